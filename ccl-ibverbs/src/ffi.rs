//! The part of libibverbs' C interface this crate uses: types, constants and the inline verbs of
//! `<infiniband/verbs.h>`, written out by hand for rdma-core's ABI 1 (`libibverbs.so.1`) on
//! 64-bit Linux (x86_64, aarch64).
//!
//! Written here rather than generated from the C headers so that building the crate (and its
//! documentation) needs no headers and no libclang: the library itself is only opened at run
//! time (see [`crate::sys`]). rdma-core keeps this ABI stable (a program built against an older
//! header runs with any newer library), so definitions fixed here stay valid.
//!
//! Structs the crate allocates, fills or reads have their full C layout; structs it only
//! points to are opaque. The lock members come from `libc`, whose definitions follow each
//! architecture (`pthread_mutex_t` is 40 bytes on x86_64 and 48 on aarch64, which moves the
//! fields after it). Pointers to objects this crate never touches (SRQs, address handles,
//! memory windows...) are `*mut c_void`; entries of function tables it never calls are
//! [`UnusedFn`]: both have the size and place of the C member.
//!
//! With the `layout-check` feature, a test compares every size, alignment, field offset and
//! constant here with the bindings generated from the installed headers (the `rdma-sys`
//! crate).

// The C names, so that code reads like the header and the documentation of the verbs.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_uint, c_void};
use std::fmt;
use std::marker::{PhantomData, PhantomPinned};

#[cfg(all(test, feature = "layout-check"))]
mod layout_check;

/// A big-endian (network order) 32-bit value.
pub type __be32 = u32;
/// A big-endian (network order) 64-bit value.
pub type __be64 = u64;

/// An entry of a C function table that this crate never calls: only its size and place matter.
pub type UnusedFn = Option<unsafe extern "C" fn()>;

/// Marks a type that is only ever handled through pointers made by the library (not `Send`,
/// `Sync` or `Unpin`, as the nomicon recommends for opaque foreign types).
type Opaque = PhantomData<(*mut u8, PhantomPinned)>;

// ---- Enumerations: C enums of non-negative values, whose type is `unsigned int`.

/// `enum ibv_mtu`.
pub type ibv_mtu = c_uint;
pub const IBV_MTU_256: ibv_mtu = 1;
pub const IBV_MTU_512: ibv_mtu = 2;
pub const IBV_MTU_1024: ibv_mtu = 3;
pub const IBV_MTU_2048: ibv_mtu = 4;
pub const IBV_MTU_4096: ibv_mtu = 5;

/// `enum ibv_port_state`.
pub type ibv_port_state = c_uint;
pub const IBV_PORT_ACTIVE: ibv_port_state = 4;

/// `enum ibv_qp_state`.
pub type ibv_qp_state = c_uint;
pub const IBV_QPS_INIT: ibv_qp_state = 1;
pub const IBV_QPS_RTR: ibv_qp_state = 2;
pub const IBV_QPS_RTS: ibv_qp_state = 3;
pub const IBV_QPS_ERR: ibv_qp_state = 6;

/// `enum ibv_qp_type`.
pub type ibv_qp_type = c_uint;
pub const IBV_QPT_RC: ibv_qp_type = 2;

/// `enum ibv_mig_state` (a member of `ibv_qp_attr`; never set here).
pub type ibv_mig_state = c_uint;

/// `enum ibv_qp_attr_mask`: which members of an `ibv_qp_attr` an `ibv_modify_qp` applies.
pub type ibv_qp_attr_mask = c_uint;
pub const IBV_QP_STATE: ibv_qp_attr_mask = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: ibv_qp_attr_mask = 1 << 3;
pub const IBV_QP_PKEY_INDEX: ibv_qp_attr_mask = 1 << 4;
pub const IBV_QP_PORT: ibv_qp_attr_mask = 1 << 5;
pub const IBV_QP_AV: ibv_qp_attr_mask = 1 << 7;
pub const IBV_QP_PATH_MTU: ibv_qp_attr_mask = 1 << 8;
pub const IBV_QP_TIMEOUT: ibv_qp_attr_mask = 1 << 9;
pub const IBV_QP_RETRY_CNT: ibv_qp_attr_mask = 1 << 10;
pub const IBV_QP_RNR_RETRY: ibv_qp_attr_mask = 1 << 11;
pub const IBV_QP_RQ_PSN: ibv_qp_attr_mask = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: ibv_qp_attr_mask = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: ibv_qp_attr_mask = 1 << 15;
pub const IBV_QP_SQ_PSN: ibv_qp_attr_mask = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: ibv_qp_attr_mask = 1 << 17;
pub const IBV_QP_DEST_QPN: ibv_qp_attr_mask = 1 << 20;

