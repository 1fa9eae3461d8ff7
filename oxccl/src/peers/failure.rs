//! Failure: the sticky error, abort, the failure notices the monitor passes on, revoke and
//! shrink, and the verdict that explains an error.

use super::*;

use ccl_bootstrap::timing::ROOT_SILENT;
use ccl_bootstrap::{Conclusion, Seen};
use ccl_diag::culprit::{self, verdict_prefix};

/// The peer a failure report blames: one this rank saw leave or waited for in vain (a remote
/// error, a timeout). A disagreement (invalid usage, such as settings that differ) is both
/// ranks' doing, so the blame stays with the rank that reports it.
pub(crate) fn blamed_peer(e: &Error) -> Option<usize> {
    e.peer_id()
        .filter(|_| matches!(e.kind(), ErrorKind::Remote | ErrorKind::Timeout))
}

/// How long an operation may run before the early warning (`None`: never): `CCL_LATE_WARN_MS`
/// when set to a number, else (`auto`) ten times the recent median of the same operation and
/// size, at least `CCL_LATE_WARN_FLOOR_MS`; half the timeout while there is no median yet.
pub(super) fn late_limit(config: &Config, usual_us: Option<u64>) -> Option<Duration> {
    let floor = Duration::from_millis(config.late_warn_floor_ms);
    match config.late_warn_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(match usual_us {
            Some(u) => (Duration::from_micros(u) * 10).max(floor),
            None => (config.timeout / 2).max(floor),
        }),
    }
}

impl Peers {
    /// Fails the communicator and ends every wait at once. Safe to call more than once and from
    /// any thread. The other ranks hear of it and fail too, instead of waiting for this one.
    pub(crate) fn abort(&self) {
        self.fail(Error::new(ErrorKind::Aborted, "the communicator was aborted").rank(self.rank));
        self.abort.raise();
    }

    pub(super) fn notice_error(&self, n: &Notice) -> Error {
        let what = if n.died { "died" } else { "failed" };
        Error::remote(format!(
            "{}rank {} {what}: {}",
            verdict_prefix(&n.verdict),
            n.rank,
            n.message
        ))
        .rank(self.rank)
        // A rank is no peer of its own: on the receiving end of a stalled link it is the
        // culprit the verdict names first.
        .peer(n.culprit.filter(|&c| c != self.rank).unwrap_or(n.rank))
    }

    /// Fails with the first failure notice that has arrived, if any, or with the revocation.
    pub(super) fn check_notices(&self) -> Result<()> {
        let Some(m) = &self.monitor else {
            return Ok(());
        };
        if let Some(n) = m.poll() {
            return Err(self.record(self.notice_error(&n)));
        }
        if let Some(n) = m.revoked() {
            let e = Error::new(ErrorKind::Revoked, n.message).rank(self.rank);
            return Err(self.record(e));
        }
        Ok(())
    }

    /// Revokes the communicator on every rank: this rank's operations, pending and future, fail
    /// at once with [`ErrorKind::Revoked`], and the root tells every other rank, whose operations
    /// then fail the same way. Unlike a failure, a revocation is no error of this rank's: the
    /// survivors of a failure revoke so that no rank keeps waiting, then shrink.
    pub(crate) fn revoke(&self) {
        self.record(
            Error::new(ErrorKind::Revoked, "this rank revoked the communicator").rank(self.rank),
        );
        if let Some(m) = &self.monitor {
            m.revoke();
        }
        self.abort.raise();
    }

    /// The ranks the job's root has reported failed or dead so far (a rank that failed on its
    /// own, e.g. by timing out, reports itself; one that vanished is reported by the root).
    pub(crate) fn failed_ranks(&self) -> Vec<usize> {
        self.monitor
            .as_ref()
            .map(|m| m.failed_ranks())
            .unwrap_or_default()
    }

