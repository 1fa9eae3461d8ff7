//! Each rank's side of the rendezvous ([`Bootstrap`]): joining the root, the allgathers among
//! the ranks, and the two ways a rank's bootstrap ends: a goodbye, or its line to the root kept
//! as its monitor line ([`Bootstrap::into_monitor`]).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::net;
use ccl_core::transport::decode_addr;
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::gather::Gather;
use super::root::{Root, root_is_local};
use crate::id::UniqueId;
use crate::monitor::{Monitor, Recovery, Relay, Shared, Tree};
use crate::timing::{ERROR_WORD, FRAME_WRITE, ROOT_FIRST};
use crate::wire::{self, Frame, FrameKind, MAX_RANKS};

/// A rank's connection to the root.
#[derive(Debug)]
pub struct Bootstrap {
    pub(crate) stream: TcpStream,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) root: SocketAddr,
    pub(crate) secret: [u8; 32],
    pub(crate) timeout: Duration,
    pub(crate) round: u32,
    pub(crate) done: bool,
    /// Why an allgather of this rank failed (the root was told): later calls fail with it
    /// rather than wait on a job that has ended.
    pub(crate) broken: Option<Error>,
    /// This rank's part in the allgathers among the ranks (none when alone).
    pub(crate) gather: Option<Gather>,
    /// From the start of [`Bootstrap::connect`] to the root's welcome (every rank had joined).
    pub(crate) joined: Duration,
}

impl Bootstrap {
    /// Joins the rendezvous of `id` as `rank` of `size`; returns once every rank has joined.
    pub fn connect(
        id: &UniqueId,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        Bootstrap::connect_with(id, rank, size, timeout, false)
    }

    /// [`Bootstrap::connect`] to a root known to be listening already (a shrink's, started
    /// before its id was sent): a refused connection means its process died, and fails at
    /// once instead of being tried again until the timeout.
    pub fn connect_running(
        id: &UniqueId,
        rank: usize,
        size: usize,
        timeout: Duration,
    ) -> Result<Bootstrap> {
        Bootstrap::connect_with(id, rank, size, timeout, true)
    }

