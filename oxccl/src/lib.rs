//! # ccl: collective communication for training programs
//!
//! Allreduce, broadcast, reduce, allgather, reduce-scatter, alltoall, gather, scatter, the
//! collectives with a count per rank (allgatherv, reduce-scatterv, alltoallv), barrier and
//! point-to-point sends and receives (also from any source: [`Communicator::recv_any`]) across
//! processes and hosts over RDMA (RoCEv2 verbs),
//! shared memory, TCP, or threads of one process, with NCCL's semantics and a safe Rust API.
//!
//! ## Quick start
//!
//! Every rank creates a [`Communicator`] from the same [`UniqueId`] (made by one process and
//! passed to the others: through MPI, a file, an environment variable), its rank and the number
//! of ranks; or from launcher variables with [`Communicator::from_env`] (torchrun, mpirun, srun).
//!
//! ```
//! use oxccl::{Communicator, Config, ReduceOp, UniqueId};
//! # fn main() -> oxccl::Result<()> {
//! // Starts the rendezvous root in this process. `UniqueId::new()` listens on the interface named
//! // by CCL_SOCKET_IFNAME (default: the first non-loopback one) for jobs across hosts; this
//! // example keeps everything on one host.
//! let id = UniqueId::new_at([127, 0, 0, 1].into(), &Config::from_env()?)?;
//! let size = 2;
//! let ranks: Vec<_> = (0..size)
//!     .map(|rank| {
//!         let id = id.clone();
//!         std::thread::spawn(move || -> oxccl::Result<Vec<f32>> {
//!             let comm = Communicator::init(&id, rank, size)?;
//!             let mine = vec![rank as f32 + 1.0; 4];
//!             let mut sum = vec![0.0f32; 4];
//!             comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
//!             Ok(sum)
//!         })
//!     })
//!     .collect();
//! for r in ranks {
//!     assert_eq!(r.join().unwrap()?, vec![3.0; 4]);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## What to expect
//! - Every blocking call has a deadline (`CCL_TIMEOUT`, default 600 s without progress); when it
//!   passes, the error names the peer and the transfer that stalled.
//! - Errors are sticky: after a collective fails, the communicator returns that error from every
//!   call. [`Communicator::abort`] (any thread) ends every wait at once.
//! - A rank's death need not end the job: the survivors [`shrink`](Communicator::shrink) the
//!   communicator and go on ([`recover`]: revoke, shrink, grow).
//! - Results are bit-identical on every rank. Collectives must be called in the same order with
//!   matching arguments on every rank, as with NCCL and MPI.
//! - Settings are `CCL_*` environment variables, listed in `docs/env.md`.
//!
//! ## What is inside
//!
//! This crate is the communicator's runtime; the schedules it runs come from `ccl-algos`, the
//! transports from `ccl-core` (TCP, in-process), `ccl-shm` and `ccl-ibverbs`, the rendezvous
//! and the job monitor from `ccl-bootstrap`, the flight recorder from `ccl-diag`. Its modules:
//! `peers` (the transport half: set-up, failure and recovery, dumps, the slow-rank report,
//! waits), `wireup` (which transport each pair of ranks uses, and the connections), `exec` (the
//! executor that runs a schedule over the connections), `engine` (one path for every operation:
//! check, choose the algorithm, fetch or build the schedule, execute), `order` (issue order and
//! the progress thread), `group` (sends and receives, and from any source), `registry` (registered memory),
//! [`recover`] (revoke, shrink, grow) and `split`. `docs/design.md` explains how they fit.
#![forbid(unsafe_code)]

/// Communicator set-up and recovery log as `init`; the executor and the engine as `coll`.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Init;

use std::sync::Arc;

use ccl_algos::overrides::Overrides;
use ccl_bootstrap::Bootstrap;
use ccl_bootstrap::env::Launch;
use ccl_core::ccl_info;
use ccl_core::config::TransportKind;
use ccl_core::transport::Transport;
use ccl_core::transport::local::LocalTransport;
use ccl_core::transport::tcp::TcpTransport;
use peers::Peers;

pub use ccl_algos::algo::{Algo, BufferLens, Collective};
pub use ccl_bootstrap::{UNIQUE_ID_BYTES, UniqueId};
pub use ccl_core::config::Config;
pub use ccl_core::{DataType, Element, Error, ErrorKind, ReduceOp, Result};

