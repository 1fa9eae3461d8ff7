//! In-process transport: ranks are threads of one process, connected by bounded byte rings.
//!
//! Meant for tests: it exercises the same executor paths as a network (partial transfers, back
//! pressure from a full ring, blocking waits on descriptors) without sockets. Each direction is a
//! ring of [`RING_BYTES`] guarded by a mutex, with an eventfd that wakes the other side, so
//! waiting works with `poll(2)` like every other transport.
//!
//! Listeners live in a process-wide registry; a handle names the process and the listener, and a
//! handle from another process is refused.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::LOG_SUBSYS;
use super::handshake::secrets_equal;
use super::{
    ConnectContext, Endpoint, Handle, HandleFormat, Interest, Listener, Transport,
    TransportProperties,
};
use crate::ccl_warn;
use crate::error::{Error, ErrorKind, Result};
use crate::net;

/// Capacity of each direction of a connection. Small enough that large transfers exercise back
/// pressure in tests.
pub const RING_BYTES: usize = 256 << 10;
/// Handles: the listener's process and its number there.
const FORMAT: HandleFormat = HandleFormat {
    transport: "in-process",
    magic: b"CL",
    version: 2,
};

/// The in-process transport.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalTransport;

impl LocalTransport {
    pub fn new() -> LocalTransport {
        LocalTransport
    }
}

fn new_eventfd() -> Result<EventFd> {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()))
}

fn signal(fd: &EventFd) {
    // A full counter (impossible in practice) or EAGAIN still leaves the fd readable.
    let _ = fd.write(1);
}

fn drain(fd: &EventFd) {
    let _ = fd.read();
}

/// A fixed-capacity byte ring.
struct Ring {
    buf: Box<[u8]>,
    head: usize,
    len: usize,
    closed: bool,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            buf: vec![0; cap].into_boxed_slice(),
            head: 0,
            len: 0,
            closed: false,
        }
    }

    fn push(&mut self, src: &[u8]) -> usize {
        let cap = self.buf.len();
        let n = src.len().min(cap - self.len);
        let tail = (self.head + self.len) % cap;
        let first = n.min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&src[..first]);
        self.buf[..n - first].copy_from_slice(&src[first..n]);
        self.len += n;
        n
    }

    /// The contiguous readable bytes at the head.
    fn front(&self) -> &[u8] {
        let end = (self.head + self.len).min(self.buf.len());
        &self.buf[self.head..end]
    }

    fn pop(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        self.head = (self.head + n) % self.buf.len();
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
    }
}

/// One direction of a connection.
struct Pipe {
    ring: Mutex<Ring>,
    /// Signalled when bytes arrive (or the pipe closes).
    readable: EventFd,
    /// Signalled when space frees up (or the pipe closes).
    writable: EventFd,
}

impl Pipe {
    fn new() -> Result<Arc<Pipe>> {
        Ok(Arc::new(Pipe {
            ring: Mutex::new(Ring::new(RING_BYTES)),
            readable: new_eventfd()?,
            writable: new_eventfd()?,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Ring> {
        // A panic while holding the lock leaves a consistent ring (all updates are single
        // assignments after the copy), so poisoning is not a reason to fail.
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn close(&self) {
        self.lock().closed = true;
        signal(&self.readable);
        signal(&self.writable);
    }
}

/// A connection waiting for `accept`.
struct Incoming {
    rank: usize,
    size: usize,
    secret: [u8; 32],
    /// Connector -> acceptor.
    up: Arc<Pipe>,
    /// Acceptor -> connector.
    down: Arc<Pipe>,
}

struct Slot {
    queue: Mutex<VecDeque<Incoming>>,
    wake: EventFd,
}

fn registry() -> &'static Mutex<HashMap<u64, Arc<Slot>>> {
    static R: OnceLock<Mutex<HashMap<u64, Arc<Slot>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock_registry() -> MutexGuard<'static, HashMap<u64, Arc<Slot>>> {
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn encode_handle(id: u64) -> Handle {
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&std::process::id().to_le_bytes());
    b.extend_from_slice(&id.to_le_bytes());
    FORMAT.encode(&b)
}

fn decode_handle(h: &Handle) -> Result<u64> {
    let b = FORMAT.decode(h)?;
    let (Some((pid, id)), 12) = (b.split_first_chunk::<4>(), b.len()) else {
        return Err(FORMAT.malformed("wrong length"));
    };
    let pid = u32::from_le_bytes(*pid);
    if pid != std::process::id() {
        return Err(Error::invalid_argument(format!(
            "the in-process transport connects threads of one process, but this handle comes from pid {pid} (use CCL_TRANSPORT=tcp across processes)"
        )));
    }
    Ok(u64::from_le_bytes(id.try_into().expect("12 - 4 bytes")))
}

impl Transport for LocalTransport {
    fn name(&self) -> &'static str {
        "local"
    }

    fn scope(&self) -> super::Scope {
        super::Scope::Process
    }

    fn properties(&self) -> TransportProperties {
        TransportProperties {
            latency: Duration::from_micros(1),
            bandwidth: 5.0e9,
            spin: Duration::ZERO,
            host_memory: false,
        }
    }

    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            queue: Mutex::new(VecDeque::new()),
            wake: new_eventfd()?,
        });
        lock_registry().insert(id, slot.clone());
        Ok(Box::new(LocalListener {
            ctx: ctx.clone(),
            id,
            slot,
        }))
    }

    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        _deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let id = decode_handle(handle).map_err(|e| e.rank(ctx.rank).peer(peer))?;
        let slot = lock_registry().get(&id).cloned().ok_or_else(|| {
            Error::remote(format!("in-process listener of peer {peer} is gone"))
                .rank(ctx.rank)
                .peer(peer)
        })?;
        let (up, down) = (Pipe::new()?, Pipe::new()?);
        slot.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Incoming {
                rank: ctx.rank,
                size: ctx.size,
                secret: ctx.secret,
                up: up.clone(),
                down: down.clone(),
            });
        signal(&slot.wake);
        Ok(Box::new(LocalEndpoint {
            peer,
            tx: up,
            rx: down,
        }))
    }
}

