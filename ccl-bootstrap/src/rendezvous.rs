//! The rendezvous: the root server that admits a communicator's ranks and introduces them, and
//! each rank's side of it ([`Bootstrap`]).
//!
//! The root is a small server thread that admits exactly `size` ranks presenting the secret and
//! tells each where its successor listens; the ranks' allgathers then run among themselves
//! (`gather`). The communicator uses one allgather to exchange transport connection handles
//! and host names; after that the root stays on as the job's monitor (`monitor`): it watches
//! every rank's line (its own, or through the hubs of the monitor tree), passes failures on, answers live queries and runs recovery
//! agreements.
//!
//! Every read and write is bounded by a deadline, and the root tells every rank which ranks
//! never arrived, so a job with a missing rank fails with a message naming it instead of
//! hanging.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ccl_core::config::Config;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::net;
use ccl_core::transport::{decode_addr, encode_addr};
use ccl_core::{ccl_info, ccl_trace, ccl_warn};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::LOG_SUBSYS;
use crate::gather::{Gather, list_ranks};
use crate::id::{UniqueId, random_secret};
use crate::monitor::{self, Monitor, Recovery, Relay, Shared, Tree};
use crate::wire::{self, Frame, FrameKind};

/// Ids whose root runs in this process: making one starts its root.
impl UniqueId {
    /// Creates an id and starts its root in this process, listening on an address chosen by
    /// `CCL_SOCKET_IFNAME` (default: the first non-loopback interface, else loopback).
    pub fn new() -> Result<UniqueId> {
        let cfg = Config::from_env()?;
        let ip = net::pick_local_ip(cfg.socket_ifname.as_deref())?;
        UniqueId::new_at(ip, &cfg)
    }

    /// Creates an id whose root listens on `ip` (port chosen by the OS), e.g. loopback for a job
    /// on one host. The root stops `cfg.timeout` after creation if not every rank has arrived.
    pub fn new_at(ip: IpAddr, cfg: &Config) -> Result<UniqueId> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
            Error::io(
                ErrorKind::System,
                format!("bootstrap root: cannot listen on {ip}"),
                e,
            )
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap root", e))?;
        let id = UniqueId::for_address(addr, random_secret()?);
        Root::spawn(listener, id.secret(), cfg.timeout)?;
        Ok(id)
    }
}

/// The root: admits `size` ranks, introduces them, ends when every rank said goodbye (or
/// watches the job).
pub(crate) struct Root {
    listener: TcpListener,
    secret: [u8; 32],
    timeout: Duration,
    addr: SocketAddr,
    /// Set when the ranks being admitted must be failed at once (a shrink's member died).
    abandon: Option<monitor::Abandon>,
}

/// How long a new connection may take to present its hello before the root drops it.
const HELLO_GRACE: Duration = Duration::from_secs(5);
pub use crate::wire::MAX_RANKS;

/// Ports of the roots running in this process: a rank whose root runs in its own process hosts
/// the job's monitor, and when that connection vanishes the others know whose process ended.
fn local_roots() -> &'static std::sync::Mutex<Vec<u16>> {
    static R: std::sync::OnceLock<std::sync::Mutex<Vec<u16>>> = std::sync::OnceLock::new();
    R.get_or_init(|| std::sync::Mutex::new(Vec::new()))
}

/// Whether the root at `addr` runs in this process.
pub fn root_is_local(addr: SocketAddr) -> bool {
    local_roots()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&addr.port())
}

impl Root {
    /// Starts the root thread on `listener`.
    pub(crate) fn spawn(listener: TcpListener, secret: [u8; 32], timeout: Duration) -> Result<()> {
        Root::spawn_with(listener, secret, timeout, None)
    }

