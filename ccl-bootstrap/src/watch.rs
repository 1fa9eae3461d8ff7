//! The root's last phase: watching the job while its communicator lives.
//!
//! The root keeps every rank's connection and passes each rank's failure on to the others,
//! including the failure nobody can report: a rank whose process died closes its connection
//! without a goodbye. Before passing the first failure on, it asks every live rank what it is
//! doing ([`FrameKind::StateQuery`], answered by the rank's monitor thread even while the rank
//! waits or runs its own code), gives the answers a deadline, and runs the analysis of
//! `ccl_diag::verdict` on them: every notice carries that verdict. A rank whose operation runs late
//! asks for the same verdict, and `ccl-trace --live` (presenting the secret) for the whole picture.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::LOG_SUBSYS;
use crate::wire::{self, Frame, FrameKind, Notice};
use ccl_core::{ccl_trace, ccl_warn};
use ccl_diag::verdict::{self as diag, Presence, RankView};

/// How long the root waits for every live rank to describe itself. A rank that has not
/// answered by then is stopped or its process hung: that is the verdict.
pub const GATHER: Duration = Duration::from_secs(1);
/// A verdict this fresh answers another rank's request (ranks stuck together ask within one
/// wake-up of each other); an older one may describe an operation that has since ended.
const REUSE: Duration = Duration::from_millis(250);
/// How long a live client may take to present its request.
const CLIENT_GRACE: Duration = Duration::from_secs(2);
/// Most live clients served at once (more are dropped).
const MAX_CLIENTS: usize = 16;

/// What the root knows of one rank while watching.
struct Watched {
    stream: TcpStream,
    buf: Vec<u8>,
    frames: VecDeque<Frame>,
    open: bool,
    /// Said goodbye, or its failure was already passed on: its closing is no news.
    quiet: bool,
    host: String,
    pid: u32,
}

