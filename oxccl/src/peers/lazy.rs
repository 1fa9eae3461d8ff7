//! Connections on demand (`CCL_CONNECT=lazy`): a pair connects the first time an operation on
//! either of its ranks needs it, not at set-up.
//!
//! Only the lower rank of a pair opens its connection, so a pair never races itself into two.
//! When the lower rank needs the pair, it connects; when the higher one does, it asks the lower
//! one through the job monitor ([`Monitor::ask_connect`]), whose hook connects on the lower
//! rank's behalf whatever its own program is doing (a rank blocked in another operation, or
//! computing, still answers). Connecting runs on a thread per connection, accepting on a thread
//! per transport that owns the listener from set-up on, so neither waits on an executor; each
//! result goes to an inbox that the executor empties into the communicator's [`Links`] before
//! an operation runs ([`Lazy::ensure`]), waiting on an eventfd that the threads write.
//!
//! Pairs whose transport sets up host memory (shared memory) still connect at set-up: the host's
//! segment reaches every rank through them.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use super::{Links, Peers};
use crate::LOG_SUBSYS;
use ccl_bootstrap::Monitor;
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::transport::{ConnectContext, Endpoint, Handle, Listener, Transport};
use ccl_core::{ccl_trace, ccl_warn};

/// A pair nobody has asked for yet.
const IDLE: u8 = 0;
/// Connecting (lower rank), or asked the lower rank to (higher rank).
const PENDING: u8 = 1;
/// Its endpoint is in the inbox or in the links.
const READY: u8 = 2;

/// How long one accept call waits before the thread looks whether the communicator is gone: an
/// accept thread outlives its communicator by at most this. Not shorter: every rank has one,
/// and with hundreds of ranks on a few CPUs the wake-ups of short slices add up to seconds.
const ACCEPT_SLICE: Duration = Duration::from_secs(1);

/// How long a rank waiting for its connections sleeps before it looks again at what it is not
/// woken for.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// What the connecting and accepting threads hand to the executor.
#[derive(Default)]
struct Inbox {
    ready: Vec<(usize, Box<dyn Endpoint>)>,
    failed: Vec<(usize, Error)>,
}

struct Shared {
    ctx: ConnectContext,
    transports: Vec<Arc<dyn Transport>>,
    /// Per peer, the index of its transport, `None` for this rank and for pairs connected at
    /// set-up.
    lazy: Vec<Option<usize>>,
    /// The handles of higher peers, for their chosen transport.
    handles: Vec<Option<Handle>>,
    state: Vec<AtomicU8>,
    inbox: Mutex<Inbox>,
    /// Readable while the inbox holds something.
    wake: EventFd,
    /// Set when the communicator's links go: the threads end.
    stop: AtomicBool,
}

impl Shared {
    fn deliver(&self, peer: usize, r: Result<Box<dyn Endpoint>>) {
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        match r {
            Ok(ep) => {
                self.state[peer].store(READY, Ordering::Release);
                inbox.ready.push((peer, ep));
            }
            Err(e) => inbox.failed.push((peer, e)),
        }
        drop(inbox);
        let _ = self.wake.write(1);
    }

