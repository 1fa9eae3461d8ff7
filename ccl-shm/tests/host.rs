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
