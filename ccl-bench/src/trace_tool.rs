//! `ccl-trace`: reads the flight-recorder dumps of every rank (`CCL_TRACE_DIR`) and says where a
//! stuck or failed job stands: the last operation each rank reached, which ranks never entered
//! the operation the others are stuck in, which peer each rank was waiting for, and, following
//! those waits, the rank(s) the job is waiting on.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Dump {
    pub comm: String,
    pub rank: usize,
    pub size: usize,
    pub host: String,
    pub pid: u32,
    pub reason: String,
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

/// The verdict for one communicator.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub comm: String,
    pub size: usize,
    /// The operation the job was in (the furthest any rank got).
    pub stuck_seq: u64,
    pub stuck_name: String,
    /// Ranks that never entered it (or left no dump).
    pub never_arrived: BTreeSet<usize>,
    /// Ranks without a dump.
    pub no_dump: BTreeSet<usize>,
    /// Rank -> the peer it waited for.
    pub waits: BTreeMap<usize, usize>,
    /// Where the waits lead: the rank(s) the job waits for.
    pub culprits: BTreeSet<usize>,
}

/// Analyses the dumps of one communicator.
pub fn analyse(dumps: &[&Dump]) -> Verdict {
    let size = dumps.iter().map(|d| d.size).max().unwrap_or(0);
    let comm = dumps.first().map(|d| d.comm.clone()).unwrap_or_default();
    let by_rank: BTreeMap<usize, &Dump> = dumps.iter().map(|d| (d.rank, *d)).collect();
    let last = |d: &Dump| d.entries.iter().max_by_key(|e| e.seq).cloned();
    let stuck = by_rank
        .values()
        .filter_map(|d| last(d))
        .max_by_key(|e| e.seq);
    let (stuck_seq, stuck_name) = stuck.map_or((0, String::new()), |e| (e.seq, e.name));
    let no_dump: BTreeSet<usize> = (0..size).filter(|r| !by_rank.contains_key(r)).collect();
    let mut never_arrived = no_dump.clone();
    let mut waits = BTreeMap::new();
    for (&r, d) in &by_rank {
        match d.entries.iter().find(|e| e.seq == stuck_seq) {
            None => {
                never_arrived.insert(r);
            }
            Some(e) => {
                // A peer whose header never came has not entered this operation.
                for p in &e.peers {
                    if !p.arrived && p.to_recv > 0 && e.state != "done" {
                        never_arrived.insert(p.peer);
                    }
                }
            }
        }
    }
    // What each rank waits for is read from its own latest unfinished operation: a rank still
    // inside an earlier operation than the furthest one waits there, and the chain runs through
    // it to the rank everyone is really behind.
    for (&r, d) in &by_rank {
        let open = d
            .entries
            .iter()
            .filter(|e| e.state != "done")
            .max_by_key(|e| e.seq);
        if let Some(p) = open.and_then(|e| e.waiting_on) {
            waits.insert(r, p);
        }
    }
    // Follow each rank's waits to where they end: a rank that left no dump or waits for nobody.
    // A rank names only one of the peers it waits for, so waits can run in a cycle (two
    // halving-doubling partners each stuck behind a third rank): a cycle proves nothing and
    // counts only when no chain ends anywhere else.
    let mut culprits = BTreeSet::new();
    let mut cycles = BTreeSet::new();
    for &start in waits.keys() {
        let mut at = start;
        let mut seen = BTreeSet::new();
        let mut cycled = false;
        while let Some(&next) = waits.get(&at) {
            if !seen.insert(at) {
                cycled = true;
                break;
            }
            at = next;
        }
        if cycled {
            cycles.insert(at);
        } else {
            culprits.insert(at);
        }
    }
    if culprits.is_empty() {
        culprits = if never_arrived.is_empty() {
            cycles
        } else {
            never_arrived.clone()
        };
    }
    Verdict {
        comm,
        size,
        stuck_seq,
        stuck_name,
        never_arrived,
        no_dump,
        waits,
        culprits,
    }
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
        let v = analyse(&ds);
        let ranks: BTreeSet<usize> = ds.iter().map(|d| d.rank).collect();
        let _ = writeln!(
            out,
            "communicator {comm}: {} ranks, dumps from rank(s) {}{}",
            v.size,
            list(&ranks),
            if v.no_dump.is_empty() {
                String::new()
            } else {
                format!("; no dump from rank(s) {}", list(&v.no_dump))
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
            entries: vec![Entry {
                seq,
                name: "allreduce".into(),
                algo: "ring".into(),
                bytes: 1024,
                state: "failed".into(),
                start_us: 1,
                end_us: 2,
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
        assert_eq!(v.no_dump, BTreeSet::from([2]));
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
