//! A rank's line to the root while the communicator lives.
//!
//! A thread per communicator reads it, so the rank answers the root's state queries whatever
//! its own threads do (wait in a collective, compute, sleep): only a stopped or dead process
//! stays silent, and that silence is what names it. The thread queues failure notices and wakes
//! the rank's waits through an eventfd; this rank's own failure goes out through the same
//! connection.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::Bootstrap;
use super::wire::{self, Frame, FrameKind, Notice};
use crate::error::{Error, ErrorKind, Result};
use crate::{ccl_trace, ccl_warn};

/// Describes this rank for a state query ([`crate::diag::encode`]d).
pub type StateSource = Box<dyn Fn() -> Vec<u8> + Send + Sync>;

impl Bootstrap {
    /// Ends the allgather rounds but keeps the connection: the root then passes every rank's
    /// failure on to the others for as long as the communicator lives, and asks this rank for
    /// its state (see [`Monitor::set_state_source`]).
    pub fn into_monitor(mut self) -> Result<Monitor> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut who = std::process::id().to_le_bytes().to_vec();
        who.extend_from_slice(crate::log::hostname().as_bytes());
        wire::write_frame(
            &mut self.stream,
            &Frame::new(FrameKind::Monitor, who),
            deadline,
        )
        .map_err(|e| e.rank(self.rank))?;
        self.done = true;
        let sys =
            |e: std::io::Error| Error::io(ErrorKind::System, "bootstrap socket", e).rank(self.rank);
        self.stream.set_nonblocking(true).map_err(sys)?;
        let reader = self.stream.try_clone().map_err(sys)?;
        let writer = self.stream.try_clone().map_err(sys)?;
        let efd = || {
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()).rank(self.rank))
        };
        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            rank: self.rank,
            notices: Mutex::new(VecDeque::new()),
            wake: efd()?,
            stop: efd()?,
            root_gone: AtomicBool::new(false),
            acks: AtomicU64::new(0),
            state: OnceLock::new(),
        });
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("ccl-monitor".into())
            .spawn(move || s.read_loop(reader))
            .map_err(|e| {
                Error::io(ErrorKind::System, "spawning the monitor thread", e).rank(self.rank)
            })?;
        Ok(Monitor {
            shared,
            root: self.root,
        })
    }
}

/// What the rank's threads and its monitor thread share.
struct Shared {
    writer: Mutex<TcpStream>,
    rank: usize,
    notices: Mutex<VecDeque<Notice>>,
    /// Readable once a notice arrived or the root's connection closed.
    wake: EventFd,
    /// Readable once the monitor is dropped: ends the thread.
    stop: EventFd,
    root_gone: AtomicBool,
    /// Acknowledgements from the root (it is alive and working on a report of ours).
    acks: AtomicU64,
    state: OnceLock<StateSource>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("rank", &self.rank).finish()
    }
}

impl Shared {
    fn read_loop(&self, stream: TcpStream) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            {
                let mut fds = [
                    PollFd::new(stream.as_fd(), PollFlags::POLLIN),
                    PollFd::new(self.stop.as_fd(), PollFlags::POLLIN),
                ];
                let _ = nix::poll::poll(&mut fds, PollTimeout::from(1000u16));
                if fds[1].any().unwrap_or(false) {
                    return;
                }
            }
            let closed = loop {
                match (&stream).read(&mut chunk) {
                    Ok(0) => break true,
                    Ok(k) => buf.extend_from_slice(&chunk[..k]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
            let frames = wire::take_frames(&mut buf).unwrap_or_default();
            for f in frames {
                self.handle(f);
            }
            if closed {
                // The root's process ended (it may simply have finished): no news, but waits
                // look again.
                self.root_gone.store(true, Ordering::Release);
                let _ = self.wake.write(1);
                return;
            }
        }
    }

    fn handle(&self, f: Frame) {
        match f.kind {
            FrameKind::Notice => {
                if let Ok(n) = Notice::decode(&f.payload) {
                    self.notices
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back(n);
                    let _ = self.wake.write(1);
                }
            }
            FrameKind::StateQuery => {
                let mut reply = f.payload.get(..4).unwrap_or(&[0; 4]).to_vec();
                // Nothing to say while the communicator is being dropped: no answer.
                let body = self.state.get().map(|src| src()).unwrap_or_default();
                if !body.is_empty() {
                    reply.extend(body);
                    self.send(&Frame::new(FrameKind::StateReply, reply));
                }
            }
            FrameKind::Verdict => {
                ccl_warn!(Some(self.rank), "{}", String::from_utf8_lossy(&f.payload));
            }
            FrameKind::Ack => {
                self.acks.fetch_add(1, Ordering::AcqRel);
            }
            k => ccl_trace!(Some(self.rank), "monitor: ignored {k:?} from the root"),
        }
    }

    fn send(&self, f: &Frame) {
        use std::io::Write;
        let s = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        // Small frames fit the socket buffer; a root that does not read gets a short grace.
        let bytes = f.encode();
        let until = Instant::now() + Duration::from_millis(500);
        let mut off = 0;
        while off < bytes.len() && Instant::now() < until {
            match (&*s).write(&bytes[off..]) {
                Ok(k) => off += k,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

/// A rank's line to the root while the communicator lives: failures of other ranks arrive here
/// as [`Notice`]s (with the root's verdict), and this rank's own failure goes out through it.
#[derive(Debug)]
pub struct Monitor {
    shared: Arc<Shared>,
    root: SocketAddr,
}

impl Monitor {
    /// Readable when a notice (or the root's end) arrives.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }

    /// Sets what this rank answers the root's state queries with (once; later calls are
    /// ignored). Until it is set the rank does not answer.
    pub fn set_state_source(&self, f: StateSource) {
        let _ = self.shared.state.set(f);
    }

    /// The first notice that has arrived, without waiting. The first failure is the one that
    /// counts: it stays, so every later look sees it too.
    pub fn poll(&self) -> Option<Notice> {
        self.shared
            .notices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .front()
            .cloned()
    }

    /// Waits up to `max` for a notice.
    pub fn wait(&self, max: Duration) -> Option<Notice> {
        let until = Instant::now() + max;
        loop {
            if let Some(n) = self.poll() {
                return Some(n);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.root_gone() {
                return None;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }

    /// Acknowledgements from the root so far (it answers a failure report or verdict request
    /// at once, before it gathers the verdict): whether the root is alive.
    pub fn acks(&self) -> u64 {
        self.shared.acks.load(Ordering::Acquire)
    }

    /// Tells the root (and through it every rank) that this rank failed, and why.
    pub fn report(&self, message: &str) {
        let n = Notice {
            rank: self.shared.rank,
            died: false,
            message: message.to_string(),
            verdict: String::new(),
            culprit: None,
        };
        self.shared.send(&n.encode(FrameKind::Failure));
    }

    /// Asks the root for the current verdict; the answer is logged at warn level after
    /// `preamble` when it comes (by the monitor thread).
    pub fn request_verdict(&self, preamble: &str) {
        self.shared.send(&Frame::new(
            FrameKind::VerdictRequest,
            preamble.as_bytes().to_vec(),
        ));
    }

    /// The root's address (for messages).
    pub fn root(&self) -> SocketAddr {
        self.root
    }

    /// Whether the root's connection has closed (its process ended).
    pub fn root_gone(&self) -> bool {
        self.shared.root_gone.load(Ordering::Acquire)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // A goodbye tells the root this rank's closing is no failure.
        self.shared.send(&Frame::new(FrameKind::Bye, Vec::new()));
        let _ = self.shared.stop.write(1);
    }
}
