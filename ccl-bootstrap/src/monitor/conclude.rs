//! What a rank concludes when a peer's connection failed or one of its waits timed out: the
//! monitor's notice of the job's first failure (which carries the verdict), a revocation, or,
//! when no notice can come, which rank to blame for the silence. The one table of those cases;
//! the communicator turns a [`Conclusion`] into its error, with the sentences of
//! `ccl_diag::culprit`.

use std::time::Duration;

use super::Monitor;
use crate::timing::{GATHER, ROOT_SILENT, VERDICT_SLACK};
use crate::wire::Notice;

/// What the rank saw, and what the conclusion needs to know of the job.
pub struct Seen<'a> {
    /// The rank's own wait timed out (its report starts the verdict); otherwise a peer closed
    /// its connection, which the others saw too.
    pub timed_out: bool,
    /// The failure as this rank words it, for its report.
    pub message: &'a str,
    /// The peer it blames, if any.
    pub blamed: Option<usize>,
    /// This rank.
    pub rank: usize,
    /// The rank in whose process the rendezvous started (none when it ran elsewhere).
    pub first_root: Option<usize>,
    /// The communicator's timeout: how long a slow monitor on this host is waited for.
    pub timeout: Duration,
    /// Whether rank `r`'s process runs on this host and is not stopped.
    pub runs_unstopped_here: &'a dyn Fn(usize) -> bool,
}

impl std::fmt::Debug for Seen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seen")
            .field("timed_out", &self.timed_out)
            .field("message", &self.message)
            .field("blamed", &self.blamed)
            .field("rank", &self.rank)
            .field("first_root", &self.first_root)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What the rank concludes.
#[derive(Debug)]
pub enum Conclusion {
    /// The monitor's notice of the job's first failure (this rank's own, when `rank` is this
    /// rank: then it carries the verdict on this rank's report).
    Notice(Notice),
    /// No notice, but the communicator was revoked: the peer that closed had returned from it.
    Revoked(Notice),
    /// The monitor's line closed: the rank whose process ran it died.
    RootDied {
        /// That rank.
        root: usize,
    },
    /// No acknowledgement of this rank's report through its hub: the hub or the monitor.
    HubOrRootSilent {
        /// The hub.
        hub: usize,
        /// The rank whose process runs the monitor, if it is a rank.
        root: Option<usize>,
    },
    /// No acknowledgement of this rank's report from the monitor in `root`'s process.
    RootSilent {
        /// That rank.
        root: usize,
    },
    /// Nothing to add to what the rank saw.
    Nothing,
}

impl Monitor {
    /// Reports a timeout to the monitor, waits (within the control plane's deadlines) for the
    /// notice of the job's first failure, and concludes.
    ///
    /// The root acknowledges a report at once and gathers the verdict within `GATHER`; a root
    /// that does not even acknowledge within `ROOT_SILENT` is stopped or hung itself, unless
    /// its process runs on this host unstopped (a loaded or emulated machine: its verdict is
    /// worth the communicator's timeout).
    pub fn conclude(&self, seen: &Seen<'_>) -> Conclusion {
        // The rank whose process runs the monitor: the first root's, or the one that took over.
        let root_host = self.moved_to().or(seen.first_root);
        if seen.timed_out {
            self.report(seen.message, seen.blamed);
        }
        let acks = self.acks();
        let notice = self.wait(ROOT_SILENT.get()).or_else(|| {
            let alive = self.acks() > acks || !seen.timed_out;
            if alive && !self.root_gone() {
                self.wait(GATHER.get() + VERDICT_SLACK.get())
            } else if !self.root_gone() && root_host.is_some_and(|h| (seen.runs_unstopped_here)(h))
            {
                self.wait(seen.timeout)
            } else {
                None
            }
        });
        if let Some(n) = notice {
            return Conclusion::Notice(n);
        }
        if let Some(n) = self.revoked() {
            return Conclusion::Revoked(n);
        }
        let unanswered = seen.timed_out && self.acks() == acks;
        match root_host.filter(|&h| h != seen.rank) {
            // No notice can come when the root itself went: then the rank running it ended.
            Some(root) if self.root_gone() => Conclusion::RootDied { root },
            // Through a hub of the monitor tree, silence has two suspects.
            _ if unanswered && self.hub().is_some() => Conclusion::HubOrRootSilent {
                hub: self.hub().expect("checked"),
                root: root_host,
            },
            // Silence blames the root only when it had something to answer: a peer that left
            // cleanly (it said goodbye) gives the root no failure to announce.
            Some(root) if unanswered => Conclusion::RootSilent { root },
            _ => Conclusion::Nothing,
        }
    }
}
