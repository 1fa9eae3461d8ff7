//! What lets the tests of one process play a root that dies alone: a root "in another process"
//! and a root killed. Both are keyed by the job's secret (with the root's address for a kill):
//! ports are reused by later tests' roots, secrets are not.

use std::net::SocketAddr;
use std::sync::Mutex;

/// Jobs whose root counts as running in another process, with the ranks that count as running
/// in it.
static REMOTE: Mutex<Vec<([u8; 32], Vec<usize>)>> = Mutex::new(Vec::new());
static KILLED: Mutex<Vec<([u8; 32], SocketAddr)>> = Mutex::new(Vec::new());

/// The root of the job with `secret` counts as running in another process than its ranks, but
/// `with_root`.
pub(crate) fn set_remote(secret: [u8; 32], with_root: Vec<usize>) {
    REMOTE.lock().unwrap().push((secret, with_root));
}

/// The ranks that count as running in the root's process, if it counts as remote.
pub(crate) fn remote(secret: &[u8; 32]) -> Option<Vec<usize>> {
    let all = REMOTE.lock().unwrap();
    all.iter()
        .find(|(s, _)| s == secret)
        .map(|(_, w)| w.clone())
}

/// Ends the monitor of the job with `secret` at `addr` as its process's death would: its
/// lines close.
pub(crate) fn kill(secret: [u8; 32], addr: SocketAddr) {
    KILLED.lock().unwrap().push((secret, addr));
}

pub(crate) fn killed(secret: &[u8; 32], addr: SocketAddr) -> bool {
    KILLED
        .lock()
        .unwrap()
        .iter()
        .any(|(s, a)| s == secret && *a == addr)
}
