//! The transport half of a communicator: who the ranks are, connections to every peer, the
//! sticky error and abort. (The `ccl` crate's `Communicator` adds algorithms, schedules and
//! issue order on top.)
//!
//! [`Peers`] is the shared, thread-safe part (rank, size, settings, host names, abort signal,
//! first error); [`Links`] holds the endpoints, which the collective executor drives with
//! exclusive access. Keeping them apart lets `abort()` run from any thread while a collective holds the
//! links. How a rank waits for its peers (spin, then sleep on the endpoints, the abort signal and
//! the job monitor) is in [`wait`].

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::wireup::{self, HostId, Record};
use ccl_bootstrap::{Bootstrap, Monitor, Notice};
use ccl_core::config::Config;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::topology::{TopoFile, Topology};
use ccl_core::transport::{
    ConnectContext, Endpoint, Handle, HostMemory, Listener, Transport, TransportProperties,
};
use ccl_core::{ccl_info, ccl_warn, net};
use ccl_diag::recorder::Recorder;
use ccl_diag::{Dump, Meta};

pub mod wait;

/// Ends every wait of a communicator: a flag checked by busy loops and an eventfd that wakes
/// `poll(2)`.
#[derive(Debug)]
pub struct AbortSignal {
    flag: AtomicBool,
    fd: EventFd,
}

