//! A rank's monitor thread: it reads the rank's line up the monitor tree, and on a hub also the
//! lines of the ranks below it, passing their frames up and the root's frames down.
//!
//! - A frame from a child goes up wrapped as `Up{origin}` (a grandchild's frame arrives wrapped
//!   already and goes up as it is); a child's line that closes goes up as `Up{origin, Gone}`,
//!   so the root learns of a death from the hub as it would from its own line.
//! - A `Down{target}` frame is handled here when this rank is the target, passed to the child
//!   whose subtree holds the target otherwise; `Down{ALL}` does both.
//! - The root's `Attach` moves the line to the hub it names: the rank joins the hub, tells the
//!   root `Moved` on the old line and keeps reading that line until the root closes it, so no
//!   frame the root sent before it read `Moved` is lost.
//! - A digest query (`Down{ALL, DigestQuery}`) is answered for the whole subtree: the hub asks
//!   its ranks with a budget shorter by [`wire::HOP`], merges their digests with its own as they come,
//!   and sends one digest up when all have answered or its budget ends; a rank that has not
//!   answered by then is left out, and the root counts it as silent.
//! - When the line to a hub closes (the hub's process ended, or it dropped its communicator), the
//!   rank *adopts* itself: it joins the root directly and goes on. Only when the root cannot be
//!   reached is the job's monitor gone for this rank.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::LOG_SUBSYS;
use crate::shared::{Shared, write_within};
use crate::wire::{self, Frame, FrameKind};
use ccl_core::{ccl_info, ccl_trace, ccl_warn};
use ccl_diag::digest::{Digest, Ranges};

/// How long a new line may take to say which rank it is.
const JOIN_GRACE: Duration = Duration::from_secs(5);
/// How long a frame for a child that has not joined yet is kept (it joins, then the root
/// routes to it through this hub, so its line may still wait in this rank's accept queue).
const UNJOINED_GRACE: Duration = Duration::from_secs(5);
/// How long joining the root (or a hub) may take.
const CONNECT_GRACE: Duration = Duration::from_secs(5);
/// How long a hub whose communicator was dropped goes on passing frames for its ranks.
const LINGER: Duration = Duration::from_secs(2);

/// A digest query this hub is answering for its subtree.
struct Gathering {
    id: u32,
    /// When the hub answers with what it has.
    by: Instant,
    acc: Digest,
    /// Children that have not answered.
    waiting: Vec<usize>,
}

/// One monitor line and what has arrived on it.
struct Line {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Line {
    fn new(stream: TcpStream) -> Line {
        let _ = stream.set_nonblocking(true);
        Line {
            stream,
            buf: Vec::new(),
        }
    }

    /// What arrived, and whether the line closed (or sent garbage).
    fn read(&mut self) -> (Vec<Frame>, bool) {
        wire::read_ready(&self.stream, &mut self.buf)
    }

    fn send(&self, f: &Frame) {
        write_within(&self.stream, &f.encode());
    }
}

/// Whether connecting failed because nothing listens there any more (the process ended).
fn refused(e: &ccl_core::Error) -> bool {
    e.os_error()
        .is_some_and(|o| o.kind() == std::io::ErrorKind::ConnectionRefused)
}

pub(crate) struct Relay {
    s: Arc<Shared>,
    /// The line up: to the root, or to this rank's hub.
    up: Line,
    up_is_root: bool,
    /// The first line to the root, after the root moved this rank to a hub: read until the
    /// root closes it.
    old: Option<Line>,
    listener: Option<TcpListener>,
    /// New lines to this hub that have not said which rank they are.
    joiners: Vec<(Line, Instant)>,
    children: Vec<(usize, Line)>,
    /// Frames for children that have not joined yet.
    unjoined: Vec<(usize, Frame, Instant)>,
    /// Frames for every rank, kept a while for children that join late.
    recent_all: Vec<(Frame, Instant)>,
    gathering: Option<Gathering>,
    /// The communicator is being dropped: this rank takes over no monitor.
    leaving: bool,
}

impl Relay {
    pub(crate) fn new(s: Arc<Shared>, up: TcpStream, listener: Option<TcpListener>) -> Relay {
        Relay {
            s,
            up: Line::new(up),
            up_is_root: true,
            old: None,
            listener,
            joiners: Vec::new(),
            children: Vec::new(),
            unjoined: Vec::new(),
            recent_all: Vec::new(),
            gathering: None,
            leaving: false,
        }
    }

    pub(crate) fn run(mut self) {
        let mut linger: Option<Instant> = None;
        loop {
            if self.sleep(linger.is_some()) {
                // The communicator is being dropped. A hub goes on passing frames a while, so
                // that what the root sent its ranks before they learn of its goodbye (the
                // revocation, a shrink's answer) still reaches them; then their lines close
                // with this thread, and they join the root.
                let _ = self.s.stop.read();
                linger = Some(Instant::now() + LINGER);
                self.leaving = true;
                #[cfg(test)]
                if self.s.vanished.load(Ordering::Acquire) {
                    return;
                }
            }
            // A rank told to use a shrunk communicator lingers too: if the monitor dies now,
            // members still waiting for its verdict learn from this rank that it was "use it".
            if linger.is_some_and(|t| {
                Instant::now() >= t
                    || (self.children.is_empty() && self.joiners.is_empty() && !self.s.committed())
            }) {
                return;
            }
            if let Some(old) = &mut self.old {
                let (frames, closed) = old.read();
                if closed {
                    self.old = None;
                }
                for f in frames {
                    self.take_down(f);
                }
            }
            let (frames, closed) = self.up.read();
            for f in frames {
                self.take_down(f);
            }
            let may_fail_over = !self.leaving || self.s.committed();
            if closed && !self.adopt() && !(may_fail_over && self.failover()) {
                // The root's process ended (it may simply have finished) and no standby took
                // over: no news, but waits look again.
                self.s.root_gone.store(true, Ordering::Release);
                let _ = self.s.wake.write(1);
                return;
            }
            self.accept();
            self.take_up();
            self.retry_unjoined();
            if self
                .gathering
                .as_ref()
                .is_some_and(|g| Instant::now() >= g.by)
            {
                self.answer();
            }
        }
    }

