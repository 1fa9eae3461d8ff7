//! The symbolic checker run over every schedule builder, as one test binary with a module per
//! family (each test binary links the library with link-time optimisation, so one binary
//! instead of seven builds in a fraction of the time).

mod allreduce;
mod collectives;
mod direct;
mod hier_shm;
mod host;
mod trees;
mod vcoll;
