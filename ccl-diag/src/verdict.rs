//! Which rank a stuck job waits for, from every rank's view of its own latest operations.
//!
//! One analysis serves three readers: the job's monitor (the bootstrap root), which asks every
//! live rank for its state when a rank fails or stalls and puts the verdict into every rank's
//! error; `ccl-trace --live`, which asks a running job the same; and `ccl-trace DIR`, which reads
//! flight-recorder dumps. Each rank names the one peer it waits for; following those waits from
//! rank to rank ends at the culprit: a rank that died, one that cannot answer (stopped), one that
//! never entered the operation, one inside it that stopped moving, or a link on which bytes the
//! sender handed over never arrived.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::culprit;
use crate::digest::{Digest, Lead, Link, MOVING_US, Ranges, stuck_link, unacked_link};
use crate::dump::Op;
use crate::recorder::State;

pub use crate::view::{Presence, RankView, SlowPeer};

/// What the job waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Culprit {
    /// The chain of waits ends at these ranks; why is in [`Verdict::line`].
    Ranks(BTreeSet<usize>),
    /// `to` waits, in operation `seq`, for bytes `from` handed to the link and that never
    /// arrived.
    Link { from: usize, to: usize, seq: u64 },
    /// Nobody waits for anybody.
    Nothing,
}

/// The analysis of one communicator.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub size: usize,
    /// The operation the job is in (the furthest any rank got).
    pub stuck_seq: u64,
    pub stuck_name: String,
    /// Ranks that never entered it (or cannot say).
    pub never_arrived: BTreeSet<usize>,
    /// Ranks that could not say what they do (no dump, no answer, dead).
    pub absent: BTreeSet<usize>,
    /// Ranks that wait for a peer.
    pub waiting: BTreeSet<usize>,
    /// Where the waits lead: the rank(s) the job waits for.
    pub culprits: BTreeSet<usize>,
    pub culprit: Culprit,
    /// What the line needs: the operation the job is in as a rank inside it describes it, the
    /// link's figures, the least time a waiting rank has gone without progress, and the views
    /// of the culprits and of the link's ends.
    op: Option<Op>,
    link: Option<Link>,
    stalled_s: Option<f64>,
    views: Vec<RankView>,
}

/// Most culprits a line names one by one (and whose views a verdict fetches).
const MAX_NAMED: usize = 16;

/// Analyses the views of one communicator of `size` ranks (ranks without a view count as
/// absent).
pub fn analyse(views: &[RankView], size: usize) -> Verdict {
    Digest::of(views).verdict(size, &mut |ranks: &[usize]| {
        views
            .iter()
            .filter(|v| ranks.contains(&v.rank))
            .cloned()
            .collect()
    })
}

