//! Going on after a rank dies: revoke, shrink, grow (NCCL's `ncclCommRevoke`, `ncclCommShrink`
//! and `ncclCommGrow`; MPI's ULFM).
//!
//! What the calls guarantee:
//! - [`Communicator::revoke`]: every pending and later operation of the communicator fails with
//!   [`ErrorKind::Revoked`] on this rank at once, and on every other rank as soon as the job's
//!   rendezvous root passes the word on (milliseconds), so no rank keeps waiting for a peer that
//!   gave up. A revoked communicator runs nothing more; data an interrupted collective was
//!   writing is undefined (some blocks written, some not), its inputs are untouched unless it
//!   ran in place.
//! - [`Communicator::shrink`]: the survivors agree, through the root, on who is left (every rank
//!   still connected that asks within `CCL_TIMEOUT`, minus the ranks any of them excludes) and get
//!   a new communicator of exactly those ranks, numbered densely in their old order. A rank that
//!   dies during the shrink is left out by a further round, run by `shrink` itself. Calling it
//!   revokes the old communicator everywhere, so ranks still blocked in it return and shrink
//!   too.
//! - [`Communicator::grow`]: existing ranks and new processes meet in a new communicator of a
//!   larger size; existing ranks keep their ranks, new ones take the ranks above.
//!
//! The job's monitor, through which the survivors agree, starts in the process that made the
//! unique id (a launcher, or the application's rank 0). When that process dies, a standby rank
//! outside it takes the monitor over and `shrink` goes through it (see `ccl_bootstrap`).

use std::time::Instant;

use ccl_core::ErrorKind;
use ccl_core::ccl_warn;

use crate::LOG_SUBSYS;
use crate::{Communicator, Error, Result, UniqueId};

impl Communicator {
    /// Revokes the communicator on every rank: see the [module docs](crate::recover).
    pub fn revoke(&self) {
        self.engine.peers.revoke();
        self.order.wake_all();
    }

    /// The ranks the job's root has reported failed or dead so far, in rank order (a rank that
    /// failed by itself, e.g. timed out waiting for a stopped peer, is among them; a rank that
    /// only learned of another's failure is not).
    pub fn failed_ranks(&self) -> Vec<usize> {
        self.engine.peers.failed_ranks()
    }

