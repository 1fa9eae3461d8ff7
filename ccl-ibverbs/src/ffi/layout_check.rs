//! The definitions of `ffi` against `rdma-sys`, whose bindings are generated from the installed
//! rdma-core headers at build time (rdma-sys writes the structs with anonymous unions by hand,
//! from the same header). For every struct: size, alignment, and each field's offset and size,
//! with the field lists matched both ways (a destructuring without `..` fails to compile if
//! either side has a field the list lacks); for every union: size, alignment and each member's
//! size; for every constant: the value, at the same integer type. Opaque types have no layout
//! to compare.
//!
//! Not covered: `VERBS_ABI_IS_EXTENDED`, a pointer-valued macro of the header that has no
//! binding (rdma-sys's own code compares `abi_compat` with `UINT_MAX`, which is not the value:
//! the header and the library use `UINTPTR_MAX`), and the prototypes of the function pointers,
//! whose argument types are each crate's own.

use std::fmt::Debug;
use std::mem::{align_of, offset_of, size_of};

use rdma_sys as c;

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

fn member_size<U, F>(_: fn(&U) -> *const F) -> usize {
    size_of::<F>()
}

fn same_size_and_align<Ours, Theirs>(name: &str) {
    assert_eq!(size_of::<Ours>(), size_of::<Theirs>(), "size of {name}");
    assert_eq!(
        align_of::<Ours>(),
        align_of::<Theirs>(),
        "alignment of {name}"
    );
}

/// One value, compared at one type: a constant of the wrong integer type does not compile.
fn same<T: PartialEq + Debug>(ours: T, theirs: T, name: &str) {
    assert_eq!(ours, theirs, "{name}");
}

/// `same_struct!(ours = theirs { field, field: their_name, ... })`, every field of both (`theirs`
/// is the name in rdma-sys).
macro_rules! same_struct {
    ($ours:ident = $theirs:ident { $($fields:tt)* }) => {
        same_struct!(@pairs $ours $theirs [] $($fields)*)
    };
    // Pairs each field with its name in rdma-sys, then checks them all.
    (@pairs $ours:ident $theirs:ident [$($done:tt)*]) => {
        same_struct!(@check $ours $theirs $($done)*)
    };
    (@pairs $ours:ident $theirs:ident [$($done:tt)*] $f:ident : $g:ident $(, $($rest:tt)*)?) => {
        same_struct!(@pairs $ours $theirs [$($done)* ($f $g)] $($($rest)*)?)
    };
    (@pairs $ours:ident $theirs:ident [$($done:tt)*] $f:ident $(, $($rest:tt)*)?) => {
        same_struct!(@pairs $ours $theirs [$($done)* ($f $f)] $($($rest)*)?)
    };
    (@check $ours:ident $theirs:ident $(($f:ident $g:ident))*) => {{
        same_size_and_align::<super::$ours, c::$theirs>(stringify!($ours));
        $(
            assert_eq!(
                offset_of!(super::$ours, $f),
                offset_of!(c::$theirs, $g),
                concat!("offset of ", stringify!($ours), ".", stringify!($f))
            );
            assert_eq!(
                field_size(|s: &super::$ours| &s.$f),
                field_size(|s: &c::$theirs| &s.$g),
                concat!("size of ", stringify!($ours), ".", stringify!($f))
            );
        )*
        #[allow(dead_code)]
        fn every_field(ours: &super::$ours, theirs: &c::$theirs) {
            let super::$ours { $($f: _),* } = ours;
            let c::$theirs { $($g: _),* } = theirs;
        }
    }};
}

/// `same_union!(ours = theirs { member, member: their_name, ... })`: members start at 0.
macro_rules! same_union {
    ($ours:ident = $theirs:ident { $($f:ident $(: $g:ident)?),* $(,)? }) => {{
        same_size_and_align::<super::$ours, c::$theirs>(stringify!($ours));
        $(same_union!(@member super::$ours, c::$theirs, $f $(, $g)?);)*
    }};
    (@member $o:ty, $t:ty, $f:ident) => {
        same_union!(@member $o, $t, $f, $f)
    };
    (@member $o:ty, $t:ty, $f:ident, $g:ident) => {
        assert_eq!(
            member_size(|u: &$o| &raw const u.$f),
            member_size(|u: &$t| &raw const u.$g),
            concat!("size of ", stringify!($o), ".", stringify!($f))
        );
    };
}

