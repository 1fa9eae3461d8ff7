//! The tree, halving-doubling and hierarchical allreduce schedules, and the rooted tree
//! broadcast and reduce, checked by the symbolic executor: world sizes 1..=64, counts
//! {0, 1, n-1, n, 2n+3}, in place and out of place, Sum and Avg, with and without buffering,
//! several interleavings, over several topologies.

use ccl_algos::algo::{Algo, Collective, build};
use ccl_algos::schedule::{Schedule, Shape};
use ccl_algos::symbolic::{Expect, Setup, Slot, Value, all_ranks, inputs, simulate};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, n.saturating_sub(1), n, 2 * n + 3];
    c.sort();
    c.dedup();
    c
}

fn seeds(n: usize) -> u64 {
    match n {
        0..=8 => 12,
        9..=24 => 3,
        _ => 1,
    }
}

fn schedules(coll: Collective, algo: Algo, shape: Shape, topo: &Topology) -> Vec<Schedule> {
    let lens = coll.buffer_lens(shape.count, shape.size).unwrap();
    let (send_len, recv_len) = (lens.send, lens.recv);
    (0..shape.size)
        .map(|rank| {
            let sh = Shape { rank, ..shape };
            let s = build(coll, algo, &sh, topo).unwrap();
            s.validate(send_len, recv_len, sh.in_place)
                .unwrap_or_else(|e| panic!("{coll} {algo} {sh:?}: {e}"));
            s
        })
        .collect()
}

fn check_allreduce(algo: Algo, topo: &Topology, count: usize, in_place: bool, op: ReduceOp) {
    let n = topo.size();
    let scheds = schedules(
        Collective::AllReduce,
        algo,
        Shape::new(0, n, count, in_place, op),
        topo,
    );
    for rdv in [false, true] {
        let setup = Setup::allreduce(n, count, in_place, op, rdv);
        for seed in 0..seeds(n) {
            simulate(&scheds, &setup, seed * 7919 + 1).unwrap_or_else(|e| {
                panic!(
                    "{algo} n={n} count={count} in_place={in_place} {op} rendezvous={rdv} \
                     seed={seed} topo={topo:?}: {e}"
                )
            });
        }
    }
}

fn sweep_allreduce(algo: Algo, topo_of: impl Fn(usize) -> Topology) {
    for n in 1..=64 {
        let topo = topo_of(n);
        for count in counts(n) {
            for in_place in [false, true] {
                check_allreduce(algo, &topo, count, in_place, ReduceOp::Sum);
            }
        }
        check_allreduce(algo, &topo, 2 * n + 3, false, ReduceOp::Avg);
        check_allreduce(algo, &topo, n, true, ReduceOp::Avg);
    }
}

/// Ranks dealt round-robin over hosts of `per` ranks: rank order and ring order differ.
fn dealt(n: usize, per: usize) -> Topology {
    let hosts = n.div_ceil(per);
    let names: Vec<String> = (0..n).map(|r| format!("h{}", r % hosts)).collect();
    Topology::from_hosts(&names)
}

/// Hosts of uneven sizes 1, 2, 3, 1, 2, 3, ...
fn uneven(n: usize) -> Topology {
    let mut names = Vec::new();
    let mut h = 0;
    while names.len() < n {
        for _ in 0..(h % 3 + 1) {
            names.push(format!("h{h}"));
        }
        h += 1;
    }
    names.truncate(n);
    Topology::from_hosts(&names)
}

#[test]
fn tree_all_world_sizes() {
    sweep_allreduce(Algo::Tree, Topology::flat);
}

#[test]
fn tree_follows_the_topology_order() {
    for n in [3, 6, 8, 13] {
        let topo = dealt(n, 2);
        for count in counts(n) {
            check_allreduce(Algo::Tree, &topo, count, n % 2 == 0, ReduceOp::Avg);
        }
    }
}

#[test]
fn halving_doubling_all_world_sizes() {
    sweep_allreduce(Algo::HalvingDoubling, Topology::flat);
}

#[test]
fn halving_doubling_follows_the_topology_order() {
    for n in [3, 5, 6, 8, 12] {
        let topo = dealt(n, 3);
        for count in counts(n) {
            check_allreduce(
                Algo::HalvingDoubling,
                &topo,
                count,
                n % 2 == 1,
                ReduceOp::Avg,
            );
        }
    }
}

#[test]
fn hierarchical_one_host() {
    sweep_allreduce(Algo::Hierarchical, |n| {
        Topology::from_hosts(&vec!["box".to_string(); n])
    });
}

