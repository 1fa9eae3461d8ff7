//! Every collective x algorithm with ranks as threads: world sizes 1..=8, counts {0, 1, 7, 1023},
//! every dtype and op where it applies, in place and out of place, over the in-process and TCP
//! transports, against closed-form results.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccl_core::config::TransportKind;
use ccl_core::dispatch_dtype;
use ccl_core::test_values::{self, CheckValue};
use common::*;
use oxccl::{Collective, Communicator, DataType, ReduceOp};

const COUNTS: [usize; 4] = [0, 1, 7, 1023];

fn vals<T: CheckValue>(op: ReduceOp, r: usize, len: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_i64(test_values::input(op, r, i)))
        .collect()
}

fn poison<T: CheckValue>(len: usize) -> Vec<T> {
    vec![T::from_i64(99); len]
}

fn mismatches<T: CheckValue>(got: &[T], want: impl Fn(usize) -> T) -> usize {
    got.iter()
        .enumerate()
        .filter(|(i, v)| bytemuck::bytes_of(*v) != bytemuck::bytes_of(&want(*i)))
        .count()
}

/// Runs one call of `coll` and returns how many elements are wrong.
// Long: one match over every collective, each arm giving its buffers their closed-form inputs
// and checking its own expected output; the arms share the rank, size and counts above them.
fn case<T: CheckValue>(
    comm: &Communicator,
    coll: Collective,
    c: usize,
    op: ReduceOp,
    in_place: bool,
    root: usize,
) -> usize {
    let (r, n) = (comm.rank(), comm.size());
    let fail = |e: oxccl::Error| {
        panic!(
            "rank {r}: {coll} {} count {c} {op} in_place={in_place}: {e}",
            T::DTYPE
        )
    };
    match coll {
        Collective::Broadcast => {
            let want = |i: usize| T::from_i64(test_values::input(ReduceOp::Sum, root, i));
            let mine = vals::<T>(ReduceOp::Sum, r, c);
            let out = if in_place {
                let mut b = mine;
                comm.broadcast_in_place(&mut b, root).unwrap_or_else(fail);
                b
            } else {
                let mut b = poison(c);
                comm.broadcast(&mine, &mut b, root).unwrap_or_else(fail);
                b
            };
            mismatches(&out, want)
        }
        Collective::Reduce => {
            let mine = vals::<T>(op, r, c);
            let out = if in_place {
                let mut b = mine.clone();
                comm.reduce_in_place(&mut b, op, root).unwrap_or_else(fail);
                b
            } else {
                let mut b = poison(c);
                comm.reduce(&mine, &mut b, op, root).unwrap_or_else(fail);
                b
            };
            if r == root {
                mismatches(&out, |i| test_values::expected::<T>(op, n, i))
            } else if in_place {
                // Non-root buffers are left alone.
                mismatches(&out, |i| mine[i])
            } else {
                mismatches(&out, |_| T::from_i64(99))
            }
        }
        Collective::AllGather => {
            let want = |j: usize| {
                T::from_i64(test_values::input(
                    ReduceOp::Sum,
                    j / c.max(1),
                    j % c.max(1),
                ))
            };
            let out = if in_place {
                let mut b = poison::<T>(c * n);
                b[r * c..(r + 1) * c].copy_from_slice(&vals::<T>(ReduceOp::Sum, r, c));
                comm.all_gather_in_place(&mut b).unwrap_or_else(fail);
                b
            } else {
                let mut b = poison(c * n);
                comm.all_gather(&vals::<T>(ReduceOp::Sum, r, c), &mut b)
                    .unwrap_or_else(fail);
                b
            };
            mismatches(&out, want)
        }
        Collective::ReduceScatter => {
            let input = vals::<T>(op, r, c * n);
            if in_place {
                let mut b = input.clone();
                comm.reduce_scatter_in_place(&mut b, op)
                    .unwrap_or_else(fail);
                mismatches(&b, |j| {
                    if j / c.max(1) == r {
                        test_values::expected::<T>(op, n, j)
                    } else {
                        input[j]
                    }
                })
            } else {
                let mut b = poison(c);
                comm.reduce_scatter(&input, &mut b, op).unwrap_or_else(fail);
                mismatches(&b, |i| test_values::expected::<T>(op, n, r * c + i))
            }
        }
        Collective::AllToAll => {
            let input = vals::<T>(ReduceOp::Sum, r, c * n);
            let want = |j: usize| {
                T::from_i64(test_values::input(
                    ReduceOp::Sum,
                    j / c.max(1),
                    r * c + j % c.max(1),
                ))
            };
            let out = if in_place {
                let mut b = input;
                comm.all_to_all_in_place(&mut b).unwrap_or_else(fail);
                b
            } else {
                let mut b = poison(c * n);
                comm.all_to_all(&input, &mut b).unwrap_or_else(fail);
                b
            };
            mismatches(&out, want)
        }
        Collective::AllReduce => allreduce_case::<T>(comm, c, op, in_place),
        Collective::Barrier => unreachable!("tested separately"),
        Collective::Gather
        | Collective::Scatter
        | Collective::AllGatherV
        | Collective::ReduceScatterV
        | Collective::AllToAllV => unreachable!("tests/vcoll.rs"),
    }
}

