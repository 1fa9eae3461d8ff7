//! Every allreduce schedule, for world sizes 1..=64, computes the full reduction on every rank,
//! bit-identically, with no hazard in any of many interleavings, with and without buffering.

use ccl_algos::algo::{Algo, Collective, build};
use ccl_algos::schedule::{Action, Buf, Combine, Region, Schedule, Shape};
use ccl_algos::symbolic::{Setup, simulate};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

fn check(algo: Algo, n: usize, count: usize, in_place: bool, op: ReduceOp, seeds: u64) {
    let scheds: Vec<_> = (0..n)
        .map(|rank| {
            let s = build(
                Collective::AllReduce,
                algo,
                &Shape::new(rank, n, count, in_place, op),
                &Topology::flat(n),
            )
            .unwrap();
            s.validate(count, count, in_place)
                .unwrap_or_else(|e| panic!("{algo} n={n} rank={rank} count={count}: {e}"));
            s
        })
        .collect();
    for rendezvous in [false, true] {
        let setup = Setup::allreduce(n, count, in_place, op, rendezvous);
        for seed in 0..seeds {
            simulate(&scheds, &setup, seed * 7919 + 1).unwrap_or_else(|e| {
                panic!("{algo} n={n} count={count} in_place={in_place} {op} rendezvous={rendezvous} seed={seed}: {e}")
            });
        }
    }
}

#[test]
fn ring_all_world_sizes() {
    for n in 1..=64usize {
        for count in [0, 1, n.saturating_sub(1), n, 2 * n + 3] {
            for in_place in [false, true] {
                let seeds = if n <= 8 { 20 } else { 2 };
                check(Algo::Ring, n, count, in_place, ReduceOp::Sum, seeds);
            }
        }
        check(Algo::Ring, n, n + 1, false, ReduceOp::Avg, 2);
    }
}

#[test]
fn recursive_doubling_all_world_sizes() {
    for n in 1..=64 {
        for count in [0, 1, 5] {
            for in_place in [false, true] {
                let seeds = if n <= 8 { 20 } else { 2 };
                check(
                    Algo::RecursiveDoubling,
                    n,
                    count,
                    in_place,
                    ReduceOp::Sum,
                    seeds,
                );
            }
        }
        check(Algo::RecursiveDoubling, n, 3, true, ReduceOp::Avg, 2);
    }
}

fn two_rank(build: impl Fn(usize) -> Schedule) -> Vec<Schedule> {
    (0..2).map(build).collect()
}

// The checker itself must catch broken schedules, or the tests above prove nothing.

fn setup(in_place: bool, rendezvous: bool) -> Setup {
    Setup::allreduce(2, 4, in_place, ReduceOp::Sum, rendezvous)
}

/// Sending a buffer while reducing into it, without waiting for the send.
#[test]
fn checker_catches_a_write_after_read_hazard() {
    // Both ranks send their buffer and reduce the incoming data into it in place, without waiting
    // for their own send: a write-after-read hazard.
    let bad = two_rank(|r| {
        let mut s = Schedule::new("bad");
        let whole = Region::new(Buf::Recv, 0, 4);
        s.push(
            Action::Send {
                peer: 1 - r,
                src: whole,
            },
            &[],
            None,
            0,
        );
        s.push(
            Action::Recv {
                peer: 1 - r,
                dst: whole,
                combine: Combine::Reduce {
                    with: None,
                    incoming_first: r == 1,
                    finish_avg: false,
                },
            },
            &[],
            None,
            0,
        );
        s.finish()
    });
    let errs: Vec<String> = (0..50)
        .filter_map(|seed| simulate(&bad, &setup(true, false), seed).err())
        .collect();
    assert!(
        errs.iter().any(|e| e.contains("ran before earlier op")),
        "{errs:?}"
    );
}

/// Each rank waiting for its send to finish before it receives.
#[test]
fn checker_catches_a_deadlock_without_buffering() {
    // The hazard above fixed by a dependency.
    let waits = two_rank(|r| {
        let mut s = Schedule::new("waits");
        let whole = Region::new(Buf::Recv, 0, 4);
        s.push_auto(
            Action::Send {
                peer: 1 - r,
                src: whole,
            },
            None,
            0,
        );
        s.push_auto(
            Action::Recv {
                peer: 1 - r,
                dst: whole,
                combine: Combine::Reduce {
                    with: None,
                    incoming_first: r == 1,
                    finish_avg: false,
                },
            },
            None,
            0,
        );
        s.finish()
    });
    assert!(simulate(&waits, &setup(true, false), 1).is_ok());
    let e = simulate(&waits, &setup(true, true), 1).unwrap_err();
    assert!(e.contains("deadlock without buffering"), "{e}");
}

/// Results that are not bit-identical on every rank.
#[test]
fn checker_catches_ranks_reducing_in_different_orders() {
    let unordered = two_rank(|r| {
        let mut s = Schedule::new("unordered");
        let src = Region::new(Buf::Send, 0, 4);
        let dst = Region::new(Buf::Recv, 0, 4);
        s.push(Action::Send { peer: 1 - r, src }, &[], None, 0);
        s.push(
            Action::Recv {
                peer: 1 - r,
                dst,
                combine: Combine::Reduce {
                    with: Some(src),
                    incoming_first: false,
                    finish_avg: false,
                },
            },
            &[],
            None,
            0,
        );
        s.finish()
    });
    let e = simulate(&unordered, &setup(false, false), 1).unwrap_err();
    assert!(e.contains("not bit-identical"), "{e}");
}

/// Reducing elements of different indices together.
#[test]
fn checker_catches_wrong_elements_reduced_together() {
    let shifted = two_rank(|r| {
        let mut s = Schedule::new("shifted");
        s.push(
            Action::Send {
                peer: 1 - r,
                src: Region::new(Buf::Send, 0, 3),
            },
            &[],
            None,
            0,
        );
        s.push(
            Action::Recv {
                peer: 1 - r,
                dst: Region::new(Buf::Recv, 1, 3),
                combine: Combine::Reduce {
                    with: Some(Region::new(Buf::Send, 1, 3)),
                    incoming_first: r == 1,
                    finish_avg: false,
                },
            },
            &[],
            None,
            0,
        );
        s.finish()
    });
    let e = simulate(&shifted, &setup(false, false), 1).unwrap_err();
    assert!(e.contains("reduced element"), "{e}");
}

/// A rank that never hears from the others.
#[test]
fn checker_catches_a_missing_contribution() {
    let lonely = two_rank(|_| {
        let mut s = Schedule::new("lonely");
        s.push(
            Action::Copy {
                src: Region::new(Buf::Send, 0, 4),
                dst: Region::new(Buf::Recv, 0, 4),
            },
            &[],
            None,
            0,
        );
        s.finish()
    });
    // Without talking to anyone a rank hears from nobody (the causal check) and computes the
    // wrong values (the value check), each caught on its own.
    let e = simulate(&lonely, &setup(false, false), 1).unwrap_err();
    assert!(e.contains("heard only from"), "{e}");
    let values_only = Setup {
        causal: false,
        ..setup(false, false)
    };
    let e = simulate(&lonely, &values_only, 1).unwrap_err();
    assert!(e.contains("expected element 0 of 0x3"), "{e}");
}
