//! The shared-memory transport: a pair of rings in one memory file per pair of ranks of a host.
//!
//! Set-up, per host: the ranks get the host segment, each other's arenas and life lines from
//! the lowest of them (`join`), before any pair connects.
//!
//! Set-up, per pair, when the pair is first used (or at set-up with `CCL_CONNECT=eager`): the
//! listener is a Unix socket in the abstract namespace (so it leaves no file behind either, and
//! only processes in the same network namespace reach it); the connector authenticates with the
//! communicator secret, then creates the memory file and four eventfds and passes them over the
//! socket; the acceptor checks the file and maps it. The socket stays open: a peer that dies,
//! however it dies, closes it, which wakes a waiting rank.
//!
//! The segment: one page of control (a header and the two rings' positions and sleep flags),
//! then the connector-to-acceptor ring, then the acceptor-to-connector ring, each mapped twice
//! back to back so every copy and every lent slice is contiguous.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ccl_core::transport::handshake::{self, Acceptor, Magic};
use ccl_core::transport::program::{HostCall, HostProgram, Stop};
use ccl_core::transport::{
    ConnectContext, Endpoint, Handle, HandleFormat, HostMemory, Interest, Listener, Scope,
    Transport, TransportProperties,
};
use ccl_core::{Error, ErrorKind, Result, ccl_trace, net};
use nix::poll::PollFlags;

use crate::LOG_SUBSYS;
use crate::arena::{Arena, PeerArena};
use crate::fdpass;
use crate::host::HostSegment;
use crate::join::{Departures, Joined};
use crate::mem::{Mapping, MemFile, Mirror, PAGE, page_size};
use crate::ring::{Consumer, Producer, RingCtl, RingMem};
use crate::wake::{drain, new_eventfd, signal};

/// Handles: the name of the listener's socket. Version 2: the set-up messages carry the ranks'
/// arenas; 3: no length byte before the name; 4: the host's ranks join before pairs connect,
/// and a pair's set-up carries its rings only.
const FORMAT: HandleFormat = HandleFormat {
    transport: "shared-memory",
    magic: b"CS",
    version: 4,
};
const MAGIC: Magic = Magic {
    hello: *b"CCLSHM\x04H",
    ack: *b"CCLSHM\x04A",
};
const SETUP_MAGIC: [u8; 8] = *b"CCLSHM\x04S";
const READY_MAGIC: [u8; 8] = *b"CCLSHM\x04R";
/// Most ranks one host segment holds.
const MAX_HOST_RANKS: usize = 4096;
const SEGMENT_MAGIC: [u8; 8] = *b"CCLSHMSG";
/// Where the two rings' control blocks sit in the control page.
const CTL_OFFSET: [usize; 2] = [128, 128 + std::mem::size_of::<RingCtl>()];
const _: () = assert!(CTL_OFFSET[1] + std::mem::size_of::<RingCtl>() <= PAGE);
const _: () = assert!(CTL_OFFSET[1] % std::mem::align_of::<RingCtl>() == 0);

/// The shared-memory transport. One per communicator: it also sets up the host segment that
/// the communicator's ranks on this host share ([`ShmTransport::take_host`]).
#[derive(Debug, Default, Clone)]
pub struct ShmTransport {
    host: Arc<Mutex<HostState>>,
    /// Microseconds a waiting rank spins beyond `CCL_SPIN_US`, set in `prepare`.
    spin_us: Arc<AtomicU64>,
}

/// The ranks of this host that talk through shared memory (this rank included, ascending), and
/// what they share once joined.
#[derive(Debug, Default)]
struct HostState {
    group: Vec<usize>,
    /// The host segment the lowest rank made in `prepare`, until it hands it out.
    segment: Option<HostSegment>,
    /// This rank's arena (made in `prepare`).
    arena: Option<Arc<Arena>>,
    /// Another handle on this rank's listener, for the join (`listen` to `join_host`).
    listener: Option<UnixListener>,
    joined: Option<Joined>,
}

