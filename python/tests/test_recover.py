"""Revoke and shrink through the C ABI: a rank dies, the survivors shrink and go on."""

import os

import numpy as np
import pytest

import oxccl as ccl
from ranks import run_ranks


def survive_a_death(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid, timeout=30)
    x = np.ones(1024)
    if rank == size - 1:
        for _ in range(3):
            comm.all_reduce(x)
        os._exit(0)  # no goodbye: the rendezvous reports this rank dead
    # The others may fail in any of these, even the first three: a failure ends every
    # operation in flight, one the dead rank already finished too.
    with pytest.raises(ccl.CclError) as e:
        for _ in range(100000):
            comm.all_reduce(x)
    # The death itself, or the revocation by a survivor that shrinks first.
    assert f"rank {size - 1} died" in e.value.message or e.value.code == ccl.REVOKED, e.value.message
    assert comm.failed_ranks() in ([], [size - 1])
    s = comm.shrink()
    assert (s.rank, s.size) == (rank, size - 1), (s.rank, s.size)
    y = np.full(1024, float(rank + 1))
    s.all_reduce(y)
    assert (y == (size - 1) * size / 2).all()
    # The old communicator is revoked.
    with pytest.raises(ccl.CclError) as e:
        comm.barrier()
    assert e.value.code in (ccl.REVOKED, ccl.REMOTE_ERROR)


def rank_0_dies_with_the_rendezvous(rank, size, uid):
    # Rank 0 made the unique id: the job's rendezvous and monitor run in its process.
    comm = ccl.Communicator(rank, size, uid, timeout=30)
    x = np.ones(1024)
    if rank == 0:
        for _ in range(3):
            comm.all_reduce(x)
        os._exit(0)  # the rendezvous ends with it
    with pytest.raises(ccl.CclError) as e:
        for _ in range(100000):
            comm.all_reduce(x)
    assert "rank 0 died" in e.value.message or e.value.code == ccl.REVOKED, e.value.message
    # Another rank took the job's monitor over: the survivors agree through it.
    s = comm.shrink()
    assert (s.rank, s.size) == (rank - 1, size - 1), (s.rank, s.size)
    y = np.full(1024, float(rank))
    s.all_reduce(y)
    assert (y == (size - 1) * size / 2).all()
    assert 0 in comm.failed_ranks(), comm.failed_ranks()


def revoke_and_exclude(rank, size, uid):
    comm = ccl.Communicator(rank, size, uid, timeout=30)
    if rank == 0:
        comm.revoke()
    else:
        with pytest.raises(ccl.CclError) as e:
            comm.barrier()  # rank 0 never joins: only the revocation ends it
        assert e.value.code == ccl.REVOKED, e.value.message
    if rank == 1:
        with pytest.raises(ccl.CclError) as e:
            comm.shrink([rank])
        assert e.value.code == ccl.INVALID_ARGUMENT
        with pytest.raises(ccl.CclError) as e:
            comm.shrink()
        assert e.value.code == ccl.REVOKED, e.value.message
        return
    s = comm.shrink([1])
    assert s.size == size - 1
    s.barrier()


def test_survivors_of_a_death_shrink_and_compute():
    run_ranks(survive_a_death, 4, dying=(3,))


def test_rank_0_that_made_the_unique_id_dies_and_the_others_shrink():
    run_ranks(rank_0_dies_with_the_rendezvous, 4, dying=(0,), uid_from_rank0=True)


def test_revoke_ends_blocked_calls_and_an_excluded_rank_is_told():
    run_ranks(revoke_and_exclude, 3)
