//! The executor: runs any [`Schedule`] over a communicator's endpoints.
//!
//! It keeps, per peer, a queue of sends and a queue of receives in wire order, and a queue of
//! local ops. Each pass offers every queue head as much work as its dependencies allow, using the
//! endpoints' non-blocking calls; a send that streams from a receive forwards bytes as they are
//! reduced (in pieces of at least `CCL_CHUNK_SIZE`, so the pipeline does not degrade into tiny
//! writes). Reducing receives reduce straight from the transport's buffer into their destination.
//!
//! Before any data, each rank sends every peer it sends to an operation [`Header`] and checks the
//! one it receives, so mismatched calls fail with both calls described.
//!
//! When a pass makes no progress the executor says what it waits for from each peer, and the
//! communicator waits (spin over all peers, then sleep: `crate::peers::wait`). The rules "how
//! much of this send may go now" and "may this receive take bytes now" are written once
//! (`Run::send_now`, `Run::receive_now`) and used both to move and to say what to wait for,
//! so the executor never sleeps when it could move. A wait that sees no progress for
//! `CCL_TIMEOUT` fails with an error that names the peers it was waiting on and how far each
//! transfer got.
//!
//! The executor allocates nothing on the way through a collective except when it is about to
//! sleep (the poll set), and reuses its state between calls.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::peers::{Links, Peers};
use ccl_core::reduce::{self, Kernels, Order};
use ccl_core::transport::{HostMemory, Interest, MemRegion};
use ccl_core::{DataType, Error, ReduceOp, Result};
use ccl_diag::recorder::{self as trace, Begin};

use ccl_algos::algo::{Algo, Collective};
mod header;
use ccl_algos::local::LocalPlan;
use ccl_algos::schedule::{Action, Buf, Combine, OpId, Region, Schedule};
use header::{HEADER_LEN, Header, HeaderError, KIND_P2P};

mod plan;

pub use plan::{PlanJob, run_plan};

/// The buffers a schedule works on, as bytes.
#[derive(Debug)]
pub struct Buffers<'a> {
    /// Input of an out-of-place collective (`None` in place).
    pub send: Option<&'a [u8]>,
    pub recv: &'a mut [u8],
    pub scratch: &'a mut [u8],
    /// More caller buffers (`Buf::Extra(i)`), for groups of sends and receives.
    pub extra: Vec<ExtraBuf<'a>>,
}

/// The caller buffers that are registered with the transports (`ccl`'s `Registration` and
/// `Buffer`): one region per transport that needs registration, empty for a plain buffer. Sends
/// out of a registered buffer go to the endpoint as zero-copy sends
/// ([`Endpoint::send_registered`](ccl_core::transport::Endpoint::send_registered)), and copying
/// receives into one as zero-copy receives
/// ([`Endpoint::recv_registered`](ccl_core::transport::Endpoint::recv_registered)); a
/// transport without zero copy stages them as usual.
#[derive(Clone, Copy, Debug, Default)]
pub struct Registered<'a> {
    pub send: &'a [Box<dyn MemRegion>],
    pub recv: &'a [Box<dyn MemRegion>],
}

impl Registered<'_> {
    /// The region of buffer `buf` registered with transport `transport`, if any.
    fn region(&self, buf: Buf, transport: Option<&str>) -> Option<&dyn MemRegion> {
        let regions = match buf {
            Buf::Send => self.send,
            Buf::Recv => self.recv,
            _ => return None,
        };
        let t = transport?;
        regions.iter().find(|r| r.transport() == t).map(|r| &**r)
    }
}

