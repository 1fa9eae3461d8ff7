"""torch.distributed through the oxccl backend beside Gloo: all_reduce latency and bus bandwidth,
and DDP training steps. Not a test: numbers, written as JSON lines, summarized as tables.

    python python/bench/torch_bench.py allreduce --backend oxccl --ranks 2 --out r.jsonl
    python python/bench/torch_bench.py ddp --backend gloo --ranks 4 --out r.jsonl
    python python/bench/torch_bench.py summary r.jsonl
    python python/bench/torch_bench.py overhead


scripts/torch-bench.sh runs both backends in interleaved rounds and prints the summary.

all_reduce follows nccl-tests: float32 sum, in place (torch's all_reduce has no other form), a
buffer of zeros so repeated sums stay finite; per size a few warm-up calls, a calibration loop
(1, 8, 64, ... calls until they take 20 ms), then enough calls to fill --seconds, timed after a
barrier; time per call is the slowest rank's mean; algbw = bytes / time, busbw = algbw x 2(n-1)/n
(GB = 1e9 B). Each size is checked once afterwards (rank r contributes r + 1). The ranks are
processes of this script meeting through a file:// store (torch's TCP store does reverse-DNS
lookups); Gloo is pinned to loopback with GLOO_SOCKET_IFNAME=lo, oxccl with CCL_SOCKET_IFNAME=lo.

overhead measures what one small all_reduce costs on the calling thread, in CPU time (which
load on the machine changes far less than wall time), with one rank so that no peer is waited
for: torch's own path down to a backend that does nothing (fake), the oxccl backend blocking
and with async_op=True plus wait(), the library call alone through ctypes, and Gloo.

ddp runs examples/python/ddp_train.py --time-steps (a model wide enough that its gradient
allreduces matter) and records its time per step.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower()
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def sizes(lo, hi, factor):
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def load():
    """Other processes' CPU share over the last minute (1-minute load average / cores)."""
    try:
        return round(os.getloadavg()[0] / os.cpu_count(), 2)
    except OSError:
        return None


# ---- one rank ---------------------------------------------------------------------------


# The backends measured: torch's Gloo, the oxccl backend, PyTorch's no-op "fake" backend
# (torch's own cost: the floor any backend pays) and the library alone (the package's
# Communicator on the same tensors: the ceiling for bandwidth).
# "oxccl-nofr" is oxccl with torch's own flight recorder off (TORCH_FR_BUFFER_SIZE=0): torch 2.15
# hooks its recorder into every out-of-tree backend's operations, Gloo and fake record
# themselves or not at all.
BACKENDS = ["gloo", "oxccl", "oxccl-nofr", "fake", "lib"]


def _backend_env(backend):
    return {
        "oxccl-nofr": {"TORCH_FR_BUFFER_SIZE": "0"},
    }.get(backend, {})


def _ops(args, rank, n):
    """(all_reduce(t), barrier(), slowest(x, op)) for the backend measured."""
    import torch
    import torch.distributed as dist

    if args.backend == "lib":
        import oxccl as ccl

        store = dist.FileStore(args.store, n)
        if rank == 0:
            store.set("uid", ccl.get_unique_id())
        comm = ccl.Communicator(rank, n, store.get("uid"))
        ops = {"max": ccl.MAX, "sum": ccl.SUM}

        def slowest(x, op="max"):
            t = torch.tensor([x], dtype=torch.float64)
            comm.all_reduce(t, op=ops[op])
            return t.item()

        return (lambda t: comm.all_reduce(t)), comm.barrier, slowest, comm.destroy
    if args.backend.startswith("oxccl"):
        import oxccl.torch  # noqa: F401
    if args.backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
    else:
        name = "oxccl" if args.backend.startswith("oxccl") else args.backend
        dist.init_process_group(name, init_method="file://" + args.store, rank=rank, world_size=n)
    ops = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM}

    def slowest(x, op="max"):
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=ops[op])
        return t.item()

    return dist.all_reduce, dist.barrier, slowest, dist.destroy_process_group


