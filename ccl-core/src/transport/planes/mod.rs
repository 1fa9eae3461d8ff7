//! One peer over several network planes: a connection per plane (TCP, or verbs on each NIC
//! port), the stream striped across them, and a plane that stops delivering routed around
//! without an error.
//!
//! Hosts built for failure (dual-plane, dual-ToR fabrics) give every host two or more ports on
//! independent networks, so that a cable, a port or a switch can fail while the job goes on. An
//! endpoint here holds one connection per plane and keeps the [`Endpoint`] contract (one
//! ordered, reliable byte stream) over all of them. A plane's connection is a TCP socket or
//! another transport's endpoint on that plane's device ([`Striped::over_endpoints`]: the verbs
//! transport with several ports); the frames below travel inside it either way:
//!
//! - **Frames with stream offsets.** Every data frame carries the offset of its first byte in the
//!   stream to this peer (a sequence number per peer, not per plane). The receiver delivers bytes
//!   in offset order whichever plane brought them, and drops any byte below what it delivered, so
//!   a byte sent twice (once on a plane that died, once again on another) is delivered once.
//! - **Copies until acknowledged.** A sender keeps every byte it took in a ring of
//!   [`WINDOW`] bytes until the peer acknowledges having delivered it; the peer acknowledges the
//!   stream offset it delivered up to and, per plane, how many bytes it read from that plane.
//! - **A stalled plane is found by its sibling.** TCP keeps retrying a cut link for minutes and
//!   reports nothing. A plane is declared down when bytes written to it go unread for
//!   `CCL_PLANE_TIMEOUT` while another plane to the same peer shows that the peer is reading
//!   (its acknowledgements come back there). Bytes not acknowledged on the down plane go again
//!   on the others. A peer that reads nothing on any plane (busy, stopped) makes no plane down:
//!   that is for the job's failure monitor to judge, not the link's.
//! - **Back when it delivers.** A down plane's connection is kept: TCP retransmits what it holds,
//!   and when the link returns those bytes arrive (the receiver drops them as duplicates) and
//!   the peer's count for the plane catches up; the plane then takes new frames again.
//! - **Striped by what each plane takes.** A frame of at most [`CHUNK`] bytes goes to the next
//!   plane whose socket takes it; a plane that drains slower fills its socket buffer and takes
//!   fewer frames, so each plane's share follows its measured rate, not a setting.
//! - **Made again after an error** ([`Redial`]: verbs sets up new queue pairs over the plane's
//!   side channel; TCP connects a new socket on the plane, to a port the accepting end names):
//!   the end that saw the plane fail says so on another plane, the peer drops its side of it
//!   and says so too, and both make the connection again while the stream goes on over the
//!   others; the plane then takes its share again.
//! - **A keeper thread** finishes what a sender's caller left: a frame half written, bytes to
//!   send again after a failover, an acknowledgement due, a health check. The caller returns as
//!   soon as the transport holds its bytes (as a TCP socket does), and may not call again for a
//!   long while; the keeper makes sure the bytes still reach the peer. It sleeps when no
//!   endpoint has such work.
//!
//! Only when every plane to a peer failed with an error (closed, reset) does the endpoint fail,
//! and the job's rank-failure path (verdict, revocation, shrink) takes over as for one plane.

use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

use super::LOG_SUBSYS;
use super::{Endpoint, Interest};
use crate::ccl_warn;
use crate::error::{Error, ErrorKind, Result, classify_io};

