//! Every allreduce schedule, for world sizes 1..=64, computes the full reduction on every rank,
//! bit-identically, with no hazard in any of many interleavings.

use ccl_algos::allreduce::Algo;
use ccl_algos::schedule::Shape;
use ccl_algos::symbolic::{Check, simulate};
use ccl_core::ReduceOp;

fn check(algo: Algo, n: usize, count: usize, in_place: bool, op: ReduceOp, seeds: u64) {
    let scheds: Vec<_> = (0..n)
        .map(|rank| {
            let s = algo.build(&Shape {
                rank,
                size: n,
                count,
                in_place,
                op,
            });
            s.validate(count, count, in_place)
                .unwrap_or_else(|e| panic!("{algo} n={n} rank={rank} count={count}: {e}"));
            s
        })
        .collect();
    let full = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    let c = Check {
        expect_mask: Box::new(move |_, _| Some(full)),
        identical: true,
    };
    for seed in 0..seeds {
        simulate(&scheds, count, count, in_place, op, &c, seed * 7919 + 1).unwrap_or_else(|e| {
            panic!("{algo} n={n} count={count} in_place={in_place} {op} seed={seed}: {e}")
        });
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

/// The checker itself must catch broken schedules, or the tests above prove nothing.
#[test]
fn checker_catches_broken_schedules() {
    use ccl_algos::schedule::{Action, Buf, Combine, Region, Schedule};
    let n = 2;
    // Both ranks send their buffer and reduce the incoming data into it in place, without waiting
    // for their own send: a write-after-read hazard.
    let bad: Vec<Schedule> = (0..n)
        .map(|r| {
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
        })
        .collect();
    let c = Check {
        expect_mask: Box::new(|_, _| Some(3)),
        identical: true,
    };
    let errs: Vec<String> = (0..50)
        .filter_map(|seed| simulate(&bad, 4, 4, true, ReduceOp::Sum, &c, seed).err())
        .collect();
    assert!(
        errs.iter().any(|e| e.contains("ran before earlier op")),
        "{errs:?}"
    );

    // A schedule whose ranks reduce in different orders is not bit-identical.
    let unordered: Vec<Schedule> = (0..n)
        .map(|r| {
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
        })
        .collect();
    let e = simulate(&unordered, 4, 4, false, ReduceOp::Sum, &c, 1).unwrap_err();
    assert!(e.contains("not bit-identical"), "{e}");

    // A missing contribution is caught.
    let lonely: Vec<Schedule> = (0..n)
        .map(|_| {
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
        })
        .collect();
    let e = simulate(&lonely, 4, 4, false, ReduceOp::Sum, &c, 1).unwrap_err();
    assert!(e.contains("expected 0x3"), "{e}");
}
