//! The [`Endpoint`] contract as checks every transport runs in its tests: the in-process and TCP
//! transports below, shared memory in `ccl-shm`'s tests, verbs in `ccl-ibverbs`'s (on a device,
//! in the SoftRoCE VM). Built for this crate's own tests and, with the `conformance` feature,
//! for the transport crates' tests, which enable it in their dev-dependencies.
//!
//! Each check takes a function making a connected pair and panics, naming what broke, when the
//! transport breaks the contract:
//! - [`ordered_stream`]: bytes arrive in order and intact whatever the piece sizes, through
//!   `recv` and through `recv_with` whose consumer takes whole elements only;
//! - [`partial_lending`]: bytes a `recv_with` consumer leaves are offered again;
//! - [`back_pressure`]: a sender with no reader is eventually refused (returns 0), never blocks,
//!   and gets through once the reader drains;
//! - [`waiting`]: an idle endpoint lets its caller sleep (`prepare_wait` and `wait_fds` give a
//!   poll set that stays quiet) and wakes it when bytes arrive;
//! - [`peer_gone`]: after the peer closes, what it sent is still delivered, then receiving fails
//!   with a remote error naming the peer, and a sleeping receiver is woken;
//! - [`empty_calls`]: zero-length calls do nothing and fail nothing.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::{ConnectContext, Endpoint, Interest, Transport};
use crate::config::Config;
use crate::error::ErrorKind;

/// A connected pair: (rank 0's endpoint to rank 1, rank 1's endpoint to rank 0).
pub type Pair = (Box<dyn Endpoint>, Box<dyn Endpoint>);

/// How long any check waits for something that must happen.
const PATIENCE: Duration = Duration::from_secs(60);

/// Connects rank 0 to rank 1 through `t` (listening as rank 1, connecting from another thread).
pub fn connect_pair(t: &(dyn Transport + 'static), config: &Config) -> Pair {
    connect_pair_over(t, t, config)
}

/// [`connect_pair`] with rank 0 on `t0` and rank 1 on `t1` (ends set up differently).
pub fn connect_pair_over(
    t0: &(dyn Transport + 'static),
    t1: &(dyn Transport + 'static),
    config: &Config,
) -> Pair {
    let ctx = |rank| ConnectContext {
        rank,
        size: 2,
        secret: [0x3c; 32],
        local_ip: [127, 0, 0, 1].into(),
        config: config.clone(),
    };
    let deadline = Instant::now() + PATIENCE;
    let mut l = t1.listen(&ctx(1)).expect("listen");
    let h = l.handle();
    std::thread::scope(|s| {
        let c = s.spawn(|| t0.connect(&ctx(0), 1, &h, deadline).expect("connect"));
        let (peer, e1) = l.accept(deadline).expect("accept");
        assert_eq!(peer, 0, "the acceptor must learn the connector's rank");
        let e0 = c.join().expect("connector thread");
        assert_eq!((e0.peer(), e1.peer()), (1, 0));
        (e0, e1)
    })
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 9)) as u8
}

/// Blocks like the executor until `ep` may progress for `i` (or `max` passes); returns whether
/// the poll reported readiness.
fn wait(ep: &mut dyn Endpoint, i: Interest, max: Duration) -> bool {
    if !ep.prepare_wait(i).expect("prepare_wait") {
        return true;
    }
    let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
    ep.wait_fds(i, &mut fds);
    assert!(
        !fds.is_empty(),
        "an endpoint that may sleep must give descriptors to poll"
    );
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|(f, fl)| PollFd::new(*f, *fl)).collect();
    let ms = PollTimeout::try_from(max.as_millis() as u64).unwrap_or(PollTimeout::MAX);
    nix::poll::poll(&mut p, ms).expect("poll") > 0
}

fn send_all(ep: &mut dyn Endpoint, data: &[u8], pieces: &[usize]) {
    let (mut off, mut k) = (0, 0);
    let deadline = Instant::now() + PATIENCE;
    while off < data.len() {
        let piece = pieces[k % pieces.len()].min(data.len() - off);
        k += 1;
        let mut sent = 0;
        while sent < piece {
            let n = ep.send(&data[off + sent..off + piece]).expect("send");
            sent += n;
            if n == 0 {
                assert!(Instant::now() < deadline, "send made no progress");
                wait(
                    ep,
                    Interest {
                        send: true,
                        recv: false,
                    },
                    Duration::from_millis(100),
                );
            }
        }
        off += piece;
    }
}

