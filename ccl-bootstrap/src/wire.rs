//! Bootstrap wire format: length-prefixed frames `[u32 LE payload length][u8 kind][payload]`.
//!
//! Decoders never trust a length: frames are capped at [`MAX_FRAME`] before any allocation, and
//! every slice is bounds-checked, so bytes from a stranger give an error, never a panic or a huge
//! allocation.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ccl_core::error::{Error, Result};
use ccl_core::net;
use ccl_core::transport::{decode_addr, encode_addr};

static BYTES_IN: AtomicU64 = AtomicU64::new(0);
static BYTES_OUT: AtomicU64 = AtomicU64::new(0);

/// Bytes of bootstrap and monitor traffic this process has read and written, the root's and
/// its ranks' alike (a launcher that runs only the root gets the root's).
pub fn traffic() -> (u64, u64) {
    (
        BYTES_IN.load(Ordering::Relaxed),
        BYTES_OUT.load(Ordering::Relaxed),
    )
}

pub(crate) fn count_in(n: usize) {
    BYTES_IN.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn count_out(n: usize) {
    BYTES_OUT.fetch_add(n as u64, Ordering::Relaxed);
}

/// The rank a 4-byte payload names (`ConnectMe`).
pub fn rank_of(payload: &[u8]) -> Option<usize> {
    payload
        .try_into()
        .ok()
        .map(|b| u32::from_le_bytes(b) as usize)
}

/// Most ranks a root admits (a sanity bound on the size a hello may claim).
pub const MAX_RANKS: usize = 1 << 20;

/// Largest payload accepted (allgather of connection handles stays far below).
pub const MAX_FRAME: usize = 64 << 20;
const HELLO_MAGIC: [u8; 8] = *b"CCLBOOT2";
const GATHER_MAGIC: [u8; 8] = *b"CCLGATH1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Hello = 1,
    Welcome = 2,
    Error = 3,
    /// Rank to rank: send me your block of step `k` of an allgather (a [`GatherAsk`]).
    Gather = 4,
    /// Rank to rank: the block asked for (a [`Block`]).
    Block = 5,
    Bye = 6,
    /// Rank to root: done with allgather rounds; keep the connection to watch the job.
    Monitor = 7,
    /// Rank to root: this rank failed (payload: a [`Notice`]).
    Failure = 8,
    /// Root to rank: another rank failed or died (payload: a [`Notice`]).
    Notice = 9,
    /// Rank to root: this rank revoked the communicator (no payload).
    Revoke = 20,
    /// Root to rank: the communicator was revoked, by the rank the [`Notice`] names.
    Revoked = 21,
    /// Rank to root: this rank asks to shrink the communicator (payload: a [`ShrinkRequest`]).
    Shrink = 22,
    /// Root to rank: the survivors and where their new communicator meets (a
    /// [`ShrinkDecision`]).
    Shrunk = 23,
    /// Rank to root: whether this rank's part of the shrunk communicator formed
    /// (`[u32 round][u8 ok]`).
    Formed = 24,
    /// Root to rank: whether every member's did, so the shrunk communicator may be used
    /// (`[u32 round][u8 commit]`); if not, the members ask again.
    Commit = 25,
    /// Rank to root: connect to rank `[u32 target]`, on its behalf; root to the target: the
    /// rank `[u32 asker]` needs its connection with you, which the lower rank of a pair makes
    /// (`CCL_CONNECT=lazy`).
    ConnectMe = 29,
    /// Root to rank: describe your state (payload: `[u32 query id]`).
    StateQuery = 10,
    /// Rank to root: `[u32 query id]` then a [`ccl_diag::verdict::encode`]d view.
    StateReply = 11,
    /// Rank to root: an operation runs late; send the verdict (payload: what to say first).
    VerdictRequest = 12,
    /// Root to rank: the answer to a [`FrameKind::VerdictRequest`] (payload: text).
    Verdict = 13,
    /// Root to rank: a failure report or verdict request arrived and is being worked on.
    Ack = 14,
    /// Live client to root: `[magic][secret]`, asking where the job is.
    Query = 15,
    /// Root to live client: the answer (payload: text).
    Report = 16,
    /// Root to rank, when the monitor is a tree: report through hub `[u32 rank]`, listening at
    /// `[addr]` (see `tree`).
    Attach = 30,
    /// Rank to root, on its first line, once it reports through its hub: nothing more comes
    /// this way (no payload).
    Moved = 31,
    /// Rank to hub, or an orphan to the root: `[secret][u32 rank]`, this line is that rank's
    /// monitor line.
    Join = 32,
    /// Towards the root: `[u32 origin]` and a frame of rank `origin`.
    Up = 33,
    /// Away from the root: `[u32 target, or u32::MAX for every rank]` and a frame for it.
    Down = 34,
    /// Hub to root, inside an [`FrameKind::Up`]: the origin's line to this hub closed.
    Gone = 35,
    /// Root to every rank, when the monitor is a tree: describe your subtree
    /// (`[u32 query id][u32 budget, ms]`); a hub asks its ranks with a smaller budget and
    /// answers within its own.
    DigestQuery = 36,
    /// Towards the root: `[u32 query id]` and a [`ccl_diag::digest::Digest`] (JSON) of the
    /// sender's view and of those of the ranks below it that answered in time.
    DigestReply = 37,
    /// Root to every rank: where the job's monitor moves if the root's process dies (a
    /// [`Standby`]).
    Standby = 38,
    /// A rank to a standby rank, once the root's line closed (a [`Rejoin`]): the root is gone,
    /// take over the monitor.
    Rejoin = 39,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::Welcome,
            3 => FrameKind::Error,
            4 => FrameKind::Gather,
            5 => FrameKind::Block,
            6 => FrameKind::Bye,
            7 => FrameKind::Monitor,
            8 => FrameKind::Failure,
            9 => FrameKind::Notice,
            20 => FrameKind::Revoke,
            21 => FrameKind::Revoked,
            22 => FrameKind::Shrink,
            23 => FrameKind::Shrunk,
            24 => FrameKind::Formed,
            25 => FrameKind::Commit,
            29 => FrameKind::ConnectMe,
            10 => FrameKind::StateQuery,
            11 => FrameKind::StateReply,
            12 => FrameKind::VerdictRequest,
            13 => FrameKind::Verdict,
            14 => FrameKind::Ack,
            15 => FrameKind::Query,
            16 => FrameKind::Report,
            30 => FrameKind::Attach,
            31 => FrameKind::Moved,
            32 => FrameKind::Join,
            33 => FrameKind::Up,
            34 => FrameKind::Down,
            35 => FrameKind::Gone,
            36 => FrameKind::DigestQuery,
            37 => FrameKind::DigestReply,
            38 => FrameKind::Standby,
            39 => FrameKind::Rejoin,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn new(kind: FrameKind, payload: Vec<u8>) -> Frame {
        Frame { kind, payload }
    }

    pub fn error(msg: &str) -> Frame {
        Frame::new(FrameKind::Error, msg.as_bytes().to_vec())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(5 + self.payload.len());
        b.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        b.push(self.kind as u8);
        b.extend_from_slice(&self.payload);
        b
    }
}

