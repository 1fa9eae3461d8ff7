//! Core of ccl: element types and reduce kernels, errors, configuration, bootstrap, and the
//! transport abstraction with its non-RDMA implementations.
#![deny(unsafe_code)]

pub mod bootstrap;
pub mod comm;
pub mod config;
pub mod entropy;
pub mod error;
pub mod log;
pub mod net;
pub mod reduce;
pub mod test_values;
pub mod topology;
pub mod transport;
pub mod types;
pub mod wireup;

pub use bootstrap::UniqueId;
pub use config::Config;
pub use error::{Error, ErrorKind, Result};
/// The `half` crate, whose `f16` and `bf16` are element types.
pub use half;
pub use reduce::{Order, finish_avg, reduce_inplace, reduce_into, reduce_slice};
pub use types::{DataType, Element, ReduceOp};
