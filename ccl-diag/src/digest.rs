//! The verdict's input, summed up: what a verdict needs of many ranks' views, in a form that
//! merges and does not grow with the ranks it covers.
//!
//! A job's monitor with thousands of ranks must not gather every rank's view in one place. Each
//! hub of the monitor tree turns its ranks' views into a [`Digest`], merges its sub-hubs'
//! digests into it and passes one digest up; the root merges the top ones and asks the few ranks
//! the verdict names for their full views ([`Digest::verdict`]). [`crate::verdict::analyse`] is
//! the same code over one digest of every view, so both give the same verdict.
//!
//! Following waits is transitive, so a set of ranks reduces to where the waits inside it lead:
//! to a rank inside that waits for nobody (a chain's end), to a rank outside (an exit, resolved
//! when the digest holding that rank is merged in), or round a cycle. A digest grows with the
//! distinct places its waits lead to, and with runs of rank numbers ([`Ranges`]), not with its
//! ranks: a ring with one stopped rank gives one chain per digest.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dump::Op;
use crate::recorder::State;
use crate::view::{Presence, RankView};

/// A set of ranks as sorted, disjoint, non-adjacent runs `(first, last)`.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "Vec<(usize, usize)>")]
pub struct Ranges(Vec<(usize, usize)>);

/// Runs as they arrive from another process are checked, not trusted.
impl TryFrom<Vec<(usize, usize)>> for Ranges {
    type Error = String;
    fn try_from(v: Vec<(usize, usize)>) -> Result<Ranges, String> {
        let ordered = v.iter().all(|&(a, b)| a <= b)
            && v.windows(2)
                .all(|w| w[0].1.checked_add(1).is_some_and(|n| n < w[1].0));
        if ordered {
            Ok(Ranges(v))
        } else {
            Err(format!("rank runs out of order: {v:?}"))
        }
    }
}

impl Ranges {
    pub fn new() -> Ranges {
        Ranges(Vec::new())
    }

    /// The ranks `first..=last`.
    pub fn span(first: usize, last: usize) -> Ranges {
        if first > last {
            Ranges::new()
        } else {
            Ranges(vec![(first, last)])
        }
    }

    pub fn contains(&self, r: usize) -> bool {
        let i = self.0.partition_point(|&(_, last)| last < r);
        self.0.get(i).is_some_and(|&(first, _)| first <= r)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many ranks.
    pub fn len(&self) -> usize {
        self.0.iter().map(|&(a, b)| b - a + 1).sum()
    }

    pub fn first(&self) -> Option<usize> {
        self.0.first().map(|&(a, _)| a)
    }

    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().flat_map(|&(a, b)| a..=b)
    }

    /// Every rank in `self` or `o`.
    pub fn union(&self, o: &Ranges) -> Ranges {
        let mut runs: Vec<(usize, usize)> = self.0.iter().chain(&o.0).copied().collect();
        runs.sort_unstable();
        let mut out: Vec<(usize, usize)> = Vec::with_capacity(runs.len());
        for (a, b) in runs {
            match out.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        Ranges(out)
    }

    /// The ranks of `self` not in `o`.
    pub fn minus(&self, o: &Ranges) -> Ranges {
        let mut out = Vec::new();
        for &(a, b) in &self.0 {
            let mut from = a;
            for &(c, d) in &o.0 {
                if d < from || c > b {
                    continue;
                }
                if c > from {
                    out.push((from, c - 1));
                }
                from = d.saturating_add(1);
                if from > b {
                    break;
                }
            }
            if from <= b && from >= a {
                out.push((from, b));
            }
        }
        Ranges(out)
    }

    /// Whether no rank is in both.
    pub fn disjoint(&self, o: &Ranges) -> bool {
        self.0
            .iter()
            .all(|&(a, b)| o.0.iter().all(|&(c, d)| d < a || c > b))
    }
}

impl FromIterator<usize> for Ranges {
    fn from_iter<I: IntoIterator<Item = usize>>(it: I) -> Ranges {
        let mut v: Vec<usize> = it.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        let mut out: Vec<(usize, usize)> = Vec::new();
        for r in v {
            match out.last_mut() {
                Some(last) if r == last.1 + 1 => last.1 = r,
                _ => out.push((r, r)),
            }
        }
        Ranges(out)
    }
}

/// `0-36, 38 and 40-1023`.
impl fmt::Display for Ranges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|&(a, b)| match b - a {
                0 => a.to_string(),
                1 => format!("{a}, {b}"),
                _ => format!("{a}-{b}"),
            })
            .collect();
        match parts.split_last() {
            None => Ok(()),
            Some((last, [])) => write!(f, "{last}"),
            Some((last, rest)) => write!(f, "{} and {last}", rest.join(", ")),
        }
    }
}

