//! When a pass moves nothing: sleeping until a peer can move, and what to say when nothing
//! moves for the whole deadline (who is waited on, how far each transfer got, crossed calls).

use super::*;

impl Run<'_, '_> {
    /// `CCL_FAULT_STALL`: once every header went out and came in (the peers see this rank
    /// inside, it sees them), moves nothing more, as a rank deadlocked inside ccl would, while the monitor thread
    /// answers; ends when the job fails (a notice or an abort) or after twice the timeout.
    pub(super) fn stall(&mut self) -> Result<()> {
        let timeout = self.comm.config().timeout;
        let until = Instant::now() + 2 * timeout;
        self.st.idle_since = Some((Instant::now(), None));
        self.st.sync_trace(self.comm, self.sched, None);
        ccl_core::ccl_warn!(
            Some(self.comm.rank()),
            "CCL_FAULT_STALL: operation #{} stops moving here on purpose",
            self.seq
        );
        while Instant::now() < until {
            self.comm.block(
                self.links,
                &[],
                None,
                Duration::from_millis(100),
                false,
                || {},
            )?;
        }
        Err(Error::timeout(format!(
            "stalled on purpose (CCL_FAULT_STALL=op:{}) for {:.1} s and nothing failed the job",
            self.seq,
            (2 * timeout).as_secs_f64()
        )))
    }

