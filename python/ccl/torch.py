"""The ``"ccl"`` backend of ``torch.distributed``, for CPU tensors.

    import ccl.torch                     # registers the backend
    import torch.distributed as dist
    dist.init_process_group("ccl", init_method="file:///tmp/job", rank=r, world_size=n)
    model = torch.nn.parallel.DistributedDataParallel(model)

How it fits into PyTorch (see docs/torch.md for what each operation does and what is missing):

- ``ProcessGroupCCL`` is a c10d ``Backend`` registered for device ``cpu``, as PyTorch registers
  third-party backends: ``init_process_group`` and ``new_group`` build a ``ProcessGroup`` with
  this backend behind it, so group names, ``destroy_process_group`` and every ``dist.*`` call
  work as with Gloo.
- Rank 0 of each group makes a ccl unique id and puts it in the group's store; the others read it
  from there, so whatever rendezvous torch uses (env://, file://, tcp://) carries ccl's too. The
  group's timeout becomes the communicator's deadline (``cclCommInitRankConfig``): every
  operation of the group fails when it goes that long without progress.
- Collectives with a non-blocking form in the library are issued with it and return at once
  (DDP's buckets overlap the backward pass); ``work.wait()`` waits for the library's requests,
  ``get_future()`` returns a Future a thread of the group completes when they finish (see
  ``_Work`` in ``ccl._torch_work``). Blocking calls (``async_op=False``) run inline.
- Gather, scatter and the all-gathers and all-to-alls with per-rank sizes are the library's
  gather, scatter, allgatherv and alltoallv (``ccl._vcoll``); they complete before returning.
- ``isend``/``irecv`` are deferred and run as one library group when one of them is waited on,
  or before the group's next other operation (see ``_P2P`` in ``ccl._torch_work``).
"""

import ctypes
import logging
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _Backend

import ccl as _ccl
from ccl import _vcoll
from ccl._torch_work import (
    _Completer,
    _Out,
    _P2P,
    _Work,
    _bytes,
    _copy_back,
    _fail,
    _finished,
    _from_bytes,
    _invalid,
    _nbytes,
    _wait_request,
)

__all__ = ["ProcessGroupCCL", "PythonProcessGroupCCL", "BACKEND", "IMPLEMENTATION"]
_log = logging.getLogger("ccl.torch")

BACKEND = "ccl"
_UID_KEY = "ccl/unique_id"

_R = dist.ReduceOp.RedOpType
_OPS = {
    _R.SUM: _ccl.SUM,
    _R.PRODUCT: _ccl.PROD,
    _R.MIN: _ccl.MIN,
    _R.MAX: _ccl.MAX,
    _R.AVG: _ccl.AVG,
    _R.BAND: _ccl.BAND,
    _R.BOR: _ccl.BOR,
    _R.BXOR: _ccl.BXOR,
}
# Booleans travel as uint8; torch sums booleans as a logical or and multiplies them as an and.
_BOOL_OPS = {
    _ccl.SUM: _ccl.MAX,
    _ccl.PROD: _ccl.MIN,
    _ccl.MAX: _ccl.MAX,
    _ccl.MIN: _ccl.MIN,
    _ccl.BAND: _ccl.BAND,
    _ccl.BOR: _ccl.BOR,
    _ccl.BXOR: _ccl.BXOR,
}
_REDUCIBLE = {
    getattr(torch, n)
    for n in _ccl.DTYPES
    if isinstance(getattr(torch, n, None), torch.dtype)
}


# The common case, dispatched without the general path's bookkeeping: a contiguous tensor of a
# type the library reduces natively, an op it has (RedOpType's value -> cclRedOp_t).
_FAST_DTYPES = {
    getattr(torch, n): code
    for n, code in _ccl.DTYPES.items()
    if isinstance(getattr(torch, n, None), torch.dtype)
}
_FAST_OPS = {k.value: v for k, v in _OPS.items()}
_lib = _ccl._lib


def _unsupported(name, what):
    return NotImplementedError(f"ccl backend: {name}: {what}")


