//! What the ranks of a host share comes from the lowest of them when they join the host, before
//! any pair connects: the host segment, every rank's arena and every rank's life line. Pairs
//! then connect on their own.

use std::time::{Duration, Instant};

use ccl_core::transport::{ConnectContext, HostMemory, Listener, Transport};
use ccl_core::{Config, ErrorKind, Result};
use ccl_shm::{HostGroup, ShmTransport};

fn ctx(rank: usize, size: usize) -> ConnectContext {
    ConnectContext {
        rank,
        size,
        secret: [0x77; 32],
        local_ip: [127, 0, 0, 1].into(),
        config: Config::default(),
    }
}

fn no_watch(_: &[usize]) -> Result<()> {
    Ok(())
}

/// Every rank's transport and listener, and how each rank's join ended.
type Joined = (Vec<ShmTransport>, Vec<Box<dyn Listener>>, Vec<Result<()>>);

/// Ranks `0..n` of one host prepare, listen and join (those in `absent` do not).
fn join(n: usize, absent: &[usize], within: Duration) -> Joined {
    let ts: Vec<ShmTransport> = (0..n).map(|_| ShmTransport::new()).collect();
    let group: Vec<usize> = (0..n).collect();
    for (r, t) in ts.iter().enumerate() {
        let peers: Vec<usize> = (0..n).filter(|&p| p != r).collect();
        t.prepare(&ctx(r, n), &peers).unwrap();
    }
    let listeners: Vec<_> = (0..n).map(|r| ts[r].listen(&ctx(r, n)).unwrap()).collect();
    let leader = listeners[0].handle();
    let deadline = Instant::now() + within;
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = ts
            .iter()
            .enumerate()
            .filter(|(r, _)| !absent.contains(r))
            .map(|(r, t)| {
                let (group, leader) = (&group, &leader);
                s.spawn(move || t.join_host(&ctx(r, n), group, leader, deadline, &no_watch))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    (ts, listeners, results)
}

#[test]
fn every_rank_of_the_host_gets_what_it_shares_from_the_lowest() {
    let n = 3;
    let (ts, mut listeners, results) = join(n, &[], Duration::from_secs(60));
    for r in results {
        r.unwrap();
    }
    let mut groups: Vec<HostGroup> = ts
        .iter()
        .map(|t| t.take_host_group().expect("a host segment"))
        .collect();
    for (r, g) in groups.iter().enumerate() {
        assert_eq!(g.ranks, vec![0, 1, 2]);
        assert_eq!(g.segment.me(), r);
        assert_eq!(g.segment.ranks(), n);
        // Every other rank's arena is mapped here.
        assert!(g.has_shared(), "rank {r}");
        assert!(g.departures_fd().is_some(), "rank {r}");
        for i in 0..n {
            assert!(!g.gone(i), "rank {r} sees {i}");
        }
    }
    groups[2].segment.my_slot()[..4].copy_from_slice(b"two!");
    groups[2].segment.post();
    assert!(groups[0].segment.reached([2], 1));
    assert_eq!(&groups[0].segment.slot(2)[..4], b"two!");
    assert_eq!(&groups[1].segment.slot(2)[..4], b"two!");
    // Taken once.
    assert!(ts[0].take_host().is_none());
    // A pair connects on its own afterwards, with nothing of the host's in its set-up.
    let h = listeners[2].handle();
    std::thread::scope(|s| {
        let l = &mut listeners[2];
        let a = s.spawn(move || l.accept(Instant::now() + Duration::from_secs(60)));
        let mut ep = ts[1]
            .connect(&ctx(1, n), 2, &h, Instant::now() + Duration::from_secs(60))
            .unwrap();
        let (peer, mut back) = a.join().unwrap().unwrap();
        assert_eq!(peer, 1);
        assert_eq!(ep.send(b"pair").unwrap(), 4);
        let mut got = [0u8; 4];
        assert_eq!(back.recv(&mut got).unwrap(), 4);
        assert_eq!(&got, b"pair");
    });
    // A rank that leaves closes its life line: the others see it without a connection to it.
    let readable = |g: &HostGroup| {
        let fd = g.departures_fd().unwrap();
        let mut p = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
        nix::poll::poll(&mut p, nix::poll::PollTimeout::ZERO).unwrap() > 0
    };
    assert!(!readable(&groups[0]));
    let g2 = groups.pop().unwrap();
    drop(g2);
    assert!(readable(&groups[0]) && readable(&groups[1]));
    assert!(groups[0].gone(2) && groups[1].gone(2));
    assert!(!groups[0].gone(1) && !groups[1].gone(0));
    // Asked about, the departure no longer wakes the waits; it stays known.
    assert!(!readable(&groups[0]) && groups[0].gone(2));
}

#[test]
fn a_rank_that_never_joins_is_named() {
    let (_ts, _l, results) = join(4, &[2], Duration::from_secs(2));
    let e = results[0]
        .as_ref()
        .expect_err("the leader waits for rank 2");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.to_string()
            .contains("rank(s) 2 of this host never joined"),
        "{e}"
    );
    assert_eq!(e.peer_id(), Some(2), "{e}");
    for (r, res) in results.iter().enumerate().skip(1) {
        // The others give up at the deadline too, waiting for the leader.
        assert!(res.is_err(), "rank {r}");
    }
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
