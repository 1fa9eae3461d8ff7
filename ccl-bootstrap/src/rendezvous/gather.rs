//! The allgather among the ranks themselves (Bruck's algorithm), so that no process moves more
//! than its own share of the records.
//!
//! In step `k` (`k < ceil(log2 N)`) rank `r` asks rank `r + 2^k` (mod N) for the first
//! `min(2^k, N - 2^k)` records it holds (its own, then `r + 2^k + 1`, ...) and appends them to
//! its own; after the last step it holds all N. Every rank sends and receives about N records in
//! all, over `ceil(log2 N)` connections of its own.
//!
//! The root tells each rank only where its successor `r + 1` listens. The rest travels with the
//! blocks (pointer jumping): rank `r + 2^k` answers step `k` with the address of its own partner
//! of step `k`, `r + 2^(k+1)`, which is `r`'s partner of step `k + 1`. So the root sends O(N)
//! bytes in all, and the records never pass through it.
//!
//! A rank answers on a server thread that owns its listener: a request for step `k` waits there
//! until this rank holds `2^k` records, which only its own earlier steps need, so the steps of
//! all ranks form no cycle. Answers are written without blocking, so a slow asker holds up
//! nobody else.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::LOG_SUBSYS;
use crate::timing::{ASK_GRACE, ERROR_WORD, PEER_ERROR, ROOT_WORD};
use crate::wire::{self, Block, Frame, FrameKind, GatherAsk};
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::{ccl_trace, ccl_warn};

/// Steps of an allgather among `n` ranks: `ceil(log2 n)`.
pub(crate) fn steps(n: usize) -> u32 {
    if n <= 1 {
        0
    } else {
        usize::BITS - (n - 1).leading_zeros()
    }
}

/// Records sent in step `k` among `n` ranks.
fn count(n: usize, k: u32) -> usize {
    (1usize << k).min(n - (1usize << k))
}

/// What a rank's allgather steps and its server share.
struct Shared {
    rank: usize,
    size: usize,
    secret: [u8; 32],
    timeout: Duration,
    state: Mutex<State>,
    /// Written by the rank after each step it completes, and to stop the server.
    progress: EventFd,
    /// Written by the server after each answer it finished sending.
    served: EventFd,
    stop: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Per allgather round: the records this rank holds so far, its own first, then those of
    /// `rank + 1`, `rank + 2`, ...
    rounds: Vec<Vec<Vec<u8>>>,
    /// `next[k]`: where rank `rank + 2^k` listens (from the root for `k = 0`, then from the
    /// answer of step `k - 1`). The same for every round.
    next: Vec<SocketAddr>,
    /// Per round, the steps whose answer went out.
    answered: Vec<Vec<bool>>,
}

/// This rank's part in the allgathers of one bootstrap.
pub(crate) struct Gather {
    shared: Arc<Shared>,
    #[cfg(test)]
    listen: SocketAddr,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Gather {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gather")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .finish()
    }
}

impl Gather {
    /// Starts answering on `listener`; `successor` is where rank `rank + 1` listens.
    pub(crate) fn start(
        listener: TcpListener,
        successor: SocketAddr,
        rank: usize,
        size: usize,
        secret: [u8; 32],
        timeout: Duration,
    ) -> Result<Gather> {
        let sys = |what: &str, e: std::io::Error| Error::io(ErrorKind::System, what, e).rank(rank);
        listener
            .set_nonblocking(true)
            .map_err(|e| sys("bootstrap listener", e))?;
        let efd = || {
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                .map_err(|e| sys("eventfd", e.into()))
        };
        let shared = Arc::new(Shared {
            rank,
            size,
            secret,
            timeout,
            state: Mutex::new(State {
                next: vec![successor],
                ..State::default()
            }),
            progress: efd()?,
            served: efd()?,
            stop: AtomicBool::new(false),
        });
        #[cfg(test)]
        let listen = listener
            .local_addr()
            .map_err(|e| sys("bootstrap listener", e))?;
        let s = Arc::clone(&shared);
        let server = std::thread::Builder::new()
            .name("ccl-bootstrap-gather".into())
            .spawn(move || Server::new(s, listener).run())
            .map_err(|e| sys("spawning the bootstrap allgather thread", e))?;
        Ok(Gather {
            shared,
            #[cfg(test)]
            listen,
            server: Some(server),
        })
    }

