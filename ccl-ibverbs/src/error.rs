//! One error variant per failing verb, each with the OS error the verb reported.
//!
//! [`VerbsError`] converts into [`ccl_core::Error`] (kind `System`), keeping the OS error as the
//! source, so callers see for instance
//! `system error (rank 0): ibv_reg_mr of 4194304 bytes failed (...raise the locked-memory limit...): Cannot allocate memory`.

use std::io;

use ccl_core::{Error, ErrorKind};

/// A failed verbs call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// Opening libibverbs (`dlopen`) or finding a verb in it.
    #[error("libibverbs could not be loaded")]
    Load(#[source] io::Error),
    /// `ibv_fork_init`.
    #[error("ibv_fork_init failed (set RDMAV_FORK_SAFE=1 in the environment instead?)")]
    ForkInit(#[source] io::Error),
    /// `ibv_get_device_list`.
    #[error("ibv_get_device_list failed (is the ib_uverbs kernel module loaded?)")]
    GetDeviceList(#[source] io::Error),
    /// `ibv_open_device`.
    #[error("ibv_open_device({device}) failed (permissions on /dev/infiniband?)")]
    OpenDevice { device: String, source: io::Error },
    /// `ibv_query_port`.
    #[error("ibv_query_port({device}, port {port}) failed")]
    QueryPort {
        device: String,
        port: u8,
        source: io::Error,
    },
    /// `ibv_alloc_pd`.
    #[error("ibv_alloc_pd({device}) failed")]
    AllocPd { device: String, source: io::Error },
    /// `ibv_create_comp_channel`.
    #[error("ibv_create_comp_channel({device}) failed")]
    CreateCompChannel { device: String, source: io::Error },
    /// `ibv_create_cq`.
    #[error("ibv_create_cq with {entries} entries failed")]
    CreateCq { entries: u32, source: io::Error },
    /// `ibv_req_notify_cq`.
    #[error("ibv_req_notify_cq failed")]
    ReqNotifyCq(#[source] io::Error),
    /// `ibv_get_cq_event`.
    #[error("ibv_get_cq_event failed")]
    GetCqEvent(#[source] io::Error),
    /// `ibv_poll_cq`.
    #[error("ibv_poll_cq failed (the CQ is in error)")]
    PollCq(#[source] io::Error),
    /// `ibv_create_qp`.
    #[error("ibv_create_qp (RC, {send_wr} send / {recv_wr} receive WRs) failed")]
    CreateQp {
        send_wr: u32,
        recv_wr: u32,
        source: io::Error,
    },
    /// `ibv_modify_qp` to `state`.
    #[error("ibv_modify_qp to {state} failed")]
    ModifyQp {
        state: &'static str,
        source: io::Error,
    },
    /// `ibv_reg_mr`.
    #[error("ibv_reg_mr of {len} bytes failed{}", memlock_hint(source))]
    RegMr { len: usize, source: io::Error },
    /// `ibv_post_send`.
    #[error("ibv_post_send failed")]
    PostSend(#[source] io::Error),
    /// `ibv_post_recv`.
    #[error("ibv_post_recv failed")]
    PostRecv(#[source] io::Error),
    /// Allocating the memory to register (`mmap`).
    #[error("allocating {len} bytes for registration failed")]
    Alloc { len: usize, source: io::Error },
}

impl VerbsError {
    /// The OS error behind the failure.
    pub fn os_error(&self) -> &io::Error {
        match self {
            VerbsError::Load(e)
            | VerbsError::ForkInit(e)
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

/// What to do about a failed registration, when the cause looks like `ulimit -l`.
fn memlock_hint(e: &io::Error) -> &'static str {
    if is_memlock_error(e) {
        " (the locked-memory limit is probably too low: raise it with `ulimit -l unlimited`, \
         LimitMEMLOCK=infinity for systemd, or --ulimit memlock=-1 for containers)"
    } else {
        ""
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
    fn every_message() {
        let os = || io::Error::from_raw_os_error(libc::EINVAL);
        let dev = || "rxe0".to_string();
        for (e, want) in [
            (
                VerbsError::ForkInit(os()),
                "ibv_fork_init failed (set RDMAV_FORK_SAFE=1 in the environment instead?)",
            ),
            (
                VerbsError::GetDeviceList(os()),
                "ibv_get_device_list failed (is the ib_uverbs kernel module loaded?)",
            ),
            (
                VerbsError::OpenDevice {
                    device: dev(),
                    source: os(),
                },
                "ibv_open_device(rxe0) failed (permissions on /dev/infiniband?)",
            ),
            (
                VerbsError::QueryPort {
                    device: dev(),
                    port: 1,
                    source: os(),
                },
                "ibv_query_port(rxe0, port 1) failed",
            ),
            (
                VerbsError::AllocPd {
                    device: dev(),
                    source: os(),
                },
                "ibv_alloc_pd(rxe0) failed",
            ),
            (
                VerbsError::CreateCompChannel {
                    device: dev(),
                    source: os(),
                },
                "ibv_create_comp_channel(rxe0) failed",
            ),
            (
                VerbsError::CreateCq {
                    entries: 70,
                    source: os(),
                },
                "ibv_create_cq with 70 entries failed",
            ),
            (VerbsError::ReqNotifyCq(os()), "ibv_req_notify_cq failed"),
            (VerbsError::GetCqEvent(os()), "ibv_get_cq_event failed"),
            (
                VerbsError::PollCq(os()),
                "ibv_poll_cq failed (the CQ is in error)",
            ),
            (
                VerbsError::CreateQp {
                    send_wr: 16,
                    recv_wr: 18,
                    source: os(),
                },
                "ibv_create_qp (RC, 16 send / 18 receive WRs) failed",
            ),
            (
                VerbsError::ModifyQp {
                    state: "RTR",
                    source: os(),
                },
                "ibv_modify_qp to RTR failed",
            ),
            (
                VerbsError::RegMr {
                    len: 4096,
                    source: os(),
                },
                "ibv_reg_mr of 4096 bytes failed",
            ),
            (VerbsError::PostSend(os()), "ibv_post_send failed"),
            (VerbsError::PostRecv(os()), "ibv_post_recv failed"),
            (
                VerbsError::Alloc {
                    len: 8192,
                    source: os(),
                },
                "allocating 8192 bytes for registration failed",
            ),
        ] {
            assert_eq!(e.to_string(), want);
            let src = std::error::Error::source(&e).expect("every variant has its OS error");
            assert_eq!(src.to_string(), os().to_string());
            assert_eq!(e.os_error().raw_os_error(), Some(libc::EINVAL));
        }
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
