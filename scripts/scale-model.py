#!/usr/bin/env python3
"""scale-model.py - what set-up would cost at 1K-32K ranks, from the runs of scale-init.sh.

    scripts/scale-model.py [DIR]          DIR: scale-init.sh's OUT (default target/scale-init)
    scripts/scale-model.py --self-test    the fit recovers known costs from made-up runs
    ALPHA_US=20  RANKS=1024,4096,8192,16384,32768  ROOTS=1,4,16

Reads the rank-process runs over TCP (DIR/tcp-lazy-N.jsonl, DIR/tcp-eager-N.jsonl; at least
three lazy sizes) and fits, by least squares, what this host's measurements say each part of
set-up costs in CPU time:

    per rank   cpu(N) = p + s * K + d * N     K = ceil(log2 N)
               p: starting a process and a communicator (loading, threads, listeners);
               s: per step of the allgather among the ranks and of the first allreduce
                  (recursive doubling: K peers, each connected on first use);
               d: per rank of the job (every rank decodes and keeps every record)
    eager      c: per extra connection, from cpu_eager(N) - cpu_lazy(N)
    root       a: per rank admitted and watched (the rendezvous root and monitor threads)

On this host all ranks share a few CPUs, so the measured time is the CPU total over the CPUs,
and the fit is checked against that. On a cluster every rank has a CPU of its own, the launcher
is the site's, and what remains is the critical path:

    T(N) = p + a * N / roots + K * (s + 3 * alpha) + d * N     (+ (N - 1) * c eager)

alpha: the network's round trip (ALPHA_US): a step of the allgather takes one, connecting a
peer on first use about two. Every cost is fitted non-negative (a term the runs cannot resolve comes out 0). The roots:
each admits N / roots ranks (this library runs one;
the column for several says what NCCL's scalable init would give here). Constants measured on
a crowded host overstate the CPU parts (caches and the scheduler are shared); the model is a
shape, checked here only at the sizes that ran.
"""

import glob
import json
import math
import os
import re
import sys


def load(path):
    lines = [json.loads(l) for l in open(path)]
    ranks = [l for l in lines if "rank" in l]
    launcher = next((l for l in lines if l.get("launcher")), None)
    if not ranks or launcher is None or launcher.get("ranks_in_process"):
        return None
    if any(r.get("cpu_us") is None for r in ranks):
        return None
    n = len(ranks)
    return {
        "n": n,
        "cpu": sum(r["cpu_us"] for r in ranks) / n / 1e6,
        "first": max(r["first_us"] for r in ranks) / 1e6,
        "started": max(r["start_us"] for r in ranks) / 1e6,
        "peers": sum(r["peers"] for r in ranks) / n,
        "root_cpu": launcher.get("root_cpu_us", 0) / 1e6,
    }


def steps(n):
    return max(1, math.ceil(math.log2(n)))


def solve(rows, cols):
    """Least squares: rows of (x_1..x_k, y); returns the k coefficients (normal equations)."""
    k = cols
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * r[k] for r in rows) for i in range(k)]
    for i in range(k):  # Gauss-Jordan with partial pivoting
        piv = max(range(i, k), key=lambda r: abs(a[r][i]))
        a[i], a[piv], b[i], b[piv] = a[piv], a[i], b[piv], b[i]
        if abs(a[i][i]) < 1e-18:
            sys.exit("scale-model: the runs do not determine the fit (need three sizes or more)")
        for r in range(k):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * y for x, y in zip(a[r], a[i])]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] for i in range(k)]


def nnls(rows, cols):
    """Least squares with every coefficient >= 0: the best fit over the subsets of the
    coefficients left free (the others held at 0) whose solution has no negative one. A cost
    cannot be negative; a term the runs cannot resolve comes out as 0 rather than as a
    negative number that offsets another."""
    best = None
    for mask in range(1, 1 << cols):
        free = [i for i in range(cols) if mask >> i & 1]
        if len(free) > len(rows):
            continue
        sub = [tuple(r[i] for i in free) + (r[cols],) for r in rows]
        try:
            coef = solve(sub, len(free))
        except SystemExit:
            continue
        if min(coef) < 0:
            continue
        full = [0.0] * cols
        for i, c in zip(free, coef):
            full[i] = c
        err = sum((sum(full[i] * r[i] for i in range(cols)) - r[cols]) ** 2 for r in rows)
        if best is None or err < best[0]:
            best = (err, full)
    if best is None:
        sys.exit("scale-model: no fit with non-negative costs")
    return best[1]


def fmt(t):
    return f"{t * 1e3:.0f} ms" if t < 1 else f"{t:.1f} s"