/// A caller buffer of a point-to-point group: sent from, or received into.
#[derive(Debug)]
pub enum ExtraBuf<'a> {
    Src(&'a [u8]),
    Dst(&'a mut [u8]),
}

fn no_host() -> Error {
    Error::internal("schedule uses host memory but the communicator has none")
}

/// Region `r` of host rank `i`'s slot.
fn host_slot<'x>(h: &'x dyn HostMemory, i: u16, r: &Region, elem: usize) -> Result<&'x [u8]> {
    if i as usize >= h.ranks().len() {
        return Err(Error::internal(format!("no host rank {i}")));
    }
    h.slot(i as usize)
        .get(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of this rank's host slot (host rank `i` must be this rank: only owners write).
fn host_slot_mut<'x>(
    h: &'x mut dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x mut [u8]> {
    if i as usize != h.me() {
        return Err(Error::internal(format!(
            "schedule writes the host slot of host rank {i}"
        )));
    }
    h.my_slot()
        .get_mut(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of host rank `i`'s input, read in place.
fn peer_in<'x>(h: &'x dyn HostMemory, i: u16, r: &Region, elem: usize) -> Result<&'x [u8]> {
    h.peer_input(i as usize)?
        .get(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of host rank `i`'s output, written in place.
fn peer_out<'x>(
    h: &'x mut dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x mut [u8]> {
    h.peer_output(i as usize)?
        .get_mut(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Set in the operation fingerprint of a direct schedule ([`Schedule::direct`]): a bit of the
/// reduce op's byte that no op uses, so that a rank running it and one running the staged
/// schedule see different fingerprints.
const DIRECT_DESC: u64 = 1 << 47;

fn outside(r: &Region) -> Error {
    Error::internal(format!("schedule region {r:?} is outside its buffer"))
}

/// The header of the operation `info` for channel sequence `channel_seq` and `bytes`.
fn header_of(
    info: &OpInfo,
    dtype: DataType,
    op: ReduceOp,
    channel_seq: u64,
    bytes: usize,
    entry_us: u64,
) -> Header {
    let (kind, algo) = match info.kind {
        OpKind::Collective { coll, algo } => (coll.id(), algo.id()),
        OpKind::PointToPoint => (KIND_P2P, 0),
    };
    Header {
        kind,
        dtype: dtype as u8,
        op: op as u8,
        algo,
        root: info.root as u32,
        seq: channel_seq,
        count: info.count as u64,
        bytes: bytes as u64,
        entry_us,
    }
}

/// Whether this host's ranks outnumber its CPUs (worked out once per communicator).
fn shares_cpus(comm: &Peers, st: &mut ExecState) -> bool {
    *st.shares_cpus.get_or_insert_with(|| {
        comm.machine_cpus() > 0 && comm.ranks_on_host() > comm.machine_cpus()
    })
}

/// Adds what operation `seq` was doing to `e`, and what the job monitor knows of its cause.
fn fail_op(comm: &Peers, info: &OpInfo, seq: u64, sched: &Schedule, e: Error) -> Error {
    let e = e.rank(comm.rank()).context(format!(
        "{} #{} ({}, {} bytes)",
        info.name(),
        seq,
        sched.algo,
        info.bytes
    ));
    comm.explain(e)
}

/// An operation's fingerprint in host memory, from its header.
fn host_desc(mine: Header, direct: bool) -> u64 {
    let d = mine.host_desc();
    if direct { d | DIRECT_DESC } else { d }
}

/// Every other rank of the host must be in the same call as this one (`desc`, host operation
/// number `host_ops`); `mine` gives this rank's header for the message when one is not.
fn check_host_calls(
    h: &dyn HostMemory,
    host_ops: u64,
    desc: u64,
    direct: bool,
    mine: impl Fn() -> Header,
) -> Result<()> {
    match h.first_unlike(host_ops, desc) {
        None => Ok(()),
        Some((i, theirs)) => Err(unlike(h, i, theirs, desc, direct, mine())),
    }
}

/// The error of host rank `i` found in another operation (`theirs`) than this rank's (`desc`,
/// whose header is `mine`).
fn unlike(
    h: &dyn HostMemory,
    i: usize,
    theirs: u64,
    desc: u64,
    direct: bool,
    mine: Header,
) -> Error {
    let peer = h.ranks()[i];
    if theirs ^ desc == DIRECT_DESC {
        let (a, b) = if direct { ("", " not") } else { (" not", "") };
        return Error::invalid_usage(format!(
            "with peer {peer}: {}: this rank's buffers are{a} all from \
             Communicator::alloc (shared memory) and the peer's are{b}; on one host \
             either every rank passes such buffers to a collective or none does",
            mine.describe()
        ))
        .peer(peer);
    }
    let theirs = Header::from_host_desc(theirs & !DIRECT_DESC, mine.algo);
    Error::invalid_usage(format!(
        "with peer {peer}: mismatched calls: this rank called {}, the peer called {}",
        mine.describe(),
        theirs.describe()
    ))
    .peer(peer)
}

impl<'a> Buffers<'a> {
    /// The caller's buffers alone, with no scratch space or group buffers.
    fn caller(send: Option<&'a [u8]>, recv: &'a mut [u8]) -> Buffers<'a> {
        Buffers {
            send,
            recv,
            scratch: Default::default(),
            extra: Vec::new(),
        }
    }

    fn range(r: &Region, elem: usize) -> std::ops::Range<usize> {
        r.off * elem..r.end() * elem
    }

    fn get(&self, r: &Region, elem: usize) -> Result<&[u8]> {
        let b: &[u8] = match r.buf {
            Buf::Send => self
                .send
                .ok_or_else(|| Error::internal("schedule reads the send buffer in place"))?,
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
            Buf::Extra(i) => match self.extra.get(i as usize) {
                Some(ExtraBuf::Src(b)) => b,
                Some(ExtraBuf::Dst(b)) => b,
                None => return Err(Error::internal(format!("no group buffer {i}"))),
            },
            // Host memory is the run's, not the caller's (`Run::region`).
            Buf::Host(_) | Buf::PeerIn(_) | Buf::PeerOut(_) => return Err(no_host()),
        };
        b.get(Self::range(r, elem)).ok_or_else(|| outside(r))
    }

    fn get_mut(&mut self, r: &Region, elem: usize) -> Result<&mut [u8]> {
        let b: &mut [u8] = match r.buf {
            Buf::Send => return Err(Error::internal("schedule writes the send buffer")),
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
            Buf::Extra(i) => match self.extra.get_mut(i as usize) {
                Some(ExtraBuf::Dst(b)) => b,
                Some(ExtraBuf::Src(_)) => {
                    return Err(Error::internal(format!(
                        "schedule writes send-only group buffer {i}"
                    )));
                }
                None => return Err(Error::internal(format!("no group buffer {i}"))),
            },
            Buf::Host(_) | Buf::PeerIn(_) | Buf::PeerOut(_) => return Err(no_host()),
        };
        b.get_mut(Self::range(r, elem)).ok_or_else(|| outside(r))
    }

    /// `dst` for writing and `src` for reading; `None` for `src` when it is `dst` itself.
    fn pair(
        &mut self,
        dst: &Region,
        src: &Region,
        elem: usize,
    ) -> Result<(&mut [u8], Option<&[u8]>)> {
        if dst == src {
            return Ok((self.get_mut(dst, elem)?, None));
        }
        if dst.overlaps(src) {
            return Err(Error::internal(format!(
                "overlapping operands {dst:?} {src:?}"
            )));
        }
        let Buffers {
            send,
            recv,
            scratch,
            ..
        } = self;
        let no_send = || Error::internal("schedule reads the send buffer in place");
        if dst.buf != src.buf {
            let (d, sb): (&mut [u8], &[u8]) = match (dst.buf, src.buf) {
                (Buf::Recv, Buf::Send) => (recv, send.ok_or_else(no_send)?),
                (Buf::Recv, Buf::Scratch) => (recv, scratch),
                (Buf::Scratch, Buf::Send) => (scratch, send.ok_or_else(no_send)?),
                (Buf::Scratch, Buf::Recv) => (scratch, recv),
                _ => {
                    return Err(Error::internal(
                        "unsupported operand buffers for a local op",
                    ));
                }
            };
            let sl = sb.get(Self::range(src, elem)).ok_or_else(|| outside(src))?;
            let dl = d
                .get_mut(Self::range(dst, elem))
                .ok_or_else(|| outside(dst))?;
            return Ok((dl, Some(sl)));
        }
        // Same buffer, disjoint ranges: split it.
        let whole: &mut [u8] = match dst.buf {
            Buf::Recv => recv,
            Buf::Scratch => scratch,
            _ => {
                return Err(Error::internal(
                    "unsupported operand buffers for a local op",
                ));
            }
        };
        let (dr, sr) = (Self::range(dst, elem), Self::range(src, elem));
        if dr.end.max(sr.end) > whole.len() {
            return Err(outside(dst));
        }
        if dr.start < sr.start {
            let (a, b) = whole.split_at_mut(sr.start);
            Ok((&mut a[dr], Some(&b[..sr.len()])))
        } else {
            let (a, b) = whole.split_at_mut(dr.start);
            Ok((&mut b[..dr.len()], Some(&a[sr])))
        }
    }
}

/// What an operation is, as its header tells each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A collective run by one algorithm.
    Collective { coll: Collective, algo: Algo },
    /// A group of sends and receives.
    PointToPoint,
}

/// Describes the running operation: in error messages, the flight recorder, and the header each
/// peer checks.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub kind: OpKind,
    /// The nccl-tests size of the operation (bytes sent, for point-to-point).
    pub bytes: usize,
    /// Root of broadcast and reduce (0 otherwise).
    pub root: usize,
    /// NCCL's count (0 for point-to-point).
    pub count: usize,
}

impl OpInfo {
    /// `allreduce`, `broadcast`, ..., `send/recv`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            OpKind::Collective { coll, .. } => coll.name(),
            OpKind::PointToPoint => "send/recv",
        }
    }

    /// Whether the operation has a root.
    fn rooted(&self) -> bool {
        matches!(self.kind, OpKind::Collective { coll, .. } if coll.rooted())
    }
}

/// A schedule to run, with its buffers and what it is.
#[derive(Debug)]
pub struct Job<'s, 'b> {
    pub schedule: &'s Schedule,
    pub buffers: Buffers<'b>,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub info: OpInfo,
    /// The communicator's number for this operation (1, 2, ...).
    pub seq: u64,
    /// Which of the buffers are registered.
    pub registered: Registered<'b>,
    /// The schedule compiled for this rank when it has no peers ([`LocalPlan::compile`]):
    /// the executor runs its steps instead of walking the schedule's ops.
    pub local: Option<&'s LocalPlan>,
}

/// A first send this small travels in the same write as the header.
const COALESCE: usize = 2048;
/// With the header, a receiver reads ahead this much of the first message in the same call.
const LOOKAHEAD: usize = 4096;

/// What the executor keeps per peer queue of a schedule.
#[derive(Debug)]
struct PeerState {
    /// Position of the next send and receive in the peer's queues.
    next_send: usize,
    next_recv: usize,
    /// The header (and a small first message) to send, and how much of it went.
    header_out: Vec<u8>,
    header_out_sent: usize,
    /// Bytes of the first send op carried in `header_out`.
    carried: usize,
    /// Whether a header is expected from this peer, the header, and how much of it arrived.
    expects_header: bool,
    header_in: [u8; HEADER_LEN],
    header_in_got: usize,
    /// Time spent waiting for this peer, and how late it entered (from its header).
    wait_us: u64,
    late_us: Option<i64>,
}

impl Default for PeerState {
    fn default() -> PeerState {
        PeerState {
            next_send: 0,
            next_recv: 0,
            header_out: Vec::with_capacity(HEADER_LEN + COALESCE),
            header_out_sent: 0,
            carried: 0,
            expects_header: false,
            header_in: [0; HEADER_LEN],
            header_in_got: 0,
            wait_us: 0,
            late_us: None,
        }
    }
}

impl PeerState {
    /// Resets for a new operation, keeping the header buffer's memory.
    fn reset(&mut self) {
        self.next_send = 0;
        self.next_recv = 0;
        self.header_out.clear();
        self.header_out_sent = 0;
        self.carried = 0;
        self.expects_header = false;
        self.header_in = [0; HEADER_LEN];
        self.header_in_got = 0;
        self.wait_us = 0;
        self.late_us = None;
    }

    /// Whether this rank's header to the peer still has bytes to go: no data may follow before.
    fn header_out_pending(&self) -> bool {
        self.header_out_sent < self.header_out.len()
    }

