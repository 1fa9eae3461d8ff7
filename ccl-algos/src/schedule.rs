//! Schedules: a collective written down as data.
//!
//! A [`Schedule`] is one rank's list of [`Op`]s: sends and receives to and from peers, and local
//! copies and reductions, over three buffers (the caller's send and receive buffers and a scratch
//! buffer). Each op lists the ops that must finish before it starts (`deps`); a send may instead
//! **stream** from the op that produces its data (`stream_from`), forwarding bytes as soon as they
//! are produced: that is what pipelines a ring without cutting it into many small ops.
//!
//! Schedules are pure functions of (rank, world size, count, placement), so they can be checked
//! exhaustively without a network (see [`crate::symbolic`]) and cached per communicator.

use ccl_core::ReduceOp;

/// Which buffer a region lies in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The caller's input (out-of-place collectives only).
    Send,
    /// The caller's output (and input, in place).
    Recv,
    /// Temporary space owned by the communicator.
    Scratch,
    /// More caller buffers, for groups of point-to-point operations.
    Extra(u16),
    /// The slot of host rank `i` in the memory the ranks of one host share
    /// (`ccl_core::transport::HostMemory`): every rank reads every slot, only its owner writes
    /// it, and [`Action::Post`] / [`Action::WaitPosts`] order the two.
    Host(u16),
    /// Host rank `i`'s input (its send buffer, or its receive buffer in place) where it lies,
    /// in memory the ranks of the host share (`HostMemory::peer_input`): read only, after the
    /// post that follows its announcement. Only in [`Schedule::direct`] schedules.
    PeerIn(u16),
    /// Host rank `i`'s output, written in place (`HostMemory::peer_output`). Only in
    /// [`Schedule::direct`] schedules.
    PeerOut(u16),
}

/// A range of a buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Region {
    pub const fn new(buf: Buf, off: usize, len: usize) -> Region {
        Region { buf, off, len }
    }

    pub const fn end(&self) -> usize {
        self.off + self.len
    }

    /// Whether the two regions share any element.
    pub fn overlaps(&self, o: &Region) -> bool {
        self.buf == o.buf && self.off < o.end() && o.off < self.end()
    }
}

/// How a receive combines incoming data with what is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// `dst = incoming`.
    Copy,
    /// `dst = with (op) incoming`, or `incoming (op) with` when `incoming_first`; `with` of
    /// `None` means `dst` itself. With `finish_avg`, the result is also divided by the world size
    /// (the last reduction of an `Avg`).
    Reduce {
        with: Option<Region>,
        incoming_first: bool,
        finish_avg: bool,
    },
}

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Send {
        peer: usize,
        src: Region,
    },
    Recv {
        peer: usize,
        dst: Region,
        combine: Combine,
    },
    /// Local: `dst = src`.
    Copy {
        src: Region,
        dst: Region,
    },
    /// Local: `dst = dst (op) src`, or `src (op) dst` when `src_first`.
    Reduce {
        dst: Region,
        src: Region,
        src_first: bool,
    },
    /// Local: `dst = a (op) b`, `a` the first operand (`dst` overlaps neither).
    ReduceInto {
        dst: Region,
        a: Region,
        b: Region,
    },
    /// Local: divide by the world size (end of an `Avg`).
    FinishAvg {
        region: Region,
    },
    /// Local: publish to the other ranks of the host that everything this rank did before is
    /// done (what it wrote to its host slot is ready; what it read from theirs may be
    /// overwritten). Bumps this rank's post counter.
    Post,
    /// Local: wait until every rank of the host has posted `count` times in this operation.
    WaitPosts {
        count: u32,
    },
}

impl Action {
    /// Elements the op moves or touches.
    pub fn len(&self) -> usize {
        match self {
            Action::Send { src, .. } => src.len,
            Action::Recv { dst, .. } => dst.len,
            Action::Copy { dst, .. }
            | Action::Reduce { dst, .. }
            | Action::ReduceInto { dst, .. } => dst.len,
            Action::FinishAvg { region } => region.len,
            // One unit of work, so that they count as pending until they run (ops of length
            // zero are complete from the start).
            Action::Post | Action::WaitPosts { .. } => 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The peer of a send or receive.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Action::Send { peer, .. } | Action::Recv { peer, .. } => Some(*peer),
            _ => None,
        }
    }
}

/// Index of an op in its schedule.
pub type OpId = usize;