mod crossover;
mod engine;
mod exec;
mod group;
mod order;
mod peers;
pub mod recover;
mod registry;
mod split;
mod vcoll;
mod wireup;
/// Page-aligned memory (huge pages when the system has them), as [`Buffer`] uses; for callers
/// that allocate memory to register later (the C ABI's `cclMemAlloc`).
pub use ccl_shm::pages::Pages;
pub use exec::Probed;
pub use group::Group;
pub use order::Request;
pub use peers::InitTimings;
pub use registry::{Buffer, Registration, UnboundRegistration};
pub use vcoll::Counts;

use engine::{Call, Engine};
use order::Order;

/// A group of ranks that run collectives together.
///
/// `Communicator` is `Send + Sync`: share it between threads (for instance so one thread can
/// [`abort`](Communicator::abort) while another is blocked in a collective). Operations run one
/// at a time, in the order they were issued on this rank, blocking or not; every rank must issue
/// the same operations in the same order.
pub struct Communicator {
    engine: Arc<Engine>,
    /// Dropped with the communicator: finishes (or fails at their deadlines) the operations
    /// already issued, then stops the progress thread; the connections close when the last
    /// reference to the engine goes.
    order: Order,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("transport", &self.transport_name())
            .finish_non_exhaustive()
    }
}

/// A collective on typed buffers: NCCL's count from their lengths, then the untyped run.
fn run_typed<T: Element>(
    engine: &Engine,
    coll: Collective,
    send: Option<&[T]>,
    recv: &mut [T],
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let count = coll
        .count_for(send.map(|b| b.len()), recv.len(), engine.size())
        .map_err(|e| Error::invalid_argument(format!("{coll}: {e}")).rank(engine.rank()))?;
    let send = send.map(|b| bytemuck::cast_slice::<T, u8>(b));
    let call = Call {
        coll,
        count,
        dtype: T::DTYPE,
        op,
        root,
    };
    engine.run(call, send, bytemuck::cast_slice_mut(recv))
}

impl Communicator {
    /// Joins the communicator of `id` as `rank` of `size`, with settings from the environment.
    pub fn init(id: &UniqueId, rank: usize, size: usize) -> Result<Communicator> {
        Communicator::init_with_config(id, rank, size, Config::from_env()?)
    }

    /// [`init`](Communicator::init) with explicit settings.
    pub fn init_with_config(
        id: &UniqueId,
        rank: usize,
        size: usize,
        config: Config,
    ) -> Result<Communicator> {
        let b = Bootstrap::connect(id, rank, size, config.timeout)?;
        Communicator::from_bootstrap(b, config)
    }

    /// Joins the job described by launcher variables (torchrun, mpirun, srun, or `CCL_RANK`,
    /// `CCL_WORLD_SIZE` with `CCL_UNIQUE_ID`/`CCL_COMM_ID`/`MASTER_ADDR`); see `docs/bootstrap.md`.
    pub fn from_env() -> Result<Communicator> {
        Communicator::from_env_with_config(Config::from_env()?)
    }

    /// [`from_env`](Communicator::from_env) with explicit settings (the rendezvous still comes
    /// from launcher variables and the `CCL_*` rendezvous fields of `config`).
    pub fn from_env_with_config(config: Config) -> Result<Communicator> {
        let launch = Launch::from_env(&config)?;
        ccl_info!(
            Some(launch.rank),
            "rank {} of {} from {} variables",
            launch.rank,
            launch.size,
            launch.launcher
        );
        let b = launch.bootstrap(&config)?;
        Communicator::from_bootstrap(b, config)
    }

