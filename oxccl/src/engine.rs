//! The engine of a communicator: what runs an operation, on the caller's thread or the progress
//! thread, and the one path every operation takes: check the arguments, pick the algorithm,
//! fetch or build the schedule, execute it.

/// Operations log as `coll`.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Coll;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::exec::{self, Buffers, ExecState, ExtraBuf, Job, OpInfo, OpKind, Registered};
use crate::peers::{Links, Peers};
use ccl_algos::algo::{self, Algo, Collective};
use ccl_algos::local::LocalPlan;
use ccl_algos::overrides::Overrides;
use ccl_algos::schedule::{Schedule, Shape};
use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;
use ccl_core::{ccl_info, ccl_trace};
use ccl_diag::recorder::Begin;

mod choice;
use choice::{allreduce_candidates, measured_choice};

use crate::crossover::{self, Crossover, Trial};
use crate::registry::Registry;
use crate::{DataType, Error, ErrorKind, ReduceOp, Result};

/// Most cached schedules per communicator; beyond that the cache starts over.
const PLAN_CACHE_LIMIT: usize = 256;

/// Calls remembered with their algorithm and schedule, so that a call like a recent one (a
/// training step repeats the same few) skips the cost model and the plan map's hashing.
const RECENT: usize = 8;

/// One collective as NCCL takes it: `count` elements of `dtype` (NCCL's count for `coll`), the
/// operator (ignored by collectives that do not reduce) and the root (ignored by those without
/// one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Call {
    pub coll: Collective,
    pub count: usize,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub root: usize,
}

/// A schedule to run on the caller's buffers (`send` is `None` in place) and a group's extra
/// buffers, with the type and operator its reductions use and what the trace records of it.
pub(crate) struct Execution<'s, 'b> {
    pub sched: &'s Schedule,
    pub send: Option<&'b [u8]>,
    pub recv: &'b mut [u8],
    pub extra: Vec<ExtraBuf<'b>>,
    pub dtype: DataType,
    pub op: ReduceOp,
    pub info: OpInfo,
    /// The schedule compiled for the executor ([`LocalPlan`]), when it has no peers.
    pub local: Option<&'s LocalPlan>,
}

/// What a `Communicator` shares with its progress thread to run operations: the transport half
/// ([`Peers`] and the [`Links`]), the algorithm choice, cached schedules, executor state and
/// scratch space. Issue order is not its business (`crate::order` keeps it).
pub(crate) struct Engine {
    pub peers: Arc<Peers>,
    /// The transport as the cost model sees it on this machine.
    model: TransportProperties,
    overrides: Mutex<Overrides>,
    /// Bumped whenever `overrides` changes: a prepared call made before is made again.
    overrides_gen: AtomicU64,
    /// Bytes of each rank's slot in host memory (0: the communicator has none). A rank alone on
    /// its host among hosts that share memory has no segment but schedules the same chunks as
    /// the others, so it takes the slot size they have.
    host_slot: usize,
    /// Whether buffers can lie in the host's shared arenas (`HostMemory::has_shared`).
    has_shared: bool,
    /// Live registrations of caller memory (`Communicator::alloc`, `Communicator::register`).
    pub registry: Arc<Registry>,
    inner: Mutex<Inner>,
}

struct Inner {
    links: Links,
    exec: ExecState,
    plans: HashMap<(Collective, Algo, Shape), Arc<Schedule>>,
    /// The last calls' choices, the newest at `recent_next - 1` (see [`RECENT`]).
    recent: Vec<Recent>,
    recent_next: usize,
    /// Scratch space, as u64 so it is aligned for every element type.
    scratch: Vec<u64>,
    /// The last call that ran by a plan, ready to run again.
    prepared: Option<Box<Prepared>>,
    /// One-shot or two-shot for the host-memory allreduce, by size.
    crossover: Crossover,
}

