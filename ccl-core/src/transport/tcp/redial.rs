//! A TCP plane's socket made again after it failed with an error (reset, closed).
//!
//! The listener the planes were first accepted on may be gone by then (it lives while lower
//! peers still connect), so the accepting end of the first connection listens anew, on the
//! plane's own address and a port of the kernel's choice, and names the port in its redial
//! notice ([`Redial::offer`]); the connecting end connects there (the route to the peer's
//! plane address is the plane's link, as for the first connection). The
//! new socket starts with the communicator's handshake and the endpoint's token and plane, so
//! that nothing but this peer's plane is taken for it. Both ends try until the link carries the
//! connection (a cut link: connects time out and are tried again), the redial's deadline, or the
//! endpoint no longer wants the plane.

use super::*;
use crate::transport::planes::{Redial, RedialCall, Remade};

/// The handshake of a plane's new socket (not accepted on the transport's listener).
const REDIAL_MAGIC: Magic = Magic {
    hello: *b"CCLTCP\x01R",
    ack: *b"CCLTCP\x01S",
};
/// What follows the hello: the endpoint's token and the plane.
const ID_LEN: usize = 12;
/// How long one connect or accept waits before the caller's `wanted` is asked again.
const SLICE: Duration = Duration::from_millis(200);

/// How one TCP plane is made again.
pub(super) struct TcpRedial {
    ctx: ConnectContext,
    peer: usize,
    plane: usize,
    token: u64,
    /// This end's address on the plane, and the peer's.
    local: IpAddr,
    remote: IpAddr,
    /// This end accepted the first connection: it listens for the new one.
    accepts: bool,
    listener: Option<TcpListener>,
}

impl TcpRedial {
    pub(super) fn boxed(
        ctx: &ConnectContext,
        peer: usize,
        conn: &PlaneConn,
        token: u64,
        accepts: bool,
    ) -> Box<dyn Redial> {
        Box::new(TcpRedial {
            ctx: ctx.clone(),
            peer,
            plane: conn.plane,
            token,
            local: conn.local.ip(),
            remote: conn.remote.ip(),
            accepts,
            listener: None,
        })
    }

    fn what(&self) -> String {
        format!(
            "making TCP plane {} to peer {} again ({} -> {})",
            self.plane, self.peer, self.local, self.remote
        )
    }

    fn id(&self) -> [u8; ID_LEN] {
        let mut b = [0u8; ID_LEN];
        b[..8].copy_from_slice(&self.token.to_le_bytes());
        b[8..].copy_from_slice(&(self.plane as u32).to_le_bytes());
        b
    }

    fn err(&self, e: io::Error) -> Error {
        Error::io(classify_io(&e), self.what(), e)
            .rank(self.ctx.rank)
            .peer(self.peer)
    }

    fn given_up(&self, call: &RedialCall) -> Option<Error> {
        if !(call.wanted)() {
            return Some(
                Error::remote(format!("{}: the endpoint no longer wants it", self.what()))
                    .rank(self.ctx.rank)
                    .peer(self.peer),
            );
        }
        (Instant::now() >= call.deadline).then(|| {
            Error::timeout(format!(
                "{}: the link did not carry it in time",
                self.what()
            ))
            .rank(self.ctx.rank)
            .peer(self.peer)
        })
    }

    /// The accepting end: the first connection from the peer's plane address that passes the
    /// handshake and names this endpoint and plane.
    fn accept(&mut self, call: &RedialCall) -> Result<TcpStream> {
        let l = self
            .listener
            .take()
            .ok_or_else(|| Error::internal(format!("{}: no listener", self.what())))?;
        loop {
            if let Some(e) = self.given_up(call) {
                return Err(e);
            }
            let mut fds = [nix::poll::PollFd::new(l.as_fd(), PollFlags::POLLIN)];
            let slice = nix::poll::PollTimeout::from(SLICE.as_millis() as u16);
            if !matches!(nix::poll::poll(&mut fds, slice), Ok(n) if n > 0) {
                continue;
            }
            let (s, from) = match l.accept() {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(self.err(e)),
            };
            if from.ip() != self.remote {
                ccl_warn!(
                    Some(self.ctx.rank),
                    "{}: dropped a connection from {from}",
                    self.what()
                );
                continue;
            }
            match self.check(s, call.deadline) {
                Ok(s) => return Ok(s),
                Err(e) => ccl_warn!(Some(self.ctx.rank), "{e}"),
            }
        }
    }

