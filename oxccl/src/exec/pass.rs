//! The pass loop: each pass offers every queue head as much work as its dependencies allow,
//! and the rules "how much of this send may go now" and "may this receive take bytes now"
//! that both moving and waiting use.

use super::*;

impl Run<'_, '_> {
    /// Where region `r` of the schedule lies in this operation: host regions may be in the other
    /// half of their slot.
    pub(super) fn at(&self, r: &Region) -> Region {
        match self.host_swap {
            Some(slot) => ccl_algos::host::swap_half(*r, slot),
            None => *r,
        }
    }

    /// The bytes of region `r`, in the caller's buffers, the scratch space or host memory.
    pub(super) fn region<'x>(
        bufs: &'x Buffers<'_>,
        host: Option<&'x (dyn HostMemory + 'static)>,
        r: &Region,
        elem: usize,
    ) -> Result<&'x [u8]> {
        match r.buf {
            Buf::Host(i) => host_slot(host.ok_or_else(no_host)?, i, r, elem),
            Buf::PeerIn(i) => peer_in(host.ok_or_else(no_host)?, i, r, elem),
            _ => bufs.get(r, elem),
        }
    }

    /// Region `r`, to write: a caller buffer, the scratch space or this rank's host slot.
    pub(super) fn region_mut<'x>(
        bufs: &'x mut Buffers<'_>,
        host: Option<&'x mut (dyn HostMemory + 'static)>,
        r: &Region,
        elem: usize,
    ) -> Result<&'x mut [u8]> {
        match r.buf {
            Buf::Host(i) => host_slot_mut(host.ok_or_else(no_host)?, i, r, elem),
            Buf::PeerOut(i) => peer_out(host.ok_or_else(no_host)?, i, r, elem),
            _ => bufs.get_mut(r, elem),
        }
    }

    /// `dst` to write and `src` to read (`None` when there is no `src`), wherever each lies.
    pub(super) fn operands<'x>(
        bufs: &'x mut Buffers<'_>,
        host: Option<&'x mut (dyn HostMemory + 'static)>,
        dst: &Region,
        src: Option<&Region>,
        elem: usize,
    ) -> Result<(&'x mut [u8], Option<&'x [u8]>)> {
        let Some(src) = src else {
            return Ok((Self::region_mut(bufs, host, dst, elem)?, None));
        };
        match (dst.buf, src.buf) {
            (Buf::Host(d), Buf::Host(s)) if d != s => {
                let h = host.ok_or_else(no_host)?;
                if d as usize != h.me() || s as usize >= h.ranks().len() {
                    return Err(Error::internal(format!(
                        "host operands {dst:?} {src:?} for host rank {}",
                        h.me()
                    )));
                }
                let (mine, theirs) = h.slot_pair(s as usize);
                Ok((
                    mine.get_mut(Buffers::range(dst, elem))
                        .ok_or_else(|| outside(dst))?,
                    Some(
                        theirs
                            .get(Buffers::range(src, elem))
                            .ok_or_else(|| outside(src))?,
                    ),
                ))
            }
            (Buf::Host(_), Buf::Host(_)) => Err(Error::internal(
                "a local op within one host slot is not supported",
            )),
            (Buf::Host(d), _) => {
                let s = bufs.get(src, elem)?;
                Ok((
                    host_slot_mut(host.ok_or_else(no_host)?, d, dst, elem)?,
                    Some(s),
                ))
            }
            (_, Buf::Host(s)) => {
                let sl = host_slot(host.ok_or_else(no_host)?, s, src, elem)?;
                Ok((bufs.get_mut(dst, elem)?, Some(sl)))
            }
            (Buf::PeerOut(d), _) => {
                let s = bufs.get(src, elem)?;
                Ok((peer_out(host.ok_or_else(no_host)?, d, dst, elem)?, Some(s)))
            }
            (_, Buf::PeerIn(s)) => {
                let sl = peer_in(host.ok_or_else(no_host)?, s, src, elem)?;
                Ok((bufs.get_mut(dst, elem)?, Some(sl)))
            }
            _ => bufs.pair(dst, src, elem),
        }
    }

    /// Bytes of op `id`.
    pub(super) fn len(&self, id: OpId) -> usize {
        self.st.len(self.sched, id)
    }

    pub(super) fn complete(&self, id: OpId) -> bool {
        self.st.complete(self.sched, id)
    }

    pub(super) fn deps_done(&self, id: OpId) -> bool {
        self.st.deps_done(self.sched, id)
    }

    /// How far the data of send or receive `id` is ready: 0 before its dependencies are done,
    /// then all of it, or as far as the op it streams from has come.
    pub(super) fn ready(&self, id: OpId) -> usize {
        if !self.deps_done(id) {
            return 0;
        }
        let len = self.len(id);
        match self.sched.ops[id].stream_from {
            Some(from) => self.st.done[from].min(len),
            None => len,
        }
    }

    /// How much of send `id` may go now: `Some(end)` to hand bytes `done..end` to the transport,
    /// `None` to wait. A streamed send waits until a whole chunk is ready (or its last piece), so
    /// the pipeline does not degrade into tiny writes.
    pub(super) fn send_now(&self, id: OpId) -> Option<usize> {
        let ready = self.ready(id);
        let pending = ready.saturating_sub(self.st.done[id]);
        (pending > 0 && (ready == self.len(id) || pending >= self.chunk)).then_some(ready)
    }

    /// Whether receive `id` may take bytes now: `Some(end)` to take bytes up to `end`, `None` to
    /// wait. A receive that streams from a producer (a second child's data reduced behind the
    /// first's) may go only as far as the producer has.
    pub(super) fn receive_now(&self, id: OpId) -> Option<usize> {
        let ready = self.ready(id);
        (ready > self.st.done[id]).then_some(ready)
    }

    /// What this rank waits for from peer queue `pi`: by the same rules as the pass that moves.
    pub(super) fn interest(&self, pi: usize) -> Interest {
        let q = &self.st.peers[pi];
        let ready = |dir| {
            self.head(pi, dir)
                .is_some_and(|id| self.may_move(id, dir).is_some())
        };
        Interest {
            send: q.header_out_pending() || ready(Dir::Send),
            recv: q.header_in_pending() || ready(Dir::Recv),
        }
    }

    /// Marks `k` more bytes of op `id` done; returns whether that completed it.
    pub(super) fn advance(&mut self, id: OpId, k: usize) -> bool {
        self.st.done[id] += k;
        let complete = self.complete(id);
        if complete {
            self.st.ops_left -= 1;
        }
        complete
    }

    pub(super) fn header(&self, channel_seq: u64, bytes: usize) -> Header {
        header_of(
            &self.info,
            self.dtype,
            self.op,
            channel_seq,
            bytes,
            self.st.entry_us,
        )
    }

    /// Adds what this run was doing to `e`, and what the job monitor knows of its cause.
    pub(super) fn fail(&self, e: Error) -> Error {
        fail_op(self.comm, &self.info, self.seq, self.sched, e)
    }

    /// Runs the schedule to completion (or error).
    pub(super) fn drive(&mut self) -> Result<()> {
        if self.sched.peers.is_empty() && self.comm.config().fault_stall != Some(self.seq) {
            return self.drive_local();
        }
        // Zero-length ops count as complete from the start (0 of 0 bytes done).
        self.st
            .reset(self.sched, self.elem, self.comm.size(), self.entry_us);
        if self.sched.uses_host() {
            let h = self.host.as_deref().ok_or_else(no_host)?;
            self.host_base = h.posted(h.me());
        }
        self.queue_headers().map_err(|e| self.fail(e))?;
        let mut idle = Idle::default();
        let stall = self.comm.config().fault_stall == Some(self.seq);
        while !self.st.finished() {
            self.comm.check_aborted()?;
            if stall && self.st.headers_left == 0 {
                return self.stall().map_err(|e| self.fail(e));
            }
            if self.pass().map_err(|e| self.fail(e))? {
                idle.moved();
                self.st.end_idle();
            } else {
                let (since, idle) = idle.tick();
                self.idle(since, idle).map_err(|e| self.fail(e))?;
            }
        }
        Ok(())
    }

    /// [`drive`](Run::drive) for a schedule without peers (one in host memory, or a local
    /// copy): its local ops one after the other, waiting only where a wait in host memory has
    /// not come true. The same ops and the same waiting as a pass would do, without the per-peer
    /// queues, headers and per-op bookkeeping a pass goes through, which cost a small
    /// operation in host memory more than its data.
    pub(super) fn drive_local(&mut self) -> Result<()> {
        self.st.reset_local(self.sched, self.elem, self.entry_us);
        if self.sched.uses_host() {
            let h = self.host.as_deref().ok_or_else(no_host)?;
            self.host_base = h.posted(h.me());
        }
        let sched = self.sched;
        let mut k = 0;
        while let Some(&id) = sched.locals.get(k) {
            self.st.next_local = k;
            // Ops run in order, so an op's dependencies (earlier local ops) are done.
            if matches!(sched.ops[id].action, Action::WaitPosts { .. }) {
                self.await_posts(id, k)?;
            }
            if let Some(next) = self.run_fused(k).map_err(|e| self.fail(e))? {
                self.st.done[id] = self.len(id);
                self.st.done[next] = self.len(next);
                k += 2;
                continue;
            }
            self.run_local(id).map_err(|e| self.fail(e))?;
            self.st.done[id] = self.len(id);
            k += 1;
        }
        self.st.next_local = sched.locals.len();
        Ok(())
    }

    /// Local ops `k` and `k + 1` as one pass when they are a copy out of host memory and a
    /// reduction of another host region into that copy (how a one-shot allreduce reads the
    /// slots): `dst = a (op) b` reads each input once, in one vectorized loop, where the copy
    /// and then the reduction read the output twice. Measured on this 2-core machine with the
    /// same protocol in C (`scripts/peers/host_floor.c`), 2 KiB of f32 from the other CPU's
    /// cache: 0.64-0.70 us per operation as a copy then a reduction, 0.57-0.67 as one pass.
    /// Returns op `k + 1` when it ran both; the bytes are those of the two ops (`a` first
    /// unless the reduction puts its source first).
    pub(super) fn run_fused(&mut self, k: usize) -> Result<Option<OpId>> {
        let sched = self.sched;
        let (Some(&first), Some(&next)) = (sched.locals.get(k), sched.locals.get(k + 1)) else {
            return Ok(None);
        };
        let (
            Action::Copy { src: a, dst },
            Action::Reduce {
                dst: into,
                src: b,
                src_first,
            },
        ) = (sched.ops[first].action, sched.ops[next].action)
        else {
            return Ok(None);
        };
        let (Buf::Host(ia), Buf::Host(ib)) = (a.buf, b.buf) else {
            return Ok(None);
        };
        if into != dst || matches!(dst.buf, Buf::Host(_) | Buf::Send) || dst.len == 0 {
            return Ok(None);
        }
        let (a, b, dst, elem) = (self.at(&a), self.at(&b), self.at(&dst), self.elem);
        let host = self.host.as_deref().ok_or_else(no_host)?;
        let (a, b) = (
            host_slot(host, ia, &a, elem)?,
            host_slot(host, ib, &b, elem)?,
        );
        let d = self.bufs.get_mut(&dst, elem)?;
        let (x, y) = if src_first { (b, a) } else { (a, b) };
        (self.kernels.into)(self.dtype, self.op, d, x, y);
        Ok(Some(next))
    }

    /// Offers every queue head what it may do now; returns whether anything moved.
    pub(super) fn pass(&mut self) -> Result<bool> {
        let mut moved = self.run_locals()?;
        for pi in 0..self.sched.peers.len() {
            moved |= self.send_header(pi)?;
            moved |= self.move_data(pi, Dir::Send)?;
            moved |= self.receive_header(pi)?;
            moved |= self.move_data(pi, Dir::Recv)?;
        }
        Ok(moved)
    }
}

