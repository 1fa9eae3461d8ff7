//! Every collective x algorithm, world sizes 1..=64, checked symbolically: results exact, no
//! hazard, no deadlock with or without buffering, caller buffers outside the result untouched.

use ccl_algos::algo::{Algo, Collective, build};
use ccl_algos::schedule::{Schedule, Shape};
use ccl_algos::symbolic::{Expect, InitFn, Setup, Value, all_ranks, inputs, simulate};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// Initial buffers and expectations for `coll` (NCCL semantics, including in place).
fn setup(
    coll: Collective,
    n: usize,
    c: usize,
    in_place: bool,
    op: ReduceOp,
    root: usize,
    rendezvous: bool,
) -> Setup {
    let all = all_ranks(n);
    let lens = coll.buffer_lens(c, n).unwrap();
    let send_len = lens.send;
    let buf_len = if in_place { lens.in_place() } else { lens.recv };
    let init: InitFn = match coll {
        Collective::AllGather => Box::new(move |r| {
            if in_place {
                let mut recv = vec![None; buf_len];
                for i in 0..c {
                    recv[r * c + i] = Some(Value::input(r, i));
                }
                (Vec::new(), recv)
            } else {
                (inputs(r, c), vec![None; buf_len])
            }
        }),
        _ => Box::new(move |r| {
            if in_place {
                (Vec::new(), inputs(r, buf_len))
            } else {
                (inputs(r, send_len), vec![None; buf_len])
            }
        }),
    };
    let expect: Box<dyn Fn(usize, usize) -> Option<Expect>> = match coll {
        Collective::AllReduce => Box::new(move |_, i| {
            Some(Expect::Reduced {
                mask: all,
                idx: i as u32,
            })
        }),
        Collective::Broadcast => Box::new(move |_, i| Some(Expect::Exact(Value::input(root, i)))),
        Collective::Reduce => Box::new(move |r, i| {
            Some(if r == root {
                Expect::Reduced {
                    mask: all,
                    idx: i as u32,
                }
            } else if in_place {
                Expect::Exact(Value::input(r, i))
            } else {
                Expect::Unwritten
            })
        }),
        Collective::AllGather => {
            Box::new(move |_, j| Some(Expect::Exact(Value::input(j / c.max(1), j % c.max(1)))))
        }
        Collective::ReduceScatter => Box::new(move |r, j| {
            if !in_place {
                return Some(Expect::Reduced {
                    mask: all,
                    idx: (r * c + j) as u32,
                });
            }
            Some(if j / c.max(1) == r {
                Expect::Reduced {
                    mask: all,
                    idx: j as u32,
                }
            } else {
                Expect::Exact(Value::input(r, j))
            })
        }),
        Collective::AllToAll => Box::new(move |r, j| {
            let (from, i) = (j / c.max(1), j % c.max(1));
            Some(Expect::Exact(Value::input(from, r * c + i)))
        }),
        Collective::Barrier => Box::new(|_, _| None),
        Collective::Gather
        | Collective::Scatter
        | Collective::AllGatherV
        | Collective::ReduceScatterV
        | Collective::AllToAllV => unreachable!("checked in symbolic_vcoll.rs"),
    };
    Setup {
        init,
        expect,
        identical: matches!(
            coll,
            Collective::AllReduce | Collective::Broadcast | Collective::AllGather
        ),
        op,
        rendezvous,
        extra: Vec::new(),
        // Rooted collectives do not make every rank depend on every other, and a count of 0
        // moves no data (only the barrier synchronises without any).
        causal: !matches!(coll, Collective::Broadcast | Collective::Reduce)
            && (c > 0 || coll == Collective::Barrier),
    }
}