// One long list, not split: each entry is one struct's full field list against the headers,
// read top to bottom beside verbs.h; splitting it by struct would only add names.
#[test]
fn structs_match_the_headers() {
    same_struct!(
        ibv_context_ops = ibv_context_ops {
            _compat_query_device,
            _compat_query_port,
            _compat_alloc_pd,
            _compat_dealloc_pd,
            _compat_reg_mr,
            _compat_rereg_mr,
            _compat_dereg_mr,
            alloc_mw,
            bind_mw,
            dealloc_mw,
            _compat_create_cq,
            poll_cq,
            req_notify_cq,
            _compat_cq_event,
            _compat_resize_cq,
            _compat_destroy_cq,
            _compat_create_srq,
            _compat_modify_srq,
            _compat_query_srq,
            _compat_destroy_srq,
            post_srq_recv,
            _compat_create_qp,
            _compat_query_qp,
            _compat_modify_qp,
            _compat_destroy_qp,
            post_send,
            post_recv,
            _compat_create_ah,
            _compat_destroy_ah,
            _compat_attach_mcast,
            _compat_detach_mcast,
            _compat_async_event,
        }
    );
    same_struct!(
        ibv_context = ibv_context {
            device,
            ops,
            cmd_fd,
            async_fd,
            num_comp_vectors,
            mutex,
            abi_compat,
        }
    );
    same_struct!(
        verbs_context = verbs_context {
            query_port,
            advise_mr,
            alloc_null_mr,
            read_counters,
            attach_counters_point_flow,
            create_counters,
            destroy_counters,
            reg_dm_mr,
            alloc_dm,
            free_dm,
            modify_flow_action_esp,
            destroy_flow_action,
            create_flow_action_esp,
            modify_qp_rate_limit,
            alloc_parent_domain,
            dealloc_td,
            alloc_td,
            modify_cq,
            post_srq_ops,
            destroy_rwq_ind_table,
            create_rwq_ind_table,
            destroy_wq,
            modify_wq,
            create_wq,
            query_rt_values,
            create_cq_ex,
            priv_,
            query_device_ex,
            ibv_destroy_flow,
            ABI_placeholder2,
            ibv_create_flow,
            ABI_placeholder1,
            open_qp,
            create_qp_ex,
            get_srq_num,
            create_srq_ex,
            open_xrcd,
            close_xrcd,
            _ABI_placeholder3,
            sz,
            context,
        }
    );
    same_struct!(
        ibv_port_attr = ibv_port_attr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            port_cap_flags,
            max_msg_sz,
            bad_pkey_cntr,
            qkey_viol_cntr,
            pkey_tbl_len,
            lid,
            sm_lid,
            lmc,
            max_vl_num,
            sm_sl,
            subnet_timeout,
            init_type_reply,
            active_width,
            active_speed,
            phys_state,
            link_layer,
            flags,
            port_cap_flags2,
        }
    );
    same_struct!(
        ibv_mr = ibv_mr {
            context,
            pd,
            addr,
            length,
            handle,
            lkey,
            rkey
        }
    );
    same_struct!(
        ibv_comp_channel = ibv_comp_channel {
            context,
            fd,
            refcnt
        }
    );
    same_struct!(
        ibv_cq = ibv_cq {
            context,
            channel,
            cq_context,
            handle,
            cqe,
            mutex,
            cond,
            comp_events_completed,
            async_events_completed,
        }
    );
    same_struct!(
        ibv_wc = ibv_wc {
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm: imm_data_invalidated_rkey_union,
            qp_num,
            src_qp,
            wc_flags,
            pkey_index,
            slid,
            sl,
            dlid_path_bits,
        }
    );
    same_struct!(
        ibv_qp = ibv_qp {
            context,
            qp_context,
            pd,
            send_cq,
            recv_cq,
            srq,
            handle,
            qp_num,
            state,
            qp_type,
            mutex,
            cond,
            events_completed,
        }
    );
    same_struct!(
        ibv_qp_cap = ibv_qp_cap {
            max_send_wr,
            max_recv_wr,
            max_send_sge,
            max_recv_sge,
            max_inline_data,
        }
    );
    same_struct!(
        ibv_qp_init_attr = ibv_qp_init_attr {
            qp_context,
            send_cq,
            recv_cq,
            srq,
            cap,
            qp_type,
            sq_sig_all,
        }
    );
    same_struct!(
        ibv_gid_global = ibv_gid_global_t {
            subnet_prefix,
            interface_id
        }
    );
    same_struct!(
        ibv_global_route = ibv_global_route {
            dgid,
            flow_label,
            sgid_index,
            hop_limit,
            traffic_class,
        }
    );
    same_struct!(
        ibv_ah_attr = ibv_ah_attr {
            grh,
            dlid,
            sl,
            src_path_bits,
            static_rate,
            is_global,
            port_num,
        }
    );
    same_struct!(
        ibv_qp_attr = ibv_qp_attr {
            qp_state,
            cur_qp_state,
            path_mtu,
            path_mig_state,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp_num,
            qp_access_flags,
            cap,
            ah_attr,
            alt_ah_attr,
            pkey_index,
            alt_pkey_index,
            en_sqd_async_notify,
            sq_draining,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            port_num,
            timeout,
            retry_cnt,
            rnr_retry,
            alt_port_num,
            alt_timeout,
            rate_limit,
        }
    );
    same_struct!(ibv_sge = ibv_sge { addr, length, lkey });
    same_struct!(
        ibv_recv_wr = ibv_recv_wr {
            wr_id,
            next,
            sg_list,
            num_sge
        }
    );
    same_struct!(ibv_send_wr_rdma = rdma_t { remote_addr, rkey });
    same_struct!(
        ibv_send_wr_atomic = atomic_t {
            remote_addr,
            compare_add,
            swap,
            rkey
        }
    );
    same_struct!(
        ibv_send_wr_ud = ud_t {
            ah,
            remote_qpn,
            remote_qkey
        }
    );
    same_struct!(ibv_send_wr_xrc = xrc_t { remote_srqn });
    same_struct!(
        ibv_mw_bind_info = ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags
        }
    );
    same_struct!(
        ibv_send_wr_bind_mw = bind_mw_t {
            mw,
            rkey,
            bind_info
        }
    );
    same_struct!(ibv_send_wr_tso = tso_t { hdr, hdr_sz, mss });
    same_struct!(
        ibv_send_wr = ibv_send_wr {
            wr_id,
            next,
            sg_list,
            num_sge,
            opcode,
            send_flags,
            imm: imm_data_invalidated_rkey_union,
            wr,
            qp_type,
            bind_mw_tso: bind_mw_tso_union,
        }
    );
}