impl Digest {
    /// The verdict on a communicator of `size` ranks, from this digest of its views (ranks it
    /// does not cover count as absent). `fetch` gives the full views of the ranks asked for,
    /// of those it can (a monitor asks them again): the culprits, to say why they hold the job
    /// up, and both ends of each link the digest could not check alone.
    pub fn verdict(
        &self,
        size: usize,
        fetch: &mut dyn FnMut(&[usize]) -> Vec<RankView>,
    ) -> Verdict {
        let all = if size == 0 {
            Ranges::new()
        } else {
            Ranges::span(0, size - 1)
        };
        let absent_r = all.minus(&self.answered);
        let absent: BTreeSet<usize> = absent_r.iter().collect();
        let (stuck_seq, stuck_name) = self
            .top
            .as_ref()
            .map_or((0, String::new()), |(s, _, op)| (*s, op.name.clone()));
        let mut never_arrived = absent.clone();
        never_arrived.extend(self.answered.minus(&self.at_top).iter());
        never_arrived.extend(self.unheard.iter());
        let culprits = self.culprits(&absent, &never_arrived);
        // A rank that died or cannot answer explains any link: its peers' sockets hold what it
        // never read.
        let candidates: &[(usize, usize)] = if absent.is_empty() {
            &self.pending
        } else {
            &[]
        };
        let mut ask: BTreeSet<usize> = culprits.iter().copied().take(MAX_NAMED).collect();
        ask.extend(candidates.iter().flat_map(|&(to, from)| [to, from]));
        if absent.is_empty()
            && let Some(l) = &self.link
        {
            ask.extend([l.to, l.from]);
        }
        let ask: Vec<usize> = ask.into_iter().collect();
        let mut views = if ask.is_empty() {
            Vec::new()
        } else {
            fetch(&ask)
        };
        let view = |r: usize| {
            views
                .iter()
                .find(|v| v.rank == r && v.presence == Presence::Answered)
        };
        let found = candidates
            .iter()
            .find_map(|&(to, from)| stuck_link(view(to)?, view(from)?));
        let mut link = if absent.is_empty() {
            found.or_else(|| self.link.clone())
        } else {
            None
        };
        if link.is_none() && absent.is_empty() && culprits.len() == 1 {
            let c = *culprits.iter().next().expect("one");
            if let Some((l, more)) = unacked_from(c, &views, fetch) {
                views.extend(more);
                link = Some(l);
            }
        }
        let culprit = match &link {
            Some(l) => Culprit::Link {
                from: l.from,
                to: l.to,
                seq: l.seq,
            },
            None if culprits.is_empty() => Culprit::Nothing,
            None => Culprit::Ranks(culprits.clone()),
        };
        // Only what the line reads stays.
        views.retain(|v| {
            culprits.contains(&v.rank)
                || link
                    .as_ref()
                    .is_some_and(|l| l.to == v.rank || l.from == v.rank)
        });
        Verdict {
            size,
            stuck_seq,
            stuck_name,
            never_arrived,
            absent,
            waiting: self.waiting().iter().collect(),
            culprits,
            culprit,
            op: self.top.as_ref().map(|t| t.2.clone()),
            link,
            stalled_s: self.idle_us.map(|us| us as f64 / 1e6),
            views,
        }
    }

    /// Where the waits lead: the rank(s) the job waits for.
    fn culprits(
        &self,
        absent: &BTreeSet<usize>,
        never_arrived: &BTreeSet<usize>,
    ) -> BTreeSet<usize> {
        // Follows each rank's waits to where they end: a rank that cannot say or waits for
        // nobody. A rank names only one of the peers it waits for, so waits can run in a cycle
        // (two halving-doubling partners each stuck behind a third rank): a cycle proves
        // nothing and counts only when no chain ends anywhere else, and then the ranks that
        // never arrived come first.
        let mut culprits = BTreeSet::new();
        let mut cycles = BTreeSet::new();
        for c in &self.chains {
            match &c.lead {
                Lead::End(e) | Lead::Exit(e) => {
                    culprits.insert(*e);
                }
                Lead::Cycle(on) => cycles.extend(on.iter()),
            }
        }
        if culprits.is_empty() {
            culprits = if never_arrived.is_empty() {
                cycles
            } else {
                never_arrived.clone()
            };
        }
        // A rank that died, or cannot answer, explains the chains that end elsewhere: a rank
        // that was sending to it when its state was taken names nobody it waits for.
        let absent_culprits: BTreeSet<usize> = culprits.intersection(absent).copied().collect();
        if !absent_culprits.is_empty() {
            culprits = absent_culprits;
        } else if !self.dead.is_empty() {
            culprits = self.dead.iter().collect();
        }
        culprits
    }
}

/// Where rank `c` (the one rank holding the job up, `views` holding its view) is stuck sending
/// inside an earlier operation: if a peer it sends to got every byte and moved on, the
/// acknowledgements are what stopped. The link back, and the peers' views (`fetch`ed).
fn unacked_from(
    c: usize,
    views: &[RankView],
    fetch: &mut dyn FnMut(&[usize]) -> Vec<RankView>,
) -> Option<(Link, Vec<RankView>)> {
    let sender = views
        .iter()
        .find(|v| v.rank == c && v.presence == Presence::Answered)?;
    let to: Vec<usize> = sender
        .open()?
        .peers
        .iter()
        .filter(|p| p.sent < p.to_send)
        .map(|p| p.peer)
        .collect();
    if to.is_empty() {
        return None;
    }
    let more = fetch(&to);
    let link = more
        .iter()
        .filter(|v| v.presence == Presence::Answered)
        .find_map(|v| unacked_link(sender, v))?;
    Some((link, more))
}

