//! # ccl: collective communication for training programs
//!
//! Allreduce (and, as they land, the other collectives) across processes and hosts over RDMA
//! (RoCEv2 verbs), TCP, or threads of one process, with NCCL's semantics and a safe Rust API.
//!
//! ## Quick start
//!
//! Every rank creates a [`Communicator`] from the same [`UniqueId`] (made by one process and
//! passed to the others: through MPI, a file, an environment variable), its rank and the number
//! of ranks; or from launcher variables with [`Communicator::from_env`] (torchrun, mpirun, srun).
//!
//! ```
//! use ccl::{Communicator, Config, ReduceOp, UniqueId};
//! # fn main() -> ccl::Result<()> {
//! // Starts the rendezvous root in this process. `UniqueId::new()` listens on the interface named
//! // by CCL_SOCKET_IFNAME (default: the first non-loopback one) for jobs across hosts; this
//! // example keeps everything on one host.
//! let id = UniqueId::new_at([127, 0, 0, 1].into(), &Config::from_env()?)?;
//! let size = 2;
//! let ranks: Vec<_> = (0..size)
//!     .map(|rank| {
//!         let id = id.clone();
//!         std::thread::spawn(move || -> ccl::Result<Vec<f32>> {
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
//! - Results are bit-identical on every rank. Collectives must be called in the same order with
//!   matching arguments on every rank, as with NCCL and MPI.
//! - Settings are `CCL_*` environment variables, listed in `docs/env.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use ccl_algos::algo;
use ccl_algos::exec::{self, Buffers, ExecState, OpInfo};
use ccl_algos::schedule::{Schedule, Shape};
use ccl_algos::select::Overrides;
use ccl_core::bootstrap::Bootstrap;
use ccl_core::bootstrap::env::Launch;
use ccl_core::comm::{Comm, Links};
use ccl_core::config::TransportKind;
use ccl_core::topology::Topology;
use ccl_core::transport::Transport;
use ccl_core::transport::local::LocalTransport;
use ccl_core::transport::tcp::TcpTransport;
use ccl_core::{ccl_info, ccl_trace};

pub use ccl_algos::algo::{Algo, Collective};
pub use ccl_core::config::Config;
pub use ccl_core::{DataType, Element, Error, ErrorKind, ReduceOp, Result, UniqueId};

mod group;
pub use group::Group;

/// Most cached schedules per communicator; beyond that the cache starts over.
const PLAN_CACHE_LIMIT: usize = 256;

/// A group of ranks that run collectives together.
///
/// `Communicator` is `Send + Sync`: it can be shared between threads, for instance so one thread
/// can [`abort`](Communicator::abort) while another is blocked in a collective. Collectives on one
/// communicator run one at a time.
pub struct Communicator {
    comm: Arc<Comm>,
    overrides: Mutex<Overrides>,
    inner: Mutex<Inner>,
}

