//! The endpoint contract over a real device: the shared conformance suite
//! (`ccl_core::transport::conformance`, the checks every transport passes) with one data QP,
//! with four (pieces round-robin) and with every send split across four, then what only verbs
//! has: zero-copy receives (grants larger and smaller than what the sender sends in one call,
//! with the sender's bytes staged or registered), and two ports striped as two planes. Every
//! test here needs a device, so they are ignored by default and `scripts/rxe-tests.sh` runs them
//! in the SoftRoCE VM (`--include-ignored`); run there or on a host with an active RoCE port, a
//! test without a device fails.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use ccl_core::Config;
use ccl_core::transport::conformance::{self, Pair};
use ccl_core::transport::{Endpoint, Interest, MemRegion, Transport};
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

/// Endpoints (rank 0 side, rank 1 side) of a transport on `cfg`.
fn pair(cfg: &Config) -> Pair {
    conformance::connect_pair(&transport(cfg), cfg)
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn one_qp_meets_the_endpoint_contract() {
    let mut cfg = Config::default();
    cfg.ib.slots = 4;
    cfg.ib.slot_size = 64 << 10;
    conformance::run_all(&|| pair(&cfg));
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn four_qps_meet_the_endpoint_contract() {
    let mut cfg = Config::default();
    cfg.ib.qps_per_conn = 4;
    cfg.ib.slots = 8;
    cfg.ib.slot_size = 16 << 10;
    conformance::run_all(&|| pair(&cfg));
}

/// `CCL_IB_SPLIT_DATA_ON_QPS=1`: every send is cut into one piece per QP (odd sizes give odd
/// shares, and 1-byte sends the smallest pieces).
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn sends_split_across_four_qps_meet_the_endpoint_contract() {
    let mut cfg = Config::default();
    cfg.ib.qps_per_conn = 4;
    cfg.ib.split_data_on_qps = true;
    cfg.ib.slots = 8;
    cfg.ib.slot_size = 64 << 10;
    conformance::run_all(&|| pair(&cfg));
}

/// Two ports (`CCL_IB_HCA=rxe0,rxe1`, both in the SoftRoCE VM that scripts/rxe-tests.sh boots):
/// a verbs connection on each, one striped endpoint over both, as for two network planes.
#[test]
#[ignore = "needs two RDMA ports; scripts/rxe-tests.sh runs it in the SoftRoCE VM (rxe0, rxe1)"]
fn two_ports_striped_meet_the_endpoint_contract() {
    let mut cfg = Config::default();
    cfg.ib.hca = Some(std::env::var("IB_TEST_PLANES").unwrap_or_else(|_| "rxe0,rxe1".into()));
    cfg.ib.slots = 4;
    cfg.ib.slot_size = 64 << 10;
    let t = transport(&cfg);
    assert_eq!(
        t.planes().len(),
        2,
        "CCL_IB_HCA={:?} must match two active ports (scripts/rxe-tests.sh's VM has rxe0 and \
         rxe1; elsewhere set IB_TEST_PLANES)",
        cfg.ib.hca
    );
    conformance::run_all(&|| conformance::connect_pair(&t, &cfg));
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

const SEND: Interest = Interest {
    send: true,
    recv: false,
};
const RECV: Interest = Interest {
    send: false,
    recv: true,
};

/// Sends all of `data`, from registered memory when `region` is given.
fn send_all(a: &mut dyn Endpoint, data: &[u8], region: Option<&dyn MemRegion>) {
    let (mut off, t0) = (0, Instant::now());
    while off < data.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "send stalled at {off}"
        );
        let n = match region {
            Some(r) => a.send_registered(&data[off..], r).unwrap(),
            None => a.send(&data[off..]).unwrap(),
        };
        off += n;
        if n == 0 {
            wait(a, SEND);
        }
    }
}

/// Receives all of `dst`, zero copy when `region` is given.
fn recv_all(b: &mut dyn Endpoint, dst: &mut [u8], region: Option<&dyn MemRegion>) {
    let (mut off, t0) = (0, Instant::now());
    while off < dst.len() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "receive stalled at {off}"
        );
        let n = match region {
            Some(r) => b.recv_registered(&mut dst[off..], r).unwrap(),
            None => b.recv(&mut dst[off..]).unwrap(),
        };
        off += n;
        if n == 0 {
            wait(b, RECV);
        }
    }
}

/// A small ring (so the sender cannot run far ahead of a grant) over two data QPs (so pieces
/// complete out of order), or four with every send split across them.
fn grant_config(split: bool) -> Config {
    let mut cfg = Config::default();
    cfg.ib.slots = 4;
    cfg.ib.slot_size = 16 << 10;
    cfg.ib.qps_per_conn = if split { 4 } else { 2 };
    cfg.ib.split_data_on_qps = split;
    cfg
}

