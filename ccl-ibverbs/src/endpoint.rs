//! One connection to a peer: receiver-driven flow control over pre-registered staging slots.
//!
//! Per direction there is a ring of `S` slots of `B` bytes, registered once. The receiver's ring
//! is the target of the sender's RDMA writes:
//!
//! - **Send.** `send` copies up to `B` bytes of the caller's data into local slot `seq % S` and
//!   posts one RDMA WRITE_WITH_IMM into the peer's slot `seq % S`; the immediate value carries
//!   the slot index and the length. Pieces go round-robin over the data QPs, the rotation
//!   carrying on from one call to the next; with `CCL_IB_SPLIT_DATA_ON_QPS=1` a call's bytes are
//!   cut into one piece per data QP instead ([`piece_size`]). A slot may be written only while
//!   the sender holds a credit for it (clear to send) and its previous write has completed
//!   locally, so bytes in flight never exceed `S x B`.
//! - **Receive.** Every data QP keeps a receive posted for each write that can be in flight. A
//!   completion marks its slot arrived; slots are delivered strictly in sequence order (writes on
//!   different QPs may complete out of order). `recv` copies out; `recv_with` lends the slot's
//!   bytes in place (a partial element at the end of a slot is joined with the next slot's bytes
//!   in a small carry buffer).
//! - **Zero copy.** `send_registered` posts the same writes into the same slots, but from the
//!   caller's registered memory ([`UserMr`]) instead of a local staging slot: the receiver
//!   cannot tell the difference, and the sender copies nothing. Bytes count as taken only once
//!   their write completed (the device reads the caller's memory until then), so the caller
//!   calls again from the first byte not taken.
//! - **Grants (zero-copy receive).** `recv_registered` into the caller's registered memory
//!   ([`UserMr`], registered for remote write) sends the peer a [`Grant`] on the control QP: the
//!   bytes of the stream from offset `o` (the bytes delivered so far) to `o + len` may go straight
//!   to the caller's range. The sender may already have written some of them into the ring when
//!   the grant arrives; it writes the rest of the range, from its own stream position on,
//!   directly, with WRITE_WITH_IMM whose immediate value names the next slot (taken under the
//!   same credits, so pieces stay in one sequence across all data QPs) and [`DIRECT_LEN`]. The
//!   receiver delivers pieces in sequence as always: ring pieces are copied into the range, a
//!   direct piece is already in place at `range + (stream position - o)` and only advances the
//!   stream (and frees its slot's credit). One grant per direction is in force at a time; the
//!   receiver sends the next only when every byte of the last was delivered.
//! - **Credits.** When slots have been consumed, the receiver returns the cumulative count of
//!   freed slots in the immediate value of a zero-length SEND on the control QP (its own traffic
//!   class, `CCL_IB_CTRL_TC`).
//! - **Waiting.** Calls never block. `prepare_wait` polls the CQ, arms it, and polls again (no
//!   lost wakeup), then the executor sleeps on the completion channel's fd and on the TCP side
//!   socket, which stays open as a liveness channel: a peer that dies is seen as EOF on it even
//!   when no work request of ours is outstanding that could fail.
//!
//! The data path allocates nothing: slot tables, the completion buffer and the carry are sized
//! when the connection is made.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use ccl_core::transport::{ConnectContext, Endpoint, Interest, MemRegion};
use ccl_core::{Error, Result};
use nix::poll::PollFlags;

use crate::LOG_SUBSYS;
use crate::cq::{Completion, POLL_BATCH};
use crate::mr::UserMr;
use crate::qp::{POST_BATCH, WriteImm};
use crate::resources::{
    CTRL_RECV, CTRL_SEND, DATA_RECV, DATA_SEND, KIND_SHIFT, Layout, Resources, wr_id,
};
use crate::wc::wc_error;
use crate::wire::{DIRECT_LEN, GRANT_LEN, Grant, decode_imm, encode_imm};

/// Bytes a carry buffer holds: more than two of the largest element.
const CARRY_CAP: usize = 64;
/// How long a dropped endpoint waits for its writes to be acknowledged, so bytes `send` took
/// reach the peer even when the program exits right after a collective.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// The smallest piece split mode cuts, so a small send does not become many tiny writes (each
/// costs a work request, a completion and a credit whatever its size).
const MIN_SPLIT_PIECE: usize = 4096;
/// Receives smaller than this are not granted: one more control message and its round trip
/// would cost about what the copy out of the ring saves.
const GRANT_MIN: usize = 16 << 10;
/// The largest range one grant covers (its length is 32 bits on the wire); a longer receive is
/// granted again once the first range is in.
const GRANT_MAX: usize = 1 << 30;