    /// [`Root::spawn`] with a handle that makes admission give up.
    pub(crate) fn spawn_with(
        listener: TcpListener,
        secret: [u8; 32],
        timeout: Duration,
        abandon: Option<monitor::Abandon>,
    ) -> Result<()> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap root", e))?;
        local_roots()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(addr.port());
        let root = Root {
            listener,
            secret,
            timeout,
            addr,
            abandon,
        };
        std::thread::Builder::new()
            .name("ccl-bootstrap-root".into())
            .spawn(move || {
                if let Err(e) = root.run() {
                    ccl_warn!(None, "bootstrap root at {addr}: {e}");
                }
                local_roots()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|&p| p != addr.port());
            })
            .map_err(|e| Error::io(ErrorKind::System, "spawning the bootstrap root thread", e))?;
        Ok(())
    }

    /// Starts a root listening on `bind` (rank 0 does this for address-based rendezvous).
    pub(crate) fn listen_and_spawn(
        bind: SocketAddr,
        secret: [u8; 32],
        timeout: Duration,
    ) -> Result<SocketAddr> {
        let l = bind_reusable(bind)?;
        let addr = l
            .local_addr()
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap root", e))?;
        Root::spawn(l, secret, timeout)?;
        Ok(addr)
    }

    fn run(self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| Error::io(ErrorKind::System, "bootstrap root", e))?;
        let ranks = self.admit(deadline)?;
        let n = ranks.len();
        let listens: Vec<Option<SocketAddr>> = ranks.iter().map(|(_, l)| *l).collect();
        let mut streams: Vec<TcpStream> = ranks.into_iter().map(|(s, _)| s).collect();
        // Each rank learns where its successor listens; the allgathers run among the ranks.
        for (r, s) in streams.iter_mut().enumerate() {
            let next = listens[(r + 1) % n].map(encode_addr).unwrap_or_default();
            let _ = wire::write_frame(s, &Frame::new(FrameKind::Welcome, next), deadline);
        }
        self.until_done(streams)
    }

    /// Phase 1: admits ranks until as many have joined as the first one's hello announced, and
    /// returns their connections and where they listen, in rank order.
    fn admit(&self, deadline: Instant) -> Result<Vec<(TcpStream, Option<SocketAddr>)>> {
        let mut ranks: Vec<Option<TcpStream>> = Vec::new();
        let mut listens: Vec<Option<SocketAddr>> = Vec::new();
        let mut size = 0usize;
        let mut joined = 0usize;
        while joined < size || size == 0 {
            if let Some(msg) = self.abandoned() {
                broadcast_error(&mut ranks, &msg);
                return Err(Error::remote(msg));
            }
            if Instant::now() >= deadline {
                let msg = if size == 0 {
                    format!(
                        "no rank arrived at the rendezvous {} within {:?}",
                        self.addr, self.timeout
                    )
                } else {
                    format!(
                        "rank(s) {} never arrived at the rendezvous {} within {:?} ({joined} of {size} did)",
                        missing_ranks(&ranks, size),
                        self.addr,
                        self.timeout
                    )
                };
                broadcast_error(&mut ranks, &msg);
                return Err(Error::timeout(msg));
            }
            let (mut s, from) = match self.listener.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io(ErrorKind::System, "bootstrap root: accept", e)),
            };
            let Some(h) = self.hello(&mut s, from, deadline) else {
                continue;
            };
            // From here the peer is one of ours: problems are the job's, and everyone hears.
            if size == 0 {
                if h.size == 0 || h.size > MAX_RANKS {
                    let msg = format!(
                        "rank {} from {from} announced world size {}",
                        h.rank, h.size
                    );
                    let _ = wire::write_frame(&mut s, &Frame::error(&msg), deadline);
                    continue;
                }
                size = h.size;
                ranks.resize_with(size, || None);
                listens.resize(size, None);
            }
            if let Some(msg) = admission_problem(&h, from, &ranks) {
                let _ = wire::write_frame(&mut s, &Frame::error(&msg), deadline);
                broadcast_error(&mut ranks, &msg);
                return Err(Error::invalid_argument(msg));
            }
            ccl_trace!(
                None,
                "bootstrap root {}: rank {} joined from {from}",
                self.addr,
                h.rank
            );
            ranks[h.rank] = Some(s);
            listens[h.rank] = h.listen;
            joined += 1;
        }
        ccl_info!(
            None,
            "bootstrap root {}: all {size} ranks joined",
            self.addr
        );
        Ok(ranks
            .into_iter()
            .map(|s| s.expect("all joined"))
            .zip(listens)
            .collect())
    }

    /// Why admission must give up, if it must.
    fn abandoned(&self) -> Option<String> {
        let a = self.abandon.as_ref()?;
        a.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads a new connection's hello and checks its secret: `None` (and a warning) when the
    /// connection is no rank of this job, which is dropped without disturbing the job.
    fn hello(&self, s: &mut TcpStream, from: SocketAddr, deadline: Instant) -> Option<wire::Hello> {
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        let hello_by = (Instant::now() + HELLO_GRACE).min(deadline);
        let h = wire::read_frame(s, hello_by, &|| format!("hello from {from}"))
            .map_err(|e| e.to_string())
            .and_then(|f| wire::Hello::decode(&f).map_err(|why| why.to_string()));
        let h = match h {
            Ok(h) => h,
            Err(why) => {
                ccl_warn!(
                    None,
                    "bootstrap root {}: dropped connection from {from}: {why}",
                    self.addr
                );
                return None;
            }
        };
        if !ccl_core::transport::handshake::secrets_equal(&h.secret, &self.secret) {
            ccl_warn!(
                None,
                "bootstrap root {}: dropped connection from {from} claiming rank {}: wrong secret (another job?)",
                self.addr,
                h.rank
            );
            return None;
        }
        Some(h)
    }

    /// Phase 2: the ranks run their allgathers among themselves; the root waits until every
    /// rank says goodbye, or hands the connections to the watch ([`monitor::Watch`]) when
    /// every rank asks for the monitor. A rank that fails or leaves before fails the job, and
    /// every rank hears why.
    fn until_done(&self, mut streams: Vec<TcpStream>) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        match self.collect(&mut streams, deadline)? {
            Done::Bye => {
                ccl_trace!(None, "bootstrap root {}: done", self.addr);
                Ok(())
            }
            Done::Monitor(who) => {
                let tree = match monitor_tree(&who) {
                    Ok(t) => t,
                    Err(msg) => {
                        broadcast_error_streams(&mut streams, &msg);
                        return Err(Error::invalid_argument(msg));
                    }
                };
                ccl_trace!(
                    None,
                    "bootstrap root {}: watching the job (monitor fan-out {})",
                    self.addr,
                    tree.fanout()
                );
                let _ = self.listener.set_nonblocking(true);
                monitor::Watch::new(
                    streams.into_iter().zip(who).collect(),
                    tree,
                    &self.listener,
                    self.secret,
                    self.addr,
                    self.timeout,
                    Root::spawn_with,
                )
                .run();
                Ok(())
            }
        }
    }

    /// Reads every rank's last bootstrap frame, in whatever order they come: all goodbyes or
    /// all monitor requests. An error a rank reports, or its connection closing, fails the job
    /// at once.
    fn collect(&self, streams: &mut [TcpStream], deadline: Instant) -> Result<Done> {
        let size = streams.len();
        let mut last: Vec<Option<Frame>> = vec![None; size];
        let mut pending: Vec<usize> = (0..size).collect();
        let fail = |streams: &mut [TcpStream], msg: String, r: usize| {
            broadcast_error_streams(streams, &msg);
            Err(Error::remote(msg).peer(r))
        };
        while !pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let msg = format!(
                    "rank(s) {} did not finish the bootstrap within {:?} (stopped, or stuck before it?)",
                    list_ranks(&pending),
                    self.timeout
                );
                broadcast_error_streams(streams, &msg);
                return Err(Error::timeout(msg).peer(pending[0]));
            }
            let mut fds: Vec<PollFd> = pending
                .iter()
                .map(|&r| PollFd::new(streams[r].as_fd(), PollFlags::POLLIN))
                .collect();
            let ms = left.as_millis().clamp(1, 1000) as u16;
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
            let ready: Vec<usize> = pending
                .iter()
                .zip(&fds)
                .filter(|(_, f)| f.any().unwrap_or(false))
                .map(|(&r, _)| r)
                .collect();
            drop(fds);
            for r in ready {
                let f = match wire::read_frame(&mut streams[r], deadline, &|| {
                    format!("the bootstrap of rank {r}")
                }) {
                    Ok(f) => f,
                    Err(e) => {
                        let msg = format!("rank {r} left the rendezvous during the bootstrap: {e}");
                        return fail(streams, msg, r);
                    }
                };
                match f.kind {
                    FrameKind::Bye | FrameKind::Monitor => last[r] = Some(f),
                    FrameKind::Error => {
                        let msg = format!("rank {r}: {}", String::from_utf8_lossy(&f.payload));
                        return fail(streams, msg, r);
                    }
                    other => {
                        let msg = format!("rank {r} sent {other:?} during the bootstrap");
                        return fail(streams, msg, r);
                    }
                }
                pending.retain(|&p| p != r);
            }
        }
        let frames: Vec<Frame> = last.into_iter().map(|f| f.expect("every rank")).collect();
        let watchers = frames
            .iter()
            .filter(|f| f.kind == FrameKind::Monitor)
            .count();
        match watchers {
            0 => Ok(Done::Bye),
            w if w == size => {
                let mut who = Vec::with_capacity(size);
                for (r, f) in frames.iter().enumerate() {
                    match wire::Watchme::decode(&f.payload) {
                        Ok(m) => who.push(m),
                        Err(e) => {
                            let msg = format!("rank {r}: {e}");
                            return fail(streams, msg, r);
                        }
                    }
                }
                Ok(Done::Monitor(who))
            }
            _ => {
                let msg = "ranks disagree on whether the root watches the job (some said goodbye, some asked for the monitor)".to_string();
                broadcast_error_streams(streams, &msg);
                Err(Error::internal(msg))
            }
        }
    }
}