/// The host segment of a communicator's ranks on one host, and which communicator rank each of
/// its slots belongs to.
#[derive(Debug)]
pub struct HostGroup {
    pub segment: HostSegment,
    /// Communicator rank of each host index, ascending.
    pub ranks: Vec<usize>,
    /// Every host rank's arena mapped here (this rank's own at its index is `None`), when
    /// every one of them has one; else empty.
    arenas: Vec<Option<PeerArena>>,
    mine: Option<Arc<Arena>>,
    /// The other ranks' life lines (see `join`).
    departures: Departures,
    /// This rank's own end of its life line, closed with the group.
    _life: OwnedFd,
    /// The operation announced last (`HostMemory::announce_buffers`), whose buffers
    /// `peer_input` and `peer_output` look up.
    op: AtomicU64,
    /// The reduce kernels of this CPU (`HostMemory::kernels`).
    kernels: ccl_core::reduce::Kernels,
}

impl HostGroup {
    fn peer_arena(&self, i: usize) -> Result<&PeerArena> {
        self.arenas
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::internal(format!("no shared arena of host rank {i}")))
    }

    /// Host rank `i`'s announced input or output, checked.
    fn announced(&self, i: usize, output: bool) -> Result<(std::ptr::NonNull<u8>, usize)> {
        let peer = self.ranks.get(i).copied().unwrap_or(i);
        let op = self.op.load(Ordering::Relaxed);
        self.peer_arena(i)?.announced(op, output).map_err(|m| {
            Error::remote(format!(
                "peer {peer} {m} (mismatched or corrupted registered buffers?)"
            ))
            .peer(peer)
        })
    }
}

impl HostMemory for HostGroup {
    fn ranks(&self) -> &[usize] {
        &self.ranks
    }
    fn me(&self) -> usize {
        self.segment.me()
    }
    fn slot_len(&self) -> usize {
        self.segment.slot_len()
    }
    fn posted(&self, i: usize) -> u64 {
        self.segment.posted(i)
    }
    fn post(&self) {
        self.segment.post()
    }
    fn wake(&self) {
        self.segment.wake()
    }
    fn wake_seen(&self) {
        self.segment.wake_seen()
    }
    fn announce(&self, op: u64, desc: u64) {
        self.segment.announce(op, desc)
    }
    fn desc(&self, i: usize, op: u64) -> u64 {
        self.segment.desc(i, op)
    }
    fn all_posted(&self, count: u64) -> bool {
        self.segment.all_posted(count)
    }
    fn first_unlike(&self, op: u64, desc: u64) -> Option<(usize, u64)> {
        self.segment.first_unlike(op, desc)
    }
    fn arm(&self, count: u64) -> bool {
        self.segment.arm_all(count)
    }
    fn wait_fd(&self) -> BorrowedFd<'_> {
        self.segment.wait_fd()
    }
    fn slot(&self, i: usize) -> &[u8] {
        self.segment.slot(i)
    }
    fn my_slot(&mut self) -> &mut [u8] {
        self.segment.my_slot()
    }
    fn slot_pair(&mut self, i: usize) -> (&mut [u8], &[u8]) {
        self.segment.slot_pair(i)
    }
    fn run(&mut self, prog: &HostProgram, from: usize, call: &mut HostCall<'_>) -> Result<Stop> {
        self.segment.run(prog, from, call, &self.kernels)
    }
    fn shared(&self, bytes: &[u8]) -> bool {
        match &self.mine {
            Some(a) if !self.arenas.is_empty() && a.contains(bytes.as_ptr() as usize) => {
                a.place(bytes).is_some()
            }
            _ => false,
        }
    }
    fn has_shared(&self) -> bool {
        self.mine.is_some() && !self.arenas.is_empty()
    }
    fn announce_buffers(&self, op: u64, input: &[u8], output: &[u8]) -> Result<()> {
        let a = self
            .mine
            .as_ref()
            .ok_or_else(|| Error::internal("no shared arena"))?;
        let place = |b: &[u8], what: &str| {
            a.place(b).ok_or_else(|| {
                Error::internal(format!("the {what} buffer is not in this rank's arena"))
            })
        };
        a.announce(op, place(input, "input")?, place(output, "output")?);
        self.op.store(op, Ordering::Relaxed);
        Ok(())
    }
    fn peer_input(&self, i: usize) -> Result<&[u8]> {
        let (p, len) = self.announced(i, false)?;
        // SAFETY: `p..p + len` lies inside host rank `i`'s arena, mapped while `self` lives, in
        // a block its table vouches for (so its pages are allocated and no access faults). Its
        // owner lent it to this operation; the schedule reads it only after the owner's post
        // and no rank writes the elements read before the next post that the reader waits for
        // (the symbolic checker verifies both).
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), len) })
    }
    fn peer_output(&mut self, i: usize) -> Result<&mut [u8]> {
        let (p, len) = self.announced(i, true)?;
        // SAFETY: as for `peer_input`; `&mut self` makes this the only borrow of the peer's
        // output in this process, and the schedules give every element of it one writer per
        // operation, ordered against every other access by posts and waits.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) })
    }
    fn kernels(&self) -> ccl_core::reduce::Kernels {
        self.kernels
    }
    fn departures_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.departures.fd())
    }
    fn gone(&self, i: usize) -> bool {
        self.departures.gone(i)
    }
}

