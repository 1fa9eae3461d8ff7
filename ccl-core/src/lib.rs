//! Core of ccl: element types and reduce kernels, errors, configuration, bootstrap, and the
//! transport abstraction with its non-RDMA implementations.
#![deny(unsafe_code)]

pub mod reduce;
pub mod types;

pub use reduce::{Order, finish_avg, reduce_inplace, reduce_into, reduce_slice};
pub use types::{DataType, Element, ReduceOp};
