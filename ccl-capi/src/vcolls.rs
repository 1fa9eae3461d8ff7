//! The collectives with a count per rank: `cclAllGatherV`, `cclReduceScatterV`,
//! `cclAlltoAllV` and their non-blocking forms. Counts and displacements are arrays of `nranks`
//! `size_t`s, in elements, as in MPI; a NULL displacement array packs the blocks back to back.

use std::ffi::{c_int, c_void};

use oxccl::{Communicator, Counts, DataType, ReduceOp};

use crate::buffers::ranges;
use crate::buffers::{OutBuf, PreparedV, RawIn, RawOut, bytes_of, check_region, dtype_of, op_of};
use crate::error::{Fail, guard, out};
use crate::handles::{Tracked, comm_from, insert_request};
use crate::{cclComm_t, cclDataType_t, cclRedOp_t, cclRequest_t, cclResult_t, group};

/// Copies an array of `n` counts or displacements; NULL is `None` (allowed for displacements).
fn array(
    name: &str,
    p: *const usize,
    n: usize,
    nullable: bool,
) -> Result<Option<Vec<usize>>, Fail> {
    if p.is_null() {
        if nullable {
            return Ok(None);
        }
        return Err(Fail::arg(format!("{name} is NULL (it needs {n} entries)")));
    }
    if (p as usize) % align_of::<usize>() != 0 {
        return Err(Fail::arg(format!("{name} {p:p} is not aligned for size_t")));
    }
    // SAFETY:
    // - `p` is non-NULL and aligned for `usize` (checked above); the header's contract is that
    //   it points to `n` (the communicator's size) readable `size_t`s that nothing writes during
    //   the call, and `n` `usize`s of an existing array cannot exceed `isize::MAX` bytes.
    // - The slice is copied at once and not kept.
    let v = unsafe { std::slice::from_raw_parts(p, n) }.to_vec();
    Ok(Some(v))
}

/// Buffers of a per-rank collective, checked: lengths from the counts, NCCL's address rule
/// for in place (`in_place` says whether the addresses make it so), no other overlap.
fn prepare_v(
    c: &Communicator,
    counts: Counts,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    dtype: DataType,
    op: ReduceOp,
) -> Result<PreparedV, Fail> {
    let (rank, n) = (c.rank(), c.size());
    let (s, r) = (sendbuff as usize, recvbuff as usize);
    let own = counts.own_offset(rank, n)?;
    let own_bytes = bytes_of(own, dtype, "a displacement")?;
    let in_place = match counts {
        Counts::AllGatherV { .. } => r.checked_add(own_bytes) == Some(s),
        Counts::ReduceScatterV { .. } => s.checked_add(own_bytes) == Some(r),
        Counts::AllToAllV { .. } => s == r,
    } && s != 0;
    let lens = counts.buffer_lens(rank, n, in_place)?;
    let rb = bytes_of(lens.recv, dtype, "recvbuff")?;
    if in_place {
        // The one buffer: allgatherv's and alltoallv's receive buffer, reduce-scatterv's input.
        let (name, p) = match counts {
            Counts::ReduceScatterV { .. } => ("sendbuff", s),
            _ => ("recvbuff", r),
        };
        check_region(name, p, rb)?;
        // SAFETY: `check_region` found the range non-NULL and not wrapping, `bytes_of` bounded
        // it by `isize::MAX`, and the header's contract makes the buffer valid, writable and
        // untouched by others until the call completes.
        let buf = unsafe { RawOut::new(p as *mut u8, rb) };
        let recv = if rb == 0 {
            OutBuf::Ours(Vec::new())
        } else {
            OutBuf::Raw(buf)
        };
        return Ok(PreparedV {
            counts,
            send: None,
            recv,
            dtype,
            op,
        });
    }
    let sb = bytes_of(lens.send, dtype, "sendbuff")?;
    check_region("sendbuff", s, sb)?;
    check_region("recvbuff", r, rb)?;
    if sb > 0 && rb > 0 && s < r + rb && r < s + sb {
        return Err(Fail::arg(format!(
            "sendbuff [{s:#x}, +{sb}) and recvbuff [{r:#x}, +{rb}) overlap, which only the \
             in-place form allows ({})",
            match counts {
                Counts::AllGatherV { .. } => "sendbuff == recvbuff + displs[rank] * size",
                Counts::ReduceScatterV { .. } =>
                    "recvbuff == sendbuff + (recvcounts[0] + ... + recvcounts[rank-1]) * size",
                Counts::AllToAllV { .. } => "sendbuff == recvbuff",
            }
        )));
    }
    let send = if sb == 0 {
        RawIn::empty()
    } else {
        // SAFETY: `check_region` found the range non-NULL and not wrapping, `bytes_of` bounded
        // it by `isize::MAX`; the header's contract keeps it valid for reads and unchanged until
        // the call completes; it does not overlap the receive buffer (checked above).
        unsafe { RawIn::new(s as *const u8, sb) }
    };
    let recv = if rb == 0 {
        OutBuf::Ours(Vec::new())
    } else {
        // SAFETY: as for the send buffer, and the header makes recvbuff writable; the ranges do
        // not overlap, so the shared and the mutable slice never alias.
        OutBuf::Raw(unsafe { RawOut::new(r as *mut u8, rb) })
    };
    Ok(PreparedV {
        counts,
        send: Some(send),
        recv,
        dtype,
        op,
    })
}

