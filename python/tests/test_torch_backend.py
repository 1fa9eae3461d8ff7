"""The torch.distributed backend: registration, asynchronous work, every op, errors, timeouts."""

import time
from datetime import timedelta

import pytest

torch = pytest.importorskip("torch")

from ranks import run_ranks  # noqa: E402


def _init(rank, size, store_file, timeout=None):
    # No import of oxccl.torch: torch finds the backend through the package's entry point.
    import torch.distributed as dist

    kw = {} if timeout is None else {"timeout": timeout}
    dist.init_process_group(
        "oxccl", init_method="file://" + store_file, rank=rank, world_size=size, **kw
    )
    return dist


def registration_and_groups(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    import oxccl.torch

    pg = dist.group.WORLD
    assert dist.get_backend() == "oxccl"
    assert pg.group_name, "the group has a name"
    assert torch.device("cpu") in pg._device_types
    assert isinstance(pg._get_backend(torch.device("cpu")), oxccl.torch.ProcessGroupOxccl)
    # A subgroup of all but the last rank, and one of everyone: both work and both go away.
    sub = dist.new_group(list(range(size - 1)))
    full = dist.new_group()
    t = torch.ones(3)
    if rank < size - 1:
        dist.all_reduce(t, group=sub)
        assert (t == size - 1).all()
    dist.all_reduce(t, group=full)
    dist.barrier(device_ids=[0])  # device ids name GPUs: ignored
    dist.monitored_barrier(timeout=timedelta(seconds=60))
    dist.destroy_process_group(sub)
    dist.destroy_process_group(full)
    dist.all_reduce(t)
    dist.destroy_process_group()


def test_registration_subgroups_and_destroy(tmp_path):
    run_ranks(registration_and_groups, 3, str(tmp_path / "store"))


def async_work(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    # Launching returns before the operation can finish: rank 1 joins the allreduce only after
    # rank 0 has said, through the store, that its launch returned. A blocking backend would
    # deadlock here (and the test fail at its deadline).
    store = dist.distributed_c10d._get_default_store()
    big = torch.full((1 << 20,), float(rank + 1))
    if rank == 0:
        w = dist.all_reduce(big, async_op=True)
        store.set("launched", "1")
        fut = w.get_future()
        assert w.wait() is True
        assert fut.wait()[0] is big
    else:
        store.wait(["launched"], timedelta(seconds=60))
        dist.all_reduce(big)
    assert (big == size * (size + 1) / 2).all()
    # A future chained as DDP's communication hooks chain it.
    t = torch.full((4,), float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert fut.wait().tolist() == [size * (size - 1)] * 4
    # Many in flight at once, waited in reverse.
    ts = [torch.full((100,), float(i)) for i in range(8)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for w in reversed(works):
        w.wait()
    assert all((x == i * size).all() for i, x in enumerate(ts))
    dist.destroy_process_group()


def test_async_work_overlaps_and_completes_futures(tmp_path):
    run_ranks(async_work, 2, str(tmp_path / "store"))


def reduce_ops(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    R = dist.ReduceOp
    assert size == 2
    for op, want in ((R.BAND, 0b1100), (R.BOR, 0b1101), (R.BXOR, 0b0001)):
        t = torch.tensor([0b1100 | rank], dtype=torch.int32)
        dist.all_reduce(t, op=op)
        assert t.item() == want, (op, t)
    for dt in (torch.uint8, torch.int64, torch.bool):
        t = torch.tensor([1, 0, rank % 2], dtype=dt)
        dist.all_reduce(t, op=R.BOR)
        assert t.tolist() == [1, 0, 1] if dt != torch.bool else [True, False, True]
    with pytest.raises(RuntimeError, match="integer types only, not float"):
        dist.all_reduce(torch.ones(2), op=R.BAND)
    # PREMUL_SUM: scale, then sum; on allreduce, reduce and reduce-scatter.
    premul = dist._make_nccl_premul_sum(0.5)
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, op=premul)
    assert (t == 0.5 * size * (size + 1) / 2).all()
    t = torch.full((4,), float(rank + 1))
    dist.reduce(t, dst=0, op=dist._make_nccl_premul_sum(torch.tensor([2.0])))
    assert (t == (size * (size + 1) if rank == 0 else rank + 1)).all(), t
    out = torch.zeros(2)
    dist.reduce_scatter_tensor(out, torch.arange(2.0 * size), op=premul)
    assert out.tolist() == [0.5 * size * 2 * rank, 0.5 * size * (2 * rank + 1)]
    # bool sums are logical or; complex sums per component.
    b = torch.tensor([rank == 0, False])
    dist.all_reduce(b)
    assert b.tolist() == [True, False]
    c = torch.full((3,), complex(rank, 1))
    dist.all_reduce(c)
    assert (c == complex(size * (size - 1) / 2, size)).all()
    # Sparse all_reduce: sum of COO tensors.
    i = torch.tensor([[rank, 3]])
    s = torch.sparse_coo_tensor(i, torch.tensor([1.0, float(rank)]), (4,))
    dist.all_reduce(s)
    want = torch.zeros(4)
    for r in range(size):
        want[r] += 1
        want[3] += r
    assert torch.equal(s.to_dense(), want), s
    dist.destroy_process_group()


def test_reduce_ops(tmp_path):
    run_ranks(reduce_ops, 2, str(tmp_path / "store"))


def uneven_and_rooted(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    # gather / scatter, to and from every root, with non-contiguous outputs.
    for root in range(size):
        outs = [torch.zeros(3, 2).t() for _ in range(size)] if rank == root else None
        dist.gather(torch.full((2, 3), float(rank)), outs, dst=root)
        if rank == root:
            assert all((o == r).all() and o.shape == (2, 3) for r, o in enumerate(outs))
        got = torch.zeros(5, dtype=torch.int64)
        ins = [torch.full((5,), 10 * r + root) for r in range(size)] if rank == root else None
        dist.scatter(got, ins, src=root)
        assert (got == 10 * rank + root).all()
    # Uneven all_to_all_single: rank r sends r + 1 + k rows to rank k.
    splits_in = [rank + 1 + k for k in range(size)]
    splits_out = [r + 1 + rank for r in range(size)]
    inp = torch.cat([torch.full((n, 2), float(100 * rank + k)) for k, n in enumerate(splits_in)])
    out = torch.empty(sum(splits_out), 2)
    dist.all_to_all_single(out, inp, splits_out, splits_in)
    want = torch.cat([torch.full((n, 2), float(100 * r + rank)) for r, n in enumerate(splits_out)])
    assert torch.equal(out, want)
    # A non-contiguous all_to_all_single is refused before anything is sent, as Gloo does.
    with pytest.raises(ValueError, match="Tensors must be contiguous"):
        dist.all_to_all_single(torch.empty(size, size), torch.ones(size, size).t())
    # Uneven all_to_all over lists, and all_gather with per-rank sizes.
    outs = [torch.empty(r + 1) for r in range(size)]
    dist.all_to_all(outs, [torch.full((rank + 1,), float(k)) for k in range(size)])
    assert all((o == rank).all() and o.numel() == r + 1 for r, o in enumerate(outs))
    outs = [torch.empty(r + 2, dtype=torch.int16) for r in range(size)]
    dist.all_gather(outs, torch.full((rank + 2,), rank, dtype=torch.int16))
    assert all((o == r).all() for r, o in enumerate(outs))
    # Objects (built on the above), including gather_object.
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank, "pad": "x" * rank * 100})
    assert [o["rank"] for o in objs] == list(range(size))
    gathered = [None] * size if rank == 0 else None
    dist.gather_object(("r", rank), gathered, dst=0)
    if rank == 0:
        assert gathered == [("r", r) for r in range(size)]
    dist.destroy_process_group()


def test_gather_scatter_and_uneven_collectives(tmp_path):
    run_ranks(uneven_and_rooted, 3, str(tmp_path / "store"))


def point_to_point(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    peer = 1 - rank
    # Both ranks post a send then a receive before waiting: with blocking sends of a message
    # larger than any socket buffer, this would deadlock.
    big_out = torch.full((4 << 20,), float(rank))
    big_in = torch.empty(4 << 20)
    ws = [dist.isend(big_out, peer), dist.irecv(big_in, peer)]
    for w in ws:
        w.wait()
    assert (big_in == peer).all()
    # batch_isend_irecv, two each way in order, with tags.
    a, b = torch.empty(3), torch.empty(5)
    ops = [
        dist.P2POp(dist.isend, torch.full((3,), 1.0 + rank), peer, tag=7),
        dist.P2POp(dist.isend, torch.full((5,), 2.0 + rank), peer, tag=8),
        dist.P2POp(dist.irecv, a, peer, tag=7),
        dist.P2POp(dist.irecv, b, peer, tag=8),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert (a == 1.0 + peer).all() and (b == 2.0 + peer).all()
    # Blocking send/recv, a non-contiguous receive buffer, and a future on a receive.
    if rank == 0:
        dist.send(torch.arange(6.0).view(2, 3), 1)
        dist.send(torch.arange(4.0), 1, tag=3)
    else:
        m = torch.zeros(3, 2).t()
        dist.recv(m, 0)
        assert torch.equal(m, torch.arange(6.0).view(2, 3))
        got = torch.zeros(4)
        assert dist.irecv(got, 0, tag=3).get_future().wait()[0] is got
        assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    # A tag that does not match the message is an error, not silently wrong data.
    if rank == 0:
        dist.send(torch.ones(2), 1, tag=1)
    else:
        with pytest.raises(RuntimeError, match="with tag 2 got the message sent with tag 1"):
            dist.recv(torch.zeros(2), 0, tag=2)
    dist.barrier()
    dist.destroy_process_group()


def test_point_to_point(tmp_path):
    run_ranks(point_to_point, 2, str(tmp_path / "store"))


def any_source(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    # Each rank in turn receives two messages from every other one, without naming the
    # sender (as PyTorch's test_send_recv_any_source): dist.recv returns it, and an irecv's
    # work says it; each message holds its sender's rank, and each sender comes twice. One tag
    # for all: a receive from any source takes the first send whatever its tag.
    for dst in range(size):
        if dst != rank:
            dist.send(torch.full((10,), float(rank)), dst, tag=5)
            dist.send(torch.full((10,), float(rank)), dst, tag=5)
            continue
        seen = []
        for _ in range(size - 1):
            t = torch.full((10,), -1.0)
            src = dist.recv(t, tag=5)
            assert (t == src).all(), (src, t)
            u = torch.full((10,), -1.0)
            w = dist.irecv(u, tag=5)
            w.wait()
            assert (u == w._source_rank()).all(), (w._source_rank(), u)
            seen += [src, w._source_rank()]
        assert sorted(seen) == sorted(2 * [r for r in range(size) if r != rank]), seen
    # Until everyone is through, a later send could be the one a receive above takes.
    dist.barrier()
    # A receive from any source among recorded transfers runs after those before it.
    peer = (rank + 1) % size
    a = torch.full((4,), -1.0)
    ops = [dist.isend(torch.full((4,), float(rank)), peer), dist.irecv(a)]
    for w in ops:
        w.wait()
    assert (a == (rank - 1) % size).all() and ops[1]._source_rank() == (rank - 1) % size
    with pytest.raises(RuntimeError, match="not a receive"):
        ops[0]._source_rank()
    dist.barrier()
    dist.destroy_process_group()


def test_recv_from_any_source(tmp_path):
    run_ranks(any_source, 3, str(tmp_path / "store"))


def group_timeout(rank, size, uid, store_file):
    dist = _init(rank, size, store_file, timeout=timedelta(seconds=1))
    patient = dist.new_group(timeout=timedelta(seconds=60))
    dist.barrier()
    if rank == 0:
        # wait(timeout) on an operation rank 1 never joins.
        with pytest.raises(RuntimeError, match="Timed out waiting 200ms"):
            dist.all_reduce(torch.ones(1), group=patient, async_op=True).wait(
                timedelta(milliseconds=200)
            )
        with pytest.raises(RuntimeError, match="Rank 1 failed to pass monitoredBarrier"):
            dist.monitored_barrier(patient, timeout=timedelta(milliseconds=300))
        # Rank 1 never joins: the group's 1 s timeout ends it (CCL_TIMEOUT is 60 s here).
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=" timeout .*peer 1"):
            dist.barrier()
        took = time.monotonic() - t0
        assert 0.9 <= took < 30, took
    # Keep rank 1 connected until rank 0 is done (a closed connection fails sooner).
    time.sleep(6 if rank == 1 else 0)
    dist.destroy_process_group()


def test_group_timeout_is_honoured(tmp_path):
    run_ranks(group_timeout, 2, str(tmp_path / "store"))


def abort_pending(rank, size, uid, store_file):
    dist = _init(rank, size, store_file)
    dist.barrier()
    if rank == 0:
        w = dist.all_reduce(torch.ones(1 << 16), async_op=True)  # rank 1 never joins
        fut = w.get_future()
        time.sleep(0.5)
        t0 = time.monotonic()
        dist.group.WORLD._get_backend(torch.device("cpu")).abort()
        with pytest.raises(RuntimeError, match="abort"):
            w.wait()
        with pytest.raises(RuntimeError, match="abort"):
            fut.wait()
        assert time.monotonic() - t0 < 30
        with pytest.raises(RuntimeError, match="aborted"):
            dist.all_reduce(torch.ones(1))
    else:
        time.sleep(3)


def test_abort_ends_pending_work(tmp_path):
    run_ranks(abort_pending, 2, str(tmp_path / "store"))


def native_additions(rank, size, uid, store_file):
    """What only the native backend can do: calls torch passes to C++ backends alone, and the
    work object torch hands back unwrapped."""
    dist = _init(rank, size, store_file)
    from torch.distributed import _functional_collectives as fc

    pg = dist.distributed_c10d._get_default_group()
    # Sequence numbers: per group, per collective, on the work too.
    start = pg._get_sequence_number_for_group()
    w = dist.all_reduce(torch.ones(1), async_op=True)
    assert w._get_sequence_number() == start + 1 == pg._get_sequence_number_for_group()
    assert w.wait() and w.is_completed()
    from torch._C._distributed_c10d import WorkResult

    w = dist.all_reduce(torch.ones(2), async_op=True)
    assert WorkResult(w.get_future_result().wait()) == WorkResult.SUCCESS and w.is_completed()
    # Waiting unregisters the work from torch's registry.
    with fc.allow_inflight_collective_as_graph_input_ctx():
        n0 = torch._C._distributed_c10d._get_work_registry_size()
        w = dist.all_reduce(torch.ones(1), async_op=True)
        assert torch._C._distributed_c10d._get_work_registry_size() == n0 + 1
        w.wait()
        assert torch._C._distributed_c10d._get_work_registry_size() == n0
    # gather_into_tensor, to every root, into a non-contiguous output.
    for root in range(size):
        out = torch.zeros(3, size).t() if rank == root else None
        dist.gather_into_tensor(torch.full((3,), float(rank)), out, dst=root)
        if rank == root:
            assert torch.equal(out, torch.arange(float(size)).repeat_interleave(3).view(size, 3))
    # reduce_scatter with a block of its own size per rank.
    ins = [torch.full((r + 1,), float(rank + 1)) for r in range(size)]
    out = torch.zeros(rank + 1)
    dist.reduce_scatter(out, ins)
    assert (out == size * (size + 1) / 2).all(), out
    # Coalesced collectives: one work for the block.
    a, b = torch.ones(4), torch.full((2,), 2.0)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    assert (a == size).all() and (b == 2 * size).all()
    # split_group: cclCommSplit under torch's groups (here {0, 1} and {2}).
    assert size == 3
    sub = dist.split_group(split_ranks=[[0, 1], [2]])
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    assert (t == (2 if rank < 2 else 1)).all(), t
    assert dist.get_group_rank(sub, rank) == (rank if rank < 2 else 0)
    dist.destroy_process_group()


def test_native_additions(tmp_path):
    run_ranks(native_additions, 3, str(tmp_path / "store"))
