//! The root's last phase: watching the job while its communicator lives.
//!
//! The root watches every rank's line, its own or, with more ranks than the fan-out, through
//! the hub ranks of the monitor tree (`tree`, `hub`): the root then holds only the top
//! level's lines and sorts what arrives by the rank it came from. It passes each rank's failure
//! on to the others, including the failure nobody can report: a rank whose process died closes
//! its line without a goodbye (a hub reports a line of its own ranks that closed). Before passing the first failure on, it asks every live rank what it is
//! doing ([`FrameKind::StateQuery`], answered by the rank's monitor thread even while the rank
//! waits or runs its own code), gives the answers a deadline, and runs the analysis of
//! `ccl_diag::verdict` on them: every notice carries that verdict. A rank whose operation runs late
//! asks for the same verdict, and `ccl-trace --live` (presenting the secret) for the whole picture.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::tree::Tree;
use crate::LOG_SUBSYS;
use crate::timing::{ADOPT_GRACE, LINE_WRITE, REUSE};
use crate::wire::{self, Frame, FrameKind, Notice};
use ccl_core::{ccl_trace, ccl_warn};

/// What the root knows of one rank while watching.
pub(super) struct Watched {
    pub(super) frames: VecDeque<Frame>,
    pub(super) open: bool,
    /// Said goodbye, or its failure was already passed on: its closing is no news.
    pub(super) quiet: bool,
    /// Said goodbye: its communicator is gone, and it answers no state query (a hub's line
    /// may stay open a while, passing its ranks' frames).
    pub(super) left: bool,
    pub(super) host: String,
    pub(super) pid: u32,
    /// Its own line to the root, if it has one (else it reports through its hubs).
    pub(super) link: Option<usize>,
    /// Since when its way up has been cut (a hub above it died) without it joining the root.
    pub(super) orphaned: Option<Instant>,
    /// The hub whose death cut it off.
    pub(super) lost_hub: usize,
    /// Frames for it that had no way to it (a hub above it had died): sent once it joins.
    pub(super) undelivered: Vec<Frame>,
    /// Why it is gone, when the root knows better than "its line closed".
    pub(super) why: Option<String>,
    /// The rank its own failure report named (the peer it saw leave, or timed out on).
    pub(super) blamed: Option<usize>,
}

impl Watched {
    pub(super) fn new(host: String, pid: u32, link: Option<usize>) -> Watched {
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
pub(super) struct Link {
    pub(super) rank: usize,
    pub(super) stream: TcpStream,
    pub(super) buf: Vec<u8>,
    pub(super) open: bool,
    /// The rank said it reports through its hub from now on: this line's end is no news.
    pub(super) moved: bool,
    /// The root told the rank to move to its hub.
    pub(super) attached: bool,
}

impl Link {
    pub(super) fn new(rank: usize, stream: TcpStream) -> Link {
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
    pub(super) fn read(&mut self) -> (Vec<Frame>, bool) {
        wire::read_ready(&self.stream, &mut self.buf)
    }

    pub(super) fn send(&mut self, f: &Frame) {
        let by = Instant::now() + LINE_WRITE.get();
        let _ = self.stream.set_nonblocking(false);
        let _ = wire::write_frame(&mut self.stream, f, by);
        let _ = self.stream.set_nonblocking(true);
    }
}

/// A live client that has yet to present its request.
pub(super) struct Client {
    pub(super) stream: TcpStream,
    pub(super) from: SocketAddr,
    pub(super) buf: Vec<u8>,
    pub(super) by: Instant,
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
    let with_root = super::hooks::remote(secret).unwrap_or(with_root);
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

/// The root's watch over a job: `streams` are the ranks' connections with what each said of
/// itself when it asked to be watched.
pub(crate) struct Watch<'a> {
    pub(super) ranks: Vec<Watched>,
    pub(super) links: Vec<Link>,
    pub(super) tree: Tree,
    /// Every rank told to move to its hub has moved (or gone).
    pub(super) settled: bool,
    /// The notices and revocations sent so far (each once): a rank that joins the root after
    /// its hub died gets them again, as a hub that dies may take some with it.
    pub(super) told: Vec<Frame>,
    pub(super) listener: &'a TcpListener,
    pub(super) secret: [u8; 32],
    pub(super) addr: SocketAddr,
    pub(super) clients: Vec<Client>,
    /// The verdict on the job's first failure, once made (later notices repeat it).
    pub(super) verdict: Option<(String, Option<usize>)>,
    /// The last verdict made, and when.
    pub(super) recent: Option<(Instant, (String, Option<usize>))>,
    pub(super) query_id: u32,
    /// Revocation and the shrink rounds ([`super::recovery`]).
    pub(super) recovery: super::recovery::Recovery,
    /// Where the monitor moves if this process dies.
    pub(super) standby: wire::Standby,
    /// How long ranks cut off from the monitor have to join it before they are named dead.
    pub(super) adopt_grace: Duration,
    /// The rank that took this monitor over from a root that died, if it did.
    pub(super) took_over: Option<usize>,
    /// Taken over at the job's end (the old monitor's ranks had left): ranks that do not join
    /// are not named dead.
    pub(super) ending: bool,
}

impl<'a> Watch<'a> {
    pub(crate) fn new(
        streams: Vec<(TcpStream, wire::Watchme)>,
        tree: Tree,
        listener: &'a TcpListener,
        secret: [u8; 32],
        addr: SocketAddr,
        timeout: Duration,
        spawn_root: super::recovery::SpawnRoot,
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
            recovery: super::recovery::Recovery::new(n, addr, timeout, spawn_root),
            standby,
            adopt_grace: ADOPT_GRACE.get(),
            took_over: None,
            ending: false,
        };
        // A star is settled from the start.
        w.settle();
        let f = w.standby.encode();
        w.broadcast(&f);
        w
    }
}

impl Watch<'_> {
    /// Runs until every rank has gone.
    pub(crate) fn run(mut self) {
        // A monitor taken over starts with the lines of ranks that asked already, their frames
        // read: they would wake no poll.
        self.serve_clients();
        // Nothing to wait for before the first look (a monitor taken over has a death to
        // announce).
        let mut first = true;
        while self.ranks.iter().any(|w| w.open) {
            #[cfg(test)]
            if super::hooks::killed(&self.secret, self.addr) {
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
                    Some((t, v)) if t.elapsed() < REUSE.get() => v.clone(),
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
}