    fn from_bootstrap(b: Bootstrap, config: Config) -> Result<Communicator> {
        let rank = b.rank();
        let shm = ccl_shm::ShmTransport::new();
        let settings = Overrides::parse(config.algo.as_deref().unwrap_or(""))
            .map_err(|m| Error::invalid_argument(m.to_string()).rank(rank))
            .and_then(|o| Ok((o, transports(&config, rank, &shm)?)));
        let (overrides, candidates) = match settings {
            Ok(s) => s,
            Err(e) => {
                // The root passes this rank's own error on to the others.
                b.fail(&e);
                return Err(e);
            }
        };
        if config.trace_counter && ccl_shm::clock::calibrate() {
            ccl_diag::recorder::set_fast_clock(ccl_shm::clock::now_us);
        }
        let reg_max = config.reg_max_bytes;
        let (peers, links) = Peers::connect(b, candidates.clone(), config)?;
        // Memory is registered with the transports some connection uses.
        let used: Vec<_> = candidates
            .into_iter()
            .filter(|t| (0..peers.size()).any(|p| peers.peer_transport(p) == Some(t.name())))
            .collect();
        // Registered memory comes from the shared arena when shared memory connects this rank
        // to others of its host.
        let arena = used
            .iter()
            .any(|t| t.name() == shm.name())
            .then(|| shm.arena())
            .flatten();
        let registry = Arc::new(registry::Registry::new(rank, used, reg_max, arena));
        let c = Communicator {
            order: Order::new(peers.clone()),
            engine: Arc::new(Engine::new(peers, links, overrides, registry)),
        };
        c.engine.log_algorithm_table();
        Ok(c)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.engine.size()
    }

    /// The transport every pair of ranks uses (`shm`, `tcp`, `ib`, `local`), or those in use
    /// joined by `+` (`shm+tcp`: shared memory within hosts, TCP across).
    pub fn transport_name(&self) -> &str {
        self.engine.peers.transport_name()
    }

    /// What connects to what, e.g. `2 hosts x 2 ranks: shm within hosts, tcp across (as seen
    /// from rank 0)`.
    pub fn transport_summary(&self) -> &str {
        self.engine.peers.transport_summary()
    }

    /// The peers this rank holds a connection to, in rank order. Waits for an operation that
    /// another thread runs on this communicator.
    pub fn connected_peers(&self) -> Vec<usize> {
        self.engine.connected_peers()
    }

    /// What setting this communicator up took on this rank, phase by phase.
    pub fn init_timings(&self) -> InitTimings {
        self.engine.peers.init_timings()
    }

    /// Host name of every rank.
    pub fn hosts(&self) -> &[String] {
        self.engine.peers.hosts()
    }

    /// The settings this communicator was created with.
    pub fn config(&self) -> &Config {
        self.engine.peers.config()
    }

    /// The algorithms `coll` can run on this communicator: those the library has for it, less
    /// `shm` unless every rank is on this host and connected by shared memory, and `hiershm`
    /// unless the ranks of every host are.
    pub fn algorithms(&self, coll: Collective) -> Vec<Algo> {
        coll.algos()
            .iter()
            .copied()
            .filter(|&a| self.engine.can_run(a))
            .collect()
    }

    /// Forces `algo` for `coll` on this rank (`None`: back to the cost model), like `CCL_ALGO`.
    /// Every rank must make the same choice before its next call of `coll`. An algorithm this
    /// communicator cannot run ([`algorithms`](Communicator::algorithms)) is an error.
    pub fn set_algorithm(&self, coll: Collective, algo: Option<Algo>) -> Result<()> {
        if let Some(a) = algo
            && coll.algos().contains(&a)
            && !self.algorithms(coll).contains(&a)
        {
            return Err(
                Error::invalid_argument(ccl_algos::algo::unavailable(coll, a).to_string())
                    .rank(self.rank()),
            );
        }
        self.engine
            .set_override(coll, algo)
            .map_err(|m| Error::invalid_argument(m.to_string()).rank(self.rank()))
    }

    /// Fails the communicator and ends every wait at once, from any thread; idempotent.
    pub fn abort(&self) {
        self.engine.peers.abort();
        self.order.wake_all();
    }

    /// Peers the slow-rank report named in its last window: ranks that entered operations
    /// `CCL_SLOW_MS` or more after this one on average, two windows of `CCL_SLOW_WINDOW`
    /// operations in a row (also logged at warn level).
    pub fn slow_peers(&self) -> Vec<ccl_diag::verdict::SlowPeer> {
        self.engine.peers.slow_peers()
    }

    /// The flight recorder as JSON (what `CCL_TRACE_DIR` dumps hold; `ccl-trace` reads it).
    pub fn trace_json(&self) -> String {
        self.engine.peers.trace_json("snapshot")
    }

    /// Writes the flight recorder to `CCL_TRACE_DIR` now; returns the file, if written.
    pub fn dump_trace(&self, reason: &str) -> Option<std::path::PathBuf> {
        self.engine.peers.dump_trace(reason)
    }

