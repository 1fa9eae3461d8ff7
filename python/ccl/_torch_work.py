"""What the ``"ccl"`` torch backend's calls return and how they finish: ``_Work`` (a
``dist.Work`` over the library's requests, with a Future that a thread of the group completes),
the copies back into tensors that were not contiguous, and ``_P2P``, which defers
``isend``/``irecv`` and runs them as one library group.

Split from ``ccl.torch`` so the backend's operations and their plumbing each stay readable.
"""

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

import ccl as _ccl

_lib = _ccl._lib


def _wait_request(req):
    """cclWait on a request handle; raises the library's error."""
    _ccl._check(_lib.cclWait(req))


def _fail(code, msg):
    return _ccl.CclError(code, msg)


def _invalid(msg):
    return _fail(_ccl.INVALID_ARGUMENT, "invalid argument: " + msg)


def _bytes(t):
    """A contiguous tensor's memory as a 1-D uint8 tensor (no copy)."""
    return t.reshape(-1).view(torch.uint8)


def _nbytes(t):
    return t.numel() * t.element_size()


class _Out:
    """An output tensor and the contiguous buffer the library writes in its place."""

    __slots__ = ("t", "c")

    def __init__(self, t):
        self.t = t
        self.c = t if t.is_contiguous() else t.contiguous()

    def back(self):
        if self.c is not self.t:
            self.t.copy_(self.c)


def _copy_back(outs):
    """What finishes an operation whose outputs may be stand-ins: None when none is."""
    copies = [o for o in outs if o.c is not o.t]
    if not copies:
        return None

    def finish():
        for o in copies:
            o.back()

    return finish


def _from_bytes(dst, src):
    """Copies the bytes `src` (1-D uint8) into tensor `dst`, whatever its layout."""
    if dst.numel():
        dst.copy_(src.view(dst.dtype).view(dst.shape))


# A work's states: nobody runs its completion yet, a thread does, it is done. Transitions take
# _STATE (one lock for all works: the sections are a few attribute writes).
_PENDING, _CLAIMED, _DONE = 0, 1, 2
_STATE = threading.Lock()


class _Work(dist.Work):
    """A torch work over library requests, completed by whichever thread gets to it first.

    ``wait()`` on the thread that waits runs the completion itself (the library's own wait, no
    thread hop) unless a timeout is given, which the completion thread then serves while this one
    waits with the deadline. ``get_future()`` hands the completion to the group's completion
    thread, so the Future completes without anyone waiting (DDP's communication hooks chain on
    it). Errors surface on ``wait()`` and in the Future with the library's message.

    torch returns the work to the caller wrapped in a holder that forwards only ``wait()`` and
    ``get_future()``, so ``is_completed()`` on it stays False; ``get_future().done()`` tells.
    """

    def __init__(self, name, drive, result, completer=None, in_flight=True):
        super().__init__()
        self._in_flight = in_flight
        self._name = name
        self._drive = drive
        self._result = result
        self._completer = completer
        self._error = None
        self._src = self._fut = None
        if drive is None:
            self._state, self._gate = _DONE, None
        else:
            # Held until the work is done; a waiter with a deadline acquires it with a timeout.
            # (A plain lock: a threading.Event costs more than the operation at 8 bytes.)
            self._state, self._gate = _PENDING, threading.Lock()
            self._gate.acquire()

    def _claim(self):
        with _STATE:
            if self._state != _PENDING:
                return False
            self._state = _CLAIMED
            return True

    def _complete(self):
        """Runs the completion (once, on the thread that claimed it)."""
        err = None
        try:
            self._drive()
        except BaseException as e:  # noqa: BLE001 - every failure goes to the waiters
            err = self._completer.describe(self._name, e) if self._completer else e
        with _STATE:
            self._error, self._state, src = err, _DONE, self._src
            self._drive = None
        self._gate.release()
        if src is not None:
            src.set_result(None)

    def _await(self, secs):
        """Waits until another thread completed the work; False at the deadline."""
        if not self._gate.acquire(timeout=secs if secs > 0 else -1):
            return False
        self._gate.release()
        return True

    def wait(self, timeout=timedelta(0)):
        if self._state != _DONE:
            secs = timeout.total_seconds() if timeout else 0.0
            if secs <= 0:
                if self._claim():
                    self._complete()
                else:
                    self._await(0)
            else:
                if self._claim():
                    self._completer.put(self)
                if not self._await(secs):
                    raise RuntimeError(
                        f"ccl {self._name}: Timed out waiting {int(secs * 1000)}ms for the "
                        "operation to complete (it goes on; the group's timeout ends it)"
                    )
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        with _STATE:
            if self._fut is not None:
                return self._fut
            # The caller's Future is a continuation of `src`: an exception raised in a callback
            # fails a Future inside torch, which keeps the error when the Future crosses into
            # C++ and back (DDP's hooks, the holder torch wraps works in); set_exception would
            # leave the exception object as the value there.
            self._src = src = torch.futures.Future()
            self._fut = fut = src.then(self._outcome)
            finished, hand_off = self._state == _DONE, self._state == _PENDING
            if hand_off:
                self._state = _CLAIMED
        if finished:
            src.set_result(None)
        elif hand_off:
            self._completer.put(self)
        return fut

    def _outcome(self, _):
        if self._error is not None:
            raise self._error
        return self._result

    def result(self):
        self.wait()
        return self._result

    def __del__(self):
        # The library may still be writing into the tensors this work keeps alive: a work over
        # library requests dropped unwaited finishes first (as the package's Work does). A
        # recorded send or receive stays recorded (_P2P keeps its tensor).
        try:
            if self._in_flight and self._state == _PENDING and self._claim():
                self._complete()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


