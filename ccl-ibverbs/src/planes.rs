//! Several ports as planes: a verbs connection on each port to a peer, one striped endpoint
//! over them ([`Striped`]), and a port's connection made again after it fails.
//!
//! Each plane's verbs connection is set up over that plane's TCP socket (the side channel), as
//! a single port's is. The side channel is shared between the connection and its [`Redial`]:
//! when the connection fails (a queue pair in error after its link went down), the striped
//! endpoint drops it at both ends and calls the redial at both, which sets up new queue pairs
//! over the same side channel. The socket outlives a link that goes away for a while (TCP
//! retransmits), so the set-up completes once the link is back.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ccl_core::transport::planes::{PlaneConn, PlaneEndpoint, Redial, RedialCall, Remade, Striped};
use ccl_core::transport::tcp::{self, PlaneBuilder};
use ccl_core::transport::{ConnectContext, Endpoint, Interest};
use ccl_core::{Error, ErrorKind, Result};
use nix::poll::PollFlags;

use crate::connect::establish;
use crate::port::IbDevice;

/// Makes each peer's plane sockets (one per port, sorted by plane) a verbs connection per
/// plane and one striped endpoint.
pub(crate) fn builder(planes: Vec<Arc<IbDevice>>) -> Arc<PlaneBuilder> {
    Arc::new(move |ctx, peer, conns, deadline| {
        let mut eps = Vec::with_capacity(conns.len());
        for c in conns {
            // The port whose address the plane's socket uses: the connecting end's plane
            // number is the listener's, and where planes pair by network the two ends may
            // number their ports differently. Else (ports without an address of their own)
            // the plane's number.
            let mut by_ip = planes.iter().filter(|d| d.ip() == Some(c.local.ip()));
            let dev = match (by_ip.next(), by_ip.next()) {
                (Some(d), None) => Some(d),
                _ => planes.get(c.plane),
            };
            let dev = dev.ok_or_else(|| {
                Error::remote(format!(
                    "verbs plane {} from peer {peer}: this rank has {} planes",
                    c.plane,
                    planes.len()
                ))
                .rank(ctx.rank)
                .peer(peer)
            })?;
            eps.push(plane(dev, ctx, peer, c, deadline)?);
        }
        let cfg = &ctx.config;
        let ep = Striped::over_endpoints(peer, eps, cfg.plane_timeout, cfg.timeout)
            .map_err(|e| e.rank(ctx.rank))?;
        Ok(Box::new(ep) as Box<dyn Endpoint>)
    })
}

/// One plane: the verbs connection on `dev` over the plane's socket, and its way back.
fn plane(
    dev: &Arc<IbDevice>,
    ctx: &ConnectContext,
    peer: usize,
    c: PlaneConn,
    deadline: Instant,
) -> Result<PlaneEndpoint> {
    let name = format!(
        "verbs plane {} ({} port {}, {} -> {})",
        c.plane,
        dev.name(),
        dev.port(),
        c.local,
        c.remote
    );
    let side = tcp::plane_socket_endpoint(peer, c).map_err(|e| e.rank(ctx.rank))?;
    let side = Arc::new(Mutex::new(side));
    let endpoint = establish(
        dev,
        ctx,
        peer,
        Box::new(SharedSide::boxed(&side, peer)?),
        deadline,
    )?;
    Ok(PlaneEndpoint {
        name,
        endpoint,
        redial: Some(Box::new(IbRedial {
            dev: dev.clone(),
            ctx: ctx.clone(),
            peer,
            side,
        })),
    })
}

struct IbRedial {
    dev: Arc<IbDevice>,
    ctx: ConnectContext,
    peer: usize,
    side: Arc<Mutex<Box<dyn Endpoint>>>,
}

impl Redial for IbRedial {
    fn redial(&mut self, call: RedialCall) -> Result<Remade> {
        let mut side = SharedSide::boxed(&self.side, self.peer)?;
        // The set-up reads the side channel at least every 100 ms: while it runs, a read or
        // write there fails once the plane is no longer wanted, which ends the set-up.
        let settled = Arc::new(AtomicBool::new(false));
        side.abort = Some(Abort {
            wanted: call.wanted,
            settled: settled.clone(),
        });
        let r = establish(
            &self.dev,
            &self.ctx,
            self.peer,
            Box::new(side),
            call.deadline,
        );
        settled.store(true, Ordering::Release);
        r.map(Remade::Endpoint)
    }
}

/// A side channel that the plane's connections, one after another, and its redial share.
struct SharedSide {
    inner: Arc<Mutex<Box<dyn Endpoint>>>,
    peer: usize,
    /// A copy of the socket's descriptor (the socket lives behind the lock).
    fd: OwnedFd,
    /// While a redial's set-up runs over it: when to call the set-up off.
    abort: Option<Abort>,
}

struct Abort {
    wanted: Arc<dyn Fn() -> bool + Send + Sync>,
    /// The set-up ended: the connection it made uses the channel from now on.
    settled: Arc<AtomicBool>,
}

impl SharedSide {
    fn boxed(inner: &Arc<Mutex<Box<dyn Endpoint>>>, peer: usize) -> Result<SharedSide> {
        let fd = {
            let g = lock(inner);
            let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
            g.wait_fds(
                Interest {
                    send: true,
                    recv: true,
                },
                &mut fds,
            );
            let [(fd, _)] = fds[..] else {
                return Err(Error::internal(format!(
                    "verbs plane to peer {peer}: the side channel waits on {} descriptors, not one",
                    fds.len()
                )));
            };
            fd.try_clone_to_owned().map_err(|e| {
                Error::io(ErrorKind::System, "copying a side channel's descriptor", e).peer(peer)
            })?
        };
        Ok(SharedSide {
            inner: inner.clone(),
            peer,
            fd,
            abort: None,
        })
    }

    /// An error once a redial's set-up over this channel is no longer wanted.
    fn called_off(&self) -> Result<()> {
        match &self.abort {
            Some(a) if !a.settled.load(Ordering::Acquire) && !(a.wanted)() => {
                Err(Error::remote(format!(
                    "verbs plane to peer {}: the endpoint no longer wants it made again",
                    self.peer
                )))
            }
            _ => Ok(()),
        }
    }
}

fn lock(m: &Mutex<Box<dyn Endpoint>>) -> MutexGuard<'_, Box<dyn Endpoint>> {
    // A panic while a call held the socket leaves nothing half-done that another call could
    // misread: the socket's own state is the kernel's.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Endpoint for SharedSide {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        self.called_off()?;
        lock(&self.inner).send(src)
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        self.called_off()?;
        lock(&self.inner).recv(dst)
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        self.called_off()?;
        lock(&self.inner).recv_with(max, consume)
    }

    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        lock(&self.inner).prepare_wait(interest)
    }

    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        let g = lock(&self.inner);
        let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::new();
        g.wait_fds(interest, &mut fds);
        let flags = fds.iter().fold(PollFlags::empty(), |a, (_, f)| a | *f);
        drop(fds);
        drop(g);
        if !flags.is_empty() {
            out.push((self.fd.as_fd(), flags));
        }
    }
}