    /// Whether the peer's header has yet to arrive: none of its data is taken before.
    fn header_in_pending(&self) -> bool {
        self.expects_header && self.header_in_got < HEADER_LEN
    }
}

/// Reusable executor state.
#[derive(Debug, Default)]
pub struct ExecState {
    /// Bytes per element of the operation.
    elem: usize,
    /// Bytes done per op.
    done: Vec<usize>,
    /// Per peer queue of the schedule (entries beyond the schedule's peers are kept for reuse).
    peers: Vec<PeerState>,
    next_local: usize,
    /// Ops with bytes still to move, and headers still to send or receive.
    ops_left: usize,
    headers_left: usize,
    /// Headers sent to / received from each rank so far (the per-channel sequence).
    headers_to: Vec<u64>,
    headers_from: Vec<u64>,
    /// When this rank entered the operation (microseconds since the epoch).
    entry_us: u64,
    /// Since when nothing has moved, and which peer queue's data was awaited then.
    idle_since: Option<(Instant, Option<usize>)>,
    /// What this rank waits for from each peer, while it waits.
    waits: Vec<(usize, Interest)>,
    /// Whether this host runs more of the communicator's ranks than it has CPUs (known after
    /// the first wait).
    shares_cpus: Option<bool>,
    /// Operations run in host memory so far: which of its two places an operation announces
    /// itself in (a rank can be one operation ahead of the others there).
    host_ops: u64,
    /// Whether the next operation in host memory starts on the second half of the slots (the
    /// last one's last chunk was on the first; see `crate::host`).
    host_second_half: bool,
}

impl ExecState {
    fn reset(&mut self, s: &Schedule, elem: usize, world: usize, entry_us: u64) {
        self.elem = elem;
        self.done.clear();
        self.done.resize(s.ops.len(), 0);
        if self.peers.len() < s.peers.len() {
            self.peers.resize_with(s.peers.len(), PeerState::default);
        }
        for p in &mut self.peers {
            p.reset();
        }
        self.next_local = 0;
        self.ops_left = s.ops.iter().filter(|o| o.action.len() * elem > 0).count();
        self.headers_left = 0;
        if self.headers_to.len() != world {
            self.headers_to = vec![0; world];
            self.headers_from = vec![0; world];
        }
        self.entry_us = entry_us;
        self.idle_since = None;
    }

    /// [`reset`](ExecState::reset) for a schedule without peers: only what running its local
    /// ops in order uses.
    fn reset_local(&mut self, s: &Schedule, elem: usize, entry_us: u64) {
        self.elem = elem;
        self.done.clear();
        self.done.resize(s.ops.len(), 0);
        self.next_local = 0;
        self.ops_left = 0;
        self.headers_left = 0;
        self.entry_us = entry_us;
        self.idle_since = None;
    }

    /// Charges the idle time that just ended to the peer that was awaited.
    fn end_idle(&mut self) {
        if let Some((t, Some(pi))) = self.idle_since.take() {
            self.peers[pi].wait_us += t.elapsed().as_micros() as u64;
        }
    }

    fn finished(&self) -> bool {
        self.ops_left == 0 && self.headers_left == 0
    }

    /// Bytes of op `id` of `s`.
    fn len(&self, s: &Schedule, id: OpId) -> usize {
        s.ops[id].action.len() * self.elem
    }

    fn complete(&self, s: &Schedule, id: OpId) -> bool {
        self.done[id] == self.len(s, id)
    }

    fn deps_done(&self, s: &Schedule, id: OpId) -> bool {
        s.ops[id].deps.iter().all(|&d| self.complete(s, d))
    }

    /// The first peer with a receive whose dependencies are met but whose data has not arrived.
    fn first_waited_peer(&self, s: &Schedule) -> Option<usize> {
        s.peers.iter().zip(&self.peers).find_map(|(p, q)| {
            if q.header_in_pending() {
                return Some(p.peer);
            }
            let &id = p.recvs.get(q.next_recv)?;
            self.deps_done(s, id).then_some(p.peer)
        })
    }

    /// Brings the recorder's entry for this operation up to date.
    fn sync_trace(&self, comm: &Peers, s: &Schedule, waiting_on: Option<usize>) {
        if let Some(e) = comm.recorder().current() {
            self.sync_entry(e, s, waiting_on);
        }
    }

    /// Brings recorder entry `e` of this operation up to date.
    fn sync_entry(&self, e: &mut trace::Entry, s: &Schedule, waiting_on: Option<usize>) {
        e.waiting_on = waiting_on;
        if let Some((t, _)) = self.idle_since {
            e.progress_us = trace::now_us().saturating_sub(t.elapsed().as_micros() as u64);
        }
        for ((stat, p), q) in e.peers.iter_mut().zip(&s.peers).zip(&self.peers) {
            stat.sent = p.sends.iter().map(|&id| self.done[id] as u64).sum();
            stat.received = p.recvs.iter().map(|&id| self.done[id] as u64).sum();
            stat.arrived = !q.header_in_pending();
            stat.waited_us = q.wait_us;
            stat.late_us = q.late_us.unwrap_or(0);
        }
    }
}

/// Runs `job` to completion (or error), recording it in the communicator's flight recorder.
pub fn run(comm: &Peers, links: &mut Links, state: &mut ExecState, job: Job<'_, '_>) -> Result<()> {
    if let Some(plan) = job.local {
        // A plan's schedule has no scratch space or group buffers (`LocalPlan::compile`).
        return run_plan(
            comm,
            links,
            state,
            PlanJob {
                schedule: job.schedule,
                plan,
                send: job.buffers.send,
                recv: job.buffers.recv,
                dtype: job.dtype,
                op: job.op,
                info: job.info,
                seq: job.seq,
                record: op_record(&job.info, job.seq, job.dtype, job.op, job.schedule.algo),
            },
        );
    }
    let elem = job.dtype.size();
    let sched = job.schedule;
    let record = op_record(&job.info, job.seq, job.dtype, job.op, sched.algo);
    let entry_us = begin_op(comm, record, sched, elem);
    // The host memory travels beside the links for the run: local ops borrow slots of it while
    // the links are in use.
    let mut host = links.host.take();
    let mut run = Run::new(comm, links, host.as_deref_mut(), state, job, entry_us);
    let r = run.drive();
    drop(run);
    end_op(comm, host.as_deref(), state, sched, &r);
    links.host = host;
    r
}

/// Starts the recorder's entry for `job`; returns the time the operation entered (the entry's
/// start: one clock read fewer per operation).
#[inline]
fn begin_op(comm: &Peers, b: Begin, sched: &Schedule, elem: usize) -> u64 {
    let start = comm.recorder().begin(
        b,
        sched.peers.iter().map(|p| {
            (
                p.peer,
                (p.send_elems * elem) as u64,
                (p.recv_elems * elem) as u64,
            )
        }),
    );
    start.unwrap_or_else(trace::now_us)
}

/// What the flight recorder records of operation `seq`.
pub fn op_record(
    info: &OpInfo,
    seq: u64,
    dtype: DataType,
    op: ReduceOp,
    algo: &'static str,
) -> Begin {
    Begin {
        seq,
        name: info.name(),
        algo,
        dtype: dtype.name(),
        op: op.name(),
        count: info.count as u64,
        bytes: info.bytes as u64,
        root: info.rooted().then_some(info.root),
    }
}

