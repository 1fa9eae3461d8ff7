//! The control plane's named deadlines in one place, with the orders between them that the
//! monitor relies on asserted in a test. Each is used where its comment says; the values are
//! the ones each had beside its use. (Waits derived from `CCL_TIMEOUT` are not here: they are
//! the user's setting.)

use std::time::Duration;

// The rendezvous.

/// How long a new connection may take to present its hello before the root drops it.
pub(crate) const HELLO_GRACE: Duration = Duration::from_secs(5);
/// How long a connection accepted by a rank's allgather server may take to say what it wants.
pub(crate) const ASK_GRACE: Duration = Duration::from_secs(5);

// The monitor, the root's side.

/// How long the root waits for every live rank to describe itself. A rank that has not
/// answered by then is stopped or its process hung: that is the verdict.
pub const GATHER: Duration = Duration::from_secs(1);
/// How much sooner than its own a hub's ranks must answer a digest query (their answers still
/// have to travel, and be merged, before the hub's budget ends).
pub(crate) const HOP: Duration = Duration::from_millis(100);
/// A verdict this fresh answers another rank's request (ranks stuck together ask within one
/// wake-up of each other); an older one may describe an operation that has since ended.
pub(crate) const REUSE: Duration = Duration::from_millis(250);
/// How long the ranks below a hub that died have to join the root themselves before the root
/// names them dead too. Only the naming waits: the hub's own death is passed on at once.
pub(crate) const ADOPT_GRACE: Duration = Duration::from_secs(10);
/// How long a live client may take to present its request.
pub(crate) const CLIENT_GRACE: Duration = Duration::from_secs(2);

// The monitor, each rank's side.

/// How long joining the root (or a hub) may take.
pub(crate) const CONNECT_GRACE: Duration = Duration::from_secs(5);
/// How long a new line to a hub may take to say which rank it is.
pub(crate) const JOIN_GRACE: Duration = Duration::from_secs(5);
/// How long a frame for a child that has not joined yet is kept (it joins, then the root
/// routes to it through this hub, so its line may still wait in this rank's accept queue).
pub(crate) const UNJOINED_GRACE: Duration = Duration::from_secs(5);
/// How long a hub whose communicator was dropped goes on passing frames for its ranks.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// How long a rank of the monitor's process waits, when it leaves, for the monitor to have told
/// the others so.
pub(crate) const BYE_HEARD: Duration = Duration::from_millis(500);

#[cfg(test)]
mod tests {
    use super::*;

    /// The orders the monitor's rules rest on.
    #[test]
    fn deadlines_keep_their_order() {
        // A rank below a dead hub joins the root within CONNECT_GRACE; the root must not name
        // it dead before that.
        assert!(ADOPT_GRACE > CONNECT_GRACE);
        // A hub's ranks answer within GATHER - HOP, and a hub's own merge needs HOP / 2 of it.
        assert!(HOP < GATHER);
    }
}
