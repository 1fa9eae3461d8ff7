//! Work-completion statuses as typed errors naming the peer.

use ccl_core::{Error, ErrorKind};

/// `ibv_wc_status` values (the verbs ABI; stable since the first libibverbs).
pub mod status {
    pub const SUCCESS: u32 = 0;
    pub const LOC_LEN_ERR: u32 = 1;
    pub const LOC_QP_OP_ERR: u32 = 2;
    pub const LOC_EEC_OP_ERR: u32 = 3;
    pub const LOC_PROT_ERR: u32 = 4;
    pub const WR_FLUSH_ERR: u32 = 5;
    pub const MW_BIND_ERR: u32 = 6;
    pub const BAD_RESP_ERR: u32 = 7;
    pub const LOC_ACCESS_ERR: u32 = 8;
    pub const REM_INV_REQ_ERR: u32 = 9;
    pub const REM_ACCESS_ERR: u32 = 10;
    pub const REM_OP_ERR: u32 = 11;
    pub const RETRY_EXC_ERR: u32 = 12;
    pub const RNR_RETRY_EXC_ERR: u32 = 13;
    pub const LOC_RDD_VIOL_ERR: u32 = 14;
    pub const REM_INV_RD_REQ_ERR: u32 = 15;
    pub const REM_ABORT_ERR: u32 = 16;
    pub const INV_EECN_ERR: u32 = 17;
    pub const INV_EEC_STATE_ERR: u32 = 18;
    pub const FATAL_ERR: u32 = 19;
    pub const RESP_TIMEOUT_ERR: u32 = 20;
    pub const GENERAL_ERR: u32 = 21;
}

/// The verbs name of a status (`ibv_wc_status_str` without a library call).
pub fn status_name(s: u32) -> &'static str {
    use status::*;
    match s {
        SUCCESS => "success",
        LOC_LEN_ERR => "local length error",
        LOC_QP_OP_ERR => "local QP operation error",
        LOC_EEC_OP_ERR => "local EE context operation error",
        LOC_PROT_ERR => "local protection error",
        WR_FLUSH_ERR => "work request flushed error",
        MW_BIND_ERR => "memory window bind error",
        BAD_RESP_ERR => "bad response error",
        LOC_ACCESS_ERR => "local access error",
        REM_INV_REQ_ERR => "remote invalid request error",
        REM_ACCESS_ERR => "remote access error",
        REM_OP_ERR => "remote operation error",
        RETRY_EXC_ERR => "transport retry counter exceeded",
        RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
        LOC_RDD_VIOL_ERR => "local RDD violation error",
        REM_INV_RD_REQ_ERR => "remote invalid RD request",
        REM_ABORT_ERR => "operation aborted",
        INV_EECN_ERR => "invalid EE context number",
        INV_EEC_STATE_ERR => "invalid EE context state",
        FATAL_ERR => "fatal error",
        RESP_TIMEOUT_ERR => "response timeout error",
        GENERAL_ERR => "general error",
        _ => "unknown status",
    }
}

