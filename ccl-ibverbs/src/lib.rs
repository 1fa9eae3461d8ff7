//! # ccl-ibverbs: the RoCEv2 / InfiniBand verbs transport of ccl
//!
//! The only crate of ccl that touches libibverbs. It implements
//! [`ccl_core::transport::Transport`] over reliable-connected queue pairs, in the manner of NCCL's
//! `net_ib`: receiver-driven flow control over pre-registered staging slots, payload by RDMA
//! WRITE_WITH_IMM, credits back over a control QP with its own traffic class, several data QPs per
//! peer, busy-poll then sleep on a completion channel.
//!
//! The library is opened at run time, the first time a device is looked at (see [`sys`]), so
//! programs that do not use verbs neither load it nor need it installed. The types, constants
//! and inline verbs of its C interface are the crate's own, written for rdma-core's ABI
//! ([`ffi`]), so building needs no C headers either (nor libclang). The `layout-check` feature
//! adds a test that compares every size, alignment, field offset and constant of [`ffi`] with
//! bindings generated from the installed headers (by `rdma-sys`, which needs libibverbs-dev):
//! `cargo test -p ccl-ibverbs --features layout-check`.
//!
//! ## Quick start
//!
//! Programs do not use this crate directly: `ccl` picks it when `CCL_TRANSPORT=ib`, or with
//! `CCL_TRANSPORT=auto` (the default) when an active RoCE port exists.
//!
//! ```sh
//! # SoftRoCE on a Linux host whose kernel has rdma_rxe (or scripts/rxe-vm.sh CMD in a VM)
//! sudo scripts/rxe-setup.sh
//! CCL_TRANSPORT=ib CCL_DEBUG=info target/release/ccl-bench allreduce --np 2 -b 1M -e 64M
//! ```
//!
//! Used directly, the transport is opened and handed to the communicator set-up like any other
//! transport (`ccl` opens one for each communicator):
//!
//! ```no_run
//! use ccl_core::Config;
//! use ccl_core::transport::Transport;
//! let cfg = Config::from_env()?;
//! if ccl_ibverbs::probe(&cfg) {
//!     let ib = ccl_ibverbs::IbTransport::open(&cfg)?;
//!     println!("{} on {} port {}", ib.name(), ib.device().name(), ib.device().port());
//! }
//! # Ok::<(), ccl_core::Error>(())
//! ```
//!
//! ## Settings
//!
//! `CCL_IB_HCA` (device/port filter, NCCL syntax; matching several ports makes each a network
//! plane: a connection per port, striped, a failed port routed around and set up again),
//! `CCL_IB_GID_INDEX`, `CCL_IB_TIMEOUT`,
//! `CCL_IB_RETRY_CNT`, `CCL_IB_RNR_RETRY`, `CCL_IB_TC`, `CCL_IB_CTRL_TC`, `CCL_IB_QPS_PER_CONN`,
//! `CCL_IB_SPLIT_DATA_ON_QPS`, `CCL_IB_SLOTS`, `CCL_IB_SLOT_SIZE`, `CCL_IB_SPIN_US`;
//! `docs/env.md` describes each.
//!
//! ## Design points
//!
//! - **Objects.** [`device::Context`], [`pd::Pd`], [`cq::CompChannel`], [`cq::Cq`], [`qp::Qp`] and
//!   [`mr::RegisteredBuf`] each wrap one verbs object and own their parents through `Arc`, so they
//!   are destroyed children first. A connection's objects are torn down in one place (dropping
//!   them moves the QPs to ERR and drains the CQ before destroying anything), whether the
//!   connection closes or fails half-way through its set-up. Each failing verb has its own
//!   [`VerbsError`] variant with the OS error.
//! - **Modules depend one way**: `transport` (listen, connect) uses `connect` (the set-up
//!   handshake), which builds an `endpoint` (the data path) over `resources` (the verbs objects
//!   of one connection), all on the opened `port` ([`IbDevice`]: device choice and context).
//! - **GID choice** ([`sysfs`]): from `/sys/class/infiniband/<dev>/ports/<p>/gids` and
//!   `gid_attrs/types`, preferring RoCE v2 with an IPv4-mapped address, skipping link-local and
//!   zero GIDs, scanning a short prefix of the table; `CCL_IB_GID_INDEX` overrides.
//! - **QP transitions** ([`qp::transition`]) are a pure function of the connection parameters.
//! - **ECMP entropy.** Every QP of a connection is given its own GRH flow label by the rule of
//!   [`ccl_core::entropy`], so devices that derive the RoCE v2 UDP source port from it (rxe,
//!   mlx5) send each QP's packets from a distinct port, and switches may hash them onto distinct
//!   paths. At `CCL_DEBUG=trace` the connection's log line lists each QP pair's port.
//! - **Flow control** (`endpoint`): bytes in flight per peer and direction are
//!   at most `CCL_IB_SLOTS x CCL_IB_SLOT_SIZE`; CQs and receive queues are sized from that bound.
//! - **Liveness.** The TCP connection used to exchange QP information stays open; a dead peer is
//!   seen as EOF on it (no hang while no work request is outstanding), and failed work
//!   completions become errors naming the peer ([`wc::wc_error`]).
//! - **Fork safety.** `ibv_fork_init` is called once, before any other verbs call of this crate
//!   ([`device::fork_init`]); staging memory is page-aligned `mmap` memory of its own, so
//!   `MADV_DONTFORK` affects nothing else. Registering caller memory marks its pages
//!   `MADV_DONTFORK` too: a child process forked while it is registered does not see them
//!   (`Communicator::alloc` memory is page-aligned memory of its own, so this touches nothing
//!   else). `RDMAV_FORK_SAFE=1` in the environment does the same
//!   for verbs calls made before ccl's.
//! - **Memory locking.** A registration refused with ENOMEM/EPERM says to raise `ulimit -l`.
//!
//! ## Zero copy from registered memory
//!
//! Sends of plain buffers copy into registered staging slots, and receives copy (or reduce) out
//! of them. Sending straight from arbitrary user buffers would need their registrations cached,
//! and a cache of user pointers is unsound without memory hooks: a buffer that is freed and
//! whose address is mapped again keeps the old pinned pages in the cached registration, and the
//! device silently sends stale data (rxe on the 6.1 kernel has no on-demand paging to fall back
//! on). So the transport registers user memory only when asked, through
//! [`Transport::register`](ccl_core::transport::Transport::register) ([`mr::UserMr`]), by
//! `ccl`'s `Registration` (which borrows the buffer for its whole life) and `Buffer` (which owns
//! it): neither can outlive the memory. A send from such memory
//! ([`Endpoint::send_registered`](ccl_core::transport::Endpoint::send_registered)) is an RDMA
//! write straight from it into the peer's staging ring, with the same credits, slots and
//! immediate values as a staged one (the receiver cannot tell them apart); its bytes count as
//! taken once the write completed. A receive into such memory
//! ([`Endpoint::recv_registered`](ccl_core::transport::Endpoint::recv_registered)) grants the
//! range to the peer in a control message (address, rkey, length and the stream offset it
//! starts at), and the peer writes the rest of those bytes straight into it, whether it sends
//! from registered memory or stages (see the `endpoint` module). Each connection counts what it
//! moved with and without a copy; [`traffic`] sums the connections that closed.

/// The log subsystem of everything here.
const LOG_SUBSYS: ccl_core::log::Subsys = ccl_core::log::Subsys::Net;

mod connect;
pub mod cq;
pub mod device;
mod endpoint;
pub mod error;
pub mod ffi;
pub mod mr;
pub mod pd;
mod planes;
mod port;
pub mod qp;
mod resources;
pub mod sys;
pub mod sysfs;
mod transport;
pub mod wc;
pub mod wire;

pub use endpoint::{Traffic, traffic};
pub use error::VerbsError;
pub use port::{IbDevice, probe, probe_at};
pub use transport::IbTransport;
