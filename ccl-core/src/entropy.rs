//! ECMP entropy of a verbs connection: the flow label each QP is given and the RoCE v2 UDP
//! source port a device derives from it.
//!
//! Switches spread flows over equal-cost paths by hashing each packet's 5-tuple. For RoCE v2
//! everything in it but the UDP source port is fixed by the two hosts (addresses, UDP, port
//! 4791), so that port is the only entropy a connection has: QPs with the same source port take
//! the same path. Linux drivers derive the port from the GRH flow label given when the QP moves
//! to RTR (`rdma_get_udp_sport` in `include/rdma/ib_verbs.h`, used by rxe and mlx5 among others):
//! a zero label is first replaced by a hash of the local and remote QP numbers
//! ([`kernel_flow_label`]), then the 20-bit label is folded into the low 14 bits of a port at or
//! above 0xC000 ([`flow_label_to_udp_sport`]). Kernels older than those drivers' adoption of it
//! (mlx5 before about 5.8) give every QP of a device one port whatever the label.
//!
//! Left to that default, the QPs of one connection get ports that are only probably distinct.
//! The verbs transport instead gives QP `k` of a connection (`k = 0` the control QP, `1..=n` the
//! data QPs) the label [`qp_flow_label`]`(base, k)`, with `base` from the two control QP numbers
//! ([`conn_base`]). The labels are below 2^14, so the fold leaves them unchanged and a
//! connection's QPs (up to 16383 of them) have pairwise distinct ports; both ends compute the
//! same `base`, so each QP pair uses one port in both directions. Across connections the bases,
//! and so the ports, are as spread as the kernel's own hash makes them.
//!
//! This module is the one statement of that rule: the verbs transport sets the labels from it,
//! and a fabric model that hashes flows onto paths takes each QP's source port from
//! [`qp_udp_sport`]. `scripts/rxe-entropy.sh` checks on the wire (two SoftRoCE VMs) that the
//! device sends exactly these ports.

/// Lowest RoCE v2 UDP source port (`IB_ROCE_UDP_ENCAP_VALID_PORT_MIN`); the 14 bits below it
/// carry the entropy.
pub const ROCE_SPORT_MIN: u16 = 0xC000;
/// RoCE v2's UDP destination port.
pub const ROCE_V2_DPORT: u16 = 4791;
/// Mask of the 20-bit GRH flow label (`IB_GRH_FLOWLABEL_MASK`).
pub const FLOW_LABEL_MASK: u32 = 0xF_FFFF;
/// Distinct non-zero labels that fold to distinct ports: 1..=0x3fff.
pub const DISTINCT_LABELS: u32 = 0x3FFF;

/// The kernel's `rdma_flow_label_to_udp_sport`: the UDP source port a device derives from a
/// flow label (the label's top 6 bits are XORed into its low 14, then offset to 0xC000).
pub fn flow_label_to_udp_sport(fl: u32) -> u16 {
    let fl = fl & FLOW_LABEL_MASK;
    let low = (fl & 0x3FFF) ^ (fl >> 14);
    low as u16 | ROCE_SPORT_MIN
}

/// The kernel's `rdma_calc_flow_label`: the label a driver uses when the QP was given none, from
/// the local and remote QP numbers; symmetric, so both ends of a QP pair agree.
pub fn kernel_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut v = lqpn as u64 * rqpn as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v as u32) & FLOW_LABEL_MASK
}

/// The kernel's `rdma_get_udp_sport`: the port of a QP given label `fl` (0: none) towards
/// `rqpn`.
pub fn kernel_udp_sport(fl: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if fl == 0 {
        kernel_flow_label(lqpn, rqpn)
    } else {
        fl
    };
    flow_label_to_udp_sport(fl)
}

/// The base of a connection's labels, from the control QP numbers of its two ends (in either
/// order: both ends compute the same value).
pub fn conn_base(ctrl_qpn_a: u32, ctrl_qpn_b: u32) -> u32 {
    kernel_flow_label(ctrl_qpn_a, ctrl_qpn_b)
}