/// Parses the 5-byte frame header: payload length and kind.
pub fn decode_header(h: &[u8; 5]) -> Result<(usize, FrameKind)> {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len > MAX_FRAME {
        return Err(Error::remote(format!(
            "bootstrap frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"
        )));
    }
    let kind = FrameKind::from_u8(h[4])
        .ok_or_else(|| Error::remote(format!("unknown bootstrap frame kind {}", h[4])))?;
    Ok((len, kind))
}

pub fn read_frame(
    s: &mut TcpStream,
    deadline: Instant,
    what: &dyn Fn() -> String,
) -> Result<Frame> {
    let mut h = [0u8; 5];
    net::read_exact_by(s, &mut h, deadline, what)?;
    let (len, kind) = decode_header(&h).map_err(|e| e.context(what()))?;
    let mut payload = vec![0u8; len];
    net::read_exact_by(s, &mut payload, deadline, what)?;
    count_in(h.len() + len);
    Ok(Frame { kind, payload })
}

pub fn write_frame(s: &mut TcpStream, f: &Frame, deadline: Instant) -> Result<()> {
    let bytes = f.encode();
    net::write_all_by(s, &bytes, deadline, &|| {
        format!("sending bootstrap {:?}", f.kind)
    })?;
    count_out(bytes.len());
    Ok(())
}

/// A rank's first message to the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub secret: [u8; 32],
    pub rank: usize,
    pub size: usize,
    /// Where this rank listens for the others' allgather requests (none when alone).
    pub listen: Option<SocketAddr>,
}

impl Hello {
    pub fn encode(&self) -> Frame {
        let mut p = Vec::with_capacity(48 + 19);
        p.extend_from_slice(&HELLO_MAGIC);
        p.extend_from_slice(&self.secret);
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.extend_from_slice(&(self.size as u32).to_le_bytes());
        if let Some(a) = self.listen {
            p.extend_from_slice(&encode_addr(a));
        }
        Frame::new(FrameKind::Hello, p)
    }

    pub fn decode(f: &Frame) -> std::result::Result<Hello, String> {
        if f.kind != FrameKind::Hello {
            return Err(format!("expected a hello, got {:?}", f.kind));
        }
        let p = &f.payload;
        if p.len() < 48 || p[..8] != HELLO_MAGIC {
            return Err("not a ccl bootstrap hello (or one of another version)".into());
        }
        let listen = match &p[48..] {
            [] => None,
            a => Some(decode_addr(a).ok_or("a hello with a malformed listening address")?),
        };
        Ok(Hello {
            secret: p[8..40].try_into().expect("32 bytes"),
            rank: u32::from_le_bytes(p[40..44].try_into().expect("4 bytes")) as usize,
            size: u32::from_le_bytes(p[44..48].try_into().expect("4 bytes")) as usize,
            listen,
        })
    }
}

/// A rank's request to another for its block of one allgather step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatherAsk {
    pub secret: [u8; 32],
    pub rank: usize,
    pub round: u32,
    pub step: u32,
}