#[test]
fn hierarchical_one_rank_per_host() {
    sweep_allreduce(Algo::Hierarchical, Topology::flat);
}

#[test]
fn hierarchical_uneven_hosts() {
    sweep_allreduce(Algo::Hierarchical, uneven);
}

#[test]
fn hierarchical_racks_and_scattered_hosts() {
    // 2 racks x 2 hosts x 2 ranks, and larger grids.
    for (z, r, h, k) in [
        (1, 2, 2, 2),
        (1, 2, 2, 3),
        (2, 2, 2, 2),
        (1, 3, 1, 4),
        (2, 1, 3, 5),
    ] {
        let topo = Topology::grid(z, r, h, k);
        let n = topo.size();
        for count in counts(n) {
            for in_place in [false, true] {
                check_allreduce(Algo::Hierarchical, &topo, count, in_place, ReduceOp::Sum);
            }
        }
        check_allreduce(Algo::Hierarchical, &topo, n + 1, false, ReduceOp::Avg);
    }
    // Hosts whose ranks are not contiguous in rank order.
    for n in [4, 7, 9, 16] {
        let topo = dealt(n, 3);
        for count in counts(n) {
            check_allreduce(Algo::Hierarchical, &topo, count, n % 2 == 0, ReduceOp::Avg);
        }
    }
}

/// Rooted collectives: rank `r`'s initial (send, recv) and what its receive buffer must hold.
fn check_rooted(coll: Collective, topo: &Topology, root: usize, count: usize, in_place: bool) {
    let n = topo.size();
    let op = if coll == Collective::Reduce && count % 2 == 1 {
        ReduceOp::Avg
    } else {
        ReduceOp::Sum
    };
    let mut shape = Shape::new(0, n, count, in_place, op);
    shape.root = root;
    let scheds = schedules(coll, Algo::Tree, shape, topo);
    // A value no rank computes, to show what a buffer held before.
    let junk = |r: usize, i: usize| Some(Value::input(63 - (r % 64), i + 1_000_000));
    let initial = move |r: usize| -> (Vec<Slot>, Vec<Slot>) {
        if in_place {
            (Vec::new(), inputs(r, count))
        } else {
            (inputs(r, count), (0..count).map(|i| junk(r, i)).collect())
        }
    };
    for rdv in [false, true] {
        let setup = Setup {
            init: Box::new(initial),
            expect: Box::new(move |r, i| match coll {
                Collective::Broadcast => Some(Expect::Exact(Value::input(root, i))),
                _ if r == root => Some(Expect::Reduced {
                    mask: all_ranks(n),
                    idx: i as u32,
                }),
                _ => None,
            }),
            identical: coll == Collective::Broadcast,
            op,
            rendezvous: rdv,
            extra: Vec::new(),
            // Only the root hears from everyone (reduce), or everyone from the root (broadcast).
            causal: false,
        };
        for seed in 0..seeds(n) {
            let out = simulate(&scheds, &setup, seed * 104_729 + 3).unwrap_or_else(|e| {
                panic!(
                    "{coll} tree n={n} root={root} count={count} in_place={in_place} \
                     rendezvous={rdv} seed={seed}: {e}"
                )
            });
            if coll == Collective::Reduce {
                // Only the root's receive buffer changes.
                for (r, got) in out.iter().enumerate() {
                    if r != root {
                        assert_eq!(got, &initial(r).1, "reduce n={n} root={root}: rank {r}");
                    }
                }
            }
        }
    }
}

fn sweep_rooted(coll: Collective) {
    for n in 1..=64usize {
        let topo = Topology::flat(n);
        let roots: Vec<usize> = if n <= 8 {
            (0..n).collect()
        } else {
            vec![0, n / 2, n - 1]
        };
        for root in roots {
            for count in counts(n) {
                for in_place in [false, true] {
                    check_rooted(coll, &topo, root, count, in_place);
                }
            }
        }
    }
    for topo in [uneven(11), dealt(10, 3), Topology::grid(1, 2, 2, 2)] {
        for root in 0..topo.size() {
            check_rooted(coll, &topo, root, 7, root % 2 == 0);
        }
    }
}

#[test]
fn broadcast_tree_all_world_sizes_and_roots() {
    sweep_rooted(Collective::Broadcast);
}

#[test]
fn reduce_tree_all_world_sizes_and_roots() {
    sweep_rooted(Collective::Reduce);
}
