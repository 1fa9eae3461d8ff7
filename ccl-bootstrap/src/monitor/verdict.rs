//! Verdict gathering: before the root passes a failure on, and when a rank's operation runs
//! late, it asks every live rank what it is doing ([`FrameKind::StateQuery`]; with the monitor a
//! tree, digests merged hub by hub, [`FrameKind::DigestQuery`]), gives the answers [`GATHER`],
//! and runs the analysis of `ccl_diag::verdict` on them to name the rank or link the job waits
//! for.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

use super::root::Watch;
use crate::LOG_SUBSYS;
use crate::timing::GATHER;
use crate::wire::{self, Frame, FrameKind};
use ccl_core::ccl_warn;
use ccl_diag::digest::{Digest, Ranges};
use ccl_diag::verdict::{self as diag, Presence, RankView};

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

impl Watch<'_> {
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
    pub(super) fn judge(&mut self) -> (String, Option<usize>) {
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
        self.broadcast(&wire::digest_query(
            id,
            GATHER.get().saturating_sub(wire::HOP.get()),
        ));
        let until = Instant::now() + GATHER.get();
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
        let until = Instant::now() + GATHER.get();
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
}