/// Where the waits of a set of ranks lead.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Lead {
    /// To this rank, covered, which waits for nobody (or cannot say).
    End(usize),
    /// To this rank, not covered: resolved once a digest covering it is merged in.
    Exit(usize),
    /// Round a cycle through these ranks.
    Cycle(Ranges),
}

/// Waiting ranks whose waits lead to the same place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub waiters: Ranges,
    pub lead: Lead,
}

/// A link on which bytes were handed over and never arrived (see `verdict`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub from: usize,
    pub to: usize,
    pub seq: u64,
    /// Bytes `from` handed the link for `to`, and bytes `to` got of them.
    pub sent: u64,
    pub got: u64,
    /// `from` had finished the operation.
    pub sender_done: bool,
    /// The operation, as `to` describes it (peers left out).
    pub op: Op,
    /// The bytes arrived, and `to` (their sender) is stuck because their acknowledgements
    /// from `from` do not arrive: the link's way back (see `unacked_link`). `sent` is then what
    /// `to` saw taken, `got` what `from` received.
    #[serde(default)]
    pub unacked: bool,
}

/// Most link candidates a digest carries whose sender it does not cover (the root asks those
/// ranks for their views); beyond that, the lowest-numbered waiters are kept.
pub const MAX_PENDING: usize = 64;

/// What a verdict needs of the views of the ranks in `covers`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest {
    pub covers: Ranges,
    pub answered: Ranges,
    /// Of the ranks that did not answer, those whose process ended.
    pub dead: Ranges,
    /// The furthest operation an answering rank got to, and the lowest rank there, with the
    /// operation as it describes it (peers left out).
    pub top: Option<(u64, usize, Op)>,
    /// The answering ranks whose latest operation is the top one.
    pub at_top: Ranges,
    /// Peers whose header had not arrived at a rank inside the top operation.
    pub unheard: Ranges,
    pub chains: Vec<Chain>,
    /// The least time any waiting rank has gone without progress, microseconds.
    pub idle_us: Option<u64>,
    /// The lowest-numbered waiter of a link whose two ends are covered.
    pub link: Option<Link>,
    /// `(waiter, sender)` links to check whose sender was not covered, lowest waiter first, all
    /// below `link`'s.
    pub pending: Vec<(usize, usize)>,
}

/// `op` without its per-peer figures (an alltoall's has one per rank).
fn bare(op: &Op) -> Op {
    Op {
        peers: Vec::new(),
        ..op.clone()
    }
}

/// How long `e` of `v` had gone without progress when `v` answered (or when `e` ended),
/// microseconds.
pub(crate) fn idle_us(v: &RankView, e: &Op) -> u64 {
    let at = if e.progress_us > 0 {
        e.progress_us
    } else {
        e.start_us
    };
    let now = if e.end_us > 0 { e.end_us } else { v.now_us };
    now.saturating_sub(at)
}

/// A wait shorter than this, microseconds, is the job at work, not a hang.
pub(crate) const MOVING_US: u64 = 1_000_000;

