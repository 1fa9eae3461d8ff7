//! What `ccl-trace DIR` prints: from the flight-recorder dumps of every rank, where a stuck or
//! failed job stands: the last operation each rank reached, which ranks never entered the
//! operation the others are stuck in, which peer each rank was waiting for, and, following
//! those waits, the rank(s) the job is waiting on.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::dump::Dump;
use crate::verdict::{self, Presence, RankView, Verdict};

/// The dumps of one communicator as views, with the ranks that left none marked so.
fn views(dumps: &[&Dump]) -> (Vec<RankView>, usize) {
    let size = dumps.iter().map(|d| d.meta.size).max().unwrap_or(0);
    let mut vs: Vec<RankView> = dumps.iter().map(|d| RankView::from_dump(d)).collect();
    for r in 0..size {
        if !dumps.iter().any(|d| d.meta.rank == r) {
            vs.push(RankView::absent(r, "", 0, Presence::NoDump));
        }
    }
    (vs, size)
}

/// Analyses the dumps of one communicator (the same analysis the job's monitor runs live).
pub fn analyse(dumps: &[&Dump]) -> Verdict {
    let (vs, size) = views(dumps);
    verdict::analyse(&vs, size)
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What dump `d` says of its rank: its last operation, the peer it waited for, the peer it
/// waited longest for, and why it stopped.
fn rank_lines(out: &mut String, d: &Dump, v: &Verdict) {
    let last = d.entries.iter().max_by_key(|e| e.seq);
    let Some(e) = last else {
        let _ = writeln!(
            out,
            "  rank {} ({}:{}): no operation recorded",
            d.meta.rank, d.meta.host, d.meta.pid
        );
        return;
    };
    let dur = if e.end_us > e.start_us {
        format!(" after {:.3} s", (e.end_us - e.start_us) as f64 / 1e6)
    } else {
        String::new()
    };
    let mut line = format!(
        "  rank {} ({}:{}): {} #{} ({}, {} bytes) {}{dur}",
        d.meta.rank,
        d.meta.host,
        d.meta.pid,
        e.name,
        e.seq,
        e.algo,
        e.bytes,
        e.state.name()
    );
    if let Some(p) = e.waiting_on {
        let ps = e.peers.iter().find(|x| x.peer == p);
        let detail = match ps {
            Some(ps) if !ps.arrived => " (it never sent this operation's header)".to_string(),
            Some(ps) => {
                format!(" ({} of {} bytes from it arrived)", ps.received, ps.to_recv)
            }
            None => String::new(),
        };
        let _ = write!(line, ", waiting for peer {p}{detail}");
    }
    if e.seq < v.stuck_seq {
        line.push_str(&format!(" -- never entered #{}", v.stuck_seq));
    }
    let _ = writeln!(out, "{line}");
    let slowest = e
        .peers
        .iter()
        .filter(|p| p.waited_us > 0)
        .max_by_key(|p| p.waited_us);
    if let Some(p) = slowest {
        let _ = writeln!(
            out,
            "      waited {:.1} ms for peer {} (it entered {:.1} ms {}; {} of {} bytes sent to it)",
            p.waited_us as f64 / 1e3,
            p.peer,
            p.late_us.unsigned_abs() as f64 / 1e3,
            if p.late_us >= 0 { "later" } else { "earlier" },
            p.sent,
            p.to_send
        );
    }
    let why = e.error.as_deref().unwrap_or(&d.meta.reason);
    let _ = writeln!(out, "      {why}");
}

/// The human-readable report over all dumps.
pub fn report(dumps: &[Dump]) -> String {
    let mut by_comm: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        by_comm.entry(&d.meta.comm).or_default().push(d);
    }
    let mut out = String::new();
    for (comm, ds) in by_comm {
        let v = analyse(&ds);
        let ranks: BTreeSet<usize> = ds.iter().map(|d| d.meta.rank).collect();
        let _ = writeln!(
            out,
            "communicator {comm}: {} ranks, dumps from rank(s) {}{}",
            v.size,
            list(&ranks),
            if v.absent.is_empty() {
                String::new()
            } else {
                format!("; no dump from rank(s) {}", list(&v.absent))
            }
        );
        let _ = writeln!(
            out,
            "  furthest operation: {} #{}",
            v.stuck_name, v.stuck_seq
        );
        let mut sorted: Vec<&&Dump> = ds.iter().collect();
        sorted.sort_by_key(|d| d.meta.rank);
        for d in sorted {
            rank_lines(&mut out, d, &v);
        }
        if !v.never_arrived.is_empty() {
            let _ = writeln!(
                out,
                "  never arrived at {} #{}: rank(s) {}",
                v.stuck_name,
                v.stuck_seq,
                list(&v.never_arrived)
            );
        }
        let _ = writeln!(out, "  => the job waits for rank(s) {}", list(&v.culprits));
        let _ = writeln!(out, "  verdict: {}", v.line());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::{Meta, Op};
    use crate::recorder::{PeerStat, State};

    fn dump(rank: usize, seq: u64, waiting_on: Option<usize>, arrived: &[(usize, bool)]) -> Dump {
        Dump {
            meta: Meta {
                comm: "c".into(),
                rank,
                size: 4,
                host: "h".into(),
                pid: 1,
                reason: "timeout".into(),
            },
            time_us: 3,
            format: String::new(),
            entries: vec![Op {
                seq,
                name: "allreduce".into(),
                algo: "ring".into(),
                dtype: "float".into(),
                op: "sum".into(),
                count: 256,
                bytes: 1024,
                root: None,
                state: State::Failed,
                start_us: 1,
                end_us: 2,
                progress_us: 1,
                waiting_on,
                error: None,
                peers: arrived
                    .iter()
                    .map(|&(peer, arrived)| PeerStat {
                        peer,
                        to_send: 8,
                        sent: 0,
                        to_recv: 8,
                        received: 0,
                        arrived,
                        waited_us: 0,
                        late_us: 0,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn a_stopped_rank_is_found_through_the_chain_of_waits() {
        // Ring 0 -> 1 -> 2 -> 3 -> 0: rank 2 is stopped and left no dump; rank 3 waits for 2,
        // rank 0 for 3, rank 1 for 0.
        let ds = [
            dump(0, 7, Some(3), &[(3, true), (1, true)]),
            dump(1, 7, Some(0), &[(0, true), (2, true)]),
            dump(3, 7, Some(2), &[(2, false), (0, true)]),
        ];
        let refs: Vec<&Dump> = ds.iter().collect();
        let v = analyse(&refs);
        assert_eq!(v.stuck_seq, 7);
        assert_eq!(v.absent, BTreeSet::from([2]));
        assert_eq!(v.culprits, BTreeSet::from([2]));
        let text = report(&ds);
        assert!(text.contains("=> the job waits for rank(s) 2"), "{text}");
        assert!(
            text.contains("never sent this operation's header"),
            "{text}"
        );
    }

    #[test]
    fn a_rank_behind_in_an_earlier_operation_is_followed() {
        // Rank 2 stopped inside #7 and left no dump; rank 3 waits for it there, rank 0 (still in
        // #7) waits for 3, and rank 1, already in #8, waits for 0.
        let mut r1 = dump(1, 8, Some(0), &[(0, false)]);
        r1.entries[0].state = State::Running;
        let ds = [
            dump(0, 7, Some(3), &[(3, true)]),
            r1,
            dump(3, 7, Some(2), &[(2, true)]),
        ];
        let refs: Vec<&Dump> = ds.iter().collect();
        let v = analyse(&refs);
        assert_eq!(v.stuck_seq, 8);
        assert_eq!(v.culprits, BTreeSet::from([2]));
    }

    #[test]
    fn a_cycle_of_waits_does_not_hide_the_stopped_rank() {
        // Halving-doubling: 0 and 1 each name the other (both stuck behind the step before),
        // 3 waits for the stopped rank 2.
        let ds = [
            dump(0, 9, Some(1), &[(1, true), (3, true)]),
            dump(1, 9, Some(0), &[(0, true), (2, true)]),
            dump(3, 9, Some(2), &[(2, false), (1, true)]),
        ];
        let refs: Vec<&Dump> = ds.iter().collect();
        assert_eq!(analyse(&refs).culprits, BTreeSet::from([2]));
        // Only a cycle: the ranks that never arrived are named.
        let ds = [
            dump(0, 9, Some(1), &[(1, true), (2, false)]),
            dump(1, 9, Some(0), &[(0, true)]),
        ];
        let refs: Vec<&Dump> = ds.iter().collect();
        let v = analyse(&refs);
        assert_eq!(v.culprits, BTreeSet::from([2, 3]), "{v:?}");
    }

    #[test]
    fn a_rank_that_never_entered_is_named() {
        let ds = [
            dump(0, 8, Some(1), &[(1, false)]),
            dump(1, 7, None, &[]),
            dump(2, 8, Some(0), &[(0, true)]),
            dump(3, 8, Some(2), &[(2, true)]),
        ];
        let refs: Vec<&Dump> = ds.iter().collect();
        let v = analyse(&refs);
        assert!(v.never_arrived.contains(&1));
        assert_eq!(v.culprits, BTreeSet::from([1]));
    }
}
