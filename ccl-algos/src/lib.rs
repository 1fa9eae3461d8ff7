//! Collective algorithms of ccl.
//!
//! A collective is a [`schedule::Schedule`]: data that says, for one rank, what to send to whom,
//! what to receive and how to combine it, and what depends on what. Schedules are built by pure
//! functions of (rank, world size, count, placement), checked exhaustively by the
//! [`symbolic`] executor, cached, and run by the one [`exec`]utor over any transport.
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