/// Bytes moved by every verbs connection of the process so far, added when a connection closes
/// (the figures of its closing trace line): how many were copied and how many were not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Sent from the caller's registered memory (no copy on the sender).
    pub sent_zero_copy: u64,
    /// Sent through local staging slots (one copy on the sender).
    pub sent_staged: u64,
    /// Of all bytes sent, those written into a range the peer granted (no copy on the receiver).
    pub sent_into_grants: u64,
    /// Received straight into the caller's registered memory (no copy on the receiver).
    pub received_in_place: u64,
    /// Received through the staging ring (copied or reduced out of it).
    pub received_staged: u64,
}

static TOTALS: [std::sync::atomic::AtomicU64; 5] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 5];

/// What every verbs connection of this process that has closed moved ([`Traffic`]).
pub fn traffic() -> Traffic {
    let t = |i: usize| TOTALS[i].load(std::sync::atomic::Ordering::Relaxed);
    Traffic {
        sent_zero_copy: t(0),
        sent_staged: t(1),
        sent_into_grants: t(2),
        received_in_place: t(3),
        received_staged: t(4),
    }
}

/// Split pieces are multiples of this, so a piece ends on an element boundary whenever the send
/// began on one.
const SPLIT_ALIGN: usize = 64;

/// The largest piece a `send` of `len` bytes stages per RDMA write: a slot (`slot_size`), or
/// with `split` an even share of `len` for each of the `nqp` data QPs, rounded up to
/// [`SPLIT_ALIGN`] and kept between [`MIN_SPLIT_PIECE`] and a slot. Split mode spreads even a
/// message smaller than a slot over every QP (every path of the fabric) at the price of smaller
/// writes, and so fewer bytes in flight (`slots x piece`).
pub(crate) fn piece_size(len: usize, nqp: usize, slot_size: usize, split: bool) -> usize {
    if !split || nqp <= 1 {
        return slot_size;
    }
    let share = len.div_ceil(nqp).next_multiple_of(SPLIT_ALIGN);
    share.clamp(MIN_SPLIT_PIECE.min(slot_size), slot_size)
}

/// Where the peer's receive ring is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Remote {
    pub ring_addr: u64,
    pub rkey: u32,
}

pub(crate) struct IbEndpoint {
    peer: usize,
    rank: usize,
    layout: Layout,
    res: Resources,
    remote: Remote,
    /// The authenticated TCP connection used to exchange QP information, kept as a liveness
    /// channel.
    side: Box<dyn Endpoint>,
    /// How long to wait for a control-queue slot before failing.
    timeout: Duration,
    /// `CCL_IB_SPLIT_DATA_ON_QPS`.
    split: bool,

    // Sender.
    /// Pieces posted so far.
    send_seq: u64,
    /// Slots the peer has granted in total beyond the initial `S` (cumulative credits).
    granted: u64,
    /// Last cumulative credit value seen (wrapping u32 on the wire).
    last_credit_imm: u32,
    /// Local slot still being read by the device (its write has not completed).
    send_busy: Box<[bool]>,
    send_outstanding: usize,
    next_qp: usize,
    /// Zero-copy pieces: bytes of the piece written from each slot index (0 = staged, or free),
    /// and whether its write completed.
    zc_len: Box<[u32]>,
    zc_acked: Box<[bool]>,
    /// Address of the first caller byte posted zero-copy and not yet reported taken, the bytes
    /// posted from it, and the sequence number of its piece.
    zc_start: usize,
    zc_posted: usize,
    zc_seq: u64,
    /// Stream bytes posted so far.
    send_pos: u64,
    /// The peer's grant in force, until the stream passes its end.
    grant: Option<Grant>,
    /// What this connection moved, for the trace line at teardown and [`traffic`].
    traffic: Traffic,

    // Receiver.
    /// Next piece to deliver.
    recv_seq: u64,
    /// Stream bytes delivered to the caller so far.
    recv_pos: u64,
    /// The grant this side sent and whose bytes have not all been delivered.
    my_grant: Option<Grant>,
    /// Bytes that arrived in each slot (`NONE` = not arrived).
    arrived: Box<[u32]>,
    /// Whether the piece of each slot went into the granted range instead of the slot.
    direct: Box<[bool]>,
    /// Bytes of the head slot already delivered.
    head_off: usize,
    /// Slots freed in total (wrapping), and the value last sent to the peer.
    freed: u32,
    credit_sent: u32,
    ctrl_outstanding: usize,
    carry: [u8; CARRY_CAP],
    carry_len: usize,

    armed: bool,
    /// Requests staged by one `send` call (one per slot at most).
    pending: Box<[WriteImm]>,
}

const NONE: u32 = u32::MAX;