/// Most payload bytes in one data frame: the unit the planes share a transfer in.
pub const CHUNK: usize = 128 << 10;
/// Bytes a sender may hold unacknowledged (and a receiver read ahead of what it delivered).
pub const WINDOW: usize = 8 << 20;
/// The receiver acknowledges at least every this many delivered bytes.
const ACK_EVERY: u64 = 512 << 10;
/// ...and at least every this many bytes read from its planes (delivered or not), so that a
/// sender's in-flight bytes per plane are known within a fraction of [`IN_FLIGHT_MIN`]...
const READ_ACK_EVERY: u64 = 128 << 10;
/// ...and at least this often while bytes arrive, so that the sender sees which planes deliver.
const ACK_INTERVAL: Duration = Duration::from_millis(10);
/// How often the keeper looks at endpoints with work, and how long a caller must have been away
/// before it does.
const KEEPER_TICK: Duration = Duration::from_millis(2);
/// How long a caller that prepared to wait may sleep on the planes' descriptors before it calls
/// again (the executor wakes at least every 100 ms): the keeper leaves such an endpoint alone,
/// since reading the bytes the caller sleeps for would take its wake-up away.
const CALLER_SLEEPS: Duration = Duration::from_millis(100);
/// Bytes a plane may have in flight (written, not yet read by the peer): its measured rate times
/// [`IN_FLIGHT_TIME`], within [`IN_FLIGHT_MIN`] and a share of the window. A plane full to its
/// cap takes no frame; the planes share a transfer in proportion to how fast each drains, and
/// a frame put on a slow plane waits behind at most that long a queue (a kernel socket buffer
/// left to itself holds megabytes, and a slow plane's would hold the window).
const IN_FLIGHT_TIME: f64 = 0.008;
const IN_FLIGHT_MIN: u64 = 1 << 20;
/// How often a call that moved bytes also reads every plane for acks and checks the planes'
/// health (a call that moved nothing always does).
const SERVICE_EVERY: Duration = Duration::from_millis(1);
/// The most planes one endpoint uses (a handle carries an address per plane in at most
/// [`MAX_HANDLE_LEN`](super::MAX_HANDLE_LEN) bytes).
pub const MAX_PLANES: usize = 4;

/// Frame header: magic, kind, plane count (acks), payload length, stream offset.
const HDR: usize = 16;
const MAGIC: [u8; 2] = *b"CF";
const DATA: u8 = 1;
const ACK: u8 = 2;
const PING: u8 = 3;
/// The sender is closing the endpoint: the planes closing next are its goodbye, not failures.
const BYE: u8 = 4;
/// Plane `planes` (the header's field) failed at this end, or was dropped at the peer's asking:
/// its connection of generation `off` is to be made again.
const REDIAL: u8 = 5;
/// How long making a plane's connection again may wait for its link to return.
const REDIAL_WAIT: Duration = Duration::from_secs(300);
/// An ack's count per plane: the plane's generation in the top byte, bytes read below.
const GEN_SHIFT: u32 = 56;
/// An ack's payload: delivered offset, then bytes read per plane.
const ACK_MAX: usize = 8 + 8 * MAX_PLANES;

fn header(kind: u8, planes: u8, len: u32, off: u64) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[..2].copy_from_slice(&MAGIC);
    h[2] = kind;
    h[3] = planes;
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..].copy_from_slice(&off.to_le_bytes());
    h
}

/// One plane's connection as the endpoint opens it.
#[derive(Debug)]
pub struct PlaneConn {
    /// Index of the plane (its place in `CCL_SOCKET_IFNAME`'s matches).
    pub plane: usize,
    pub stream: TcpStream,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// One plane's connection made by another transport (verbs on one port), with what to call it
/// in logs and errors.
pub struct PlaneEndpoint {
    /// E.g. `verbs plane 1 (rxe1 port 1, 10.0.1.1:4000 -> 10.0.1.2:4100)`.
    pub name: String,
    pub endpoint: Box<dyn Endpoint>,
    /// How to make the connection again when it fails (none: the plane stays failed).
    pub redial: Option<Box<dyn Redial>>,
}

impl std::fmt::Debug for PlaneEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaneEndpoint")
            .field("name", &self.name)
            .field("redial", &self.redial.is_some())
            .finish_non_exhaustive()
    }
}