def _reduction(name, reduce_op):
    """(ccl op, PREMUL_SUM factor or None) for a torch ReduceOp."""
    kind = getattr(reduce_op, "op", reduce_op)
    if kind == _R.PREMUL_SUM:
        # A scalar multiply, then a sum (NCCL's ncclRedOpCreatePreMulSum does the same).
        return _ccl.SUM, reduce_op.factor
    try:
        return _OPS[kind], None
    except (KeyError, TypeError):
        raise _invalid(f"{name}: reduce op {kind} is not supported by ccl") from None


def _reducible(name, t, op):
    """A contiguous tensor as a buffer the library reduces, and the op to reduce it with."""
    if t.dtype == torch.bool:
        if op not in _BOOL_OPS:
            raise _invalid(f"{name}: reduce op {_ccl.ReduceOp(op).name} on a bool tensor")
        return t.view(torch.uint8), _BOOL_OPS[op]
    if t.is_complex():
        if op not in (_ccl.SUM, _ccl.AVG):
            raise _invalid(
                f"{name}: complex tensors reduce with sum or avg only, not "
                f"{_ccl.ReduceOp(op).name}"
            )
        return torch.view_as_real(t), op
    if t.dtype not in _REDUCIBLE:
        raise _invalid(
            f"{name}: tensors of dtype {t.dtype} cannot be reduced by ccl (supported: "
            f"{', '.join(sorted(str(d) for d in _REDUCIBLE))}, bool, complex)"
        )
    return t, op


# The dump path torch's variables gave, once the first group took it; groups made so far.
_fr_prefix = None
_fr_groups = 0


def _flight_recorder_from_torch_env():
    """Asks for dumps in PyTorch's flight-recorder format where torch's own variables ask for a
    flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE`` above 0, ``TORCH_NCCL_DUMP_ON_TIMEOUT`` not
    off), at torch's path (``TORCH_FR_DUMP_TEMP_FILE`` + rank), unless ``CCL_TRACE_TORCH_FILE``
    is set. The first group of a process writes there; later groups (whose ranks are not the
    global ones) add their communicator id to the name so that nothing is overwritten (the
    analyser then needs ``-p`` for them)."""
    global _fr_prefix, _fr_groups

    try:
        size = int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0"))
    except ValueError:
        return
    if size <= 0 or os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT", "1").lower() in ("0", "false"):
        return
    if _fr_prefix is None:
        if os.environ.get("CCL_TRACE_TORCH_FILE"):
            return  # the user's own choice
        _fr_prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "/tmp/nccl_trace_rank_")
    os.environ["CCL_TRACE_TORCH_FILE"] = _fr_prefix if _fr_groups == 0 else _fr_prefix + "%c_"
    os.environ.setdefault("CCL_TRACE_BUFFER", str(size))
    _fr_groups += 1