impl ShmTransport {
    pub fn new() -> ShmTransport {
        ShmTransport::default()
    }

    fn state(&self) -> MutexGuard<'_, HostState> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The host segment, once this rank joined its host (`None` when it shares memory with no
    /// other). Taken once.
    pub fn take_host_group(&self) -> Option<HostGroup> {
        let mut st = self.state();
        let joined = st.joined.take()?;
        let ranks = std::mem::take(&mut st.group);
        let mut arenas = joined.arenas;
        // Direct reads need every other rank's arena.
        let me = joined.segment.me();
        if st.arena.is_none() || (0..ranks.len()).any(|i| i != me && arenas[i].is_none()) {
            arenas.clear();
        }
        // Without a way to watch the others' departures the host memory is not used (the
        // communicator's waits would not see a peer that left); that takes running out of
        // descriptors.
        let departures = match Departures::new(joined.lines) {
            Ok(d) => d,
            Err(e) => {
                ccl_core::ccl_warn!(None, "no host memory: {e}");
                return None;
            }
        };
        Some(HostGroup {
            segment: joined.segment,
            ranks,
            arenas,
            mine: st.arena.clone(),
            departures,
            _life: joined.life,
            op: AtomicU64::new(0),
            kernels: crate::simd::kernels(),
        })
    }

    /// This rank's shared arena, which `Communicator::alloc` takes memory from (`None` when it
    /// shares memory with no other rank, or `CCL_SHM_ARENA_BYTES` is 0).
    pub fn arena(&self) -> Option<Arc<Arena>> {
        self.state().arena.clone()
    }
}

/// A pair's set-up message: magic and ring size, with the pair's descriptors. The reply: magic.
const SETUP_LEN: usize = 16;
const READY_LEN: usize = 8;

/// Descriptors of a pair's segment: the file and four eventfds.
const PAIR_FDS: usize = 5;

fn encode_handle(name: &[u8]) -> Handle {
    FORMAT.encode(name)
}

fn decode_handle(h: &Handle) -> Result<Vec<u8>> {
    match FORMAT.decode(h)? {
        [] => Err(FORMAT.malformed("no name")),
        name => Ok(name.to_vec()),
    }
}

