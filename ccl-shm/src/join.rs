//! The host join: at set-up, before any pair of them connects, the ranks of a host that share
//! memory get what they all share from the lowest of them, the leader: the host segment, every
//! rank's arena and every rank's life line. Pairs then set up only their rings, on first use.
//!
//! A life line is one end of a socket pair whose other end its rank keeps for as long as its
//! communicator lives and passes to nobody: when the rank drops the communicator or its process
//! ends, however it ends, the kernel closes that end and every holder of the line sees it
//! readable. A rank waiting in host memory for a peer's post watches the peer's line, so a peer
//! it never connected to is noticed all the same.
//!
//! The messages, after the transport's hello and ack (which carry the secret):
//! - joiner to leader: `JOIN` (magic, arena length), with its line and its arena if it has one;
//! - leader to joiner: `TABLE` (magic, host ranks, the joiner's index, slot size, every rank's
//!   arena length), then the descriptors in `CHUNK`s of at most [`CHUNK_FDS`]: the segment's
//!   file, one eventfd per rank, and for every other rank its line and then its arena;
//! - joiner to leader: `DONE`, once all of it is mapped.
//!
//! The leader sends to a window of joiners at a time, sized so that the descriptors in flight
//! stay within its open-file limit (the kernel bounds them by it), and waits for the oldest
//! one's `DONE` before it sends to another.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ccl_core::transport::ConnectContext;
use ccl_core::transport::handshake::{Acceptor, Magic};
use ccl_core::{Error, ErrorKind, Result, ccl_info, net};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::LOG_SUBSYS;
use crate::arena::{Arena, PeerArena};
use crate::fdpass;
use crate::host::HostSegment;

const JOIN_MAGIC: [u8; 8] = *b"CCLSHM\x04J";
const TABLE_MAGIC: [u8; 8] = *b"CCLSHM\x04T";
const CHUNK_MAGIC: [u8; 8] = *b"CCLSHM\x04C";
const DONE_MAGIC: [u8; 8] = *b"CCLSHM\x04D";
const JOIN_LEN: usize = 16;
const TABLE_HEAD: usize = 24;
const CHUNK_LEN: usize = 16;
/// Descriptors per message: under [`fdpass::MAX_FDS`].
pub(crate) const CHUNK_FDS: usize = 128;
/// How often a wait looks whether another rank's failure ended the set-up.
const SLICE: Duration = Duration::from_millis(100);

/// Whether another rank's failure ends the set-up (called with the ranks still awaited).
pub(crate) type Watch<'a> = &'a (dyn Fn(&[usize]) -> Result<()> + Sync);

/// What a rank of the host holds once it joined.
#[derive(Debug)]
pub(crate) struct Joined {
    pub segment: HostSegment,
    /// By host index: every other rank's arena (`None` at this rank's own index and for ranks
    /// without one).
    pub arenas: Vec<Option<PeerArena>>,
    /// By host index: every other rank's life line (`None` at this rank's own index).
    pub lines: Vec<Option<OwnedFd>>,
    /// This rank's own end: it closes when the rank's host memory is dropped.
    pub life: OwnedFd,
}

/// A rank's own life line: the end it keeps and the end it gives away.
fn life_line() -> Result<(OwnedFd, OwnedFd)> {
    let (keep, give) =
        UnixStream::pair().map_err(|e| sys("shared-memory transport: a life line", e))?;
    Ok((keep.into(), give.into()))
}

fn sys(what: impl Into<String>, e: std::io::Error) -> Error {
    Error::io(ErrorKind::System, what, e)
}

/// Every rank of a host holds about three descriptors per rank of the host (its eventfd, arena
/// and line), and the leader has `extra` more in flight: raise the soft limit towards the hard
/// one when the default would not do. Returns the soft limit.
fn make_room_for(ranks: usize, extra: usize, rank: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let want = (4 * ranks + 256 + extra) as u64;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return usize::MAX;
    };
    if soft >= want {
        return soft as usize;
    }
    let to = want.min(hard);
    if setrlimit(Resource::RLIMIT_NOFILE, to, hard).is_err() {
        return soft as usize;
    }
    ccl_info!(
        Some(rank),
        "raised the open-file limit from {soft} to {to} for {ranks} ranks of this host in shared memory"
    );
    to as usize
}