    /// The survivors' new communicator, leaving out `exclude` (ranks of this communicator) and
    /// every rank that died or does not ask within `CCL_TIMEOUT`: see the
    /// [module docs](crate::recover). Every surviving rank calls it; the ranks of the new
    /// communicator keep their order. A rank that is excluded gets an [`ErrorKind::Revoked`]
    /// error saying so.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let (me, n) = (self.rank(), self.size());
        if let Some(&r) = exclude.iter().find(|&&r| r >= n) {
            return Err(Error::invalid_argument(format!(
                "shrink: excluded rank {r} is not a rank of this communicator of {n}"
            ))
            .rank(me));
        }
        if exclude.contains(&me) {
            return Err(Error::invalid_argument(format!(
                "shrink: rank {me} excludes itself (a rank that leaves does not call shrink)"
            ))
            .rank(me));
        }
        self.order.wake_all();
        if n == 1 {
            // Nobody to agree with: a communicator of this rank alone, as before.
            self.engine.peers.revoke();
            let id = UniqueId::new_at(self.engine.peers.local_ip(), self.config())?;
            return Communicator::init_with_config(&id, 0, 1, self.config().clone());
        }
        let started = Instant::now();
        let mut last = None;
        // Each failed attempt loses a member (it died while the new communicator formed), so
        // there are at most `n` of them.
        for _ in 0..n {
            // The root decides by its own timeout after the first request; waiting twice that
            // (and a margin) covers a root on a loaded machine and a request that came late.
            let deadline = Instant::now()
                + 2 * self.config().timeout
                + ccl_bootstrap::timing::RECOVERY_SLACK.get();
            let (members, id) = self.engine.peers.shrink_agree(exclude, deadline)?;
            let Some(new_rank) = members.iter().position(|&r| r == me) else {
                return Err(Error::new(
                    ErrorKind::Revoked,
                    format!("rank {me} was excluded from the shrunk communicator (its members: {members:?})"),
                )
                .rank(me));
            };
            let mut config = self.config().clone();
            config.topo_file = None;
            config.topology = Some(self.engine.peers.topology().subset(&members));
            // The root started before it sent the id: a refused connection is its death.
            let formed = ccl_bootstrap::Bootstrap::connect_running(
                &id,
                new_rank,
                members.len(),
                config.timeout,
            )
            .and_then(|b| Communicator::from_bootstrap(b, config));
            // Only the root's verdict says whether every member's part formed too.
            match (
                self.engine.peers.shrink_formed(formed.is_ok(), deadline)?,
                formed,
            ) {
                (true, Ok(c)) => {
                    ccl_core::ccl_info!(
                        Some(me),
                        "shrunk to {} ranks (this rank is now {new_rank}) in {:.1} ms",
                        members.len(),
                        started.elapsed().as_secs_f64() * 1e3
                    );
                    return Ok(c);
                }
                (_, Err(e)) => {
                    ccl_warn!(
                        Some(me),
                        "shrink: the new communicator did not form here, trying again: {e}"
                    );
                    last = Some(e);
                }
                (false, Ok(_)) => {
                    ccl_warn!(
                        Some(me),
                        "shrink: the new communicator did not form on every member, trying again"
                    );
                    last = Some(
                        Error::remote("the shrunk communicator did not form on every member")
                            .rank(me),
                    );
                }
            }
        }
        Err(last
            .unwrap_or_else(|| Error::internal("shrink made no attempt"))
            .context("shrink"))
    }

    /// A larger communicator: this communicator's ranks keep their ranks, and
    /// `new_size - size()` new processes join as the ranks above with
    /// [`Communicator::init`]`(id, rank, new_size)`. `id` is made by one rank of this
    /// communicator (`UniqueId::new()`), handed to the new processes, and passed by every rank
    /// here; [`grow_id`](Self::grow_id) makes and shares it. Every rank of this communicator
    /// calls it; this communicator stays usable.
    pub fn grow(&self, id: &UniqueId, new_size: usize) -> Result<Communicator> {
        let (me, n) = (self.rank(), self.size());
        if new_size <= n {
            return Err(Error::invalid_argument(format!(
                "grow: the new size {new_size} must exceed the current size {n}"
            ))
            .rank(me));
        }
        // Every rank must name the same rendezvous: a rank holding another id would wait there
        // alone until the timeout.
        let mine = id.as_bytes().to_vec();
        let mut all = vec![0u8; mine.len() * n];
        self.all_gather(&mine, &mut all)?;
        if let Some(r) = (0..n).find(|&r| all[r * mine.len()..(r + 1) * mine.len()] != mine[..]) {
            return Err(Error::invalid_argument(format!(
                "grow: rank {r} passed a different unique id than rank {me}"
            ))
            .rank(me));
        }
        let mut config = self.config().clone();
        config.topo_file = None;
        config.topology = None;
        Communicator::init_with_config(id, me, new_size, config).map_err(|e| e.context("grow"))
    }

    /// Makes the unique id of a grown communicator on `root` and gives it to every rank (a
    /// collective): pass it to the new processes and to [`grow`](Self::grow).
    pub fn grow_id(&self, root: usize) -> Result<UniqueId> {
        let mut bytes = [0u8; ccl_bootstrap::UNIQUE_ID_BYTES];
        if self.rank() == root {
            let id = UniqueId::new_at(self.engine.peers.local_ip(), self.config())?;
            bytes.copy_from_slice(id.as_bytes());
        }
        self.broadcast_in_place(&mut bytes, root)?;
        UniqueId::from_bytes(&bytes)
    }
}