/// A call whose schedule runs by a [`LocalPlan`] (a small operation in host memory), with all
/// it needs worked out: its arguments were checked, its algorithm chosen and its schedule
/// compiled. The same call again (a program calls the same few over and over) is recognised
/// by comparing its arguments, and goes to the executor at once. Measured on 2 ranks' 2 KiB
/// allreduces: the checks, the choice and the lookups it skips were about 300 instructions of a
/// call's 2600, and each 1000 instructions on this path cost about 0.13 us.
struct Prepared {
    call: Call,
    in_place: bool,
    send_len: usize,
    recv_len: usize,
    /// `Engine::overrides_gen` when it was made.
    overrides_gen: u64,
    /// The operation as the executor describes it (its algorithm, its nccl-tests size).
    info: OpInfo,
    sched: Arc<Schedule>,
    plan: Arc<LocalPlan>,
    /// What the flight recorder records of it, but its number.
    record: Begin,
}

impl Prepared {
    fn fits(&self, call: &Call, send: Option<&[u8]>, recv: &[u8], overrides_gen: u64) -> bool {
        self.call == *call
            && self.recv_len == recv.len()
            && match send {
                None => self.in_place,
                Some(s) => !self.in_place && self.send_len == s.len(),
            }
            && self.overrides_gen == overrides_gen
    }
}

/// A call's algorithm and schedule. The key holds all they depend on: the forced algorithm
/// (else the cost model, whose inputs do not change, chooses from the collective and the size
/// in bytes, which the shape and element size give).
struct Recent {
    coll: Collective,
    forced: Option<Algo>,
    elem: usize,
    shape: Shape,
    algo: Algo,
    sched: Arc<Schedule>,
    /// The schedule compiled for the executor when it has no peers.
    local: Option<Arc<LocalPlan>>,
}

impl Engine {
    pub(crate) fn new(
        peers: Arc<Peers>,
        links: Links,
        overrides: Overrides,
        registry: Arc<Registry>,
    ) -> Engine {
        let host_slot = match &links.host {
            Some(h) => h.slot_len(),
            None if peers.transport_properties().host_memory
                && peers.topology().host_peers(peers.rank()).len() == 1 =>
            {
                peers.config().shm_slot_size
            }
            None => 0,
        };
        let has_shared = links.host.as_deref().is_some_and(|h| h.has_shared());
        let peers_config_one_shot = peers.config().shm_one_shot;
        let model = peers.cost_properties();
        let candidates = allreduce_candidates(&peers, &model, host_slot);
        Engine {
            has_shared,
            registry,
            model,
            peers,
            overrides: Mutex::new(overrides),
            overrides_gen: AtomicU64::new(0),
            host_slot,
            inner: Mutex::new(Inner {
                links,
                exec: ExecState::default(),
                plans: HashMap::new(),
                recent: Vec::with_capacity(RECENT),
                recent_next: 0,
                scratch: Vec::new(),
                prepared: None,
                crossover: Crossover::new(
                    match peers_config_one_shot {
                        None => crossover::Setting::Measure,
                        Some(b) => crossover::Setting::UpTo(b),
                    },
                    candidates,
                ),
            }),
        }
    }

    pub(crate) fn rank(&self) -> usize {
        self.peers.rank()
    }

    /// Whether `algo` can run on this communicator (the host-memory algorithms need host
    /// memory where they use it).
    pub(crate) fn can_run(&self, algo: Algo) -> bool {
        algo::available(algo, &self.model, self.peers.topology())
            && (!matches!(algo, Algo::Shm | Algo::HierShm) || self.host_slot > 0)
    }

    pub(crate) fn size(&self) -> usize {
        self.peers.size()
    }