struct LocalListener {
    ctx: ConnectContext,
    id: u64,
    slot: Arc<Slot>,
}

impl Drop for LocalListener {
    fn drop(&mut self) {
        lock_registry().remove(&self.id);
    }
}

impl Listener for LocalListener {
    fn handle(&self) -> Handle {
        encode_handle(self.id)
    }

    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)> {
        let me = self.ctx.rank;
        loop {
            drain(&self.slot.wake);
            let next = self
                .slot
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pop_front();
            if let Some(inc) = next {
                let ok = secrets_equal(&inc.secret, &self.ctx.secret)
                    && inc.size == self.ctx.size
                    && inc.rank < self.ctx.size
                    && inc.rank != me;
                if !ok {
                    ccl_warn!(
                        Some(me),
                        "in-process transport: refused a connection claiming rank {} (wrong secret or world size)",
                        inc.rank
                    );
                    inc.up.close();
                    inc.down.close();
                    continue;
                }
                return Ok((
                    inc.rank,
                    Box::new(LocalEndpoint {
                        peer: inc.rank,
                        tx: inc.down,
                        rx: inc.up,
                    }),
                ));
            }
            let left = net::remaining(deadline, || {
                "in-process transport: waiting for peers to connect".to_string()
            })
            .map_err(|e| e.rank(me))?;
            let mut fds = [PollFd::new(self.slot.wake.as_fd(), PollFlags::POLLIN)];
            let ms = PollTimeout::try_from(left.as_millis().clamp(1, 500) as u64)
                .unwrap_or(PollTimeout::MAX);
            let _ = nix::poll::poll(&mut fds, ms);
        }
    }
}

struct LocalEndpoint {
    peer: usize,
    tx: Arc<Pipe>,
    rx: Arc<Pipe>,
}

impl LocalEndpoint {
    fn closed(&self) -> Error {
        Error::remote(format!(
            "in-process connection to peer {} was closed by the peer",
            self.peer
        ))
        .peer(self.peer)
    }
}

impl Drop for LocalEndpoint {
    fn drop(&mut self) {
        self.tx.close();
        self.rx.close();
    }
}

impl Endpoint for LocalEndpoint {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        let n = {
            let mut r = self.tx.lock();
            if r.closed {
                return Err(self.closed());
            }
            r.push(src)
        };
        if n > 0 {
            signal(&self.tx.readable);
        }
        Ok(n)
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        let mut off = 0;
        {
            let mut r = self.rx.lock();
            // Two rounds cover a ring that wraps.
            for _ in 0..2 {
                let f = r.front();
                let n = f.len().min(dst.len() - off);
                if n == 0 {
                    break;
                }
                dst[off..off + n].copy_from_slice(&f[..n]);
                r.pop(n);
                off += n;
            }
            if off == 0 && r.closed && !dst.is_empty() {
                return Err(self.closed());
            }
        }
        if off > 0 {
            signal(&self.rx.writable);
        }
        Ok(off)
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        let used = {
            let mut r = self.rx.lock();
            let f = r.front();
            let n = f.len().min(max);
            if n == 0 {
                if r.closed && max > 0 {
                    return Err(self.closed());
                }
                return Ok(0);
            }
            let used = consume(&f[..n]);
            r.pop(used);
            // The consumer stopped at a partial element that continues after the wrap point:
            // make the ring contiguous so it sees the whole element next time.
            if used < n {
                straighten(&mut r);
            }
            used
        };
        if used > 0 {
            signal(&self.rx.writable);
        }
        Ok(used)
    }

    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        // Drain first, then re-check: a signal that lands after the check stays in the eventfd
        // and wakes the poll.
        if interest.recv {
            drain(&self.rx.readable);
            let r = self.rx.lock();
            if r.len > 0 || r.closed {
                return Ok(false);
            }
        }
        if interest.send {
            drain(&self.tx.writable);
            let r = self.tx.lock();
            if r.len < r.buf.len() || r.closed {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        if interest.recv {
            out.push((self.rx.readable.as_fd(), PollFlags::POLLIN));
        }
        if interest.send {
            out.push((self.tx.writable.as_fd(), PollFlags::POLLIN));
        }
    }
}

/// Rotates the ring so its contents start at index 0, making them contiguous. Only needed when a
/// consumer stops at a partial element at the wrap point, which is rare.
fn straighten(r: &mut Ring) {
    if r.head + r.len <= r.buf.len() {
        return;
    }
    let head = r.head;
    r.buf.rotate_left(head);
    r.head = 0;
}
