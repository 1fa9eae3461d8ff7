//! The job monitor's frames: failure notices, the shrink agreement, the monitor tree's
//! envelopes, digests, requests to be watched and moves to a hub, the standbys and a rank's
//! rejoin after the root's process died, and a live client's query.

use std::net::SocketAddr;

use ccl_core::error::{Error, Result};
use ccl_core::transport::{decode_addr, encode_addr};

use super::codec::{Frame, FrameKind, decode_header};
use super::rendezvous::MAX_RANKS;

/// The rank a 4-byte payload names (`ConnectMe`).
pub fn rank_of(payload: &[u8]) -> Option<usize> {
    payload
        .try_into()
        .ok()
        .map(|b| u32::from_le_bytes(b) as usize)
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

/// The round of a [`FrameKind::Commit`] that a monitor sends for a round its dead predecessor
/// decided.
pub const INHERITED: u32 = u32::MAX;

/// Reads a [`round_flag`] payload.
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

pub(crate) use crate::timing::HOP;

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