/// Makes a plane's connection again after it failed, once both ends agreed to (verbs: new
/// queue pairs over the plane's side channel, which outlives them; TCP: a new socket, the
/// accepting end listening on a port it names in its notice). Runs on a thread of its own
/// while the stream goes on over the other planes; both ends call it at about the same time.
pub trait Redial: Send {
    /// Called before this end's notice goes out; the peer's [`Redial::redial`] gets the value
    /// as [`RedialCall::offer`] (TCP: the port this end listens on for the new connection).
    fn offer(&mut self) -> Result<u64> {
        Ok(0)
    }

    /// The new connection, by `call.deadline` (the link may still be down: it waits for it),
    /// or an error soon after `call.wanted` turns false (the endpoint was dropped or failed).
    fn redial(&mut self, call: RedialCall) -> Result<Remade>;
}

/// What one attempt to make a plane again is given.
pub struct RedialCall {
    pub deadline: Instant,
    /// The peer's [`Redial::offer`].
    pub offer: u64,
    /// Whether the plane still waits for its connection: false once the endpoint is dropped,
    /// failed or closing; an attempt that waits for the peer or the link looks often.
    pub wanted: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl std::fmt::Debug for RedialCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedialCall")
            .field("deadline", &self.deadline)
            .field("offer", &self.offer)
            .finish_non_exhaustive()
    }
}

/// A plane's new connection: a socket the frames go on directly, or another transport's
/// endpoint.
pub enum Remade {
    Socket(TcpStream),
    Endpoint(Box<dyn Endpoint>),
}

impl std::fmt::Debug for Remade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Remade::Socket(s) => f.debug_tuple("Socket").field(s).finish(),
            Remade::Endpoint(ep) => f.debug_tuple("Endpoint").field(&ep.peer()).finish(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Up,
    /// Stopped delivering while another plane answered; probed by TCP's own retries.
    Down,
    /// Failed with an error; its connection is made again where the transport can
    /// ([`Redial`]), else never used again.
    Dead,
}

/// A frame being written: its header (and an ack's payload) then payload bytes from the ring.
struct Tx {
    head: [u8; HDR + ACK_MAX],
    head_len: usize,
    off: u64,
    len: usize,
    done: usize,
}

/// The frame being read.
enum Rx {
    /// Reading a header (bytes so far).
    Header(usize),
    /// Reading an ack's payload (its length, bytes so far).
    Ack(usize, usize),
    /// Reading a data frame's payload: the offset of the next byte and the frame's end.
    Data(u64, u64),
}

struct Plane {
    /// E.g. `TCP plane 1 (10.0.1.1:4000 -> 10.0.1.2:4100)`.
    name: String,
    link: Link,
    state: State,
    tx: Option<Tx>,
    /// Stream ranges of data frames written here and not yet acknowledged.
    sent: Vec<(u64, u64)>,
    /// Bytes of data frames (headers and payload) written to this plane, and how many of them
    /// the peer says it read. Acks and pings are not counted, so that no ack calls for another.
    wrote: u64,
    peer_read: u64,
    /// When `peer_read` last moved (or the plane went from idle to busy).
    moved: Instant,
    /// When anything was last read from this plane.
    heard: Instant,
    /// Since when it has stalled while another plane delivered.
    suspect: Option<Instant>,
    /// Bytes per second the peer read from it while it had bytes in flight (0: not yet known).
    rate: f64,
    ack_due: bool,
    ping_due: bool,
    rx: Rx,
    rx_head: [u8; HDR + ACK_MAX],
    /// Bytes of data frames read from this plane.
    read: u64,
    /// Which connection of this plane this is (0 the first, each one made again the next), as
    /// acks and redial notices name it: counts of one are never taken for another's.
    generation: u8,
    /// `read` when this connection began.
    read_base: u64,
    redial: Redialing,
}

