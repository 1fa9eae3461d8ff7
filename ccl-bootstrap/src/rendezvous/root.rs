//! The root's side of the rendezvous: the server thread that admits exactly `size` ranks
//! presenting the secret, tells each where its successor listens, and then waits until every
//! rank says goodbye, or hands their connections to the job monitor (`crate::monitor`).

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ccl_core::config::Config;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::net;
use ccl_core::transport::encode_addr;
use ccl_core::{ccl_info, ccl_trace, ccl_warn};
use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::gather::list_ranks;
use crate::LOG_SUBSYS;
use crate::id::{UniqueId, random_secret};
use crate::monitor::{self, Tree};
use crate::timing::{ERROR_WORD, HELLO_GRACE};
use crate::wire::{self, Frame, FrameKind, MAX_RANKS};

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
        let hello_by = (Instant::now() + HELLO_GRACE.get()).min(deadline);
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
    let by = Instant::now() + ERROR_WORD.get();
    for s in ranks.iter_mut().flatten() {
        let _ = wire::write_frame(s, &f, by);
    }
}

fn broadcast_error_streams(streams: &mut [TcpStream], msg: &str) {
    let f = Frame::error(msg);
    let by = Instant::now() + ERROR_WORD.get();
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