fn sys(what: impl Into<String>, e: io::Error) -> Error {
    Error::io(ErrorKind::System, what, e)
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn scope(&self) -> Scope {
        Scope::Host
    }

    fn prepare(&self, ctx: &ConnectContext, peers: &[usize]) -> Result<()> {
        let mut group: Vec<usize> = peers.iter().copied().chain([ctx.rank]).collect();
        group.sort_unstable();
        group.dedup();
        let mut st = self.state();
        // The lowest rank of the host makes the segment and hands it out in `join_host`.
        if group.len() > 1 && group[0] == ctx.rank && group.len() <= MAX_HOST_RANKS {
            st.segment = Some(HostSegment::create(group.len(), ctx.config.shm_slot_size)?);
        }
        if group.len() > 1 && ctx.config.shm_arena_bytes > 0 && st.arena.is_none() {
            st.arena =
                Some(Arena::create(ctx.config.shm_arena_bytes).map_err(|e| e.rank(ctx.rank))?);
        }
        st.group = group;
        // A peer's step here takes as long as its copies, often longer than `CCL_SPIN_US`, and
        // an idle vCPU wakes in tens of microseconds to milliseconds: spinning longer pays (an
        // 8 MiB allreduce of 2 ranks went from 0.6 to 7 GB/s busbw). With more ranks than CPUs
        // the executor yields between polls instead of spinning, so the wait still leaves the
        // CPU to the rank it waits for.
        let spin = ctx.config.shm_spin.as_micros() as u64;
        self.spin_us.store(spin, Ordering::Relaxed);
        Ok(())
    }

    fn properties(&self) -> TransportProperties {
        // A cache line between cores each way; copies at memory speed less the reducing reads.
        TransportProperties {
            latency: Duration::from_nanos(500),
            bandwidth: 10.0e9,
            spin: Duration::from_micros(self.spin_us.load(Ordering::Relaxed)),
            host_memory: true,
        }
    }

    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>> {
        if page_size() != PAGE {
            return Err(Error::invalid_usage(format!(
                "the shared-memory transport needs 4 KiB pages; this system has {} (set CCL_SHM_DISABLE=1)",
                page_size()
            ))
            .rank(ctx.rank));
        }
        let mut rnd = [0u8; 12];
        getrandom::getrandom(&mut rnd).map_err(|e| Error::internal(format!("getrandom: {e}")))?;
        let hex: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
        let name = format!("ccl-shm/{}/{hex}", std::process::id()).into_bytes();
        let addr = SocketAddr::from_abstract_name(&name)
            .map_err(|e| sys("shared-memory transport: socket name", e))?;
        let l = UnixListener::bind_addr(&addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| sys("shared-memory transport: listen", e).rank(ctx.rank))?;
        self.state().listener = Some(
            l.try_clone()
                .map_err(|e| sys("shared-memory transport: listen", e).rank(ctx.rank))?,
        );
        Ok(Box::new(ShmListener {
            ctx: ctx.clone(),
            listener: l,
            name,
            acceptor: Acceptor::new(MAGIC, "shared-memory transport"),
        }))
    }

    fn join_host(
        &self,
        ctx: &ConnectContext,
        group: &[usize],
        leader: &Handle,
        deadline: Instant,
        watch: &(dyn Fn(&[usize]) -> Result<()> + Sync),
    ) -> Result<()> {
        let mut st = self.state();
        let listener = st.listener.take();
        if group.len() < 2 || group.len() > MAX_HOST_RANKS || group != st.group.as_slice() {
            return Ok(());
        }
        let arena = st.arena.clone();
        let host = crate::join::Host {
            ctx,
            magic: MAGIC,
            group,
        };
        let joined = if group[0] == ctx.rank {
            let segment = st.segment.take();
            drop(st);
            let (Some(listener), Some(segment)) = (listener, segment) else {
                return Err(Error::internal(
                    "the shared-memory join needs the leader's listener and segment",
                )
                .rank(ctx.rank));
            };
            crate::join::lead(host, &listener, segment, arena.as_deref(), deadline, watch)?
        } else {
            drop(st);
            let name = decode_handle(leader).map_err(|e| e.rank(ctx.rank).peer(group[0]))?;
            crate::join::join(host, &name, arena.as_deref(), deadline, watch)?
        };
        self.state().joined = Some(joined);
        Ok(())
    }

    fn take_host(&self) -> Option<Box<dyn HostMemory>> {
        self.take_host_group()
            .map(|g| Box::new(g) as Box<dyn HostMemory>)
    }

    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let fail = |e: Error| e.rank(ctx.rank).peer(peer);
        let name = decode_handle(handle).map_err(fail)?;
        let what = || format!("shared-memory connection to peer {peer}");
        let addr = SocketAddr::from_abstract_name(&name).map_err(|e| fail(sys(what(), e)))?;
        let mut s = UnixStream::connect_addr(&addr).map_err(|e| {
            fail(Error::io(
                ErrorKind::InvalidUsage,
                format!(
                    "{}: its socket cannot be reached; shared memory works between ranks of one \
                     host in one network namespace (is peer {peer} on another host? \
                     CCL_TRANSPORT=shm forces shared memory for every pair)",
                    what()
                ),
                e,
            ))
        })?;
        net::write_all_by(&mut s, &handshake::hello(&MAGIC, ctx), deadline, &what).map_err(fail)?;
        let mut ack = [0u8; handshake::ACK_LEN];
        net::read_exact_by(&mut s, &mut ack, deadline, &what).map_err(|e| {
            fail(e.context("no handshake reply (the peer refused our secret or rank?)"))
        })?;
        handshake::check_ack(&MAGIC, &ack, peer)
            .map_err(|m| fail(Error::remote(format!("{}: {m}", what()))))?;
        let seg = Segment::create(ctx.config.shm_ring_size).map_err(fail)?;
        let mut setup = [0u8; SETUP_LEN];
        setup[..8].copy_from_slice(&SETUP_MAGIC);
        setup[8..16].copy_from_slice(&(seg.cap as u64).to_le_bytes());
        let fds: Vec<BorrowedFd<'_>> = std::iter::once(seg.file.fd())
            .chain(seg.events.iter().map(|e| e.as_fd()))
            .collect();
        fdpass::send(&s, &setup, &fds).map_err(|e| fail(sys(what(), e)))?;
        let mut ready = [0u8; READY_LEN];
        let left = net::remaining(deadline, what).map_err(fail)?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| fail(sys(what(), e)))?;
        let extra = fdpass::recv(&s, &mut ready).map_err(|e| {
            fail(Error::io(
                ErrorKind::Remote,
                format!("{}: the peer could not map the shared memory", what()),
                e,
            ))
        })?;
        if ready != READY_MAGIC || !extra.is_empty() {
            return Err(fail(Error::remote(format!(
                "{}: unexpected set-up reply (mixed library versions?)",
                what()
            ))));
        }
        ShmEndpoint::boxed(peer, seg, 0, s).map_err(fail)
    }
}