impl GatherAsk {
    pub fn encode(&self) -> Frame {
        let mut p = Vec::with_capacity(52);
        p.extend_from_slice(&GATHER_MAGIC);
        p.extend_from_slice(&self.secret);
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.extend_from_slice(&self.round.to_le_bytes());
        p.extend_from_slice(&self.step.to_le_bytes());
        Frame::new(FrameKind::Gather, p)
    }

    pub fn decode(f: &Frame) -> std::result::Result<GatherAsk, String> {
        let p = &f.payload;
        if f.kind != FrameKind::Gather || p.len() != 52 || p[..8] != GATHER_MAGIC {
            return Err(format!("not a ccl allgather request ({:?})", f.kind));
        }
        let u32_at = |o: usize| u32::from_le_bytes(p[o..o + 4].try_into().expect("4 bytes"));
        Ok(GatherAsk {
            secret: p[8..40].try_into().expect("32 bytes"),
            rank: u32_at(40) as usize,
            round: u32_at(44),
            step: u32_at(48),
        })
    }
}

/// One allgather step's answer: the records asked for and, while the steps go on, where the
/// asker's partner of the next step listens (the answering rank's own partner of this step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub next: Option<SocketAddr>,
    pub records: Vec<Vec<u8>>,
}

impl Block {
    pub fn encode(&self) -> Frame {
        let addr = self.next.map(encode_addr).unwrap_or_default();
        let mut p = vec![addr.len() as u8];
        p.extend_from_slice(&addr);
        p.extend_from_slice(&encode_blobs(&self.records));
        Frame::new(FrameKind::Block, p)
    }

    pub fn decode(p: &[u8]) -> Result<Block> {
        let bad = || Error::remote("malformed bootstrap allgather block");
        let (&n, rest) = p.split_first().ok_or_else(bad)?;
        let (addr, rest) = rest.split_at_checked(n as usize).ok_or_else(bad)?;
        let next = match addr {
            [] => None,
            a => Some(decode_addr(a).ok_or_else(bad)?),
        };
        Ok(Block {
            next,
            records: decode_blobs(rest)?,
        })
    }
}

/// Longest failure message carried (longer ones are cut).
pub const MAX_NOTICE: usize = 4096;

/// A rank's failure, as the monitor passes it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The rank that failed or died.
    pub rank: usize,
    /// It vanished without a word (process exit, kill) rather than reporting an error.
    pub died: bool,
    pub message: String,
    /// The monitor's verdict on the job (empty from a rank, or when it has none).
    pub verdict: String,
    /// The rank the verdict names first; in a rank's own report, the peer its error names.
    pub culprit: Option<usize>,
}

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

impl Notice {
    /// `[u32 rank][u8 died][u32 culprit or MAX][u16 message length][message][verdict]`.
    pub fn encode(&self, kind: FrameKind) -> Frame {
        let msg = cut(&self.message, MAX_NOTICE);
        let verdict = cut(&self.verdict, MAX_NOTICE);
        let mut p = Vec::with_capacity(11 + msg.len() + verdict.len());
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.push(u8::from(self.died));
        p.extend_from_slice(&self.culprit.map_or(u32::MAX, |c| c as u32).to_le_bytes());
        p.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        p.extend_from_slice(msg);
        p.extend_from_slice(verdict);
        Frame::new(kind, p)
    }

    pub fn decode(p: &[u8]) -> Result<Notice> {
        let bad = || Error::remote("malformed failure notice");
        if p.len() < 11 || p.len() > 11 + 2 * MAX_NOTICE || p[4] > 1 {
            return Err(bad());
        }
        let culprit = u32::from_le_bytes(p[5..9].try_into().expect("4 bytes"));
        let len = u16::from_le_bytes([p[9], p[10]]) as usize;
        if p.len() < 11 + len {
            return Err(bad());
        }
        Ok(Notice {
            rank: u32::from_le_bytes(p[..4].try_into().expect("4 bytes")) as usize,
            died: p[4] == 1,
            culprit: (culprit != u32::MAX).then_some(culprit as usize),
            message: String::from_utf8_lossy(&p[11..11 + len]).into_owned(),
            verdict: String::from_utf8_lossy(&p[11 + len..]).into_owned(),
        })
    }
}

/// Reads `[u32 n][u32 x n]` at `p[*off..]`, each below `limit`.
fn take_ranks(p: &[u8], off: &mut usize, limit: usize) -> Result<Vec<usize>> {
    let bad = || Error::remote("malformed shrink message");
    let word = |o: usize| -> Result<usize> {
        let b = p.get(o..o + 4).ok_or_else(bad)?;
        Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
    };
    let n = word(*off)?;
    if n > limit {
        return Err(bad());
    }
    *off += 4;
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let r = word(*off)?;
        if r >= limit {
            return Err(bad());
        }
        v.push(r);
        *off += 4;
    }
    Ok(v)
}

fn put_ranks(p: &mut Vec<u8>, ranks: &[usize]) {
    p.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
    for &r in ranks {
        p.extend_from_slice(&(r as u32).to_le_bytes());
    }
}

/// A rank's request to shrink: the shrink round it has seen decided (0 before any), and the
/// ranks it wants left out besides the dead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShrinkRequest {
    pub round: u32,
    pub exclude: Vec<usize>,
}