impl IbEndpoint {
    /// The endpoint of a connection to `peer` whose QPs are ready to send (RTS) and whose side
    /// channel is `side`.
    pub(crate) fn new(
        ctx: &ConnectContext,
        peer: usize,
        side: Box<dyn Endpoint>,
        layout: Layout,
        res: Resources,
        remote: Remote,
    ) -> IbEndpoint {
        IbEndpoint {
            peer,
            rank: ctx.rank,
            layout,
            res,
            remote,
            side,
            timeout: ctx.config.timeout,
            split: ctx.config.ib.split_data_on_qps,
            send_seq: 0,
            granted: 0,
            last_credit_imm: 0,
            send_busy: vec![false; layout.slots].into_boxed_slice(),
            send_outstanding: 0,
            next_qp: 0,
            zc_len: vec![0; layout.slots].into_boxed_slice(),
            zc_acked: vec![false; layout.slots].into_boxed_slice(),
            zc_start: 0,
            zc_posted: 0,
            zc_seq: 0,
            send_pos: 0,
            grant: None,
            traffic: Traffic::default(),
            recv_seq: 0,
            recv_pos: 0,
            my_grant: None,
            arrived: vec![NONE; layout.slots].into_boxed_slice(),
            direct: vec![false; layout.slots].into_boxed_slice(),
            head_off: 0,
            freed: 0,
            credit_sent: 0,
            ctrl_outstanding: 0,
            carry: [0; CARRY_CAP],
            carry_len: 0,
            armed: false,
            pending: vec![WriteImm::default(); layout.slots].into_boxed_slice(),
        }
    }

    fn err(&self, e: impl Into<Error>) -> Error {
        e.into().peer(self.peer).rank(self.rank)
    }

    fn protocol(&self, what: String) -> Error {
        Error::remote(format!(
            "verbs transport: peer {} broke the protocol: {what}",
            self.peer
        ))
        .peer(self.peer)
        .rank(self.rank)
    }

    /// Reaps completions: frees local send slots, marks arrived slots, takes credits.
    fn progress(&mut self) -> Result<()> {
        if self.armed && self.res.cq.take_event().map_err(|e| self.err(e))? {
            self.armed = false;
        }
        loop {
            let mut wcs = [Completion::default(); POLL_BATCH];
            let n = self.res.cq.poll(&mut wcs[..]).map_err(|e| self.err(e))?;
            for wc in &wcs[..n] {
                self.complete(wc)?;
            }
            if n < POLL_BATCH {
                return Ok(());
            }
        }
    }

    fn complete(&mut self, wc: &Completion) -> Result<()> {
        let kind = wc.wr_id >> KIND_SHIFT;
        let index = (wc.wr_id & ((1 << KIND_SHIFT) - 1)) as usize;
        if wc.status != 0 {
            let what = match kind {
                DATA_SEND => "RDMA write of staged data",
                DATA_RECV => "receive of an RDMA write",
                CTRL_SEND => "credit message",
                _ => "receive of a credit message",
            };
            return Err(wc_error(wc.status, wc.vendor_err, self.peer, what).rank(self.rank));
        }
        match kind {
            DATA_SEND => {
                if index >= self.layout.slots || !self.send_busy[index] {
                    return Err(Error::internal(format!(
                        "verbs transport: unexpected send completion for slot {index}"
                    )));
                }
                self.send_busy[index] = false;
                self.send_outstanding -= 1;
                if self.zc_len[index] > 0 {
                    self.zc_acked[index] = true;
                }
            }
            DATA_RECV => {
                let Some(imm) = wc.imm else {
                    return Err(self.protocol("a data write without an immediate value".into()));
                };
                let (slot, mut len) = decode_imm(imm);
                let direct = len == DIRECT_LEN;
                if direct {
                    if self.my_grant.is_none() {
                        return Err(self.protocol(format!(
                            "a write of {} bytes into a granted range while none is granted",
                            wc.byte_len
                        )));
                    }
                    len = wc.byte_len as usize;
                }
                if slot >= self.layout.slots
                    || len > self.layout.slot_size
                    || len == 0
                    || self.arrived[slot] != NONE
                {
                    return Err(self.protocol(format!(
                        "write of {len} bytes into slot {slot} (slots {}, {} bytes; arrived {})",
                        self.layout.slots,
                        self.layout.slot_size,
                        self.arrived.get(slot).map_or(0, |&a| a)
                    )));
                }
                self.arrived[slot] = len as u32;
                self.direct[slot] = direct;
                let qp =
                    self.res.qps.get(1 + index).ok_or_else(|| {
                        Error::internal("receive completion for an unknown data QP")
                    })?;
                qp.post_recv(wr_id(DATA_RECV, index))
                    .map_err(|e| self.err(e))?;
            }
            CTRL_SEND => self.ctrl_outstanding -= 1,
            CTRL_RECV => {
                let Some(imm) = wc.imm else {
                    let cell = self.res.ctrl_cell(index);
                    let g = Grant::decode(&cell[..(wc.byte_len as usize).min(GRANT_LEN)])
                        .map_err(|e| self.protocol(e))?;
                    self.take_grant(g)?;
                    return self.res.post_ctrl_recv(index).map_err(|e| self.err(e));
                };
                let delta = imm.wrapping_sub(self.last_credit_imm) as u64;
                self.last_credit_imm = imm;
                self.granted += delta;
                if self.granted > self.send_seq {
                    return Err(self.protocol(format!(
                        "credits for {} slots but only {} were written",
                        self.granted, self.send_seq
                    )));
                }
                self.res.post_ctrl_recv(index).map_err(|e| self.err(e))?;
            }
            _ => {
                return Err(Error::internal(format!(
                    "verbs transport: completion with unknown id {:#x}",
                    wc.wr_id
                )));
            }
        }
        Ok(())
    }