/// The regions an op reads and the regions it writes.
pub fn access(a: &Action) -> (Vec<Region>, Vec<Region>) {
    match *a {
        Action::Send { src, .. } => (vec![src], vec![]),
        Action::Recv { dst, combine, .. } => match combine {
            Combine::Copy => (vec![], vec![dst]),
            Combine::Reduce { with, .. } => (vec![with.unwrap_or(dst)], vec![dst]),
        },
        Action::Copy { src, dst } => (vec![src], vec![dst]),
        Action::Reduce { dst, src, .. } => (vec![src, dst], vec![dst]),
        Action::ReduceInto { dst, a, b } => (vec![a, b], vec![dst]),
        Action::FinishAvg { region } => (vec![region], vec![region]),
        Action::Post | Action::WaitPosts { .. } => (vec![], vec![]),
    }
}

fn conflicts(a: &Action, b: &Action) -> bool {
    let (ar, aw) = access(a);
    let (br, bw) = access(b);
    let hit = |x: &[Region], y: &[Region]| {
        x.iter()
            .any(|p| p.len > 0 && y.iter().any(|q| q.len > 0 && p.overlaps(q)))
    };
    hit(&aw, &br) || hit(&ar, &bw) || hit(&aw, &bw)
}

/// A schedule that breaks a structural rule ([`Schedule::validate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0:?} uses the send buffer in place")]
    SendInPlace(Region),
    #[error("{region:?} exceeds its buffer of {cap} elements")]
    Outside { region: Region, cap: usize },
    #[error("op {0} depends on a later op")]
    LaterDependency(OpId),
    #[error("op {0} writes the send buffer")]
    WritesSend(OpId),
    #[error("op {op}: operand {with:?} does not match {dst:?}")]
    Operand { op: OpId, with: Region, dst: Region },
    #[error("op {op}: bad local operands {src:?} -> {dst:?}")]
    LocalOperands { op: OpId, src: Region, dst: Region },
    #[error("op {op} streams from op {from} of a different length")]
    StreamLength { op: OpId, from: OpId },
    #[error("op {0}: only sends and receives stream")]
    StreamKind(OpId),
}

/// One step of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub action: Action,
    /// Ops that must be complete before this one starts.
    pub deps: Vec<OpId>,
    /// For a send or a receive: the op producing its data (for a reducing receive, the partial
    /// result it reduces into), element for element; the op may go as far as that op has.
    pub stream_from: Option<OpId>,
    /// Which step of the algorithm this is, for error messages and traces.
    pub step: u32,
}

/// Ops touching one peer, in the order they go on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerOps {
    pub peer: usize,
    pub sends: Vec<OpId>,
    pub recvs: Vec<OpId>,
    /// Elements sent to and received from this peer in all.
    pub send_elems: usize,
    pub recv_elems: usize,
}

/// One rank's part of a collective.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// The algorithm, e.g. `ring`.
    pub algo: &'static str,
    pub ops: Vec<Op>,
    /// Elements of scratch space needed.
    pub scratch: usize,
    /// Per-peer queues, derived by [`Schedule::finish`].
    pub peers: Vec<PeerOps>,
    /// Local ops in order, derived by [`Schedule::finish`].
    pub locals: Vec<OpId>,
    /// Elements of each host slot the schedule may use (`Buf::Host`; 0 when it uses none).
    pub host_slot: usize,
    /// Chunks it works on in host memory, each in the other half of the slots from the one
    /// before; the next operation goes on with the half after its last (see `crate::host`).
    pub host_chunks: usize,
    /// Exchange operation headers with every peer this schedule has a send or receive op for,
    /// even an empty one. Without it only peers that move data do, which is enough when every
    /// rank's count is the same; the collectives with a count per rank set it, so a pair whose
    /// counts disagree (0 on one side) finds out instead of one side waiting for data that never
    /// comes.
    pub handshake: bool,
    /// Reads and writes the host's ranks' buffers in place ([`Buf::PeerIn`], [`Buf::PeerOut`]):
    /// every rank's input and output lie in memory the host's ranks share, and each rank
    /// announces where before its first post.
    pub direct: bool,
}

impl Schedule {
    pub fn new(algo: &'static str) -> Schedule {
        Schedule {
            algo,
            ops: Vec::new(),
            scratch: 0,
            peers: Vec::new(),
            locals: Vec::new(),
            host_slot: 0,
            host_chunks: 0,
            handshake: false,
            direct: false,
        }
    }