    /// Nothing moved in the last pass, `idle` since the last progress: fail past the deadline,
    /// else spin (retry at once) or let the communicator wait for what this rank waits for.
    pub(super) fn idle(&mut self, since: Instant, idle: Duration) -> Result<()> {
        if self.st.idle_since.is_none() {
            // About to wait: the ranks waiting for this one's posts must see them first.
            if self.sched.uses_host()
                && let Some(h) = self.host.as_deref()
            {
                h.wake();
            }
            let waited = self
                .st
                .first_waited_peer(self.sched)
                .and_then(|p| self.sched.peers.iter().position(|q| q.peer == p));
            self.st.idle_since = Some((since, waited));
        }
        let timeout = self.comm.config().timeout;
        if idle >= timeout {
            let mut e = Error::timeout(format!(
                "no progress for {:.1} s; {}",
                idle.as_secs_f64(),
                self.describe_pending()
            ));
            // The peer whose data we wait for is the one to look at first.
            if let Some(p) = self
                .st
                .first_waited_peer(self.sched)
                .or_else(|| self.host_laggard(self.host_wait()?))
            {
                e = e.peer(p);
            }
            return Err(e);
        }
        if idle < self.comm.spin_window() {
            // With a CPU per rank, plain busy-polling (see `crate::peers::wait` for why it
            // does not yield). With more ranks than CPUs, the rank awaited may need this very
            // CPU: polling between yields hands it over at once, where sleeping would cost a
            // wake-up per step (4 ranks on 2 CPUs: 60-100 us per 8 B allreduce).
            if shares_cpus(self.comm, self.st) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if self.crossed_calls()? {
            return Ok(());
        }
        let mut waits = std::mem::take(&mut self.st.waits);
        waits.clear();
        waits.extend(
            (0..self.sched.peers.len())
                .map(|pi| (self.sched.peers[pi].peer, self.interest(pi)))
                .filter(|(_, i)| i.send || i.recv),
        );
        let host = self
            .host_wait()
            .and_then(|c| self.host.as_deref().map(|h| (h as &dyn HostMemory, c)));
        // Waiting in host memory, also watch the connections of the ranks not there yet (where
        // there are connections): a crossed call (see `crossed_calls`) shows there. Their
        // deaths show on their life lines (`Peers::block`).
        if let Some((h, target)) = host {
            let links = &*self.links;
            waits.extend(
                (0..h.ranks().len())
                    .filter(|&i| i != h.me() && h.posted(i) < target)
                    .map(|i| h.ranks()[i])
                    .filter(|&p| links.has(p))
                    .map(|p| {
                        let recv = Interest {
                            send: false,
                            recv: true,
                        };
                        (p, recv)
                    }),
            );
        }
        self.st.waits = waits;
        let (comm, sched, st) = (self.comm, self.sched, &*self.st);
        // About to sleep: this is when a dump (or a hang) needs the recorder current.
        comm.block(self.links, &st.waits, host, timeout - idle, false, || {
            st.sync_trace(comm, sched, st.first_waited_peer(sched))
        })
    }

    /// Where the ranks of a host meet both in host memory and over connections, a rank in one
    /// kind of operation would wait for a peer in the other until the deadline: fail at once
    /// instead, describing both calls. Sound because every connection of a host-memory
    /// communicator is in the same memory: a peer publishes its bytes before it posts.
    /// Returns whether something arrived after all (the caller retries).
    pub(super) fn crossed_calls(&mut self) -> Result<bool> {
        let Some(me) = self.host.as_deref().map(|h| h.me()) else {
            return Ok(false);
        };
        let mine = self.header(0, 0);
        let crossed = |peer: usize, theirs: String| {
            Error::invalid_usage(format!(
                "with peer {peer}: mismatched calls: this rank called {}, the peer called {theirs}",
                mine.describe()
            ))
            .peer(peer)
        };
        if let Some(target) = self.host_wait() {
            // In host memory, waiting for posts: a peer that instead sends over its connection
            // is in another operation (this rank has taken everything earlier ones sent). A
            // peer not connected to this rank has sent nothing to it; one that connects in its
            // operation over connections shows up here once it has.
            for (i, &peer) in self.host_ranks().iter().enumerate() {
                if i == me
                    || self.host.as_deref().is_some_and(|h| h.posted(i) >= target)
                    || !self.links.has(peer)
                {
                    continue;
                }
                let mut head = [0u8; HEADER_LEN];
                let mut got = 0;
                // A receive from any source may have read its header already.
                if let Some(e) = self.st.early.iter().find(|e| e.peer == peer) {
                    (head, got) = (e.header, e.got);
                } else {
                    self.links.get(peer)?.recv_with(HEADER_LEN, &mut |b| {
                        got = b.len().min(HEADER_LEN);
                        head[..got].copy_from_slice(&b[..got]);
                        0
                    })?;
                }
                if got > 0 {
                    let theirs = match Header::decode(&head) {
                        Ok(h) if got == HEADER_LEN => h.describe(),
                        _ => "an operation over its connection".to_string(),
                    };
                    return Err(crossed(peer, theirs));
                }
            }
            return Ok(false);
        }
        // Over connections, waiting for a peer's operation header: a peer that has posted in
        // host memory more often than this rank is in a later operation there, having skipped
        // this one (it would have sent the header before posting).
        for pi in 0..self.sched.peers.len() {
            if !self.st.peers[pi].header_in_pending() {
                continue;
            }
            let peer = self.sched.peers[pi].peer;
            let Some(i) = self.host_ranks().iter().position(|&r| r == peer) else {
                continue;
            };
            let h = self.host.as_deref().ok_or_else(no_host)?;
            if h.posted(i) <= h.posted(me) {
                continue;
            }
            // Its next operation there is this rank's next one too.
            let theirs = Header::from_host_desc(h.desc(i, self.st.host_ops), Algo::Shm.id());
            if self.receive_header(pi)? {
                return Ok(true);
            }
            return Err(crossed(peer, theirs.describe()));
        }
        Ok(false)
    }

    /// Communicator rank of each host index (empty without host memory).
    pub(super) fn host_ranks(&self) -> Vec<usize> {
        self.host
            .as_deref()
            .map_or_else(Vec::new, |h| h.ranks().to_vec())
    }

    /// What each peer queue is waiting for, for timeout messages.
    pub(super) fn describe_pending(&self) -> String {
        let mut out = String::new();
        for (p, q) in self.sched.peers.iter().zip(&self.st.peers) {
            let peer = p.peer;
            if q.header_in_pending() {
                let _ = write!(
                    out,
                    "waiting to receive from peer {peer} (its operation header: {} of {HEADER_LEN} bytes arrived; has it made this call?); ",
                    q.header_in_got
                );
                continue;
            }
            if q.header_out_pending() {
                let _ = write!(
                    out,
                    "sending to peer {peer} blocked (the operation header; is peer {peer} reading?); "
                );
            }
            if let Some(&id) = p.recvs.get(q.next_recv) {
                let _ = write!(
                    out,
                    "waiting to receive from peer {peer} (step {}: {} of {} bytes arrived); ",
                    self.sched.ops[id].step,
                    self.st.done[id],
                    self.len(id)
                );
            }
            if let Some(&id) = p.sends.get(q.next_send)
                && self.ready(id) > self.st.done[id]
            {
                let _ = write!(
                    out,
                    "sending to peer {peer} blocked (step {}: {} of {} bytes taken; is peer {peer} reading?); ",
                    self.sched.ops[id].step,
                    self.st.done[id],
                    self.len(id)
                );
            }
        }
        if let (Some(target), Some(h)) = (self.host_wait(), self.host.as_deref()) {
            let behind: Vec<String> = (0..h.ranks().len())
                .filter(|&i| h.posted(i) < target)
                .map(|i| h.ranks()[i].to_string())
                .collect();
            let _ = write!(
                out,
                "waiting in shared memory for rank(s) {} (post {} of this operation; has it made this call?); ",
                behind.join(", "),
                target - self.host_base
            );
        }
        if out.is_empty() {
            out.push_str("no transfer pending (schedule stalled)");
        }
        out.trim_end_matches("; ").to_string()
    }
}