    /// Runs `call` on untyped buffers (`send` is `None` in place) after checking every
    /// argument: lengths against the collective's rules, the root against the world size. Not
    /// ordered: callers hold the turn. The reuse of a recent call's algorithm and schedule and
    /// the execution share one hold of the engine lock, taken once per call.
    pub(crate) fn run(&self, call: Call, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        // Read before the lock, as the slow way reads `forced`: a change made while this call
        // waited for the lock counts from the next call on.
        let overrides_gen = self.overrides_gen.load(Ordering::Acquire);
        let mut g = self.lock();
        if let Some(p) = g.prepared.take() {
            let again = p.fits(&call, send, recv, overrides_gen)
                && !(self.has_shared && in_arena(&g, send, recv));
            let r = again.then(|| self.run_prepared(&mut g, &p, send, recv));
            g.prepared = Some(p);
            if let Some(r) = r {
                return r;
            }
        }
        drop(g);
        let Call {
            coll,
            count,
            dtype,
            op,
            root,
        } = call;
        let (rank, n) = (self.rank(), self.size());
        let size_bytes = self.check(&call, send, recv)?;
        let mut shape = Shape {
            rank,
            size: n,
            count,
            in_place: send.is_none(),
            op,
            root,
            host_slot: self.host_slot / dtype.size(),
            one_shot: None,
        };
        let forced = self.forced(coll);
        let mut g = self.lock();
        // Buffers in the shared arena are read in place; whether they are is known per call,
        // so that schedule is built per call, outside the caches.
        let direct = self
            .direct_plan(&g, coll, forced, &shape, size_bytes, send, recv)
            .map(|sched| (Algo::Shm, Arc::new(sched), None));
        let (forced, trial) = if direct.is_none() {
            measured_choice(&g.crossover, coll, forced, size_bytes, &mut shape)
        } else {
            (forced, None)
        };
        let (algo, sched, local) =
            match direct.or_else(|| g.recent(coll, forced, dtype.size(), &shape)) {
                Some(hit) => hit,
                None => self.first_call(&mut g, coll, forced, dtype.size(), shape, size_bytes)?,
            };
        let info = OpInfo {
            kind: OpKind::Collective { coll, algo },
            bytes: size_bytes,
            root,
            count,
        };
        // A direct schedule has no plan: it is built per call. A trial is not prepared, so that
        // the next call of its size class comes back for its side.
        if let Some(plan) = local.as_ref().filter(|_| trial.is_none()) {
            g.prepared = Some(Box::new(Prepared {
                call,
                in_place: send.is_none(),
                send_len: send.map_or(0, <[u8]>::len),
                recv_len: recv.len(),
                overrides_gen,
                info,
                sched: sched.clone(),
                plan: plan.clone(),
                record: exec::op_record(&info, 0, dtype, op, sched.algo),
            }));
        }
        let start = std::time::Instant::now();
        self.execute_locked(
            &mut g,
            Execution {
                sched: &sched,
                send,
                recv,
                extra: Vec::new(),
                dtype,
                op,
                info,
                local: local.as_deref(),
            },
        )?;
        let Some(t) = trial else { return Ok(()) };
        match g.crossover.record(t, start.elapsed()) {
            Some(mine) => {
                drop(g);
                self.settle_crossover(t, mine)
            }
            None => Ok(()),
        }
    }