/// `enum ibv_access_flags`.
pub type ibv_access_flags = c_uint;
pub const IBV_ACCESS_LOCAL_WRITE: ibv_access_flags = 1;
pub const IBV_ACCESS_REMOTE_WRITE: ibv_access_flags = 1 << 1;

/// `enum ibv_wr_opcode`.
pub type ibv_wr_opcode = c_uint;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: ibv_wr_opcode = 1;
pub const IBV_WR_SEND: ibv_wr_opcode = 2;
pub const IBV_WR_SEND_WITH_IMM: ibv_wr_opcode = 3;

/// `enum ibv_send_flags`.
pub type ibv_send_flags = c_uint;
pub const IBV_SEND_SIGNALED: ibv_send_flags = 1 << 1;
pub const IBV_SEND_INLINE: ibv_send_flags = 1 << 3;

/// `enum ibv_wc_status`.
pub type ibv_wc_status = c_uint;
pub const IBV_WC_SUCCESS: ibv_wc_status = 0;
pub const IBV_WC_WR_FLUSH_ERR: ibv_wc_status = 5;
pub const IBV_WC_RETRY_EXC_ERR: ibv_wc_status = 12;
pub const IBV_WC_RNR_RETRY_EXC_ERR: ibv_wc_status = 13;
pub const IBV_WC_GENERAL_ERR: ibv_wc_status = 21;

/// `enum ibv_wc_opcode` (a member of `ibv_wc`; read as a number).
pub type ibv_wc_opcode = c_uint;

/// `enum ibv_wc_flags`.
pub type ibv_wc_flags = c_uint;
pub const IBV_WC_WITH_IMM: ibv_wc_flags = 1 << 1;

/// The header's `__VERBS_ABI_IS_EXTENDED`, `(void *)UINTPTR_MAX`: the `abi_compat` of a context
/// that is the `context` member of a [`verbs_context`] (every context rdma-core opens).
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

// ---- Opaque objects: only pointers to them are handled.

/// `struct ibv_device`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_device {
    _data: [u8; 0],
    _marker: Opaque,
}

/// `struct ibv_pd`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_pd {
    _data: [u8; 0],
    _marker: Opaque,
}

/// `struct _compat_ibv_port_attr`, the older prefix of [`ibv_port_attr`] that the library's
/// `ibv_query_port` entry point fills (the header leaves it incomplete too).
#[repr(C)]
#[derive(Debug)]
pub struct _compat_ibv_port_attr {
    _data: [u8; 0],
    _marker: Opaque,
}

// ---- Device context.

/// `struct ibv_context_ops`: the provider's functions, of which the header's inline verbs call
/// four. The library fills every entry of a context it opens (a stub that fails where the
/// provider has none).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_context_ops {
    pub _compat_query_device: UnusedFn,
    pub _compat_query_port: UnusedFn,
    pub _compat_alloc_pd: UnusedFn,
    pub _compat_dealloc_pd: UnusedFn,
    pub _compat_reg_mr: UnusedFn,
    pub _compat_rereg_mr: UnusedFn,
    pub _compat_dereg_mr: UnusedFn,
    pub alloc_mw: UnusedFn,
    pub bind_mw: UnusedFn,
    pub dealloc_mw: UnusedFn,
    pub _compat_create_cq: UnusedFn,
    pub poll_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int>,
    pub req_notify_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int>,
    pub _compat_cq_event: UnusedFn,
    pub _compat_resize_cq: UnusedFn,
    pub _compat_destroy_cq: UnusedFn,
    pub _compat_create_srq: UnusedFn,
    pub _compat_modify_srq: UnusedFn,
    pub _compat_query_srq: UnusedFn,
    pub _compat_destroy_srq: UnusedFn,
    pub post_srq_recv: UnusedFn,
    pub _compat_create_qp: UnusedFn,
    pub _compat_query_qp: UnusedFn,
    pub _compat_modify_qp: UnusedFn,
    pub _compat_destroy_qp: UnusedFn,
    pub post_send: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_send_wr,
            bad_wr: *mut *mut ibv_send_wr,
        ) -> c_int,
    >,
    pub post_recv: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_recv_wr,
            bad_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    pub _compat_create_ah: UnusedFn,
    pub _compat_destroy_ah: UnusedFn,
    pub _compat_attach_mcast: UnusedFn,
    pub _compat_detach_mcast: UnusedFn,
    pub _compat_async_event: UnusedFn,
}

