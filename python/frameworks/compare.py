"""Compares one framework's run on oxccl with its run on Gloo and prints one line.

    python compare.py NAME SIZE OXCCL.json GLOO.json OXCCL_SECONDS GLOO_SECONDS [--rtol 1e-4]

A result file that is missing (the run failed) is a failure. So are losses that differ by more
than rtol at any step, a different number of steps, a run whose group was not on the backend
it was asked for, and, for torchft, an oxccl survivor that did not see the failed rank's
failure within a second or whose errored() stayed empty. Exits 1 on any failure.
"""

import argparse
import json
import math
import sys

IMPL = {"oxccl": "ProcessGroupOxccl", "gloo": "ProcessGroupGloo"}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(x):
    return f"{x:.0e}" if x else "0"


def torchft_line(name, size, ox, gl):
    """The resiliency scenario: what each backend's survivors saw, and whether oxccl's were
    told within a second with errored() set."""

    def summary(d):
        recs = d.get("resiliency") or []
        times = [r["error_s_after_fault"] for r in recs if r["error"]]
        told = sum(1 for r in recs if r["errored"])
        span = f"{min(times):.3f}-{max(times):.3f} s" if times else "never"
        return recs, times, told, f"errors after {span}, errored() set on {told}/{len(recs)}"

    ox_recs, ox_times, ox_told, ox_text = summary(ox)
    _, _, _, gl_text = summary(gl)
    ok = bool(ox_recs) and len(ox_times) == len(ox_recs) and max(ox_times) < 1.0 and ox_told == len(ox_recs)
    ok = ok and all(r["survivors_allreduce"] == size - 1 for r in ox_recs)
    verdict = "ok" if ok else "FAILED"
    print(
        f"{name} {size} ranks, last rank fails ({ox.get('fault')}): {verdict}: "
        f"oxccl survivors' {ox_text}; gloo survivors' {gl_text}; "
        f"survivors regrouped at {size - 1} ranks on oxccl",
        flush=True,
    )
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("size", type=int)
    p.add_argument("oxccl")
    p.add_argument("gloo")
    p.add_argument("oxccl_s", type=float)
    p.add_argument("gloo_s", type=float)
    p.add_argument("--rtol", type=float, default=1e-4)
    a = p.parse_args()
    head = f"{a.name} {a.size} ranks:"
    ox, gl = load(a.oxccl), load(a.gloo)
    missing = [b for b, d in (("oxccl", ox), ("gloo", gl)) if d is None]
    if missing:
        print(f"{head} FAILED: no result from the {' and '.join(missing)} run (see its log)", flush=True)
        return 1
    problems = []
    for b, d in (("oxccl", ox), ("gloo", gl)):
        if d.get("backend") != b or d.get("impl") != IMPL[b]:
            problems.append(f"the {b} run's group was {d.get('backend')}/{d.get('impl')}")
        if d.get("world_size") not in (None, a.size):
            problems.append(f"the {b} run had {d.get('world_size')} ranks")
    lo, lg = ox["losses"], gl["losses"]
    if not lo or len(lo) != len(lg):
        problems.append(f"{len(lo)} losses on oxccl, {len(lg)} on gloo")
    worst, at = 0.0, None
    for i, (x, y) in enumerate(zip(lo, lg)):
        if not (math.isfinite(x) and math.isfinite(y)):
            problems.append(f"step {i}: loss {x} on oxccl, {y} on gloo")
            break
        rel = abs(x - y) / max(abs(y), 1e-30)
        if rel > worst:
            worst, at = rel, i
    if worst > a.rtol:
        problems.append(f"losses differ: step {at}: {lo[at]!r} on oxccl, {lg[at]!r} on gloo (rel {worst:.1e})")
    times = f"oxccl {a.oxccl_s:.1f} s, gloo {a.gloo_s:.1f} s (training {ox['train_s']:.2f} s, {gl['train_s']:.2f} s)"
    if problems:
        print(f"{head} FAILED: {'; '.join(problems)}; {times}", flush=True)
        ok = False
    else:
        print(f"{head} {len(lo)} steps, losses equal (max rel diff {fmt(worst)}), {times}", flush=True)
        ok = True
    if "resiliency" in ox:
        ok = torchft_line(a.name, a.size, ox, gl) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
