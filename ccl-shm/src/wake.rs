//! Eventfds that wake a sleeping side: the rings' and the host segment's.
//!
//! A side about to sleep says so in shared memory first, and the other side writes the eventfd
//! only then (see `ring` and `host` for the fences that keep a wake-up from being lost).

use std::os::fd::{AsRawFd, OwnedFd};

use ccl_core::{Error, ErrorKind, Result};
use nix::sys::eventfd::{EfdFlags, EventFd};

/// A non-blocking eventfd, closed on exec.
pub(crate) fn new_eventfd() -> Result<OwnedFd> {
    EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        .map(OwnedFd::from)
        .map_err(|e| Error::io(ErrorKind::System, "eventfd", e.into()))
}

/// Wakes whoever polls `fd`.
pub(crate) fn signal(fd: &OwnedFd) {
    // EAGAIN (a full counter) still leaves it readable.
    let _ = nix::unistd::write(fd, &1u64.to_ne_bytes());
}

/// Clears a pending wake-up.
pub(crate) fn drain(fd: &OwnedFd) {
    let mut b = [0u8; 8];
    let _ = nix::unistd::read(fd.as_raw_fd(), &mut b);
}
