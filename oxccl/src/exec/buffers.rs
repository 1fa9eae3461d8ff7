//! The buffers an operation works on: the caller's, scratch, and the registered ones, and
//! the regions a schedule names in them.

use super::*;

impl Registered<'_> {
    /// The region of buffer `buf` registered with transport `transport`, if any.
    pub(super) fn region(&self, buf: Buf, transport: Option<&str>) -> Option<&dyn MemRegion> {
        let regions = match buf {
            Buf::Send => self.send,
            Buf::Recv => self.recv,
            _ => return None,
        };
        let t = transport?;
        regions.iter().find(|r| r.transport() == t).map(|r| &**r)
    }
}

pub(super) fn outside(r: &Region) -> Error {
    Error::internal(format!("schedule region {r:?} is outside its buffer"))
}

impl<'a> Buffers<'a> {
    /// The caller's buffers alone, with no scratch space or group buffers.
    pub(super) fn caller(send: Option<&'a [u8]>, recv: &'a mut [u8]) -> Buffers<'a> {
        Buffers {
            send,
            recv,
            scratch: Default::default(),
            extra: Vec::new(),
        }
    }

    pub(super) fn range(r: &Region, elem: usize) -> std::ops::Range<usize> {
        r.off * elem..r.end() * elem
    }

    pub(super) fn get(&self, r: &Region, elem: usize) -> Result<&[u8]> {
        let b: &[u8] = match r.buf {
            Buf::Send => self
                .send
                .ok_or_else(|| Error::internal("schedule reads the send buffer in place"))?,
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
            Buf::Extra(i) => match self.extra.get(i as usize) {
                Some(ExtraBuf::Src(b)) => b,
                Some(ExtraBuf::Dst(b)) => b,
                None => return Err(Error::internal(format!("no group buffer {i}"))),
            },
            // Host memory is the run's, not the caller's (`Run::region`).
            Buf::Host(_) | Buf::PeerIn(_) | Buf::PeerOut(_) => return Err(no_host()),
        };
        b.get(Self::range(r, elem)).ok_or_else(|| outside(r))
    }

    pub(super) fn get_mut(&mut self, r: &Region, elem: usize) -> Result<&mut [u8]> {
        let b: &mut [u8] = match r.buf {
            Buf::Send => return Err(Error::internal("schedule writes the send buffer")),
            Buf::Recv => self.recv,
            Buf::Scratch => self.scratch,
            Buf::Extra(i) => match self.extra.get_mut(i as usize) {
                Some(ExtraBuf::Dst(b)) => b,
                Some(ExtraBuf::Src(_)) => {
                    return Err(Error::internal(format!(
                        "schedule writes send-only group buffer {i}"
                    )));
                }
                None => return Err(Error::internal(format!("no group buffer {i}"))),
            },
            Buf::Host(_) | Buf::PeerIn(_) | Buf::PeerOut(_) => return Err(no_host()),
        };
        b.get_mut(Self::range(r, elem)).ok_or_else(|| outside(r))
    }

    /// `dst` for writing and `src` for reading; `None` for `src` when it is `dst` itself.
    pub(super) fn pair(
        &mut self,
        dst: &Region,
        src: &Region,
        elem: usize,
    ) -> Result<(&mut [u8], Option<&[u8]>)> {
        if dst == src {
            return Ok((self.get_mut(dst, elem)?, None));
        }
        if dst.overlaps(src) {
            return Err(Error::internal(format!(
                "overlapping operands {dst:?} {src:?}"
            )));
        }
        let Buffers {
            send,
            recv,
            scratch,
            ..
        } = self;
        let no_send = || Error::internal("schedule reads the send buffer in place");
        if dst.buf != src.buf {
            let (d, sb): (&mut [u8], &[u8]) = match (dst.buf, src.buf) {
                (Buf::Recv, Buf::Send) => (recv, send.ok_or_else(no_send)?),
                (Buf::Recv, Buf::Scratch) => (recv, scratch),
                (Buf::Scratch, Buf::Send) => (scratch, send.ok_or_else(no_send)?),
                (Buf::Scratch, Buf::Recv) => (scratch, recv),
                _ => {
                    return Err(Error::internal(
                        "unsupported operand buffers for a local op",
                    ));
                }
            };
            let sl = sb.get(Self::range(src, elem)).ok_or_else(|| outside(src))?;
            let dl = d
                .get_mut(Self::range(dst, elem))
                .ok_or_else(|| outside(dst))?;
            return Ok((dl, Some(sl)));
        }
        // Same buffer, disjoint ranges: split it.
        let whole: &mut [u8] = match dst.buf {
            Buf::Recv => recv,
            Buf::Scratch => scratch,
            _ => {
                return Err(Error::internal(
                    "unsupported operand buffers for a local op",
                ));
            }
        };
        let (dr, sr) = (Self::range(dst, elem), Self::range(src, elem));
        if dr.end.max(sr.end) > whole.len() {
            return Err(outside(dst));
        }
        if dr.start < sr.start {
            let (a, b) = whole.split_at_mut(sr.start);
            Ok((&mut a[dr], Some(&b[..sr.len()])))
        } else {
            let (a, b) = whole.split_at_mut(dr.start);
            Ok((&mut b[..dr.len()], Some(&a[sr])))
        }
    }
}
