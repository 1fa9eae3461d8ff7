//! The rendezvous: the root server that admits a communicator's ranks and introduces them, and
//! each rank's side of it ([`Bootstrap`]).
//!
//! The root is a small server thread that admits exactly `size` ranks presenting the secret and
//! tells each where its successor listens; the ranks' allgathers then run among themselves
//! (`gather`). The communicator uses one allgather to exchange transport connection handles
//! and host names; after that the root stays on as the job's monitor (`monitor`): it watches
//! every rank's line (its own, or through the hubs of the monitor tree), passes failures on, answers live queries and runs recovery
//! agreements.
//!
//! Every read and write is bounded by a deadline, and the root tells every rank which ranks
//! never arrived, so a job with a missing rank fails with a message naming it instead of
//! hanging.
//!
//! - `root`: the root server, from admission to the hand-over to the job monitor;
//! - `rank`: each rank's side, [`Bootstrap`];
//! - `gather`: the allgather among the ranks themselves;
//! - [`env`](mod@env): the rendezvous from launcher variables.
//!
//! The unique id that names a rendezvous is [`UniqueId`](crate::UniqueId) (`crate::id`).

pub mod env;
mod gather;
mod rank;
mod root;
#[cfg(test)]
mod tests;

pub use crate::wire::MAX_RANKS;
pub use rank::{Bootstrap, check_rank};
pub use root::root_is_local;