impl Watched {
    /// Reads what has arrived without waiting; marks the rank closed at end of stream.
    fn read(&mut self) {
        let mut chunk = [0u8; 4096];
        let closed = loop {
            match (&self.stream).read(&mut chunk) {
                Ok(0) => break true,
                Ok(k) => {
                    wire::count_in(k);
                    self.buf.extend_from_slice(&chunk[..k])
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break true,
            }
        };
        match wire::take_frames(&mut self.buf) {
            Ok(f) => self.frames.extend(f),
            // Garbage from a rank: treat it as gone.
            Err(_) => self.open = false,
        }
        if closed {
            self.open = false;
        }
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

/// The root's watch over a job: `streams` are the ranks' connections with what each said of
/// itself when it asked to be watched (`[u32 pid][host]`).
pub(super) struct Watch<'a> {
    ranks: Vec<Watched>,
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
}

impl<'a> Watch<'a> {
    pub(super) fn new(
        streams: Vec<(TcpStream, Vec<u8>)>,
        listener: &'a TcpListener,
        secret: [u8; 32],
        addr: SocketAddr,
        timeout: Duration,
        spawn_root: crate::recovery::SpawnRoot,
    ) -> Watch<'a> {
        let n = streams.len();
        let ranks = streams
            .into_iter()
            .map(|(stream, who)| {
                let _ = stream.set_nonblocking(true);
                let pid = who
                    .get(..4)
                    .map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
                let host = who
                    .get(4..)
                    .map_or(String::new(), |b| String::from_utf8_lossy(b).into_owned());
                Watched {
                    stream,
                    buf: Vec::new(),
                    frames: VecDeque::new(),
                    open: true,
                    quiet: false,
                    host,
                    pid,
                }
            })
            .collect();
        Watch {
            ranks,
            listener,
            secret,
            addr,
            clients: Vec::new(),
            verdict: None,
            recent: None,
            query_id: 0,
            recovery: crate::recovery::Recovery::new(n, addr, timeout, spawn_root),
        }
    }

    /// Runs until every rank has gone.
    pub(super) fn run(mut self) {
        while self.ranks.iter().any(|w| w.open) {
            self.sleep();
            for w in self.ranks.iter_mut().filter(|w| w.open) {
                w.read();
            }
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
                    notices.push(Notice {
                        rank: r,
                        died: true,
                        message: "its connection to the rendezvous closed without a goodbye (the process exited, crashed or was killed)".into(),
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
                    self.ranks[r].send(&Frame::new(FrameKind::Verdict, text.into_bytes()));
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
                self.ranks[r].send(&f);
            }
        }
    }

    /// Waits up to a second (less while a shrink round is due) for a rank or a live client to
    /// say something.
    fn sleep(&self) {
        let mut fds: Vec<PollFd<'_>> = self
            .ranks
            .iter()
            .filter(|w| w.open)
            .map(|w| PollFd::new(w.stream.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        fds.extend(
            self.clients
                .iter()
                .map(|c| PollFd::new(c.stream.as_fd(), PollFlags::POLLIN)),
        );
        let wait = self.recovery.deadline().map_or(1000, |t| {
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
        for (r, w) in self.ranks.iter_mut().enumerate() {
            while let Some(f) = w.frames.pop_front() {
                match f.kind {
                    FrameKind::Bye => w.quiet = true,
                    FrameKind::Failure => {
                        if w.open {
                            w.send(&Frame::new(FrameKind::Ack, Vec::new()));
                        }
                        if let Ok(mut n) = Notice::decode(&f.payload) {
                            n.rank = r;
                            if !w.quiet {
                                w.quiet = true;
                                failures.push(n);
                            }
                        }
                    }
                    FrameKind::VerdictRequest => {
                        if w.open {
                            w.send(&Frame::new(FrameKind::Ack, Vec::new()));
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
            let frame = n.encode(FrameKind::Notice);
            // Ranks in this process last: one of them may exit as soon as it has the notice,
            // and this thread with it.
            let me = std::process::id();
            for w in self.ranks.iter_mut().filter(|w| w.open && w.pid != me) {
                w.send(&frame);
            }
            for w in self.ranks.iter_mut().filter(|w| w.open && w.pid == me) {
                w.send(&frame);
            }
        }
    }

    /// Asks every rank where it is and says which rank the job waits for.
    fn judge(&mut self) -> (String, Option<usize>) {
        let views = self.gather();
        let v = diag::analyse(&views, self.ranks.len());
        let culprit = match &v.culprit {
            diag::Culprit::Ranks(s) => s.iter().next().copied(),
            diag::Culprit::Link { to, .. } => Some(*to),
            diag::Culprit::Nothing => None,
        };
        let out = (v.line(&views), culprit);
        self.recent = Some((Instant::now(), out.clone()));
        out
    }

    /// Every rank's view: its answer to a state query, or how it failed to answer within
    /// [`GATHER`]. Other frames that arrive meanwhile wait in each rank's queue.
    pub(super) fn gather(&mut self) -> Vec<RankView> {
        self.query_id = self.query_id.wrapping_add(1);
        let id = self.query_id;
        let q = Frame::new(FrameKind::StateQuery, id.to_le_bytes().to_vec());
        let mut views: Vec<Option<RankView>> = vec![None; self.ranks.len()];
        for w in self.ranks.iter_mut().filter(|w| w.open) {
            w.send(&q);
        }
        let until = Instant::now() + GATHER;
        loop {
            for (r, w) in self.ranks.iter_mut().enumerate() {
                if !w.open || views[r].is_some() {
                    continue;
                }
                w.read();
                let mut keep = VecDeque::new();
                while let Some(f) = w.frames.pop_front() {
                    match f.kind {
                        FrameKind::StateReply if f.payload.get(..4) == Some(&id.to_le_bytes()) => {
                            match diag::decode(&f.payload[4..]) {
                                Ok(mut v) => {
                                    v.rank = r;
                                    views[r] = Some(v);
                                }
                                Err(why) => ccl_warn!(
                                    None,
                                    "bootstrap root {}: rank {r} sent a bad state reply: {why}",
                                    self.addr
                                ),
                            }
                        }
                        FrameKind::StateReply => {}
                        FrameKind::Failure if w.open => {
                            // Acknowledge now: its sender waits to know the root is alive.
                            w.send(&Frame::new(FrameKind::Ack, Vec::new()));
                            keep.push_back(f);
                        }
                        _ => keep.push_back(f),
                    }
                }
                w.frames = keep;
            }
            let waiting: Vec<usize> = (0..self.ranks.len())
                .filter(|&r| self.ranks[r].open && views[r].is_none())
                .collect();
            let left = until.saturating_duration_since(Instant::now());
            if waiting.is_empty() || left.is_zero() {
                break;
            }
            let mut fds: Vec<PollFd<'_>> = waiting
                .iter()
                .map(|&r| PollFd::new(self.ranks[r].stream.as_fd(), PollFlags::POLLIN))
                .collect();
            let ms = left.as_millis().clamp(1, 100) as u16;
            let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
        }
        views
            .into_iter()
            .enumerate()
            .map(|(r, v)| {
                let w = &self.ranks[r];
                v.unwrap_or_else(|| {
                    let presence = if w.open {
                        Presence::Silent
                    } else {
                        Presence::Dead
                    };
                    RankView::absent(r, &w.host, w.pid, presence)
                })
            })
            .collect()
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
            let frame = wire::take_frames(&mut c.buf)
                .ok()
                .and_then(|f| f.into_iter().next());
            let Some(frame) = frame else {
                if closed || Instant::now() >= c.by {
                    self.clients.swap_remove(i);
                } else {
                    i += 1;
                }
                continue;
            };
            let c = self.clients.swap_remove(i);
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
            let views = self.gather();
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
