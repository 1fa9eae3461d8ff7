//! The transport abstraction: how bytes move between two ranks.
//!
//! Shaped after NCCL's net plugin and Gloo's `Pair`:
//! - A [`Transport`] is chosen at run time (`dyn`), so every type here is object-safe.
//! - A rank [`listen`](Transport::listen)s once; the listener's [`Handle`] (at most
//!   [`MAX_HANDLE_LEN`] bytes) goes to the other ranks through the bootstrap, and peers
//!   [`connect`](Transport::connect) to it. Connections authenticate with the communicator's secret.
//! - An [`Endpoint`] is one bidirectional connection to a peer: an ordered, reliable byte pipe with
//!   **non-blocking** calls. Every call returns how much it did now (0 = would block); the caller
//!   polls it again later. That is the NCCL `isend`/`test` pair folded into one call: instead of
//!   handing the transport a pointer that must stay valid until a later `test`, the caller passes a
//!   borrowed slice on each call, so the API stays safe and a socket can still read and write
//!   user memory directly (zero copy for TCP). Transports that need registered memory (verbs)
//!   stage through their own registered slots, or send straight from memory the caller
//!   registered with them ([`Transport::register`], [`Endpoint::send_registered`]).
//! - The schedule (both sides know the byte counts of every transfer) gives the stream its message
//!   boundaries; transports need not frame anything.
//!
//! Waiting follows "spin, then block": the executor retries non-blocking calls for a short while,
//! then asks each endpoint to [`prepare_wait`](Endpoint::prepare_wait) and sleeps in `poll(2)` on
//! the descriptors from [`wait_fds`](Endpoint::wait_fds), so idle ranks do not burn the cores that
//! their peers (or a software RDMA device) need.

/// The log subsystem of every transport.
const LOG_SUBSYS: crate::log::Subsys = crate::log::Subsys::Net;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod handshake;
pub mod local;
pub mod planes;
pub mod program;
pub mod tcp;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

use crate::error::{Error, Result};

/// The largest connection handle a transport may publish (NCCL's `NCCL_NET_HANDLE_MAXSIZE`).
pub const MAX_HANDLE_LEN: usize = 128;

/// What a listener publishes so peers can connect to it: opaque bytes, at most
/// [`MAX_HANDLE_LEN`]. Transports version their handles (first bytes) so a mismatched build is
/// refused with a clear error rather than misread.
#[derive(Clone, PartialEq, Eq)]
pub struct Handle {
    len: u8,
    bytes: [u8; MAX_HANDLE_LEN],
}

impl Handle {
    /// Wraps `bytes`; fails when they exceed [`MAX_HANDLE_LEN`].
    pub fn new(bytes: &[u8]) -> Result<Handle> {
        if bytes.len() > MAX_HANDLE_LEN {
            return Err(Error::internal(format!(
                "connection handle of {} bytes exceeds the {MAX_HANDLE_LEN}-byte limit",
                bytes.len()
            )));
        }
        let mut h = Handle {
            len: bytes.len() as u8,
            bytes: [0; MAX_HANDLE_LEN],
        };
        h.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(h)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// The layout every transport's handle shares: a magic naming the transport, a version, then the
/// transport's own bytes. Checking the first two in one place means every transport refuses a
/// handle of another transport, or of another version of the library, in the same words.
#[derive(Clone, Copy, Debug)]
pub struct HandleFormat {
    /// The transport as errors name it (`TCP`, `shared-memory`, ...).
    pub transport: &'static str,
    pub magic: &'static [u8],
    /// Changes whenever the body's layout does.
    pub version: u8,
}

impl HandleFormat {
    /// A handle of this format around `body` (a transport's bodies are a few dozen bytes).
    pub fn encode(&self, body: &[u8]) -> Handle {
        let mut b = Vec::with_capacity(self.magic.len() + 1 + body.len());
        b.extend_from_slice(self.magic);
        b.push(self.version);
        b.extend_from_slice(body);
        Handle::new(&b).expect("a transport's handle fits in MAX_HANDLE_LEN bytes")
    }

    /// The body of `h`, or an error saying why `h` is not a handle of this format.
    pub fn decode<'h>(&self, h: &'h Handle) -> Result<&'h [u8]> {
        let b = h.as_bytes();
        let m = self.magic.len();
        if b.len() <= m || &b[..m] != self.magic {
            return Err(self.malformed(
                "not one of its handles (wrong magic; do all ranks use the same transport?)",
            ));
        }
        if b[m] != self.version {
            return Err(self.malformed(&format!(
                "version {} but this build speaks {} (mixed library versions?)",
                b[m], self.version
            )));
        }
        Ok(&b[m + 1..])
    }

