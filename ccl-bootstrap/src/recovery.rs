//! The root's part in surviving a rank's death: revoking a communicator and agreeing on the
//! survivors of a shrink.
//!
//! **Why the root decides.** The root already hears from every rank (on its own line or
//! through the hubs of the monitor tree) and is the one that sees a rank die (its line closes
//! without a goodbye). Agreement through it is one request and one answer per rank, and a
//! further death during the shrink is just another closed line it sees. When the root's own
//! process dies, a standby rank takes the watch over (`relay`, `watch::Takeover`) with a fresh
//! `Recovery`: requests pending at the old root are sent again, and a round it had decided is
//! dropped by the ranks, so this module never sees a round of another root.
//!
//! **A round.** The first request revokes the communicator for every rank that has not asked
//! yet, so ranks blocked in a collective return and ask too. The root answers when every rank it
//! waits for has asked: every rank still connected, minus the ranks some request excludes (a live
//! rank that is being excluded need not take part), or when the timeout passes (a rank that has
//! not asked by then, stopped or stuck, is left out). The members are the ranks that asked, in
//! rank order, minus every rank any request excluded. They get the unique id of a new root,
//! started here; a member that dies before the new communicator is up makes that root fail
//! everyone at once, and the others ask again for a round among the members still alive.
//!
//! **Commit.** Whether a member's part of the new communicator formed can differ between
//! members (one connected to a rank just before it died, another just after). So each member
//! reports its outcome, and only when every member reports success does the root tell them to
//! use it; otherwise, or when a member dies or stays silent past the timeout, it tells them all
//! to drop it and ask again. The root alone decides, so the live members never disagree on the
//! outcome.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::LOG_SUBSYS;
use crate::id::{UniqueId, random_secret};
use crate::wire::{self, Frame, FrameKind, ShrinkDecision, ShrinkRequest};
use ccl_core::{ccl_trace, ccl_warn};

/// Set to a message when the new communicator's root must give up admitting (a member died).
pub(super) type Abandon = Arc<Mutex<Option<String>>>;

/// Starts a root on a listener (the rendezvous's `Root::spawn_with`, passed in so that this
/// module, which the root's watch runs, does not reach back up to the root).
pub(super) type SpawnRoot =
    fn(TcpListener, [u8; 32], Duration, Option<Abandon>) -> ccl_core::Result<()>;

/// What the root knows of shrinking while it watches a communicator.
pub(super) struct Recovery {
    size: usize,
    /// Where new roots listen (the address of this one).
    addr: SocketAddr,
    timeout: Duration,
    spawn_root: SpawnRoot,
    revoked: bool,
    /// Shrink rounds decided so far.
    round: u32,
    /// Ranks this round waits for: every rank in round 0, the last round's members after.
    expected: Vec<bool>,
    /// This round's requests: rank, the ranks it excludes.
    requests: BTreeMap<usize, Vec<usize>>,
    started: Option<Instant>,
    /// The last decision's members and the handle that makes their root give up.
    admitting: Option<(Vec<usize>, Abandon)>,
    /// The members whose new communicator is forming, since when, and who reported it formed.
    forming: Option<Forming>,
}

struct Forming {
    members: Vec<usize>,
    since: Instant,
    formed: Vec<usize>,
    failed: bool,
}

/// A frame for one rank.
pub(super) type Out = (usize, Frame);

impl Recovery {
    pub(super) fn new(
        size: usize,
        addr: SocketAddr,
        timeout: Duration,
        spawn_root: SpawnRoot,
    ) -> Recovery {
        Recovery {
            size,
            addr,
            timeout,
            spawn_root,
            revoked: false,
            round: 0,
            expected: vec![true; size],
            requests: BTreeMap::new(),
            started: None,
            admitting: None,
            forming: None,
        }
    }

    /// Whether the root should look again before its usual poll interval (a round is open).
    pub(super) fn deadline(&self) -> Option<Instant> {
        let forming = self.forming.as_ref().map(|f| f.since);
        self.started.or(forming).map(|t| t + self.timeout)
    }

    /// Member `r` reports whether its part of the new communicator formed.
    pub(super) fn on_formed(&mut self, r: usize, payload: &[u8]) {
        let Ok((round, ok)) = wire::read_round_flag(payload) else {
            return;
        };
        if let Some(f) = &mut self.forming
            && round == self.round
            && f.members.contains(&r)
        {
            if ok {
                f.formed.push(r);
            } else {
                f.failed = true;
            }
        }
    }

    /// The verdict on the forming communicator, once every member formed it (commit), one
    /// failed, died or stayed silent past the timeout (drop it and ask again).
    fn verdict(&mut self, open: &[bool]) -> Vec<Out> {
        let Some(f) = &self.forming else {
            return Vec::new();
        };
        let all = f.members.iter().all(|r| f.formed.contains(r));
        let lost = f.members.iter().any(|&r| !open[r]);
        let late = f.since.elapsed() >= self.timeout;
        if !(all || f.failed || lost || late) {
            return Vec::new();
        }
        let commit = all && !f.failed && !lost;
        let frame = wire::round_flag(FrameKind::Commit, self.round, commit);
        let members = f.members.clone();
        self.forming = None;
        if !commit {
            ccl_warn!(
                None,
                "bootstrap root {}: the shrunk communicator of ranks {members:?} did not form everywhere; its members ask again",
                self.addr
            );
        }
        members
            .into_iter()
            .filter(|&r| open[r])
            .map(|r| (r, frame.clone()))
            .collect()
    }

