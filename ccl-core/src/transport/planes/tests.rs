//! Striped endpoints over relayed planes that the tests cut (both sides closed after a given
//! byte) or pause (bytes held, connections open, as a cut link looks to TCP), checking that
//! every byte is delivered exactly once whatever the stage of the transfer.

use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::*;
use crate::config::Config;
use crate::transport::ConnectContext;
use crate::transport::conformance::{connect_pair, run_all};
use crate::transport::tcp::{self, PlaneBuilder, TcpTransport};

const PATIENCE: Duration = Duration::from_secs(60);

fn loopback_planes() -> TcpTransport {
    TcpTransport::on_planes(&[
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
    ])
}

#[test]
fn two_planes_meet_the_endpoint_contract() {
    run_all(&|| connect_pair(&loopback_planes(), &Config::default()));
}

/// Each plane's connection as another transport's endpoint (here a plain TCP endpoint over the
/// plane's socket, as the verbs transport puts a verbs connection on each port).
fn over_endpoints(peer: usize, conns: Vec<PlaneConn>, down_after: Duration) -> Result<Striped> {
    over_endpoints_redialing(peer, conns, Vec::new(), down_after)
}

/// The same, each plane made again after a failure through `sides[plane]` when given.
fn over_endpoints_redialing(
    peer: usize,
    conns: Vec<PlaneConn>,
    mut sides: Vec<TcpStream>,
    down_after: Duration,
) -> Result<Striped> {
    sides.reverse();
    let eps = conns
        .into_iter()
        .map(|c| {
            let redial = sides.pop().map(|side| {
                Box::new(TestRedial {
                    side,
                    listen: peer == 1,
                    peer,
                    plane: c.plane,
                }) as Box<dyn Redial>
            });
            Ok(PlaneEndpoint {
                name: format!("test plane {} ({} -> {})", c.plane, c.local, c.remote),
                endpoint: tcp::plane_socket_endpoint(peer, c)?,
                redial,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Striped::over_endpoints(peer, eps, down_after, PATIENCE)
}

/// Makes a plane again as a direct loopback connection (not relayed): rank 0's end listens and
/// sends its port over the plane's side socket, rank 1's connects, as a verbs plane exchanges
/// its new queue pairs over its side channel.
struct TestRedial {
    side: TcpStream,
    listen: bool,
    peer: usize,
    plane: usize,
}

impl Redial for TestRedial {
    fn redial(&mut self, call: RedialCall) -> Result<Remade> {
        let io = |e| Error::io(ErrorKind::System, "test redial", e);
        let left = call.deadline.saturating_duration_since(Instant::now());
        self.side.set_read_timeout(Some(left)).map_err(io)?;
        let stream = if self.listen {
            let l = TcpListener::bind("127.0.0.1:0").map_err(io)?;
            let port = l.local_addr().map_err(io)?.port();
            self.side.write_all(&port.to_le_bytes()).map_err(io)?;
            l.accept().map_err(io)?.0
        } else {
            let mut b = [0u8; 2];
            self.side.read_exact(&mut b).map_err(io)?;
            TcpStream::connect(("127.0.0.1", u16::from_le_bytes(b))).map_err(io)?
        };
        let conn = PlaneConn {
            plane: self.plane,
            local: stream.local_addr().map_err(io)?,
            remote: stream.peer_addr().map_err(io)?,
            stream,
        };
        tcp::plane_socket_endpoint(self.peer, conn).map(Remade::Endpoint)
    }
}

/// A connecting context for rank `rank` of a pair (the secret both ends share).
fn pair_ctx(rank: usize) -> ConnectContext {
    ConnectContext {
        rank,
        size: 2,
        secret: [0x5a; 32],
        local_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
        config: Config::default(),
    }
}

#[test]
fn planes_over_endpoints_meet_the_endpoint_contract() {
    let build: Arc<PlaneBuilder> = Arc::new(|ctx, peer, conns, _| {
        Ok(Box::new(over_endpoints(peer, conns, ctx.config.plane_timeout)?) as Box<dyn Endpoint>)
    });
    let t = loopback_planes().building(build);
    run_all(&|| connect_pair(&t, &Config::default()));
}

/// What each plane of a test pair is made of.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Over {
    Sockets,
    Endpoints,
    /// Endpoints, each made again after it fails ([`TestRedial`]).
    Redialing,
    /// Sockets, each made again after it fails as the TCP transport makes them (B accepts).
    SocketsRedialing,
}

/// One direction of a relayed plane.
#[derive(Default)]
struct Gate {
    /// Close both connections once this many bytes went through (`u64::MAX`: never).
    cut_after: AtomicU64,
    /// Hold bytes once this many went through, until cleared (`u64::MAX`: never).
    pause_after: AtomicU64,
    forwarded: AtomicU64,
    cut: AtomicBool,
}

/// A plane through a relay: `gates[0]` for bytes from A to B, `gates[1]` for B to A.
struct Relay {
    gates: [Arc<Gate>; 2],
}

fn gate() -> Arc<Gate> {
    let g = Gate::default();
    g.cut_after.store(u64::MAX, Ordering::Relaxed);
    g.pause_after.store(u64::MAX, Ordering::Relaxed);
    Arc::new(g)
}

fn forward(mut from: TcpStream, mut to: TcpStream, g: Arc<Gate>) {
    from.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let done = g.forwarded.load(Ordering::Relaxed);
        if done >= g.pause_after.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let limit = g
            .cut_after
            .load(Ordering::Relaxed)
            .min(g.pause_after.load(Ordering::Relaxed));
        if done >= g.cut_after.load(Ordering::Relaxed) {
            g.cut.store(true, Ordering::Relaxed);
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
        let want = buf.len().min((limit - done).min(buf.len() as u64) as usize);
        let n = match from.read(&mut buf[..want]) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
        };
        if to.write_all(&buf[..n]).is_err() {
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        g.forwarded.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn conn(plane: usize, s: TcpStream) -> PlaneConn {
    PlaneConn {
        plane,
        local: s.local_addr().unwrap(),
        remote: s.peer_addr().unwrap(),
        stream: s,
    }
}

/// A pair of striped endpoints (A is rank 0, B rank 1) over `n` relayed planes.
fn relayed_pair(n: usize, down_after: Duration) -> (Striped, Striped, Vec<Relay>) {
    relayed_pair_over(Over::Sockets, n, down_after)
}

fn relayed_pair_over(over: Over, n: usize, down_after: Duration) -> (Striped, Striped, Vec<Relay>) {
    let (mut ca, mut cb, mut relays) = (Vec::new(), Vec::new(), Vec::new());
    for plane in 0..n {
        let lb = TcpListener::bind("127.0.0.1:0").unwrap();
        let lp = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(lp.local_addr().unwrap()).unwrap();
        let (pa, _) = lp.accept().unwrap();
        let pb = TcpStream::connect(lb.local_addr().unwrap()).unwrap();
        let (b, _) = lb.accept().unwrap();
        let gates = [gate(), gate()];
        for (from, to, g) in [
            (
                pa.try_clone().unwrap(),
                pb.try_clone().unwrap(),
                gates[0].clone(),
            ),
            (pb, pa, gates[1].clone()),
        ] {
            std::thread::spawn(move || forward(from, to, g));
        }
        relays.push(Relay { gates });
        ca.push(conn(plane, a));
        cb.push(conn(plane, b));
    }
    let (a, b) = match over {
        Over::Sockets => (
            Striped::new(1, ca, &|_| None, down_after, PATIENCE).unwrap(),
            Striped::new(0, cb, &|_| None, down_after, PATIENCE).unwrap(),
        ),
        Over::SocketsRedialing => {
            let token = 0x7e57;
            let (ctx_a, ctx_b) = (pair_ctx(0), pair_ctx(1));
            let ra = |c: &PlaneConn| Some(tcp::socket_redial(&ctx_a, 1, c, token, false));
            let rb = |c: &PlaneConn| Some(tcp::socket_redial(&ctx_b, 0, c, token, true));
            (
                Striped::new(1, ca, &ra, down_after, PATIENCE).unwrap(),
                Striped::new(0, cb, &rb, down_after, PATIENCE).unwrap(),
            )
        }
        Over::Endpoints => (
            over_endpoints(1, ca, down_after).unwrap(),
            over_endpoints(0, cb, down_after).unwrap(),
        ),
        Over::Redialing => {
            let (mut sa, mut sb) = (Vec::new(), Vec::new());
            for _ in 0..n {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                sa.push(TcpStream::connect(l.local_addr().unwrap()).unwrap());
                sb.push(l.accept().unwrap().0);
            }
            (
                over_endpoints_redialing(1, ca, sa, down_after).unwrap(),
                over_endpoints_redialing(0, cb, sb, down_after).unwrap(),
            )
        }
    };
    (a, b, relays)
}

fn pattern(seed: usize, i: usize) -> u8 {
    (i.wrapping_mul(131) ^ (i >> 11) ^ seed) as u8
}

fn describe(ep: &Striped) -> String {
    let g = ep.lock();
    let planes: Vec<String> = g
        .planes
        .iter()
        .map(|p| {
            format!(
                "{:?} wrote {} peer_read {} read {} tx {:?} sent {:?}",
                p.state,
                p.wrote,
                p.peer_read,
                p.read,
                p.tx.as_ref().map(|t| (t.off, t.len, t.done)),
                p.sent
            )
        })
        .collect();
    format!(
        "taken {} acked {} resend {:?} next {} have {:?} ack_sent {} planes [{}]",
        g.taken,
        g.acked,
        g.resend,
        g.next,
        g.have.0,
        g.ack_sent,
        planes.join("; ")
    )
}

/// One way of an exchange: what to send, and what arrived so far.
struct Flow {
    seed: usize,
    len: usize,
    sent: usize,
    got: Vec<u8>,
}

impl Flow {
    fn new(seed: usize, len: usize) -> Flow {
        Flow {
            seed,
            len,
            sent: 0,
            got: Vec::with_capacity(len),
        }
    }

    fn step(&mut self, tx: &mut Striped, rx: &mut Striped, turn: usize) -> Result<bool> {
        let mut moved = false;
        if self.sent < self.len {
            let end = (self.sent + 300_007).min(self.len);
            let chunk: Vec<u8> = (self.sent..end).map(|i| pattern(self.seed, i)).collect();
            let n = tx.send(&chunk)?;
            self.sent += n;
            moved |= n > 0;
        }
        if self.got.len() < self.len {
            let want = self.len - self.got.len();
            let n = if turn % 2 == 0 {
                let mut b = vec![0u8; want.min(200_003)];
                let n = rx.recv(&mut b)?;
                self.got.extend_from_slice(&b[..n]);
                n
            } else {
                // Whole 4-byte elements only, as a reducing receive takes them.
                let got = &mut self.got;
                rx.recv_with(want.min(77_777), &mut |s| {
                    let k = if s.len() + got.len() == self.len {
                        s.len()
                    } else {
                        s.len() / 4 * 4
                    };
                    got.extend_from_slice(&s[..k]);
                    k
                })?
            };
            moved |= n > 0;
        }
        Ok(moved)
    }

    fn done(&self) -> bool {
        self.sent == self.len && self.got.len() == self.len
    }

    fn check(&self, what: &str) {
        assert_eq!(self.got.len(), self.len, "{what}: length");
        if let Some(i) = (0..self.len).find(|&i| self.got[i] != pattern(self.seed, i)) {
            panic!(
                "{what}: byte {i} of {} wrong (duplicated, lost or reordered)",
                self.len
            );
        }
    }
}

/// Sends `ab` bytes from A to B and `ba` from B to A at once, driving both endpoints from one
/// thread; checks every byte. `during` runs between rounds (to cut or pause planes).
fn exchange(a: &mut Striped, b: &mut Striped, ab: usize, ba: usize, mut during: impl FnMut(usize)) {
    let (mut f, mut r) = (Flow::new(1, ab), Flow::new(7, ba));
    let deadline = Instant::now() + PATIENCE;
    let mut turn = 0;
    while !(f.done() && r.done()) {
        during(turn);
        let m1 = f.step(a, b, turn).expect("A to B");
        let m2 = r.step(b, a, turn + 1).expect("B to A");
        if !(m1 || m2) {
            assert!(
                Instant::now() < deadline,
                "no progress: A->B {}/{} sent, {} received; B->A {}/{}, {}; A {}; B {}",
                f.sent,
                ab,
                f.got.len(),
                r.sent,
                ba,
                r.got.len(),
                describe(a),
                describe(b)
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        turn += 1;
    }
    f.check("A to B");
    r.check("B to A");
}

/// Fails plane `plane` at `ep` as an error on its connection would.
fn fail_plane(ep: &Striped, plane: usize) {
    let mut g = ep.lock();
    let e = Error::remote("test: closed").peer(g.peer);
    let _ = g.plane_failed(plane, e);
}

/// Exchanges `bytes` each way until `done`, failing after [`PATIENCE`] with both ends' state.
fn exchange_until(
    a: &mut Striped,
    b: &mut Striped,
    bytes: usize,
    what: &str,
    done: impl Fn(&Striped, &Striped) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    while !done(a, b) {
        assert!(
            Instant::now() < deadline,
            "not seen in time: {what}: A {}, B {}",
            describe(a),
            describe(b)
        );
        exchange(a, b, bytes, bytes, |_| {});
    }
}

/// A plane closed at any byte of its stream, either way (in a header, in a payload, between
/// frames, in an ack): the transfer completes on the other plane, each byte exactly once, and
/// the closed plane is dead on the side that saw it.
#[test]
fn a_plane_closed_at_any_byte_loses_and_repeats_nothing() {
    let frame = (HDR + CHUNK) as u64;
    let points = [
        0,
        1,
        HDR as u64 - 1,
        HDR as u64,
        HDR as u64 + 1,
        frame - 1,
        frame,
        frame + 7,
        3 * frame + CHUNK as u64 / 2,
        5 << 20,
    ];
    // Over endpoints (another transport's connection per plane) the same framing runs: a few
    // of the points suffice to show their failures reach it the same way.
    let cases = (0..2)
        .flat_map(|plane| {
            (0..2).flat_map(move |dir| points.map(|k| (Over::Sockets, plane, dir, k)))
        })
        .chain([0, HDR as u64 + 1, frame + 7, 5 << 20].map(|k| (Over::Endpoints, 0, 0, k)))
        .chain([1, frame].map(|k| (Over::Endpoints, 1, 1, k)));
    for (over, plane, dir, k) in cases {
        {
            {
                let (mut a, mut b, relays) = relayed_pair_over(over, 2, Duration::from_millis(200));
                relays[plane].gates[dir]
                    .cut_after
                    .store(k, Ordering::Relaxed);
                exchange(&mut a, &mut b, 6 << 20, 3 << 20, |_| {});
                let cut = relays[plane].gates[dir].cut.load(Ordering::Relaxed);
                if cut {
                    // Both sides see the close once they use the plane again.
                    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
                    assert!(
                        a.plane_states()[plane] == "dead" || b.plane_states()[plane] == "dead",
                        "{over:?}: plane {plane} cut at byte {k} of direction {dir}: states A \
                         {:?} B {:?}",
                        a.plane_states(),
                        b.plane_states()
                    );
                }
            }
        }
    }
}

/// A plane that holds its bytes (a cut link: TCP reports nothing) is declared down while the
/// other answers; its bytes go again on the other; when it delivers again (the held bytes
/// arrive, as duplicates) it is up again. Nothing lost or repeated.
#[test]
fn a_stalled_plane_is_routed_around_and_taken_back() {
    let cases = [0u64, 100, (HDR + CHUNK) as u64 + 3, 2 << 20]
        .map(|at| (Over::Sockets, at))
        .into_iter()
        .chain([(Over::Endpoints, 100), (Over::Endpoints, 2 << 20)]);
    for (over, at) in cases {
        let (mut a, mut b, relays) = relayed_pair_over(over, 2, Duration::from_millis(150));
        relays[0].gates[0].pause_after.store(at, Ordering::Relaxed);
        exchange(&mut a, &mut b, 8 << 20, 2 << 20, |_| {});
        let (failovers, _) = a.failovers();
        assert!(
            failovers >= 1 || relays[0].gates[0].forwarded.load(Ordering::Relaxed) < at,
            "plane 0 held its bytes from {at} on, yet A never routed around it (states {:?})",
            a.plane_states()
        );
        assert_eq!(a.plane_states()[0], "down", "held at {at}");
        relays[0].gates[0]
            .pause_after
            .store(u64::MAX, Ordering::Relaxed);
        let deadline = Instant::now() + PATIENCE;
        while a.plane_states()[0] != "up" {
            assert!(Instant::now() < deadline, "plane 0 never came back");
            exchange(&mut a, &mut b, 64 << 10, 64 << 10, |_| {});
        }
        // Back in the stripe: both planes carry a large transfer.
        let before = relays[0].gates[0].forwarded.load(Ordering::Relaxed);
        exchange(&mut a, &mut b, 8 << 20, 1 << 20, |_| {});
        let (now0, now1) = (
            relays[0].gates[0].forwarded.load(Ordering::Relaxed),
            relays[1].gates[0].forwarded.load(Ordering::Relaxed),
        );
        assert!(
            now0 > before + (1 << 20),
            "plane 0 carried {} of 8 MiB after it came back (plane 1: {now1} in all); A {}",
            now0 - before,
            describe(&a)
        );
    }
}

/// A connection that can be made to take and give nothing, as a verbs connection does while
/// its peer grants no room (its link is cut): no byte is ever written to it, so none go unread.
struct Freezable {
    inner: Box<dyn Endpoint>,
    frozen: Arc<AtomicBool>,
}

impl Endpoint for Freezable {
    fn peer(&self) -> usize {
        self.inner.peer()
    }
    fn send(&mut self, src: &[u8]) -> Result<usize> {
        if self.frozen.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.inner.send(src)
    }
    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        if self.frozen.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.inner.recv(dst)
    }
    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        if self.frozen.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.inner.recv_with(max, consume)
    }
    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        self.inner.prepare_wait(interest)
    }
    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        self.inner.wait_fds(interest, out)
    }
}

/// A plane whose connection stops taking bytes (nothing written, so nothing goes unread) is
/// declared down all the same while the other delivers, and taken back when it moves again.
#[test]
fn a_plane_that_takes_nothing_is_routed_around() {
    let frozen = Arc::new(AtomicBool::new(false));
    let mut ends: [Vec<PlaneEndpoint>; 2] = [Vec::new(), Vec::new()];
    for plane in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s0 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let s1 = l.accept().unwrap().0;
        for (rank, s) in [(0, s0), (1, s1)] {
            let peer = 1 - rank;
            let conn = PlaneConn {
                plane,
                local: s.local_addr().unwrap(),
                remote: s.peer_addr().unwrap(),
                stream: s,
            };
            let inner = tcp::plane_socket_endpoint(peer, conn).unwrap();
            let endpoint: Box<dyn Endpoint> = if plane == 0 {
                Box::new(Freezable {
                    inner,
                    frozen: frozen.clone(),
                })
            } else {
                inner
            };
            ends[rank].push(PlaneEndpoint {
                name: format!("test plane {plane}"),
                endpoint,
                redial: None,
            });
        }
    }
    let [e0, e1] = ends;
    let down_after = Duration::from_millis(150);
    let mut a = Striped::over_endpoints(1, e0, down_after, PATIENCE).unwrap();
    let mut b = Striped::over_endpoints(0, e1, down_after, PATIENCE).unwrap();
    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
    frozen.store(true, Ordering::Relaxed);
    // The transfer completes; a data frame that got stuck on plane 0 made it down (a stuck ack
    // only keeps the plane from taking frames).
    exchange(&mut a, &mut b, 8 << 20, 8 << 20, |_| {});
    for ep in [&a, &b] {
        let g = ep.lock();
        let p = &g.planes[0];
        let data_stuck = p.tx.as_ref().is_some_and(|t| t.len > 0);
        assert!(
            p.state == State::Down || !data_stuck,
            "a data frame stuck on plane 0, which is {:?}",
            p.state
        );
    }
    frozen.store(false, Ordering::Relaxed);
    let deadline = Instant::now() + PATIENCE;
    while a.plane_states()[0] != "up" || b.plane_states()[0] != "up" {
        assert!(
            Instant::now() < deadline,
            "plane 0 never came back: {}",
            describe(&a)
        );
        exchange(&mut a, &mut b, 64 << 10, 64 << 10, |_| {});
    }
    let wrote = |ep: &Striped| ep.lock().planes[0].wrote;
    let before = wrote(&a);
    exchange(&mut a, &mut b, 16 << 20, 1 << 20, |_| {});
    assert!(wrote(&a) > before + (1 << 20), "{}", describe(&a));
}

/// When every plane holds its bytes at once (from the first byte, or in mid-transfer), no plane
/// is declared down: the peer may simply not be reading. The transfer completes once they
/// deliver again.
#[test]
fn when_every_plane_stalls_none_is_declared_down() {
    for pause_at in [Duration::ZERO, Duration::from_millis(30)] {
        let (mut a, mut b, relays) = relayed_pair(2, Duration::from_millis(300));
        let t0 = Instant::now();
        let (mut paused, mut resumed) = (false, false);
        exchange(&mut a, &mut b, 48 << 20, 1 << 20, |_| {
            let t = t0.elapsed();
            if !paused && t >= pause_at {
                for r in &relays {
                    r.gates[0].pause_after.store(0, Ordering::Relaxed);
                }
                paused = true;
            }
            if !resumed && t >= pause_at + Duration::from_millis(1200) {
                for r in &relays {
                    r.gates[0].pause_after.store(u64::MAX, Ordering::Relaxed);
                }
                resumed = true;
            }
        });
        assert!(resumed, "the transfer ended before the planes were let go");
        assert_eq!(
            a.failovers().0,
            0,
            "paused at {pause_at:?}: {}",
            describe(&a)
        );
        assert_eq!(a.plane_states(), ["up", "up"]);
    }
}

/// A plane that fails is made again where the transport can: the failure is seen at one end
/// (or both), both drop their side and make it again, and it takes its share of new frames;
/// nothing lost or repeated meanwhile. Twice in a row, the second time on the plane made again.
#[test]
fn a_failed_plane_is_made_again() {
    let frame = (HDR + CHUNK) as u64;
    let cases = [(0, 0, 0), (1, 1, frame + 7), (0, 1, 3 * frame)];
    for (over, (plane, dir, at)) in [Over::Redialing, Over::SocketsRedialing]
        .into_iter()
        .flat_map(|o| cases.map(|c| (o, c)))
    {
        let (mut a, mut b, relays) = relayed_pair_over(over, 2, Duration::from_millis(200));
        exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
        let gate = &relays[plane].gates[dir];
        gate.cut_after.store(
            gate.forwarded.load(Ordering::Relaxed) + at,
            Ordering::Relaxed,
        );
        let deadline = Instant::now() + PATIENCE;
        while a.redials() == 0 || b.redials() == 0 {
            assert!(
                Instant::now() < deadline,
                "{over:?}: plane {plane} cut {at} bytes on (direction {dir}) was not made again: \
                 A {}, B {}",
                describe(&a),
                describe(&b)
            );
            exchange(&mut a, &mut b, 4 << 20, 1 << 20, |_| {});
        }
        assert_eq!(a.plane_states(), ["up", "up"], "{}", describe(&a));
        assert_eq!(b.plane_states(), ["up", "up"], "{}", describe(&b));
        // The new connection carries its share, both ways.
        let wrote = |ep: &Striped| ep.lock().planes[plane].wrote;
        let (wa, wb) = (wrote(&a), wrote(&b));
        exchange(&mut a, &mut b, 16 << 20, 16 << 20, |_| {});
        assert!(
            wrote(&a) > wa + (1 << 20) && wrote(&b) > wb + (1 << 20),
            "plane {plane} made again carried little: A {} -> {}, B {} -> {}",
            wa,
            wrote(&a),
            wb,
            wrote(&b)
        );
        // The plane made again fails in turn (its direct connection closed at A): made again.
        assert!(
            !matches!(a.lock().planes[plane].link, Link::Gone),
            "{over:?}: plane {plane} has no connection"
        );
        fail_plane(&a, plane);
        exchange_until(
            &mut a,
            &mut b,
            1 << 20,
            "the plane failed again made again",
            |a, b| a.redials() >= 2 && b.redials() >= 2,
        );
        assert_eq!(a.plane_states(), ["up", "up"], "{}", describe(&a));
    }
}

/// A redial notice lost with the plane that carried it goes again on another: plane 0 fails at
/// A, A's notice goes into plane 1, which is cut before it delivers; B (which saw plane 0 close
/// and sent its own) must still hear A's, or both would wait for each other.
#[test]
fn a_redial_notice_lost_with_its_plane_goes_again() {
    let (mut a, mut b, relays) = relayed_pair_over(Over::Redialing, 3, Duration::from_millis(200));
    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
    // Plane 1 holds what A writes from now on.
    let held = &relays[1].gates[0];
    held.pause_after
        .store(held.forwarded.load(Ordering::Relaxed), Ordering::Relaxed);
    // A read the relay began before the pause ends (its 20 ms timeout), then it holds.
    std::thread::sleep(Duration::from_millis(100));
    held.pause_after
        .store(held.forwarded.load(Ordering::Relaxed), Ordering::Relaxed);
    {
        let mut g = a.lock();
        // The keeper leaves alone an endpoint whose caller may be asleep on it: so it does not
        // send the notice before the test chooses its plane.
        g.touched = Instant::now() + PATIENCE;
        let e = Error::remote("test: failed").peer(1);
        let _ = g.plane_failed(0, e);
    }
    // Once A's redial thread dropped the old connection, the notice is due: put it on plane 1.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut g = a.lock();
        if g.planes[0].redial.due {
            g.turn = 1;
            let _ = g.pump();
            assert!(g.planes[0].redial.sent, "the notice went nowhere");
            break;
        }
        drop(g);
        assert!(Instant::now() < deadline, "A's notice never became due");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Plane 1 is cut with the notice in it.
    held.cut_after
        .store(held.forwarded.load(Ordering::Relaxed), Ordering::Relaxed);
    held.pause_after.store(u64::MAX, Ordering::Relaxed);
    let deadline = Instant::now() + PATIENCE;
    while a.lock().planes[0].generation == 0 || b.lock().planes[0].generation == 0 {
        assert!(
            Instant::now() < deadline,
            "plane 0 was not made again: A {}, B {}",
            describe(&a),
            describe(&b)
        );
        exchange(&mut a, &mut b, 256 << 10, 256 << 10, |_| {});
    }
}

/// A redial that waits for its peer or its link until the plane is no longer wanted, and says
/// when it started and when it gave up.
struct WaitsForever {
    started: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
}

impl Redial for WaitsForever {
    fn redial(&mut self, call: RedialCall) -> Result<Remade> {
        self.started.store(true, Ordering::Release);
        while (call.wanted)() && Instant::now() < call.deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.ended.store(true, Ordering::Release);
        Err(Error::remote("test: called off"))
    }
}

/// A plane being made again when its endpoint is dropped: the attempt is called off at once at
/// both ends (it would otherwise hold its thread, and a verbs plane its queue pairs, for the
/// redial's five minutes).
#[test]
fn a_redial_is_called_off_when_its_endpoint_is_dropped() {
    let flags: Vec<[Arc<AtomicBool>; 2]> = (0..2)
        .map(|_| {
            [
                Arc::new(AtomicBool::new(false)),
                Arc::new(AtomicBool::new(false)),
            ]
        })
        .collect();
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    for plane in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let b = l.accept().unwrap().0;
        ca.push(conn(plane, a));
        cb.push(conn(plane, b));
    }
    let striped = |peer: usize, conns: Vec<PlaneConn>, f: &[Arc<AtomicBool>; 2]| {
        let eps = conns
            .into_iter()
            .map(|c| PlaneEndpoint {
                name: format!("test plane {}", c.plane),
                redial: (c.plane == 0).then(|| {
                    Box::new(WaitsForever {
                        started: f[0].clone(),
                        ended: f[1].clone(),
                    }) as Box<dyn Redial>
                }),
                endpoint: tcp::plane_socket_endpoint(peer, c).unwrap(),
            })
            .collect();
        Striped::over_endpoints(peer, eps, Duration::from_millis(200), PATIENCE).unwrap()
    };
    let mut a = striped(1, ca, &flags[0]);
    let mut b = striped(0, cb, &flags[1]);
    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
    fail_plane(&a, 0);
    exchange_until(
        &mut a,
        &mut b,
        64 << 10,
        "the redial started at both ends",
        |_, _| flags.iter().all(|f| f[0].load(Ordering::Acquire)),
    );
    assert!(!flags.iter().any(|f| f[1].load(Ordering::Acquire)));
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !flags.iter().all(|f| f[1].load(Ordering::Acquire)) {
        assert!(
            Instant::now() < deadline,
            "a redial still waits 20 s after its endpoint was dropped"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// An endpoint dropped with bytes its peer has not read lingers until the peer has read them,
/// even while the peer's caller is away (the keeper reads for it), and not for the timeout:
/// the peer's caller then gets every byte, though the sockets they came on are closed.
#[test]
fn a_dropped_endpoint_lingers_until_an_idle_peer_has_read_its_bytes() {
    let (mut a, mut b, _relays) = relayed_pair(2, Duration::from_millis(200));
    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
    let data: Vec<u8> = (0..4 << 20).map(|i| pattern(3, i)).collect();
    let deadline = Instant::now() + PATIENCE;
    let mut off = 0;
    while off < data.len() {
        let n = a.send(&data[off..]).unwrap();
        if n == 0 {
            assert!(
                Instant::now() < deadline,
                "A's send took nothing: {}",
                describe(&a)
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        off += n;
    }
    let t0 = Instant::now();
    drop(a);
    assert!(
        t0.elapsed() < PATIENCE / 2,
        "the drop waited {:?}, as if nobody read at B",
        t0.elapsed()
    );
    let mut got = vec![0u8; data.len()];
    let mut at = 0;
    while at < got.len() {
        let n = b.recv(&mut got[at..]).unwrap();
        if n == 0 {
            assert!(
                Instant::now() < deadline,
                "B got {at} of {} bytes",
                got.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        at += n;
    }
    assert!(got == data, "B got different bytes");
}

/// With every plane closed the endpoint fails, naming the peer (also where planes are made
/// again: none is left to carry the notices).
#[test]
fn with_every_plane_closed_the_endpoint_fails_naming_the_peer() {
    for over in [Over::Sockets, Over::Endpoints, Over::SocketsRedialing] {
        every_plane_closed(over);
    }
}

fn every_plane_closed(over: Over) {
    let (mut a, mut b, relays) = relayed_pair_over(over, 2, Duration::from_millis(100));
    exchange(&mut a, &mut b, 1 << 20, 1 << 20, |_| {});
    for r in &relays {
        r.gates[0].cut_after.store(0, Ordering::Relaxed);
    }
    let deadline = Instant::now() + PATIENCE;
    let e = loop {
        match a.send(&[7u8; 4096]).and_then(|_| a.recv(&mut [0u8; 16])) {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "no error with every plane closed"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    assert_eq!(e.peer_id(), Some(1), "{over:?}: {e}");
    assert!(e.to_string().contains("every plane"), "{over:?}: {e}");
}

/// Per rank, the plane number and local address of each plane connection its builder got.
type Seen = Arc<Mutex<Vec<Vec<(usize, IpAddr)>>>>;

/// Rank 0 on `t0` connects to rank 1 listening on `t1`; each end's plane connections (the
/// plane numbers and local addresses its builder got) are kept in `seen[rank]`.
fn connect_two(
    t0: &TcpTransport,
    t1: &TcpTransport,
    seen: &Seen,
) -> crate::transport::conformance::Pair {
    let keep = |s: Seen| -> Arc<PlaneBuilder> {
        Arc::new(move |ctx, peer, conns, _| {
            s.lock().unwrap()[ctx.rank] = conns.iter().map(|c| (c.plane, c.local.ip())).collect();
            Ok(
                Box::new(over_endpoints(peer, conns, ctx.config.plane_timeout)?)
                    as Box<dyn Endpoint>,
            )
        })
    };
    let (t0, t1) = (
        t0.clone().building(keep(seen.clone())),
        t1.clone().building(keep(seen.clone())),
    );
    crate::transport::conformance::connect_pair_over(&t0, &t1, &Config::default())
}

/// Planes found without a setting pair by network: each end connects to the peer's addresses
/// on its own planes' networks, whatever the number of planes at each end, and the endpoint
/// meets the contract over what connected.
#[test]
fn planes_paired_by_network_connect_whatever_each_end_has() {
    let lo = |d: u8, prefix: u8| crate::net::UpAddr {
        name: format!("lo{d}"),
        ip: IpAddr::V4(Ipv4Addr::new(127, 0, 0, d)),
        loopback: false,
        prefix,
    };
    let ip = |d: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 0, d));
    let seen = Arc::new(Mutex::new(vec![Vec::new(); 2]));
    let planes =
        |s: &Seen, r: usize| -> Vec<usize> { s.lock().unwrap()[r].iter().map(|p| p.0).collect() };
    // Two planes at each end, on one network: both connect.
    let two = TcpTransport::on_networks(&[lo(1, 8), lo(2, 8)]);
    drop(connect_two(&two, &two, &seen));
    assert_eq!(
        (planes(&seen, 0), planes(&seen, 1)),
        (vec![0, 1], vec![0, 1])
    );
    // One plane (127.0.0.4/31: .4 and .5) against two (.2 and .5): only the listener's plane
    // on its network, the second; the listener accepted it on that address.
    let one = TcpTransport::on_networks(&[lo(4, 31)]);
    let other = TcpTransport::on_networks(&[lo(2, 8), lo(5, 8)]);
    drop(connect_two(&one, &other, &seen));
    assert_eq!(planes(&seen, 0), vec![1]);
    assert_eq!(seen.lock().unwrap()[1], vec![(1, ip(5))]);
    // None of the peer's addresses on its network: the peer's first alone, as without planes.
    let apart = TcpTransport::on_networks(&[lo(9, 32)]);
    drop(connect_two(&apart, &other, &seen));
    assert_eq!(planes(&seen, 0), vec![0]);
    run_all(&|| connect_two(&one, &other, &Arc::new(Mutex::new(vec![Vec::new(); 2]))));
}

#[test]
fn ranges_merge_and_trim() {
    let mut r = Ranges::default();
    r.add(10, 20);
    r.add(30, 40);
    r.add(20, 30);
    assert_eq!(r.0, [(10, 40)]);
    r.add(50, 60);
    r.add(5, 8);
    assert_eq!(r.0, [(5, 8), (10, 40), (50, 60)]);
    r.trim(12);
    assert_eq!(r.0, [(12, 40), (50, 60)]);
    assert_eq!(r.run_at(12), 28);
    assert_eq!(r.run_at(45), 0);
}
