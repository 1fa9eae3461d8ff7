//! The executor: runs any [`Schedule`] over a communicator's endpoints.
//!
//! It keeps, per peer, a queue of sends and a queue of receives in wire order, and a queue of
//! local ops. Each pass offers every queue head as much work as its dependencies allow, using the
//! endpoints' non-blocking calls; a send that streams from a receive forwards bytes as they are
//! reduced (in pieces of at least `CCL_CHUNK_SIZE`, so the pipeline does not degrade into tiny
//! writes). Reducing receives reduce straight from the transport's buffer into their destination.
//!
//! When a pass makes no progress the executor spins for `CCL_SPIN_US`, then blocks in `poll(2)`
//! on the endpoints' descriptors and the communicator's abort signal. A wait that sees no
//! progress for `CCL_TIMEOUT` fails with an error that names the peers it was waiting on and how
//! far each transfer got.
//!
//! The executor allocates nothing on the way through a collective except when it is about to
//! block (the poll set), and reuses its state between calls.

use std::fmt::Write as _;
use std::time::Instant;

use ccl_core::comm::{Comm, Links};
use ccl_core::reduce::{self, Order};
use ccl_core::trace::{self, Begin};
use ccl_core::transport::Interest;
use ccl_core::{DataType, Error, ErrorKind, ReduceOp, Result};
use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::algo::Collective;
use crate::header::{HEADER_LEN, Header};
use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule};

/// The buffers a schedule works on, as bytes.
#[derive(Debug)]
pub struct Buffers<'a> {
    /// Input of an out-of-place collective (`None` in place).
    pub send: Option<&'a [u8]>,
    pub recv: &'a mut [u8],
    pub scratch: &'a mut [u8],
    /// More caller buffers (`Buf::Extra(i)`), for groups of sends and receives.
    pub extra: Vec<ExtraBuf<'a>>,
}

