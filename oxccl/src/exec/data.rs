//! Data movement over the endpoints: operation headers first, then bytes in wire order, and
//! receives that reduce straight from the transport's buffer.

use super::*;

/// The header of the operation `info` for channel sequence `channel_seq` and `bytes`.
pub(super) fn header_of(
    info: &OpInfo,
    dtype: DataType,
    op: ReduceOp,
    channel_seq: u64,
    bytes: usize,
    entry_us: u64,
) -> Header {
    let (kind, algo) = match info.kind {
        OpKind::Collective { coll, algo } => (coll.id(), algo.id()),
        OpKind::PointToPoint => (KIND_P2P, 0),
    };
    Header {
        kind,
        dtype: dtype as u8,
        op: op as u8,
        algo,
        root: info.root as u32,
        seq: channel_seq,
        count: info.count as u64,
        bytes: bytes as u64,
        entry_us,
    }
}

/// The operand order of a reduction: the other operand first, or the accumulator first.
pub(super) fn order(other_first: bool) -> Order {
    if other_first {
        Order::SrcFirst
    } else {
        Order::AccFirst
    }
}

impl Run<'_, '_> {
    /// Queues the header for every peer this rank sends to, with a small first message riding
    /// along, and notes which peers' headers to expect.
    pub(super) fn queue_headers(&mut self) -> Result<()> {
        let mut arrived = false;
        for (pi, p) in self.sched.peers.iter().enumerate() {
            let bytes = p.send_elems * self.elem;
            if bytes > 0 || (self.sched.handshake && !p.sends.is_empty()) {
                let h = self.header(self.st.headers_to[p.peer], bytes);
                self.st.headers_to[p.peer] += 1;
                self.st.headers_left += 1;
                let first = &self.sched.ops[p.sends[0]];
                let len = first.action.len() * self.elem;
                let out = &mut self.st.peers[pi].header_out;
                out.extend_from_slice(&h.encode());
                // Data that no earlier op writes is final now and may go with the header.
                if first.deps.is_empty()
                    && first.stream_from.is_none()
                    && len <= COALESCE
                    && let Action::Send { src, .. } = first.action
                {
                    let src = self.at(&src);
                    let out = &mut self.st.peers[pi].header_out;
                    out.extend_from_slice(Self::region(
                        &self.bufs,
                        self.host.as_deref(),
                        &src,
                        self.elem,
                    )?);
                    self.st.peers[pi].carried = len;
                }
            }
            if p.recv_elems * self.elem > 0 || (self.sched.handshake && !p.recvs.is_empty()) {
                self.st.peers[pi].expects_header = true;
                // A receive from any source may have read (part of) this header already.
                if let Some(e) = self.st.take_early(p.peer) {
                    let q = &mut self.st.peers[pi];
                    (q.header_in, q.header_in_got) = (e.header, e.got);
                }
                if self.st.peers[pi].header_in_pending() {
                    self.st.headers_left += 1;
                } else {
                    arrived = true;
                }
            }
        }
        if arrived {
            for pi in 0..self.sched.peers.len() {
                let q = &self.st.peers[pi];
                if q.expects_header && !q.header_in_pending() {
                    self.check_header(pi)?;
                }
            }
        }
        Ok(())
    }

    /// Sends what is left of the header to peer queue `pi`; once it is all gone, the first
    /// send's bytes that rode along count as done.
    pub(super) fn send_header(&mut self, pi: usize) -> Result<bool> {
        if !self.st.peers[pi].header_out_pending() {
            return Ok(false);
        }
        let peer = self.sched.peers[pi].peer;
        let q = &mut self.st.peers[pi];
        let ep = self.links.get(peer)?;
        let k = ep
            .send(&q.header_out[q.header_out_sent..])
            .map_err(|e| e.context(format!("sending the operation header to peer {peer}")))?;
        q.header_out_sent += k;
        if !q.header_out_pending() {
            self.st.headers_left -= 1;
            let carried = q.carried;
            if carried > 0 {
                self.advance(self.sched.peers[pi].sends[0], carried);
            }
        }
        Ok(k > 0)
    }

    /// Moves as much of peer queue `pi`'s sends (or receives) as may go now, in wire order.
    pub(super) fn move_data(&mut self, pi: usize, dir: Dir) -> Result<bool> {
        let mut moved = false;
        while let Some(id) = self.head(pi, dir) {
            if !self.complete(id) {
                let Some(end) = self.may_move(id, dir) else {
                    break;
                };
                let k = self.transfer(id, pi, dir, end)?;
                if k == 0 {
                    break;
                }
                moved = true;
                if !self.advance(id, k) {
                    break;
                }
            }
            let q = &mut self.st.peers[pi];
            match dir {
                Dir::Send => q.next_send += 1,
                Dir::Recv => q.next_recv += 1,
            }
        }
        Ok(moved)
    }

    /// The op at the head of peer queue `pi`'s sends (or receives); `None` when the queue is
    /// empty, or while the operation header in that direction has not gone (or arrived).
    pub(super) fn head(&self, pi: usize, dir: Dir) -> Option<OpId> {
        let (p, q) = (&self.sched.peers[pi], &self.st.peers[pi]);
        match dir {
            Dir::Send if !q.header_out_pending() => p.sends.get(q.next_send).copied(),
            Dir::Recv if !q.header_in_pending() => p.recvs.get(q.next_recv).copied(),
            _ => None,
        }
    }

    /// The rule for `dir`: `send_now` or `receive_now`.
    pub(super) fn may_move(&self, id: OpId, dir: Dir) -> Option<usize> {
        match dir {
            Dir::Send => self.send_now(id),
            Dir::Recv => self.receive_now(id),
        }
    }