impl<'r, 'b> Run<'r, 'b> {
    /// The run of `job` from the operation's start (no post counted, nothing announced), its
    /// plan unused; `host` is the links' host memory, lent to the run.
    pub(super) fn new(
        comm: &'r Peers,
        links: &'r mut Links,
        host: Option<&'r mut (dyn HostMemory + 'static)>,
        st: &'r mut ExecState,
        job: Job<'r, 'b>,
        entry_us: u64,
    ) -> Run<'r, 'b> {
        let elem = job.dtype.size();
        // The widest kernels the CPU runs wherever every rank runs on this CPU: on one host,
        // or reading host memory (whose elements one rank each computes). Ranks on other
        // machines might run other sets, which agree on every bit but for which NaN payload a
        // sum of two NaNs keeps, and an algorithm in which two ranks compute the same element
        // (recursive doubling) must give both the same bits.
        let kernels = match host.as_deref() {
            Some(h) => h.kernels(),
            None if comm.topology().num_hosts() == 1 => ccl_shm::simd::kernels(),
            None => Kernels::BASELINE,
        };
        Run {
            comm,
            links,
            host,
            host_base: 0,
            host_swap: st.host_second_half.then_some(job.schedule.host_slot),
            announced: false,
            entry_us,
            st,
            sched: job.schedule,
            bufs: job.buffers,
            registered: job.registered,
            dtype: job.dtype,
            op: job.op,
            info: job.info,
            seq: job.seq,
            elem,
            chunk: comm.config().chunk_size.max(elem),
            kernels,
        }
    }
}
