//! Reliable-connected queue pairs: creation, the INIT -> RTR -> RTS transitions (as a pure,
//! tested function of the connection parameters), posting work requests.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::ffi::{
    IBV_QPS_ERR, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPT_RC, IBV_SEND_INLINE,
    IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, ibv_mtu,
    ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_qp_state, ibv_recv_wr,
    ibv_send_wr, ibv_send_wr_rdma, ibv_sge,
};
use crate::sys::{ibv_create_qp, ibv_destroy_qp, ibv_modify_qp};

use crate::LOG_SUBSYS;
use crate::cq::Cq;
use crate::error::{VerbsError, errno_error, last_os_error};
use crate::pd::Pd;

/// `ibv_qp_attr_mask` bits (verbs ABI values; a test checks them against `ffi`'s).
pub mod mask {
    pub const STATE: u32 = 1 << 0;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const DEST_QPN: u32 = 1 << 20;
}

/// QP states we move through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    Init,
    Rtr,
    Rts,
    Err,
}

impl QpState {
    pub fn name(self) -> &'static str {
        match self {
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Err => "ERR",
        }
    }

    fn verbs(self) -> ibv_qp_state {
        match self {
            QpState::Init => IBV_QPS_INIT,
            QpState::Rtr => IBV_QPS_RTR,
            QpState::Rts => IBV_QPS_RTS,
            QpState::Err => IBV_QPS_ERR,
        }
    }
}

/// Everything the transitions of one QP depend on: the local port, the remote QP, and the
/// `CCL_IB_*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnParams {
    pub port: u8,
    /// Path MTU as an `ibv_mtu` code: the smaller of both ports' active MTUs.
    pub path_mtu: u8,
    pub remote_qpn: u32,
    pub remote_psn: u32,
    pub local_psn: u32,
    pub remote_gid: [u8; 16],
    pub remote_lid: u16,
    pub sgid_index: u8,
    pub traffic_class: u8,
    /// GRH flow label (20 bits; 0 lets the device choose): devices derive the RoCE v2 UDP source
    /// port from it, see [`ccl_core::entropy`].
    pub flow_label: u32,
    pub service_level: u8,
    /// `CCL_IB_TIMEOUT`: 4.096 us x 2^timeout.
    pub timeout: u8,
    /// `CCL_IB_RETRY_CNT`.
    pub retry_cnt: u8,
    /// `CCL_IB_RNR_RETRY`.
    pub rnr_retry: u8,
}

/// The attributes of one `ibv_modify_qp` call, as plain values: `mask` says which are set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Transition {
    pub mask: u32,
    pub access: u32,
    pub pkey_index: u16,
    pub port: u8,
    pub path_mtu: u8,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub max_dest_rd_atomic: u8,
    pub max_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    /// Address vector: with a GRH (RoCE always routes by GID).
    pub is_global: bool,
    pub dgid: [u8; 16],
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub dlid: u16,
    pub sl: u8,
}

/// Access a QP grants peers: RDMA writes into registered receive memory, plus local writes.
pub const QP_ACCESS: u32 = 1 /* LOCAL_WRITE */ | 2 /* REMOTE_WRITE */;
/// Receiver-not-ready NAK timer code 12 = 0.64 ms (NCCL's value).
pub const MIN_RNR_TIMER: u8 = 12;

