//! What a rank's monitor thread (`thread`) does as a hub, for the ranks below it:
//!
//! - It takes their lines (each says which rank it is and presents the job's secret).
//! - A frame from a child goes up wrapped as `Up{origin}` (a grandchild's frame arrives wrapped
//!   already and goes up as it is); a child's line that closes goes up as `Up{origin, Gone}`,
//!   so the root learns of a death from the hub as it would from its own line.
//! - A frame for a rank below goes to the child whose subtree holds it, and waits a while for
//!   a child that has not joined yet.
//! - A digest query (`Down{ALL, DigestQuery}`) is answered for the whole subtree: the hub asks
//!   its ranks with a budget shorter by [`wire::HOP`], merges their digests with its own as they come,
//!   and sends one digest up when all have answered or its budget ends; a rank that has not
//!   answered by then is left out, and the root counts it as silent.

use std::time::Instant;

use super::thread::{Gathering, Line, Relay};
use crate::LOG_SUBSYS;
use crate::timing::{JOIN_GRACE, UNJOINED_GRACE};
use crate::wire::{self, Frame, FrameKind};
use ccl_core::{ccl_trace, ccl_warn};
use ccl_diag::digest::Ranges;

impl Relay {
    /// Starts answering a digest query for this hub's subtree: asks its ranks (with a budget
    /// shorter by [`wire::HOP`]) and takes its own view; [`Relay::take_digest`] merges their answers.
    pub(super) fn gather(&mut self, q: &Frame) {
        let Some((id, budget)) = wire::read_digest_query(&q.payload) else {
            return;
        };
        // An older query still open: answer it with what came.
        self.answer();
        self.accept();
        let down = wire::envelope(
            FrameKind::Down,
            wire::ALL,
            &wire::digest_query(id, budget.saturating_sub(wire::HOP.get())),
        );
        for (_, c) in &self.children {
            c.send(&down);
        }
        let now = Instant::now();
        self.recent_all.retain(|(_, by)| *by > now);
        self.recent_all.push((down, now + UNJOINED_GRACE.get()));
        self.gathering = Some(Gathering {
            id,
            by: now + budget.saturating_sub(wire::HOP.get() / 2),
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
    pub(super) fn answer(&mut self) {
        if let Some(g) = self.gathering.take() {
            self.s.send(&wire::digest_reply(g.id, &g.acc));
        }
    }

    /// Passes `f` to the child whose subtree holds `target`; keeps it a while if that child has
    /// not joined yet.
    pub(super) fn pass_down(&mut self, target: usize, f: Frame) {
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
                .push((target, f, Instant::now() + UNJOINED_GRACE.get())),
        }
    }

    pub(super) fn retry_unjoined(&mut self) {
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

    /// Takes the lines of ranks joining this hub; keeps those that are this hub's children and
    /// present the job's secret.
    pub(super) fn accept(&mut self) {
        if let Some(l) = &self.listener {
            while let Ok((s, _)) = l.accept() {
                self.joiners
                    .push((Line::new(s), Instant::now() + JOIN_GRACE.get()));
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
    pub(super) fn take_up(&mut self) {
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
