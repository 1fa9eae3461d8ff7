"""Runs a function as N ranks in N fresh processes and reports every rank's failure."""

import multiprocessing as mp
import os
import traceback

import oxccl as ccl

TIMEOUT = 120


def _entry(fn, rank, size, uid, q, args, uids=None):
    try:
        if uids is not None:
            # This job's unique id comes from its rank 0, which runs the rendezvous.
            if rank == 0:
                uid = ccl.get_unique_id()
                for _ in range(size - 1):
                    uids.put(uid)
            else:
                uid = uids.get(timeout=TIMEOUT)
        fn(rank, size, uid, *args)
        q.put((rank, None))
    except BaseException:  # noqa: BLE001 - report anything to the parent
        q.put((rank, traceback.format_exc()))


def run_ranks(fn, size, *args, dying=(), uid_from_rank0=False):
    """Calls fn(rank, size, uid, *args) in `size` spawned processes; the unique id's rendezvous
    runs in this process, or with `uid_from_rank0` in rank 0's (which makes the id and hands it
    to the others, as an application does). Fails with every rank's traceback if any rank
    fails or hangs. Ranks in `dying` are meant to end their process without reporting."""
    os.environ.setdefault("CCL_SOCKET_IFNAME", "=lo")
    os.environ.setdefault("CCL_TIMEOUT", "60")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    uids = ctx.Queue() if uid_from_rank0 else None
    uid = None if uid_from_rank0 else ccl.get_unique_id()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, size, uid, q, args, uids)) for r in range(size)
    ]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(size - len(dying)):
            rank, err = q.get(timeout=TIMEOUT)
            results[rank] = err
    except Exception:  # noqa: BLE001 - a missing rank is reported below
        pass
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    failures = [f"rank {r}:\n{e}" for r, e in sorted(results.items()) if e]
    missing = [r for r in range(size) if r not in results and r not in dying]
    if missing:
        failures.append(f"ranks {missing} did not report within {TIMEOUT} s")
    assert not failures, "\n".join(failures)