    /// Sends (or receives) bytes `done..end` of op `id` to (or from) the peer of queue `pi`;
    /// returns how many the transport took (or had).
    pub(super) fn transfer(&mut self, id: OpId, pi: usize, dir: Dir, end: usize) -> Result<usize> {
        let peer = self.sched.peers[pi].peer;
        let step = self.sched.ops[id].step;
        match dir {
            Dir::Send => {
                let Action::Send { src, .. } = self.sched.ops[id].action else {
                    unreachable!("send queue holds sends")
                };
                let done = self.st.done[id];
                let src = self.at(&src);
                let data =
                    &Self::region(&self.bufs, self.host.as_deref(), &src, self.elem)?[done..end];
                let reg = self
                    .registered
                    .region(src.buf, self.comm.peer_transport(peer));
                let ep = self.links.get(peer)?;
                match reg {
                    Some(r) => ep.send_registered(data, r),
                    None => ep.send(data),
                }
                .map_err(|e| e.context(format!("sending step {step} to peer {peer}")))
            }
            Dir::Recv => self
                .receive_into(id, peer, end)
                .map_err(|e| e.context(format!("receiving step {step} from peer {peer}"))),
        }
    }

    /// Takes what has arrived of the header from peer queue `pi`, and checks it once whole:
    /// the peer's header is checked before any of its data is taken.
    pub(super) fn receive_header(&mut self, pi: usize) -> Result<bool> {
        if !self.st.peers[pi].header_in_pending() {
            return Ok(false);
        }
        let p = &self.sched.peers[pi];
        let peer = p.peer;
        // Reading ahead lets a small first message arrive in the same call; the transport keeps
        // those bytes for the receive that follows.
        let look = p.recvs.first().map_or(0, |&id| self.len(id)).min(LOOKAHEAD);
        let q = &mut self.st.peers[pi];
        let got = q.header_in_got;
        let want = HEADER_LEN - got;
        let into = &mut q.header_in;
        // A transport may lend the bytes in several pieces (a message-based one hands out one
        // slot at a time): take only what the header still lacks.
        let mut taken = 0;
        let k = self
            .links
            .get(peer)?
            .recv_with(want + look, &mut |b: &[u8]| {
                let t = b.len().min(want - taken);
                into[got + taken..got + taken + t].copy_from_slice(&b[..t]);
                taken += t;
                t
            })
            .map_err(|e| e.context(format!("receiving the operation header from peer {peer}")))?;
        q.header_in_got += k;
        if !q.header_in_pending() {
            self.st.headers_left -= 1;
            self.check_header(pi)?;
        }
        Ok(k > 0)
    }

    /// Compares the header that arrived from peer queue `pi` with what this rank expects.
    pub(super) fn check_header(&mut self, pi: usize) -> Result<()> {
        let p = &self.sched.peers[pi];
        let mismatch = |m: HeaderError| {
            Error::invalid_usage(format!("with peer {}: {m}", p.peer)).peer(p.peer)
        };
        let theirs = Header::decode(&self.st.peers[pi].header_in).map_err(mismatch)?;
        let mine = self.header(self.st.headers_from[p.peer], p.recv_elems * self.elem);
        self.st.headers_from[p.peer] += 1;
        Header::check(&mine, &theirs).map_err(mismatch)?;
        self.st.peers[pi].late_us = Some(theirs.entry_us as i64 - self.st.entry_us as i64);
        Ok(())
    }

    /// Receives bytes `done..end` of receive `id` from `peer`, copying them into place or
    /// reducing them straight from the transport's buffer; returns how many arrived.
    pub(super) fn receive_into(&mut self, id: OpId, peer: usize, end: usize) -> Result<usize> {
        let Action::Recv { dst, combine, .. } = self.sched.ops[id].action else {
            unreachable!("receive queue holds receives")
        };
        let dst = self.at(&dst);
        let combine = match combine {
            Combine::Reduce {
                with: Some(w),
                incoming_first,
                finish_avg,
            } => Combine::Reduce {
                with: Some(self.at(&w)),
                incoming_first,
                finish_avg,
            },
            c => c,
        };
        let (dtype, op, elem, world) = (self.dtype, self.op, self.elem, self.comm.size());
        let kernels = self.kernels;
        let done = self.st.done[id];
        let registered = self.registered;
        let reg = registered.region(dst.buf, self.comm.peer_transport(peer));
        let ep = self.links.get(peer)?;
        match combine {
            Combine::Copy => {
                let d = Self::region_mut(&mut self.bufs, self.host.as_deref_mut(), &dst, elem)?;
                // Into registered memory the peer may write directly (`recv_registered`); the
                // op keeps `d[done..]` borrowed until its bytes are in, as that asks.
                match reg {
                    Some(r) => ep.recv_registered(&mut d[done..end], r),
                    None => ep.recv(&mut d[done..end]),
                }
            }
            Combine::Reduce {
                with,
                incoming_first,
                finish_avg,
            } => {
                let (d, w) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    with.as_ref(),
                    elem,
                )?;
                let mut off = done;
                ep.recv_with(end - done, &mut |incoming: &[u8]| {
                    // Whole elements only; a partial one is offered again once complete.
                    let k = incoming.len() / elem * elem;
                    if k == 0 {
                        return 0;
                    }
                    let out = &mut d[off..off + k];
                    let incoming = &incoming[..k];
                    match w {
                        None => (kernels.inplace)(dtype, op, out, incoming, order(incoming_first)),
                        Some(w) if incoming_first => {
                            (kernels.into)(dtype, op, out, incoming, &w[off..off + k])
                        }
                        Some(w) => (kernels.into)(dtype, op, out, &w[off..off + k], incoming),
                    }
                    if finish_avg {
                        reduce::finish_avg(dtype, out, world);
                    }
                    off += k;
                    k
                })
            }
        }
    }
}