#[allow(clippy::too_many_arguments)]
fn check(
    coll: Collective,
    algo: Algo,
    n: usize,
    c: usize,
    in_place: bool,
    op: ReduceOp,
    root: usize,
    seeds: u64,
) {
    let topo = Topology::flat(n);
    let lens = coll.buffer_lens(c, n).unwrap();
    let send_len = lens.send;
    let buf_len = if in_place { lens.in_place() } else { lens.recv };
    let scheds: Vec<Schedule> = (0..n)
        .map(|rank| {
            let shape = Shape {
                root,
                // Room for two elements per rank in each half of a slot: several chunks.
                host_slot: if matches!(algo, Algo::Shm | Algo::HierShm) {
                    4 * n
                } else {
                    0
                },
                ..Shape::new(rank, n, c, in_place, op)
            };
            let s = build(coll, algo, &shape, &topo).unwrap();
            s.validate(send_len, buf_len, in_place).unwrap_or_else(|e| {
                panic!("{coll} {algo} n={n} rank={rank} c={c} in_place={in_place}: {e}")
            });
            s
        })
        .collect();
    for rendezvous in [false, true] {
        let st = setup(coll, n, c, in_place, op, root, rendezvous);
        for seed in 0..seeds {
            simulate(&scheds, &st, seed * 7919 + 3).unwrap_or_else(|e| {
                panic!("{coll} {algo} n={n} c={c} in_place={in_place} {op} root={root} rendezvous={rendezvous} seed={seed}: {e}")
            });
        }
    }
}

fn sweep(coll: Collective) {
    for &algo in coll.algos() {
        for n in 1..=64usize {
            let seeds = if n <= 8 {
                12
            } else if n <= 20 {
                2
            } else {
                1
            };
            let roots: Vec<usize> = if matches!(coll, Collective::Broadcast | Collective::Reduce) {
                let mut r = vec![0, n - 1, n / 2];
                r.dedup();
                r
            } else {
                vec![0]
            };
            // Small worlds get every edge case; large ones one count that is not a multiple of
            // anything (every world size is still checked, with and without buffering).
            let counts: &[usize] = if coll == Collective::Barrier {
                &[0]
            } else if n <= 16 {
                &[0, 1, 3]
            } else {
                &[3]
            };
            for &c in counts {
                for in_place in [false, true] {
                    for &root in &roots {
                        check(coll, algo, n, c, in_place, ReduceOp::Sum, root, seeds);
                    }
                }
            }
            if !matches!(
                coll,
                Collective::Broadcast
                    | Collective::AllGather
                    | Collective::AllToAll
                    | Collective::Barrier
            ) {
                check(coll, algo, n, 2, false, ReduceOp::Avg, n / 2, 1);
            }
        }
    }
}

#[test]
fn broadcast() {
    sweep(Collective::Broadcast);
}

#[test]
fn reduce() {
    sweep(Collective::Reduce);
}

#[test]
fn allgather() {
    sweep(Collective::AllGather);
}

#[test]
fn reduce_scatter() {
    sweep(Collective::ReduceScatter);
}

#[test]
fn alltoall() {
    sweep(Collective::AllToAll);
}

#[test]
fn barrier() {
    sweep(Collective::Barrier);
}

#[test]
fn allreduce() {
    sweep(Collective::AllReduce);
}

/// A barrier whose rounds only wait for the previous round does not carry every arrival to every
/// rank (rank 1's arrival never reaches rank 0 with 6 ranks); the causal check must catch it.
#[test]
fn causal_check_catches_a_broken_barrier() {
    use ccl_algos::schedule::{Action, Buf, Combine, Region};
    let n = 6;
    let rounds = 3;
    let scheds: Vec<Schedule> = (0..n)
        .map(|r| {
            let mut sc = Schedule::new("broken");
            let mut prev = None;
            for k in 0..rounds {
                let d = 1 << k;
                let deps: Vec<usize> = prev.into_iter().collect();
                sc.push(
                    Action::Send {
                        peer: (r + d) % n,
                        src: Region::new(Buf::Scratch, k, 1),
                    },
                    &deps,
                    None,
                    0,
                );
                prev = Some(sc.push(
                    Action::Recv {
                        peer: (r + n - d) % n,
                        dst: Region::new(Buf::Scratch, rounds + k, 1),
                        combine: Combine::Copy,
                    },
                    &[],
                    None,
                    0,
                ));
            }
            sc.scratch = 2 * rounds;
            sc.finish()
        })
        .collect();
    let st = setup(Collective::Barrier, n, 0, true, ReduceOp::Sum, 0, false);
    let errs: Vec<String> = (0..200)
        .filter_map(|seed| simulate(&scheds, &st, seed).err())
        .collect();
    assert!(
        errs.iter().any(|e| e.contains("heard only from")),
        "{errs:?}"
    );
}
