//! Gather, scatter, allgatherv, reduce-scatterv and alltoallv, checked symbolically for world
//! sizes 1..=24 and 64: results exact, no hazard, no deadlock with or without buffering, every
//! element outside the result (gaps between blocks, other ranks' blocks) left alone. Counts
//! include zeros, blocks are placed out of rank order with gaps, roots vary.

use ccl_algos::algo::{Algo, Collective, build, build_per_rank};
use ccl_algos::schedule::{Schedule, Shape};
use ccl_algos::symbolic::{Expect, Setup, Value, all_ranks, inputs, simulate};
use ccl_algos::vcoll::VShape;
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

fn seeds(n: usize) -> u64 {
    if n <= 8 { 10 } else { 1 }
}

fn run(what: &str, scheds: &[Schedule], setup: impl Fn(bool) -> Setup, n: usize) {
    for rendezvous in [false, true] {
        let st = setup(rendezvous);
        for seed in 0..seeds(n) {
            simulate(scheds, &st, seed * 7919 + 3)
                .unwrap_or_else(|e| panic!("{what} rendezvous={rendezvous} seed={seed}: {e}"));
        }
    }
}

fn rooted(coll: Collective, n: usize, c: usize, in_place: bool, root: usize) {
    let topo = Topology::flat(n);
    let lens = coll.buffer_lens(c, n).unwrap();
    let scheds: Vec<Schedule> = (0..n)
        .map(|rank| {
            let shape = Shape {
                root,
                ..Shape::new(rank, n, c, in_place, ReduceOp::Sum)
            };
            let s = build(coll, Algo::Pairwise, &shape, &topo).unwrap();
            // Out of place, a non-root rank's unused buffer may be empty.
            let (send, recv) = match (coll, in_place, rank == root) {
                (_, true, _) => (0, lens.in_place()),
                (Collective::Gather, false, false) => (lens.send, 0),
                (Collective::Scatter, false, false) => (0, lens.recv),
                _ => (lens.send, lens.recv),
            };
            s.validate(send, recv, in_place)
                .unwrap_or_else(|e| panic!("{coll} n={n} rank={rank} c={c}: {e}"));
            s
        })
        .collect();
    let buf = if in_place { lens.in_place() } else { lens.recv };
    let send = lens.send;
    let setup = move |rendezvous| {
        let init: Box<dyn Fn(usize) -> _> = Box::new(move |r| match (coll, in_place) {
            // Gather in place: each rank's input is its block of the one buffer.
            (Collective::Gather, true) => {
                let mut b = vec![None; buf];
                for i in 0..c {
                    b[r * c + i] = Some(Value::input(r, i));
                }
                (Vec::new(), b)
            }
            (_, true) => (Vec::new(), inputs(r, buf)),
            _ => (inputs(r, send), vec![None; buf]),
        });
        let expect: Box<dyn Fn(usize, usize) -> Option<Expect>> = Box::new(move |r, j| {
            let (blk, i) = (j / c.max(1), j % c.max(1));
            Some(match (coll, in_place) {
                (Collective::Gather, _) if r == root => Expect::Exact(Value::input(blk, i)),
                (Collective::Gather, true) if blk == r => Expect::Exact(Value::input(r, i)),
                (Collective::Gather, _) => Expect::Unwritten,
                (Collective::Scatter, false) => Expect::Exact(Value::input(root, r * c + j)),
                (Collective::Scatter, true) if blk == r => Expect::Exact(Value::input(root, j)),
                (Collective::Scatter, true) => Expect::Exact(Value::input(r, j)),
                _ => unreachable!(),
            })
        });
        Setup {
            init,
            expect,
            identical: false,
            op: ReduceOp::Sum,
            rendezvous,
            extra: Vec::new(),
            causal: false,
        }
    };
    let what = format!("{coll} n={n} c={c} in_place={in_place} root={root}");
    run(&what, &scheds, setup, n);
}

/// Counts with zeros, differing by rank.
fn counts(n: usize, salt: usize) -> Vec<usize> {
    (0..n).map(|k| (k * 7 + salt) % 4).collect()
}

/// Blocks of `counts` placed in reverse rank order, one element apart.
fn spread(counts: &[usize]) -> Vec<usize> {
    let mut d = vec![0; counts.len()];
    let mut next = 1;
    for k in (0..counts.len()).rev() {
        d[k] = next;
        next += counts[k] + 1;
    }
    d
}

