//! The sending side of a connection: pieces of the caller's bytes (staged, or from its
//! registration) written into the peer's slots or straight into a range the peer granted,
//! under the credits the peer returned.

use super::*;

impl IbEndpoint {
    /// Puts the peer's grant `g` in force, unless the stream has already passed its end.
    pub(super) fn take_grant(&mut self, g: Grant) -> Result<()> {
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
    pub(super) fn can_send(&self) -> bool {
        let slot = (self.send_seq % self.layout.slots as u64) as usize;
        self.send_seq < self.granted + self.layout.slots as u64 && !self.send_busy[slot]
    }

    /// The unread bytes of the head slot, if it arrived.
    pub(super) fn head(&self) -> Option<(*const u8, usize)> {
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
    pub(super) fn head_direct(&self) -> Option<usize> {
        let slot = (self.recv_seq % self.layout.slots as u64) as usize;
        (self.arrived[slot] != NONE && self.direct[slot]).then_some(self.arrived[slot] as usize)
    }

    /// Marks `n` bytes of the head slot delivered; frees the slot when it is used up.
    pub(super) fn advance(&mut self, n: usize) {
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

    /// Whether the oldest zero-copy piece in flight has completed (its bytes can be reported).
    pub(super) fn zc_head_acked(&self) -> bool {
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
    pub(super) fn post(&mut self, src: &[u8], zero_copy: Option<u32>) -> Result<usize> {
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
    pub(super) fn zc_reap(&mut self) -> usize {
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
    pub(super) fn own_region<'r>(
        &self,
        region: &'r dyn MemRegion,
        bytes: &[u8],
    ) -> Option<&'r UserMr> {
        let pd = self.res.send_buf.pd();
        region
            .as_any()
            .downcast_ref::<UserMr>()
            .filter(|m| std::sync::Arc::ptr_eq(m.pd(), pd) && m.covers(bytes))
    }
}