/// `struct ibv_context`: an open device.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct verbs_context`: the extended context that wraps every [`ibv_context`] rdma-core
/// opens. New members are added at the front, so `sz` (what the library filled) tells which
/// of them a given library has.
#[repr(C)]
#[derive(Debug)]
pub struct verbs_context {
    pub query_port: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            port_num: u8,
            port_attr: *mut ibv_port_attr,
            port_attr_len: usize,
        ) -> c_int,
    >,
    pub advise_mr: UnusedFn,
    pub alloc_null_mr: UnusedFn,
    pub read_counters: UnusedFn,
    pub attach_counters_point_flow: UnusedFn,
    pub create_counters: UnusedFn,
    pub destroy_counters: UnusedFn,
    pub reg_dm_mr: UnusedFn,
    pub alloc_dm: UnusedFn,
    pub free_dm: UnusedFn,
    pub modify_flow_action_esp: UnusedFn,
    pub destroy_flow_action: UnusedFn,
    pub create_flow_action_esp: UnusedFn,
    pub modify_qp_rate_limit: UnusedFn,
    pub alloc_parent_domain: UnusedFn,
    pub dealloc_td: UnusedFn,
    pub alloc_td: UnusedFn,
    pub modify_cq: UnusedFn,
    pub post_srq_ops: UnusedFn,
    pub destroy_rwq_ind_table: UnusedFn,
    pub create_rwq_ind_table: UnusedFn,
    pub destroy_wq: UnusedFn,
    pub modify_wq: UnusedFn,
    pub create_wq: UnusedFn,
    pub query_rt_values: UnusedFn,
    pub create_cq_ex: UnusedFn,
    /// `struct verbs_ex_private *priv`.
    pub priv_: *mut c_void,
    pub query_device_ex: UnusedFn,
    pub ibv_destroy_flow: UnusedFn,
    pub ABI_placeholder2: UnusedFn,
    pub ibv_create_flow: UnusedFn,
    pub ABI_placeholder1: UnusedFn,
    pub open_qp: UnusedFn,
    pub create_qp_ex: UnusedFn,
    pub get_srq_num: UnusedFn,
    pub create_srq_ex: UnusedFn,
    pub open_xrcd: UnusedFn,
    pub close_xrcd: UnusedFn,
    pub _ABI_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_port_attr`, filled by `ibv_query_port`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_port_attr {
    pub state: ibv_port_state,
    pub max_mtu: ibv_mtu,
    pub active_mtu: ibv_mtu,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

// ---- Memory regions, completion channels and queues.

/// `struct ibv_mr`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
#[derive(Debug)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// The anonymous union of `struct ibv_wc`: which member holds depends on `wc_flags`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_wc_imm {
    /// With `IBV_WC_WITH_IMM`: the immediate value, network order.
    pub imm_data: __be32,
    /// With `IBV_WC_WITH_INV`: the invalidated rkey.
    pub invalidated_rkey: u32,
}

/// `struct ibv_wc`: a work completion.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: ibv_wc_status,
    pub opcode: ibv_wc_opcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm: ibv_wc_imm,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// ---- Queue pairs.

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    /// `struct ibv_srq *`.
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: ibv_qp_state,
    pub qp_type: ibv_qp_type,
    pub mutex: libc::pthread_mutex_t,
    pub cond: libc::pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    /// `struct ibv_srq *`.
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: ibv_qp_type,
    pub sq_sig_all: c_int,
}

/// The `global` member of `union ibv_gid`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_gid_global {
    pub subnet_prefix: __be64,
    pub interface_id: __be64,
}

/// `union ibv_gid`: 16 bytes, 8-aligned through its `global` member.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_gid {
    pub raw: [u8; 16],
    pub global: ibv_gid_global,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`: the arguments of `ibv_modify_qp`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_qp_attr {
    pub qp_state: ibv_qp_state,
    pub cur_qp_state: ibv_qp_state,
    pub path_mtu: ibv_mtu,
    pub path_mig_state: ibv_mig_state,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

// ---- Work requests.

/// `struct ibv_sge`: one scatter/gather element.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// The first anonymous union of `struct ibv_send_wr`: which member holds depends on the opcode.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_imm {
    /// For the `*_WITH_IMM` opcodes: the immediate value, network order.
    pub imm_data: __be32,
    /// For the `*_INV` opcodes: the rkey to invalidate.
    pub invalidate_rkey: u32,
}

/// `wr.rdma` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_rdma {
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `wr.atomic` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_atomic {
    pub remote_addr: u64,
    pub compare_add: u64,
    pub swap: u64,
    pub rkey: u32,
}

/// `wr.ud` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_ud {
    /// `struct ibv_ah *`.
    pub ah: *mut c_void,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// The `wr` union of `struct ibv_send_wr`: the remote side, by transport and opcode.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_wr {
    pub rdma: ibv_send_wr_rdma,
    pub atomic: ibv_send_wr_atomic,
    pub ud: ibv_send_wr_ud,
}

