//! TCP transport: one socket per peer, non-blocking, zero-copy to and from user buffers; or,
//! on hosts with several network planes, one socket per plane and peer, striped with failover
//! ([`super::planes`]).
//!
//! Sends write straight from the caller's slice; plain receives read straight into the caller's
//! slice. Receives that reduce go through a small staging buffer per connection that stays in
//! cache, so the reduction reads hot data. A connection starts with a handshake carrying the
//! communicator secret and the connecting rank; a connection without the secret is logged and
//! dropped, and the job goes on.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

use super::LOG_SUBSYS;
use super::handshake::{self, Acceptor, Magic};
use super::planes::{MAX_PLANES, PlaneConn, Striped};

mod plane_setup;
mod redial;
use super::{
    ConnectContext, Endpoint, Handle, HandleFormat, Interest, Listener, Transport,
    TransportProperties, decode_addrs, encode_addrs,
};
use crate::error::{Error, ErrorKind, Result, classify_io};
use crate::net;
use crate::{ccl_info, ccl_trace, ccl_warn};
use plane_setup::{Group, PLANES_MAGIC};

/// Handles: how many planes, then an address per plane.
const FORMAT: HandleFormat = HandleFormat {
    transport: "TCP",
    magic: b"CT",
    version: 3,
};
const MAGIC: Magic = Magic {
    hello: *b"CCLTCP\x01H",
    ack: *b"CCLTCP\x01A",
};
/// Staging for reducing receives: large enough for few syscalls, small enough to stay in L2.
const STAGE_LEN: usize = 256 << 10;
/// Most bytes one send call writes. On loopback the sender's write also does the receiver's TCP
/// processing, so a 1 MiB write leaves a megabyte of socket buffers for the peer to read back
/// from L3; writing in L2-sized pieces lets sends and receives interleave while the data is
/// still in cache (2 MiB allreduce, 2 ranks: about 2 GB/s busbw uncapped, 3.5-4.5 capped).
const MAX_WRITE: usize = 256 << 10;

/// The TCP transport.
#[derive(Debug, Default, Clone)]
pub struct TcpTransport {
    planes: Planes,
    /// What a peer's set of plane connections becomes (default: one [`Striped`] over them).
    build: Option<Builder>,
}

/// Makes one endpoint to `peer` of its plane connections, sorted by plane (the same set on
/// both ends), by `deadline`: another transport (verbs on several ports) sets up its own
/// connection on each plane, over that plane's socket.
pub type PlaneBuilder = dyn Fn(&ConnectContext, usize, Vec<PlaneConn>, Instant) -> Result<Box<dyn Endpoint>>
    + Send
    + Sync;

#[derive(Clone)]
struct Builder(Arc<PlaneBuilder>);

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PlaneBuilder")
    }
}

/// A peer's plane connections as one endpoint: `build`'s, or one [`Striped`] over the sockets.
/// `token` names the connector's endpoint; `accepts`: this end accepted the planes (it listens
/// when a plane's socket is made again, [`redial::TcpRedial`]).
fn plane_endpoint_set(
    build: &Option<Builder>,
    ctx: &ConnectContext,
    peer: usize,
    mut conns: Vec<PlaneConn>,
    (token, accepts): (u64, bool),
    deadline: Instant,
) -> Result<Box<dyn Endpoint>> {
    conns.sort_by_key(|c| c.plane);
    match build {
        Some(Builder(f)) => f(ctx, peer, conns, deadline),
        // One plane connected (the only one both ranks share): the plain socket path, as
        // without planes (nothing to stripe or fail over to).
        None if conns.len() == 1 => {
            let c = conns.pop().expect("one");
            TcpEndpoint::boxed(peer, c.stream, c.remote).map_err(|e| e.rank(ctx.rank))
        }
        None => {
            let cfg = &ctx.config;
            let paths: Vec<String> = conns
                .iter()
                .map(|c| format!("{} -> {}", c.local, c.remote))
                .collect();
            ccl_info!(
                Some(ctx.rank),
                "TCP to peer {peer} over {} planes: {}",
                conns.len(),
                paths.join(", ")
            );
            let redial =
                |c: &PlaneConn| Some(redial::TcpRedial::boxed(ctx, peer, c, token, accepts));
            Ok(Box::new(
                Striped::new(peer, conns, &redial, cfg.plane_timeout, cfg.timeout)
                    .map_err(|e| e.rank(ctx.rank))?,
            ))
        }
    }
}