fn run_dtype(
    comm: &Communicator,
    dtype: DataType,
    coll: Collective,
    c: usize,
    op: ReduceOp,
    in_place: bool,
    root: usize,
) -> usize {
    dispatch_dtype!(dtype, case(comm, coll, c, op, in_place, root))
}

fn sweep(transport: TransportKind, colls: &[Collective]) {
    // Software RDMA in a 2-vCPU VM: fewer world sizes, every size that changes a schedule's shape.
    let max = if transport == TransportKind::Ib { 5 } else { 8 };
    let colls: Vec<Collective> = colls.to_vec();
    for n in 1..=max {
        let colls = colls.clone();
        let wrong = run_ranks(
            n,
            config(transport, Duration::from_secs(120)),
            move |comm| {
                let mut wrong = Vec::new();
                for &coll in &colls {
                    let reduces = matches!(
                        coll,
                        Collective::Reduce | Collective::ReduceScatter | Collective::AllReduce
                    );
                    let ops: &[ReduceOp] = if reduces {
                        &ReduceOp::ARITHMETIC
                    } else {
                        &[ReduceOp::Sum]
                    };
                    let roots: Vec<usize> =
                        if matches!(coll, Collective::Broadcast | Collective::Reduce) {
                            vec![0, n - 1]
                        } else {
                            vec![0]
                        };
                    for algo in comm.algorithms(coll) {
                        comm.set_algorithm(coll, Some(algo)).unwrap();
                        for c in COUNTS {
                            for dtype in DataType::ALL {
                                for &op in ops {
                                    for in_place in [false, true] {
                                        for &root in &roots {
                                            let w = run_dtype(
                                                &comm, dtype, coll, c, op, in_place, root,
                                            );
                                            if w > 0 {
                                                wrong.push(format!(
                                                "rank {} {coll} {algo} count {c} {dtype} {op} in_place={in_place} root={root}: {w} wrong",
                                                comm.rank()
                                            ));
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                wrong
            },
        );
        let wrong: Vec<String> = wrong.into_iter().flatten().collect();
        assert!(
            wrong.is_empty(),
            "{transport:?}, {n} ranks, {} wrong:\n{}",
            wrong.len(),
            wrong.join("\n")
        );
    }
}

const ROOTED: [Collective; 2] = [Collective::Broadcast, Collective::Reduce];
const BLOCKED: [Collective; 3] = [
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
];

#[test]
fn rooted_over_local() {
    sweep(TransportKind::Local, &ROOTED);
}

#[test]
fn rooted_over_tcp() {
    sweep(TransportKind::Tcp, &ROOTED);
}

#[test]
fn rooted_over_shm() {
    sweep(TransportKind::Shm, &ROOTED);
}

#[test]
fn blocked_over_shm() {
    sweep(TransportKind::Shm, &BLOCKED);
}

#[test]
fn blocked_over_local() {
    sweep(TransportKind::Local, &BLOCKED);
}

#[test]
fn blocked_over_tcp() {
    sweep(TransportKind::Tcp, &BLOCKED);
}

/// Every rooted and blocked collective, algorithm, dtype, op and placement over verbs.
#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_every_collective() {
    require_ib();
    sweep(TransportKind::Ib, &ROOTED);
    sweep(TransportKind::Ib, &BLOCKED);
    barrier_over(TransportKind::Ib, 4);
    send_recv_over(TransportKind::Ib, 4);
}

#[test]
fn barrier_holds_everyone_until_all_arrive() {
    for t in [TransportKind::Local, TransportKind::Tcp, TransportKind::Shm] {
        barrier_over(t, 8);
    }
}

fn barrier_over(t: TransportKind, max: usize) {
    for n in 1..=max {
        let arrived = Arc::new(AtomicUsize::new(0));
        run_ranks(n, config(t, Duration::from_secs(60)), move |comm| {
            for round in 1..=5 {
                // Late arrivals on purpose: nobody may leave before the slowest arrives.
                if comm.rank() == round % comm.size() {
                    std::thread::sleep(Duration::from_millis(20));
                }
                arrived.fetch_add(1, Ordering::SeqCst);
                comm.barrier().unwrap();
                let seen = arrived.load(Ordering::SeqCst);
                assert!(
                    seen >= round * comm.size(),
                    "rank {} left barrier {round} after {seen} arrivals",
                    comm.rank()
                );
                comm.barrier().unwrap();
            }
        });
    }
}

#[test]
fn send_recv_groups() {
    for t in [TransportKind::Local, TransportKind::Tcp, TransportKind::Shm] {
        send_recv_over(t, 6);
    }
}

fn send_recv_over(t: TransportKind, max: usize) {
    for n in 1..=max {
        run_ranks(n, config(t, Duration::from_secs(60)), move |comm| {
            let (r, n) = (comm.rank(), comm.size());
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            // A ring exchange larger than any socket buffer: only a group can do it.
            let len = 3 << 20;
            let out: Vec<u32> = (0..len).map(|i| (r * 7 + i) as u32).collect();
            let mut inc = vec![0u32; len];
            let mut g = comm.group();
            g.send(&out, next).unwrap();
            g.recv(&mut inc, prev).unwrap();
            g.run().unwrap();
            assert!(
                inc.iter()
                    .enumerate()
                    .all(|(i, &v)| v == (prev * 7 + i) as u32),
                "rank {r}"
            );
            // Plain blocking send/recv, rank 0 to the last rank.
            if n > 1 && r == 0 {
                comm.send(&[1.5f64, 2.5], n - 1).unwrap();
            }
            if n > 1 && r == n - 1 {
                let mut b = [0f64; 2];
                comm.recv(&mut b, 0).unwrap();
                assert_eq!(b, [1.5, 2.5]);
            }
            // Bad peers are refused before anything moves.
            let e = comm.send(&[1u8], n).unwrap_err();
            assert!(
                e.to_string().contains(&format!("peer {n} is out of range")),
                "{e}"
            );
            comm.barrier().unwrap();
        });
    }
}

#[test]
fn bad_collective_arguments() {
    run_ranks(
        3,
        config(TransportKind::Local, Duration::from_secs(30)),
        |comm| {
            let mut b = vec![0f32; 10];
            let e = comm.all_gather_in_place(&mut b).unwrap_err();
            assert!(
                e.to_string().contains("does not split into 3 equal blocks"),
                "{e}"
            );
            let e = comm.all_gather(&[1f32; 4], &mut b).unwrap_err();
            assert!(
                e.to_string()
                    .contains("needs a receive buffer of 48 bytes, got 40"),
                "{e}"
            );
            let e = comm.broadcast_in_place(&mut b, 3).unwrap_err();
            assert!(e.to_string().contains("root 3 is out of range"), "{e}");
            let e = comm
                .reduce(&[1f32; 3], &mut b, ReduceOp::Sum, 0)
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains("3 elements but receive buffer has 10"),
                "{e}"
            );
            let e = comm
                .set_algorithm(Collective::AllToAll, Some(oxccl::Algo::Ring))
                .unwrap_err();
            assert!(e.to_string().contains("alltoall has no ring"), "{e}");
            // Still usable.
            comm.barrier().unwrap();
        },
    );
}

/// The bitwise operators through every reducing collective and algorithm on every integer type;
/// on a float type they are an argument error that leaves the communicator usable.
#[test]
fn bitwise_ops_on_integers_refused_on_floats() {
    const REDUCING: [Collective; 3] = [
        Collective::AllReduce,
        Collective::Reduce,
        Collective::ReduceScatter,
    ];
    for n in [1, 2, 3, 5] {
        let wrong = run_ranks(
            n,
            config(TransportKind::Local, Duration::from_secs(120)),
            move |comm| {
                let mut wrong = Vec::new();
                for coll in REDUCING {
                    for algo in comm.algorithms(coll) {
                        comm.set_algorithm(coll, Some(algo)).unwrap();
                        for c in COUNTS {
                            for dtype in DataType::ALL.into_iter().filter(|d| !d.is_float()) {
                                for op in [ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor] {
                                    for in_place in [false, true] {
                                        let w = run_dtype(&comm, dtype, coll, c, op, in_place, 0);
                                        if w > 0 {
                                            wrong.push(format!(
                                                "rank {} {coll} {algo} count {c} {dtype} {op} \
                                                 in_place={in_place}: {w} wrong",
                                                comm.rank()
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                let mut x = vec![1.0f32; 2 * n];
                let mut out = vec![0.0f32; 2];
                for e in [
                    comm.all_reduce_in_place(&mut x, ReduceOp::BOr).unwrap_err(),
                    comm.reduce_in_place(&mut x, ReduceOp::BAnd, 0).unwrap_err(),
                    comm.reduce_scatter(&x, &mut out, ReduceOp::BXor)
                        .unwrap_err(),
                ] {
                    assert_eq!(e.kind(), oxccl::ErrorKind::InvalidArgument, "{e}");
                    assert!(e.to_string().contains("integer types only"), "{e}");
                    assert!(e.to_string().contains("float"), "{e}");
                }
                comm.all_reduce_in_place(&mut x, ReduceOp::Max).unwrap();
                assert!(comm.error().is_none());
                wrong
            },
        );
        let wrong: Vec<String> = wrong.into_iter().flatten().collect();
        assert!(wrong.is_empty(), "{n} ranks:\n{}", wrong.join("\n"));
    }
}