/// The other ranks' life lines, watched through one epoll descriptor, so that a rank waiting in
/// host memory polls one descriptor for all of them (not one per rank of the host on every
/// wait).
#[derive(Debug)]
pub(crate) struct Departures {
    epoll: Epoll,
    /// By host index (`None` at this rank's own).
    lines: Vec<Option<OwnedFd>>,
    left: Vec<AtomicBool>,
}

impl Departures {
    pub(crate) fn new(lines: Vec<Option<OwnedFd>>) -> Result<Departures> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
            .map_err(|e| sys("shared-memory transport: epoll", e.into()))?;
        for (i, l) in lines.iter().enumerate() {
            if let Some(l) = l {
                epoll
                    .add(l, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                    .map_err(|e| sys("shared-memory transport: epoll", e.into()))?;
            }
        }
        let left = lines.iter().map(|_| AtomicBool::new(false)).collect();
        Ok(Departures { epoll, lines, left })
    }

    /// Readable while a rank has left that [`gone`](Departures::gone) was not asked about.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    /// Whether host rank `i` has left; once it has, its line stops making [`fd`] readable.
    pub(crate) fn gone(&self, i: usize) -> bool {
        if self.left.get(i).is_some_and(|l| l.load(Ordering::Relaxed)) {
            return true;
        }
        let Some(Some(line)) = self.lines.get(i) else {
            return false;
        };
        if !line_closed(line.as_fd()) {
            return false;
        }
        let _ = self.epoll.delete(line);
        self.left[i].store(true, Ordering::Relaxed);
        true
    }
}

/// Whether the other end of `line` has closed: nobody ever writes on a life line, so readable
/// means closed.
fn line_closed(line: BorrowedFd<'_>) -> bool {
    let mut b = [0u8; 1];
    use std::os::fd::AsRawFd;
    matches!(
        nix::sys::socket::recv(
            line.as_raw_fd(),
            &mut b,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        ),
        Ok(_) | Err(nix::errno::Errno::ECONNRESET)
    )
}

/// Waits until `s` is readable, asking `watch` about `awaited` every [`SLICE`].
fn wait_readable(
    s: &UnixStream,
    deadline: Instant,
    watch: Watch<'_>,
    awaited: &[usize],
    what: &dyn Fn() -> String,
) -> Result<()> {
    loop {
        watch(awaited)?;
        let left = net::remaining(deadline, what)?;
        let mut fds = [PollFd::new(s.as_fd(), PollFlags::POLLIN)];
        let ms = left.min(SLICE).as_millis().max(1) as u16;
        match nix::poll::poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => return Ok(()),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(sys("poll", e.into())),
        }
    }
}

/// Receives one message of `buf.len()` bytes with its descriptors, within `deadline`.
fn recv_by(
    s: &UnixStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<Vec<OwnedFd>> {
    let left = net::remaining(deadline, what)?;
    s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| sys(what(), e))?;
    fdpass::recv(s, buf).map_err(|e| {
        Error::io(
            ErrorKind::Remote,
            format!("{}: the connection closed or failed", what()),
            e,
        )
    })
}

/// Who joins: this rank's context, the transport's handshake, and the host's ranks that share
/// memory (ascending; the first leads).
#[derive(Clone, Copy)]
pub(crate) struct Host<'a> {
    pub ctx: &'a ConnectContext,
    pub magic: Magic,
    pub group: &'a [usize],
}

/// A joiner the leader has accepted.
struct Member {
    index: usize,
    stream: UnixStream,
    line: OwnedFd,
    arena: Option<PeerArena>,
    alen: usize,
}

