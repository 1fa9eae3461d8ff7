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
//! Point-to-point groups are left out: PyTorch records each send and receive as its own entry
//! matched by sizes, ccl records a group as one operation with bytes per peer.

use crate::trace::{Entry, Meta, Recorder, State};

/// Matches the dumps of torch 2.10 and later (`version_val` in `FlightRecorder.hpp`).
pub const VERSION: &str = "2.10";

/// The backend named in `profiling_name` (one the analyser knows, so it does not warn on
/// every entry): ccl stands in for the process group's backend.
const BACKEND: &str = "c10d";

/// A Python value, as much of it as the dump needs.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Keys in the order written.
    Dict(Vec<(Value, Value)>),
}

fn s(v: &str) -> Value {
    Value::Str(v.to_string())
}

fn dict(items: Vec<(&str, Value)>) -> Value {
    Value::Dict(items.into_iter().map(|(k, v)| (s(k), v)).collect())
}

/// Pickle protocol 2 of `v` (what `pickle.load` reads in every Python 3).
pub fn pickle(v: &Value) -> Vec<u8> {
    let mut out = vec![0x80, 2];
    put(&mut out, v);
    out.push(b'.');
    out
}

fn put(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::None => out.push(b'N'),
        Value::Bool(true) => out.push(0x88),
        Value::Bool(false) => out.push(0x89),
        Value::Int(i) => match i32::try_from(*i) {
            Ok(small) => {
                out.push(b'J');
                out.extend_from_slice(&small.to_le_bytes());
            }
            Err(_) => {
                // LONG1: length, then two's complement little-endian.
                out.extend_from_slice(&[0x8a, 8]);
                out.extend_from_slice(&i.to_le_bytes());
            }
        },
        Value::Str(t) => {
            out.push(b'X');
            out.extend_from_slice(&(t.len() as u32).to_le_bytes());
            out.extend_from_slice(t.as_bytes());
        }
        Value::List(items) => {
            out.push(b']');
            if !items.is_empty() {
                out.push(b'(');
                items.iter().for_each(|i| put(out, i));
                out.push(b'e');
            }
        }
        Value::Tuple(items) => {
            out.push(b'(');
            items.iter().for_each(|i| put(out, i));
            out.push(b't');
        }
        Value::Dict(items) => {
            out.push(b'}');
            if !items.is_empty() {
                out.push(b'(');
                for (k, v) in items {
                    put(out, k);
                    put(out, v);
                }
                out.push(b'u');
            }
        }
    }
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
fn torch_op(e: &Entry, n: i64) -> Option<(&'static str, i64, i64)> {
    let c = e.count as i64;
    Some(match e.name {
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

/// One entry as PyTorch writes it. `record` numbers the entries (here the operation's sequence
/// number, the same on every rank, so the analyser lines the ranks' rings up on it).
fn entry(e: &Entry, meta: &Meta, pg: &str) -> Option<Value> {
    let (name, input, output) = torch_op(e, meta.size as i64)?;
    let dtype = || Value::List(vec![s(torch_dtype(e.dtype))]);
    let shape = |n: i64| Value::List(vec![Value::List(vec![Value::Int(n)])]);
    // A failed operation never completed: to the analyser it stays started, like a collective
    // NCCL's watchdog timed out.
    let state = match e.state {
        State::Done => "completed",
        State::Running | State::Failed => "started",
    };
    let ns = |us: u64| Value::Int((us as i64).saturating_mul(1000));
    let seq = e.seq as i64;
    Some(dict(vec![
        ("record_id", Value::Int(seq)),
        ("pg_id", Value::Int(0)),
        ("process_group", Value::Tuple(vec![s(pg), s("default_pg")])),
        ("collective_seq_id", Value::Int(seq)),
        ("p2p_seq_id", Value::Int(0)),
        ("op_id", Value::Int(seq)),
        ("profiling_name", s(&format!("{BACKEND}:{name}"))),
        ("time_created_ns", ns(e.start_us)),
        ("input_sizes", shape(input)),
        ("input_dtypes", dtype()),
        ("output_sizes", shape(output)),
        ("output_dtypes", dtype()),
        ("state", s(state)),
        ("time_discovered_started_ns", ns(e.start_us)),
        (
            "time_discovered_completed_ns",
            if e.state == State::Done {
                ns(e.end_us)
            } else {
                Value::None
            },
        ),
        ("retired", Value::Bool(e.state != State::Running)),
        ("timeout_ms", Value::Int(0)),
        ("is_p2p", Value::Bool(false)),
        ("frames", Value::List(Vec::new())),
    ]))
}

/// The dump of `rec` in PyTorch's format: one process group, the communicator, named by its id.
pub fn dump(rec: &Recorder, meta: &Meta) -> Value {
    let pg = &meta.comm;
    let ranks: Vec<String> = (0..meta.size).map(|r| r.to_string()).collect();
    let pg_config = Value::Dict(vec![(
        s(pg),
        dict(vec![
            ("name", s(pg)),
            ("desc", s("default_pg")),
            ("ranks", s(&format!("[{}]", ranks.join(", ")))),
        ]),
    )]);
    let entries = rec.entries().filter_map(|e| entry(e, meta, pg)).collect();
    dict(vec![
        ("version", s(VERSION)),
        ("pg_config", pg_config),
        (
            "comm_lib_version",
            s(concat!("ccl ", env!("CARGO_PKG_VERSION"))),
        ),
        ("pg_status", Value::Dict(Vec::new())),
        ("entries", Value::List(entries)),
        (
            "ccl",
            dict(vec![
                ("rank", Value::Int(meta.rank as i64)),
                ("host", s(&meta.host)),
                ("pid", Value::Int(i64::from(meta.pid))),
                ("reason", s(&meta.reason)),
            ]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Begin;

    #[test]
    fn pickle_opcodes_are_protocol_2() {
        let v = dict(vec![
            ("a", Value::List(vec![Value::Int(1), Value::Int(-2)])),
            ("b", Value::Tuple(vec![Value::None, Value::Bool(true)])),
            ("c", Value::Int(1 << 40)),
            ("d", Value::List(Vec::new())),
        ]);
        let p = pickle(&v);
        let mut want = vec![0x80, 2, b'}', b'('];
        want.extend([b'X', 1, 0, 0, 0, b'a', b']', b'(']);
        want.extend([b'J', 1, 0, 0, 0, b'J', 0xfe, 0xff, 0xff, 0xff, b'e']);
        want.extend([b'X', 1, 0, 0, 0, b'b', b'(', b'N', 0x88, b't']);
        want.extend([b'X', 1, 0, 0, 0, b'c', 0x8a, 8]);
        want.extend((1i64 << 40).to_le_bytes());
        want.extend([b'X', 1, 0, 0, 0, b'd', b']', b'u', b'.']);
        assert_eq!(p, want);
    }

    #[test]
    fn entries_carry_what_the_analyser_matches_on() {
        let mut r = Recorder::new(4);
        for (seq, name) in [(1, "allreduce"), (2, "allgather")] {
            r.begin(
                Begin {
                    seq,
                    name,
                    algo: "ring",
                    dtype: "float",
                    op: "sum",
                    count: 8,
                    bytes: 32,
                    root: None,
                },
                std::iter::empty(),
            );
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
        let Value::Dict(top) = dump(&r, &meta) else {
            panic!("not a dict")
        };
        let get = |items: &[(Value, Value)], k: &str| {
            items
                .iter()
                .find(|(key, _)| *key == s(k))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k}"))
        };
        assert_eq!(get(&top, "version"), s("2.10"));
        let Value::Dict(pgs) = get(&top, "pg_config") else {
            panic!()
        };
        let Value::Dict(pg) = get(&pgs, "c0") else {
            panic!()
        };
        assert_eq!(get(&pg, "ranks"), s("[0, 1, 2, 3]"));
        let Value::List(entries) = get(&top, "entries") else {
            panic!()
        };
        let Value::Dict(second) = &entries[1] else {
            panic!()
        };
        assert_eq!(get(second, "profiling_name"), s("c10d:_all_gather_base"));
        assert_eq!(get(second, "state"), s("started"));
        assert_eq!(get(second, "collective_seq_id"), Value::Int(2));
        assert_eq!(
            get(second, "output_sizes"),
            Value::List(vec![Value::List(vec![Value::Int(32)])])
        );
        let Value::Dict(first) = &entries[0] else {
            panic!()
        };
        assert_eq!(get(first, "state"), s("completed"));
    }
}
