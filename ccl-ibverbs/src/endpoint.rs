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

// One connection, its two directions in files of their own.
mod recv;
mod send;

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
                // A consumer that takes less than it was offered is not offered more in this
                // call (the Endpoint contract); the next call offers the rest, refilled.
                if u < n {
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
                    // A partial element at the end of the slot: the next call offers it joined
                    // with what follows.
                    self.fill_carry(left);
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