/// The leader's part (`magic`: the transport's handshake): accepts every other rank of `group` on `listener`, gives each the host
/// `segment`, the arenas (this rank's own `arena` included) and the life lines.
pub(crate) fn lead(
    host: Host<'_>,
    listener: &UnixListener,
    segment: HostSegment,
    arena: Option<&Arena>,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Joined> {
    let Host { ctx, group, .. } = host;
    let rank = ctx.rank;
    let g = group.len();
    // Room for 16 joiners' descriptors in flight.
    let room = make_room_for(g, 16 * (1 + 3 * g), rank);
    let (life, my_line) = life_line()?;
    let mut members = accept_joiners(host, listener, deadline, watch)?;
    members.sort_by_key(|m| m.index);
    let slot = segment.slot_len();
    let lens: Vec<u64> = (0..g)
        .map(|i| match i {
            0 => arena.map_or(0, |a| a.len() as u64),
            i => members[i - 1].alen as u64,
        })
        .collect();
    let arena_fd = |i: usize| -> Option<BorrowedFd<'_>> {
        match i {
            0 => arena.map(|a| a.fd()),
            i => members[i - 1].arena.as_ref().map(|a| a.fd()),
        }
    };
    let line_fd = |i: usize| -> BorrowedFd<'_> {
        match i {
            0 => my_line.as_fd(),
            i => members[i - 1].line.as_fd(),
        }
    };
    let share = segment.share();
    // At most `window` joiners' descriptors in flight at once (see the module's docs).
    let per = 1 + 3 * g;
    let window = (room.saturating_sub(4 * g + 256) / per).clamp(1, 64);
    let mut sent: std::collections::VecDeque<&Member> = Default::default();
    for m in &members {
        if sent.len() == window {
            let first = sent.pop_front().expect("a full window");
            await_done(first, group, rank, deadline, watch)?;
        }
        let peer = group[m.index];
        let what = || format!("the shared-memory join of rank {peer} of this host");
        let fail = |e: Error| e.rank(rank).peer(peer);
        let mut table = Vec::with_capacity(TABLE_HEAD + 8 * g);
        table.extend_from_slice(&TABLE_MAGIC);
        table.extend_from_slice(&(g as u32).to_le_bytes());
        table.extend_from_slice(&(m.index as u32).to_le_bytes());
        table.extend_from_slice(&(slot as u64).to_le_bytes());
        for &l in &lens {
            table.extend_from_slice(&l.to_le_bytes());
        }
        let mut fds: Vec<BorrowedFd<'_>> = Vec::with_capacity(per);
        fds.push(share.file);
        fds.extend(share.events.iter().copied());
        for j in (0..g).filter(|&j| j != m.index) {
            fds.push(line_fd(j));
            fds.extend(arena_fd(j));
        }
        fdpass::send(&m.stream, &table, &[]).map_err(|e| fail(sys(what(), e)))?;
        for (k, chunk) in fds.chunks(CHUNK_FDS).enumerate() {
            let mut head = [0u8; CHUNK_LEN];
            head[..8].copy_from_slice(&CHUNK_MAGIC);
            head[8..12].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
            head[12..].copy_from_slice(&(k as u32).to_le_bytes());
            fdpass::send(&m.stream, &head, chunk).map_err(|e| fail(sys(what(), e)))?;
        }
        sent.push_back(m);
    }
    for m in sent {
        await_done(m, group, rank, deadline, watch)?;
    }
    drop(share);
    let mut arenas: Vec<Option<PeerArena>> = (0..g).map(|_| None).collect();
    let mut lines: Vec<Option<OwnedFd>> = (0..g).map(|_| None).collect();
    for m in members {
        arenas[m.index] = m.arena;
        lines[m.index] = Some(m.line);
    }
    Ok(Joined {
        segment,
        arenas,
        lines,
        life,
    })
}

/// The leader's first part: accepts and admits every other rank of the host.
fn accept_joiners(
    host: Host<'_>,
    listener: &UnixListener,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Vec<Member>> {
    let Host { ctx, magic, group } = host;
    let (rank, g) = (ctx.rank, group.len());
    let mut acceptor = Acceptor::new(magic, "shared-memory transport");
    let mut members: Vec<Member> = Vec::with_capacity(g - 1);
    while members.len() < g - 1 {
        let missing: Vec<usize> = group[1..]
            .iter()
            .enumerate()
            .filter(|(i, _)| !members.iter().any(|m| m.index == i + 1))
            .map(|(_, &r)| r)
            .collect();
        watch(&missing)?;
        let slice = deadline.min(Instant::now() + SLICE);
        let got = acceptor.accept(
            ctx,
            listener.as_fd(),
            || match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)?;
                    Ok(Some((s, "a rank of this host".to_string())))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            },
            slice,
        );
        let (peer, s, _) = match got {
            Ok(x) => x,
            Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() < deadline => continue,
            Err(e) if e.kind() == ErrorKind::Timeout => {
                return Err(Error::timeout(format!(
                    "rank(s) {} of this host never joined its shared memory within {:.1} s",
                    missing
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    ctx.config.timeout.as_secs_f64()
                ))
                .rank(rank)
                .peer(missing[0]));
            }
            Err(e) => return Err(e.rank(rank)),
        };
        let index = group.iter().position(|&r| r == peer).filter(|&i| i > 0);
        let Some(index) = index.filter(|i| !members.iter().any(|m| m.index == *i)) else {
            return Err(Error::remote(format!(
                "a shared-memory join claiming rank {peer}, which is not an awaited rank of this host"
            ))
            .rank(rank)
            .peer(peer));
        };
        members.push(admit(ctx, &magic, peer, index, s, deadline)?);
    }
    Ok(members)
}

