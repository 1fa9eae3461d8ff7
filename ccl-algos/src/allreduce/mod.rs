//! Allreduce algorithms (see [`crate::algo`] for the choice between them).

pub mod hd;
pub mod hier;
pub mod rd;
pub mod ring;
pub mod tree;