    /// Asks the job's root which ranks survive a shrink (see `ccl_bootstrap`'s recovery):
    /// the members of the new communicator, as ranks of this one, and its unique id. A rank that
    /// asks again (the new communicator failed to form) joins the next round. Revokes this communicator here
    /// first: nothing more runs on it.
    pub(crate) fn shrink_agree(
        &self,
        exclude: &[usize],
        deadline: std::time::Instant,
    ) -> Result<(Vec<usize>, ccl_bootstrap::UniqueId)> {
        self.record(Error::new(ErrorKind::Revoked, "the communicator was shrunk").rank(self.rank));
        self.abort.raise();
        let Some(m) = &self.monitor else {
            return Err(Error::invalid_usage(
                "cannot shrink a communicator of one rank (it has no rendezvous to agree through)",
            )
            .rank(self.rank));
        };
        let d = m.shrink(exclude, self.size, deadline)?;

        let id = ccl_bootstrap::UniqueId::from_bytes(&d.id).map_err(|e| {
            Error::remote(format!(
                "the rendezvous sent a bad unique id for the shrunk communicator: {e}"
            ))
            .rank(self.rank)
        })?;
        Ok((d.members, id))
    }

    /// A transport error or a timeout often only shows the neighbour that gave up after the
    /// real failure (in a ring, rank 0 sees rank 3 close because rank 3 saw rank 2 die). Reports
    /// this rank's own failure to the job's monitor, waits (with deadlines) for its notice of
    /// the first failure, which carries the monitor's verdict on which rank the job waits for,
    /// and puts that verdict first in the error, with what was seen here. Which case applies is
    /// the monitor's table (`Monitor::conclude`); this writes the error for each.
    pub(crate) fn explain(&self, e: Error) -> Error {
        if !matches!(e.kind(), ErrorKind::Remote | ErrorKind::Timeout) {
            return e;
        }
        // Already explained (a notice failed this communicator while it waited).
        if let Some(first) = self.error() {
            return first;
        }
        let Some(m) = &self.monitor else { return e };
        let message = e.to_string();
        let unstopped = |r: usize| self.runs_unstopped_here(r);
        let seen = Seen {
            timed_out: e.kind() == ErrorKind::Timeout,
            message: &message,
            blamed: blamed_peer(&e),
            rank: self.rank,
            first_root: self.root_host,
            timeout: self.config.timeout,
            runs_unstopped_here: &unstopped,
        };
        let silent_s = ROOT_SILENT.get().as_secs_f64();
        match m.conclude(&seen) {
            Conclusion::Notice(n) if n.rank == self.rank => Error::new(
                e.kind(),
                format!("{}{}", verdict_prefix(&n.verdict), e.message()),
            )
            .rank(self.rank)
            .peer(
                n.culprit
                    .filter(|&c| c != self.rank)
                    .or(e.peer_id())
                    .unwrap_or(self.rank),
            ),
            // Even a notice from the neighbour that closed carries its own cause, which leads on
            // to the rank that failed first.
            Conclusion::Notice(n) => {
                let first = self.notice_error(&n);
                Error::remote(format!(
                    "{} (seen here as: {})",
                    first.message(),
                    e.message()
                ))
                .rank(self.rank)
                .peer(first.peer_id().unwrap_or(n.rank))
            }
            // A peer that returned from a revoked communicator and closed is no failure of its
            // own.
            Conclusion::Revoked(n) => Error::new(
                ErrorKind::Revoked,
                format!("{} (seen here as: {})", n.message, e.message()),
            )
            .rank(self.rank),
            Conclusion::RootDied { root } => {
                Error::remote(culprit::root_died(&self.who(root), e.message()))
                    .rank(self.rank)
                    .peer(root)
            }
            Conclusion::HubOrRootSilent { hub, root } => {
                let root = root.map_or_else(
                    || format!("at {}", m.root()),
                    |r| format!("in {}'s process", self.who(r)),
                );
                let text =
                    culprit::hub_or_root_silent(&self.who(hub), &root, silent_s, e.message());
                Error::new(e.kind(), text).rank(self.rank).peer(hub)
            }
            Conclusion::RootSilent { root } => {
                let text = culprit::root_silent(&self.who(root), silent_s, e.message());
                Error::new(e.kind(), text).rank(self.rank).peer(root)
            }
            Conclusion::Nothing => e,
        }
    }

    /// Tells the root whether this rank's part of the communicator of the last shrink round
    /// formed, and returns whether every member's did (only then may it be used; otherwise ask
    /// again with [`shrink_agree`](Self::shrink_agree)).
    pub(crate) fn shrink_formed(&self, ok: bool, deadline: std::time::Instant) -> Result<bool> {
        let m = self.monitor.as_ref().ok_or_else(|| {
            Error::internal("a shrink's outcome without a rendezvous").rank(self.rank)
        })?;
        m.formed(ok, deadline)
    }

