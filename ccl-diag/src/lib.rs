//! Diagnosis for ccl: what a communicator records of its operations, and how a stuck or failed
//! job is explained from it.
//!
//! - [`recorder`]: the flight recorder, a ring of the last operations that the executor fills
//!   (cheap enough to stay on).
//! - [`dump`]: the one schema of a dump ([`Dump`], [`Op`]): the JSON a rank writes, what
//!   `ccl-trace` reads, what the live monitor receives.
//! - [`view`]: one rank's view of itself (what it answers the job's monitor).
//! - [`verdict`]: from every rank's view, which rank (or link) the job waits for, in one line.
//! - [`culprit`]: the sentences that name a culprit when no verdict could be gathered (the
//!   monitor's process died or is silent), shared by every crate that finds such a case.
//! - [`digest`]: the same analysis's input summed up, so that a monitor tree merges it hub by
//!   hub instead of gathering every rank's view in one place.
//! - [`report`]: the report `ccl-trace DIR` prints over a directory of dumps.
//! - [`torch`] and [`chrome`]: the same dump as PyTorch's flight-recorder pickle (for its
//!   analyser) and as a Chrome trace.
//! - [`human_bytes`]: the one byte-size formatter, for errors, verdicts, benchmark tables and
//!   plot axes across ccl.
//!
//! It depends on no other crate of ccl: a tool that reads dumps needs nothing of the runtime.
//!
//! ```
//! use ccl_diag::recorder::{Begin, Recorder};
//! use ccl_diag::{Dump, Meta};
//!
//! let mut rec = Recorder::new(16);
//! let begin = Begin {
//!     seq: 1,
//!     name: "allreduce",
//!     algo: "ring",
//!     dtype: "float",
//!     op: "sum",
//!     count: 4,
//!     bytes: 16,
//!     root: None,
//! };
//! rec.begin(begin, [(1, 16, 16)].into_iter());
//! rec.end(None);
//! let meta = Meta {
//!     comm: "c0".into(),
//!     rank: 0,
//!     size: 2,
//!     host: "h".into(),
//!     pid: 1,
//!     reason: "example".into(),
//! };
//! let dump = Dump::of(&rec, &meta);
//! assert!(dump.to_json().contains("\"name\":\"allreduce\""));
//! ```
#![forbid(unsafe_code)]

pub mod chrome;
pub mod culprit;
pub mod digest;
pub mod dump;
pub mod recorder;
pub mod report;
pub mod torch;
pub mod verdict;
pub mod view;

pub use dump::{Dump, Meta, Op};
pub use verdict::human_bytes;
