//! The job monitor: once the ranks have met, the root stays on and watches the job for as long
//! as its communicator lives, over the connections the rendezvous made (the rendezvous hands
//! them over: `Watch` on the root's side, [`Monitor`] and its thread on each rank's).
//!
//! The root's side:
//! - `root`: the watch, what it knows of each rank, its loop, and the failures it passes on to
//!   every rank (notices);
//! - `lines`: the lines the root holds, read and routed through the hubs of the monitor tree;
//! - `verdict`: gathering the ranks' states (or the hubs' digests) and naming the rank or link
//!   the job waits for;
//! - `clients`: what arrives at the root's listener: live queries ([`live_query`]) and ranks
//!   joining the root directly;
//! - `recovery`: revoking a communicator and agreeing on the survivors of a shrink.
//!
//! Each rank's side:
//! - `rank`: [`Monitor`], what the communicator holds;
//! - `thread`: the rank's monitor thread and its line up the tree;
//! - `hub`: what that thread does as a hub for the ranks below it;
//! - `shared`: what the rank's threads and its monitor thread share, and how a frame from the
//!   root is handled;
//! - `conclude`: what a rank concludes when a peer failed or a wait timed out (the monitor's
//!   notice, a revocation, or whom to blame for the monitor's silence).
//!
//! Both sides: `tree`, the shape of the monitor tree (arithmetic on the size and the fan-out);
//! `takeover`, how the monitor survives its process's death (the standbys the root names, a
//! rank's failover to them, the watch a standby runs).

mod clients;
mod conclude;
mod hub;
mod lines;
mod rank;
mod recovery;
mod root;
mod shared;
mod takeover;
mod thread;
mod tree;
mod verdict;

#[cfg(test)]
pub(crate) mod hooks;
#[cfg(test)]
mod tests;

pub use clients::live_query;
pub use conclude::{Conclusion, Seen};
pub use lines::root_lines;
pub use rank::Monitor;
pub use verdict::state_bytes;

// What the rendezvous hands its connections over to, on the root's side and on a rank's.
pub(crate) use recovery::Abandon;
pub(crate) use root::Watch;
pub(crate) use shared::{Recovery, Shared};
pub(crate) use thread::Relay;
pub(crate) use tree::Tree;
