//! What lets the tests of one process play a root that dies alone: a root "in another process"
//! and a root killed by its address.

use std::net::SocketAddr;
use std::sync::Mutex;

/// Roots that count as running in another process, with the ranks that count as running
/// in it.
static REMOTE: Mutex<Vec<(SocketAddr, Vec<usize>)>> = Mutex::new(Vec::new());
static KILLED: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// The root at `addr` counts as running in another process than its ranks, but `with_root`.
pub(crate) fn set_remote(addr: SocketAddr, with_root: Vec<usize>) {
    REMOTE.lock().unwrap().push((addr, with_root));
}

/// The ranks that count as running in the root's process, if it counts as remote.
pub(crate) fn remote(addr: SocketAddr) -> Option<Vec<usize>> {
    let all = REMOTE.lock().unwrap();
    all.iter().find(|(a, _)| *a == addr).map(|(_, w)| w.clone())
}

/// Ends the monitor at `addr` as its process's death would: its lines close.
pub(crate) fn kill(addr: SocketAddr) {
    KILLED.lock().unwrap().push(addr);
}

pub(crate) fn killed(addr: SocketAddr) -> bool {
    KILLED.lock().unwrap().contains(&addr)
}
