//! Gather and scatter, and the collectives with a count per rank: allgatherv, reduce-scatterv,
//! alltoallv.
//!
//! Gather and scatter take one count and a root, and go the same way as every other collective
//! ([`Communicator::collective`]). The per-rank collectives take their counts (and, where the
//! layout is free, displacements) as MPI does: allgatherv and reduce-scatterv every rank's count
//! on every rank, alltoallv this rank's send and receive counts. Every pair of ranks checks
//! what it must agree on in the operation header it exchanges anyway (`ccl_algos::vcoll`), so
//! counts that disagree between ranks are an error naming the peer, not a hang.

use crate::exec::{OpInfo, OpKind};
use ccl_algos::algo::{self, Collective};
use ccl_algos::vcoll::VShape;

use crate::engine::{Engine, Execution};
use crate::order::Request;
use crate::{BufferLens, Communicator, DataType, Element, Error, ReduceOp, Result};

/// The counts of a collective with a count per rank, in elements. Displacements are element
/// offsets into the buffer; `None` packs the blocks back to back in rank order. The buffers must
/// hold every block: exactly the blocks' total when packed, at least up to the furthest block
/// with displacements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Counts {
    /// Rank `k` contributes `counts[k]` elements (this rank's send buffer holds exactly
    /// `counts[rank]`), which land at `displs[k]` of every rank's receive buffer. The same
    /// `counts` on every rank.
    AllGatherV {
        counts: Vec<usize>,
        displs: Option<Vec<usize>>,
    },
    /// The send buffer holds `counts[k]` elements for each rank `k`, back to back; rank `k`
    /// receives (`counts[k]` elements) the reduction of every rank's block `k`. The same
    /// `counts` on every rank.
    ReduceScatterV { counts: Vec<usize> },
    /// `send_counts[k]` elements at `send_displs[k]` go to rank `k`; `recv_counts[k]` elements
    /// from rank `k` land at `recv_displs[k]`. Rank `k`'s `recv_counts[rank]` must equal this
    /// rank's `send_counts[k]`. In place, the send side is ignored: the receive blocks are also
    /// what is sent.
    AllToAllV {
        send_counts: Vec<usize>,
        send_displs: Option<Vec<usize>>,
        recv_counts: Vec<usize>,
        recv_displs: Option<Vec<usize>>,
    },
}

impl Counts {
    /// The collective these counts are for.
    pub fn collective(&self) -> Collective {
        match self {
            Counts::AllGatherV { .. } => Collective::AllGatherV,
            Counts::ReduceScatterV { .. } => Collective::ReduceScatterV,
            Counts::AllToAllV { .. } => Collective::AllToAllV,
        }
    }

    /// Elements this rank's buffers must hold (`send` is 0 in place, `recv` is then the one
    /// buffer), or what is wrong with the counts.
    pub fn buffer_lens(&self, rank: usize, size: usize, in_place: bool) -> Result<BufferLens> {
        let v = self.shape(rank, size, in_place, ReduceOp::Sum)?;
        Ok(BufferLens {
            send: v.send_len,
            recv: v.recv_len,
        })
    }

    /// Where this rank's own block starts, in elements: in the receive buffer for allgatherv
    /// (in place, its input is already there), in the send buffer for reduce-scatterv (in
    /// place, its result lands there), 0 for alltoallv. The C ABI recognizes in-place calls by
    /// this offset.
    pub fn own_offset(&self, rank: usize, size: usize) -> Result<usize> {
        let v = self.shape(rank, size, false, ReduceOp::Sum)?;
        Ok(match self {
            Counts::AllGatherV { .. } => v.recv[rank].off,
            Counts::ReduceScatterV { .. } => v.send[rank].off,
            Counts::AllToAllV { .. } => 0,
        })
    }

    /// This rank's view: the blocks of its buffers, or what is wrong with the counts.
    fn shape(&self, rank: usize, size: usize, in_place: bool, op: ReduceOp) -> Result<VShape> {
        let v = match self {
            Counts::AllGatherV { counts, displs } => {
                VShape::all_gather_v(rank, size, counts, displs.as_deref(), in_place)
            }
            Counts::ReduceScatterV { counts } => {
                VShape::reduce_scatter_v(rank, size, counts, in_place, op)
            }
            Counts::AllToAllV {
                send_counts,
                send_displs,
                recv_counts,
                recv_displs,
            } => VShape::all_to_all_v(
                rank,
                size,
                (send_counts, send_displs.as_deref()),
                (recv_counts, recv_displs.as_deref()),
                in_place,
            ),
        };
        v.map_err(|m| Error::invalid_argument(format!("{}: {m}", self.collective())).rank(rank))
    }