    /// The algorithm `coll` runs for a buffer of `size_bytes` (the whole buffer for allreduce,
    /// broadcast, reduce; the gathered result for allgather; the whole input for reduce-scatter
    /// and alltoall): the one forced by `CCL_ALGO` or [`set_algorithm`](Self::set_algorithm),
    /// else, for an allreduce on one host at a size this communicator has measured
    /// (`CCL_SHM_ONE_SHOT`), the fastest it found, else the cost model's choice.
    pub fn algorithm(&self, coll: Collective, size_bytes: usize) -> Algo {
        self.engine.algorithm(coll, size_bytes)
    }

    /// Whether the next `coll` of `count` elements of `dtype` would still be one of the calls
    /// in which this communicator measures which algorithm is fastest at that size
    /// (`CCL_SHM_ONE_SHOT=auto`: an allreduce on one host tries each candidate a few times per
    /// power-of-two size class before it settles). Every rank gives the same answer after the
    /// same calls, so a benchmark can warm up until it is `false` without deadlocking.
    pub fn measuring(&self, coll: Collective, count: usize, dtype: DataType) -> bool {
        self.engine.measuring(coll, count, dtype.size())
    }

    /// The error the communicator failed with, if it has (NCCL's `ncclCommGetAsyncError`).
    pub fn error(&self) -> Option<Error> {
        self.engine.peers.error()
    }

    /// Any collective on typed buffers: from `send`, or in place in `recv` when `send` is
    /// `None`. The count follows from the lengths (NCCL's rules: allgather's input block,
    /// reduce-scatter's output block, alltoall's per-peer block); `op` is ignored by
    /// collectives that do not reduce, `root` by those without one.
    pub fn collective<T: Element>(
        &self,
        coll: Collective,
        send: Option<&[T]>,
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.order
            .blocking(|| run_typed(&self.engine, coll, send, recv, op, root))
    }

    /// Any collective on untyped buffers, NCCL style: `count` is NCCL's count, `send` is `None`
    /// in place. Buffer lengths are checked against the collective's rules.
    // Seven arguments: NCCL's own list (buffers, count, type, operator, root), which the C ABI
    // passes through one for one.
    #[allow(clippy::too_many_arguments)]
    pub fn collective_bytes(
        &self,
        coll: Collective,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let call = Call {
            coll,
            count,
            dtype,
            op,
            root,
        };
        self.order.blocking(|| self.engine.run(call, send, recv))
    }

    /// Non-blocking [`collective`](Communicator::collective): takes ownership of the buffers
    /// (any `Vec<T>`, `Box<[T]>`, ...) and gives them back from [`Request::wait`]. Operations
    /// complete in the order they were issued; argument errors also arrive through `wait`.
    pub fn collective_async<T, S, R>(
        &self,
        coll: Collective,
        send: Option<S>,
        recv: R,
        op: ReduceOp,
        root: usize,
    ) -> Request<(Option<S>, R)>
    where
        T: Element,
        S: AsRef<[T]> + Send + 'static,
        R: AsMut<[T]> + Send + 'static,
    {
        let engine = self.engine.clone();
        self.order.submit((send, recv), move |(send, recv)| {
            run_typed(
                &engine,
                coll,
                send.as_ref().map(|b| b.as_ref()),
                recv.as_mut(),
                op,
                root,
            )
        })
    }