/// The attributes to move a reset QP to `to` (INIT, RTR, RTS in order; ERR from any state).
pub fn transition(to: QpState, p: &ConnParams) -> Transition {
    let state = mask::STATE;
    match to {
        QpState::Init => Transition {
            mask: state | mask::PKEY_INDEX | mask::PORT | mask::ACCESS_FLAGS,
            access: QP_ACCESS,
            pkey_index: 0,
            port: p.port,
            ..Default::default()
        },
        QpState::Rtr => Transition {
            mask: state
                | mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER,
            path_mtu: p.path_mtu,
            dest_qpn: p.remote_qpn,
            rq_psn: p.remote_psn,
            // No RDMA reads or atomics are used; 1 is the smallest value every device accepts.
            max_dest_rd_atomic: 1,
            min_rnr_timer: MIN_RNR_TIMER,
            is_global: true,
            dgid: p.remote_gid,
            sgid_index: p.sgid_index,
            hop_limit: 255,
            traffic_class: p.traffic_class,
            flow_label: p.flow_label,
            dlid: p.remote_lid,
            sl: p.service_level,
            port: p.port,
            ..Default::default()
        },
        QpState::Rts => Transition {
            mask: state
                | mask::TIMEOUT
                | mask::RETRY_CNT
                | mask::RNR_RETRY
                | mask::SQ_PSN
                | mask::MAX_QP_RD_ATOMIC,
            sq_psn: p.local_psn,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            max_rd_atomic: 1,
            ..Default::default()
        },
        QpState::Err => Transition {
            mask: state,
            ..Default::default()
        },
    }
}

fn to_attr(to: QpState, t: &Transition) -> ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is a plain C struct of integers and unions of integers; all-zero is
    // a valid value (and what C callers start from with memset).
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = to.verbs();
    a.qp_access_flags = t.access;
    a.pkey_index = t.pkey_index;
    a.port_num = t.port;
    a.path_mtu = t.path_mtu as ibv_mtu;
    a.dest_qp_num = t.dest_qpn;
    a.rq_psn = t.rq_psn;
    a.sq_psn = t.sq_psn;
    a.max_dest_rd_atomic = t.max_dest_rd_atomic;
    a.max_rd_atomic = t.max_rd_atomic;
    a.min_rnr_timer = t.min_rnr_timer;
    a.timeout = t.timeout;
    a.retry_cnt = t.retry_cnt;
    a.rnr_retry = t.rnr_retry;
    a.ah_attr.is_global = t.is_global as u8;
    a.ah_attr.grh.dgid.raw = t.dgid;
    a.ah_attr.grh.sgid_index = t.sgid_index;
    a.ah_attr.grh.hop_limit = t.hop_limit;
    a.ah_attr.grh.traffic_class = t.traffic_class;
    a.ah_attr.grh.flow_label = t.flow_label;
    a.ah_attr.dlid = t.dlid;
    a.ah_attr.sl = t.sl;
    a.ah_attr.port_num = t.port;
    a
}

/// Work requests chained into one post at most.
pub const POST_BATCH: usize = 16;

/// One RDMA WRITE_WITH_IMM request (see [`Qp::post_writes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteImm {
    pub wr_id: u64,
    /// Local source: address, length, and the lkey of its registration.
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
    /// Remote target and its rkey.
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate value, host order.
    pub imm: u32,
}

/// An RC queue pair. Owns its protection domain and completion queue.
#[derive(Debug)]
pub struct Qp {
    qp: NonNull<ibv_qp>,
    qpn: u32,
    _cq: Arc<Cq>,
    _pd: Arc<Pd>,
}

// SAFETY: posting to and modifying a QP is thread-safe in libibverbs; freed only in Drop.
unsafe impl Send for Qp {}