/// How the ranks ended their bootstrap.
enum Done {
    /// Every rank is done with the bootstrap.
    Bye,
    /// Every rank wants the root to watch the job; what each said of itself.
    Monitor(Vec<wire::Watchme>),
}

/// The monitor tree the ranks asked for; an error when they disagree on its fan-out (each
/// rank works out its own place in it, so they must agree).
fn monitor_tree(who: &[wire::Watchme]) -> std::result::Result<Tree, String> {
    let f = who.first().map_or(2, |w| w.fanout);
    if let Some((r, w)) = who.iter().enumerate().find(|(_, w)| w.fanout != f) {
        return Err(format!(
            "ranks disagree on CCL_MONITOR_FANOUT: rank 0 has {f}, rank {r} has {} (every rank must use the same value)",
            w.fanout
        ));
    }
    let tree = Tree::new(who.len(), f as usize);
    if let Some(h) = (0..who.len()).find(|&h| tree.is_hub(h) && who[h].listen.is_none()) {
        return Err(format!(
            "rank {h} is a hub of the monitor tree (fan-out {f}) but does not listen for its ranks"
        ));
    }
    Ok(tree)
}

/// Why the rank that sent `h` from `from` cannot join the ranks admitted so far (`ranks` is as
/// long as the world size the first rank announced), if it cannot.
fn admission_problem(
    h: &wire::Hello,
    from: SocketAddr,
    ranks: &[Option<TcpStream>],
) -> Option<String> {
    let size = ranks.len();
    if h.size != size {
        Some(format!(
            "rank {} from {from} says the world size is {} but rank(s) before it said {size}",
            h.rank, h.size
        ))
    } else if h.rank >= size {
        Some(format!(
            "rank {} from {from} is out of range for world size {size}",
            h.rank
        ))
    } else if ranks[h.rank].is_some() {
        Some(format!("rank {} joined twice (again from {from})", h.rank))
    } else if size > 1 && h.listen.is_none() {
        Some(format!(
            "rank {} from {from} did not say where it listens for the other ranks",
            h.rank
        ))
    } else {
        None
    }
}

