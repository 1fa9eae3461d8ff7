"""Training survives a rank's death and takes a replacement back, through torch's own API.

    python examples/python/shrink_grow.py                  # 4 ranks, rank 2 dies at step 5
    python examples/python/shrink_grow.py --kill 0 --trials 20

Four processes train a linear model with data parallelism over the "oxccl" backend (no import
of it: torch finds it by name). At step `--at`, rank `--kill` kills itself (SIGKILL) before its
all_reduce, and a replacement process is started. The survivors' all_reduce fails naming it;
they call ``dist.shrink_group(oxccl.torch.failed_ranks())`` and redo the step on three ranks.
Two steps later they and the replacement exchange ``dist._get_reconfigure_handle()`` through a
file store and call ``dist._reconfigure(uuid, handles)``: four ranks again, the replacement last.
Rank 0 broadcasts the weights and the step, and all four train on.

The global batch is the same at every size (24 samples a step, split among the ranks present),
so the weights must equal those of an uninterrupted run, computed here in one process; the
script checks that, and how long the survivors took from the death to the next correct
all_reduce (at most the group's timeout + 1 s). It exits non-zero if any trial fails.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

FEATURES = 16
BATCH = 24  # divisible by 4 and by 3: each size splits the batch evenly
LR = 0.05


def batch(step):
    """The step's samples (x, y), the same for every rank and for the reference."""
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    w_true = torch.linspace(-1, 1, FEATURES, dtype=torch.float64)
    y = x @ w_true + 0.01 * torch.randn(BATCH, generator=g, dtype=torch.float64)
    return x, y


def grad_sum(w, x, y):
    """The sum (not mean) of the samples' gradients and losses, so that partial sums add up."""
    err = x @ w - y
    return x.t() @ err, (err * err).sum()


def reference(steps):
    import torch

    w = torch.zeros(FEATURES, dtype=torch.float64)
    for s in range(steps):
        g, _ = grad_sum(w, *batch(s))
        w -= LR * g / BATCH
    return w


