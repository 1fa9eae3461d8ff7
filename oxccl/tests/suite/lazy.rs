//! Connections on demand (`CCL_CONNECT=lazy`): pairs connect the first time an operation needs
//! them, each rank holds only the connections its algorithms use, results are exact, and
//! programs whose point-to-point order needs a peer's connection before that peer reaches the
//! matching call still finish.

use crate::common;

use std::time::Duration;

use ccl_core::config::{ConnectMode, TransportKind};
use common::*;
use oxccl::ReduceOp;

fn lazy(transport: TransportKind) -> oxccl::Config {
    let mut c = config(transport, Duration::from_secs(60));
    c.connect = ConnectMode::Lazy;
    c
}

/// A ring allreduce on 8 ranks connects each rank to its two ring neighbours and nobody else,
/// and nothing before the first call.
#[test]
fn a_ring_connects_each_rank_to_its_two_neighbours_only() {
    for transport in [TransportKind::Tcp, TransportKind::Local] {
        let mut cfg = lazy(transport);
        cfg.algo = Some("allreduce:ring".into());
        let n = 8;
        let seen = run_ranks(n, cfg, move |comm| {
            let before = comm.connected_peers();
            let wrong = allreduce_case::<f32>(&comm, 1000, ReduceOp::Sum, false)
                + allreduce_case::<i64>(&comm, 7, ReduceOp::Max, true);
            (before, comm.connected_peers(), wrong)
        });
        for (r, (before, after, wrong)) in seen.into_iter().enumerate() {
            assert!(
                before.is_empty(),
                "{transport:?} rank {r}: {before:?} before any call"
            );
            assert_eq!(wrong, 0, "{transport:?} rank {r}");
            let mut ring = vec![(r + 1) % n, (r + n - 1) % n];
            ring.sort();
            assert_eq!(after, ring, "{transport:?} rank {r}");
        }
    }
}

/// Every collective, on 5 ranks, gives the same results as with every pair connected, and the
/// connections grow only as calls need them.
#[test]
fn every_collective_is_exact_with_pairs_connected_on_demand() {
    let n = 5;
    let out = run_ranks(n, lazy(TransportKind::Tcp), move |comm| {
        let r = comm.rank();
        let mut wrong = 0;
        for count in [0, 1, 7, 1 << 16] {
            wrong += allreduce_case::<f64>(&comm, count, ReduceOp::Sum, false);
        }
        let mut b = vec![if r == 3 { 42u32 } else { 0 }; 33];
        comm.broadcast_in_place(&mut b, 3).unwrap();
        wrong += b.iter().filter(|&&v| v != 42).count();
        let send: Vec<u32> = (0..n as u32 * 4).map(|i| r as u32 * 1000 + i).collect();
        let mut recv = vec![0u32; send.len()];
        comm.all_gather(&send[..4], &mut recv[..4 * n]).unwrap();
        wrong += (0..4 * n)
            .filter(|&i| recv[i] != (i / 4) as u32 * 1000 + (i % 4) as u32)
            .count();
        comm.all_to_all(&send, &mut recv).unwrap();
        // Block j of what rank r receives is block r of what rank j sent.
        wrong += (0..4 * n)
            .filter(|&i| recv[i] != (i / 4) as u32 * 1000 + (r * 4 + i % 4) as u32)
            .count();
        (wrong, comm.connected_peers().len())
    });
    for (r, (wrong, peers)) in out.into_iter().enumerate() {
        assert_eq!(wrong, 0, "rank {r}");
        // After an alltoall every pair is connected.
        assert_eq!(peers, n - 1, "rank {r}");
    }
}

/// Rank 2 sends to 1, then to 0; rank 0 receives from 2, then sends to 1; rank 1 receives from
/// 0, then from 2. Rank 2 needs its pair with rank 1, which makes it, while rank 1 waits for
/// rank 0: rank 1 must connect when asked, not when its own program reaches rank 2.
#[test]
fn a_rank_busy_elsewhere_still_connects_when_a_higher_one_asks() {
    for transport in [TransportKind::Tcp, TransportKind::Local] {
        let got = run_ranks(3, lazy(transport), |comm| {
            let mut x = [0u8; 1];
            match comm.rank() {
                2 => {
                    comm.send(&[21u8], 1).unwrap();
                    comm.send(&[20u8], 0).unwrap();
                    vec![]
                }
                0 => {
                    comm.recv(&mut x, 2).unwrap();
                    comm.send(&[1u8], 1).unwrap();
                    vec![x[0]]
                }
                _ => {
                    let mut y = [0u8; 1];
                    comm.recv(&mut x, 0).unwrap();
                    comm.recv(&mut y, 2).unwrap();
                    vec![x[0], y[0]]
                }
            }
        });
        assert_eq!(got, vec![vec![20], vec![1, 21], vec![]], "{transport:?}");
    }
}

/// A peer that leaves without making the call: the rank waiting on it fails naming it (rank 0
/// connects when asked, its process stays, its communicator goes).
#[test]
fn a_peer_that_leaves_before_the_call_is_named() {
    let mut cfg = lazy(TransportKind::Tcp);
    cfg.timeout = Duration::from_secs(3);
    let out = run_ranks(2, cfg, |comm| {
        if comm.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            return None;
        }
        let mut x = [0u8; 4];
        Some(comm.recv(&mut x, 0).unwrap_err().to_string())
    });
    let e = out[1].as_ref().unwrap();
    assert!(e.contains("peer 0") && e.contains("closed"), "{e}");
}

/// Over shared memory, a host-memory collective connects no pair at all; a rank that then
/// leaves is still named to the ranks waiting for its post, through its life line (there is no
/// connection to it whose closing they could see).
#[test]
fn a_host_rank_never_connected_that_leaves_is_named() {
    let mut cfg = lazy(TransportKind::Shm);
    cfg.timeout = Duration::from_secs(30);
    let out = run_ranks(3, cfg, |comm| {
        let wrong = allreduce_case::<f32>(&comm, 2, ReduceOp::Sum, false);
        let connected = comm.connected_peers();
        if comm.rank() == 2 {
            return (wrong, connected, None);
        }
        let mut x = [1.0f32; 2];
        let e = comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
        (wrong, connected, Some((e.to_string(), e.peer_id())))
    });
    for (r, (wrong, connected, e)) in out.into_iter().enumerate() {
        assert_eq!(wrong, 0, "rank {r}");
        assert!(connected.is_empty(), "rank {r}: {connected:?}");
        if let Some((e, peer)) = e {
            assert!(e.contains("shared-memory peer 2 left"), "rank {r}: {e}");
            assert_eq!(peer, Some(2), "rank {r}: {e}");
        }
    }
}