def rank_main(args):
    import torch

    torch.set_num_threads(1)
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    all_reduce, barrier, slowest, close = _ops(args, rank, n)

    ladder = sizes(parse_size(args.b), parse_size(args.e), args.f)
    buf = torch.zeros(max(1, ladder[-1] // 4), dtype=torch.float32)
    rows = []
    for nbytes in ladder:
        count = max(1, nbytes // 4)
        view = buf[:count]
        for _ in range(2 if nbytes >= 64 << 20 else args.warmup):
            all_reduce(view)
        k = 1
        while True:
            barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                all_reduce(view)
            took = slowest(time.perf_counter() - t0)
            if took >= 0.02 or k >= 1 << 20:
                break
            k *= 8
        iters = int(slowest(min(max(args.seconds / max(took / k, 1e-9), 5), 1e6)))
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            all_reduce(view)
        per = (time.perf_counter() - t0) / iters
        tmax = slowest(per)
        view.fill_(float(rank + 1))
        all_reduce(view)
        # The fake backend computes nothing: its results are not checked.
        wrong = 0 if args.backend == "fake" else int((view != n * (n + 1) / 2).sum())
        view.zero_()
        wrong = int(slowest(wrong, "sum"))
        algbw = count * 4 / tmax / 1e9
        rows.append(
            {
                "kind": "allreduce",
                "backend": args.backend,
                "ranks": n,
                "bytes": count * 4,
                "iters": iters,
                "time_us": tmax * 1e6,
                "algbw": algbw,
                "busbw": algbw * 2 * (n - 1) / n,
                "wrong": wrong,
            }
        )
    close()
    if rank == 0:
        with open(args.rows, "w") as f:
            json.dump(rows, f)


# ---- CPU cost of the Python path ---------------------------------------------------------


def overhead_main(args):
    import torch
    import torch.distributed as dist

    import oxccl
    import oxccl.torch  # noqa: F401

    torch.set_num_threads(1)
    n = args.calls

    def per_call(fn):
        for _ in range(min(n, 200)):
            fn()
        c0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - c0) / n * 1e6

    from torch.testing._internal.distributed.fake_pg import FakeStore

    with tempfile.TemporaryDirectory(prefix="ccl-torch-overhead-") as d:
        rows = {}
        t = torch.zeros(2)
        for backend in ("fake", "gloo", "oxccl"):
            label = backend
            kw = {"store": FakeStore()} if backend == "fake" else {"init_method": f"file://{d}/{backend}"}
            dist.init_process_group(backend, rank=0, world_size=1, **kw)
            rows[f"{label}: dist.all_reduce"] = per_call(lambda: dist.all_reduce(t))
            rows[f"{label}: dist.all_reduce(async_op=True).wait()"] = per_call(
                lambda: dist.all_reduce(t, async_op=True).wait()
            )
            if backend == "oxccl":
                pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
                lib, h, p = oxccl._lib, pg.comm._h, t.data_ptr()
                f32, total = oxccl.DTYPES["float32"], oxccl.SUM
                rows["library: cclAllReduce through ctypes alone"] = per_call(
                    lambda: lib.cclAllReduce(p, p, 2, f32, total, h)
                )
            dist.destroy_process_group()
    out = [
        {"kind": "overhead", "what": k, "cpu_us": v, "calls": n, "load": load()}
        for k, v in rows.items()
    ]
    emit(args.out, out)


# ---- launching ranks -----------------------------------------------------------------


def _source_tree():
    """The repository's python/ for running without installing; nothing when the package is
    installed, whose native torch backend the source tree does not have."""
    import importlib.util

    return [] if importlib.util.find_spec("oxccl") is not None else [str(REPO / "python")]


def launch(cmd_for_rank, n, extra_env=None, timeout=3600):
    """Runs n processes (one per rank) on loopback; returns rank 0's stdout."""
    env = dict(os.environ)
    env.update(
        {
            "WORLD_SIZE": str(n),
            "GLOO_SOCKET_IFNAME": "lo",
            "CCL_SOCKET_IFNAME": "=lo",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(p for p in (*_source_tree(), env.get("PYTHONPATH")) if p),
        }
    )
    env.update(extra_env or {})
    procs = []
    for r in range(n):
        e = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        out = subprocess.PIPE if r == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(cmd_for_rank(r), env=e, stdout=out, text=True))
    try:
        stdout, _ = procs[0].communicate(timeout=timeout)
        codes = [procs[0].returncode] + [p.wait(timeout=60) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"a rank failed (exit codes {codes})")
    return stdout


def cmd_allreduce(args):
    with tempfile.TemporaryDirectory(prefix="ccl-torch-bench-") as d:
        rows = os.path.join(d, "rows.json")
        argv = [
            sys.executable,
            os.path.abspath(__file__),
            "_rank",
            "--backend",
            args.backend,
            "--store",
            os.path.join(d, "store"),
            "--rows",
            rows,
            "-b",
            args.b,
            "-e",
            args.e,
            "-f",
            str(args.f),
            "--warmup",
            str(args.warmup),
            "--seconds",
            str(args.seconds),
        ]
        before = load()
        launch(lambda r: argv, args.ranks, _backend_env(args.backend))
        with open(rows) as f:
            out = json.load(f)
    for row in out:
        row.update({"round": args.round, "load_before": before, "load_after": load()})
    emit(args.out, out)


def cmd_ddp(args):
    with tempfile.TemporaryDirectory(prefix="ccl-torch-ddp-") as d:
        argv = [
            sys.executable,
            str(REPO / "examples" / "python" / "ddp_train.py"),
            "--backend",
            "oxccl" if args.backend.startswith("oxccl") else args.backend,
            "--init-method",
            "file://" + os.path.join(d, "store"),
            "--width",
            str(args.width),
            "--depth",
            str(args.depth),
            "--batch",
            str(args.batch),
            "--time-steps",
            str(args.steps),
        ]
        before = load()
        stdout = launch(lambda r: argv, args.ranks, _backend_env(args.backend))
    line = next(x for x in stdout.splitlines() if x.startswith("step_ms "))
    f = line.split()
    row = {
        "kind": "ddp",
        "backend": args.backend,
        "ranks": args.ranks,
        "step_ms": float(f[1]),
        "gradient_bytes": int(f[f.index("gradient_bytes") + 1]),
        "width": args.width,
        "depth": args.depth,
        "batch": args.batch,
        "steps": args.steps,
        "round": args.round,
        "load_before": before,
        "load_after": load(),
    }
    emit(args.out, [row])


def emit(path, rows):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path:
        with open(path, "a") as f:
            f.write(text)
    sys.stdout.write(text)


# ---- summary --------------------------------------------------------------------------


def fmt_size(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return f"{b // k} {unit}"
    return f"{b} B"


def cmd_summary(args):
    rows = []
    for p in args.files:
        with open(p) as f:
            rows += [json.loads(x) for x in f if x.strip()]
    med = statistics.median
    out = []
    ar = [r for r in rows if r["kind"] == "allreduce"]
    verdicts = []
    names = {
        "fake": "fake",
        "gloo": "Gloo",
        "oxccl": "oxccl",
        "oxccl-nofr": "oxccl, torch's recorder off",
        "lib": "library",
    }
    for n in sorted({r["ranks"] for r in ar}):
        have = [b for b in ("fake", "gloo", "oxccl", "oxccl-nofr", "lib") if any(
            r["backend"] == b and r["ranks"] == n for r in ar)]
        out.append(f"\n### all_reduce, {n} ranks (float32 sum, in place; median of rounds)\n")
        out.append(
            "| size | "
            + " | ".join(f"{names[b]} time (us)" for b in have)
            + " | "
            + " | ".join(f"{names[b]} busbw (GB/s)" for b in have if b != "fake")
            + " | rounds | wrong |"
        )
        out.append("|---:" * (2 * len(have) - ("fake" in have) + 3) + "|")
        smallest = min(r["bytes"] for r in ar if r["ranks"] == n)
        for size in sorted({r["bytes"] for r in ar if r["ranks"] == n}):
            per = {b: [r for r in ar if r["ranks"] == n and r["bytes"] == size and r["backend"] == b]
                   for b in have}
            if not all(per.values()):
                continue
            t = {b: med(r["time_us"] for r in v) for b, v in per.items()}
            bw = {b: med(r["busbw"] for r in v) for b, v in per.items()}
            wrong = sum(r["wrong"] for v in per.values() for r in v)
            out.append(
                f"| {fmt_size(size)} | "
                + " | ".join(f"{t[b]:.1f}" for b in have)
                + " | "
                + " | ".join(f"{bw[b]:.3f}" for b in have if b != "fake")
                + f" | {min(len(v) for v in per.values())} | {wrong} |"
            )
            for b in ("oxccl", "oxccl-nofr"):
                if size == smallest and n == 2 and "fake" in t and b in t:
                    d = t[b] - t["fake"]
                    verdicts.append(
                        f"{n} ranks, {fmt_size(size)}: {names[b]} {t[b]:.1f} us, torch's floor "
                        f"(fake) {t['fake']:.1f} us: {d:+.1f} us (target <= +1.5: "
                        f"{'met' if d <= 1.5 else 'NOT met'})"
                    )
            if size >= 1 << 20 and "lib" in bw and "oxccl" in bw:
                ratio = bw["oxccl"] / bw["lib"]
                if ratio < 0.9:
                    verdicts.append(
                        f"{n} ranks, {fmt_size(size)}: oxccl busbw {bw['oxccl']:.3f} is "
                        f"{ratio:.2f} of the library's {bw['lib']:.3f} GB/s (target >= 0.9: "
                        "NOT met)"
                    )
        big = [b for b in {r["bytes"] for r in ar if r["ranks"] == n} if b >= 1 << 20]
        if big and "lib" in have and "oxccl" in have and not any(
            f"{n} ranks" in v and "busbw" in v for v in verdicts
        ):
            verdicts.append(f"{n} ranks, 1 MiB and above: ccl busbw >= 0.9 of the library's: met")
    dd = [r for r in rows if r["kind"] == "ddp"]
    if dd:
        out.append("\n### DDP training step (examples/python/ddp_train.py --time-steps)\n")
        out.append(
            "| ranks | model | gradient MB | no communication (fake) step (ms) | Gloo step (ms) "
            "| oxccl step (ms) | oxccl / Gloo | rounds |"
        )
        out.append("|---:|---|---:|---:|---:|---:|---:|---:|")
        for n in sorted({r["ranks"] for r in dd}):
            g = [r for r in dd if r["ranks"] == n and r["backend"] == "gloo"]
            c = [r for r in dd if r["ranks"] == n and r["backend"] == "oxccl"]
            if not g or not c:
                continue
            f = [r for r in dd if r["ranks"] == n and r["backend"] == "fake"]
            fs = f"{med(r['step_ms'] for r in f):.1f}" if f else "-"
            gs, cs = med(r["step_ms"] for r in g), med(r["step_ms"] for r in c)
            m = c[0]
            out.append(
                f"| {n} | MLP width {m['width']} depth {m['depth']}, batch {m['batch']} | "
                f"{m['gradient_bytes'] / 1e6:.1f} | {fs} | {gs:.1f} | {cs:.1f} | {cs / gs:.2f} | "
                f"{min(len(g), len(c))} |"
            )
            verdicts.append(
                f"DDP {n} ranks: ccl {cs:.1f} ms vs Gloo {gs:.1f} ms per step, "
                f"{cs / gs:.2f} of Gloo's (target <= 0.7: {'met' if cs <= 0.7 * gs else 'NOT met'})"
            )
    loads = [r["load_before"] for r in rows if r.get("load_before") is not None]
    if loads:
        out.append(
            f"\nMachine load (1-min load average per core) before the runs: median "
            f"{med(loads):.2f}, max {max(loads):.2f}."
        )
    out.append("\nTargets:\n" + "\n".join(f"- {v}" for v in verdicts))
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("allreduce", help="all_reduce latency and busbw, 8 B to 64 MiB")
    d = sub.add_parser("ddp", help="DDP training step time")
    a.add_argument("--backend", choices=BACKENDS, required=True)
    d.add_argument("--backend", choices=["gloo", "oxccl", "fake"], required=True)
    for p in (a, d):
        p.add_argument("--ranks", type=int, default=2)
        p.add_argument("--out", help="append JSON lines here")
        p.add_argument("--round", type=int, default=0)
    a.add_argument("-b", default="8")
    a.add_argument("-e", default="64M")
    a.add_argument("-f", type=int, default=4)
    a.add_argument("--warmup", type=int, default=5)
    a.add_argument("--seconds", type=float, default=0.25, help="timed work per size")
    d.add_argument("--width", type=int, default=2048)
    d.add_argument("--depth", type=int, default=4)
    d.add_argument("--batch", type=int, default=64)
    d.add_argument("--steps", type=int, default=20)
    o = sub.add_parser("overhead", help="CPU time per 8-byte all_reduce, one rank")
    o.add_argument("--calls", type=int, default=20000)
    o.add_argument("--out", help="append JSON lines here")
    s = sub.add_parser("summary", help="tables from JSON lines")
    s.add_argument("files", nargs="+")
    r = sub.add_parser("_rank")
    r.add_argument("--backend", required=True)
    r.add_argument("--store", required=True)
    r.add_argument("--rows", required=True)
    r.add_argument("-b", default="8")
    r.add_argument("-e", default="64M")
    r.add_argument("-f", type=int, default=4)
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--seconds", type=float, default=0.25)
    args = ap.parse_args()
    {
        "allreduce": cmd_allreduce,
        "ddp": cmd_ddp,
        "overhead": overhead_main,
        "summary": cmd_summary,
        "_rank": rank_main,
    }[
        args.cmd
    ](args)


if __name__ == "__main__":
    main()