struct ShmListener {
    ctx: ConnectContext,
    listener: UnixListener,
    name: Vec<u8>,
    acceptor: Acceptor<UnixStream>,
}

impl Listener for ShmListener {
    fn handle(&self) -> Handle {
        encode_handle(&self.name)
    }

    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)> {
        let rank = self.ctx.rank;
        let listener = &self.listener;
        let (peer, mut s, _) = self.acceptor.accept(
            &self.ctx,
            listener.as_fd(),
            || match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(true)?;
                    let who = match nix::sys::socket::getsockopt(
                        &s,
                        nix::sys::socket::sockopt::PeerCredentials,
                    ) {
                        Ok(c) => format!("pid {}", c.pid()),
                        Err(_) => "an unknown process".to_string(),
                    };
                    Ok(Some((s, who)))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
                Err(e) => Err(e),
            },
            deadline,
        )?;
        let fail = |e: Error| e.rank(rank).peer(peer);
        let what = || format!("shared-memory connection from peer {peer}");
        // The caller's deadline bounds the wait for a peer; one that has arrived is set up
        // within the communicator's timeout (see `Listener::accept`).
        let deadline = Instant::now() + self.ctx.config.timeout;
        s.set_nonblocking(false).map_err(|e| fail(sys(what(), e)))?;
        net::write_all_by(&mut s, &handshake::ack(&MAGIC, rank), deadline, &what).map_err(fail)?;
        let left = net::remaining(deadline, what).map_err(fail)?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(|e| fail(sys(what(), e)))?;
        let mut setup = [0u8; SETUP_LEN];
        let fds = fdpass::recv(&s, &mut setup).map_err(|e| {
            fail(Error::io(
                ErrorKind::Remote,
                format!("{}: no shared-memory set-up", what()),
                e,
            ))
        })?;
        if setup[..8] != SETUP_MAGIC {
            return Err(fail(Error::remote(format!(
                "{}: bad set-up message",
                what()
            ))));
        }
        let cap = u64::from_le_bytes(setup[8..16].try_into().expect("8")) as usize;
        let seg = Segment::open(fds, cap).map_err(|e| fail(e.context(what())))?;
        fdpass::send(&s, &READY_MAGIC, &[]).map_err(|e| fail(sys(what(), e)))?;
        ccl_trace!(Some(rank), "shared-memory transport: accepted peer {peer}");
        Ok((peer, ShmEndpoint::boxed(peer, seg, 1, s).map_err(fail)?))
    }
}