def _finished(result):
    return _Work("done", None, result)


class _Completer:
    """Completes works that nobody waits for on the calling thread: those asked for a Future
    (DDP) or waited on with a timeout. One thread per group, started with the first such work
    and stopped by ``stop`` after the queued ones; the library finishes one communicator's
    operations in issue order, so taking the works in that order never waits behind a later
    one."""

    def __init__(self, describe):
        self.describe = describe
        self._q = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def put(self, work):
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="ccl-torch-completion", daemon=True
                )
                self._thread.start()
        self._q.put(work)

    def _loop(self):
        while True:
            work = self._q.get()
            if work is None:
                return
            work._complete()

    def stop(self, timeout):
        with self._lock:
            t, self._thread = self._thread, None
        if t is not None:
            self._q.put(None)
            t.join(timeout)


class _Transfer:
    """One isend or irecv: its contiguous byte buffer and the tag that travels with it."""

    __slots__ = ("kind", "tensor", "peer", "tag", "out", "data", "tagbuf", "done", "error")

    def __init__(self, kind, tensor, peer, tag):
        self.kind, self.tensor, self.peer, self.tag = kind, tensor, peer, tag
        self.out = _Out(tensor)
        self.data = _bytes(self.out.c)
        fill = tag if kind == "send" else -1
        self.tagbuf = torch.full((1,), fill, dtype=torch.int64)
        self.done = False
        self.error = None

    def finish(self):
        if self.kind == "recv":
            got = int(self.tagbuf[0])
            if got != self.tag:
                self.error = _invalid(
                    f"recv from rank {self.peer} with tag {self.tag} got the message sent with "
                    f"tag {got}: ccl matches the messages between two ranks in the order they "
                    "are posted, so the n-th send's tag must be the n-th receive's"
                )
                return
            self.out.back()


class _P2P:
    """torch's isend/irecv, which return at once, over ccl's sends and receives, which run as
    groups (NCCL's model).

    A transfer is recorded, not run. The recorded ones run together as one library group when
    one of them is waited on, before any other operation of the process group (which keeps the
    order of operations between two ranks the same on both), and before a second send to (or
    receive from) the same peer is recorded. With at most one transfer per peer and direction in
    a group, each library group carries exactly one torch transfer each way between two ranks,
    so groups match between ranks however each side batched them. A transfer carries its tag
    (8 bytes in the same group); a receive whose tag differs from the message's fails.
    """

    def __init__(self, pg):
        self._pg = pg
        self._lock = threading.RLock()
        self._batch = []
        self._peers = set()

    def post(self, kind, tensor, peer, tag):
        n = self._pg._size
        if not 0 <= peer < n:
            raise _invalid(f"{kind}: peer {peer} is out of range for {n} ranks")
        t = _Transfer(kind, tensor, peer, tag)
        with self._lock:
            self._pg._live_comm(kind)
            if (kind, peer) in self._peers:
                self._flush_locked()
            self._batch.append(t)
            self._peers.add((kind, peer))
        return _Work(kind, lambda: self._wait(t), [tensor], self._pg._completer, in_flight=False)

    def _wait(self, t):
        if not t.done:
            with self._lock:
                if not t.done:
                    self._flush_locked()
        if t.error is not None:
            raise t.error

    def flush(self):
        if self._batch:
            with self._lock:
                self._flush_locked()

    def cancel(self, why):
        with self._lock:
            batch, self._batch = self._batch, []
            self._peers.clear()
        for t in batch:
            t.error = _fail(
                _ccl.INVALID_USAGE,
                f"invalid usage: {t.kind} with rank {t.peer} never ran: the process group was "
                f"{why} before it was waited on",
            )
            t.done = True

    def _flush_locked(self):
        batch, self._batch = self._batch, []
        self._peers.clear()
        if not batch:
            return
        try:
            comm = self._pg._live_comm("send/recv")
            with _ccl.group():
                for t in batch:
                    if t.kind == "send":
                        comm.send(t.data, t.peer)
                        comm.send(t.tagbuf, t.peer)
                    else:
                        comm.recv(t.data, t.peer)
                        comm.recv(t.tagbuf, t.peer)
        except _ccl.CclError as e:
            for t in batch:
                t.error = e
        else:
            for t in batch:
                t.finish()
        for t in batch:
            t.done = True