/// The flow label of QP `k` of a connection whose base is `base`: `k = 0` is the control QP,
/// `1..=n` the data QPs. Never 0 (which would leave the choice to the device), below 2^14, and
/// distinct for `k` in any run of [`DISTINCT_LABELS`] consecutive values.
pub fn qp_flow_label(base: u32, k: usize) -> u32 {
    let k = (k % DISTINCT_LABELS as usize) as u32;
    1 + ((base % DISTINCT_LABELS) + k) % DISTINCT_LABELS
}

/// The RoCE v2 UDP source port of QP `k` of a connection whose base is `base`, on a device that
/// derives the port from the flow label (rxe, mlx5 and every driver using `rdma_get_udp_sport`).
pub fn qp_udp_sport(base: u32, k: usize) -> u16 {
    flow_label_to_udp_sport(qp_flow_label(base, k))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn fold_matches_the_kernel() {
        // Labels below 2^14 keep their value; the top 6 bits are XORed into the low ones.
        assert_eq!(flow_label_to_udp_sport(0), 0xC000);
        assert_eq!(flow_label_to_udp_sport(1), 0xC001);
        assert_eq!(flow_label_to_udp_sport(0x3FFF), 0xFFFF);
        assert_eq!(flow_label_to_udp_sport(0x4000), 0xC001);
        assert_eq!(flow_label_to_udp_sport(0xF_FFFF), 0xC000 | (0x3FFF ^ 0x3F));
        // Only 20 bits count.
        assert_eq!(flow_label_to_udp_sport(0x10_0001), 0xC001);
    }

    #[test]
    fn kernel_label_is_symmetric_and_folded() {
        for (a, b) in [(17, 18), (0x123, 0x4567), (0xFF_FFFF, 0xFF_FFFE), (0, 9)] {
            assert_eq!(kernel_flow_label(a, b), kernel_flow_label(b, a));
            assert!(kernel_flow_label(a, b) <= FLOW_LABEL_MASK);
        }
        // Small products are the label itself.
        assert_eq!(kernel_flow_label(17, 18), 306);
        // v = 0xFFFFFF * 0xFFFFFE = 0xFFFFFD000002; folded: v ^= v >> 20, v ^= v >> 40.
        let v: u64 = 0xFF_FFFF * 0xFF_FFFE;
        let v = v ^ (v >> 20);
        let v = v ^ (v >> 40);
        assert_eq!(
            kernel_flow_label(0xFF_FFFF, 0xFF_FFFE),
            (v & 0xF_FFFF) as u32
        );
        assert_eq!(kernel_udp_sport(0, 17, 18), 0xC000 | 306);
        assert_eq!(kernel_udp_sport(5, 17, 18), 0xC005);
    }

    #[test]
    fn labels_are_never_zero_and_stay_below_the_fold() {
        for base in [0, 1, 0x3FFE, 0x3FFF, 0x4000, 0xF_FFFF] {
            for k in 0..=64 {
                let l = qp_flow_label(base, k);
                assert!((1..=DISTINCT_LABELS).contains(&l), "base {base} k {k}: {l}");
                assert_eq!(qp_udp_sport(base, k), ROCE_SPORT_MIN | l as u16);
            }
        }
    }

    #[test]
    fn a_connections_qps_have_distinct_ports() {
        // Control QP and 64 data QPs (CCL_IB_QPS_PER_CONN's maximum), across the wrap-around.
        for base in [0, 7, 0x3FF0, 0x3FFE, 0x3FFF, 0xABCDE, 0xF_FFFF] {
            let ports: HashSet<u16> = (0..=64).map(|k| qp_udp_sport(base, k)).collect();
            assert_eq!(ports.len(), 65, "base {base}");
        }
    }

    #[test]
    fn both_ends_agree() {
        assert_eq!(conn_base(17, 23), conn_base(23, 17));
        let b = conn_base(17, 23);
        assert_eq!(b, 17 * 23);
        // Control QP then data QPs: consecutive labels from the base.
        assert_eq!(qp_flow_label(b, 0), 1 + 391);
        assert_eq!(qp_udp_sport(b, 4), 0xC000 + 396);
    }
}