fn all_gather_v(n: usize, salt: usize, in_place: bool, displaced: bool) {
    let cnt = counts(n, salt);
    let displs = shapes_displs(n, &cnt, displaced);
    let shapes: Vec<VShape> = (0..n)
        .map(|r| {
            let d = displaced.then_some(&displs[..]);
            VShape::all_gather_v(r, n, &cnt, d, in_place).unwrap()
        })
        .collect();
    let scheds = schedules(Collective::AllGatherV, &shapes);
    let len = shapes[0].recv_len;
    let (cnt2, displs2) = (cnt.clone(), shapes[0].recv.clone());
    let setup = move |rendezvous| {
        let cnt = cnt2.clone();
        let displs = displs2.clone();
        let c2 = cnt.clone();
        let init: Box<dyn Fn(usize) -> _> = Box::new(move |r| {
            let cnt = &c2;
            if in_place {
                let mut b = vec![None; len];
                for i in 0..cnt[r] {
                    b[displs[r].off + i] = Some(Value::input(r, i));
                }
                (Vec::new(), b)
            } else {
                (inputs(r, cnt[r]), vec![None; len])
            }
        });
        let displs = shapes_displs(n, &cnt, displaced);
        let expect: Box<dyn Fn(usize, usize) -> Option<Expect>> = Box::new(move |_, j| {
            Some(match owner_of(&displs, &cnt, j) {
                Some(k) => Expect::Exact(Value::input(k, j - displs[k])),
                None => Expect::Unwritten,
            })
        });
        Setup {
            init,
            expect,
            identical: true,
            op: ReduceOp::Sum,
            rendezvous,
            extra: Vec::new(),
            causal: false,
        }
    };
    let what = format!(
        "allgatherv n={n} counts={:?} in_place={in_place}",
        counts(n, salt)
    );
    run(&what, &scheds, setup, n);
}

fn shapes_displs(n: usize, cnt: &[usize], displaced: bool) -> Vec<usize> {
    if displaced {
        spread(cnt)
    } else {
        (0..n).map(|k| cnt[..k].iter().sum()).collect()
    }
}

fn owner_of(displs: &[usize], cnt: &[usize], j: usize) -> Option<usize> {
    (0..cnt.len()).find(|&k| j >= displs[k] && j < displs[k] + cnt[k])
}

fn schedules(coll: Collective, shapes: &[VShape]) -> Vec<Schedule> {
    shapes
        .iter()
        .map(|v| {
            let s = build_per_rank(coll, Algo::Pairwise, v).unwrap();
            s.validate(v.send_len, v.recv_len, v.in_place)
                .unwrap_or_else(|e| panic!("{coll} n={} rank={}: {e}", v.size, v.rank));
            assert!(s.handshake);
            s
        })
        .collect()
}

fn reduce_scatter_v(n: usize, salt: usize, in_place: bool, op: ReduceOp) {
    let cnt = counts(n, salt);
    let shapes: Vec<VShape> = (0..n)
        .map(|r| VShape::reduce_scatter_v(r, n, &cnt, in_place, op).unwrap())
        .collect();
    let scheds = schedules(Collective::ReduceScatterV, &shapes);
    let total: usize = cnt.iter().sum();
    let start: Vec<usize> = (0..n).map(|k| cnt[..k].iter().sum()).collect();
    let setup = move |rendezvous| {
        let (cnt, start) = (cnt.clone(), start.clone());
        let c2 = cnt.clone();
        let init: Box<dyn Fn(usize) -> _> = Box::new(move |r| {
            let cnt = &c2;
            if in_place {
                (Vec::new(), inputs(r, total))
            } else {
                (inputs(r, total), vec![None; cnt[r]])
            }
        });
        let all = all_ranks(n);
        let expect: Box<dyn Fn(usize, usize) -> Option<Expect>> = Box::new(move |r, j| {
            Some(if !in_place {
                Expect::Reduced {
                    mask: all,
                    idx: (start[r] + j) as u32,
                }
            } else if j >= start[r] && j < start[r] + cnt[r] {
                Expect::Reduced {
                    mask: all,
                    idx: j as u32,
                }
            } else {
                Expect::Exact(Value::input(r, j))
            })
        });
        Setup {
            init,
            expect,
            identical: false,
            op,
            rendezvous,
            extra: Vec::new(),
            causal: false,
        }
    };
    let what = format!(
        "reducescatterv n={n} counts={:?} in_place={in_place} {op}",
        counts(n, salt)
    );
    run(&what, &scheds, setup, n);
}

/// Elements rank `from` sends rank `to`; symmetric for the in-place form.
fn matrix(from: usize, to: usize, salt: usize, symmetric: bool) -> usize {
    if symmetric {
        ((from + to) * 3 + from * to + salt) % 4
    } else {
        (from * 3 + to * 5 + salt) % 4
    }
}

