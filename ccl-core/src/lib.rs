//! Core of ccl: what every transport and every layer above needs, and nothing of the runtime.
//!
//! - element types and reduce kernels ([`types`], [`reduce`]), errors ([`error`]);
//! - every `CCL_*` setting in one place ([`config`]), logging ([`log`]);
//! - the job's topology ([`topology`]) and ECMP entropy ([`entropy`]);
//! - sockets with deadlines ([`net`]) and the one hash ([`hash`]);
//! - the transport abstraction ([`transport`]: `Transport`, `Endpoint`, `MemRegion`), one
//!   handle layout for every transport (`HandleFormat`), the interface of the memory a host's
//!   ranks share (`HostMemory`, `HostProgram`), the TCP and in-process transports, and the
//!   Endpoint conformance suite every transport runs (feature `conformance`, which the
//!   transport crates' tests enable).
//!
//! It builds and tests anywhere (no libibverbs).
#![forbid(unsafe_code)]

pub mod config;
pub mod entropy;
pub mod error;
pub mod hash;
pub mod log;
pub mod net;
pub mod reduce;
pub mod test_values;
pub mod topology;
pub mod transport;
pub mod types;

pub use config::Config;
pub use error::{Error, ErrorKind, Result};
/// The `half` crate, whose `f16` and `bf16` are element types.
pub use half;
pub use reduce::{Order, finish_avg, reduce_inplace, reduce_into, reduce_slice};
pub use types::{DataType, Element, ReduceOp};