/// One plane's connection as a plain TCP endpoint (a verbs plane's side channel).
pub fn plane_socket_endpoint(peer: usize, conn: PlaneConn) -> Result<Box<dyn Endpoint>> {
    TcpEndpoint::boxed(peer, conn.stream, conn.remote)
}

/// How the TCP transport makes `conn`'s plane again after it fails (the end that accepted the
/// planes listens; `token` names the connector's endpoint): for endpoints over sockets made
/// elsewhere (tests).
pub fn socket_redial(
    ctx: &ConnectContext,
    peer: usize,
    conn: &PlaneConn,
    token: u64,
    accepts: bool,
) -> Box<dyn super::planes::Redial> {
    redial::TcpRedial::boxed(ctx, peer, conn, token, accepts)
}

/// Where a rank's TCP connections go out.
#[derive(Debug, Default, Clone)]
enum Planes {
    /// The one address chosen at set-up (`ConnectContext::local_ip`).
    #[default]
    One,
    /// Every interface `CCL_SOCKET_IFNAME` matches, when it matches several; without it, the
    /// interfaces found like the rendezvous's ([`net::auto_planes`]).
    FromConfig,
    /// These addresses (tests: several loopback addresses stand for planes).
    Fixed(Arc<[IpAddr]>),
    /// These interfaces' addresses, paired with a peer's by network (verbs ports found
    /// without `CCL_IB_HCA`).
    Networks(Arc<[net::UpAddr]>),
}

impl TcpTransport {
    /// One connection per peer, from the address chosen at set-up.
    pub fn new() -> TcpTransport {
        TcpTransport::default()
    }

    /// A connection per plane and peer where `CCL_SOCKET_IFNAME` matches several up interfaces
    /// (in order of their names, at most [`MAX_PLANES`]), or, without it, where this rank has
    /// several interfaces like the one it reached the rendezvous from ([`net::auto_planes`])
    /// and the peer has addresses on their networks; else one as [`TcpTransport::new`].
    pub fn with_planes() -> TcpTransport {
        TcpTransport {
            planes: Planes::FromConfig,
            build: None,
        }
    }

    /// A connection per address of `ips` and peer (each listens and connects on its own).
    pub fn on_planes(ips: &[IpAddr]) -> TcpTransport {
        TcpTransport {
            planes: Planes::Fixed(ips.iter().copied().take(MAX_PLANES).collect()),
            build: None,
        }
    }

    /// A connection per address of `nets` and peer, paired with the peer's addresses by
    /// network, as planes found without `CCL_SOCKET_IFNAME` pair.
    pub fn on_networks(nets: &[net::UpAddr]) -> TcpTransport {
        TcpTransport {
            planes: Planes::Networks(nets.iter().take(MAX_PLANES).cloned().collect()),
            build: None,
        }
    }

    /// The same, with each peer's plane connections made into an endpoint by `build`.
    pub fn building(self, build: Arc<PlaneBuilder>) -> TcpTransport {
        TcpTransport {
            build: Some(Builder(build)),
            ..self
        }
    }