fn all_to_all_v(n: usize, salt: usize, in_place: bool) {
    let m = move |f: usize, t: usize| matrix(f, t, salt, in_place);
    let send_counts = move |r: usize| (0..n).map(|k| m(r, k)).collect::<Vec<_>>();
    let recv_counts = move |r: usize| (0..n).map(|k| m(k, r)).collect::<Vec<_>>();
    // Send blocks in reverse rank order with gaps; receive blocks packed.
    let send_displs = move |r: usize| spread(&send_counts(r));
    let recv_displs = move |r: usize| {
        let c = recv_counts(r);
        (0..n).map(|k| c[..k].iter().sum()).collect::<Vec<usize>>()
    };
    let shapes: Vec<VShape> = (0..n)
        .map(|r| {
            let (sc, sd, rc) = (send_counts(r), send_displs(r), recv_counts(r));
            VShape::all_to_all_v(r, n, (&sc, Some(&sd)), (&rc, None), in_place).unwrap()
        })
        .collect();
    let scheds = schedules(Collective::AllToAllV, &shapes);
    let shapes2 = shapes.clone();
    let setup = move |rendezvous| {
        let shapes = shapes2.clone();
        let sh = shapes.clone();
        let init: Box<dyn Fn(usize) -> _> = Box::new(move |r| {
            let v = &sh[r];
            if in_place {
                (Vec::new(), inputs(r, v.recv_len))
            } else {
                (inputs(r, v.send_len), vec![None; v.recv_len])
            }
        });
        let expect: Box<dyn Fn(usize, usize) -> Option<Expect>> = Box::new(move |r, j| {
            let rd = recv_displs(r);
            let rc = recv_counts(r);
            Some(match owner_of(&rd, &rc, j) {
                // Element i of the block from `k` is element i of k's block for this rank.
                Some(k) => {
                    let i = j - rd[k];
                    let src = if in_place {
                        shapes[k].recv[r].off
                    } else {
                        shapes[k].send[r].off
                    };
                    Expect::Exact(Value::input(k, src + i))
                }
                None if in_place => Expect::Exact(Value::input(r, j)),
                None => Expect::Unwritten,
            })
        });
        Setup {
            init,
            expect,
            identical: false,
            op: ReduceOp::Sum,
            rendezvous,
            extra: Vec::new(),
            causal: false,
        }
    };
    let what = format!("alltoallv n={n} salt={salt} in_place={in_place}");
    run(&what, &scheds, setup, n);
}

fn sizes() -> impl Iterator<Item = usize> {
    (1..=24).chain([64])
}

#[test]
fn gather_and_scatter() {
    for n in sizes() {
        let mut roots = vec![0, n - 1, n / 2];
        roots.dedup();
        for coll in [Collective::Gather, Collective::Scatter] {
            for c in [0, 1, 3] {
                for in_place in [false, true] {
                    for &root in &roots {
                        rooted(coll, n, c, in_place, root);
                    }
                }
            }
        }
    }
}

#[test]
fn allgatherv() {
    for n in sizes() {
        for salt in [0, 1, 2] {
            for in_place in [false, true] {
                for displaced in [false, true] {
                    all_gather_v(n, salt, in_place, displaced);
                }
            }
        }
    }
}

#[test]
fn reduce_scatterv() {
    for n in sizes() {
        for salt in [0, 3] {
            for in_place in [false, true] {
                reduce_scatter_v(n, salt, in_place, ReduceOp::Sum);
            }
        }
        reduce_scatter_v(n, 1, false, ReduceOp::Avg);
    }
}

#[test]
fn alltoallv() {
    for n in sizes() {
        for salt in [0, 1, 2] {
            for in_place in [false, true] {
                all_to_all_v(n, salt, in_place);
            }
        }
    }
}

/// The checker is not vacuous here: an alltoallv whose receive blocks are swapped (block from
/// rank k written where rank k+1's belongs) is caught.
#[test]
fn a_misplaced_block_is_caught() {
    let n = 3;
    let shapes: Vec<VShape> = (0..n)
        .map(|r| {
            let c = vec![2; n];
            let mut v = VShape::all_to_all_v(r, n, (&c, None), (&c, None), false).unwrap();
            v.recv.swap((r + 1) % n, (r + 2) % n);
            v
        })
        .collect();
    let scheds = schedules(Collective::AllToAllV, &shapes);
    let setup = |rendezvous| Setup {
        init: Box::new(|r| (inputs(r, 6), vec![None; 6])),
        expect: Box::new(|r, j| Some(Expect::Exact(Value::input(j / 2, r * 2 + j % 2)))),
        identical: false,
        op: ReduceOp::Sum,
        rendezvous,
        extra: Vec::new(),
        causal: false,
    };
    let st = setup(false);
    let e = simulate(&scheds, &st, 1).unwrap_err();
    assert!(e.contains("expected"), "{e}");
}
