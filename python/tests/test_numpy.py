"""Collectives on numpy arrays across processes, and the errors the package raises."""

import numpy as np
import pytest

import oxccl as ccl
from ranks import run_ranks

DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]


def contrib(rank, n, dtype):
    """Rank r's data: r + 1 + i % 3, small and exact in every type."""
    return (rank + 1 + np.arange(n) % 3).astype(dtype)


BITWISE = {ccl.BAND: np.bitwise_and, ccl.BOR: np.bitwise_or, ccl.BXOR: np.bitwise_xor}


def expected(op, size, n, dtype):
    if op in BITWISE:
        xs = [contrib(r, n, "int64") for r in range(size)]
        return BITWISE[op].reduce(xs).astype(dtype)
    xs = [contrib(r, n, "float64") for r in range(size)]
    if op == ccl.SUM:
        v = sum(xs)
    elif op == ccl.PROD:
        v = np.prod(xs, axis=0)
    elif op == ccl.MAX:
        v = np.max(xs, axis=0)
    elif op == ccl.MIN:
        v = np.min(xs, axis=0)
    else:
        v = sum(xs) / size
        if not np.issubdtype(np.dtype(dtype), np.floating):
            v = np.trunc(v)
    return v.astype(dtype)


def collectives(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid)
    assert (comm.rank, comm.size) == (rank, size)
    n = 1003
    for dt in DTYPES:
        for op in ccl.ReduceOp:
            x = contrib(rank, n, dt)
            if op in BITWISE and np.dtype(dt).kind == "f":
                with pytest.raises(ccl.CclError, match="integer types only, not (half|float|double)"):
                    comm.all_reduce(x, op=op)
                continue
            want = expected(op, size, n, dt)
            out = np.empty_like(x)
            assert comm.all_reduce(x, op=op, out=out) is out
            np.testing.assert_allclose(out.astype("float64"), want.astype("float64"), rtol=1e-3)
            assert comm.all_reduce(x, op=op) is x  # in place
            np.testing.assert_allclose(x.astype("float64"), want.astype("float64"), rtol=1e-3)

    # Broadcast and reduce, in and out of place, from every root.
    for root in range(size):
        x = np.arange(10, dtype=np.float32) + 100 * rank
        out = np.zeros(10, np.float32)
        comm.broadcast(x if rank == root else None, root=root, out=out)
        assert (out == np.arange(10) + 100 * root).all()
        comm.broadcast(x, root=root)
        assert (x == np.arange(10) + 100 * root).all()
        y = np.full(7, rank + 1, np.int64)
        r = np.zeros(7, np.int64)
        comm.reduce(y, op=ccl.SUM, root=root, out=r)
        assert (r == (size * (size + 1) // 2 if rank == root else 0)).all()
        comm.reduce(y, op=ccl.MAX, root=root)
        assert (y == (size if rank == root else rank + 1)).all()

    # Allgather, reduce-scatter, alltoall, in and out of place.
    m = 5
    mine = np.full(m, rank, np.float64)
    g = np.empty(m * size)
    comm.all_gather(mine, out=g)
    assert (g == np.repeat(np.arange(size), m)).all()
    g[:] = -1
    g[rank * m : (rank + 1) * m] = rank
    comm.all_gather(g)
    assert (g == np.repeat(np.arange(size), m)).all()

    src = np.arange(m * size, dtype=np.int32) + rank
    rs = np.empty(m, np.int32)
    comm.reduce_scatter(src, out=rs)
    block = np.arange(rank * m, (rank + 1) * m)
    assert (rs == size * block + size * (size - 1) // 2).all()
    comm.reduce_scatter(src)
    assert (src[rank * m : (rank + 1) * m] == size * block + size * (size - 1) // 2).all()

    a2a = np.array([rank * 100 + k for k in range(size) for _ in range(m)], np.int64)
    out = np.empty_like(a2a)
    comm.all_to_all(a2a, out=out)
    assert (out == np.repeat(np.arange(size) * 100 + rank, m)).all()
    comm.all_to_all(a2a)
    assert (a2a == out).all()
    comm.barrier()

    # Non-blocking: issued in order, waited later.
    big = np.full(1 << 18, rank + 1.0, np.float32)
    w1 = comm.all_reduce(big, op=ccl.SUM, async_op=True)
    gathered = np.empty(size, np.float32)
    w2 = comm.all_gather(big[:1], out=gathered, async_op=True)
    w3 = comm.barrier(async_op=True)
    assert w1.wait() is big
    w2.wait()
    w3.wait()
    assert w1.test() and (big == size * (size + 1) / 2).all()
    assert (gathered == size * (size + 1) / 2).all()

    # Send right, receive left: grouped so it cannot deadlock.
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.full(1 << 20, rank, np.int32)
    inbox = np.empty_like(out)
    with ccl.group():
        comm.send(out, right)
        comm.recv(inbox, left)
    assert (inbox == left).all()

    # From any source: the others send their rank to rank 0, which takes each once.
    if rank:
        comm.send(np.full(3, rank, np.int64), 0)
    else:
        got = set()
        for _ in range(size - 1):
            if got:
                buf = np.empty(3, np.int64)
                peer = comm.recv_any(buf)
            else:
                peer, nbytes = comm.probe()
                assert nbytes == 24
                buf = np.empty(3, np.int64)
                comm.recv(buf, peer)
            assert (buf == peer).all()
            got.add(peer)
        assert got == set(range(1, size))
    with ccl.group(), pytest.raises(ccl.CclError, match="cclProbe inside a group"):
        comm.probe()

    # Split into even and odd ranks.
    sub = comm.split(rank % 2, key=rank)
    v = np.array([rank], np.int64)
    sub.all_reduce(v)
    assert v[0] == sum(r for r in range(size) if r % 2 == rank % 2)
    sub.destroy()
    comm.destroy()


def test_collectives_three_ranks():
    run_ranks(collectives, 3)


def single():
    return ccl.Communicator(0, 1, ccl.get_unique_id())


def test_refuses_bad_buffers_with_clear_messages():
    comm = single()
    with pytest.raises(ccl.CclError, match="dtype bool, which ccl does not handle"):
        comm.all_reduce(np.zeros(4, bool))
    with pytest.raises(ccl.CclError, match="dtype complex64"):
        comm.all_reduce(np.zeros(4, np.complex64))
    with pytest.raises(ccl.CclError, match="not C-contiguous"):
        comm.all_reduce(np.zeros(8, np.float32)[::2])
    with pytest.raises(ccl.CclError, match="not C-contiguous"):
        comm.all_reduce(np.zeros((4, 4), np.float32).T)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ccl.CclError, match="out is read-only"):
        comm.all_reduce(np.zeros(4, np.float32), out=ro)
    with pytest.raises(ccl.CclError, match="4 elements but out has 5"):
        comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(5, np.float32))
    with pytest.raises(ccl.CclError, match="float32 but out is float64"):
        comm.all_reduce(np.zeros(4, np.float32), out=np.zeros(4))
    with pytest.raises(ccl.CclError, match="type list is not an array"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(ccl.CclError, match="not an oxccl.ReduceOp"):
        comm.all_reduce(np.zeros(4), op=17)
    # Errors found by the C library carry its message and code.
    with pytest.raises(ccl.CclError, match="cclBroadcast: invalid argument: root 3 is out of range") as e:
        comm.broadcast(np.zeros(4), root=3)
    assert e.value.code == ccl.INVALID_ARGUMENT
    with pytest.raises(ccl.CclError, match="cclSend: invalid argument: peer 1 is out of range"):
        comm.send(np.zeros(4), 1)
    # A wrong unique id.
    with pytest.raises(ccl.CclError, match="malformed unique id") as e:
        ccl.Communicator(0, 1, bytes(128))
    assert e.value.code == ccl.INVALID_ARGUMENT
    with pytest.raises(ccl.CclError, match="128 bytes, got 3"):
        ccl.Communicator(0, 1, b"abc")
    # Argument errors leave the communicator working.
    x = np.ones(3)
    comm.all_reduce(x)
    assert comm.error() is None
    comm.destroy()
    with pytest.raises(ccl.CclError, match="destroyed") as e:
        comm.all_reduce(x)
    assert e.value.code == ccl.INVALID_USAGE


def test_buffer_protocol_objects_without_copies():
    comm = single()
    b = bytearray(b"\x01\x02\x03")
    comm.all_reduce(memoryview(b), op=ccl.SUM)  # one rank: unchanged, but accepted in place
    assert b == bytearray(b"\x01\x02\x03")
    out = bytearray(3)
    comm.all_reduce(memoryview(bytes(b)), out=out)
    assert out == b
    comm.destroy()


def test_version_and_library():
    assert ccl.version() == 100
    assert ccl.library_path().endswith("libccl.so")
    assert len(ccl.get_unique_id()) == 128


FROM_ENV = """
import numpy as np, oxccl as ccl
comm = ccl.Communicator.from_env()
x = np.full(8, comm.rank + 1, np.int64)
comm.all_reduce(x)
assert (x == comm.size * (comm.size + 1) // 2).all(), x
print("rank", comm.rank, "of", comm.size, "ok")
comm.destroy()
"""


def test_from_env_with_launcher_variables():
    """What torchrun or mpirun would set: rank, size and where rank 0 runs the rendezvous."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(2):
        env = dict(
            os.environ,
            CCL_RANK=str(r),
            CCL_WORLD_SIZE="2",
            CCL_COMM_ID=f"127.0.0.1:{port}",
            CCL_SOCKET_IFNAME="=lo",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", FROM_ENV], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "rank 1 of 2 ok" in outs[1]


def rooted_and_uneven(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid)
    m = 4
    for root in range(size):
        mine = np.arange(m, dtype=np.int32) + 10 * rank
        want = np.concatenate([np.arange(m, dtype=np.int32) + 10 * r for r in range(size)])
        # Gather: out on the root only.
        out = np.full(m * size, -1, np.int32) if rank == root else None
        got = comm.gather(mine, out=out, root=root)
        if rank == root:
            assert got is out and (out == want).all()
        # In place on the root; others just send.
        if rank == root:
            buf = np.full(m * size, -1, np.int32)
            buf[root * m : (root + 1) * m] = mine
            comm.gather(buf, root=root)
            assert (buf == want).all()
        else:
            comm.gather(mine, root=root)
        # Scatter, non-blocking: block k of the root's buffer to rank k.
        out = np.zeros(m, np.int32)
        w = comm.scatter(want + root if rank == root else None, out=out, root=root, async_op=True)
        assert w.wait() is out and (out == np.arange(m) + 10 * rank + root).all()

    # Allgatherv: rank k contributes k % 3 elements, placed in reverse rank order.
    counts = [k % 3 for k in range(size)]
    displs, off = [0] * size, 0
    for k in reversed(range(size)):
        displs[k] = off
        off += counts[k]
    out = np.full(off, -1.0)
    comm.all_gather_v(np.full(counts[rank], float(rank)), out, counts, displs)
    for k in range(size):
        assert (out[displs[k] : displs[k] + counts[k]] == k).all()
    # In place, packed.
    buf = np.full(sum(counts), -1.0)
    start = sum(counts[:rank])
    buf[start : start + counts[rank]] = rank
    comm.all_gather_v(None, buf, counts)
    assert (buf == np.repeat(np.arange(size), counts)).all()

    # Reduce-scatterv: sum of every rank's block `rank`, out of place and in place.
    total = sum(counts)
    x = np.arange(total, dtype=np.int64) + rank
    out = np.zeros(counts[rank], np.int64)
    comm.reduce_scatter_v(x, counts, op=ccl.SUM, out=out)
    want = size * (np.arange(total)[start : start + counts[rank]]) + size * (size - 1) // 2
    assert (out == want).all()
    comm.reduce_scatter_v(x, counts, op=ccl.SUM)
    assert (x[start : start + counts[rank]] == want).all()

    # Alltoallv: rank a sends rank b (a + b) % 3 elements of value 100 a + b.
    sc = [(rank + k) % 3 for k in range(size)]
    rc = [(k + rank) % 3 for k in range(size)]
    send = np.concatenate([np.full(c, 100 * rank + k, np.int32) for k, c in enumerate(sc)])
    out = np.full(sum(rc), -1, np.int32)
    comm.all_to_all_v(send, sc, out, rc)
    want = np.concatenate([np.full(c, 100 * k + rank, np.int32) for k, c in enumerate(rc)])
    assert (out == want).all()
    comm.all_to_all_v(None, None, send, rc)  # in place: the counts are symmetric
    assert (send == want).all()


def disagreeing_counts(rank, size, uid):
    """Counts that disagree fail on the rank that finds out, naming the peer, and fail the
    communicator everywhere by the next call. A fresh communicator, so that no earlier call can
    still be in flight on a rank when the failure reaches it: a failure ends every operation in
    flight, earlier ones included (docs/diagnosis.md)."""
    comm = ccl.Communicator(rank, size, uid)
    bad = [2] * size
    if rank == size - 1:
        bad[0] = 1
    try:
        comm.all_gather_v(np.zeros(bad[rank]), np.zeros(sum(bad)), bad)
        comm.barrier()
        raise AssertionError("disagreeing counts went unnoticed")
    except ccl.CclError as e:
        assert "mismatched calls" in e.message or "failed" in e.message, e.message
    with pytest.raises(ccl.CclError, match="counts has 2 entries for"):
        ccl.Communicator.all_gather_v(comm, np.zeros(1), np.zeros(2), [1, 1])


def test_gather_scatter_and_v_collectives_three_ranks():
    run_ranks(rooted_and_uneven, 3)


def test_disagreeing_counts_fail_every_rank():
    run_ranks(disagreeing_counts, 3)
