//! The collectives: their names and wire ids, and NCCL's rules for their buffer lengths.

use std::fmt;

wire_enum! {
    /// A collective operation.
    pub enum Collective {
        AllReduce = 0 => "allreduce",
        Broadcast = 1 => "broadcast",
        Reduce = 2 => "reduce",
        AllGather = 3 => "allgather",
        ReduceScatter = 4 => "reducescatter",
        AllToAll = 5 => "alltoall",
        Barrier = 6 => "barrier",
        /// Every rank's block to the root, in rank order.
        Gather = 7 => "gather",
        /// Block `k` of the root's buffer to rank `k`.
        Scatter = 8 => "scatter",
        /// Allgather with a count per rank (every rank passes all the counts).
        AllGatherV = 9 => "allgatherv",
        /// Reduce-scatter with a count per rank (every rank passes all the counts).
        ReduceScatterV = 10 => "reducescatterv",
        /// Alltoall with a count per pair of ranks (each rank passes its own send and receive
        /// counts).
        AllToAllV = 11 => "alltoallv",
    }
}

impl Collective {
    /// The lengths, in elements, of the send and receive buffers for NCCL's `count`: the whole
    /// buffer for allreduce, broadcast and reduce; one rank's block for allgather's input,
    /// reduce-scatter's output and alltoall's block per peer.
    pub fn buffer_lens(self, count: usize, n: usize) -> Result<BufferLens, LenError> {
        let blocks = || {
            count
                .checked_mul(n)
                .ok_or(LenError::Overflow { count, ranks: n })
        };
        let (send, recv) = match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (count, count),
            Collective::AllGather => (count, blocks()?),
            Collective::ReduceScatter => (blocks()?, count),
            Collective::AllToAll => (blocks()?, blocks()?),
            Collective::Barrier => (0, 0),
            // The root's buffer holds every rank's block; the others' one block.
            Collective::Gather => (count, blocks()?),
            Collective::Scatter => (blocks()?, count),
            Collective::AllGatherV | Collective::ReduceScatterV | Collective::AllToAllV => {
                return Err(LenError::PerRank(self));
            }
        };
        Ok(BufferLens { send, recv })
    }

    /// NCCL's `count` for buffers of these lengths in elements (`send` is `None` in place, where
    /// `recv` is the one buffer): the inverse of [`buffer_lens`](Collective::buffer_lens). Only
    /// the lengths that decide the count are checked here; `buffer_lens` then gives what every
    /// buffer must hold.
    pub fn count_for(self, send: Option<usize>, recv: usize, n: usize) -> Result<usize, LenError> {
        let blocks = |len: usize| {
            if n == 0 || len % n != 0 {
                return Err(LenError::NotBlocks { len, ranks: n });
            }
            Ok(len / n)
        };
        match (self, send) {
            (Collective::AllReduce | Collective::Broadcast | Collective::Reduce, Some(s))
                if s != recv =>
            {
                Err(LenError::Mismatch { send: s, recv })
            }
            (Collective::AllReduce | Collective::Broadcast | Collective::Reduce, _) => Ok(recv),
            (Collective::AllGather | Collective::Gather, Some(s)) => Ok(s),
            (Collective::ReduceScatter | Collective::Scatter, Some(_)) => Ok(recv),
            (
                Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::Gather
                | Collective::Scatter,
                _,
            ) => blocks(recv),
            (Collective::Barrier, _) => Ok(0),
            (Collective::AllGatherV | Collective::ReduceScatterV | Collective::AllToAllV, _) => {
                Err(LenError::PerRank(self))
            }
        }
    }

    /// Whether the collective has a root (broadcast, reduce, gather, scatter).
    pub const fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// Whether the collective reduces (and so takes an operator).
    pub const fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce
                | Collective::Reduce
                | Collective::ReduceScatter
                | Collective::ReduceScatterV
        )
    }

    /// Whether the collective takes counts per rank ([`crate::vcoll::VShape`]) instead of one
    /// count: allgatherv, reduce-scatterv, alltoallv.
    pub const fn per_rank(self) -> bool {
        matches!(
            self,
            Collective::AllGatherV | Collective::ReduceScatterV | Collective::AllToAllV
        )
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The lengths of a collective's send and receive buffers (NCCL's rules), in elements or bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferLens {
    pub send: usize,
    pub recv: usize,
}

impl BufferLens {
    /// The one buffer of the in-place form: the larger of the two. NCCL puts allgather's input
    /// at block `rank` of its output and reduce-scatter's output at block `rank` of its input.
    pub const fn in_place(self) -> usize {
        if self.send > self.recv {
            self.send
        } else {
            self.recv
        }
    }

    /// The same lengths in bytes of `elem` bytes each, unless they overflow.
    pub fn bytes(self, elem: usize) -> Option<BufferLens> {
        Some(BufferLens {
            send: self.send.checked_mul(elem)?,
            recv: self.recv.checked_mul(elem)?,
        })
    }
}

/// Buffer lengths that do not fit a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LenError {
    #[error("count {count} times {ranks} ranks overflows the address space")]
    Overflow { count: usize, ranks: usize },
    #[error("send buffer has {send} elements but receive buffer has {recv}")]
    Mismatch { send: usize, recv: usize },
    #[error("a buffer of {len} elements does not split into {ranks} equal blocks")]
    NotBlocks { len: usize, ranks: usize },
    #[error("{0} takes a count per rank, not one count")]
    PerRank(Collective),
}