/// A failed plane's way back.
#[derive(Default)]
struct Redialing {
    /// How (none: no way, or it is being used on the redial thread).
    how: Option<Box<dyn Redial>>,
    /// A notice to the peer is to go out (once the failed connection is dropped); it went;
    /// the peer's arrived.
    due: bool,
    sent: bool,
    heard: bool,
    /// This end's offer (in its notice) and the peer's (from its notice).
    offer: u64,
    peer_offer: u64,
}

impl Plane {
    fn new(name: String, link: Link, now: Instant) -> Plane {
        Plane {
            name,
            link,
            state: State::Up,
            tx: None,
            sent: Vec::new(),
            wrote: 0,
            peer_read: 0,
            moved: now,
            heard: now,
            suspect: None,
            rate: 0.0,
            ack_due: false,
            ping_due: false,
            rx: Rx::Header(0),
            rx_head: [0; HDR + ACK_MAX],
            read: 0,
            generation: 0,
            read_base: 0,
            redial: Redialing::default(),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }

    /// Whether the peer has yet to read data from this plane: bytes written and not acknowledged
    /// as read, or a frame its connection has not taken yet (a transport with flow control of
    /// its own, as verbs has, takes nothing while the peer grants no room).
    fn owes(&self) -> bool {
        self.wrote > self.peer_read || self.tx.as_ref().is_some_and(|t| t.len > 0)
    }
}

mod keeper;
mod link;
mod recv;
mod redial;
mod ring;
mod send;
#[cfg(test)]
mod tests;

use keeper::keeper;
use link::{Link, WaitFd, link_error};
use ring::{Ranges, Ring};

struct Inner {
    /// This endpoint, for threads that come back to it (a plane made again).
    me: Weak<Mutex<Inner>>,
    peer: usize,
    planes: Vec<Plane>,
    down_after: Duration,
    /// Next plane to offer a frame.
    turn: usize,
    /// When `service` last ran.
    serviced_at: Instant,
    /// When the caller last called (or, while it may sleep on the planes, until when it may).
    touched: Instant,
    // Sending.
    out: Ring,
    /// Stream offsets: taken from the caller, and acknowledged by the peer.
    taken: u64,
    acked: u64,
    /// Ranges to frame again, from planes that went down.
    resend: Vec<(u64, u64)>,
    // Receiving.
    inq: Ring,
    have: Ranges,
    /// Delivered to the caller.
    next: u64,
    ack_sent: u64,
    ack_sent_at: Instant,
    /// Bytes read (all planes) when the last ack went out.
    read_at_ack: u64,
    scratch: Box<[u8]>,
    seam: [u8; 64],
    /// Set when the last plane failed: every later call fails with it, once the bytes that
    /// arrived before are delivered.
    failed: Option<Error>,
    /// Dropped, lingering: a plane the peer closes now is the peer closing too, not news.
    closing: bool,
    /// The peer said goodbye: it reads nothing more, so a drop has nothing to wait for.
    peer_left: bool,
    /// Wait descriptors of planes made again, for the caller's next wait to take up.
    new_fds: Vec<(usize, Vec<WaitFd>)>,
    // What happened, for the log and tests.
    failovers: u64,
    resent: u64,
    redials: u64,
}

/// An [`Endpoint`] over several planes.
pub struct Striped {
    inner: Arc<Mutex<Inner>>,
    peer: usize,
    /// What a waiting caller sleeps on, per plane.
    fds: Vec<WaitFd>,
    /// How long a drop waits for the peer to acknowledge what it was handed.
    linger: Duration,
}

impl std::fmt::Debug for Striped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Striped")
            .field("peer", &self.peer)
            .field("planes", &self.fds.len())
            .finish_non_exhaustive()
    }
}