/// The sender sends the stream in pieces of `sends` bytes (alternately staged and from
/// registered memory); the receiver takes pieces of `recvs` bytes, alternately into registered
/// memory (zero copy: a grant) and plain. The first receive, registered, asks for its grant
/// before the sender starts, so its bytes must land in place (all but what the ring holds);
/// the bytes must come out right
/// whatever the grants and sends cut, and the connections' counters must show bytes received
/// in place.
fn grants(cfg: &Config, sends: &[usize], recvs: &[usize]) {
    let total: usize = sends.iter().sum();
    assert_eq!(total, recvs.iter().sum::<usize>());
    let t = transport(cfg);
    let before = ccl_ibverbs::traffic();
    let (mut a, mut b) = conformance::connect_pair(&t, cfg);
    let data: Vec<u8> = (0..total).map(pattern).collect();
    let src_reg = t.register(&data).unwrap().expect("verbs registers memory");
    let mut got = vec![0u8; total];
    let dst_reg = t.register(&got).unwrap().expect("verbs registers memory");
    let (go_tx, go_rx) = std::sync::mpsc::channel();
    let sends = sends.to_vec();
    std::thread::scope(|s| {
        let (data, src_reg) = (&data, &src_reg);
        s.spawn(move || {
            go_rx.recv().unwrap();
            let mut off = 0;
            for (k, &n) in sends.iter().enumerate() {
                let region = (k % 2 == 1).then_some(&**src_reg);
                send_all(&mut *a, &data[off..off + n], region);
                off += n;
            }
            drop(a);
        });
        let mut off = 0;
        for (k, &n) in recvs.iter().enumerate() {
            let dst = &mut got[off..off + n];
            if k == 0 {
                // Nothing was sent yet: this grants the range and takes nothing.
                assert_eq!(b.recv_registered(dst, &*dst_reg).unwrap(), 0);
                go_tx.send(()).unwrap();
            }
            let region = (k % 2 == 0).then_some(&*dst_reg);
            recv_all(&mut *b, dst, region);
            off += n;
        }
    });
    drop(b);
    drop(dst_reg);
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, pattern(i), "byte {i} of {total}");
    }
    // The sender sees the first grant before any credit (both come on the control QP, the
    // grant first), so at most the ring's bytes of the first range went through the ring.
    let after = ccl_ibverbs::traffic();
    let in_place = after.received_in_place - before.received_in_place;
    let ring = (cfg.ib.slots * cfg.ib.slot_size) as u64;
    assert!(
        in_place + ring >= recvs[0] as u64,
        "only {in_place} bytes landed in place; the first receive alone granted {} (ring {ring})",
        recvs[0]
    );
    assert!(after.sent_into_grants - before.sent_into_grants >= in_place);
}

/// One grant larger than what the sender sends in one call: three sends fill it, a fourth
/// goes past it into the ring, and the receive after it is plain.
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn a_grant_larger_than_a_send() {
    grants(
        &grant_config(false),
        &[100_001, 200_003, 3, 300_007],
        &[300_007, 300_007],
    );
}

/// Grants smaller than the sender's one call: its bytes go into the first range, the ring, a
/// second range and the ring again.
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn grants_smaller_than_a_send() {
    grants(
        &grant_config(false),
        &[1_000_003],
        &[250_001, 100_000, 400_001, 250_001],
    );
}

/// As above with every send split over four QPs, with registered sends on both sides of the
/// grants' edges.
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn grants_with_sends_split_over_four_qps() {
    grants(
        &grant_config(true),
        &[70_001, 500_000, 1, 429_999],
        &[300_001, 64, 699_936],
    );
}

/// While a range is granted, the peer may write into it: a plain receive is refused, not
/// served out of order.
#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn a_plain_receive_during_a_grant_is_an_error() {
    let cfg = grant_config(false);
    let t = transport(&cfg);
    let (_a, mut b) = conformance::connect_pair(&t, &cfg);
    let mut buf = vec![0u8; 1 << 20];
    let reg = t.register(&buf).unwrap().expect("verbs registers memory");
    assert_eq!(b.recv_registered(&mut buf, &*reg).unwrap(), 0);
    let mut other = [0u8; 16];
    let e = b.recv(&mut other).unwrap_err();
    assert!(e.to_string().contains("granted"), "{e}");
    // Resuming anywhere but at the granted range's next byte is refused too.
    let e = b.recv_registered(&mut buf[8..], &*reg).unwrap_err();
    assert!(e.to_string().contains("granted"), "{e}");
}
