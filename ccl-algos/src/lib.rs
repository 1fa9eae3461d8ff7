//! Collective algorithms of ccl, as data.
//!
//! The collectives themselves (names, wire ids, NCCL's buffer rules) are [`collective`]. A
//! collective call is a [`schedule::Schedule`]: data that says, for one rank, what to send to
//! whom, what to receive and how to combine it, and what depends on what. Schedules are built by
//! pure functions of (rank, world size, count, placement): one module per algorithm
//! ([`allreduce`]'s ring, trees, halving-doubling, ..., [`host`] for shared memory), one table
//! of which collective has which algorithm ([`algo::implementation`]), the alpha-beta cost model
//! that chooses between them ([`cost`]), the `CCL_ALGO` overrides ([`overrides`]), and the
//! [`symbolic`] checker that runs every rank's schedule together without a network and proves
//! the results right. Nothing here moves a byte: the communicator in `ccl` runs schedules over
//! its transports, and `ccl-sim` over a model of a fabric.
//!
//! ```
//! use ccl_algos::algo::{Algo, Collective, build};
//! use ccl_algos::schedule::Shape;
//! use ccl_algos::symbolic::{Setup, simulate};
//! use ccl_core::ReduceOp;
//! use ccl_core::topology::Topology;
//!
//! // Every rank's ring allreduce of 10 floats over 4 ranks, checked together.
//! let n = 4;
//! let scheds: Vec<_> = (0..n)
//!     .map(|rank| {
//!         let shape = Shape::new(rank, n, 10, false, ReduceOp::Sum);
//!         build(Collective::AllReduce, Algo::Ring, &shape, &Topology::flat(n)).unwrap()
//!     })
//!     .collect();
//! let setup = Setup::allreduce(n, 10, false, ReduceOp::Sum, false);
//! assert!(simulate(&scheds, &setup, 1).is_ok());
//! ```
#![forbid(unsafe_code)]

#[macro_use]
mod wire_enum;

pub mod algo;
pub mod allgather;
pub mod allreduce;
pub mod alltoall;
pub mod barrier;
pub mod binary_tree;
pub mod broadcast;
pub mod collective;
pub mod cost;
pub mod direct;
pub mod host;
pub mod local;
pub mod overrides;
pub mod reduce;
pub mod reduce_scatter;
pub mod schedule;
pub mod symbolic;
pub mod vcoll;
