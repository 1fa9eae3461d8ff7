//! Broadcast algorithms: copy the root's buffer to every rank.

pub mod ring;
pub mod rooted_tree;
