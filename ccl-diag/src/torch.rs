//! The flight recorder in PyTorch's format: the pickle that `torch.distributed`'s flight
//! recorder dumps (`TORCH_FR_DUMP_TEMP_FILE<rank>`), so its analyser
//! (`python -m torch.distributed.flight_recorder.fr_trace DIR`) reads ccl's dumps too.
//!
//! The analyser needs, per file, `version` ("major.minor": it picks how to match coalesced
//! groups), `pg_config` (each process group's ranks, as the string of a Python list) and
//! `entries`, each with `record_id` (aligns the ranks' rings), `process_group` (name, desc),
//! `collective_seq_id`, `profiling_name` (`<backend>:<collective>`), `input_sizes` and
//! `output_sizes` (per tensor, its shape: it compares them across ranks), `input_dtypes` and
//! `output_dtypes`, `state` (`scheduled`, `started`, `completed`: it compares them too),
//! `time_created_ns` and `is_p2p`. A rank whose ring lacks the sequence number the others
//! reached is what it names as "missing" from that collective.
//!
//! The file is a pickle of protocol 2 (what `pickle.load` reads in every Python 3), written by
//! serde from the structs below, whose fields are the dictionary's keys in order.
//!
//! Point-to-point groups are left out: PyTorch records each send and receive as its own entry
//! matched by sizes, ccl records a group as one operation with bytes per peer.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::dump::{Dump, Op};
use crate::recorder::State;

/// Matches the dumps of torch 2.10 and later (`version_val` in `FlightRecorder.hpp`).
pub const VERSION: &str = "2.10";

/// The backend named in `profiling_name` (one the analyser knows, so it does not warn on
/// every entry): ccl stands in for the process group's backend.
const BACKEND: &str = "c10d";

/// The process group's description in every entry and in `pg_config`.
const PG_DESC: &str = "default_pg";

/// The whole file.
#[derive(Serialize)]
struct TorchDump<'a> {
    version: &'static str,
    pg_config: BTreeMap<&'a str, PgConfig<'a>>,
    comm_lib_version: &'static str,
    /// An empty dictionary: ccl keeps no per-group status beside the entries.
    pg_status: BTreeMap<&'a str, ()>,
    entries: Vec<TorchEntry<'a>>,
    /// Who wrote it, beyond what PyTorch's format holds.
    ccl: Writer<'a>,
}

#[derive(Serialize)]
struct PgConfig<'a> {
    name: &'a str,
    desc: &'static str,
    /// The string of a Python list, as PyTorch writes it.
    ranks: String,
}

#[derive(Serialize)]
struct Writer<'a> {
    rank: usize,
    host: &'a str,
    pid: u32,
    reason: &'a str,
}

/// One entry as PyTorch writes it. `record_id` numbers the entries (here the operation's
/// sequence number, the same on every rank, so the analyser lines the ranks' rings up on it).
#[derive(Serialize)]
struct TorchEntry<'a> {
    record_id: i64,
    pg_id: i64,
    process_group: (&'a str, &'static str),
    collective_seq_id: i64,
    p2p_seq_id: i64,
    op_id: i64,
    profiling_name: String,
    time_created_ns: i64,
    input_sizes: Vec<Vec<i64>>,
    input_dtypes: Vec<&'a str>,
    output_sizes: Vec<Vec<i64>>,
    output_dtypes: Vec<&'a str>,
    state: &'static str,
    time_discovered_started_ns: i64,
    time_discovered_completed_ns: Option<i64>,
    retired: bool,
    timeout_ms: i64,
    is_p2p: bool,
    frames: Vec<()>,
}

/// PyTorch's name of a ccl element type (`c10::toString(ScalarType)`).
fn torch_dtype(name: &str) -> &str {
    match name {
        "int8" => "Char",
        "uint8" => "Byte",
        "int32" => "Int",
        "uint32" => "UInt32",
        "int64" => "Long",
        "uint64" => "UInt64",
        "half" => "Half",
        "float" => "Float",
        "double" => "Double",
        "bfloat16" => "BFloat16",
        other => other,
    }
}

/// PyTorch's name of a collective and the shapes of its input and output for NCCL's count
/// (those of `dist.all_reduce`, `dist.all_gather_into_tensor`, ...), or `None` for what the
/// analyser cannot match (point-to-point groups).
fn torch_op(e: &Op, n: i64) -> Option<(&'static str, i64, i64)> {
    let c = e.count as i64;
    Some(match e.name.as_str() {
        "allreduce" => ("all_reduce", c, c),
        "broadcast" => ("broadcast", c, c),
        "reduce" => ("reduce", c, c),
        "allgather" => ("_all_gather_base", c, c * n),
        "reducescatter" => ("_reduce_scatter_base", c * n, c),
        "alltoall" => ("all_to_all_single", c * n, c * n),
        "barrier" => ("barrier", 0, 0),
        "gather" => ("gather", c, c * n),
        "scatter" => ("scatter", c * n, c),
        // The count of these is a fingerprint of the counts, not a size: both sides 0.
        "allgatherv" => ("all_gather_v", 0, 0),
        "reducescatterv" => ("reduce_scatter_v", 0, 0),
        "alltoallv" => ("all_to_all_v_single", 0, 0),
        _ => return None,
    })
}

