//! The library's error type.
//!
//! Every error carries a [`ErrorKind`] that mirrors NCCL's result codes (so the C ABI maps it one to
//! one), the rank that saw it and, where there is one, the peer it concerns. The message is written
//! for the person who has to find out which rank or link broke a job, so it names the operation and
//! the value that was wrong.
//!
//! `Error` is `Clone` because a communicator's first error is sticky: every later call and every
//! waiter gets a copy of the original cause.

use std::fmt;
use std::io;
use std::sync::Arc;

/// What kind of failure an [`Error`] is; the same classes as NCCL's `ncclResult_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A value passed by the caller is out of range or malformed.
    InvalidArgument,
    /// The call is not allowed in this state (e.g. on a destroyed or failed communicator).
    InvalidUsage,
    /// An operating-system call failed (socket, memory registration, ...).
    System,
    /// A peer failed, closed its connection or sent something that breaks the protocol.
    Remote,
    /// A deadline passed.
    Timeout,
    /// The communicator was aborted.
    Aborted,
    /// The communicator was revoked (by a rank, or because the survivors shrank it): every
    /// operation on it fails; a shrink gives the survivors a new one.
    Revoked,
    /// A bug in the library.
    Internal,
}

impl ErrorKind {
    /// A short lowercase name, used as the message prefix.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::InvalidUsage => "invalid usage",
            ErrorKind::System => "system error",
            ErrorKind::Remote => "remote error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Aborted => "aborted",
            ErrorKind::Revoked => "revoked",
            ErrorKind::Internal => "internal error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A ccl error: a kind, the rank and peer involved, a message and an optional OS-level cause.
#[derive(Clone, thiserror::Error)]
#[error(transparent)]
pub struct Error {
    inner: Arc<Inner>,
}

/// Shown as `kind (rank R, peer P): message: OS error`.
#[derive(Debug, thiserror::Error)]
#[error("{kind}{}: {message}{}", whose(*.rank, *.peer), cause(.source))]
struct Inner {
    kind: ErrorKind,
    rank: Option<usize>,
    peer: Option<usize>,
    message: String,
    source: Option<io::Error>,
}

/// The ` (rank R, peer P)` part of a message, with what is known of the two.
fn whose(rank: Option<usize>, peer: Option<usize>) -> String {
    match (rank, peer) {
        (Some(r), Some(p)) => format!(" (rank {r}, peer {p})"),
        (Some(r), None) => format!(" (rank {r})"),
        (None, Some(p)) => format!(" (peer {p})"),
        (None, None) => String::new(),
    }
}

/// The `: OS error` tail of a message, when there is one.
fn cause(source: &Option<io::Error>) -> String {
    source
        .as_ref()
        .map(|s| format!(": {s}"))
        .unwrap_or_default()
}

/// The result type of every fallible call in ccl.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A new error of `kind` with `message`; rank and peer are added with [`Error::rank`] and
    /// [`Error::peer`] where they are known.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            inner: Arc::new(Inner {
                kind,
                rank: None,
                peer: None,
                message: message.into(),
                source: None,
            }),
        }
    }

    /// An error caused by an OS-level failure.
    pub fn io(kind: ErrorKind, message: impl Into<String>, source: io::Error) -> Error {
        let mut e = Error::new(kind, message);
        Arc::get_mut(&mut e.inner)
            .expect("fresh error is unique")
            .source = Some(source);
        e
    }

    /// Shorthand for an [`ErrorKind::InvalidArgument`] error.
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Shorthand for an [`ErrorKind::InvalidUsage`] error.
    pub fn invalid_usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidUsage, message)
    }

    /// Shorthand for an [`ErrorKind::Internal`] error.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    /// Shorthand for an [`ErrorKind::Remote`] error.
    pub fn remote(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Remote, message)
    }

    /// Shorthand for an [`ErrorKind::Timeout`] error.
    pub fn timeout(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Timeout, message)
    }

    /// The rank that saw this error (set when not already set).
    #[must_use]
    pub fn rank(self, rank: usize) -> Error {
        self.with(|i| {
            if i.rank.is_none() {
                i.rank = Some(rank)
            }
        })
    }

    /// The peer rank this error concerns (set when not already set).
    #[must_use]
    pub fn peer(self, peer: usize) -> Error {
        self.with(|i| {
            if i.peer.is_none() {
                i.peer = Some(peer)
            }
        })
    }

    /// Prefixes the message with what was being done, e.g. `"connecting to peer 3"`.
    #[must_use]
    pub fn context(self, what: impl fmt::Display) -> Error {
        self.with(|i| i.message = format!("{what}: {}", i.message))
    }

    fn with(mut self, f: impl FnOnce(&mut Inner)) -> Error {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => f(inner),
            None => {
                let old = &*self.inner;
                let mut inner = Inner {
                    kind: old.kind,
                    rank: old.rank,
                    peer: old.peer,
                    message: old.message.clone(),
                    source: old
                        .source
                        .as_ref()
                        .map(|s| io::Error::new(s.kind(), s.to_string())),
                };
                f(&mut inner);
                self.inner = Arc::new(inner);
            }
        }
        self
    }

    /// The class of failure.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The rank that saw the error, when known.
    pub fn rank_id(&self) -> Option<usize> {
        self.inner.rank
    }

    /// The peer the error concerns, when there is one.
    pub fn peer_id(&self) -> Option<usize> {
        self.inner.peer
    }

    /// The message without the kind/rank/peer prefix.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// The OS error behind this one, if any.
    pub fn os_error(&self) -> Option<&io::Error> {
        self.inner.source.as_ref()
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug output shows up in `unwrap()` panics; the readable form helps more there.
        write!(f, "Error({self})")
    }
}

