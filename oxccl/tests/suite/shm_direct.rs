//! Registered buffers over shared memory (`Communicator::alloc` from the ranks' shared
//! arenas): allreduce reads every rank's input and writes every rank's output in place, at
//! every size, in and out of place; ranks that mix shared and plain buffers fail clearly, all of
//! them; allocations beyond the arena or the host's memory fail naming the size and the setting.

use crate::common;

use std::time::Duration;

use ccl_core::config::TransportKind;
use ccl_core::test_values::{CheckValue, count_wrong};
use common::*;
use oxccl::{Communicator, ErrorKind, ReduceOp};

fn cfg() -> oxccl::Config {
    config(TransportKind::Shm, Duration::from_secs(60))
}

/// One allreduce on buffers from `alloc`; returns the number of wrong elements.
fn registered_case<T: CheckValue>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    in_place: bool,
) -> usize {
    let r = comm.rank();
    let mut send = comm.alloc::<T>(count).unwrap();
    for (i, x) in send.iter_mut().enumerate() {
        *x = T::from_i64(input(op, r, i));
    }
    assert!(send.is_shared(), "alloc over shm gives shared memory");
    let fail = |e: oxccl::Error| panic!("rank {r}: {} count {count} {op}: {e}", T::DTYPE);
    if in_place {
        comm.all_reduce_in_place(&mut send, op).unwrap_or_else(fail);
        count_wrong(&send, op, comm.size())
    } else {
        let mut recv = comm.alloc::<T>(count).unwrap();
        recv.fill(T::from_i64(99));
        comm.all_reduce(&send, &mut recv, op).unwrap_or_else(fail);
        count_wrong(&recv, op, comm.size())
    }
}

/// Counts small (staged: the cost model prefers one barrier) and large (direct), odd ones that
/// split unevenly among the ranks, and one above the host slot (no chunks on the direct path).
const COUNTS: [usize; 6] = [1, 7, 1023, 70_001, 262_147, (3 << 20) + 1];

#[test]
fn registered_allreduce_over_shm_reads_in_place() {
    for n in 2..=4 {
        let wrong: Vec<String> = run_ranks(n, cfg(), |comm| {
            let mut w = Vec::new();
            for &c in &COUNTS {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    for in_place in [false, true] {
                        let bad = registered_case::<f32>(&comm, c, op, in_place)
                            + registered_case::<i32>(&comm, c, op, in_place);
                        if bad > 0 {
                            w.push(format!(
                                "rank {} count {c} {op} in_place={in_place}: {bad} wrong",
                                comm.rank()
                            ));
                        }
                    }
                }
            }
            // Some calls took the direct path: the trace names it.
            assert!(
                comm.trace_json().contains("shm-direct"),
                "no allreduce read the buffers in place"
            );
            assert_eq!(comm.registered_bytes(), (0, 0));
            w
        })
        .into_iter()
        .flatten()
        .collect();
        assert!(wrong.is_empty(), "{n} ranks:\n{}", wrong.join("\n"));
    }
}

/// Ranks that differ in placement (some in place, some not) and buffers at different offsets
/// of their arenas (allocated in different orders, some freed before).
#[test]
fn ranks_that_differ_in_placement_and_allocation_order() {
    let wrong: Vec<usize> = run_ranks(3, cfg(), |comm| {
        let (r, c, op) = (comm.rank(), 100_003, ReduceOp::Sum);
        let pads: Vec<_> = (0..r)
            .map(|k| comm.alloc::<u8>(4096 * (k + 1)).unwrap())
            .collect();
        let mut buf = comm.alloc::<f64>(c).unwrap();
        for (i, x) in buf.iter_mut().enumerate() {
            *x = f64::from_i64(input(op, r, i));
        }
        drop(pads);
        let mut bad = 0;
        for round in 0..4 {
            if r % 2 == 1 {
                let mut send = comm.alloc::<f64>(c).unwrap();
                send.copy_from_slice(&buf);
                comm.all_reduce(&send, &mut buf, op).unwrap();
            } else {
                comm.all_reduce_in_place(&mut buf, op).unwrap();
            }
            // Every round sums n copies of the last result: n^(round+1) times the inputs' sum.
            let scale = 3f64.powi(round);
            bad += buf
                .iter()
                .enumerate()
                .filter(|&(i, &x)| x != scale * ccl_core::test_values::expected::<f64>(op, 3, i))
                .count();
        }
        bad
    });
    assert_eq!(wrong, vec![0; 3]);
}

/// One rank with a plain buffer, the others with shared ones: every rank fails, none hangs or
/// reads a plain buffer as shared. Where the plain rank runs `shm` too the ranks meet in host
/// memory and the error says what differs; where it runs an algorithm over the connections,
/// the direct ranks' fingerprints and its headers disagree. Which one a size takes is the cost
/// model's call and depends on the CPUs: with 3 ranks on 2 CPUs, 16 KiB and 4 MiB run `shm` on
/// plain buffers and 64 KiB the tree (`cost::host_direct_allreduce`, `cost::host_allreduce_of`).
#[test]
fn mixed_shared_and_plain_ranks_fail_clearly_on_every_rank() {
    for c in [4096, 16384, 1 << 20] {
        let errs: Vec<String> = run_ranks(3, cfg(), move |comm| {
            let r = comm.rank();
            let e = if r == 1 {
                let mut v = vec![1f32; c];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
            } else {
                let mut b = comm.alloc::<f32>(c).unwrap();
                comm.all_reduce_in_place(&mut b, ReduceOp::Sum)
            };
            e.expect_err("a mixed call must fail").to_string()
        });
        for (r, e) in errs.iter().enumerate() {
            assert!(
                e.contains("Communicator::alloc") || e.contains("mismatched calls"),
                "count {c}, rank {r}: {e}"
            );
            assert!(
                e.contains("peer "),
                "count {c}, rank {r} names no peer: {e}"
            );
        }
    }
}