    /// The handshake of an accepted socket: the peer's hello (secret, rank), then this
    /// endpoint's token and plane; the ack goes back when both are right.
    fn check(&self, mut s: TcpStream, deadline: Instant) -> Result<TcpStream> {
        let what = || self.what();
        let until = deadline.min(Instant::now() + handshake::GRACE);
        s.set_nonblocking(false).map_err(|e| self.err(e))?;
        let mut hello = [0u8; handshake::HELLO_LEN];
        net::read_exact_by(&mut s, &mut hello, until, &what)?;
        let mut id = [0u8; ID_LEN];
        net::read_exact_by(&mut s, &mut id, until, &what)?;
        match handshake::check_hello(&REDIAL_MAGIC, &self.ctx, &hello) {
            Ok(rank) if rank == self.peer && id == self.id() => {}
            Ok(rank) => {
                return Err(Error::remote(format!(
                    "{}: refused a connection from rank {rank} for another plane",
                    self.what()
                )));
            }
            Err(m) => return Err(Error::remote(format!("{}: refused: {m}", self.what()))),
        }
        net::write_all_by(
            &mut s,
            &handshake::ack(&REDIAL_MAGIC, self.ctx.rank),
            until,
            &what,
        )?;
        Ok(s)
    }

    /// The connecting end: connects to the port the peer named until a connection passes the
    /// handshake.
    fn connect(&self, call: &RedialCall) -> Result<TcpStream> {
        let port = u16::try_from(call.offer)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| {
                Error::remote(format!(
                    "{}: the peer named no port to connect to ({})",
                    self.what(),
                    call.offer
                ))
            })?;
        let to = SocketAddr::new(self.remote, port);
        let what = || self.what();
        loop {
            if let Some(e) = self.given_up(call) {
                return Err(e);
            }
            let mut s = match TcpStream::connect_timeout(&to, SLICE) {
                Ok(s) => s,
                Err(_) => {
                    // A cut link times out; one that refuses is not back yet (or not routed):
                    // both are tried again until the deadline.
                    std::thread::sleep(SLICE / 4);
                    continue;
                }
            };
            let until = call.deadline.min(Instant::now() + handshake::GRACE);
            let mut hello = [0u8; handshake::HELLO_LEN + ID_LEN];
            hello[..handshake::HELLO_LEN]
                .copy_from_slice(&handshake::hello(&REDIAL_MAGIC, &self.ctx));
            hello[handshake::HELLO_LEN..].copy_from_slice(&self.id());
            let mut ack = [0u8; handshake::ACK_LEN];
            let shaken = net::write_all_by(&mut s, &hello, until, &what)
                .and_then(|()| net::read_exact_by(&mut s, &mut ack, until, &what));
            match shaken {
                Ok(()) => {
                    handshake::check_ack(&REDIAL_MAGIC, &ack, self.peer).map_err(|m| {
                        Error::remote(format!("{}: {m}", self.what()))
                            .rank(self.ctx.rank)
                            .peer(self.peer)
                    })?;
                    return Ok(s);
                }
                Err(e) => ccl_warn!(Some(self.ctx.rank), "{e}; trying again"),
            }
        }
    }
}

impl Redial for TcpRedial {
    fn offer(&mut self) -> Result<u64> {
        if !self.accepts {
            return Ok(0);
        }
        let l = TcpListener::bind(SocketAddr::new(self.local, 0)).map_err(|e| self.err(e))?;
        l.set_nonblocking(true).map_err(|e| self.err(e))?;
        let port = l.local_addr().map_err(|e| self.err(e))?.port();
        self.listener = Some(l);
        Ok(u64::from(port))
    }

    fn redial(&mut self, call: RedialCall) -> Result<Remade> {
        let s = if self.accepts {
            self.accept(&call)?
        } else {
            self.connect(&call)?
        };
        tune(&s, &self.ctx).map_err(|e| self.err(e))?;
        ccl_trace!(
            Some(self.ctx.rank),
            "TCP plane {} to peer {} connected again ({:?} -> {:?})",
            self.plane,
            self.peer,
            s.local_addr().ok(),
            s.peer_addr().ok()
        );
        Ok(Remade::Socket(s))
    }
}
