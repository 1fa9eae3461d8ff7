//! The root's last phase: watching the job while its communicator lives.
//!
//! The root watches every rank's line, its own or, with more ranks than the fan-out, through
//! the hub ranks of the monitor tree (`tree`, `relay`): the root then holds only the top
//! level's lines and sorts what arrives by the rank it came from. It passes each rank's failure
//! on to the others, including the failure nobody can report: a rank whose process died closes
//! its line without a goodbye (a hub reports a line of its own ranks that closed). Before passing the first failure on, it asks every live rank what it is
//! doing ([`FrameKind::StateQuery`], answered by the rank's monitor thread even while the rank
//! waits or runs its own code), gives the answers a deadline, and runs the analysis of
//! `ccl_diag::verdict` on them: every notice carries that verdict. A rank whose operation runs late
//! asks for the same verdict, and `ccl-trace --live` (presenting the secret) for the whole picture.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::LOG_SUBSYS;
use crate::tree::Tree;
use crate::wire::{self, Frame, FrameKind, Notice};
use ccl_core::{ccl_info, ccl_trace, ccl_warn};
use ccl_diag::digest::{Digest, Ranges};
use ccl_diag::verdict::{self as diag, Presence, RankView};

/// How long the root waits for every live rank to describe itself. A rank that has not
/// answered by then is stopped or its process hung: that is the verdict.
pub const GATHER: Duration = Duration::from_secs(1);
/// A verdict this fresh answers another rank's request (ranks stuck together ask within one
/// wake-up of each other); an older one may describe an operation that has since ended.
const REUSE: Duration = Duration::from_millis(250);
/// How long a live client may take to present its request.
const CLIENT_GRACE: Duration = Duration::from_secs(2);
/// Most live clients, and ranks joining after their hub died, served at once (more are
/// dropped).
const MAX_CLIENTS: usize = 1024;

/// How long the ranks below a hub that died have to join the root themselves before the root
/// names them dead too. Only the naming waits: the hub's own death is passed on at once.
const ADOPT_GRACE: Duration = Duration::from_secs(10);

static SETTLED_LINES: AtomicUsize = AtomicUsize::new(0);
static STATE_BYTES: std::sync::Mutex<Vec<(SocketAddr, usize)>> = std::sync::Mutex::new(Vec::new());

/// Bytes of rank state (views and digests) the root at `root`, in this process, has taken in
/// for verdicts and live queries: with the monitor a tree, a verdict's share does not grow
/// with the ranks.
pub fn state_bytes(root: SocketAddr) -> usize {
    let all = STATE_BYTES.lock().unwrap_or_else(|p| p.into_inner());
    all.iter().find(|(a, _)| *a == root).map_or(0, |(_, b)| *b)
}

/// Counts `bytes` of rank state taken in by the root at `root`.
fn count_state(root: SocketAddr, bytes: usize) {
    let mut all = STATE_BYTES.lock().unwrap_or_else(|p| p.into_inner());
    match all.iter_mut().find(|(a, _)| *a == root) {
        Some((_, b)) => *b += bytes,
        None => all.push((root, bytes)),
    }
}

/// The most monitor connections a root of this process held once the ranks had moved to their
/// hubs (the root's share of the monitor tree: at most `CCL_MONITOR_FANOUT`).
pub fn root_lines() -> usize {
    SETTLED_LINES.load(Ordering::Relaxed)
}

/// Whether rank `w` said goodbye (its frames may still wait to be handled).
fn said_goodbye(w: &Watched) -> bool {
    w.left || w.frames.iter().any(|f| f.kind == FrameKind::Bye)
}

/// What the root knows of one rank while watching.
struct Watched {
    frames: VecDeque<Frame>,
    open: bool,
    /// Said goodbye, or its failure was already passed on: its closing is no news.
    quiet: bool,
    /// Said goodbye: its communicator is gone, and it answers no state query (a hub's line
    /// may stay open a while, passing its ranks' frames).
    left: bool,
    host: String,
    pid: u32,
    /// Its own line to the root, if it has one (else it reports through its hubs).
    link: Option<usize>,
    /// Since when its way up has been cut (a hub above it died) without it joining the root.
    orphaned: Option<Instant>,
    /// The hub whose death cut it off.
    lost_hub: usize,
    /// Frames for it that had no way to it (a hub above it had died): sent once it joins.
    undelivered: Vec<Frame>,
    /// Why it is gone, when the root knows better than "its line closed".
    why: Option<String>,
    /// The rank its own failure report named (the peer it saw leave, or timed out on).
    blamed: Option<usize>,
}

impl Watched {
    fn new(host: String, pid: u32, link: Option<usize>) -> Watched {
        Watched {
            frames: VecDeque::new(),
            open: true,
            quiet: false,
            left: false,
            host,
            pid,
            link,
            orphaned: None,
            lost_hub: 0,
            undelivered: Vec::new(),
            why: None,
            blamed: None,
        }
    }
}

/// A line the root holds: a rank's own, which carries the frames of the ranks below it too.
struct Link {
    rank: usize,
    stream: TcpStream,
    buf: Vec<u8>,
    open: bool,
    /// The rank said it reports through its hub from now on: this line's end is no news.
    moved: bool,
    /// The root told the rank to move to its hub.
    attached: bool,
}

