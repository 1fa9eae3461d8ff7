//! Waiting for peers: spin over all of them, then sleep.
//!
//! A rank with nothing to do first busy-polls: its caller keeps retrying the non-blocking calls
//! of every peer it waits on, for [`Peers::spin_window`]. Only then does it sleep, in
//! [`Peers::block`]: `poll(2)` on those endpoints' descriptors, the communicator's abort signal
//! and the job monitor, waking at least every 100 ms so the caller can look at its deadline.
//!
//! Spinning is what makes small messages fast on virtual machines whose idle vCPUs wake slowly;
//! sleeping is what leaves the core to other ranks on the same CPU and to a software RDMA device.
//! With a CPU per rank the spin never yields: measured beside one busy process, yielding turned
//! an 8 B allreduce from 3.4 us into 1.5 ms, because each yield hands the competitor a whole
//! timeslice. With more of the communicator's ranks on a host than it has CPUs, the executor
//! yields between polls instead: the competitor is then most likely the rank awaited, and
//! handing it the CPU at once beats sleeping and waking (4 ranks on 2 CPUs, 8 B allreduce over
//! shared memory: 500-1300 us sleeping at once, 15-25 us yielding).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::{Links, Peers};
use ccl_core::error::{Error, ErrorKind, Result};
use ccl_core::transport::{HostMemory, Interest};

/// The longest one sleep lasts, so that the caller's deadline is looked at again.
const RECHECK: Duration = Duration::from_millis(100);

impl Peers {
    /// How long a rank with nothing to do busy-polls its peers before it sleeps: `CCL_SPIN_US`,
    /// plus the transport's own window (`CCL_IB_SPIN_US` for verbs, where waking through the
    /// completion channel costs far more than a poll).
    pub(crate) fn spin_window(&self) -> Duration {
        self.config.spin + self.transport_props.spin
    }

    /// `Ok` unless the communicator was aborted; then its first error.
    pub(crate) fn check_aborted(&self) -> Result<()> {
        if !self.abort.is_raised() {
            return Ok(());
        }
        Err(self.check().err().unwrap_or_else(|| {
            Error::new(ErrorKind::Aborted, "the communicator was aborted").rank(self.rank)
        }))
    }

    /// Sleeps until an endpoint may make progress on what `waits` says this rank waits for from
    /// each peer, every rank of the host has posted `count` times in host memory (when `host` is
    /// `(memory, count)`), the communicator is aborted, another rank's failure is announced, a
    /// peer connects on demand (when `connections`), or `max` (at most 100 ms) passes. Returns
    /// at once when an endpoint turns out ready while arming its notification; `before_sleep`
    /// runs only when the rank really sleeps. Fails with the failure a notice announced.
    pub(crate) fn block(
        &self,
        links: &mut Links,
        waits: &[(usize, Interest)],
        host: Option<(&dyn HostMemory, u64)>,
        max: Duration,
        connections: bool,
        before_sleep: impl FnOnce(),
    ) -> Result<()> {
        for &(peer, interest) in waits {
            if !links.get(peer)?.prepare_wait(interest)? {
                return Ok(());
            }
        }
        if let Some((h, count)) = host
            && !h.arm(count)
        {
            return Ok(());
        }
        before_sleep();
        self.warn_if_late();
        let mut fds: Vec<(BorrowedFd<'_>, PollFlags)> = Vec::with_capacity(waits.len() + 3);
        fds.push((self.abort.fd(), PollFlags::POLLIN));
        if let Some(m) = &self.monitor {
            fds.push((m.fd(), PollFlags::POLLIN));
        }
        // The host ranks' posts, and their departures: a peer that leaves or dies is seen there
        // whether or not this rank ever connected to it.
        let mut departures_at = None;
        if let Some((h, _)) = host {
            fds.push((h.wait_fd(), PollFlags::POLLIN));
            if let Some(fd) = h.departures_fd() {
                departures_at = Some(fds.len());
                fds.push((fd, PollFlags::POLLIN));
            }
        }
        for &(peer, interest) in waits {
            if let Some(Some(ep)) = links.endpoints.get(peer) {
                ep.wait_fds(interest, &mut fds);
            }
        }
        if connections && let Some(fd) = links.lazy.as_ref().map(|l| l.wake_fd()) {
            fds.push((fd, PollFlags::POLLIN));
        }
        let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|(fd, f)| PollFd::new(*fd, *f)).collect();
        let ms = max.min(RECHECK).as_millis().max(1) as u16;
        match nix::poll::poll(&mut pfds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::io(ErrorKind::System, "poll", e.into())),
        }
        // Another rank's failure ends this wait too.
        self.check_notices()?;
        let departed = departures_at
            .and_then(|i| pfds[i].revents())
            .is_some_and(|r| !r.is_empty());
        drop(pfds);
        if let Some((h, count)) = host.filter(|_| departed)
            && let Some(i) = left_behind(h, count)
        {
            let peer = h.ranks()[i];
            return Err(Error::remote(format!(
                "shared-memory peer {peer} left before its post this rank waits for (its \
                 process ended, or it dropped the communicator)"
            ))
            .peer(peer));
        }
        Ok(())
    }
}

/// A host rank that left before posting `count` times. Asks about every rank, which also
/// clears the departures seen from `HostMemory::departures_fd`.
fn left_behind(h: &dyn HostMemory, count: u64) -> Option<usize> {
    let left: Vec<usize> = (0..h.ranks().len()).filter(|&i| h.gone(i)).collect();
    // Posts come before leaving: a rank that posted `count` times and then left ends no wait.
    left.into_iter()
        .find(|&i| i != h.me() && h.posted(i) < count)
}