    /// Puts the peer's grant `g` in force, unless the stream has already passed its end.
    fn take_grant(&mut self, g: Grant) -> Result<()> {
        if g.offset > self.send_pos {
            return Err(self.protocol(format!(
                "a grant from stream offset {} but only {} bytes were sent",
                g.offset, self.send_pos
            )));
        }
        if let Some(old) = self.grant
            && old.end() > self.send_pos
        {
            return Err(self.protocol(format!(
                "a grant from offset {} while the one up to {} is still in force (at {})",
                g.offset,
                old.end(),
                self.send_pos
            )));
        }
        self.grant = (g.end() > self.send_pos).then_some(g);
        Ok(())
    }

    /// Whether the next piece may be written now.
    fn can_send(&self) -> bool {
        let slot = (self.send_seq % self.layout.slots as u64) as usize;
        self.send_seq < self.granted + self.layout.slots as u64 && !self.send_busy[slot]
    }

    /// The unread bytes of the head slot, if it arrived.
    fn head(&self) -> Option<(*const u8, usize)> {
        let slot = (self.recv_seq % self.layout.slots as u64) as usize;
        let len = self.arrived[slot];
        if len == NONE || self.direct[slot] {
            return None;
        }
        let buf = &self.res.recv_buf;
        // SAFETY: `slot < slots` and `head_off <= len <= slot_size`, so the pointer stays in the
        // ring, which is `slots x slot_size` bytes.
        let p = unsafe {
            buf.as_ptr()
                .add(slot * self.layout.slot_size + self.head_off)
        };
        Some((p, len as usize - self.head_off))
    }

    /// The length of the head piece if it arrived and went into the granted range.
    fn head_direct(&self) -> Option<usize> {
        let slot = (self.recv_seq % self.layout.slots as u64) as usize;
        (self.arrived[slot] != NONE && self.direct[slot]).then_some(self.arrived[slot] as usize)
    }