    /// Whether the schedule works in host memory (and so posts and waits there).
    pub fn uses_host(&self) -> bool {
        self.host_slot > 0
    }

    /// Appends an op and returns its id.
    pub fn push(
        &mut self,
        action: Action,
        deps: &[OpId],
        stream_from: Option<OpId>,
        step: u32,
    ) -> OpId {
        debug_assert!(deps.iter().all(|&d| d < self.ops.len()));
        debug_assert!(stream_from.is_none_or(|s| s < self.ops.len()));
        self.ops.push(Op {
            action,
            deps: deps.to_vec(),
            stream_from,
            step,
        });
        self.ops.len() - 1
    }

    /// Appends an op that waits for every earlier op it conflicts with (one that writes data this
    /// op reads, or reads or writes data this op writes), except `stream_from`, which it follows
    /// piece by piece instead. Builders state only what streams; the hazards take care of
    /// themselves.
    pub fn push_auto(&mut self, action: Action, stream_from: Option<OpId>, step: u32) -> OpId {
        let deps: Vec<OpId> = (0..self.ops.len())
            .filter(|&i| Some(i) != stream_from && conflicts(&self.ops[i].action, &action))
            .collect();
        self.push(action, &deps, stream_from, step)
    }

    /// [`push_auto`](Schedule::push_auto) for an op at the end of a **stream chain** (a send
    /// streaming from a receive that streams from an earlier receive, ...): it need not wait for
    /// the ops up the chain either, when each touches exactly the same regions as this op where
    /// they overlap. An op of the chain is never ahead of the one streaming from it, so element
    /// `i` of a shared region is done up the chain before this op reaches it. Without this, a
    /// send streaming behind two reducing receives would wait for the first to finish whole.
    pub fn push_stream(&mut self, action: Action, stream_from: Option<OpId>, step: u32) -> OpId {
        let mut chain = Vec::new();
        let mut cur = stream_from;
        while let Some(c) = cur {
            chain.push(c);
            cur = self.ops[c].stream_from;
        }
        let (ar, aw) = access(&action);
        let mine: Vec<Region> = ar.into_iter().chain(aw).filter(|r| r.len > 0).collect();
        let aligned = |op: &Action| {
            let (r, w) = access(op);
            r.iter()
                .chain(&w)
                .filter(|x| x.len > 0)
                .all(|x| mine.iter().all(|m| !m.overlaps(x) || m == x))
        };
        let deps: Vec<OpId> = (0..self.ops.len())
            .filter(|&i| {
                conflicts(&self.ops[i].action, &action)
                    && !(chain.contains(&i) && aligned(&self.ops[i].action))
            })
            .collect();
        self.push(action, &deps, stream_from, step)
    }

    /// Derives the per-peer and local queues. Call once after the last push.
    pub fn finish(mut self) -> Schedule {
        let mut peers: Vec<PeerOps> = Vec::new();
        let mut locals = Vec::new();
        for (id, op) in self.ops.iter().enumerate() {
            match op.action {
                Action::Send { peer, .. } | Action::Recv { peer, .. } => {
                    let i = match peers.iter().position(|p| p.peer == peer) {
                        Some(i) => i,
                        None => {
                            peers.push(PeerOps {
                                peer,
                                sends: Vec::new(),
                                recvs: Vec::new(),
                                send_elems: 0,
                                recv_elems: 0,
                            });
                            peers.len() - 1
                        }
                    };
                    if matches!(op.action, Action::Send { .. }) {
                        peers[i].sends.push(id);
                        peers[i].send_elems += op.action.len();
                    } else {
                        peers[i].recvs.push(id);
                        peers[i].recv_elems += op.action.len();
                    }
                }
                _ => locals.push(id),
            }
        }
        self.peers = peers;
        self.locals = locals;
        self
    }

