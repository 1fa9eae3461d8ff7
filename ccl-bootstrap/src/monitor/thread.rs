//! A rank's monitor thread: it reads the rank's line up the monitor tree, and on a hub also the
//! lines of the ranks below it, passing their frames up and the root's frames down (`hub`).
//!
//! - A `Down{target}` frame is handled here when this rank is the target, passed to the child
//!   whose subtree holds the target otherwise; `Down{ALL}` does both.
//! - The root's `Attach` moves the line to the hub it names: the rank joins the hub, tells the
//!   root `Moved` on the old line and keeps reading that line until the root closes it, so no
//!   frame the root sent before it read `Moved` is lost.
//! - When the line to a hub closes (the hub's process ended, or it dropped its communicator), the
//!   rank *adopts* itself: it joins the root directly and goes on. Only when the root cannot be
//!   reached is the job's monitor gone for this rank.
//! - When the root's own line closes (its process ended), the thread moves to a standby rank
//!   that takes the monitor over (`takeover`).

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::shared::{Shared, write_within};
use crate::LOG_SUBSYS;
use crate::timing::{CONNECT_GRACE, LINGER, UNJOINED_GRACE};
use crate::wire::{self, Frame, FrameKind};
use ccl_core::{ccl_trace, ccl_warn};
use ccl_diag::digest::Digest;

/// A digest query this hub is answering for its subtree.
pub(super) struct Gathering {
    pub(super) id: u32,
    /// When the hub answers with what it has.
    pub(super) by: Instant,
    pub(super) acc: Digest,
    /// Children that have not answered.
    pub(super) waiting: Vec<usize>,
}

/// One monitor line and what has arrived on it.
pub(super) struct Line {
    pub(super) stream: TcpStream,
    pub(super) buf: Vec<u8>,
}

impl Line {
    pub(super) fn new(stream: TcpStream) -> Line {
        let _ = stream.set_nonblocking(true);
        Line {
            stream,
            buf: Vec::new(),
        }
    }

    /// What arrived, and whether the line closed (or sent garbage).
    pub(super) fn read(&mut self) -> (Vec<Frame>, bool) {
        wire::read_ready(&self.stream, &mut self.buf)
    }

    pub(super) fn send(&self, f: &Frame) {
        write_within(&self.stream, &f.encode());
    }
}

pub(crate) struct Relay {
    pub(super) s: Arc<Shared>,
    /// The line up: to the root, or to this rank's hub.
    pub(super) up: Line,
    pub(super) up_is_root: bool,
    /// The first line to the root, after the root moved this rank to a hub: read until the
    /// root closes it.
    pub(super) old: Option<Line>,
    pub(super) listener: Option<TcpListener>,
    /// New lines to this hub that have not said which rank they are.
    pub(super) joiners: Vec<(Line, Instant)>,
    pub(super) children: Vec<(usize, Line)>,
    /// Frames for children that have not joined yet.
    pub(super) unjoined: Vec<(usize, Frame, Instant)>,
    /// Frames for every rank, kept a while for children that join late.
    pub(super) recent_all: Vec<(Frame, Instant)>,
    pub(super) gathering: Option<Gathering>,
    /// The communicator is being dropped: this rank takes over no monitor.
    pub(super) leaving: bool,
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
                linger = Some(Instant::now() + LINGER.get());
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
                    self.recent_all.push((f, now + UNJOINED_GRACE.get()));
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

    /// A new monitor line to `addr`, on which this rank has said who it is.
    fn join(&self, addr: std::net::SocketAddr, what: &str) -> Option<Line> {
        let by = Instant::now() + CONNECT_GRACE.get();
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
}
