//! A rank's line to the root while the communicator lives.
//!
//! A thread per communicator reads it, so the rank answers the root's state queries whatever
//! its own threads do (wait in a collective, compute, sleep): only a stopped or dead process
//! stays silent, and that silence is what names it. The thread queues failure notices and wakes
//! the rank's waits through an eventfd; this rank's own failure goes out through the same
//! connection.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::shared::{ConnectHook, NoticeHook, Shared, StateSource};
use crate::timing::BYE_HEARD;
use crate::wire::{self, Frame, FrameKind, Notice};
use ccl_core::error::{Error, ErrorKind, Result};

/// A rank's line to the root while the communicator lives: failures of other ranks arrive here
/// as [`Notice`]s (with the root's verdict), and this rank's own failure goes out through it.
#[derive(Debug)]
pub struct Monitor {
    pub(crate) shared: Arc<Shared>,
    /// Whether dropping it says goodbye (always, outside tests of a rank that vanishes).
    pub(crate) bye: bool,
}

impl Monitor {
    /// Readable when a notice (or the root's end) arrives.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.shared.wake.as_fd()
    }

    /// Sets what this rank answers the root's state queries with (once; later calls are
    /// ignored). Until it is set the rank does not answer.
    pub fn set_state_source(&self, f: StateSource) {
        let _ = self.shared.state.set(f);
    }

    /// Gives every rank's host name and process id (once; later calls are ignored): when this
    /// rank takes the job's monitor over, a rank of its host whose process has ended is named
    /// dead at once instead of after the timeout.
    pub fn set_roster(&self, ranks: Vec<(String, u32)>) {
        if ranks.len() == self.shared.size {
            let _ = self.shared.roster.set(ranks);
        }
    }

    /// Sets what to do with each failure notice as it arrives, on the monitor thread, before
    /// the rank's waits see it (once; later calls are ignored).
    pub fn set_notice_hook(&self, f: NoticeHook) {
        let _ = self.shared.on_notice.set(f);
    }

    /// Sets what to do when another rank asks this one to connect to it, on the monitor thread
    /// (once; later calls are ignored).
    pub fn set_connect_hook(&self, f: ConnectHook) {
        let _ = self.shared.on_connect.set(f);
        // Under the lock the monitor thread takes to look for the hook: a request it found
        // no hook for is in the list by now.
        let early = std::mem::take(
            &mut *self
                .shared
                .early_connects
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        if let Some(hook) = self.shared.on_connect.get() {
            for from in early {
                hook(from);
            }
        }
    }

    /// Asks rank `to` (through the root) to connect to this rank: the lower rank of a pair
    /// makes its connection, wherever its own program is.
    pub fn ask_connect(&self, to: usize) {
        self.shared.send(&Frame::new(
            FrameKind::ConnectMe,
            (to as u32).to_le_bytes().to_vec(),
        ));
    }

    /// The first notice that has arrived, without waiting. The first failure is the one that
    /// counts: it stays, so every later look sees it too.
    pub fn poll(&self) -> Option<Notice> {
        self.shared
            .notices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .front()
            .cloned()
    }

    /// Waits up to `max` for a notice; returns `None` early once the communicator is revoked.
    pub fn wait(&self, max: Duration) -> Option<Notice> {
        let until = Instant::now() + max;
        loop {
            if let Some(n) = self.poll() {
                return Some(n);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() || self.root_gone() || self.revoked().is_some() {
                return None;
            }
            std::thread::sleep(left.min(Duration::from_millis(10)));
        }
    }

    /// Who revoked the communicator, if a rank has (or the root did, for a shrink).
    pub fn revoked(&self) -> Option<Notice> {
        self.shared.recovery().revoked.clone()
    }

    /// The ranks the root has said failed or died so far.
    pub fn failed_ranks(&self) -> Vec<usize> {
        self.shared.recovery().failed.iter().copied().collect()
    }

    /// The error the root failed the job with, if it did (a rank left while the ranks set up).
    pub fn root_error(&self) -> Option<String> {
        self.shared.recovery().root_error.clone()
    }

    /// Tells the root (and through it every rank) that this rank revoked the communicator.
    pub fn revoke(&self) {
        self.shared.send(&Frame::new(FrameKind::Revoke, Vec::new()));
    }

    /// Asks the root to shrink the communicator (see `recovery`) and waits, until `deadline`,
    /// for the members and the unique id of the new one. When the monitor moves to a standby
    /// rank meanwhile (the root's process died), the request goes again to the new one.
    pub fn shrink(
        &self,
        exclude: &[usize],
        size: usize,
        deadline: Instant,
    ) -> Result<wire::ShrinkDecision> {
        loop {
            let epoch = self.shared.epoch.load(Ordering::Acquire);
            let req = wire::ShrinkRequest {
                round: self.shared.round(),
                exclude: exclude.to_vec(),
            };
            self.shared.send(&req.encode());
            let Some((at, f)) = self.answer(epoch, deadline)? else {
                continue;
            };
            if f.kind != FrameKind::Shrunk {
                return Err(Error::remote(format!(
                    "the rendezvous answered a shrink request with {:?}",
                    f.kind
                ))
                .rank(self.shared.rank));
            }
            let d = wire::ShrinkDecision::decode(&f.payload, size)
                .map_err(|e| e.rank(self.shared.rank))?;
            *self
                .shared
                .shrink_round
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = (at, d.round);
            return Ok(d);
        }
    }

    /// Tells the root whether this rank's part of the shrunk communicator of the last round
    /// formed, and waits until `deadline` for whether every member's did (then it may be used).
    /// A root that died before it said counts as "no": the members ask its successor again.
    pub fn formed(&self, ok: bool, deadline: Instant) -> Result<bool> {
        let (at, round) = *self
            .shared
            .shrink_round
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if at == self.shared.epoch.load(Ordering::Acquire) {
            self.shared
                .send(&wire::round_flag(FrameKind::Formed, round, ok));
            while let Some((e, f)) = self.answer(at, deadline)? {
                if e != at {
                    // The next monitor's: the verdict below is about this round.
                    self.shared.recovery().answers.push_front((e, f));
                    break;
                }
                match (f.kind, wire::read_round_flag(&f.payload)) {
                    (FrameKind::Commit, Ok((r, commit))) if r == round => return Ok(commit),
                    // A verdict on a round of a dead monitor that this rank no longer waits for.
                    (FrameKind::Commit, Ok((wire::INHERITED, _))) => continue,
                    _ => {
                        return Err(Error::remote(format!(
                            "the rendezvous answered a shrink's outcome with {:?}",
                            f.kind
                        ))
                        .rank(self.shared.rank));
                    }
                }
            }
        }
        // The monitor that decided the round died before this rank heard its verdict. It may
        // have told other members to use the new communicator: its successor learns that from
        // them (this rank's monitor thread told it what this rank knows) and says.
        loop {
            let epoch = self.shared.epoch.load(Ordering::Acquire);
            match self.answer(epoch, deadline)? {
                Some((_, f)) => match (f.kind, wire::read_round_flag(&f.payload)) {
                    (FrameKind::Commit, Ok((wire::INHERITED, commit))) => return Ok(commit),
                    _ => continue,
                },
                None => continue,
            }
        }
    }

    /// The next answer to a shrink request or outcome from the root of `epoch`, with its
    /// epoch; an error frame is an error. `None` when the monitor moved to another rank since
    /// (the answer will not come). Answers of earlier roots are dropped; one that came before
    /// its root died still counts (a commit some members may have acted on).
    fn answer(&self, epoch: u32, deadline: Instant) -> Result<Option<(u32, Frame)>> {
        let rank = self.shared.rank;
        loop {
            let next = {
                let mut r = self.shared.recovery();
                while r.answers.front().is_some_and(|(e, _)| *e < epoch) {
                    r.answers.pop_front();
                }
                r.answers.pop_front()
            };
            if let Some((at, f)) = next {
                if f.kind == FrameKind::Error {
                    let msg = String::from_utf8_lossy(&f.payload).into_owned();
                    return Err(Error::new(ErrorKind::Revoked, msg).rank(rank));
                }
                return Ok(Some((at, f)));
            }
            if self.shared.epoch.load(Ordering::Acquire) != epoch {
                return Ok(None);
            }
            if self.root_gone() {
                return Err(Error::remote(format!(
                    "cannot shrink: the job's monitor at {} is gone (its process ended, and no \
                     rank outside it could take over)",
                    self.root()
                ))
                .rank(rank));
            }
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "no answer to the shrink request from the job's monitor at {}",
                    self.root()
                ))
                .rank(rank));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Acknowledgements from the root so far (it answers a failure report or verdict request
    /// at once, before it gathers the verdict): whether the root is alive.
    pub fn acks(&self) -> u64 {
        self.shared.acks.load(Ordering::Acquire)
    }

    /// Tells the root (and through it every rank) that this rank failed, and why: `peer` is
    /// the rank its error names, which the root blames instead of this rank when its verdict
    /// cannot tell the two apart.
    pub fn report(&self, message: &str, peer: Option<usize>) {
        let n = Notice {
            rank: self.shared.rank,
            died: false,
            message: message.to_string(),
            verdict: String::new(),
            culprit: peer,
        };
        self.shared.send(&n.encode(FrameKind::Failure));
    }

    /// Asks the root for the current verdict; the answer is logged at warn level after
    /// `preamble` when it comes (by the monitor thread).
    pub fn request_verdict(&self, preamble: &str) {
        self.shared.send(&Frame::new(
            FrameKind::VerdictRequest,
            preamble.as_bytes().to_vec(),
        ));
    }

    /// Where the job's monitor runs (for messages): the root's address, or the standby's that
    /// took it over.
    pub fn root(&self) -> SocketAddr {
        self.shared.root()
    }

    /// The rank whose process runs the job's monitor since it took over from a root that died,
    /// if one did.
    pub fn moved_to(&self) -> Option<usize> {
        Some(self.shared.moved_to.load(Ordering::Acquire)).filter(|&r| r != usize::MAX)
    }

    /// Whether the root's connection has closed (its process ended).
    pub fn root_gone(&self) -> bool {
        self.shared.root_gone.load(Ordering::Acquire)
    }

    /// The hub rank this rank reports to the root through, if it does not report directly
    /// (with more ranks than `CCL_MONITOR_FANOUT`).
    pub fn hub(&self) -> Option<usize> {
        Some(self.shared.hub.load(Ordering::Acquire)).filter(|&h| h != usize::MAX)
    }

    /// The standby ranks the root named, once it has.
    pub(crate) fn standby(&self) -> Option<wire::Standby> {
        self.shared
            .standby
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Drops this monitor as a rank whose process died would: its lines close without a
    /// goodbye.
    #[cfg(test)]
    pub(crate) fn vanish(mut self) {
        self.bye = false;
        // A dead process's monitor thread does not linger either.
        self.shared.vanished.store(true, Ordering::Release);
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // A goodbye tells the root this rank's closing is no failure.
        if self.bye {
            self.shared.send(&Frame::new(FrameKind::Bye, Vec::new()));
            // The monitor runs in this process: it dies with it, maybe right after this. The
            // others must know that this rank had left first, or they would name it dead. After
            // a failure the wait matters as much: the monitor takes the goodbye after the
            // failure's notices, and a process that ended first would keep them from the
            // others (who would then take the monitor over and name this rank the culprit). A
            // revoked communicator (a shrink's old one) gives the wait no purpose: its
            // survivors have agreed already, and the new communicator must not wait for it.
            let here = self
                .standby()
                .is_some_and(|sb| !sb.ranks.is_empty() && sb.with_root.contains(&self.shared.rank))
                && self.revoked().is_none();
            let until = Instant::now() + BYE_HEARD.get();
            while here
                && !self.shared.bye_heard.load(Ordering::Acquire)
                && !self.root_gone()
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let _ = self.shared.stop.write(1);
    }
}
