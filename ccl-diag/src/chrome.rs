//! A Chrome trace (chrome://tracing, Perfetto) of every rank's flight recorder: one track
//! (process) per rank, one slice per operation, times from the job's first operation.

use serde_json::json;

use crate::dump::Dump;

/// The trace of `dumps` as JSON.
pub fn trace(dumps: &[Dump]) -> String {
    let t0 = dumps
        .iter()
        .flat_map(|d| &d.entries)
        .map(|e| e.start_us)
        .min()
        .unwrap_or(0);
    let mut events = Vec::new();
    for d in dumps {
        let rank = d.meta.rank;
        events.push(json!({
            "ph": "M", "name": "process_name", "pid": rank, "tid": 0,
            "args": { "name": format!("rank {rank} ({})", d.meta.host) }
        }));
        events.push(json!({
            "ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
            "args": { "sort_index": rank }
        }));
        for e in &d.entries {
            // A running operation has no end yet: it is drawn as an instant at its start.
            let end = e.end_us.max(e.start_us);
            events.push(json!({
                "ph": "X",
                "name": format!("{} {} B", e.name, e.bytes),
                "cat": e.algo,
                "pid": rank,
                "tid": 0,
                "ts": e.start_us - t0,
                "dur": end - e.start_us,
                "args": { "seq": e.seq, "algo": e.algo, "dtype": e.dtype, "state": e.state }
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::{Meta, Op};
    use crate::recorder::State;
    use serde_json::Value;

    #[test]
    fn chrome_trace_has_a_track_per_rank() {
        let d = |r: u64| Dump {
            format: String::new(),
            meta: Meta {
                comm: "c".into(),
                rank: r as usize,
                size: 2,
                host: "h".into(),
                pid: 1,
                reason: String::new(),
            },
            time_us: 0,
            entries: vec![Op {
                seq: 1,
                name: "allreduce".into(),
                algo: "ring".into(),
                dtype: "float".into(),
                op: "sum".into(),
                count: 2,
                bytes: 8,
                root: None,
                state: State::Done,
                start_us: 100 + r,
                end_us: 150,
                progress_us: 150,
                waiting_on: None,
                error: None,
                peers: Vec::new(),
            }],
        };
        let t: Value = serde_json::from_str(&trace(&[d(0), d(1)])).unwrap();
        let ev = t["traceEvents"].as_array().unwrap();
        let pids: std::collections::BTreeSet<u64> = ev
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids.len(), 2);
        assert!(ev.iter().any(|e| e["ph"] == "X" && e["ts"] == 0));
        assert!(ev.iter().any(|e| e["args"]["state"] == "done"));
    }
}