    fn connect_with(
        id: &UniqueId,
        rank: usize,
        size: usize,
        timeout: Duration,
        running: bool,
    ) -> Result<Bootstrap> {
        check_rank(rank, size)?;
        let started = Instant::now();
        let root = id.root_addr();
        // Give the root's own deadline (which names the missing ranks) the chance to fire first.
        let deadline = Instant::now() + timeout + ROOT_FIRST.get();
        let what = || format!("bootstrap: joining the rendezvous at {root}");
        let by = Instant::now() + timeout;
        let mut stream = if running {
            net::connect_to_listening(root, by, &what)
        } else {
            net::connect_by(root, by, &what)
        }
        .map_err(|e| e.rank(rank))?;
        let _ = stream.set_nodelay(true);
        // The other ranks reach this one where it reached the root from.
        let listener = if size > 1 {
            let ip = stream
                .local_addr()
                .map_err(|e| Error::io(ErrorKind::System, "bootstrap socket", e).rank(rank))?
                .ip();
            let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
                Error::io(
                    ErrorKind::System,
                    format!("bootstrap: cannot listen on {ip}"),
                    e,
                )
                .rank(rank)
            })?;
            Some(l)
        } else {
            None
        };
        let listen = listener
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap listener", e).rank(rank))?;
        let hello = wire::Hello {
            secret: id.secret(),
            rank,
            size,
            listen,
        };
        wire::write_frame(&mut stream, &hello.encode(), deadline)
            .map_err(|e| e.rank(rank).context(what()))?;
        let f = wire::read_frame(&mut stream, deadline, &|| {
            format!("bootstrap: waiting at {root} for all {size} ranks to join")
        })
        .map_err(|e| e.rank(rank))?;
        match f.kind {
            FrameKind::Welcome => {}
            FrameKind::Error => {
                return Err(Error::remote(format!(
                    "bootstrap root {root}: {}",
                    String::from_utf8_lossy(&f.payload)
                ))
                .rank(rank));
            }
            k => {
                return Err(Error::remote(format!(
                    "bootstrap root {root} sent {k:?} instead of a welcome"
                ))
                .rank(rank));
            }
        }
        let gather = match listener {
            Some(l) => {
                let next = decode_addr(&f.payload).ok_or_else(|| {
                    Error::remote(format!(
                        "bootstrap root {root} did not say where rank {} listens",
                        (rank + 1) % size
                    ))
                    .rank(rank)
                })?;
                Some(Gather::start(l, next, rank, size, id.secret(), timeout)?)
            }
            None => None,
        };
        Ok(Bootstrap {
            stream,
            rank,
            size,
            root,
            secret: id.secret(),
            timeout,
            round: 0,
            done: false,
            broken: None,
            gather,
            joined: started.elapsed(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// How long joining took: from the start of [`Bootstrap::connect`] until every rank had
    /// joined (most of it, in a large job, is waiting for the last rank to start).
    pub fn join_time(&self) -> Duration {
        self.joined
    }

    /// The root's address.
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// The communicator secret.
    pub fn secret(&self) -> [u8; 32] {
        self.secret
    }

    /// The local address this rank used to reach the root: an address peers that reach the same
    /// root can most likely reach too, so it is the default address to listen on.
    pub fn local_ip(&self) -> Result<IpAddr> {
        self.stream
            .local_addr()
            .map(|a| a.ip())
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap socket", e).rank(self.rank))
    }

    /// Every rank contributes `data`; returns all contributions in rank order. The records
    /// travel among the ranks (see `gather`), not through the root.
    pub fn allgather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.timeout + ROOT_FIRST.get();
        let round = self.round;
        self.round += 1;
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let Some(g) = &self.gather else {
            return Ok(vec![data.to_vec()]);
        };
        g.allgather(&mut self.stream, round, data, deadline)
            .inspect_err(|e| {
                self.broken = Some(e.clone());
                self.tell_root(e)
            })
    }

    /// Leaves the bootstrap after this rank failed with `e` on its own (a bad setting, records
    /// it cannot use). It first serves the ranks that still need its allgather blocks, so that
    /// each of them reaches its own verdict on the same records instead of learning that this
    /// rank left; then the root passes `e` on to the ranks still in the bootstrap.
    pub fn fail(mut self, e: &Error) {
        if self.broken.is_none() && self.settle().is_ok() {
            self.tell_root(e);
        }
    }

    /// Waits until the ranks that need this rank's allgather blocks have them: its listener
    /// closes after that.
    pub(crate) fn settle(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.timeout + ROOT_FIRST.get();
        let Some(g) = self.gather.take() else {
            return Ok(());
        };
        g.settle(&mut self.stream, deadline)
            .inspect_err(|e| self.tell_root(e))
    }

    /// Passes this rank's bootstrap failure to the root, which fails the job with it (unless
    /// the failure is the root's own message).
    fn tell_root(&mut self, e: &Error) {
        if !e.message().starts_with("bootstrap root") && !e.message().contains("the bootstrap root")
        {
            let by = Instant::now() + ERROR_WORD.get();
            let _ = wire::write_frame(&mut self.stream, &Frame::error(&e.to_string()), by);
        }
    }

    /// Tells the root this rank is done with the bootstrap; after a failed allgather, returns
    /// that failure again (the job has ended: there is nobody left to serve).
    pub fn finish(mut self) -> Result<()> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        self.settle()?;
        self.say_bye()
    }

    fn say_bye(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let deadline = Instant::now() + FRAME_WRITE.get();
        wire::write_frame(
            &mut self.stream,
            &Frame::new(FrameKind::Bye, Vec::new()),
            deadline,
        )
        .map_err(|e| e.rank(self.rank))
    }
}