    /// Whether the send (or receive) blocks are packed: then a buffer must hold exactly them.
    fn packed(&self, send_side: bool) -> bool {
        match self {
            Counts::AllGatherV { displs, .. } => send_side || displs.is_none(),
            Counts::ReduceScatterV { .. } => true,
            Counts::AllToAllV {
                send_displs,
                recv_displs,
                ..
            } => {
                if send_side {
                    send_displs.is_none()
                } else {
                    recv_displs.is_none()
                }
            }
        }
    }
}

/// Checks one buffer's length in bytes against the elements its blocks need.
fn check_len(
    coll: Collective,
    rank: usize,
    what: &str,
    len: usize,
    need: usize,
    dtype: DataType,
    exact: bool,
) -> Result<()> {
    let need_bytes = need.checked_mul(dtype.size()).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{coll}: {need} elements of {dtype} overflow the address space"
        ))
        .rank(rank)
    })?;
    if len == need_bytes || (!exact && len > need_bytes) {
        return Ok(());
    }
    Err(Error::invalid_argument(format!(
        "{coll}: the counts need a {what} buffer of {}{need_bytes} bytes ({need} x {dtype}), got {len}",
        if exact { "" } else { "at least " },
    ))
    .rank(rank))
}

/// Runs a collective with a count per rank on untyped buffers, after checking the counts and
/// the buffers against each other. Not ordered: callers hold the turn.
fn run_v(
    s: &Engine,
    counts: &Counts,
    send: Option<&[u8]>,
    recv: &mut [u8],
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (rank, n) = (s.rank(), s.size());
    let coll = counts.collective();
    if coll.reduces() && !op.supports(dtype) {
        return Err(Error::invalid_argument(format!(
            "{coll}: reduce op {op} is bitwise and defined for integer types only, not {dtype}"
        ))
        .rank(rank));
    }
    let v = counts.shape(rank, n, send.is_none(), op)?;
    if let Some(b) = send {
        check_len(
            coll,
            rank,
            "send",
            b.len(),
            v.send_len,
            dtype,
            counts.packed(true),
        )?;
    }
    let what = if send.is_none() {
        "(in-place)"
    } else {
        "receive"
    };
    let exact = counts.packed(false);
    check_len(coll, rank, what, recv.len(), v.recv_len, dtype, exact)?;
    s.peers.check()?;
    let bytes = v.size_bytes(dtype.size());
    let algo = s.algorithm(coll, bytes);
    let sched = algo::build_per_rank(coll, algo, &v)
        .map_err(|m| Error::invalid_usage(m.to_string()).rank(rank))?;
    let info = OpInfo {
        kind: OpKind::Collective { coll, algo },
        bytes,
        root: 0,
        // What the ranks must agree on travels as the header's count.
        count: v.agreed as usize,
    };
    s.execute(Execution {
        sched: &sched,
        send,
        recv,
        extra: Vec::new(),
        dtype,
        op,
        info,
        local: None,
    })
}

