//! `cclGroupStart`/`cclGroupEnd` and point-to-point operations.
//!
//! As in NCCL, the group is per thread: between the outermost start and end, operations are
//! recorded with the communicator they target, and the end runs them. Per communicator (in the
//! order each was first used) the recorded collectives run first, in order, then every send and
//! receive together as one exchange (`oxccl::Group`), which is what keeps "everyone sends, then
//! everyone receives" from deadlocking.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

use oxccl::Communicator;

use crate::buffers::{
    OutBuf, Prepared, PreparedV, RawIn, RawOut, bytes_of, check_region, dtype_of,
};
use crate::error::{Fail, guard, out};
use crate::handles::{comm_from, comm_live};
use crate::{cclComm_t, cclDataType_t, cclResult_t};

enum Op {
    Coll(Prepared),
    CollV(PreparedV),
    Send(RawIn, usize),
    Recv(OutBuf, usize),
}

struct Recorded {
    handle: usize,
    comm: Arc<Communicator>,
    op: Op,
}

#[derive(Default)]
struct State {
    depth: usize,
    ops: Vec<Recorded>,
}

thread_local! {
    static GROUP: RefCell<State> = RefCell::new(State::default());
}

/// Whether this thread is inside a group.
pub(crate) fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Records a collective for the end of the group.
pub(crate) fn defer(handle: cclComm_t, comm: Arc<Communicator>, p: Prepared) {
    record(handle, comm, Op::Coll(p));
}

/// Records a collective with a count per rank for the end of the group.
pub(crate) fn defer_v(handle: cclComm_t, comm: Arc<Communicator>, p: PreparedV) {
    record(handle, comm, Op::CollV(p));
}

fn record(handle: cclComm_t, comm: Arc<Communicator>, op: Op) {
    GROUP.with(|g| {
        g.borrow_mut().ops.push(Recorded {
            handle: handle as usize,
            comm,
            op,
        })
    });
}

c_fn! {
    /// Starts (or nests) a group on this thread.
    pub fn cclGroupStart() -> cclResult_t {
        guard("cclGroupStart", || {
            GROUP.with(|g| g.borrow_mut().depth += 1);
            Ok(())
        })
    }
}

c_fn! {
    /// Ends a group; the outermost end runs what was recorded.
    pub fn cclGroupEnd() -> cclResult_t {
        guard("cclGroupEnd", || {
            let ops = GROUP.with(|g| {
                let mut g = g.borrow_mut();
                if g.depth == 0 {
                    return Err(Fail::usage("cclGroupEnd without a matching cclGroupStart"));
                }
                g.depth -= 1;
                Ok(if g.depth == 0 {
                    std::mem::take(&mut g.ops)
                } else {
                    Vec::new()
                })
            })?;
            run(ops)
        })
    }
}