    /// Non-blocking [`collective_bytes`](Communicator::collective_bytes) on owned byte buffers.
    // Seven arguments: as `collective_bytes`.
    #[allow(clippy::too_many_arguments)]
    pub fn collective_bytes_async<S, R>(
        &self,
        coll: Collective,
        send: Option<S>,
        recv: R,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Request<(Option<S>, R)>
    where
        S: AsRef<[u8]> + Send + 'static,
        R: AsMut<[u8]> + Send + 'static,
    {
        let call = Call {
            coll,
            count,
            dtype,
            op,
            root,
        };
        let engine = self.engine.clone();
        self.order.submit((send, recv), move |(send, recv)| {
            let send = send.as_ref().map(|b| b.as_ref());
            engine.run(call, send, recv.as_mut())
        })
    }

    /// Allocates `n` zeroed elements of memory registered with every transport of this
    /// communicator that needs registration: page aligned, on huge pages when the system has
    /// them. Collectives on (parts of) it send straight from it where the transport can (verbs:
    /// RDMA writes from it, no copy into staging buffers). Counts toward `CCL_REG_MAX_BYTES`
    /// until dropped.
    ///
    /// ```no_run
    /// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
    /// let mut grads = comm.alloc::<f32>(1 << 20)?;
    /// grads.fill(1.0);
    /// comm.all_reduce_in_place(&mut grads, oxccl::ReduceOp::Sum)?;
    /// // Non-blocking calls take it and give it back.
    /// let grads = comm.all_reduce_async(grads, oxccl::ReduceOp::Sum).wait()?;
    /// # drop(grads); Ok(()) }
    /// ```
    pub fn alloc<T: Element>(&self, n: usize) -> Result<Buffer<T>> {
        Buffer::new(&self.engine.registry, n)
    }

    /// Registers `mem` with every transport of this communicator that needs registration, for
    /// as long as the returned [`Registration`] lives: it borrows `mem` (use it through the
    /// registration, which derefs to the slice) and deregisters when dropped. Collectives on
    /// (parts of) it send straight from it where the transport can. Registering costs a system
    /// call that pins the pages; register long-lived buffers once, not per call. Counts toward
    /// `CCL_REG_MAX_BYTES` until dropped.
    ///
    /// ```no_run
    /// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
    /// let mut v = vec![1.0f32; 1 << 20];
    /// let mut out = vec![0.0f32; 1 << 20];
    /// let (send, mut recv) = (comm.register(&mut v)?, comm.register(&mut out)?);
    /// comm.all_reduce(&send, &mut recv, oxccl::ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    pub fn register<'a, T: Element>(&self, mem: &'a mut [T]) -> Result<Registration<'a, T>> {
        Registration::new(&self.engine.registry, mem)
    }

    /// Registers `mem` without borrowing it, for callers that manage its life themselves (the
    /// C ABI's `cclCommRegister`): see [`UnboundRegistration`] for the rule they must keep.
    /// Rust code should use [`register`](Communicator::register).
    pub fn register_unbound(&self, mem: &[u8]) -> Result<UnboundRegistration> {
        UnboundRegistration::new(&self.engine.registry, mem)
    }

    /// Bytes this communicator holds registered now (from [`alloc`](Communicator::alloc) and
    /// [`register`](Communicator::register)), and in how many registrations.
    pub fn registered_bytes(&self) -> (usize, usize) {
        let r = &self.engine.registry;
        (r.bytes(), r.count())
    }

    /// Elementwise reduction of every rank's `send` into every rank's `recv` (out of place).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::AllReduce, Some(send), recv, op, 0)
    }

    /// Elementwise reduction of every rank's `buf`, in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::AllReduce, None, buf, op, 0)
    }

    /// Untyped allreduce of `count` elements of `dtype`: out of place from `send`, or in place in
    /// `recv` when `send` is `None`. Buffers must be exactly `count` elements long.
    pub fn all_reduce_bytes(
        &self,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective_bytes(Collective::AllReduce, send, recv, count, dtype, op, 0)
    }

    /// Non-blocking allreduce in place of an owned buffer, returned by [`Request::wait`].
    pub fn all_reduce_async<T, B>(&self, buf: B, op: ReduceOp) -> Request<B>
    where
        T: Element,
        B: AsMut<[T]> + Send + 'static,
    {
        let engine = self.engine.clone();
        self.order.submit(buf, move |buf| {
            run_typed(&engine, Collective::AllReduce, None, buf.as_mut(), op, 0)
        })
    }

    /// Copies `root`'s `send` into every rank's `recv` (`send` is read on the root only, but must
    /// have the same length everywhere).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Broadcast, Some(send), recv, ReduceOp::Sum, root)
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.collective(Collective::Broadcast, None, buf, ReduceOp::Sum, root)
    }

    /// Reduces every rank's `send` into `root`'s `recv`; other ranks' `recv` is left untouched.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(Collective::Reduce, Some(send), recv, op, root)
    }

    /// Reduces every rank's `buf` into `root`'s `buf`; other ranks' `buf` is left untouched.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.collective(Collective::Reduce, None, buf, op, root)
    }

    /// Gathers every rank's `send` into every rank's `recv`, in rank order
    /// (`recv.len() == send.len() * size`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.collective(Collective::AllGather, Some(send), recv, ReduceOp::Sum, 0)
    }

    /// Allgather in place: each rank's input is already at block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.collective(Collective::AllGather, None, buf, ReduceOp::Sum, 0)
    }

    /// Rank `r` receives in `recv` the reduction of every rank's block `r` of `send`
    /// (`send.len() == recv.len() * size`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(Collective::ReduceScatter, Some(send), recv, op, 0)
    }

    /// Reduce-scatter in place: the result lands in block `rank` of `buf`; other blocks keep
    /// their input.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.collective(Collective::ReduceScatter, None, buf, op, 0)
    }

    /// Block `k` of every rank's `send` goes to block `rank` of rank `k`'s `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.collective(Collective::AllToAll, Some(send), recv, ReduceOp::Sum, 0)
    }

    /// Alltoall in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.collective(Collective::AllToAll, None, buf, ReduceOp::Sum, 0)
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.collective::<u8>(Collective::Barrier, None, &mut [], ReduceOp::Sum, 0)
    }

    /// Non-blocking barrier.
    pub fn barrier_async(&self) -> Request<()> {
        let engine = self.engine.clone();
        self.order.submit((), move |()| {
            run_typed::<u8>(
                &engine,
                Collective::Barrier,
                None,
                &mut [],
                ReduceOp::Sum,
                0,
            )
        })
    }
}

