"""oxccl: collective communication for numpy arrays and PyTorch CPU tensors.

A thin layer over the library's C ABI (``libccl.so``, see ``include/ccl.h``): buffers are passed by
address, never copied, so results land in the arrays and tensors you pass.

    import oxccl, numpy as np
    comm = oxccl.Communicator.from_env()           # torchrun, mpirun, srun or CCL_* variables
    x = np.full(1000, comm.rank, dtype=np.float32)
    comm.all_reduce(x)                           # in place, sum
    y = np.empty(1000 * comm.size, np.float32)
    comm.all_gather(x, out=y)                    # out of place
    work = comm.all_reduce(x, op=oxccl.AVG, async_op=True)
    ...                                          # compute meanwhile; do not touch x
    work.wait()

Or with an explicit unique id, as with NCCL: one process calls ``oxccl.get_unique_id()`` and passes
the 128 bytes to the others; every rank calls ``oxccl.Communicator(rank, size, uid)``.

Arrays must be C-contiguous and of a supported dtype (int8, uint8, int32, uint32, int64, uint64,
float16, bfloat16, float32, float64); anything else is refused with a ``CclError`` rather than
silently copied. Failures raise ``CclError`` carrying the C library's result code and message.

Registered memory lets the verbs transport send straight from your arrays (no copy into its
staging buffers): ``comm.alloc(shape, dtype)`` returns a numpy array in memory the library
allocated and registered (``torch.from_numpy`` views it as a tensor), freed when the array and
its views are gone; ``with comm.register(x):`` registers an existing array for the block.

    g = comm.alloc((1 << 20,), np.float32)      # page aligned, registered
    comm.all_reduce(g)
    with comm.register(x), comm.register(y):
        comm.all_reduce(x, out=y)

``dist.init_process_group("oxccl")`` runs the native ``torch.distributed`` backend (``oxccl.torch``;
found by name through the package's entry point, no import needed).
"""

import ctypes
import enum
import threading

import numpy as np

from . import _abi as _a
from . import _lib as _l

_lib = _l.load()

__version__ = "0.1.0"
__all__ = [
    "CclError",
    "Communicator",
    "ReduceOp",
    "SUM",
    "PROD",
    "MAX",
    "MIN",
    "AVG",
    "BAND",
    "BOR",
    "BXOR",
    "Work",
    "get_unique_id",
    "group",
    "library_path",
    "version",
]

# Result codes (cclResult_t).
SUCCESS = 0
SYSTEM_ERROR = 2
INTERNAL_ERROR = 3
INVALID_ARGUMENT = 4
INVALID_USAGE = 5
REMOTE_ERROR = 6
IN_PROGRESS = 7
TIMEOUT = 8
REVOKED = 9

SPLIT_NOCOLOR = -1


class ReduceOp(enum.IntEnum):
    """Reduction operators (cclRedOp_t). The bitwise ones take integer arrays only."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7


SUM, PROD, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG
BAND, BOR, BXOR = ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR

# cclDataType_t by dtype name (numpy's names; torch's without the "torch." prefix).
DTYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
}


class CclError(RuntimeError):
    """A failed ccl call: ``code`` is the C ABI's result code, ``message`` what was wrong."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _error_string(code):
    return _lib.cclGetErrorString(code).decode()


def _check(res):
    if res != SUCCESS:
        msg = _lib.cclGetLastError(None)
        msg = msg.decode(errors="replace") if msg else ""
        raise CclError(res, msg or _error_string(res))


def _invalid(msg):
    return CclError(INVALID_ARGUMENT, "invalid argument: " + msg)


def version():
    """The library's version code (major * 10000 + minor * 100 + patch)."""
    v = ctypes.c_int()
    _check(_lib.cclGetVersion(ctypes.byref(v)))
    return v.value


def library_path():
    """The path of the libccl.so in use."""
    return _lib.path


def get_unique_id():
    """A new unique id (128 bytes) whose rendezvous runs in this process, which must stay alive
    until every rank has joined; the rendezvous then stays on as the job's monitor (it passes
    failures on and agrees on a shrink), so keep this process alive while the communicator is
    used. Pass the id to every rank's ``Communicator(rank, size, uid)``."""
    uid = _a.UniqueIdStruct()
    _check(_lib.cclGetUniqueId(ctypes.byref(uid)))
    return bytes(uid.internal)


