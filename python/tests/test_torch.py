"""PyTorch CPU tensors, the torch.distributed backend, and DDP training under torchrun."""

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import oxccl as ccl  # noqa: E402
from ranks import run_ranks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def tensors(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid)
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        x = torch.full((1000,), rank + 1, dtype=dt)
        ptr = x.data_ptr()
        comm.all_reduce(x)  # in place, no copy
        assert x.data_ptr() == ptr
        assert (x == size * (size + 1) // 2).all(), (dt, x[:4])
        out = torch.empty_like(x)
        comm.all_reduce(torch.full((1000,), rank + 1, dtype=dt), op=ccl.MAX, out=out)
        assert (out == size).all()
    # bf16 average.
    x = torch.full((64,), float(rank), dtype=torch.bfloat16)
    comm.all_reduce(x, op=ccl.AVG)
    assert (x == (size - 1) / 2).all()
    # Views that are contiguous are fine: a row of a matrix.
    m = torch.zeros(3, 8)
    m[1] = rank + 1
    comm.all_reduce(m[1])
    assert (m[1] == size * (size + 1) / 2).all() and (m[0] == 0).all()
    # Allgather into a tensor, reduce-scatter, broadcast, non-blocking.
    g = torch.empty(size * 4, dtype=torch.int32)
    comm.all_gather(torch.full((4,), rank, dtype=torch.int32), out=g)
    assert g.tolist() == [r for r in range(size) for _ in range(4)]
    rs = torch.empty(2)
    comm.reduce_scatter(torch.arange(2.0 * size), out=rs)
    assert rs.tolist() == [size * (2 * rank), size * (2 * rank + 1)]
    b = torch.arange(5.0) * (rank + 1)
    w = comm.broadcast(b, root=size - 1, async_op=True)
    assert w.wait() is b and b.tolist() == [size * i for i in range(5)]
    comm.destroy()


def test_tensors_two_ranks():
    run_ranks(tensors, 2)


def test_refuses_non_contiguous_and_unsupported_tensors():
    comm = ccl.Communicator(0, 1, ccl.get_unique_id())
    with pytest.raises(ccl.CclError, match="non-contiguous tensor.*x.contiguous"):
        comm.all_reduce(torch.zeros(4, 4).t())
    with pytest.raises(ccl.CclError, match="dtype torch.bool"):
        comm.all_reduce(torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ccl.CclError, match="dtype torch.complex64"):
        comm.all_reduce(torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(ccl.CclError, match="the input is float32 but out is bfloat16"):
        comm.all_reduce(torch.zeros(4), out=torch.zeros(4, dtype=torch.bfloat16))
    comm.destroy()


def process_group(rank, size, uid, store_file):
    import torch.distributed as dist

    import oxccl.torch  # noqa: F401

    dist.init_process_group("oxccl", init_method="file://" + store_file, rank=rank, world_size=size)
    assert dist.get_backend() == "oxccl"
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    assert (t == size * (size + 1) / 2).all()
    for op, want in ((dist.ReduceOp.MAX, size), (dist.ReduceOp.MIN, 1), (dist.ReduceOp.AVG, (size + 1) / 2)):
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, op=op)
        assert (t == want).all(), (op, t)
    t = torch.full((3,), 2.0)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    assert (t == 2.0**size).all()
    w = dist.all_reduce(torch.ones(3), async_op=True)
    w.wait()
    b = torch.arange(4.0) if rank == 1 else torch.zeros(4)
    dist.broadcast(b, src=1)
    assert b.tolist() == [0.0, 1.0, 2.0, 3.0]
    r = torch.full((2,), float(rank))
    dist.reduce(r, dst=0)
    if rank == 0:
        assert (r == size * (size - 1) / 2).all()
    outs = [torch.zeros(2) for _ in range(size)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    assert [o.tolist() for o in outs] == [[float(i)] * 2 for i in range(size)]
    o = torch.zeros(2 * size)
    dist.all_gather_into_tensor(o, torch.full((2,), float(rank)))
    assert o.tolist() == [float(i) for i in range(size) for _ in range(2)]
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, torch.arange(2.0 * size))
    assert o.tolist() == [size * 2.0 * rank, size * (2.0 * rank + 1)]
    o = torch.zeros(2)
    dist.reduce_scatter(o, [torch.full((2,), float(i)) for i in range(size)])
    assert (o == size * rank).all()
    a = torch.arange(size, dtype=torch.float32) + 10 * rank
    o = torch.empty(size)
    dist.all_to_all_single(o, a)
    assert o.tolist() == [10.0 * i + rank for i in range(size)]
    dist.barrier()
    if rank == 0:
        dist.send(torch.arange(3.0), dst=1)
    elif rank == 1:
        got = torch.zeros(3)
        dist.recv(got, src=0)
        assert got.tolist() == [0.0, 1.0, 2.0]
    # One DDP step: different inputs, identical averaged gradients everywhere.
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.randn(8, 4)).square().sum().backward()
    grads = [torch.zeros_like(model.weight.grad) for _ in range(size)]
    dist.all_gather(grads, model.weight.grad)
    assert all(torch.equal(g, grads[0]) for g in grads)
    dist.destroy_process_group()


def test_process_group_three_ranks(tmp_path):
    run_ranks(process_group, 3, str(tmp_path / "store"))


def gather_shapes(rank, size, uid, store_file):
    """all_gather_coalesced pairs outputs as c10d does (output_lists[r][j] is input j of rank
    r), with tensors of different shapes and empty ones; all_gather of empty tensors."""
    import torch.distributed as dist

    import oxccl.torch  # noqa: F401

    dist.init_process_group("oxccl", init_method="file://" + store_file, rank=rank, world_size=size)
    shapes = [(2, 2), (0,), (3, 3, 3), (0,), (5,)]
    inputs = [torch.full(s, float(10 * rank + j)) for j, s in enumerate(shapes)]
    outputs = [[torch.full(s, -1.0) for s in shapes] for _ in range(size)]
    dist.all_gather_coalesced(outputs, inputs)
    for r in range(size):
        for j, s in enumerate(shapes):
            assert outputs[r][j].shape == s, (r, j, outputs[r][j].shape)
            assert (outputs[r][j] == 10 * r + j).all(), (r, j, outputs[r][j])
    empty = [torch.empty(0) for _ in range(size)]
    dist.all_gather(empty, torch.empty(0))
    assert all(e.numel() == 0 for e in empty)
    dist.destroy_process_group()


def test_all_gather_coalesced_and_empty_tensors(tmp_path):
    run_ranks(gather_shapes, 2, str(tmp_path / "store"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_training_under_torchrun(tmp_path):
    """examples/python/ddp_train.py with two ranks: the loss falls and the weights match."""
    env = dict(os.environ, CCL_SOCKET_IFNAME="=lo", OMP_NUM_THREADS="1")
    save = str(tmp_path / "rank{rank}.pt")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(REPO / "examples" / "python" / "ddp_train.py"),
        "--init-method",
        "file://" + str(tmp_path / "store"),
        "--save",
        save,
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = [float(x) for x in re.findall(r"epoch +\d+ +loss ([0-9.]+)", p.stdout)]
    assert len(losses) >= 5 and losses[-1] < 0.6 * losses[0], p.stdout
    assert "weights bit-identical on all 2 ranks: True" in p.stdout, p.stdout
    w0 = torch.load(save.format(rank=0))
    w1 = torch.load(save.format(rank=1))
    for k in w0:
        assert torch.equal(w0[k].view(torch.int32), w1[k].view(torch.int32)), k
