//! Connection set-up over the side channel (an authenticated TCP connection to the peer).
//!
//! Both sides run the same steps: create the connection's verbs objects and bring the QPs to
//! INIT with their receives posted; exchange [`QpInfo`] (QP numbers, PSNs, GID, MTU, receive
//! ring address and rkey) and check that both sides use the same layout; move every QP to RTR
//! and RTS; then exchange a ready byte, so neither side writes before the other can receive. The
//! side channel then stays open as the endpoint's liveness channel. A failure at any step drops
//! the half-made connection, which tears it down ([`Resources`]' `Drop`).

use std::sync::Arc;
use std::time::Instant;

use ccl_core::config::IbConfig;
use ccl_core::entropy;
use ccl_core::transport::{ConnectContext, Endpoint, Interest};
use ccl_core::{Error, ErrorKind, Result};
use nix::poll::{PollFd, PollTimeout};

use crate::LOG_SUBSYS;
use crate::device::mtu_bytes;
use crate::endpoint::{IbEndpoint, Remote};
use crate::port::IbDevice;
use crate::qp::{ConnParams, QpState};
use crate::resources::{Layout, Resources};
use crate::wire::{QpAddr, QpInfo};

/// The last byte of the set-up: "my QPs are ready to receive".
const READY: u8 = b'R';

/// Connects to `peer` over `side`: see the module documentation.
pub(crate) fn establish(
    dev: &Arc<IbDevice>,
    ctx: &ConnectContext,
    peer: usize,
    mut side: Box<dyn Endpoint>,
    deadline: Instant,
) -> Result<Box<dyn Endpoint>> {
    let ib = &ctx.config.ib;
    let layout = Layout {
        slots: ib.slots,
        slot_size: ib.slot_size,
        nqp: ib.qps_per_conn,
    };
    let (res, theirs) = handshake(dev, ctx, peer, layout, &mut *side, deadline).map_err(|e| {
        e.rank(ctx.rank)
            .peer(peer)
            .context(format!("connecting to peer {peer} over verbs"))
    })?;
    ccl_core::ccl_trace!(
        Some(ctx.rank),
        "verbs transport: connected to peer {peer}: {} data QPs, {} x {} B slots, MTU {}; \
         UDP source ports (local>remote QP:port, control QP first) {}",
        layout.nqp,
        layout.slots,
        layout.slot_size,
        mtu_bytes(dev.port_attr.active_mtu.min(theirs.mtu)),
        describe_ports(&res, &theirs)
    );
    let remote = Remote {
        ring_addr: theirs.ring_addr,
        rkey: theirs.ring_rkey,
    };
    Ok(Box::new(IbEndpoint::new(
        ctx, peer, side, layout, res, remote,
    )))
}

/// The steps of [`establish`] up to the ready mark; returns the connected objects and what the
/// peer told about itself.
fn handshake(
    dev: &IbDevice,
    ctx: &ConnectContext,
    peer: usize,
    layout: Layout,
    side: &mut dyn Endpoint,
    deadline: Instant,
) -> Result<(Resources, QpInfo)> {
    let ib = &ctx.config.ib;
    let res = Resources::new(dev, layout, ctx.rank, peer)?;
    let psns: Vec<u32> = res.qps.iter().map(|_| random_psn()).collect();
    let base = base_params(dev, ib);
    res.init(&layout, &base)?;
    let mine = QpInfo {
        rank: ctx.rank as u32,
        mtu: dev.port_attr.active_mtu,
        lid: dev.port_attr.lid,
        gid: dev.gid.gid,
        slots: layout.slots as u16,
        slot_size: layout.slot_size as u32,
        ring_addr: res.recv_buf.addr(),
        ring_rkey: res.recv_buf.rkey(),
        ctrl: QpAddr {
            qpn: res.qps[0].qpn(),
            psn: psns[0],
        },
        data: res.qps[1..]
            .iter()
            .zip(&psns[1..])
            .map(|(q, &psn)| QpAddr { qpn: q.qpn(), psn })
            .collect(),
    };
    let theirs = exchange(side, &mine, peer, deadline)?;
    check_layout(&theirs, &layout, ctx.rank, peer)?;
    let path = ConnParams {
        path_mtu: dev.port_attr.active_mtu.min(theirs.mtu),
        remote_gid: theirs.gid,
        remote_lid: theirs.lid,
        ..base
    };
    connect_qps(&res, &path, &theirs, &psns, ib)?;
    side_send(side, &[READY], deadline)?;
    let mut r = [0u8; 1];
    side_recv(side, &mut r, deadline)?;
    if r[0] != READY {
        return Err(Error::remote(format!(
            "verbs transport: peer {peer} sent {:#x} instead of its ready mark",
            r[0]
        )));
    }
    Ok((res, theirs))
}

/// The parameters every QP of the connection shares; the remote fields are filled per QP.
fn base_params(dev: &IbDevice, ib: &IbConfig) -> ConnParams {
    ConnParams {
        port: dev.port,
        path_mtu: 0,
        remote_qpn: 0,
        remote_psn: 0,
        local_psn: 0,
        remote_gid: [0; 16],
        remote_lid: 0,
        sgid_index: dev.gid.index as u8,
        traffic_class: 0,
        flow_label: 0,
        service_level: 0,
        timeout: ib.timeout,
        retry_cnt: ib.retry_cnt,
        rnr_retry: ib.rnr_retry,
    }
}