/// Whether `to` (waiting for `from`) is stuck on bytes `from` handed the link in the operation
/// `to` is in and that never arrived. The sender may still be inside that operation or may
/// have finished it and moved on (a sender's part ends once its bytes are handed over). Counts
/// only when the waiter has been idle long enough for a healthy link to deliver what was in
/// flight, which holds whenever a verdict is asked for (a timeout, a late operation).
pub(crate) fn stuck_link(to: &RankView, from: &RankView) -> Option<Link> {
    let ea = to.open()?;
    let eb = from.ops.iter().find(|e| e.seq == ea.seq)?;
    if idle_us(to, ea) < MOVING_US {
        return None;
    }
    let got = ea.peers.iter().find(|p| p.peer == from.rank)?;
    let gave = eb.peers.iter().find(|p| p.peer == to.rank)?;
    (got.arrived && gave.sent > got.received).then(|| Link {
        from: from.rank,
        to: to.rank,
        seq: ea.seq,
        sent: gave.sent,
        got: got.received,
        sender_done: eb.state == State::Done,
        op: bare(ea),
        unacked: false,
    })
}

/// Whether `sender`, inside an operation, is stuck sending to `receiver` although `receiver`
/// got every byte of it and finished its part: the bytes arrived, their acknowledgements (or
/// the receiver's credits) never came back, so the link from `receiver` to `sender` is the one
/// that stopped (an RDMA write completes at its sender only when the receiver's transport
/// acknowledges it). Counts only once the sender has been idle long enough.
pub(crate) fn unacked_link(sender: &RankView, receiver: &RankView) -> Option<Link> {
    let es = sender.open()?;
    if idle_us(sender, es) < MOVING_US {
        return None;
    }
    let mine = es.peers.iter().find(|p| p.peer == receiver.rank)?;
    let er = receiver.ops.iter().find(|e| e.seq == es.seq)?;
    let theirs = er.peers.iter().find(|p| p.peer == sender.rank)?;
    let all_arrived = theirs.to_recv > 0 && theirs.received == theirs.to_recv;
    (mine.sent < mine.to_send && er.state == State::Done && all_arrived).then(|| Link {
        from: receiver.rank,
        to: sender.rank,
        seq: es.seq,
        sent: mine.sent,
        got: theirs.received,
        sender_done: true,
        op: bare(es),
        unacked: true,
    })
}

/// Whether `to`'s side of a link check holds (what [`stuck_link`] needs of the waiter alone).
fn could_be_stuck(to: &RankView, from: usize) -> bool {
    to.open().is_some_and(|ea| {
        idle_us(to, ea) >= MOVING_US && ea.peers.iter().any(|p| p.peer == from && p.arrived)
    })
}

impl Digest {
    /// The digest of `views`: covers their ranks (an answering view wins over an absent one of
    /// the same rank).
    pub fn of(views: &[RankView]) -> Digest {
        let by_rank: BTreeMap<usize, &RankView> = views
            .iter()
            .filter(|v| v.presence == Presence::Answered)
            .map(|v| (v.rank, v))
            .collect();
        let covers: Ranges = views.iter().map(|v| v.rank).collect();
        let answered: Ranges = by_rank.keys().copied().collect();
        let dead: Ranges = views
            .iter()
            .filter(|v| v.presence == Presence::Dead && !by_rank.contains_key(&v.rank))
            .map(|v| v.rank)
            .collect();
        let latest = |v: &RankView| v.latest().map(|e| e.seq);
        let top_seq = by_rank.values().filter_map(|v| latest(v)).max();
        let mut top = None;
        let mut at_top = Vec::new();
        let mut unheard = Vec::new();
        if let Some(s) = top_seq {
            for (&r, v) in &by_rank {
                let Some(e) = v.latest().filter(|e| e.seq == s) else {
                    continue;
                };
                at_top.push(r);
                if top.is_none() {
                    top = Some((s, r, bare(e)));
                }
                if e.state != State::Done {
                    unheard.extend(
                        e.peers
                            .iter()
                            .filter(|p| !p.arrived && p.to_recv > 0)
                            .map(|p| p.peer),
                    );
                }
            }
        }
        let waits: BTreeMap<usize, usize> = by_rank
            .iter()
            .filter_map(|(&r, v)| Some((r, v.open()?.waiting_on?)))
            .collect();
        let idle = waits
            .keys()
            .filter_map(|r| {
                let v = by_rank[r];
                Some(idle_us(v, v.latest()?))
            })
            .min();
        let mut link = None;
        let mut pending = Vec::new();
        for (&to, &from) in &waits {
            match by_rank.get(&from) {
                Some(b) => {
                    if let Some(l) = stuck_link(by_rank[&to], b) {
                        link = Some(l);
                        break;
                    }
                }
                None if !covers.contains(from) && could_be_stuck(by_rank[&to], from) => {
                    pending.push((to, from));
                }
                None => {}
            }
        }
        pending.truncate(MAX_PENDING);
        let chains = chains(&waits, |r| covers.contains(r));
        let mut d = Digest {
            covers,
            answered,
            dead,
            top,
            at_top: at_top.into_iter().collect(),
            unheard: unheard.into_iter().collect(),
            chains,
            idle_us: idle,
            link,
            pending,
        };
        d.regroup();
        d
    }

