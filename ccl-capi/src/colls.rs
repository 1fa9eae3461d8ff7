//! Collectives, blocking and non-blocking, and requests.

use std::ffi::{c_int, c_void};

use ccl::Collective;

use crate::buffers::{Prepared, prepare};
use crate::error::{Fail, guard, out};
use crate::handles::{comm_from, insert_request, take_request, test_request};
use crate::{cclComm_t, cclDataType_t, cclRedOp_t, cclRequest_t, cclResult_t, group};

/// A blocking collective: checked, then run (or recorded, inside a group).
#[allow(clippy::too_many_arguments)]
fn blocking(
    name: &str,
    coll: Collective,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: cclComm_t,
) -> cclResult_t {
    guard(name, || {
        let c = comm_from(comm)?;
        let p = if coll == Collective::Barrier {
            Prepared::barrier()
        } else {
            prepare(&c, coll, sendbuff, recvbuff, count, datatype, op, root)?
        };
        if group::active() {
            group::defer(comm, c, p);
            return Ok(());
        }
        p.run(&c)
    })
}

/// A non-blocking collective: checked, then queued; the request is registered.
#[allow(clippy::too_many_arguments)]
fn nonblocking(
    name: &str,
    coll: Collective,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
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
        let p = if coll == Collective::Barrier {
            Prepared::barrier()
        } else {
            prepare(&c, coll, sendbuff, recvbuff, count, datatype, op, root)?
        };
        let req = c.collective_bytes_async(p.coll, p.send, p.recv, p.count, p.dtype, p.op, p.root);
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
    let c = Collective::AllReduce;
    blocking(
        "cclAllReduce",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        0,
        comm,
    )
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
    let c = Collective::Broadcast;
    blocking(
        "cclBroadcast",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
    )
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
    let c = Collective::Reduce;
    blocking(
        "cclReduce",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        op,
        root,
        comm,
    )
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
    let c = Collective::AllGather;
    blocking(
        "cclAllGather",
        c,
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        0,
        0,
        comm,
    )
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
    let c = Collective::ReduceScatter;
    blocking(
        "cclReduceScatter",
        c,
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        op,
        0,
        comm,
    )
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
    let c = Collective::AllToAll;
    blocking(
        "cclAlltoAll",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        0,
        comm,
    )
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
    let c = Collective::Gather;
    blocking(
        "cclGather",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
    )
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
    let c = Collective::Scatter;
    blocking(
        "cclScatter",
        c,
        sendbuff,
        recvbuff,
        count,
        datatype,
        0,
        root,
        comm,
    )
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
    let (n, c) = ("cclGatherAsync", Collective::Gather);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, 0, root, comm, request,
    )
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
    let (n, c) = ("cclScatterAsync", Collective::Scatter);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, 0, root, comm, request,
    )
}

/// Barrier.
#[unsafe(no_mangle)]
pub extern "C" fn cclBarrier(comm: cclComm_t) -> cclResult_t {
    let c = Collective::Barrier;
    blocking("cclBarrier", c, NO_BUF, NO_BUF, 0, 0, 0, 0, comm)
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
    let (n, c) = ("cclAllReduceAsync", Collective::AllReduce);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, op, 0, comm, request,
    )
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
    let (n, c) = ("cclBroadcastAsync", Collective::Broadcast);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, 0, root, comm, request,
    )
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
    let (n, c) = ("cclReduceAsync", Collective::Reduce);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, op, root, comm, request,
    )
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
    let (n, c) = ("cclAllGatherAsync", Collective::AllGather);
    nonblocking(
        n, c, sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, request,
    )
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
    let (n, c) = ("cclReduceScatterAsync", Collective::ReduceScatter);
    nonblocking(
        n, c, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, request,
    )
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
    let (n, c) = ("cclAlltoAllAsync", Collective::AllToAll);
    nonblocking(
        n, c, sendbuff, recvbuff, count, datatype, 0, 0, comm, request,
    )
}

/// Non-blocking barrier.
#[unsafe(no_mangle)]
pub extern "C" fn cclBarrierAsync(comm: cclComm_t, request: *mut cclRequest_t) -> cclResult_t {
    let (n, c) = ("cclBarrierAsync", Collective::Barrier);
    nonblocking(n, c, NO_BUF, NO_BUF, 0, 0, 0, 0, comm, request)
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