/// The transports this rank can use for `config.transport`, most preferred first. Each pair of
/// ranks then takes the first one both have that can connect them: shared memory within a host
/// (unless `CCL_SHM_DISABLE`), verbs, TCP.
fn transports(
    config: &Config,
    rank: usize,
    shm: &ccl_shm::ShmTransport,
) -> Result<Vec<Arc<dyn Transport>>> {
    let tcp: Arc<dyn Transport> = Arc::new(TcpTransport::with_planes());
    let shm: Arc<dyn Transport> = Arc::new(shm.clone());
    Ok(match config.transport {
        TransportKind::Tcp => vec![tcp],
        TransportKind::Local => vec![Arc::new(LocalTransport::new())],
        TransportKind::Shm => vec![shm],
        TransportKind::Ib => vec![ib_transport(config).map_err(|e| e.rank(rank))?],
        TransportKind::Auto => {
            let mut v = Vec::with_capacity(3);
            if !config.shm_disable {
                v.push(shm);
            }
            v.extend(auto_ib(config, rank));
            v.push(tcp);
            v
        }
    })
}

#[cfg(feature = "ib")]
fn ib_transport(config: &Config) -> Result<Arc<dyn Transport>> {
    Ok(Arc::new(ccl_ibverbs::IbTransport::open(config)?))
}

#[cfg(not(feature = "ib"))]
fn ib_transport(_config: &Config) -> Result<Arc<dyn Transport>> {
    Err(Error::invalid_usage(
        "CCL_TRANSPORT=ib: this build has no verbs transport (ccl was built without its `ib` feature)",
    ))
}

/// `auto`: verbs when an active RoCE port exists (and opens), else none; says which at info
/// level. The ranks then agree on the first transport all of them have.
#[cfg(feature = "ib")]
fn auto_ib(config: &Config, rank: usize) -> Option<Arc<dyn Transport>> {
    if !ccl_ibverbs::probe(config) {
        ccl_info!(Some(rank), "transport auto: no active RoCE port, using tcp");
        return None;
    }
    match ccl_ibverbs::IbTransport::open(config) {
        Ok(t) => {
            ccl_info!(
                Some(rank),
                "transport auto: active RoCE port {} port {}, using ib (if every rank can)",
                t.device().name(),
                t.device().port()
            );
            Some(Arc::new(t))
        }
        Err(e) => {
            ccl_core::ccl_warn!(
                Some(rank),
                "transport auto: a RoCE port exists but cannot be used ({e}); using tcp"
            );
            None
        }
    }
}

#[cfg(not(feature = "ib"))]
fn auto_ib(_config: &Config, rank: usize) -> Option<Arc<dyn Transport>> {
    ccl_info!(
        Some(rank),
        "transport auto: no verbs transport in this build, using tcp"
    );
    None
}