    /// Adds `o`, which covers other ranks: waits that left one digest and enter the other are
    /// followed on. `o` covering a rank `self` covers is refused.
    pub fn merge(&mut self, o: Digest) -> Result<(), String> {
        if !self.covers.disjoint(&o.covers) {
            return Err(format!(
                "digests of overlapping ranks ({} and {})",
                self.covers, o.covers
            ));
        }
        self.covers = self.covers.union(&o.covers);
        self.answered = self.answered.union(&o.answered);
        self.dead = self.dead.union(&o.dead);
        let seq = |t: &Option<(u64, usize, Op)>| t.as_ref().map(|t| t.0);
        match seq(&self.top).cmp(&seq(&o.top)) {
            std::cmp::Ordering::Less => {
                self.top = o.top;
                self.at_top = o.at_top;
                self.unheard = o.unheard;
            }
            std::cmp::Ordering::Equal => {
                if o.top.as_ref().map(|t| t.1) < self.top.as_ref().map(|t| t.1) {
                    self.top = o.top;
                }
                self.at_top = self.at_top.union(&o.at_top);
                self.unheard = self.unheard.union(&o.unheard);
            }
            std::cmp::Ordering::Greater => {}
        }
        self.idle_us = match (self.idle_us, o.idle_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(l) = o.link
            && self.link.as_ref().is_none_or(|s| l.to < s.to)
        {
            self.link = Some(l);
        }
        self.pending.extend(o.pending);
        self.chains.extend(o.chains);
        self.regroup();
        Ok(())
    }

    /// Follows exits into ranks now covered, joins chains that lead to the same place, and
    /// drops link candidates that cannot come first.
    fn regroup(&mut self) {
        let leads: Vec<Lead> = (0..self.chains.len()).map(|i| self.follow(i)).collect();
        let mut by_lead: BTreeMap<Lead, Ranges> = BTreeMap::new();
        for (c, lead) in std::mem::take(&mut self.chains).into_iter().zip(leads) {
            let w = by_lead.entry(lead).or_default();
            *w = w.union(&c.waiters);
        }
        self.chains = by_lead
            .into_iter()
            .map(|(lead, waiters)| Chain { waiters, lead })
            .collect();
        let below = self.link.as_ref().map_or(usize::MAX, |l| l.to);
        let answered = &self.answered;
        let covers = &self.covers;
        // A sender now covered that did not answer cannot be on a stuck link.
        self.pending.retain(|&(to, from)| {
            to < below && (answered.contains(from) || !covers.contains(from))
        });
        self.pending.sort_unstable();
        self.pending.dedup();
        self.pending.truncate(MAX_PENDING);
    }

    /// Where chain `i`'s waits lead, through the chains of the ranks its exits enter.
    fn follow(&self, i: usize) -> Lead {
        let mut at = i;
        // (chain, the rank by which the walk entered it)
        let mut path: Vec<(usize, usize)> = Vec::new();
        loop {
            let t = match &self.chains[at].lead {
                Lead::Exit(t) if self.covers.contains(*t) => *t,
                lead => return lead.clone(),
            };
            let Some(next) = self.chains.iter().position(|c| c.waiters.contains(t)) else {
                return Lead::End(t);
            };
            if let Some(k) = path.iter().position(|&(c, _)| c == next) {
                // Round a cycle: `t` and the ranks by which the walk entered each chain since
                // it first entered this one are on it (that first entry may be on a tail that
                // joins the cycle inside the chain).
                let on: Ranges = path[k + 1..].iter().map(|&(_, r)| r).chain([t]).collect();
                return Lead::Cycle(on);
            }
            path.push((next, t));
            at = next;
        }
    }

    /// The wire form, what a hub sends up.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a digest is plain data")
    }

