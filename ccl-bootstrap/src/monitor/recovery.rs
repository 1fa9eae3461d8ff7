//! The root's part in surviving a rank's death: revoking a communicator and agreeing on the
//! survivors of a shrink.
//!
//! **Why the root decides.** The root already hears from every rank (on its own line or
//! through the hubs of the monitor tree) and is the one that sees a rank die (its line closes
//! without a goodbye). Agreement through it is one request and one answer per rank, and a
//! further death during the shrink is just another closed line it sees. When the root's own
//! process dies, a standby rank takes the watch over (`takeover`) with a fresh `Recovery`:
//! requests pending at the old root are sent again, and a round it had decided is dropped by
//! the ranks, so this module never sees a round of another root.
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
pub(crate) type Abandon = Arc<Mutex<Option<String>>>;

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
    /// Rounds decided by the monitor this one took over from.
    inherited: Vec<Inherited>,
    /// Ranks that joined after the predecessor died knowing of no round.
    orphans: Vec<usize>,
}

struct Forming {
    members: Vec<usize>,
    since: Instant,
    formed: Vec<usize>,
    failed: bool,
}

/// A frame for one rank.
pub(super) type Out = (usize, Frame);

/// A round a dead predecessor decided, as the members who joined this monitor told it.
struct Inherited {
    /// The new communicator's unique id: the round's name.
    id: Vec<u8>,
    members: Vec<usize>,
    /// Some member was told to use it: then every member was (all had formed it).
    committed: bool,
    /// Members that have said what they know.
    heard: Vec<usize>,
    /// Members waiting for the verdict, and whether each has it.
    waiting: Vec<(usize, bool)>,
    /// A member knew nothing of the round: nobody can have been told to use it.
    unknown: bool,
    done: bool,
}

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
            inherited: Vec::new(),
            orphans: Vec::new(),
        }
    }

    /// Rank `r` joined this monitor after its predecessor died, with its part in the last
    /// round that one decided (`None`: none, or one told "drop it").
    pub(super) fn on_rejoin(&mut self, r: usize, round: Option<wire::Outcome>) {
        ccl_trace!(
            None,
            "bootstrap root {}: rank {r} rejoins knowing {:?}",
            self.addr,
            round.as_ref().map(|o| (&o.members, o.committed))
        );
        match round {
            Some(o) => {
                let i = match self.inherited.iter().position(|x| x.id == o.id) {
                    Some(i) => i,
                    None => {
                        self.inherited.push(Inherited {
                            id: o.id.clone(),
                            members: o.members.clone(),
                            committed: false,
                            heard: Vec::new(),
                            waiting: Vec::new(),
                            unknown: false,
                            done: false,
                        });
                        self.inherited.len() - 1
                    }
                };
                let x = &mut self.inherited[i];
                x.heard.push(r);
                if o.committed {
                    x.committed = true;
                } else {
                    x.waiting.push((r, false));
                }
            }
            None => {
                for x in self.inherited.iter_mut().filter(|x| x.members.contains(&r)) {
                    x.heard.push(r);
                    x.unknown = true;
                }
                self.orphans.push(r);
            }
        }
    }

    /// The verdicts on inherited rounds: "use it" to the members still waiting as soon as one
    /// member says it was told so; "drop it" once every live member has joined and none was,
    /// or one knew nothing of the round.
    fn inherited_verdicts(&mut self, open: &[bool]) -> Vec<Out> {
        let mut out = Vec::new();
        for x in self.inherited.iter_mut().filter(|x| !x.done) {
            // A member that joined knowing nothing, before this round was first reported.
            if x.members
                .iter()
                .any(|m| self.orphans.contains(m) && !x.heard.contains(m))
            {
                x.unknown = true;
            }
            let all = x
                .members
                .iter()
                .all(|&m| x.heard.contains(&m) || !open.get(m).copied().unwrap_or(false));
            let verdict = if x.committed {
                Some(true)
            } else if x.unknown || all {
                Some(false)
            } else {
                None
            };
            let Some(commit) = verdict else { continue };
            ccl_trace!(
                None,
                "bootstrap root {}: the inherited round of {:?}: {}",
                self.addr,
                x.members,
                if commit { "use it" } else { "drop it" }
            );
            let f = wire::round_flag(FrameKind::Commit, wire::INHERITED, commit);
            for (m, told) in x.waiting.iter_mut().filter(|(_, t)| !*t) {
                *told = true;
                out.push((*m, f.clone()));
            }
            // Members that report later still get it; a verdict of "drop" is final.
            x.done = !commit;
        }
        out
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
        let mut out = self.inherited_verdicts(open);
        out.extend(self.verdict(open));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn recovery(n: usize) -> Recovery {
        let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
        Recovery::new(n, addr, Duration::from_secs(10), |_, _, _, _| Ok(()))
    }

    fn told(r: usize, committed: bool) -> Option<wire::Outcome> {
        let _ = r;
        Some(wire::Outcome {
            id: vec![7; 16],
            members: vec![1, 2, 3],
            committed,
        })
    }

    /// The verdicts sent: (rank, use it).
    fn verdicts(out: Vec<Out>) -> Vec<(usize, bool)> {
        out.into_iter()
            .map(|(r, f)| {
                assert_eq!(f.kind, FrameKind::Commit);
                let (round, commit) = wire::read_round_flag(&f.payload).unwrap();
                assert_eq!(round, wire::INHERITED);
                (r, commit)
            })
            .collect()
    }

    #[test]
    fn a_round_one_member_was_told_to_use_is_used_by_all() {
        // Rank 0 ran the monitor and died while it said "use it" to ranks 1, 2 and 3.
        let open = [false, true, true, true];
        let mut rec = recovery(4);
        rec.on_rejoin(1, told(1, false));
        assert!(
            verdicts(rec.decide(&open)).is_empty(),
            "ranks 2 and 3 may know"
        );
        rec.on_rejoin(2, told(2, true));
        assert_eq!(verdicts(rec.decide(&open)), [(1, true)]);
        rec.on_rejoin(3, told(3, false));
        assert_eq!(verdicts(rec.decide(&open)), [(3, true)]);
        assert!(verdicts(rec.decide(&open)).is_empty());
    }

    #[test]
    fn a_round_nobody_was_told_to_use_is_dropped_once_every_member_said() {
        let mut open = vec![false, true, true, true];
        let mut rec = recovery(4);
        rec.on_rejoin(1, told(1, false));
        rec.on_rejoin(3, told(3, false));
        assert!(verdicts(rec.decide(&open)).is_empty(), "rank 2 may know");
        // Rank 2 died too: nobody left can have been told.
        open[2] = false;
        assert_eq!(verdicts(rec.decide(&open)), [(1, false), (3, false)]);
    }

    #[test]
    fn a_member_that_knew_nothing_of_the_round_ends_it() {
        // Rank 2 never had the decision: the monitor cannot have said "use it" to anyone.
        let open = [false, true, true, true];
        let mut rec = recovery(4);
        rec.on_rejoin(2, None);
        rec.on_rejoin(1, told(1, false));
        assert_eq!(verdicts(rec.decide(&open)), [(1, false)]);
    }
}