    /// Marks `n` bytes of the head slot delivered; frees the slot when it is used up.
    fn advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let slot = (self.recv_seq % self.layout.slots as u64) as usize;
        self.head_off += n;
        debug_assert!(self.head_off <= self.arrived[slot] as usize);
        if self.head_off == self.arrived[slot] as usize {
            self.arrived[slot] = NONE;
            self.direct[slot] = false;
            self.head_off = 0;
            self.recv_seq += 1;
            self.freed = self.freed.wrapping_add(1);
        }
    }

    /// Tells the peer about freed slots (one message for everything freed since the last one).
    fn flush_credits(&mut self) -> Result<()> {
        if self.freed == self.credit_sent {
            return Ok(());
        }
        self.ctrl_room()?;
        self.res.qps[0]
            .post_send_imm(wr_id(CTRL_SEND, 0), self.freed)
            .map_err(|e| self.err(e))?;
        self.ctrl_outstanding += 1;
        self.credit_sent = self.freed;
        Ok(())
    }

    /// Waits, bounded, until the control queue has room for one more message.
    fn ctrl_room(&mut self) -> Result<()> {
        if self.ctrl_outstanding as u32 >= self.layout.ctrl_depth() {
            // The control queue is full of credit messages not yet acknowledged: wait for one,
            // an acknowledgement away. (Practically never: it holds one per slot.)
            let t0 = Instant::now();
            while self.ctrl_outstanding as u32 >= self.layout.ctrl_depth() {
                self.progress()?;
                if t0.elapsed() > self.timeout {
                    return Err(Error::timeout(format!(
                        "verbs transport: credit messages to peer {} not acknowledged for {:.1} s",
                        self.peer,
                        t0.elapsed().as_secs_f64()
                    ))
                    .peer(self.peer)
                    .rank(self.rank));
                }
                std::thread::yield_now();
            }
        }
        Ok(())
    }

    /// Grants the peer `len` bytes of registered memory at `addr` (key `rkey`) for the stream
    /// from the bytes delivered so far on.
    fn send_grant(&mut self, addr: u64, len: usize, rkey: u32) -> Result<()> {
        let g = Grant {
            offset: self.recv_pos,
            addr,
            len: len as u32,
            rkey,
        };
        self.ctrl_room()?;
        self.res.qps[0]
            .post_send_inline(wr_id(CTRL_SEND, 0), &g.encode())
            .map_err(|e| self.err(e))?;
        self.ctrl_outstanding += 1;
        self.my_grant = Some(g);
        Ok(())
    }

    /// Fails a plain receive while a range is granted: the peer may be writing into it, and
    /// the bytes that went there would be skipped.
    fn no_grant(&self) -> Result<()> {
        match self.my_grant {
            Some(g) => Err(Error::internal(format!(
                "verbs transport: a plain receive from peer {} while {} bytes at {:#x} are                  granted to it (stream {}..{}, at {})",
                self.peer,
                g.len,
                g.addr,
                g.offset,
                g.end(),
                self.recv_pos
            ))),
            None => Ok(()),
        }
    }

    /// Moves bytes from the head slots into the carry until it holds `want` (at most
    /// [`CARRY_CAP`]) or no more bytes have arrived.
    fn fill_carry(&mut self, want: usize) {
        let want = want.min(CARRY_CAP);
        while self.carry_len < want {
            let Some((p, avail)) = self.head() else {
                return;
            };
            let k = avail.min(want - self.carry_len);
            // SAFETY: `p..p+k` lies in the head slot, which has arrived and is not granted to
            // the peer until it is freed, so the device does not write it now; the carry is a
            // separate array.
            unsafe {
                std::ptr::copy_nonoverlapping(p, self.carry[self.carry_len..].as_mut_ptr(), k)
            };
            self.carry_len += k;
            self.advance(k);
        }
    }

    fn take_carry(&mut self, n: usize) {
        self.carry.copy_within(n..self.carry_len, 0);
        self.carry_len -= n;
    }

    /// Fails when the side socket shows the peer closed or sent something unexpected.
    fn check_alive(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        match self.side.recv(&mut b) {
            Ok(0) => Ok(()),
            Ok(_) => Err(self.protocol("unexpected bytes on the side channel".into())),
            Err(e) => Err(Error::remote(format!(
                "verbs transport: peer {} is gone: {}",
                self.peer,
                e.message()
            ))
            .peer(self.peer)
            .rank(self.rank)),
        }
    }

    fn ready(&self, interest: Interest) -> bool {
        (interest.recv && (self.head().is_some() || self.head_direct().is_some()))
            || (interest.send
                && if self.zc_posted > 0 {
                    // What the caller waits for is its bytes in flight.
                    self.zc_head_acked()
                } else {
                    self.can_send()
                })
    }

    /// Whether the oldest zero-copy piece in flight has completed (its bytes can be reported).
    fn zc_head_acked(&self) -> bool {
        let slot = (self.zc_seq % self.layout.slots as u64) as usize;
        self.zc_posted > 0 && self.zc_acked[slot]
    }

    /// Stages (copies into local slots) or, with `zero_copy` (the lkey of the registration
    /// `src` lies in), points at `src` directly, as many pieces of `src` as credits and free
    /// slots allow, and posts them with one chained call per QP: into the peer's ring, or
    /// where its grant covers the stream, into the granted range. Returns the bytes posted.
    // Long: choosing each piece's destination (ring slot or grant), its source (staged copy or
    // the caller's registration) and posting them per QP share the piece bookkeeping; split
    // apart, each part would carry the slot, sequence and traffic state the others update.
    fn post(&mut self, src: &[u8], zero_copy: Option<u32>) -> Result<usize> {
        let (s, b, nqp) = (self.layout.slots, self.layout.slot_size, self.layout.nqp);
        let piece = piece_size(src.len(), nqp, b, self.split);
        let buf = &self.res.send_buf;
        let (base, staging_lkey) = (buf.as_ptr(), buf.lkey());
        let first_qp = self.next_qp;
        let mut pieces = 0;
        let mut taken = 0;
        while taken < src.len() && self.can_send() {
            let slot = (self.send_seq % s as u64) as usize;
            let pos = self.send_pos + taken as u64;
            let mut n = (src.len() - taken).min(piece);
            // The grant's offset is at most the stream position (it names bytes delivered),
            // so a piece either lies in the granted range or starts past it.
            let remote = match self.grant {
                Some(g) if pos >= g.offset && pos < g.end() => {
                    n = n.min((g.end() - pos) as usize);
                    if pos + n as u64 == g.end() {
                        self.grant = None;
                    }
                    self.traffic.sent_into_grants += n as u64;
                    (
                        g.addr + (pos - g.offset),
                        g.rkey,
                        encode_imm(slot, DIRECT_LEN),
                    )
                }
                _ => (
                    self.remote.ring_addr + (slot * b) as u64,
                    self.remote.rkey,
                    encode_imm(slot, n),
                ),
            };
            let (local, lkey) = match zero_copy {
                Some(lkey) => {
                    self.zc_len[slot] = n as u32;
                    self.zc_acked[slot] = false;
                    (src[taken..].as_ptr() as u64, lkey)
                }
                None => {
                    // SAFETY:
                    // - The local slot is not busy: its previous write completed, so the
                    //   device does not read it now.
                    // - `slot * b + n <= s * b`, the buffer's size; `src[taken..taken + n]` is
                    //   in bounds; the regions do not overlap (ours is registered staging
                    //   memory).
                    let dst = unsafe {
                        let dst = base.add(slot * b);
                        std::ptr::copy_nonoverlapping(src[taken..].as_ptr(), dst, n);
                        dst
                    };
                    (dst as u64, staging_lkey)
                }
            };
            self.pending[pieces] = WriteImm {
                wr_id: wr_id(DATA_SEND, slot),
                addr: local,
                len: n as u32,
                lkey,
                remote_addr: remote.0,
                rkey: remote.1,
                imm: remote.2,
            };
            pieces += 1;
            self.send_busy[slot] = true;
            self.send_outstanding += 1;
            self.send_seq += 1;
            self.next_qp = (self.next_qp + 1) % nqp;
            taken += n;
        }
        self.send_pos += taken as u64;
        match zero_copy {
            Some(_) => self.traffic.sent_zero_copy += taken as u64,
            None => self.traffic.sent_staged += taken as u64,
        }
        // Piece k went to QP (first_qp + k) % nqp.
        for q in 0..nqp.min(pieces) {
            let qi = (first_qp + q) % nqp;
            let mut group = [WriteImm::default(); POST_BATCH];
            let mut g = 0;
            let mut k = q;
            while k < pieces {
                group[g] = self.pending[k];
                g += 1;
                k += nqp;
                if g == POST_BATCH || k >= pieces {
                    // SAFETY:
                    // - A staged request's source is its local slot in the send buffer
                    //   registered with `staging_lkey`; the slot stays busy (unwritten) until
                    //   the request's completion is polled.
                    // - A zero-copy request's source lies in the caller's registration with
                    //   `lkey` (checked by `send_registered`); by `send_registered`'s contract
                    //   the caller keeps those bytes borrowed and unchanged until they are
                    //   reported taken, which happens only after the completion is polled.
                    // - Each remote slot was granted: `seq < granted + slots` held when it was
                    //   staged, i.e. the peer freed its previous contents; it lies inside the
                    //   ring the peer registered (`slot * b + n <= s * b`). A write into a
                    //   granted range stays inside the range the peer granted (cut at its
                    //   end above); the peer checks nothing more, the device checks the key.
                    unsafe { self.res.qps[1 + qi].post_writes(&group[..g]) }
                        .map_err(|e| self.err(e))?;
                    g = 0;
                }
            }
        }
        Ok(taken)
    }

    /// Reports the zero-copy bytes whose writes completed, in order, and frees their pieces.
    fn zc_reap(&mut self) -> usize {
        let mut done = 0;
        while self.zc_head_acked() {
            let slot = (self.zc_seq % self.layout.slots as u64) as usize;
            let n = self.zc_len[slot] as usize;
            self.zc_len[slot] = 0;
            self.zc_acked[slot] = false;
            self.zc_seq += 1;
            self.zc_posted -= n;
            done += n;
        }
        self.zc_start += done;
        done
    }
    /// `region` as this connection's own registration (same protection domain) when it covers
    /// `bytes`; `None` means stage them.
    fn own_region<'r>(&self, region: &'r dyn MemRegion, bytes: &[u8]) -> Option<&'r UserMr> {
        let pd = self.res.send_buf.pd();
        region
            .as_any()
            .downcast_ref::<UserMr>()
            .filter(|m| std::sync::Arc::ptr_eq(m.pd(), pd) && m.covers(bytes))
    }

    /// Copies delivered bytes (the carry, then arrived ring pieces, up to the first piece that
    /// went into a granted range) into `dst`; returns how many.
    fn copy_out(&mut self, dst: &mut [u8]) -> usize {
        let mut got = 0;
        if self.carry_len > 0 {
            let k = self.carry_len.min(dst.len());
            dst[..k].copy_from_slice(&self.carry[..k]);
            self.take_carry(k);
            got = k;
        }
        while got < dst.len() {
            let Some((p, avail)) = self.head() else {
                break;
            };
            let k = avail.min(dst.len() - got);
            // SAFETY: `p..p+k` is arrived data in the head slot, which the device does not
            // write until the slot is freed and granted again; `dst[got..got + k]` is in bounds
            // and separate memory.
            unsafe { std::ptr::copy_nonoverlapping(p, dst[got..].as_mut_ptr(), k) };
            self.advance(k);
            got += k;
        }
        got
    }
}

