//! The one form of a flight-recorder dump: what a rank writes on a failure or `SIGUSR1`, what
//! `ccl-trace DIR` reads back, what the live monitor receives, and what the Chrome trace and
//! PyTorch's pickle are made from. Every reader and writer goes through [`Dump`] and [`Op`], so
//! a field is named in one place.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::recorder::{Entry, PeerStat, Recorder, State, now_us};

/// The `format` of the dumps this version writes.
pub const FORMAT: &str = "ccl-trace-1";

/// Who wrote a dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Identifies the communicator across ranks.
    pub comm: String,
    pub rank: usize,
    pub size: usize,
    pub host: String,
    pub pid: u32,
    pub reason: String,
}

/// One rank's flight recorder, as written to `ccl-trace-<comm>-<rank>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dump {
    #[serde(default)]
    pub format: String,
    /// Who wrote it and why (the error, "SIGUSR1", ...).
    #[serde(flatten)]
    pub meta: Meta,
    /// The writer's clock when it wrote the dump, microseconds since the epoch.
    #[serde(default)]
    pub time_us: u64,
    /// Oldest first.
    pub entries: Vec<Op>,
}

/// One operation as a rank recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub seq: u64,
    pub name: String,
    pub algo: String,
    #[serde(default)]
    pub dtype: String,
    #[serde(default)]
    pub op: String,
    #[serde(default)]
    pub count: u64,
    pub bytes: u64,
    #[serde(default)]
    pub root: Option<usize>,
    pub state: State,
    pub start_us: u64,
    pub end_us: u64,
    /// When something last moved in it (0: unknown).
    #[serde(default)]
    pub progress_us: u64,
    /// The peer it was waiting for when last seen blocked.
    pub waiting_on: Option<usize>,
    #[serde(default)]
    pub error: Option<String>,
    pub peers: Vec<PeerStat>,
}

impl From<&Entry> for Op {
    fn from(e: &Entry) -> Op {
        let w = &e.what;
        Op {
            seq: w.seq,
            name: w.name.to_string(),
            algo: w.algo.to_string(),
            dtype: w.dtype.to_string(),
            op: w.op.to_string(),
            count: w.count,
            bytes: w.bytes,
            root: w.root,
            state: e.state,
            start_us: e.start_us,
            end_us: e.end_us,
            progress_us: e.progress_us,
            waiting_on: e.waiting_on,
            error: e.error.clone(),
            peers: e.peers.clone(),
        }
    }
}

/// The last `n` operations of `rec`, oldest first.
pub fn last_ops(rec: &Recorder, n: usize) -> Vec<Op> {
    let all: Vec<&Entry> = rec.entries().collect();
    all[all.len().saturating_sub(n)..]
        .iter()
        .map(|&e| Op::from(e))
        .collect()
}

impl Dump {
    /// What `rec` holds, written now by the rank `meta` names.
    pub fn of(rec: &Recorder, meta: &Meta) -> Dump {
        Dump {
            format: FORMAT.to_string(),
            meta: meta.clone(),
            time_us: now_us(),
            entries: rec.entries().map(Op::from).collect(),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a dump is plain data")
    }

    /// The name of its file: one per communicator and rank.
    pub fn file_name(comm: &str, rank: usize) -> String {
        format!("ccl-trace-{comm}-r{rank}.json")
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::Begin;

    #[test]
    fn a_dump_reads_back_as_written() {
        let mut r = Recorder::new(3);
        for seq in 1..=2 {
            r.begin(Begin::test(seq, "allreduce"), [(1, 8, 8)].into_iter());
        }
        r.current().unwrap().waiting_on = Some(2);
        let meta = Meta {
            comm: "c\"x".into(),
            rank: 0,
            size: 3,
            host: "h".into(),
            pid: 1,
            reason: "test".into(),
        };
        let d = Dump::of(&r, &meta);
        let j = d.to_json();
        assert!(
            j.contains("\"waiting_on\":2")
                && j.contains("\"state\":\"running\"")
                && j.contains("c\\\"x")
                && j.starts_with("{\"format\":\"ccl-trace-1\""),
            "{j}"
        );
        let back: Dump = serde_json::from_str(&j).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.entries[1].peers[0].to_recv, 8);
        assert_eq!(last_ops(&r, 1), d.entries[1..]);
    }
}