    /// Runs allgather round `round` with this rank's `data`; `root` is the connection to the
    /// root, watched for the job's failure while this rank waits. Returns every rank's data in
    /// rank order.
    pub(crate) fn allgather(
        &self,
        root: &mut TcpStream,
        round: u32,
        data: &[u8],
        deadline: Instant,
    ) -> Result<Vec<Vec<u8>>> {
        let (rank, n) = (self.shared.rank, self.shared.size);
        {
            let mut st = self.shared.lock();
            debug_assert_eq!(st.rounds.len(), round as usize);
            st.rounds.push(vec![data.to_vec()]);
            st.answered.push(vec![false; steps(n) as usize]);
        }
        self.wake_server();
        for k in 0..steps(n) {
            let peer = (rank + (1 << k)) % n;
            let addr = self.shared.lock().next[k as usize];
            let b = self
                .step(root, round, k, peer, addr, deadline)
                .map_err(|e| root_word(root, e, rank))?;
            if b.records.len() != count(n, k) {
                return Err(Error::remote(format!(
                    "bootstrap allgather: rank {peer} sent {} records for step {k}, not {}",
                    b.records.len(),
                    count(n, k)
                ))
                .peer(peer)
                .rank(rank));
            }
            let more = (1usize << (k + 1)) < n;
            let mut st = self.shared.lock();
            if more && st.next.len() == k as usize + 1 {
                let next = b.next.ok_or_else(|| {
                    Error::remote(format!(
                        "bootstrap allgather: rank {peer} did not say where rank {} listens",
                        (rank + (2 << k)) % n
                    ))
                    .peer(peer)
                    .rank(rank)
                })?;
                st.next.push(next);
            }
            st.rounds[round as usize].extend(b.records);
            drop(st);
            self.wake_server();
        }
        let mine = &self.shared.lock().rounds[round as usize];
        // mine[i] is rank (rank + i) % n's.
        let mut all = vec![Vec::new(); n];
        for (i, d) in mine.iter().enumerate() {
            all[(rank + i) % n] = d.clone();
        }
        Ok(all)
    }

    /// Asks `peer` (listening at `addr`) for its block of step `k` and waits for it.
    fn step(
        &self,
        root: &mut TcpStream,
        round: u32,
        k: u32,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> Result<Block> {
        let rank = self.shared.rank;
        let what = || format!("bootstrap allgather step {k}: rank {peer} at {addr}");
        let named = |e: Error| e.peer(peer).rank(rank);
        let mut s = ccl_core::net::connect_to_listening(addr, deadline, &what).map_err(named)?;
        let _ = s.set_nodelay(true);
        let ask = GatherAsk {
            secret: self.shared.secret,
            rank,
            round,
            step: k,
        };
        wire::write_frame(&mut s, &ask.encode(), deadline).map_err(|e| named(e.context(what())))?;
        wait_readable(&s, root, deadline, &|| {
            format!("{} did not answer (is it stopped?)", what())
        })
        .map_err(|e| e.rank(rank))?;
        let f = wire::read_frame(&mut s, deadline, &what).map_err(named)?;
        match f.kind {
            FrameKind::Block => Block::decode(&f.payload).map_err(|e| named(e.context(what()))),
            FrameKind::Error => Err(named(Error::remote(format!(
                "{}: {}",
                what(),
                String::from_utf8_lossy(&f.payload)
            )))),
            other => Err(named(Error::remote(format!("{}: sent {other:?}", what())))),
        }
    }

    /// Waits until this rank answered every step of every round (its listener must stay up
    /// until then), watching `root` for the job's failure.
    pub(crate) fn settle(&self, root: &mut TcpStream, deadline: Instant) -> Result<()> {
        let (rank, n) = (self.shared.rank, self.shared.size);
        loop {
            let missing: Vec<usize> = {
                let st = self.shared.lock();
                st.answered
                    .iter()
                    .flat_map(|a| a.iter().enumerate().filter(|(_, done)| !**done))
                    .map(|(k, _)| (rank + n - (1 << k) % n) % n)
                    .collect()
            };
            if missing.is_empty() {
                return Ok(());
            }
            let mut fds = [
                PollFd::new(self.shared.served.as_fd(), PollFlags::POLLIN),
                PollFd::new(root.as_fd(), PollFlags::POLLIN),
            ];
            let left = ccl_core::net::remaining(deadline, || {
                format!(
                    "bootstrap allgather: rank(s) {} never asked this rank for their block",
                    list_ranks(&missing)
                )
            })
            .map_err(|e| e.rank(rank).peer(missing[0]))?;
            let _ = nix::poll::poll(&mut fds, poll_ms(left));
            if fds[1].any().unwrap_or(false) {
                return Err(root_error(root, deadline).rank(rank));
            }
            let _ = self.shared.served.read();
        }
    }

    /// Where this rank listens.
    #[cfg(test)]
    pub(crate) fn listening(&self) -> SocketAddr {
        self.listen
    }

    fn wake_server(&self) {
        let _ = self.shared.progress.write(1);
    }
}

impl Drop for Gather {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.wake_server();
        if let Some(t) = self.server.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `ask` once this rank holds what it asks for, or why it will never do.
    fn answer(&self, ask: &GatherAsk) -> std::result::Result<Option<Block>, String> {
        let (rank, n) = (self.rank, self.size);
        let k = ask.step;
        if k >= steps(n) || ask.rank != (rank + n - (1 << k) % n) % n {
            return Err(format!(
                "rank {} asked rank {rank} for step {k}, which is not theirs to exchange among {n} ranks",
                ask.rank
            ));
        }
        let st = self.lock();
        let Some(have) = st.rounds.get(ask.round as usize) else {
            return Ok(None);
        };
        let more = (1usize << (k + 1)) < n;
        if have.len() < (1 << k) || (more && st.next.len() <= k as usize) {
            return Ok(None);
        }
        Ok(Some(Block {
            next: more.then(|| st.next[k as usize]),
            records: have[..count(n, k)].to_vec(),
        }))
    }

