//! Local actions (copies and reductions within this rank) and the actions in host memory
//! shared with the other ranks of this host: posts, waits and reading peers' slots.

use super::*;

pub(super) fn no_host() -> Error {
    Error::internal("schedule uses host memory but the communicator has none")
}

/// Region `r` of host rank `i`'s slot.
pub(super) fn host_slot<'x>(
    h: &'x dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x [u8]> {
    if i as usize >= h.ranks().len() {
        return Err(Error::internal(format!("no host rank {i}")));
    }
    h.slot(i as usize)
        .get(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of this rank's host slot (host rank `i` must be this rank: only owners write).
pub(super) fn host_slot_mut<'x>(
    h: &'x mut dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x mut [u8]> {
    if i as usize != h.me() {
        return Err(Error::internal(format!(
            "schedule writes the host slot of host rank {i}"
        )));
    }
    h.my_slot()
        .get_mut(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of host rank `i`'s input, read in place.
pub(super) fn peer_in<'x>(
    h: &'x dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x [u8]> {
    h.peer_input(i as usize)?
        .get(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Region `r` of host rank `i`'s output, written in place.
pub(super) fn peer_out<'x>(
    h: &'x mut dyn HostMemory,
    i: u16,
    r: &Region,
    elem: usize,
) -> Result<&'x mut [u8]> {
    h.peer_output(i as usize)?
        .get_mut(Buffers::range(r, elem))
        .ok_or_else(|| outside(r))
}

/// Set in the operation fingerprint of a direct schedule ([`Schedule::direct`]): a bit of the
/// reduce op's byte that no op uses, so that a rank running it and one running the staged
/// schedule see different fingerprints.
pub(super) const DIRECT_DESC: u64 = 1 << 47;

/// An operation's fingerprint in host memory, from its header.
pub(super) fn host_desc(mine: Header, direct: bool) -> u64 {
    let d = mine.host_desc();
    if direct { d | DIRECT_DESC } else { d }
}

/// Every other rank of the host must be in the same call as this one (`desc`, host operation
/// number `host_ops`); `mine` gives this rank's header for the message when one is not.
pub(super) fn check_host_calls(
    h: &dyn HostMemory,
    host_ops: u64,
    desc: u64,
    direct: bool,
    mine: impl Fn() -> Header,
) -> Result<()> {
    match h.first_unlike(host_ops, desc) {
        None => Ok(()),
        Some((i, theirs)) => Err(unlike(h, i, theirs, desc, direct, mine())),
    }
}

/// The error of host rank `i` found in another operation (`theirs`) than this rank's (`desc`,
/// whose header is `mine`).
pub(super) fn unlike(
    h: &dyn HostMemory,
    i: usize,
    theirs: u64,
    desc: u64,
    direct: bool,
    mine: Header,
) -> Error {
    let peer = h.ranks()[i];
    if theirs ^ desc == DIRECT_DESC {
        let (a, b) = if direct { ("", " not") } else { (" not", "") };
        return Error::invalid_usage(format!(
            "with peer {peer}: {}: this rank's buffers are{a} all from \
             Communicator::alloc (shared memory) and the peer's are{b}; on one host \
             either every rank passes such buffers to a collective or none does",
            mine.describe()
        ))
        .peer(peer);
    }
    let theirs = Header::from_host_desc(theirs & !DIRECT_DESC, mine.algo);
    Error::invalid_usage(format!(
        "with peer {peer}: mismatched calls: this rank called {}, the peer called {}",
        mine.describe(),
        theirs.describe()
    ))
    .peer(peer)
}

impl Run<'_, '_> {
    /// Runs local ops whole, in order, once their dependencies are done.
    pub(super) fn run_locals(&mut self) -> Result<bool> {
        let mut moved = false;
        while let Some(&id) = self.sched.locals.get(self.st.next_local) {
            if !self.deps_done(id) || self.host_wait_pending(id)?.is_some() {
                break;
            }
            self.run_local(id)?;
            let len = self.len(id);
            if len > 0 {
                self.advance(id, len);
            }
            self.st.next_local += 1;
            moved = true;
        }
        Ok(moved)
    }

    pub(super) fn run_local(&mut self, id: OpId) -> Result<()> {
        let (dtype, op, elem) = (self.dtype, self.op, self.elem);
        match self.sched.ops[id].action {
            Action::Copy { src, dst } => {
                let (src, dst) = (self.at(&src), self.at(&dst));
                let (d, s) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    Some(&src),
                    elem,
                )?;
                if let Some(s) = s {
                    d.copy_from_slice(s);
                }
            }
            Action::Reduce {
                dst,
                src,
                src_first,
            } => {
                let (src, dst) = (self.at(&src), self.at(&dst));
                let (d, s) = Self::operands(
                    &mut self.bufs,
                    self.host.as_deref_mut(),
                    &dst,
                    Some(&src),
                    elem,
                )?;
                let s = s.ok_or_else(|| Error::internal("local reduce of a region with itself"))?;
                (self.kernels.inplace)(dtype, op, d, s, order(src_first));
            }
            Action::ReduceInto { dst, a, b } => {
                let (dst, a, b) = (self.at(&dst), self.at(&a), self.at(&b));
                // The first operand and the destination are this rank's; the second may lie in
                // host memory or another rank's buffer.
                let (d, x) = self.bufs.pair(&dst, &a, elem)?;
                let x = x.ok_or_else(|| Error::internal("reduce into an operand"))?;
                let h = self.host.as_deref().ok_or_else(no_host);
                let y = match b.buf {
                    Buf::Host(i) => host_slot(h?, i, &b, elem)?,
                    Buf::PeerIn(i) => peer_in(h?, i, &b, elem)?,
                    _ => {
                        return Err(Error::internal(
                            "the second operand of a reduce-into lies outside host memory",
                        ));
                    }
                };
                (self.kernels.into)(dtype, op, d, x, y);
            }
            Action::FinishAvg { region } => {
                if op == ReduceOp::Avg {
                    let region = self.at(&region);
                    let world = self.comm.size();
                    let d =
                        Self::region_mut(&mut self.bufs, self.host.as_deref_mut(), &region, elem)?;
                    reduce::finish_avg(dtype, d, world);
                }
            }
            Action::Post => {
                let desc = self.host_desc();
                let h = self.host.as_deref().ok_or_else(no_host)?;
                // Before the first post, so that a rank that sees it sees this operation (and
                // no rank can be in the next one before this rank's last post).
                if !self.announced {
                    if self.sched.direct {
                        let out: &[u8] = self.bufs.recv;
                        h.announce_buffers(self.st.host_ops, self.bufs.send.unwrap_or(out), out)?;
                    }
                    h.announce(self.st.host_ops, desc);
                    self.announced = true;
                }
                h.post();
                // With peers, the rank may go on moving data over its connections for long
                // before it waits or ends: wake the host's sleepers now. Without (a small
                // operation in host memory), the wake waits for the next wait or the end.
                if !self.sched.peers.is_empty() {
                    h.wake();
                }
            }
            Action::WaitPosts { count } => {
                // At the entry wait (0) the others may still be in the previous operation.
                if count > 0 {
                    self.check_host_calls(self.host_desc())?;
                }
            }
            Action::Send { .. } | Action::Recv { .. } => {
                unreachable!("local queue holds local ops")
            }
        }
        Ok(())
    }

    /// For local op `id`: when it is a wait in host memory that the host's ranks have not all
    /// reached, the post count it waits for.
    pub(super) fn host_wait_pending(&self, id: OpId) -> Result<Option<u64>> {
        let Action::WaitPosts { count } = self.sched.ops[id].action else {
            return Ok(None);
        };
        let h = self.host.as_deref().ok_or_else(no_host)?;
        let target = self.host_base + u64::from(count);
        Ok((!h.all_posted(target)).then_some(target))
    }

    /// The host rank that has not yet posted `target` times, as a communicator rank.
    pub(super) fn host_laggard(&self, target: u64) -> Option<usize> {
        let h = self.host.as_deref()?;
        (0..h.ranks().len())
            .find(|&i| h.posted(i) < target)
            .map(|i| h.ranks()[i])
    }

    /// This operation's fingerprint in host memory.
    pub(super) fn host_desc(&self) -> u64 {
        host_desc(self.header(0, 0), self.sched.direct)
    }

    /// Every other rank of the host must be in the same call as this one.
    pub(super) fn check_host_calls(&self, desc: u64) -> Result<()> {
        let h = self.host.as_deref().ok_or_else(no_host)?;
        check_host_calls(h, self.st.host_ops, desc, self.sched.direct, || {
            self.header(0, 0)
        })
    }

    /// Local op `id`, the `k`th, a wait in host memory: waits until every host rank has posted
    /// as often, waking first the ranks that may sleep waiting for this rank's posts (a post
    /// wakes nobody, `HostMemory::post`). When nobody has to be waited for, only the ranks seen
    /// asleep are woken: the fenced wake comes when the operation ends.
    pub(super) fn await_posts(&mut self, id: OpId, k: usize) -> Result<()> {
        let h = self.host.as_deref().ok_or_else(no_host)?;
        if self
            .host_wait_pending(id)
            .map_err(|e| self.fail(e))?
            .is_none()
        {
            h.wake_seen();
            return Ok(());
        }
        h.wake();
        self.st.next_local = k;
        self.wait_host(id)
    }

    /// Waits until local op `id`, a wait in host memory, may run: spinning, then sleeping, as a
    /// pass that moves nothing would. Out of line: a small operation whose peers are there
    /// already never comes here.
    #[inline(never)]
    pub(super) fn wait_host(&mut self, id: OpId) -> Result<()> {
        let mut idle = Idle::default();
        while self
            .host_wait_pending(id)
            .map_err(|e| self.fail(e))?
            .is_some()
        {
            self.comm.check_aborted()?;
            let (since, idle) = idle.tick();
            self.idle(since, idle).map_err(|e| self.fail(e))?;
        }
        self.st.end_idle();
        Ok(())
    }

    /// The post count this rank waits for in host memory, if the next local op is such a wait.
    pub(super) fn host_wait(&self) -> Option<u64> {
        let &id = self.sched.locals.get(self.st.next_local)?;
        if !self.deps_done(id) {
            return None;
        }
        self.host_wait_pending(id).ok().flatten()
    }
}
