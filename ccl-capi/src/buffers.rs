//! Caller buffers: checking pointers, counts and enums against NCCL's rules, and wrapping the
//! memory for the safe API.

use std::ffi::{c_int, c_void};

use oxccl::{Collective, Communicator, Counts, DataType, ReduceOp};

use crate::error::Fail;

/// Caller memory read by an operation.
#[derive(Debug)]
pub(crate) struct RawIn {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a `RawIn` is only read, and the caller promised (header) that the memory stays valid
// and unchanged until the operation completes, whichever thread runs it.
unsafe impl Send for RawIn {}

impl RawIn {
    /// An empty buffer (a count of 0 needs no memory).
    pub(crate) fn empty() -> RawIn {
        RawIn {
            ptr: std::ptr::null(),
            len: 0,
        }
    }

    /// # Safety
    /// `ptr` is non-NULL and valid for reads of `len` bytes that nothing writes, and `len` is at
    /// most `isize::MAX`, for as long as the returned value is used.
    pub(crate) unsafe fn new(ptr: *const u8, len: usize) -> RawIn {
        RawIn { ptr, len }
    }
}

/// `(address, length)` of the caller memory an operation's buffers use, for
/// `cclCommDeregister` to refuse memory that a pending operation uses.
pub(crate) fn ranges(send: Option<&RawIn>, recv: &OutBuf) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(2);
    if let Some(s) = send {
        v.push((s.ptr as usize, s.len));
    }
    if let OutBuf::Raw(r) = recv {
        v.push((r.ptr as usize, r.len));
    }
    v
}

impl AsRef<[u8]> for RawIn {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY:
        // - `len > 0`, so `new` made this value, whose contract is that `ptr` is non-NULL and
        //   valid for reads of `len <= isize::MAX` bytes, unchanged, while it is used.
        // - `u8` has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Caller memory written by an operation.
#[derive(Debug)]
pub(crate) struct RawOut {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the caller promised (header) that the memory stays valid, and is used by nothing else,
// until the operation completes, whichever thread runs it.
unsafe impl Send for RawOut {}

impl RawOut {
    /// # Safety
    /// `ptr` is non-NULL and valid for reads and writes of `len` bytes that nothing else
    /// accesses, and `len` is at most `isize::MAX`, for as long as the returned value is used.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize) -> RawOut {
        RawOut { ptr, len }
    }
}

/// Where an operation writes: caller memory, or a buffer of ours for results nobody reads (a
/// non-root rank's `recvbuff` of reduce, which NCCL lets be NULL).
#[derive(Debug)]
pub(crate) enum OutBuf {
    Raw(RawOut),
    Ours(Vec<u8>),
}

impl AsMut<[u8]> for OutBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        match self {
            OutBuf::Ours(v) => v,
            OutBuf::Raw(r) if r.len == 0 => &mut [],
            OutBuf::Raw(r) => {
                // SAFETY:
                // - `len > 0`, so `RawOut::new` made this value: `ptr` is non-NULL and valid for
                //   reads and writes of `len <= isize::MAX` bytes nothing else accesses while it
                //   is used.
                // - The `&mut self` borrow makes this the only slice of it at a time.
                unsafe { std::slice::from_raw_parts_mut(r.ptr, r.len) }
            }
        }
    }
}

/// A collective's arguments, checked and ready for `Communicator::collective_bytes`.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub coll: Collective,
    /// `None`: in place.
    pub send: Option<RawIn>,
    pub recv: OutBuf,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
}

impl Prepared {
    /// Runs it to completion on the caller's thread.
    pub(crate) fn run(mut self, c: &Communicator) -> Result<(), Fail> {
        c.collective_bytes(
            self.coll,
            self.send.as_ref().map(|s| s.as_ref()),
            self.recv.as_mut(),
            self.count,
            self.dtype,
            self.op,
            self.root,
        )?;
        Ok(())
    }

    /// A barrier (no buffers).
    pub(crate) fn barrier() -> Prepared {
        Prepared {
            coll: Collective::Barrier,
            send: None,
            recv: OutBuf::Ours(Vec::new()),
            count: 0,
            dtype: DataType::U8,
            op: ReduceOp::Sum,
            root: 0,
        }
    }
}

/// A per-rank collective's arguments, checked and ready for `Communicator::collective_v_bytes`.
#[derive(Debug)]
pub(crate) struct PreparedV {
    pub(crate) counts: Counts,
    /// `None`: in place.
    pub(crate) send: Option<RawIn>,
    pub(crate) recv: OutBuf,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
}

impl PreparedV {
    /// Runs it to completion on the caller's thread.
    pub(crate) fn run(mut self, c: &Communicator) -> Result<(), Fail> {
        let send = self.send.as_ref().map(|s| s.as_ref());
        c.collective_v_bytes(&self.counts, send, self.recv.as_mut(), self.dtype, self.op)?;
        Ok(())
    }
}