    fn answered(&self, ask: &GatherAsk) {
        if let Some(a) = self.lock().answered.get_mut(ask.round as usize) {
            a[ask.step as usize] = true;
        }
        let _ = self.served.write(1);
    }
}

/// One connection to this rank's listener.
struct Conn {
    s: TcpStream,
    from: SocketAddr,
    inbox: Vec<u8>,
    ask: Option<GatherAsk>,
    /// The answer being written, and how much of it went out.
    out: Option<(Vec<u8>, usize)>,
    deadline: Instant,
}

/// The thread that answers the other ranks' requests.
struct Server {
    shared: Arc<Shared>,
    listener: TcpListener,
    conns: Vec<Conn>,
}

impl Server {
    fn new(shared: Arc<Shared>, listener: TcpListener) -> Server {
        Server {
            shared,
            listener,
            conns: Vec::new(),
        }
    }

    fn run(mut self) {
        while !self.shared.stop.load(Ordering::Acquire) {
            let incoming = self.poll();
            let _ = self.shared.progress.read();
            if incoming {
                self.accept();
            }
            let now = Instant::now();
            let shared = Arc::clone(&self.shared);
            self.conns.retain_mut(|c| {
                let keep = c.serve(&shared);
                if keep && now >= c.deadline {
                    ccl_warn!(
                        Some(shared.rank),
                        "bootstrap allgather: dropped the connection from {} ({:?}): it took too long",
                        c.from,
                        c.ask.as_ref().map(|a| (a.rank, a.step))
                    );
                    return false;
                }
                keep
            });
        }
    }

