//! What the executor keeps between passes and between operations: per peer, where each
//! queue stands; per operation, how far each action got.

use super::*;

impl Default for PeerState {
    fn default() -> PeerState {
        PeerState {
            next_send: 0,
            next_recv: 0,
            header_out: Vec::with_capacity(HEADER_LEN + COALESCE),
            header_out_sent: 0,
            carried: 0,
            expects_header: false,
            header_in: [0; HEADER_LEN],
            header_in_got: 0,
            wait_us: 0,
            late_us: None,
        }
    }
}

impl PeerState {
    /// Resets for a new operation, keeping the header buffer's memory.
    pub(super) fn reset(&mut self) {
        self.next_send = 0;
        self.next_recv = 0;
        self.header_out.clear();
        self.header_out_sent = 0;
        self.carried = 0;
        self.expects_header = false;
        self.header_in = [0; HEADER_LEN];
        self.header_in_got = 0;
        self.wait_us = 0;
        self.late_us = None;
    }

    /// Whether this rank's header to the peer still has bytes to go: no data may follow before.
    pub(super) fn header_out_pending(&self) -> bool {
        self.header_out_sent < self.header_out.len()
    }

    /// Whether the peer's header has yet to arrive: none of its data is taken before.
    pub(super) fn header_in_pending(&self) -> bool {
        self.expects_header && self.header_in_got < HEADER_LEN
    }
}

impl ExecState {
    pub(super) fn reset(&mut self, s: &Schedule, elem: usize, world: usize, entry_us: u64) {
        self.elem = elem;
        self.done.clear();
        self.done.resize(s.ops.len(), 0);
        if self.peers.len() < s.peers.len() {
            self.peers.resize_with(s.peers.len(), PeerState::default);
        }
        for p in &mut self.peers {
            p.reset();
        }
        self.next_local = 0;
        self.ops_left = s.ops.iter().filter(|o| o.action.len() * elem > 0).count();
        self.headers_left = 0;
        if self.headers_to.len() != world {
            self.headers_to = vec![0; world];
            self.headers_from = vec![0; world];
        }
        self.entry_us = entry_us;
        self.idle_since = None;
    }

    /// [`reset`](ExecState::reset) for a schedule without peers: only what running its local
    /// ops in order uses.
    pub(super) fn reset_local(&mut self, s: &Schedule, elem: usize, entry_us: u64) {
        self.elem = elem;
        self.done.clear();
        self.done.resize(s.ops.len(), 0);
        self.next_local = 0;
        self.ops_left = 0;
        self.headers_left = 0;
        self.entry_us = entry_us;
        self.idle_since = None;
    }

    /// Charges the idle time that just ended to the peer that was awaited.
    pub(super) fn end_idle(&mut self) {
        if let Some((t, Some(pi))) = self.idle_since.take() {
            self.peers[pi].wait_us += t.elapsed().as_micros() as u64;
        }
    }

    pub(super) fn finished(&self) -> bool {
        self.ops_left == 0 && self.headers_left == 0
    }

    /// Bytes of op `id` of `s`.
    pub(super) fn len(&self, s: &Schedule, id: OpId) -> usize {
        s.ops[id].action.len() * self.elem
    }

    pub(super) fn complete(&self, s: &Schedule, id: OpId) -> bool {
        self.done[id] == self.len(s, id)
    }

    pub(super) fn deps_done(&self, s: &Schedule, id: OpId) -> bool {
        s.ops[id].deps.iter().all(|&d| self.complete(s, d))
    }

    /// The first peer with a receive whose dependencies are met but whose data has not arrived.
    pub(super) fn first_waited_peer(&self, s: &Schedule) -> Option<usize> {
        s.peers.iter().zip(&self.peers).find_map(|(p, q)| {
            if q.header_in_pending() {
                return Some(p.peer);
            }
            let &id = p.recvs.get(q.next_recv)?;
            self.deps_done(s, id).then_some(p.peer)
        })
    }

    /// Brings the recorder's entry for this operation up to date.
    pub(super) fn sync_trace(&self, comm: &Peers, s: &Schedule, waiting_on: Option<usize>) {
        if let Some(e) = comm.recorder().current() {
            self.sync_entry(e, s, waiting_on);
        }
    }

    /// Brings recorder entry `e` of this operation up to date.
    pub(super) fn sync_entry(&self, e: &mut trace::Entry, s: &Schedule, waiting_on: Option<usize>) {
        e.waiting_on = waiting_on;
        if let Some((t, _)) = self.idle_since {
            e.progress_us = trace::now_us().saturating_sub(t.elapsed().as_micros() as u64);
        }
        for ((stat, p), q) in e.peers.iter_mut().zip(&s.peers).zip(&self.peers) {
            stat.sent = p.sends.iter().map(|&id| self.done[id] as u64).sum();
            stat.received = p.recvs.iter().map(|&id| self.done[id] as u64).sum();
            stat.arrived = !q.header_in_pending();
            stat.waited_us = q.wait_us;
            stat.late_us = q.late_us.unwrap_or(0);
        }
    }
}

impl Idle {
    const CLOCK_EVERY: u32 = 8;

    /// Something moved: no longer idle.
    pub(super) fn moved(&mut self) {
        self.from = None;
    }

    /// One more pass that moved nothing: since when, and for how long as of the last look at
    /// the clock.
    pub(super) fn tick(&mut self) -> (Instant, Duration) {
        match self.from {
            None => {
                self.from = Some(Instant::now());
                (self.passes, self.idle) = (0, Duration::ZERO);
            }
            Some(t) => {
                self.passes += 1;
                if self.passes % Self::CLOCK_EVERY == 0 {
                    self.idle = t.elapsed();
                }
            }
        }
        (self.from.expect("set above"), self.idle)
    }
}
