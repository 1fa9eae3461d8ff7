//! Reduce algorithms: the reduction of every rank's buffer, in the root's buffer only.

pub mod ring;
pub mod rooted_tree;