    /// This rank's plane addresses.
    fn plane_ips(&self, ctx: &ConnectContext) -> Result<Vec<IpAddr>> {
        let found: Vec<IpAddr> = match (&self.planes, &ctx.config.socket_ifname) {
            (Planes::Fixed(ips), _) => return Ok(ips.to_vec()),
            (Planes::Networks(nets), _) => return Ok(nets.iter().map(|a| a.ip).collect()),
            (Planes::One, _) => Vec::new(),
            (Planes::FromConfig, Some(spec)) => net::plane_ips(spec)
                .map_err(|e| e.rank(ctx.rank))?
                .into_iter()
                .map(|p| p.1)
                .collect(),
            (Planes::FromConfig, None) => net::auto_planes(ctx.local_ip, MAX_PLANES)
                .map_err(|e| e.rank(ctx.rank))?
                .into_iter()
                .map(|a| a.ip)
                .collect(),
        };
        Ok(if found.len() < 2 {
            vec![ctx.local_ip]
        } else {
            found.into_iter().take(MAX_PLANES).collect()
        })
    }

    /// Which of a peer's plane addresses to connect to, as the listener numbers them. Planes
    /// named in `CCL_SOCKET_IFNAME` pair in order (the first match with the first); planes
    /// found without it pair by network: each of the peer's addresses that is on the network
    /// of one of this rank's planes (reached over that link, not routed), else the peer's
    /// first address alone.
    fn pairing(&self, ctx: &ConnectContext, addrs: &[SocketAddr]) -> Result<Vec<usize>> {
        let mine = match (&self.planes, &ctx.config.socket_ifname) {
            (Planes::Networks(nets), _) => nets.to_vec(),
            (Planes::FromConfig, None) => {
                net::auto_planes(ctx.local_ip, MAX_PLANES).map_err(|e| e.rank(ctx.rank))?
            }
            _ => {
                let n = self.plane_ips(ctx)?.len().min(addrs.len());
                return Ok((0..n).collect());
            }
        };
        let on_link: Vec<usize> = (0..addrs.len())
            .filter(|&j| mine.iter().any(|m| m.on_link(addrs[j].ip())))
            .collect();
        Ok(if on_link.is_empty() { vec![0] } else { on_link })
    }
}

/// Encodes a listen address as a handle.
pub fn encode_handle(addr: SocketAddr) -> Handle {
    encode_handles(&[addr])
}

/// Encodes one listen address per plane as a handle.
pub fn encode_handles(addrs: &[SocketAddr]) -> Handle {
    FORMAT.encode(&encode_addrs(addrs))
}

/// Decodes a one-plane handle from [`encode_handle`]; anything else is a clear error.
pub fn decode_handle(h: &Handle) -> Result<SocketAddr> {
    let addrs = decode_handles(h)?;
    match addrs[..] {
        [a] => Ok(a),
        _ => Err(FORMAT.malformed(&format!("{} planes where one was expected", addrs.len()))),
    }
}

/// Decodes a handle from [`encode_handles`]: an address per plane, at least one.
pub fn decode_handles(h: &Handle) -> Result<Vec<SocketAddr>> {
    decode_addrs(&FORMAT, FORMAT.decode(h)?, MAX_PLANES)
}