/// Turns a failed work completion into an error naming `peer`; `what` is the operation
/// (`"RDMA write of 4096 bytes"`). Statuses that mean the peer or the path is gone are
/// [`ErrorKind::Remote`]; local protection and length errors are bugs ([`ErrorKind::Internal`]).
pub fn wc_error(status: u32, vendor_err: u32, peer: usize, what: &str) -> Error {
    use status::*;
    let name = status_name(status);
    let (kind, why) = match status {
        RETRY_EXC_ERR => (
            ErrorKind::Remote,
            format!(
                "peer {peer} unreachable or dead: no acknowledgement after all retries \
                 (CCL_IB_TIMEOUT, CCL_IB_RETRY_CNT); check that the peer is alive, the GIDs \
                 (CCL_IB_GID_INDEX) and the network path"
            ),
        ),
        RNR_RETRY_EXC_ERR => (
            ErrorKind::Remote,
            format!("peer {peer} had no receive posted for too long (receiver not ready)"),
        ),
        REM_ACCESS_ERR | REM_INV_REQ_ERR | REM_OP_ERR | REM_INV_RD_REQ_ERR => (
            ErrorKind::Remote,
            format!(
                "peer {peer} refused the operation (its buffer or QP is gone: did it fail or exit?)"
            ),
        ),
        REM_ABORT_ERR | RESP_TIMEOUT_ERR | BAD_RESP_ERR => (
            ErrorKind::Remote,
            format!("the connection to peer {peer} broke"),
        ),
        WR_FLUSH_ERR => (
            ErrorKind::Remote,
            format!(
                "the connection to peer {peer} is in error (an earlier operation failed or it was closed)"
            ),
        ),
        // rxe reports this when it cannot send at all: seen with the network device set down.
        LOC_QP_OP_ERR => (
            ErrorKind::System,
            format!(
                "local QP operation error on the connection to peer {peer}: the local port or \
                 its network device failed (is the link down?)"
            ),
        ),
        LOC_LEN_ERR | LOC_PROT_ERR | LOC_ACCESS_ERR | MW_BIND_ERR => (
            ErrorKind::Internal,
            format!("local error on the connection to peer {peer} (a bug in ccl)"),
        ),
        FATAL_ERR | GENERAL_ERR => (
            ErrorKind::System,
            format!("device error on the connection to peer {peer}"),
        ),
        _ => (
            ErrorKind::System,
            format!("failure on the connection to peer {peer}"),
        ),
    };
    Error::new(
        kind,
        format!("verbs transport: {what} failed with status {status} ({name}, vendor error {vendor_err:#x}): {why}"),
    )
    .peer(peer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_exceeded_names_the_peer() {
        let e = wc_error(12, 0x81, 5, "RDMA write of 4096 bytes");
        assert_eq!(e.kind(), ErrorKind::Remote);
        assert_eq!(e.peer_id(), Some(5));
        let s = e.to_string();
        assert!(s.contains("peer 5 unreachable or dead"), "{s}");
        assert!(s.contains("status 12"), "{s}");
        assert!(s.contains("transport retry counter exceeded"), "{s}");
        assert!(s.contains("RDMA write of 4096 bytes"), "{s}");
    }

    #[test]
    fn every_status_maps() {
        for st in 1..=25 {
            let e = wc_error(st, 0, 1, "x");
            assert_eq!(e.peer_id(), Some(1));
            assert!(e.to_string().contains(&format!("status {st}")));
            assert!(e.to_string().contains("peer 1"));
        }
        assert_eq!(wc_error(13, 0, 0, "x").kind(), ErrorKind::Remote);
        assert_eq!(wc_error(10, 0, 0, "x").kind(), ErrorKind::Remote);
        assert_eq!(wc_error(5, 0, 0, "x").kind(), ErrorKind::Remote);
        assert_eq!(wc_error(4, 0, 0, "x").kind(), ErrorKind::Internal);
        let down = wc_error(2, 0, 3, "x");
        assert_eq!(down.kind(), ErrorKind::System);
        assert!(down.to_string().contains("link down"), "{down}");
        assert_eq!(wc_error(1, 0, 0, "x").kind(), ErrorKind::Internal);
        assert_eq!(wc_error(19, 0, 0, "x").kind(), ErrorKind::System);
        assert_eq!(wc_error(99, 0, 0, "x").kind(), ErrorKind::System);
        assert_eq!(status_name(99), "unknown status");
    }

    /// `ffi`'s values are the headers' (its layout check compares them).
    #[test]
    fn status_numbers_match_the_verbs_abi() {
        use crate::ffi::*;
        assert_eq!(IBV_WC_SUCCESS, status::SUCCESS);
        assert_eq!(IBV_WC_WR_FLUSH_ERR, status::WR_FLUSH_ERR);
        assert_eq!(IBV_WC_RETRY_EXC_ERR, status::RETRY_EXC_ERR);
        assert_eq!(IBV_WC_RNR_RETRY_EXC_ERR, status::RNR_RETRY_EXC_ERR);
        assert_eq!(IBV_WC_GENERAL_ERR, status::GENERAL_ERR);
    }
}
