"""The ``"ccl"`` backend of ``torch.distributed``, for CPU tensors.

    import ccl.torch                     # registers the backend
    import torch.distributed as dist
    dist.init_process_group("ccl", init_method="file:///tmp/job", rank=r, world_size=n)
    model = torch.nn.parallel.DistributedDataParallel(model)

Rank 0 makes a ccl unique id and puts it in torch's store; the other ranks read it from there,
so whatever rendezvous torch uses (env://, file://, tcp://) carries ccl's too. The process group
is written in Python over the C library; operations run when called and return completed work
objects, which is what DistributedDataParallel and the ``torch.distributed`` functions expect.
"""

from datetime import timedelta

import torch
import torch.distributed as dist

import ccl as _ccl

__all__ = ["ProcessGroupCCL", "BACKEND"]

BACKEND = "ccl"
_UID_KEY = "ccl/unique_id"

_WorkBase = getattr(dist, "Work", None) or dist.distributed_c10d.Work


def _op(reduce_op):
    R = dist.ReduceOp
    for theirs, ours in (
        (R.SUM, _ccl.SUM),
        (R.PRODUCT, _ccl.PROD),
        (R.MIN, _ccl.MIN),
        (R.MAX, _ccl.MAX),
        (R.AVG, _ccl.AVG),
    ):
        if reduce_op == theirs:
            return ours
    raise _ccl.CclError(
        _ccl.INVALID_ARGUMENT,
        f"invalid argument: reduce op {reduce_op} is not supported by ccl (sum, product, min, "
        "max, avg)",
    )


class _Done(_WorkBase):
    """A finished operation whose future holds its output tensors."""

    def __init__(self, result):
        super().__init__()
        self._fut = torch.futures.Future()
        self._fut.set_result(result)

    def wait(self, timeout=timedelta(0)):
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def exception(self):
        return None

    def result(self):
        return self._fut.value()


class _Contig:
    """A contiguous stand-in for a tensor, written back on exit if it was a copy."""

    def __init__(self, t):
        self.t = t
        self.c = t if t.is_contiguous() else t.contiguous()

    def __enter__(self):
        return self.c

    def __exit__(self, *exc):
        if self.c is not self.t and exc[0] is None:
            self.t.copy_(self.c)
        return False


class ProcessGroupCCL(dist.ProcessGroup):
    """A ``torch.distributed`` process group over a ccl communicator."""

    def __init__(self, store, rank, size, timeout=None):
        super().__init__(rank, size)
        if rank == 0:
            uid = _ccl.get_unique_id()
            store.set(_UID_KEY, uid)
        else:
            uid = store.get(_UID_KEY)
        self.comm = _ccl.Communicator(rank, size, uid)

    # -- identity --

    def getBackendName(self):
        return BACKEND

    @property
    def name(self):
        return BACKEND

    def abort(self):
        if self.comm is not None:
            self.comm.abort()

    def shutdown(self):
        if self.comm is not None:
            self.comm.destroy()

    # -- collectives --

    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None else _ccl.SUM
        for t in tensors:
            with _Contig(t) as c:
                self.comm.all_reduce(c, op=op)
        return _Done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts):
        root = opts.rootRank
        for t in tensors:
            with _Contig(t) as c:
                self.comm.broadcast(c, root=root)
        return _Done(tensors)

    def reduce(self, tensors, opts):
        op, root = _op(opts.reduceOp), opts.rootRank
        for t in tensors:
            with _Contig(t) as c:
                self.comm.reduce(c, op=op, root=root)
        return _Done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, inp in zip(output_tensors, input_tensors):
            inp = inp.contiguous()
            flat = torch.empty(inp.numel() * self.size(), dtype=inp.dtype)
            self.comm.all_gather(inp, out=flat)
            for r, o in enumerate(outs):
                o.copy_(flat[r * inp.numel() : (r + 1) * inp.numel()].view(o.shape))
        return _Done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # c10d's layout: output_lists[r][j] receives input j of rank r (allgather's is the
        # transpose, output_tensors[j][r]).
        per_input = [[outs[j] for outs in output_lists] for j in range(len(input_list))]
        self.allgather(per_input, input_list, opts)
        return _Done(output_lists)

    def all_gather_single(self, output, input, opts=None):
        with _Contig(output) as o:
            self.comm.all_gather(input.contiguous(), out=o)
        return _Done([output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for o, i in zip(outputs, inputs):
            self.all_gather_single(o, i, opts)
        return _Done(outputs)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        op = _op(opts.reduceOp)
        for out, ins in zip(output_tensors, input_tensors):
            flat = torch.cat([t.reshape(-1) for t in ins])
            with _Contig(out) as o:
                self.comm.reduce_scatter(flat, op=op, out=o)
        return _Done(output_tensors)

    def reduce_scatter_single(self, output, input, opts):
        with _Contig(output) as o:
            self.comm.reduce_scatter(input.contiguous(), op=_op(opts.reduceOp), out=o)
        return _Done([output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        for o, i in zip(outputs, inputs):
            self.reduce_scatter_single(o, i, opts)
        return _Done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.empty_like(flat_in)
        self.comm.all_to_all(flat_in, out=flat_out)
        off = 0
        for o in output_tensors:
            o.copy_(flat_out[off : off + o.numel()].view(o.shape))
            off += o.numel()
        return _Done(output_tensors)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        if list(output_splits) or list(input_splits):
            n = self.size()
            even = input.shape[0] // n if input.dim() else 0
            if any(s != even for s in list(output_splits) + list(input_splits)):
                raise _ccl.CclError(
                    _ccl.INVALID_ARGUMENT,
                    "invalid argument: ccl's alltoall takes equal splits only",
                )
        with _Contig(output) as o:
            self.comm.all_to_all(input.contiguous(), out=o)
        return _Done([output])

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        self.comm.barrier()
        return _Done([])

    def send(self, tensors, dst, tag=0):
        for t in tensors:
            self.comm.send(t.contiguous(), dst)
        return _Done(tensors)

    def recv(self, tensors, src, tag=0):
        for t in tensors:
            with _Contig(t) as c:
                self.comm.recv(c, src)
        return _Done(tensors)


def _create(store, rank, size, timeout):
    return ProcessGroupCCL(store, rank, size, timeout)


def _register():
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


_register()