/// What every run does once its schedule ran (to completion or to error `r`): wakes the ranks
/// that wait for this one's last posts, turns the host memory's halves, and closes the
/// recorder's entry.
#[inline]
fn end_op(
    comm: &Peers,
    host: Option<&(dyn HostMemory + 'static)>,
    state: &mut ExecState,
    sched: &Schedule,
    r: &Result<()>,
) {
    // Posts wake nobody: the ranks that wait for this one's last posts are woken now.
    if sched.uses_host()
        && let Some(h) = host
    {
        h.wake();
    }
    // Every rank of the host runs the same operations in host memory (a mismatch fails the
    // communicator), so all count them and turn the halves alike.
    if sched.uses_host() && sched.host_chunks > 0 {
        state.host_ops += 1;
        state.host_second_half ^= sched.host_chunks % 2 == 1;
    }
    state.end_idle();
    let waiting = r.as_ref().err().and(state.first_waited_peer(sched));
    {
        let mut rec = comm.recorder();
        if let Some(e) = rec.current() {
            // Without peers (idle already ended), only what it waits on is left to say.
            if sched.peers.is_empty() {
                e.waiting_on = waiting;
            } else {
                state.sync_entry(e, sched, waiting);
            }
        }
        rec.end(r.as_ref().err().map(|e| e.to_string()));
    }
    // An operation with no peer's header (one in host memory) says nothing of lateness.
    if r.is_ok() && !sched.peers.is_empty() {
        comm.note_lateness(
            sched
                .peers
                .iter()
                .zip(&state.peers)
                .filter_map(|(p, q)| q.late_us.map(|l| (p.peer, l))),
        );
    }
}

/// How long a run has moved nothing. The clock is read only once idle: a small operation that
/// never waits reads it not at all, and a waiting one every [`Idle::CLOCK_EVERY`] idle passes,
/// so it notices the peer's data sooner.
#[derive(Default)]
struct Idle {
    from: Option<Instant>,
    passes: u32,
    idle: Duration,
}

impl Idle {
    const CLOCK_EVERY: u32 = 8;

    /// Something moved: no longer idle.
    fn moved(&mut self) {
        self.from = None;
    }

    /// One more pass that moved nothing: since when, and for how long as of the last look at
    /// the clock.
    fn tick(&mut self) -> (Instant, Duration) {
        match self.from {
            None => {
                self.from = Some(Instant::now());
                (self.passes, self.idle) = (0, Duration::ZERO);
            }
            Some(t) => {
                self.passes += 1;
                if self.passes % Self::CLOCK_EVERY == 0 {
                    self.idle = t.elapsed();
                }
            }
        }
        (self.from.expect("set above"), self.idle)
    }
}

/// One run of a schedule: everything a pass needs.
struct Run<'r, 'b> {
    comm: &'r Peers,
    links: &'r mut Links,
    /// The memory the ranks of this host share, when the communicator has it.
    host: Option<&'r mut (dyn HostMemory + 'static)>,
    /// This rank's post count when the operation began: a schedule's waits count from it.
    host_base: u64,
    /// The slot size (elements) when the operation runs on the other halves of the slots from
    /// the ones its schedule names (`ccl_algos::host::swap_half`).
    host_swap: Option<usize>,
    /// Whether this rank has told the host which operation it is in.
    announced: bool,
    /// When this rank entered the operation (microseconds since the epoch).
    entry_us: u64,
    st: &'r mut ExecState,
    sched: &'r Schedule,
    bufs: Buffers<'b>,
    registered: Registered<'b>,
    dtype: DataType,
    op: ReduceOp,
    info: OpInfo,
    seq: u64,
    /// Bytes per element.
    elem: usize,
    /// The smallest piece a streamed send hands over while more is coming.
    chunk: usize,
    /// The kernels of local reductions: the host memory's when there is one (they may use
    /// vector units found at run time), the baseline's otherwise.
    kernels: Kernels,
}

impl<'r, 'b> Run<'r, 'b> {
    /// The run of `job` from the operation's start (no post counted, nothing announced), its
    /// plan unused; `host` is the links' host memory, lent to the run.
    fn new(
        comm: &'r Peers,
        links: &'r mut Links,
        host: Option<&'r mut (dyn HostMemory + 'static)>,
        st: &'r mut ExecState,
        job: Job<'r, 'b>,
        entry_us: u64,
    ) -> Run<'r, 'b> {
        let elem = job.dtype.size();
        let kernels = host.as_deref().map_or(Kernels::BASELINE, |h| h.kernels());
        Run {
            comm,
            links,
            host,
            host_base: 0,
            host_swap: st.host_second_half.then_some(job.schedule.host_slot),
            announced: false,
            entry_us,
            st,
            sched: job.schedule,
            bufs: job.buffers,
            registered: job.registered,
            dtype: job.dtype,
            op: job.op,
            info: job.info,
            seq: job.seq,
            elem,
            chunk: comm.config().chunk_size.max(elem),
            kernels,
        }
    }
}

impl Run<'_, '_> {
    /// Where region `r` of the schedule lies in this operation: host regions may be in the other
    /// half of their slot.
    fn at(&self, r: &Region) -> Region {
        match self.host_swap {
            Some(slot) => ccl_algos::host::swap_half(*r, slot),
            None => *r,
        }
    }