def worker(args):
    import torch
    import torch.distributed as dist

    rank, joiner = args.rank, args.rank < 0
    oob = dist.FileStore(os.path.join(args.dir, "oob"), -1)
    timeout = timedelta(seconds=args.timeout)
    if joiner:
        # Not part of any group yet: a group of one made in the reconfigure regime.
        dist.init_process_group(
            "oxccl", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout,
            enable_reconfigure=True,
        )
    else:
        dist.init_process_group(
            "oxccl", init_method="file://" + os.path.join(args.dir, "init"), rank=rank,
            world_size=args.world, timeout=timeout,
        )
    import oxccl.torch

    w = torch.zeros(FEATURES, dtype=torch.float64)
    step = 0
    report = {}
    if joiner:
        step = grow(oob, dist)
        state = torch.zeros(FEATURES + 1, dtype=torch.float64)
        dist.broadcast(state, src=0)
        w, step = state[:FEATURES].clone(), int(state[FEATURES])
    while step < args.steps:
        if step == args.at and rank == args.kill and not joiner:
            oob.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.at + 2 and args.kill >= 0 and dist.get_world_size() < args.world:
            grow(oob, dist)
            state = torch.cat([w, torch.tensor([float(step)], dtype=torch.float64)])
            dist.broadcast(state, src=0)
        x, y = batch(step)
        n, r = dist.get_world_size(), dist.get_rank()
        part = slice(r * BATCH // n, (r + 1) * BATCH // n)
        g, loss = grad_sum(w, x[part], y[part])
        buf = torch.cat([g, loss.reshape(1)])
        try:
            dist.all_reduce(buf)
        except RuntimeError as e:
            failed = oxccl.torch.failed_ranks()
            report["error"] = str(e).splitlines()[0][:300]
            report["failed"] = failed
            dist.shrink_group(failed)
            continue  # the same step again, on the survivors
        if "failed" in report and "recovered_after" not in report:
            report["recovered_after"] = time.time() - float(oob.get("killed_at"))
        w -= LR * buf[:FEATURES] / BATCH
        step += 1
    report.update(rank=dist.get_rank(), size=dist.get_world_size(), w=w.tolist())
    oob.set(f"report/{'joiner' if joiner else rank}", json.dumps(report))
    dist.destroy_process_group()


def grow(oob, dist):
    """Four members again: survivors keep their order, the replacement comes last. Each writes
    its reconfigure handle to the out-of-band store and waits for the others'."""
    members = 4
    me = dist.get_rank() if dist.get_world_size() > 1 else members - 1
    oob.set(f"grow/{me}", dist._get_reconfigure_handle())
    keys = [f"grow/{i}" for i in range(members)]
    oob.wait(keys, timedelta(seconds=120))
    handles = [oob.get(k).decode() for k in keys]
    dist._reconfigure(uuid=2, handles=handles).wait()
    assert dist.get_world_size() == members and dist.get_rank() == me
    return 0


def trial(args, kill):
    import torch

    with tempfile.TemporaryDirectory(prefix="oxccl-shrink-grow-") as d:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.setdefault("CCL_SOCKET_IFNAME", "=lo")
        base = [sys.executable, __file__, "--dir", d, "--world", str(args.world),
                "--steps", str(args.steps), "--at", str(args.at), "--kill", str(kill),
                "--timeout", str(args.timeout)]
        import torch.distributed as dist

        oob = dist.FileStore(os.path.join(d, "oob"), -1)
        procs = [subprocess.Popen(base + ["--rank", str(r)], env=env) for r in range(args.world)]
        oob.wait(["killed_at"], timedelta(seconds=300))
        procs.append(subprocess.Popen(base + ["--rank", "-1"], env=env))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=300))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append("hung")
        want = reference(args.steps)
        reports = {}
        for who in [*(str(r) for r in range(args.world) if r != kill), "joiner"]:
            reports[who] = json.loads(oob.get(f"report/{who}")) if oob.check([f"report/{who}"]) else None
        ok = codes[kill] == -signal.SIGKILL and all(c == 0 for i, c in enumerate(codes) if i != kill)
        worst = 0.0
        slowest = 0.0
        for who, rep in reports.items():
            if rep is None:
                ok = False
                print(f"  {who}: no report")
                continue
            diff = (torch.tensor(rep["w"], dtype=torch.float64) - want).abs().max().item()
            worst = max(worst, diff)
            if who != "joiner":
                slowest = max(slowest, rep.get("recovered_after", float("inf")))
                ok &= rep.get("failed") == [kill]
            ok &= rep["size"] == args.world
        ok &= worst <= 1e-9 and slowest <= args.timeout + 1.0
        first = reports.get(str(0 if kill else 1)) or {}
        print(f"kill rank {kill}: exit codes {codes}; error: {first.get('error', '-')!r}")
        print(f"  survivors' next correct all_reduce {slowest:.3f} s after the death "
              f"(limit {args.timeout + 1.0:.0f} s); weights vs uninterrupted run: max diff "
              f"{worst:.2e}; {'ok' if ok else 'FAILED'}")
        return ok, slowest


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--at", type=int, default=5, help="the step at which the rank dies")
    p.add_argument("--kill", type=int, default=2, help="the rank that dies")
    p.add_argument("--trials", type=int, default=1, help="trials, the killed rank cycling")
    p.add_argument("--timeout", type=float, default=10.0, help="the group's timeout (s)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return worker(args)
    if args.world != 4:
        p.error("the example grows back to 4 ranks: --world 4")
    results = [trial(args, (args.kill + t) % args.world) for t in range(args.trials)]
    good = sum(ok for ok, _ in results)
    times = sorted(t for _, t in results)
    print(f"{good}/{len(results)} trials right; from a death to the next correct all_reduce: "
          f"median {times[len(times) // 2]:.3f} s, slowest {times[-1]:.3f} s")
    sys.exit(0 if good == len(results) else 1)


if __name__ == "__main__":
    main()
