//! `ccl-trace`: reads the flight-recorder dumps of every rank (`CCL_TRACE_DIR`) and says where a
//! stuck or failed job stands: the last operation each rank reached, which ranks never entered
//! the operation the others are stuck in, which peer each rank was waiting for, and, following
//! those waits, the rank(s) the job is waiting on.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use ccl_core::diag::{OpView, Presence, RankView, Verdict};
use ccl_core::trace::State;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Dump {
    pub comm: String,
    pub rank: usize,
    pub size: usize,
    pub host: String,
    pub pid: u32,
    pub reason: String,
    #[serde(default)]
    pub time_us: u64,
    pub entries: Vec<Entry>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct Entry {
    pub seq: u64,
    pub name: String,
    pub algo: String,
    pub bytes: u64,
    pub state: String,
    pub start_us: u64,
    pub end_us: u64,
    #[serde(default)]
    pub progress_us: u64,
    pub waiting_on: Option<usize>,
    pub error: Option<String>,
    pub peers: Vec<PeerStat>,
}

#[derive(Debug, Deserialize, Clone)]
pub struct PeerStat {
    pub peer: usize,
    pub to_send: u64,
    pub sent: u64,
    pub to_recv: u64,
    pub received: u64,
    pub arrived: bool,
    pub waited_us: u64,
    pub late_us: i64,
}

/// Reads every `ccl-trace-*.json` in `dir`.
pub fn read_dir(dir: &Path) -> Result<Vec<Dump>, String> {
    let mut out = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for ent in rd.flatten() {
        let p = ent.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.starts_with("ccl-trace-") && name.ends_with(".json")) {
            continue;
        }
        let text =
            std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        let d: Dump = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a ccl trace dump: {e}", p.display()))?;
        out.push(d);
    }
    if out.is_empty() {
        return Err(format!("no ccl-trace-*.json dumps in {}", dir.display()));
    }
    Ok(out)
}

/// A dump as the shared analysis sees it.
fn view(d: &Dump) -> RankView {
    let state = |s: &str| match s {
        "running" => State::Running,
        "done" => State::Done,
        _ => State::Failed,
    };
    RankView {
        rank: d.rank,
        host: d.host.clone(),
        pid: d.pid,
        presence: Presence::Answered,
        now_us: d.time_us,
        ops: d
            .entries
            .iter()
            .map(|e| OpView {
                seq: e.seq,
                name: e.name.clone(),
                algo: e.algo.clone(),
                bytes: e.bytes,
                state: state(&e.state),
                start_us: e.start_us,
                end_us: e.end_us,
                progress_us: e.progress_us,
                waiting_on: e.waiting_on,
                peers: e
                    .peers
                    .iter()
                    .map(|p| ccl_core::trace::PeerStat {
                        peer: p.peer,
                        to_send: p.to_send,
                        sent: p.sent,
                        to_recv: p.to_recv,
                        received: p.received,
                        arrived: p.arrived,
                        waited_us: p.waited_us,
                        late_us: p.late_us,
                    })
                    .collect(),
            })
            .collect(),
        slow: Vec::new(),
    }
}

/// The dumps of one communicator as views, with the ranks that left none marked so.
fn views(dumps: &[&Dump]) -> (Vec<RankView>, usize) {
    let size = dumps.iter().map(|d| d.size).max().unwrap_or(0);
    let mut vs: Vec<RankView> = dumps.iter().map(|d| view(d)).collect();
    for r in 0..size {
        if !dumps.iter().any(|d| d.rank == r) {
            vs.push(RankView::absent(r, "", 0, Presence::NoDump));
        }
    }
    (vs, size)
}

/// Analyses the dumps of one communicator (the same analysis the job's monitor runs live).
pub fn analyse(dumps: &[&Dump]) -> Verdict {
    let (vs, size) = views(dumps);
    ccl_core::diag::analyse(&vs, size)
}

fn list(s: &BTreeSet<usize>) -> String {
    s.iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The human-readable report over all dumps.
pub fn report(dumps: &[Dump]) -> String {
    let mut by_comm: BTreeMap<&str, Vec<&Dump>> = BTreeMap::new();
    for d in dumps {
        by_comm.entry(&d.comm).or_default().push(d);
    }
    let mut out = String::new();
    for (comm, ds) in by_comm {
        let (vs, _) = views(&ds);
        let v = analyse(&ds);
        let ranks: BTreeSet<usize> = ds.iter().map(|d| d.rank).collect();
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
        sorted.sort_by_key(|d| d.rank);
        for d in sorted {
            let last = d.entries.iter().max_by_key(|e| e.seq);
            let Some(e) = last else {
                let _ = writeln!(
                    out,
                    "  rank {} ({}:{}): no operation recorded",
                    d.rank, d.host, d.pid
                );
                continue;
            };
            let dur = if e.end_us > e.start_us {
                format!(" after {:.3} s", (e.end_us - e.start_us) as f64 / 1e6)
            } else {
                String::new()
            };
            let mut line = format!(
                "  rank {} ({}:{}): {} #{} ({}, {} bytes) {}{dur}",
                d.rank, d.host, d.pid, e.name, e.seq, e.algo, e.bytes, e.state
            );
            if let Some(p) = e.waiting_on {
                let ps = e.peers.iter().find(|x| x.peer == p);
                let detail = match ps {
                    Some(ps) if !ps.arrived => {
                        " (it never sent this operation's header)".to_string()
                    }
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
            let why = e.error.as_deref().unwrap_or(&d.reason);
            let _ = writeln!(out, "      {why}");
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
        let _ = writeln!(out, "  verdict: {}", v.line(&vs));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dump(rank: usize, seq: u64, waiting_on: Option<usize>, arrived: &[(usize, bool)]) -> Dump {
        Dump {
            comm: "c".into(),
            rank,
            size: 4,
            host: "h".into(),
            pid: 1,
            reason: "timeout".into(),
            time_us: 3,
            entries: vec![Entry {
                seq,
                name: "allreduce".into(),
                algo: "ring".into(),
                bytes: 1024,
                state: "failed".into(),
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
        r1.entries[0].state = "running".into();
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
