//! The sending half: frames onto planes, acks and pings, failover.

use super::*;

impl Inner {
    pub(super) fn io_error(&self, i: usize, doing: &str, e: io::Error) -> Error {
        link_error(e, || {
            format!("{doing} peer {} on {}", self.peer, self.planes[i].name())
        })
        .peer(self.peer)
    }

    /// Plane `i` failed with `e`: it is dead; its unacknowledged bytes go on the others. Fails
    /// when no plane is left.
    pub(super) fn plane_failed(&mut self, i: usize, e: Error) -> Result<()> {
        if self.planes[i].state == State::Dead {
            return Ok(());
        }
        self.planes[i].state = State::Dead;
        self.planes[i].tx = None;
        let alive = self
            .planes
            .iter()
            .filter(|p| p.state != State::Dead)
            .count();
        if alive == 0 {
            let e = e.context("every plane to this peer failed");
            self.failed = Some(e.clone());
            return Err(e);
        }
        if !self.closing {
            ccl_warn!(
                None,
                "{} to peer {} failed ({e}); {alive} plane(s) left, its unacknowledged bytes go \
                 again on them",
                self.planes[i].name(),
                self.peer
            );
        }
        self.requeue(i);
        self.resend_notices();
        self.after_death(i);
        Ok(())
    }

    /// Queues plane `i`'s unacknowledged ranges to be framed again on other planes.
    pub(super) fn requeue(&mut self, i: usize) {
        self.failovers += 1;
        let acked = self.acked;
        let sent = std::mem::take(&mut self.planes[i].sent);
        for (s, e) in sent {
            let s = s.max(acked);
            if s < e {
                self.resent += e - s;
                self.resend.push((s, e));
            }
        }
        self.resend.sort_unstable();
    }