fn entry<'a>(e: &'a Op, size: usize, pg: &'a str) -> Option<TorchEntry<'a>> {
    let (name, input, output) = torch_op(e, size as i64)?;
    // A failed operation never completed: to the analyser it stays started, like a collective
    // NCCL's watchdog timed out.
    let state = match e.state {
        State::Done => "completed",
        State::Running | State::Failed => "started",
    };
    let ns = |us: u64| (us as i64).saturating_mul(1000);
    let seq = e.seq as i64;
    Some(TorchEntry {
        record_id: seq,
        pg_id: 0,
        process_group: (pg, PG_DESC),
        collective_seq_id: seq,
        p2p_seq_id: 0,
        op_id: seq,
        profiling_name: format!("{BACKEND}:{name}"),
        time_created_ns: ns(e.start_us),
        input_sizes: vec![vec![input]],
        input_dtypes: vec![torch_dtype(&e.dtype)],
        output_sizes: vec![vec![output]],
        output_dtypes: vec![torch_dtype(&e.dtype)],
        state,
        time_discovered_started_ns: ns(e.start_us),
        time_discovered_completed_ns: (e.state == State::Done).then(|| ns(e.end_us)),
        retired: e.state != State::Running,
        timeout_ms: 0,
        is_p2p: false,
        frames: Vec::new(),
    })
}

/// `d` in PyTorch's format, pickled: one process group, the communicator, named by its id.
pub fn pickle(d: &Dump) -> Vec<u8> {
    let pg = d.meta.comm.as_str();
    let ranks: Vec<String> = (0..d.meta.size).map(|r| r.to_string()).collect();
    let file = TorchDump {
        version: VERSION,
        pg_config: BTreeMap::from([(
            pg,
            PgConfig {
                name: pg,
                desc: PG_DESC,
                ranks: format!("[{}]", ranks.join(", ")),
            },
        )]),
        comm_lib_version: concat!("ccl ", env!("CARGO_PKG_VERSION")),
        pg_status: BTreeMap::new(),
        entries: d
            .entries
            .iter()
            .filter_map(|e| entry(e, d.meta.size, pg))
            .collect(),
        ccl: Writer {
            rank: d.meta.rank,
            host: &d.meta.host,
            pid: d.meta.pid,
            reason: &d.meta.reason,
        },
    };
    serde_pickle::to_vec(&file, serde_pickle::SerOptions::new().proto_v2())
        .expect("the dump is plain data")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dump::Meta;
    use crate::recorder::{Begin, Recorder};
    use serde_json::{Value, json};

    #[test]
    fn entries_carry_what_the_analyser_matches_on() {
        let mut r = Recorder::new(4);
        for (seq, name) in [(1, "allreduce"), (2, "allgather"), (3, "sendrecv")] {
            r.begin(Begin::test(seq, name), std::iter::empty());
            if seq == 1 {
                r.end(None);
            }
        }
        let meta = Meta {
            comm: "c0".into(),
            rank: 1,
            size: 4,
            host: "h".into(),
            pid: 7,
            reason: "test".into(),
        };
        let bytes = pickle(&Dump::of(&r, &meta));
        // Protocol 2, as every Python 3 reads it.
        assert_eq!(&bytes[..2], &[0x80, 2]);
        let top: Value = serde_pickle::from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
        assert_eq!(top["version"], json!("2.10"));
        assert_eq!(top["pg_config"]["c0"]["ranks"], json!("[0, 1, 2, 3]"));
        assert_eq!(top["pg_status"], json!({}));
        assert_eq!(top["ccl"]["pid"], json!(7));
        // The point-to-point group is left out.
        let entries = top["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 2);
        let second = &entries[1];
        assert_eq!(second["profiling_name"], json!("c10d:_all_gather_base"));
        assert_eq!(second["state"], json!("started"));
        assert_eq!(second["collective_seq_id"], json!(2));
        assert_eq!(second["output_sizes"], json!([[16]]));
        assert_eq!(second["input_dtypes"], json!(["Float"]));
        assert_eq!(second["process_group"], json!(["c0", "default_pg"]));
        assert_eq!(second["time_discovered_completed_ns"], Value::Null);
        assert_eq!(entries[0]["state"], json!("completed"));
    }
}
