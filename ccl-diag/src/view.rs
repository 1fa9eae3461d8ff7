//! One rank's view of itself: who it is and its latest operations, what a rank answers the job's
//! monitor and what a dump says ([`crate::verdict`] and [`crate::digest`] read it).

use serde::{Deserialize, Serialize};

use crate::dump::{Dump, Op};
use crate::recorder::State;

/// A peer that the slow-rank report named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowPeer {
    pub peer: usize,
    /// Mean lateness over the last window, microseconds.
    pub mean_late_us: i64,
    /// Operations with this peer in the window.
    pub ops: u64,
}

/// Whether a rank could tell what it is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Presence {
    /// It answered (or left a dump).
    Answered,
    /// Its process is alive as far as anyone knows but it did not answer in time: stopped
    /// (`SIGSTOP`, a debugger) or its whole process is hung.
    Silent,
    /// Its process ended.
    Dead,
    /// No dump from it (`ccl-trace DIR`): stopped, killed, or stuck outside ccl.
    NoDump,
}

/// One rank: who it is and its latest operations, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankView {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    pub presence: Presence,
    /// Its clock when it answered (microseconds since the epoch).
    pub now_us: u64,
    pub ops: Vec<Op>,
    pub slow: Vec<SlowPeer>,
}

impl RankView {
    /// A rank known only by name and how it failed to answer.
    pub fn absent(rank: usize, host: &str, pid: u32, presence: Presence) -> RankView {
        RankView {
            rank,
            host: host.to_string(),
            pid,
            presence,
            now_us: 0,
            ops: Vec::new(),
            slow: Vec::new(),
        }
    }

    /// What a rank's dump says.
    pub fn from_dump(d: &Dump) -> RankView {
        RankView {
            rank: d.meta.rank,
            host: d.meta.host.clone(),
            pid: d.meta.pid,
            presence: Presence::Answered,
            now_us: d.time_us,
            ops: d.entries.clone(),
            slow: Vec::new(),
        }
    }

    pub(crate) fn latest(&self) -> Option<&Op> {
        self.ops.iter().max_by_key(|o| o.seq)
    }

    /// The newest operation this rank has not finished: where it waits, if it waits.
    pub(crate) fn open(&self) -> Option<&Op> {
        self.ops
            .iter()
            .filter(|e| e.state != State::Done)
            .max_by_key(|e| e.seq)
    }

    pub(crate) fn who(&self) -> String {
        if self.host.is_empty() {
            format!("rank {}", self.rank)
        } else {
            format!("rank {} ({}:{})", self.rank, self.host, self.pid)
        }
    }
}