impl ShrinkRequest {
    /// `[u32 round][u32 n][u32 rank x n]`.
    pub fn encode(&self) -> Frame {
        let mut p = (self.round).to_le_bytes().to_vec();
        put_ranks(&mut p, &self.exclude);
        Frame::new(FrameKind::Shrink, p)
    }

    /// Ranks must be below `size`, the communicator's.
    pub fn decode(p: &[u8], size: usize) -> Result<ShrinkRequest> {
        let round = p
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| Error::remote("malformed shrink message"))?;
        let mut off = 4;
        let exclude = take_ranks(p, &mut off, size)?;
        if off != p.len() {
            return Err(Error::remote("malformed shrink message"));
        }
        Ok(ShrinkRequest { round, exclude })
    }
}

/// The root's answer to a shrink round: the members of the new communicator (old ranks, in
/// their new order) and the unique id of its rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShrinkDecision {
    pub round: u32,
    pub members: Vec<usize>,
    pub id: Vec<u8>,
}

impl ShrinkDecision {
    /// `[u32 round][u32 n][u32 rank x n][id]`.
    pub fn encode(&self) -> Frame {
        let mut p = (self.round).to_le_bytes().to_vec();
        put_ranks(&mut p, &self.members);
        p.extend_from_slice(&self.id);
        Frame::new(FrameKind::Shrunk, p)
    }

    pub fn decode(p: &[u8], size: usize) -> Result<ShrinkDecision> {
        let round = p
            .get(..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or_else(|| Error::remote("malformed shrink message"))?;
        let mut off = 4;
        let members = take_ranks(p, &mut off, size)?;
        Ok(ShrinkDecision {
            round,
            members,
            id: p[off..].to_vec(),
        })
    }
}

/// `[u32 round][u8 flag]`: a [`FrameKind::Formed`] or [`FrameKind::Commit`] frame.
pub fn round_flag(kind: FrameKind, round: u32, flag: bool) -> Frame {
    let mut p = round.to_le_bytes().to_vec();
    p.push(u8::from(flag));
    Frame::new(kind, p)
}

/// Reads a [`round_flag`] payload.
/// The round of a [`FrameKind::Commit`] that a monitor sends for a round its dead predecessor
/// decided.
pub const INHERITED: u32 = u32::MAX;

pub fn read_round_flag(p: &[u8]) -> Result<(u32, bool)> {
    match p {
        [a, b, c, d, f @ (0 | 1)] => Ok((u32::from_le_bytes([*a, *b, *c, *d]), *f == 1)),
        _ => Err(Error::remote("malformed shrink message")),
    }
}

/// Every rank, in a [`FrameKind::Down`].
pub const ALL: u32 = u32::MAX;

/// `frame` wrapped for the tree: `kind` is [`FrameKind::Up`] (`who` is its origin) or
/// [`FrameKind::Down`] (`who` is its target, or [`ALL`]).
pub fn envelope(kind: FrameKind, who: u32, frame: &Frame) -> Frame {
    let mut p = Vec::with_capacity(9 + frame.payload.len());
    p.extend_from_slice(&who.to_le_bytes());
    p.extend_from_slice(&frame.encode());
    Frame::new(kind, p)
}

/// The rank and the frame inside an [`envelope`].
pub fn open_envelope(p: &[u8]) -> Result<(u32, Frame)> {
    let bad = || Error::remote("malformed monitor envelope");
    let (who, rest) = p.split_first_chunk::<4>().ok_or_else(bad)?;
    let (h, body) = rest.split_first_chunk::<5>().ok_or_else(bad)?;
    let (len, kind) = decode_header(h)?;
    if body.len() != len {
        return Err(bad());
    }
    Ok((u32::from_le_bytes(*who), Frame::new(kind, body.to_vec())))
}

/// How much sooner than its own a hub's ranks must answer a digest query (their answers still
/// have to travel, and be merged, before the hub's budget ends).
pub(crate) const HOP: std::time::Duration = std::time::Duration::from_millis(100);

/// A [`FrameKind::DigestQuery`]: query `id`, to be answered within `budget`.
pub fn digest_query(id: u32, budget: std::time::Duration) -> Frame {
    let mut p = id.to_le_bytes().to_vec();
    p.extend_from_slice(&(budget.as_millis().min(u32::MAX as u128) as u32).to_le_bytes());
    Frame::new(FrameKind::DigestQuery, p)
}

/// Reads [`digest_query`]'s payload: the query id and the budget.
pub fn read_digest_query(p: &[u8]) -> Option<(u32, std::time::Duration)> {
    let id = u32::from_le_bytes(p.get(..4)?.try_into().ok()?);
    let ms = u32::from_le_bytes(p.get(4..8)?.try_into().ok()?);
    Some((id, std::time::Duration::from_millis(ms.into())))
}

/// A [`FrameKind::DigestReply`] to query `id`.
pub fn digest_reply(id: u32, d: &ccl_diag::digest::Digest) -> Frame {
    let mut p = id.to_le_bytes().to_vec();
    p.extend(d.encode());
    Frame::new(FrameKind::DigestReply, p)
}

/// Reads [`digest_reply`]'s payload; a bad one is an error, never a panic.
pub fn read_digest_reply(p: &[u8]) -> std::result::Result<(u32, ccl_diag::digest::Digest), String> {
    let id = p
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or("a digest reply without its query id")?;
    Ok((id, ccl_diag::digest::Digest::decode(&p[4..])?))
}

/// What a rank says of itself when it asks to be watched ([`FrameKind::Monitor`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watchme {
    pub pid: u32,
    /// The monitor tree's fan-out this rank was configured with (`CCL_MONITOR_FANOUT`).
    pub fanout: u32,
    /// Where this rank takes its children's lines, if it is a hub.
    pub listen: Option<SocketAddr>,
    pub host: String,
}