    /// The error for a handle of this format whose body makes no sense.
    pub fn malformed(&self, why: &str) -> Error {
        Error::invalid_argument(format!("bad {} connection handle: {why}", self.transport))
    }
}

/// A socket address as handle bytes: family (4 or 6), port (big endian), address.
pub fn encode_addr(addr: SocketAddr) -> Vec<u8> {
    let mut b = Vec::with_capacity(19);
    match addr.ip() {
        IpAddr::V4(v4) => {
            b.push(4);
            b.extend_from_slice(&addr.port().to_be_bytes());
            b.extend_from_slice(&v4.octets());
        }
        IpAddr::V6(v6) => {
            b.push(6);
            b.extend_from_slice(&addr.port().to_be_bytes());
            b.extend_from_slice(&v6.octets());
        }
    }
    b
}

/// A list of socket addresses (one per network plane) as a handle body: a count, then each
/// address as [`encode_addr`] writes it.
pub fn encode_addrs(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut body = vec![addrs.len() as u8];
    for a in addrs {
        body.extend_from_slice(&encode_addr(*a));
    }
    body
}

/// Reads [`encode_addrs`]'s body: at least one address and at most `max`; anything else is
/// `format`'s malformed-handle error.
pub fn decode_addrs(format: &HandleFormat, body: &[u8], max: usize) -> Result<Vec<SocketAddr>> {
    let (&n, mut rest) = body
        .split_first()
        .ok_or_else(|| format.malformed("empty"))?;
    if n == 0 || n as usize > max {
        return Err(format.malformed(&format!("{n} planes (1 to {max} expected)")));
    }
    let mut addrs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = match rest.first() {
            Some(4) => 7,
            Some(6) => 19,
            _ => return Err(format.malformed("not an address")),
        };
        if rest.len() < len {
            return Err(format.malformed("not an address"));
        }
        let a = decode_addr(&rest[..len]).ok_or_else(|| format.malformed("not an address"))?;
        addrs.push(a);
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err(format.malformed("bytes after the last address"));
    }
    Ok(addrs)
}

/// Reads [`encode_addr`]'s bytes (all of `b`); `None` when they are anything else.
pub fn decode_addr(b: &[u8]) -> Option<SocketAddr> {
    let (&family, rest) = b.split_first()?;
    let (port, ip) = rest.split_first_chunk::<2>()?;
    let ip = match (family, ip.len()) {
        (4, 4) => IpAddr::from(<[u8; 4]>::try_from(ip).ok()?),
        (6, 16) => IpAddr::from(<[u8; 16]>::try_from(ip).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, u16::from_be_bytes(*port)))
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle({} bytes)", self.len)
    }
}

/// Who is connecting and the proof that it belongs to the job.
#[derive(Clone)]
pub struct ConnectContext {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// The communicator's secret (from the unique id); connections without it are refused.
    pub secret: [u8; 32],
    /// The local address to listen on / connect from, chosen during bootstrap.
    pub local_ip: std::net::IpAddr,
    /// Settings (buffer sizes, timeouts, ...).
    pub config: crate::config::Config,
}

impl fmt::Debug for ConnectContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectContext")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_ip", &self.local_ip)
            .finish_non_exhaustive()
    }
}