/// One pair's shared memory, mapped: the control page and the two rings.
struct Segment {
    // Users of the mappings (`Producer`, `Consumer`) live in the endpoint, which drops them
    // before this.
    file: MemFile,
    ctl: Mapping,
    rings: [Mirror; 2],
    /// Per ring: data readable (the consumer polls it), space free (the producer polls it).
    events: [OwnedFd; 4],
    cap: usize,
}

impl Segment {
    fn len(cap: usize) -> Result<usize> {
        cap.checked_mul(2)
            .and_then(|b| b.checked_add(PAGE))
            .ok_or_else(|| Error::invalid_argument("CCL_SHM_RING_SIZE is too large"))
    }

    fn create(cap: usize) -> Result<Segment> {
        let file = MemFile::create("ccl-shm", Segment::len(cap)?, "CCL_SHM_RING_SIZE")?;
        let seg = Segment::map(
            file,
            cap,
            [
                new_eventfd()?,
                new_eventfd()?,
                new_eventfd()?,
                new_eventfd()?,
            ],
        )?;
        let p = seg.ctl.ptr().as_ptr();
        // SAFETY: the control page is mapped read-write, this process created it just now and
        // nobody else has it yet; the header's 16 bytes lie inside the page.
        unsafe {
            std::ptr::copy_nonoverlapping(SEGMENT_MAGIC.as_ptr(), p, 8);
            std::ptr::copy_nonoverlapping((cap as u64).to_le_bytes().as_ptr(), p.add(8), 8);
        }
        Ok(seg)
    }

    fn open(fds: Vec<OwnedFd>, cap: usize) -> Result<Segment> {
        if cap < 4096 || cap % PAGE != 0 || cap > 1 << 30 {
            return Err(Error::remote(format!("bad shared ring size {cap}")));
        }
        let Ok([file, a, b, c, d]) = <[OwnedFd; PAIR_FDS]>::try_from(fds) else {
            return Err(Error::remote(
                "shared-memory set-up carried the wrong number of descriptors",
            ));
        };
        let file = MemFile::open(file, Segment::len(cap)?)?;
        let seg = Segment::map(file, cap, [a, b, c, d])?;
        let mut head = [0u8; 16];
        // SAFETY: the control page is mapped; the connector wrote the header before passing the
        // file and writes it never again.
        unsafe { std::ptr::copy_nonoverlapping(seg.ctl.ptr().as_ptr(), head.as_mut_ptr(), 16) };
        if head[..8] != SEGMENT_MAGIC
            || u64::from_le_bytes(head[8..].try_into().expect("8")) != cap as u64
        {
            return Err(Error::remote("the shared memory file is not a ccl segment"));
        }
        Ok(seg)
    }

    fn map(file: MemFile, cap: usize, events: [OwnedFd; 4]) -> Result<Segment> {
        let ctl = Mapping::new(&file, 0, PAGE)?;
        let rings = [
            Mirror::new(&file, PAGE, cap)?,
            Mirror::new(&file, PAGE + cap, cap)?,
        ];
        Ok(Segment {
            file,
            ctl,
            rings,
            events,
            cap,
        })
    }

    fn ring(&self, i: usize) -> RingMem {
        // SAFETY:
        // - The control blocks lie inside the mapped control page at offsets aligned for
        //   `RingCtl` (checked at compile time), in a file that started zeroed.
        // - Ring `i`'s data is a `Mirror` of `cap` bytes.
        // - Both stay mapped while the segment lives, and the endpoint owning the segment drops
        //   its producer and consumer first.
        // - The protocol makes one side the producer and the other the consumer of each ring:
        //   the connector writes ring 0 and reads ring 1, the acceptor the reverse.
        unsafe {
            RingMem::new(
                self.ctl.ptr().as_ptr().add(CTL_OFFSET[i]).cast(),
                self.rings[i].ptr().as_ptr(),
                self.cap,
            )
        }
    }
}