impl Bootstrap {
    /// Ends the allgather rounds but keeps the connection: the root then passes every rank's
    /// failure on to the others for as long as the communicator lives, and asks this rank for
    /// its state (see [`Monitor::set_state_source`]). With more than `fanout` ranks the root
    /// moves this line to a hub rank of the monitor tree (`monitor::tree`); every rank must
    /// give the same `fanout` (`CCL_MONITOR_FANOUT`).
    pub fn into_monitor(mut self, fanout: usize) -> Result<Monitor> {
        if let Some(e) = self.broken.take() {
            return Err(e);
        }
        self.settle()?;
        let rank = self.rank;
        let sys = |what: &str, e: std::io::Error| Error::io(ErrorKind::System, what, e).rank(rank);
        let tree = Tree::new(self.size, fanout);
        let listener = self.monitor_listener(&tree)?;
        let me = wire::Watchme {
            pid: std::process::id(),
            fanout: tree.fanout() as u32,
            listen: listener
                .as_ref()
                .map(|l| l.local_addr())
                .transpose()
                .map_err(|e| sys("monitor listener", e))?,
            host: ccl_core::log::hostname().to_string(),
        };
        let deadline = Instant::now() + FRAME_WRITE.get();
        wire::write_frame(&mut self.stream, &me.encode(), deadline).map_err(|e| e.rank(rank))?;
        self.done = true;
        self.stream
            .set_nonblocking(true)
            .map_err(|e| sys("bootstrap socket", e))?;
        let reader = self
            .stream
            .try_clone()
            .map_err(|e| sys("bootstrap socket", e))?;
        let writer = self
            .stream
            .try_clone()
            .map_err(|e| sys("bootstrap socket", e))?;
        let efd = || {
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| sys("eventfd", e.into()))
        };
        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            rank,
            size: self.size,
            root: Mutex::new(self.root),
            secret: self.secret,
            timeout: self.timeout,
            tree,
            standby: Mutex::new(None),
            moved_to: AtomicUsize::new(usize::MAX),
            epoch: AtomicU32::new(0),
            bye_heard: AtomicBool::new(false),
            shrink_round: Mutex::new((0, 0)),
            roster: OnceLock::new(),
            outcome: Mutex::new(None),
            #[cfg(test)]
            vanished: AtomicBool::new(false),
            spawn_root: Root::spawn_with,
            notices: Mutex::new(VecDeque::new()),
            wake: efd()?,
            stop: efd()?,
            root_gone: AtomicBool::new(false),
            hub: AtomicUsize::new(usize::MAX),
            acks: AtomicU64::new(0),
            state: OnceLock::new(),
            on_notice: OnceLock::new(),
            on_connect: OnceLock::new(),
            early_connects: Mutex::new(Vec::new()),
            recovery: Mutex::new(Recovery::default()),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("ccl-monitor".into())
            .spawn(move || Relay::new(s, reader, listener).run())
            .map_err(|e| sys("spawning the monitor thread", e))?;
        Ok(Monitor { shared, bye: true })
    }
}

impl Bootstrap {
    /// Where this rank takes monitor lines, if it does. A hub takes its children's lines where
    /// it reached the root from. A rank outside the root's process may take over the monitor
    /// when that process dies: it listens too, and the root tells every rank where the first
    /// few such ranks listen.
    fn monitor_listener(&self, tree: &Tree) -> Result<Option<TcpListener>> {
        let rank = self.rank;
        let sys = |what: &str, e: std::io::Error| Error::io(ErrorKind::System, what, e).rank(rank);
        let standby = !root_is_local(self.root);
        #[cfg(test)]
        let standby = standby || crate::monitor::hooks::remote(&self.secret).is_some();
        if !(tree.is_hub(rank) || standby) {
            return Ok(None);
        }
        let ip = self.local_ip()?;
        let l = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| sys("monitor: cannot listen for the ranks it watches", e))?;
        l.set_nonblocking(true)
            .map_err(|e| sys("monitor listener", e))?;
        Ok(Some(l))
    }
}

/// Validates a (rank, size) pair from the caller.
pub fn check_rank(rank: usize, size: usize) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid_argument(
            "world size must be at least 1, got 0",
        ));
    }
    if size > MAX_RANKS {
        return Err(Error::invalid_argument(format!(
            "world size {size} exceeds the supported maximum of {MAX_RANKS}"
        )));
    }
    if rank >= size {
        return Err(Error::invalid_argument(format!(
            "rank {rank} is out of range for world size {size} (ranks are 0..{})",
            size - 1
        )));
    }
    Ok(())
}