/// `4 MiB`, `512 B`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `0, 2 and 3`.
fn and_list(s: impl IntoIterator<Item = usize>) -> String {
    let v: Vec<String> = s.into_iter().map(|r| r.to_string()).collect();
    match v.len() {
        0 => String::new(),
        1 => v[0].clone(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// `0, 2 and 3`; above [`MAX_NAMED`] ranks, runs (`0-36 and 38-1023`).
fn rank_list(s: &BTreeSet<usize>) -> String {
    if s.len() > MAX_NAMED {
        s.iter().copied().collect::<Ranges>().to_string()
    } else {
        and_list(s.iter().copied())
    }
}

impl Verdict {
    /// The ranks held up behind `c`: every other rank that waits (with a single culprit, a
    /// rank whose own wait runs in a cycle, such as halving-doubling partners, is behind it too).
    fn waiting_for(&self, c: usize) -> BTreeSet<usize> {
        self.waiting.iter().copied().filter(|&r| r != c).collect()
    }

    /// The one line a user reads first, e.g. `allreduce #203 (ring, 4 MiB) is stuck behind
    /// rank 1 (host:pid), which does not answer (stopped, or its process is hung): the job has
    /// not progressed for 5.0 s; ranks 0, 2 and 3 wait on it`. A rank named as the culprit is
    /// always written `rank R (host:pid)` (when its host is known).
    pub fn line(&self) -> String {
        let view = |r: usize| self.views.iter().find(|v| v.rank == r);
        let who = |r: usize| view(r).map_or(format!("rank {r}"), |v| v.who());
        let describe = |op: Option<&Op>, seq: u64| {
            let before = if seq == 0 {
                "the job (before its first operation)".to_string()
            } else {
                format!("{} #{}", self.stuck_name, seq)
            };
            op.map_or(before, |e| {
                format!(
                    "{} #{} ({}, {})",
                    e.name,
                    e.seq,
                    e.algo,
                    human_bytes(e.bytes)
                )
            })
        };
        let op_text = describe(self.op.as_ref(), self.stuck_seq);
        let since = match self.stalled_s {
            Some(s) if s >= 0.1 => format!(": the job has not progressed for {s:.1} s"),
            _ => String::new(),
        };
        let waiters = |c: usize| {
            let w = self.waiting_for(c);
            match w.len() {
                0 => String::new(),
                1 => format!("; rank {} waits on it", rank_list(&w)),
                _ => format!("; ranks {} wait on it", rank_list(&w)),
            }
        };
        match (&self.culprit, &self.link) {
            (Culprit::Nothing, _) => format!("{op_text}: no rank waits for another"),
            (Culprit::Link { .. }, Some(l)) if l.unacked => format!(
                "{} is stuck on the link from {} to {}: rank {} got every byte rank {} sent it ({}) \
                 and finished its part, but rank {} saw only {} of them acknowledged: the \
                 acknowledgements from rank {} do not arrive{since}",
                describe(Some(&l.op), l.seq),
                who(l.from),
                who(l.to),
                l.from,
                l.to,
                l.got,
                l.to,
                l.sent,
                l.from,
            ),
            (Culprit::Link { .. }, Some(l)) => {
                let where_ = if l.sender_done {
                    format!(
                        "rank {} is inside the operation and rank {} finished its part of it",
                        l.to, l.from
                    )
                } else {
                    "both ranks are inside the operation".to_string()
                };
                format!(
                    "{} is stuck on the link from {} to {}: {} bytes were sent on it and {} arrived, {where_}{since}",
                    describe(Some(&l.op), l.seq),
                    who(l.from),
                    who(l.to),
                    l.sent,
                    l.got,
                )
            }
            (Culprit::Ranks(set), _) if set.len() == 1 => {
                let c = *set.iter().next().expect("one");
                let why = match view(c).map(|v| v.presence) {
                    Some(Presence::Dead) => format!(", {}", culprit::DIED),
                    Some(Presence::Silent) => format!(", {}", culprit::SILENT),
                    Some(Presence::NoDump) | None => format!(", {}", culprit::NO_STATE),
                    Some(Presence::Answered) => self.inside_or_not(view(c).expect("some")),
                };
                format!(
                    "{op_text} is stuck behind {}{why}{since}{}",
                    who(c),
                    waiters(c)
                )
            }
            (Culprit::Ranks(set), _) => {
                let mut names: Vec<String> = set.iter().take(MAX_NAMED).map(|&r| who(r)).collect();
                if set.len() > MAX_NAMED {
                    names.push(format!("and {} more", set.len() - MAX_NAMED));
                }
                format!("{op_text} is stuck behind {}{since}", names.join(", "))
            }
            (Culprit::Link { from, to, .. }, None) => {
                format!(
                    "{op_text} is stuck on the link from {} to {}{since}",
                    who(*from),
                    who(*to)
                )
            }
        }
    }

    /// Why a rank that answered holds the others up.
    fn inside_or_not(&self, v: &RankView) -> String {
        match v.ops.iter().find(|e| e.seq == self.stuck_seq) {
            Some(e) if e.state == State::Running || e.state == State::Failed => {
                ", which is inside it but has stopped moving (deadlocked, starved or descheduled)"
                    .to_string()
            }
            _ => match v.latest() {
                Some(l) => format!(
                    ", which never entered it (its last operation is {} #{}, {}: it is in its own code or called something else)",
                    l.name,
                    l.seq,
                    l.state.name()
                ),
                None => ", which never entered it (it has run no operation yet)".to_string(),
            },
        }
    }
}

/// What a live query shows: every rank's current operation, per-peer progress, slow-rank
/// figures, and the verdict.
// Long: one report written top to bottom (a line per rank, its operation, a line per peer with
// bytes sent and received, the slow-rank figures, the verdict); each part is plain formatting.
pub fn live_report(views: &[RankView], size: usize) -> String {
    let mut out = String::new();
    let mut sorted: Vec<&RankView> = views.iter().collect();
    sorted.sort_by_key(|v| v.rank);
    for v in &sorted {
        match v.presence {
            Presence::Answered => {}
            Presence::Silent => {
                let _ = writeln!(out, "{}: does not answer (stopped or hung)", v.who());
                continue;
            }
            Presence::Dead => {
                let _ = writeln!(out, "{}: its process ended", v.who());
                continue;
            }
            Presence::NoDump => {
                let _ = writeln!(out, "{}: no state", v.who());
                continue;
            }
        }
        let Some(e) = v.latest() else {
            let _ = writeln!(out, "{}: no operation yet", v.who());
            continue;
        };
        let age = |t: u64| {
            if t > 0 && v.now_us > t {
                format!("{:.1} s", (v.now_us - t) as f64 / 1e6)
            } else {
                "-".to_string()
            }
        };
        let mut line = format!(
            "{}: {} #{} ({}, {}) {}",
            v.who(),
            e.name,
            e.seq,
            e.algo,
            human_bytes(e.bytes),
            e.state.name()
        );
        if e.state == State::Running {
            let _ = write!(
                line,
                " for {}, last progress {} ago",
                age(e.start_us),
                age(e.progress_us.max(e.start_us))
            );
        }
        if let Some(p) = e.waiting_on {
            let _ = write!(line, ", waiting for rank {p}");
        }
        let _ = writeln!(out, "{line}");
        for p in &e.peers {
            let _ = writeln!(
                out,
                "    peer {}: sent {}/{} received {}/{}{} waited {:.1} ms, entered {:.1} ms {}",
                p.peer,
                p.sent,
                p.to_send,
                p.received,
                p.to_recv,
                if p.arrived {
                    ""
                } else {
                    " (its header has not arrived)"
                },
                p.waited_us as f64 / 1e3,
                p.late_us.unsigned_abs() as f64 / 1e3,
                if p.late_us >= 0 { "later" } else { "earlier" }
            );
        }
        for s in &v.slow {
            let _ = writeln!(
                out,
                "    slow rank: peer {} entered {:.1} ms late on average over {} operations",
                s.peer,
                s.mean_late_us as f64 / 1e3,
                s.ops
            );
        }
    }
    let verdict = analyse(views, size);
    let everyone_answered = views
        .iter()
        .filter(|v| v.presence == Presence::Answered)
        .count()
        == size;
    match verdict.stalled_s {
        // Waits shorter than this are the job at work, not a hang.
        Some(s) if s < MOVING_S && everyone_answered => {
            let _ = writeln!(
                out,
                "=> the job is moving: no rank has waited longer than {s:.1} s"
            );
        }
        None if everyone_answered => {
            let _ = writeln!(out, "=> the job is moving: no rank waits");
        }
        _ => {
            let _ = writeln!(out, "=> {}", verdict.line());
        }
    }
    out
}

/// A wait shorter than this, seconds, is the job at work, not a hang.
const MOVING_S: f64 = MOVING_US as f64 / 1e6;

/// Operations a rank sends the monitor: the ones a verdict can be about.
const MAX_OPS: usize = 16;

/// The wire form of a view, what a rank answers the monitor (at most its last `MAX_OPS`
/// operations).
pub fn encode(v: &RankView) -> Vec<u8> {
    let cut = RankView {
        ops: v.ops[v.ops.len().saturating_sub(MAX_OPS)..].to_vec(),
        ..v.clone()
    };
    serde_json::to_vec(&cut).expect("a view is plain data")
}

/// Reads [`encode`]'s output; the result is marked as answered. A bad reply is an error, never
/// a panic.
pub fn decode(b: &[u8]) -> Result<RankView, String> {
    let mut v: RankView = serde_json::from_slice(b).map_err(|e| format!("bad state reply: {e}"))?;
    if v.ops.len() > MAX_OPS {
        return Err(format!("state reply claims {} operations", v.ops.len()));
    }
    v.presence = Presence::Answered;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::PeerStat;

    fn peer(peer: usize, arrived: bool, sent: u64, received: u64) -> PeerStat {
        PeerStat {
            peer,
            to_send: 64,
            sent,
            to_recv: 64,
            received,
            arrived,
            waited_us: 0,
            late_us: 0,
        }
    }

    fn view(
        rank: usize,
        seq: u64,
        state: State,
        waiting_on: Option<usize>,
        peers: Vec<PeerStat>,
    ) -> RankView {
        RankView {
            rank,
            host: "h".into(),
            pid: 100 + rank as u32,
            presence: Presence::Answered,
            now_us: 10_000_000,
            ops: vec![Op {
                seq,
                name: "allreduce".into(),
                algo: "ring".into(),
                dtype: "float".into(),
                op: "sum".into(),
                count: 1 << 20,
                bytes: 4 << 20,
                root: None,
                error: None,
                state,
                start_us: 1_000_000,
                end_us: 0,
                progress_us: 5_000_000,
                waiting_on,
                peers,
            }],
            slow: vec![],
        }
    }

    #[test]
    fn a_silent_rank_at_the_end_of_the_chain_is_the_verdict() {
        // Ring 0 -> 1 -> 2 -> 3 -> 0 with rank 1 stopped: 2 waits for 1, 3 for 2, 0 for 3.
        let vs = vec![
            view(0, 7, State::Running, Some(3), vec![peer(3, true, 0, 0)]),
            RankView::absent(1, "h", 101, Presence::Silent),
            view(2, 7, State::Failed, Some(1), vec![peer(1, true, 0, 0)]),
            view(3, 7, State::Running, Some(2), vec![peer(2, true, 0, 0)]),
        ];
        let v = analyse(&vs, 4);
        assert_eq!(v.culprit, Culprit::Ranks(BTreeSet::from([1])));
        let line = v.line();
        assert!(
            line.starts_with(
                "allreduce #7 (ring, 4 MiB) is stuck behind rank 1 (h:101), which does not answer"
            ),
            "{line}"
        );
        assert!(line.contains("not progressed for 5.0 s"), "{line}");
        assert!(line.contains("ranks 0, 2 and 3 wait on it"), "{line}");
    }

    #[test]
    fn a_rank_that_never_entered_is_told_apart_from_a_stopped_one() {
        let mut late = view(2, 6, State::Done, None, vec![]);
        late.ops[0].end_us = 2_000_000;
        let vs = vec![
            view(0, 7, State::Running, Some(2), vec![peer(2, false, 0, 0)]),
            view(1, 7, State::Running, Some(0), vec![peer(0, true, 0, 0)]),
            late,
        ];
        let v = analyse(&vs, 3);
        assert_eq!(v.culprits, BTreeSet::from([2]));
        let line = v.line();
        assert!(
            line.contains("rank 2 (h:102), which never entered it"),
            "{line}"
        );
        assert!(line.contains("allreduce #6, done"), "{line}");
        // Inside but not waiting for anyone: stopped moving.
        let vs = vec![
            view(0, 7, State::Running, Some(1), vec![peer(1, true, 0, 0)]),
            view(1, 7, State::Running, None, vec![peer(0, true, 0, 0)]),
        ];
        let line = analyse(&vs, 2).line();
        assert!(
            line.contains("rank 1 (h:101), which is inside it but has stopped moving"),
            "{line}"
        );
    }

    #[test]
    fn bytes_sent_that_never_arrive_name_the_link() {
        // 1 sent 64 bytes to 0, of which 0 got 16; both are inside.
        let vs = vec![
            view(0, 3, State::Failed, Some(1), vec![peer(1, true, 0, 16)]),
            view(1, 3, State::Running, Some(0), vec![peer(0, true, 64, 0)]),
        ];
        let v = analyse(&vs, 2);
        assert_eq!(
            v.culprit,
            Culprit::Link {
                from: 1,
                to: 0,
                seq: 3
            }
        );
        let line = v.line();
        assert!(line.contains("link from rank 1 (h:101) to rank 0 (h:100): 64 bytes were sent on it and 16 arrived"), "{line}");
    }

    #[test]
    fn a_sender_that_finished_and_moved_on_still_names_the_link() {
        // Ring of 4: rank 3 handed all of its last step to rank 0 and entered #6, as did 1 and
        // 2; rank 0 is still in #5 with half of those bytes. The waits of #6 run in a circle
        // through rank 0, but the bytes lie on the link from 3 to 0.
        let mut r3 = view(3, 6, State::Running, Some(2), vec![peer(2, true, 0, 0)]);
        let mut done = view(3, 5, State::Done, None, vec![peer(0, true, 64, 0)]);
        done.ops[0].end_us = 9_000_000;
        r3.ops.insert(0, done.ops.remove(0));
        let vs = vec![
            view(0, 5, State::Running, Some(3), vec![peer(3, true, 0, 32)]),
            view(1, 6, State::Running, Some(0), vec![peer(0, false, 0, 0)]),
            view(2, 6, State::Running, Some(1), vec![peer(1, true, 0, 0)]),
            r3,
        ];
        let v = analyse(&vs, 4);
        assert_eq!(
            v.culprit,
            Culprit::Link {
                from: 3,
                to: 0,
                seq: 5
            }
        );
        let line = v.line();
        assert!(
            line.starts_with("allreduce #5 (ring, 4 MiB) is stuck on the link from rank 3 (h:103) to rank 0 (h:100): 64 bytes were sent on it and 32 arrived, rank 0 is inside the operation and rank 3 finished its part of it"),
            "{line}"
        );
        // Once every byte arrived it is no link: rank 0 itself holds the job up.
        let mut vs = vs;
        vs[0].ops[0].peers[0].received = 64;
        let v = analyse(&vs, 4);
        assert_eq!(v.culprit, Culprit::Ranks(BTreeSet::from([0])));
    }

    #[test]
    fn bytes_that_arrived_but_were_never_acknowledged_name_the_way_back() {
        // Ring of 4: rank 2 got all of rank 1's bytes of #4 and entered #5 with 0 and 3; rank
        // 1 is still in #4, 16 of its 64 bytes to rank 2 acknowledged (an RDMA write completes
        // at its sender only when the receiver acknowledges it). The waits of #5 end at rank 1,
        // but the link from 2 back to 1 is what stopped.
        let mut r2 = view(2, 5, State::Running, Some(1), vec![peer(1, true, 0, 0)]);
        let mut done = view(2, 4, State::Done, None, vec![peer(1, true, 64, 64)]);
        done.ops[0].end_us = 9_000_000;
        r2.ops.insert(0, done.ops.remove(0));
        let vs = vec![
            view(0, 5, State::Running, Some(3), vec![peer(3, true, 0, 0)]),
            view(1, 4, State::Running, None, vec![peer(2, true, 16, 64)]),
            r2,
            view(3, 5, State::Running, Some(2), vec![peer(2, true, 0, 0)]),
        ];
        let v = analyse(&vs, 4);
        assert_eq!(
            v.culprit,
            Culprit::Link {
                from: 2,
                to: 1,
                seq: 4
            }
        );
        let line = v.line();
        assert!(
            line.starts_with("allreduce #4 (ring, 4 MiB) is stuck on the link from rank 2 (h:102) to rank 1 (h:101): rank 2 got every byte rank 1 sent it (64) and finished its part, but rank 1 saw only 16 of them acknowledged"),
            "{line}"
        );
        // Rank 2 still missing bytes: not this; rank 1 holds the job up as before.
        let mut vs = vs;
        vs[2].ops[0].peers[0].received = 32;
        let v = analyse(&vs, 4);
        assert_eq!(v.culprit, Culprit::Ranks(BTreeSet::from([1])));
    }

    #[test]
    fn a_dead_rank_is_named_as_dead() {
        let vs = vec![
            view(0, 9, State::Failed, Some(1), vec![peer(1, true, 0, 0)]),
            RankView::absent(1, "h", 101, Presence::Dead),
        ];
        let line = analyse(&vs, 2).line();
        assert!(line.contains("behind rank 1 (h:101), which died"), "{line}");
        assert!(line.contains("rank 0 waits on it"), "{line}");
        // A rank caught sending to the dead one waits for nobody; the dead rank still explains.
        let vs = vec![
            view(0, 9, State::Running, None, vec![peer(2, true, 0, 0)]),
            view(1, 9, State::Failed, Some(0), vec![peer(0, true, 0, 0)]),
            RankView::absent(2, "h", 102, Presence::Dead),
            view(3, 9, State::Failed, Some(2), vec![peer(2, true, 0, 0)]),
        ];
        let v = analyse(&vs, 4);
        assert_eq!(v.culprit, Culprit::Ranks(BTreeSet::from([2])));
    }

    #[test]
    fn state_round_trips_and_bad_bytes_are_refused() {
        let mut v = view(3, 11, State::Running, Some(2), vec![peer(2, true, 5, 6)]);
        v.slow.push(SlowPeer {
            peer: 2,
            mean_late_us: -7,
            ops: 9,
        });
        let b = encode(&v);
        assert_eq!(decode(&b).unwrap(), v);
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "cut at {n} accepted");
        }
        assert!(live_report(&[v], 4).contains("=> "));
        assert_eq!(human_bytes(4 << 20), "4 MiB");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }
}