impl Watchme {
    /// `[u32 pid][u32 fanout][u8 addr length][addr][host]`.
    pub fn encode(&self) -> Frame {
        let mut p = self.pid.to_le_bytes().to_vec();
        p.extend_from_slice(&self.fanout.to_le_bytes());
        let a = self.listen.map(encode_addr).unwrap_or_default();
        p.push(a.len() as u8);
        p.extend_from_slice(&a);
        p.extend_from_slice(self.host.as_bytes());
        Frame::new(FrameKind::Monitor, p)
    }

    pub fn decode(p: &[u8]) -> Result<Watchme> {
        let bad = || Error::remote("malformed monitor request");
        let (pid, rest) = p.split_first_chunk::<4>().ok_or_else(bad)?;
        let (fanout, rest) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
        let (&alen, rest) = rest.split_first().ok_or_else(bad)?;
        let a = rest.get(..alen as usize).ok_or_else(bad)?;
        let listen = match alen {
            0 => None,
            _ => Some(decode_addr(a).ok_or_else(bad)?),
        };
        Ok(Watchme {
            pid: u32::from_le_bytes(*pid),
            fanout: u32::from_le_bytes(*fanout),
            listen,
            host: String::from_utf8_lossy(&rest[alen as usize..]).into_owned(),
        })
    }
}

/// `[u32 rank][addr]`: an [`FrameKind::Attach`] to the hub `rank` at `addr`.
pub fn attach(hub: usize, addr: SocketAddr) -> Frame {
    let mut p = (hub as u32).to_le_bytes().to_vec();
    p.extend_from_slice(&encode_addr(addr));
    Frame::new(FrameKind::Attach, p)
}

/// Reads an [`attach`] payload.
pub fn read_attach(p: &[u8]) -> Option<(usize, SocketAddr)> {
    let (hub, a) = p.split_first_chunk::<4>()?;
    Some((u32::from_le_bytes(*hub) as usize, decode_addr(a)?))
}

/// A [`FrameKind::Join`]: `[secret][u32 rank]`.
pub fn join(secret: &[u8; 32], rank: usize) -> Frame {
    let mut p = secret.to_vec();
    p.extend_from_slice(&(rank as u32).to_le_bytes());
    Frame::new(FrameKind::Join, p)
}

/// The secret and rank of a [`join`] frame.
pub fn read_join(f: &Frame) -> Option<([u8; 32], usize)> {
    if f.kind != FrameKind::Join || f.payload.len() != 36 {
        return None;
    }
    let secret = f.payload[..32].try_into().ok()?;
    Some((secret, rank_of(&f.payload[32..])?))
}

/// Where the job's monitor goes when the root's process dies: the ranks that take it over, in
/// order, and the ranks that die with the root (they run in its process).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Standby {
    /// Ranks outside the root's process that listen for the others, lowest first, and where.
    pub ranks: Vec<(usize, SocketAddr)>,
    pub with_root: Vec<usize>,
    /// Those of `with_root` that said goodbye: the process ending after them is no death.
    pub left: Vec<usize>,
}

impl Standby {
    /// `[u32 k]` then per rank `[u32 rank][u8 addr length][addr]`, then `with_root` and `left`
    /// as `[u32 m][u32 rank]*m`.
    pub fn encode(&self) -> Frame {
        let mut p = (self.ranks.len() as u32).to_le_bytes().to_vec();
        for (r, a) in &self.ranks {
            let a = encode_addr(*a);
            p.extend_from_slice(&(*r as u32).to_le_bytes());
            p.push(a.len() as u8);
            p.extend_from_slice(&a);
        }
        put_ranks(&mut p, &self.with_root);
        put_ranks(&mut p, &self.left);
        Frame::new(FrameKind::Standby, p)
    }

    /// Reads [`Standby::encode`]'s payload; ranks must be below `size`.
    pub fn decode(p: &[u8], size: usize) -> Result<Standby> {
        let bad = || Error::remote("malformed standby list");
        let (k, mut rest) = p.split_first_chunk::<4>().ok_or_else(bad)?;
        let k = u32::from_le_bytes(*k) as usize;
        if k > size {
            return Err(bad());
        }
        let mut ranks = Vec::with_capacity(k);
        for _ in 0..k {
            let (r, more) = rest.split_first_chunk::<4>().ok_or_else(bad)?;
            let (&alen, more) = more.split_first().ok_or_else(bad)?;
            let a = more.get(..alen as usize).ok_or_else(bad)?;
            let r = u32::from_le_bytes(*r) as usize;
            if r >= size {
                return Err(bad());
            }
            ranks.push((r, decode_addr(a).ok_or_else(bad)?));
            rest = &more[alen as usize..];
        }
        let mut off = 0;
        let with_root = take_ranks(rest, &mut off, size).map_err(|_| bad())?;
        let left = take_ranks(rest, &mut off, size).map_err(|_| bad())?;
        if off != rest.len() {
            return Err(bad());
        }
        Ok(Standby {
            ranks,
            with_root,
            left,
        })
    }
}