impl Link {
    fn new(rank: usize, stream: TcpStream) -> Link {
        let _ = stream.set_nonblocking(true);
        // Small frames answered by small frames: a line adopted from a live client was
        // accepted with Nagle on, which holds each frame back until the last is acknowledged
        // (40 ms with delayed acknowledgements: a takeover's shrink took that much longer).
        let _ = stream.set_nodelay(true);
        Link {
            rank,
            stream,
            buf: Vec::new(),
            open: true,
            moved: false,
            attached: false,
        }
    }

    /// Reads what has arrived without waiting: its frames, and whether the line ended.
    fn read(&mut self) -> (Vec<Frame>, bool) {
        wire::read_ready(&self.stream, &mut self.buf)
    }

    fn send(&mut self, f: &Frame) {
        let by = Instant::now() + Duration::from_millis(500);
        let _ = self.stream.set_nonblocking(false);
        let _ = wire::write_frame(&mut self.stream, f, by);
        let _ = self.stream.set_nonblocking(true);
    }
}

/// A live client that has yet to present its request.
struct Client {
    stream: TcpStream,
    from: SocketAddr,
    buf: Vec<u8>,
    by: Instant,
}

/// How many ranks the root names as standbys: each death of the monitor's process moves it to
/// the next one alive.
const STANDBYS: usize = 8;

/// The first [`STANDBYS`] ranks that listen and run outside this process, and the ranks that
/// run in it (they die with the root).
fn standby_list(
    ranks: &[Watched],
    listens: &[Option<SocketAddr>],
    secret: &[u8; 32],
) -> wire::Standby {
    let (me, host) = (std::process::id(), ccl_core::log::hostname());
    let with_root: Vec<usize> = (0..ranks.len())
        .filter(|&r| ranks[r].pid == me && ranks[r].host == host)
        .collect();
    #[cfg(test)]
    let with_root = crate::hooks::remote(secret).unwrap_or(with_root);
    #[cfg(not(test))]
    let _ = secret;
    wire::Standby {
        ranks: (0..ranks.len())
            .filter(|r| !with_root.contains(r))
            .filter_map(|r| listens[r].map(|a| (r, a)))
            .take(STANDBYS)
            .collect(),
        with_root,
        left: Vec::new(),
    }
}

/// Whether process `pid` of this host still runs (a zombie, waiting for its parent to reap
/// it, has ended).
fn alive(pid: u32) -> bool {
    ccl_core::log::process_state(pid).is_some_and(|s| !matches!(s, 'Z' | 'X'))
}

/// A rank taking the job's monitor over after the root's process died (see `relay`).
pub(crate) struct Takeover {
    pub(crate) size: usize,
    /// The rank taking over.
    pub(crate) rank: usize,
    /// The ranks that died with the monitor's process: named dead at once.
    pub(crate) lost: Vec<usize>,
    /// The ranks the old monitor had named dead already.
    pub(crate) dead: Vec<usize>,
    pub(crate) standby: wire::Standby,
    pub(crate) secret: [u8; 32],
    pub(crate) timeout: Duration,
    pub(crate) spawn_root: crate::recovery::SpawnRoot,
    /// Every rank's host and process id, if the communicator gave them.
    pub(crate) roster: Option<Vec<(String, u32)>>,
    /// Lines of ranks that asked already, with what they sent.
    pub(crate) clients: Vec<(TcpStream, Vec<u8>)>,
}

impl Takeover {
    /// Runs the job's monitor on `listener`, on a thread of its own, until every rank has gone.
    pub(crate) fn spawn(self, listener: TcpListener) -> std::io::Result<()> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        std::thread::Builder::new()
            .name("ccl-monitor-root".into())
            .spawn(move || Watch::took_over(self, &listener, addr).run())?;
        Ok(())
    }
}

/// The root's watch over a job: `streams` are the ranks' connections with what each said of
/// itself when it asked to be watched.
pub(super) struct Watch<'a> {
    ranks: Vec<Watched>,
    links: Vec<Link>,
    tree: Tree,
    /// Every rank told to move to its hub has moved (or gone).
    settled: bool,
    /// The notices and revocations sent so far (each once): a rank that joins the root after
    /// its hub died gets them again, as a hub that dies may take some with it.
    told: Vec<Frame>,
    listener: &'a TcpListener,
    secret: [u8; 32],
    addr: SocketAddr,
    clients: Vec<Client>,
    /// The verdict on the job's first failure, once made (later notices repeat it).
    verdict: Option<(String, Option<usize>)>,
    /// The last verdict made, and when.
    recent: Option<(Instant, (String, Option<usize>))>,
    query_id: u32,
    /// Revocation and the shrink rounds ([`super::recovery`]).
    recovery: crate::recovery::Recovery,
    /// Where the monitor moves if this process dies.
    standby: wire::Standby,
    /// How long ranks cut off from the monitor have to join it before they are named dead.
    adopt_grace: Duration,
    /// The rank that took this monitor over from a root that died, if it did.
    took_over: Option<usize>,
    /// Taken over at the job's end (the old monitor's ranks had left): ranks that do not join
    /// are not named dead.
    ending: bool,
}

