//! The collectives in host memory (`Algo::Shm`), checked symbolically with small slots (many
//! chunks, both halves of a slot in turn): results exact and bit-identical where they must be,
//! no slot read before its owner published it, none overwritten before its readers were done,
//! also across two operations run back to back.

use ccl_algos::algo::{Algo, Collective, build};
use ccl_algos::host;
use ccl_algos::schedule::{Action, Buf, Schedule, Shape};
use ccl_algos::symbolic::{Expect, Setup, Value, all_ranks, inputs, simulate};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

fn shape(rank: usize, n: usize, count: usize, in_place: bool, op: ReduceOp, slot: usize) -> Shape {
    Shape {
        host_slot: slot,
        ..Shape::new(rank, n, count, in_place, op)
    }
}

fn allreduce_setup(n: usize, c: usize, in_place: bool, op: ReduceOp) -> Setup {
    Setup::allreduce(n, c, in_place, op, false)
}

/// The schedule run twice in a row, as two operations, starting on either half: the second's
/// waits count on from the first's posts, and it runs on the halves the first leaves it.
fn twice(s: &Schedule, second_half: bool) -> Schedule {
    host::in_sequence(&[s.clone(), s.clone()], second_half)
}

#[test]
fn allreduce_one_and_two_shot_with_small_slots() {
    for n in 1..=6usize {
        for slot in [2 * n, 4 * n + 2] {
            for c in [1, 5, 17, 40] {
                for one_shot_max in [0, usize::MAX] {
                    for in_place in [false, true] {
                        for op in [ReduceOp::Sum, ReduceOp::Avg] {
                            let scheds: Vec<Schedule> = (0..n)
                                .map(|r| {
                                    let s = host::allreduce_with(
                                        &shape(r, n, c, in_place, op, slot),
                                        one_shot_max,
                                    );
                                    s.validate(if in_place { 0 } else { c }, c, in_place)
                                        .unwrap();
                                    s
                                })
                                .collect();
                            let st = allreduce_setup(n, c, in_place, op);
                            for seed in 0..6 {
                                simulate(&scheds, &st, seed * 31 + 1).unwrap_or_else(|e| {
                                    panic!("n={n} slot={slot} c={c} one_shot_max={one_shot_max} in_place={in_place} {op} seed={seed}: {e}")
                                });
                            }
                            if !in_place {
                                for seed in 0..6 {
                                    let two: Vec<Schedule> =
                                        scheds.iter().map(|s| twice(s, seed % 2 == 1)).collect();
                                    simulate(&two, &st, seed * 17 + 5).unwrap_or_else(|e| {
                                        panic!("twice: n={n} slot={slot} c={c} one_shot_max={one_shot_max} {op} seed={seed}: {e}")
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn allgather_reduce_scatter_broadcast_with_small_slots() {
    for n in 1..=6usize {
        for slot in [2 * n, 3 * n + 1] {
            for c in [1, 4, 9] {
                for in_place in [false, true] {
                    for (coll, root) in [
                        (Collective::AllGather, 0),
                        (Collective::ReduceScatter, 0),
                        (Collective::Broadcast, 0),
                        (Collective::Broadcast, n - 1),
                    ] {
                        let lens = coll.buffer_lens(c, n).unwrap();
                        let buf = if in_place { lens.in_place() } else { lens.recv };
                        let scheds: Vec<Schedule> = (0..n)
                            .map(|r| {
                                let sh = Shape {
                                    root,
                                    ..shape(r, n, c, in_place, ReduceOp::Sum, slot)
                                };
                                let s = build(coll, Algo::Shm, &sh, &Topology::flat(n)).unwrap();
                                s.validate(lens.send, buf, in_place).unwrap();
                                s
                            })
                            .collect();
                        let st = setup(coll, n, c, in_place, root);
                        for seed in 0..6 {
                            simulate(&scheds, &st, seed * 13 + 7).unwrap_or_else(|e| {
                                panic!("{coll} n={n} slot={slot} c={c} in_place={in_place} root={root} seed={seed}: {e}")
                            });
                        }
                        if !in_place {
                            for second_half in [false, true] {
                                let two: Vec<Schedule> =
                                    scheds.iter().map(|s| twice(s, second_half)).collect();
                                simulate(&two, &st, 99).unwrap_or_else(|e| {
                                    panic!("twice: {coll} n={n} slot={slot} c={c} root={root}: {e}")
                                });
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Buffers and expectations of allgather, reduce-scatter and broadcast (NCCL's rules).
fn setup(coll: Collective, n: usize, c: usize, in_place: bool, root: usize) -> Setup {
    let all = all_ranks(n);
    let lens = coll.buffer_lens(c, n).unwrap();
    let buf = if in_place { lens.in_place() } else { lens.recv };
    let send = lens.send;
    Setup {
        init: Box::new(move |r| {
            if !in_place {
                return (inputs(r, send), vec![None; buf]);
            }
            let mut b = inputs(r, buf);
            if coll == Collective::AllGather {
                b = vec![None; buf];
                for i in 0..c {
                    b[r * c + i] = Some(Value::input(r, i));
                }
            }
            (Vec::new(), b)
        }),
        expect: Box::new(move |r, j| {
            Some(match coll {
                Collective::AllGather => Expect::Exact(Value::input(j / c, j % c)),
                Collective::Broadcast => Expect::Exact(Value::input(root, j)),
                _ if !in_place => Expect::Reduced {
                    mask: all,
                    idx: (r * c + j) as u32,
                },
                _ if j / c == r => Expect::Reduced {
                    mask: all,
                    idx: j as u32,
                },
                _ => Expect::Exact(Value::input(r, j)),
            })
        }),
        identical: coll != Collective::ReduceScatter,
        op: ReduceOp::Sum,
        rendezvous: false,
        extra: Vec::new(),
        causal: coll != Collective::Broadcast,
    }
}

#[test]
fn the_checker_catches_a_missing_barrier() {
    // One-shot allreduce without its barrier: ranks read slots nobody published.
    let n = 3;
    let scheds: Vec<Schedule> = (0..n)
        .map(|r| {
            let s = host::allreduce_with(&shape(r, n, 4, false, ReduceOp::Sum, 16), usize::MAX);
            let mut t = Schedule::new("broken");
            t.host_slot = s.host_slot;
            for o in &s.ops {
                if !matches!(o.action, Action::WaitPosts { count: 1 }) {
                    t.push(o.action, &[], None, o.step);
                }
            }
            t.finish()
        })
        .collect();
    let st = allreduce_setup(n, 4, false, ReduceOp::Sum);
    let failed = (0..20).any(|seed| simulate(&scheds, &st, seed).is_err());
    assert!(failed, "a schedule without its barrier must fail the check");
    // And one that writes another rank's slot is refused outright.
    let mut bad = Schedule::new("bad");
    bad.host_slot = 4;
    bad.push(
        Action::Copy {
            src: ccl_algos::schedule::Region::new(Buf::Send, 0, 1),
            dst: ccl_algos::schedule::Region::new(Buf::Host(1), 0, 1),
        },
        &[],
        None,
        0,
    );
    let bad = bad.finish();
    let ok = Schedule::new("ok").finish();
    let e = simulate(&[bad, ok], &allreduce_setup(2, 1, false, ReduceOp::Sum), 1).unwrap_err();
    assert!(e.contains("writes rank 1's host slot"), "{e}");
}

#[test]
fn without_host_memory_the_algorithm_is_refused() {
    let e = build(
        Collective::AllReduce,
        Algo::Shm,
        &Shape::new(0, 4, 8, false, ReduceOp::Sum),
        &Topology::flat(4),
    )
    .unwrap_err();
    assert!(e.to_string().contains("one host"), "{e}");
}

#[test]
fn the_checker_catches_a_slot_overwritten_while_others_read_it() {
    // Two one-shot allreduces of one chunk back to back, the second on the same halves as the
    // first (as if the executor did not turn them): a rank may copy its next input over a slot
    // the others still reduce from, as nothing waits for them between the operations.
    let n = 3;
    let st = allreduce_setup(n, 4, false, ReduceOp::Sum);
    let scheds: Vec<Schedule> = (0..n)
        .map(|r| {
            let s = host::allreduce_with(&shape(r, n, 4, false, ReduceOp::Sum, 16), usize::MAX);
            assert_eq!(s.host_chunks, 1);
            let mut t = Schedule::new("broken");
            t.host_slot = s.host_slot;
            for round in 0..2u32 {
                for o in &s.ops {
                    let a = match o.action {
                        Action::WaitPosts { count } => Action::WaitPosts {
                            count: count + round,
                        },
                        a => a,
                    };
                    t.push(a, &[], None, o.step);
                }
            }
            t.finish()
        })
        .collect();
    let errors: Vec<String> = (0..40)
        .filter_map(|seed| simulate(&scheds, &st, seed).err())
        .collect();
    assert!(
        errors.iter().any(|e| e.contains("overwrites element")),
        "{errors:?}"
    );
    // Turned as the executor turns them, the same two pass.
    let turned: Vec<Schedule> = (0..n)
        .map(|r| {
            let s = host::allreduce_with(&shape(r, n, 4, false, ReduceOp::Sum, 16), usize::MAX);
            twice(&s, false)
        })
        .collect();
    for seed in 0..40 {
        simulate(&turned, &st, seed).unwrap();
    }
}

#[test]
fn different_collectives_in_a_row_share_the_slots_safely() {
    // An allreduce of one chunk (leaving the next on the second half), a broadcast of three, a
    // two-shot allreduce of two: each starts where the one before left the halves, none waits
    // for the one before to finish reading; the last result must be the allreduce's.
    for n in 1..=5usize {
        let slot = 4 * n + 2;
        let c = 3 * (slot / 2) - 1;
        let st = allreduce_setup(n, c, false, ReduceOp::Sum);
        for second_half in [false, true] {
            let scheds: Vec<Schedule> = (0..n)
                .map(|r| {
                    let sh = shape(r, n, c, false, ReduceOp::Sum, slot);
                    let small = Shape { count: 1, ..sh };
                    let ops = [
                        host::allreduce_with(&small, usize::MAX),
                        host::broadcast(&Shape { root: n - 1, ..sh }),
                        host::allreduce_with(&Shape { count: slot, ..sh }, 0),
                        host::allreduce_with(&sh, usize::MAX),
                    ];
                    host::in_sequence(&ops, second_half)
                })
                .collect();
            for seed in 0..8 {
                simulate(&scheds, &st, seed * 7 + 3)
                    .unwrap_or_else(|e| panic!("n={n} second_half={second_half} seed={seed}: {e}"));
            }
        }
    }
}
