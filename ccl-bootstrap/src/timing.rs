//! Every fixed deadline of the control plane (the rendezvous, the job monitor, and what a rank
//! concludes from it) in one place, with the orders between them that the rules rely on
//! asserted in a test, and one scale factor: `CCL_CONTROL_SCALE` stretches them all alike (a
//! host so loaded that a 1 s gathering or a 500 ms write misses for no fault of the peer's can
//! set 2 or 4; orders between them hold at any scale). Waits derived from `CCL_TIMEOUT` are not
//! here: they are the user's setting.
//!
//! Read a deadline with [`Deadline::get`]. Polling intervals (how often a loop looks again) are
//! not deadlines and stay beside their loops.

use std::sync::OnceLock;
use std::time::Duration;

use crate::LOG_SUBSYS;

/// A deadline of the control plane: its value at scale 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Deadline(Duration);

impl Deadline {
    const fn millis(ms: u64) -> Deadline {
        Deadline(Duration::from_millis(ms))
    }

    const fn secs(s: u64) -> Deadline {
        Deadline(Duration::from_secs(s))
    }

    /// The deadline at the process's `CCL_CONTROL_SCALE`.
    pub fn get(self) -> Duration {
        self.0.mul_f64(scale())
    }

    /// The deadline at scale 1.
    pub const fn base(self) -> Duration {
        self.0
    }
}

/// `CCL_CONTROL_SCALE`, read once. A value `Config::from_env` would refuse (communicators
/// fail to start with it) is taken as 1 here, with a warning: the rendezvous may run before any
/// communicator reads its settings.
fn scale() -> f64 {
    static SCALE: OnceLock<f64> = OnceLock::new();
    *SCALE.get_or_init(|| {
        let v = std::env::var(SCALE_VAR).unwrap_or_default();
        if v.trim().is_empty() {
            return 1.0;
        }
        ccl_core::config::parse_scale(SCALE_VAR, &v).unwrap_or_else(|e| {
            ccl_core::ccl_warn!(None, "{e}; the control plane's deadlines stay at scale 1");
            1.0
        })
    })
}

const SCALE_VAR: &str = "CCL_CONTROL_SCALE";

// The rendezvous.

/// How long a new connection may take to present its hello before the root drops it.
pub(crate) const HELLO_GRACE: Deadline = Deadline::secs(5);
/// How long a connection accepted by a rank's allgather server may take to say what it wants.
pub(crate) const ASK_GRACE: Deadline = Deadline::secs(5);
/// How much longer than the user's timeout a rank waits in the rendezvous, so that the root's
/// own deadline (whose error names the missing ranks) fires first.
pub(crate) const ROOT_FIRST: Deadline = Deadline::secs(2);
/// How long a rank waits for the root's word (its error) when a rendezvous step failed, and
/// how long an error may take to reach a rank or client.
pub(crate) const ERROR_WORD: Deadline = Deadline::secs(2);
/// How long a rank whose rendezvous step failed waits for the root to start saying why (the
/// root's message names the cause; the rank's own error may only name a closed socket).
pub(crate) const ROOT_WORD: Deadline = Deadline::secs(1);
/// How long an error to a peer of the allgather may take to write (it is a courtesy: the
/// peer learns the same from the root).
pub(crate) const PEER_ERROR: Deadline = Deadline::millis(100);
/// How long a rank's hello to the monitor and its goodbye may take to write.
pub(crate) const FRAME_WRITE: Deadline = Deadline::secs(5);
/// The longest and shortest attempt at joining a rendezvous whose root may not be up yet
/// (launcher variables: the root may start after its ranks).
pub(crate) const JOIN_ATTEMPT_MAX: Deadline = Deadline::secs(3);
pub(crate) const JOIN_ATTEMPT_MIN: Deadline = Deadline::millis(100);

// The monitor, the root's side.

