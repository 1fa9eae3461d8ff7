//! The hierarchical allreduce on host memory (`Algo::HierShm`), checked symbolically with every
//! host's memory modelled on its own: 2x2, 2x3, 3x2, uneven hosts and ranks alone on their
//! host, hosts whose ranks interleave in rank order, small slots (many chunks, both halves of
//! a slot in turn), leader-based and with every rank on the network, in and out of place, sum
//! and average, and two operations back to back.

use ccl_algos::algo::{Algo, AlgoError, Collective, build};
use ccl_algos::allreduce::hier_shm;
use ccl_algos::schedule::{Action, Buf, Region, Schedule, Shape};
use ccl_algos::symbolic::{Setup, simulate, simulate_hosts, twice};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// Ranks on hosts named as `hosts` says (rank `r` on `hosts[r]`).
fn placed(hosts: &[&str]) -> Topology {
    Topology::from_hosts(&hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
}

/// `h` hosts of `k` ranks, ranks of a host consecutive.
fn grid(h: usize, k: usize) -> Topology {
    let names: Vec<String> = (0..h * k).map(|r| format!("host{}", r / k)).collect();
    Topology::from_hosts(&names)
}

/// Each host's ranks, ascending (host rank `i` is the `i`-th).
fn hosts_of(topo: &Topology) -> Vec<Vec<usize>> {
    let mut g = topo.host_groups();
    for h in &mut g {
        h.sort_unstable();
    }
    g
}

fn schedules(
    topo: &Topology,
    count: usize,
    in_place: bool,
    op: ReduceOp,
    slot: usize,
    leader_max: usize,
) -> Vec<Schedule> {
    let n = topo.size();
    (0..n)
        .map(|r| {
            let sh = Shape {
                host_slot: slot,
                ..Shape::new(r, n, count, in_place, op)
            };
            let s = hier_shm::build_with(&sh, topo, leader_max);
            s.validate(if in_place { 0 } else { count }, count, in_place)
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            s
        })
        .collect()
}

fn check(topo: &Topology, what: &str, counts: &[usize], slots: &[usize], seeds: u64) {
    let hosts = hosts_of(topo);
    for &slot in slots {
        for &c in counts {
            for leader_max in [0, usize::MAX] {
                for in_place in [false, true] {
                    for op in [ReduceOp::Sum, ReduceOp::Avg] {
                        let scheds = schedules(topo, c, in_place, op, slot, leader_max);
                        let st = Setup::allreduce(topo.size(), c, in_place, op, false);
                        for seed in 0..seeds {
                            simulate_hosts(&scheds, &st, &hosts, seed * 37 + 3).unwrap_or_else(|e| {
                                panic!("{what} slot={slot} c={c} leader_max={leader_max} in_place={in_place} {op} seed={seed}: {e}")
                            });
                        }
                        if !in_place {
                            let two: Vec<Schedule> = scheds.iter().map(twice).collect();
                            simulate_hosts(&two, &st, &hosts, 11).unwrap_or_else(|e| {
                                panic!("twice: {what} slot={slot} c={c} leader_max={leader_max} {op}: {e}")
                            });
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn two_by_two_two_by_three_and_three_by_two() {
    for (h, k) in [(2, 2), (2, 3), (3, 2)] {
        check(
            &grid(h, k),
            &format!("{h}x{k}"),
            &[1, 2, 5, 17, 40],
            &[2, 4, 10, 64],
            5,
        );
    }
}

#[test]
fn uneven_hosts_and_ranks_alone_on_their_host() {
    for hosts in [
        &["a", "a", "b", "b", "b"][..],
        &["a", "a", "a", "b", "b"],
        &["a", "b", "b"],
        &["a", "b", "c", "c"],
        &["a", "a", "b", "c", "c", "c"],
        // Ranks of a host not consecutive: rings follow the hosts' order, not the ranks'.
        &["a", "b", "a", "b"],
        &["x", "y", "y", "x", "z", "x"],
    ] {
        check(
            &placed(hosts),
            &format!("{hosts:?}"),
            &[1, 3, 7, 26],
            &[2, 6, 32],
            4,
        );
    }
}

#[test]
fn one_host_and_one_rank_per_host() {
    // Forced on one host it is a two-shot allreduce in host memory; with a rank per host a ring.
    check(&grid(1, 3), "1x3", &[1, 5, 17], &[2, 8], 4);
    check(&grid(3, 1), "3x1", &[1, 5, 17], &[2, 8], 4);
    check(&grid(1, 1), "1x1", &[0, 1, 5], &[2], 1);
    check(&grid(2, 2), "2x2 empty", &[0], &[4], 1);
}

/// With the hosts modelled apart, a schedule that reads across hosts or forgets a barrier is
/// caught.
#[test]
fn the_checker_keeps_hosts_apart() {
    let topo = grid(2, 2);
    let hosts = hosts_of(&topo);
    let st = Setup::allreduce(4, 8, false, ReduceOp::Sum, false);
    // Without the barriers that publish the copy-ins, owners read slots nobody published.
    let scheds: Vec<Schedule> = schedules(&topo, 8, false, ReduceOp::Sum, 4, 0)
        .iter()
        .map(|s| {
            let mut t = Schedule::new("broken");
            t.host_slot = s.host_slot;
            for o in &s.ops {
                if !matches!(o.action, Action::WaitPosts { count } if count % 2 == 1) {
                    t.push(o.action, &o.deps, o.stream_from, o.step);
                }
            }
            t.finish()
        })
        .collect();
    let failed = (0..20).any(|seed| simulate_hosts(&scheds, &st, &hosts, seed).is_err());
    assert!(
        failed,
        "a schedule without its barriers must fail the check"
    );
    // Host rank 2 exists on no host of two ranks.
    let mut bad = Schedule::new("bad");
    bad.host_slot = 4;
    bad.push(
        Action::Copy {
            src: Region::new(Buf::Host(2), 0, 1),
            dst: Region::new(Buf::Recv, 0, 1),
        },
        &[],
        None,
        0,
    );
    let bad = bad.finish();
    let ok = |_| Schedule::new("ok").finish();
    let scheds = vec![bad, ok(1), ok(2), ok(3)];
    let st = Setup::allreduce(4, 1, false, ReduceOp::Sum, false);
    let e = simulate_hosts(&scheds, &st, &hosts, 1).unwrap_err();
    assert!(e.contains("outside the slot"), "{e}");
    // Modelled as one host of four, the two-host schedules wait for posts from ranks that never
    // make them in this memory: the check must not pass by accident.
    let scheds = schedules(&topo, 8, false, ReduceOp::Sum, 4, 0);
    let e = simulate(
        &scheds,
        &Setup::allreduce(4, 8, false, ReduceOp::Sum, false),
        1,
    );
    assert!(e.is_err());
}

#[test]
fn without_host_memory_it_is_refused() {
    let e = build(
        Collective::AllReduce,
        Algo::HierShm,
        &Shape::new(0, 4, 8, false, ReduceOp::Sum),
        &grid(2, 2),
    )
    .unwrap_err();
    assert!(matches!(e, AlgoError::NoHostMemoryPerHost { .. }), "{e}");
    assert!(e.to_string().contains("every host"), "{e}");
}