/// Runs recorded operations, per communicator; returns the first failure after trying every
/// communicator (the one that failed skips the rest of its operations).
fn run(ops: Vec<Recorded>) -> Result<(), Fail> {
    let mut order: Vec<usize> = Vec::new();
    for r in &ops {
        if !order.contains(&r.handle) {
            order.push(r.handle);
        }
    }
    let mut ops: Vec<Option<Recorded>> = ops.into_iter().map(Some).collect();
    let mut first: Option<Fail> = None;
    for h in order {
        let mine: Vec<Recorded> = ops
            .iter_mut()
            .filter(|r| r.as_ref().is_some_and(|r| r.handle == h))
            .filter_map(Option::take)
            .collect();
        if let Err(e) = run_comm(h, mine) {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

fn run_comm(h: usize, ops: Vec<Recorded>) -> Result<(), Fail> {
    let Some(comm) = ops.first().map(|r| r.comm.clone()) else {
        return Ok(());
    };
    if !comm_live(h as cclComm_t) {
        return Err(Fail::usage(format!(
            "communicator {h:#x} was destroyed inside the group, before cclGroupEnd"
        )));
    }
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    for r in ops {
        match r.op {
            Op::Coll(p) => p.run(&comm)?,
            Op::CollV(p) => p.run(&comm)?,
            Op::Send(b, peer) => sends.push((b, peer)),
            Op::Recv(b, peer) => recvs.push((b, peer)),
        }
    }
    if sends.is_empty() && recvs.is_empty() {
        return Ok(());
    }
    // Sends and receives with one peer match in the order they were recorded; the two
    // directions are independent, so adding all sends first keeps that order.
    let mut g = comm.group();
    for (b, peer) in &sends {
        g.send::<u8>(b.as_ref(), *peer)?;
    }
    for (b, peer) in &mut recvs {
        g.recv::<u8>(b.as_mut(), *peer)?;
    }
    g.run()?;
    Ok(())
}

/// Checks a send or receive: communicator, type, count, peer and buffer (named `name`).
fn p2p(
    comm: cclComm_t,
    name: &str,
    buf: usize,
    count: usize,
    datatype: c_int,
    peer: c_int,
) -> Result<(Arc<Communicator>, usize, usize), Fail> {
    let c = comm_from(comm)?;
    let dtype = dtype_of(datatype)?;
    let bytes = bytes_of(count, dtype, name)?;
    let n = c.size();
    let peer = match usize::try_from(peer) {
        Ok(p) if p < n => p,
        _ => {
            return Err(Fail::arg(format!(
                "peer {peer} is out of range for {n} ranks"
            )));
        }
    };
    check_region(name, buf, bytes)?;
    Ok((c, bytes, peer))
}

c_fn! {
    /// Sends `count` elements to `peer` (recorded when inside a group).
    pub fn cclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: cclDataType_t,
        peer: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        guard("cclSend", || {
            let (c, bytes, peer) = p2p(comm, "sendbuff", sendbuff as usize, count, datatype, peer)?;
            let buf = if bytes == 0 {
                RawIn::empty()
            } else {
                // SAFETY: `p2p` checked the range is non-NULL, does not wrap and is at most
                // `isize::MAX` bytes; the header's contract keeps it valid and unchanged until the
                // send completes (at cclGroupEnd inside a group).
                unsafe { RawIn::new(sendbuff.cast(), bytes) }
            };
            if active() {
                record(comm, c, Op::Send(buf, peer));
                return Ok(());
            }
            c.send::<u8>(buf.as_ref(), peer)?;
            Ok(())
        })
    }
}

c_fn! {
    /// Receives `count` elements from `peer` (recorded when inside a group).
    pub fn cclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: cclDataType_t,
        peer: c_int,
        comm: cclComm_t,
    ) -> cclResult_t {
        guard("cclRecv", || {
            let (c, bytes, peer) = p2p(comm, "recvbuff", recvbuff as usize, count, datatype, peer)?;
            let mut buf = if bytes == 0 {
                OutBuf::Ours(Vec::new())
            } else {
                // SAFETY: `p2p` checked the range is non-NULL, does not wrap and is at most
                // `isize::MAX` bytes; the header's contract keeps it valid, writable and used by
                // nothing else until the receive completes (at cclGroupEnd inside a group).
                OutBuf::Raw(unsafe { RawOut::new(recvbuff.cast(), bytes) })
            };
            if active() {
                record(comm, c, Op::Recv(buf, peer));
                return Ok(());
            }
            c.recv::<u8>(buf.as_mut(), peer)?;
            Ok(())
        })
    }
}

c_fn! {
    /// Receiving from any source (MPI_ANY_SOURCE): waits until some peer's next operation toward
    /// this rank is a send (alone or in a group) and stores that peer in *peer and the bytes it
    /// sends here in *bytes (bytes may be NULL); lowest rank first when several wait. Nothing is
    /// received: cclRecv (or a group) naming *peer receives it next. Peers whose next operation
    /// here is a collective are passed over. Not inside a group (cclInvalidUsage). After the
    /// communicator's timeout with no send it fails with cclTimeout, naming what each peer
    /// announced instead, and the communicator stays usable.
    pub fn cclProbe(peer: *mut c_int, bytes: *mut usize, comm: cclComm_t) -> cclResult_t {
        guard("cclProbe", || {
            let c = comm_from(comm)?;
            if peer.is_null() {
                return Err(Fail::arg("peer is NULL"));
            }
            if active() {
                return Err(Fail::usage(
                    "cclProbe inside a group: the group's operations run at cclGroupEnd, so a \
                     probe there could not see what they send; probe before cclGroupStart",
                ));
            }
            let found = c.probe()?;
            if !bytes.is_null() {
                out(bytes, "bytes", found.bytes)?;
            }
            out(peer, "peer", found.peer as c_int)
        })
    }
}