/// What a transport is like: for the algorithm cost model (alpha-beta), and for waiting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransportProperties {
    /// One-way latency of a small message.
    pub latency: Duration,
    /// Bytes per second one connection sustains in one direction.
    pub bandwidth: f64,
    /// How much longer than `CCL_SPIN_US` a waiting rank should busy-poll its peers before it
    /// sleeps, for a transport whose wake-up costs much more than a poll (verbs:
    /// `CCL_IB_SPIN_US`).
    pub spin: Duration,
    /// Whether ranks connected by it also share a host-wide segment ([`HostMemory`]), on which
    /// the intra-host collectives (`Algo::Shm` in ccl-algos) run.
    pub host_memory: bool,
}

/// Which pairs of ranks a transport can connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Any two ranks that can reach each other over the network.
    Any,
    /// Ranks of one host that can share memory (same host name, same boot, same network
    /// namespace).
    Host,
    /// Threads of one process.
    Process,
}

/// A way of connecting ranks. Object-safe: chosen at run time.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Short name for logs and the benchmark (`tcp`, `local`, `ib`, `shm`).
    fn name(&self) -> &'static str;

    /// Which pairs it can connect; a communicator picks, per pair, the first transport both
    /// ranks have whose scope includes them.
    fn scope(&self) -> Scope {
        Scope::Any
    }

    /// Latency and bandwidth for the cost model, and the spin its waits want.
    fn properties(&self) -> TransportProperties;

    /// Called once before any connection is made, with the peers this transport will connect
    /// this rank to (higher and lower). Shared memory uses it to set up memory for the whole
    /// host; most transports need nothing.
    fn prepare(&self, _ctx: &ConnectContext, _peers: &[usize]) -> Result<()> {
        Ok(())
    }

    /// Starts listening for connections from peers.
    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>>;

    /// Sets up what the ranks of one host share, before any pair of them connects (so pairs
    /// can connect on demand, or never): shared memory hands out the host segment, every
    /// rank's arena and every rank's liveness here. Called at set-up, after
    /// [`prepare`](Transport::prepare) and [`listen`](Transport::listen), by every rank of
    /// `group` (this host's ranks that use this transport with each other, ascending, two or
    /// more); `leader` is the handle `group[0]` published. `watch` says whether another rank's
    /// failure ends the set-up (called with the ranks still awaited). Most transports share
    /// nothing.
    fn join_host(
        &self,
        _ctx: &ConnectContext,
        _group: &[usize],
        _leader: &Handle,
        _deadline: Instant,
        _watch: &(dyn Fn(&[usize]) -> Result<()> + Sync),
    ) -> Result<()> {
        Ok(())
    }

    /// Connects to the listener of `peer` that published `handle`.
    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>>;

    /// Once set-up is done: the memory this rank shares with the other ranks of its host, if
    /// the transport set one up ([`join_host`](Transport::join_host)). Taken once.
    fn take_host(&self) -> Option<Box<dyn HostMemory>> {
        None
    }

    /// Registers `mem` with the transport for zero-copy transfers ([`MemRegion`]), or
    /// `Ok(None)` when the transport has no use for registered memory (the default: TCP, shared
    /// memory and in-process read and write caller memory directly anyway).
    ///
    /// The returned region records `mem`'s address, not a borrow: its owner must drop it before
    /// the memory is freed or moved, and must keep the memory borrowed while any transfer uses
    /// it. `ccl`'s `Registration` and `Buffer` make that a compile-time rule; nothing else should
    /// call this.
    fn register(&self, _mem: &[u8]) -> Result<Option<Box<dyn MemRegion>>> {
        Ok(None)
    }
}