impl Qp {
    /// An RC QP reporting both queues to `cq`, with room for `send_wr`/`recv_wr` outstanding
    /// work requests of one scatter/gather element each, and sends of up to `inline` bytes
    /// copied into the work request. Completions are requested per work request (not for every
    /// send).
    pub fn new(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        send_wr: u32,
        recv_wr: u32,
        inline: u32,
    ) -> Result<Qp, VerbsError> {
        // SAFETY: all-zero is a valid `ibv_qp_init_attr` (pointers null, integers zero).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.qp_type = IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = send_wr;
        init.cap.max_recv_wr = recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = inline;
        // SAFETY:
        // - `pd` and `cq` are live and outlive the QP (Arcs stored below).
        // - `init` is fully initialized.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::CreateQp {
            send_wr,
            recv_wr,
            source: last_os_error(),
        })?;
        // SAFETY: a live QP; `qp_num` is a plain field set at creation.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Qp {
            qp,
            qpn,
            _cq: cq.clone(),
            _pd: pd.clone(),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Moves the QP to `to` with the attributes of [`transition`].
    pub fn modify(&self, to: QpState, p: &ConnParams) -> Result<(), VerbsError> {
        let t = transition(to, p);
        let mut a = to_attr(to, &t);
        // SAFETY:
        // - `self.qp` is live.
        // - `a` is fully initialized and `t.mask` names only fields set from `t`.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut a, t.mask as i32) };
        if rc != 0 {
            return Err(VerbsError::ModifyQp {
                state: to.name(),
                source: errno_error(rc),
            });
        }
        Ok(())
    }

    /// Moves the QP to ERR: outstanding work requests complete with a flush status.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        // SAFETY: all-zero is a valid `ibv_qp_attr`; only the state is set and masked.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = IBV_QPS_ERR;
        // SAFETY: live QP; the mask names only `qp_state`.
        let rc = unsafe { ibv_modify_qp(self.qp.as_ptr(), &mut a, mask::STATE as i32) };
        if rc != 0 {
            return Err(VerbsError::ModifyQp {
                state: "ERR",
                source: errno_error(rc),
            });
        }
        Ok(())
    }

    /// Posts RDMA WRITE_WITH_IMM requests, signaled, chained so each group of up to
    /// [`POST_BATCH`] costs one call into the provider (one doorbell).
    ///
    /// # Safety
    /// For every request: `addr..addr+len` must lie in a live registration with `lkey` and must
    /// not be written by anyone until the request's completion is polled (or the QP is
    /// destroyed); `remote_addr..+len` must be memory the peer granted for this write.
    pub unsafe fn post_writes(&self, reqs: &[WriteImm]) -> Result<(), VerbsError> {
        for group in reqs.chunks(POST_BATCH) {
            // SAFETY: all-zero is a valid `ibv_sge` and `ibv_send_wr` (null pointers, zero
            // integers and unions).
            let mut sges: [ibv_sge; POST_BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: as above.
            let mut wrs: [ibv_send_wr; POST_BATCH] = unsafe { std::mem::zeroed() };
            let n = group.len();
            for (i, r) in group.iter().enumerate() {
                sges[i] = ibv_sge {
                    addr: r.addr,
                    length: r.len,
                    lkey: r.lkey,
                };
            }
            for (i, r) in group.iter().enumerate() {
                let wr = &mut wrs[i];
                wr.wr_id = r.wr_id;
                wr.sg_list = &mut sges[i];
                wr.num_sge = 1;
                wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.send_flags = IBV_SEND_SIGNALED;
                wr.imm.imm_data = r.imm.to_be();
                wr.wr.rdma = ibv_send_wr_rdma {
                    remote_addr: r.remote_addr,
                    rkey: r.rkey,
                };
            }
            for i in 0..n - 1 {
                let next: *mut ibv_send_wr = &mut wrs[i + 1];
                wrs[i].next = next;
            }
            // SAFETY: the chain is `wrs[..n]`, linked in order and null-terminated (the last
            // `next` stays null); each points at its own element of `sges`, all alive for the
            // call. The memory they reference is valid by this function's contract.
            unsafe { self.post_send(&mut wrs[0]) }?;
        }
        Ok(())
    }

    /// Posts a zero-length SEND_WITH_IMM carrying `imm` (host order), signaled.
    pub fn post_send_imm(&self, wr_id: u64, imm: u32) -> Result<(), VerbsError> {
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.num_sge = 0;
        wr.opcode = IBV_WR_SEND_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm.imm_data = imm.to_be();
        // SAFETY: no memory is referenced (zero scatter/gather elements).
        unsafe { self.post_send(&mut wr) }
    }

    /// # Safety
    /// Memory the work requests reference must stay valid as `post_writes` says.
    unsafe fn post_send(&self, wr: &mut ibv_send_wr) -> Result<(), VerbsError> {
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY:
        // - `self.qp` is live; `wr` starts a null-terminated chain of fully initialized work
        //   requests whose scatter/gather lists live on the caller's stack for the duration of
        //   the call (the library copies them into the send queue).
        // - The caller guarantees the referenced memory (function contract).
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::PostSend(errno_error(rc)));
        }
        Ok(())
    }

    /// Posts a receive with no buffer: it takes the immediate value of a WRITE_WITH_IMM or a
    /// zero-length SEND_WITH_IMM.
    /// A SEND of `data` (at most the `inline` bytes the QP was made for), copied into the work
    /// request at posting, so `data` needs no registration and may change right after.
    pub fn post_send_inline(&self, wr_id: u64, data: &[u8]) -> Result<(), VerbsError> {
        let mut sge = ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        };
        // SAFETY: all-zero is a valid `ibv_send_wr`.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        // SAFETY: with IBV_SEND_INLINE the provider copies `data` (alive for the call) into the
        // work queue while posting and never reads it afterwards; no lkey is used.
        unsafe { self.post_send(&mut wr) }
    }

    /// A receive whose incoming SEND payload lands in `len` bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must lie in memory registered with `lkey` for local write that stays
    /// allocated, and that nothing else reads or writes, until the receive's completion is polled
    /// (or the QP is destroyed).
    pub unsafe fn post_recv_buf(
        &self,
        wr_id: u64,
        addr: u64,
        len: u32,
        lkey: u32,
    ) -> Result<(), VerbsError> {
        let sge = ibv_sge {
            addr,
            length: len,
            lkey,
        };
        // SAFETY: the memory is the caller's to vouch for (this function's contract).
        unsafe { self.post_recv_sge(wr_id, Some(sge)) }
    }

    /// A receive that takes no payload (RDMA writes with immediate values, credits).
    pub fn post_recv(&self, wr_id: u64) -> Result<(), VerbsError> {
        // SAFETY: a receive with no scatter/gather element references no memory.
        unsafe { self.post_recv_sge(wr_id, None) }
    }

    /// # Safety
    /// As [`post_recv_buf`](Qp::post_recv_buf) for the memory `sge` names.
    unsafe fn post_recv_sge(&self, wr_id: u64, sge: Option<ibv_sge>) -> Result<(), VerbsError> {
        let mut sge = sge;
        let (sg_list, num_sge) = match sge.as_mut() {
            Some(s) => (s as *mut ibv_sge, 1),
            None => (std::ptr::null_mut(), 0),
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list,
            num_sge,
        };
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; one fully initialized work request whose memory, if any, the caller
        // vouches for (this function's contract); `sge` outlives the call, which copies it.
        let rc = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::PostRecv(errno_error(rc)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once. The endpoint moves QPs to ERR
        // and drains their completions before dropping them, so no completion refers to a
        // destroyed QP's memory.
        let rc = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_destroy_qp({}) failed: {rc}", self.qpn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ConnParams {
        ConnParams {
            port: 1,
            path_mtu: 5,
            remote_qpn: 0x123,
            remote_psn: 0x456,
            local_psn: 0x789,
            remote_gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 2],
            remote_lid: 0,
            sgid_index: 1,
            traffic_class: 106,
            flow_label: 0x1234,
            service_level: 0,
            timeout: 20,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }

    #[test]
    fn init() {
        let t = transition(QpState::Init, &params());
        assert_eq!(t.mask, 1 | 8 | 16 | 32);
        assert_eq!(t.port, 1);
        assert_eq!(t.access, 3);
        assert_eq!(t.pkey_index, 0);
    }

    #[test]
    fn rtr_carries_the_path() {
        let p = params();
        let t = transition(QpState::Rtr, &p);
        assert_eq!(
            t.mask,
            mask::STATE
                | mask::AV
                | mask::PATH_MTU
                | mask::DEST_QPN
                | mask::RQ_PSN
                | mask::MAX_DEST_RD_ATOMIC
                | mask::MIN_RNR_TIMER
        );
        assert_eq!(
            t.mask,
            1 | 128 | 256 | (1 << 20) | 4096 | (1 << 17) | (1 << 15)
        );
        assert_eq!((t.dest_qpn, t.rq_psn, t.path_mtu), (0x123, 0x456, 5));
        assert!(t.is_global);
        assert_eq!(t.dgid, p.remote_gid);
        assert_eq!((t.sgid_index, t.traffic_class, t.hop_limit), (1, 106, 255));
        assert_eq!(t.flow_label, 0x1234);
        assert_eq!(to_attr(QpState::Rtr, &t).ah_attr.grh.flow_label, 0x1234);
        assert_eq!(t.port, 1);
        assert_eq!(t.min_rnr_timer, 12);
        // No send-side fields.
        assert_eq!((t.sq_psn, t.timeout, t.retry_cnt), (0, 0, 0));
    }

    #[test]
    fn rts_carries_timeouts() {
        let t = transition(QpState::Rts, &params());
        assert_eq!(t.mask, 1 | 512 | 1024 | 2048 | 65536 | 8192);
        assert_eq!(
            (t.sq_psn, t.timeout, t.retry_cnt, t.rnr_retry),
            (0x789, 20, 7, 7)
        );
        assert_eq!(t.max_rd_atomic, 1);
        // No path fields.
        assert!(!t.is_global);
        assert_eq!(t.flow_label, 0);
        assert_eq!(t.dest_qpn, 0);
    }

    #[test]
    fn err_sets_only_the_state() {
        assert_eq!(transition(QpState::Err, &params()).mask, 1);
    }

    #[test]
    fn settings_flow_through() {
        let mut p = params();
        p.timeout = 14;
        p.retry_cnt = 3;
        p.traffic_class = 224;
        assert_eq!(transition(QpState::Rts, &p).timeout, 14);
        assert_eq!(transition(QpState::Rts, &p).retry_cnt, 3);
        assert_eq!(transition(QpState::Rtr, &p).traffic_class, 224);
    }

    /// `ffi`'s values are the headers' (its layout check compares them).
    #[test]
    fn mask_bits_match_the_headers() {
        use crate::ffi::*;
        assert_eq!(IBV_QP_STATE, mask::STATE);
        assert_eq!(IBV_QP_ACCESS_FLAGS, mask::ACCESS_FLAGS);
        assert_eq!(IBV_QP_PKEY_INDEX, mask::PKEY_INDEX);
        assert_eq!(IBV_QP_PORT, mask::PORT);
        assert_eq!(IBV_QP_AV, mask::AV);
        assert_eq!(IBV_QP_PATH_MTU, mask::PATH_MTU);
        assert_eq!(IBV_QP_TIMEOUT, mask::TIMEOUT);
        assert_eq!(IBV_QP_RETRY_CNT, mask::RETRY_CNT);
        assert_eq!(IBV_QP_RNR_RETRY, mask::RNR_RETRY);
        assert_eq!(IBV_QP_RQ_PSN, mask::RQ_PSN);
        assert_eq!(IBV_QP_MAX_QP_RD_ATOMIC, mask::MAX_QP_RD_ATOMIC);
        assert_eq!(IBV_QP_MIN_RNR_TIMER, mask::MIN_RNR_TIMER);
        assert_eq!(IBV_QP_SQ_PSN, mask::SQ_PSN);
        assert_eq!(IBV_QP_MAX_DEST_RD_ATOMIC, mask::MAX_DEST_RD_ATOMIC);
        assert_eq!(IBV_QP_DEST_QPN, mask::DEST_QPN);
        assert_eq!(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, QP_ACCESS);
    }
}