/// A caller buffer of a point-to-point group: sent from, or received into.
#[derive(Debug)]
pub enum ExtraBuf<'a> {
    Src(&'a [u8]),
    Dst(&'a mut [u8]),
}

fn outside(r: &Region) -> Error {
    Error::internal(format!("schedule region {r:?} is outside its buffer"))
}

impl Buffers<'_> {
    fn range(r: &Region, es: usize) -> std::ops::Range<usize> {
        r.off * es..r.end() * es
    }

    fn get(&self, r: &Region, es: usize) -> Result<&[u8]> {
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
        };
        b.get(Self::range(r, es)).ok_or_else(|| outside(r))
    }

    fn get_mut(&mut self, r: &Region, es: usize) -> Result<&mut [u8]> {
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
        };
        b.get_mut(Self::range(r, es)).ok_or_else(|| outside(r))
    }

    /// `dst` for writing and `src` for reading; `None` for `src` when it is `dst` itself.
    fn pair(
        &mut self,
        dst: &Region,
        src: &Region,
        es: usize,
    ) -> Result<(&mut [u8], Option<&[u8]>)> {
        if dst == src {
            return Ok((self.get_mut(dst, es)?, None));
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
            let sl = sb.get(Self::range(src, es)).ok_or_else(|| outside(src))?;
            let dl = d
                .get_mut(Self::range(dst, es))
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
        let (dr, sr) = (Self::range(dst, es), Self::range(src, es));
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

/// Describes the running operation: in error messages, and in the header each peer checks.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    /// `allreduce`, `broadcast`, ...
    pub name: &'static str,
    pub seq: u64,
    pub bytes: usize,
    /// `Collective::id`, or `header::KIND_P2P`.
    pub kind: u8,
    /// `Algo::id` (0 for send/recv).
    pub algo: u8,
    pub root: usize,
    pub count: usize,
}

/// A first send this small travels in the same write as the header.
const COALESCE: usize = 2048;
/// With the header, a receiver reads ahead this much of the first message in the same call.
const LOOKAHEAD: usize = 4096;

/// Reusable executor state.
#[derive(Debug, Default)]
pub struct ExecState {
    /// Bytes done per op.
    done: Vec<usize>,
    send_cur: Vec<usize>,
    recv_cur: Vec<usize>,
    local_cur: usize,
    remaining: usize,
    /// Headers sent to / received from each rank so far (the per-channel sequence).
    hdr_out: Vec<u64>,
    hdr_in: Vec<u64>,
    /// Per peer queue: the header (and a small first message) to send, and how much went.
    out_buf: Vec<Vec<u8>>,
    out_sent: Vec<usize>,
    /// Bytes of the first send op carried in `out_buf`.
    out_carried: Vec<usize>,
    /// Per peer queue: the header being received, and how much arrived.
    in_buf: Vec<[u8; HEADER_LEN]>,
    in_got: Vec<usize>,
    /// Whether a header is expected from the peer of each queue.
    in_want: Vec<bool>,
    /// Headers still to send or receive.
    hdr_pending: usize,
    /// When this rank entered the operation (microseconds since the epoch).
    entry_us: u64,
    /// Per peer queue: time spent waiting for the peer, and how late it entered.
    wait_us: Vec<u64>,
    late_us: Vec<Option<i64>>,
    /// Since when nothing has moved, and whose data was awaited then.
    idle_since: Option<(Instant, Option<usize>)>,
}

impl ExecState {
    fn reset(&mut self, s: &Schedule, es: usize) {
        self.done.clear();
        self.done.resize(s.ops.len(), 0);
        self.send_cur.clear();
        self.send_cur.resize(s.peers.len(), 0);
        self.recv_cur.clear();
        self.recv_cur.resize(s.peers.len(), 0);
        self.local_cur = 0;
        self.remaining = s.ops.iter().filter(|o| o.action.len() * es > 0).count();
        let q = s.peers.len();
        if self.out_buf.len() < q {
            self.out_buf
                .resize_with(q, || Vec::with_capacity(HEADER_LEN + COALESCE));
        }
        self.out_sent.clear();
        self.out_sent.resize(q, 0);
        self.out_carried.clear();
        self.out_carried.resize(q, 0);
        self.in_buf.clear();
        self.in_buf.resize(q, [0; HEADER_LEN]);
        self.in_got.clear();
        self.in_got.resize(q, 0);
        self.in_want.clear();
        self.in_want.resize(q, false);
        self.hdr_pending = 0;
        self.entry_us = trace::now_us();
        self.wait_us.clear();
        self.wait_us.resize(q, 0);
        self.late_us.clear();
        self.late_us.resize(q, None);
        self.idle_since = None;
    }

    /// Charges the idle time that just ended to the peer that was awaited.
    fn end_idle(&mut self) {
        if let Some((t, Some(pi))) = self.idle_since.take() {
            self.wait_us[pi] += t.elapsed().as_micros() as u64;
        }
    }

    /// Brings the recorder's entry for this operation up to date.
    fn sync_trace(&self, comm: &Comm, s: &Schedule, es: usize, waiting_on: Option<usize>) {
        let mut r = comm.recorder();
        let Some(e) = r.current() else { return };
        e.waiting_on = waiting_on;
        for (pi, (stat, p)) in e.peers.iter_mut().zip(&s.peers).enumerate() {
            stat.sent = p.sends.iter().map(|&id| self.done[id] as u64).sum();
            stat.received = p.recvs.iter().map(|&id| self.done[id] as u64).sum();
            stat.arrived = !self.in_want[pi] || self.in_got[pi] == HEADER_LEN;
            stat.waited_us = self.wait_us[pi];
            stat.late_us = self.late_us[pi].unwrap_or(0);
        }
        let _ = es;
    }

    /// Queues the header for every peer this rank sends to, with a small first message riding
    /// along, and notes which peers' headers to expect.
    #[allow(clippy::too_many_arguments)]
    fn prepare_headers(
        &mut self,
        s: &Schedule,
        n: usize,
        es: usize,
        info: &OpInfo,
        dtype: DataType,
        op: ReduceOp,
        bufs: &Buffers<'_>,
    ) -> Result<()> {
        if self.hdr_out.len() != n {
            self.hdr_out = vec![0; n];
            self.hdr_in = vec![0; n];
        }
        for (pi, p) in s.peers.iter().enumerate() {
            let out = &mut self.out_buf[pi];
            out.clear();
            let bytes = p.send_elems * es;
            if bytes > 0 {
                let h =
                    ExecState::header(info, dtype, op, self.hdr_out[p.peer], bytes, self.entry_us);
                self.hdr_out[p.peer] += 1;
                out.extend_from_slice(&h.encode());
                self.hdr_pending += 1;
                let first = p.sends[0];
                let o = &s.ops[first];
                let len = o.action.len() * es;
                // Data that no earlier op writes is final now and may go with the header.
                if o.deps.is_empty()
                    && o.stream_from.is_none()
                    && len <= COALESCE
                    && let Action::Send { src, .. } = o.action
                {
                    out.extend_from_slice(bufs.get(&src, es)?);
                    self.out_carried[pi] = len;
                }
            }
            if p.recv_elems * es > 0 {
                self.in_want[pi] = true;
                self.hdr_pending += 1;
            }
        }
        Ok(())
    }

    fn header(
        info: &OpInfo,
        dtype: DataType,
        op: ReduceOp,
        seq: u64,
        bytes: usize,
        entry_us: u64,
    ) -> Header {
        Header {
            kind: info.kind,
            dtype: dtype as u8,
            op: op as u8,
            algo: info.algo,
            root: info.root as u32,
            seq,
            count: info.count as u64,
            bytes: bytes as u64,
            entry_us,
        }
    }

    #[inline]
    fn complete(&self, s: &Schedule, id: OpId, es: usize) -> bool {
        self.done[id] == s.ops[id].action.len() * es
    }

    #[inline]
    fn deps_done(&self, s: &Schedule, id: OpId, es: usize) -> bool {
        s.ops[id].deps.iter().all(|&d| self.complete(s, d, es))
    }

    /// How many bytes of send `id` may go now.
    #[inline]
    fn allowed(&self, s: &Schedule, id: OpId, es: usize) -> usize {
        if !self.deps_done(s, id, es) {
            return 0;
        }
        let len = s.ops[id].action.len() * es;
        match s.ops[id].stream_from {
            Some(p) => self.done[p].min(len),
            None => len,
        }
    }
}

/// Runs `s` to completion (or error), recording it in the communicator's flight recorder.
#[allow(clippy::too_many_arguments)]
pub fn run(
    comm: &Comm,
    links: &mut Links,
    st: &mut ExecState,
    s: &Schedule,
    bufs: &mut Buffers<'_>,
    dtype: DataType,
    op: ReduceOp,
    info: &OpInfo,
) -> Result<()> {
    let es = dtype.size();
    let rooted = [Collective::Broadcast.id(), Collective::Reduce.id()].contains(&info.kind);
    comm.recorder().begin(
        Begin {
            seq: info.seq,
            name: info.name,
            algo: s.algo,
            dtype: dtype.name(),
            op: op.name(),
            count: info.count as u64,
            bytes: info.bytes as u64,
            root: rooted.then_some(info.root),
        },
        s.peers.iter().map(|p| {
            (
                p.peer,
                (p.send_elems * es) as u64,
                (p.recv_elems * es) as u64,
            )
        }),
    );
    let r = drive(comm, links, st, s, bufs, dtype, op, info);
    st.end_idle();
    let waiting = r.as_ref().err().and(first_waited_peer(s, st, es));
    st.sync_trace(comm, s, es, waiting);
    comm.recorder().end(r.as_ref().err().map(|e| e.to_string()));
    if r.is_ok() {
        comm.note_lateness(
            s.peers
                .iter()
                .zip(&st.late_us)
                .filter_map(|(p, l)| l.map(|l| (p.peer, l))),
        );
    }
    r
}

/// Runs `s` to completion (or error). `n` is the world size (for `Avg`).
#[allow(clippy::too_many_arguments)]
fn drive(
    comm: &Comm,
    links: &mut Links,
    st: &mut ExecState,
    s: &Schedule,
    bufs: &mut Buffers<'_>,
    dtype: DataType,
    op: ReduceOp,
    info: &OpInfo,
) -> Result<()> {
    let es = dtype.size();
    let n = comm.size();
    let cfg = comm.config();
    let chunk = cfg.chunk_size.max(es);
    let abort = comm.abort_signal();
    let fail = |e: Error| -> Error {
        let e = e.rank(comm.rank()).context(format!(
            "{} #{} ({}, {} bytes)",
            info.name, info.seq, s.algo, info.bytes
        ));
        comm.explain(e)
    };
    // Zero-length ops count as complete from the start (0 of 0 bytes done).
    st.reset(s, es);
    st.prepare_headers(s, n, es, info, dtype, op, bufs)
        .map_err(fail)?;
    let mut last_progress = Instant::now();
    while st.remaining > 0 || st.hdr_pending > 0 {
        if abort.is_raised() {
            return Err(comm.check().err().unwrap_or_else(|| {
                Error::new(ErrorKind::Aborted, "the communicator was aborted").rank(comm.rank())
            }));
        }
        let mut progressed = false;

        // Local ops run whole, in order, once their dependencies are done.
        while let Some(&id) = s.locals.get(st.local_cur) {
            if !st.deps_done(s, id, es) {
                break;
            }
            run_local(s, id, bufs, dtype, op, n, es).map_err(fail)?;
            st.done[id] = s.ops[id].action.len() * es;
            if st.done[id] > 0 {
                st.remaining -= 1;
            }
            st.local_cur += 1;
            progressed = true;
        }

        for (pi, p) in s.peers.iter().enumerate() {
            // The header goes before any data to this peer.
            let out_len = st.out_buf[pi].len();
            if st.out_sent[pi] < out_len {
                let ep = links.get(p.peer).map_err(fail)?;
                let k = ep.send(&st.out_buf[pi][st.out_sent[pi]..]).map_err(|e| {
                    fail(e.context(format!("sending the operation header to peer {}", p.peer)))
                })?;
                st.out_sent[pi] += k;
                progressed |= k > 0;
                if st.out_sent[pi] == out_len {
                    st.hdr_pending -= 1;
                    let carried = st.out_carried[pi];
                    if carried > 0 {
                        let id = p.sends[0];
                        st.done[id] = carried;
                        if carried == s.ops[id].action.len() * es {
                            st.remaining -= 1;
                        }
                    }
                }
            }
            // Sends.
            while st.out_sent[pi] == out_len
                && let Some(&id) = p.sends.get(st.send_cur[pi])
            {
                let len = s.ops[id].action.len() * es;
                if st.done[id] == len {
                    st.send_cur[pi] += 1;
                    continue;
                }
                let allowed = st.allowed(s, id, es);
                let pending = allowed.saturating_sub(st.done[id]);
                if pending == 0 || (allowed < len && pending < chunk) {
                    break;
                }
                let Action::Send { src, .. } = s.ops[id].action else {
                    unreachable!("send queue holds sends")
                };
                let data = bufs.get(&src, es).map_err(fail)?;
                let ep = links.get(p.peer).map_err(fail)?;
                let k = ep.send(&data[st.done[id]..allowed]).map_err(|e| {
                    fail(e.context(format!(
                        "sending step {} to peer {}",
                        s.ops[id].step, p.peer
                    )))
                })?;
                if k == 0 {
                    break;
                }
                st.done[id] += k;
                progressed = true;
                if st.done[id] == len {
                    st.remaining -= 1;
                    st.send_cur[pi] += 1;
                } else {
                    break;
                }
            }
            // The peer's header is checked before any of its data is taken.
            if st.in_want[pi] && st.in_got[pi] < HEADER_LEN {
                let got = st.in_got[pi];
                let want = HEADER_LEN - got;
                // Reading ahead lets a small first message arrive in the same call; the
                // transport keeps those bytes for the receive that follows.
                let look = p
                    .recvs
                    .first()
                    .map_or(0, |&id| s.ops[id].action.len() * es)
                    .min(LOOKAHEAD);
                let hb = &mut st.in_buf[pi];
                let ep = links.get(p.peer).map_err(fail)?;
                // A transport may lend the bytes in several pieces (a message-based one hands
                // out one slot at a time): take only what the header still lacks.
                let mut taken = 0;
                let k = ep
                    .recv_with(want + look, &mut |b: &[u8]| {
                        let t = b.len().min(want - taken);
                        hb[got + taken..got + taken + t].copy_from_slice(&b[..t]);
                        taken += t;
                        t
                    })
                    .map_err(|e| {
                        fail(e.context(format!(
                            "receiving the operation header from peer {}",
                            p.peer
                        )))
                    })?;
                st.in_got[pi] += k;
                progressed |= k > 0;
                if st.in_got[pi] == HEADER_LEN {
                    st.hdr_pending -= 1;
                    let mismatch = |m: String| {
                        fail(
                            Error::invalid_usage(format!("with peer {}: {m}", p.peer)).peer(p.peer),
                        )
                    };
                    let theirs = Header::decode(&st.in_buf[pi]).map_err(mismatch)?;
                    let expect = p.recv_elems * es;
                    let mine =
                        ExecState::header(info, dtype, op, st.hdr_in[p.peer], expect, st.entry_us);
                    st.hdr_in[p.peer] += 1;
                    Header::check(&mine, &theirs).map_err(mismatch)?;
                    st.late_us[pi] = Some(theirs.entry_us as i64 - st.entry_us as i64);
                }
            }
            // Receives.
            while (!st.in_want[pi] || st.in_got[pi] == HEADER_LEN)
                && let Some(&id) = p.recvs.get(st.recv_cur[pi])
            {
                let len = s.ops[id].action.len() * es;
                if st.done[id] == len {
                    st.recv_cur[pi] += 1;
                    continue;
                }
                if !st.deps_done(s, id, es) {
                    break;
                }
                // A receive that streams from a producer (a second child's data reduced behind
                // the first's) may go only as far as the producer has.
                let limit = match s.ops[id].stream_from {
                    Some(src) => st.done[src].min(len),
                    None => len,
                };
                if limit <= st.done[id] {
                    break;
                }
                let k = recv_some(
                    s,
                    id,
                    st.done[id],
                    limit,
                    bufs,
                    links,
                    p.peer,
                    dtype,
                    op,
                    n,
                    es,
                )
                .map_err(|e| {
                    fail(e.context(format!(
                        "receiving step {} from peer {}",
                        s.ops[id].step, p.peer
                    )))
                })?;
                if k == 0 {
                    break;
                }
                st.done[id] += k;
                progressed = true;
                if st.done[id] == len {
                    st.remaining -= 1;
                    st.recv_cur[pi] += 1;
                } else {
                    break;
                }
            }
        }

        if progressed {
            last_progress = Instant::now();
            st.end_idle();
            continue;
        }
        if st.idle_since.is_none() {
            let waited =
                first_waited_peer(s, st, es).and_then(|p| s.peers.iter().position(|q| q.peer == p));
            st.idle_since = Some((Instant::now(), waited));
        }
        let idle = last_progress.elapsed();
        if idle >= cfg.timeout {
            let mut e = Error::timeout(format!(
                "no progress for {:.1} s; {}",
                idle.as_secs_f64(),
                describe_pending(s, st, es)
            ));
            // The peer whose data we wait for is the one to look at first.
            if let Some(p) = first_waited_peer(s, st, es) {
                e = e.peer(p);
            }
            return Err(fail(e));
        }
        if idle < cfg.spin {
            // Plain busy-polling: yielding here would hand a competing process a whole
            // timeslice per round (measured: 8 B allreduce 3.4 us -> 1.5 ms beside one busy
            // loop). Blocking after the spin window is what leaves the core to others.
            std::hint::spin_loop();
            continue;
        }
        block(comm, links, st, s, es, chunk, cfg.timeout - idle).map_err(fail)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn recv_some(
    s: &Schedule,
    id: OpId,
    done: usize,
    limit: usize,
    bufs: &mut Buffers<'_>,
    links: &mut Links,
    peer: usize,
    dtype: DataType,
    op: ReduceOp,
    n: usize,
    es: usize,
) -> Result<usize> {
    let Action::Recv { dst, combine, .. } = s.ops[id].action else {
        unreachable!("receive queue holds receives")
    };
    let ep = links.get(peer)?;
    match combine {
        Combine::Copy => {
            let d = bufs.get_mut(&dst, es)?;
            ep.recv(&mut d[done..limit])
        }
        Combine::Reduce {
            with,
            incoming_first,
            finish_avg,
        } => {
            let (d, w) = match with {
                Some(w) => bufs.pair(&dst, &w, es)?,
                None => (bufs.get_mut(&dst, es)?, None),
            };
            let mut off = done;
            let order = if incoming_first {
                Order::SrcFirst
            } else {
                Order::AccFirst
            };
            ep.recv_with(limit - done, &mut |incoming: &[u8]| {
                // Whole elements only; a partial one is offered again once complete.
                let k = incoming.len() / es * es;
                if k == 0 {
                    return 0;
                }
                let out = &mut d[off..off + k];
                match w {
                    None => reduce::reduce_inplace(dtype, op, out, &incoming[..k], order),
                    Some(w) => {
                        let mine = &w[off..off + k];
                        if incoming_first {
                            reduce::reduce_into(dtype, op, out, &incoming[..k], mine)
                        } else {
                            reduce::reduce_into(dtype, op, out, mine, &incoming[..k])
                        }
                    }
                }
                if finish_avg {
                    reduce::finish_avg(dtype, out, n);
                }
                off += k;
                k
            })
        }
    }
}

fn run_local(
    s: &Schedule,
    id: OpId,
    bufs: &mut Buffers<'_>,
    dtype: DataType,
    op: ReduceOp,
    n: usize,
    es: usize,
) -> Result<()> {
    match s.ops[id].action {
        Action::Copy { src, dst } => {
            let (d, sr) = bufs.pair(&dst, &src, es)?;
            if let Some(sr) = sr {
                d.copy_from_slice(sr);
            }
        }
        Action::Reduce {
            dst,
            src,
            src_first,
        } => {
            let (d, sr) = bufs.pair(&dst, &src, es)?;
            let sr = sr.ok_or_else(|| Error::internal("local reduce of a region with itself"))?;
            let order = if src_first {
                Order::SrcFirst
            } else {
                Order::AccFirst
            };
            reduce::reduce_inplace(dtype, op, d, sr, order);
        }
        Action::FinishAvg { region } => {
            if op == ReduceOp::Avg {
                reduce::finish_avg(dtype, bufs.get_mut(&region, es)?, n);
            }
        }
        Action::Send { .. } | Action::Recv { .. } => unreachable!("local queue holds local ops"),
    }
    Ok(())
}

/// The first peer with a receive whose dependencies are met but whose data has not arrived.
fn first_waited_peer(s: &Schedule, st: &ExecState, es: usize) -> Option<usize> {
    s.peers.iter().enumerate().find_map(|(pi, p)| {
        if st.in_want[pi] && st.in_got[pi] < HEADER_LEN {
            return Some(p.peer);
        }
        let &id = p.recvs.get(st.recv_cur[pi])?;
        st.deps_done(s, id, es).then_some(p.peer)
    })
}

/// What each peer queue is waiting for, for timeout messages.
fn describe_pending(s: &Schedule, st: &ExecState, es: usize) -> String {
    let mut out = String::new();
    for (pi, p) in s.peers.iter().enumerate() {
        if st.in_want[pi] && st.in_got[pi] < HEADER_LEN {
            let _ = write!(
                out,
                "waiting to receive from peer {} (its operation header: {} of {HEADER_LEN} bytes arrived; has it made this call?); ",
                p.peer, st.in_got[pi]
            );
            continue;
        }
        if st.out_sent[pi] < st.out_buf[pi].len() {
            let _ = write!(
                out,
                "sending to peer {} blocked (the operation header; is peer {} reading?); ",
                p.peer, p.peer
            );
        }
        if let Some(&id) = p.recvs.get(st.recv_cur[pi]) {
            let len = s.ops[id].action.len() * es;
            let _ = write!(
                out,
                "waiting to receive from peer {} (step {}: {} of {len} bytes arrived); ",
                p.peer, s.ops[id].step, st.done[id]
            );
        }
        if let Some(&id) = p.sends.get(st.send_cur[pi]) {
            let len = s.ops[id].action.len() * es;
            if st.allowed(s, id, es) > st.done[id] {
                let _ = write!(
                    out,
                    "sending to peer {} blocked (step {}: {} of {len} bytes taken; is peer {} reading?); ",
                    p.peer, s.ops[id].step, st.done[id], p.peer
                );
            }
        }
    }
    if out.is_empty() {
        out.push_str("no transfer pending (schedule stalled)");
    }
    out.trim_end_matches("; ").to_string()
}

/// Sleeps in poll(2) until an endpoint we wait on or the abort signal is ready, or `max` passes.
fn block(
    comm: &Comm,
    links: &mut Links,
    st: &ExecState,
    s: &Schedule,
    es: usize,
    chunk: usize,
    max: std::time::Duration,
) -> Result<()> {
    let mut interests: Vec<(usize, Interest)> = Vec::with_capacity(s.peers.len());
    for (pi, p) in s.peers.iter().enumerate() {
        let mut i = Interest::default();
        let header_out = st.out_sent[pi] == st.out_buf[pi].len();
        let header_in = !st.in_want[pi] || st.in_got[pi] == HEADER_LEN;
        if !header_in {
            i.recv = true;
        } else if let Some(&id) = p.recvs.get(st.recv_cur[pi]) {
            let streamed = s.ops[id]
                .stream_from
                .is_none_or(|src| st.done[src] > st.done[id]);
            i.recv = st.deps_done(s, id, es) && streamed;
        }
        if !header_out {
            i.send = true;
        } else if let Some(&id) = p.sends.get(st.send_cur[pi]) {
            let len = s.ops[id].action.len() * es;
            let allowed = st.allowed(s, id, es);
            let pending = allowed.saturating_sub(st.done[id]);
            i.send = pending > 0 && (allowed == len || pending >= chunk);
        }
        if i.recv || i.send {
            interests.push((p.peer, i));
        }
    }
    for &(peer, i) in &interests {
        if !links.get(peer)?.prepare_wait(i)? {
            return Ok(());
        }
    }
    // About to sleep: this is when a dump (or a hang) needs the recorder current.
    st.sync_trace(comm, s, es, first_waited_peer(s, st, es));
    let mut fds: Vec<(std::os::fd::BorrowedFd<'_>, PollFlags)> =
        Vec::with_capacity(interests.len() + 2);
    fds.push((comm.abort_signal().fd(), PollFlags::POLLIN));
    if let Some(fd) = comm.monitor_fd() {
        fds.push((fd, PollFlags::POLLIN));
    }
    for &(peer, i) in &interests {
        if let Some(Some(ep)) = links.endpoints.get(peer) {
            ep.wait_fds(i, &mut fds);
        }
    }
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|(fd, f)| PollFd::new(*fd, *f)).collect();
    // Wake at least every 100 ms to re-check the deadline.
    let ms = max.as_millis().clamp(1, 100) as u16;
    match nix::poll::poll(&mut pfds, PollTimeout::from(ms)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(Error::io(ErrorKind::System, "poll", e.into())),
    }
    // Another rank's failure ends this wait too.
    comm.check_notices()
}