/// `qp_type.xrc` of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_xrc {
    pub remote_srqn: u32,
}

/// The `qp_type` union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_qp_type {
    pub xrc: ibv_send_wr_xrc,
}

/// `struct ibv_mw_bind_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: c_uint,
}

/// `bind_mw` of the last anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_bind_mw {
    /// `struct ibv_mw *`.
    pub mw: *mut c_void,
    pub rkey: u32,
    pub bind_info: ibv_mw_bind_info,
}

/// `tso` of the last anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr_tso {
    pub hdr: *mut c_void,
    pub hdr_sz: u16,
    pub mss: u16,
}

/// The last anonymous union of `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ibv_send_wr_bind_mw_tso {
    pub bind_mw: ibv_send_wr_bind_mw,
    pub tso: ibv_send_wr_tso,
}

/// `struct ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: ibv_wr_opcode,
    pub send_flags: c_uint,
    pub imm: ibv_send_wr_imm,
    pub wr: ibv_send_wr_wr,
    pub qp_type: ibv_send_wr_qp_type,
    pub bind_mw_tso: ibv_send_wr_bind_mw_tso,
}

// ---- Debug for the types whose members are unions or locks: which union member holds is up to
// the reader, and the locks are the library's; both are left out.

macro_rules! opaque_debug {
    ($($t:ident),*) => {
        $(impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).finish_non_exhaustive()
            }
        })*
    };
}

opaque_debug!(
    ibv_gid,
    ibv_wc_imm,
    ibv_send_wr_imm,
    ibv_send_wr_wr,
    ibv_send_wr_qp_type,
    ibv_send_wr_bind_mw_tso
);

impl fmt::Debug for ibv_context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ibv_context")
            .field("device", &self.device)
            .field("cmd_fd", &self.cmd_fd)
            .field("async_fd", &self.async_fd)
            .field("num_comp_vectors", &self.num_comp_vectors)
            .field("abi_compat", &self.abi_compat)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ibv_cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ibv_cq")
            .field("context", &self.context)
            .field("channel", &self.channel)
            .field("handle", &self.handle)
            .field("cqe", &self.cqe)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for ibv_qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ibv_qp")
            .field("context", &self.context)
            .field("handle", &self.handle)
            .field("qp_num", &self.qp_num)
            .field("state", &self.state)
            .field("qp_type", &self.qp_type)
            .finish_non_exhaustive()
    }
}

// ---- The header's inline verbs: calls through the context's table of provider functions.

/// The provider's entry `op` of `ctx`'s function table. The header calls it without a check:
/// the library fills every entry of a context it opens, so a missing one is a broken library.
macro_rules! op {
    ($ctx:expr, $op:ident) => {
        (*$ctx).ops.$op.expect(concat!(
            "libibverbs left ibv_context_ops.",
            stringify!($op),
            " unset"
        ))
    };
}

/// `ibv_post_send`: posts the chain of work requests `wr` to the send queue of `qp`.
///
/// # Safety
/// `qp` is a live QP; `wr` starts a null-terminated chain of valid work requests whose memory
/// stays valid as the verb requires; `bad_wr` is writable.
#[inline]
pub unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: a live QP points at its open context, whose table holds the provider's function
    // of this prototype; the arguments are the caller's to vouch for.
    unsafe { op!((*qp).context, post_send)(qp, wr, bad_wr) }
}

/// `ibv_post_recv`: posts the chain of work requests `wr` to the receive queue of `qp`.
///
/// # Safety
/// As for [`ibv_post_send`], for receive work requests.
#[inline]
pub unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in `ibv_post_send`.
    unsafe { op!((*qp).context, post_recv)(qp, wr, bad_wr) }
}

/// `ibv_poll_cq`: reads up to `num_entries` completions of `cq` into `wc`; returns how many, or
/// a negative value when the CQ is in error.
///
/// # Safety
/// `cq` is a live CQ and `wc` has room for `num_entries` completions.
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points at its open context, whose table holds the provider's function
    // of this prototype; the arguments are the caller's to vouch for.
    unsafe { op!((*cq).context, poll_cq)(cq, num_entries, wc) }
}

/// `ibv_req_notify_cq`: arms `cq`, so its completion channel gets an event at the next
/// completion (only a solicited one if `solicited_only` is non-zero).
///
/// # Safety
/// `cq` is a live CQ.
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: as in `ibv_poll_cq`.
    unsafe { op!((*cq).context, req_notify_cq)(cq, solicited_only) }
}