/// Waits for joiner `m`'s word that it mapped everything.
fn await_done(
    m: &Member,
    group: &[usize],
    rank: usize,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<()> {
    let peer = group[m.index];
    let what = || format!("the shared-memory join of rank {peer} of this host");
    let fail = |e: Error| e.rank(rank).peer(peer);
    wait_readable(&m.stream, deadline, watch, &[peer], &what).map_err(fail)?;
    let mut done = [0u8; 8];
    recv_by(&m.stream, &mut done, deadline, &|| {
        format!(
            "{} (it could not map the host's shared memory? see its error)",
            what()
        )
    })
    .map_err(fail)?;
    if done != DONE_MAGIC {
        return Err(fail(Error::remote(format!(
            "{}: an unexpected reply",
            what()
        ))));
    }
    Ok(())
}

/// Reads a joiner's `JOIN` after answering its hello.
fn admit(
    ctx: &ConnectContext,
    magic: &Magic,
    peer: usize,
    index: usize,
    mut s: UnixStream,
    deadline: Instant,
) -> Result<Member> {
    let fail = |e: Error| e.rank(ctx.rank).peer(peer);
    let what = || format!("the shared-memory join of rank {peer} of this host");
    s.set_nonblocking(false).map_err(|e| fail(sys(what(), e)))?;
    let ack = ccl_core::transport::handshake::ack(magic, ctx.rank);
    net::write_all_by(&mut s, &ack, deadline, &what).map_err(fail)?;
    let mut join = [0u8; JOIN_LEN];
    let mut fds = recv_by(&s, &mut join, deadline, &what).map_err(fail)?;
    let alen = u64::from_le_bytes(join[8..].try_into().expect("8")) as usize;
    if join[..8] != JOIN_MAGIC || fds.len() != 1 + usize::from(alen > 0) {
        return Err(fail(Error::remote(format!(
            "{}: a bad join message ({} descriptors; mixed library versions?)",
            what(),
            fds.len()
        ))));
    }
    let arena = match fds.pop() {
        Some(fd) if alen > 0 => {
            Some(PeerArena::open(fd, alen).map_err(|e| fail(e.context(what())))?)
        }
        Some(fd) => {
            fds.push(fd);
            None
        }
        None => None,
    };
    let line = fds.pop().expect("counted");
    Ok(Member {
        index,
        stream: s,
        line,
        arena,
        alen,
    })
}

/// A joiner's first part: connects to the leader listening at `name` and passes the handshake.
fn knock(host: Host<'_>, name: &[u8], deadline: Instant, watch: Watch<'_>) -> Result<UnixStream> {
    use std::os::linux::net::SocketAddrExt;
    let Host { ctx, magic, group } = host;
    let (rank, leader) = (ctx.rank, group[0]);
    let fail = |e: Error| e.rank(rank).peer(leader);
    let what = || format!("joining the shared memory of this host (rank {leader} leads it)");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)
        .map_err(|e| fail(sys(what(), e)))?;
    let mut s = UnixStream::connect_addr(&addr).map_err(|e| {
        fail(Error::io(
            ErrorKind::InvalidUsage,
            format!(
                "{}: its socket cannot be reached (is rank {leader} on another host?)",
                what()
            ),
            e,
        ))
    })?;
    let hello = ccl_core::transport::handshake::hello(&magic, ctx);
    net::write_all_by(&mut s, &hello, deadline, &what).map_err(fail)?;
    // The leader answers once it gets to this rank: wait as long as the others take to join.
    wait_readable(&s, deadline, watch, &[leader], &what).map_err(fail)?;
    let mut ack = [0u8; ccl_core::transport::handshake::ACK_LEN];
    net::read_exact_by(&mut s, &mut ack, deadline, &what)
        .map_err(|e| fail(e.context("no handshake reply (the leader refused our secret?)")))?;
    ccl_core::transport::handshake::check_ack(&magic, &ack, leader)
        .map_err(|m| fail(Error::remote(format!("{}: {m}", what()))))?;
    Ok(s)
}