    /// Waits for something to do, without waking on a timer: progress and the stop come by the
    /// eventfd, and only a connection's deadline bounds the wait. Whether the listener is
    /// readable. (Hundreds of ranks sharing a few CPUs spend their time in wake-ups otherwise.)
    fn poll(&self) -> bool {
        let mut fds = vec![
            PollFd::new(self.listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.shared.progress.as_fd(), PollFlags::POLLIN),
        ];
        for c in &self.conns {
            let ev = if c.out.is_some() {
                PollFlags::POLLOUT
            } else if c.ask.is_none() {
                PollFlags::POLLIN
            } else {
                PollFlags::empty()
            };
            fds.push(PollFd::new(c.s.as_fd(), ev));
        }
        let timeout = match self.conns.iter().map(|c| c.deadline).min() {
            Some(d) => poll_ms(d.saturating_duration_since(Instant::now())),
            None => PollTimeout::NONE,
        };
        let _ = nix::poll::poll(&mut fds, timeout);
        fds[0].any().unwrap_or(false)
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((s, from)) => {
                    if s.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    self.conns.push(Conn {
                        s,
                        from,
                        inbox: Vec::new(),
                        ask: None,
                        out: None,
                        deadline: Instant::now() + ASK_GRACE.get(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

impl Conn {
    /// Moves this connection on as far as it goes without blocking; false once it is done.
    fn serve(&mut self, shared: &Shared) -> bool {
        if self.ask.is_none() && !self.read_ask(shared) {
            return false;
        }
        if let (Some(ask), None) = (&self.ask, &self.out) {
            match shared.answer(ask) {
                Ok(Some(b)) => self.out = Some((b.encode().encode(), 0)),
                Ok(None) => return true,
                Err(why) => {
                    ccl_warn!(Some(shared.rank), "bootstrap allgather: {why}");
                    let _ = wire::write_frame(
                        &mut self.s,
                        &Frame::error(&why),
                        Instant::now() + PEER_ERROR.get(),
                    );
                    return false;
                }
            }
        }
        let Some((bytes, off)) = &mut self.out else {
            return true;
        };
        use std::io::Write;
        loop {
            match self.s.write(&bytes[*off..]) {
                Ok(0) => return false,
                Ok(w) => {
                    wire::count_out(w);
                    *off += w;
                    if *off == bytes.len() {
                        let ask = self.ask.as_ref().expect("asked");
                        ccl_trace!(
                            Some(shared.rank),
                            "bootstrap allgather: answered rank {} for step {} of round {}",
                            ask.rank,
                            ask.step,
                            ask.round
                        );
                        shared.answered(ask);
                        return false;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
    }

    /// Reads what has arrived; false when the connection is to be dropped.
    fn read_ask(&mut self, shared: &Shared) -> bool {
        use std::io::Read;
        let mut chunk = [0u8; 256];
        loop {
            match self.s.read(&mut chunk) {
                Ok(0) => return false,
                Ok(r) => self.inbox.extend_from_slice(&chunk[..r]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
            if self.inbox.len() > 1024 {
                break;
            }
        }
        let f = match wire::take_frames(&mut self.inbox) {
            Ok(mut f) if !f.is_empty() => f.swap_remove(0),
            Ok(_) => return self.inbox.len() <= 1024,
            Err(_) => return false,
        };
        wire::count_in(5 + f.payload.len());
        let ask = match GatherAsk::decode(&f) {
            Ok(a) => a,
            Err(why) => {
                ccl_warn!(
                    Some(shared.rank),
                    "bootstrap allgather: dropped the connection from {}: {why}",
                    self.from
                );
                return false;
            }
        };
        if !ccl_core::transport::handshake::secrets_equal(&ask.secret, &shared.secret) {
            ccl_warn!(
                Some(shared.rank),
                "bootstrap allgather: dropped the connection from {} claiming rank {}: wrong secret (another job?)",
                self.from,
                ask.rank
            );
            return false;
        }
        // One of ours: it waits as long as the job does.
        self.deadline = Instant::now() + shared.timeout;
        self.ask = Some(ask);
        true
    }
}

/// Waits until `s` is readable, failing with the root's message if the root speaks first
/// (it only does to fail the job) and with `what` at the deadline.
fn wait_readable(
    s: &TcpStream,
    root: &mut TcpStream,
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<()> {
    loop {
        let left = ccl_core::net::remaining(deadline, what)?;
        let mut fds = [
            PollFd::new(s.as_fd(), PollFlags::POLLIN),
            PollFd::new(root.as_fd(), PollFlags::POLLIN),
        ];
        let _ = nix::poll::poll(&mut fds, poll_ms(left));
        if fds[0].any().unwrap_or(false) {
            return Ok(());
        }
        if fds[1].any().unwrap_or(false) {
            return Err(root_error(root, deadline));
        }
    }
}

/// What the root said when it spoke during an allgather (it fails the job), or that it closed.
fn root_error(root: &mut TcpStream, deadline: Instant) -> Error {
    let by = deadline.min(Instant::now() + ERROR_WORD.get());
    match wire::read_frame(root, by, &|| "the bootstrap root".to_string()) {
        Ok(f) if f.kind == FrameKind::Error => Error::remote(format!(
            "bootstrap root: {}",
            String::from_utf8_lossy(&f.payload)
        )),
        Ok(f) => Error::remote(format!(
            "bootstrap root sent {:?} during an allgather",
            f.kind
        )),
        Err(e) => Error::remote(format!(
            "the bootstrap root went away during an allgather: {e}"
        )),
    }
}

/// A partner that fails mid-step most likely left because the root failed the job, whose
/// message names the cause: prefer it to `e` when it comes within `ROOT_WORD`.
fn root_word(root: &mut TcpStream, e: Error, rank: usize) -> Error {
    if e.message().contains("bootstrap root") {
        return e;
    }
    let mut fds = [PollFd::new(root.as_fd(), PollFlags::POLLIN)];
    let wait = u16::try_from(ROOT_WORD.get().as_millis()).unwrap_or(u16::MAX);
    if nix::poll::poll(&mut fds, PollTimeout::from(wait)).unwrap_or(0) > 0 {
        return root_error(root, Instant::now() + ERROR_WORD.get()).rank(rank);
    }
    e
}

/// Ranks for a message: all of them, or the first 16 and how many.
pub(crate) fn list_ranks(ranks: &[usize]) -> String {
    let s: Vec<String> = ranks.iter().take(16).map(|r| r.to_string()).collect();
    if ranks.len() > 16 {
        format!("{} ... ({} ranks)", s.join(", "), ranks.len())
    } else {
        s.join(", ")
    }
}

fn poll_ms(left: Duration) -> PollTimeout {
    PollTimeout::from(left.as_millis().clamp(1, 1000) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_and_counts_cover_every_rank_once() {
        for n in 1..300usize {
            let total: usize = (0..steps(n)).map(|k| count(n, k)).sum();
            assert_eq!(total + 1, n, "n = {n}");
            if n > 1 {
                assert!(1usize << (steps(n) - 1) < n && n <= 1usize << steps(n));
            }
        }
    }
}
