//! Bootstrap wire format: length-prefixed frames `[u32 LE payload length][u8 kind][payload]`.
//!
//! Decoders never trust a length: frames are capped at [`MAX_FRAME`] before any allocation, and
//! every slice is bounds-checked, so bytes from a stranger give an error, never a panic or a huge
//! allocation.
//!
//! - `codec`: [`Frame`], [`FrameKind`] (every kind, the rendezvous's and the monitor's), reading
//!   and writing frames, blob lists, the traffic counters.
//! - `rendezvous`: a rank's [`Hello`] to the root and the allgather's [`GatherAsk`] and
//!   [`Block`].
//! - `monitor`: the job monitor's frames: [`Notice`], the shrink agreement, the monitor tree's
//!   envelopes and digests, [`Watchme`], [`Standby`], [`Rejoin`] and the live query.

mod codec;
mod monitor;
mod rendezvous;
#[cfg(test)]
mod tests;

pub use codec::{
    Frame, FrameKind, MAX_FRAME, blob_slices, decode_blobs, decode_header, encode_blobs,
    read_frame, read_ready, take_frames, traffic, write_frame,
};
pub(crate) use codec::{count_in, count_out};
pub(crate) use monitor::HOP;
pub use monitor::{
    ALL, INHERITED, MAX_NOTICE, Notice, Outcome, Rejoin, ShrinkDecision, ShrinkRequest, Standby,
    Watchme, attach, digest_query, digest_reply, envelope, join, open_envelope, query,
    query_secret, rank_of, read_attach, read_digest_query, read_digest_reply, read_join,
    read_round_flag, round_flag,
};
pub use rendezvous::{Block, GatherAsk, Hello, MAX_RANKS};