/// Sends our QP information and reads the peer's, checking that it is the rank we expect.
fn exchange(
    side: &mut dyn Endpoint,
    mine: &QpInfo,
    peer: usize,
    deadline: Instant,
) -> Result<QpInfo> {
    let bad = |m: String| {
        Error::remote(format!(
            "verbs transport: bad QP information from peer {peer}: {m}"
        ))
    };
    side_send(side, &mine.encode(), deadline)?;
    let mut head = [0u8; QpInfo::HEADER_LEN];
    side_recv(side, &mut head, deadline)?;
    let len = QpInfo::len_from_header(&head).map_err(bad)?;
    let mut msg = vec![0u8; len];
    msg[..head.len()].copy_from_slice(&head);
    side_recv(side, &mut msg[head.len()..], deadline)?;
    let theirs = QpInfo::decode(&msg).map_err(bad)?;
    if theirs.rank as usize != peer {
        return Err(Error::remote(format!(
            "verbs transport: peer {peer} says it is rank {}",
            theirs.rank
        )));
    }
    Ok(theirs)
}

/// Refuses a peer whose slots or QP count differ from ours: its writes would not fit our ring.
fn check_layout(theirs: &QpInfo, layout: &Layout, rank: usize, peer: usize) -> Result<()> {
    for (name, ours, their) in [
        ("CCL_IB_QPS_PER_CONN", layout.nqp, theirs.data.len()),
        ("CCL_IB_SLOTS", layout.slots, theirs.slots as usize),
        (
            "CCL_IB_SLOT_SIZE",
            layout.slot_size,
            theirs.slot_size as usize,
        ),
    ] {
        if ours != their {
            return Err(Error::invalid_usage(format!(
                "{name} is {ours} on rank {rank} but {their} on rank {peer}: set it alike on every rank"
            )));
        }
    }
    Ok(())
}

/// Moves every QP to RTR and RTS towards its peer QP (`path` holds what all share): the control
/// QP with `CCL_IB_CTRL_TC`, the data QPs with `CCL_IB_TC`. Each QP gets the flow label of
/// [`flow_labels`], so the device gives it its own UDP source port.
fn connect_qps(
    res: &Resources,
    path: &ConnParams,
    theirs: &QpInfo,
    psns: &[u32],
    ib: &IbConfig,
) -> Result<()> {
    let labels = flow_labels(res.qps[0].qpn(), theirs.ctrl.qpn, res.qps.len());
    let pairs = std::iter::once((&res.qps[0], theirs.ctrl, psns[0], ib.ctrl_tc)).chain(
        res.qps[1..]
            .iter()
            .zip(&theirs.data)
            .zip(&psns[1..])
            .map(|((q, t), &psn)| (q, *t, psn, ib.tc)),
    );
    for ((qp, t, psn, tc), flow_label) in pairs.zip(labels) {
        let p = ConnParams {
            remote_qpn: t.qpn,
            remote_psn: t.psn,
            local_psn: psn,
            traffic_class: tc,
            flow_label,
            ..*path
        };
        qp.modify(QpState::Rtr, &p)?;
        qp.modify(QpState::Rts, &p)?;
    }
    Ok(())
}

/// The flow labels of a connection's `nqp_total` QPs (control QP first), by the rule of
/// [`ccl_core::entropy`]: both ends compute the same ones from the two control QP numbers.
fn flow_labels(my_ctrl: u32, their_ctrl: u32, nqp_total: usize) -> Vec<u32> {
    let base = entropy::conn_base(my_ctrl, their_ctrl);
    (0..nqp_total)
        .map(|k| entropy::qp_flow_label(base, k))
        .collect()
}

/// `local>remote:port` for each QP (control QP first): which UDP source port the device
/// derives for each QP pair, for the log and for matching a packet capture.
fn describe_ports(res: &Resources, theirs: &QpInfo) -> String {
    let labels = flow_labels(res.qps[0].qpn(), theirs.ctrl.qpn, res.qps.len());
    let remote = std::iter::once(theirs.ctrl.qpn).chain(theirs.data.iter().map(|d| d.qpn));
    res.qps
        .iter()
        .zip(remote)
        .zip(labels)
        .map(|((q, r), l)| format!("{}>{}:{}", q.qpn(), r, entropy::flow_label_to_udp_sport(l)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sleeps until the side channel is ready for `interest` or 100 ms pass.
fn wait_side(side: &mut dyn Endpoint, interest: Interest, deadline: Instant) -> Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::timeout(format!(
            "verbs transport: exchanging QP information with peer {} (deadline passed)",
            side.peer()
        )));
    }
    let mut fds = Vec::new();
    side.wait_fds(interest, &mut fds);
    let mut pfds: Vec<PollFd<'_>> = fds.iter().map(|(fd, f)| PollFd::new(*fd, *f)).collect();
    let ms = left.as_millis().clamp(1, 100) as u16;
    match nix::poll::poll(&mut pfds, PollTimeout::from(ms)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(Error::io(ErrorKind::System, "poll", e.into())),
    }
}

fn side_send(side: &mut dyn Endpoint, mut buf: &[u8], deadline: Instant) -> Result<()> {
    while !buf.is_empty() {
        let n = side.send(buf)?;
        buf = &buf[n..];
        if n == 0 {
            wait_side(
                side,
                Interest {
                    send: true,
                    recv: false,
                },
                deadline,
            )?;
        }
    }
    Ok(())
}

fn side_recv(side: &mut dyn Endpoint, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let n = side.recv(&mut buf[got..])?;
        got += n;
        if n == 0 {
            wait_side(
                side,
                Interest {
                    send: false,
                    recv: true,
                },
                deadline,
            )?;
        }
    }
    Ok(())
}

/// A random 24-bit packet sequence number (a stale packet of an earlier connection between the
/// same QP numbers is then unlikely to be taken for a new one).
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    if getrandom::getrandom(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(7);
        b = t.to_le_bytes();
    }
    u32::from_le_bytes(b) & 0x00ff_ffff
}