    /// Starts connecting to the higher peer `peer`, unless that has started already.
    fn connect(self: &Arc<Self>, peer: usize) {
        if self.stop.load(Ordering::Acquire)
            || peer <= self.ctx.rank
            || self.lazy.get(peer).copied().flatten().is_none()
            || self.state[peer]
                .compare_exchange(IDLE, PENDING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ccl-connect".into())
            .spawn(move || {
                let t = &me.transports[me.lazy[peer].expect("checked above")];
                let handle = me.handles[peer]
                    .as_ref()
                    .expect("higher peers have handles");
                let deadline = Instant::now() + me.ctx.config.timeout;
                ccl_trace!(
                    Some(me.ctx.rank),
                    "connecting to peer {peer} over {}",
                    t.name()
                );
                let r = t.connect(&me.ctx, peer, handle, deadline).map_err(|e| {
                    e.rank(me.ctx.rank)
                        .peer(peer)
                        .context(format!("connecting to peer {peer} over {}", t.name()))
                });
                me.deliver(peer, r);
            });
        if let Err(e) = spawned {
            self.deliver(
                peer,
                Err(
                    Error::io(ErrorKind::System, "spawning a connecting thread", e)
                        .rank(self.ctx.rank)
                        .peer(peer),
                ),
            );
        }
    }

    /// Accepts the lower peers that chose transport `t` until each has connected or the
    /// communicator is gone.
    fn accept_loop(&self, t: usize, mut l: Box<dyn Listener>) {
        let rank = self.ctx.rank;
        let name = self.transports[t].name();
        let mut waiting: Vec<usize> = (0..rank).filter(|&p| self.lazy[p] == Some(t)).collect();
        while !waiting.is_empty() && !self.stop.load(Ordering::Acquire) {
            match l.accept(Instant::now() + ACCEPT_SLICE) {
                Ok((peer, ep)) => {
                    if let Some(i) = waiting.iter().position(|&p| p == peer) {
                        waiting.swap_remove(i);
                        self.deliver(peer, Ok(ep));
                    } else {
                        ccl_warn!(
                            Some(rank),
                            "dropped an unexpected {name} connection claiming rank {peer}"
                        );
                    }
                }
                Err(e) if e.kind() == ErrorKind::Timeout => {}
                Err(e) => {
                    // A connection that failed its handshake; the listener goes on.
                    ccl_warn!(Some(rank), "accepting over {name}: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// A communicator's connections still to be made.
pub(crate) struct Lazy {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Lazy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lazy").finish_non_exhaustive()
    }
}

impl Drop for Lazy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
    }
}

impl Lazy {
    /// Takes over `listeners[t]` for every transport that some lazy lower peer chose, on a
    /// thread each. `lazy[p]`: the transport of each pair to connect on demand; `handles[p]`:
    /// the handle of each higher peer.
    pub(crate) fn start(
        ctx: ConnectContext,
        transports: Vec<Arc<dyn Transport>>,
        listeners: Vec<Option<Box<dyn Listener>>>,
        lazy: Vec<Option<usize>>,
        handles: Vec<Option<Handle>>,
    ) -> Result<Lazy> {
        let rank = ctx.rank;
        let shared = Arc::new(Shared {
            state: (0..lazy.len()).map(|_| AtomicU8::new(IDLE)).collect(),
            ctx,
            transports,
            lazy,
            handles,
            inbox: Mutex::new(Inbox::default()),
            wake: EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()).rank(rank))?,
            stop: AtomicBool::new(false),
        });
        for (t, l) in listeners.into_iter().enumerate() {
            let Some(l) = l else { continue };
            if !(0..rank).any(|p| shared.lazy[p] == Some(t)) {
                continue;
            }
            let me = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("ccl-accept-{}", shared.transports[t].name()))
                .spawn(move || me.accept_loop(t, l))
                .map_err(|e| Error::io(ErrorKind::System, "spawning an accepting thread", e))?;
        }
        Ok(Lazy { shared })
    }

    /// What the monitor calls when a higher rank asks this one to connect.
    pub(crate) fn hook(&self) -> Box<dyn Fn(usize) + Send + Sync> {
        let weak = Arc::downgrade(&self.shared);
        Box::new(move |from| {
            if let Some(s) = weak.upgrade() {
                s.connect(from);
            }
        })
    }

    /// Readable while connections wait in the inbox.
    pub(crate) fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }

    /// Whether `peer`'s pair is made on demand.
    fn is_lazy(&self, peer: usize) -> bool {
        self.shared.lazy.get(peer).copied().flatten().is_some()
    }

    /// Moves what the threads made into `endpoints`, and returns the failure of a `wanted`
    /// peer, if one failed.
    fn collect(
        &self,
        endpoints: &mut [Option<Box<dyn Endpoint>>],
        wanted: &[usize],
    ) -> Option<Error> {
        let mut inbox = self.shared.inbox.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.shared.wake.read();
        for (peer, ep) in inbox.ready.drain(..) {
            endpoints[peer] = Some(ep);
        }
        let i = inbox.failed.iter().position(|(p, _)| wanted.contains(p))?;
        Some(inbox.failed.remove(i).1)
    }
}