impl Endpoint for IbEndpoint {
    fn peer(&self) -> usize {
        self.peer
    }

    fn send(&mut self, src: &[u8]) -> Result<usize> {
        self.progress()?;
        if self.zc_posted > 0 {
            return Err(Error::internal(format!(
                "verbs transport: a staged send to peer {} while {} zero-copy bytes are in flight",
                self.peer, self.zc_posted
            )));
        }
        self.post(src, None)
    }

    fn send_registered(&mut self, src: &[u8], region: &dyn MemRegion) -> Result<usize> {
        let Some(mr) = self.own_region(region, src) else {
            return self.send(src);
        };
        let lkey = mr.lkey();
        self.progress()?;
        let at = src.as_ptr() as usize;
        if self.zc_posted > 0 && (at != self.zc_start || src.len() < self.zc_posted) {
            return Err(Error::internal(format!(
                "verbs transport: zero-copy send to peer {} resumed at {at:#x} ({} bytes) but \
                 {} bytes from {:#x} are in flight",
                self.peer,
                src.len(),
                self.zc_posted,
                self.zc_start
            )));
        }
        if self.zc_posted == 0 {
            self.zc_start = at;
            self.zc_seq = self.send_seq;
        }
        let done = self.zc_reap();
        let from = done + self.zc_posted;
        let posted = self.post(&src[from..], Some(lkey))?;
        self.zc_posted += posted;
        Ok(done)
    }