def self_test():
    """Runs made up from known costs, written as scale-init.sh writes them: the fit must give
    the costs back, and hold at 0 a cost the runs do not have."""
    import tempfile
    for p, s, d, a, c in [(5e-3, 3e-4, 4e-6, 1.5e-4, 1e-4), (6e-3, 0.0, 5e-6, 2e-4, 8e-5)]:
        with tempfile.TemporaryDirectory() as out:
            for mode, sizes in (("lazy", (64, 128, 256, 512, 1024)), ("eager", (64, 256))):
                for n in sizes:
                    k = steps(n)
                    cpu = p + s * k + d * n + (c * (n - 1 - k) if mode == "eager" else 0)
                    peers = k if mode == "lazy" else n - 1
                    with open(os.path.join(out, f"tcp-{mode}-{n}.jsonl"), "w") as f:
                        for r in range(n):
                            f.write(json.dumps({"rank": r, "cpu_us": cpu * 1e6, "first_us": 1,
                                                "start_us": 0, "peers": peers}) + "\n")
                        f.write(json.dumps({"launcher": True, "ranks": n,
                                            "root_cpu_us": a * n * 1e6}) + "\n")
            got = fit(out)
            want = {"p": p, "s": s, "d": d, "a": a, "a0": 0.0, "c": c}
            for key, w in want.items():
                if abs(got[key] - w) > 1e-3 * max(abs(w), 1e-6):
                    sys.exit(f"scale-model self-test: {key} = {got[key]:.3g}, made with {w:.3g}")
    print("scale-model self-test: the fit gives back the costs the runs were made with")


def fit(out):
    """The costs, fitted to the runs in `out`, and the runs."""
    runs = {"lazy": {}, "eager": {}}
    for path in glob.glob(os.path.join(out, "tcp-*-*.jsonl")):
        m = re.fullmatch(r"tcp-(lazy|eager)-(\d+)\.jsonl", os.path.basename(path))
        if m and (r := load(path)):
            runs[m.group(1)][r["n"]] = r
    lazy = runs["lazy"]
    if len(lazy) < 3:
        sys.exit(f"scale-model: {out} has {len(lazy)} lazy TCP runs with CPU times; "
                 "run scripts/scale-init.sh with three sizes or more first")
    p, s, d = nnls([(1.0, steps(n), n, r["cpu"]) for n, r in lazy.items()], 3)
    a, a0 = nnls([(n, 1.0, r["root_cpu"]) for n, r in lazy.items()], 2)
    extra = [(n - 1 - lazy[n]["peers"], e["cpu"] - lazy[n]["cpu"])
             for n, e in runs["eager"].items() if n in lazy and n > lazy[n]["peers"] + 1]
    c = sum(y for _, y in extra) / sum(x for x, _ in extra) if extra else None
    return {"p": p, "s": s, "d": d, "a": a, "a0": a0, "c": c, "runs": runs}


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    out = sys.argv[1] if len(sys.argv) > 1 else "target/scale-init"
    f = fit(out)
    p, s, d, a, a0, c, runs = (f[k] for k in ("p", "s", "d", "a", "a0", "c", "runs"))
    lazy = runs["lazy"]
    extra = c is not None
    cpus = os.cpu_count() or 1
    alpha = float(os.environ.get("ALPHA_US", "20")) / 1e6
    sizes = [int(x) for x in os.environ.get("RANKS", "1024,4096,8192,16384,32768").split(",")]
    roots = [int(x) for x in os.environ.get("ROOTS", "1,4,16").split(",")]

    eager_sizes = sorted(n for n in runs["eager"] if n in lazy)
    print(f"Fitted on this host ({cpus} CPUs) from the lazy TCP runs of {sorted(lazy)} ranks"
          + (f" and the eager ones of {eager_sizes}" if extra else "") + ":")
    print(f"- per rank: p = {p * 1e3:.2f} ms, s = {s * 1e6:.0f} us per step, "
          f"d = {d * 1e6:.2f} us per rank of the job")
    print(f"- root: a = {a * 1e6:.0f} us per rank (+ {a0 * 1e3:.1f} ms)")
    if s == 0:
        print("  (the per-step cost is below what these runs resolve: their steps grow from "
              f"{steps(min(lazy))} to {steps(max(lazy))} while the host gets more crowded; "
              "the fit holds it at 0)")
    if c is not None:
        print(f"- eager: c = {c * 1e6:.0f} us per extra connection")
    print()
    print("Check on this host (every rank on its CPUs: (ranks' CPU + root's) / CPUs, against "
          "the slowest rank's first result, launching included):")
    print()
    print("| ranks | connect | CPU model s | measured first s | of which launching s |")
    print("|---|---|---|---|---|")
    for mode in ("lazy", "eager"):
        for n, r in sorted(runs[mode].items()):
            cpu = p + s * steps(n) + d * n + (0 if mode == "lazy" or c is None
                                             else c * (n - 1 - lazy.get(n, r)["peers"]))
            host = (n * cpu + a * n + a0) / cpus
            print(f"| {n} | {mode} | {host:.2f} | {r['first']:.2f} | {r['started']:.2f} |")
    print()
    print(f"Predicted set-up plus the first 8-byte allreduce on a cluster (a CPU per rank, "
          f"round trip {alpha * 1e6:.0f} us, launch not counted):")
    print()
    cols = [f"lazy, {k} root{'s' if k > 1 else ''}" for k in roots]
    if c is not None:
        cols += [f"eager, {k} root{'s' if k > 1 else ''}" for k in (roots[0], roots[-1])]
    print("| ranks | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n in sizes:
        base = lambda k: p + a * n / k + steps(n) * (s + 3 * alpha) + d * n
        cells = [fmt(base(k)) for k in roots]
        if c is not None:
            cells += [fmt(base(k) + (n - 1) * c) for k in (roots[0], roots[-1])]
        print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