/// One end of a pair: it writes ring `tx` and reads ring `1 - tx`.
struct ShmEndpoint {
    peer: usize,
    tx: Producer,
    rx: Consumer,
    /// Signalled when ring `tx` gets data (the peer waits on it) / when ring `rx` frees space.
    wake_peer_data: usize,
    wake_peer_space: usize,
    /// What this side polls: data in ring `rx`, space in ring `tx`.
    my_data: usize,
    my_space: usize,
    sock: UnixStream,
    /// Dropped last: the rings above point into it.
    seg: Segment,
}

impl ShmEndpoint {
    fn boxed(peer: usize, seg: Segment, tx: usize, sock: UnixStream) -> Result<Box<dyn Endpoint>> {
        sock.set_nonblocking(true)
            .map_err(|e| sys("shared-memory connection", e))?;
        let rx = 1 - tx;
        Ok(Box::new(ShmEndpoint {
            peer,
            tx: Producer::new(seg.ring(tx)),
            rx: Consumer::new(seg.ring(rx)),
            wake_peer_data: 2 * tx,
            wake_peer_space: 2 * rx + 1,
            my_data: 2 * rx,
            my_space: 2 * tx + 1,
            sock,
            seg,
        }))
    }

    fn closed(&self) -> Error {
        Error::remote(format!(
            "shared-memory connection to peer {} was closed by the peer (did it exit or fail?)",
            self.peer
        ))
        .peer(self.peer)
    }

    /// Whether the peer's process still holds its end of the socket.
    fn peer_alive(&self) -> bool {
        let mut b = [0u8; 1];
        !matches!(
            nix::sys::socket::recv(
                self.sock.as_raw_fd(),
                &mut b,
                nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            ),
            Ok(0) | Err(nix::errno::Errno::ECONNRESET)
        )
    }

    fn after_read(&self, n: usize) {
        if n > 0 && self.rx.producer_wants_wake() {
            signal(&self.seg.events[self.wake_peer_space]);
        }
    }
}

impl Drop for ShmEndpoint {
    fn drop(&mut self) {
        // The peer reads what is left, then sees the close; if it sleeps, wake it.
        self.tx.close();
        self.rx.close();
        signal(&self.seg.events[self.wake_peer_data]);
        signal(&self.seg.events[self.wake_peer_space]);
    }
}

impl Endpoint for ShmEndpoint {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        if self.tx.consumer_closed() {
            return Err(self.closed());
        }
        let n = self.tx.push(src);
        if n > 0 && self.tx.consumer_wants_wake() {
            signal(&self.seg.events[self.wake_peer_data]);
        }
        Ok(n)
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        let n = self.rx.read(dst);
        if n == 0 && !dst.is_empty() && self.rx.producer_closed() && self.rx.is_empty() {
            return Err(self.closed());
        }
        self.after_read(n);
        Ok(n)
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        let n = self.rx.read_with(max, consume);
        if n == 0 && max > 0 && self.rx.producer_closed() && self.rx.is_empty() {
            return Err(self.closed());
        }
        self.after_read(n);
        Ok(n)
    }

    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        // Clear old wake-ups first: one that lands after the checks below stays and wakes the
        // poll.
        if interest.recv {
            drain(&self.seg.events[self.my_data]);
            if !self.rx.arm() {
                return Ok(false);
            }
        }
        if interest.send {
            drain(&self.seg.events[self.my_space]);
            if !self.tx.arm() {
                return Ok(false);
            }
        }
        if !self.peer_alive() {
            return Err(Error::remote(format!(
                "shared-memory peer {} died (its end of the connection closed)",
                self.peer
            ))
            .peer(self.peer));
        }
        Ok(true)
    }

    fn wait_fds<'a>(&'a self, interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        if interest.recv {
            out.push((self.seg.events[self.my_data].as_fd(), PollFlags::POLLIN));
        }
        if interest.send {
            out.push((self.seg.events[self.my_space].as_fd(), PollFlags::POLLIN));
        }
        if interest.recv || interest.send {
            out.push((self.sock.as_fd(), PollFlags::POLLIN));
        }
    }
}

#[cfg(test)]
mod tests;
