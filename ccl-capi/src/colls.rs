//! Collectives, blocking and non-blocking, and requests.

use std::ffi::{c_int, c_void};

use oxccl::Collective;

use crate::buffers::{Prepared, RawCall, prepare, ranges};
use crate::error::{Fail, guard, out};
use crate::handles::{Tracked, comm_from, insert_request, take_request, test_request};
use crate::{cclComm_t, cclDataType_t, cclRedOp_t, cclRequest_t, cclResult_t, group};

/// A blocking collective: checked, then run (or recorded, inside a group).
fn blocking(name: &str, call: RawCall, comm: cclComm_t) -> cclResult_t {
    guard(name, || {
        let c = comm_from(comm)?;
        let p = if call.coll == Collective::Barrier {
            Prepared::barrier()
        } else {
            prepare(&c, &call)?
        };
        if group::active() {
            group::defer(comm, c, p);
            return Ok(());
        }
        p.run(&c)
    })
}

/// A non-blocking collective: checked, then queued; the request is registered.
fn nonblocking(
    name: &str,
    call: RawCall,
    comm: cclComm_t,
    request: *mut cclRequest_t,
) -> cclResult_t {
    guard(name, || {
        out(request, "request", std::ptr::null_mut())?;
        if group::active() {
            return Err(Fail::usage(
                "non-blocking operations cannot be part of a group (call it outside \
                 cclGroupStart/cclGroupEnd)",
            ));
        }
        let c = comm_from(comm)?;
        let p = if call.coll == Collective::Barrier {
            Prepared::barrier()
        } else {
            prepare(&c, &call)?
        };
        let ranges = ranges(p.send.as_ref(), &p.recv);
        let inner =
            c.collective_bytes_async(p.coll, p.send, p.recv, p.count, p.dtype, p.op, p.root);
        let req = Tracked {
            comm: comm as usize,
            ranges,
            inner,
        };
        out(request, "request", insert_request(Box::new(req)))
    })
}

const NO_BUF: *mut c_void = std::ptr::null_mut();

c_fn! {
    /// recvbuff[i] = op over ranks of sendbuff[i], count elements, on every rank.
    pub fn cclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::AllReduce, sendbuff, recvbuff, count, datatype).op(op);
        blocking("cclAllReduce", call, comm)
    }
}

c_fn! {
    /// Copies count elements from root's sendbuff to every rank's recvbuff (sendbuff is read on
    /// root only; other ranks may pass NULL).
    pub fn cclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Broadcast, sendbuff, recvbuff, count, datatype)
            .root(root);
        blocking("cclBroadcast", call, comm)
    }
}

c_fn! {
    /// Reduces every rank's sendbuff into root's recvbuff (recvbuff is written on root only; other
    /// ranks may pass NULL).
    pub fn cclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        root: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Reduce, sendbuff, recvbuff, count, datatype)
            .op(op)
            .root(root);
        blocking("cclReduce", call, comm)
    }
}

c_fn! {
    /// recvbuff (nranks * sendcount elements) receives every rank's sendbuff, in rank order.
    pub fn cclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(
            Collective::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
        );
        blocking("cclAllGather", call, comm)
    }
}

c_fn! {
    /// Rank r's recvbuff (recvcount elements) receives the reduction of block r of every rank's
    /// sendbuff (nranks * recvcount elements).
    pub fn cclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(
            Collective::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
        )
        .op(op);
        blocking("cclReduceScatter", call, comm)
    }
}

c_fn! {
    /// Block k (count elements) of sendbuff goes to block rank of rank k's recvbuff; both buffers
    /// hold nranks * count elements.
    pub fn cclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::AllToAll, sendbuff, recvbuff, count, datatype);
        blocking("cclAlltoAll", call, comm)
    }
}