struct Inner {
    links: Links,
    exec: ExecState,
    plans: HashMap<(Collective, Algo, Shape), Arc<Schedule>>,
    /// Scratch space, as u64 so it is aligned for every element type.
    scratch: Vec<u64>,
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
        let overrides = Overrides::parse(config.algo.as_deref().unwrap_or(""))
            .map_err(|m| Error::invalid_argument(m).rank(rank))?;
        let candidates = transports(config.transport, rank)?;
        let (comm, links) = Comm::connect(b, candidates, config)?;
        let c = Communicator {
            comm,
            overrides: Mutex::new(overrides),
            inner: Mutex::new(Inner {
                links,
                exec: ExecState::default(),
                plans: HashMap::new(),
                scratch: Vec::new(),
            }),
        };
        c.log_algorithm_table();
        Ok(c)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The transport in use (`tcp`, `local`, `ib`).
    pub fn transport_name(&self) -> &'static str {
        self.comm.transport_name()
    }

    /// Host name of every rank.
    pub fn hosts(&self) -> &[String] {
        self.comm.hosts()
    }

    /// Forces `algo` for `coll` on this rank (`None`: back to the cost model), like `CCL_ALGO`.
    /// Every rank must make the same choice before its next call of `coll`.
    pub fn set_algorithm(&self, coll: Collective, algo: Option<Algo>) -> Result<()> {
        let mut o = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        match algo {
            Some(a) => o
                .set(coll, a)
                .map_err(|m| Error::invalid_argument(m).rank(self.rank())),
            None => {
                o.clear(coll);
                Ok(())
            }
        }
    }

    /// Fails the communicator and ends every wait at once, from any thread; idempotent.
    pub fn abort(&self) {
        self.comm.abort();
    }

    /// The error the communicator failed with, if it has (NCCL's `ncclCommGetAsyncError`).
    pub fn error(&self) -> Option<Error> {
        self.comm.error()
    }

    /// Elementwise reduction of every rank's `send` into every rank's `recv` (out of place).
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if send.len() != recv.len() {
            return Err(Error::invalid_argument(format!(
                "all_reduce: send buffer has {} elements but receive buffer has {}",
                send.len(),
                recv.len()
            ))
            .rank(self.rank()));
        }
        let count = recv.len();
        self.all_reduce_bytes(
            Some(bytemuck::cast_slice(send)),
            bytemuck::cast_slice_mut(recv),
            count,
            T::DTYPE,
            op,
        )
    }

    /// Elementwise reduction of every rank's `buf`, in place.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = buf.len();
        self.all_reduce_bytes(None, bytemuck::cast_slice_mut(buf), count, T::DTYPE, op)
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
        self.run(Collective::AllReduce, send, recv, count, dtype, op, 0)
    }

    /// Copies `root`'s `send` into every rank's `recv` (`send` is read on the root only, but must
    /// have the same length everywhere).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        self.same_len("broadcast", send.len(), recv.len())?;
        let count = recv.len();
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        self.run(
            Collective::Broadcast,
            Some(s),
            r,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            root,
        )
    }

    /// Copies `root`'s `buf` into every rank's `buf`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let count = buf.len();
        let b = bytemuck::cast_slice_mut(buf);
        self.run(
            Collective::Broadcast,
            None,
            b,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            root,
        )
    }

    /// Reduces every rank's `send` into `root`'s `recv`; other ranks' `recv` is left untouched.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.same_len("reduce", send.len(), recv.len())?;
        let count = recv.len();
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        self.run(Collective::Reduce, Some(s), r, count, T::DTYPE, op, root)
    }

    /// Reduces every rank's `buf` into `root`'s `buf`; other ranks' `buf` is left untouched.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let count = buf.len();
        self.run(
            Collective::Reduce,
            None,
            bytemuck::cast_slice_mut(buf),
            count,
            T::DTYPE,
            op,
            root,
        )
    }

    /// Gathers every rank's `send` into every rank's `recv`, in rank order
    /// (`recv.len() == send.len() * size`).
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = send.len();
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        self.run(
            Collective::AllGather,
            Some(s),
            r,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }

    /// Allgather in place: each rank's input is already at block `rank` of `buf`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_len("all_gather_in_place", buf.len())?;
        let b = bytemuck::cast_slice_mut(buf);
        self.run(
            Collective::AllGather,
            None,
            b,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }

    /// Rank `r` receives in `recv` the reduction of every rank's block `r` of `send`
    /// (`send.len() == recv.len() * size`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let count = recv.len();
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        self.run(
            Collective::ReduceScatter,
            Some(s),
            r,
            count,
            T::DTYPE,
            op,
            0,
        )
    }

    /// Reduce-scatter in place: the result lands in block `rank` of `buf`; other blocks keep
    /// their input.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.block_len("reduce_scatter_in_place", buf.len())?;
        let b = bytemuck::cast_slice_mut(buf);
        self.run(Collective::ReduceScatter, None, b, count, T::DTYPE, op, 0)
    }

    /// Block `k` of every rank's `send` goes to block `rank` of rank `k`'s `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let count = self.block_len("all_to_all", send.len())?;
        let (s, r) = (bytemuck::cast_slice(send), bytemuck::cast_slice_mut(recv));
        self.run(
            Collective::AllToAll,
            Some(s),
            r,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }

    /// Alltoall in place.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.block_len("all_to_all_in_place", buf.len())?;
        let b = bytemuck::cast_slice_mut(buf);
        self.run(
            Collective::AllToAll,
            None,
            b,
            count,
            T::DTYPE,
            ReduceOp::Sum,
            0,
        )
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.run(
            Collective::Barrier,
            None,
            &mut [],
            0,
            DataType::U8,
            ReduceOp::Sum,
            0,
        )
    }

    /// Any collective on untyped buffers, NCCL style: `count` is NCCL's count (per-rank block for
    /// allgather, reduce-scatter and alltoall), `send` is `None` in place, `root` is used by
    /// broadcast and reduce. Buffer lengths are checked against the collective's rules.
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
        self.run(coll, send, recv, count, dtype, op, root)
    }

    fn same_len(&self, what: &str, send: usize, recv: usize) -> Result<()> {
        if send != recv {
            return Err(Error::invalid_argument(format!(
                "{what}: send buffer has {send} elements but receive buffer has {recv}"
            ))
            .rank(self.rank()));
        }
        Ok(())
    }

    /// `len / size`, when `len` splits into one block per rank.
    fn block_len(&self, what: &str, len: usize) -> Result<usize> {
        let n = self.size();
        if len % n != 0 {
            return Err(Error::invalid_argument(format!(
                "{what}: a buffer of {len} elements does not split into {n} equal blocks"
            ))
            .rank(self.rank()));
        }
        Ok(len / n)
    }

    /// Runs `coll` on untyped buffers after checking every argument: lengths against
    /// [`Collective::buffer_lens`], the root against the world size.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        coll: Collective,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (rank, n) = (self.rank(), self.size());
        let bad = |m: String| Error::invalid_argument(format!("{coll}: {m}")).rank(rank);
        if root >= n {
            return Err(bad(format!("root {root} is out of range for {n} ranks")));
        }
        let overflow = || {
            bad(format!(
                "{count} elements of {dtype} over {n} ranks overflow the address space"
            ))
        };
        // buffer_lens multiplies unchecked; count * n must not wrap.
        let blocks = count.checked_mul(n).ok_or_else(overflow)?;
        let (send_len, recv_len) = match coll {
            Collective::AllGather => (count, blocks),
            Collective::ReduceScatter => (blocks, count),
            Collective::AllToAll => (blocks, blocks),
            _ => coll.buffer_lens(count, n),
        };
        let send_bytes = send_len.checked_mul(dtype.size()).ok_or_else(overflow)?;
        let recv_bytes = recv_len.checked_mul(dtype.size()).ok_or_else(overflow)?;
        // In place, one buffer serves as both: NCCL's rules put allgather's input at block
        // `rank` of the output and reduce-scatter's output at block `rank` of the input.
        let buf_bytes = if send.is_none() {
            send_bytes.max(recv_bytes)
        } else {
            recv_bytes
        };
        if recv.len() != buf_bytes {
            return Err(bad(format!(
                "count {count} of {dtype} needs a {} buffer of {buf_bytes} bytes, got {}",
                if send.is_none() {
                    "(in-place)"
                } else {
                    "receive"
                },
                recv.len()
            )));
        }
        if let Some(s) = send
            && s.len() != send_bytes
        {
            return Err(bad(format!(
                "count {count} of {dtype} needs a send buffer of {send_bytes} bytes, got {}",
                s.len()
            )));
        }
        self.comm.check()?;
        // The nccl-tests size, for the cost model.
        let size_bytes = match coll {
            Collective::AllGather => recv_bytes,
            Collective::ReduceScatter | Collective::AllToAll => send_bytes,
            _ => recv_bytes,
        };
        let forced = self
            .overrides
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(coll);
        let algo = match forced {
            Some(a) => a,
            None => algo::choose(
                coll,
                n,
                size_bytes,
                &self.comm.transport_properties(),
                self.comm.topology(),
            ),
        };
        let shape = Shape {
            rank,
            size: n,
            count,
            in_place: send.is_none(),
            op,
            root,
        };
        let mut g = self.lock();
        let sched = g.plan(coll, algo, &shape, self.comm.topology())?;
        drop(g);
        self.execute(
            &sched,
            send,
            recv,
            Vec::new(),
            dtype,
            op,
            coll.name(),
            size_bytes,
        )
    }

    /// Runs a schedule with the communicator's links, scratch space and executor state.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute(
        &self,
        sched: &Schedule,
        send: Option<&[u8]>,
        recv: &mut [u8],
        extra: Vec<exec::ExtraBuf<'_>>,
        dtype: DataType,
        op: ReduceOp,
        name: &str,
        bytes: usize,
    ) -> Result<()> {
        let mut g = self.lock();
        self.comm.check()?;
        let seq = self.comm.next_seq();
        let inner = &mut *g;
        let scratch_bytes = sched.scratch * dtype.size();
        let need = scratch_bytes.div_ceil(8);
        if inner.scratch.len() < need {
            inner.scratch.resize(need, 0);
        }
        let scratch = &mut bytemuck::cast_slice_mut(&mut inner.scratch[..need])[..scratch_bytes];
        let mut bufs = Buffers {
            send,
            recv,
            scratch,
            extra,
        };
        let info = OpInfo { name, seq, bytes };
        exec::run(
            &self.comm,
            &mut inner.links,
            &mut inner.exec,
            sched,
            &mut bufs,
            dtype,
            op,
            &info,
        )
        .map_err(|e| self.comm.fail(e))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic inside a collective leaves the links in an unknown state; the communicator
        // records that as its error, and the lock itself stays usable for abort/drop.
        self.inner.lock().unwrap_or_else(|p| {
            self.comm
                .fail(Error::internal("a previous collective panicked").rank(self.rank()));
            p.into_inner()
        })
    }

    /// Logs, once, which algorithm the cost model picks for each collective at which size.
    fn log_algorithm_table(&self) {
        if !ccl_core::log::enabled(ccl_core::config::LogLevel::Info) || self.rank() != 0 {
            return;
        }
        let props = self.comm.transport_properties();
        for coll in Collective::ALL {
            if coll.algos().is_empty() {
                continue;
            }
            let forced = self
                .overrides
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(coll);
            if let Some(a) = forced {
                ccl_info!(Some(0), "{coll} algorithm: {a} (CCL_ALGO)");
                continue;
            }
            let mut table = String::new();
            let mut prev = None;
            for p in 0..=34 {
                let b = 1usize << p;
                let a = algo::choose(coll, self.size(), b, &props, self.comm.topology());
                if prev != Some(a) {
                    table.push_str(&format!(" {a} from {b} B;"));
                    prev = Some(a);
                }
            }
            ccl_info!(Some(0), "{coll} algorithms:{}", table.trim_end_matches(';'));
        }
    }
}

