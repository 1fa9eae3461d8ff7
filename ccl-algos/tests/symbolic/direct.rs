//! Allreduce in place on buffers the host's ranks share (`ccl_algos::direct`), checked
//! symbolically: exact, bit-identical results; no rank reads another's input before the post
//! that publishes it, writes an element another rank still reads, or ends the operation (handing
//! its buffers back) before every rank that touched them posted; also two operations back to
//! back, and ranks that differ in placement.

use ccl_algos::direct;
use ccl_algos::host;
use ccl_algos::schedule::{Action, Schedule, Shape};
use ccl_algos::symbolic::{Expect, Setup, all_ranks, inputs, simulate};
use ccl_core::ReduceOp;

fn shape(rank: usize, n: usize, count: usize, in_place: bool, op: ReduceOp) -> Shape {
    Shape {
        host_slot: 8,
        ..Shape::new(rank, n, count, in_place, op)
    }
}

/// Allreduce where rank `r` is in place when `in_place(r)`.
fn setup(n: usize, c: usize, op: ReduceOp, in_place: fn(usize) -> bool) -> Setup {
    Setup {
        init: Box::new(move |r| {
            if in_place(r) {
                (Vec::new(), inputs(r, c))
            } else {
                (inputs(r, c), vec![None; c])
            }
        }),
        expect: Box::new(move |_, i| {
            Some(Expect::Reduced {
                mask: all_ranks(n),
                idx: i as u32,
            })
        }),
        identical: true,
        op,
        rendezvous: false,
        extra: Vec::new(),
        causal: true,
    }
}

fn schedules(n: usize, c: usize, op: ReduceOp, in_place: fn(usize) -> bool) -> Vec<Schedule> {
    (0..n)
        .map(|r| {
            let s = direct::allreduce(&shape(r, n, c, in_place(r), op));
            assert!(s.direct);
            s.validate(if in_place(r) { 0 } else { c }, c, in_place(r))
                .unwrap();
            s
        })
        .collect()
}

/// Whether rank `r` runs in place.
type Placement = fn(usize) -> bool;

const PLACEMENTS: [(&str, Placement); 3] = [
    ("out of place", |_| false),
    ("in place", |_| true),
    ("mixed", |r| r % 2 == 1),
];

#[test]
fn allreduce_direct_is_exact_and_race_free() {
    for n in 2..=5usize {
        for c in [1, 2, 3, 7, 40] {
            for (what, in_place) in PLACEMENTS {
                for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                    let scheds = schedules(n, c, op, in_place);
                    let st = setup(n, c, op, in_place);
                    for seed in 0..8 {
                        simulate(&scheds, &st, seed * 29 + 3)
                            .unwrap_or_else(|e| panic!("n={n} c={c} {what} {op} seed={seed}: {e}"));
                    }
                }
            }
        }
    }
}

#[test]
fn two_direct_allreduces_back_to_back() {
    for n in 2..=4usize {
        for c in [1, 5, 12] {
            // Out of place: the second operation reads the same inputs again.
            let scheds: Vec<Schedule> = schedules(n, c, ReduceOp::Sum, |_| false)
                .iter()
                .map(|s| host::in_sequence(&[s.clone(), s.clone()], false))
                .collect();
            let st = setup(n, c, ReduceOp::Sum, |_| false);
            for seed in 0..8 {
                simulate(&scheds, &st, seed * 13 + 1)
                    .unwrap_or_else(|e| panic!("n={n} c={c} seed={seed}: {e}"));
            }
        }
    }
}

/// Rank `r`'s schedule without the ops `drop` picks.
fn without(s: &Schedule, drop: impl Fn(usize, &Action) -> bool) -> Schedule {
    let mut t = Schedule::new(s.algo);
    t.host_slot = s.host_slot;
    t.host_chunks = s.host_chunks;
    t.direct = true;
    for (id, o) in s.ops.iter().enumerate() {
        if !drop(id, &o.action) {
            t.push(o.action, &[], None, o.step);
        }
    }
    t.finish()
}

#[test]
fn the_checker_catches_missing_barriers() {
    let (n, c) = (3, 9);
    let st = setup(n, c, ReduceOp::Sum, |_| false);
    let first_wait = |_: usize, a: &Action| matches!(a, Action::WaitPosts { count: 1 });
    let last_wait = |_: usize, a: &Action| matches!(a, Action::WaitPosts { count: 2 });
    for (what, drop, expect) in [
        (
            "no first barrier",
            &first_wait as &dyn Fn(usize, &Action) -> bool,
            "before rank",
        ),
        ("no last barrier", &last_wait, "ends the operation"),
    ] {
        let scheds: Vec<Schedule> = schedules(n, c, ReduceOp::Sum, |_| false)
            .iter()
            .map(|s| without(s, drop))
            .collect();
        let caught = (0..40)
            .any(|seed| simulate(&scheds, &st, seed * 7 + 1).is_err_and(|e| e.contains(expect)));
        assert!(caught, "{what}: not caught");
    }
    // A direct rank among staged ones: the peer announces no buffers.
    let mut scheds = schedules(n, c, ReduceOp::Sum, |_| false);
    scheds[1] = host::allreduce(&shape(1, n, c, false, ReduceOp::Sum));
    let e = simulate(&scheds, &st, 1).unwrap_err();
    assert!(e.contains("not direct"), "{e}");
}

/// Allgather, broadcast and reduce-scatter on shared buffers, with the placements above:
/// exact results, and the same ordering rules.
#[test]
fn allgather_broadcast_reduce_scatter_direct() {
    use ccl_algos::algo::Collective;
    use ccl_algos::symbolic::Value;
    for n in 2..=4usize {
        for c in [1, 3, 8] {
            for (what, in_place) in PLACEMENTS {
                for (coll, root) in [
                    (Collective::AllGather, 0),
                    (Collective::ReduceScatter, 0),
                    (Collective::Broadcast, 0),
                    (Collective::Broadcast, n - 1),
                ] {
                    let lens = coll.buffer_lens(c, n).unwrap();
                    let scheds: Vec<Schedule> = (0..n)
                        .map(|r| {
                            let sh = Shape {
                                root,
                                ..shape(r, n, c, in_place(r), ReduceOp::Sum)
                            };
                            let s = direct::build(coll, &sh).unwrap();
                            let buf = if in_place(r) {
                                lens.in_place()
                            } else {
                                lens.recv
                            };
                            s.validate(lens.send, buf, in_place(r)).unwrap();
                            s
                        })
                        .collect();
                    let all = all_ranks(n);
                    let st = Setup {
                        init: Box::new(move |r| {
                            if !in_place(r) {
                                return (inputs(r, lens.send), vec![None; lens.recv]);
                            }
                            let mut b = inputs(r, lens.in_place());
                            if coll == Collective::AllGather {
                                b = vec![None; lens.in_place()];
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
                                // In place, the result is block `r` of the buffer.
                                _ if in_place(r) && j / c != r => return None,
                                _ => Expect::Reduced {
                                    mask: all,
                                    idx: (r * c + j % c) as u32,
                                },
                            })
                        }),
                        identical: coll != Collective::ReduceScatter,
                        op: ReduceOp::Sum,
                        rendezvous: false,
                        extra: Vec::new(),
                        causal: false,
                    };
                    for seed in 0..8 {
                        simulate(&scheds, &st, seed * 11 + 5).unwrap_or_else(|e| {
                            panic!("{coll} n={n} c={c} {what} root={root} seed={seed}: {e}")
                        });
                    }
                }
            }
        }
    }
}