c_fn! {
    /// Gathers count elements of every rank's sendbuff into root's recvbuff (nranks * count
    /// elements, in rank order), as NCCL 2.28's ncclGather. recvbuff is written on root only (other
    /// ranks may pass NULL). In place on root when sendbuff == recvbuff + root * count * size.
    pub fn cclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Gather, sendbuff, recvbuff, count, datatype)
            .root(root);
        blocking("cclGather", call, comm)
    }
}

c_fn! {
    /// Block k (count elements) of root's sendbuff (nranks * count elements) goes to rank k's
    /// recvbuff, as NCCL 2.28's ncclScatter. sendbuff is read on root only (other ranks may pass
    /// NULL). In place on root when recvbuff == sendbuff + root * count * size.
    pub fn cclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Scatter, sendbuff, recvbuff, count, datatype)
            .root(root);
        blocking("cclScatter", call, comm)
    }
}

c_fn! {
    /// Non-blocking gather.
    pub fn cclGatherAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Gather, sendbuff, recvbuff, count, datatype)
            .root(root);
        nonblocking("cclGatherAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking scatter.
    pub fn cclScatterAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Scatter, sendbuff, recvbuff, count, datatype)
            .root(root);
        nonblocking("cclScatterAsync", call, comm, request)
    }
}

c_fn! {
    /// Returns once every rank of comm has called it.
    pub fn cclBarrier(comm: cclComm_t) -> cclResult_t {
        let call = RawCall::new(Collective::Barrier, NO_BUF, NO_BUF, 0, 0);
        blocking("cclBarrier", call, comm)
    }
}

c_fn! {
    /// Non-blocking allreduce.
    pub fn cclAllReduceAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::AllReduce, sendbuff, recvbuff, count, datatype).op(op);
        nonblocking("cclAllReduceAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking broadcast.
    pub fn cclBroadcastAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        root: c_int,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Broadcast, sendbuff, recvbuff, count, datatype)
            .root(root);
        nonblocking("cclBroadcastAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking reduce.
    pub fn cclReduceAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        root: c_int,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::Reduce, sendbuff, recvbuff, count, datatype)
            .op(op)
            .root(root);
        nonblocking("cclReduceAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking allgather.
    pub fn cclAllGatherAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(
            Collective::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
        );
        nonblocking("cclAllGatherAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking reduce-scatter.
    pub fn cclReduceScatterAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(
            Collective::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
        )
        .op(op);
        nonblocking("cclReduceScatterAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking alltoall.
    pub fn cclAlltoAllAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let call = RawCall::new(Collective::AllToAll, sendbuff, recvbuff, count, datatype);
        nonblocking("cclAlltoAllAsync", call, comm, request)
    }
}

c_fn! {
    /// Non-blocking barrier.
    pub fn cclBarrierAsync(comm: cclComm_t, request: *mut cclRequest_t) -> cclResult_t {
        let call = RawCall::new(Collective::Barrier, NO_BUF, NO_BUF, 0, 0);
        nonblocking("cclBarrierAsync", call, comm, request)
    }
}

c_fn! {
    /// Sets *done to 1 if the operation has finished, else 0. When done, the request is released
    /// (the handle becomes invalid) and the operation's result is returned.
    pub fn cclTest(request: cclRequest_t, done: *mut c_int) -> cclResult_t {
        guard("cclTest", || {
            if done.is_null() {
                return Err(Fail::arg("done is NULL"));
            }
            match test_request(request)? {
                None => out(done, "done", 0),
                Some(r) => {
                    out(done, "done", 1)?;
                    r.map_err(Fail::from)
                }
            }
        })
    }
}

c_fn! {
    /// Waits for the operation, releases the request and returns the operation's result. Every
    /// wait ends: operations fail at their deadline (CCL_TIMEOUT without progress) or on abort.
    pub fn cclWait(request: cclRequest_t) -> cclResult_t {
        guard("cclWait", || {
            take_request(request)?.finish()?;
            Ok(())
        })
    }
}
