//! The host segment travels with the shared-memory connections: the lowest rank of a host makes
//! it, every other rank of the host receives it from that rank, and all see each other's slots.

use std::time::{Duration, Instant};

use ccl_core::Config;
use ccl_core::transport::{ConnectContext, Transport};
use ccl_shm::ShmTransport;

fn ctx(rank: usize, size: usize) -> ConnectContext {
    ConnectContext {
        rank,
        size,
        secret: [0x77; 32],
        local_ip: [127, 0, 0, 1].into(),
        config: Config::default(),
    }
}

#[test]
fn every_rank_of_the_host_gets_the_segment_from_the_lowest() {
    let n = 3;
    let ts: Vec<ShmTransport> = (0..n).map(|_| ShmTransport::new()).collect();
    for (r, t) in ts.iter().enumerate() {
        let peers: Vec<usize> = (0..n).filter(|&p| p != r).collect();
        t.prepare(&ctx(r, n), &peers).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut listeners: Vec<_> = (0..n).map(|r| ts[r].listen(&ctx(r, n)).unwrap()).collect();
    let handles: Vec<_> = listeners.iter().map(|l| l.handle()).collect();
    let mut eps = Vec::new();
    std::thread::scope(|s| {
        let accepts: Vec<_> = listeners
            .iter_mut()
            .enumerate()
            .map(|(r, l)| {
                s.spawn(move || {
                    (0..r)
                        .map(|_| l.accept(deadline).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (r, t) in ts.iter().enumerate() {
            for (p, h) in handles.iter().enumerate().skip(r + 1) {
                eps.push(t.connect(&ctx(r, n), p, h, deadline).unwrap());
            }
        }
        for a in accepts {
            eps.extend(a.join().unwrap().into_iter().map(|(_, e)| e));
        }
    });
    let mut groups: Vec<_> = ts
        .iter()
        .map(|t| t.take_host_group().expect("a host segment"))
        .collect();
    for (r, g) in groups.iter().enumerate() {
        assert_eq!(g.ranks, vec![0, 1, 2]);
        assert_eq!(g.segment.me(), r);
        assert_eq!(g.segment.ranks(), n);
    }
    groups[2].segment.my_slot()[..4].copy_from_slice(b"two!");
    groups[2].segment.post();
    assert!(groups[0].segment.reached([2], 1));
    assert_eq!(&groups[0].segment.slot(2)[..4], b"two!");
    assert_eq!(&groups[1].segment.slot(2)[..4], b"two!");
    // Taken once.
    assert!(ts[0].take_host().is_none());
}

#[test]
fn a_rank_alone_on_its_host_gets_no_segment() {
    let t = ShmTransport::new();
    t.prepare(&ctx(0, 1), &[]).unwrap();
    assert!(t.take_host().is_none());
}

/// A process that does not hold the job's secret reaches the listener's socket (it is in the
/// same network namespace) but gets no connection and no descriptor (the pair's memory and the
/// host segment travel only after the handshake): the listener drops it, and a real peer still
/// connects afterwards.
#[test]
fn a_connector_without_the_secret_gets_nothing() {
    let n = 2;
    let ts: Vec<ShmTransport> = (0..n).map(|_| ShmTransport::new()).collect();
    for (r, t) in ts.iter().enumerate() {
        t.prepare(&ctx(r, n), &[1 - r]).unwrap();
    }
    let mut l = ts[1].listen(&ctx(1, n)).unwrap();
    let h = l.handle();
    let intruder = ShmTransport::new();
    let mut wrong = ctx(0, n);
    wrong.secret = [0x78; 32];
    intruder.prepare(&wrong, &[1]).unwrap();
    std::thread::scope(|s| {
        let a = s.spawn(move || {
            // The intruder's attempt must not come out of accept: only the real peer does.
            let got = l.accept(Instant::now() + Duration::from_secs(60));
            let (peer, _ep) = got.expect("the real peer connects");
            assert_eq!(peer, 0);
        });
        let e = intruder
            .connect(&wrong, 1, &h, Instant::now() + Duration::from_secs(10))
            .expect_err("a connector with the wrong secret must be refused");
        eprintln!("refused: {e}");
        let ok = ts[0].connect(&ctx(0, n), 1, &h, Instant::now() + Duration::from_secs(60));
        assert!(ok.is_ok(), "{:?}", ok.err());
        a.join().unwrap();
    });
}
