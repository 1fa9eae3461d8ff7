//! Gather and scatter (one count, a root), and the collectives with a count per rank:
//! allgatherv, reduce-scatterv and alltoallv (MPI's `MPI_Allgatherv`, `MPI_Reduce_scatter`,
//! `MPI_Alltoallv`).
//!
//! All of them are direct: gather and scatter send straight to and from the root, the others
//! exchange with every peer at once (staggered, as [`crate::alltoall`] does). The executor cuts
//! every transfer into the pieces the transport takes, so large blocks pipeline on their own.
//!
//! **How every rank knows every count.** As in MPI, each rank passes the counts it needs:
//! allgatherv and reduce-scatterv take every rank's count on every rank; alltoallv takes this
//! rank's send counts (one per destination) and receive counts (one per source). Schedules of
//! these collectives set [`Schedule::handshake`], so every pair of ranks exchanges an operation
//! header even when no element moves between them, and the header carries what the two must
//! agree on: the bytes of that pair's transfer, and for allgatherv and reduce-scatterv a
//! fingerprint of the whole counts array ([`VShape::agreed`]). Counts that disagree are an
//! error on the rank that receives the header (naming the peer and both calls), never a hang
//! or misplaced data: the check costs 48 bytes per pair of ranks, which travel with the data.

use ccl_core::ReduceOp;
use ccl_core::hash::Fnv1a;

use crate::collective::Collective;
use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};
use crate::{alltoall, reduce_scatter};

/// Where one rank's block lies in a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    pub off: usize,
    pub len: usize,
}

impl Block {
    const fn end(&self) -> usize {
        self.off + self.len
    }

    fn region(&self, buf: Buf) -> Region {
        Region::new(buf, self.off, self.len)
    }
}

/// One rank's view of a collective with a count per rank: the blocks of its buffers.
///
/// | collective | `send` | `recv` |
/// |---|---|---|
/// | allgatherv | one block: this rank's input (unused in place) | block `k`: rank `k`'s data |
/// | reduce-scatterv | block `k`: the input reduced into rank `k` (in place: of the one buffer) | one block: the result (unused in place: it lands at `send[rank]`) |
/// | alltoallv | block `k`: goes to rank `k` (unused in place) | block `k`: comes from rank `k` (in place also the data to send) |
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VShape {
    /// Allgatherv, reduce-scatterv or alltoallv.
    pub coll: Collective,
    pub rank: usize,
    pub size: usize,
    pub in_place: bool,
    pub op: ReduceOp,
    pub send: Vec<Block>,
    pub recv: Vec<Block>,
    /// What every rank must have passed alike: a fingerprint of the counts array for
    /// allgatherv and reduce-scatterv, 0 for alltoallv (whose pairs check their byte counts).
    /// It travels as the count of the operation header.
    pub agreed: u64,
    /// Elements the send buffer must hold (0 in place), and the receive buffer (in place: the
    /// one buffer).
    pub send_len: usize,
    pub recv_len: usize,
}

/// A fingerprint of a counts array that no two different arrays of the sizes in use share by
/// accident (FNV-1a over the 8-byte counts, then a final mix).
pub fn fingerprint(counts: &[usize]) -> u64 {
    counts
        .iter()
        .fold(Fnv1a::new(), |h, &c| h.bytes(&(c as u64).to_le_bytes()))
        .finish_mixed()
}

/// `counts` packed back to back, or placed at `displs`, as blocks; checks the lengths of both
/// arrays against the world size. `what` names the arrays in errors.
fn blocks(
    what: &str,
    counts: &[usize],
    displs: Option<&[usize]>,
    n: usize,
) -> Result<Vec<Block>, String> {
    if counts.len() != n {
        return Err(format!(
            "{what} counts has {} entries for {n} ranks",
            counts.len()
        ));
    }
    let mut out = Vec::with_capacity(n);
    let mut next = 0usize;
    for (k, &len) in counts.iter().enumerate() {
        let off = match displs {
            Some(d) if d.len() != n => {
                return Err(format!(
                    "{what} displacements has {} entries for {n} ranks",
                    d.len()
                ));
            }
            Some(d) => d[k],
            None => next,
        };
        let end = off.checked_add(len).ok_or_else(|| {
            format!("{what} block of rank {k} (at {off}, {len} elements) overflows")
        })?;
        next = end;
        out.push(Block { off, len });
    }
    Ok(out)
}

/// The furthest end of any block: how long a buffer holding them all must be.
fn extent(b: &[Block]) -> usize {
    b.iter().map(Block::end).max().unwrap_or(0)
}

/// Refuses blocks that share an element: two ranks' data would land on each other.
fn disjoint(what: &str, b: &[Block]) -> Result<(), String> {
    let mut order: Vec<usize> = (0..b.len()).filter(|&k| b[k].len > 0).collect();
    order.sort_by_key(|&k| b[k].off);
    for w in order.windows(2) {
        let (a, c) = (b[w[0]], b[w[1]]);
        if c.off < a.end() {
            return Err(format!(
                "{what} blocks of rank {} (at {}, {} elements) and rank {} (at {}, {} elements) overlap",
                w[0], a.off, a.len, w[1], c.off, c.len
            ));
        }
    }
    Ok(())
}