/// Which per-rank collective, with its raw count arrays.
enum Raw {
    AllGatherV {
        recvcounts: *const usize,
        displs: *const usize,
    },
    ReduceScatterV {
        recvcounts: *const usize,
    },
    AllToAllV {
        sendcounts: *const usize,
        sdispls: *const usize,
        recvcounts: *const usize,
        rdispls: *const usize,
    },
}

impl Raw {
    /// The counts, copied; `same` says whether sendbuff == recvbuff (alltoallv in place, whose
    /// send counts and displacements are ignored and may be NULL).
    fn counts(&self, n: usize, same: bool) -> Result<Counts, Fail> {
        let need = |name, p| array(name, p, n, false).map(Option::unwrap_or_default);
        Ok(match *self {
            Raw::AllGatherV { recvcounts, displs } => Counts::AllGatherV {
                counts: need("recvcounts", recvcounts)?,
                displs: array("displs", displs, n, true)?,
            },
            Raw::ReduceScatterV { recvcounts } => Counts::ReduceScatterV {
                counts: need("recvcounts", recvcounts)?,
            },
            Raw::AllToAllV {
                sendcounts,
                sdispls,
                recvcounts,
                rdispls,
            } => {
                let recv_counts = need("recvcounts", recvcounts)?;
                let rd = array("rdispls", rdispls, n, true)?;
                // In place the send side is ignored and may be NULL.
                let send_counts = array("sendcounts", sendcounts, n, same)?
                    .unwrap_or_else(|| recv_counts.clone());
                Counts::AllToAllV {
                    send_counts,
                    send_displs: array("sdispls", sdispls, n, true)?,
                    recv_counts,
                    recv_displs: rd,
                }
            }
        })
    }
}

/// Checks the arguments of a per-rank collective on this rank and wraps them.
fn prepare(
    comm: cclComm_t,
    raw: &Raw,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    datatype: c_int,
    op: c_int,
) -> Result<(std::sync::Arc<Communicator>, PreparedV), Fail> {
    let c = comm_from(comm)?;
    let dtype = dtype_of(datatype)?;
    let op = match raw {
        Raw::ReduceScatterV { .. } => op_of(op)?,
        _ => ReduceOp::Sum,
    };
    op.check(dtype)?;
    let same = std::ptr::eq(sendbuff, recvbuff.cast_const()) && !sendbuff.is_null();
    let counts = raw.counts(c.size(), same)?;
    let p = prepare_v(&c, counts, sendbuff, recvbuff, dtype, op)?;
    Ok((c, p))
}

/// A blocking per-rank collective: checked, then run (or recorded, inside a group).
fn blocking(
    name: &str,
    raw: Raw,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    datatype: c_int,
    op: c_int,
    comm: cclComm_t,
) -> cclResult_t {
    guard(name, || {
        let (c, p) = prepare(comm, &raw, sendbuff, recvbuff, datatype, op)?;
        if group::active() {
            group::defer_v(comm, c, p);
            return Ok(());
        }
        p.run(&c)
    })
}