impl Striped {
    /// An endpoint over `conns` (at least one) to `peer`; `down_after` is
    /// `CCL_PLANE_TIMEOUT_MS`, `linger` bounds how long a drop waits for the peer to
    /// acknowledge what it was handed (the communicator's timeout). `redial` gives each plane
    /// its way back after an error (none: the plane stays failed).
    pub fn new(
        peer: usize,
        conns: Vec<PlaneConn>,
        redial: &dyn Fn(&PlaneConn) -> Option<Box<dyn Redial>>,
        down_after: Duration,
        linger: Duration,
    ) -> Result<Striped> {
        let now = Instant::now();
        let mut planes = Vec::with_capacity(conns.len());
        let mut fds = Vec::with_capacity(conns.len());
        for c in conns {
            c.stream.set_nonblocking(true).map_err(|e| {
                Error::io(
                    ErrorKind::System,
                    format!("TCP plane {} to peer {peer}", c.plane),
                    e,
                )
                .peer(peer)
            })?;
            let how = redial(&c);
            let stream = Arc::new(c.stream);
            fds.push(WaitFd::tcp(planes.len(), &stream));
            let name = format!("TCP plane {} ({} -> {})", c.plane, c.local, c.remote);
            let mut p = Plane::new(name, Link::Tcp(stream), now);
            p.redial.how = how;
            planes.push(p);
        }
        Ok(Striped::start(peer, planes, fds, down_after, linger))
    }

    /// An endpoint over one connection per plane that another transport made (in the same
    /// order on both ends), as [`Striped::new`] over sockets.
    pub fn over_endpoints(
        peer: usize,
        eps: Vec<PlaneEndpoint>,
        down_after: Duration,
        linger: Duration,
    ) -> Result<Striped> {
        let now = Instant::now();
        let mut planes = Vec::with_capacity(eps.len());
        let mut fds = Vec::new();
        for e in eps {
            let waits = WaitFd::of_endpoint(planes.len(), &*e.endpoint).map_err(|err| {
                Error::io(
                    ErrorKind::System,
                    format!("{} to peer {peer}: copying its wait descriptors", e.name),
                    err,
                )
                .peer(peer)
            })?;
            fds.extend(waits);
            let mut p = Plane::new(e.name, Link::Endpoint(e.endpoint), now);
            p.redial.how = e.redial;
            planes.push(p);
        }
        Ok(Striped::start(peer, planes, fds, down_after, linger))
    }

    fn start(
        peer: usize,
        planes: Vec<Plane>,
        fds: Vec<WaitFd>,
        down_after: Duration,
        linger: Duration,
    ) -> Striped {
        assert!(!planes.is_empty() && planes.len() <= MAX_PLANES);
        let now = Instant::now();
        let inner = Arc::new_cyclic(|me| {
            Mutex::new(Inner {
                me: me.clone(),
                peer,
                planes,
                down_after,
                turn: 0,
                touched: now,
                serviced_at: now,
                out: Ring::new(),
                taken: 0,
                acked: 0,
                resend: Vec::new(),
                inq: Ring::new(),
                have: Ranges::default(),
                next: 0,
                ack_sent: 0,
                ack_sent_at: now,
                read_at_ack: 0,
                scratch: vec![0u8; 64 << 10].into_boxed_slice(),
                seam: [0; 64],
                failed: None,
                closing: false,
                peer_left: false,
                new_fds: Vec::new(),
                failovers: 0,
                resent: 0,
                redials: 0,
            })
        });
        keeper().add(&inner);
        Striped {
            inner,
            peer,
            fds,
            linger,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves nothing half-updated that a later call could
        // misread as data: every field is advanced only after the bytes it counts moved.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many planes went down, and bytes sent again because of it (for tests and logs).
    pub fn failovers(&self) -> (u64, u64) {
        let g = self.lock();
        (g.failovers, g.resent)
    }

    /// How many planes' connections were made again after they failed.
    pub fn redials(&self) -> u64 {
        self.lock().redials
    }

    /// Each plane's state, as `up`, `down` or `dead`.
    pub fn plane_states(&self) -> Vec<&'static str> {
        self.lock()
            .planes
            .iter()
            .map(|p| match p.state {
                State::Up => "up",
                State::Down => "down",
                State::Dead => "dead",
            })
            .collect()
    }
}

impl Inner {
    /// Everything but handing bytes to the caller: reads acks (and, with `ahead`, data ahead of
    /// what was delivered, so acks behind it are reached), declares stalled planes down, owes
    /// acks, writes what is owed.
    fn service(&mut self, ahead: bool) -> Result<()> {
        self.serviced_at = Instant::now();
        for i in 0..self.planes.len() {
            self.drain(i, None, ahead)?;
        }
        self.check_planes();
        self.owe_acks();
        self.pump()
    }