# ---- buffers ----------------------------------------------------------------------------


class _Buf:
    """An array's memory: address, element count, ccl data type, and the object keeping it."""

    __slots__ = ("ptr", "count", "dtype", "itemsize", "dtype_name", "obj")

    def __init__(self, ptr, count, dtype_name, itemsize, obj):
        self.ptr = ptr
        self.count = count
        self.dtype_name = dtype_name
        self.dtype = DTYPES[dtype_name]
        self.itemsize = itemsize
        self.obj = obj


def _is_torch(x):
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _dtype_code(name, what, dtype):
    if name not in DTYPES:
        raise _invalid(
            f"{what} has dtype {dtype}, which ccl does not handle "
            f"(supported: {', '.join(DTYPES)})"
        )


def _buf(x, what, writable):
    """Views `x` without copying it, or refuses it with a message saying why."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise _invalid(f"{what} is a tensor on {x.device}; ccl takes CPU tensors")
        if not x.is_contiguous():
            raise _invalid(
                f"{what} is a non-contiguous tensor (shape {tuple(x.shape)}, strides "
                f"{tuple(x.stride())}); pass x.contiguous()"
            )
        name = str(x.dtype).replace("torch.", "")
        _dtype_code(name, what, x.dtype)
        return _Buf(x.data_ptr(), x.numel(), name, x.element_size(), x)
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except Exception as e:  # noqa: BLE001 - report any conversion failure the same way
            raise _invalid(f"{what} of type {type(x).__name__} is not an array: {e}") from None
        if a.base is None or not np.shares_memory(a, a.base):
            raise _invalid(
                f"{what} of type {type(x).__name__} is not an array or buffer ccl can use "
                "without copying; pass a numpy array or a CPU tensor"
            )
    if not a.flags.c_contiguous:
        raise _invalid(
            f"{what} is not C-contiguous (shape {a.shape}, strides {a.strides}); "
            "pass np.ascontiguousarray(x)"
        )
    if writable and not a.flags.writeable:
        raise _invalid(f"{what} is read-only")
    name = a.dtype.name
    _dtype_code(name, what, a.dtype)
    return _Buf(a.__array_interface__["data"][0], a.size, name, a.dtype.itemsize, x)


def _same_dtype(a, b):
    if a.dtype != b.dtype:
        raise _invalid(f"the input is {a.dtype_name} but out is {b.dtype_name}")


# ---- groups -----------------------------------------------------------------------------

_tls = threading.local()


def _group_depth():
    return getattr(_tls, "depth", 0)


def _keep_for_group(objs):
    """Inside a group, operations run at its end: keep their buffers alive until then."""
    if _group_depth() > 0:
        _tls.keep.extend(objs)


class group:
    """``with oxccl.group(): ...``: sends, receives and collectives issued inside (on this thread)
    run together when the block ends, like NCCL's ncclGroupStart/ncclGroupEnd. Exchanges such
    as "send right, receive left" must be grouped to avoid deadlock."""

    def __enter__(self):
        _check(_lib.cclGroupStart())
        if _group_depth() == 0:
            _tls.keep = []
        _tls.depth = _group_depth() + 1
        return self

    def __exit__(self, *exc):
        _tls.depth -= 1
        try:
            _check(_lib.cclGroupEnd())
        finally:
            if _tls.depth == 0:
                _tls.keep = []
        return False


# ---- requests ---------------------------------------------------------------------------


class Work:
    """A non-blocking operation. ``wait()`` returns its output; until then the buffers must be
    left alone (this object keeps them alive)."""

    def __init__(self, req, keep, result):
        self._req = req
        self._keep = keep
        self._result = result
        self._done = False

    def _finish(self):
        self._done = True
        self._keep = None

    def wait(self, timeout=None):
        """Waits for the operation and returns its output (raises ``CclError`` if it failed)."""
        if not self._done:
            res = _lib.cclWait(self._req)
            self._finish()
            _check(res)
        return self._result

    def test(self):
        """Whether the operation has finished (raises ``CclError`` if it failed)."""
        if self._done:
            return True
        done = ctypes.c_int(0)
        res = _lib.cclTest(self._req, ctypes.byref(done))
        if done.value or res != SUCCESS:
            self._finish()
        _check(res)
        return bool(done.value)

    is_completed = test

    def result(self):
        return self.wait()

    def __del__(self):
        # The buffers must outlive the operation, whoever drops this first.
        try:
            if not self._done and _lib is not None:
                _lib.cclWait(self._req)
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


# ---- communicators ----------------------------------------------------------------------


def _uid_struct(uid):
    if isinstance(uid, str):
        uid = bytes.fromhex(uid)
    uid = bytes(uid)
    if len(uid) != _a.UNIQUE_ID_BYTES:
        raise _invalid(f"a unique id has {_a.UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    return _a.UniqueIdStruct.from_buffer_copy(uid)


def _timeout_ms(timeout):
    secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout)
    ms = int(round(secs * 1000))
    if not 0 < ms < 2**31:
        raise _invalid(f"timeout {timeout!r} must be between 1 ms and 24 days")
    return ms


class _Allocation:
    """Memory from cclCommMemAlloc (or cclMemAlloc and a registration); deregistered and freed
    with the last view of the array over it."""

    def __init__(self, ptr):
        self.ptr, self.comm, self.reg = ptr, None, None

    def __del__(self):
        try:
            if _lib is None:
                return
            if self.reg is not None:
                _lib.cclCommDeregister(self.comm, self.reg)
            _lib.cclMemFree(ctypes.c_void_p(self.ptr))
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass


class _Registration:
    """``with comm.register(array):`` -- the array registered with the communicator."""

    def __init__(self, comm, array):
        self._comm, self._array, self._h = comm, array, None

    def __enter__(self):
        b = _buf(self._array, "array", False)
        n = b.count * b.itemsize
        if n == 0:
            return self._array
        h = ctypes.c_void_p()
        _check(_lib.cclCommRegister(self._comm._handle(), b.ptr, n, ctypes.byref(h)))
        self._h = h
        return self._array

    def __exit__(self, *exc):
        h, self._h = self._h, None
        if h is not None:
            _check(_lib.cclCommDeregister(self._comm._h, h))
        return False


class Communicator:
    """A group of ranks running collectives together (a ``cclComm_t``)."""

    def __init__(self, rank, size, uid, timeout=None):
        """Joins the communicator of `uid` (from ``get_unique_id()``) as `rank` of `size`;
        blocks until every rank has joined. `timeout` (seconds, or a ``datetime.timedelta``) is
        how long any wait of this communicator may go without progress; by default
        ``CCL_TIMEOUT``'s."""
        h = ctypes.c_void_p()
        uid = _uid_struct(uid)
        if timeout is None:
            _check(_lib.cclCommInitRank(ctypes.byref(h), int(size), uid, int(rank)))
        else:
            cfg = _l.config(version())
            cfg.timeoutMs = _timeout_ms(timeout)
            _check(
                _lib.cclCommInitRankConfig(
                    ctypes.byref(h), int(size), uid, int(rank), ctypes.byref(cfg)
                )
            )
        self._h = h
        self._fill()

    @classmethod
    def from_env(cls):
        """Joins the job described by launcher variables (torchrun, mpirun, srun, CCL_*)."""
        h = ctypes.c_void_p()
        _check(_lib.cclCommInitFromEnv(ctypes.byref(h)))
        return cls._wrap(h)

    @classmethod
    def _wrap(cls, h):
        c = cls.__new__(cls)
        c._h = h
        c._fill()
        return c

    @classmethod
    def _borrow(cls, handle):
        """A view of a communicator someone else owns (the native torch backend's): explicit
        calls act on it, but dropping the view does not free it."""
        c = cls._wrap(ctypes.c_void_p(handle))
        c._borrowed = True
        return c

    def _fill(self):
        v = ctypes.c_int()
        _check(_lib.cclCommUserRank(self._h, ctypes.byref(v)))
        self.rank = v.value
        _check(_lib.cclCommCount(self._h, ctypes.byref(v)))
        self.size = v.value

    def __repr__(self):
        return f"oxccl.Communicator(rank={self.rank}, size={self.size})"

    @property
    def handle(self):
        """The ``cclComm_t`` value (for passing to C code)."""
        return self._h.value

    # -- lifetime --

    def destroy(self):
        """Finishes issued operations and frees the communicator; idempotent."""
        h, self._h = getattr(self, "_h", None), None
        if h is not None and h.value:
            _check(_lib.cclCommDestroy(h))

    close = destroy

    def abort(self):
        """Fails the communicator at once (ending waits on other threads) and frees it."""
        h, self._h = self._h, None
        if h is not None and h.value:
            _check(_lib.cclCommAbort(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        try:
            if _lib is not None and not getattr(self, "_borrowed", False):
                self.destroy()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def _handle(self):
        if self._h is None:
            raise CclError(INVALID_USAGE, "invalid usage: the communicator was destroyed")
        return self._h

    def error(self):
        """The error the communicator failed with (a ``CclError``), or None."""
        v = ctypes.c_int()
        _check(_lib.cclCommGetAsyncError(self._handle(), ctypes.byref(v)))
        if v.value == SUCCESS:
            return None
        return CclError(v.value, _error_string(v.value))

    def split(self, color, key=0):
        """Collective: ranks with the same `color` form a new communicator ordered by `key`;
        color None joins nothing and returns None."""
        h = ctypes.c_void_p()
        c = SPLIT_NOCOLOR if color is None else int(color)
        _check(_lib.cclCommSplit(self._handle(), c, int(key), ctypes.byref(h), None))
        return Communicator._wrap(h) if h.value else None

    # -- surviving a rank's death --

    def revoke(self):
        """Every pending and later operation of this communicator fails with ``REVOKED``, here
        at once and on every other rank within milliseconds."""
        _check(_lib.cclCommRevoke(self._handle(), 0))

    def failed_ranks(self):
        """The ranks the job's rendezvous has reported failed or dead so far."""
        n = ctypes.c_int()
        _check(_lib.cclCommGetFailedRanks(self._handle(), None, 0, ctypes.byref(n)))
        out = (ctypes.c_int * max(n.value, 1))()
        _check(_lib.cclCommGetFailedRanks(self._handle(), out, n.value, ctypes.byref(n)))
        return list(out[: n.value])

    def shrink(self, exclude=()):
        """The survivors' communicator: every live rank that calls it within the timeout, minus
        `exclude` (ranks of this communicator), numbered densely in their old order. Revokes
        this one everywhere; an excluded caller gets a ``CclError`` with code ``REVOKED``."""
        ex = [int(r) for r in exclude]
        arr = (ctypes.c_int * max(len(ex), 1))(*ex)
        h = ctypes.c_void_p()
        _check(_lib.cclCommShrink(self._handle(), arr, len(ex), ctypes.byref(h), None, 0))
        return Communicator._wrap(h)

    def grow(self, uid, size):
        """A communicator of `size` ranks: this one's keep their ranks, new processes join with
        ``Communicator(rank, size, uid)`` for ranks from ``self.size`` up. Every rank here
        passes the same `uid` (``get_unique_id()`` on one of them, shared)."""
        u = _uid_struct(uid)
        h = ctypes.c_void_p()
        _check(_lib.cclCommGrow(self._handle(), int(size), ctypes.byref(u), -1, ctypes.byref(h), None))
        return Communicator._wrap(h)

    # -- the one path every collective takes --

    def _run(self, name, args, keep, result, async_op):
        comm = self._handle()
        if async_op:
            req = ctypes.c_void_p()
            _check(getattr(_lib, name + "Async")(*args, comm, ctypes.byref(req)))
            return Work(req, keep, result)
        _keep_for_group(keep)
        _check(getattr(_lib, name)(*args, comm))
        return result

    @staticmethod
    def _op(op):
        try:
            return int(ReduceOp(op))
        except ValueError:
            raise _invalid(f"op {op!r} is not an oxccl.ReduceOp") from None

    def all_reduce(self, buf, op=SUM, out=None, async_op=False):
        """Elementwise reduction over ranks: in place in `buf`, or into `out`."""
        s = _buf(buf, "buf", out is None)
        r = _buf(out, "out", True) if out is not None else s
        _same_dtype(s, r)
        if s.count != r.count:
            raise _invalid(f"buf has {s.count} elements but out has {r.count}")
        args = (s.ptr, r.ptr, r.count, r.dtype, self._op(op))
        return self._run("cclAllReduce", args, (buf, out), r.obj, async_op)

    def broadcast(self, buf, root=0, out=None, async_op=False):
        """Copies root's `buf` to every rank: in place in `buf`, or into `out` (then `buf` is
        read on the root only and may be None elsewhere)."""
        if out is None:
            s = r = _buf(buf, "buf", True)
        else:
            r = _buf(out, "out", True)
            s = _buf(buf, "buf", False) if buf is not None else None
            if s is not None:
                _same_dtype(s, r)
                if s.count != r.count:
                    raise _invalid(f"buf has {s.count} elements but out has {r.count}")
        args = (s.ptr if s else None, r.ptr, r.count, r.dtype, int(root))
        return self._run("cclBroadcast", args, (buf, out), r.obj, async_op)

    def reduce(self, buf, op=SUM, root=0, out=None, async_op=False):
        """Reduces every rank's `buf` into root's `out` (or root's `buf`, in place, without
        `out`); other ranks' buffers are left alone."""
        s = _buf(buf, "buf", out is None)
        r = _buf(out, "out", True) if out is not None else s
        _same_dtype(s, r)
        if s.count != r.count:
            raise _invalid(f"buf has {s.count} elements but out has {r.count}")
        args = (s.ptr, r.ptr, s.count, s.dtype, self._op(op), int(root))
        return self._run("cclReduce", args, (buf, out), r.obj, async_op)

    def all_gather(self, buf, out=None, async_op=False):
        """Every rank's `buf` into `out` (size x len(buf)), in rank order. In place (no `out`):
        `buf` is the whole output and this rank's input is already at block `rank`."""
        if out is None:
            r = _buf(buf, "buf", True)
            count = self._blocks(r, "buf")
            sptr = r.ptr + self.rank * count * r.itemsize
        else:
            s = _buf(buf, "buf", False)
            r = _buf(out, "out", True)
            _same_dtype(s, r)
            count, sptr = s.count, s.ptr
            if r.count != count * self.size:
                raise _invalid(
                    f"out has {r.count} elements but {self.size} ranks x {count} need "
                    f"{count * self.size}"
                )
        args = (sptr, r.ptr, count, r.dtype)
        return self._run("cclAllGather", args, (buf, out), r.obj, async_op)

    def reduce_scatter(self, buf, op=SUM, out=None, async_op=False):
        """Rank r gets the reduction of block r of every rank's `buf` (size x len(out)), in
        `out`; in place (no `out`) at block `rank` of `buf`."""
        s = _buf(buf, "buf", out is None)
        if out is None:
            count = self._blocks(s, "buf")
            rptr, r = s.ptr + self.rank * count * s.itemsize, s
        else:
            r = _buf(out, "out", True)
            _same_dtype(s, r)
            count, rptr = r.count, r.ptr
            if s.count != count * self.size:
                raise _invalid(
                    f"buf has {s.count} elements but {self.size} ranks x {count} need "
                    f"{count * self.size}"
                )
        args = (s.ptr, rptr, count, s.dtype, self._op(op))
        return self._run("cclReduceScatter", args, (buf, out), r.obj, async_op)

    def all_to_all(self, buf, out=None, async_op=False):
        """Block k of `buf` goes to block `rank` of rank k's output (`out`, or `buf` in place)."""
        s = _buf(buf, "buf", out is None)
        r = _buf(out, "out", True) if out is not None else s
        _same_dtype(s, r)
        if s.count != r.count:
            raise _invalid(f"buf has {s.count} elements but out has {r.count}")
        count = self._blocks(r, "buf" if out is None else "out")
        args = (s.ptr, r.ptr, count, r.dtype)
        return self._run("cclAlltoAll", args, (buf, out), r.obj, async_op)

    # -- gather, scatter and the collectives with a count per rank --

    def gather(self, buf, out=None, root=0, async_op=False):
        """Every rank's `buf` into root's `out` (size x len(buf)), in rank order; `out` is
        written on the root only and may be None elsewhere. In place on the root (no `out`):
        `buf` is the whole output and the root's input is already at block `root`."""
        root = int(root)
        if out is None and self.rank == root:
            r = _buf(buf, "buf", True)
            count = self._blocks(r, "buf")
            sptr, rptr, dtype = r.ptr + root * count * r.itemsize, r.ptr, r.dtype
            result = buf
        else:
            s = _buf(buf, "buf", False)
            count, sptr, dtype, rptr, result = s.count, s.ptr, s.dtype, None, None
            if out is not None and self.rank == root:
                r = _buf(out, "out", True)
                _same_dtype(s, r)
                if r.count != count * self.size:
                    raise _invalid(
                        f"out has {r.count} elements but {self.size} ranks x {count} need "
                        f"{count * self.size}"
                    )
                rptr, result = r.ptr, out
        args = (sptr, rptr, count, dtype, root)
        return self._run("cclGather", args, (buf, out), result, async_op)

    def scatter(self, buf, out=None, root=0, async_op=False):
        """Block k of root's `buf` (size x len(out)) into rank k's `out`; `buf` is read on the
        root only and may be None elsewhere. In place on the root (no `out`): the root's result
        is block `root` of `buf`, which it already holds."""
        root = int(root)
        if out is None:
            if self.rank != root:
                raise _invalid("scatter: out is needed on every rank but the root")
            s = _buf(buf, "buf", True)
            count = self._blocks(s, "buf")
            args = (s.ptr, s.ptr + root * count * s.itemsize, count, s.dtype, root)
            return self._run("cclScatter", args, (buf,), buf, async_op)
        r = _buf(out, "out", True)
        sptr = None
        if self.rank == root:
            s = _buf(buf, "buf", False)
            _same_dtype(s, r)
            if s.count != r.count * self.size:
                raise _invalid(
                    f"buf has {s.count} elements but {self.size} ranks x {r.count} need "
                    f"{r.count * self.size}"
                )
            sptr = s.ptr
        args = (sptr, r.ptr, r.count, r.dtype, root)
        return self._run("cclScatter", args, (buf, out), out, async_op)

    def _counts(self, what, values):
        """A size_t array of one value per rank."""
        values = [int(v) for v in values]
        if len(values) != self.size:
            raise _invalid(f"{what} has {len(values)} entries for {self.size} ranks")
        if any(v < 0 for v in values):
            raise _invalid(f"{what} has a negative entry: {values}")
        return (ctypes.c_size_t * self.size)(*values)

    def all_gather_v(self, buf, out, counts, displs=None, async_op=False):
        """Rank k's `buf` (counts[k] elements) lands at displs[k] of every rank's `out`
        (back to back in rank order without `displs`). Every rank passes the same `counts`. In
        place (`buf` None): this rank's input is already in `out` at its displacement."""
        r = _buf(out, "out", True)
        c = self._counts("counts", counts)
        d = self._counts("displs", displs) if displs is not None else None
        if buf is None:
            own = d[self.rank] if d is not None else sum(c[: self.rank])
            sptr = r.ptr + own * r.itemsize
        else:
            s = _buf(buf, "buf", False)
            _same_dtype(s, r)
            if s.count != c[self.rank]:
                raise _invalid(f"buf has {s.count} elements but counts[{self.rank}] is "
                               f"{c[self.rank]}")
            sptr = s.ptr
        args = (sptr, r.ptr, c, d, r.dtype)
        return self._run("cclAllGatherV", args, (buf, out, c, d), out, async_op)

    def reduce_scatter_v(self, buf, counts, op=SUM, out=None, async_op=False):
        """`buf` holds counts[k] elements for each rank k, back to back; rank r's `out`
        (counts[r] elements) receives the reduction of every rank's block r; in place (no
        `out`) the result lands in block `rank` of `buf`. Every rank passes the same `counts`."""
        s = _buf(buf, "buf", out is None)
        c = self._counts("counts", counts)
        if out is None:
            rptr = s.ptr + sum(c[: self.rank]) * s.itemsize
            result = buf
        else:
            r = _buf(out, "out", True)
            _same_dtype(s, r)
            rptr, result = r.ptr, out
        args = (s.ptr, rptr, c, s.dtype, self._op(op))
        return self._run("cclReduceScatterV", args, (buf, out, c), result, async_op)

    def all_to_all_v(
        self,
        buf,
        send_counts,
        out,
        recv_counts,
        send_displs=None,
        recv_displs=None,
        async_op=False,
    ):
        """send_counts[k] elements of `buf` at send_displs[k] go to rank k; recv_counts[k]
        elements from rank k land at recv_displs[k] of `out` (back to back in rank order
        without displacements). In place (`buf` None): `out`'s blocks are also what is sent
        (`send_counts` and `send_displs` are then ignored)."""
        r = _buf(out, "out", True)
        rc = self._counts("recv_counts", recv_counts)
        rd = self._counts("recv_displs", recv_displs) if recv_displs is not None else None
        if buf is None:
            sptr, sc, sd = r.ptr, None, None
        else:
            s = _buf(buf, "buf", False)
            _same_dtype(s, r)
            sptr = s.ptr
            sc = self._counts("send_counts", send_counts)
            sd = self._counts("send_displs", send_displs) if send_displs is not None else None
        args = (sptr, sc, sd, r.ptr, rc, rd, r.dtype)
        return self._run("cclAlltoAllV", args, (buf, out, sc, sd, rc, rd), out, async_op)

    # -- registered memory --

    def alloc(self, shape, dtype=np.float32):
        """A zeroed numpy array of `shape` and `dtype` in memory allocated by the library and
        registered with this communicator (``cclCommMemAlloc``: page aligned; on a host whose
        ranks share memory, from the communicator's shared arena, so that an allreduce on such
        arrays on every rank of the host reads and writes them in place): collectives on it
        send without copying where the transport can. The memory is freed when the array and
        every view of it are gone. ``torch.from_numpy(a)`` gives a tensor over the same
        memory."""
        dt = np.dtype(dtype)
        _dtype_code(dt.name, "alloc", dt)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = max(count * dt.itemsize, 1)
        ptr = ctypes.c_void_p()
        _check(_lib.cclCommMemAlloc(self._handle(), ctypes.byref(ptr), nbytes))
        owner = _Allocation(ptr.value)
        mem = (ctypes.c_ubyte * nbytes).from_address(ptr.value)
        # The array's base chain holds `mem`, and `mem` holds the owner: the memory lives as
        # long as any view of it.
        mem._ccl_owner = owner
        return np.frombuffer(mem, dtype=dt, count=count).reshape(shape)

    def register(self, array):
        """Registers `array` (a numpy array or CPU tensor) with this communicator for the
        ``with`` block: ``with comm.register(x): comm.all_reduce(x)``. Leaving the block
        deregisters it; that fails (``CclError``) while a non-blocking operation on it is
        pending, so wait for it inside the block."""
        return _Registration(self, array)

    def barrier(self, async_op=False):
        """Returns once every rank has called it."""
        return self._run("cclBarrier", (), (), None, async_op)

    def send(self, buf, peer):
        """Sends `buf` to `peer` (recorded until the end of an enclosing ``oxccl.group()``)."""
        s = _buf(buf, "buf", False)
        _keep_for_group((buf,))
        _check(_lib.cclSend(s.ptr, s.count, s.dtype, int(peer), self._handle()))

    def recv(self, buf, peer):
        """Receives into `buf` from `peer` (recorded until the end of a ``oxccl.group()``)."""
        r = _buf(buf, "buf", True)
        _keep_for_group((buf,))
        _check(_lib.cclRecv(r.ptr, r.count, r.dtype, int(peer), self._handle()))
        return buf

    def probe(self):
        """Waits until some peer's next operation toward this rank is a send and returns
        ``(peer, nbytes)``: who sends, and how many bytes (lowest rank first when several
        wait). Nothing is received; ``recv`` from that peer takes it. Peers whose next
        operation here is a collective are passed over. Raises ``CclError`` (code TIMEOUT)
        after the communicator's timeout with no send; the communicator stays usable."""
        peer, nbytes = ctypes.c_int(), ctypes.c_size_t()
        _check(_lib.cclProbe(ctypes.byref(peer), ctypes.byref(nbytes), self._handle()))
        return peer.value, nbytes.value

    def recv_any(self, buf):
        """Receives into `buf` the first send to reach this rank from any peer (``probe``,
        then ``recv``) and returns that peer. The send must have `buf`'s size in bytes. Another
        thread's receive between the two calls could take the send: receive from one thread."""
        peer, _ = self.probe()
        self.recv(buf, peer)
        return peer

    def _blocks(self, b, what):
        if b.count % self.size:
            raise _invalid(
                f"{what} has {b.count} elements, which do not split into {self.size} equal blocks"
            )
        return b.count // self.size
