//! Allreduce correctness with ranks as threads: world sizes 1..=8, counts {0, 1, 7, 1023, 1M+3},
//! every dtype and op, in place and out of place, over the in-process and TCP transports, with
//! exact expected values. Both algorithms are forced in turn for the small counts.

use crate::common;

use std::time::Duration;

use ccl_core::config::TransportKind;
use common::*;
use oxccl::ReduceOp;

const COUNTS: [usize; 5] = [0, 1, 7, 1023, (1 << 20) + 3];

fn sweep(transport: TransportKind, sizes: std::ops::RangeInclusive<usize>) {
    sweep_algos(transport, sizes, &[None, Some("ring"), Some("rd")]);
}

fn sweep_algos(
    transport: TransportKind,
    sizes: std::ops::RangeInclusive<usize>,
    algos: &[Option<&'static str>],
) {
    for n in sizes {
        for &algo in algos {
            let mut cfg = config(transport, Duration::from_secs(120));
            cfg.algo = algo.map(String::from);
            let results = run_ranks(n, cfg, move |comm| {
                let mut wrong = Vec::new();
                for count in COUNTS {
                    // The forced algorithms run the small counts; automatic choice runs all.
                    if algo.is_some() && count > 1023 {
                        continue;
                    }
                    for op in ReduceOp::ARITHMETIC {
                        for in_place in [false, true] {
                            for (dtype, w) in all_dtypes(&comm, count, op, in_place) {
                                if w > 0 {
                                    wrong.push(format!(
                                        "rank {} count {count} {dtype} {op} in_place={in_place} algo={algo:?}: {w} wrong",
                                        comm.rank()
                                    ));
                                }
                            }
                        }
                    }
                }
                wrong
            });
            let wrong: Vec<String> = results.into_iter().flatten().collect();
            assert!(
                wrong.is_empty(),
                "{} over {transport:?}, {n} ranks:\n{}",
                wrong.len(),
                wrong.join("\n")
            );
        }
    }
}

#[test]
fn local_transport_world_sizes_1_to_8() {
    sweep(TransportKind::Local, 1..=8);
}

#[test]
fn tcp_transport_world_sizes_1_to_8() {
    sweep(TransportKind::Tcp, 1..=8);
}

#[test]
fn shm_transport_world_sizes_1_to_8() {
    sweep(TransportKind::Shm, 1..=8);
}

/// The host-memory algorithm forced at every small count, so that its one-pass reduction of the
/// slots (the executor fuses a copy out of one slot with the reduction of the next) meets every
/// dtype and op, beyond the few counts the cost model gives it.
#[test]
fn shm_algorithm_forced_world_sizes_2_to_4() {
    sweep_algos(TransportKind::Shm, 2..=4, &[Some("shm")]);
}