    /// Reads [`Digest::encode`]'s output; bad bytes are an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Digest, String> {
        let d: Digest = serde_json::from_slice(b).map_err(|e| format!("bad digest: {e}"))?;
        if d.pending.len() > MAX_PENDING {
            return Err(format!("a digest with {} link candidates", d.pending.len()));
        }
        Ok(d)
    }

    /// Every waiting rank.
    pub fn waiting(&self) -> Ranges {
        self.chains
            .iter()
            .fold(Ranges::new(), |w, c| w.union(&c.waiters))
    }
}

/// The chains of `waits` among the ranks `covered` says are covered: each waiting rank's waits
/// followed to a covered rank that waits for nobody, to an uncovered rank, or round a cycle.
fn chains(waits: &BTreeMap<usize, usize>, covered: impl Fn(usize) -> bool) -> Vec<Chain> {
    let mut lead_of: BTreeMap<usize, Lead> = BTreeMap::new();
    for &start in waits.keys() {
        let mut at = start;
        let mut path: Vec<usize> = Vec::new();
        let lead = loop {
            if let Some(l) = lead_of.get(&at) {
                break l.clone();
            }
            let Some(&next) = waits.get(&at) else {
                break if covered(at) {
                    Lead::End(at)
                } else {
                    Lead::Exit(at)
                };
            };
            if let Some(k) = path.iter().position(|&p| p == at) {
                break Lead::Cycle(path[k..].iter().copied().collect());
            }
            path.push(at);
            at = next;
        };
        for p in path {
            lead_of.insert(p, lead.clone());
        }
    }
    let mut by_lead: BTreeMap<Lead, BTreeSet<usize>> = BTreeMap::new();
    for (r, l) in lead_of {
        by_lead.entry(l).or_default().insert(r);
    }
    by_lead
        .into_iter()
        .map(|(lead, w)| Chain {
            waiters: w.into_iter().collect(),
            lead,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::PeerStat;
    use crate::verdict::{Culprit, analyse};

    /// xorshift64*: the same cases on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn op(rng: &mut Rng, n: usize, seq: u64, state: State, waiting_on: Option<usize>) -> Op {
        let own = waiting_on.map(|p| PeerStat {
            peer: p,
            to_send: 64,
            sent: 16 * rng.below(5) as u64,
            to_recv: 64,
            received: 16 * rng.below(5) as u64,
            arrived: rng.below(4) > 0,
            waited_us: 0,
            late_us: 0,
        });
        let peers = (0..rng.below(4))
            .map(|_| {
                let to_recv = 64 * rng.below(2) as u64;
                PeerStat {
                    peer: rng.below(n),
                    to_send: 64,
                    sent: 16 * rng.below(5) as u64,
                    to_recv,
                    received: 16 * rng.below(5) as u64,
                    arrived: rng.below(3) > 0,
                    waited_us: 0,
                    late_us: 0,
                }
            })
            .collect::<Vec<_>>()
            .into_iter()
            .chain(own)
            .collect();
        Op {
            seq,
            name: "allreduce".into(),
            algo: "ring".into(),
            dtype: "float".into(),
            op: "sum".into(),
            count: 16,
            bytes: 64,
            root: None,
            error: None,
            state,
            start_us: 1_000_000,
            end_us: if state == State::Done { 9_000_000 } else { 0 },
            progress_us: [2_000_000, 9_500_000][rng.below(2)],
            waiting_on,
            peers,
        }
    }

    /// Rank `r`'s answer, with `ops`.
    fn answered(r: usize, ops: Vec<Op>) -> RankView {
        RankView {
            rank: r,
            host: "h".into(),
            pid: r as u32,
            presence: Presence::Answered,
            now_us: 10_000_000,
            ops,
            slow: Vec::new(),
        }
    }

    /// Views of `n` ranks; `dense`: every rank answers and waits inside one operation (waits
    /// then often run in cycles).
    fn random_views(rng: &mut Rng, n: usize, dense: bool) -> Vec<RankView> {
        (0..n)
            .map(|r| {
                match if dense { 9 } else { rng.below(10) } {
                    0 => return RankView::absent(r, "h", r as u32, Presence::Silent),
                    1 => return RankView::absent(r, "h", r as u32, Presence::Dead),
                    _ => {}
                }
                let seq = if dense { 7 } else { 5 + rng.below(3) as u64 };
                let state = if dense {
                    State::Running
                } else {
                    [State::Running, State::Done, State::Failed][rng.below(3)]
                };
                let waits = (state != State::Done && (dense || rng.below(5) > 0))
                    .then(|| rng.below(n + usize::from(!dense)));
                let mut ops = vec![op(rng, n, seq, state, waits)];
                if rng.below(2) == 0 {
                    let prev_waits = (rng.below(3) == 0).then(|| rng.below(n));
                    ops.insert(0, op(rng, n, seq - 1, State::Done, prev_waits));
                }
                if !dense && rng.below(8) == 0 {
                    ops.clear();
                }
                if dense {
                    // Every header in, every byte delivered: only the cycles are left.
                    for p in ops.iter_mut().flat_map(|o| o.peers.iter_mut()) {
                        p.arrived = true;
                        p.received = p.sent;
                    }
                }
                answered(r, ops)
            })
            .collect()
    }

    #[test]
    fn merged_digests_give_the_verdict_of_all_views() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut cycles = 0;
        for case in 0..3000 {
            let n = 1 + rng.below(24);
            // Some views missing altogether: an uncovered rank counts as absent.
            let mut views = random_views(&mut rng, n, case % 4 == 0);
            if rng.below(6) == 0 {
                views.remove(rng.below(n));
            }
            let fetch = |views: &[RankView], ranks: &[usize]| -> Vec<RankView> {
                views
                    .iter()
                    .filter(|v| ranks.contains(&v.rank))
                    .cloned()
                    .collect()
            };
            let whole = analyse(&views, n);
            // Random parts, merged in a random order, hub by hub.
            let parts = 1 + rng.below(n.max(1));
            let mut digests: Vec<Digest> = (0..parts)
                .map(|p| {
                    let mine: Vec<RankView> = views
                        .iter()
                        .filter(|v| (v.rank * 7 + case) % parts == p)
                        .cloned()
                        .collect();
                    Digest::of(&mine)
                })
                .collect();
            while digests.len() > 1 {
                let a = rng.below(digests.len());
                let d = digests.swap_remove(a);
                let b = rng.below(digests.len());
                // Through the wire form, as a hub sends it.
                let d = Digest::decode(&d.encode()).unwrap();
                digests[b].merge(d).unwrap();
            }
            let merged = digests
                .pop()
                .unwrap()
                .verdict(n, &mut |ranks: &[usize]| fetch(&views, ranks));
            let what = format!("case {case}: {views:#?}");
            assert_eq!(merged.stuck_seq, whole.stuck_seq, "{what}");
            assert_eq!(merged.never_arrived, whole.never_arrived, "{what}");
            assert_eq!(merged.absent, whole.absent, "{what}");
            assert_eq!(merged.waiting, whole.waiting, "{what}");
            // A cycle that crosses digests is known by the ranks where it crosses: some of its
            // ranks, not all.
            let by_cycle = !merged.culprits.is_empty()
                && merged.culprits != whole.culprits
                && merged.culprits.is_subset(&whole.culprits);
            if by_cycle {
                cycles += 1;
                if matches!(whole.culprit, Culprit::Link { .. }) {
                    assert_eq!(merged.culprit, whole.culprit, "{what}");
                    assert_eq!(merged.line(), whole.line(), "{what}");
                }
                continue;
            }
            assert_eq!(merged.culprits, whole.culprits, "{what}");
            assert_eq!(merged.culprit, whole.culprit, "{what}");
            assert_eq!(merged.line(), whole.line(), "{what}");
        }
        // Both kinds of case occur.
        assert!(
            (20..500).contains(&cycles),
            "{cycles} cases decided by a cycle"
        );
    }

    #[test]
    fn ranges_add_subtract_and_print() {
        let a: Ranges = [0, 1, 2, 3, 5, 7, 8, 9].into_iter().collect();
        assert_eq!(a.to_string(), "0-3, 5 and 7-9");
        assert_eq!(a.len(), 8);
        assert!(a.contains(5) && !a.contains(4) && !a.contains(10));
        let b: Ranges = [4, 6].into_iter().collect();
        assert_eq!(a.union(&b), Ranges::span(0, 9));
        assert!(a.disjoint(&b));
        assert_eq!(Ranges::span(0, 9).minus(&b), a);
        assert_eq!(a.minus(&Ranges::span(2, 8)).to_string(), "0, 1 and 9");
        assert_eq!(Ranges::span(3, 4).to_string(), "3, 4");
        let mut other = Digest::of(&[RankView::absent(3, "h", 1, Presence::Dead)]);
        assert!(
            other
                .merge(Digest::of(&[RankView::absent(3, "h", 1, Presence::Dead)]))
                .is_err()
        );
        // Runs from another process are checked.
        let b = Digest::of(&[RankView::absent(3, "h", 1, Presence::Dead)]).encode();
        let text = String::from_utf8(b).unwrap().replace("[[3,3]]", "[[4,3]]");
        assert!(Digest::decode(text.as_bytes()).is_err(), "{text}");
        let text = text.replace("[[4,3]]", "[[5,6],[1,2]]");
        assert!(Digest::decode(text.as_bytes()).is_err(), "{text}");
        assert!(Digest::decode(b"{").is_err());
    }

    #[test]
    fn a_ring_stuck_at_one_rank_digests_to_one_chain_per_part() {
        // 1,024 ranks in a ring, rank 700 stopped; each rank r waits for r - 1.
        let n = 1024;
        let views: Vec<RankView> = (0..n)
            .map(|r| {
                if r == 700 {
                    return RankView::absent(r, "h", 1, Presence::Silent);
                }
                let mut rng = Rng(r as u64 + 1);
                let mut o = op(&mut rng, n, 9, State::Running, Some((r + n - 1) % n));
                o.peers.truncate(0);
                answered(r, vec![o])
            })
            .collect();
        let mut top = Digest::default();
        for part in views.chunks(64) {
            let d = Digest::of(part);
            assert!(d.chains.len() <= 2, "{:?}", d.chains);
            top.merge(d).unwrap();
        }
        assert_eq!(top.chains.len(), 1, "{:?}", top.chains);
        assert!(serde_json::to_vec(&top).unwrap().len() < 1024);
        let v = top.verdict(n, &mut |_| Vec::new());
        assert_eq!(v.culprit, Culprit::Ranks(BTreeSet::from([700])));
        let line = v.line();
        assert!(
            line.contains("ranks 0-699 and 701-1023 wait on it"),
            "{line}"
        );
    }
}
