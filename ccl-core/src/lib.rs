//! Core of ccl: element types and reduce kernels, errors, configuration, bootstrap, and the
//! transport abstraction with its non-RDMA implementations.
#![deny(unsafe_code)]

pub mod types;

pub use types::{DataType, Element, ReduceOp};