/// Decodes a `cclDataType_t`.
pub(crate) fn dtype_of(v: c_int) -> Result<DataType, Fail> {
    u8::try_from(v)
        .ok()
        .and_then(DataType::from_u8)
        .ok_or_else(|| {
            Fail::arg(format!(
                "datatype {v} is not a cclDataType_t (0 to {})",
                DataType::ALL.len() - 1
            ))
        })
}

/// Decodes a `cclRedOp_t`.
pub(crate) fn op_of(v: c_int) -> Result<ReduceOp, Fail> {
    u8::try_from(v)
        .ok()
        .and_then(ReduceOp::from_u8)
        .ok_or_else(|| {
            Fail::arg(format!(
                "op {v} is not a cclRedOp_t (0 to {})",
                ReduceOp::ALL.len() - 1
            ))
        })
}

/// Checks that `bytes` at `p` can be memory: not NULL unless empty, not wrapping around.
pub(crate) fn check_region(name: &str, p: usize, bytes: usize) -> Result<(), Fail> {
    if bytes == 0 {
        return Ok(());
    }
    if p == 0 {
        return Err(Fail::arg(format!(
            "{name} is NULL but {bytes} bytes are needed"
        )));
    }
    if p.checked_add(bytes).is_none() {
        return Err(Fail::arg(format!(
            "{name} {p:#x} plus {bytes} bytes runs past the end of the address space"
        )));
    }
    Ok(())
}

/// `count` elements of `dtype` in bytes, if a buffer that large can exist.
pub(crate) fn bytes_of(count: usize, dtype: DataType, what: &str) -> Result<usize, Fail> {
    count
        .checked_mul(dtype.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Fail::arg(format!(
                "{what} of {count} elements of {dtype} is larger than any buffer can be"
            ))
        })
}

/// `base + k * block`, unless that overflows.
fn offset(base: usize, k: usize, block: usize) -> Option<usize> {
    k.checked_mul(block).and_then(|o| base.checked_add(o))
}

fn overlaps(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    alen > 0 && blen > 0 && a < b + blen && b < a + alen
}

/// A collective as the C caller passed it: raw pointers and C enums, not yet checked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawCall {
    pub coll: Collective,
    pub sendbuff: *const c_void,
    pub recvbuff: *mut c_void,
    pub count: usize,
    pub datatype: c_int,
    /// Read only by the collectives that reduce.
    pub op: c_int,
    /// Read only by the collectives with a root.
    pub root: c_int,
}

impl RawCall {
    /// A call of `coll` without an operator or a root (set them with [`op`](Self::op) and
    /// [`root`](Self::root)).
    pub(crate) fn new(
        coll: Collective,
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
    ) -> RawCall {
        RawCall {
            coll,
            sendbuff,
            recvbuff,
            count,
            datatype,
            op: 0,
            root: 0,
        }
    }

    pub(crate) fn op(self, op: c_int) -> RawCall {
        RawCall { op, ..self }
    }

    pub(crate) fn root(self, root: c_int) -> RawCall {
        RawCall { root, ..self }
    }
}

/// Checks a collective's arguments on this rank against NCCL's rules and wraps its buffers.
pub(crate) fn prepare(c: &Communicator, call: &RawCall) -> Result<Prepared, Fail> {
    let coll = call.coll;
    let (rank, n) = (c.rank(), c.size());
    let dtype = dtype_of(call.datatype)?;
    let op = match coll {
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter => op_of(call.op)?,
        _ => ReduceOp::Sum,
    };
    op.check(dtype)?;
    let root = match coll {
        c if c.rooted() => match usize::try_from(call.root) {
            Ok(r) if r < n => r,
            _ => {
                return Err(Fail::arg(format!(
                    "root {} is out of range for {n} ranks",
                    call.root
                )));
            }
        },
        _ => 0,
    };
    let elems = coll
        .buffer_lens(call.count, n)
        .map_err(|e| Fail::arg(e.to_string()))?;
    let sb = bytes_of(elems.send, dtype, "sendbuff")?;
    let rb = bytes_of(elems.recv, dtype, "recvbuff")?;
    let (s, r) = (call.sendbuff as usize, call.recvbuff as usize);
    let is_root = rank == root;

    // NCCL's in-place forms. A non-root rank's sendbuff of broadcast is never read, so it runs
    // in place whatever it passed.
    let in_place = match coll {
        Collective::AllGather => sb > 0 && offset(r, rank, sb) == Some(s),
        Collective::ReduceScatter => rb > 0 && offset(s, rank, rb) == Some(r),
        // On the root, as allgather and reduce-scatter; elsewhere the buffer that only the root
        // uses is ignored, so never in place.
        Collective::Gather if is_root => sb > 0 && offset(r, rank, sb) == Some(s),
        Collective::Scatter if is_root => rb > 0 && offset(s, rank, rb) == Some(r),
        Collective::Gather | Collective::Scatter => false,
        Collective::Broadcast if !is_root => true,
        _ => s == r,
    } && (sb > 0 || rb > 0);
    let (send, recv) = if in_place {
        (None, wrap_in_place(coll, (s, sb), (r, rb))?)
    } else {
        // A non-root rank's recvbuff of reduce is never written; NCCL lets it be NULL.
        let reduce_leaf = coll == Collective::Reduce && !is_root && r == 0;
        let (send, recv) = wrap_apart(coll, (s, sb), (r, rb), reduce_leaf, is_root)?;
        (Some(send), recv)
    };
    Ok(Prepared {
        coll,
        send,
        recv,
        count: call.count,
        dtype,
        op,
        root,
    })
}

