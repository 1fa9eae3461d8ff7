//! The same call again: a small operation in host memory that repeats the last one goes
//! straight to the executor with what the first call worked out (`Engine`'s prepared call).
//! Whatever changes between calls (type, operator, count, placement, buffer lengths, root, the
//! algorithm forced) must be seen: each change gets its own result or its own error.

use crate::common;

use std::time::Duration;

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Algo, Collective, Communicator, DataType, ErrorKind, ReduceOp};

fn cfg() -> oxccl::Config {
    config(TransportKind::Shm, Duration::from_secs(60))
}

/// The algorithm the flight recorder says the last operation ran.
fn last_algo(comm: &Communicator) -> String {
    let v: serde_json::Value = serde_json::from_str(&comm.trace_json()).unwrap();
    let e = v["entries"].as_array().unwrap();
    e.last().unwrap()["algo"].as_str().unwrap().to_string()
}

/// `count` elements of rank `r`'s input.
fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| (r * 1000 + i % 97) as f32).collect()
}

/// What `op` of every rank's [`input`] gives.
fn expected(n: usize, count: usize, op: ReduceOp) -> Vec<f32> {
    (0..count)
        .map(|i| {
            let v = (0..n).map(|r| (r * 1000 + i % 97) as f32);
            match op {
                ReduceOp::Sum => v.sum(),
                ReduceOp::Max => v.fold(f32::MIN, f32::max),
                ReduceOp::Min => v.fold(f32::MAX, f32::min),
                _ => unreachable!("not used here"),
            }
        })
        .collect()
}

#[test]
fn repeated_calls_see_every_change_of_their_arguments() {
    for n in [2, 3] {
        run_ranks(n, cfg(), move |comm| {
            let r = comm.rank();
            let check = |count: usize, op: ReduceOp, in_place: bool| {
                let send = input(r, count);
                let mut recv = vec![-1.0f32; count];
                // Three times each: the first call prepares, the others run prepared.
                for k in 0..3 {
                    if in_place {
                        recv.copy_from_slice(&send);
                        comm.all_reduce_in_place(&mut recv, op).unwrap();
                    } else {
                        recv.fill(-1.0);
                        comm.all_reduce(&send, &mut recv, op).unwrap();
                    }
                    assert_eq!(
                        recv,
                        expected(n, count, op),
                        "rank {r}: count {count} {op} in place {in_place}, call {k}"
                    );
                }
            };
            check(100, ReduceOp::Sum, false);
            check(100, ReduceOp::Max, false);
            check(100, ReduceOp::Sum, true);
            check(101, ReduceOp::Sum, true);
            check(100, ReduceOp::Min, false);
            assert_eq!(last_algo(&comm), "shm", "rank {r}");

            // The same element size, another type: integer results.
            for _ in 0..3 {
                let send: Vec<i32> = vec![r as i32 + 1; 100];
                let mut recv = vec![0i32; 100];
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                assert_eq!(recv, vec![(n * (n + 1) / 2) as i32; 100], "rank {r}");
                let mut bytes = vec![0u8; 400];
                comm.all_reduce_bytes(
                    Some(bytemuck::cast_slice(&send)),
                    &mut bytes,
                    100,
                    DataType::U32,
                    ReduceOp::Max,
                )
                .unwrap();
                let got: &[u32] = bytemuck::cast_slice(&bytes);
                assert_eq!(got, vec![n as u32; 100], "rank {r}");
            }

            // Buffers of the wrong length after the right ones: still an error naming them,
            // and the communicator still works.
            let send = input(r, 100);
            let mut recv = vec![0.0f32; 100];
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            let mut short = vec![0.0f32; 99];
            let e = comm
                .all_reduce(&send, &mut short, ReduceOp::Sum)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("99"), "{e}");
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            let mut bytes = vec![0u8; 400];
            let e = comm
                .all_reduce_bytes(
                    Some(&bytemuck::cast_slice::<f32, u8>(&send)[..396]),
                    &mut bytes,
                    100,
                    DataType::F32,
                    ReduceOp::Sum,
                )
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(e.to_string().contains("396"), "{e}");
            assert!(comm.error().is_none());
            check(100, ReduceOp::Sum, false);

            // A root that changes between calls.
            for root in [0, n - 1, 0, 1] {
                let mut buf = vec![r as f32; 50];
                comm.broadcast_in_place(&mut buf, root).unwrap();
                assert_eq!(
                    buf,
                    vec![root as f32; 50],
                    "rank {r}: broadcast from {root}"
                );
            }

            // An algorithm forced between two calls alike runs from the second on, and lifting
            // it brings the host-memory schedule back.
            check(100, ReduceOp::Sum, false);
            comm.set_algorithm(Collective::AllReduce, Some(Algo::Ring))
                .unwrap();
            check(100, ReduceOp::Sum, false);
            assert_eq!(last_algo(&comm), "ring", "rank {r}");
            comm.set_algorithm(Collective::AllReduce, None).unwrap();
            check(100, ReduceOp::Sum, false);
            assert_eq!(last_algo(&comm), "shm", "rank {r}");
        });
    }
}

#[test]
fn a_mismatch_after_repeated_calls_fails_on_every_rank() {
    let res = run_ranks(2, cfg(), |comm| {
        let r = comm.rank();
        let mut x = vec![1.0f32; 64];
        for _ in 0..5 {
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        // Rank 1 changes the count; rank 0 repeats its call.
        let mut y = vec![1.0f32; if r == 0 { 64 } else { 65 }];
        comm.all_reduce_in_place(&mut y, ReduceOp::Sum)
    });
    // A rank fails on its own look at the other's call, or first hears of the other's failure
    // (a remote error that carries it).
    for (r, out) in res.iter().enumerate() {
        let e = out.as_ref().unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::InvalidUsage | ErrorKind::Remote),
            "rank {r}: {e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("mismatched calls") && m.contains("64 x float") && m.contains("65 x float"),
            "rank {r}: {m}"
        );
    }
}

#[test]
fn a_measured_allreduce_choice_is_right_throughout_and_the_same_on_every_rank() {
    // Counts in three measured size classes (1.2 KiB, 20 KiB, 280 KiB of f32): each class's
    // first calls go round the candidates, then every rank takes the one the ranks' summed
    // times pick. A rank that chose differently from another would get a wrong sum or stall.
    let trials = 4 * 9;
    for n in [2, 3] {
        let out = run_ranks(n, cfg(), move |comm| {
            let r = comm.rank();
            let mut seen = Vec::new();
            for count in [300usize, 5000, 70000] {
                let send = input(r, count);
                let mut algos = std::collections::BTreeSet::new();
                for k in 0..trials + 4 {
                    let mut recv = vec![0f32; count];
                    comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                    assert_eq!(
                        recv,
                        expected(n, count, ReduceOp::Sum),
                        "count {count} call {k}"
                    );
                    let a = last_algo(&comm);
                    seen.push(a.clone());
                    if k < trials {
                        algos.insert(a);
                    }
                }
                assert!(algos.len() >= 2, "the trials ran {algos:?}");
                seen.push(format!(
                    "{}",
                    comm.algorithm(Collective::AllReduce, count * 4)
                ));
            }
            seen
        });
        for (r, o) in out.iter().enumerate() {
            assert_eq!(o, &out[0], "rank {r} of {n} chose differently from rank 0");
        }
    }
}