fn missing_ranks(ranks: &[Option<TcpStream>], size: usize) -> String {
    let m: Vec<usize> = (0..size)
        .filter(|&r| ranks.get(r).is_none_or(|s| s.is_none()))
        .collect();
    list_ranks(&m)
}

fn broadcast_error(ranks: &mut [Option<TcpStream>], msg: &str) {
    let f = Frame::error(msg);
    let by = Instant::now() + Duration::from_secs(2);
    for s in ranks.iter_mut().flatten() {
        let _ = wire::write_frame(s, &f, by);
    }
}

fn broadcast_error_streams(streams: &mut [TcpStream], msg: &str) {
    let f = Frame::error(msg);
    let by = Instant::now() + Duration::from_secs(2);
    for s in streams.iter_mut() {
        let _ = wire::write_frame(s, &f, by);
    }
}

/// Binds with SO_REUSEADDR so a fixed rendezvous port can be reused right after a previous job.
fn bind_reusable(addr: SocketAddr) -> Result<TcpListener> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt,
        socket, sockopt,
    };
    let fam = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let err = |e: nix::Error| {
        Error::io(
            ErrorKind::System,
            format!("bootstrap root: cannot listen on {addr} (is the port in use?)"),
            e.into(),
        )
    };
    let fd = socket(fam, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).map_err(err)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(err)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(addr),
    )
    .map_err(err)?;
    listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN)).map_err(err)?;
    Ok(TcpListener::from(fd))
}

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
        let deadline = Instant::now() + timeout + Duration::from_secs(2);
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
        let deadline = Instant::now() + self.timeout + Duration::from_secs(2);
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
        let deadline = Instant::now() + self.timeout + Duration::from_secs(2);
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
            let by = Instant::now() + Duration::from_secs(2);
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
        let deadline = Instant::now() + Duration::from_secs(5);
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
        let deadline = Instant::now() + Duration::from_secs(5);
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
            spawn_root: crate::rendezvous::Root::spawn_with,
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
        let standby = !crate::rendezvous::root_is_local(self.root);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn cfg(timeout_ms: u64) -> Config {
        Config {
            timeout: Duration::from_millis(timeout_ms),
            ..Config::default()
        }
    }

    #[test]
    fn rank_checks() {
        assert!(check_rank(0, 1).is_ok());
        let e = check_rank(4, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("rank 4"), "{e}");
        assert!(
            check_rank(0, 0)
                .unwrap_err()
                .to_string()
                .contains("at least 1")
        );
    }

    #[test]
    fn allgather_among_the_ranks() {
        // Powers of two and not, so the last step's partial block is covered.
        for n in [2, 3, 5, 8, 13] {
            let c = cfg(20_000);
            let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    let id = id.clone();
                    std::thread::spawn(move || {
                        let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                        assert_eq!(b.local_ip().unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
                        let a = b.allgather(format!("rank{r}").as_bytes()).unwrap();
                        let z = b.allgather(&vec![r as u8; r * 1000]).unwrap();
                        b.finish().unwrap();
                        (a, z)
                    })
                })
                .collect();
            for h in hs {
                let (a, z) = h.join().unwrap();
                for r in 0..n {
                    assert_eq!(a[r], format!("rank{r}").as_bytes(), "n = {n}");
                    assert_eq!(z[r], vec![r as u8; r * 1000], "n = {n}");
                }
            }
        }
    }

    /// A rank that fails on its own right after an allgather still gives the others its
    /// blocks, so none of them learns only that it left: each one gets every record (and can
    /// reach its own verdict on them) or, when the root passes the error on first, the error.
    #[test]
    fn a_rank_that_fails_after_the_allgather_serves_the_others_first() {
        let c = cfg(20_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let n = 6;
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                    let all = b.allgather(&[r as u8; 3]).map_err(|e| e.to_string());
                    if r == 2 {
                        b.fail(&Error::invalid_argument("rank 2's own bad setting"));
                        return (all, Ok(()));
                    }
                    (all, b.finish().map_err(|e| e.to_string()))
                })
            })
            .collect();
        for (r, h) in hs.into_iter().enumerate() {
            let (all, fin) = h.join().unwrap();
            for e in [all.as_ref().err(), fin.as_ref().err()]
                .into_iter()
                .flatten()
            {
                assert!(e.contains("rank 2's own bad setting"), "rank {r}: {e}");
            }
            if let Ok(all) = all {
                assert_eq!(all, (0..n).map(|p| vec![p as u8; 3]).collect::<Vec<_>>());
            }
        }
    }

    /// A rank that leaves after joining fails everyone's allgather with its name, well before
    /// the deadline, whether or not it was some rank's partner.
    #[test]
    fn a_rank_that_leaves_during_the_allgather_is_named() {
        let c = cfg(20_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let n = 6;
        let t0 = Instant::now();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                    if r == 4 {
                        drop(b);
                        return None;
                    }
                    Some(b.allgather(b"x").unwrap_err())
                })
            })
            .collect();
        for h in hs {
            if let Some(e) = h.join().unwrap() {
                assert!(e.to_string().contains("rank 4"), "{e}");
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    /// A stranger on a rank's allgather listener is dropped; the job goes on.
    #[test]
    fn a_stranger_at_a_ranks_listener_is_dropped() {
        let c = cfg(20_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let n = 3;
        let (tx, rx) = std::sync::mpsc::channel();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, tx) = (id.clone(), tx.clone());
                std::thread::spawn(move || {
                    let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                    if r == 1 {
                        let g = b.gather.as_ref().unwrap();
                        tx.send(g.listening()).unwrap();
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    let a = b.allgather(&[r as u8]).unwrap();
                    b.finish().unwrap();
                    a
                })
            })
            .collect();
        let at = rx.recv().unwrap();
        let mut s = TcpStream::connect(at).unwrap();
        let ask = wire::GatherAsk {
            secret: [0; 32],
            rank: 0,
            round: 0,
            step: 0,
        };
        let by = Instant::now() + Duration::from_secs(5);
        wire::write_frame(&mut s, &ask.encode(), by).unwrap();
        let got = wire::read_frame(&mut s, by, &|| "stranger".into());
        assert!(got.is_err(), "a stranger got {got:?}");
        for h in hs {
            assert_eq!(h.join().unwrap(), vec![vec![0], vec![1], vec![2]]);
        }
    }

    #[test]
    fn missing_rank_is_named() {
        let c = cfg(600);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        // Ranks 0 and 2 of 3 arrive; rank 1 never does.
        let hs: Vec<_> = [0, 2]
            .into_iter()
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    Bootstrap::connect(&id, r, 3, Duration::from_millis(600)).unwrap_err()
                })
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap();
            assert!(e.to_string().contains("rank(s) 1 never arrived"), "{e}");
        }
    }

    #[test]
    fn wrong_secret_is_dropped_and_job_continues() {
        let c = cfg(10_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let stranger = UniqueId::for_address(id.root_addr(), [0xAA; 32]);
        let e = Bootstrap::connect(&stranger, 0, 1, Duration::from_millis(300)).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Remote),
            "{e}"
        );
        // A client sending garbage is dropped too.
        {
            use std::io::Write;
            let mut s = TcpStream::connect(id.root_addr()).unwrap();
            let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
        }
        let mut b = Bootstrap::connect(&id, 0, 1, Duration::from_secs(10)).unwrap();
        assert_eq!(b.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
        b.finish().unwrap();
    }

    #[test]
    fn duplicate_rank_fails_everyone() {
        let c = cfg(10_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let id = id.clone();
                std::thread::spawn(move || {
                    Bootstrap::connect(&id, 1, 3, Duration::from_secs(10)).map(|_| ())
                })
            })
            .collect();
        for h in hs {
            let e = h.join().unwrap().unwrap_err();
            assert!(e.to_string().contains("rank 1 joined twice"), "{e}");
        }
    }

    #[test]
    fn unreachable_root_fails_within_timeout_naming_it() {
        // A loopback port nobody listens on: every attempt is refused and retried until the
        // deadline. (Tests never send packets off the machine.)
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let id = UniqueId::for_address(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            [0; 32],
        );
        let t0 = Instant::now();
        let e = Bootstrap::connect(&id, 0, 2, Duration::from_millis(500)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
