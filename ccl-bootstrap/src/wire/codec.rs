//! The codec: a frame's header and kinds, reading and writing frames (blocking with a deadline,
//! or what a non-blocking line has ready), the blob lists that allgather records travel in, and
//! the count of the bytes that went each way.

use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ccl_core::error::{Error, Result};
use ccl_core::net;

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

/// Largest payload accepted (allgather of connection handles stays far below).
pub const MAX_FRAME: usize = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Hello = 1,
    Welcome = 2,
    Error = 3,
    /// Rank to rank: send me your block of step `k` of an allgather (a
    /// [`GatherAsk`](super::GatherAsk)).
    Gather = 4,
    /// Rank to rank: the block asked for (a [`Block`](super::Block)).
    Block = 5,
    Bye = 6,
    /// Rank to root: done with allgather rounds; keep the connection to watch the job.
    Monitor = 7,
    /// Rank to root: this rank failed (payload: a [`Notice`](super::Notice)).
    Failure = 8,
    /// Root to rank: another rank failed or died (payload: a [`Notice`](super::Notice)).
    Notice = 9,
    /// Rank to root: this rank revoked the communicator (no payload).
    Revoke = 20,
    /// Root to rank: the communicator was revoked, by the rank the [`Notice`](super::Notice) names.
    Revoked = 21,
    /// Rank to root: this rank asks to shrink the communicator (payload: a
    /// [`ShrinkRequest`](super::ShrinkRequest)).
    Shrink = 22,
    /// Root to rank: the survivors and where their new communicator meets (a
    /// [`ShrinkDecision`](super::ShrinkDecision)).
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
    /// [`Standby`](super::Standby)).
    Standby = 38,
    /// A rank to a standby rank, once the root's line closed (a [`Rejoin`](super::Rejoin)): the
    /// root is gone, take over the monitor.
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
