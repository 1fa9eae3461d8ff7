//! The receiving half: frames read in stream order whichever plane brought them.

use super::*;

impl Inner {
    /// Reads frame headers on plane `i` until it holds a data frame (or nothing more is
    /// readable). Returns that frame's `(next byte, end)`.
    pub(super) fn head(&mut self, i: usize) -> Result<Option<(u64, u64)>> {
        loop {
            let p = &mut self.planes[i];
            if p.state == State::Dead {
                return Ok(None);
            }
            let (want, got) = match p.rx {
                Rx::Data(at, end) => return Ok(Some((at, end))),
                Rx::Header(got) => (HDR, got),
                Rx::Ack(len, got) => (HDR + len, HDR + got),
            };
            let r = p.link.read(&mut p.rx_head[got..want]);
            let n = match self.read_result(i, r)? {
                Some(0) | None => return Ok(None),
                Some(n) => n,
            };
            let p = &mut self.planes[i];
            let got = got + n;
            if got < want {
                p.rx = match p.rx {
                    Rx::Header(_) => Rx::Header(got),
                    Rx::Ack(len, _) => Rx::Ack(len, got - HDR),
                    Rx::Data(..) => unreachable!(),
                };
                continue;
            }
            let h = &p.rx_head;
            let kind = h[2];
            let len = u32::from_le_bytes(h[4..8].try_into().expect("4")) as usize;
            let off = u64::from_le_bytes(h[8..16].try_into().expect("8"));
            if h[..2] != MAGIC || !matches!(kind, DATA | ACK | PING | BYE | REDIAL) {
                let e = Error::internal(format!(
                    "{} from peer {}: bad frame header {:02x?} (a corrupted stream)",
                    p.name(),
                    self.peer,
                    &h[..HDR]
                ))
                .peer(self.peer);
                self.plane_failed(i, e)?;
                return Ok(None);
            }
            match (kind, &p.rx) {
                (DATA, _) => {
                    if off + len as u64 > self.next + WINDOW as u64 {
                        let e = Error::internal(format!(
                            "{} from peer {}: frame at {off}+{len} beyond the window \
                             (delivered {})",
                            p.name(),
                            self.peer,
                            self.next
                        ))
                        .peer(self.peer);
                        self.plane_failed(i, e)?;
                        return Ok(None);
                    }
                    p.read += HDR as u64;
                    p.rx = Rx::Data(off, off + len as u64);
                }
                (ACK, Rx::Header(_)) if len > 0 && len <= ACK_MAX => p.rx = Rx::Ack(len, 0),
                (ACK, Rx::Ack(..)) => {
                    let planes = h[3] as usize;
                    let delivered = u64::from_le_bytes(h[HDR..HDR + 8].try_into().expect("8"));
                    let mut reads = [0u64; MAX_PLANES];
                    for (k, r) in reads.iter_mut().enumerate().take(planes.min(MAX_PLANES)) {
                        let at = HDR + 8 + 8 * k;
                        *r = u64::from_le_bytes(h[at..at + 8].try_into().expect("8"));
                    }
                    p.rx = Rx::Header(0);
                    self.on_ack(delivered, &reads[..planes.min(MAX_PLANES)]);
                }
                (BYE, _) => {
                    p.rx = Rx::Header(0);
                    self.closing = true;
                    self.peer_left = true;
                }
                (REDIAL, _) => {
                    p.rx = Rx::Header(0);
                    let j = h[3] as usize;
                    self.on_redial(j, off);
                }
                (PING, _) => {
                    p.rx = Rx::Header(0);
                    for p in &mut self.planes {
                        p.ack_due = true;
                    }
                }
                _ => {
                    let e = Error::internal(format!(
                        "{} from peer {}: bad ack of {len} bytes",
                        p.name(),
                        self.peer
                    ));
                    self.plane_failed(i, e)?;
                    return Ok(None);
                }
            }
        }
    }

