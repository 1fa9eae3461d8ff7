//! The slow-rank report and the flight recorder seen through the API.

use crate::common;

use std::time::Duration;

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Algo, Collective, ReduceOp};

#[test]
fn a_rank_slowed_on_purpose_is_named_by_the_slow_rank_report() {
    let mut cfg = config(TransportKind::Tcp, Duration::from_secs(60));
    // The slow rank is late by three times the threshold, and the threshold is far above what
    // scheduling on a loaded 2-core machine makes a punctual rank late by on average over a
    // window of 20 operations (a few milliseconds); with 25 ms against 10 the margins were
    // within the noise of a loaded machine.
    cfg.slow_window = 20;
    cfg.slow_ms = 20;
    let slow = 2;
    let reports = run_ranks(4, cfg, move |comm| {
        // Pairwise allgather talks to every peer, so every rank sees how late the slow one is.
        comm.set_algorithm(Collective::AllGather, Some(Algo::Pairwise))
            .unwrap();
        let mut named = Vec::new();
        for _ in 0..50 {
            if comm.rank() == slow {
                std::thread::sleep(Duration::from_millis(60));
            }
            let mut out = vec![0u32; 4 * 16];
            comm.all_gather(&[comm.rank() as u32; 16], &mut out)
                .unwrap();
            named.extend(comm.slow_peers().into_iter().map(|p| p.peer));
        }
        named.sort();
        named.dedup();
        (comm.rank(), named)
    });
    for (rank, named) in reports {
        if rank == slow {
            // The slow rank waits for nobody; it names nobody.
            assert!(named.is_empty(), "rank {rank} named {named:?}");
        } else {
            assert_eq!(named, vec![slow], "rank {rank} named {named:?}");
        }
    }
}

#[test]
fn the_recorder_holds_the_last_operations() {
    let mut cfg = config(TransportKind::Local, Duration::from_secs(60));
    cfg.trace_buffer = 8;
    run_ranks(3, cfg, |comm| {
        for k in 0..20 {
            let mut x = vec![k as f32; 100];
            comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        }
        let v: serde_json::Value = serde_json::from_str(&comm.trace_json()).unwrap();
        assert_eq!(v["rank"], comm.rank());
        let e = v["entries"].as_array().unwrap();
        assert_eq!(e.len(), 8);
        assert_eq!(e[7]["seq"], 20);
        assert_eq!(e[0]["seq"], 13);
        assert!(
            e.iter()
                .all(|x| x["state"] == "done" && x["name"] == "allreduce")
        );
        let peers = e[7]["peers"].as_array().unwrap();
        assert!(!peers.is_empty());
        assert!(peers.iter().all(|p| p["received"] == p["to_recv"]
            && p["sent"] == p["to_send"]
            && p["arrived"] == true));
    });
}