impl AbortSignal {
    pub fn new() -> Result<AbortSignal> {
        Ok(AbortSignal {
            flag: AtomicBool::new(false),
            fd: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()))?,
        })
    }

    /// Raises the signal (idempotent).
    pub fn raise(&self) {
        self.flag.store(true, Ordering::Release);
        let _ = self.fd.write(1);
    }

    #[inline]
    pub fn is_raised(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Readable once raised; add it to every poll set.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The ranks of a communicator as the transport layer holds them: rank and size, settings, hosts
/// and topology, which transport each peer uses, the job monitor, the flight recorder, abort and
/// the sticky error. Thread-safe; the endpoints themselves are in [`Links`].
#[derive(Debug)]
pub struct Peers {
    rank: usize,
    size: usize,
    config: Config,
    transport_name: String,
    peer_transports: Vec<Option<&'static str>>,
    summary: String,
    transport_props: ccl_core::transport::TransportProperties,
    /// CPUs of this machine (0: unknown).
    cpus: usize,
    hosts: Vec<String>,
    /// Every rank's machine: its boot id, else (unknown) its host name.
    machines: Vec<String>,
    /// Process id of every rank, in rank order.
    pids: Vec<u32>,
    topology: Topology,
    local_ip: std::net::IpAddr,
    /// The rendezvous root's watch over the job (absent for a single rank).
    monitor: Option<Monitor>,
    /// The rank whose process runs the root, if one does.
    root_host: Option<usize>,
    /// The same on every rank of this communicator (names its trace dumps).
    tag: String,
    recorder: Mutex<Recorder>,
    slow: Mutex<SlowTracker>,
    abort: AbortSignal,
    error: Mutex<Option<Error>>,
    /// Whether `error` holds one: every operation checks, and a load costs it less than the
    /// lock round trip.
    failed: AtomicBool,
    seq: AtomicU64,
    /// Shrink rounds the root has decided that this rank has seen.
    shrink_round: std::sync::atomic::AtomicU32,
    /// The last operation an early warning was asked for (so each warns once).
    warned_seq: AtomicU64,
    /// When the slow-rank report was last logged.
    slow_logged: Mutex<Option<Instant>>,
}

/// Connections to every peer, indexed by rank (`None` for this rank), and the memory this rank
/// shares with the other ranks of its host (all of the communicator's ranks on one host, or
/// the host's own when the communicator spans hosts).
#[derive(Debug, Default)]
pub struct Links {
    pub endpoints: Vec<Option<Box<dyn Endpoint>>>,
    pub host: Option<Box<dyn HostMemory>>,
}

impl Links {
    /// The endpoint to `peer`.
    pub fn get(&mut self, peer: usize) -> Result<&mut Box<dyn Endpoint>> {
        self.endpoints
            .get_mut(peer)
            .and_then(|e| e.as_mut())
            .ok_or_else(|| Error::internal(format!("no connection to peer {peer}")))
    }
}

impl Peers {
    /// Connects to every peer, using `bootstrap` to exchange where each rank runs and a handle
    /// for each of its transports, then releases the bootstrap.
    ///
    /// `candidates` are the transports usable on this rank, most preferred first; each pair of
    /// ranks uses the first one that both have and that can connect them ([`wireup::choose`]):
    /// shared memory within a host, verbs or TCP across.
    // Long: one sequence whose every step needs what the one before produced (settings and
    // topology, listeners, the record exchange, the choice per pair, the job monitor, the
    // connections, what ended up in use); each step's work is a function of its own.
    pub fn connect(
        mut bootstrap: Bootstrap,
        candidates: Vec<Arc<dyn Transport>>,
        config: Config,
    ) -> Result<(Arc<Peers>, Links)> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        for var in &config.unknown {
            ccl_warn!(
                Some(rank),
                "{var} is set but is not a ccl setting (see docs/env.md)"
            );
        }
        // Read the topology file before any exchange, so a bad file fails here, on every rank.
        let topo_file = read_topology(&config, size, rank)?;
        let local_ip = match &config.socket_ifname {
            Some(spec) => net::pick_local_ip(Some(spec)).map_err(|e| e.rank(rank))?,
            None => bootstrap.local_ip()?,
        };
        let ctx = ConnectContext {
            rank,
            size,
            secret: bootstrap.secret(),
            local_ip,
            config: config.clone(),
        };
        let listeners = candidates
            .iter()
            .map(|t| (size > 1).then(|| t.listen(&ctx)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let fp = match (&config.topology, &topo_file) {
            (Some(t), _) => t.fingerprint().max(1),
            (None, Some(f)) => f.fingerprint(),
            (None, None) => 0,
        };
        let records = exchange_records(&mut bootstrap, &candidates, &listeners, fp)?;
        check_fingerprints(&records, fp, rank)?;
        let hosts: Vec<String> = records.iter().map(|r| r.host.name.clone()).collect();
        let pids: Vec<u32> = records.iter().map(|r| r.host.pid).collect();
        let machines: Vec<String> = records
            .iter()
            .map(|r| match r.host.boot_id.as_str() {
                "" => r.host.name.clone(),
                b => b.to_string(),
            })
            .collect();
        let topology = match (&config.topology, &topo_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => f.resolve(&hosts).map_err(|e| e.rank(rank))?,
            // Hosts by name and machine: two machines (VMs, say) that share a host name are
            // still two hosts.
            (None, None) => Topology::from_hosts(
                &hosts
                    .iter()
                    .zip(&machines)
                    .map(|(h, m)| format!("{h}\0{m}"))
                    .collect::<Vec<_>>(),
            ),
        };
        let chosen = wireup::choose(rank, &records, &candidates)?;
        let root_host = records.iter().position(|r| r.runs_root);
        // From here on the root passes failures on: a rank that dies or fails while the others
        // connect is named to them at once. A rank alone has nobody to tell.
        let monitor = if size > 1 {
            Some(bootstrap.into_monitor()?)
        } else {
            bootstrap.finish()?;
            None
        };
        let watch = |awaited: &[usize]| setup_watch(monitor.as_ref(), rank, root_host, awaited);
        let deadline = Instant::now() + config.timeout;
        let endpoints = wireup::connect_all(
            &ctx,
            &candidates,
            listeners,
            &chosen,
            &records,
            deadline,
            &watch,
        )
        .inspect_err(|e| {
            // Tell the others, unless the failure is one they told us about.
            if let (Some(m), false) = (&monitor, e.message().contains("during set-up")) {
                m.report(&e.to_string());
            }
        })?;
        let summary = wireup::summary(&records, rank, &chosen, &candidates);
        ccl_info!(
            Some(rank),
            "communicator ready: {size} ranks, {summary} (listening on {local_ip})"
        );
        if let (Some(path), true, 0) = (&config.topo_file, topo_file.is_some(), rank) {
            log_topology(path, &topology);
        }
        let groups = topology.host_groups();
        let every_host = wireup::hosts_share_memory(&records, &candidates, &groups);
        let my_host = topology.host_peers(rank);
        let InUse {
            peer_transports,
            props,
            name: transport_name,
            host,
        } = in_use(&chosen, &candidates, &my_host, every_host);
        if let Some(h) = &host {
            ccl_info!(
                Some(rank),
                "host memory: {} ranks of this host share a segment of {} KiB slots{}; rings of {} KiB each way between two of them",
                h.ranks().len(),
                h.slot_len() >> 10,
                if groups.len() > 1 && every_host {
                    ", as do every host's"
                } else {
                    ""
                },
                config.shm_ring_size >> 10
            );
        }
        let tag = comm_tag(&ctx.secret);
        let (trace_buffer, trace_counter) = (config.trace_buffer, config.trace_counter);
        let comm = Peers {
            rank,
            size,
            config,
            transport_name,
            peer_transports,
            summary,
            transport_props: props,
            cpus: online_cpus(),
            topology,
            local_ip,
            hosts,
            machines,
            pids,
            monitor,
            root_host,
            tag,
            recorder: Mutex::new(Recorder::with_clock(
                trace_buffer,
                if trace_counter {
                    ccl_diag::recorder::fast_clock()
                } else {
                    ccl_diag::recorder::now_us
                },
            )),
            slow: Mutex::new(SlowTracker::new(size)),
            abort: AbortSignal::new()?,
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            shrink_round: std::sync::atomic::AtomicU32::new(0),
            warned_seq: AtomicU64::new(0),
            slow_logged: Mutex::new(None),
        };
        let comm = Arc::new(comm);
        if let Some(m) = &comm.monitor {
            let weak = Arc::downgrade(&comm);
            m.set_state_source(Box::new(move || {
                weak.upgrade()
                    .map_or_else(Vec::new, |c| ccl_diag::verdict::encode(&c.state_view()))
            }));
            if comm.config.trace_dir.is_some() || comm.config.trace_torch_file.is_some() {
                let weak = Arc::downgrade(&comm);
                let once = std::sync::atomic::AtomicBool::new(false);
                m.set_notice_hook(Box::new(move |n| {
                    if let Some(c) = weak.upgrade()
                        && !once.swap(true, Ordering::AcqRel)
                    {
                        c.dump_outside_operations(n);
                    }
                }));
            }
        }
        if comm.config.trace_dir.is_some() || comm.config.trace_torch_file.is_some() {
            watch_sigusr1(&comm);
        }
        Ok((comm, Links { endpoints, host }))
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The transport every pair uses (`shm`, `tcp`, `ib`, `local`), or the ones in use joined by
    /// `+` (`shm+tcp`) when pairs differ.
    pub fn transport_name(&self) -> &str {
        &self.transport_name
    }

    /// The transport this rank uses with `peer` (`None` for itself).
    pub fn peer_transport(&self, peer: usize) -> Option<&'static str> {
        self.peer_transports.get(peer).copied().flatten()
    }

    /// What connects to what, e.g. `2 hosts x 2 ranks: shm within hosts, tcp across`.
    pub fn transport_summary(&self) -> &str {
        &self.summary
    }

    /// The transport's properties as the cost model sees them on this rank's machine: what the
    /// transport says of itself, adjusted for ranks that share the CPUs.
    pub fn cost_properties(&self) -> ccl_core::transport::TransportProperties {
        ccl_algos::cost::on_shared_cpus(
            self.transport_properties(),
            self.ranks_on_host(),
            self.machine_cpus(),
        )
    }

    /// What the transport says of itself (the cost model adjusts it for shared CPUs).
    pub fn transport_properties(&self) -> ccl_core::transport::TransportProperties {
        self.transport_props
    }

    /// How many ranks of this communicator share this rank's machine, and so its CPUs (this one
    /// included): same boot id, whatever their host names (hosts in UTS namespaces or
    /// containers on one machine still share its CPUs).
    pub fn ranks_on_host(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| **m == self.machines[self.rank])
            .count()
    }

    /// CPUs of this machine, not of this process: a launcher may have bound each rank to one
    /// (0: unknown).
    pub fn machine_cpus(&self) -> usize {
        self.cpus
    }

    /// Host name of every rank, in rank order.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The address this rank listens on (where peers reached it).
    pub fn local_ip(&self) -> std::net::IpAddr {
        self.local_ip
    }

    /// Where the ranks are (host, rack, zone).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Fails the communicator and ends every wait at once. Safe to call more than once and from
    /// any thread. The other ranks hear of it and fail too, instead of waiting for this one.
    pub fn abort(&self) {
        self.fail(Error::new(ErrorKind::Aborted, "the communicator was aborted").rank(self.rank));
        self.abort.raise();
    }

    fn notice_error(&self, n: &Notice) -> Error {
        let what = if n.died { "died" } else { "failed" };
        Error::remote(format!(
            "{}rank {} {what}: {}",
            verdict_prefix(&n.verdict),
            n.rank,
            n.message
        ))
        .rank(self.rank)
        // A rank is no peer of its own: on the receiving end of a stalled link it is the
        // culprit the verdict names first.
        .peer(n.culprit.filter(|&c| c != self.rank).unwrap_or(n.rank))
    }

    /// Fails with the first failure notice that has arrived, if any, or with the revocation.
    fn check_notices(&self) -> Result<()> {
        let Some(m) = &self.monitor else {
            return Ok(());
        };
        if let Some(n) = m.poll() {
            return Err(self.record(self.notice_error(&n)));
        }
        if let Some(n) = m.revoked() {
            let e = Error::new(ErrorKind::Revoked, n.message).rank(self.rank);
            return Err(self.record(e));
        }
        Ok(())
    }

    /// Revokes the communicator on every rank: this rank's operations, pending and future, fail
    /// at once with [`ErrorKind::Revoked`], and the root tells every other rank, whose operations
    /// then fail the same way. Unlike a failure, a revocation is no error of this rank's: the
    /// survivors of a failure revoke so that no rank keeps waiting, then shrink.
    pub fn revoke(&self) {
        self.record(
            Error::new(ErrorKind::Revoked, "this rank revoked the communicator").rank(self.rank),
        );
        if let Some(m) = &self.monitor {
            m.revoke();
        }
        self.abort.raise();
    }

    /// The ranks the job's root has reported failed or dead so far (a rank that failed on its
    /// own, e.g. by timing out, reports itself; one that vanished is reported by the root).
    pub fn failed_ranks(&self) -> Vec<usize> {
        self.monitor
            .as_ref()
            .map(|m| m.failed_ranks())
            .unwrap_or_default()
    }

    /// Asks the job's root which ranks survive a shrink (see `ccl_bootstrap`'s recovery):
    /// the members of the new communicator, as ranks of this one, and its unique id. A rank that
    /// asks again (the new communicator failed to form) joins the next round. Revokes this communicator here
    /// first: nothing more runs on it.
    pub fn shrink_agree(
        &self,
        exclude: &[usize],
        deadline: std::time::Instant,
    ) -> Result<(Vec<usize>, ccl_bootstrap::UniqueId)> {
        self.record(Error::new(ErrorKind::Revoked, "the communicator was shrunk").rank(self.rank));
        self.abort.raise();
        let Some(m) = &self.monitor else {
            return Err(Error::invalid_usage(
                "cannot shrink a communicator of one rank (it has no rendezvous to agree through)",
            )
            .rank(self.rank));
        };
        let round = self.shrink_round.load(Ordering::Acquire);
        let d = m.shrink(round, exclude, self.size, deadline)?;
        self.shrink_round.store(d.round, Ordering::Release);

        let id = ccl_bootstrap::UniqueId::from_bytes(&d.id).map_err(|e| {
            Error::remote(format!(
                "the rendezvous sent a bad unique id for the shrunk communicator: {e}"
            ))
            .rank(self.rank)
        })?;
        Ok((d.members, id))
    }

    /// A transport error or a timeout often only shows the neighbour that gave up after the
    /// real failure (in a ring, rank 0 sees rank 3 close because rank 3 saw rank 2 die). Reports
    /// this rank's own failure to the job's monitor, waits (with deadlines) for its notice of
    /// the first failure, which carries the monitor's verdict on which rank the job waits for,
    /// and puts that verdict first in the error, with what was seen here.
    pub fn explain(&self, e: Error) -> Error {
        if !matches!(e.kind(), ErrorKind::Remote | ErrorKind::Timeout) {
            return e;
        }
        // Already explained (a notice failed this communicator while it waited).
        if let Some(first) = self.error() {
            return first;
        }
        let Some(m) = &self.monitor else { return e };
        if e.kind() == ErrorKind::Timeout {
            // This rank's own failure: the monitor needs it to start the verdict.
            m.report(&e.to_string());
        }
        let acks = m.acks();
        // The root acknowledges a report at once and gathers the verdict within GATHER; a root
        // that does not even acknowledge is stopped or hung itself. A peer that closed its
        // connection (Remote) was seen by the others too: some rank's report is on its way.
        let notice = m.wait(ROOT_SILENT).or_else(|| {
            let alive = m.acks() > acks || e.kind() == ErrorKind::Remote;
            if alive && !m.root_gone() {
                m.wait(ccl_bootstrap::GATHER + VERDICT_SLACK)
            } else {
                None
            }
        });
        // A peer that returned from a revoked communicator and closed is no failure of its own.
        if notice.is_none()
            && let Some(n) = m.revoked()
        {
            return Error::new(
                ErrorKind::Revoked,
                format!("{} (seen here as: {})", n.message, e.message()),
            )
            .rank(self.rank);
        }
        match notice {
            Some(n) if n.rank == self.rank => Error::new(
                e.kind(),
                format!("{}{}", verdict_prefix(&n.verdict), e.message()),
            )
            .rank(self.rank)
            .peer(
                n.culprit
                    .filter(|&c| c != self.rank)
                    .or(e.peer_id())
                    .unwrap_or(self.rank),
            ),
            // Even a notice from the neighbour that closed carries its own cause, which leads on
            // to the rank that failed first.
            Some(n) => {
                let first = self.notice_error(&n);
                Error::remote(format!(
                    "{} (seen here as: {})",
                    first.message(),
                    e.message()
                ))
                .rank(self.rank)
                .peer(first.peer_id().unwrap_or(n.rank))
            }
            // No notice can come when the root itself went: then the rank running it ended.
            None if m.root_gone() && self.root_host.is_some_and(|h| h != self.rank) => {
                let h = self.root_host.expect("checked");
                Error::remote(format!(
                    "verdict: the job is stuck behind {}, which died (its process ended: the job's rendezvous, which it ran, closed); seen here as: {}",
                    self.who(h),
                    e.message()
                ))
                .rank(self.rank)
                .peer(h)
            }
            None if m.acks() == acks && self.root_host.is_some_and(|h| h != self.rank) => {
                let h = self.root_host.expect("checked");
                Error::new(
                    e.kind(),
                    format!(
                        "verdict: the job is stuck behind {}, which does not answer (stopped, or its process is hung): the job's monitor runs in its process and did not acknowledge this rank's report within {:.1} s; {}",
                        self.who(h),
                        ROOT_SILENT.as_secs_f64(),
                        e.message()
                    ),
                )
                .rank(self.rank)
                .peer(h)
            }
            None => e,
        }
    }

    /// Tells the root whether this rank's part of the communicator of the last shrink round
    /// formed, and returns whether every member's did (only then may it be used; otherwise ask
    /// again with [`shrink_agree`](Self::shrink_agree)).
    pub fn shrink_formed(&self, ok: bool, deadline: std::time::Instant) -> Result<bool> {
        let m = self.monitor.as_ref().ok_or_else(|| {
            Error::internal("a shrink's outcome without a rendezvous").rank(self.rank)
        })?;
        m.formed(self.shrink_round.load(Ordering::Acquire), ok, deadline)
    }

    /// `rank R (host:pid)`.
    fn who(&self, r: usize) -> String {
        format!(
            "rank {r} ({}:{})",
            self.hosts.get(r).map_or("?", |h| h.as_str()),
            self.pids.get(r).copied().unwrap_or(0)
        )
    }

    /// What this rank is doing, for the job's monitor: its last operations and slow-rank
    /// figures.
    pub fn state_view(&self) -> ccl_diag::verdict::RankView {
        let ops = ccl_diag::dump::last_ops(&self.recorder(), 2);
        ccl_diag::verdict::RankView {
            rank: self.rank,
            host: ccl_core::log::hostname().to_string(),
            pid: std::process::id(),
            presence: ccl_diag::verdict::Presence::Answered,
            now_us: ccl_diag::recorder::now_us(),
            ops,
            slow: self.slow_peers(),
        }
    }

    /// Called while this rank waits: when the current operation has run much longer than
    /// usual (`CCL_LATE_WARN_MS`), asks the job's monitor once for the verdict, which the
    /// monitor thread logs as a warning.
    pub fn warn_if_late(&self) {
        let Some(m) = &self.monitor else { return };
        let (seq, text) = {
            let r = self.recorder();
            let Some(e) = r.entries().last() else { return };
            if e.state != ccl_diag::recorder::State::Running
                || self.warned_seq.load(Ordering::Relaxed) >= e.seq
            {
                return;
            }
            let usual = r.usual_us(e.name, e.bytes);
            let Some(limit) = late_limit(&self.config, usual) else {
                return;
            };
            let ran =
                Duration::from_micros(ccl_diag::recorder::now_us().saturating_sub(e.start_us));
            if ran < limit {
                return;
            }
            let usual = usual.map_or(String::new(), |u| {
                format!(" (usually {:.1} ms)", u as f64 / 1e3)
            });
            (
                e.seq,
                format!(
                    "late operation: {} #{} ({}, {}) has run {:.1} s{usual}; verdict",
                    e.name,
                    e.seq,
                    e.algo,
                    ccl_diag::verdict::human_bytes(e.bytes),
                    ran.as_secs_f64()
                ),
            )
        };
        self.warned_seq.store(seq, Ordering::Relaxed);
        m.request_verdict(&text);
    }

    /// The first error this communicator failed with, if any.
    pub fn error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Ok` unless the communicator has failed; then the original error.
    pub fn check(&self) -> Result<()> {
        match self.error() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Records `e` as the communicator's error unless one is already recorded; returns the
    /// recorded one. Errors stick: a collective that failed part-way leaves peers and buffers in
    /// an unknown state, so nothing more may run.
    pub fn fail(&self, e: Error) -> Error {
        let first = self.record(e.clone());
        // Only this rank's own failure is news for the others; one learned from a notice is
        // already known to them, and so is a revocation.
        if first.to_string() == e.to_string()
            && e.kind() != ErrorKind::Revoked
            && let Some(m) = &self.monitor
        {
            m.report(&e.to_string());
        }
        first
    }

    /// Records `e` as the communicator's error unless one is already recorded (without telling
    /// the other ranks); returns the recorded one.
    fn record(&self, e: Error) -> Error {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        match &*g {
            Some(first) => first.clone(),
            None => {
                ccl_warn!(Some(self.rank), "communicator failed: {e}");
                *g = Some(e.clone());
                self.failed.store(true, Ordering::Release);
                drop(g);
                self.dump_trace(&e.to_string());
                e
            }
        }
    }

    /// The flight recorder.
    pub fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.recorder.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recorder as a dump, written now for `reason`.
    pub fn trace_dump(&self, reason: &str) -> Dump {
        Dump::of(&self.recorder(), &self.trace_meta(reason))
    }

    /// The recorder as JSON (what a dump file holds).
    pub fn trace_json(&self, reason: &str) -> String {
        self.trace_dump(reason).to_json()
    }

    fn trace_meta(&self, reason: &str) -> Meta {
        Meta {
            comm: self.tag.clone(),
            rank: self.rank,
            size: self.size,
            host: ccl_core::log::hostname().to_string(),
            pid: std::process::id(),
            reason: reason.to_string(),
        }
    }

    /// Writes the recorder to `CCL_TRACE_DIR` and, in PyTorch's format, to
    /// `CCL_TRACE_TORCH_FILE`, those that are set; returns the file written to `CCL_TRACE_DIR`.
    pub fn dump_trace(&self, reason: &str) -> Option<std::path::PathBuf> {
        if let Some(prefix) = &self.config.trace_torch_file {
            let path = ccl_core::log::expand_path(prefix).replace("%c", &self.tag);
            let bytes = ccl_diag::torch::pickle(&self.trace_dump(reason));
            self.write_dump(
                std::path::PathBuf::from(format!("{path}{}", self.rank)),
                &bytes,
                reason,
            );
        }
        let dir = ccl_core::log::expand_path(self.config.trace_dir.as_deref()?);
        let path = std::path::Path::new(&dir).join(Dump::file_name(&self.tag, self.rank));
        self.write_dump(path, self.trace_json(reason).as_bytes(), reason)
    }

    /// Dumps the recorder on the first failure notice when this rank is in none of its
    /// operations: it learns of the failure only at its next call, and a rank in its own code
    /// is often the one the job waits for, whose dump (without the operation the others are
    /// in) an analyser needs most. A rank inside an operation dumps when that operation fails.
    fn dump_outside_operations(&self, n: &ccl_bootstrap::Notice) {
        let outside = self
            .recorder()
            .current()
            .is_none_or(|e| e.state != ccl_diag::recorder::State::Running);
        if outside {
            let what = if n.died { "died" } else { "failed" };
            self.dump_trace(&format!(
                "rank {} {what} while this rank was outside ccl: {}",
                n.rank, n.message
            ));
        }
    }

    /// Writes a dump whole (a reader never sees half a file) and says where it went.
    fn write_dump(
        &self,
        path: std::path::PathBuf,
        bytes: &[u8],
        reason: &str,
    ) -> Option<std::path::PathBuf> {
        let write = || -> std::io::Result<()> {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)?;
            }
            let mut tmp = path.clone().into_os_string();
            tmp.push(format!(".tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)
        };
        match write() {
            Ok(()) => {
                ccl_warn!(
                    Some(self.rank),
                    "flight recorder written to {} ({reason})",
                    path.display()
                );
                Some(path)
            }
            Err(e) => {
                ccl_warn!(
                    Some(self.rank),
                    "cannot write the flight recorder to {}: {e}",
                    path.display()
                );
                None
            }
        }
    }

    /// Counts one operation's lateness of each peer (microseconds, from operation headers) and
    /// names a peer that stays late, as the slow-rank report.
    pub fn note_lateness(&self, late: impl Iterator<Item = (usize, i64)>) {
        let window = self.config.slow_window as u64;
        let limit_us = self.config.slow_ms as i64 * 1000;
        let mut s = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        for (peer, us) in late {
            if let Some(p) = s.peers.get_mut(peer) {
                p.sum_us += us;
                p.ops += 1;
            }
        }
        s.ops += 1;
        if s.ops < window {
            return;
        }
        let mut report = Vec::new();
        let mut figures = Vec::new();
        for (peer, p) in s.peers.iter_mut().enumerate() {
            let mean = if p.ops > 0 {
                p.sum_us / p.ops as i64
            } else {
                0
            };
            if p.ops > 0 {
                figures.push((peer, mean));
            }
            let slow = p.ops > 0 && mean >= limit_us;
            if slow && p.slow_windows >= 1 {
                ccl_warn!(
                    Some(self.rank),
                    "slow rank: peer {peer} entered operations {:.1} ms after this rank on average over the last {} operations with it (and the window before)",
                    mean as f64 / 1000.0,
                    p.ops
                );
                report.push(SlowPeer {
                    peer,
                    mean_late_us: mean,
                    ops: p.ops,
                });
            }
            p.slow_windows = if slow { p.slow_windows + 1 } else { 0 };
            p.sum_us = 0;
            p.ops = 0;
        }
        s.ops = 0;
        s.report = report;
        drop(s);
        self.log_slow_report(&figures, window);
    }

    /// The periodic slow-rank report (`CCL_SLOW_REPORT_S`): every peer's mean lateness over the
    /// window just ended, and the latest one by host and pid.
    fn log_slow_report(&self, figures: &[(usize, i64)], window: u64) {
        let every = self.config.slow_report;
        if every.is_zero() || figures.is_empty() {
            return;
        }
        {
            let mut last = self.slow_logged.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < every) {
                return;
            }
            *last = Some(Instant::now());
        }
        let list: Vec<String> = figures
            .iter()
            .map(|(p, m)| format!("peer {p} {:+.1} ms", *m as f64 / 1e3))
            .collect();
        let &(worst, mean) = figures.iter().max_by_key(|(_, m)| *m).expect("not empty");
        let verdict = if mean >= self.config.slow_ms as i64 * 1000 {
            format!(
                "the rank this one waits for: {} ({:.1} ms late on average)",
                self.who(worst),
                mean as f64 / 1e3
            )
        } else {
            format!("no peer is {} ms late", self.config.slow_ms)
        };
        ccl_warn!(
            Some(self.rank),
            "slow-rank report over the last {window} operations: mean lateness {}; {verdict}",
            list.join(", ")
        );
    }

    /// The peers the last slow-rank window named.
    pub fn slow_peers(&self) -> Vec<SlowPeer> {
        self.slow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .report
            .clone()
    }

    /// The next collective sequence number (1, 2, ...).
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }
}

pub use ccl_diag::verdict::SlowPeer;

/// A root that has not acknowledged a failure report within this is taken to be stopped.
const ROOT_SILENT: Duration = Duration::from_millis(1500);
/// Beyond the root's gathering deadline, what passing the verdict on may take on a loaded
/// machine.
const VERDICT_SLACK: Duration = Duration::from_millis(1500);

/// `verdict: ...; ` before a message, when there is a verdict.
fn verdict_prefix(v: &str) -> String {
    if v.is_empty() {
        String::new()
    } else {
        format!("verdict: {v}; ")
    }
}

/// How long an operation may run before the early warning (`None`: never): `CCL_LATE_WARN_MS`
/// when set to a number, else (`auto`) ten times the recent median of the same operation and
/// size, at least `CCL_LATE_WARN_FLOOR_MS`; half the timeout while there is no median yet.
fn late_limit(config: &Config, usual_us: Option<u64>) -> Option<Duration> {
    let floor = Duration::from_millis(config.late_warn_floor_ms);
    match config.late_warn_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(match usual_us {
            Some(u) => (Duration::from_micros(u) * 10).max(floor),
            None => (config.timeout / 2).max(floor),
        }),
    }
}

#[derive(Debug, Default, Clone)]
struct PeerLateness {
    sum_us: i64,
    ops: u64,
    slow_windows: u32,
}

#[derive(Debug)]
struct SlowTracker {
    peers: Vec<PeerLateness>,
    ops: u64,
    report: Vec<SlowPeer>,
}

impl SlowTracker {
    fn new(n: usize) -> SlowTracker {
        SlowTracker {
            peers: vec![PeerLateness::default(); n],
            ops: 0,
            report: Vec::new(),
        }
    }
}

/// Reads `CCL_TOPO_FILE` unless a topology was given in code; checks a given one's size.
fn read_topology(config: &Config, size: usize, rank: usize) -> Result<Option<TopoFile>> {
    if let Some(t) = &config.topology {
        if t.size() != size {
            return Err(Error::invalid_argument(format!(
                "the topology given describes {} ranks but the world has {size}",
                t.size()
            ))
            .rank(rank));
        }
        return Ok(None);
    }
    config
        .topo_file
        .as_ref()
        .map(|path| TopoFile::read(std::path::Path::new(path)).map_err(|e| e.rank(rank)))
        .transpose()
}

/// Publishes this rank's record (where it runs, its topology's fingerprint `fp`, a handle per
/// transport: `listeners[t]` listens for `candidates[t]`, none when alone) and returns every
/// rank's, in rank order.
fn exchange_records(
    bootstrap: &mut Bootstrap,
    candidates: &[Arc<dyn Transport>],
    listeners: &[Option<Box<dyn Listener>>],
    fp: u64,
) -> Result<Vec<Record>> {
    let record = Record {
        runs_root: ccl_bootstrap::root_is_local(bootstrap.root()),
        topo_fp: fp,
        host: HostId::current(),
        offers: candidates
            .iter()
            .zip(listeners)
            .map(|(t, l)| {
                (
                    t.name().to_string(),
                    l.as_ref()
                        .map_or_else(|| Handle::new(&[]).expect("empty"), |l| l.handle()),
                )
            })
            .collect(),
    };
    let rank = bootstrap.rank();
    bootstrap
        .allgather(&record.encode())?
        .iter()
        .enumerate()
        .map(|(r, b)| Record::decode(b, r).map_err(|e| e.rank(rank)))
        .collect()
}

/// Says (rank 0, info level) what the topology file at `path` described.
fn log_topology(path: &str, topology: &Topology) {
    let sm = topology.summary();
    ccl_info!(
        Some(0),
        "topology from {path}: {} hosts ({} to {} ranks each), {} racks, {} zones",
        sm.hosts,
        sm.min_per_host,
        sm.max_per_host,
        sm.racks,
        sm.zones
    );
}

/// Fails when, during set-up, the root has announced another rank's failure, or when the rank
/// that ran the root, which this rank still waits for, has gone.
fn setup_watch(
    monitor: Option<&Monitor>,
    rank: usize,
    root_host: Option<usize>,
    awaited: &[usize],
) -> Result<()> {
    let Some(m) = monitor else { return Ok(()) };
    if let Some(n) = m.poll() {
        let what = if n.died { "died" } else { "failed" };
        return Err(Error::remote(format!(
            "rank {} {what} during set-up: {}",
            n.rank, n.message
        ))
        .rank(rank)
        .peer(n.rank));
    }
    if let Some(msg) = m.root_error() {
        return Err(Error::remote(format!("during set-up: {msg}")).rank(rank));
    }
    match root_host {
        Some(h) if awaited.contains(&h) && m.root_gone() => Err(Error::remote(format!(
            "rank {h} died or exited during set-up: the job's rendezvous, which it ran, closed"
        ))
        .rank(rank)
        .peer(h)),
        _ => Ok(()),
    }
}

/// Every rank must use the same topology.
fn check_fingerprints(records: &[Record], fp: u64, rank: usize) -> Result<()> {
    let set = |f: u64| if f == 0 { "unset" } else { "set" };
    match records.iter().position(|r| r.topo_fp != fp) {
        None => Ok(()),
        Some(r) => Err(Error::invalid_usage(format!(
            "the topology (CCL_TOPO_FILE) differs between this rank ({}) and rank {r} ({}); \
             every rank must use the same",
            set(fp),
            set(records[r].topo_fp)
        ))
        .rank(rank)),
    }
}

/// Of the `candidates`, given the one `chosen` for each peer: each peer's transport by name, the
/// properties of those in use together ([`slowest`]), and their label ([`transport_label`]).
/// What a communicator's connections use, once made.
struct InUse {
    /// Per peer, the transport's name.
    peer_transports: Vec<Option<&'static str>>,
    /// As the cost model sees them: the slowest transport in use, and whether the ranks of every
    /// host share host memory.
    props: TransportProperties,
    /// `tcp`, `shm+tcp`, ...
    name: String,
    /// The memory this rank shares with the other ranks of its host.
    host: Option<Box<dyn HostMemory>>,
}

/// `my_host`: the ranks of this rank's host as the topology places them; `every_host`: whether
/// every host's ranks share memory ([`wireup::hosts_share_memory`]).
fn in_use(
    chosen: &[Option<usize>],
    candidates: &[Arc<dyn Transport>],
    my_host: &[usize],
    every_host: bool,
) -> InUse {
    let peer_transports = chosen
        .iter()
        .map(|c| c.map(|t| candidates[t].name()))
        .collect();
    let used: Vec<&Arc<dyn Transport>> = candidates
        .iter()
        .enumerate()
        .filter(|(t, _)| chosen.contains(&Some(*t)))
        .map(|(_, t)| t)
        .collect();
    // Host memory serves collectives when it holds exactly this host's ranks: the whole
    // communicator (`shm` algorithms) or one host of several (`hiershm`), whose schedules
    // number slots by the host's ranks in order.
    let host = used
        .iter()
        .find_map(|t| t.take_host())
        .filter(|h| h.ranks() == my_host);
    let mut props = slowest(&used).unwrap_or_else(|| candidates[0].properties());
    props.host_memory = every_host;
    InUse {
        peer_transports,
        props,
        name: transport_label(&used, candidates),
        host,
    }
}

/// The transport with the lowest bandwidth among those in use (what bounds an algorithm whose
/// steps cross every kind of link), with the longest spin any of them wants.
fn slowest(used: &[&Arc<dyn Transport>]) -> Option<ccl_core::transport::TransportProperties> {
    let spin = used.iter().map(|t| t.properties().spin).max()?;
    used.iter()
        .map(|t| t.properties())
        .min_by(|a, b| a.bandwidth.total_cmp(&b.bandwidth))
        // A rank waits on peers of every transport at once: it spins as long as the one that
        // wants it longest.
        .map(|p| ccl_core::transport::TransportProperties { spin, ..p })
}

/// `tcp`, or `shm+tcp` when pairs use different transports (in preference order).
fn transport_label(used: &[&Arc<dyn Transport>], candidates: &[Arc<dyn Transport>]) -> String {
    match used {
        [] => candidates.first().map_or("none", |t| t.name()).to_string(),
        _ => used.iter().map(|t| t.name()).collect::<Vec<_>>().join("+"),
    }
}

/// A short name for a communicator, the same on all its ranks: a hash of its secret (which it
/// does not reveal).
fn comm_tag(secret: &[u8; 32]) -> String {
    let h = ccl_core::hash::fnv1a(secret);
    format!("{h:016x}")
}

/// Communicators that dump their recorder on `SIGUSR1`.
fn dumpers() -> &'static Mutex<Vec<std::sync::Weak<Peers>>> {
    static D: std::sync::OnceLock<Mutex<Vec<std::sync::Weak<Peers>>>> = std::sync::OnceLock::new();
    D.get_or_init(|| Mutex::new(Vec::new()))
}

/// Registers `comm` for `SIGUSR1` dumps, starting the (one, process-wide) signal thread on first
/// use. The handler only wakes the thread; the thread writes the files.
fn watch_sigusr1(comm: &Arc<Peers>) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    {
        let mut d = dumpers().lock().unwrap_or_else(|p| p.into_inner());
        d.retain(|w| w.strong_count() > 0);
        d.push(Arc::downgrade(comm));
    }
    STARTED.call_once(|| {
        let mut signals = match signal_hook::iterator::Signals::new([signal_hook::consts::SIGUSR1])
        {
            Ok(s) => s,
            Err(e) => {
                ccl_warn!(None, "cannot watch SIGUSR1 for flight-recorder dumps: {e}");
                return;
            }
        };
        let _ = std::thread::Builder::new()
            .name("ccl-sigusr1".into())
            .spawn(move || {
                for _ in signals.forever() {
                    let live: Vec<Arc<Peers>> = dumpers()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .filter_map(|w| w.upgrade())
                        .collect();
                    for c in live {
                        c.dump_trace("SIGUSR1");
                    }
                }
            });
    });
}

/// CPUs of this machine (not of this process: a launcher may have bound each rank to one).
fn online_cpus() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .map_or(0, |n| n.max(0) as usize)
}
