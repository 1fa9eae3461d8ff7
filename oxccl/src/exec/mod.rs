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

/// Operations log as `coll`.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Coll;

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::peers::{Links, Peers};
use ccl_core::reduce::{self, Kernels, Order};
use ccl_core::transport::{HostMemory, Interest, MemRegion};
use ccl_core::{DataType, Error, ReduceOp, Result};
use ccl_diag::recorder::{self as trace, Begin};

use ccl_algos::algo::{Algo, Collective};
use ccl_algos::local::LocalPlan;
use ccl_algos::schedule::{Action, Buf, Combine, OpId, Region, Schedule};
use header::{HEADER_LEN, Header, HeaderError, KIND_P2P};

// The executor is one type spread over files by concern (as tokio spreads its worker):
// the types are here, each file holds the methods of one concern.
mod buffers;
mod data;
mod header;
mod host;
mod op;
mod pass;
mod plan;
mod probe;
mod stall;
mod state;

pub(crate) use op::op_record;
pub(crate) use plan::{PlanJob, run_plan};
pub use probe::Probed;
pub(crate) use probe::probe;

use buffers::outside;
use data::{header_of, order};
use host::{
    check_host_calls, host_desc, host_slot, host_slot_mut, no_host, peer_in, peer_out, unlike,
};
use op::{abandon_op, begin_op, end_op, fail_op, shares_cpus};

/// The buffers a schedule works on, as bytes.
#[derive(Debug)]
pub(crate) struct Buffers<'a> {
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
pub(crate) struct Registered<'a> {
    pub send: &'a [Box<dyn MemRegion>],
    pub recv: &'a [Box<dyn MemRegion>],
}

/// A caller buffer of a point-to-point group: sent from, or received into.
#[derive(Debug)]
pub(crate) enum ExtraBuf<'a> {
    Src(&'a [u8]),
    Dst(&'a mut [u8]),
}

/// What an operation is, as its header tells each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// A collective run by one algorithm.
    Collective { coll: Collective, algo: Algo },
    /// A group of sends and receives.
    PointToPoint,
}

/// Describes the running operation: in error messages, the flight recorder, and the header each
/// peer checks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpInfo {
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
    pub(crate) fn name(&self) -> &'static str {
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
pub(crate) struct Job<'s, 'b> {
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

/// Reusable executor state.
#[derive(Debug, Default)]
pub(crate) struct ExecState {
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
    /// Peers' headers read ahead by a receive from any source (`probe`), for the operations
    /// they open.
    early: Vec<probe::Early>,
}

/// Runs `job` to completion (or error), recording it in the communicator's flight recorder.
pub(crate) fn run(
    comm: &Peers,
    links: &mut Links,
    state: &mut ExecState,
    job: Job<'_, '_>,
) -> Result<()> {
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
    // Connections on demand: the first operation over a pair makes it.
    // A connection that fails (its peer died, say) fails the operation like any other error
    // of it: named, and with the job monitor's verdict on the cause.
    if let Err(e) = comm.ensure_connected(links, sched.peers.iter().map(|p| p.peer)) {
        let e = fail_op(comm, &job.info, job.seq, sched, e);
        abandon_op(comm, &e);
        return Err(e);
    }
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

/// How long a run has moved nothing. The clock is read only once idle: a small operation that
/// never waits reads it not at all, and a waiting one every [`Idle::CLOCK_EVERY`] idle passes,
/// so it notices the peer's data sooner.
#[derive(Default)]
struct Idle {
    from: Option<Instant>,
    passes: u32,
    idle: Duration,
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
    /// The kernels of reductions: the host memory's when there is one and the CPU's widest when
    /// every rank is on this host (both may use vector units found at run time), the
    /// baseline's otherwise.
    kernels: Kernels,
}

/// The direction of a peer queue: this rank's sends to the peer, or its receives from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Send,
    Recv,
}