impl Communicator {
    /// Gathers every rank's `send` into `root`'s `recv`, in rank order
    /// (`recv.len() == send.len() * size` on the root). Other ranks' `recv` is not touched and
    /// may be empty.
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Gather, Some(send), recv, ReduceOp::Sum, root)
    }

    /// Gather in place: every rank's input is already at block `rank` of `buf`
    /// (`size` blocks on every rank); the root ends with all of them.
    pub fn gather_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Gather, None, buf, ReduceOp::Sum, root)
    }

    /// Block `k` of `root`'s `send` into rank `k`'s `recv` (`send.len() == recv.len() * size`
    /// on the root). Other ranks' `send` is not read and may be empty.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Scatter, Some(send), recv, ReduceOp::Sum, root)
    }

    /// Scatter in place: `buf` holds `size` blocks on every rank; the root's are the input,
    /// and every rank's result lands in its block `rank`.
    pub fn scatter_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Scatter, None, buf, ReduceOp::Sum, root)
    }

    /// A collective with a count per rank on typed buffers: from `send`, or in place in `recv`
    /// when `send` is `None`. `op` is ignored except by reduce-scatterv.
    pub fn collective_v<T: Element>(
        &self,
        counts: &Counts,
        send: Option<&[T]>,
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let send = send.map(|b| bytemuck::cast_slice::<T, u8>(b));
        let recv = bytemuck::cast_slice_mut(recv);
        self.order
            .blocking(|| run_v(&self.engine, counts, send, recv, T::DTYPE, op))
    }

    /// [`collective_v`](Communicator::collective_v) on untyped buffers of `dtype`.
    pub fn collective_v_bytes(
        &self,
        counts: &Counts,
        send: Option<&[u8]>,
        recv: &mut [u8],
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.order
            .blocking(|| run_v(&self.engine, counts, send, recv, dtype, op))
    }

    /// Non-blocking [`collective_v`](Communicator::collective_v): takes ownership of the
    /// counts and buffers and gives the buffers back from [`Request::wait`].
    pub fn collective_v_async<T, S, R>(
        &self,
        counts: Counts,
        send: Option<S>,
        recv: R,
        op: ReduceOp,
    ) -> Request<(Option<S>, R)>
    where
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    {
        let engine = self.engine.clone();
        self.order.submit((send, recv), move |(send, recv)| {
            let send = send
                .as_ref()
                .map(|b| bytemuck::cast_slice::<T, u8>(b.as_ref()));
            let recv = bytemuck::cast_slice_mut(recv.as_mut());
            run_v(&engine, &counts, send, recv, T::DTYPE, op)
        })
    }

    /// Non-blocking [`collective_v_bytes`](Communicator::collective_v_bytes) on owned byte
    /// buffers.
    pub fn collective_v_bytes_async<S, R>(
        &self,
        counts: Counts,
        send: Option<S>,
        recv: R,
        dtype: DataType,
        op: ReduceOp,
    ) -> Request<(Option<S>, R)>
    where
        S: AsRef<[u8]> + Send + 'static,
        R: AsMut<[u8]> + Send + 'static,
    {
        let engine = self.engine.clone();
        self.order.submit((send, recv), move |(send, recv)| {
            let send = send.as_ref().map(|b| b.as_ref());
            run_v(&engine, &counts, send, recv.as_mut(), dtype, op)
        })
    }

    /// Allgather with a count per rank: rank `k`'s `send` (`counts[k]` elements) lands at
    /// `displs[k]` of every rank's `recv` (back to back in rank order without `displs`). Every
    /// rank passes the same `counts`.
    pub fn all_gather_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        displs: Option<&[usize]>,
    ) -> Result<()> {
        let c = Counts::AllGatherV {
            counts: counts.to_vec(),
            displs: displs.map(<[usize]>::to_vec),
        };
        self.collective_v(&c, Some(send), recv, ReduceOp::Sum)
    }

    /// Allgatherv in place: this rank's input is already at its block of `buf`.
    pub fn all_gather_v_in_place<T: Element>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: Option<&[usize]>,
    ) -> Result<()> {
        let c = Counts::AllGatherV {
            counts: counts.to_vec(),
            displs: displs.map(<[usize]>::to_vec),
        };
        self.collective_v(&c, None, buf, ReduceOp::Sum)
    }

    /// Reduce-scatter with a count per rank: `send` holds `counts[k]` elements for each rank
    /// `k`, back to back; rank `r`'s `recv` (`counts[r]` elements) receives the reduction of
    /// every rank's block `r`. Every rank passes the same `counts`.
    pub fn reduce_scatter_v<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let c = Counts::ReduceScatterV {
            counts: counts.to_vec(),
        };
        self.collective_v(&c, Some(send), recv, op)
    }

    /// Reduce-scatterv in place: the result lands in this rank's block of `buf`; the other
    /// blocks keep their input.
    pub fn reduce_scatter_v_in_place<T: Element>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        let c = Counts::ReduceScatterV {
            counts: counts.to_vec(),
        };
        self.collective_v(&c, None, buf, op)
    }

    /// Alltoall with a count per pair: `send_counts[k]` elements of `send` at `send_displs[k]`
    /// go to rank `k`, and `recv_counts[k]` elements from rank `k` land at `recv_displs[k]` of
    /// `recv` (back to back in rank order without displacements). Rank `k`'s
    /// `recv_counts[rank]` must equal this rank's `send_counts[k]`.
    pub fn all_to_all_v<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: Option<&[usize]>,
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: Option<&[usize]>,
    ) -> Result<()> {
        let c = Counts::AllToAllV {
            send_counts: send_counts.to_vec(),
            send_displs: send_displs.map(<[usize]>::to_vec),
            recv_counts: recv_counts.to_vec(),
            recv_displs: recv_displs.map(<[usize]>::to_vec),
        };
        self.collective_v(&c, Some(send), recv, ReduceOp::Sum)
    }

    /// Alltoallv in place: block `k` of `buf` (`counts[k]` elements at `displs[k]`) goes to rank
    /// `k` and is replaced by what rank `k` sends; each pair's counts are symmetric.
    pub fn all_to_all_v_in_place<T: Element>(
        &self,
        buf: &mut [T],
        counts: &[usize],
        displs: Option<&[usize]>,
    ) -> Result<()> {
        let c = Counts::AllToAllV {
            send_counts: counts.to_vec(),
            send_displs: displs.map(<[usize]>::to_vec),
            recv_counts: counts.to_vec(),
            recv_displs: displs.map(<[usize]>::to_vec),
        };
        self.collective_v(&c, None, buf, ReduceOp::Sum)
    }
}