/// Maps an OS error from a transport to a ccl error: a peer that went away is a remote failure,
/// everything else a system failure.
pub fn classify_io(e: &io::Error) -> ErrorKind {
    use io::ErrorKind as K;
    match e.kind() {
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
            ErrorKind::Remote
        }
        K::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::System,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_rank_and_peer() {
        let e = Error::remote("connection closed while receiving 4096 bytes")
            .peer(3)
            .rank(1);
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert_eq!(
            e.to_string(),
            "remote error (rank 1, peer 3): connection closed while receiving 4096 bytes"
        );
        // The first rank/peer stick: an error passed up through layers keeps where it started.
        let e2 = e.clone().rank(7).peer(9);
        assert_eq!(e2.rank_id(), Some(1));
        assert_eq!(e2.peer_id(), Some(3));
    }

    #[test]
    fn context_and_source() {
        let src = io::Error::from_raw_os_error(111);
        let e = Error::io(ErrorKind::System, "connect to 127.0.0.1:1", src).context("bootstrap");
        let s = e.to_string();
        assert!(s.starts_with("system error: bootstrap: connect to 127.0.0.1:1: "));
        assert!(std::error::Error::source(&e).is_some());
        // Cloned errors share the cause and can still be extended.
        let c = e.clone().rank(2);
        assert!(c.to_string().contains("(rank 2)"));
        assert!(c.os_error().is_some());
        assert_eq!(e.rank_id(), None);
    }

    #[test]
    fn display_with_every_part_known_or_not() {
        let e = || Error::timeout("no progress");
        assert_eq!(e().to_string(), "timeout: no progress");
        assert_eq!(e().rank(2).to_string(), "timeout (rank 2): no progress");
        assert_eq!(e().peer(5).to_string(), "timeout (peer 5): no progress");
        let os = Error::io(ErrorKind::System, "poll", io::Error::other("boom"));
        assert_eq!(
            os.rank(0).peer(1).to_string(),
            "system error (rank 0, peer 1): poll: boom"
        );
        assert_eq!(format!("{:?}", e()), "Error(timeout: no progress)");
    }

    #[test]
    fn io_classification() {
        assert_eq!(
            classify_io(&io::Error::from(io::ErrorKind::ConnectionReset)),
            ErrorKind::Remote
        );
        assert_eq!(
            classify_io(&io::Error::from(io::ErrorKind::UnexpectedEof)),
            ErrorKind::Remote
        );
        assert_eq!(
            classify_io(&io::Error::from(io::ErrorKind::PermissionDenied)),
            ErrorKind::System
        );
    }
}
