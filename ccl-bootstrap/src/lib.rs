//! Bootstrap: how the ranks of a communicator find each other before any data moves, and the
//! job-wide services that run over the same connections afterwards.
//!
//! - [`UniqueId`] (128 bytes, like NCCL's): a magic, a random secret and the address of a
//!   **root**, the rendezvous server thread that admits exactly `size` ranks presenting the
//!   secret and introduces them ([`rendezvous`]); their allgathers then run among the ranks
//!   themselves (Bruck's algorithm), so the root moves O(N) bytes.
//! - [`env`](mod@env): the rendezvous from launcher variables (torchrun, Open MPI, PMI, Slurm), so jobs
//!   start unchanged under the launchers users already run.
//! - After set-up the root stays on as the **job monitor** (`monitor::root` on the root's side,
//!   [`Monitor`] on each rank's): it sees a rank's process end, passes failures on to every
//!   rank, asks the live ranks for their state to name the culprit of a hang (the analysis is
//!   `ccl-diag`'s), answers `ccl-trace --live`, and runs the agreement of a shrink
//!   (`monitor::recovery`).
//!
//! The root lives in whichever process created the id: the application's rank 0 (NCCL's model,
//! the id then travels by MPI, a file or a framework's store), the benchmark launcher, or rank 0
//! itself when the rendezvous comes from launcher variables. When that process dies, the first
//! live *standby* the root named (a rank outside its process) takes the monitor over, and every
//! rank's monitor thread moves to it: no single process's death ends the job's monitor. Every read and write is bounded by a
//! deadline and every connection must present the secret.
//!
//! The code: [`rendezvous`] (the root's side and each rank's, the allgather among the ranks,
//! launcher variables), `monitor` (the job monitor: the root's side, each rank's, the monitor
//! tree, the takeover, recovery), [`wire`] (the frames: the codec, the rendezvous's, the
//! monitor's) and `id` (the unique id).
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

mod id;
mod monitor;
pub mod rendezvous;
pub mod timing;
pub mod wire;

pub use id::{UNIQUE_ID_BYTES, UniqueId, random_secret};
pub use monitor::{Conclusion, Monitor, Seen, live_query, root_lines, state_bytes};
pub use rendezvous::{Bootstrap, MAX_RANKS, check_rank, env, root_is_local};
pub use wire::Notice;