/// A joiner's part: connects to the leader (`group[0]`, listening at `name`), gives it this
/// rank's life line and `arena`, and maps what it hands out.
pub(crate) fn join(
    host: Host<'_>,
    name: &[u8],
    arena: Option<&Arena>,
    deadline: Instant,
    watch: Watch<'_>,
) -> Result<Joined> {
    let Host { ctx, group, .. } = host;
    let (rank, leader, g) = (ctx.rank, group[0], group.len());
    let me = group
        .iter()
        .position(|&r| r == rank)
        .ok_or_else(|| Error::internal("this rank is not in its host's group").rank(rank))?;
    make_room_for(g, 0, rank);
    let fail = |e: Error| e.rank(rank).peer(leader);
    let what = || format!("joining the shared memory of this host (rank {leader} leads it)");
    let s = knock(host, name, deadline, watch)?;
    let (life, my_line) = life_line()?;
    let mut msg = [0u8; JOIN_LEN];
    msg[..8].copy_from_slice(&JOIN_MAGIC);
    msg[8..].copy_from_slice(&(arena.map_or(0, |a| a.len()) as u64).to_le_bytes());
    let mut fds = vec![my_line.as_fd()];
    fds.extend(arena.map(|a| a.fd()));
    fdpass::send(&s, &msg, &fds).map_err(|e| fail(sys(what(), e)))?;
    drop(fds);
    // The leader holds the given end now; keeping it here would hide this rank's own death
    // from nobody, but it would keep a descriptor for nothing.
    drop(my_line);
    wait_readable(&s, deadline, watch, &[leader], &what).map_err(fail)?;
    let mut table = vec![0u8; TABLE_HEAD + 8 * g];
    recv_by(&s, &mut table, deadline, &what).map_err(fail)?;
    let word = |a: usize, b: usize| -> u64 {
        let mut v = [0u8; 8];
        v[..b - a].copy_from_slice(&table[a..b]);
        u64::from_le_bytes(v)
    };
    let (ranks, index, slot) = (word(8, 12), word(12, 16), word(16, 24) as usize);
    if table[..8] != TABLE_MAGIC || ranks != g as u64 || index != me as u64 {
        return Err(fail(Error::remote(format!(
            "{}: the leader describes a host of {ranks} ranks with this one at {index}, not {g} \
             at {me} (do the ranks agree on the topology?)",
            what()
        ))));
    }
    let lens: Vec<usize> = (0..g)
        .map(|i| word(TABLE_HEAD + 8 * i, TABLE_HEAD + 8 * i + 8) as usize)
        .collect();
    let expect = 1
        + g
        + (0..g)
            .filter(|&j| j != me)
            .map(|j| 1 + usize::from(lens[j] > 0))
            .sum::<usize>();
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(expect);
    for k in 0..expect.div_ceil(CHUNK_FDS) {
        let mut head = [0u8; CHUNK_LEN];
        let got = recv_by(&s, &mut head, deadline, &what).map_err(fail)?;
        let n = u32::from_le_bytes(head[8..12].try_into().expect("4")) as usize;
        let at = u32::from_le_bytes(head[12..].try_into().expect("4")) as usize;
        if head[..8] != CHUNK_MAGIC || at != k || n != got.len() || fds.len() + n > expect {
            return Err(fail(Error::remote(format!(
                "{}: descriptors out of order ({} in part {at})",
                what(),
                got.len()
            ))));
        }
        fds.extend(got);
    }
    if fds.len() != expect {
        return Err(fail(Error::remote(format!(
            "{}: {} descriptors, not {expect}",
            what(),
            fds.len()
        ))));
    }
    let mut fds = fds.into_iter();
    let file = fds.next().expect("counted");
    let events: Vec<OwnedFd> = fds.by_ref().take(g).collect();
    let segment =
        HostSegment::open(file, events, g, slot, me).map_err(|e| fail(e.context(what())))?;
    let mut arenas: Vec<Option<PeerArena>> = (0..g).map(|_| None).collect();
    let mut lines: Vec<Option<OwnedFd>> = (0..g).map(|_| None).collect();
    for j in (0..g).filter(|&j| j != me) {
        lines[j] = fds.next();
        if lens[j] > 0 {
            let fd = fds.next().expect("counted");
            arenas[j] =
                Some(PeerArena::open(fd, lens[j]).map_err(|e| {
                    fail(e.context(format!("{}: rank {}'s arena", what(), group[j])))
                })?);
        }
    }
    fdpass::send(&s, &DONE_MAGIC, &[]).map_err(|e| fail(sys(what(), e)))?;
    Ok(Joined {
        segment,
        arenas,
        lines,
        life,
    })
}