fn tune(s: &TcpStream, ctx: &ConnectContext) -> io::Result<()> {
    s.set_nodelay(true)?;
    let buf = ctx.config.socket_buffer;
    if buf > 0 {
        use nix::sys::socket::{setsockopt, sockopt};
        setsockopt(s, sockopt::SndBuf, &buf).map_err(io::Error::from)?;
        setsockopt(s, sockopt::RcvBuf, &buf).map_err(io::Error::from)?;
    }
    Ok(())
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn properties(&self) -> TransportProperties {
        // Loopback TCP on a small VM: ~4 us one way when polling, ~4 GB/s one stream.
        TransportProperties {
            latency: Duration::from_micros(5),
            bandwidth: 3.0e9,
            spin: Duration::ZERO,
            host_memory: false,
        }
    }

    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>> {
        let ips = self.plane_ips(ctx)?;
        let sys = |what: String, e| Error::io(ErrorKind::System, what, e).rank(ctx.rank);
        let mut listeners = Vec::with_capacity(ips.len());
        let mut addrs = Vec::with_capacity(ips.len());
        for ip in ips {
            let bind = SocketAddr::new(ip, 0);
            let l = TcpListener::bind(bind)
                .map_err(|e| sys(format!("TCP transport: cannot listen on {bind}"), e))?;
            l.set_nonblocking(true)
                .map_err(|e| sys("TCP listener".into(), e))?;
            addrs.push(l.local_addr().map_err(|e| sys("TCP listener".into(), e))?);
            listeners.push(l);
        }
        let magic = if listeners.len() > 1 {
            PLANES_MAGIC
        } else {
            MAGIC
        };
        Ok(Box::new(TcpListenerImpl {
            ctx: ctx.clone(),
            listeners,
            addrs,
            acceptor: Acceptor::new(magic, "TCP transport"),
            groups: Vec::new(),
            build: self.build.clone(),
        }))
    }

    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let addrs = decode_handles(handle).map_err(|e| e.rank(ctx.rank).peer(peer))?;
        if let [addr] = addrs[..] {
            let s = connect_stream(ctx, peer, addr, &MAGIC, deadline)?;
            return TcpEndpoint::boxed(peer, s, addr).map_err(|e| e.rank(ctx.rank));
        }
        self.connect_planes(ctx, peer, &addrs, deadline)
    }
}

/// Connects to `addr` and passes the handshake (`magic`'s hello, the listener's ack).
fn connect_stream(
    ctx: &ConnectContext,
    peer: usize,
    addr: SocketAddr,
    magic: &Magic,
    deadline: Instant,
) -> Result<TcpStream> {
    let what = || format!("TCP connect to peer {peer} at {addr}");
    let mut s = net::connect_to_listening(addr, deadline, &what)
        .map_err(|e| e.rank(ctx.rank).peer(peer))?;
    tune(&s, ctx).map_err(|e| {
        Error::io(ErrorKind::System, what(), e)
            .rank(ctx.rank)
            .peer(peer)
    })?;
    net::write_all_by(&mut s, &handshake::hello(magic, ctx), deadline, &what)
        .map_err(|e| e.rank(ctx.rank).peer(peer))?;
    let mut ack = [0u8; handshake::ACK_LEN];
    net::read_exact_by(&mut s, &mut ack, deadline, &what).map_err(|e| {
        e.context("no handshake reply (the peer refused our secret or rank?)")
            .rank(ctx.rank)
            .peer(peer)
    })?;
    handshake::check_ack(magic, &ack, peer).map_err(|m| {
        Error::remote(format!("{}: {m}", what()))
            .rank(ctx.rank)
            .peer(peer)
    })?;
    Ok(s)
}

struct TcpListenerImpl {
    ctx: ConnectContext,
    /// One per plane.
    listeners: Vec<TcpListener>,
    addrs: Vec<SocketAddr>,
    acceptor: Acceptor<TcpStream>,
    /// Peers' planes that connected, until each peer's set is complete.
    groups: Vec<Group>,
    build: Option<Builder>,
}

impl Listener for TcpListenerImpl {
    fn handle(&self) -> Handle {
        encode_handles(&self.addrs)
    }

    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)> {
        if self.listeners.len() == 1 {
            let listener = &self.listeners[0];
            let (peer, stream, from) = self.acceptor.accept(
                &self.ctx,
                listener.as_fd(),
                || accept_from(listener),
                deadline,
            )?;
            // The caller's deadline bounds the wait for a peer; one that has arrived is set up
            // within the communicator's timeout (see `Listener::accept`).
            let until = Instant::now() + self.ctx.config.timeout;
            let s = self.finish(stream, &from, peer, &MAGIC, until)?;
            let addr = s
                .peer_addr()
                .map_err(|e| Error::io(ErrorKind::System, "TCP accept", e).rank(self.ctx.rank))?;
            return Ok((
                peer,
                TcpEndpoint::boxed(peer, s, addr).map_err(|e| e.rank(self.ctx.rank))?,
            ));
        }
        self.accept_planes(deadline)
    }
}