/// The one buffer of an in-place call (address, bytes of `send` and `recv`): the larger of the
/// two, allgather's output, reduce-scatter's input.
fn wrap_in_place(
    coll: Collective,
    (s, sb): (usize, usize),
    (r, rb): (usize, usize),
) -> Result<OutBuf, Fail> {
    let (name, p, len) = match coll {
        Collective::ReduceScatter | Collective::Scatter => ("sendbuff", s, sb),
        _ => ("recvbuff", r, rb),
    };
    if p == 0 {
        return Err(Fail::arg(format!(
            "sendbuff and recvbuff are NULL (in place) but {len} bytes are needed"
        )));
    }
    check_region(name, p, len)?;
    // SAFETY: `check_region` found the range non-NULL and not wrapping, `bytes_of` bounded
    // it by `isize::MAX`, and the header's contract makes the caller's buffer valid and
    // writable (it is the receive buffer) and untouched by others until the call completes.
    let buf = unsafe { RawOut::new(p as *mut u8, len) };
    Ok(OutBuf::Raw(buf))
}

/// The two buffers (address, bytes) of an out-of-place call, which must not overlap. A
/// `reduce_leaf` (a non-root rank of reduce with a NULL recvbuff) gets a buffer of ours to
/// receive into. A non-root rank's sendbuff of scatter is never read, its recvbuff of gather
/// never written: both may be NULL, and are not used whatever they are.
fn wrap_apart(
    coll: Collective,
    (s, sb): (usize, usize),
    (r, rb): (usize, usize),
    reduce_leaf: bool,
    is_root: bool,
) -> Result<(RawIn, OutBuf), Fail> {
    let unused_send = coll == Collective::Scatter && !is_root;
    let unused_recv = coll == Collective::Gather && !is_root;
    let sb = if unused_send { 0 } else { sb };
    check_region("sendbuff", s, sb)?;
    if !reduce_leaf && !unused_recv {
        check_region("recvbuff", r, rb)?;
        if overlaps(s, sb, r, rb) {
            let rule = match coll {
                Collective::AllGather => "sendbuff == recvbuff + rank * sendcount * size",
                Collective::ReduceScatter => "recvbuff == sendbuff + rank * recvcount * size",
                Collective::Gather => "sendbuff == recvbuff + rank * count * size, on the root",
                Collective::Scatter => "recvbuff == sendbuff + rank * count * size, on the root",
                _ => "sendbuff == recvbuff",
            };
            return Err(Fail::arg(format!(
                "sendbuff [{s:#x}, +{sb}) and recvbuff [{r:#x}, +{rb}) overlap, which only the \
                 in-place form allows ({rule})"
            )));
        }
    }
    let send = if sb == 0 {
        RawIn::empty()
    } else {
        // SAFETY: `check_region` found the range non-NULL and not wrapping, `bytes_of` bounded
        // it by `isize::MAX`; the header's contract makes it valid for reads and unchanged until
        // the call completes; it does not overlap the receive buffer (checked above, or it is
        // a buffer of ours).
        unsafe { RawIn::new(s as *const u8, sb) }
    };
    let recv = if reduce_leaf {
        let mut v = Vec::new();
        v.try_reserve_exact(rb).map_err(|_| {
            Fail::arg(format!(
                "cannot allocate {rb} bytes standing in for a NULL recvbuff"
            ))
        })?;
        v.resize(rb, 0);
        OutBuf::Ours(v)
    } else if rb == 0 || unused_recv {
        OutBuf::Ours(Vec::new())
    } else {
        // SAFETY: as for the send buffer, and the header makes recvbuff writable; the ranges
        // do not overlap, so the shared and the mutable slice never alias.
        OutBuf::Raw(unsafe { RawOut::new(r as *mut u8, rb) })
    };
    Ok((send, recv))
}