    /// Writes what plane `i` has of its current frame. `Ok(true)`: the frame is out (or there
    /// was none); `Ok(false)`: the socket is full.
    pub(super) fn flush(&mut self, i: usize) -> Result<bool> {
        loop {
            let p = &mut self.planes[i];
            let Some(tx) = &mut p.tx else { return Ok(true) };
            let total = tx.head_len + tx.len;
            if tx.done == total {
                p.tx = None;
                return Ok(true);
            }
            let mut parts: [IoSlice<'_>; 3] =
                [IoSlice::new(&[]), IoSlice::new(&[]), IoSlice::new(&[])];
            let mut k = 0;
            if tx.done < tx.head_len {
                parts[k] = IoSlice::new(&tx.head[tx.done..tx.head_len]);
                k += 1;
            }
            // The payload still lies in the send ring: a frame's bytes are acknowledged only
            // once delivered, and a frame whose range an ack already passed (it went again on
            // another plane) is dropped by the receiver whatever its bytes.
            let from = tx.done.saturating_sub(tx.head_len);
            let mut off = tx.off + from as u64;
            let mut left = tx.len - from;
            while left > 0 && k < 3 && !self.out.buf.is_empty() {
                let s = self.out.at(off, left);
                parts[k] = IoSlice::new(s);
                k += 1;
                off += s.len() as u64;
                left -= s.len();
            }
            let r = p.link.write_vectored(&parts[..k]);
            match r {
                Ok(0) => {
                    let e = io::Error::new(io::ErrorKind::WriteZero, "wrote nothing");
                    let e = self.io_error(i, "send to", e);
                    self.plane_failed(i, e)?;
                    return Ok(true);
                }
                Ok(n) => {
                    let p = &mut self.planes[i];
                    let tx = p.tx.as_mut().expect("frame in flight");
                    tx.done += n;
                    if tx.len > 0 {
                        if p.wrote == p.peer_read {
                            p.moved = Instant::now();
                        }
                        p.wrote += n as u64;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = self.io_error(i, "send to", e);
                    self.plane_failed(i, e)?;
                    return Ok(true);
                }
            }
        }
    }

    /// Tells the peer, on every plane that takes it now, that this end is closing: its planes'
    /// closes are then no news to it. Best effort: a plane whose socket is full says nothing.
    pub(super) fn goodbye(&mut self) {
        for i in 0..self.planes.len() {
            if self.planes[i].state == State::Dead || self.planes[i].tx.is_some() {
                continue;
            }
            // The last ack first: the peer, lingering until this end has read what it sent,
            // learns so before the connection closes.
            self.control(i, ACK);
            if !matches!(self.flush(i), Ok(true)) {
                continue;
            }
            self.control(i, BYE);
            let _ = self.flush(i);
        }
    }

    /// Whether a send would take bytes now: room in the window, nothing to send again first,
    /// and an up plane with room and no frame half written.
    pub(super) fn can_take(&self) -> bool {
        (self.taken - self.acked) < WINDOW as u64
            && self.resend.is_empty()
            && (0..self.planes.len()).any(|i| {
                let p = &self.planes[i];
                p.state == State::Up && p.tx.is_none() && self.has_room(i)
            })
    }

    /// Whether plane `i` has room for another frame under its in-flight cap.
    pub(super) fn has_room(&self, i: usize) -> bool {
        let p = &self.planes[i];
        let share = (WINDOW / (2 * self.planes.len())) as u64;
        let cap = ((p.rate * IN_FLIGHT_TIME) as u64).clamp(IN_FLIGHT_MIN, share.max(IN_FLIGHT_MIN));
        p.wrote - p.peer_read < cap
    }

    /// Starts a data frame of `[off, off + len)` on plane `i`.
    pub(super) fn frame(&mut self, i: usize, off: u64, len: usize) {
        let mut head = [0u8; HDR + ACK_MAX];
        head[..HDR].copy_from_slice(&header(DATA, 0, len as u32, off));
        let p = &mut self.planes[i];
        if !p.owes() {
            // Idle until now: a stall is counted from here.
            p.moved = Instant::now();
        }
        p.tx = Some(Tx {
            head,
            head_len: HDR,
            off,
            len,
            done: 0,
        });
        match p.sent.last_mut() {
            Some(r) if r.1 == off => r.1 = off + len as u64,
            _ => p.sent.push((off, off + len as u64)),
        }
    }

    /// Starts an ack (or a ping) on plane `i`.
    pub(super) fn control(&mut self, i: usize, kind: u8) {
        let n = self.planes.len();
        let mut head = [0u8; HDR + ACK_MAX];
        let len = if kind == ACK { 8 + 8 * n } else { 0 };
        head[..HDR].copy_from_slice(&header(kind, n as u8, len as u32, 0));
        if kind == ACK {
            head[HDR..HDR + 8].copy_from_slice(&self.next.to_le_bytes());
            for (k, p) in self.planes.iter().enumerate() {
                let at = HDR + 8 + 8 * k;
                let count = (u64::from(p.generation) << GEN_SHIFT) | (p.read - p.read_base);
                head[at..at + 8].copy_from_slice(&count.to_le_bytes());
            }
        }
        self.planes[i].tx = Some(Tx {
            head,
            head_len: HDR + len,
            off: 0,
            len: 0,
            done: 0,
        });
    }

    /// Writes what is owed: frames in flight, acks and pings, then ranges to send again.
    pub(super) fn pump(&mut self) -> Result<()> {
        let n = self.planes.len();
        for k in 0..n {
            let i = (self.turn + k) % n;
            loop {
                if self.planes[i].state == State::Dead || !self.flush(i)? {
                    break;
                }
                let p = &mut self.planes[i];
                // The flush may have found the plane dead; a down plane only finishes the
                // frame it had begun (its stream must stay whole for when it returns).
                if p.state != State::Up {
                    break;
                }
                if p.ack_due {
                    p.ack_due = false;
                    self.control(i, ACK);
                    continue;
                }
                if p.ping_due {
                    p.ping_due = false;
                    self.control(i, PING);
                    continue;
                }
                if let Some(j) = self.planes.iter().position(|q| q.redial.due) {
                    self.redial_notice(i, j);
                    continue;
                }
                if !self.has_room(i) {
                    break;
                }
                let Some(&(s, e)) = self.resend.first() else {
                    break;
                };
                let len = ((e - s) as usize).min(CHUNK);
                if len as u64 == e - s {
                    self.resend.remove(0);
                } else {
                    self.resend[0].0 += len as u64;
                }
                self.frame(i, s, len);
            }
        }
        Ok(())
    }

    /// Takes bytes of `src` while some plane's socket takes frames; returns how many.
    pub(super) fn send(&mut self, src: &[u8]) -> Result<usize> {
        // Reading every plane for acks on every call costs a system call per plane: do it when
        // the window fills, bytes wait to go again, or a while has passed (health checks).
        let used = (self.taken - self.acked) as usize;
        if used >= WINDOW / 4
            || !self.resend.is_empty()
            || self.serviced_at.elapsed() >= SERVICE_EVERY
        {
            self.service(true)?;
        }
        let n = self.planes.len();
        let mut taken = 0;
        let mut full = 0usize; // planes whose socket is full, as a bit set
        while taken < src.len() {
            let room = WINDOW - (self.taken - self.acked) as usize;
            if room == 0 || !self.resend.is_empty() {
                break;
            }
            let i = self.turn % n;
            self.turn = self.turn.wrapping_add(1);
            if full & (1 << i) != 0 {
                if full.count_ones() as usize == n {
                    break;
                }
                continue;
            }
            let usable = self.planes[i].state == State::Up && self.has_room(i);
            if !usable || !self.flush(i)? || self.planes[i].state != State::Up {
                full |= 1 << i;
                if full.count_ones() as usize == n {
                    break;
                }
                continue;
            }
            let len = (src.len() - taken).min(CHUNK).min(room);
            self.out.put(self.taken, &src[taken..taken + len]);
            self.frame(i, self.taken, len);
            self.taken += len as u64;
            taken += len;
            if !self.flush(i)? {
                full |= 1 << i;
            }
        }
        Ok(taken)
    }

    /// With every live plane down (the others failed), takes the least-behind one as up again:
    /// the transfer goes on when its link returns, or the job's deadline ends it.
    pub(super) fn revive_one(&mut self) {
        if let Some(p) = self
            .planes
            .iter_mut()
            .filter(|p| p.state == State::Down)
            .min_by_key(|p| p.wrote - p.peer_read)
        {
            p.state = State::Up;
            p.moved = Instant::now();
        }
    }

    /// A plane whose written bytes go unread for `down_after`, of which at least half while
    /// another plane delivers and the peer answers there, is down. With bytes waiting on a
    /// plane for half of it, every quiet plane asks the peer for an ack.
    pub(super) fn check_planes(&mut self) {
        if !self.planes.iter().any(|p| p.state == State::Up) {
            self.revive_one();
        }
        let now = Instant::now();
        let half = self.down_after / 2;
        let stalled = |p: &Plane| p.state == State::Up && p.owes() && now - p.moved >= half;
        if !self.planes.iter().any(stalled) {
            for p in &mut self.planes {
                p.suspect = None;
            }
            return;
        }
        for p in &mut self.planes {
            if p.state == State::Up && now - p.heard >= half {
                p.ping_due = true;
            }
        }
        for i in 0..self.planes.len() {
            // A witness delivers and is answered on (quiet planes are pinged every half
            // timeout, so a live peer answers well within one). When every plane stalls, the peer is not
            // reading (busy, stopped): that is the job monitor's to judge, not the link's. Two
            // planes that stalled together and resume one before the other are not a witness
            // for each other for long: the suspicion must last half the timeout.
            let witness = stalled(&self.planes[i])
                .then(|| {
                    self.planes.iter().enumerate().position(|(k, q)| {
                        k != i
                            && q.state == State::Up
                            && now - q.heard < self.down_after
                            && !stalled(q)
                    })
                })
                .flatten();
            let p = &mut self.planes[i];
            let Some(w) = witness else {
                p.suspect = None;
                continue;
            };
            let since = *p.suspect.get_or_insert(now);
            if now - p.moved < self.down_after || now - since < half {
                continue;
            }
            p.state = State::Down;
            p.suspect = None;
            let unwritten =
                p.tx.as_ref()
                    .filter(|t| t.len > 0)
                    .map_or(0, |t| (t.head_len + t.len - t.done) as u64);
            let stuck = p.wrote - p.peer_read + unwritten;
            let ms = (now - p.moved).as_millis();
            ccl_warn!(
                None,
                "{} to peer {} is down: {stuck} bytes unread for {ms} ms while {} \
                 delivers (CCL_PLANE_TIMEOUT_MS); its unacknowledged bytes go again on the \
                 other planes, and it is used again once it delivers",
                self.planes[i].name(),
                self.peer,
                self.planes[w].name()
            );
            self.requeue(i);
        }
    }
}