/// `total` bytes in pieces of odd sizes one way, received alternately by `recv` and by
/// `recv_with` taking whole 8-byte elements only.
pub fn ordered_stream(pair: &dyn Fn() -> Pair, total: usize) {
    let (mut a, mut b) = pair();
    let data: Vec<u8> = (0..total).map(pattern).collect();
    std::thread::scope(|s| {
        s.spawn(|| send_all(&mut *a, &data, &[1, 3, 4093, 5, 70001, 13, 262147, 7]));
        let mut got = vec![0u8; total];
        let (mut off, mut k) = (0, 0);
        let deadline = Instant::now() + PATIENCE;
        while off < total {
            k += 1;
            let n = if k % 2 == 0 {
                b.recv(&mut got[off..]).expect("recv")
            } else {
                let want = (total - off).min(65536);
                let dst = &mut got[off..off + want];
                let mut at = 0;
                b.recv_with(want, &mut |bytes: &[u8]| {
                    // Whole elements only, unless the stream ends on a partial one.
                    let whole = if at + bytes.len() == want {
                        bytes.len()
                    } else {
                        bytes.len() / 8 * 8
                    };
                    dst[at..at + whole].copy_from_slice(&bytes[..whole]);
                    at += whole;
                    whole
                })
                .expect("recv_with")
            };
            off += n;
            if n == 0 {
                assert!(
                    Instant::now() < deadline,
                    "receive made no progress at {off}"
                );
                wait(
                    &mut *b,
                    Interest {
                        send: false,
                        recv: true,
                    },
                    Duration::from_millis(100),
                );
            }
        }
        if let Some(i) = (0..total).find(|&i| got[i] != data[i]) {
            panic!("byte {i} of {total} is {} but {} was sent", got[i], data[i]);
        }
    });
}

/// A consumer that takes fewer bytes than offered sees the rest again, in order.
pub fn partial_lending(pair: &dyn Fn() -> Pair) {
    let (mut a, mut b) = pair();
    let data: Vec<u8> = (0..100).map(pattern).collect();
    send_all(&mut *a, &data, &[100]);
    let mut got = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < data.len() {
        let n = b
            .recv_with(data.len() - got.len(), &mut |bytes: &[u8]| {
                let take = bytes.len().min(3);
                got.extend_from_slice(&bytes[..take]);
                take
            })
            .expect("recv_with");
        assert!(
            n <= 3,
            "recv_with reported {n} bytes used, the consumer took at most 3"
        );
        if n == 0 {
            assert!(Instant::now() < deadline, "recv_with made no progress");
            wait(
                &mut *b,
                Interest {
                    send: false,
                    recv: true,
                },
                Duration::from_millis(100),
            );
        }
    }
    assert_eq!(got, data);
}

/// Without a reader, sends are eventually refused (0) rather than blocking; after the reader
/// drains, everything arrives.
pub fn back_pressure(pair: &dyn Fn() -> Pair) {
    let (mut a, mut b) = pair();
    let chunk: Vec<u8> = (0..1 << 20).map(pattern).collect();
    let mut sent = 0usize;
    loop {
        let n = a.send(&chunk).expect("send");
        if n == 0 {
            break;
        }
        sent += n;
        assert!(
            sent < 1 << 30,
            "a sender without a reader was never refused"
        );
    }
    assert!(sent > 0, "nothing could be sent to an idle peer");
    // The sender may sleep now and stays asleep until the reader makes room.
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    let deadline = Instant::now() + PATIENCE;
    while got < sent {
        let n = b.recv(&mut buf).expect("recv");
        for (i, &x) in buf[..n].iter().enumerate() {
            assert_eq!(
                x,
                pattern((got + i) % (1 << 20)),
                "byte {} after back pressure",
                got + i
            );
        }
        got += n;
        if n == 0 {
            assert!(Instant::now() < deadline, "a full pipe did not drain");
            wait(
                &mut *b,
                Interest {
                    send: false,
                    recv: true,
                },
                Duration::from_millis(100),
            );
        }
    }
    assert!(
        wait(
            &mut *a,
            Interest {
                send: true,
                recv: false
            },
            PATIENCE
        ),
        "a drained pipe did not wake its sender"
    );
    assert!(a.send(b"more").expect("send") > 0);
}