    /// Checks structural rules: regions inside their buffers, dependencies pointing backwards,
    /// streams pairing equal lengths, no op reading the send buffer in place, and no receive
    /// writing a region that an unfinished earlier op still reads or writes.
    pub fn validate(
        &self,
        send_len: usize,
        recv_len: usize,
        in_place: bool,
    ) -> Result<(), ScheduleError> {
        let inside = |r: &Region| -> Result<(), ScheduleError> {
            let cap = match r.buf {
                Buf::Send if in_place => return Err(ScheduleError::SendInPlace(*r)),
                Buf::Send => send_len,
                Buf::Recv => recv_len,
                Buf::Scratch => self.scratch,
                // Group buffers are sized by the caller; the executor bounds-checks them.
                Buf::Extra(_) => usize::MAX,
                Buf::Host(_) => self.host_slot,
                // Another rank's buffer, of the same count; the executor bounds-checks it.
                Buf::PeerIn(_) | Buf::PeerOut(_) => usize::MAX,
            };
            if r.end() > cap {
                return Err(ScheduleError::Outside { region: *r, cap });
            }
            Ok(())
        };
        for (id, op) in self.ops.iter().enumerate() {
            if op.deps.iter().any(|&d| d >= id) || op.stream_from.is_some_and(|s| s >= id) {
                return Err(ScheduleError::LaterDependency(id));
            }
            match op.action {
                Action::Send { src, .. } => inside(&src)?,
                Action::Recv { dst, combine, .. } => {
                    inside(&dst)?;
                    if dst.buf == Buf::Send {
                        return Err(ScheduleError::WritesSend(id));
                    }
                    if let Combine::Reduce { with: Some(w), .. } = combine {
                        inside(&w)?;
                        if w.len != dst.len || (w.overlaps(&dst) && w != dst) {
                            return Err(ScheduleError::Operand {
                                op: id,
                                with: w,
                                dst,
                            });
                        }
                    }
                }
                Action::Copy { src, dst } | Action::Reduce { src, dst, .. } => {
                    inside(&src)?;
                    inside(&dst)?;
                    if src.len != dst.len || src.overlaps(&dst) || dst.buf == Buf::Send {
                        return Err(ScheduleError::LocalOperands { op: id, src, dst });
                    }
                }
                Action::ReduceInto { dst, a, b } => {
                    for src in [a, b] {
                        inside(&src)?;
                        if src.len != dst.len || src.overlaps(&dst) {
                            return Err(ScheduleError::LocalOperands { op: id, src, dst });
                        }
                    }
                    inside(&dst)?;
                    if dst.buf == Buf::Send {
                        return Err(ScheduleError::WritesSend(id));
                    }
                }
                Action::FinishAvg { region } => inside(&region)?,
                Action::Post | Action::WaitPosts { .. } => {}
            }
            if let Some(s) = op.stream_from {
                if self.ops[s].action.len() != op.action.len() {
                    return Err(ScheduleError::StreamLength { op: id, from: s });
                }
                if !matches!(op.action, Action::Send { .. } | Action::Recv { .. }) {
                    return Err(ScheduleError::StreamKind(id));
                }
            }
        }
        Ok(())
    }

    /// Total bytes this rank sends.
    pub fn bytes_sent(&self, elem: usize) -> usize {
        self.ops
            .iter()
            .filter_map(|o| match o.action {
                Action::Send { src, .. } => Some(src.len * elem),
                _ => None,
            })
            .sum()
    }
}

/// Where some data is: a region, and the op that produces it (`None`: there from the start).
/// An op that reads it may stream from the producer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Data {
    pub region: Region,
    pub producer: Option<OpId>,
}

impl Data {
    /// Data present from the start.
    pub const fn ready(region: Region) -> Data {
        Data {
            region,
            producer: None,
        }
    }
}

/// What a schedule computes, for building and caching it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub rank: usize,
    pub size: usize,
    /// NCCL's count: elements of the buffer (allreduce, broadcast, reduce), of each rank's block
    /// (allgather input, reduce-scatter output, alltoall per peer).
    pub count: usize,
    pub in_place: bool,
    pub op: ReduceOp,
    /// Root of broadcast and reduce (0 otherwise).
    pub root: usize,
    /// Elements of each rank's slot in the memory the communicator's ranks share on one host
    /// (0: there is none); the `shm` algorithms need it.
    pub host_slot: usize,
    /// Whether the `shm` allreduce runs one-shot or two-shot (`crate::host::allreduce`);
    /// `None`: one-shot up to [`crate::host::ONE_SHOT_MAX`] elements. A communicator measures
    /// which is faster on its host and says so here.
    pub one_shot: Option<bool>,
}

impl Shape {
    /// A shape without a root.
    pub fn new(rank: usize, size: usize, count: usize, in_place: bool, op: ReduceOp) -> Shape {
        Shape {
            rank,
            size,
            count,
            in_place,
            op,
            root: 0,
            host_slot: 0,
            one_shot: None,
        }
    }
}