    pub(super) fn on_ack(&mut self, delivered: u64, reads: &[u64]) {
        let now = Instant::now();
        if delivered > self.acked {
            self.acked = delivered.min(self.taken);
            let acked = self.acked;
            for p in &mut self.planes {
                p.sent.retain(|r| r.1 > acked);
            }
            self.resend.retain(|r| r.1 > acked);
            if let Some(r) = self.resend.first_mut() {
                r.0 = r.0.max(acked);
            }
        }
        for (p, &count) in self.planes.iter_mut().zip(reads) {
            // A count of the plane's connection before (or after) this one is not this one's.
            if (count >> GEN_SHIFT) as u8 != p.generation {
                continue;
            }
            let r = count & ((1 << GEN_SHIFT) - 1);
            if r > p.peer_read {
                let moved = r.min(p.wrote) - p.peer_read;
                // Delivery rate while the plane had bytes in flight (`moved` is when the last
                // ack advanced or the plane went from idle to busy): what sizes its share.
                let dt = (now - p.moved).as_secs_f64();
                // A stall (a cut, a down plane catching up) is no measure of the rate.
                if moved >= 64 << 10 && dt > 0.0 && dt < 0.25 {
                    let sample = moved as f64 / dt;
                    p.rate = if p.rate == 0.0 {
                        sample
                    } else {
                        0.75 * p.rate + 0.25 * sample
                    };
                }
                p.peer_read += moved;
                p.moved = now;
                if p.state == State::Down && p.peer_read == p.wrote {
                    p.state = State::Up;
                    p.rate = 0.0;
                    ccl_warn!(
                        None,
                        "{} to peer {} delivers again; it takes its share of new frames",
                        p.name(),
                        self.peer
                    );
                }
            }
        }
    }

    /// Maps a read's result: `Some(n)` bytes (0: nothing now), `None`: interrupted. A closed or
    /// failed plane is dead (an error only when it was the last one).
    pub(super) fn read_result(&mut self, i: usize, r: io::Result<usize>) -> Result<Option<usize>> {
        match r {
            Ok(0) => {
                let e = Error::remote(format!(
                    "{} to peer {} was closed by the peer (did it exit or fail?)",
                    self.planes[i].name(),
                    self.peer
                ))
                .peer(self.peer);
                self.plane_failed(i, e)?;
                Ok(Some(0))
            }
            Ok(n) => {
                self.planes[i].heard = Instant::now();
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Some(0)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => {
                let e = self.io_error(i, "receive from", e);
                self.plane_failed(i, e)?;
                Ok(Some(0))
            }
        }
    }

    /// Reads plane `i`'s current data frame where it belongs: bytes already delivered are
    /// dropped, bytes at `next` go to `dst` when given, the rest into the receive ring. With
    /// `ahead` false, stops at a frame that starts beyond `next` (it waits in the socket).
    /// Returns bytes put into `dst`.
    pub(super) fn drain(
        &mut self,
        i: usize,
        mut dst: Option<&mut [u8]>,
        ahead: bool,
    ) -> Result<usize> {
        let mut given = 0;
        loop {
            let Some((at, end)) = self.head(i)? else {
                return Ok(given);
            };
            if at == end {
                self.planes[i].rx = Rx::Header(0);
                continue;
            }
            let r = if end <= self.next || at < self.next {
                let skip = ((end.min(self.next) - at) as usize).min(self.scratch.len());
                let r = self.planes[i].link.read(&mut self.scratch[..skip]);
                self.read_result(i, r)?
            } else if at == self.next && self.have.run_at(at) == 0 && dst.is_some() {
                let d = dst.as_deref_mut().expect("checked");
                if given == d.len() {
                    return Ok(given);
                }
                let want = ((end - at) as usize).min(d.len() - given);
                let r = self.planes[i].link.read(&mut d[given..given + want]);
                let got = self.read_result(i, r)?;
                if let Some(n) = got {
                    given += n;
                    self.next += n as u64;
                    self.have.trim(self.next);
                }
                got
            } else if at == self.next || ahead {
                self.inq.ready();
                let r = self.planes[i]
                    .link
                    .read(self.inq.at_mut(at, (end - at) as usize));
                let got = self.read_result(i, r)?;
                if let Some(n) = got {
                    self.have.add(at, at + n as u64);
                }
                got
            } else {
                return Ok(given);
            };
            match r {
                Some(0) => return Ok(given),
                Some(n) => {
                    let p = &mut self.planes[i];
                    p.read += n as u64;
                    let at = at + n as u64;
                    p.rx = if at == end {
                        Rx::Header(0)
                    } else {
                        Rx::Data(at, end)
                    };
                }
                None => {}
            }
        }
    }

    /// Copies delivered-in-order bytes out of the receive ring into `dst`.
    pub(super) fn take_ring(&mut self, dst: &mut [u8]) -> usize {
        let mut n = 0;
        while n < dst.len() {
            let run = self.have.run_at(self.next) as usize;
            if run == 0 {
                break;
            }
            let s = self.inq.at(self.next, run.min(dst.len() - n));
            let k = s.len();
            dst[n..n + k].copy_from_slice(s);
            n += k;
            self.next += k as u64;
        }
        self.have.trim(self.next);
        n
    }
}