impl Inner {
    fn plan(
        &mut self,
        coll: Collective,
        algo: Algo,
        shape: &Shape,
        topo: &Topology,
    ) -> Result<Arc<Schedule>> {
        let key = (coll, algo, *shape);
        if let Some(s) = self.plans.get(&key) {
            return Ok(s.clone());
        }
        if self.plans.len() >= PLAN_CACHE_LIMIT {
            self.plans.clear();
        }
        let s = Arc::new(
            algo::build(coll, algo, shape, topo)
                .map_err(|m| Error::invalid_usage(m).rank(shape.rank))?,
        );
        ccl_trace!(
            Some(shape.rank),
            "built {algo} {coll} schedule: {} ops, count {}, in place {}",
            s.ops.len(),
            shape.count,
            shape.in_place
        );
        self.plans.insert(key, s.clone());
        Ok(s)
    }
}

/// The transports this rank can use for `kind`, most preferred first.
fn transports(kind: TransportKind, rank: usize) -> Result<Vec<Arc<dyn Transport>>> {
    let tcp: Arc<dyn Transport> = Arc::new(TcpTransport::new());
    Ok(match kind {
        TransportKind::Tcp => vec![tcp],
        TransportKind::Local => vec![Arc::new(LocalTransport::new())],
        TransportKind::Ib => {
            return Err(Error::invalid_usage(
                "CCL_TRANSPORT=ib: this build has no verbs transport",
            )
            .rank(rank));
        }
        TransportKind::Auto => {
            ccl_info!(
                Some(rank),
                "transport auto: no RDMA transport in this build, using tcp"
            );
            vec![tcp]
        }
    })
}
