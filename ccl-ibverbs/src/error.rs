//! One error variant per failing verb, each with the OS error the verb reported.
//!
//! [`VerbsError`] converts into [`ccl_core::Error`] (kind `System`), keeping the OS error as the
//! source, so callers see for instance
//! `system error (rank 0): ibv_reg_mr of 4194304 bytes failed (...raise the locked-memory limit...): Cannot allocate memory`.

use std::fmt;
use std::io;

use ccl_core::{Error, ErrorKind};

/// A failed verbs call.
#[derive(Debug)]
#[non_exhaustive]
pub enum VerbsError {
    /// `ibv_fork_init`.
    ForkInit(io::Error),
    /// `ibv_get_device_list`.
    GetDeviceList(io::Error),
    /// `ibv_open_device`.
    OpenDevice { device: String, source: io::Error },
    /// `ibv_query_port`.
    QueryPort {
        device: String,
        port: u8,
        source: io::Error,
    },
    /// `ibv_alloc_pd`.
    AllocPd { device: String, source: io::Error },
    /// `ibv_create_comp_channel`.
    CreateCompChannel { device: String, source: io::Error },
    /// `ibv_create_cq`.
    CreateCq { entries: u32, source: io::Error },
    /// `ibv_req_notify_cq`.
    ReqNotifyCq(io::Error),
    /// `ibv_get_cq_event`.
    GetCqEvent(io::Error),
    /// `ibv_poll_cq`.
    PollCq(io::Error),
    /// `ibv_create_qp`.
    CreateQp {
        send_wr: u32,
        recv_wr: u32,
        source: io::Error,
    },
    /// `ibv_modify_qp` to `state`.
    ModifyQp {
        state: &'static str,
        source: io::Error,
    },
    /// `ibv_reg_mr`.
    RegMr { len: usize, source: io::Error },
    /// `ibv_post_send`.
    PostSend(io::Error),
    /// `ibv_post_recv`.
    PostRecv(io::Error),
    /// Allocating the memory to register (`mmap`).
    Alloc { len: usize, source: io::Error },
}

impl VerbsError {
    /// The OS error behind the failure.
    pub fn os_error(&self) -> &io::Error {
        match self {
            VerbsError::ForkInit(e)
            | VerbsError::GetDeviceList(e)
            | VerbsError::ReqNotifyCq(e)
            | VerbsError::GetCqEvent(e)
            | VerbsError::PollCq(e)
            | VerbsError::PostSend(e)
            | VerbsError::PostRecv(e) => e,
            VerbsError::OpenDevice { source, .. }
            | VerbsError::QueryPort { source, .. }
            | VerbsError::AllocPd { source, .. }
            | VerbsError::CreateCompChannel { source, .. }
            | VerbsError::CreateCq { source, .. }
            | VerbsError::CreateQp { source, .. }
            | VerbsError::ModifyQp { source, .. }
            | VerbsError::RegMr { source, .. }
            | VerbsError::Alloc { source, .. } => source,
        }
    }
}

/// Whether a registration failure looks like the locked-memory limit (`ulimit -l`).
pub fn is_memlock_error(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOMEM) | Some(libc::EPERM))
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::ForkInit(_) => write!(
                f,
                "ibv_fork_init failed (set RDMAV_FORK_SAFE=1 in the environment instead?)"
            ),
            VerbsError::GetDeviceList(_) => write!(
                f,
                "ibv_get_device_list failed (is the ib_uverbs kernel module loaded?)"
            ),
            VerbsError::OpenDevice { device, .. } => {
                write!(
                    f,
                    "ibv_open_device({device}) failed (permissions on /dev/infiniband?)"
                )
            }
            VerbsError::QueryPort { device, port, .. } => {
                write!(f, "ibv_query_port({device}, port {port}) failed")
            }
            VerbsError::AllocPd { device, .. } => write!(f, "ibv_alloc_pd({device}) failed"),
            VerbsError::CreateCompChannel { device, .. } => {
                write!(f, "ibv_create_comp_channel({device}) failed")
            }
            VerbsError::CreateCq { entries, .. } => {
                write!(f, "ibv_create_cq with {entries} entries failed")
            }
            VerbsError::ReqNotifyCq(_) => write!(f, "ibv_req_notify_cq failed"),
            VerbsError::GetCqEvent(_) => write!(f, "ibv_get_cq_event failed"),
            VerbsError::PollCq(_) => write!(f, "ibv_poll_cq failed (the CQ is in error)"),
            VerbsError::CreateQp {
                send_wr, recv_wr, ..
            } => write!(
                f,
                "ibv_create_qp (RC, {send_wr} send / {recv_wr} receive WRs) failed"
            ),
            VerbsError::ModifyQp { state, .. } => write!(f, "ibv_modify_qp to {state} failed"),
            VerbsError::RegMr { len, source } => {
                write!(f, "ibv_reg_mr of {len} bytes failed")?;
                if is_memlock_error(source) {
                    write!(
                        f,
                        " (the locked-memory limit is probably too low: raise it with `ulimit -l unlimited`, \
                         LimitMEMLOCK=infinity for systemd, or --ulimit memlock=-1 for containers)"
                    )?;
                }
                Ok(())
            }
            VerbsError::PostSend(_) => write!(f, "ibv_post_send failed"),
            VerbsError::PostRecv(_) => write!(f, "ibv_post_recv failed"),
            VerbsError::Alloc { len, .. } => {
                write!(f, "allocating {len} bytes for registration failed")
            }
        }
    }
}

impl std::error::Error for VerbsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.os_error())
    }
}

impl From<VerbsError> for Error {
    fn from(e: VerbsError) -> Error {
        let msg = format!("verbs transport: {e}");
        let os = e.os_error();
        let src = match os.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(os.kind(), os.to_string()),
        };
        Error::io(ErrorKind::System, msg, src)
    }
}

/// `errno` as an `io::Error`; a verb that failed without setting it gets a generic error.
pub(crate) fn last_os_error() -> io::Error {
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(0) | None => io::Error::other("the verb failed without an errno"),
        _ => e,
    }
}

/// An `io::Error` from a verb's negative or positive errno return value.
pub(crate) fn errno_error(rc: i32) -> io::Error {
    if rc == 0 {
        return io::Error::other("the verb failed without an errno");
    }
    let code = rc.abs();
    if code == 1 && rc < 0 {
        // Some providers return -1 and set errno.
        return last_os_error();
    }
    io::Error::from_raw_os_error(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memlock_hint() {
        let e = VerbsError::RegMr {
            len: 4096,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let s = e.to_string();
        assert!(s.contains("ulimit -l"), "{s}");
        let c: Error = e.into();
        assert_eq!(c.kind(), ErrorKind::System);
        assert!(c.to_string().contains("ibv_reg_mr of 4096 bytes"), "{c}");
        assert!(c.to_string().contains("Cannot allocate memory"), "{c}");
        let e = VerbsError::RegMr {
            len: 1,
            source: io::Error::from_raw_os_error(libc::EINVAL),
        };
        assert!(!e.to_string().contains("ulimit"));
    }

    #[test]
    fn errno_values() {
        assert_eq!(errno_error(libc::EINVAL).raw_os_error(), Some(libc::EINVAL));
        assert_eq!(
            errno_error(-libc::EAGAIN).raw_os_error(),
            Some(libc::EAGAIN)
        );
        assert!(errno_error(0).raw_os_error().is_none());
    }
}