/// Memory registered with one transport ([`Transport::register`]); deregistered when dropped.
/// An endpoint given a region for a transfer uses it only if it is its own transport's
/// ([`as_any`](MemRegion::as_any) to recognise it), and stages the bytes otherwise.
pub trait MemRegion: Send + Sync + fmt::Debug {
    /// The transport that registered it ([`Transport::name`]).
    fn transport(&self) -> &'static str;
    /// First byte registered.
    fn addr(&self) -> usize;
    /// Bytes registered.
    fn len(&self) -> usize;
    /// Whether no byte is registered.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the owning transport to recognise its own regions.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Memory every rank of one host maps: a slot of bytes per rank, and a counter per rank that
/// only grows, which the rank bumps ([`post`](HostMemory::post)) when what it wrote before is
/// ready for the others (release), and which the others read (acquire) before they read it.
///
/// Schedules say who writes what when (ccl-algos' `Buf::Host`, `Action::Post`,
/// `Action::WaitPosts`); the symbolic checker verifies that no slot is read before its owner
/// posted the write, nor written again before every reader posted that it is done.
pub trait HostMemory: Send + fmt::Debug {
    /// Communicator rank of each host index, ascending.
    fn ranks(&self) -> &[usize];
    /// This rank's host index.
    fn me(&self) -> usize;
    /// Bytes of each rank's slot.
    fn slot_len(&self) -> usize;
    /// How many times host rank `i` has posted.
    fn posted(&self, i: usize) -> u64;
    /// Publishes everything this rank wrote before. Wakes nobody (so that the rank need not
    /// wait for its writes to reach the other CPUs): a rank that posted calls
    /// [`wake`](HostMemory::wake) before it waits for anything and when it leaves the operation.
    fn post(&self);
    /// Wakes the host ranks that sleep waiting for this rank's posts (ordered after them).
    fn wake(&self);
    /// Wakes the host ranks seen sleeping, without ordering anything (cheap; see
    /// [`wake`](HostMemory::wake)).
    fn wake_seen(&self);
    /// Announces the operation this rank is in (a fingerprint), before its first post in it;
    /// `op` counts the operations in host memory. A rank may be one operation ahead of another,
    /// so consecutive operations announce in different places.
    fn announce(&self, op: u64, desc: u64);
    /// The fingerprint host rank `i` announced last for operation `op` (or `op - 2`, ...).
    fn desc(&self, i: usize, op: u64) -> u64;
    /// Whether every host rank has posted at least `count` times.
    fn all_posted(&self, count: u64) -> bool {
        (0..self.ranks().len()).all(|i| self.posted(i) >= count)
    }
    /// The first other host rank whose fingerprint for operation `op` is not `desc`, with its
    /// fingerprint.
    fn first_unlike(&self, op: u64, desc: u64) -> Option<(usize, u64)> {
        let me = self.me();
        (0..self.ranks().len())
            .filter(|&i| i != me)
            .map(|i| (i, self.desc(i, op)))
            .find(|&(_, d)| d != desc)
    }
    /// Raises this rank's sleep flag unless every host rank has posted `count` times by now;
    /// returns whether the caller may sleep on [`wait_fd`](HostMemory::wait_fd).
    fn arm(&self, count: u64) -> bool;
    /// Readable when another host rank posted while this one slept.
    fn wait_fd(&self) -> BorrowedFd<'_>;
    /// Host rank `i`'s slot, to read what its owner posted.
    fn slot(&self, i: usize) -> &[u8];
    /// This rank's slot, to write.
    fn my_slot(&mut self) -> &mut [u8];
    /// This rank's slot to write and host rank `i`'s (`i != me`) to read, at once.
    fn slot_pair(&mut self, i: usize) -> (&mut [u8], &[u8]);
    /// Runs `prog`'s steps from step `from` on `call`'s buffers, until they are done, a wait
    /// would block or a rank is in another operation ([`program`]). A run from step 0 sets
    /// `call.base`. Buffers or slots too small for the program are an error, before any step.
    fn run(
        &mut self,
        prog: &program::HostProgram,
        from: usize,
        call: &mut program::HostCall<'_>,
    ) -> Result<program::Stop>;