    fn recv(&mut self, dst: &mut [u8]) -> Result<usize> {
        if dst.is_empty() {
            return Ok(0);
        }
        self.no_grant()?;
        self.progress()?;
        let got = self.copy_out(dst);
        self.recv_pos += got as u64;
        self.traffic.received_staged += got as u64;
        self.flush_credits()?;
        Ok(got)
    }

    fn recv_registered(&mut self, dst: &mut [u8], region: &dyn MemRegion) -> Result<usize> {
        let Some(mr) = self.own_region(region, dst) else {
            return self.recv(dst);
        };
        if dst.is_empty() {
            return Ok(0);
        }
        let rkey = mr.rkey();
        self.progress()?;
        let at = dst.as_ptr() as u64;
        match self.my_grant {
            Some(g) => {
                let expect = g.addr + (self.recv_pos - g.offset);
                if at != expect || at + (dst.len() as u64) < g.end_addr() {
                    return Err(Error::internal(format!(
                        "verbs transport: a zero-copy receive from peer {} into {} bytes at                          {at:#x}, but {} bytes at {:#x} are granted and the next is due at                          {expect:#x}",
                        self.peer,
                        dst.len(),
                        g.len,
                        g.addr
                    )));
                }
            }
            None if dst.len() >= GRANT_MIN => {
                self.send_grant(at, dst.len().min(GRANT_MAX), rkey)?;
            }
            None => {}
        }
        let mut got = 0;
        loop {
            let copied = self.copy_out(&mut dst[got..]);
            got += copied;
            self.recv_pos += copied as u64;
            self.traffic.received_staged += copied as u64;
            let Some(n) = self.head_direct() else {
                break;
            };
            // The piece is in place already: the sender wrote it at the grant's address plus
            // its stream offset, which is this one (pieces are delivered in stream order).
            let g = self
                .my_grant
                .expect("a direct piece arrives only under a grant");
            if self.recv_pos + n as u64 > g.end() || got + n > dst.len() {
                return Err(self.protocol(format!(
                    "a write of {n} bytes into the granted range at stream offset {}, past its                      end {}",
                    self.recv_pos,
                    g.end()
                )));
            }
            self.advance(n);
            got += n;
            self.recv_pos += n as u64;
            self.traffic.received_in_place += n as u64;
        }
        if self.my_grant.is_some_and(|g| self.recv_pos >= g.end()) {
            self.my_grant = None;
        }
        self.flush_credits()?;
        Ok(got)
    }

