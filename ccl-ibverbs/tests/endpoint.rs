//! The endpoint contract over a real device. Every test here needs one, so they are ignored by
//! default and `scripts/rxe-tests.sh` runs them in the SoftRoCE VM (`--include-ignored`); run
//! there or on a host with an active RoCE port, a test without a device fails. Two endpoints in one process, connected through the transport's own listener:
//! an ordered byte stream whatever the piece sizes, `recv_with` that takes whole elements only
//! (a partial element at a slot boundary is offered again, joined with the next bytes), several
//! data QPs (pieces round-robin, or each send split across them), non-blocking calls with
//! `prepare_wait`, and a peer that goes away.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use ccl_core::Config;
use ccl_core::transport::{ConnectContext, Endpoint, Interest, Transport};
use ccl_ibverbs::IbTransport;
use nix::poll::{PollFd, PollFlags, PollTimeout};

/// The transport on the host's active RoCE port; fails the test without one (only a run that
/// includes ignored tests gets here).
fn transport(cfg: &Config) -> IbTransport {
    assert!(
        ccl_ibverbs::probe(cfg),
        "no active RoCE port: this test needs one (scripts/rxe-tests.sh runs it in the SoftRoCE VM)"
    );
    IbTransport::open(cfg).expect("open the device")
}

fn ctx(rank: usize, cfg: &Config) -> ConnectContext {
    ConnectContext {
        rank,
        size: 2,
        secret: [9; 32],
        local_ip: [127, 0, 0, 1].into(),
        config: cfg.clone(),
    }
}

/// Endpoints (rank 0 side, rank 1 side).
fn pair(cfg: &Config) -> (Box<dyn Endpoint>, Box<dyn Endpoint>) {
    let t = transport(cfg);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut l = t.listen(&ctx(1, cfg)).unwrap();
    let h = l.handle();
    let t2 = t.clone();
    let c0 = ctx(0, cfg);
    let j = std::thread::spawn(move || t2.connect(&c0, 1, &h, deadline).unwrap());
    let (peer, e1) = l.accept(deadline).unwrap();
    assert_eq!(peer, 0);
    let e0 = j.join().unwrap();
    assert_eq!((e0.peer(), e1.peer()), (1, 0));
    (e0, e1)
}

/// Blocks like the executor does until `ep` may progress for `i`.
fn wait(ep: &mut dyn Endpoint, i: Interest) {
    if !ep.prepare_wait(i).unwrap() {
        return;
    }
    let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
    ep.wait_fds(i, &mut fds);
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|(f, fl)| PollFd::new(*f, *fl)).collect();
    nix::poll::poll(&mut p, PollTimeout::from(100u16)).unwrap();
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 8)) as u8
}

/// Sends `total` bytes in pieces of varying odd sizes from one thread and receives them in
/// another, half with `recv` and half with `recv_with` taking 8-byte elements only.
fn stream(cfg: &Config, total: usize) {
    let (mut a, mut b) = pair(cfg);
    let sender = std::thread::spawn(move || {
        let data: Vec<u8> = (0..total).map(pattern).collect();
        let mut off = 0;
        let mut k = 0usize;
        while off < total {
            // Odd piece sizes, so slot boundaries fall inside elements.
            let piece = [1, 3, 4093, 5, 70001, 13, 262147, 7][k % 8].min(total - off);
            let mut sent = 0;
            while sent < piece {
                let n = a.send(&data[off + sent..off + piece]).unwrap();
                sent += n;
                if n == 0 {
                    wait(
                        &mut *a,
                        Interest {
                            send: true,
                            recv: false,
                        },
                    );
                }
            }
            off += piece;
            k += 1;
        }
        a
    });
    let mut got = vec![0u8; total];
    let mut off = 0;
    let mut lends = 0;
    let t0 = Instant::now();
    while off < total {
        assert!(t0.elapsed() < Duration::from_secs(120), "stalled at {off}");
        let n = if (off / 100_000) % 2 == 0 {
            let end = (off + 100_000).min(total);
            b.recv(&mut got[off..end]).unwrap()
        } else {
            // Whole 8-byte elements only (as a reducing receive takes them), except at the
            // very end of the stream.
            let left = total - off;
            let dst = &mut got[off..];
            let mut here = 0;
            b.recv_with(left, &mut |bytes: &[u8]| {
                let k = if bytes.len() == left - here {
                    bytes.len()
                } else {
                    bytes.len() / 8 * 8
                };
                dst[here..here + k].copy_from_slice(&bytes[..k]);
                here += k;
                lends += 1;
                k
            })
            .unwrap()
        };
        off += n;
        if n == 0 {
            wait(
                &mut *b,
                Interest {
                    send: false,
                    recv: true,
                },
            );
        }
    }
    let a = sender.join().unwrap();
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, pattern(i), "byte {i} of {total}");
    }
    assert!(lends > 0);
    drop(a);
    drop(b);
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn byte_stream_with_odd_pieces_one_qp() {
    let mut cfg = Config::default();
    cfg.ib.slots = 4;
    cfg.ib.slot_size = 64 << 10;
    stream(&cfg, 3_000_001);
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn byte_stream_with_odd_pieces_four_qps() {
    let mut cfg = Config::default();
    cfg.ib.qps_per_conn = 4;
    cfg.ib.slots = 8;
    cfg.ib.slot_size = 16 << 10;
    stream(&cfg, 2_000_003);
}

/// `CCL_IB_SPLIT_DATA_ON_QPS=1`: every send is cut into one piece per QP (odd sizes give odd
/// shares, and the 1-byte sends the smallest pieces).
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn byte_stream_split_across_four_qps() {
    let mut cfg = Config::default();
    cfg.ib.qps_per_conn = 4;
    cfg.ib.split_data_on_qps = true;
    cfg.ib.slots = 8;
    cfg.ib.slot_size = 64 << 10;
    stream(&cfg, 2_000_003);
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn a_closed_peer_fails_the_waiting_side() {
    let cfg = Config::default();
    let (a, mut b) = pair(&cfg);
    drop(a);
    let t0 = Instant::now();
    let i = Interest {
        send: false,
        recv: true,
    };
    let e = loop {
        let mut x = [0u8; 8];
        match b.recv(&mut x) {
            Ok(0) => {}
            Ok(n) => panic!("received {n} bytes from nobody"),
            Err(e) => break e,
        }
        if let Err(e) = b.prepare_wait(i) {
            break e;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no error");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(e.kind(), ccl_core::ErrorKind::Remote, "{e}");
    assert_eq!(e.peer_id(), Some(0), "{e}");
    assert!(e.to_string().contains("peer 0"), "{e}");
}
