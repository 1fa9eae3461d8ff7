"""torchft's reconfigurable process group on oxccl (or torchft's own Gloo one), in N processes.

    python python/frameworks/torchft_train.py --backend oxccl --world-size 2 --out r.json

The script starts a TCPStore (torchft's groups meet through one, under a new prefix for every
configuration) and N worker processes. Each worker:

1. configures the group (`pg.configure(store_addr, replica_id, rank, world_size)`) and runs
   torchft's own collective checks (`torchft.process_group_test`, the functions its
   MultiPgBaseTest runs on every rank; Gloo skips the ones torchft's Gloo test skips);
2. trains a small model for --steps steps, averaging gradients with `pg.allreduce`; rank 0's
   losses go to --out;
3. plays torchft's resiliency scenario (MultiPgBaseTest._run_with_resiliency): the group is
   configured again, and while the others wait in an allreduce the last rank fails: it aborts
   its group (`pg.abort()`, what torchft does to a group on an error or a timeout; --fault
   exit ends its process instead, --fault shutdown shuts its group down gracefully, as
   torchft's own test and destroy_process_group do). Each survivor records how long after
   that its error came, the error, and what `pg.errored()` then says; the survivors then
   configure a group of N-1 under a new prefix and allreduce on it.

Between phases the ranks meet on the store, not on the group: torchft's `configure` aborts the
previous group, and a ccl abort fails the operations still in flight on every rank.
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch

import common

HERE = os.path.dirname(os.path.abspath(__file__))


def make_pg(backend, timeout):
    if backend == "oxccl":
        from torchft_oxccl import ProcessGroupOxccl

        return ProcessGroupOxccl(timeout=timeout)
    if backend == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo(timeout=timeout)
    raise SystemExit(f"unknown backend {backend}")


def collectives(pg, backend, rank):
    from torchft import process_group_test as t

    # torchft's own Gloo test leaves these out: its Gloo wrapper refuses reduce_scatter, and
    # Gloo has no all-to-all on CPU.
    skip = {"alltoall_base", "reduce_scatter", "reduce_scatter_tensor_coalesced"} if backend == "gloo" else set()
    done = []
    for name, fn in t._COLLECTIVE_TO_FUNC.items():
        if name in skip:
            continue
        fn(pg, rank, torch.tensor([rank + 1]))
        done.append(name)
    return done


def train(pg, args, rank, world, result):
    from torch.distributed import ReduceOp

    x, y = common.synthetic(common.rank0_shard(world, args.batch, args.steps))
    x, y = x[rank::world], y[rank::world]
    model = common.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for step in range(args.steps):
        xb = x[step * args.batch : (step + 1) * args.batch]
        yb = y[step * args.batch : (step + 1) * args.batch]
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        # One allreduce per step: the gradients and the loss in one flat buffer.
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads] + [loss.detach().reshape(1)])
        pg.allreduce([flat], ReduceOp.SUM).wait()
        flat /= world
        off = 0
        for g in grads:
            g.copy_(flat[off : off + g.numel()].view_as(g))
            off += g.numel()
        opt.step()
        result.loss(flat[-1])


def store_barrier(store, name, rank, ranks):
    store.set(f"{name}/{rank}", "1")
    store.wait([f"{name}/{r}" for r in ranks], timedelta(seconds=120))


def resiliency(pg, args, rank, world, store, store_addr):
    from torch.distributed import ReduceOp

    fault = world - 1
    store_barrier(store, "trained", rank, range(world))
    pg.configure(f"{store_addr}/fault", "replica_0", rank, world)
    t = torch.tensor([rank + 1.0])
    pg.allreduce([t], ReduceOp.SUM).wait()
    assert t.item() == world * (world + 1) / 2, t
    store.set(f"ready{rank}", "1")
    if rank == fault:
        store.wait([f"ready{r}" for r in range(world)])
        time.sleep(0.3)  # the survivors are waiting in their allreduce by now
        store.set("down_at", repr(time.time()))
        if args.fault == "exit":
            os._exit(0)
        if args.fault == "shutdown":
            pg.shutdown()
        else:
            pg.abort()
        store.wait([f"survivor{r}" for r in range(world - 1)], timedelta(seconds=120))
        return None
    work = pg.allreduce([torch.tensor([1.0])], ReduceOp.SUM)
    error = None
    try:
        work.wait()
    except Exception as e:  # the point: which error, and when
        error = e
    seen_at = time.time()
    down_at = float(store.get("down_at").decode())
    err_after = pg.errored()
    # torchft would now reconfigure without the failed replica; so do the survivors.
    store_barrier(store, "failed", rank, range(world - 1))
    pg.configure(f"{store_addr}/survivors", "replica_0", rank, world - 1)
    s = torch.tensor([1.0])
    pg.allreduce([s], ReduceOp.SUM).wait()
    pg.shutdown()
    store.set(f"survivor{rank}", "1")
    return {
        "rank": rank,
        "error_s_after_fault": round(seen_at - down_at, 3),
        "error": None if error is None else f"{type(error).__name__}: {error}"[:300],
        "errored": None if err_after is None else f"{type(err_after).__name__}: {err_after}"[:300],
        "survivors_allreduce": s.item(),
    }


def worker(args):
    from torch.distributed import TCPStore


    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    store = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=60))
    store_addr = f"{host}:{port}/torchft"
    result = common.Result(args, "torchft")
    pg = make_pg(args.backend, timedelta(seconds=args.timeout))
    pg.configure(f"{store_addr}/quorum_0", "replica_0", rank, world)
    result.set(
        backend=args.backend,
        impl=type(pg.parent._get_backend(torch.device("cpu"))).__name__,
        collectives=collectives(pg, args.backend, rank),
        version=importlib.metadata.version("torchft"),
        world_size=world,
    )
    result.start()
    train(pg, args, rank, world, result)
    result.stop()
    rec = resiliency(pg, args, rank, world, store, store_addr)
    # Every survivor's record reaches rank 0 through the store (the group is gone by now).
    if rec is not None:
        store.set(f"rec{rank}", json.dumps(rec))
    if rank == 0:
        recs = [json.loads(store.get(f"rec{r}")) for r in range(world - 1)]
        result.set(resiliency=recs, fault=args.fault)
        result.write(rank)


def options(p):
    p.add_argument("--timeout", type=float, default=10.0, help="the group's timeout, seconds")
    p.add_argument("--fault", choices=["abort", "exit", "shutdown"], default="abort")


def main():
    args = common.parse(__doc__, extra=options)
    if os.environ.get("TORCHFT_WORKER") == "1":
        return worker(args)
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = dict(os.environ, TORCHFT_WORKER="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port))
    env["WORLD_SIZE"] = str(args.world_size)
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen([sys.executable, __file__, *sys.argv[1:]], env=dict(env, RANK=str(r)))
        for r in range(args.world_size)
    ]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"worker exit codes {codes}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