/// How long the root waits for every live rank to describe itself. A rank that has not
/// answered by then is stopped or its process hung: that is the verdict.
pub const GATHER: Deadline = Deadline::secs(1);
/// How much sooner than its own a hub's ranks must answer a digest query (their answers still
/// have to travel, and be merged, before the hub's budget ends).
pub(crate) const HOP: Deadline = Deadline::millis(100);
/// A verdict this fresh answers another rank's request (ranks stuck together ask within one
/// wake-up of each other); an older one may describe an operation that has since ended.
pub(crate) const REUSE: Deadline = Deadline::millis(250);
/// How long the ranks below a hub that died have to join the root themselves before the root
/// names them dead too. Only the naming waits: the hub's own death is passed on at once.
pub(crate) const ADOPT_GRACE: Deadline = Deadline::secs(10);
/// How long a live client may take to present its request.
pub(crate) const CLIENT_GRACE: Deadline = Deadline::secs(2);
/// How long one frame on a monitor line may take to write before the rest is dropped (a
/// monitor thread must not hang on one reader that does not read).
pub(crate) const LINE_WRITE: Deadline = Deadline::millis(500);

// The monitor, each rank's side.

/// How long joining the root (or a hub) may take.
pub(crate) const CONNECT_GRACE: Deadline = Deadline::secs(5);
/// How long a new line to a hub may take to say which rank it is.
pub(crate) const JOIN_GRACE: Deadline = Deadline::secs(5);
/// How long a frame for a child that has not joined yet is kept (it joins, then the root
/// routes to it through this hub, so its line may still wait in this rank's accept queue).
pub(crate) const UNJOINED_GRACE: Deadline = Deadline::secs(5);
/// How long a hub whose communicator was dropped goes on passing frames for its ranks.
pub(crate) const LINGER: Deadline = Deadline::secs(2);
/// How long a rank of the monitor's process waits, when it leaves, for the monitor to have told
/// the others so (and, after a failure, the failure's notices before that). The leaving rank
/// hears its own goodbye back within milliseconds on a quiet host; a loaded one, with the
/// monitor busy taking over or gathering a verdict, took longer than 500 ms.
pub(crate) const BYE_HEARD: Deadline = Deadline::secs(2);

// What a rank concludes (the communicator, when a peer's connection failed).

/// How long a rank whose peer failed waits for the root's notice before it counts the root
/// silent (the root passes on a death it saw within milliseconds).
pub const ROOT_SILENT: Deadline = Deadline::millis(1500);
/// What a rank allows beyond [`GATHER`] for a verdict it asked for to arrive.
pub const VERDICT_SLACK: Deadline = Deadline::millis(1500);
/// What a recovery allows beyond twice the user's timeout (every survivor's agreement, each
/// within the timeout, and the new communicator's set-up).
pub const RECOVERY_SLACK: Deadline = Deadline::secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    /// The orders the control plane's rules rest on (at scale 1; scaling keeps them).
    #[test]
    fn deadlines_keep_their_order() {
        // A rank below a dead hub joins the root within CONNECT_GRACE; the root must not name
        // it dead before that.
        assert!(ADOPT_GRACE > CONNECT_GRACE);
        // A hub's ranks answer within GATHER - HOP, and a hub's own merge needs HOP / 2 of it.
        assert!(HOP < GATHER);
        // A rank that asked for a verdict waits out the whole gathering, then some.
        assert!(VERDICT_SLACK.base() > Duration::ZERO);
        // A write of the monitor's may not outlast a gathering: a root stuck writing to one
        // rank would miss the others' answers.
        assert!(LINE_WRITE < GATHER);
        // The shortest join attempt is shorter than the longest.
        assert!(JOIN_ATTEMPT_MIN < JOIN_ATTEMPT_MAX);
    }

    #[test]
    fn scaling_multiplies() {
        let d = Deadline::millis(1500);
        assert_eq!(d.base(), Duration::from_millis(1500));
        // The test process has no CCL_CONTROL_SCALE unless the runner set one.
        let s = scale();
        assert_eq!(d.get(), Duration::from_millis(1500).mul_f64(s));
    }
}
