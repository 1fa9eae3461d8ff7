"""A torchft process group on the oxccl backend: torchft's `ProcessGroupGloo`, with ccl inside.

    from torchft_oxccl import ProcessGroupOxccl
    pg = ProcessGroupOxccl(timeout=timedelta(seconds=10))
    pg.configure("127.0.0.1:29500/torchft/quorum_0", "replica_0", rank, world_size)
    manager = torchft.Manager(pg=pg, ...)          # or use pg's collectives directly

torchft rebuilds its process group from scratch at every quorum change: `configure` gets a new
store prefix, aborts the previous group and `_create_pg` makes a fresh torch ProcessGroup on it.
With ccl an abort fails the operations still in flight on every rank, so every rank must have
finished its last operation on the old group before any rank configures the next one (torchft's
quorum and commit round trips order that; the test script waits on its store). torchft's Gloo wrapper
never reports an asynchronous error (`errored()` is None); this one does: the first failure of
any of its works, else the communicator's own asynchronous error, else the ranks the job's
monitor has reported dead, so a torchft Manager learns that a peer died even before its next
collective fails.
"""

import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft.process_group import ProcessGroupWrapper

import oxccl.torch as oxccl_torch


class _RecordingWork(dist.Work):
    """Hands the wrapped work's failure to the process group (for `errored()`) and raises it."""

    def __init__(self, pg: "ProcessGroupOxccl", work: dist.Work) -> None:
        super().__init__()
        self._pg = pg
        self._work = work

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            return self._work.wait() if timeout is None else self._work.wait(timeout)
        except Exception as e:
            self._pg._record(e)
            raise

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def get_future(self) -> torch.futures.Future:
        fut = self._work.get_future()

        def record(f: torch.futures.Future) -> None:
            try:
                f.value()
            except Exception as e:
                self._pg._record(e)

        fut.add_done_callback(record)
        return fut


class ProcessGroupOxccl(ProcessGroupWrapper):
    """Reconfigurable oxccl process group for torchft (CPU tensors)."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60), pg=None) -> None:
        super().__init__(timeout=timeout, pg=pg)
        self._errored: Optional[Exception] = None
        self._lock = threading.Lock()

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        with self._lock:
            self._errored = None
        # The backend itself, made the way torch's registered "oxccl" creator makes it; the
        # group's deadline is torchft's timeout.
        backend = oxccl_torch.ProcessGroupOxccl(store, rank, world_size, int(self._timeout.total_seconds() * 1000))
        backend._set_sequence_number_for_group()
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        return pg

    def _wrap_work(self, work: dist.Work, opts: object) -> dist.Work:
        return _RecordingWork(self, work)

    def _record(self, e: Exception) -> None:
        with self._lock:
            if self._errored is None:
                self._errored = e

    def errored(self) -> Optional[Exception]:
        with self._lock:
            if self._errored is not None:
                return self._errored
        pg = self._pg
        # Looked up, not kept: see the note on _create_pg's backend in docs/frameworks.md.
        comm = pg._get_backend(torch.device("cpu")).comm if pg is not None else None
        if comm is None:
            return None
        err = comm.error()
        if err is not None:
            return err
        dead = comm.failed_ranks()
        if dead:
            return RuntimeError(f"oxccl: ranks {dead} of the process group failed")
        return None

    def abort(self, errored: bool = True) -> None:
        if errored:
            self._record(RuntimeError("aborted"))
        super().abort(errored=errored)

    def shutdown(self) -> None:
        # Graceful (cclCommDestroy: issued operations finish first). An abort would do for a
        # rank that leaves while the others wait for it, but ccl fails every operation still in
        # flight on any rank when one aborts, so a rank that finished the last collective first
        # and aborted would fail the same collective on a slower peer.
        pg = self._pg
        self._pg = None
        if pg is not None:
            pg.shutdown()

    def getBackendName(self) -> str:
        return "torchft-oxccl"