    /// The bytes of region `r`, in the caller's buffers, the scratch space or host memory.
    fn region<'x>(
        bufs: &'x Buffers<'_>,
        host: Option<&'x (dyn HostMemory + 'static)>,
        r: &Region,
        elem: usize,
    ) -> Result<&'x [u8]> {
        match r.buf {
            Buf::Host(i) => host_slot(host.ok_or_else(no_host)?, i, r, elem),
            Buf::PeerIn(i) => peer_in(host.ok_or_else(no_host)?, i, r, elem),
            _ => bufs.get(r, elem),
        }
    }

    /// Region `r`, to write: a caller buffer, the scratch space or this rank's host slot.
    fn region_mut<'x>(
        bufs: &'x mut Buffers<'_>,
        host: Option<&'x mut (dyn HostMemory + 'static)>,
        r: &Region,
        elem: usize,
    ) -> Result<&'x mut [u8]> {
        match r.buf {
            Buf::Host(i) => host_slot_mut(host.ok_or_else(no_host)?, i, r, elem),
            Buf::PeerOut(i) => peer_out(host.ok_or_else(no_host)?, i, r, elem),
            _ => bufs.get_mut(r, elem),
        }
    }

    /// `dst` to write and `src` to read (`None` when there is no `src`), wherever each lies.
    fn operands<'x>(
        bufs: &'x mut Buffers<'_>,
        host: Option<&'x mut (dyn HostMemory + 'static)>,
        dst: &Region,
        src: Option<&Region>,
        elem: usize,
    ) -> Result<(&'x mut [u8], Option<&'x [u8]>)> {
        let Some(src) = src else {
            return Ok((Self::region_mut(bufs, host, dst, elem)?, None));
        };
        match (dst.buf, src.buf) {
            (Buf::Host(d), Buf::Host(s)) if d != s => {
                let h = host.ok_or_else(no_host)?;
                if d as usize != h.me() || s as usize >= h.ranks().len() {
                    return Err(Error::internal(format!(
                        "host operands {dst:?} {src:?} for host rank {}",
                        h.me()
                    )));
                }
                let (mine, theirs) = h.slot_pair(s as usize);
                Ok((
                    mine.get_mut(Buffers::range(dst, elem))
                        .ok_or_else(|| outside(dst))?,
                    Some(
                        theirs
                            .get(Buffers::range(src, elem))
                            .ok_or_else(|| outside(src))?,
                    ),
                ))
            }
            (Buf::Host(_), Buf::Host(_)) => Err(Error::internal(
                "a local op within one host slot is not supported",
            )),
            (Buf::Host(d), _) => {
                let s = bufs.get(src, elem)?;
                Ok((
                    host_slot_mut(host.ok_or_else(no_host)?, d, dst, elem)?,
                    Some(s),
                ))
            }
            (_, Buf::Host(s)) => {
                let sl = host_slot(host.ok_or_else(no_host)?, s, src, elem)?;
                Ok((bufs.get_mut(dst, elem)?, Some(sl)))
            }
            (Buf::PeerOut(d), _) => {
                let s = bufs.get(src, elem)?;
                Ok((peer_out(host.ok_or_else(no_host)?, d, dst, elem)?, Some(s)))
            }
            (_, Buf::PeerIn(s)) => {
                let sl = peer_in(host.ok_or_else(no_host)?, s, src, elem)?;
                Ok((bufs.get_mut(dst, elem)?, Some(sl)))
            }
            _ => bufs.pair(dst, src, elem),
        }
    }

    /// Bytes of op `id`.
    fn len(&self, id: OpId) -> usize {
        self.st.len(self.sched, id)
    }

    fn complete(&self, id: OpId) -> bool {
        self.st.complete(self.sched, id)
    }

    fn deps_done(&self, id: OpId) -> bool {
        self.st.deps_done(self.sched, id)
    }

    /// How far the data of send or receive `id` is ready: 0 before its dependencies are done,
    /// then all of it, or as far as the op it streams from has come.
    fn ready(&self, id: OpId) -> usize {
        if !self.deps_done(id) {
            return 0;
        }
        let len = self.len(id);
        match self.sched.ops[id].stream_from {
            Some(from) => self.st.done[from].min(len),
            None => len,
        }
    }

    /// How much of send `id` may go now: `Some(end)` to hand bytes `done..end` to the transport,
    /// `None` to wait. A streamed send waits until a whole chunk is ready (or its last piece), so
    /// the pipeline does not degrade into tiny writes.
    fn send_now(&self, id: OpId) -> Option<usize> {
        let ready = self.ready(id);
        let pending = ready.saturating_sub(self.st.done[id]);
        (pending > 0 && (ready == self.len(id) || pending >= self.chunk)).then_some(ready)
    }

    /// Whether receive `id` may take bytes now: `Some(end)` to take bytes up to `end`, `None` to
    /// wait. A receive that streams from a producer (a second child's data reduced behind the
    /// first's) may go only as far as the producer has.
    fn receive_now(&self, id: OpId) -> Option<usize> {
        let ready = self.ready(id);
        (ready > self.st.done[id]).then_some(ready)
    }

    /// What this rank waits for from peer queue `pi`: by the same rules as the pass that moves.
    fn interest(&self, pi: usize) -> Interest {
        let q = &self.st.peers[pi];
        let ready = |dir| {
            self.head(pi, dir)
                .is_some_and(|id| self.may_move(id, dir).is_some())
        };
        Interest {
            send: q.header_out_pending() || ready(Dir::Send),
            recv: q.header_in_pending() || ready(Dir::Recv),
        }
    }

    /// Marks `k` more bytes of op `id` done; returns whether that completed it.
    fn advance(&mut self, id: OpId, k: usize) -> bool {
        self.st.done[id] += k;
        let complete = self.complete(id);
        if complete {
            self.st.ops_left -= 1;
        }
        complete
    }

    fn header(&self, channel_seq: u64, bytes: usize) -> Header {
        header_of(
            &self.info,
            self.dtype,
            self.op,
            channel_seq,
            bytes,
            self.st.entry_us,
        )
    }

    /// Adds what this run was doing to `e`, and what the job monitor knows of its cause.
    fn fail(&self, e: Error) -> Error {
        fail_op(self.comm, &self.info, self.seq, self.sched, e)
    }

    /// Runs the schedule to completion (or error).
    fn drive(&mut self) -> Result<()> {
        if self.sched.peers.is_empty() && self.comm.config().fault_stall != Some(self.seq) {
            return self.drive_local();
        }
        // Zero-length ops count as complete from the start (0 of 0 bytes done).
        self.st
            .reset(self.sched, self.elem, self.comm.size(), self.entry_us);
        if self.sched.uses_host() {
            let h = self.host.as_deref().ok_or_else(no_host)?;
            self.host_base = h.posted(h.me());
        }
        self.queue_headers().map_err(|e| self.fail(e))?;
        let mut idle = Idle::default();
        let stall = self.comm.config().fault_stall == Some(self.seq);
        while !self.st.finished() {
            self.comm.check_aborted()?;
            if stall && self.st.headers_left == 0 {
                return self.stall().map_err(|e| self.fail(e));
            }
            if self.pass().map_err(|e| self.fail(e))? {
                idle.moved();
                self.st.end_idle();
            } else {
                let (since, idle) = idle.tick();
                self.idle(since, idle).map_err(|e| self.fail(e))?;
            }
        }
        Ok(())
    }

    /// [`drive`](Run::drive) for a schedule without peers (one in host memory, or a local
    /// copy): its local ops one after the other, waiting only where a wait in host memory has
    /// not come true. The same ops and the same waiting as a pass would do, without the per-peer
    /// queues, headers and per-op bookkeeping a pass goes through, which cost a small
    /// operation in host memory more than its data.
    fn drive_local(&mut self) -> Result<()> {
        self.st.reset_local(self.sched, self.elem, self.entry_us);
        if self.sched.uses_host() {
            let h = self.host.as_deref().ok_or_else(no_host)?;
            self.host_base = h.posted(h.me());
        }
        let sched = self.sched;
        let mut k = 0;
        while let Some(&id) = sched.locals.get(k) {
            self.st.next_local = k;
            // Ops run in order, so an op's dependencies (earlier local ops) are done.
            if matches!(sched.ops[id].action, Action::WaitPosts { .. }) {
                self.await_posts(id, k)?;
            }
            if let Some(next) = self.run_fused(k).map_err(|e| self.fail(e))? {
                self.st.done[id] = self.len(id);
                self.st.done[next] = self.len(next);
                k += 2;
                continue;
            }
            self.run_local(id).map_err(|e| self.fail(e))?;
            self.st.done[id] = self.len(id);
            k += 1;
        }
        self.st.next_local = sched.locals.len();
        Ok(())
    }

    /// Local ops `k` and `k + 1` as one pass when they are a copy out of host memory and a
    /// reduction of another host region into that copy (how a one-shot allreduce reads the
    /// slots): `dst = a (op) b` reads each input once, in one vectorized loop, where the copy
    /// and then the reduction read the output twice. Measured on this 2-core machine with the
    /// same protocol in C (`scripts/peers/host_floor.c`), 2 KiB of f32 from the other CPU's
    /// cache: 0.64-0.70 us per operation as a copy then a reduction, 0.57-0.67 as one pass.
    /// Returns op `k + 1` when it ran both; the bytes are those of the two ops (`a` first
    /// unless the reduction puts its source first).
    fn run_fused(&mut self, k: usize) -> Result<Option<OpId>> {
        let sched = self.sched;
        let (Some(&first), Some(&next)) = (sched.locals.get(k), sched.locals.get(k + 1)) else {
            return Ok(None);
        };
        let (
            Action::Copy { src: a, dst },
            Action::Reduce {
                dst: into,
                src: b,
                src_first,
            },
        ) = (sched.ops[first].action, sched.ops[next].action)
        else {
            return Ok(None);
        };
        let (Buf::Host(ia), Buf::Host(ib)) = (a.buf, b.buf) else {
            return Ok(None);
        };
        if into != dst || matches!(dst.buf, Buf::Host(_) | Buf::Send) || dst.len == 0 {
            return Ok(None);
        }
        let (a, b, dst, elem) = (self.at(&a), self.at(&b), self.at(&dst), self.elem);
        let host = self.host.as_deref().ok_or_else(no_host)?;
        let (a, b) = (
            host_slot(host, ia, &a, elem)?,
            host_slot(host, ib, &b, elem)?,
        );
        let d = self.bufs.get_mut(&dst, elem)?;
        let (x, y) = if src_first { (b, a) } else { (a, b) };
        (self.kernels.into)(self.dtype, self.op, d, x, y);
        Ok(Some(next))
    }

    /// `CCL_FAULT_STALL`: once every header went out and came in (the peers see this rank
    /// inside, it sees them), moves nothing more, as a rank deadlocked inside ccl would, while the monitor thread
    /// answers; ends when the job fails (a notice or an abort) or after twice the timeout.
    fn stall(&mut self) -> Result<()> {
        let timeout = self.comm.config().timeout;
        let until = Instant::now() + 2 * timeout;
        self.st.idle_since = Some((Instant::now(), None));
        self.st.sync_trace(self.comm, self.sched, None);
        ccl_core::ccl_warn!(
            Some(self.comm.rank()),
            "CCL_FAULT_STALL: operation #{} stops moving here on purpose",
            self.seq
        );
        while Instant::now() < until {
            self.comm
                .block(self.links, &[], None, Duration::from_millis(100), || {})?;
        }
        Err(Error::timeout(format!(
            "stalled on purpose (CCL_FAULT_STALL=op:{}) for {:.1} s and nothing failed the job",
            self.seq,
            (2 * timeout).as_secs_f64()
        )))
    }

    /// Offers every queue head what it may do now; returns whether anything moved.
    fn pass(&mut self) -> Result<bool> {
        let mut moved = self.run_locals()?;
        for pi in 0..self.sched.peers.len() {
            moved |= self.send_header(pi)?;
            moved |= self.move_data(pi, Dir::Send)?;
            moved |= self.receive_header(pi)?;
            moved |= self.move_data(pi, Dir::Recv)?;
        }
        Ok(moved)
    }

    /// Queues the header for every peer this rank sends to, with a small first message riding
    /// along, and notes which peers' headers to expect.
    fn queue_headers(&mut self) -> Result<()> {
        for (pi, p) in self.sched.peers.iter().enumerate() {
            let bytes = p.send_elems * self.elem;
            if bytes > 0 || (self.sched.handshake && !p.sends.is_empty()) {
                let h = self.header(self.st.headers_to[p.peer], bytes);
                self.st.headers_to[p.peer] += 1;
                self.st.headers_left += 1;
                let first = &self.sched.ops[p.sends[0]];
                let len = first.action.len() * self.elem;
                let out = &mut self.st.peers[pi].header_out;
                out.extend_from_slice(&h.encode());
                // Data that no earlier op writes is final now and may go with the header.
                if first.deps.is_empty()
                    && first.stream_from.is_none()
                    && len <= COALESCE
                    && let Action::Send { src, .. } = first.action
                {
                    let src = self.at(&src);
                    let out = &mut self.st.peers[pi].header_out;
                    out.extend_from_slice(Self::region(
                        &self.bufs,
                        self.host.as_deref(),
                        &src,
                        self.elem,
                    )?);
                    self.st.peers[pi].carried = len;
                }
            }
            if p.recv_elems * self.elem > 0 || (self.sched.handshake && !p.recvs.is_empty()) {
                self.st.peers[pi].expects_header = true;
                self.st.headers_left += 1;
            }
        }
        Ok(())
    }

    /// Runs local ops whole, in order, once their dependencies are done.
    fn run_locals(&mut self) -> Result<bool> {
        let mut moved = false;
        while let Some(&id) = self.sched.locals.get(self.st.next_local) {
            if !self.deps_done(id) || self.host_wait_pending(id)?.is_some() {
                break;
            }
            self.run_local(id)?;
            let len = self.len(id);
            if len > 0 {
                self.advance(id, len);
            }
            self.st.next_local += 1;
            moved = true;
        }
        Ok(moved)
    }

    fn run_local(&mut self, id: OpId) -> Result<()> {
        let (dtype, op, elem) = (self.dtype, self.op, self.elem);
        match self.sched.ops[id].action {
            Action::Copy { src, dst } => {
                let (src, dst) = (self.at(&src), self.at(&dst));
                let (d, s) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    Some(&src),
                    elem,
                )?;
                if let Some(s) = s {
                    d.copy_from_slice(s);
                }
            }
            Action::Reduce {
                dst,
                src,
                src_first,
            } => {
                let (src, dst) = (self.at(&src), self.at(&dst));
                let (d, s) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    Some(&src),
                    elem,
                )?;
                let s = s.ok_or_else(|| Error::internal("local reduce of a region with itself"))?;
                (self.kernels.inplace)(dtype, op, d, s, order(src_first));
            }
            Action::ReduceInto { dst, a, b } => {
                let (dst, a, b) = (self.at(&dst), self.at(&a), self.at(&b));
                // The first operand and the destination are this rank's; the second may lie in
                // host memory or another rank's buffer.
                let (d, x) = self.bufs.pair(&dst, &a, elem)?;
                let x = x.ok_or_else(|| Error::internal("reduce into an operand"))?;
                let h = self.host.as_deref().ok_or_else(no_host);
                let y = match b.buf {
                    Buf::Host(i) => host_slot(h?, i, &b, elem)?,
                    Buf::PeerIn(i) => peer_in(h?, i, &b, elem)?,
                    _ => {
                        return Err(Error::internal(
                            "the second operand of a reduce-into lies outside host memory",
                        ));
                    }
                };
                (self.kernels.into)(dtype, op, d, x, y);
            }
            Action::FinishAvg { region } => {
                if op == ReduceOp::Avg {
                    let region = self.at(&region);
                    let world = self.comm.size();
                    let d =
                        Self::region_mut(&mut self.bufs, self.host.as_deref_mut(), &region, elem)?;
                    reduce::finish_avg(dtype, d, world);
                }
            }
            Action::Post => {
                let desc = self.host_desc();
                let h = self.host.as_deref().ok_or_else(no_host)?;
                // Before the first post, so that a rank that sees it sees this operation (and
                // no rank can be in the next one before this rank's last post).
                if !self.announced {
                    if self.sched.direct {
                        let out: &[u8] = self.bufs.recv;
                        h.announce_buffers(self.st.host_ops, self.bufs.send.unwrap_or(out), out)?;
                    }
                    h.announce(self.st.host_ops, desc);
                    self.announced = true;
                }
                h.post();
                // With peers, the rank may go on moving data over its connections for long
                // before it waits or ends: wake the host's sleepers now. Without (a small
                // operation in host memory), the wake waits for the next wait or the end.
                if !self.sched.peers.is_empty() {
                    h.wake();
                }
            }
            Action::WaitPosts { count } => {
                // At the entry wait (0) the others may still be in the previous operation.
                if count > 0 {
                    self.check_host_calls(self.host_desc())?;
                }
            }
            Action::Send { .. } | Action::Recv { .. } => {
                unreachable!("local queue holds local ops")
            }
        }
        Ok(())
    }

    /// For local op `id`: when it is a wait in host memory that the host's ranks have not all
    /// reached, the post count it waits for.
    fn host_wait_pending(&self, id: OpId) -> Result<Option<u64>> {
        let Action::WaitPosts { count } = self.sched.ops[id].action else {
            return Ok(None);
        };
        let h = self.host.as_deref().ok_or_else(no_host)?;
        let target = self.host_base + u64::from(count);
        Ok((!h.all_posted(target)).then_some(target))
    }

    /// The host rank that has not yet posted `target` times, as a communicator rank.
    fn host_laggard(&self, target: u64) -> Option<usize> {
        let h = self.host.as_deref()?;
        (0..h.ranks().len())
            .find(|&i| h.posted(i) < target)
            .map(|i| h.ranks()[i])
    }

    /// This operation's fingerprint in host memory.
    fn host_desc(&self) -> u64 {
        host_desc(self.header(0, 0), self.sched.direct)
    }

    /// Every other rank of the host must be in the same call as this one.
    fn check_host_calls(&self, desc: u64) -> Result<()> {
        let h = self.host.as_deref().ok_or_else(no_host)?;
        check_host_calls(h, self.st.host_ops, desc, self.sched.direct, || {
            self.header(0, 0)
        })
    }

    /// Local op `id`, the `k`th, a wait in host memory: waits until every host rank has posted
    /// as often, waking first the ranks that may sleep waiting for this rank's posts (a post
    /// wakes nobody, `HostMemory::post`). When nobody has to be waited for, only the ranks seen
    /// asleep are woken: the fenced wake comes when the operation ends.
    fn await_posts(&mut self, id: OpId, k: usize) -> Result<()> {
        let h = self.host.as_deref().ok_or_else(no_host)?;
        if self
            .host_wait_pending(id)
            .map_err(|e| self.fail(e))?
            .is_none()
        {
            h.wake_seen();
            return Ok(());
        }
        h.wake();
        self.st.next_local = k;
        self.wait_host(id)
    }

    /// Waits until local op `id`, a wait in host memory, may run: spinning, then sleeping, as a
    /// pass that moves nothing would. Out of line: a small operation whose peers are there
    /// already never comes here.
    #[inline(never)]
    fn wait_host(&mut self, id: OpId) -> Result<()> {
        let mut idle = Idle::default();
        while self
            .host_wait_pending(id)
            .map_err(|e| self.fail(e))?
            .is_some()
        {
            self.comm.check_aborted()?;
            let (since, idle) = idle.tick();
            self.idle(since, idle).map_err(|e| self.fail(e))?;
        }
        self.st.end_idle();
        Ok(())
    }

    /// The post count this rank waits for in host memory, if the next local op is such a wait.
    fn host_wait(&self) -> Option<u64> {
        let &id = self.sched.locals.get(self.st.next_local)?;
        if !self.deps_done(id) {
            return None;
        }
        self.host_wait_pending(id).ok().flatten()
    }

    /// Sends what is left of the header to peer queue `pi`; once it is all gone, the first
    /// send's bytes that rode along count as done.
    fn send_header(&mut self, pi: usize) -> Result<bool> {
        if !self.st.peers[pi].header_out_pending() {
            return Ok(false);
        }
        let peer = self.sched.peers[pi].peer;
        let q = &mut self.st.peers[pi];
        let ep = self.links.get(peer)?;
        let k = ep
            .send(&q.header_out[q.header_out_sent..])
            .map_err(|e| e.context(format!("sending the operation header to peer {peer}")))?;
        q.header_out_sent += k;
        if !q.header_out_pending() {
            self.st.headers_left -= 1;
            let carried = q.carried;
            if carried > 0 {
                self.advance(self.sched.peers[pi].sends[0], carried);
            }
        }
        Ok(k > 0)
    }

    /// Moves as much of peer queue `pi`'s sends (or receives) as may go now, in wire order.
    fn move_data(&mut self, pi: usize, dir: Dir) -> Result<bool> {
        let mut moved = false;
        while let Some(id) = self.head(pi, dir) {
            if !self.complete(id) {
                let Some(end) = self.may_move(id, dir) else {
                    break;
                };
                let k = self.transfer(id, pi, dir, end)?;
                if k == 0 {
                    break;
                }
                moved = true;
                if !self.advance(id, k) {
                    break;
                }
            }
            let q = &mut self.st.peers[pi];
            match dir {
                Dir::Send => q.next_send += 1,
                Dir::Recv => q.next_recv += 1,
            }
        }
        Ok(moved)
    }

    /// The op at the head of peer queue `pi`'s sends (or receives); `None` when the queue is
    /// empty, or while the operation header in that direction has not gone (or arrived).
    fn head(&self, pi: usize, dir: Dir) -> Option<OpId> {
        let (p, q) = (&self.sched.peers[pi], &self.st.peers[pi]);
        match dir {
            Dir::Send if !q.header_out_pending() => p.sends.get(q.next_send).copied(),
            Dir::Recv if !q.header_in_pending() => p.recvs.get(q.next_recv).copied(),
            _ => None,
        }
    }

    /// The rule for `dir`: `send_now` or `receive_now`.
    fn may_move(&self, id: OpId, dir: Dir) -> Option<usize> {
        match dir {
            Dir::Send => self.send_now(id),
            Dir::Recv => self.receive_now(id),
        }
    }

    /// Sends (or receives) bytes `done..end` of op `id` to (or from) the peer of queue `pi`;
    /// returns how many the transport took (or had).
    fn transfer(&mut self, id: OpId, pi: usize, dir: Dir, end: usize) -> Result<usize> {
        let peer = self.sched.peers[pi].peer;
        let step = self.sched.ops[id].step;
        match dir {
            Dir::Send => {
                let Action::Send { src, .. } = self.sched.ops[id].action else {
                    unreachable!("send queue holds sends")
                };
                let done = self.st.done[id];
                let src = self.at(&src);
                let data =
                    &Self::region(&self.bufs, self.host.as_deref(), &src, self.elem)?[done..end];
                let reg = self
                    .registered
                    .region(src.buf, self.comm.peer_transport(peer));
                let ep = self.links.get(peer)?;
                match reg {
                    Some(r) => ep.send_registered(data, r),
                    None => ep.send(data),
                }
                .map_err(|e| e.context(format!("sending step {step} to peer {peer}")))
            }
            Dir::Recv => self
                .receive_into(id, peer, end)
                .map_err(|e| e.context(format!("receiving step {step} from peer {peer}"))),
        }
    }

    /// Takes what has arrived of the header from peer queue `pi`, and checks it once whole:
    /// the peer's header is checked before any of its data is taken.
    fn receive_header(&mut self, pi: usize) -> Result<bool> {
        if !self.st.peers[pi].header_in_pending() {
            return Ok(false);
        }
        let p = &self.sched.peers[pi];
        let peer = p.peer;
        // Reading ahead lets a small first message arrive in the same call; the transport keeps
        // those bytes for the receive that follows.
        let look = p.recvs.first().map_or(0, |&id| self.len(id)).min(LOOKAHEAD);
        let q = &mut self.st.peers[pi];
        let got = q.header_in_got;
        let want = HEADER_LEN - got;
        let into = &mut q.header_in;
        // A transport may lend the bytes in several pieces (a message-based one hands out one
        // slot at a time): take only what the header still lacks.
        let mut taken = 0;
        let k = self
            .links
            .get(peer)?
            .recv_with(want + look, &mut |b: &[u8]| {
                let t = b.len().min(want - taken);
                into[got + taken..got + taken + t].copy_from_slice(&b[..t]);
                taken += t;
                t
            })
            .map_err(|e| e.context(format!("receiving the operation header from peer {peer}")))?;
        q.header_in_got += k;
        if !q.header_in_pending() {
            self.st.headers_left -= 1;
            self.check_header(pi)?;
        }
        Ok(k > 0)
    }

    /// Compares the header that arrived from peer queue `pi` with what this rank expects.
    fn check_header(&mut self, pi: usize) -> Result<()> {
        let p = &self.sched.peers[pi];
        let mismatch = |m: HeaderError| {
            Error::invalid_usage(format!("with peer {}: {m}", p.peer)).peer(p.peer)
        };
        let theirs = Header::decode(&self.st.peers[pi].header_in).map_err(mismatch)?;
        let mine = self.header(self.st.headers_from[p.peer], p.recv_elems * self.elem);
        self.st.headers_from[p.peer] += 1;
        Header::check(&mine, &theirs).map_err(mismatch)?;
        self.st.peers[pi].late_us = Some(theirs.entry_us as i64 - self.st.entry_us as i64);
        Ok(())
    }

    /// Receives bytes `done..end` of receive `id` from `peer`, copying them into place or
    /// reducing them straight from the transport's buffer; returns how many arrived.
    fn receive_into(&mut self, id: OpId, peer: usize, end: usize) -> Result<usize> {
        let Action::Recv { dst, combine, .. } = self.sched.ops[id].action else {
            unreachable!("receive queue holds receives")
        };
        let dst = self.at(&dst);
        let combine = match combine {
            Combine::Reduce {
                with: Some(w),
                incoming_first,
                finish_avg,
            } => Combine::Reduce {
                with: Some(self.at(&w)),
                incoming_first,
                finish_avg,
            },
            c => c,
        };
        let (dtype, op, elem, world) = (self.dtype, self.op, self.elem, self.comm.size());
        let done = self.st.done[id];
        let registered = self.registered;
        let reg = registered.region(dst.buf, self.comm.peer_transport(peer));
        let ep = self.links.get(peer)?;
        match combine {
            Combine::Copy => {
                let d = Self::region_mut(&mut self.bufs, self.host.as_deref_mut(), &dst, elem)?;
                // Into registered memory the peer may write directly (`recv_registered`); the
                // op keeps `d[done..]` borrowed until its bytes are in, as that asks.
                match reg {
                    Some(r) => ep.recv_registered(&mut d[done..end], r),
                    None => ep.recv(&mut d[done..end]),
                }
            }
            Combine::Reduce {
                with,
                incoming_first,
                finish_avg,
            } => {
                let (d, w) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    with.as_ref(),
                    elem,
                )?;
                let mut off = done;
                ep.recv_with(end - done, &mut |incoming: &[u8]| {
                    // Whole elements only; a partial one is offered again once complete.
                    let k = incoming.len() / elem * elem;
                    if k == 0 {
                        return 0;
                    }
                    let out = &mut d[off..off + k];
                    let incoming = &incoming[..k];
                    match w {
                        None => {
                            reduce::reduce_inplace(dtype, op, out, incoming, order(incoming_first))
                        }
                        Some(w) if incoming_first => {
                            reduce::reduce_into(dtype, op, out, incoming, &w[off..off + k])
                        }
                        Some(w) => reduce::reduce_into(dtype, op, out, &w[off..off + k], incoming),
                    }
                    if finish_avg {
                        reduce::finish_avg(dtype, out, world);
                    }
                    off += k;
                    k
                })
            }
        }
    }

    /// Nothing moved in the last pass, `idle` since the last progress: fail past the deadline,
    /// else spin (retry at once) or let the communicator wait for what this rank waits for.
    fn idle(&mut self, since: Instant, idle: Duration) -> Result<()> {
        if self.st.idle_since.is_none() {
            // About to wait: the ranks waiting for this one's posts must see them first.
            if self.sched.uses_host()
                && let Some(h) = self.host.as_deref()
            {
                h.wake();
            }
            let waited = self
                .st
                .first_waited_peer(self.sched)
                .and_then(|p| self.sched.peers.iter().position(|q| q.peer == p));
            self.st.idle_since = Some((since, waited));
        }
        let timeout = self.comm.config().timeout;
        if idle >= timeout {
            let mut e = Error::timeout(format!(
                "no progress for {:.1} s; {}",
                idle.as_secs_f64(),
                self.describe_pending()
            ));
            // The peer whose data we wait for is the one to look at first.
            if let Some(p) = self
                .st
                .first_waited_peer(self.sched)
                .or_else(|| self.host_laggard(self.host_wait()?))
            {
                e = e.peer(p);
            }
            return Err(e);
        }
        if idle < self.comm.spin_window() {
            // With a CPU per rank, plain busy-polling (see `crate::peers::wait` for why it
            // does not yield). With more ranks than CPUs, the rank awaited may need this very
            // CPU: polling between yields hands it over at once, where sleeping would cost a
            // wake-up per step (4 ranks on 2 CPUs: 60-100 us per 8 B allreduce).
            if shares_cpus(self.comm, self.st) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if self.crossed_calls()? {
            return Ok(());
        }
        let mut waits = std::mem::take(&mut self.st.waits);
        waits.clear();
        waits.extend(
            (0..self.sched.peers.len())
                .map(|pi| (self.sched.peers[pi].peer, self.interest(pi)))
                .filter(|(_, i)| i.send || i.recv),
        );
        let host = self
            .host_wait()
            .and_then(|c| self.host.as_deref().map(|h| (h as &dyn HostMemory, c)));
        // Waiting in host memory, also watch the connections of the ranks not there yet: a
        // death (or a crossed call, see `crossed_calls`) shows there first.
        if let Some((h, target)) = host {
            waits.extend(
                (0..h.ranks().len())
                    .filter(|&i| i != h.me() && h.posted(i) < target)
                    .map(|i| {
                        let recv = Interest {
                            send: false,
                            recv: true,
                        };
                        (h.ranks()[i], recv)
                    }),
            );
        }
        self.st.waits = waits;
        let (comm, sched, st) = (self.comm, self.sched, &*self.st);
        // About to sleep: this is when a dump (or a hang) needs the recorder current.
        comm.block(self.links, &st.waits, host, timeout - idle, || {
            st.sync_trace(comm, sched, st.first_waited_peer(sched))
        })
    }

    /// Where the ranks of a host meet both in host memory and over connections, a rank in one
    /// kind of operation would wait for a peer in the other until the deadline: fail at once
    /// instead, describing both calls. Sound because every connection of a host-memory
    /// communicator is in the same memory: a peer publishes its bytes before it posts.
    /// Returns whether something arrived after all (the caller retries).
    fn crossed_calls(&mut self) -> Result<bool> {
        let Some(me) = self.host.as_deref().map(|h| h.me()) else {
            return Ok(false);
        };
        let mine = self.header(0, 0);
        let crossed = |peer: usize, theirs: String| {
            Error::invalid_usage(format!(
                "with peer {peer}: mismatched calls: this rank called {}, the peer called {theirs}",
                mine.describe()
            ))
            .peer(peer)
        };
        if let Some(target) = self.host_wait() {
            // In host memory, waiting for posts: a peer that instead sends over its connection
            // is in another operation (this rank has taken everything earlier ones sent).
            for (i, &peer) in self.host_ranks().iter().enumerate() {
                if i == me || self.host.as_deref().is_some_and(|h| h.posted(i) >= target) {
                    continue;
                }
                let mut head = [0u8; HEADER_LEN];
                let mut got = 0;
                self.links.get(peer)?.recv_with(HEADER_LEN, &mut |b| {
                    got = b.len().min(HEADER_LEN);
                    head[..got].copy_from_slice(&b[..got]);
                    0
                })?;
                if got > 0 {
                    let theirs = match Header::decode(&head) {
                        Ok(h) if got == HEADER_LEN => h.describe(),
                        _ => "an operation over its connection".to_string(),
                    };
                    return Err(crossed(peer, theirs));
                }
            }
            return Ok(false);
        }
        // Over connections, waiting for a peer's operation header: a peer that has posted in
        // host memory more often than this rank is in a later operation there, having skipped
        // this one (it would have sent the header before posting).
        for pi in 0..self.sched.peers.len() {
            if !self.st.peers[pi].header_in_pending() {
                continue;
            }
            let peer = self.sched.peers[pi].peer;
            let Some(i) = self.host_ranks().iter().position(|&r| r == peer) else {
                continue;
            };
            let h = self.host.as_deref().ok_or_else(no_host)?;
            if h.posted(i) <= h.posted(me) {
                continue;
            }
            // Its next operation there is this rank's next one too.
            let theirs = Header::from_host_desc(h.desc(i, self.st.host_ops), Algo::Shm.id());
            if self.receive_header(pi)? {
                return Ok(true);
            }
            return Err(crossed(peer, theirs.describe()));
        }
        Ok(false)
    }

    /// Communicator rank of each host index (empty without host memory).
    fn host_ranks(&self) -> Vec<usize> {
        self.host
            .as_deref()
            .map_or_else(Vec::new, |h| h.ranks().to_vec())
    }

    /// What each peer queue is waiting for, for timeout messages.
    fn describe_pending(&self) -> String {
        let mut out = String::new();
        for (p, q) in self.sched.peers.iter().zip(&self.st.peers) {
            let peer = p.peer;
            if q.header_in_pending() {
                let _ = write!(
                    out,
                    "waiting to receive from peer {peer} (its operation header: {} of {HEADER_LEN} bytes arrived; has it made this call?); ",
                    q.header_in_got
                );
                continue;
            }
            if q.header_out_pending() {
                let _ = write!(
                    out,
                    "sending to peer {peer} blocked (the operation header; is peer {peer} reading?); "
                );
            }
            if let Some(&id) = p.recvs.get(q.next_recv) {
                let _ = write!(
                    out,
                    "waiting to receive from peer {peer} (step {}: {} of {} bytes arrived); ",
                    self.sched.ops[id].step,
                    self.st.done[id],
                    self.len(id)
                );
            }
            if let Some(&id) = p.sends.get(q.next_send)
                && self.ready(id) > self.st.done[id]
            {
                let _ = write!(
                    out,
                    "sending to peer {peer} blocked (step {}: {} of {} bytes taken; is peer {peer} reading?); ",
                    self.sched.ops[id].step,
                    self.st.done[id],
                    self.len(id)
                );
            }
        }
        if let (Some(target), Some(h)) = (self.host_wait(), self.host.as_deref()) {
            let behind: Vec<String> = (0..h.ranks().len())
                .filter(|&i| h.posted(i) < target)
                .map(|i| h.ranks()[i].to_string())
                .collect();
            let _ = write!(
                out,
                "waiting in shared memory for rank(s) {} (post {} of this operation; has it made this call?); ",
                behind.join(", "),
                target - self.host_base
            );
        }
        if out.is_empty() {
            out.push_str("no transfer pending (schedule stalled)");
        }
        out.trim_end_matches("; ").to_string()
    }
}

/// The direction of a peer queue: this rank's sends to the peer, or its receives from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}

/// The operand order of a reduction: the other operand first, or the accumulator first.
fn order(other_first: bool) -> Order {
    if other_first {
        Order::SrcFirst
    } else {
        Order::AccFirst
    }
}
