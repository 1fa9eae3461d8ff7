//! Allreduce algorithms (see [`crate::algo`] for the choice between them).

pub mod rd;
pub mod ring;