    /// Waits up to a second (less when `short`) for any line; true once the monitor is being
    /// dropped.
    fn sleep(&self, short: bool) -> bool {
        let mut fds = vec![
            PollFd::new(self.s.stop.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.up.stream.as_fd(), PollFlags::POLLIN),
        ];
        fds.extend(
            self.old
                .iter()
                .map(|l| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN)),
        );
        fds.extend(
            self.listener
                .iter()
                .map(|l| PollFd::new(l.as_fd(), PollFlags::POLLIN)),
        );
        fds.extend(
            self.joiners
                .iter()
                .map(|(l, _)| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN)),
        );
        fds.extend(
            self.children
                .iter()
                .map(|(_, l)| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN)),
        );
        let mut ms: u16 = if !short && self.joiners.is_empty() && self.unjoined.is_empty() {
            1000
        } else {
            50
        };
        if let Some(g) = &self.gathering {
            let left = g.by.saturating_duration_since(Instant::now()).as_millis();
            ms = ms.min(left.clamp(1, 1000) as u16);
        }
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
        fds[0].any().unwrap_or(false)
    }

    /// A frame from the root's side.
    fn take_down(&mut self, f: Frame) {
        match f.kind {
            FrameKind::Down => {
                let Ok((target, inner)) = wire::open_envelope(&f.payload) else {
                    return;
                };
                if target == wire::ALL && inner.kind == FrameKind::DigestQuery {
                    self.gather(&inner);
                } else if target == wire::ALL {
                    // A rank the root routes through this hub has written its join: take it
                    // first. One whose join is still on its way gets the frame when it joins.
                    self.accept();
                    for (_, c) in &self.children {
                        c.send(&f);
                    }
                    let now = Instant::now();
                    self.recent_all.retain(|(_, by)| *by > now);
                    self.recent_all.push((f, now + UNJOINED_GRACE));
                    self.s.handle(inner);
                } else if target as usize == self.s.rank {
                    self.s.handle(inner);
                } else {
                    self.pass_down(target as usize, f);
                }
            }
            FrameKind::Attach => self.attach(&f.payload),
            _ => self.s.handle(f),
        }
    }

    /// Starts answering a digest query for this hub's subtree: asks its ranks (with a budget
    /// shorter by [`wire::HOP`]) and takes its own view; [`Relay::take_digest`] merges their answers.
    fn gather(&mut self, q: &Frame) {
        let Some((id, budget)) = wire::read_digest_query(&q.payload) else {
            return;
        };
        // An older query still open: answer it with what came.
        self.answer();
        self.accept();
        let down = wire::envelope(
            FrameKind::Down,
            wire::ALL,
            &wire::digest_query(id, budget.saturating_sub(wire::HOP)),
        );
        for (_, c) in &self.children {
            c.send(&down);
        }
        let now = Instant::now();
        self.recent_all.retain(|(_, by)| *by > now);
        self.recent_all.push((down, now + UNJOINED_GRACE));
        self.gathering = Some(Gathering {
            id,
            by: now + budget.saturating_sub(wire::HOP / 2),
            acc: self.s.own_digest().unwrap_or_default(),
            waiting: self.children.iter().map(|(r, _)| *r).collect(),
        });
        if self.children.is_empty() {
            self.answer();
        }
    }

    /// Child `r`'s digest: merged into the open query's answer if it is for that query and
    /// covers only `r`'s subtree.
    fn take_digest(&mut self, r: usize, f: &Frame) {
        let me = self.s.rank;
        let (id, d) = match wire::read_digest_reply(&f.payload) {
            Ok(x) => x,
            Err(why) => {
                ccl_warn!(Some(me), "monitor: rank {r} sent a bad digest: {why}");
                return;
            }
        };
        let Some(g) = self.gathering.as_mut().filter(|g| g.id == id) else {
            // This hub has answered already (the rank joined late, or answered the root on its
            // first line too): the root still counts what comes before its own deadline.
            self.s.send(f);
            return;
        };
        let subtree = Ranges::span(r, self.s.tree.end(r) - 1);
        if !d.covers.minus(&subtree).is_empty() {
            ccl_warn!(
                Some(me),
                "monitor: dropped rank {r}'s digest: it covers ranks {} outside its subtree",
                d.covers
            );
        } else if !g.acc.covers.disjoint(&d.covers) {
            ccl_trace!(Some(me), "monitor: rank {r} answered query {id} twice");
        } else if let Err(why) = g.acc.merge(d) {
            ccl_warn!(Some(me), "monitor: dropped rank {r}'s digest: {why}");
        }
        g.waiting.retain(|&c| c != r);
        if g.waiting.is_empty() {
            self.answer();
        }
    }

    /// Sends the open digest query's answer up, with whatever has come.
    fn answer(&mut self) {
        if let Some(g) = self.gathering.take() {
            self.s.send(&wire::digest_reply(g.id, &g.acc));
        }
    }

    /// Passes `f` to the child whose subtree holds `target`; keeps it a while if that child has
    /// not joined yet.
    fn pass_down(&mut self, target: usize, f: Frame) {
        let Some(c) = self.s.tree.toward(Some(self.s.rank), target) else {
            ccl_trace!(
                Some(self.s.rank),
                "monitor: dropped a frame for rank {target}, not below this rank"
            );
            return;
        };
        match self.children.iter().find(|(r, _)| *r == c) {
            Some((_, line)) => line.send(&f),
            None => self
                .unjoined
                .push((target, f, Instant::now() + UNJOINED_GRACE)),
        }
    }

    fn retry_unjoined(&mut self) {
        let now = Instant::now();
        for (target, f, by) in std::mem::take(&mut self.unjoined) {
            let c = self.s.tree.toward(Some(self.s.rank), target);
            match self.children.iter().find(|(r, _)| Some(*r) == c) {
                Some((_, line)) => line.send(&f),
                None if now < by => self.unjoined.push((target, f, by)),
                None => ccl_trace!(
                    Some(self.s.rank),
                    "monitor: dropped a frame for rank {target}: its line never joined this hub"
                ),
            }
        }
    }

    /// Moves this rank's line to the hub the root named.
    fn attach(&mut self, payload: &[u8]) {
        let rank = self.s.rank;
        let Some((hub, addr)) = wire::read_attach(payload) else {
            return;
        };
        if !self.up_is_root || self.old.is_some() || self.s.tree.parent(rank) != Some(hub) {
            ccl_warn!(
                Some(rank),
                "monitor: ignored the root's move to rank {hub}, which is not this rank's hub"
            );
            return;
        }
        let Some(line) = self.join(addr, &format!("its monitor hub, rank {hub}")) else {
            // Stay on the root's line: the root keeps watching this rank directly.
            return;
        };
        let Ok(w) = line.stream.try_clone() else {
            return;
        };
        {
            let mut writer = self.s.writer.lock().unwrap_or_else(|p| p.into_inner());
            let first = std::mem::replace(&mut *writer, w);
            // Under the writer's lock: this rank's own frames go to the hub from here on.
            write_within(&first, &Frame::new(FrameKind::Moved, Vec::new()).encode());
        }
        self.old = Some(std::mem::replace(&mut self.up, line));
        self.up_is_root = false;
        self.s.hub.store(hub, Ordering::Release);
        ccl_trace!(
            Some(rank),
            "monitor: reporting through rank {hub} at {addr}"
        );
    }

    /// After the line to this rank's hub closed: joins the root directly. False when this rank
    /// was on the root's line, or the root cannot be reached.
    fn adopt(&mut self) -> bool {
        if self.up_is_root {
            return false;
        }
        let root = self.s.root();
        let Some(line) = self.join(root, "the job's rendezvous") else {
            return false;
        };
        let Ok(w) = line.stream.try_clone() else {
            return false;
        };
        *self.s.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
        self.up = line;
        self.up_is_root = true;
        self.s.hub.store(usize::MAX, Ordering::Release);
        ccl_trace!(
            Some(self.s.rank),
            "monitor: its hub's line closed; reporting to the root at {root} directly"
        );
        true
    }

    /// After the root's line closed: moves this rank's monitor line to the first standby rank
    /// that answers (taking the monitor over itself when it is that rank). False when no
    /// standby is known or none is left.
    ///
    /// Only hard evidence passes a standby by: a refused connection, or a line that closes
    /// before the standby answers (its process ended). A standby that takes the connection but
    /// does not answer (stopped) is waited for until the timeout, then this rank gives up: every
    /// rank then fails saying so, rather than some following one monitor and some another.
    fn failover(&mut self) -> bool {
        let me = self.s.rank;
        let Some(sb) = self
            .s
            .standby
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return false;
        };
        // This rank's hub role ends: its ranks' lines close, and they fail over too.
        self.children.clear();
        self.unjoined.clear();
        self.gathering = None;
        let (lost, mut dead) = self.lost(&sb);
        dead.extend(&lost);
        for &(c, addr) in &sb.ranks {
            if dead.contains(&c) {
                continue;
            }
            if c == me {
                // A rank that is leaving runs no monitor (the others pass it by too).
                if !self.leaving && self.take_over(Vec::new()) {
                    return true;
                }
                continue;
            }
            match self.rejoin(c, addr, &dead) {
                Some(Ok(line)) => {
                    self.switch_up(line, c, addr);
                    return true;
                }
                Some(Err(())) => return false,
                None => dead.push(c),
            }
        }
        ccl_warn!(
            Some(me),
            "monitor: the job's monitor is gone and no standby rank took it over"
        );
        false
    }

    /// The ranks that died with the monitor this rank followed (those that ran in its process
    /// and had not left), and the ranks that are gone already (the monitor said they died, or
    /// they left before its process ended).
    fn lost(&self, sb: &wire::Standby) -> (Vec<usize>, Vec<usize>) {
        // The monitor this rank followed sent its own list (a standby's names itself).
        let (lost, left): (Vec<usize>, Vec<usize>) =
            sb.with_root.iter().partition(|r| !sb.left.contains(r));
        let mut dead = self.s.dead();
        dead.extend(left);
        (lost, dead)
    }

    /// Joins standby `c` at `addr`: the line once `c` answered; `None` when `c` is gone (try
    /// the next one); `Err` when it took the connection but never answered.
    fn rejoin(
        &self,
        c: usize,
        addr: std::net::SocketAddr,
        dead: &[usize],
    ) -> Option<Result<Line, ()>> {
        let me = self.s.rank;
        let join = wire::Rejoin {
            secret: self.s.secret,
            rank: me,
            pid: std::process::id(),
            dead: dead.to_vec(),
            round: self
                .s
                .outcome
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            host: ccl_core::log::hostname().to_string(),
        };
        // Only a refused connection says the standby is gone; anything else (a full accept
        // queue, a slow host) is tried again until the timeout.
        let until = Instant::now() + self.s.timeout;
        let what = || format!("monitor: joining standby rank {c} at {addr}");
        let mut s = loop {
            let by = (Instant::now() + CONNECT_GRACE).min(until);
            let joined = ccl_core::net::connect_to_listening(addr, by, &what).and_then(|mut s| {
                let _ = s.set_nodelay(true);
                wire::write_frame(&mut s, &join.encode(), by)?;
                Ok(s)
            });
            match joined {
                Ok(s) => break s,
                Err(e) if refused(&e) => {
                    ccl_trace!(Some(me), "{e}");
                    return None;
                }
                Err(e) if Instant::now() >= until => {
                    ccl_warn!(
                        Some(me),
                        "monitor: the job's root died and standby rank {c} could not be reached within {:?}: {e}",
                        self.s.timeout
                    );
                    return Some(Err(()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        // The standby's first frame says it took this rank on.
        let first = wire::read_frame(&mut s, until, &|| {
            format!("waiting for standby rank {c} at {addr} to take the job's monitor over")
        });
        match first {
            // The monitor runs there, and no longer counts this rank among the job's: moving on
            // to another standby would start a second monitor.
            Ok(f) if f.kind == FrameKind::Error => {
                ccl_warn!(
                    Some(me),
                    "monitor: rank {c}, which runs the job's monitor now, refused this rank: {}",
                    String::from_utf8_lossy(&f.payload)
                );
                Some(Err(()))
            }
            Ok(f) => {
                let line = Line::new(s);
                self.s.handle(f);
                Some(Ok(line))
            }
            Err(e) if e.kind() == ccl_core::ErrorKind::Timeout => {
                ccl_warn!(
                    Some(me),
                    "monitor: the job's root died and standby rank {c} took this rank's line but did not answer within {:?} (stopped?): {e}",
                    self.s.timeout
                );
                Some(Err(()))
            }
            Err(e) => {
                ccl_trace!(Some(me), "monitor: standby rank {c} is gone: {e}");
                None
            }
        }
    }

    /// Makes `line`, to the monitor that rank `c` runs at `addr`, this rank's line up.
    fn switch_up(&mut self, line: Line, c: usize, addr: std::net::SocketAddr) {
        let Ok(w) = line.stream.try_clone() else {
            return;
        };
        *self.s.writer.lock().unwrap_or_else(|p| p.into_inner()) = w;
        self.up = line;
        self.up_is_root = true;
        self.old = None;
        self.s.hub.store(usize::MAX, Ordering::Release);
        *self.s.root.lock().unwrap_or_else(|p| p.into_inner()) = addr;
        self.s.moved_to.store(c, Ordering::Release);
        self.s.epoch.fetch_add(1, Ordering::AcqRel);
        let _ = self.s.wake.write(1);
        if self.leaving {
            // Here only to say what this rank was told: it has left.
            self.s.send(&Frame::new(FrameKind::Bye, Vec::new()));
        }
        ccl_info!(
            Some(self.s.rank),
            "monitor: the job's monitor ended with its process; rank {c} at {addr} runs it now"
        );
    }

    /// Runs the job's monitor here, on this rank's listener, for the ranks whose root died
    /// (`first`: the lines of those that asked already, with what they sent), and joins it.
    fn take_over(&mut self, first: Vec<(Line, Vec<Frame>)>) -> bool {
        let me = self.s.rank;
        let Some(listener) = self.listener.take() else {
            return false;
        };
        let Ok(addr) = listener.local_addr() else {
            return false;
        };
        let sb = self
            .s
            .standby
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_default();
        let (lost, dead) = self.lost(&sb);
        self.children.clear();
        self.unjoined.clear();
        self.gathering = None;
        // Lines to this listener that have not said who they are yet go to the monitor too:
        // closing them would tell their ranks this one had died.
        let pending = std::mem::take(&mut self.joiners)
            .into_iter()
            .map(|(line, _)| (line, Vec::new()));
        let clients = first
            .into_iter()
            .chain(pending)
            .map(|(line, frames)| {
                let mut buf: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
                buf.extend(line.buf);
                (line.stream, buf)
            })
            .collect();
        let t = crate::watch::Takeover {
            size: self.s.size,
            rank: me,
            lost,
            dead,
            standby: sb,
            secret: self.s.secret,
            timeout: self.s.timeout,
            spawn_root: self.s.spawn_root,
            roster: self.s.roster.get().cloned(),
            clients,
        };
        if let Err(e) = t.spawn(listener) {
            ccl_warn!(Some(me), "monitor: cannot take the job's monitor over: {e}");
            return false;
        }
        // This rank reports to the monitor it runs like every other rank.
        match self.rejoin(me, addr, &[]) {
            Some(Ok(line)) => {
                self.switch_up(line, me, addr);
                true
            }
            _ => false,
        }
    }

    /// A new monitor line to `addr`, on which this rank has said who it is.
    fn join(&self, addr: std::net::SocketAddr, what: &str) -> Option<Line> {
        let by = Instant::now() + CONNECT_GRACE;
        let describe = || format!("monitor: joining {what} at {addr}");
        let joined = ccl_core::net::connect_to_listening(addr, by, &describe).and_then(|mut s| {
            let _ = s.set_nodelay(true);
            wire::write_frame(&mut s, &wire::join(&self.s.secret, self.s.rank), by)?;
            Ok(s)
        });
        match joined {
            Ok(s) => Some(Line::new(s)),
            Err(e) => {
                ccl_warn!(Some(self.s.rank), "{e}");
                None
            }
        }
    }

    /// Takes the lines of ranks joining this hub; keeps those that are this hub's children and
    /// present the job's secret.
    fn accept(&mut self) {
        if let Some(l) = &self.listener {
            while let Ok((s, _)) = l.accept() {
                self.joiners
                    .push((Line::new(s), Instant::now() + JOIN_GRACE));
            }
        }
        let now = Instant::now();
        let mut rejoins = Vec::new();
        for (mut line, by) in std::mem::take(&mut self.joiners) {
            let (frames, closed) = line.read();
            let Some(first) = frames.first() else {
                if !closed && now < by {
                    self.joiners.push((line, by));
                }
                continue;
            };
            let me = self.s.rank;
            if let Some(j) = wire::Rejoin::decode(first) {
                if ccl_core::transport::handshake::secrets_equal(&j.secret, &self.s.secret)
                    && !self.leaving
                {
                    // Only a rank of this job whose root's line closed asks this: the root's
                    // process died.
                    rejoins.push((line, frames));
                } else {
                    ccl_warn!(
                        Some(me),
                        "monitor: refused a takeover request from rank {} (not this job's secret, or this rank is leaving)",
                        j.rank
                    );
                }
                continue;
            }
            match wire::read_join(first) {
                Some((secret, r))
                    if ccl_core::transport::handshake::secrets_equal(&secret, &self.s.secret)
                        && self.s.tree.parent(r) == Some(me) =>
                {
                    self.children.retain(|(c, _)| *c != r);
                    for f in frames.into_iter().skip(1) {
                        self.pass_up(r, f);
                    }
                    if closed {
                        self.pass_up(r, Frame::new(FrameKind::Gone, Vec::new()));
                    } else {
                        for (f, by) in &self.recent_all {
                            if *by > now {
                                line.send(f);
                            }
                        }
                        self.children.push((r, line));
                    }
                }
                _ => ccl_warn!(
                    Some(me),
                    "monitor: dropped a line that is not one of this hub's ranks with the job's secret"
                ),
            }
        }
        if !rejoins.is_empty() && !self.take_over(rejoins) {
            ccl_warn!(
                Some(self.s.rank),
                "monitor: asked to take over the job's monitor, but cannot"
            );
        }
    }

    /// Reads the children's lines and passes what they say up.
    fn take_up(&mut self) {
        let mut i = 0;
        while i < self.children.len() {
            let (frames, closed) = self.children[i].1.read();
            let r = self.children[i].0;
            for f in frames {
                self.pass_up(r, f);
            }
            if closed {
                self.children.swap_remove(i);
                self.pass_up(r, Frame::new(FrameKind::Gone, Vec::new()));
                if let Some(g) = &mut self.gathering {
                    g.waiting.retain(|&c| c != r);
                    if g.waiting.is_empty() {
                        self.answer();
                    }
                }
            } else {
                i += 1;
            }
        }
    }

    /// Sends child `r`'s frame up: wrapped with its origin, unless a hub below wrapped it. A
    /// digest is this hub's to merge.
    fn pass_up(&mut self, r: usize, f: Frame) {
        if f.kind == FrameKind::DigestReply {
            self.take_digest(r, &f);
        } else if f.kind == FrameKind::Up {
            self.s.send(&f);
        } else {
            self.s.send(&wire::envelope(FrameKind::Up, r as u32, &f));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use crate::{Bootstrap, Monitor, UniqueId};
    use ccl_core::config::Config;
    use ccl_diag::verdict::{self as diag, Presence, RankView};

    /// `n` ranks of one job (threads of this process) with monitors of fan-out `f`, each
    /// answering state queries, with the ranks that asked each to connect.
    type Asked = std::sync::Arc<Mutex<Vec<usize>>>;

    fn job(n: usize, f: usize) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
        job_with(
            n,
            f,
            std::sync::Arc::new(|r| {
                diag::encode(&RankView::absent(r, "test", 1, Presence::Answered))
            }),
        )
    }

    /// Each rank's state source.
    type States = std::sync::Arc<dyn Fn(usize) -> Vec<u8> + Send + Sync>;

    /// [`job`], with each rank `r` describing itself as `state(r)`.
    fn job_with(n: usize, f: usize, state: States) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
        job_opts(n, f, state, None)
    }

    /// With `remote`, the root counts as running in a process of its own, with those ranks.
    fn job_opts(
        n: usize,
        f: usize,
        state: States,
        remote: Option<Vec<usize>>,
    ) -> (UniqueId, Vec<Monitor>, Vec<Asked>) {
        let c = Config {
            timeout: Duration::from_secs(20),
            ..Config::default()
        };
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        if let Some(with_root) = remote {
            crate::hooks::set_remote(id.secret(), with_root);
        }
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                    b.allgather(&[r as u8]).unwrap();
                    b.into_monitor(f).unwrap()
                })
            })
            .collect();
        let mut asked = Vec::new();
        let ms: Vec<Monitor> = hs
            .into_iter()
            .enumerate()
            .map(|(r, h)| {
                let m = h.join().unwrap();
                let state = std::sync::Arc::clone(&state);
                m.set_state_source(Box::new(move || state(r)));
                let a = std::sync::Arc::new(Mutex::new(Vec::new()));
                let a2 = std::sync::Arc::clone(&a);
                m.set_connect_hook(Box::new(move |from| a2.lock().unwrap().push(from)));
                asked.push(a);
                m
            })
            .collect();
        (id, ms, asked)
    }

    fn until(what: &str, mut ok: impl FnMut() -> bool) {
        let by = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < by, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn report(id: &UniqueId) -> String {
        crate::live_query(id.root_addr(), &id.secret(), Duration::from_secs(10)).unwrap()
    }

    /// 13 ranks with fan-out 3 make three levels: 0 and 9 report to the root; 3 and 6 to 0,
    /// 12 to 9; 4 and 5 to 3, and so on. Frames cross every level both ways, a dead hub's
    /// ranks join the root and stay watched, and deaths are named however a rank reported.
    /// Every monitor of `ms` shrinks at once (`exclude` nothing) and commits: the members.
    fn shrink_all(ms: &[&Monitor], n: usize) -> Vec<Vec<usize>> {
        let by = Instant::now() + Duration::from_secs(30);
        std::thread::scope(|sc| {
            let hs: Vec<_> = ms
                .iter()
                .map(|m| {
                    sc.spawn(move || {
                        loop {
                            let d = m.shrink(&[], n, by).unwrap();
                            if m.formed(true, by).unwrap() {
                                return d.members;
                            }
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// The monitor a standby took over gathers states and names the culprit of a later hang
    /// as the first root did (here through what was a tree of hubs).
    #[test]
    fn after_a_takeover_the_monitor_names_the_culprit_of_a_hang() {
        // Rank 4 is stopped: it says nothing.
        let state = |r| {
            if r == 4 {
                Vec::new()
            } else {
                ring_view(r, 6, 0, 0)
            }
        };
        let (id, ms, _) = job_opts(6, 2, std::sync::Arc::new(state), Some(Vec::new()));
        until("every rank knows the standbys", || {
            ms.iter().all(|m| m.standby().is_some())
        });
        crate::hooks::kill(id.secret(), id.root_addr());
        until("every rank follows rank 0's monitor", || {
            ms.iter().all(|m| m.moved_to() == Some(0))
        });
        let v = verdict_after_report(&ms, 5);
        assert!(
            v.starts_with("allreduce #5 (ring, 64 B) is stuck behind rank 4 ("),
            "{v}"
        );
        assert!(v.contains("which does not answer"), "{v}");
    }

    #[test]
    fn the_roots_process_ending_after_its_rank_left_names_nobody_dead() {
        // As at the end of a job launched torchrun-style: rank 0, in the root's process,
        // destroys its communicator, then its process (and the root) ends.
        let state: States = std::sync::Arc::new(|r| {
            diag::encode(&RankView::absent(r, "test", 1, Presence::Answered))
        });
        let (id, mut ms, _) = job_opts(3, 64, state, Some(vec![0]));
        until("every rank knows the standbys", || {
            ms.iter().all(|m| m.standby().is_some())
        });
        let sb = ms[0].standby().unwrap();
        assert_eq!(sb.ranks.iter().map(|(r, _)| *r).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(sb.with_root, [0]);
        // Dropping waits until the root has told the others that rank 0 left.
        drop(ms.remove(0));
        assert!(ms.iter().all(|m| m.standby().unwrap().left == [0]));
        crate::hooks::kill(id.secret(), id.root_addr());
        until("the others follow rank 1's monitor", || {
            ms.iter().all(|m| m.moved_to() == Some(1))
        });
        for m in &ms {
            assert_eq!(m.wait(Duration::from_millis(1500)), None);
            assert!(m.failed_ranks().is_empty());
        }
    }

    #[test]
    fn a_standby_takes_the_monitor_over_when_the_root_dies_twice() {
        // Five ranks with fan-out 2: ranks 0 and 2 are hubs, rank 4 is below rank 0 and
        // below rank 2... the takeover makes the tree a star.
        let n = 5;
        let state: States = std::sync::Arc::new(|r| {
            diag::encode(&RankView::absent(r, "test", 1, Presence::Answered))
        });
        let (id, mut ms, _) = job_opts(n, 2, state, Some(Vec::new()));
        until("every rank knows the standbys", || {
            ms.iter().all(|m| m.standby().is_some())
        });
        let sb = ms[0].standby().unwrap();
        assert_eq!(
            sb.ranks.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert!(sb.with_root.is_empty());

        crate::hooks::kill(id.secret(), id.root_addr());
        until("every rank follows rank 0's monitor", || {
            ms.iter().all(|m| m.moved_to() == Some(0))
        });
        assert!(ms.iter().all(|m| !m.root_gone() && m.hub().is_none()));
        let refs: Vec<&Monitor> = ms.iter().collect();
        for members in shrink_all(&refs, n) {
            assert_eq!(members, vec![0, 1, 2, 3, 4]);
        }

        // Now rank 0's process dies, with the monitor it took over.
        crate::hooks::kill(id.secret(), ms[0].root());
        ms.remove(0).vanish();
        until("the survivors follow rank 1's monitor", || {
            ms.iter().all(|m| m.moved_to() == Some(1))
        });
        for m in &ms {
            let n0 = m
                .wait(Duration::from_secs(20))
                .expect("a notice of rank 0's death");
            assert_eq!(n0.rank, 0, "{n0:?}");
            assert!(n0.died);
            assert_eq!(m.failed_ranks(), vec![0]);
        }
        let refs: Vec<&Monitor> = ms.iter().collect();
        for members in shrink_all(&refs, n) {
            assert_eq!(members, vec![1, 2, 3, 4]);
        }
    }

    #[test]
    fn a_tree_of_hubs_watches_the_job_and_survives_a_hub() {
        let (id, mut ms, asked) = job(13, 3);
        let hub_of = |r: usize| match r {
            0 | 9 => None,
            1..=3 | 6 => Some(0),
            12 => Some(9),
            r => Some(r - r % 3),
        };
        until("every rank reports through its hub", || {
            (0..13).all(|r| ms[r].hub() == hub_of(r))
        });
        // A state query reaches every rank through the tree and every answer comes back.
        let text = report(&id);
        assert!(!text.contains("does not answer"), "{text}");
        // Up two levels and down two: rank 8 (under 6, under 0) asks rank 10 (under 9).
        ms[8].ask_connect(10);
        until("rank 10 is asked by rank 8", || {
            asked[10].lock().unwrap().contains(&8)
        });
        // A rank's failure reaches every other rank.
        ms[11].report("rank 11 broke", None);
        for (r, m) in ms.iter().enumerate().filter(|(r, _)| *r != 11) {
            let n = m.wait(Duration::from_secs(30)).expect("a notice");
            assert_eq!(n.rank, 11, "rank {r}: {n:?}");
            assert!(!n.died);
        }
        // Hub 3 dies: it is named, and ranks 4 and 5 go on reporting to the root directly.
        let hub = ms.remove(3);
        hub.vanish();
        until("ranks 4 and 5 join the root", || {
            ms[3].hub().is_none() && ms[4].hub().is_none()
        });
        until("rank 3's death is named", || {
            report(&id).contains("rank 3") && report(&id).contains("its process ended")
        });
        let text = report(&id);
        assert!(!text.contains("does not answer"), "{text}");
        // Rank 4, now on its own line to the root, dies: named to the others too.
        let four = ms.remove(3);
        four.vanish();
        until("rank 4's death is named", || {
            ms[3].failed_ranks().contains(&4)
        });
        // Rank 5 still hears rank 1 (under hub 0), and rank 1 hears rank 5.
        ms[1].ask_connect(5);
        until("rank 5 is asked by rank 1", || {
            asked[5].lock().unwrap().contains(&1)
        });
        ms[3].ask_connect(2);
        until("rank 2 is asked by rank 5", || {
            asked[2].lock().unwrap().contains(&5)
        });
    }

    /// A goodbye through a hub is no death; the ranks below a hub that leaves join the root.
    #[test]
    fn a_hub_that_leaves_hands_its_ranks_to_the_root() {
        let (id, mut ms, _) = job(9, 2);
        // Fan-out 2, 9 ranks: rank 4 is the hub of 5 (and of 6, the hub of 7).
        until("rank 5 reports through rank 4", || ms[5].hub() == Some(4));
        let four = ms.remove(4);
        drop(four);
        // Rank 5 and rank 6 (now at indices 4 and 5) join the root; 7 stays under 6.
        until("ranks 5 and 6 join the root", || {
            ms[4].hub().is_none() && ms[5].hub().is_none()
        });
        assert_eq!(ms[6].hub(), Some(6));
        let text = report(&id);
        assert!(!text.contains("does not answer"), "{text}");
        // A goodbye is no death: nobody hears of a failure.
        std::thread::sleep(Duration::from_millis(300));
        for m in &ms {
            assert!(m.poll().is_none(), "{:?}", m.poll());
        }
    }

    /// The state of rank `r` of `n` in a ring stuck in allreduce #5: each waits for the rank
    /// before it, whose header arrived; `sent` is what it handed the link to the rank after it,
    /// `got` what it received from the one before.
    fn ring_view(r: usize, n: usize, sent: u64, got: u64) -> Vec<u8> {
        use ccl_diag::recorder::{PeerStat, State, now_us};
        let now = now_us();
        let (prev, next) = ((r + n - 1) % n, (r + 1) % n);
        let stat = |peer, sent, received| PeerStat {
            peer,
            to_send: 64,
            sent,
            to_recv: 64,
            received,
            arrived: true,
            waited_us: 0,
            late_us: 0,
        };
        diag::encode(&RankView {
            rank: r,
            host: "test".into(),
            pid: 100 + r as u32,
            presence: Presence::Answered,
            now_us: now,
            ops: vec![ccl_diag::Op {
                seq: 5,
                name: "allreduce".into(),
                algo: "ring".into(),
                dtype: "float".into(),
                op: "sum".into(),
                count: 16,
                bytes: 64,
                root: None,
                state: State::Running,
                start_us: now - 10_000_000,
                end_us: 0,
                progress_us: now - 5_000_000,
                waiting_on: Some(prev),
                error: None,
                peers: vec![stat(prev, 0, got), stat(next, sent, 0)],
            }],
            slow: Vec::new(),
        })
    }

    /// The verdict every other rank gets once `reporter` reports a failure.
    fn verdict_after_report(ms: &[Monitor], reporter: usize) -> String {
        ms[reporter].report("timed out", None);
        let verdicts: Vec<String> = ms
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != reporter)
            .map(|(r, m)| {
                m.wait(Duration::from_secs(30))
                    .unwrap_or_else(|| panic!("rank {r}: no notice"))
                    .verdict
            })
            .collect();
        assert!(verdicts.iter().all(|v| *v == verdicts[0]), "{verdicts:?}");
        verdicts[0].clone()
    }

    /// Waits until every rank of `ms` (a job of fan-out `f`) reports through its hub: a query
    /// sent while a rank moves reaches it, but its answer may miss the hub's.
    fn settled(ms: &[Monitor], f: usize) {
        let tree = crate::tree::Tree::new(ms.len(), f);
        until("every rank reports through its hub", || {
            ms.iter()
                .enumerate()
                .all(|(r, m)| m.hub() == tree.parent(r))
        });
    }

    /// With the monitor a tree, the verdict comes from digests merged hub by hub: a silent
    /// rank two hubs below the root is found at the end of the ring's waits.
    #[test]
    fn a_tree_names_a_silent_rank_below_two_hubs() {
        // Rank 7 is stopped: it says nothing.
        let state = |r| {
            if r == 7 {
                Vec::new()
            } else {
                ring_view(r, 13, 0, 0)
            }
        };
        let (_id, ms, _) = job_with(13, 3, std::sync::Arc::new(state));
        settled(&ms, 3);
        let v = verdict_after_report(&ms, 8);
        assert!(
            v.starts_with("allreduce #5 (ring, 64 B) is stuck behind rank 7 ("),
            "{v}"
        );
        assert!(v.contains("which does not answer"), "{v}");
        assert!(
            v.contains("ranks 0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11 and 12 wait on it"),
            "{v}"
        );
    }

    /// A rank at the end of every wait whose own failure report names another rank failed
    /// because of that rank (it saw it leave): the notice blames the rank it named. Here rank
    /// 1 failed and says it waits for nobody (as a rank that has exited says nothing), so the
    /// ring's waits all end at it; its report names rank 0.
    #[test]
    fn a_culprit_whose_report_names_another_rank_passes_the_blame_on() {
        use ccl_diag::recorder::State;
        let state = |r| {
            let mut v = diag::decode(&ring_view(r, 4, 0, 0)).unwrap();
            if r == 1 {
                v.ops[0].state = State::Failed;
                v.ops[0].waiting_on = None;
            }
            diag::encode(&v)
        };
        let (_id, ms, _) = job_with(4, 4, std::sync::Arc::new(state));
        ms[1].report("shared-memory peer 0 left", Some(0));
        for r in [0, 2, 3] {
            let n = ms[r].wait(Duration::from_secs(30)).expect("a notice");
            assert_eq!(n.rank, 1, "rank {r}: {n:?}");
            assert!(n.verdict.contains("stuck behind rank 1"), "rank {r}: {n:?}");
            assert_eq!(n.culprit, Some(0), "rank {r}: {n:?}");
        }
    }

    /// A link whose ends report through different top-level hubs: the root finds it from the
    /// waiter's digest and both ends' views.
    #[test]
    fn a_tree_names_a_link_between_subtrees() {
        // Rank 8 handed 64 bytes to rank 9's link, and 16 arrived.
        let state = |r| match r {
            8 => ring_view(r, 13, 64, 0),
            9 => ring_view(r, 13, 0, 16),
            _ => ring_view(r, 13, 0, 0),
        };
        let (_id, ms, _) = job_with(13, 3, std::sync::Arc::new(state));
        settled(&ms, 3);
        let v = verdict_after_report(&ms, 9);
        assert!(
            v.starts_with("allreduce #5 (ring, 64 B) is stuck on the link from rank 8 (test:108) to rank 9 (test:109): 64 bytes were sent on it and 16 arrived, both ranks are inside the operation"),
            "{v}"
        );
    }

    /// What one verdict brings the root, star against tree: every rank's view against one
    /// digest per top-level hub (and the views of the culprit). `CCL_VERDICT_RANKS` sets the
    /// size (64 by default; docs/scale.md gives 1,024).
    #[test]
    fn a_tree_brings_the_root_digests_not_every_view() {
        let n: usize = std::env::var("CCL_VERDICT_RANKS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64);
        let mut bytes = Vec::new();
        for f in [n, (n as f64).sqrt().ceil() as usize] {
            let silent = n / 2 + 1;
            let state = move |r| {
                if r == silent {
                    Vec::new()
                } else {
                    ring_view(r, n, 0, 0)
                }
            };
            let (id, ms, _) = job_with(n, f, std::sync::Arc::new(state));
            let tree = crate::tree::Tree::new(n, f);
            until("every rank reports through its hub", || {
                ms.iter()
                    .enumerate()
                    .all(|(r, m)| m.hub() == tree.parent(r))
            });
            let before = crate::state_bytes(id.root_addr());
            let v = verdict_after_report(&ms, 0);
            let took = crate::state_bytes(id.root_addr()) - before;
            assert!(v.contains(&format!("stuck behind rank {silent} (")), "{v}");
            eprintln!(
                "{n} ranks, fan-out {f}: the root took {took} bytes of state for the verdict"
            );
            bytes.push(took);
            drop(ms);
        }
        assert!(bytes[1] * 4 < bytes[0], "{bytes:?}");
    }
}
