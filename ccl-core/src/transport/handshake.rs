//! How a connecting rank proves it belongs to the job, for every stream-based transport (TCP, the
//! shared-memory transport's Unix socket).
//!
//! The connector sends a hello (magic, its rank, the world size, the communicator secret); the
//! listener checks it and answers with an ack naming its own rank. A listener takes every
//! connection waiting in its backlog and advances all their handshakes together, so one silent or
//! garbage-sending stranger delays nobody: it is dropped with a warning after [`GRACE`], and the
//! job goes on.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::ConnectContext;
use super::LOG_SUBSYS;
use crate::ccl_warn;
use crate::error::{Error, ErrorKind, Result};
use crate::net;

/// Bytes of a hello: magic, rank, world size, secret.
pub const HELLO_LEN: usize = 8 + 4 + 4 + 32;
/// Bytes of an ack: magic, rank.
pub const ACK_LEN: usize = 8 + 4;
/// How long an accepted connection may take to present its hello before it is dropped.
pub const GRACE: Duration = Duration::from_secs(10);

/// The magic numbers of one transport's handshake; the last byte of each tells hello from ack.
#[derive(Clone, Copy, Debug)]
pub struct Magic {
    pub hello: [u8; 8],
    pub ack: [u8; 8],
}

/// Compares secrets in time independent of where they differ.
pub fn secrets_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The connector's hello.
pub fn hello(magic: &Magic, ctx: &ConnectContext) -> [u8; HELLO_LEN] {
    let mut m = [0u8; HELLO_LEN];
    m[..8].copy_from_slice(&magic.hello);
    m[8..12].copy_from_slice(&(ctx.rank as u32).to_le_bytes());
    m[12..16].copy_from_slice(&(ctx.size as u32).to_le_bytes());
    m[16..48].copy_from_slice(&ctx.secret);
    m
}

/// Checks a peer's hello; returns its rank, or why it was refused.
pub fn check_hello(
    magic: &Magic,
    ctx: &ConnectContext,
    m: &[u8; HELLO_LEN],
) -> std::result::Result<usize, String> {
    if m[..8] != magic.hello {
        return Err("not a ccl connection (bad magic)".into());
    }
    let secret: &[u8; 32] = m[16..48].try_into().expect("fixed size");
    if !secrets_equal(secret, &ctx.secret) {
        return Err("wrong secret (a connection from another job?)".into());
    }
    let rank = u32::from_le_bytes(m[8..12].try_into().expect("fixed size")) as usize;
    let size = u32::from_le_bytes(m[12..16].try_into().expect("fixed size")) as usize;
    if size != ctx.size {
        return Err(format!("peer says world size {size}, ours is {}", ctx.size));
    }
    if rank >= ctx.size || rank == ctx.rank {
        return Err(format!("peer claims rank {rank}"));
    }
    Ok(rank)
}

/// The listener's ack.
pub fn ack(magic: &Magic, rank: usize) -> [u8; ACK_LEN] {
    let mut a = [0u8; ACK_LEN];
    a[..8].copy_from_slice(&magic.ack);
    a[8..12].copy_from_slice(&(rank as u32).to_le_bytes());
    a
}

/// Checks the ack of the listener of `peer`.
pub fn check_ack(magic: &Magic, a: &[u8; ACK_LEN], peer: usize) -> std::result::Result<(), String> {
    let acker = u32::from_le_bytes(a[8..12].try_into().expect("fixed")) as usize;
    if a[..8] != magic.ack || acker != peer {
        return Err(format!("unexpected handshake reply (from rank {acker})"));
    }
    Ok(())
}

/// A connection accepted but not yet authenticated.
struct Pending<S> {
    stream: S,
    from: String,
    buf: [u8; HELLO_LEN],
    got: usize,
    since: Instant,
}

/// Handshakes in progress on one listener.
pub struct Acceptor<S> {
    magic: Magic,
    /// Names the transport in warnings (`TCP transport`).
    what: &'static str,
    pending: Vec<Pending<S>>,
}

impl<S> std::fmt::Debug for Acceptor<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acceptor")
            .field("what", &self.what)
            .field("pending", &self.pending.len())
            .finish()
    }
}

impl<S: Read + AsFd> Acceptor<S> {
    pub fn new(magic: Magic, what: &'static str) -> Acceptor<S> {
        Acceptor {
            magic,
            what,
            pending: Vec::new(),
        }
    }

    /// Waits for the next connection that presents a valid hello and returns it with the peer's
    /// rank and where it came from. `accept_one` takes one connection from the backlog
    /// (`Ok(None)`: none waiting) and must hand back a non-blocking stream; `listener` is polled
    /// for new connections.
    pub fn accept(
        &mut self,
        ctx: &ConnectContext,
        listener: BorrowedFd<'_>,
        mut accept_one: impl FnMut() -> io::Result<Option<(S, String)>>,
        deadline: Instant,
    ) -> Result<(usize, S, String)> {
        self.accept_any(ctx, &[listener], |_| accept_one(), deadline)
    }