/// An idle endpoint lets its caller sleep without waking it for nothing, and wakes it when bytes
/// arrive.
pub fn waiting(pair: &dyn Fn() -> Pair) {
    let (mut a, mut b) = pair();
    let recv = Interest {
        send: false,
        recv: true,
    };
    assert!(
        b.prepare_wait(recv).expect("prepare_wait"),
        "an idle endpoint must let its caller sleep"
    );
    let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
    b.wait_fds(recv, &mut fds);
    let mut p: Vec<PollFd<'_>> = fds.iter().map(|(f, fl)| PollFd::new(*f, *fl)).collect();
    let quiet = nix::poll::poll(&mut p, PollTimeout::from(50u16)).expect("poll");
    assert_eq!(
        quiet, 0,
        "an idle endpoint's poll set woke with nothing to do"
    );
    drop(p);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            send_all(&mut *a, b"wake", &[4]);
        });
        let t0 = Instant::now();
        let mut buf = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            got += b.recv(&mut buf[got..]).expect("recv");
            if got < 4 {
                assert!(
                    t0.elapsed() < PATIENCE,
                    "a sleeping receiver was never woken"
                );
                wait(&mut *b, recv, Duration::from_secs(5));
            }
        }
        assert_eq!(&buf, b"wake");
    });
}

/// Bytes sent before a close still arrive; then receiving fails naming the peer, and a
/// receiver asleep on the endpoint is woken by the close.
pub fn peer_gone(pair: &dyn Fn() -> Pair) {
    let (mut a, mut b) = pair();
    send_all(&mut *a, b"last words", &[10]);
    drop(a);
    let mut buf = [0u8; 10];
    let mut got = 0;
    let deadline = Instant::now() + PATIENCE;
    let err = loop {
        let mut extra = [0u8; 1];
        let dst = if got < 10 {
            &mut buf[got..]
        } else {
            &mut extra[..]
        };
        match b.recv(dst) {
            Ok(n) if got >= 10 && n > 0 => panic!("bytes arrived that the peer never sent"),
            Ok(0) => {
                assert!(Instant::now() < deadline, "a closed peer was never noticed");
                if let Err(e) = b.prepare_wait(Interest {
                    send: false,
                    recv: true,
                }) {
                    break e;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(n) => got += n,
            Err(e) => break e,
        }
    };
    assert!(
        got >= 10,
        "only {got} of the 10 bytes sent before the close arrived"
    );
    assert_eq!(&buf, b"last words");
    assert_eq!(err.kind(), ErrorKind::Remote, "{err}");
    assert_eq!(
        err.peer_id(),
        Some(0),
        "the error must name the peer: {err}"
    );

    // A receiver already asleep is woken by the close.
    let (a, mut b) = pair();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(a);
        });
        assert!(
            wait(
                &mut *b,
                Interest {
                    send: false,
                    recv: true
                },
                PATIENCE
            ),
            "a receiver asleep on a peer that closed was never woken"
        );
    });
}

/// Zero-length calls do nothing and fail nothing.
pub fn empty_calls(pair: &dyn Fn() -> Pair) {
    let (mut a, mut b) = pair();
    assert_eq!(a.send(&[]).expect("empty send"), 0);
    assert_eq!(b.recv(&mut []).expect("empty recv"), 0);
    assert_eq!(b.recv_with(0, &mut |_| 0).expect("empty recv_with"), 0);
    send_all(&mut *a, b"x", &[1]);
    let mut one = [0u8; 1];
    let deadline = Instant::now() + PATIENCE;
    while b.recv(&mut one).expect("recv") == 0 {
        assert!(Instant::now() < deadline);
        wait(
            &mut *b,
            Interest {
                send: false,
                recv: true,
            },
            Duration::from_millis(100),
        );
    }
    assert_eq!(&one, b"x");
}

/// Every check, for a transport's test suite.
pub fn run_all(pair: &dyn Fn() -> Pair) {
    empty_calls(pair);
    partial_lending(pair);
    ordered_stream(pair, 3 << 20);
    back_pressure(pair);
    waiting(pair);
    peer_gone(pair);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::local::LocalTransport;
    use crate::transport::tcp::TcpTransport;

    #[test]
    fn local_meets_the_endpoint_contract() {
        run_all(&|| connect_pair(&LocalTransport::new(), &Config::default()));
    }

    #[test]
    fn tcp_meets_the_endpoint_contract() {
        run_all(&|| connect_pair(&TcpTransport::new(), &Config::default()));
    }
}