/// A rank joining the standby that takes over the monitor after the root's process died.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejoin {
    pub secret: [u8; 32],
    pub rank: usize,
    pub pid: u32,
    /// Ranks this rank knows died (the root told it, or they ran in the root's process).
    pub dead: Vec<usize>,
    /// The last shrink round the monitor that died decided for this rank, if any.
    pub round: Option<Outcome>,
    pub host: String,
}

/// A rank's part in a shrink round: the new communicator's unique id and members, and whether
/// the monitor said to use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub id: Vec<u8>,
    pub members: Vec<usize>,
    pub committed: bool,
}

impl Rejoin {
    /// `[secret][u32 rank][u32 pid][u32 n][u32 rank]*n`, then `[u8 0]` or `[u8 1][u32 id
    /// length][id][u8 committed][u32 m][u32 rank]*m`, then `[host]`.
    pub fn encode(&self) -> Frame {
        let mut p = self.secret.to_vec();
        p.extend_from_slice(&(self.rank as u32).to_le_bytes());
        p.extend_from_slice(&self.pid.to_le_bytes());
        put_ranks(&mut p, &self.dead);
        match &self.round {
            None => p.push(0),
            Some(o) => {
                p.push(1);
                p.extend_from_slice(&(o.id.len() as u32).to_le_bytes());
                p.extend_from_slice(&o.id);
                p.push(u8::from(o.committed));
                put_ranks(&mut p, &o.members);
            }
        }
        p.extend_from_slice(self.host.as_bytes());
        Frame::new(FrameKind::Rejoin, p)
    }

    /// Reads a [`Rejoin::encode`]d frame; `None` for anything else.
    pub fn decode(f: &Frame) -> Option<Rejoin> {
        if f.kind != FrameKind::Rejoin {
            return None;
        }
        let (secret, rest) = f.payload.split_first_chunk::<32>()?;
        let (rank, rest) = rest.split_first_chunk::<4>()?;
        let (pid, rest) = rest.split_first_chunk::<4>()?;
        let mut off = 0;
        let dead = take_ranks(rest, &mut off, MAX_RANKS).ok()?;
        let round = match *rest.get(off)? {
            0 => {
                off += 1;
                None
            }
            1 => {
                let len = u32::from_le_bytes(rest.get(off + 1..off + 5)?.try_into().ok()?);
                let len = usize::try_from(len).ok().filter(|&l| l <= 4096)?;
                off += 5;
                let id = rest.get(off..off + len)?.to_vec();
                off += len;
                let committed = match *rest.get(off)? {
                    0 => false,
                    1 => true,
                    _ => return None,
                };
                off += 1;
                let members = take_ranks(rest, &mut off, MAX_RANKS).ok()?;
                Some(Outcome {
                    id,
                    members,
                    committed,
                })
            }
            _ => return None,
        };
        Some(Rejoin {
            secret: *secret,
            rank: u32::from_le_bytes(*rank) as usize,
            pid: u32::from_le_bytes(*pid),
            dead,
            round,
            host: String::from_utf8_lossy(&rest[off..]).into_owned(),
        })
    }
}

const QUERY_MAGIC: [u8; 8] = *b"CCLLIVE1";

/// A live client's request: `[magic][secret]`.
pub fn query(secret: &[u8; 32]) -> Frame {
    let mut p = QUERY_MAGIC.to_vec();
    p.extend_from_slice(secret);
    Frame::new(FrameKind::Query, p)
}

/// The secret a live client's request presents, if it is one.
pub fn query_secret(f: &Frame) -> Option<[u8; 32]> {
    (f.kind == FrameKind::Query && f.payload.len() == 40 && f.payload[..8] == QUERY_MAGIC)
        .then(|| f.payload[8..].try_into().expect("32 bytes"))
}

