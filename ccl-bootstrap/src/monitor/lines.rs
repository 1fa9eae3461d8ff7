//! The lines the root holds: a rank's own, which carries the frames of the ranks below it too
//! (each hub wraps what its ranks send). The root reads them all and sorts what arrives by the
//! rank it came from, notices a line that closes (and the ranks it cut off from the root), and
//! sends a frame to a rank on the rank's own line or down through the hubs above it.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::root::{Watch, Watched};
use super::takeover::alive;
use crate::LOG_SUBSYS;
use crate::wire::{self, Frame, FrameKind};
use ccl_core::ccl_warn;

static SETTLED_LINES: AtomicUsize = AtomicUsize::new(0);

/// The most monitor connections a root of this process held once the ranks had moved to their
/// hubs (the root's share of the monitor tree: at most `CCL_MONITOR_FANOUT`).
pub fn root_lines() -> usize {
    SETTLED_LINES.load(Ordering::Relaxed)
}

/// Whether rank `w` said goodbye (its frames may still wait to be handled).
fn said_goodbye(w: &Watched) -> bool {
    w.left || w.frames.iter().any(|f| f.kind == FrameKind::Bye)
}

impl Watch<'_> {
    /// Reads every line the root holds and sorts what arrived by rank: frames into each rank's
    /// queue, ended lines and the hubs' `Gone` into closed ranks.
    pub(super) fn pump(&mut self) {
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
    pub(super) fn settle(&mut self) {
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
    pub(super) fn send_to(&mut self, r: usize, f: &Frame) {
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
    pub(super) fn broadcast(&mut self, f: &Frame) {
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

    /// The lines the root holds that are open, to poll for reading.
    pub(super) fn link_fds(&self) -> Vec<PollFd<'_>> {
        self.links
            .iter()
            .filter(|l| l.open)
            .map(|l| PollFd::new(l.stream.as_fd(), PollFlags::POLLIN))
            .collect()
    }

    /// Waits up to 100 ms (at most until `until`) for any line the root holds.
    pub(super) fn wait_lines(&self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        let mut fds = self.link_fds();
        let ms = left.as_millis().clamp(1, 100) as u16;
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(ms));
    }
}
