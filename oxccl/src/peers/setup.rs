//! Set-up: the ranks tell each other where they run and how to reach them, agree on the
//! topology, choose a transport per pair, connect, and start watching each other through the
//! job's monitor.

use super::*;
use ccl_core::config::ConnectMode;

/// What the ranks told each other at set-up, and what follows from it.
pub(super) struct Met {
    ctx: ConnectContext,
    /// `listeners[t]` listens for `candidates[t]` (none when alone).
    listeners: Vec<Option<Box<dyn Listener>>>,
    records: Vec<Record>,
    topology: Topology,
    /// Whether the topology came from `CCL_TOPO_FILE`.
    from_file: bool,
}

impl Met {
    /// Reads the settings that shape the job (the topology file, the address to listen on),
    /// listens on every candidate transport, and exchanges records through `bootstrap`.
    fn exchange(
        bootstrap: &mut Bootstrap,
        candidates: &[Arc<dyn Transport>],
        config: Config,
    ) -> Result<Met> {
        let (rank, size) = (bootstrap.rank(), bootstrap.size());
        // Read the topology file before any exchange, so a bad file fails here, on every rank.
        let topo_file = read_topology(&config, size, rank)?;
        let local_ip = match &config.socket_ifname {
            Some(spec) => net::pick_local_ip(Some(spec)).map_err(|e| e.rank(rank))?,
            None => bootstrap.local_ip()?,
        };
        let fp = match (&config.topology, &topo_file) {
            (Some(t), _) => t.fingerprint().max(1),
            (None, Some(f)) => f.fingerprint(),
            (None, None) => 0,
        };
        let ctx = ConnectContext {
            rank,
            size,
            secret: bootstrap.secret(),
            local_ip,
            config,
        };
        let listeners = candidates
            .iter()
            .map(|t| (size > 1).then(|| t.listen(&ctx)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let records = exchange_records(bootstrap, candidates, &listeners, fp)?;
        check_fingerprints(&records, fp, rank)?;
        let hosts: Vec<String> = records.iter().map(|r| r.host.name.clone()).collect();
        let topology = match (&ctx.config.topology, &topo_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => f.resolve(&hosts).map_err(|e| e.rank(rank))?,
            // Hosts by name and machine: two machines (VMs, say) that share a host name are
            // still two hosts.
            (None, None) => Topology::from_hosts(
                &hosts
                    .iter()
                    .zip(machines(&records))
                    .map(|(h, m)| format!("{h}\0{m}"))
                    .collect::<Vec<_>>(),
            ),
        };
        Ok(Met {
            ctx,
            listeners,
            records,
            topology,
            from_file: topo_file.is_some(),
        })
    }
}

/// Every rank's machine: its boot id, else (unknown) its host name.
pub(super) fn machines(records: &[Record]) -> Vec<String> {
    records
        .iter()
        .map(|r| match r.host.boot_id.as_str() {
            "" => r.host.name.clone(),
            b => b.to_string(),
        })
        .collect()
}

/// Reads `CCL_TOPO_FILE` unless a topology was given in code; checks a given one's size.
pub(super) fn read_topology(config: &Config, size: usize, rank: usize) -> Result<Option<TopoFile>> {
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
pub(super) fn exchange_records(
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

/// The pairs to connect at set-up (the others' transports `None`), the listeners set-up
/// accepts on, and, under `CCL_CONNECT=lazy`, the pairs to connect on demand: every pair but
/// those over a transport that sets up host memory, whose segment reaches the host's ranks
/// through their connections. Takes the listeners out of `met`.
#[allow(clippy::type_complexity)]
fn on_demand(
    met: &mut Met,
    candidates: &[Arc<dyn Transport>],
    chosen: &[Option<usize>],
) -> Result<(
    Vec<Option<usize>>,
    Vec<Option<Box<dyn Listener>>>,
    Option<super::lazy::Lazy>,
)> {
    let listeners = std::mem::take(&mut met.listeners);
    if met.ctx.config.connect == ConnectMode::Eager {
        return Ok((chosen.to_vec(), listeners, None));
    }
    // Every pair connects on demand, shared-memory pairs too: what a host's ranks share was
    // set up when they joined it (`wireup::prepare_all`).
    let lazy = chosen.to_vec();
    let rank = met.ctx.rank;
    let handles = (0..chosen.len())
        .map(|p| {
            let t = lazy[p].filter(|_| p > rank)?;
            met.records[p]
                .offers
                .iter()
                .find(|(n, _)| n == candidates[t].name())
                .map(|(_, h)| h.clone())
        })
        .collect();
    let at_setup = listeners.iter().map(|_| None).collect();
    let l = super::lazy::Lazy::start(
        met.ctx.clone(),
        candidates.to_vec(),
        listeners,
        lazy,
        handles,
    )?;
    Ok((vec![None; chosen.len()], at_setup, Some(l)))
}

/// Says (rank 0, info level) what the topology file at `path` described.
pub(super) fn log_topology(path: &str, topology: &Topology) {
    // The one line about the topology is `topo`'s, whatever the module around it logs as.
    const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Topo;
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
pub(super) fn setup_watch(
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
pub(super) fn check_fingerprints(records: &[Record], fp: u64, rank: usize) -> Result<()> {
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
pub(super) struct InUse {
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
pub(super) fn in_use(
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
pub(super) fn slowest(
    used: &[&Arc<dyn Transport>],
) -> Option<ccl_core::transport::TransportProperties> {
    let spin = used.iter().map(|t| t.properties().spin).max()?;
    used.iter()
        .map(|t| t.properties())
        .min_by(|a, b| a.bandwidth.total_cmp(&b.bandwidth))
        // A rank waits on peers of every transport at once: it spins as long as the one that
        // wants it longest.
        .map(|p| ccl_core::transport::TransportProperties { spin, ..p })
}

/// `tcp`, or `shm+tcp` when pairs use different transports (in preference order).
pub(super) fn transport_label(
    used: &[&Arc<dyn Transport>],
    candidates: &[Arc<dyn Transport>],
) -> String {
    match used {
        [] => candidates.first().map_or("none", |t| t.name()).to_string(),
        _ => used.iter().map(|t| t.name()).collect::<Vec<_>>().join("+"),
    }
}

/// A short name for a communicator, the same on all its ranks: a hash of its secret (which it
/// does not reveal).
pub(super) fn comm_tag(secret: &[u8; 32]) -> String {
    let h = ccl_core::hash::fnv1a(secret);
    format!("{h:016x}")
}

/// CPUs of this machine (not of this process: a launcher may have bound each rank to one).
pub(super) fn online_cpus() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .map_or(0, |n| n.max(0) as usize)
}

impl Peers {
    /// Connects to every peer, using `bootstrap` to exchange where each rank runs and a handle
    /// for each of its transports, then releases the bootstrap.
    ///
    /// `candidates` are the transports usable on this rank, most preferred first; each pair of
    /// ranks uses the first one that both have and that can connect them ([`wireup::choose`]):
    /// shared memory within a host, verbs or TCP across.
    ///
    /// Not split, though over 100 lines: it is the set-up in order (exchange, monitor, host
    /// join, connections, attach), each step failing through the same bootstrap or monitor
    /// handle it owns; pieces would pass that handle and half-made state back and forth.
    pub(crate) fn connect(
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
        let t_exchange = Instant::now();
        let join = bootstrap.join_time();
        let fanout = config.monitor_fanout;
        let met = Met::exchange(&mut bootstrap, &candidates, config)
            .and_then(|met| Ok((wireup::choose(rank, &met.records, &candidates)?, met)));
        let (chosen, mut met) = match met {
            Ok(m) => m,
            Err(e) => {
                bootstrap.fail(&e);
                return Err(e);
            }
        };
        let root_host = met.records.iter().position(|r| r.runs_root);
        // From here on the root passes failures on: a rank that dies or fails while the others
        // connect is named to them at once. A rank alone has nobody to tell.
        let monitor = if size > 1 {
            Some(bootstrap.into_monitor(fanout)?)
        } else {
            bootstrap.finish()?;
            None
        };
        if let Some(m) = &monitor {
            m.set_roster(
                met.records
                    .iter()
                    .map(|r| (r.host.name.clone(), r.host.pid))
                    .collect(),
            );
        }
        let watch = |awaited: &[usize]| setup_watch(monitor.as_ref(), rank, root_host, awaited);
        let t_connect = Instant::now();
        let deadline = t_connect + met.ctx.config.timeout;
        // Tell the others, unless the failure is one they told us about.
        let tell = |e: &Error| {
            if let (Some(m), false) = (&monitor, e.message().contains("during set-up")) {
                m.report(&e.to_string(), failure::blamed_peer(e));
            }
        };
        wireup::prepare_all(
            &met.ctx,
            &candidates,
            &chosen,
            &met.records,
            deadline,
            &watch,
        )
        .inspect_err(tell)?;
        let (now_chosen, listeners, lazy) = on_demand(&mut met, &candidates, &chosen)?;
        if let (Some(m), Some(l)) = (&monitor, &lazy) {
            Peers::serve_connect_requests(m, l);
        }
        let endpoints = wireup::connect_all(
            &met.ctx,
            &candidates,
            listeners,
            &now_chosen,
            &met.records,
            deadline,
            &watch,
        )
        .inspect_err(tell)?;
        let summary = wireup::summary(&met.records, rank, &chosen, &candidates);
        let init = InitTimings {
            join,
            exchange: t_connect - t_exchange,
            connect: t_connect.elapsed(),
        };
        ccl_info!(
            Some(rank),
            "communicator ready: {size} ranks, {summary} (listening on {}); {init}",
            met.ctx.local_ip
        );
        let config = &met.ctx.config;
        if let (Some(path), true, 0) = (&config.topo_file, met.from_file, rank) {
            log_topology(path, &met.topology);
        }
        let groups = met.topology.host_groups();
        let every_host = wireup::hosts_share_memory(&met.records, &candidates, &groups);
        let used = in_use(
            &chosen,
            &candidates,
            &met.topology.host_peers(rank),
            every_host,
        );
        if let Some(h) = &used.host {
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
        let (mut comm, host) =
            Peers::new(met.ctx, met.topology, met.records, used, summary, monitor)?;
        comm.init = init;
        let comm = Arc::new(comm);
        comm.attach();
        Ok((
            comm,
            Links {
                endpoints,
                host,
                lazy,
            },
        ))
    }

    /// The communicator's state once it is connected.
    pub(super) fn new(
        ctx: ConnectContext,
        topology: Topology,
        records: Vec<Record>,
        used: InUse,
        summary: String,
        monitor: Option<Monitor>,
    ) -> Result<(Peers, Option<Box<dyn HostMemory>>)> {
        let ConnectContext {
            rank,
            size,
            secret,
            local_ip,
            config,
        } = ctx;
        let clock = if config.trace_counter {
            ccl_diag::recorder::fast_clock()
        } else {
            ccl_diag::recorder::now_us
        };
        let comm = Peers {
            rank,
            size,
            transport_name: used.name,
            peer_transports: used.peer_transports,
            summary,
            transport_props: used.props,
            cpus: online_cpus(),
            topology,
            local_ip,
            hosts: records.iter().map(|r| r.host.name.clone()).collect(),
            machines: machines(&records),
            pids: records.iter().map(|r| r.host.pid).collect(),
            root_host: records.iter().position(|r| r.runs_root),
            monitor,
            tag: comm_tag(&secret),
            recorder: Mutex::new(Recorder::with_clock(config.trace_buffer, clock)),
            slow: Mutex::new(SlowTracker::new(size)),
            abort: AbortSignal::new()?,
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            seq: AtomicU64::new(0),
            warned_seq: AtomicU64::new(0),
            slow_logged: Mutex::new(None),
            init: InitTimings::default(),
            config,
        };
        Ok((comm, used.host))
    }

    /// Hooks the communicator into the job's monitor (its state for the monitor's queries, a
    /// dump on the first failure notice) and into `SIGUSR1` dumps.
    pub(super) fn attach(self: &Arc<Peers>) {
        let dumps = self.config.trace_dir.is_some() || self.config.trace_torch_file.is_some();
        if let Some(m) = &self.monitor {
            let weak = Arc::downgrade(self);
            m.set_state_source(Box::new(move || {
                weak.upgrade()
                    .map_or_else(Vec::new, |c| ccl_diag::verdict::encode(&c.state_view()))
            }));
            if dumps {
                let weak = Arc::downgrade(self);
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
        if dumps {
            watch_sigusr1(self);
        }
    }
}