    // Buffers the host's ranks read and write in place (ccl-algos' `Buf::PeerIn`/`PeerOut`):
    // memory from this rank's shared arena, which every other rank of the host maps.

    /// Whether every rank of the host maps the others' arenas and `bytes` lies in one live
    /// block of this rank's.
    fn shared(&self, _bytes: &[u8]) -> bool {
        false
    }
    /// Whether any buffer can be [`shared`](HostMemory::shared): every rank of the host maps
    /// the others' arenas (known once the host memory is made, and fixed from then on).
    fn has_shared(&self) -> bool {
        false
    }
    /// Tells the host where this rank's input and output of operation `op` (counted as in
    /// [`announce`](HostMemory::announce)) lie, before its first post in it; both must be
    /// [`shared`](HostMemory::shared).
    fn announce_buffers(&self, _op: u64, _input: &[u8], _output: &[u8]) -> Result<()> {
        Err(Error::internal("this host memory has no shared buffers"))
    }
    /// Host rank `i`'s input of the operation announced last, once its post published it.
    fn peer_input(&self, _i: usize) -> Result<&[u8]> {
        Err(Error::internal("this host memory has no shared buffers"))
    }
    /// Host rank `i`'s output of the operation announced last, to write.
    fn peer_output(&mut self, _i: usize) -> Result<&mut [u8]> {
        Err(Error::internal("this host memory has no shared buffers"))
    }
    /// The reduce kernels for reductions out of host memory: a small operation there reads the
    /// other CPUs' cache lines as it reduces, and wider loads keep more of them in flight.
    fn kernels(&self) -> crate::reduce::Kernels {
        crate::reduce::Kernels::BASELINE
    }
    /// A descriptor that turns readable when some host rank may have left (it dropped the
    /// communicator, or its process ended however it ended), where the transport can tell: a
    /// rank waiting for posts watches it, whether or not it ever connected to the ranks it
    /// waits for. It stays readable until [`gone`](HostMemory::gone) has been asked about the
    /// ranks that left.
    fn departures_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Whether host rank `i` has left (see [`departures_fd`](HostMemory::departures_fd)).
    fn gone(&self, _i: usize) -> bool {
        false
    }
}

/// The accepting side of a transport.
pub trait Listener: Send {
    /// The handle peers connect to.
    fn handle(&self) -> Handle;

    /// Waits for the next authenticated connection and returns it with the peer's rank.
    /// Connections that fail authentication are logged and dropped, not returned.
    ///
    /// `deadline` bounds the wait for a peer to connect (a timeout error when it passes); once a
    /// peer has authenticated, the rest of its set-up is bounded by the communicator's timeout
    /// instead, so a caller may poll with short deadlines without losing a connection.
    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)>;
}

/// What the executor waits for on an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Interest {
    /// It has bytes to send.
    pub send: bool,
    /// It expects bytes.
    pub recv: bool,
}

/// One connection to a peer: an ordered, reliable, bidirectional byte pipe with non-blocking calls.
///
/// Errors name the peer; a closed connection is an [`ErrorKind::Remote`](crate::ErrorKind) error.
pub trait Endpoint: Send {
    /// The peer's rank.
    fn peer(&self) -> usize;

    /// Sends a prefix of `src` now; returns how many bytes were taken (0 = try later). Once taken,
    /// the bytes belong to the transport: the caller may overwrite `src`.
    fn send(&mut self, src: &[u8]) -> Result<usize>;

    /// Receives up to `dst.len()` bytes of the stream into `dst`; returns how many (0 = none yet).
    fn recv(&mut self, dst: &mut [u8]) -> Result<usize>;

    /// Lends up to `max` received bytes of the stream to `consume`, which returns how many of the
    /// offered bytes it used (possibly fewer, e.g. whole elements only; the rest is offered again
    /// on the next call). Returns the number used. This lets the caller reduce straight from the
    /// transport's buffer into its destination with no intermediate copy. `consume` may be
    /// called several times in one call, with consecutive pieces of the stream (a message-based
    /// transport lends one received message at a time), until it takes less than it was offered
    /// or `max` bytes are used.
    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize>;