/// Reads what has arrived on the non-blocking `stream` into `buf` and splits off its complete
/// frames; also whether the stream ended (or sent bytes that are no frame: treated as ended).
pub fn read_ready(stream: &TcpStream, buf: &mut Vec<u8>) -> (Vec<Frame>, bool) {
    use std::io::Read;
    let mut chunk = [0u8; 4096];
    let closed = loop {
        match (&*stream).read(&mut chunk) {
            Ok(0) => break true,
            Ok(k) => {
                count_in(k);
                buf.extend_from_slice(&chunk[..k])
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    match take_frames(buf) {
        Ok(f) => (f, closed),
        Err(_) => (Vec::new(), true),
    }
}

/// Splits the complete frames off the front of `buf` (a non-blocking reader's accumulator).
pub fn take_frames(buf: &mut Vec<u8>) -> Result<Vec<Frame>> {
    let mut out = Vec::new();
    let mut off = 0;
    while buf.len() - off >= 5 {
        let h: [u8; 5] = buf[off..off + 5].try_into().expect("5 bytes");
        let (len, kind) = decode_header(&h)?;
        if buf.len() - off - 5 < len {
            break;
        }
        out.push(Frame::new(kind, buf[off + 5..off + 5 + len].to_vec()));
        off += 5 + len;
    }
    buf.drain(..off);
    Ok(out)
}

/// `[u32 count]` then per blob `[u32 len][bytes]`.
pub fn encode_blobs(blobs: &[Vec<u8>]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + blobs.iter().map(|x| 4 + x.len()).sum::<usize>());
    b.extend_from_slice(&(blobs.len() as u32).to_le_bytes());
    for x in blobs {
        b.extend_from_slice(&(x.len() as u32).to_le_bytes());
        b.extend_from_slice(x);
    }
    b
}

pub fn decode_blobs(p: &[u8]) -> Result<Vec<Vec<u8>>> {
    Ok(blob_slices(p)?.into_iter().map(<[u8]>::to_vec).collect())
}

/// The blobs of [`encode_blobs`] as slices of `p`, copying nothing: every rank decodes every
/// rank's record at set-up, so a copy per field is N of them per rank.
pub fn blob_slices(p: &[u8]) -> Result<Vec<&[u8]>> {
    let bad = || Error::remote("malformed bootstrap allgather reply");
    let mut off = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let end = off
            .checked_add(n)
            .filter(|&e| e <= p.len())
            .ok_or_else(bad)?;
        let s = &p[off..end];
        off = end;
        Ok(s)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
    // Each blob needs at least its 4-byte length: bound the count before allocating.
    if count > p.len() / 4 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let n = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        out.push(take(n)?);
    }
    if off != p.len() {
        return Err(bad());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_tree_frames_round_trip() {
        let inner = Frame::new(FrameKind::StateReply, vec![1, 2, 3]);
        for kind in [FrameKind::Up, FrameKind::Down] {
            let e = envelope(kind, 77, &inner);
            assert_eq!(e.kind, kind);
            assert_eq!(open_envelope(&e.payload).unwrap(), (77, inner.clone()));
            // Cut anywhere, or with bytes after it, it is an error, never a panic.
            for cut in 0..e.payload.len() {
                assert!(open_envelope(&e.payload[..cut]).is_err());
            }
            let mut long = e.payload.clone();
            long.push(0);
            assert!(open_envelope(&long).is_err());
        }
        let w = Watchme {
            pid: 42,
            fanout: 64,
            listen: Some("10.0.0.9:1234".parse().unwrap()),
            host: "node-3".into(),
        };
        let f = w.encode();
        assert_eq!(Watchme::decode(&f.payload).unwrap(), w);
        let leaf = Watchme { listen: None, ..w };
        assert_eq!(Watchme::decode(&leaf.encode().payload).unwrap(), leaf);
        for cut in 0..9 {
            assert!(Watchme::decode(&f.payload[..cut]).is_err());
        }
        let a = attach(5, "[::1]:99".parse().unwrap());
        assert_eq!(
            read_attach(&a.payload),
            Some((5, "[::1]:99".parse().unwrap()))
        );
        assert_eq!(read_attach(&a.payload[..3]), None);
        let j = join(&[3; 32], 9);
        assert_eq!(read_join(&j), Some(([3; 32], 9)));
        assert_eq!(read_join(&Frame::new(FrameKind::Join, vec![0; 35])), None);
        let q = digest_query(7, std::time::Duration::from_millis(900));
        assert_eq!(
            read_digest_query(&q.payload),
            Some((7, std::time::Duration::from_millis(900)))
        );
        assert_eq!(read_digest_query(&q.payload[..7]), None);
        let view =
            ccl_diag::verdict::RankView::absent(4, "h", 1, ccl_diag::verdict::Presence::Dead);
        let d = ccl_diag::digest::Digest::of(&[view]);
        let r = digest_reply(7, &d);
        assert_eq!(read_digest_reply(&r.payload), Ok((7, d)));
        for cut in 0..r.payload.len() {
            assert!(
                read_digest_reply(&r.payload[..cut]).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn failover_frames_round_trip() {
        let s = Standby {
            ranks: vec![
                (1, "10.0.0.2:4000".parse().unwrap()),
                (5, "[::1]:7".parse().unwrap()),
            ],
            with_root: vec![0, 2],
            left: vec![2],
        };
        let f = s.encode();
        assert_eq!(Standby::decode(&f.payload, 6).unwrap(), s);
        // A rank beyond the job, a cut or a trailing byte is an error, never a panic.
        assert!(Standby::decode(&f.payload, 5).is_err());
        for cut in 0..f.payload.len() {
            assert!(
                Standby::decode(&f.payload[..cut], 6).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = f.payload.clone();
        long.push(0);
        assert!(Standby::decode(&long, 6).is_err());
        let j = Rejoin {
            secret: [7; 32],
            rank: 3,
            pid: 99,
            dead: vec![0, 4],
            round: None,
            host: "node-1".into(),
        };
        let f = j.encode();
        assert_eq!(Rejoin::decode(&f), Some(j.clone()));
        let k = Rejoin {
            round: Some(Outcome {
                id: vec![9; 128],
                members: vec![1, 3, 5],
                committed: true,
            }),
            ..j
        };
        let g = k.encode();
        assert_eq!(Rejoin::decode(&g), Some(k));
        // Cut anywhere before the host name, it is no frame.
        for cut in 0..g.payload.len() - "node-1".len() {
            let h = Frame::new(FrameKind::Rejoin, g.payload[..cut].to_vec());
            assert_eq!(Rejoin::decode(&h), None, "cut at {cut}");
        }
        for cut in 0..44 {
            let g = Frame::new(FrameKind::Rejoin, f.payload[..cut].to_vec());
            assert_eq!(Rejoin::decode(&g), None, "cut at {cut}");
        }
        assert_eq!(
            Rejoin::decode(&Frame::new(FrameKind::Join, f.payload)),
            None
        );
    }

    #[test]
    fn blobs_round_trip() {
        let b = vec![vec![], vec![1, 2, 3], vec![9; 1000]];
        assert_eq!(decode_blobs(&encode_blobs(&b)).unwrap(), b);
    }

    #[test]
    fn hello_round_trip() {
        let h = Hello {
            secret: [5; 32],
            rank: 3,
            size: 8,
            listen: Some("10.1.2.3:4567".parse().unwrap()),
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let alone = Hello {
            listen: None,
            ..h.clone()
        };
        assert_eq!(Hello::decode(&alone.encode()).unwrap(), alone);
        let mut f = h.encode();
        f.payload[0] = b'X';
        assert!(Hello::decode(&f).is_err());
        f.payload.truncate(10);
        assert!(Hello::decode(&f).is_err());
    }

    #[test]
    fn gather_frames_round_trip() {
        let a = GatherAsk {
            secret: [7; 32],
            rank: 1000,
            round: 2,
            step: 9,
        };
        assert_eq!(GatherAsk::decode(&a.encode()).unwrap(), a);
        let mut f = a.encode();
        f.payload[3] ^= 1;
        assert!(GatherAsk::decode(&f).is_err());
        for next in [None, Some("[fe80::1]:9".parse().unwrap())] {
            let b = Block {
                next,
                records: vec![vec![1, 2], vec![]],
            };
            assert_eq!(Block::decode(&b.encode().payload).unwrap(), b);
        }
        assert!(Block::decode(&[]).is_err());
        assert!(Block::decode(&[7, 4, 0]).is_err());
    }

    #[test]
    fn notices_round_trip_and_frames_split() {
        let n = Notice {
            rank: 7,
            died: true,
            message: "gone".into(),
            verdict: "allreduce #3 is stuck behind rank 7".into(),
            culprit: Some(7),
        };
        let f = n.encode(FrameKind::Notice);
        assert_eq!(Notice::decode(&f.payload).unwrap(), n);
        let long = Notice {
            rank: 1,
            died: false,
            message: "é".repeat(3000),
            verdict: String::new(),
            culprit: None,
        };
        let d = Notice::decode(&long.encode(FrameKind::Failure).payload).unwrap();
        assert!(d.message.len() <= MAX_NOTICE && d.message.chars().all(|c| c == 'é'));
        // Two frames and half of a third arrive together.
        let mut buf = f.encode();
        buf.extend(Frame::new(FrameKind::Bye, vec![]).encode());
        let third = f.encode();
        buf.extend_from_slice(&third[..4]);
        let got = take_frames(&mut buf).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(buf.len(), 4);
        buf.extend_from_slice(&third[4..]);
        assert_eq!(take_frames(&mut buf).unwrap(), vec![f]);
        assert!(buf.is_empty());
        assert!(Notice::decode(&[1, 0, 0, 0, 9]).is_err());
    }

    #[test]
    fn headers_are_bounded() {
        assert!(decode_header(&[0xff, 0xff, 0xff, 0xff, 4]).is_err());
        assert!(decode_header(&[1, 0, 0, 0, 99]).is_err());
        assert_eq!(
            decode_header(&[3, 0, 0, 0, 4]).unwrap(),
            (3, FrameKind::Gather)
        );
    }

    /// A deterministic generator of hostile inputs: every decoder returns an error or a value,
    /// never panics, and never allocates beyond the input size.
    #[test]
    fn decoders_survive_garbage() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = encode_blobs(&[vec![1; 10], vec![2; 3]]);
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let mut v: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode_blobs(&v);
            let _ = Hello::decode(&Frame::new(FrameKind::Hello, v.clone()));
            let _ = GatherAsk::decode(&Frame::new(FrameKind::Gather, v.clone()));
            let _ = Block::decode(&v);
            if v.len() >= 5 {
                let _ = decode_header(&v[..5].try_into().unwrap());
            }
            // Mutations of a valid message.
            v = good.clone();
            let i = (next() as usize) % v.len();
            v[i] = next() as u8;
            let _ = decode_blobs(&v);
            let cut = (next() as usize) % v.len();
            let _ = decode_blobs(&v[..cut]);
            let _ = Notice::decode(&v);
            let mut acc = v.clone();
            let _ = take_frames(&mut acc);
        }
    }
}