#[test]
fn unions_match_the_headers() {
    same_union!(ibv_gid = ibv_gid { raw, global });
    same_union!(
        ibv_wc_imm = imm_data_invalidated_rkey_union_t {
            imm_data,
            invalidated_rkey
        }
    );
    same_union!(
        ibv_send_wr_imm = imm_data_invalidated_rkey_union_t {
            imm_data,
            invalidate_rkey: invalidated_rkey,
        }
    );
    same_union!(ibv_send_wr_wr = wr_t { rdma, atomic, ud });
    same_union!(ibv_send_wr_qp_type = qp_type_t { xrc });
    same_union!(ibv_send_wr_bind_mw_tso = bind_mw_tso_union_t { bind_mw, tso });
}

// A flat table of every constant against the headers' value; long for the same reason.
#[test]
fn constants_match_the_headers() {
    use super::*;

    same(IBV_MTU_256, c::ibv_mtu::IBV_MTU_256, "IBV_MTU_256");
    same(IBV_MTU_512, c::ibv_mtu::IBV_MTU_512, "IBV_MTU_512");
    same(IBV_MTU_1024, c::ibv_mtu::IBV_MTU_1024, "IBV_MTU_1024");
    same(IBV_MTU_2048, c::ibv_mtu::IBV_MTU_2048, "IBV_MTU_2048");
    same(IBV_MTU_4096, c::ibv_mtu::IBV_MTU_4096, "IBV_MTU_4096");
    same(
        IBV_PORT_ACTIVE,
        c::ibv_port_state::IBV_PORT_ACTIVE,
        "IBV_PORT_ACTIVE",
    );

    same(IBV_QPS_INIT, c::ibv_qp_state::IBV_QPS_INIT, "IBV_QPS_INIT");
    same(IBV_QPS_RTR, c::ibv_qp_state::IBV_QPS_RTR, "IBV_QPS_RTR");
    same(IBV_QPS_RTS, c::ibv_qp_state::IBV_QPS_RTS, "IBV_QPS_RTS");
    same(IBV_QPS_ERR, c::ibv_qp_state::IBV_QPS_ERR, "IBV_QPS_ERR");
    same(IBV_QPT_RC, c::ibv_qp_type::IBV_QPT_RC, "IBV_QPT_RC");

    use c::ibv_qp_attr_mask as m;
    same(IBV_QP_STATE, m::IBV_QP_STATE.0, "IBV_QP_STATE");
    same(
        IBV_QP_ACCESS_FLAGS,
        m::IBV_QP_ACCESS_FLAGS.0,
        "IBV_QP_ACCESS_FLAGS",
    );
    same(
        IBV_QP_PKEY_INDEX,
        m::IBV_QP_PKEY_INDEX.0,
        "IBV_QP_PKEY_INDEX",
    );
    same(IBV_QP_PORT, m::IBV_QP_PORT.0, "IBV_QP_PORT");
    same(IBV_QP_AV, m::IBV_QP_AV.0, "IBV_QP_AV");
    same(IBV_QP_PATH_MTU, m::IBV_QP_PATH_MTU.0, "IBV_QP_PATH_MTU");
    same(IBV_QP_TIMEOUT, m::IBV_QP_TIMEOUT.0, "IBV_QP_TIMEOUT");
    same(IBV_QP_RETRY_CNT, m::IBV_QP_RETRY_CNT.0, "IBV_QP_RETRY_CNT");
    same(IBV_QP_RNR_RETRY, m::IBV_QP_RNR_RETRY.0, "IBV_QP_RNR_RETRY");
    same(IBV_QP_RQ_PSN, m::IBV_QP_RQ_PSN.0, "IBV_QP_RQ_PSN");
    same(
        IBV_QP_MAX_QP_RD_ATOMIC,
        m::IBV_QP_MAX_QP_RD_ATOMIC.0,
        "IBV_QP_MAX_QP_RD_ATOMIC",
    );
    same(
        IBV_QP_MIN_RNR_TIMER,
        m::IBV_QP_MIN_RNR_TIMER.0,
        "IBV_QP_MIN_RNR_TIMER",
    );
    same(IBV_QP_SQ_PSN, m::IBV_QP_SQ_PSN.0, "IBV_QP_SQ_PSN");
    same(
        IBV_QP_MAX_DEST_RD_ATOMIC,
        m::IBV_QP_MAX_DEST_RD_ATOMIC.0,
        "IBV_QP_MAX_DEST_RD_ATOMIC",
    );
    same(IBV_QP_DEST_QPN, m::IBV_QP_DEST_QPN.0, "IBV_QP_DEST_QPN");

    use c::ibv_access_flags as a;
    same(
        IBV_ACCESS_LOCAL_WRITE,
        a::IBV_ACCESS_LOCAL_WRITE.0,
        "IBV_ACCESS_LOCAL_WRITE",
    );
    same(
        IBV_ACCESS_REMOTE_WRITE,
        a::IBV_ACCESS_REMOTE_WRITE.0,
        "IBV_ACCESS_REMOTE_WRITE",
    );

    use c::ibv_wr_opcode as o;
    same(
        IBV_WR_RDMA_WRITE_WITH_IMM,
        o::IBV_WR_RDMA_WRITE_WITH_IMM,
        "IBV_WR_RDMA_WRITE_WITH_IMM",
    );
    same(IBV_WR_SEND, o::IBV_WR_SEND, "IBV_WR_SEND");
    same(
        IBV_WR_SEND_WITH_IMM,
        o::IBV_WR_SEND_WITH_IMM,
        "IBV_WR_SEND_WITH_IMM",
    );
    use c::ibv_send_flags as f;
    same(
        IBV_SEND_SIGNALED,
        f::IBV_SEND_SIGNALED.0,
        "IBV_SEND_SIGNALED",
    );
    same(IBV_SEND_INLINE, f::IBV_SEND_INLINE.0, "IBV_SEND_INLINE");

    use c::ibv_wc_status as s;
    same(IBV_WC_SUCCESS, s::IBV_WC_SUCCESS, "IBV_WC_SUCCESS");
    same(
        IBV_WC_WR_FLUSH_ERR,
        s::IBV_WC_WR_FLUSH_ERR,
        "IBV_WC_WR_FLUSH_ERR",
    );
    same(
        IBV_WC_RETRY_EXC_ERR,
        s::IBV_WC_RETRY_EXC_ERR,
        "IBV_WC_RETRY_EXC_ERR",
    );
    same(
        IBV_WC_RNR_RETRY_EXC_ERR,
        s::IBV_WC_RNR_RETRY_EXC_ERR,
        "IBV_WC_RNR_RETRY_EXC_ERR",
    );
    same(
        IBV_WC_GENERAL_ERR,
        s::IBV_WC_GENERAL_ERR,
        "IBV_WC_GENERAL_ERR",
    );
    same(
        IBV_WC_WITH_IMM,
        c::ibv_wc_flags::IBV_WC_WITH_IMM.0,
        "IBV_WC_WITH_IMM",
    );
}

/// The enum types of struct members that no constant above has are the header's too.
#[test]
fn enum_types_match_the_headers() {
    fn same_type<T>(_: Option<T>, _: Option<T>) {}
    same_type(None::<super::ibv_mig_state>, None::<c::ibv_mig_state::Type>);
    same_type(None::<super::ibv_wc_opcode>, None::<c::ibv_wc_opcode::Type>);
}
