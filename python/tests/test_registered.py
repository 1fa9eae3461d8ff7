"""Registered memory from Python: comm.alloc, with comm.register(...), and their errors."""

import time

import numpy as np
import pytest

import oxccl as ccl
from ranks import run_ranks


def registered(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid)
    a = comm.alloc((3, 1000), np.float32)
    assert a.shape == (3, 1000) and a.dtype == np.float32
    assert a.ctypes.data % 4096 == 0, "page aligned"
    assert not a.any(), "zeroed"
    a[:] = rank + 1
    comm.all_reduce(a)
    np.testing.assert_array_equal(a, np.full((3, 1000), size * (size + 1) / 2, np.float32))
    # A view keeps the memory alive after the array itself is gone.
    v = a[1]
    del a
    comm.all_reduce(v, op=ccl.MAX)
    assert v[0] == size * (size + 1) / 2

    x = np.arange(4096, dtype=np.int64) + rank
    y = np.zeros_like(x)
    with comm.register(x), comm.register(y):
        comm.all_reduce(x, out=y)
    np.testing.assert_array_equal(y, size * np.arange(4096) + size * (size - 1) // 2)

    # Leaving the block while an operation on the array is pending is an error. The other ranks
    # join that operation a second after the barrier, so it is still pending on rank 0.
    comm.barrier()
    if rank != 0:
        time.sleep(1)
    reg = comm.register(x)
    reg.__enter__()
    w = comm.all_reduce(x, async_op=True)
    if rank == 0:
        assert not w.test()
        with pytest.raises(ccl.CclError, match="in flight"):
            reg.__exit__(None, None, None)
    w.wait()
    if rank != 0:
        reg.__exit__(None, None, None)

    # Large arrays from alloc on every rank: on one host, read and written in place.
    for n in ((1 << 20) + 3, 5):
        s = comm.alloc(n, np.float32)
        d = comm.alloc(n, np.float32)
        s[:] = np.arange(n, dtype=np.float32) % 7 + rank
        comm.all_reduce(s, out=d)
        np.testing.assert_array_equal(d, size * (np.arange(n) % 7) + size * (size - 1) / 2)
        comm.all_reduce(s, op=ccl.MAX)
        np.testing.assert_array_equal(s, np.arange(n) % 7 + size - 1)

    with pytest.raises(ccl.CclError, match="dtype"):
        comm.alloc(4, np.complex64)
    comm.destroy()


def test_registered_memory():
    run_ranks(registered, 2)