    fn owe_acks(&mut self) {
        let read: u64 = self.planes.iter().map(|p| p.read).sum();
        let due = self.next - self.ack_sent >= ACK_EVERY
            || read - self.read_at_ack >= READ_ACK_EVERY
            || ((read > self.read_at_ack || self.next > self.ack_sent)
                && self.ack_sent_at.elapsed() >= ACK_INTERVAL);
        if due {
            self.ack_sent = self.next;
            self.ack_sent_at = Instant::now();
            self.read_at_ack = read;
            for p in &mut self.planes {
                p.ack_due = true;
            }
        }
    }

    /// Whether the keeper has something to do here.
    fn has_work(&self) -> bool {
        let owed = self.taken > self.acked
            || !self.resend.is_empty()
            || self.next > self.ack_sent
            || self
                .planes
                .iter()
                .any(|p| p.tx.is_some() || p.ack_due || p.redial.due)
            || self.planes.iter().map(|p| p.read).sum::<u64>() > self.read_at_ack;
        owed && self.planes.iter().any(|p| p.state != State::Dead)
    }
}

impl Endpoint for Striped {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        if src.is_empty() {
            return Ok(0);
        }
        let mut g = self.lock();
        g.touched = Instant::now();
        if let Some(e) = &g.failed {
            return Err(e.clone());
        }
        let n = g.send(src)?;
        let work = g.has_work();
        drop(g);
        if work {
            keeper().poke();
        }
        Ok(n)
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        let mut g = self.lock();
        g.touched = Instant::now();
        let mut n = g.take_ring(dst);
        if n == 0 {
            if let Some(e) = &g.failed {
                return Err(e.clone());
            }
            for i in 0..g.planes.len() {
                match g.drain(i, Some(&mut dst[n..]), false) {
                    Ok(k) => n += k,
                    // Bytes that arrived before the last plane failed are delivered first.
                    Err(e) => return if n > 0 { Ok(n) } else { Err(e) },
                }
                if n == dst.len() {
                    break;
                }
            }
        }
        // Nothing in order anywhere: read ahead (the next bytes may sit behind frames that a
        // failover sent early), then serve what that brought. Bytes delivered: the rest of the
        // work waits for a call that finds none, or for a while to pass.
        let serviced = if n == 0 || g.serviced_at.elapsed() >= SERVICE_EVERY {
            g.service(n == 0)
        } else {
            Ok(())
        };
        if n == 0 {
            n = g.take_ring(dst);
        }
        match serviced {
            Err(e) if n == 0 => return Err(e),
            Err(_) => return Ok(n),
            Ok(()) => {}
        }
        g.owe_acks();
        g.pump()?;
        Ok(n)
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let mut g = self.lock();
        g.touched = Instant::now();
        if g.have.run_at(g.next) == 0 {
            if let Some(e) = &g.failed {
                return Err(e.clone());
            }
            let serviced = g.service(true);
            if g.have.run_at(g.next) == 0 {
                serviced?;
            }
        }
        let run = (g.have.run_at(g.next) as usize).min(max);
        if run == 0 {
            return Ok(0);
        }
        let next = g.next;
        let contiguous = g.inq.at(next, run).len();
        let used = if contiguous < run && contiguous < g.seam.len() {
            // The bytes wrap around the ring: lend a few across the seam, so a consumer that
            // wants whole elements is never offered only a fragment of one.
            let k = run.min(g.seam.len());
            let inner = &mut *g;
            let mut got = 0;
            while got < k {
                let s = inner.inq.at(next + got as u64, k - got);
                inner.seam[got..got + s.len()].copy_from_slice(s);
                got += s.len();
            }
            consume(&inner.seam[..k])
        } else {
            consume(g.inq.at(next, run))
        };
        g.next += used as u64;
        let next = g.next;
        g.have.trim(next);
        if g.failed.is_none() {
            g.owe_acks();
            g.pump()?;
        }
        Ok(used)
    }

    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        let Striped { inner, fds, .. } = self;
        let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
        g.touched = Instant::now() + CALLER_SLEEPS;
        for (i, new) in std::mem::take(&mut g.new_fds) {
            fds.retain(|w| w.plane != i);
            fds.extend(new);
        }
        let before = (g.next, g.acked, g.have.run_at(g.next));
        if let Some(e) = &g.failed {
            // Bytes that arrived before the failure are still to be taken.
            return if g.have.run_at(g.next) > 0 {
                Ok(false)
            } else {
                Err(e.clone())
            };
        }
        if let Err(e) = g.service(true) {
            return if g.have.run_at(g.next) > 0 {
                Ok(false)
            } else {
                Err(e)
            };
        }
        // Room may have been made before this call (the keeper reads acks while the caller is
        // away): a sender that could go on must not sleep waiting for an ack already read.
        if (g.next, g.acked, g.have.run_at(g.next)) != before
            || (interest.recv && g.have.run_at(g.next) > 0)
            || (interest.send && g.can_take())
        {
            return Ok(false);
        }
        // A link that arms notifications may find bytes while doing so: then no sleep.
        for i in 0..g.planes.len() {
            if g.planes[i].state == State::Dead {
                continue;
            }
            let half_written = g.planes[i].tx.is_some();
            match g.planes[i].link.prepare_wait(half_written) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(e) => {
                    let e = e.context(format!("{} to peer {}", g.planes[i].name(), g.peer));
                    // The last plane failing is reported by the next call, after the bytes
                    // that arrived before it.
                    let _ = g.plane_failed(i, e);
                    return Ok(false);
                }
            }
        }
        for w in fds.iter_mut() {
            let p = &g.planes[w.plane];
            w.set(p.state != State::Dead, p.tx.is_some());
        }
        Ok(true)
    }

    fn wait_fds<'a>(&'a self, _interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        for w in &self.fds {
            if !w.flags.is_empty() {
                out.push((w.fd(), w.flags));
            }
        }
    }
}