impl<'a> Watch<'a> {
    pub(super) fn new(
        streams: Vec<(TcpStream, wire::Watchme)>,
        tree: Tree,
        listener: &'a TcpListener,
        secret: [u8; 32],
        addr: SocketAddr,
        timeout: Duration,
        spawn_root: crate::recovery::SpawnRoot,
    ) -> Watch<'a> {
        let n = streams.len();
        let listens: Vec<Option<SocketAddr>> = streams.iter().map(|(_, w)| w.listen).collect();
        let mut links = Vec::with_capacity(n);
        let mut ranks = Vec::with_capacity(n);
        for (r, (stream, who)) in streams.into_iter().enumerate() {
            let mut link = Link::new(r, stream);
            // Below the top of the tree, a rank reports through its hub.
            if let Some(hub) = tree.parent(r)
                && let Some(at) = listens[hub]
            {
                link.send(&wire::attach(hub, at));
                link.attached = true;
            }
            links.push(link);
            ranks.push(Watched::new(who.host, who.pid, Some(r)));
        }
        let standby = standby_list(&ranks, &listens, &secret);
        let mut w = Watch {
            ranks,
            links,
            tree,
            settled: false,
            told: Vec::new(),
            listener,
            secret,
            addr,
            clients: Vec::new(),
            verdict: None,
            recent: None,
            query_id: 0,
            recovery: crate::recovery::Recovery::new(n, addr, timeout, spawn_root),
            standby,
            adopt_grace: ADOPT_GRACE,
            took_over: None,
            ending: false,
        };
        // A star is settled from the start.
        w.settle();
        let f = w.standby.encode();
        w.broadcast(&f);
        w
    }

    /// The watch of a rank that takes the monitor over: every rank starts cut off and joins it
    /// (the tree becomes a star); those that do not within the timeout (at most
    /// [`ADOPT_GRACE`]) are named dead.
    fn took_over(t: Takeover, listener: &'a TcpListener, addr: SocketAddr) -> Watch<'a> {
        let n = t.size;
        let now = Instant::now();
        let mut ranks: Vec<Watched> = (0..n)
            .map(|r| {
                let (host, pid) = t
                    .roster
                    .as_ref()
                    .and_then(|ro| ro.get(r).cloned())
                    .unwrap_or_default();
                let mut w = Watched::new(host, pid, None);
                w.orphaned = Some(now);
                w.lost_hub = usize::MAX;
                w
            })
            .collect();
        for &d in t.dead.iter().filter(|&&d| d < n) {
            ranks[d].open = false;
            ranks[d].quiet = true;
        }
        let why = format!(
            "its process, which ran the job's monitor, ended (rank {} runs the monitor now)",
            t.rank
        );
        for &d in t.lost.iter().filter(|&&d| d < n) {
            ranks[d].open = false;
            ranks[d].quiet = false;
            ranks[d].why = Some(why.clone());
        }
        // The monitor's ranks had all left before its process ended: the job is ending, and a
        // rank that does not join has most likely left too. It is not named.
        let ending = t.lost.is_empty();
        let gone = |r: &usize| t.lost.contains(r) || t.dead.contains(r);
        let standby = wire::Standby {
            ranks: t
                .standby
                .ranks
                .iter()
                .filter(|(r, _)| !gone(r))
                .copied()
                .collect(),
            with_root: vec![t.rank],
            left: Vec::new(),
        };
        let culprit = t.lost.iter().copied().find(|&d| d < n);
        // The death that moved the monitor is the job's first failure; without one (the root's
        // process ended after its ranks left) the first failure gets a verdict of its own.
        let verdict = culprit.map(|d| {
            let line = format!(
                "the job is stuck behind rank {d} ({}:{}), which died, and the job's monitor with it (it ran in its process); rank {} took the monitor over",
                ranks[d].host, ranks[d].pid, t.rank
            );
            (line, Some(d))
        });
        let clients = t
            .clients
            .into_iter()
            .filter_map(|(stream, buf)| {
                let from = stream.peer_addr().ok()?;
                let _ = stream.set_nonblocking(true);
                Some(Client {
                    stream,
                    from,
                    buf,
                    by: now + CLIENT_GRACE,
                })
            })
            .collect();
        ccl_info!(
            None,
            "bootstrap: rank {} took the job's monitor over at {addr} (the root's process died)",
            t.rank
        );
        Watch {
            ranks,
            links: Vec::new(),
            tree: Tree::new(n, n),
            settled: true,
            told: Vec::new(),
            listener,
            secret: t.secret,
            addr,
            clients,
            verdict,
            recent: None,
            query_id: 0,
            recovery: crate::recovery::Recovery::new(n, addr, t.timeout, t.spawn_root),
            standby,
            adopt_grace: ADOPT_GRACE.min(t.timeout),
            took_over: Some(t.rank),
            ending,
        }
    }

    /// Reads every line the root holds and sorts what arrived by rank: frames into each rank's
    /// queue, ended lines and the hubs' `Gone` into closed ranks.
    fn pump(&mut self) {
        for l in 0..self.links.len() {
            if !self.links[l].open {
                continue;
            }
            let (frames, closed) = self.links[l].read();
            let from = self.links[l].rank;
            for f in frames {
                match f.kind {
                    FrameKind::Up => match wire::open_envelope(&f.payload) {
                        Ok((origin, inner)) if (origin as usize) < self.ranks.len() => {
                            let origin = origin as usize;
                            if inner.kind == FrameKind::Gone {
                                // Only the line it reports on counts: a rank that joined the
                                // root since is not gone.
                                if self.ranks[origin].link.is_none() {
                                    self.closed(origin);
                                }
                            } else {
                                self.ranks[origin].frames.push_back(inner);
                            }
                        }
                        _ => ccl_warn!(
                            None,
                            "bootstrap root {}: rank {from} passed on a bad frame",
                            self.addr
                        ),
                    },
                    FrameKind::Moved => {
                        self.links[l].moved = true;
                        if self.ranks[from].link == Some(l) {
                            self.ranks[from].link = None;
                        }
                        // Its last frame on this line: closing it tells the rank so.
                        let _ = self.links[l].stream.shutdown(std::net::Shutdown::Both);
                    }
                    _ => self.ranks[from].frames.push_back(f),
                }
            }
            if closed || self.links[l].moved {
                self.links[l].open = false;
                if !self.links[l].moved && self.ranks[from].link == Some(l) {
                    self.ranks[from].link = None;
                    self.closed(from);
                }
            }
        }
        self.links.iter_mut().filter(|l| !l.open).for_each(|l| {
            // Keep the slot (ranks refer to lines by index); the socket goes.
            if l.buf.capacity() > 0 {
                l.buf = Vec::new();
            }
        });
        self.settle();
        // Ranks cut off by a hub's death that did not join the root in time, and, after a
        // takeover, ranks of this host whose process has ended.
        let now = Instant::now();
        let host = ccl_core::log::hostname();
        for r in 0..self.ranks.len() {
            let w = &mut self.ranks[r];
            if !(w.open && w.link.is_none()) {
                continue;
            }
            if w.orphaned.is_some_and(|t| now - t >= self.adopt_grace) {
                w.open = false;
                w.quiet |= self.ending;
            } else if self.took_over.is_some() && w.pid != 0 && w.host == host && !alive(w.pid) {
                w.open = false;
                w.quiet |= self.ending;
                w.why = Some(format!(
                    "its process ({}:{}) ended before it joined the job's monitor, which rank {} took over",
                    w.host,
                    w.pid,
                    self.took_over.unwrap_or(usize::MAX)
                ));
            }
        }
    }

    /// Counts the root's lines once every rank told to move to its hub has moved (or gone):
    /// [`root_lines`], the ranks' first lines that the root kept. A short job on a loaded
    /// machine can end before its last rank has moved: a kept line whose rank has said goodbye
    /// still counts (the root held it until the job's end), and a line of a rank that joined
    /// the root again because its hub left first does not (that is the job ending).
    fn settle(&mut self) {
        if !self.settled && self.links.iter().all(|l| !(l.attached && l.open)) {
            self.settled = true;
            let ranks = &self.ranks;
            let lines = self.links[..ranks.len().min(self.links.len())]
                .iter()
                .filter(|l| !l.attached && (l.open || said_goodbye(&ranks[l.rank])))
                .count();
            SETTLED_LINES.fetch_max(lines, Ordering::Relaxed);
        }
    }

    /// Rank `r` is gone (its line ended without it having moved); the ranks that reported
    /// through it are cut off until they join the root.
    fn closed(&mut self, r: usize) {
        self.ranks[r].open = false;
        for t in r + 1..self.tree.end(r) {
            if self.ranks[t].open && self.ranks[t].link.is_none() && self.way_up(t).is_none() {
                self.ranks[t].orphaned.get_or_insert_with(Instant::now);
                self.ranks[t].lost_hub = r;
            }
        }
    }

    /// The line a frame for rank `t` goes on: its own, or that of the lowest hub above it that
    /// has one, with every hub between them alive.
    fn way_up(&self, t: usize) -> Option<usize> {
        for a in self.tree.path(t) {
            if !self.ranks[a].open && a != t {
                return None;
            }
            if let Some(l) = self.ranks[a].link {
                return Some(l);
            }
        }
        None
    }

    /// Keeps a notice or revocation for the ranks that join the root later.
    fn remember(&mut self, f: &Frame) {
        if matches!(f.kind, FrameKind::Notice | FrameKind::Revoked) && !self.told.contains(f) {
            self.told.push(f.clone());
        }
    }

    /// Sends `f` to rank `r`, through the hubs above it when it has no line of its own.
    fn send_to(&mut self, r: usize, f: &Frame) {
        self.remember(f);
        let Some(l) = self.way_up(r) else {
            if self.ranks[r].open && !self.told.contains(f) {
                self.ranks[r].undelivered.push(f.clone());
            }
            return;
        };
        if self.links[l].rank == r {
            self.links[l].send(f);
        } else {
            let e = wire::envelope(FrameKind::Down, r as u32, f);
            self.links[l].send(&e);
        }
    }

    /// Sends `f` to every rank still here, through the lines the root holds; ranks in this
    /// process last (one of them may exit as soon as it has the frame, and this thread with it).
    fn broadcast(&mut self, f: &Frame) {
        self.remember(f);
        let all = wire::envelope(FrameKind::Down, wire::ALL, f);
        let me = std::process::id();
        for local in [false, true] {
            for l in 0..self.links.len() {
                let r = self.links[l].rank;
                if !self.links[l].open || (self.ranks[r].pid == me) != local {
                    continue;
                }
                let below = self.tree.is_hub(r);
                self.links[l].send(if below { &all } else { f });
            }
        }
    }

    /// Runs until every rank has gone.
    pub(super) fn run(mut self) {
        // A monitor taken over starts with the lines of ranks that asked already, their frames
        // read: they would wake no poll.
        self.serve_clients();
        // Nothing to wait for before the first look (a monitor taken over has a death to
        // announce).
        let mut first = true;
        while self.ranks.iter().any(|w| w.open) {
            #[cfg(test)]
            if crate::hooks::killed(&self.secret, self.addr) {
                return;
            }
            if !std::mem::take(&mut first) {
                self.sleep();
            }
            self.pump();
            // Also the ranks found closed while gathering states.
            for r in (0..self.ranks.len()).filter(|&r| !self.ranks[r].open) {
                self.recovery.on_gone(r);
            }
            let (failures, requests, asks) = self.take_frames();
            self.recover(asks);
            let mut notices: Vec<Notice> = failures;
            // After its frames: a goodbye read together with the end of the stream counts.
            for (r, w) in self.ranks.iter_mut().enumerate() {
                if !w.open && !w.quiet {
                    w.quiet = true;
                    let grace = self.adopt_grace;
                    let message = match (&w.why, w.orphaned) {
                        (Some(why), _) => why.clone(),
                        (None, Some(_)) if w.link.is_none() && w.lost_hub == usize::MAX => format!(
                            "it did not join the job's monitor within {grace:?} after the root's process died (rank {} took the monitor over; this rank's process ended too, or cannot reach it)",
                            self.took_over.unwrap_or(usize::MAX)
                        ),
                        (None, Some(_)) if w.link.is_none() => format!(
                            "the job's monitor lost it: its hub, rank {}, died, and it did not join the rendezvous itself within {grace:?} (its process ended too, or cannot reach the rendezvous)",
                            w.lost_hub
                        ),
                        (None, _) => "its connection to the rendezvous closed without a goodbye (the process exited, crashed or was killed)".into(),
                    };
                    notices.push(Notice {
                        rank: r,
                        died: true,
                        message,
                        verdict: String::new(),
                        culprit: None,
                    });
                }
            }
            if !notices.is_empty() {
                self.announce(notices);
            }
            for (r, preamble) in requests {
                // Ranks stuck together ask together: one gathering answers them all.
                let (line, _) = match &self.recent {
                    Some((t, v)) if t.elapsed() < REUSE => v.clone(),
                    _ => self.judge(),
                };
                let text = format!("{preamble}: {line}");
                if self.ranks[r].open {
                    self.send_to(r, &Frame::new(FrameKind::Verdict, text.into_bytes()));
                }
            }
            self.serve_clients();
        }
        ccl_trace!(None, "bootstrap root {}: every rank has gone", self.addr);
    }

    /// Answers revocations and shrink requests and outcomes, and sends the round's decision
    /// or verdict once it is due.
    fn recover(&mut self, asks: Vec<(usize, Frame)>) {
        let open: Vec<bool> = self.ranks.iter().map(|w| w.open).collect();
        let mut outs = Vec::new();
        for (r, f) in asks {
            outs.extend(match f.kind {
                FrameKind::Revoke => self.recovery.on_revoke(r, &open),
                FrameKind::Formed => {
                    self.recovery.on_formed(r, &f.payload);
                    Vec::new()
                }
                // Passed on to the rank asked; a target out of range is dropped.
                FrameKind::ConnectMe => wire::rank_of(&f.payload)
                    .filter(|&t| t < open.len() && t != r)
                    .map(|t| {
                        (
                            t,
                            Frame::new(FrameKind::ConnectMe, (r as u32).to_le_bytes().to_vec()),
                        )
                    })
                    .into_iter()
                    .collect(),
                _ => self.recovery.on_shrink(r, &f.payload, &open),
            });
        }
        outs.extend(self.recovery.decide(&open));
        for (r, f) in outs {
            if self.ranks[r].open {
                self.send_to(r, &f);
            }
        }
    }

    /// Waits up to a second (less while a shrink round is due) for a rank or a live client to
    /// say something.
    fn sleep(&self) {
        let mut fds = self.link_fds();
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        fds.extend(
            self.clients
                .iter()
                .map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)),
        );
        let orphans = self.ranks.iter().any(|w| w.open && w.orphaned.is_some());
        let wait = self
            .recovery
            .deadline()
            .map_or(if orphans { 100 } else { 1000 }, |t| {
                t.saturating_duration_since(Instant::now())
                    .as_millis()
                    .clamp(1, 1000) as u16
            });
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(wait));
    }

    /// Handles the frames the ranks sent: goodbyes, failures (acknowledged at once, so the
    /// failing rank knows the root is alive), verdict requests. Stale state replies are dropped.
    #[allow(clippy::type_complexity)]
    fn take_frames(&mut self) -> (Vec<Notice>, Vec<(usize, String)>, Vec<(usize, Frame)>) {
        let mut failures = Vec::new();
        let mut requests = Vec::new();
        let mut asks = Vec::new();
        for r in 0..self.ranks.len() {
            while let Some(f) = self.ranks[r].frames.pop_front() {
                let open = self.ranks[r].open;
                match f.kind {
                    FrameKind::Bye => {
                        self.ranks[r].quiet = true;
                        self.ranks[r].left = true;
                        // This process ending after its ranks left is no death: every rank
                        // hears, and the leaving rank waits for its copy (see `Monitor`).
                        let sb = &mut self.standby;
                        if !sb.ranks.is_empty()
                            && sb.with_root.contains(&r)
                            && !sb.left.contains(&r)
                        {
                            sb.left.push(r);
                            let f = sb.encode();
                            self.broadcast(&f);
                        }
                    }
                    FrameKind::Failure => {
                        if open {
                            self.send_to(r, &Frame::new(FrameKind::Ack, Vec::new()));
                        }
                        if let Ok(mut n) = Notice::decode(&f.payload) {
                            n.rank = r;
                            self.ranks[r].blamed =
                                n.culprit.filter(|&c| c != r && c < self.ranks.len());
                            if !self.ranks[r].quiet {
                                self.ranks[r].quiet = true;
                                failures.push(n);
                            }
                        }
                    }
                    FrameKind::VerdictRequest => {
                        if open {
                            self.send_to(r, &Frame::new(FrameKind::Ack, Vec::new()));
                        }
                        requests.push((r, String::from_utf8_lossy(&f.payload).into_owned()));
                    }
                    FrameKind::Revoke
                    | FrameKind::Shrink
                    | FrameKind::Formed
                    | FrameKind::ConnectMe => asks.push((r, f)),
                    _ => {}
                }
            }
        }
        (failures, requests, asks)
    }

    /// Passes `notices` on to every rank still connected, each with the job's verdict.
    fn announce(&mut self, notices: Vec<Notice>) {
        let (verdict, culprit) = match &self.verdict {
            Some(v) => v.clone(),
            None => {
                let v = self.judge();
                self.verdict = Some(v.clone());
                v
            }
        };
        for mut n in notices {
            ccl_warn!(
                None,
                "bootstrap root {}: rank {} {}: {}; verdict: {verdict}",
                self.addr,
                n.rank,
                if n.died { "died" } else { "failed" },
                n.message
            );
            n.verdict = verdict.clone();
            n.culprit = culprit;
            self.broadcast(&n.encode(FrameKind::Notice));
        }
    }

    /// Where the blame for culprit `r` ends: a rank that reported its own failure naming
    /// another (the peer it saw leave, or timed out on) failed because of it, and once it has
    /// exited it is absent from the verdict just like the rank it named, so the verdict alone
    /// cannot tell them apart (ranks 0 and 2 both gone, where 0 only saw 2 leave).
    fn blame(&self, mut r: usize) -> usize {
        let mut seen = vec![r];
        while let Some(b) = self.ranks[r].blamed {
            if seen.contains(&b) {
                break;
            }
            seen.push(b);
            r = b;
        }
        r
    }

    /// Asks every rank where it is and says which rank the job waits for.
    fn judge(&mut self) -> (String, Option<usize>) {
        let n = self.ranks.len();
        let v = if self.tree.is_star() {
            let views = self.gather(None);
            diag::analyse(&views, n)
        } else {
            let d = self.digest();
            // Only ranks that answered the digest query are asked again.
            d.verdict(n, &mut |ranks: &[usize]| {
                let (ask, gone): (Vec<usize>, Vec<usize>) =
                    ranks.iter().partition(|&&r| d.answered.contains(r));
                let mut views = self.gather(Some(&ask));
                views.extend(gone.into_iter().filter(|&r| r < n).map(|r| self.absent(r)));
                views
            })
        };
        let culprit = match &v.culprit {
            diag::Culprit::Ranks(s) => s.iter().next().map(|&r| self.blame(r)),
            diag::Culprit::Link { to, .. } => Some(*to),
            diag::Culprit::Nothing => None,
        };
        let out = (v.line(), culprit);
        self.recent = Some((Instant::now(), out.clone()));
        out
    }

    /// Takes rank `r`'s queued frames that `want` picks; the others stay. A failure report
    /// met on the way is acknowledged now: its sender waits to know the root is alive.
    fn pick(&mut self, r: usize, want: &dyn Fn(&Frame) -> bool) -> Vec<Frame> {
        let mut keep = VecDeque::new();
        let mut picked = Vec::new();
        while let Some(f) = self.ranks[r].frames.pop_front() {
            if want(&f) {
                picked.push(f);
                continue;
            }
            if f.kind == FrameKind::Failure {
                self.send_to(r, &Frame::new(FrameKind::Ack, Vec::new()));
            }
            keep.push_back(f);
        }
        self.ranks[r].frames = keep;
        picked
    }

    /// The lines the root holds that are open, to poll for reading.
    fn link_fds(&self) -> Vec<PollFd<'_>> {
        self.links
            .iter()
            .filter(|l| l.open)
            .map(|l| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN))
            .collect()
    }

    /// Waits up to 100 ms (at most until `until`) for any line the root holds.
    fn wait_lines(&self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = self.link_fds();
        let ms = left.as_millis().clamp(1, 100) as u16;
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
    }

    /// Whether rank `r` is expected to answer a query.
    fn answers(&self, r: usize) -> bool {
        self.ranks[r].open && !self.ranks[r].left
    }

    /// How rank `r` is known when it gave no answer.
    fn absent(&self, r: usize) -> RankView {
        let w = &self.ranks[r];
        let presence = if self.answers(r) {
            Presence::Silent
        } else {
            Presence::Dead
        };
        RankView::absent(r, &w.host, w.pid, presence)
    }

    /// With the monitor a tree: the digest of every rank's view, merged hub by hub
    /// ([`FrameKind::DigestQuery`]), so that no N-wide gather reaches the root. A rank that no
    /// digest covers within [`GATHER`] counts as silent (or dead, if its line is gone): a hub
    /// that does not answer leaves its whole subtree out.
    fn digest(&mut self) -> Digest {
        self.query_id = self.query_id.wrapping_add(1);
        let id = self.query_id;
        self.broadcast(&wire::digest_query(id, GATHER.saturating_sub(wire::HOP)));
        let until = Instant::now() + GATHER;
        let mut acc = Digest::default();
        loop {
            self.pump();
            for r in 0..self.ranks.len() {
                if self.ranks[r].frames.is_empty() {
                    continue;
                }
                for f in self.pick(r, &|f| f.kind == FrameKind::DigestReply) {
                    count_state(self.addr, f.payload.len());
                    let merged = wire::read_digest_reply(&f.payload).and_then(|(got, d)| {
                        if got != id || !acc.covers.disjoint(&d.covers) {
                            // An older query's, or a rank that answered on its first line and
                            // through its hub too.
                            return Ok(());
                        }
                        if !d
                            .covers
                            .minus(&Ranges::span(r, self.tree.end(r) - 1))
                            .is_empty()
                        {
                            return Err(format!(
                                "it covers ranks {} outside its subtree",
                                d.covers
                            ));
                        }
                        acc.merge(d)
                    });
                    if let Err(why) = merged {
                        ccl_warn!(
                            None,
                            "bootstrap root {}: dropped rank {r}'s digest: {why}",
                            self.addr
                        );
                    }
                }
            }
            let waiting = (0..self.ranks.len()).any(|r| self.answers(r) && !acc.covers.contains(r));
            if !waiting || Instant::now() >= until {
                break;
            }
            self.wait_lines(until);
        }
        let missing: Vec<RankView> = (0..self.ranks.len())
            .filter(|&r| !acc.covers.contains(r))
            .map(|r| self.absent(r))
            .collect();
        if let Err(why) = acc.merge(Digest::of(&missing)) {
            ccl_warn!(None, "bootstrap root {}: {why}", self.addr);
        }
        acc
    }

    /// The views of `ranks` (every rank's with `None`): each one's answer to a state query, or
    /// how it failed to answer within [`GATHER`].
    pub(super) fn gather(&mut self, ranks: Option<&[usize]>) -> Vec<RankView> {
        self.query_id = self.query_id.wrapping_add(1);
        let id = self.query_id;
        let q = Frame::new(FrameKind::StateQuery, id.to_le_bytes().to_vec());
        let targets: Vec<usize> = match ranks {
            Some(rs) => {
                for &r in rs {
                    if r < self.ranks.len() && self.answers(r) {
                        self.send_to(r, &q);
                    }
                }
                rs.iter()
                    .copied()
                    .filter(|&r| r < self.ranks.len())
                    .collect()
            }
            None => {
                self.broadcast(&q);
                (0..self.ranks.len()).collect()
            }
        };
        let mut views: Vec<Option<RankView>> = vec![None; targets.len()];
        let until = Instant::now() + GATHER;
        let tag = id.to_le_bytes();
        loop {
            self.pump();
            for (i, &r) in targets.iter().enumerate() {
                if views[i].is_some() || self.ranks[r].frames.is_empty() {
                    continue;
                }
                for f in self.pick(r, &|f| f.kind == FrameKind::StateReply) {
                    count_state(self.addr, f.payload.len());
                    if f.payload.get(..4) != Some(&tag) {
                        continue;
                    }
                    match diag::decode(&f.payload[4..]) {
                        Ok(mut v) => {
                            v.rank = r;
                            views[i] = Some(v);
                        }
                        Err(why) => ccl_warn!(
                            None,
                            "bootstrap root {}: rank {r} sent a bad state reply: {why}",
                            self.addr
                        ),
                    }
                }
            }
            let waiting = targets
                .iter()
                .zip(&views)
                .any(|(&r, v)| v.is_none() && self.answers(r));
            if !waiting || Instant::now() >= until {
                break;
            }
            self.wait_lines(until);
        }
        targets
            .iter()
            .zip(views)
            .map(|(&r, v)| v.unwrap_or_else(|| self.absent(r)))
            .collect()
    }

    /// Takes the line of a rank whose hub died (or left) as that rank's own, if it presents the
    /// job's secret and the rank is still watched.
    fn adopt(&mut self, c: Client, join: &Frame, after: Vec<Frame>) {
        let rejoin = wire::Rejoin::decode(join);
        let joined = match &rejoin {
            Some(j) => Some((j.secret, j.rank)),
            None => wire::read_join(join),
        };
        let r = match joined {
            Some((secret, r))
                if ccl_core::transport::handshake::secrets_equal(&secret, &self.secret)
                    && r < self.ranks.len()
                    && self.ranks[r].open =>
            {
                r
            }
            Some((secret, r))
                if rejoin.is_some()
                    && ccl_core::transport::handshake::secrets_equal(&secret, &self.secret) =>
            {
                // One of the job's ranks, named dead or gone here: it must not look for another
                // monitor, so it hears why instead of a closed line.
                let why = format!(
                    "rank {r} is no longer watched by the job's monitor at {} (it was named dead or left)",
                    self.addr
                );
                ccl_warn!(None, "bootstrap root {}: {why}", self.addr);
                let mut s = c.stream;
                let _ = s.set_nonblocking(false);
                let _ = wire::write_frame(
                    &mut s,
                    &Frame::error(&why),
                    Instant::now() + Duration::from_millis(500),
                );
                return;
            }
            _ => {
                ccl_warn!(
                    None,
                    "bootstrap root {}: refused a monitor line from {}: not a watched rank of this job with its secret",
                    self.addr,
                    c.from
                );
                return;
            }
        };
        if let Some(j) = rejoin {
            self.recovery.on_rejoin(r, j.round);
            self.ranks[r].host = j.host;
            self.ranks[r].pid = j.pid;
            // The root that died had named them; the ranks have heard already.
            let n = self.ranks.len();
            for d in j.dead.into_iter().filter(|&d| d < n && d != r) {
                let w = &mut self.ranks[d];
                if w.open && w.link.is_none() {
                    w.open = false;
                    w.quiet = true;
                }
            }
        }
        ccl_trace!(
            None,
            "bootstrap root {}: rank {r} reports here directly now",
            self.addr
        );
        let mut link = Link::new(r, c.stream);
        link.buf = c.buf;
        self.links.push(link);
        let l = self.links.len() - 1;
        let w = &mut self.ranks[r];
        w.link = Some(l);
        w.orphaned = None;
        w.frames.extend(after);
        // What its hub may have taken with it (a rank ignores a notice it already has), and
        // what had no way to it.
        let missed: Vec<Frame> = std::iter::once(self.standby.encode())
            .chain(self.told.iter().cloned())
            .chain(std::mem::take(&mut self.ranks[r].undelivered))
            .collect();
        for f in &missed {
            self.links[l].send(f);
        }
    }

    /// Accepts live clients, and answers each that presents the secret with every rank's state
    /// and the verdict. A client without the secret is dropped unanswered.
    fn serve_clients(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((s, from)) if self.clients.len() < MAX_CLIENTS => {
                    let _ = s.set_nonblocking(true);
                    self.clients.push(Client {
                        stream: s,
                        from,
                        buf: Vec::new(),
                        by: Instant::now() + CLIENT_GRACE,
                    });
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let mut i = 0;
        while i < self.clients.len() {
            let c = &mut self.clients[i];
            let mut chunk = [0u8; 256];
            let mut closed = false;
            loop {
                match (&c.stream).read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(k) if c.buf.len() < 4096 => c.buf.extend_from_slice(&chunk[..k]),
                    Ok(_) => {
                        closed = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let mut frames = wire::take_frames(&mut c.buf)
                .unwrap_or_default()
                .into_iter();
            let Some(frame) = frames.next() else {
                if closed || Instant::now() >= c.by {
                    self.clients.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let c = self.clients.swap_remove(i);
            if matches!(frame.kind, FrameKind::Join | FrameKind::Rejoin) {
                self.adopt(c, &frame, frames.collect());
                continue;
            }
            let ok = wire::query_secret(&frame)
                .is_some_and(|s| ccl_core::transport::handshake::secrets_equal(&s, &self.secret));
            if !ok {
                ccl_warn!(
                    None,
                    "bootstrap root {}: refused a live query from {}: not a query with this job's secret",
                    self.addr,
                    c.from
                );
                continue;
            }
            let views = self.gather(None);
            let text = diag::live_report(&views, self.ranks.len());
            let mut s = c.stream;
            let _ = s.set_nonblocking(false);
            let by = Instant::now() + Duration::from_secs(2);
            let _ = wire::write_frame(
                &mut s,
                &Frame::new(FrameKind::Report, text.into_bytes()),
                by,
            );
        }
    }
}

/// Asks the running job whose rendezvous is at `root` for every rank's state and the verdict
/// (what `ccl-trace --live` prints), presenting `secret`. Nothing stops or slows the job beyond
/// each rank answering one query. A root that refuses the secret closes the connection
/// unanswered: that is an error here, and the caller learns nothing of the job.
pub fn live_query(
    root: SocketAddr,
    secret: &[u8; 32],
    timeout: Duration,
) -> ccl_core::error::Result<String> {
    use ccl_core::error::Error;
    let deadline = Instant::now() + timeout;
    let what = || format!("live query to the job's rendezvous at {root}");
    let mut s = ccl_core::net::connect_by(root, deadline, &what)?;
    wire::write_frame(&mut s, &wire::query(secret), deadline).map_err(|e| e.context(what()))?;
    let f = wire::read_frame(&mut s, deadline, &|| "waiting for the answer".to_string())
        .map_err(|e| {
            Error::remote(format!(
                "{}: no answer ({}): a wrong secret, a job that has not finished connecting or has ended, or another service at that address",
                what(),
                e.message()
            ))
        })?;
    match f.kind {
        FrameKind::Report => Ok(String::from_utf8_lossy(&f.payload).into_owned()),
        k => Err(Error::remote(format!("{}: the root sent {k:?}", what()))),
    }
}
