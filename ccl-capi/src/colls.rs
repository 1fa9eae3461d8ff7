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

/// Allreduce.
#[unsafe(no_mangle)]
pub extern "C" fn cclAllReduce(
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

/// Broadcast from `root`.
#[unsafe(no_mangle)]
pub extern "C" fn cclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Broadcast, sendbuff, recvbuff, count, datatype).root(root);
    blocking("cclBroadcast", call, comm)
}

/// Reduce to `root`.
#[unsafe(no_mangle)]
pub extern "C" fn cclReduce(
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

/// Allgather of `sendcount` elements per rank.
#[unsafe(no_mangle)]
pub extern "C" fn cclAllGather(
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

/// Reduce-scatter of `recvcount` elements per rank.
#[unsafe(no_mangle)]
pub extern "C" fn cclReduceScatter(
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

/// Alltoall of `count` elements per peer.
#[unsafe(no_mangle)]
pub extern "C" fn cclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    comm: cclComm_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::AllToAll, sendbuff, recvbuff, count, datatype);
    blocking("cclAlltoAll", call, comm)
}

/// Gather of `count` elements per rank to `root` (NCCL 2.28's `ncclGather`).
#[unsafe(no_mangle)]
pub extern "C" fn cclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Gather, sendbuff, recvbuff, count, datatype).root(root);
    blocking("cclGather", call, comm)
}

/// Scatter of `count` elements per rank from `root` (NCCL 2.28's `ncclScatter`).
#[unsafe(no_mangle)]
pub extern "C" fn cclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Scatter, sendbuff, recvbuff, count, datatype).root(root);
    blocking("cclScatter", call, comm)
}

/// Non-blocking gather.
#[unsafe(no_mangle)]
pub extern "C" fn cclGatherAsync(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
    request: *mut cclRequest_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Gather, sendbuff, recvbuff, count, datatype).root(root);
    nonblocking("cclGatherAsync", call, comm, request)
}

/// Non-blocking scatter.
#[unsafe(no_mangle)]
pub extern "C" fn cclScatterAsync(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
    request: *mut cclRequest_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Scatter, sendbuff, recvbuff, count, datatype).root(root);
    nonblocking("cclScatterAsync", call, comm, request)
}

/// Barrier.
#[unsafe(no_mangle)]
pub extern "C" fn cclBarrier(comm: cclComm_t) -> cclResult_t {
    let call = RawCall::new(Collective::Barrier, NO_BUF, NO_BUF, 0, 0);
    blocking("cclBarrier", call, comm)
}

/// Non-blocking allreduce.
#[unsafe(no_mangle)]
pub extern "C" fn cclAllReduceAsync(
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

/// Non-blocking broadcast.
#[unsafe(no_mangle)]
pub extern "C" fn cclBroadcastAsync(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: cclDataType_t,
    root: c_int,
    comm: cclComm_t,
    request: *mut cclRequest_t,
) -> cclResult_t {
    let call = RawCall::new(Collective::Broadcast, sendbuff, recvbuff, count, datatype).root(root);
    nonblocking("cclBroadcastAsync", call, comm, request)
}

/// Non-blocking reduce.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn cclReduceAsync(
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

/// Non-blocking allgather.
#[unsafe(no_mangle)]
pub extern "C" fn cclAllGatherAsync(
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

/// Non-blocking reduce-scatter.
#[unsafe(no_mangle)]
pub extern "C" fn cclReduceScatterAsync(
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

/// Non-blocking alltoall.
#[unsafe(no_mangle)]
pub extern "C" fn cclAlltoAllAsync(
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

/// Non-blocking barrier.
#[unsafe(no_mangle)]
pub extern "C" fn cclBarrierAsync(comm: cclComm_t, request: *mut cclRequest_t) -> cclResult_t {
    let call = RawCall::new(Collective::Barrier, NO_BUF, NO_BUF, 0, 0);
    nonblocking("cclBarrierAsync", call, comm, request)
}

/// Whether the request has finished; if so, releases it and returns its result.
#[unsafe(no_mangle)]
pub extern "C" fn cclTest(request: cclRequest_t, done: *mut c_int) -> cclResult_t {
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

/// Waits for the request, releases it and returns its result.
#[unsafe(no_mangle)]
pub extern "C" fn cclWait(request: cclRequest_t) -> cclResult_t {
    guard("cclWait", || {
        take_request(request)?.finish()?;
        Ok(())
    })
}