    /// [`accept`](Acceptor::accept) on several listeners: `accept_one(i)` takes a connection
    /// from `listeners[i]`'s backlog.
    pub fn accept_any(
        &mut self,
        ctx: &ConnectContext,
        listeners: &[BorrowedFd<'_>],
        mut accept_one: impl FnMut(usize) -> io::Result<Option<(S, String)>>,
        deadline: Instant,
    ) -> Result<(usize, S, String)> {
        let rank = ctx.rank;
        loop {
            for l in 0..listeners.len() {
                loop {
                    match accept_one(l) {
                        Ok(Some((stream, from))) => self.pending.push(Pending {
                            stream,
                            from,
                            buf: [0; HELLO_LEN],
                            got: 0,
                            since: Instant::now(),
                        }),
                        Ok(None) => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            let m = format!("{}: accept", self.what);
                            return Err(Error::io(ErrorKind::System, m, e).rank(rank));
                        }
                    }
                }
            }
            if let Some(done) = self.advance(ctx) {
                return Ok(done);
            }
            let left = net::remaining(deadline, || {
                format!("{}: waiting for peers to connect", self.what)
            })
            .map_err(|e| e.rank(rank))?;
            let mut fds: Vec<PollFd<'_>> = listeners
                .iter()
                .map(|l| PollFd::new(*l, PollFlags::POLLIN))
                .collect();
            fds.extend(
                self.pending
                    .iter()
                    .map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)),
            );
            let ms = left.min(Duration::from_millis(500)).as_millis().max(1) as u64;
            let ms = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            match nix::poll::poll(&mut fds, ms) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(Error::io(ErrorKind::System, "poll", e.into()).rank(rank)),
            }
        }
    }

    /// Reads what has arrived of every pending hello; returns the first complete, valid one and
    /// drops (with a warning) the invalid, closed and overdue ones.
    fn advance(&mut self, ctx: &ConnectContext) -> Option<(usize, S, String)> {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let mut drop_reason = None;
            match p.stream.read(&mut p.buf[p.got..]) {
                Ok(0) => drop_reason = Some("closed before completing the handshake".to_string()),
                Ok(n) => p.got += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => drop_reason = Some(format!("read failed: {e}")),
            }
            if drop_reason.is_none() && p.got == HELLO_LEN {
                match check_hello(&self.magic, ctx, &p.buf) {
                    Ok(peer) => {
                        let p = self.pending.swap_remove(i);
                        return Some((peer, p.stream, p.from));
                    }
                    Err(why) => drop_reason = Some(why),
                }
            }
            if drop_reason.is_none() && p.since.elapsed() > GRACE {
                drop_reason = Some(format!("no handshake within {} s", GRACE.as_secs()));
            }
            if let Some(why) = drop_reason {
                ccl_warn!(
                    Some(ctx.rank),
                    "{}: dropped connection from {}: {why}",
                    self.what,
                    self.pending[i].from
                );
                self.pending.swap_remove(i);
            } else {
                i += 1;
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Magic = Magic {
        hello: *b"CCLTST\x01H",
        ack: *b"CCLTST\x01A",
    };

    fn ctx(rank: usize, secret: [u8; 32]) -> ConnectContext {
        ConnectContext {
            rank,
            size: 4,
            secret,
            local_ip: [127, 0, 0, 1].into(),
            config: crate::config::Config::default(),
        }
    }

    #[test]
    fn hello_and_ack_round_trip_and_refusals() {
        let h = hello(&M, &ctx(2, [7; 32]));
        assert_eq!(check_hello(&M, &ctx(0, [7; 32]), &h), Ok(2));
        assert!(
            check_hello(&M, &ctx(0, [8; 32]), &h)
                .unwrap_err()
                .contains("secret")
        );
        assert!(
            check_hello(&M, &ctx(2, [7; 32]), &h)
                .unwrap_err()
                .contains("rank 2")
        );
        let other = Magic {
            hello: *b"CCLXXX\x01H",
            ack: *b"CCLXXX\x01A",
        };
        assert!(check_hello(&other, &ctx(0, [7; 32]), &h).is_err());
        assert!(check_ack(&M, &ack(&M, 3), 3).is_ok());
        assert!(check_ack(&M, &ack(&M, 3), 1).is_err());
    }

    #[test]
    fn secret_comparison() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(secrets_equal(&a, &b));
        b[31] ^= 1;
        assert!(!secrets_equal(&a, &b));
    }
}