    fn recv_with(&mut self, max: usize, consume: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        self.no_grant()?;
        self.progress()?;
        let mut used = 0;
        while used < max {
            let want = max - used;
            if self.carry_len > 0 {
                self.fill_carry(want);
                let n = self.carry_len.min(want);
                let u = consume(&self.carry[..n]).min(n);
                self.take_carry(u);
                used += u;
                if u == 0 {
                    break;
                }
                continue;
            }
            let Some((p, avail)) = self.head() else {
                break;
            };
            let n = avail.min(want);
            // SAFETY: `p..p+n` is arrived data of the head slot; the device does not write the
            // slot until it is freed (after this borrow ends) and granted again.
            let bytes = unsafe { std::slice::from_raw_parts(p, n) };
            let u = consume(bytes).min(n);
            self.advance(u);
            used += u;
            if u < n {
                let left = n - u;
                if n == avail && left <= CARRY_CAP / 2 {
                    // A partial element at the end of the slot: join it with what follows.
                    self.fill_carry(left);
                    continue;
                }
                break;
            }
        }
        self.recv_pos += used as u64;
        self.traffic.received_staged += used as u64;
        self.flush_credits()?;
        Ok(used)
    }

    fn prepare_wait(&mut self, interest: Interest) -> Result<bool> {
        self.progress()?;
        self.flush_credits()?;
        if self.ready(interest) {
            return Ok(false);
        }
        // The rank has already busy-polled every peer for CCL_SPIN_US + CCL_IB_SPIN_US (the
        // transport's spin): now it sleeps.
        self.check_alive()?;
        if !self.armed {
            self.res.cq.arm().map_err(|e| self.err(e))?;
            self.armed = true;
        }
        // A completion that arrived before the CQ was armed raises no event: look again.
        self.progress()?;
        Ok(!self.ready(interest))
    }

    /// Whatever the interest: progress either way arrives as completions on the one channel, and
    /// the side socket is watched only for the peer closing it.
    fn wait_fds<'a>(&'a self, _interest: Interest, out: &mut Vec<(BorrowedFd<'a>, PollFlags)>) {
        out.push((self.res.cq.channel().fd(), PollFlags::POLLIN));
        self.side.wait_fds(
            Interest {
                send: false,
                recv: true,
            },
            out,
        );
    }
}

impl Drop for IbEndpoint {
    fn drop(&mut self) {
        // Let the writes `send` already took reach the peer (bounded, and not when the peer is
        // gone or the connection failed).
        let t0 = Instant::now();
        while (self.send_outstanding > 0 || self.ctrl_outstanding > 0) && t0.elapsed() < DRAIN_GRACE
        {
            if self.progress().is_err() || self.check_alive().is_err() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        let t = self.traffic;
        ccl_core::ccl_trace!(
            Some(self.rank),
            "verbs connection to peer {} closes: sent {} bytes zero-copy, {} staged ({} into              granted memory); received {} bytes in place, {} through the ring",
            self.peer,
            t.sent_zero_copy,
            t.sent_staged,
            t.sent_into_grants,
            t.received_in_place,
            t.received_staged
        );
        for (i, v) in [
            t.sent_zero_copy,
            t.sent_staged,
            t.sent_into_grants,
            t.received_in_place,
            t.received_staged,
        ]
        .into_iter()
        .enumerate()
        {
            TOTALS[i].fetch_add(v, std::sync::atomic::Ordering::Relaxed);
        }
        // Dropping `res` then tears the connection down.
    }
}

#[cfg(test)]
mod tests {
    use super::piece_size;

    #[test]
    fn round_robin_pieces_are_slots() {
        for len in [1, 4096, 1 << 20, 100 << 20] {
            assert_eq!(piece_size(len, 4, 256 << 10, false), 256 << 10);
            // One QP: nothing to split across.
            assert_eq!(piece_size(len, 1, 256 << 10, true), 256 << 10);
        }
    }

    #[test]
    fn split_gives_each_qp_an_even_share() {
        let slot = 256 << 10;
        // 64 KiB over 4 QPs: four 16 KiB pieces.
        assert_eq!(piece_size(64 << 10, 4, slot, true), 16 << 10);
        // Shares are rounded up to 64 B, so four pieces still cover the message.
        let p = piece_size(100_003, 4, slot, true);
        assert_eq!(p % 64, 0);
        assert!(4 * p >= 100_003 && 3 * p < 100_003, "{p}");
        // Never above a slot: a big message still fills slots (and round-robins them).
        assert_eq!(piece_size(64 << 20, 4, slot, true), slot);
        // Never tiny: small messages take fewer, 4 KiB pieces.
        assert_eq!(piece_size(5000, 4, slot, true), 4096);
        assert_eq!(piece_size(1, 16, slot, true), 4096);
        // Unless the slot itself is smaller.
        assert_eq!(piece_size(1 << 20, 4, 4096, true), 4096);
    }
}