    /// [`send`](Endpoint::send) from memory that lies inside `region` (registered with this
    /// endpoint's transport by [`Transport::register`]): a transport that can, sends straight
    /// from it with no copy into its own buffers. The default stages like `send`, as does a
    /// transport given a region it does not recognise or that does not cover `src`.
    ///
    /// Zero copy changes what "taken" means: the returned count covers bytes the transport has
    /// finished reading, and the device may still be reading bytes past it. So the caller keeps
    /// `src` unchanged and calls again, with `src` starting at the first byte not yet taken,
    /// until every byte is taken; only then may it reuse or release the memory. A transport
    /// fails when a call starts anywhere else while bytes of an earlier one are in flight.
    fn send_registered(&mut self, src: &[u8], _region: &dyn MemRegion) -> Result<usize> {
        self.send(src)
    }

    /// [`recv`](Endpoint::recv) into memory that lies inside `region` (registered with this
    /// endpoint's transport): a transport that can lets the peer write the bytes straight into
    /// `dst` (the verbs transport grants the range in its clear-to-send), with no copy out of its
    /// own buffers. The default receives like `recv`, as does a transport given a region it does
    /// not recognise or that does not cover `dst`.
    ///
    /// The peer may write anywhere in `dst` before the call reports those bytes, so the caller
    /// keeps all of `dst` borrowed mutably (neither reads nor writes it) and calls again, with
    /// `dst` starting at the first byte not yet received and reaching at least as far, until
    /// every byte is received. A transport fails when a call starts anywhere else, or when a
    /// plain `recv` comes while a range is granted.
    fn recv_registered(&mut self, dst: &mut [u8], _region: &dyn MemRegion) -> Result<usize> {
        self.recv(dst)
    }

    /// Called before the rank sleeps (after it has busy-polled every peer it waits on). Returns
    /// `Ok(false)` when progress may be possible right away (e.g. data arrived while arming a
    /// notification); the executor then retries instead of sleeping.
    fn prepare_wait(&mut self, interest: Interest) -> Result<bool>;

    /// Descriptors to `poll(2)` on for `interest` (after a `prepare_wait` that returned true).
    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>);
}

impl fmt::Debug for dyn Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint(peer {})", self.peer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: HandleFormat = HandleFormat {
        transport: "test",
        magic: b"CX",
        version: 3,
    };

    #[test]
    fn handles_round_trip_and_others_are_refused() {
        let h = F.encode(b"body");
        assert_eq!(F.decode(&h).unwrap(), b"body");
        let other = HandleFormat { magic: b"CY", ..F };
        let e = F.decode(&other.encode(b"body")).unwrap_err().to_string();
        assert!(
            e.contains("bad test connection handle") && e.contains("same transport"),
            "{e}"
        );
        let newer = HandleFormat { version: 4, ..F };
        let e = F.decode(&newer.encode(b"")).unwrap_err().to_string();
        assert!(e.contains("version 4 but this build speaks 3"), "{e}");
        assert!(F.decode(&Handle::new(b"CX").unwrap()).is_err());
        assert!(F.decode(&Handle::new(&[]).unwrap()).is_err());
    }

    #[test]
    fn addresses_round_trip_and_garbage_is_refused() {
        for a in ["10.1.2.3:4567", "[fd00::9]:1", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(decode_addr(&encode_addr(a)), Some(a));
        }
        let good = encode_addr("127.0.0.1:80".parse().unwrap());
        // Every truncation and every single-byte corruption is an address or `None`, never a
        // panic; a wrong family or length is `None`.
        for n in 0..good.len() {
            assert_eq!(decode_addr(&good[..n]), None);
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 4, 6, 0xff] {
                let mut c = good.clone();
                c[i] = v;
                let _ = decode_addr(&c);
            }
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(decode_addr(&long), None);
    }
}
