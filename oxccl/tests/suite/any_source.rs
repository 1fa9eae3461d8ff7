//! Receiving from any source: every send is received exactly once, by the receive that names
//! its sender; peers whose next operation is a collective are passed over without disturbing
//! it; a probe that finds nothing fails with what each peer announced and leaves the
//! communicator usable.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ccl_core::config::{ConnectMode, TransportKind};
use common::*;
use oxccl::{ErrorKind, ReduceOp};

/// Each rank in turn receives two sends from every other rank, from any source (the pattern
/// of PyTorch's `test_send_recv_any_source`); every message carries its sender's rank, and
/// each sender must be named exactly twice.
fn every_send_once(cfg: oxccl::Config, max: usize) {
    const LEN: usize = 1000;
    for n in 1..=max {
        let cfg = cfg.clone();
        run_ranks(n, cfg, move |comm| {
            let (me, n) = (comm.rank(), comm.size());
            let mine = vec![me as u32; LEN];
            for dst in 0..n {
                if dst != me {
                    comm.send(&mine, dst).unwrap();
                    comm.send(&mine, dst).unwrap();
                    continue;
                }
                let mut seen = vec![0; n];
                for i in 0..2 * (n - 1) {
                    let mut buf = vec![u32::MAX; LEN];
                    // Half by probing then naming the sender, half in one call.
                    let from = if i % 2 == 0 {
                        let p = comm.probe().unwrap();
                        assert_eq!(p.bytes, 4 * LEN, "rank {me}: {p:?}");
                        comm.recv(&mut buf, p.peer).unwrap();
                        p.peer
                    } else {
                        comm.recv_any(&mut buf).unwrap()
                    };
                    assert!(buf.iter().all(|&v| v as usize == from), "rank {me}");
                    seen[from] += 1;
                }
                for (p, &k) in seen.iter().enumerate() {
                    assert_eq!(k, if p == me { 0 } else { 2 }, "rank {me}: {seen:?}");
                }
            }
            comm.barrier().unwrap();
        });
    }
}

#[test]
fn every_send_is_received_once_from_any_source() {
    for t in [TransportKind::Local, TransportKind::Tcp, TransportKind::Shm] {
        every_send_once(config(t, Duration::from_secs(60)), 5);
    }
}

/// With pairs connected on demand a sender's first send is also its first connection: the
/// receiver, connected to nobody, must see it arrive.
#[test]
fn a_sender_never_connected_before_is_found() {
    for t in [TransportKind::Tcp, TransportKind::Local] {
        let mut cfg = config(t, Duration::from_secs(60));
        cfg.connect = ConnectMode::Lazy;
        every_send_once(cfg, 4);
    }
}

/// Rank 2 sends and enters a ring allreduce (whose header reaches rank 0 at once); rank 1
/// sends later. Rank 0's second receive must pass over rank 2's allreduce and take rank 1's
/// send; its own allreduce then starts from the header the receive read ahead.
fn collective_passed_over(t: TransportKind) {
    let mut cfg = config(t, Duration::from_secs(60));
    cfg.algo = Some("allreduce:ring".into());
    // Rank 1 sends only once rank 0's own probe has seen rank 2's allreduce header (read ahead,
    // and named in the probe's timeout), so the case is the one named whatever the machine's
    // load: the state is waited for, not a time.
    let seen = Arc::new(AtomicBool::new(false));
    let got = run_ranks_with(
        3,
        cfg,
        |rank, c| {
            if rank == 0 {
                c.timeout = Duration::from_secs(2);
            }
        },
        move |comm| {
            let me = comm.rank();
            let mut order = Vec::new();
            match me {
                0 => {
                    let mut b = [0u64; 4];
                    let from = comm.recv_any(&mut b).unwrap();
                    assert_eq!((from, b), (2, [22; 4]), "rank 2 sends first");
                    order.push(from);
                    loop {
                        let e = comm.probe().expect_err("rank 1 sends only when told");
                        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
                        if e.to_string()
                            .contains("peer 2's next operation here is allreduce")
                        {
                            break;
                        }
                    }
                    seen.store(true, Ordering::Release);
                    let from = comm.recv_any(&mut b).unwrap();
                    assert_eq!(b, [11; 4]);
                    order.push(from);
                }
                1 => {
                    while !seen.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    comm.send(&[11u64; 4], 0).unwrap();
                }
                _ => comm.send(&[22u64; 4], 0).unwrap(),
            }
            let mut v: Vec<f64> = (0..3000).map(|i| (i * (me + 1)) as f64).collect();
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            let exact = v.iter().enumerate().all(|(i, &x)| x == (i * 6) as f64);
            (order, exact)
        },
    );
    assert_eq!(got[0].0, vec![2, 1], "{t:?}: rank 0's senders in order");
    for (r, (_, exact)) in got.iter().enumerate() {
        assert!(exact, "{t:?}: rank {r}'s allreduce after the receives");
    }
}

#[test]
fn a_peer_in_a_collective_is_passed_over() {
    for t in [TransportKind::Local, TransportKind::Tcp] {
        collective_passed_over(t);
    }
}

/// Nobody sends within rank 0's deadline: the probe fails naming what rank 1 does instead (a
/// barrier), and the communicator goes on: the barrier completes and a later send is found.
#[test]
fn a_probe_that_finds_nothing_names_the_peers_and_the_communicator_goes_on() {
    let cfg = config(TransportKind::Tcp, Duration::from_secs(60));
    let got = run_ranks_with(
        2,
        cfg,
        |rank, c| {
            // Long enough for rank 1's barrier header to be there on a loaded machine.
            if rank == 0 {
                c.timeout = Duration::from_secs(3);
            }
        },
        |comm| {
            if comm.rank() == 1 {
                comm.barrier().unwrap();
                comm.send(&[7i32; 3], 0).unwrap();
                return None;
            }
            let e = comm.probe().unwrap_err();
            comm.barrier().unwrap();
            let mut b = [0i32; 3];
            let from = comm.recv_any(&mut b).unwrap();
            assert_eq!((from, b), (1, [7; 3]));
            Some(e)
        },
    );
    let e = got[0].as_ref().expect("rank 0's probe error");
    let s = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{s}");
    assert!(
        s.contains("no peer sent to rank 0")
            && s.contains("peer 1's next operation here is barrier"),
        "{s}"
    );
}

/// A receive of the wrong size fails like a named one, describing both calls.
#[test]
fn a_receive_of_the_wrong_size_names_the_sender() {
    let cfg = config(TransportKind::Tcp, Duration::from_secs(20));
    let got = run_ranks(2, cfg, |comm| {
        if comm.rank() == 1 {
            // The receiver fails and the communicator with it; the send's own result is not
            // this test's subject.
            let _ = comm.send(&[1u8; 10], 0);
            return None;
        }
        let mut b = [0u8; 4];
        Some(comm.recv_any(&mut b).unwrap_err().to_string())
    });
    let s = got[0].as_ref().unwrap();
    assert!(s.contains("peer 1") && s.contains("10 bytes"), "{s}");
}

#[cfg(feature = "ib")]
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_any_source() {
    require_ib();
    every_send_once(config(TransportKind::Ib, Duration::from_secs(60)), 4);
    collective_passed_over(TransportKind::Ib);
}
