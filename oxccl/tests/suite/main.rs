//! ccl's integration tests, as one test binary: ranks as threads of this process over every
//! transport (`common`), a module per subject.
//!
//! One binary, not one per file: each test binary links the whole library with link-time
//! optimisation, about a minute of CPU apiece, and fifteen of them were most of the test
//! suite's build. `leaks.rs`, which counts this process's threads and descriptors, stays a
//! binary of its own. Run one subject with a filter: `cargo test -p oxccl --test suite
//! collectives::`.

#[path = "../common/mod.rs"]
mod common;

mod algos;
mod allreduce;
mod any_source;
mod async_split;
mod collectives;
mod diagnosis;
mod errors;
mod ib;
mod lazy;
mod mismatch;
mod recover;
mod registered;
mod repeat;
mod shm_direct;
mod stress;
mod vcoll;
