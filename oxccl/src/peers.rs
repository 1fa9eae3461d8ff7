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

use crate::LOG_SUBSYS;
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

// `Peers` is one type spread over files by concern: the state and what reads it are here.
mod dump;
mod failure;
mod lazy;
mod setup;
mod slow;
pub(crate) mod wait;

use dump::watch_sigusr1;
use slow::SlowTracker;

/// Ends every wait of a communicator: a flag checked by busy loops and an eventfd that wakes
/// `poll(2)`.
#[derive(Debug)]
pub(crate) struct AbortSignal {
    flag: AtomicBool,
    fd: EventFd,
}

impl AbortSignal {
    pub(crate) fn new() -> Result<AbortSignal> {
        Ok(AbortSignal {
            flag: AtomicBool::new(false),
            fd: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()))?,
        })
    }

    /// Raises the signal (idempotent).
    pub(crate) fn raise(&self) {
        self.flag.store(true, Ordering::Release);
        let _ = self.fd.write(1);
    }

    #[inline]
    pub(crate) fn is_raised(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Readable once raised; add it to every poll set.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The ranks of a communicator as the transport layer holds them: rank and size, settings, hosts
/// and topology, which transport each peer uses, the job monitor, the flight recorder, abort and
/// the sticky error. Thread-safe; the endpoints themselves are in [`Links`].
#[derive(Debug)]
pub(crate) struct Peers {
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
    /// The last operation an early warning was asked for (so each warns once).
    warned_seq: AtomicU64,
    /// When the slow-rank report was last logged.
    slow_logged: Mutex<Option<Instant>>,
    /// What setting up took, phase by phase.
    init: InitTimings,
}

/// What setting up a communicator took on this rank, phase by phase (also in its "communicator
/// ready" log line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InitTimings {
    /// Joining the rendezvous, until every rank had joined: in a large job mostly the wait for
    /// the last rank to start.
    pub join: std::time::Duration,
    /// Exchanging the ranks' records (the bootstrap's allgather) and handing the root's
    /// connection over to the job monitor.
    pub exchange: std::time::Duration,
    /// Choosing transports and connecting the pairs set-up connects (every pair with
    /// `CCL_CONNECT=eager`; with `lazy`, pairs connect when an operation first needs them).
    pub connect: std::time::Duration,
}

impl InitTimings {
    /// All of set-up.
    pub fn total(&self) -> std::time::Duration {
        self.join + self.exchange + self.connect
    }
}

impl std::fmt::Display for InitTimings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "set-up took {:.1} ms (join {:.1}, exchange {:.1}, connect {:.1})",
            ms(self.total()),
            ms(self.join),
            ms(self.exchange),
            ms(self.connect)
        )
    }
}

/// Connections to every peer, indexed by rank (`None` for this rank), and the memory this rank
/// shares with the other ranks of its host (all of the communicator's ranks on one host, or
/// the host's own when the communicator spans hosts).
#[derive(Debug, Default)]
pub(crate) struct Links {
    pub endpoints: Vec<Option<Box<dyn Endpoint>>>,
    pub host: Option<Box<dyn HostMemory>>,
    /// The pairs still to connect, when they connect on demand (`CCL_CONNECT=lazy`).
    pub lazy: Option<lazy::Lazy>,
}

impl Links {
    /// The peers with an endpoint, in rank order.
    pub(crate) fn connected(&self) -> Vec<usize> {
        (0..self.endpoints.len())
            .filter(|&p| self.endpoints[p].is_some())
            .collect()
    }

    /// Whether this rank has a connection to `peer` (yet).
    pub(crate) fn has(&self, peer: usize) -> bool {
        self.endpoints.get(peer).is_some_and(Option::is_some)
    }

    /// The endpoint to `peer`.
    pub(crate) fn get(&mut self, peer: usize) -> Result<&mut Box<dyn Endpoint>> {
        self.endpoints
            .get_mut(peer)
            .and_then(|e| e.as_mut())
            .ok_or_else(|| Error::internal(format!("no connection to peer {peer}")))
    }
}

impl Peers {
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The transport every pair uses (`shm`, `tcp`, `ib`, `local`), or the ones in use joined by
    /// `+` (`shm+tcp`) when pairs differ.
    pub(crate) fn transport_name(&self) -> &str {
        &self.transport_name
    }

    /// The transport this rank uses with `peer` (`None` for itself).
    pub(crate) fn peer_transport(&self, peer: usize) -> Option<&'static str> {
        self.peer_transports.get(peer).copied().flatten()
    }

    /// What connects to what, e.g. `2 hosts x 2 ranks: shm within hosts, tcp across`.
    pub(crate) fn transport_summary(&self) -> &str {
        &self.summary
    }

    /// The transport's properties as the cost model sees them on this rank's machine: what the
    /// transport says of itself, adjusted for ranks that share the CPUs.
    pub(crate) fn cost_properties(&self) -> ccl_core::transport::TransportProperties {
        ccl_algos::cost::on_shared_cpus(
            self.transport_properties(),
            self.ranks_on_host(),
            self.machine_cpus(),
        )
    }

    /// What the transport says of itself (the cost model adjusts it for shared CPUs).
    pub(crate) fn transport_properties(&self) -> ccl_core::transport::TransportProperties {
        self.transport_props
    }

    /// How many ranks of this communicator share this rank's machine, and so its CPUs (this one
    /// included): same boot id, whatever their host names (hosts in UTS namespaces or
    /// containers on one machine still share its CPUs).
    pub(crate) fn ranks_on_host(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| **m == self.machines[self.rank])
            .count()
    }

    /// CPUs of this machine, not of this process: a launcher may have bound each rank to one
    /// (0: unknown).
    pub(crate) fn machine_cpus(&self) -> usize {
        self.cpus
    }

    /// Host name of every rank, in rank order.
    pub(crate) fn init_timings(&self) -> InitTimings {
        self.init
    }

    pub(crate) fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The address this rank listens on (where peers reached it).
    pub(crate) fn local_ip(&self) -> std::net::IpAddr {
        self.local_ip
    }

    /// Where the ranks are (host, rack, zone).
    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The next collective sequence number (1, 2, ...).
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed) + 1
    }
}

pub(crate) use ccl_diag::verdict::SlowPeer;
pub(crate) use failure::blamed_peer;