impl Drop for Striped {
    /// Lingers until the peer has read every byte the caller handed over off the planes (it
    /// acknowledged them), said goodbye, every plane failed, or the communicator's timeout
    /// passed. Written is
    /// not enough: the peer's acks keep arriving, and a socket closed with unread bytes resets
    /// its connection, which throws away at the peer what it had not read yet.
    fn drop(&mut self) {
        let until = Instant::now() + self.linger;
        loop {
            let mut g = self.lock();
            g.touched = Instant::now();
            g.closing = true;
            let _ = g.service(true);
            // Data only: an ack or a ping a connection does not take is no loss.
            let unread = !g.resend.is_empty()
                || g.planes.iter().any(|p| {
                    // A plane that is down had its bytes taken back to go on the others.
                    p.state == State::Up
                        && (p.wrote > p.peer_read || p.tx.as_ref().is_some_and(|t| t.len > 0))
                });
            if !unread || g.peer_left || g.planes.iter().all(|p| p.state == State::Dead) {
                g.goodbye();
                return;
            }
            if Instant::now() >= until {
                ccl_warn!(
                    None,
                    "planes to peer {}: closed with bytes the peer has not read after {:.0} s",
                    self.peer,
                    self.linger.as_secs_f64()
                );
                return;
            }
            drop(g);
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
