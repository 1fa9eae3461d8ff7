//! The receiving side of a connection: completions of the peer's writes delivered in
//! sequence, credits and grants sent back on the control QP, bytes copied out or lent in place.

use super::*;

impl IbEndpoint {
    pub(super) fn complete(&mut self, wc: &Completion) -> Result<()> {
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

    /// Tells the peer about freed slots (one message for everything freed since the last one).
    pub(super) fn flush_credits(&mut self) -> Result<()> {
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
    pub(super) fn ctrl_room(&mut self) -> Result<()> {
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
    pub(super) fn send_grant(&mut self, addr: u64, len: usize, rkey: u32) -> Result<()> {
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
    pub(super) fn no_grant(&self) -> Result<()> {
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
    pub(super) fn fill_carry(&mut self, want: usize) {
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

    pub(super) fn take_carry(&mut self, n: usize) {
        self.carry.copy_within(n..self.carry_len, 0);
        self.carry_len -= n;
    }

    /// Copies delivered bytes (the carry, then arrived ring pieces, up to the first piece that
    /// went into a granted range) into `dst`; returns how many.
    pub(super) fn copy_out(&mut self, dst: &mut [u8]) -> usize {
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
