"""Data-parallel training with torch DistributedDataParallel over ccl.

    torchrun --nproc_per_node 2 examples/python/ddp_train.py

Each rank trains a small MLP on its shard of a synthetic classification problem; DDP broadcasts
rank 0's initial weights and averages gradients with ccl allreduces. Prints the loss per epoch
(averaged over ranks), then checks that the loss fell and that every rank ends with
bit-identical weights; exits non-zero otherwise.

Rendezvous: torch's env:// variables by default (torchrun sets them); --init-method file:///path
uses a file instead (RANK and WORLD_SIZE still come from the environment).

--time-steps N measures instead of training to convergence: a wider, deeper model (--width,
--depth), a few warm-up steps, then N timed steps; prints the time per step (the slowest rank's
mean). --backend gloo runs the same on PyTorch's Gloo backend, for comparison.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

# No import of oxccl: torch finds the "oxccl" backend through the package's entry point.


def synthetic(n, features, seed):
    """Points labelled by which side of a fixed random hyperplane (bent a little) they fall."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, generator=g)
    y = ((x @ w + 0.5 * torch.sin(3 * x[:, 0])) > 0).long()
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--init-method", default="env://")
    p.add_argument("--save", help="write this rank's final weights to SAVE.format(rank=...)")
    p.add_argument("--backend", default="oxccl", help="torch.distributed backend (oxccl, gloo, or fake: no communication)")
    p.add_argument("--width", type=int, default=32, help="hidden layer width")
    p.add_argument("--depth", type=int, default=1, help="hidden layers")
    p.add_argument("--time-steps", type=int, default=0, help="time this many steps instead")
    args = p.parse_args()

    kw = {}
    if not args.init_method.startswith("env://"):
        # Other rendezvous need rank and size given; torchrun and friends set these.
        kw = {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    if args.backend == "fake":
        # PyTorch's no-op backend: the step without communication, the floor for the others.
        from torch.testing._internal.distributed.fake_pg import FakeStore

        kw = {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
        dist.init_process_group("fake", store=FakeStore(), **kw)
    else:
        dist.init_process_group(args.backend, init_method=args.init_method, **kw)
    rank, world = dist.get_rank(), dist.get_world_size()

    x, y = synthetic(args.samples, 16, seed=7)
    x, y = x[rank::world], y[rank::world]  # this rank's shard

    # Different initial weights per rank on purpose: DDP's broadcast makes them equal.
    torch.manual_seed(1000 + rank)
    layers = [nn.Linear(16, args.width), nn.Tanh()]
    for _ in range(args.depth - 1):
        layers += [nn.Linear(args.width, args.width), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(args.width, 2))
    ddp = nn.parallel.DistributedDataParallel(model)
    if args.backend == "fake":
        # The fake backend's works carry no result, which DDP's reducer refuses: a hook that
        # hands each bucket back as it is (the same bytes DDP would have averaged).
        def keep(_, bucket):
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut

        ddp.register_comm_hook(None, keep)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    if args.time_steps:
        return time_steps(args, ddp, opt, loss_fn, x, y, rank, world)

    losses = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        total = torch.zeros(2, dtype=torch.float64)  # loss sum, batches
        for i in range(0, len(x), args.batch):
            idx = order[i : i + args.batch]
            opt.zero_grad()
            loss = loss_fn(ddp(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append((total[0] / total[1]).item())
        if rank == 0:
            print(f"epoch {epoch:3d}  loss {losses[-1]:.4f}", flush=True)

    # Every rank's weights, gathered and compared bit for bit.
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    same = all(torch.equal(e.view(torch.int32), flat.view(torch.int32)) for e in every)
    fell = losses[-1] < 0.6 * losses[0]
    if args.save:
        torch.save(model.state_dict(), args.save.format(rank=rank))
    if rank == 0:
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} ({'fell' if fell else 'DID NOT FALL'})")
        print(f"weights bit-identical on all {world} ranks: {same}", flush=True)
    dist.destroy_process_group()
    return 0 if same and fell else 1


def time_steps(args, ddp, opt, loss_fn, x, y, rank, world):
    """Mean time of one training step (forward, backward with DDP's allreduces, optimizer) over
    --time-steps steps after 3 warm-up steps, the slowest rank's; gradient bytes for context."""
    import time

    def step(i):
        idx = torch.arange(i * args.batch, (i + 1) * args.batch) % len(x)
        opt.zero_grad()
        loss_fn(ddp(x[idx]), y[idx]).backward()
        opt.step()

    for i in range(3):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.time_steps):
        step(i)
    mean = torch.tensor([(time.perf_counter() - t0) / args.time_steps], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    grad_bytes = sum(q.numel() * q.element_size() for q in ddp.parameters())
    if rank == 0:
        print(
            f"step_ms {mean.item() * 1e3:.3f} backend {args.backend} ranks {world} "
            f"gradient_bytes {grad_bytes} batch {args.batch}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
