//! Small fabrics whose answers can be worked out by hand, and the checks that tie the grouped
//! ring to the library's own schedules.

use ccl_sim::engine;
use ccl_sim::program::{Dep, Flow, Program};
use ccl_sim::{Fabric, Hashing, Network, Placement, Ports, Source, simulate};

/// `hosts` hosts of one rank in one rack at 8 Gbit/s (1e9 B/s), fixed latencies, fast CPUs.
fn small(hosts: usize) -> Fabric {
    Fabric {
        ranks_per_host: 1,
        hosts_per_rack: hosts,
        racks_per_zone: 1,
        zones: 1,
        nic_gbps: 8.0,
        hop_latency: 1e-6,
        op_overhead: 2e-6,
        reduce_bps: 1e15,
        copy_bps: 1e15,
        ..Fabric::default()
    }
}

fn flow(src: u32, dst: u32, bytes: f64) -> Flow {
    Flow {
        src,
        dst,
        bytes,
        ops: 1,
        deps: Vec::new(),
        locks: Vec::new(),
        reduce: 0.0,
        step: 0,
    }
}

fn run(f: &Fabric, flows: Vec<Flow>) -> engine::Outcome {
    let p = Program {
        ranks: f.ranks(),
        flows,
        ..Program::default()
    };
    engine::run(&Network::new(f).unwrap(), &p).unwrap()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[test]
fn one_flow_on_one_link() {
    // Overhead, then 1 MB at 1 GB/s, then two hops of latency.
    let o = run(&small(2), vec![flow(0, 1, 1e6)]);
    let want = 2e-6 + 1e-3 + 2e-6;
    assert!(close(o.time, want, 1e-9), "{} vs {want}", o.time);
    assert!(close(o.flows[0].sent, 2e-6 + 1e-3, 1e-9));
}

#[test]
fn two_flows_colliding_share_the_link() {
    // Two senders into one receiver: its NIC is shared, each gets half until both end.
    let o = run(&small(3), vec![flow(0, 2, 1e6), flow(1, 2, 1e6)]);
    let want = 2e-6 + 2e-3 + 2e-6;
    assert!(close(o.time, want, 1e-9), "{} vs {want}", o.time);
    // Unequal sizes: the small one ends at 2 x 0.5 MB / 1 GB/s, then the big one has the link.
    let o = run(&small(3), vec![flow(0, 2, 0.5e6), flow(1, 2, 1.5e6)]);
    assert!(close(o.flows[0].sent, 2e-6 + 1e-3, 1e-9));
    assert!(close(o.flows[1].sent, 2e-6 + 2e-3, 1e-9));
    // Across racks with one spine: both cross the one uplink of rack 0 whatever the hash.
    let f = Fabric {
        hosts_per_rack: 2,
        racks_per_zone: 2,
        spines: 1,
        rack_uplink_gbps: 8.0,
        ..small(2)
    };
    let o = run(&f, vec![flow(0, 2, 1e6), flow(1, 3, 1e6)]);
    let want = 2e-6 + 2e-3 + 4e-6;
    assert!(close(o.time, want, 1e-9), "{} vs {want}", o.time);
}

#[test]
fn max_min_gives_the_leftover_to_the_unconstrained() {
    // Flows 0->2 and 1->2 share rank 2's NIC; flow 1->3 shares rank 1's NIC with 1->2. Max-min:
    // 0->2 and 1->2 get 0.5 GB/s each (rank 2's NIC is full), 1->3 gets the other 0.5 of rank
    // 1's NIC.
    let o = run(
        &small(4),
        vec![flow(0, 2, 1e6), flow(1, 2, 1e6), flow(1, 3, 0.5e6)],
    );
    for (i, bytes) in [1e6, 1e6, 0.5e6].into_iter().enumerate() {
        let rate = bytes / (o.flows[i].sent - o.flows[i].start);
        assert!(close(rate, 0.5e9, 1e-6), "flow {i}: {rate}");
    }
}

#[test]
fn dependencies_and_streams_are_timed() {
    // 0 -> 1, then 1 -> 2 once it arrived: two transfers back to back.
    let mut b = flow(1, 2, 1e6);
    b.deps.push(Dep::Arrived(0));
    let o = run(&small(3), vec![flow(0, 1, 1e6), b]);
    let one = 2e-6 + 1e-3 + 2e-6;
    assert!(close(o.time, 2.0 * one, 1e-9), "{}", o.time);
    // Streaming instead: the second starts once the first piece (128 KiB) crossed, and then
    // goes no faster than the first.
    let mut b = flow(1, 2, 1e6);
    b.locks.push(ccl_sim::program::Lock {
        flow: 0,
        head_start: false,
    });
    let o = run(&small(3), vec![flow(0, 1, 1e6), b]);
    let gate = 2e-6 + 2e-6 + 131072.0 / 1e9;
    assert!(close(o.flows[1].start, gate + 2e-6, 1e-9));
    assert!(close(o.time, gate + 2e-6 + 1e-3 + 2e-6, 1e-9), "{}", o.time);
}

#[test]
fn ring_on_a_non_blocking_fabric_is_the_alpha_beta_formula() {
    // No hop latency: each of the 2(n-1) steps costs alpha + chunk / bandwidth.
    for n in [2usize, 3, 5, 8] {
        let f = Fabric {
            hop_latency: 0.0,
            ..small(n)
        };
        let bytes = 4 * 8 * 1000 * n; // whole elements, chunks equal
        let r = simulate(&f, "ring", bytes, Source::Built).unwrap();
        let c = (bytes / n) as f64;
        let want = 2.0 * (n as f64 - 1.0) * (2e-6 + c / 1e9);
        assert!(
            close(r.time_us * 1e-6, want, 1e-9),
            "n={n}: {} vs {want}",
            r.time_us * 1e-6
        );
        // The grouped ring agrees.
        let p = simulate(&f, "ring", bytes, Source::Pattern).unwrap();
        assert!(
            close(p.time_us, r.time_us, 1e-6),
            "n={n}: {} vs {}",
            p.time_us,
            r.time_us
        );
    }
}

#[test]
fn the_grouped_ring_matches_the_built_one() {
    // Fabrics with collisions, several ranks per host, a slow host, latency-bound and
    // bandwidth-bound sizes.
    let base = Fabric {
        ranks_per_host: 2,
        hosts_per_rack: 4,
        racks_per_zone: 2,
        zones: 2,
        spines: 2,
        aggs: 2,
        ..Fabric::default()
    }
    .with_oversubscription(2.0, 1.0);
    let cases = [
        base.clone(),
        Fabric {
            placement: Placement::Scattered,
            ..base.clone()
        },
        Fabric {
            slow_hosts: vec![(3, 0.5)],
            qps: 4,
            ..base.clone()
        },
    ];
    for f in &cases {
        for bytes in [4096usize, 1 << 20, 64 << 20] {
            let a = simulate(f, "ring", bytes, Source::Built).unwrap();
            let b = simulate(f, "ring", bytes, Source::Pattern).unwrap();
            let pa = ccl_sim::program(f, "ring", bytes, Source::Built).unwrap();
            let pb = ccl_sim::program(f, "ring", bytes, Source::Pattern).unwrap();
            assert_eq!(pa.traffic(), pb.traffic());
            assert!(
                close(b.time_us, a.time_us, 0.03),
                "{bytes} B: pattern {} us, built {} us ({:?})",
                b.time_us,
                a.time_us,
                f.placement
            );
        }
    }
}

#[test]
fn every_algorithm_runs_and_respects_the_nic_bound() {
    let f = Fabric {
        ranks_per_host: 2,
        hosts_per_rack: 3,
        racks_per_zone: 2,
        zones: 1,
        spines: 2,
        ..Fabric::default()
    };
    let nic = f.nic_gbps * 1e9 / 8.0;
    for algo in ccl_sim::schedules::allreduce_algos() {
        for bytes in [8usize, 4096, 4 << 20] {
            let r = simulate(&f, algo, bytes, Source::Built)
                .unwrap_or_else(|e| panic!("{algo} {bytes}: {e}"));
            // No host gets its data out faster than its NIC: hosts send at least the bytes of
            // a ring between hosts.
            let h = f.hosts() as f64;
            let floor = 2.0 * (h - 1.0) / h * bytes as f64 / nic;
            assert!(
                r.time_us * 1e-6 >= floor * 0.999,
                "{algo} {bytes}: {}",
                r.time_us
            );
            assert!(r.busbw_gbs > 0.0);
        }
    }
}

#[test]
fn runs_are_deterministic_with_a_seed() {
    let f = Fabric {
        ranks_per_host: 1,
        hosts_per_rack: 8,
        racks_per_zone: 4,
        spines: 4,
        qps: 2,
        placement: Placement::Scattered,
        ..Fabric::default()
    };
    let a = simulate(&f, "tree", 1 << 20, Source::Built).unwrap();
    let b = simulate(&f, "tree", 1 << 20, Source::Built).unwrap();
    assert_eq!(a.time_us, b.time_us);
    assert_eq!(
        serde_json::to_string(&a.tiers).unwrap(),
        serde_json::to_string(&b.tiers).unwrap()
    );
    // Spraying evens the uplinks out.
    let s = simulate(
        &Fabric {
            hashing: Hashing::Spray,
            ..f.clone()
        },
        "tree",
        1 << 20,
        Source::Built,
    )
    .unwrap();
    let up = |r: &ccl_sim::Report| {
        r.tiers
            .iter()
            .find(|t| t.tier == "rack-up")
            .unwrap()
            .imbalance
    };
    assert!(up(&s) <= up(&a) + 1e-9, "{} vs {}", up(&s), up(&a));
}

#[test]
fn one_port_per_connection_wastes_qps() {
    // One rack-crossing connection, two spines at half a NIC each: one QP (or several QPs on
    // one port) gets one uplink, half the NIC; enough QPs with their own ports get both
    // (unless every one hashes to the same spine, which 8 QPs make unlikely).
    let f = Fabric {
        ranks_per_host: 1,
        hosts_per_rack: 1,
        racks_per_zone: 2,
        spines: 2,
        hop_latency: 0.0,
        op_overhead: 0.0,
        nic_gbps: 8.0,
        rack_uplink_gbps: 4.0,
        ..Fabric::default()
    };
    let t = |qps, ports| {
        run(
            &Fabric {
                qps,
                ports,
                ..f.clone()
            },
            vec![flow(0, 1, 1e6)],
        )
        .time
    };
    assert!(close(t(1, Ports::PerQp), 2e-3, 1e-9));
    assert!(close(t(8, Ports::PerConn), 2e-3, 1e-9));
    assert!(t(8, Ports::PerQp) < 1.9e-3, "{}", t(8, Ports::PerQp));
}

#[test]
fn a_slow_host_paces_the_ring_and_finishes_last_or_close() {
    let f = Fabric {
        ranks_per_host: 1,
        hosts_per_rack: 8,
        racks_per_zone: 1,
        reduce_bps: 1e15,
        ..Fabric::default()
    };
    let bytes = 256 << 20;
    let fast = simulate(&f, "ring", bytes, Source::Built).unwrap();
    let slow = simulate(
        &Fabric {
            slow_hosts: vec![(5, 0.5)],
            ..f.clone()
        },
        "ring",
        bytes,
        Source::Built,
    )
    .unwrap();
    let ratio = slow.time_us / fast.time_us;
    assert!(ratio > 1.8 && ratio < 2.05, "{ratio}");
    let s = slow.slowest.unwrap();
    assert!(s.src_host == 5 || s.dst_host == 5, "{s:?}");
}

#[test]
fn bad_programs_are_refused() {
    let f = small(2);
    let net = Network::new(&f).unwrap();
    let mut p = Program {
        ranks: 2,
        flows: vec![flow(0, 1, 1.0)],
        ..Program::default()
    };
    p.flows[0].deps.push(Dep::Arrived(7));
    assert!(engine::run(&net, &p).unwrap_err().contains("missing"));
    // Two flows waiting for each other: found out, not a hang.
    let mut a = flow(0, 1, 1.0);
    a.deps.push(Dep::Sent(1));
    let mut b = flow(1, 0, 1.0);
    b.deps.push(Dep::Sent(0));
    let p = Program {
        ranks: 2,
        flows: vec![a, b],
        ..Program::default()
    };
    let e = engine::run(&net, &p).unwrap_err();
    assert!(e.contains("cannot finish"), "{e}");
    assert!(simulate(&f, "pairwise", 8, Source::Built).is_err());
    assert!(simulate(&f, "tree", 8, Source::Pattern).is_err());
}