/// A non-blocking per-rank collective: checked, then queued; the request is registered.
#[allow(clippy::too_many_arguments)]
fn nonblocking(
    name: &str,
    raw: Raw,
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    datatype: c_int,
    op: c_int,
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
        let (c, p) = prepare(comm, &raw, sendbuff, recvbuff, datatype, op)?;
        let ranges = ranges(p.send.as_ref(), &p.recv);
        let inner = c.collective_v_bytes_async(p.counts, p.send, p.recv, p.dtype, p.op);
        let req = Tracked {
            comm: comm as usize,
            ranges,
            inner,
        };
        out(request, "request", insert_request(Box::new(req)))
    })
}

c_fn! {
    /// Rank k's sendbuff (recvcounts[k] elements) lands at displs[k] of every rank's recvbuff.
    /// recvcounts (and displs) are the same on every rank. In place when
    /// sendbuff == recvbuff + displs[rank] * size.
    pub fn cclAllGatherV(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        displs: *const usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let raw = Raw::AllGatherV { recvcounts, displs };
        blocking("cclAllGatherV", raw, sendbuff, recvbuff, datatype, 0, comm)
    }
}

c_fn! {
    /// sendbuff holds recvcounts[k] elements for each rank k, back to back; rank r's recvbuff
    /// (recvcounts[r] elements) receives the reduction of every rank's block r. recvcounts is the
    /// same on every rank. In place when recvbuff == sendbuff + (recvcounts[0] + ... +
    /// recvcounts[rank-1]) * size: the result lands in this rank's block of sendbuff.
    pub fn cclReduceScatterV(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let raw = Raw::ReduceScatterV { recvcounts };
        let n = "cclReduceScatterV";
        blocking(n, raw, sendbuff, recvbuff, datatype, op, comm)
    }
}

c_fn! {
    /// sendcounts[k] elements at sdispls[k] of sendbuff go to rank k; recvcounts[k] elements from
    /// rank k land at rdispls[k] of recvbuff. Rank k's recvcounts[rank] must equal this rank's
    /// sendcounts[k]. In place when sendbuff == recvbuff: the receive blocks are also what is sent,
    /// and sendcounts and sdispls are ignored (may be NULL).
    pub fn cclAlltoAllV(
        sendbuff: *const c_void,
        sendcounts: *const usize,
        sdispls: *const usize,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        rdispls: *const usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
    ) -> cclResult_t {
        let raw = Raw::AllToAllV {
            sendcounts,
            sdispls,
            recvcounts,
            rdispls,
        };
        blocking("cclAlltoAllV", raw, sendbuff, recvbuff, datatype, 0, comm)
    }
}

c_fn! {
    /// Non-blocking allgatherv.
    pub fn cclAllGatherVAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        displs: *const usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let raw = Raw::AllGatherV { recvcounts, displs };
        let n = "cclAllGatherVAsync";
        nonblocking(n, raw, sendbuff, recvbuff, datatype, 0, comm, request)
    }
}

c_fn! {
    /// Non-blocking reduce-scatterv.
    pub fn cclReduceScatterVAsync(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        datatype: cclDataType_t,
        op: cclRedOp_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let raw = Raw::ReduceScatterV { recvcounts };
        let n = "cclReduceScatterVAsync";
        nonblocking(n, raw, sendbuff, recvbuff, datatype, op, comm, request)
    }
}

c_fn! {
    /// Non-blocking alltoallv.
    pub fn cclAlltoAllVAsync(
        sendbuff: *const c_void,
        sendcounts: *const usize,
        sdispls: *const usize,
        recvbuff: *mut c_void,
        recvcounts: *const usize,
        rdispls: *const usize,
        datatype: cclDataType_t,
        comm: cclComm_t,
        request: *mut cclRequest_t,
    ) -> cclResult_t {
        let raw = Raw::AllToAllV {
            sendcounts,
            sdispls,
            recvcounts,
            rdispls,
        };
        let n = "cclAlltoAllVAsync";
        nonblocking(n, raw, sendbuff, recvbuff, datatype, 0, comm, request)
    }
}
