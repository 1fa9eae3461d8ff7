//! # ccl-shm: the shared-memory transport of ccl
//!
//! Ranks on one host talk through memory they share instead of through the network stack: at
//! set-up the ranks of a host join it, getting the host segment (a slot and a post counter per
//! rank, which the host-memory collectives run on) and each other's arenas from the lowest of
//! them; each pair of ranks that talks directly shares one anonymous memory file holding a
//! single-producer, single-consumer ring per direction, made when the pair is first used. A send copies into the ring; a receive copies out, or (for the reducing steps
//! of a collective) lends the bytes straight out of the ring to the reduction, so a byte costs one
//! copy in and one read out. Waiting spins briefly (the communicator's spin window) and then
//! sleeps on an eventfd that the other side writes only when the sleeper asked for it, so ranks
//! that outnumber the CPUs do not burn the CPU their peer needs.
//!
//! This is the only crate of ccl besides `ccl-ibverbs` and the C ABI with `unsafe` code: the
//! mappings ([`mem`]) and the ring protocol over them (`ring`), the host memory's vector kernels
//! ([`simd`]) and the flight recorder's reads of the CPU's counter ([`clock`]), each block with
//! its proof.
//!
//! ## Quick start
//!
//! Programs do not use this crate directly: with `CCL_TRANSPORT=auto` (the default) a
//! communicator connects every pair of ranks on one host through it, and `CCL_SHM_DISABLE=1`
//! turns that off. Used directly it is a [`ccl_core::transport::Transport`] like any other:
//!
//! ```
//! use ccl_core::transport::Transport;
//! let shm = ccl_shm::ShmTransport::new();
//! assert_eq!(shm.name(), "shm");
//! ```
//!
//! ## Guarantees
//!
//! - **Nothing is left behind.** Memory files are `memfd`s and the listening sockets live in the
//!   abstract namespace: neither has a name in any file system, so a job killed with `kill -9`
//!   leaves nothing in `/dev/shm` or anywhere else.
//! - **Only the job gets in.** A connection must present the communicator's secret before any
//!   descriptor is passed; a stranger's connection is dropped with a warning.
//! - **No `SIGBUS`.** Pages are allocated (`fallocate`) before mapping and the file is sealed
//!   against resizing, so a host short of memory gives an error at set-up naming the size and the
//!   setting that lowers it (`CCL_SHM_RING_SIZE`), and a peer cannot shrink the file under a
//!   mapping.
//! - **Registered memory is shared without a call per allocation.** Each rank's [`arena`] is a
//!   sparse memory file every rank of its host maps; `Communicator::alloc` allocates pages in it
//!   (a host short of memory is an error naming the size, never a `SIGBUS`), and peers check
//!   the owner's table of live blocks before they read or write a buffer it names.
//! - **A dead peer is noticed.** Each pair keeps its set-up socket open, and every rank of a
//!   host holds the others' life lines (one end of a socket pair whose other end only their
//!   owner holds, handed out when the host's ranks join it); the kernel closes a rank's ends
//!   when its process ends, however it ends, which wakes a rank waiting on that peer, connected
//!   to it or not.

/// The log subsystem of everything here.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Net;

pub mod arena;
pub mod clock;
pub mod fdpass;
pub mod host;
mod join;
pub mod mem;
pub mod pages;
mod ring;
pub mod simd;
mod transport;
mod wake;

pub use host::HostSegment;
pub use transport::{HostGroup, ShmTransport};