impl Peers {
    /// Moves the connections made on demand since the last look into `links`, without
    /// waiting: for a wait that is not for given peers (a receive from any source), where a
    /// sender's first connection is how it shows up.
    pub(crate) fn adopt_connections(&self, links: &mut Links) {
        if let Some(lazy) = links.lazy.as_ref() {
            // A failed connection is reported to the operation that wanted it, not here.
            let _ = lazy.collect(&mut links.endpoints, &[]);
        }
    }

    /// Makes sure this rank holds a connection to each of `peers` before an operation over
    /// them runs: connects the higher ones, asks the lower ones to connect, and waits (on the
    /// threads' eventfd, the abort signal and the monitor) until every one is in, the
    /// communicator fails or is aborted, or `CCL_TIMEOUT` passes, which fails naming the peers.
    pub(crate) fn ensure_connected(
        &self,
        links: &mut Links,
        peers: impl Iterator<Item = usize> + Clone,
    ) -> Result<()> {
        let Some(lazy) = links.lazy.as_ref() else {
            return Ok(());
        };
        let missing =
            |p: usize| p < links.endpoints.len() && links.endpoints[p].is_none() && lazy.is_lazy(p);
        // Every operation passes here: once its peers are connected, without allocating.
        if !peers.clone().any(missing) {
            return Ok(());
        }
        let mut wanted: Vec<usize> = peers.filter(|&p| missing(p)).collect();
        wanted.sort_unstable();
        wanted.dedup();
        for &p in &wanted {
            if p > self.rank {
                lazy.shared.connect(p);
            } else if lazy.shared.state[p]
                .compare_exchange(IDLE, PENDING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                match &self.monitor {
                    Some(m) => m.ask_connect(p),
                    None => {
                        return Err(Error::internal("no job monitor to ask a peer to connect")
                            .rank(self.rank)
                            .peer(p));
                    }
                }
            }
        }
        let deadline = Instant::now() + self.config.timeout;
        let mut waits_on = None;
        loop {
            let lazy = links.lazy.as_ref().expect("checked above");
            if let Some(e) = lazy.collect(&mut links.endpoints, &wanted) {
                return Err(e);
            }
            wanted.retain(|&p| links.endpoints[p].is_none());
            if wanted.is_empty() {
                return Ok(());
            }
            // The operation waits for this peer before any of its data moves: the monitor's
            // verdict follows that wait (a stopped peer never answers a connection).
            if waits_on != Some(wanted[0]) {
                waits_on = Some(wanted[0]);
                if let Some(e) = self.recorder().current() {
                    e.waiting_on = waits_on;
                }
            }
            self.check_aborted()?;
            self.check_notices()?;
            let now = Instant::now();
            if now >= deadline {
                let list: Vec<String> = wanted.iter().map(|p| p.to_string()).collect();
                return Err(Error::timeout(format!(
                    "no connection with peer(s) {} after {:?} (a lower rank connects when asked \
                     through the job monitor; a higher one when this rank needs it)",
                    list.join(", "),
                    self.config.timeout
                ))
                .rank(self.rank)
                .peer(wanted[0]));
            }
            wait_readable(
                &[
                    lazy.wake_fd(),
                    self.abort.fd(),
                    match &self.monitor {
                        Some(m) => m.fd(),
                        None => self.abort.fd(),
                    },
                ],
                (deadline - now).min(WAIT_SLICE),
            )?;
        }
    }

    /// Hooks this rank into the monitor so that higher ranks can ask it to connect.
    pub(super) fn serve_connect_requests(monitor: &Monitor, lazy: &Lazy) {
        monitor.set_connect_hook(lazy.hook());
    }
}

fn wait_readable(fds: &[std::os::fd::BorrowedFd<'_>], max: Duration) -> Result<()> {
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    let ms = max.as_millis().clamp(1, u16::MAX as u128) as u16;
    match nix::poll::poll(&mut pfds, PollTimeout::from(ms)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(Error::io(ErrorKind::System, "poll", e.into())),
    }
}
