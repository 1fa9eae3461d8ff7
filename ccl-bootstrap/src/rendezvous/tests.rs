use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ccl_core::config::Config;
use ccl_core::error::{Error, ErrorKind};

use super::{Bootstrap, check_rank};
use crate::id::UniqueId;
use crate::wire;

fn cfg(timeout_ms: u64) -> Config {
    Config {
        timeout: Duration::from_millis(timeout_ms),
        ..Config::default()
    }
}

#[test]
fn rank_checks() {
    assert!(check_rank(0, 1).is_ok());
    let e = check_rank(4, 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("rank 4"), "{e}");
    assert!(
        check_rank(0, 0)
            .unwrap_err()
            .to_string()
            .contains("at least 1")
    );
}

#[test]
fn allgather_among_the_ranks() {
    // Powers of two and not, so the last step's partial block is covered.
    for n in [2, 3, 5, 8, 13] {
        let c = cfg(20_000);
        let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let id = id.clone();
                std::thread::spawn(move || {
                    let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                    assert_eq!(b.local_ip().unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
                    let a = b.allgather(format!("rank{r}").as_bytes()).unwrap();
                    let z = b.allgather(&vec![r as u8; r * 1000]).unwrap();
                    b.finish().unwrap();
                    (a, z)
                })
            })
            .collect();
        for h in hs {
            let (a, z) = h.join().unwrap();
            for r in 0..n {
                assert_eq!(a[r], format!("rank{r}").as_bytes(), "n = {n}");
                assert_eq!(z[r], vec![r as u8; r * 1000], "n = {n}");
            }
        }
    }
}

/// A rank that fails on its own right after an allgather still gives the others its
/// blocks, so none of them learns only that it left: each one gets every record (and can
/// reach its own verdict on them) or, when the root passes the error on first, the error.
#[test]
fn a_rank_that_fails_after_the_allgather_serves_the_others_first() {
    let c = cfg(20_000);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    let n = 6;
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                let all = b.allgather(&[r as u8; 3]).map_err(|e| e.to_string());
                if r == 2 {
                    b.fail(&Error::invalid_argument("rank 2's own bad setting"));
                    return (all, Ok(()));
                }
                (all, b.finish().map_err(|e| e.to_string()))
            })
        })
        .collect();
    for (r, h) in hs.into_iter().enumerate() {
        let (all, fin) = h.join().unwrap();
        for e in [all.as_ref().err(), fin.as_ref().err()]
            .into_iter()
            .flatten()
        {
            assert!(e.contains("rank 2's own bad setting"), "rank {r}: {e}");
        }
        if let Ok(all) = all {
            assert_eq!(all, (0..n).map(|p| vec![p as u8; 3]).collect::<Vec<_>>());
        }
    }
}

/// A rank that leaves after joining fails everyone's allgather with its name, well before
/// the deadline, whether or not it was some rank's partner.
#[test]
fn a_rank_that_leaves_during_the_allgather_is_named() {
    let c = cfg(20_000);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    let n = 6;
    let t0 = Instant::now();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                if r == 4 {
                    drop(b);
                    return None;
                }
                Some(b.allgather(b"x").unwrap_err())
            })
        })
        .collect();
    for h in hs {
        if let Some(e) = h.join().unwrap() {
            assert!(e.to_string().contains("rank 4"), "{e}");
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

/// A stranger on a rank's allgather listener is dropped; the job goes on.
#[test]
fn a_stranger_at_a_ranks_listener_is_dropped() {
    let c = cfg(20_000);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    let n = 3;
    let (tx, rx) = std::sync::mpsc::channel();
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (id, tx) = (id.clone(), tx.clone());
            std::thread::spawn(move || {
                let mut b = Bootstrap::connect(&id, r, n, Duration::from_secs(20)).unwrap();
                if r == 1 {
                    let g = b.gather.as_ref().unwrap();
                    tx.send(g.listening()).unwrap();
                    std::thread::sleep(Duration::from_millis(200));
                }
                let a = b.allgather(&[r as u8]).unwrap();
                b.finish().unwrap();
                a
            })
        })
        .collect();
    let at = rx.recv().unwrap();
    let mut s = TcpStream::connect(at).unwrap();
    let ask = wire::GatherAsk {
        secret: [0; 32],
        rank: 0,
        round: 0,
        step: 0,
    };
    let by = Instant::now() + Duration::from_secs(5);
    wire::write_frame(&mut s, &ask.encode(), by).unwrap();
    let got = wire::read_frame(&mut s, by, &|| "stranger".into());
    assert!(got.is_err(), "a stranger got {got:?}");
    for h in hs {
        assert_eq!(h.join().unwrap(), vec![vec![0], vec![1], vec![2]]);
    }
}

#[test]
fn missing_rank_is_named() {
    let c = cfg(600);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    // Ranks 0 and 2 of 3 arrive; rank 1 never does.
    let hs: Vec<_> = [0, 2]
        .into_iter()
        .map(|r| {
            let id = id.clone();
            std::thread::spawn(move || {
                Bootstrap::connect(&id, r, 3, Duration::from_millis(600)).unwrap_err()
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap();
        assert!(e.to_string().contains("rank(s) 1 never arrived"), "{e}");
    }
}

#[test]
fn wrong_secret_is_dropped_and_job_continues() {
    let c = cfg(10_000);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    let stranger = UniqueId::for_address(id.root_addr(), [0xAA; 32]);
    let e = Bootstrap::connect(&stranger, 0, 1, Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Remote),
        "{e}"
    );
    // A client sending garbage is dropped too.
    {
        use std::io::Write;
        let mut s = TcpStream::connect(id.root_addr()).unwrap();
        let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n");
    }
    let mut b = Bootstrap::connect(&id, 0, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(b.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
    b.finish().unwrap();
}

#[test]
fn duplicate_rank_fails_everyone() {
    let c = cfg(10_000);
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &c).unwrap();
    let hs: Vec<_> = (0..2)
        .map(|_| {
            let id = id.clone();
            std::thread::spawn(move || {
                Bootstrap::connect(&id, 1, 3, Duration::from_secs(10)).map(|_| ())
            })
        })
        .collect();
    for h in hs {
        let e = h.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("rank 1 joined twice"), "{e}");
    }
}

#[test]
fn unreachable_root_fails_within_timeout_naming_it() {
    // A loopback port nobody listens on: every attempt is refused and retried until the
    // deadline. (Tests never send packets off the machine.)
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = UniqueId::for_address(
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
        [0; 32],
    );
    let t0 = Instant::now();
    let e = Bootstrap::connect(&id, 0, 2, Duration::from_millis(500)).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
}
