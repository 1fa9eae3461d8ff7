//! Bootstrap: how the ranks of a communicator find each other before any data moves, and the
//! job-wide services that run over the same connections afterwards.
//!
//! - [`UniqueId`] (128 bytes, like NCCL's): a magic, a random secret and the address of a
//!   **root**, the rendezvous server thread that admits exactly `size` ranks presenting the
//!   secret and introduces them ([`rendezvous`]); their allgathers then run among the ranks
//!   themselves (Bruck's algorithm), so the root moves O(N) bytes.
//! - [`env`](mod@env): the rendezvous from launcher variables (torchrun, Open MPI, PMI, Slurm), so jobs
//!   start unchanged under the launchers users already run.
//! - After set-up the root stays on as the **job monitor** (`watch` on the root's side,
//!   [`Monitor`] on each rank's): it sees a rank's process end, passes failures on to every
//!   rank, asks the live ranks for their state to name the culprit of a hang (the analysis is
//!   `ccl-diag`'s), answers `ccl-trace --live`, and runs the agreement of a shrink
//!   (`recovery`).
//!
//! The root lives in whichever process created the id: the application's rank 0 (NCCL's model,
//! the id then travels by MPI, a file or a framework's store), the benchmark launcher, or rank 0
//! itself when the rendezvous comes from launcher variables. When that process dies, the first
//! live *standby* the root named (a rank outside its process) takes the monitor over, and every
//! rank's monitor thread moves to it: no single process's death ends the job's monitor. Every read and write is bounded by a
//! deadline and every connection must present the secret.
//!
//! ```no_run
//! use std::time::Duration;
//! use ccl_bootstrap::{Bootstrap, UniqueId};
//!
//! // One process makes the id (and runs the root); every rank gets it somehow.
//! let id = UniqueId::new()?;
//! let mut b = Bootstrap::connect(&id, 0, 1, Duration::from_secs(30))?;
//! let all = b.allgather(b"my address")?;
//! assert_eq!(all.len(), 1);
//! # Ok::<(), ccl_core::Error>(())
//! ```
#![forbid(unsafe_code)]

/// The log subsystem of everything here.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Bootstrap;

pub mod env;
mod gather;
mod id;
mod monitor;
mod recovery;
mod relay;
pub mod rendezvous;
mod shared;
mod tree;
mod watch;
pub mod wire;

/// What lets the tests of one process play a root that dies alone: a root "in another process"
/// and a root killed by its address.
#[cfg(test)]
pub(crate) mod hooks {
    use std::net::SocketAddr;
    use std::sync::Mutex;

    /// Roots that count as running in another process, with the ranks that count as running
    /// in it.
    static REMOTE: Mutex<Vec<(SocketAddr, Vec<usize>)>> = Mutex::new(Vec::new());
    static KILLED: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

    /// The root at `addr` counts as running in another process than its ranks, but `with_root`.
    pub(crate) fn set_remote(addr: SocketAddr, with_root: Vec<usize>) {
        REMOTE.lock().unwrap().push((addr, with_root));
    }

    /// The ranks that count as running in the root's process, if it counts as remote.
    pub(crate) fn remote(addr: SocketAddr) -> Option<Vec<usize>> {
        let all = REMOTE.lock().unwrap();
        all.iter().find(|(a, _)| *a == addr).map(|(_, w)| w.clone())
    }

    /// Ends the monitor at `addr` as its process's death would: its lines close.
    pub(crate) fn kill(addr: SocketAddr) {
        KILLED.lock().unwrap().push(addr);
    }

    pub(crate) fn killed(addr: SocketAddr) -> bool {
        KILLED.lock().unwrap().contains(&addr)
    }
}

pub use id::{UNIQUE_ID_BYTES, UniqueId, random_secret};
pub use monitor::Monitor;
pub use rendezvous::{Bootstrap, MAX_RANKS, check_rank, root_is_local};
pub use watch::{GATHER, live_query, root_lines, state_bytes};
pub use wire::Notice;