    /// Whether rank `r`'s process runs on this host and is not stopped (`/proc` says so; a
    /// process of another host cannot be looked at).
    fn runs_unstopped_here(&self, r: usize) -> bool {
        let (Some(host), Some(&pid)) = (self.hosts.get(r), self.pids.get(r)) else {
            return false;
        };
        if host.as_str() != ccl_core::log::hostname() {
            return false;
        }
        ccl_core::log::process_state(pid).is_some_and(|s| !matches!(s, 'T' | 't' | 'Z' | 'X'))
    }

    /// `rank R (host:pid)`.
    pub(super) fn who(&self, r: usize) -> String {
        format!(
            "rank {r} ({}:{})",
            self.hosts.get(r).map_or("?", |h| h.as_str()),
            self.pids.get(r).copied().unwrap_or(0)
        )
    }

    /// What this rank is doing, for the job's monitor: its last operations and slow-rank
    /// figures.
    pub(crate) fn state_view(&self) -> ccl_diag::verdict::RankView {
        let ops = ccl_diag::dump::last_ops(&self.recorder(), 2);
        ccl_diag::verdict::RankView {
            rank: self.rank,
            host: ccl_core::log::hostname().to_string(),
            pid: std::process::id(),
            presence: ccl_diag::verdict::Presence::Answered,
            now_us: ccl_diag::recorder::now_us(),
            ops,
            slow: self.slow_peers(),
        }
    }

    /// Called while this rank waits: when the current operation has run much longer than
    /// usual (`CCL_LATE_WARN_MS`), asks the job's monitor once for the verdict, which the
    /// monitor thread logs as a warning.
    pub(crate) fn warn_if_late(&self) {
        let Some(m) = &self.monitor else { return };
        let (seq, text) = {
            let r = self.recorder();
            let Some(e) = r.entries().last() else { return };
            if e.state != ccl_diag::recorder::State::Running
                || self.warned_seq.load(Ordering::Relaxed) >= e.what.seq
            {
                return;
            }
            let usual = r.usual_us(e.what.name, e.what.bytes);
            let Some(limit) = late_limit(&self.config, usual) else {
                return;
            };
            let ran =
                Duration::from_micros(ccl_diag::recorder::now_us().saturating_sub(e.start_us));
            if ran < limit {
                return;
            }
            let usual = usual.map_or(String::new(), |u| {
                format!(" (usually {:.1} ms)", u as f64 / 1e3)
            });
            (
                e.what.seq,
                format!(
                    "late operation: {} #{} ({}, {}) has run {:.1} s{usual}; verdict",
                    e.what.name,
                    e.what.seq,
                    e.what.algo,
                    ccl_diag::human_bytes(e.what.bytes),
                    ran.as_secs_f64()
                ),
            )
        };
        self.warned_seq.store(seq, Ordering::Relaxed);
        m.request_verdict(&text);
    }

    /// The first error this communicator failed with, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Ok` unless the communicator has failed; then the original error.
    pub(crate) fn check(&self) -> Result<()> {
        match self.error() {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// Records `e` as the communicator's error unless one is already recorded; returns the
    /// recorded one. Errors stick: a collective that failed part-way leaves peers and buffers in
    /// an unknown state, so nothing more may run.
    pub(crate) fn fail(&self, e: Error) -> Error {
        let first = self.record(e.clone());
        // Only this rank's own failure is news for the others; one learned from a notice is
        // already known to them, and so is a revocation.
        if first.to_string() == e.to_string()
            && e.kind() != ErrorKind::Revoked
            && let Some(m) = &self.monitor
        {
            m.report(&e.to_string(), blamed_peer(&e));
        }
        first
    }

    /// Records `e` as the communicator's error unless one is already recorded (without telling
    /// the other ranks); returns the recorded one.
    pub(super) fn record(&self, e: Error) -> Error {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        match &*g {
            Some(first) => first.clone(),
            None => {
                ccl_warn!(Some(self.rank), "communicator failed: {e}");
                *g = Some(e.clone());
                self.failed.store(true, Ordering::Release);
                drop(g);
                self.dump_trace(&e.to_string());
                e
            }
        }
    }
}