impl VShape {
    /// Allgatherv on `rank`: rank `k` contributes `counts[k]` elements, which land at
    /// `displs[k]` of every rank's receive buffer (packed in rank order without `displs`). In
    /// place, this rank's input is already there.
    pub fn all_gather_v(
        rank: usize,
        size: usize,
        counts: &[usize],
        displs: Option<&[usize]>,
        in_place: bool,
    ) -> Result<VShape, String> {
        let recv = blocks("receive", counts, displs, size)?;
        disjoint("receive", &recv)?;
        let own = counts[rank];
        Ok(VShape {
            coll: Collective::AllGatherV,
            rank,
            size,
            in_place,
            op: ReduceOp::Sum,
            send: vec![Block { off: 0, len: own }],
            send_len: if in_place { 0 } else { own },
            recv_len: extent(&recv),
            recv,
            agreed: fingerprint(counts),
        })
    }

    /// Reduce-scatterv on `rank`: the input holds `counts[k]` elements for each rank `k`, back to
    /// back in rank order; rank `k` receives the reduction of every rank's block `k`. In place
    /// the result lands in this rank's block of the one buffer.
    pub fn reduce_scatter_v(
        rank: usize,
        size: usize,
        counts: &[usize],
        in_place: bool,
        op: ReduceOp,
    ) -> Result<VShape, String> {
        let send = blocks("receive", counts, None, size)?;
        let total = extent(&send);
        let own = counts[rank];
        Ok(VShape {
            coll: Collective::ReduceScatterV,
            rank,
            size,
            in_place,
            op,
            recv: vec![Block { off: 0, len: own }],
            send_len: if in_place { 0 } else { total },
            recv_len: if in_place { total } else { own },
            send,
            agreed: fingerprint(counts),
        })
    }

    /// Alltoallv on `rank`: `send_counts[k]` elements at `send_displs[k]` go to rank `k`, and
    /// `recv_counts[k]` elements from rank `k` land at `recv_displs[k]` (packed in rank order
    /// without displacements). Rank `k`'s `recv_counts[rank]` must equal this rank's
    /// `send_counts[k]`. In place (`send_counts` and `send_displs` are then ignored), the data to
    /// send is where the received data lands, so the send and receive blocks are the same.
    pub fn all_to_all_v(
        rank: usize,
        size: usize,
        send: (&[usize], Option<&[usize]>),
        recv: (&[usize], Option<&[usize]>),
        in_place: bool,
    ) -> Result<VShape, String> {
        let rb = blocks("receive", recv.0, recv.1, size)?;
        disjoint("receive", &rb)?;
        let sb = if in_place {
            rb.clone()
        } else {
            blocks("send", send.0, send.1, size)?
        };
        if sb[rank].len != rb[rank].len {
            return Err(format!(
                "this rank sends itself {} elements but receives {} from itself",
                sb[rank].len, rb[rank].len
            ));
        }
        Ok(VShape {
            coll: Collective::AllToAllV,
            rank,
            size,
            in_place,
            op: ReduceOp::Sum,
            send_len: if in_place { 0 } else { extent(&sb) },
            recv_len: extent(&rb),
            send: sb,
            recv: rb,
            agreed: 0,
        })
    }

    /// The nccl-tests size of the operation in bytes of `elem` each: the gathered result of
    /// allgatherv, the whole input of reduce-scatterv, this rank's whole input of alltoallv.
    pub fn size_bytes(&self, elem: usize) -> usize {
        let sum = |b: &[Block]| b.iter().map(|x| x.len).sum::<usize>();
        let elems = match self.coll {
            Collective::AllGatherV => sum(&self.recv),
            _ => sum(&self.send),
        };
        elems.saturating_mul(elem)
    }
}

/// Gather, direct: every rank sends its block to the root, which receives them all at once
/// (and copies its own). In place, each rank's input is its block of the one buffer.
pub fn gather(s: &Shape) -> Schedule {
    let (r, n, c, root) = (s.rank, s.size, s.count, s.root);
    let mut sc = Schedule::new("pairwise");
    sc.handshake = true;
    let block = |k: usize| Region::new(Buf::Recv, k * c, c);
    let own = if s.in_place {
        block(r)
    } else {
        Region::new(Buf::Send, 0, c)
    };
    if r != root {
        sc.push_auto(
            Action::Send {
                peer: root,
                src: own,
            },
            None,
            0,
        );
        return sc.finish();
    }
    if !s.in_place {
        sc.push_auto(
            Action::Copy {
                src: own,
                dst: block(r),
            },
            None,
            0,
        );
    }
    for k in 1..n {
        let from = (r + k) % n;
        sc.push_auto(
            Action::Recv {
                peer: from,
                dst: block(from),
                combine: Combine::Copy,
            },
            None,
            0,
        );
    }
    sc.finish()
}