#[test]
fn alloc_beyond_the_arena_or_memory_is_a_clear_error() {
    let mut c = cfg();
    c.shm_arena_bytes = 8 << 20;
    let out: Vec<(String, String, bool)> = run_ranks(2, c, |comm| {
        let a = comm.alloc::<u8>(4 << 20).unwrap();
        let beyond = comm.alloc::<u8>(6 << 20).unwrap_err();
        assert_eq!(beyond.kind(), ErrorKind::InvalidUsage);
        drop(a);
        // The range came back: the same size fits again.
        let again = comm.alloc::<u8>(6 << 20).is_ok();
        (beyond.to_string(), String::new(), again)
    });
    for (e, _, again) in &out {
        assert!(
            e.contains("CCL_SHM_ARENA_BYTES") && e.contains("6 MiB"),
            "{e}"
        );
        assert!(again);
    }
    let mut c = cfg();
    c.shm_arena_bytes = 1 << 42;
    let out: Vec<String> = run_ranks(2, c, |comm| {
        comm.alloc::<u8>(1 << 41).unwrap_err().to_string()
    });
    for e in &out {
        assert!(e.contains("MemAvailable") && e.contains("2 TiB"), "{e}");
    }
}

#[test]
fn arena_off_gives_private_memory_that_still_works() {
    let mut c = cfg();
    c.shm_arena_bytes = 0;
    let wrong: Vec<usize> = run_ranks(2, c, |comm| {
        let b = comm.alloc::<f32>(8).unwrap();
        assert!(!b.is_shared());
        drop(b);
        registered_case_private(&comm)
    });
    assert_eq!(wrong, vec![0, 0]);
}

fn registered_case_private(comm: &Communicator) -> usize {
    let (r, c, op) = (comm.rank(), 300_001, ReduceOp::Sum);
    let mut b = comm.alloc::<f32>(c).unwrap();
    for (i, x) in b.iter_mut().enumerate() {
        *x = f32::from_i64(input(op, r, i));
    }
    comm.all_reduce_in_place(&mut b, op).unwrap();
    count_wrong(&b, op, comm.size())
}

/// Allgather, broadcast and reduce-scatter on buffers from `alloc` give what they give on plain
/// buffers, in and out of place, at sizes where the direct schedules run.
#[test]
fn registered_allgather_broadcast_reduce_scatter_over_shm() {
    use oxccl::Collective;
    for n in [2, 3, 4] {
        let wrong: Vec<String> = run_ranks(n, cfg(), |comm| {
            let (r, n) = (comm.rank(), comm.size());
            let mut w = Vec::new();
            for coll in [
                Collective::AllGather,
                Collective::Broadcast,
                Collective::ReduceScatter,
            ] {
                for c in [1, 1001, 300_007] {
                    for in_place in [false, true] {
                        let lens = coll.buffer_lens(c, n).unwrap();
                        let input: Vec<f32> = (0..lens.send)
                            .map(|i| f32::from_i64(input(ReduceOp::Sum, r, i)))
                            .collect();
                        let len = if in_place { lens.in_place() } else { lens.recv };
                        let mut plain = vec![-1f32; len];
                        let mut shared = comm.alloc::<f32>(len).unwrap();
                        shared.fill(-1.0);
                        let mut send = comm.alloc::<f32>(lens.send).unwrap();
                        send.copy_from_slice(&input);
                        let root = n - 1;
                        if in_place {
                            let at = if coll == Collective::AllGather {
                                r * c
                            } else {
                                0
                            };
                            plain[at..at + lens.send].copy_from_slice(&input);
                            shared[at..at + lens.send].copy_from_slice(&input);
                            comm.collective(coll, None, &mut plain, ReduceOp::Sum, root)
                                .unwrap();
                            comm.collective(coll, None, &mut shared, ReduceOp::Sum, root)
                                .unwrap();
                        } else {
                            comm.collective(coll, Some(&input), &mut plain, ReduceOp::Sum, root)
                                .unwrap();
                            comm.collective(coll, Some(&send), &mut shared, ReduceOp::Sum, root)
                                .unwrap();
                        }
                        if plain[..] != shared[..] {
                            w.push(format!("rank {r} {coll} count {c} in_place={in_place}"));
                        }
                    }
                }
            }
            assert!(comm.trace_json().contains("shm-direct"));
            w
        })
        .into_iter()
        .flatten()
        .collect();
        assert!(wrong.is_empty(), "{n} ranks:\n{}", wrong.join("\n"));
    }
}