    /// Revokes the communicator for every open rank but `by` (once).
    fn revoke(&mut self, by: usize, why: String, open: &[bool]) -> Vec<Out> {
        if self.revoked {
            return Vec::new();
        }
        self.revoked = true;
        let n = wire::Notice {
            rank: by,
            died: false,
            message: why,
            verdict: String::new(),
            culprit: None,
        };
        let f = n.encode(FrameKind::Revoked);
        (0..self.size)
            .filter(|&r| open[r] && r != by && !self.requests.contains_key(&r))
            .map(|r| (r, f.clone()))
            .collect()
    }

    /// Rank `r` revoked the communicator.
    pub(super) fn on_revoke(&mut self, r: usize, open: &[bool]) -> Vec<Out> {
        self.revoke(r, format!("rank {r} revoked the communicator"), open)
    }

    /// Rank `r` asks to shrink.
    pub(super) fn on_shrink(&mut self, r: usize, payload: &[u8], open: &[bool]) -> Vec<Out> {
        let req = match ShrinkRequest::decode(payload, self.size) {
            Ok(q) => q,
            Err(e) => return vec![(r, Frame::error(&e.to_string()))],
        };
        if req.round != self.round || !self.expected[r] {
            let msg = format!(
                "rank {r} was left out of the shrunk communicator: the survivors agreed without \
                 it (it asked in round {} of {}; a rank that does not ask within the timeout, \
                 {:?}, is left out)",
                req.round, self.round, self.timeout
            );
            return vec![(r, Frame::error(&msg))];
        }
        ccl_trace!(
            None,
            "bootstrap root {}: rank {r} asks to shrink (round {})",
            self.addr,
            req.round
        );
        self.requests.insert(r, req.exclude);
        let mut out = Vec::new();
        if self.started.is_none() {
            self.started = Some(Instant::now());
            out = self.revoke(r, format!("rank {r} is shrinking the communicator"), open);
        }
        out
    }

    /// Rank `r`'s connection closed (died, or left after a goodbye).
    pub(super) fn on_gone(&mut self, r: usize) {
        self.expected[r] = false;
        self.requests.remove(&r);
        if let Some((members, abandon)) = &self.admitting
            && members.contains(&r)
        {
            let mut g = abandon.lock().unwrap_or_else(|p| p.into_inner());
            g.get_or_insert_with(|| {
                format!(
                    "rank {r} of the old communicator died while the shrunk one was being set up"
                )
            });
        }
    }

    /// The decision of an open round, once every awaited rank has asked or the time is up, and
    /// the verdict on a forming communicator.
    pub(super) fn decide(&mut self, open: &[bool]) -> Vec<Out> {
        let mut out = self.verdict(open);
        out.extend(self.decide_round(open));
        out
    }

    fn decide_round(&mut self, open: &[bool]) -> Vec<Out> {
        let Some(started) = self.started else {
            return Vec::new();
        };
        let excluded: Vec<usize> = self.requests.values().flatten().copied().collect();
        let awaited = (0..self.size).filter(|&r| {
            self.expected[r] && open[r] && !excluded.contains(&r) && !self.requests.contains_key(&r)
        });
        if awaited.count() > 0 && started.elapsed() < self.timeout {
            return Vec::new();
        }
        let asked: Vec<usize> = self.requests.keys().copied().collect();
        let members: Vec<usize> = asked
            .iter()
            .copied()
            .filter(|r| !excluded.contains(r) && open[*r])
            .collect();
        self.requests.clear();
        self.started = None;
        self.round += 1;
        if members.is_empty() {
            let msg = format!(
                "shrink leaves no rank: ranks {asked:?} asked and excluded {excluded:?} between them"
            );
            return asked.iter().map(|&r| (r, Frame::error(&msg))).collect();
        }
        let (id, abandon) = match self.new_root() {
            Ok(x) => x,
            Err(e) => {
                let msg = format!("shrink: cannot start the new communicator's rendezvous: {e}");
                ccl_warn!(None, "bootstrap root {}: {msg}", self.addr);
                return asked.iter().map(|&r| (r, Frame::error(&msg))).collect();
            }
        };
        self.expected = (0..self.size).map(|r| members.contains(&r)).collect();
        self.admitting = Some((members.clone(), abandon));
        self.forming = Some(Forming {
            members: members.clone(),
            since: Instant::now(),
            formed: Vec::new(),
            failed: false,
        });
        ccl_trace!(
            None,
            "bootstrap root {}: shrink round {} decided: members {members:?}",
            self.addr,
            self.round
        );
        let f = ShrinkDecision {
            round: self.round,
            members,
            id: id.as_bytes().to_vec(),
        }
        .encode();
        asked.into_iter().map(|r| (r, f.clone())).collect()
    }

    /// A root beside this one, and the handle that makes it give up.
    fn new_root(&self) -> ccl_core::Result<(UniqueId, Abandon)> {
        let listener = TcpListener::bind(SocketAddr::new(self.addr.ip(), 0)).map_err(|e| {
            ccl_core::Error::io(
                ccl_core::ErrorKind::System,
                format!("listening on {}", self.addr.ip()),
                e,
            )
        })?;
        let at = listener.local_addr().map_err(|e| {
            ccl_core::Error::io(ccl_core::ErrorKind::System, "new rendezvous address", e)
        })?;
        let id = UniqueId::for_address(at, random_secret()?);
        let abandon: Abandon = Arc::new(Mutex::new(None));
        (self.spawn_root)(listener, id.secret(), self.timeout, Some(abandon.clone()))?;
        Ok((id, abandon))
    }
}