/// Scatter, direct: the root sends block `k` to rank `k` (all at once) and copies its own. In
/// place, every rank's result is its block of the one buffer.
pub fn scatter(s: &Shape) -> Schedule {
    let (r, n, c, root) = (s.rank, s.size, s.count, s.root);
    let mut sc = Schedule::new("pairwise");
    sc.handshake = true;
    let src = |k: usize| Region::new(if s.in_place { Buf::Recv } else { Buf::Send }, k * c, c);
    let out = if s.in_place {
        Region::new(Buf::Recv, r * c, c)
    } else {
        Region::new(Buf::Recv, 0, c)
    };
    if r != root {
        sc.push_auto(
            Action::Recv {
                peer: root,
                dst: out,
                combine: Combine::Copy,
            },
            None,
            0,
        );
        return sc.finish();
    }
    for k in 1..n {
        let to = (r + k) % n;
        sc.push_auto(
            Action::Send {
                peer: to,
                src: src(to),
            },
            None,
            0,
        );
    }
    if !s.in_place {
        sc.push_auto(
            Action::Copy {
                src: src(r),
                dst: out,
            },
            None,
            0,
        );
    }
    sc.finish()
}

/// Allgatherv, pairwise: this rank's block to every peer and every peer's block from it, at
/// once, to staggered peers.
pub fn all_gather_v(v: &VShape) -> Schedule {
    let (r, n) = (v.rank, v.size);
    let mut sc = Schedule::new("pairwise");
    sc.handshake = true;
    let own = if v.in_place {
        v.recv[r].region(Buf::Recv)
    } else {
        v.send[0].region(Buf::Send)
    };
    if !v.in_place {
        sc.push_auto(
            Action::Copy {
                src: own,
                dst: v.recv[r].region(Buf::Recv),
            },
            None,
            0,
        );
    }
    for k in 1..n {
        sc.push_auto(
            Action::Send {
                peer: (r + k) % n,
                src: own,
            },
            None,
            0,
        );
        let from = (r + n - k) % n;
        sc.push_auto(
            Action::Recv {
                peer: from,
                dst: v.recv[from].region(Buf::Recv),
                combine: Combine::Copy,
            },
            None,
            0,
        );
    }
    sc.finish()
}

/// Reduce-scatterv, pairwise: block `k` of the input straight to rank `k`, and the `n-1` blocks
/// that arrive reduced into the result one peer after another in rank order (as
/// [`crate::reduce_scatter::pairwise`]).
pub fn reduce_scatter_v(v: &VShape) -> Schedule {
    let mut sc = Schedule::new("pairwise");
    sc.handshake = true;
    let input = |k: usize| v.send[k].region(if v.in_place { Buf::Recv } else { Buf::Send });
    let out = if v.in_place {
        input(v.rank)
    } else {
        v.recv[0].region(Buf::Recv)
    };
    reduce_scatter::reduce_exchange(&mut sc, v.rank, v.size, v.op, input, out);
    sc.finish()
}

/// Alltoallv, pairwise: every block at once, to staggered peers (as
/// [`crate::alltoall::pairwise`]). In place, incoming blocks land in scratch and are copied over
/// once the block they replace has gone.
pub fn all_to_all_v(v: &VShape) -> Schedule {
    let mut sc = Schedule::new("pairwise");
    sc.handshake = true;
    let src = |k: usize| {
        if v.in_place {
            v.recv[k].region(Buf::Recv)
        } else {
            v.send[k].region(Buf::Send)
        }
    };
    let dst = |k: usize| v.recv[k].region(Buf::Recv);
    alltoall::exchange(&mut sc, v.rank, v.size, v.in_place, src, dst);
    sc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_check_their_arguments() {
        let e = VShape::all_gather_v(0, 3, &[1, 2], None, false).unwrap_err();
        assert_eq!(e, "receive counts has 2 entries for 3 ranks");
        let e = VShape::all_gather_v(0, 2, &[1, 2], Some(&[0]), false).unwrap_err();
        assert_eq!(e, "receive displacements has 1 entries for 2 ranks");
        let e = VShape::all_gather_v(0, 2, &[3, 2], Some(&[0, 2]), false).unwrap_err();
        assert!(
            e.contains("rank 0 (at 0, 3 elements) and rank 1 (at 2"),
            "{e}"
        );
        let v = VShape::all_gather_v(1, 3, &[2, 0, 3], Some(&[5, 0, 0]), false).unwrap();
        assert_eq!((v.send_len, v.recv_len), (0, 7));
        let e = VShape::all_to_all_v(0, 2, (&[1, 1], None), (&[2, 1], None), false).unwrap_err();
        assert!(e.contains("sends itself 1 elements but receives 2"), "{e}");
        let e = VShape::all_to_all_v(0, 1, (&[usize::MAX], Some(&[1])), (&[0], None), false)
            .unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        let v = VShape::reduce_scatter_v(2, 3, &[1, 2, 3], true, ReduceOp::Sum).unwrap();
        assert_eq!(
            (v.send_len, v.recv_len, v.send[2]),
            (0, 6, Block { off: 3, len: 3 })
        );
        assert_ne!(fingerprint(&[1, 2]), fingerprint(&[2, 1]));
        assert_ne!(fingerprint(&[0]), fingerprint(&[0, 0]));
    }
}