    /// Checks `call`'s arguments against the collective's rules (the root against the world
    /// size, the operator against the type, the buffers' lengths) and returns the nccl-tests
    /// size the cost model takes: the larger buffer (allgather's output, reduce-scatter's and
    /// alltoall's input, the buffer of the others).
    fn check(&self, call: &Call, send: Option<&[u8]>, recv: &[u8]) -> Result<usize> {
        let Call {
            coll,
            count,
            dtype,
            op,
            root,
        } = *call;
        let (rank, n) = (self.rank(), self.size());
        let bad = |m: String| Error::invalid_argument(format!("{coll}: {m}")).rank(rank);
        if root >= n {
            return Err(bad(format!("root {root} is out of range for {n} ranks")));
        }
        if matches!(
            coll,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        ) && !op.supports(dtype)
        {
            return Err(bad(format!(
                "reduce op {op} is bitwise and defined for integer types only, not {dtype}"
            )));
        }
        let lens = coll
            .buffer_lens(count, n)
            .ok()
            .and_then(|l| l.bytes(dtype.size()))
            .ok_or_else(|| {
                bad(format!(
                    "{count} elements of {dtype} over {n} ranks overflow the address space"
                ))
            })?;
        let (send_bytes, recv_bytes) = (lens.send, lens.recv);
        // In place, one buffer serves as both.
        let buf_bytes = if send.is_none() {
            lens.in_place()
        } else {
            recv_bytes
        };
        // A non-root rank's gather output and scatter input are never touched: they may be
        // empty (NCCL lets them be NULL).
        let unused_recv = coll == Collective::Gather && rank != root && send.is_some();
        let unused_send = coll == Collective::Scatter && rank != root;
        if recv.len() != buf_bytes && !(unused_recv && recv.is_empty()) {
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
            && !(unused_send && s.is_empty())
        {
            return Err(bad(format!(
                "count {count} of {dtype} needs a send buffer of {send_bytes} bytes, got {}",
                s.len()
            )));
        }
        Ok(lens.in_place())
    }

    /// A call unlike the recent ones: chooses its algorithm, plans (or finds) its schedule and
    /// compiles it for the executor when it has no peers, and remembers all three for the
    /// calls like it.
    fn first_call(
        &self,
        g: &mut Inner,
        coll: Collective,
        forced: Option<Algo>,
        elem: usize,
        shape: Shape,
        size_bytes: usize,
    ) -> Result<(Algo, Arc<Schedule>, Option<Arc<LocalPlan>>)> {
        let algo = self.choose(coll, forced, size_bytes);
        if !self.can_run(algo) {
            return Err(
                Error::invalid_usage(algo::unavailable(coll, algo).to_string()).rank(shape.rank),
            );
        }
        let sched = g.plan(coll, algo, &shape, self.peers.topology())?;
        let local = g
            .links
            .host
            .as_deref()
            .and_then(|h| LocalPlan::compile(&sched, h.me(), h.ranks().len(), elem))
            .map(Arc::new);
        g.remember(Recent {
            coll,
            forced,
            elem,
            shape,
            algo,
            sched: sched.clone(),
            local: local.clone(),
        });
        Ok((algo, sched, local))
    }

    /// Runs prepared call `p` on these buffers, which fit it.
    fn run_prepared(
        &self,
        g: &mut Inner,
        p: &Prepared,
        send: Option<&[u8]>,
        recv: &mut [u8],
    ) -> Result<()> {
        self.peers.check()?;
        let seq = self.peers.next_seq();
        let job = exec::PlanJob {
            schedule: &p.sched,
            plan: &p.plan,
            send,
            recv,
            dtype: p.call.dtype,
            op: p.call.op,
            info: p.info,
            seq,
            record: Begin { seq, ..p.record },
        };
        exec::run_plan(&self.peers, &mut g.links, &mut g.exec, job).map_err(|e| self.peers.fail(e))
    }

    /// Runs a schedule with the communicator's links, scratch space and executor state.
    pub(crate) fn execute(&self, e: Execution<'_, '_>) -> Result<()> {
        let mut g = self.lock();
        self.execute_locked(&mut g, e)
    }

    /// [`execute`](Engine::execute) with the engine already locked.
    fn execute_locked(&self, inner: &mut Inner, e: Execution<'_, '_>) -> Result<()> {
        let Execution {
            sched,
            send,
            recv,
            extra,
            dtype,
            op,
            info,
            local,
        } = e;
        self.peers.check()?;
        let seq = self.peers.next_seq();
        let scratch_bytes = sched.scratch * dtype.size();
        let need = scratch_bytes.div_ceil(8);
        if inner.scratch.len() < need {
            inner.scratch.resize(need, 0);
        }
        let scratch = &mut bytemuck::cast_slice_mut(&mut inner.scratch[..need])[..scratch_bytes];
        // The entries stay alive (registered) until the run ends, whatever their owners do. A
        // plan has no peers: nothing it does goes through a registration.
        let (reg_send, reg_recv) = if local.is_some() {
            (None, None)
        } else {
            (
                send.and_then(|s| self.registry.lookup(s)),
                self.registry.lookup(recv),
            )
        };
        let job = Job {
            schedule: sched,
            buffers: Buffers {
                send,
                recv,
                scratch,
                extra,
            },
            dtype,
            op,
            info,
            seq,
            registered: Registered {
                send: reg_send.as_ref().map_or(&[], |e| &e.regions),
                recv: reg_recv.as_ref().map_or(&[], |e| &e.regions),
            },
            local,
        };
        exec::run(&self.peers, &mut inner.links, &mut inner.exec, job)
            .map_err(|e| self.peers.fail(e))
    }

    /// Waits for a send to this rank from any peer ([`exec::probe`]).
    pub(crate) fn probe(&self) -> Result<exec::Probed> {
        let mut g = self.lock();
        let Inner { links, exec, .. } = &mut *g;
        exec::probe(&self.peers, links, exec).map_err(|e| {
            // A probe that found nothing left every stream in step; anything else did not.
            if e.kind() == ErrorKind::Timeout {
                e
            } else {
                self.peers.fail(e)
            }
        })
    }

    /// The peers with an endpoint.
    pub(crate) fn connected_peers(&self) -> Vec<usize> {
        self.lock().links.connected()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic inside a collective leaves the links in an unknown state; the communicator
        // records that as its error, and the lock itself stays usable for abort/drop.
        self.inner.lock().unwrap_or_else(|p| {
            self.peers
                .fail(Error::internal("a previous collective panicked").rank(self.rank()));
            p.into_inner()
        })
    }

    /// The schedule that reads and writes the host's ranks' buffers in place
    /// (`ccl_algos::direct`), when this rank's buffers lie in its shared arena, no algorithm
    /// other than `shm` is forced and the cost model prefers the direct schedule at this size
    /// to the algorithm it picks for plain buffers. Each rank decides
    /// from its own buffers; one that decides otherwise than a peer fails at the first barrier
    /// with an error naming it, before it reads anything.
    #[allow(clippy::too_many_arguments)]
    fn direct_plan(
        &self,
        g: &Inner,
        coll: Collective,
        forced: Option<Algo>,
        shape: &Shape,
        size_bytes: usize,
        send: Option<&[u8]>,
        recv: &[u8],
    ) -> Option<Schedule> {
        if !matches!(forced, None | Some(Algo::Shm)) || shape.count == 0 {
            return None;
        }
        let h = g.links.host.as_deref()?;
        if !h.shared(recv) || send.is_some_and(|s| !h.shared(s)) {
            return None;
        }
        let topo = self.peers.topology();
        let chosen = self.choose(coll, forced, size_bytes);
        let ok = self.can_run(Algo::Shm)
            && ccl_algos::direct::pays(coll, chosen, self.size(), size_bytes, &self.model, topo);
        ok.then(|| ccl_algos::direct::build(coll, shape)).flatten()
    }
}

/// Whether any of the buffers lies in this rank's shared arena (the host's ranks then read and
/// write them in place, by a schedule built per call).
fn in_arena(g: &Inner, send: Option<&[u8]>, recv: &[u8]) -> bool {
    g.links
        .host
        .as_deref()
        .is_some_and(|h| h.shared(recv) || send.is_some_and(|s| h.shared(s)))
}

impl Inner {
    /// The algorithm and schedule of a recent call with the same key.
    fn recent(
        &self,
        coll: Collective,
        forced: Option<Algo>,
        elem: usize,
        shape: &Shape,
    ) -> Option<(Algo, Arc<Schedule>, Option<Arc<LocalPlan>>)> {
        self.recent
            .iter()
            .find(|r| r.coll == coll && r.forced == forced && r.elem == elem && r.shape == *shape)
            .map(|r| (r.algo, r.sched.clone(), r.local.clone()))
    }

    /// Remembers a call, in place of the oldest once there are [`RECENT`].
    fn remember(&mut self, r: Recent) {
        if self.recent.len() < RECENT {
            self.recent.push(r);
        } else {
            self.recent[self.recent_next % RECENT] = r;
        }
        self.recent_next = (self.recent_next + 1) % RECENT;
    }

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
                .map_err(|m| Error::invalid_usage(m.to_string()).rank(shape.rank))?,
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