fn accept_from(listener: &TcpListener) -> io::Result<Option<(TcpStream, String)>> {
    match listener.accept() {
        Ok((s, from)) => {
            s.set_nonblocking(true)?;
            Ok(Some((s, from.to_string())))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

impl TcpListenerImpl {
    /// Answers a connection whose hello passed: blocking, tuned, acknowledged.
    fn finish(
        &self,
        mut s: TcpStream,
        from: &str,
        peer: usize,
        magic: &Magic,
        deadline: Instant,
    ) -> Result<TcpStream> {
        let rank = self.ctx.rank;
        let what = || format!("TCP accept from peer {peer} at {from}");
        s.set_nonblocking(false)
            .map_err(|e| Error::io(ErrorKind::System, what(), e).rank(rank))?;
        tune(&s, &self.ctx).map_err(|e| Error::io(ErrorKind::System, what(), e).rank(rank))?;
        let ack = handshake::ack(magic, rank);
        net::write_all_by(&mut s, &ack, deadline, &what).map_err(|e| e.rank(rank).peer(peer))?;
        ccl_trace!(
            Some(rank),
            "TCP transport: accepted peer {peer} from {from}"
        );
        Ok(s)
    }
}

/// A connected peer.
struct TcpEndpoint {
    peer: usize,
    addr: SocketAddr,
    stream: TcpStream,
    stage: Box<[u8]>,
    head: usize,
    tail: usize,
}

impl TcpEndpoint {
    fn boxed(peer: usize, stream: TcpStream, addr: SocketAddr) -> Result<Box<dyn Endpoint>> {
        stream.set_nonblocking(true).map_err(|e| {
            Error::io(
                ErrorKind::System,
                format!("TCP connection to peer {peer}"),
                e,
            )
            .peer(peer)
        })?;
        Ok(Box::new(TcpEndpoint {
            peer,
            addr,
            stream,
            stage: vec![0u8; STAGE_LEN].into_boxed_slice(),
            head: 0,
            tail: 0,
        }))
    }

    fn io_error(&self, doing: &str, e: io::Error) -> Error {
        Error::io(
            classify_io(&e),
            format!("TCP {doing} peer {} at {}", self.peer, self.addr),
            e,
        )
        .peer(self.peer)
    }

    fn closed(&self) -> Error {
        Error::remote(format!(
            "TCP connection to peer {} at {} was closed by the peer (did it exit or fail?)",
            self.peer, self.addr
        ))
        .peer(self.peer)
    }

    /// Maps a non-blocking read's result: Ok(None) = interrupted (retry), Ok(Some(0)) = would
    /// block, end of stream = the peer closed the connection.
    fn read_result(&self, r: io::Result<usize>) -> Result<Option<usize>> {
        match r {
            Ok(0) => Err(self.closed()),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(0)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(self.io_error("receive from", e)),
        }
    }

    /// Reads up to `len` more bytes into the staging buffer after `tail`.
    fn fill_stage(&mut self, len: usize) -> Result<usize> {
        loop {
            let end = (self.tail + len).min(self.stage.len());
            if end == self.tail {
                // Full: a zero-length read would look like end of stream.
                return Ok(0);
            }
            let r = self.stream.read(&mut self.stage[self.tail..end]);
            if let Some(n) = self.read_result(r)? {
                return Ok(n);
            }
        }
    }
}

impl Endpoint for TcpEndpoint {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        if src.is_empty() {
            return Ok(0);
        }
        let src = &src[..src.len().min(MAX_WRITE)];
        loop {
            return match self.stream.write(src) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(self.io_error("send to", e)),
            };
        }
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        // Bytes staged by an earlier lending receive come first: the stream is ordered.
        if self.head < self.tail {
            let n = (self.tail - self.head).min(dst.len());
            dst[..n].copy_from_slice(&self.stage[self.head..self.head + n]);
            self.head += n;
            if self.head == self.tail {
                self.head = 0;
                self.tail = 0;
            }
            return Ok(n);
        }
        loop {
            let r = self.stream.read(dst);
            if let Some(n) = self.read_result(r)? {
                return Ok(n);
            }
        }
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let avail = self.tail - self.head;
        if avail < max {
            if self.tail == self.stage.len()
                || (self.head > 0 && self.stage.len() - self.tail < max - avail)
            {
                self.stage.copy_within(self.head..self.tail, 0);
                self.head = 0;
                self.tail = avail;
            }
            // Never read past this transfer's end, so the next plain receive can go straight
            // into its destination.
            let n = self.fill_stage(max - avail)?;
            self.tail += n;
        }
        let avail = (self.tail - self.head).min(max);
        if avail == 0 {
            return Ok(0);
        }
        let used = consume(&self.stage[self.head..self.head + avail]);
        debug_assert!(used <= avail);
        self.head += used;
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
        Ok(used)
    }

    fn prepare_wait(&mut self, _interest: Interest) -> Result<bool> {
        Ok(true)
    }

    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        let mut f = PollFlags::empty();
        if interest.recv {
            f |= PollFlags::POLLIN;
        }
        if interest.send {
            f |= PollFlags::POLLOUT;
        }
        if !f.is_empty() {
            out.push((self.stream.as_fd(), f));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::IpAddr;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn handle_round_trip() {
        for a in [
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)), 4567),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 9)), 1),
        ] {
            assert_eq!(decode_handle(&encode_handle(a)).unwrap(), a);
        }
    }

    #[test]
    fn bad_handles_are_refused() {
        assert!(decode_handle(&Handle::new(b"IBxxxxxxxx").unwrap()).is_err());
        let e = decode_handle(&FORMAT.encode(b"\x04\x00")).unwrap_err();
        assert!(e.to_string().contains("not an address"), "{e}");
    }

    fn ctx(rank: usize, secret: [u8; 32]) -> ConnectContext {
        ConnectContext {
            rank,
            size: 2,
            secret,
            local_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            config: crate::config::Config::default(),
        }
    }

    /// Strangers on the data port (garbage, silence, a wrong secret) are dropped and the real
    /// peer still gets through; the connection then carries data both ways.
    #[test]
    fn strangers_are_dropped_and_the_peer_gets_through() {
        let secret = [0x5a; 32];
        let mut l = TcpTransport::new().listen(&ctx(1, secret)).unwrap();
        let addr = decode_handle(&l.handle()).unwrap();
        let mut garbage = TcpStream::connect(addr).unwrap();
        garbage
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\x01\x02garbage")
            .unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let stranger = std::thread::spawn(move || {
            TcpTransport::new().connect(
                &ctx(0, [0x11; 32]),
                1,
                &encode_handle(addr),
                Instant::now() + Duration::from_secs(2),
            )
        });
        let handle = l.handle();
        let peer = std::thread::spawn(move || {
            let mut ep = TcpTransport::new()
                .connect(
                    &ctx(0, secret),
                    1,
                    &handle,
                    Instant::now() + Duration::from_secs(20),
                )
                .unwrap();
            let mut sent = 0;
            while sent < 5 {
                sent += ep.send(&b"hello"[sent..]).unwrap();
            }
            let mut b = [0u8; 3];
            let mut got = 0;
            while got < 3 {
                got += ep.recv(&mut b[got..]).unwrap();
            }
            b
        });
        let (rank, mut ep) = l.accept(Instant::now() + Duration::from_secs(20)).unwrap();
        assert_eq!(rank, 0);
        let mut b = [0u8; 5];
        let mut got = 0;
        while got < 5 {
            got += ep.recv(&mut b[got..]).unwrap();
        }
        assert_eq!(&b, b"hello");
        let mut sent = 0;
        while sent < 3 {
            sent += ep.send(&b"ok!"[sent..]).unwrap();
        }
        assert_eq!(&peer.join().unwrap(), b"ok!");
        // The stranger with the wrong secret was refused: no handshake reply.
        assert!(stranger.join().unwrap().is_err());
    }
}