class ProcessGroupCCL(_Backend):
    """A ``torch.distributed`` backend (device ``cpu``) over a ccl communicator."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._store = store
        self._timeout = timeout if timeout is not None else timedelta(minutes=30)
        if rank == 0:
            uid = _ccl.get_unique_id()
            store.set(_UID_KEY, uid)
        else:
            uid = store.get(_UID_KEY)
        self.comm = _ccl.Communicator(rank, size, uid, timeout=self._timeout)
        self._gone = None
        self._seq = 0
        self._completer = _Completer(self._describe)
        self._p2p = _P2P(self)
        self._monitored = 0

    # -- identity and lifetime --

    def getBackendName(self):
        return BACKEND

    # Capabilities torch asks about. They must be defined here: torch's trampoline looks them
    # up on this object and would otherwise find its own property and recurse.
    @property
    def supports_coalescing(self):
        # torch's coalescing calls startCoalescing/endCoalescing, which a Python backend cannot
        # define; batch_isend_irecv then posts each transfer, which _P2P batches.
        return False

    @property
    def supports_splitting(self):
        return False

    @property
    def supports_shrinking(self):
        return False

    @property
    def supports_reconfigure(self):
        return False

    @property
    def supports_window(self):
        return False

    @property
    def _supports_time_estimate(self):
        return False

    @property
    def options(self):
        return _Backend.Options(BACKEND, self._timeout)

    def _live_comm(self, name):
        c = self.comm
        if c is None:
            raise _fail(
                _ccl.INVALID_USAGE,
                f"invalid usage: ccl {name}: the process group was {self._gone}",
            )
        return c

    def _describe(self, name, e):
        """The error an operation's waiter sees: the library's message, naming the op."""
        if isinstance(e, _ccl.CclError):
            return _ccl.CclError(e.code, f"ccl {name} failed on rank {self._rank}: {e.message}")
        return e

    def abort(self):
        """Fails every pending operation of the group at once."""
        c, self.comm = self.comm, None
        self._gone = self._gone or "aborted"
        self._p2p.cancel("aborted")
        if c is not None:
            c.abort()
        self._completer.stop(timeout=60)

    def shutdown(self):
        """Finishes the operations issued (within the group's timeout), then frees the group.
        Sends and receives recorded but never waited on are dropped with an error."""
        self._p2p.cancel("shut down")
        c, self.comm = self.comm, None
        self._gone = self._gone or "shut down"
        if c is not None:
            c.destroy()
        self._completer.stop(timeout=self._timeout.total_seconds())

    # Collectives issued so far: torch's debug wrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) and
    # its logging compare these across ranks.
    def _set_sequence_number_for_group(self):
        self._seq = 0

    def _get_sequence_number_for_group(self):
        return self._seq

    def _set_default_timeout(self, timeout):
        # The communicator's deadline is fixed when it connects (cclCommInitRankConfig); a new
        # one applies to what this backend waits for itself (monitored barriers).
        self._timeout = timeout

    set_timeout = _set_default_timeout

    # -- the one path every collective takes --

    def _run(self, name, opts, calls, finish=None, result=None):
        """Issues an operation made of library calls, each ``call(async_op)`` returning a
        request when asked for one (None if it ran to completion), and returns its work.

        ``asyncOp`` false (a blocking ``dist.*`` call) runs the calls inline; otherwise they are
        issued non-blocking and the completion thread finishes the work. `finish` runs after
        the last call (copies into the caller's tensors)."""
        comm = self._live_comm(name)
        self._p2p.flush()
        self._seq += 1
        result = [] if result is None else result
        try:
            if opts is not None and not getattr(opts, "asyncOp", True):
                for c in calls:
                    c(comm, False)
                if finish is not None:
                    finish()
                return _finished(result)
            reqs = [r for r in (c(comm, True) for c in calls) if r is not None]
        except _ccl.CclError as e:
            raise self._describe(name, e) from None

        def drive():
            for r in reqs:
                r.wait()
            if finish is not None:
                finish()

        return _Work(name, drive, result, self._completer)

    def _fast(self, name, opts, call, call_async, args, result):
        """An operation that is one library call on the caller's buffers, straight through
        ctypes: inline when blocking, else a request the work waits for."""
        comm = self._live_comm(name)
        self._seq += 1
        try:
            if not opts.asyncOp:
                _ccl._check(call(*args, comm._h))
                return _finished(result)
            req = ctypes.c_void_p()
            _ccl._check(call_async(*args, comm._h, ctypes.byref(req)))
        except _ccl.CclError as e:
            raise self._describe(name, e) from None
        return _Work(name, lambda: _wait_request(req), result, self._completer)

    def _fast_buffer(self, tensors, opts):
        """The one tensor of a call the fast path can take, or None."""
        if len(tensors) != 1 or opts is None or self._p2p._batch:
            return None
        t = tensors[0]
        if t.is_sparse or not t.is_contiguous():
            return None
        return t

    # -- reductions --

    def allreduce(self, tensors, opts=None):
        t = self._fast_buffer(tensors, opts)
        if t is not None:
            dt, op = _FAST_DTYPES.get(t.dtype), _FAST_OPS.get(opts.reduceOp.op.value)
            if dt is not None and op is not None:
                p = t.data_ptr()
                args = (p, p, t.numel(), dt, op)
                return self._fast(
                    "allreduce", opts, _lib.cclAllReduce, _lib.cclAllReduceAsync, args, tensors
                )
        op, factor = _reduction("allreduce", opts.reduceOp if opts is not None else _R.SUM)
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(tensors, op, factor)
        calls, outs = [], []
        for t in tensors:
            o = _Out(t)
            buf, lop = _reducible("allreduce", o.c, op)
            if factor is not None:
                buf.mul_(factor)
            calls.append(lambda c, a, b=buf, p=lop: c.all_reduce(b, op=p, async_op=a))
            outs.append(o)
        return self._run("allreduce", opts, calls, _copy_back(outs), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op, factor = _reduction(
            "allreduce_coalesced", opts.reduceOp if opts is not None else _R.SUM
        )
        if not tensors:
            return _finished([])
        if len({t.dtype for t in tensors}) != 1:
            raise _invalid("allreduce_coalesced: the tensors have different dtypes")
        # One library call for all of them: flattened into one buffer, copied back after.
        flat = torch.cat([t.reshape(-1) for t in tensors])
        buf, lop = _reducible("allreduce_coalesced", flat, op)
        if factor is not None:
            buf.mul_(factor)

        def finish():
            off = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[off : off + n].view(t.shape))
                off += n

        call = lambda c, a: c.all_reduce(buf, op=lop, async_op=a)  # noqa: E731
        return self._run("allreduce_coalesced", opts, [call], finish, tensors)

    def reduce(self, tensors, opts):
        op, factor = _reduction("reduce", opts.reduceOp)
        root = opts.rootRank
        calls, outs = [], []
        for t in tensors:
            o = _Out(t)
            buf, lop = _reducible("reduce", o.c, op)
            if factor is None:
                calls.append(lambda c, a, b=buf, p=lop: c.reduce(b, op=p, root=root, async_op=a))
            else:
                # Scaled into a copy: ranks other than the root keep their tensor.
                src = buf * factor
                calls.append(
                    lambda c, a, s=src, b=buf: c.reduce(
                        s, op=_ccl.SUM, root=root, out=b, async_op=a
                    )
                )
            outs.append(o)
        return self._run("reduce", opts, calls, _copy_back(outs), tensors)

    def _reduce_scatter_call(self, name, out, inp, op, factor):
        """The library call of one reduce-scatter: `inp` (contiguous, size x out) into `out`."""
        if _nbytes(inp) != self._size * _nbytes(out):
            raise _invalid(
                f"{name}: the input has {inp.numel()} elements, {self._size} ranks x "
                f"{out.numel()} need {self._size * out.numel()}"
            )
        src, lop = _reducible(name, inp, op)
        dst, _ = _reducible(name, out, op)
        if factor is not None:
            src = src * factor
        return lambda c, a: c.reduce_scatter(src, op=lop, out=dst, async_op=a)

    def reduce_scatter(self, output_tensors, input_lists, opts):
        op, factor = _reduction("reduce_scatter", opts.reduceOp)
        calls, outs = [], []
        for out, ins in zip(output_tensors, input_lists):
            if len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
                raise _unsupported(
                    "reduce_scatter",
                    "every input must have the output's size (ccl has no reduce-scatter with "
                    "per-rank sizes yet)",
                )
            o = _Out(out)
            flat = torch.cat([i.reshape(-1) for i in ins])
            calls.append(self._reduce_scatter_call("reduce_scatter", o.c, flat, op, factor))
            outs.append(o)
        return self._run("reduce_scatter", opts, calls, _copy_back(outs), output_tensors)

    def reduce_scatter_single(self, output, input, opts):
        op, factor = _reduction("reduce_scatter_tensor", opts.reduceOp)
        o = _Out(output)
        call = self._reduce_scatter_call(
            "reduce_scatter_tensor", o.c, input.contiguous(), op, factor
        )
        return self._run("reduce_scatter_tensor", opts, [call], _copy_back([o]), [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        op, factor = _reduction("reduce_scatter_tensor_coalesced", opts.reduceOp)
        calls, outs = [], []
        for out, inp in zip(outputs, inputs):
            o = _Out(out)
            calls.append(
                self._reduce_scatter_call(
                    "reduce_scatter_tensor_coalesced", o.c, inp.contiguous(), op, factor
                )
            )
            outs.append(o)
        return self._run(
            "reduce_scatter_tensor_coalesced", opts, calls, _copy_back(outs), outputs
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _sparse_allreduce(self, tensors, op, factor):
        """Sum of sparse COO tensors: every rank's indices and values gathered, then summed
        (coalesced) in rank order on every rank, so all ranks get the same tensor."""
        if len(tensors) != 1 or op != _ccl.SUM or factor is not None:
            raise _unsupported("allreduce", "sparse tensors reduce one at a time, with sum only")
        comm = self._live_comm("allreduce")
        self._p2p.flush()
        self._seq += 1
        t = tensors[0]
        s = t.coalesce()
        idx, val = s.indices().contiguous(), s.values().contiguous()
        nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
        counts = torch.empty(self._size, dtype=torch.int64)
        try:
            comm.all_gather(nnz, out=counts)
            idxs = [torch.empty((idx.shape[0], int(k)), dtype=idx.dtype) for k in counts]
            vals = [torch.empty((int(k),) + tuple(val.shape[1:]), dtype=val.dtype) for k in counts]
            _vcoll.all_gather(comm, _bytes(idx), [_bytes(i) for i in idxs])
            _vcoll.all_gather(comm, _bytes(val), [_bytes(v) for v in vals])
        except _ccl.CclError as e:
            raise self._describe("allreduce", e) from None
        total = torch.sparse_coo_tensor(torch.cat(idxs, 1), torch.cat(vals), s.shape)
        t.copy_(total.coalesce())
        return _finished(tensors)

    # -- data movement --

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        t = self._fast_buffer(tensors, opts)
        if t is not None:
            p = t.data_ptr()
            args = (p, p, _nbytes(t), _ccl.DTYPES["uint8"], root)
            return self._fast(
                "broadcast", opts, _lib.cclBroadcast, _lib.cclBroadcastAsync, args, tensors
            )
        calls, outs = [], []
        for t in tensors:
            o = _Out(t)
            b = _bytes(o.c)
            calls.append(lambda c, a, b=b: c.broadcast(b, root=root, async_op=a))
            outs.append(o)
        return self._run("broadcast", opts, calls, _copy_back(outs), tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        calls, finishes = [], []
        for outs, inp in zip(output_lists, input_tensors):
            if len(outs) != self._size:
                raise _invalid(f"allgather: {len(outs)} outputs for {self._size} ranks")
            src = _bytes(inp.contiguous())
            k = src.numel()
            if all(_nbytes(o) == k for o in outs):
                flat = torch.empty(self._size * k, dtype=torch.uint8)
                calls.append(lambda c, a, s=src, f=flat: c.all_gather(s, out=f, async_op=a))
                finishes.append(
                    lambda outs=outs, f=flat, k=k: [
                        _from_bytes(o, f[r * k : (r + 1) * k]) for r, o in enumerate(outs)
                    ]
                )
            else:
                # Per-rank sizes: written straight into the outputs.
                stand = [_Out(o) for o in outs]
                calls.append(
                    lambda c, a, s=src, st=stand: _vcoll.all_gather(
                        c, s, [_bytes(o.c) for o in st]
                    )
                )
                finishes.append(_copy_back(stand))

        def finish():
            for f in finishes:
                if f is not None:
                    f()

        return self._run("allgather", opts, calls, finish, output_lists)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # c10d's layout: output_lists[r][j] receives input j of rank r. One library call: the
        # inputs' bytes back to back, gathered, then copied out.
        if len(output_lists) != self._size:
            raise _invalid(
                f"allgather_coalesced: {len(output_lists)} output lists for {self._size} ranks"
            )
        sizes = [_nbytes(t) for t in input_list]
        for r, outs in enumerate(output_lists):
            if [_nbytes(o) for o in outs] != sizes:
                raise _invalid(
                    f"allgather_coalesced: output list {r} does not match the inputs' sizes"
                )
        src = torch.cat([_bytes(t.contiguous()) for t in input_list]) if input_list else None
        total = sum(sizes)
        flat = torch.empty(self._size * total, dtype=torch.uint8)

        def finish():
            for r, outs in enumerate(output_lists):
                off = r * total
                for o, n in zip(outs, sizes):
                    _from_bytes(o, flat[off : off + n])
                    off += n

        if src is None:
            return _finished(output_lists)
        call = lambda c, a: c.all_gather(src, out=flat, async_op=a)  # noqa: E731
        return self._run("allgather_coalesced", opts, [call], finish, output_lists)

    def _all_gather_call(self, name, out, inp):
        src = _bytes(inp.contiguous())
        dst = _bytes(out)
        if dst.numel() != self._size * src.numel():
            raise _invalid(
                f"{name}: the output has {out.numel()} elements, {self._size} ranks x "
                f"{inp.numel()} need {self._size * inp.numel()}"
            )
        return lambda c, a: c.all_gather(src, out=dst, async_op=a)

    def all_gather_single(self, output, input, opts=None):
        o = _Out(output)
        call = self._all_gather_call("all_gather_into_tensor", o.c, input)
        return self._run("all_gather_into_tensor", opts, [call], _copy_back([o]), [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        calls, outs = [], []
        for out, inp in zip(outputs, inputs):
            o = _Out(out)
            calls.append(self._all_gather_call("all_gather_into_tensor_coalesced", o.c, inp))
            outs.append(o)
        return self._run(
            "all_gather_into_tensor_coalesced", opts, calls, _copy_back(outs), outputs
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise _invalid(
                f"alltoall: {len(input_tensors)} inputs and {len(output_tensors)} outputs for "
                f"{n} ranks"
            )
        sizes = {_nbytes(t) for t in output_tensors} | {_nbytes(t) for t in input_tensors}
        if len(sizes) == 1:
            k = sizes.pop()
            src = torch.cat([_bytes(t.contiguous()) for t in input_tensors])
            dst = torch.empty(n * k, dtype=torch.uint8)

            def finish():
                for r, o in enumerate(output_tensors):
                    _from_bytes(o, dst[r * k : (r + 1) * k])

            call = lambda c, a: c.all_to_all(src, out=dst, async_op=a)  # noqa: E731
            return self._run("alltoall", opts, [call], finish, output_tensors)
        stand = [_Out(o) for o in output_tensors]
        sends = [_bytes(t.contiguous()) for t in input_tensors]
        call = lambda c, a: _vcoll.all_to_all(c, sends, [_bytes(o.c) for o in stand])  # noqa: E731
        return self._run("alltoall", opts, [call], _copy_back(stand), output_tensors)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        n = self._size
        if not (input.is_contiguous() and output.is_contiguous()):
            # As Gloo: refused before anything is sent.
            raise ValueError("Tensors must be contiguous")
        o = _Out(output)
        src, dst = _bytes(input.contiguous()), _bytes(o.c)
        out_splits, in_splits = list(output_splits), list(input_splits)
        if not out_splits and not in_splits:
            if src.numel() != dst.numel() or src.numel() % n:
                raise _invalid(
                    f"all_to_all_single: input and output of {input.numel()} and "
                    f"{output.numel()} elements do not split into {n} equal blocks"
                )
            call = lambda c, a: c.all_to_all(src, out=dst, async_op=a)  # noqa: E731
            return self._run("all_to_all_single", opts, [call], _copy_back([o]), [output])
        sends = _split_rows("input", input, in_splits, src, n)
        recvs = _split_rows("output", output, out_splits, dst, n)
        call = lambda c, a: _vcoll.all_to_all(c, sends, recvs)  # noqa: E731
        return self._run("all_to_all_single", opts, [call], _copy_back([o]), [output])

    alltoall_base = all_to_all_single

    def gather(self, output_lists, input_tensors, opts):
        root = opts.rootRank
        if len(input_tensors) != 1:
            raise _invalid(f"gather: {len(input_tensors)} input tensors, ccl takes one")
        src = _bytes(input_tensors[0].contiguous())
        stand = None
        if self._rank == root:
            if len(output_lists) != 1 or len(output_lists[0]) != self._size:
                raise _invalid(f"gather: the root needs one list of {self._size} outputs")
            stand = [_Out(t) for t in output_lists[0]]
        call = lambda c, a: _vcoll.gather(  # noqa: E731
            c, root, src, None if stand is None else [_bytes(o.c) for o in stand]
        )
        finish = _copy_back(stand) if stand else None
        return self._run("gather", opts, [call], finish, output_lists)

    def scatter(self, output_tensors, input_lists, opts):
        root = opts.rootRank
        if len(output_tensors) != 1:
            raise _invalid(f"scatter: {len(output_tensors)} output tensors, ccl takes one")
        o = _Out(output_tensors[0])
        sends = None
        if self._rank == root:
            if len(input_lists) != 1 or len(input_lists[0]) != self._size:
                raise _invalid(f"scatter: the root needs one list of {self._size} inputs")
            sends = [_bytes(t.contiguous()) for t in input_lists[0]]
        call = lambda c, a: _vcoll.scatter(c, root, sends, _bytes(o.c))  # noqa: E731
        return self._run("scatter", opts, [call], _copy_back([o]), output_tensors)

    # -- synchronization --

    def barrier(self, opts=None):
        # opts.device_ids names GPUs, which a CPU backend has none of.
        call = lambda c, a: c.barrier(async_op=a)  # noqa: E731
        return self._run("barrier", opts, [call])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """Gloo's monitored barrier, through the group's store so that it keeps its own
        timeout: every rank checks in with rank 0, which reports the first rank (or, with
        `wait_all_ranks`, every rank) that did not arrive in time, then releases the others."""
        timeout = getattr(opts, "timeout", None)
        if timeout is None or timeout < timedelta(0):
            timeout = self._timeout
        ms = int(timeout.total_seconds() * 1000)
        self._live_comm("monitored_barrier")
        self._monitored += 1
        key = f"ccl/monitored_barrier/{self._monitored}"
        store = self._store
        if self._rank != 0:
            store.set(f"{key}/{self._rank}", "1")
            ok = _store_wait(store, f"{key}/release", timeout) and store.get(
                f"{key}/release"
            ) == b"ok"
            if not ok:
                raise RuntimeError(
                    f"Rank {self._rank} successfully reached monitoredBarrier, but received "
                    "errors while waiting for send/recv from rank 0. Please check rank 0 logs "
                    "for faulty rank."
                )
            return
        if ms <= 0:
            store.set(f"{key}/release", "failed")
            raise RuntimeError(f"Rank 0 timed out in monitoredBarrier after {ms} ms")
        deadline = time.monotonic() + timeout.total_seconds()
        missing = []
        for r in range(1, self._size):
            left = timedelta(seconds=max(0.0, deadline - time.monotonic()))
            if not _store_wait(store, f"{key}/{r}", left):
                missing.append(r)
                if not wait_all_ranks:
                    break
        store.set(f"{key}/release", "failed" if missing else "ok")
        if len(missing) == 1 and not wait_all_ranks:
            raise RuntimeError(
                f"Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms"
            )
        if missing:
            ranks = ", ".join(str(r) for r in missing)
            raise RuntimeError(f"Ranks {ranks} failed to pass monitoredBarrier in {ms} ms")

    # -- point to point --

    def send(self, tensors, dst, tag=0):
        if len(tensors) != 1:
            raise _invalid(f"send: {len(tensors)} tensors, ccl sends one")
        return self._p2p.post("send", tensors[0], dst, tag)

    def recv(self, tensors, src, tag=0):
        if len(tensors) != 1:
            raise _invalid(f"recv: {len(tensors)} tensors, ccl receives one")
        return self._p2p.post("recv", tensors[0], src, tag)

    def recv_anysource(self, tensors, tag=0):
        # torch wraps a Python backend's work in a holder that passes on only wait() and
        # get_future(), so `dist.recv` could not learn the sender: only the C++ backend can.
        raise _unsupported(
            "recv",
            "receiving from any source (src=None) needs ccl's native backend (torch does not "
            "pass a Python backend's source rank on); install it with a C++ compiler present, "
            "or name the source rank",
        )


def _split_rows(what, t, splits, b, n):
    """The byte blocks of `b` (tensor `t`'s bytes) for rows split as `splits` (or equally)."""
    rows = t.shape[0] if t.dim() else 1
    row = b.numel() // rows if rows else 0
    if not splits:
        if rows % n:
            raise _invalid(f"all_to_all_single: {what} has {rows} rows, not a multiple of {n}")
        splits = [rows // n] * n
    if len(splits) != n or sum(splits) != rows:
        raise _invalid(
            f"all_to_all_single: {what} splits {splits} do not split {rows} rows among {n} ranks"
        )
    out, off = [], 0
    for s in splits:
        out.append(b[off * row : (off + s) * row])
        off += s
    return out


def _store_wait(store, key, timeout):
    """Whether `key` appears in `store` within `timeout` (0: now, not the store's default)."""
    if store.check([key]):
        return True
    if timeout <= timedelta(0):
        return False
    try:
        store.wait([key], timeout)
        return True
    except RuntimeError:
        return False


def _borrowed_comm(pg):
    """The native backend's communicator as a ``ccl.Communicator`` (revoke, shrink,
    failed_ranks), which the group keeps owning; None once the group was shut down."""
    h = pg._comm_handle()
    return _ccl.Communicator._borrow(h) if h else None


def _native():
    """The native (C++) backend's module, or None and why not."""
    choice = os.environ.get("CCL_TORCH_BACKEND", "auto").lower()
    if choice not in ("auto", "native", "python"):
        raise ValueError(f"CCL_TORCH_BACKEND={choice}: expected auto, native or python")
    if choice == "python":
        return None, "CCL_TORCH_BACKEND=python"
    try:
        from ccl import _ctorch
    except ImportError as e:
        if choice == "native":
            raise ImportError(f"CCL_TORCH_BACKEND=native, but {e}") from e
        return None, f"the native backend is not built or does not load ({e})"
    _ctorch.load_library(_lib.path)
    _ctorch.ProcessGroupCCL.comm = property(_borrowed_comm)
    return _ctorch, None


# The Python backend stays, as the fall-back where the native one was not built (no compiler,
# no torch at install time) and for comparison (CCL_TORCH_BACKEND=python).
PythonProcessGroupCCL = ProcessGroupCCL
_ctorch, _why_not = _native()
if _ctorch is not None:
    IMPLEMENTATION = "native"
    ProcessGroupCCL = _ctorch.ProcessGroupCCL  # noqa: F811 - the one torch gets
    _log.info("ccl.torch: the native (C++) backend runs")
else:
    IMPLEMENTATION = "python"
    (_log.info if _why_not.startswith("CCL_TORCH_BACKEND") else _log.warning)(
        "ccl.torch: the Python backend runs: %s", _why_not
    )


def _create(store, rank, size, timeout):
    timeout = timeout if timeout is not None else timedelta(minutes=30)
    _flight_recorder_from_torch_env()
    if _ctorch is not None:
        return ProcessGroupCCL(store, rank, size, int(timeout.total_seconds() * 1000))
    return PythonProcessGroupCCL(store, rank, size, timeout)


def _register():
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


_register()
