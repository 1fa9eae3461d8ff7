"""PyTorch's own distributed clients on the ccl backend give the numbers they give on Gloo:
FSDP2 (``fully_shard``), DTensor tensor parallelism, ``torch.distributed.checkpoint``, DDP with
communication hooks, functional collectives and ``torch.distributed.pipelining``, at 2 and 4
ranks. Each workload runs once on Gloo and once on ccl from the same seed; every number it
records (losses, gradient and parameter sums, collective results) must agree."""

import json
import os

import pytest

torch = pytest.importorskip("torch")

from ranks import run_ranks  # noqa: E402


def _mlp(width=16, depth=3):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _batch(rank, n=8, width=16):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)


def _train(model, rank, steps=3):
    """Three SGD steps on this rank's batches; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = _batch(rank + 10 * step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _fsdp2(dist, rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (size,))
    model = _mlp()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = _train(model, rank)
    full = [p.full_tensor().sum().item() for p in model.parameters()]
    return losses + full


def _tensor_parallel(dist, rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (size,))
    model = _mlp(width=8 * size, depth=2)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x, y = _batch(0, width=8 * size)  # the same input on every rank, as TP requires
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    grads = [p.grad.full_tensor().sum().item() for p in model.parameters()]
    return [loss.item()] + grads


def _checkpoint(dist, rank, size, where):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (size,))
    model = fully_shard(_mlp(), mesh=mesh)
    dcp.save({"model": model.state_dict()}, checkpoint_id=where)
    torch.manual_seed(1)
    fresh = fully_shard(_mlp(depth=3).apply(_scramble), mesh=mesh)
    state = {"model": fresh.state_dict()}
    dcp.load(state, checkpoint_id=where)
    fresh.load_state_dict(state["model"])
    return [p.full_tensor().sum().item() for p in fresh.parameters()]


def _scramble(m):
    if isinstance(m, torch.nn.Linear):
        torch.nn.init.uniform_(m.weight)


def _ddp_hooks(dist, rank, size):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    out = []
    for hook in (default_hooks.allreduce_hook, default_hooks.fp16_compress_hook):
        model = torch.nn.parallel.DistributedDataParallel(_mlp(), bucket_cap_mb=0.001)
        model.register_comm_hook(None, hook)
        out += _train(model, rank)
        out += [p.sum().item() for p in model.parameters()]
    return out


def _functional(dist, rank, size):
    import torch.distributed._functional_collectives as fc

    group = dist.group.WORLD
    t = torch.arange(4.0 * size) + rank
    a = fc.wait_tensor(fc.all_reduce(t, "sum", group))
    b = fc.wait_tensor(fc.all_gather_tensor(t, 0, group))
    c = fc.wait_tensor(fc.reduce_scatter_tensor(t, "sum", 0, group))
    d = fc.wait_tensor(fc.broadcast(t, 1, group))
    e = fc.wait_tensor(fc.all_to_all_single(t, None, None, group))
    return [x.sum().item() for x in (a, b, c, d, e)] + a.tolist() + c.tolist()


def _pipeline(dist, rank, size):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    # One stage per rank: every rank calls step() (its first call is a collective of the whole
    # pipeline group: the ranks vote on static or dynamic shapes with an all_reduce).
    stages = size
    torch.manual_seed(0)
    whole = [torch.nn.Linear(16, 16) for _ in range(stages)]
    stage = PipelineStage(whole[rank], rank, stages, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.mse_loss)
    x, y = _batch(0)
    losses = []
    if rank == 0:
        sched.step(x)
    elif rank == stages - 1:
        sched.step(target=y, losses=losses)
    else:
        sched.step()
    grads = [p.grad.sum().item() for p in whole[rank].parameters()]
    return [v.item() for v in losses] + grads


def clients(rank, size, uid, store_file, backend, out_dir):
    import torch.distributed as dist

    if backend == "oxccl":
        import oxccl.torch  # noqa: F401
    dist.init_process_group(backend, init_method="file://" + store_file, rank=rank, world_size=size)
    torch.set_num_threads(1)
    results = {
        "fsdp2": _fsdp2(dist, rank, size),
        "tensor_parallel": _tensor_parallel(dist, rank, size),
        "checkpoint": _checkpoint(dist, rank, size, os.path.join(out_dir, "dcp")),
        "ddp_hooks": _ddp_hooks(dist, rank, size),
        "functional": _functional(dist, rank, size),
        "pipeline": _pipeline(dist, rank, size),
    }
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _run(tmp_path, backend, size):
    out = tmp_path / backend
    out.mkdir()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    run_ranks(clients, size, str(tmp_path / f"store-{backend}"), backend, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(size)]


@pytest.mark.parametrize("size", [2, 4])
def test_clients_give_the_numbers_they_give_on_gloo(tmp_path, size):
    gloo = _run(tmp_path, "gloo", size)
    ccl = _run(tmp_path, "oxccl", size)
    for r in range(size):
        for client, want in gloo[r].items():
            got = ccl[r][client]
            assert len(got) == len(want), client
            assert got, client
            # Sums may be added in another order: equal to float32 rounding.
            torch.testing.assert_close(
                torch.tensor(got, dtype=torch.float64),
                torch.tensor(want, dtype=torch.float64),
                rtol=1e-4,
                atol=1e-5,
                msg=lambda m, c=client, rr=r: f"{c}, rank {rr} of {size}: {m}",
            )
