//! The verbs [`Transport`]: device choice, listening, and connection set-up.
//!
//! A listener is a TCP listener (the TCP transport's, so connections authenticate with the
//! communicator secret exactly as TCP ones do, and strangers are dropped without disturbing the
//! job); its address, wrapped in a versioned ib handle, is what peers get through the bootstrap.
//! Connecting opens that side channel, exchanges [`QpInfo`](crate::wire::QpInfo) (QP numbers,
//! PSNs, GID, MTU, receive ring address and rkey), moves every QP INIT -> RTR -> RTS, and
//! exchanges a ready byte so neither side writes before the other is ready to receive. The
//! side channel then stays open as the liveness channel of the endpoint.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::config::{Config, IbConfig};
use ccl_core::transport::tcp::{self, TcpTransport};
use ccl_core::transport::{
    ConnectContext, Endpoint, Handle, Interest, Listener, Transport, TransportProperties,
};
use ccl_core::{Error, ErrorKind, Result, ccl_info};
use nix::poll::{PollFd, PollTimeout};

use crate::cq::{CompChannel, Cq};
use crate::device::{Context, LINK_LAYER_ETHERNET, PortAttr, mtu_bytes};
use crate::endpoint::{CTRL_RECV, DATA_RECV, IbEndpoint, Layout, Remote, Resources, wr_id};
use crate::mr::MrCache;
use crate::pd::Pd;
use crate::qp::{ConnParams, Qp, QpState};
use crate::sysfs::{self, GidEntry, HcaFilter, SYSFS_ROOT};
use crate::wire::{self, QpAddr, QpInfo};

/// The opened device: context, protection domain, port and GID, and the registration cache.
/// Shared by every endpoint of the transport.
#[derive(Debug)]
pub struct IbDevice {
    pub(crate) cache: MrCache,
    pub(crate) pd: Arc<Pd>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) port: u8,
    pub(crate) port_attr: PortAttr,
    pub(crate) gid: GidEntry,
}

impl IbDevice {
    /// The device name, e.g. `rxe0`.
    pub fn name(&self) -> &str {
        self.ctx.name()
    }

    pub fn port(&self) -> u8 {
        self.port
    }

    /// The GID entry in use.
    pub fn gid(&self) -> GidEntry {
        self.gid
    }

    /// The registration cache of this device's protection domain.
    pub fn cache(&self) -> &MrCache {
        &self.cache
    }
}

/// The verbs (RoCE / InfiniBand) transport.
#[derive(Debug, Clone)]
pub struct IbTransport {
    dev: Arc<IbDevice>,
    tcp: TcpTransport,
    /// `CCL_IB_SPIN_US`: how much longer than `CCL_SPIN_US` a waiting rank polls its peers.
    spin: Duration,
}

fn filter_of(cfg: &IbConfig) -> Result<Option<HcaFilter>> {
    cfg.hca
        .as_deref()
        .map(HcaFilter::parse)
        .transpose()
        .map_err(Error::invalid_argument)
}

/// Whether `auto` should pick verbs: an active RoCE port with a usable GID (passing
/// `CCL_IB_HCA`) exists. Reads sysfs only; opens nothing.
pub fn probe(config: &Config) -> bool {
    probe_at(config, Path::new(SYSFS_ROOT))
}

/// [`probe`] over another sysfs root (tests).
pub fn probe_at(config: &Config, root: &Path) -> bool {
    match filter_of(&config.ib) {
        Ok(f) => sysfs::active_roce_port(root, f.as_ref(), config.ib.gid_index),
        Err(_) => false,
    }
}

impl IbTransport {
    /// Opens the first usable port: active, passing `CCL_IB_HCA`, RoCE before InfiniBand, with a
    /// usable GID. Fails with an error that says what was looked for and what was found.
    pub fn open(config: &Config) -> Result<IbTransport> {
        IbTransport::open_at(config, Path::new(SYSFS_ROOT))
    }

    /// [`open`](IbTransport::open) with another sysfs root (tests).
    pub fn open_at(config: &Config, root: &Path) -> Result<IbTransport> {
        let filter = filter_of(&config.ib)?;
        let what = match &config.ib.hca {
            Some(h) => format!(
                "an active port in {} matching CCL_IB_HCA='{h}'",
                root.display()
            ),
            None => format!("an active port in {}", root.display()),
        };
        let all = sysfs::ports(root);
        let cands = sysfs::candidate_ports(root, filter.as_ref());
        if cands.is_empty() {
            let found = if all.is_empty() {
                "no verbs devices at all (no RDMA hardware or driver; for SoftRoCE load rdma_rxe \
                 and add a device: scripts/rxe-setup.sh; without RDMA use CCL_TRANSPORT=tcp)"
                    .to_string()
            } else {
                let v: Vec<String> = all
                    .iter()
                    .map(|p| {
                        format!(
                            "{}:{} {} {}",
                            p.device,
                            p.port,
                            if p.active { "active" } else { "not active" },
                            p.link_layer
                        )
                    })
                    .collect();
                format!("found {}", v.join(", "))
            };
            return Err(Error::invalid_usage(format!(
                "CCL_TRANSPORT=ib: no usable verbs device: looked for {what}; {found}"
            )));
        }
        let mut reasons = Vec::new();
        for p in &cands {
            match open_port(config, root, &p.device, p.port, p.is_roce()) {
                Ok(dev) => {
                    ccl_info!(
                        None,
                        "verbs transport: {} port {} ({}), GID {} {} ({:?}), MTU {}",
                        dev.name(),
                        dev.port,
                        if p.is_roce() { "RoCE" } else { "InfiniBand" },
                        dev.gid.index,
                        dev.gid.addr(),
                        dev.gid.kind,
                        mtu_bytes(dev.port_attr.active_mtu)
                    );
                    return Ok(IbTransport {
                        dev: Arc::new(dev),
                        tcp: TcpTransport::new(),
                        spin: config.ib.spin,
                    });
                }
                Err(e) => reasons.push(format!("{}:{}: {}", p.device, p.port, e.message())),
            }
        }
        Err(Error::invalid_usage(format!(
            "CCL_TRANSPORT=ib: no usable verbs device: {}",
            reasons.join("; ")
        )))
    }

    /// The device in use.
    pub fn device(&self) -> &Arc<IbDevice> {
        &self.dev
    }
}

fn open_port(config: &Config, root: &Path, name: &str, port: u8, roce: bool) -> Result<IbDevice> {
    let gid = sysfs::choose_gid(root, name, port, roce, config.ib.gid_index)
        .map_err(Error::invalid_usage)?;
    let ctx = Context::open(name)?;
    let port_attr = ctx.query_port(port)?;
    if !port_attr.active {
        return Err(Error::invalid_usage(format!(
            "{name} port {port} is not active"
        )));
    }
    if roce && port_attr.link_layer != LINK_LAYER_ETHERNET {
        return Err(Error::invalid_usage(format!(
            "{name} port {port}: sysfs says Ethernet, the device says link layer {}",
            port_attr.link_layer
        )));
    }
    let pd = Pd::new(&ctx)?;
    Ok(IbDevice {
        cache: MrCache::new(pd.clone()),
        pd,
        ctx,
        port,
        port_attr,
        gid,
    })
}

impl Transport for IbTransport {
    fn name(&self) -> &'static str {
        "ib"
    }

    fn properties(&self) -> TransportProperties {
        TransportProperties {
            latency: Duration::from_micros(10),
            bandwidth: 3.0e9,
            // Waking a sleeping rank through the completion channel costs far more than a poll,
            // most of all on software RDMA: waits spin this much longer, over every peer.
            spin: self.spin,
        }
    }

    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>> {
        let tcp = self.tcp.listen(ctx)?;
        let addr = tcp::decode_handle(&tcp.handle())?;
        Ok(Box::new(IbListener {
            tcp,
            handle: wire::encode_handle(addr),
            dev: self.dev.clone(),
            ctx: ctx.clone(),
        }))
    }

    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let addr = wire::decode_handle(handle).map_err(|m| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("bad ib connection handle: {m}"),
            )
            .rank(ctx.rank)
            .peer(peer)
        })?;
        let side = self
            .tcp
            .connect(ctx, peer, &tcp::encode_handle(addr), deadline)?;
        establish(&self.dev, ctx, peer, side, deadline)
    }
}

struct IbListener {
    tcp: Box<dyn Listener>,
    handle: Handle,
    dev: Arc<IbDevice>,
    ctx: ConnectContext,
}

impl Listener for IbListener {
    fn handle(&self) -> Handle {
        self.handle.clone()
    }

    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)> {
        let (peer, side) = self.tcp.accept(deadline)?;
        let ep = establish(&self.dev, &self.ctx, peer, side, deadline)?;
        Ok((peer, ep))
    }
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

const READY: u8 = b'R';

/// Creates the QPs and staging rings for `peer`, exchanges QP information over `side`, and
/// brings every QP to RTS.
fn establish(
    dev: &Arc<IbDevice>,
    ctx: &ConnectContext,
    peer: usize,
    mut side: Box<dyn Endpoint>,
    deadline: Instant,
) -> Result<Box<dyn Endpoint>> {
    let rank = ctx.rank;
    let tag = |e: Error| {
        e.rank(rank)
            .peer(peer)
            .context(format!("connecting to peer {peer} over verbs"))
    };
    let ib = &ctx.config.ib;
    let layout = Layout {
        slots: ib.slots,
        slot_size: ib.slot_size,
        nqp: ib.qps_per_conn,
    };
    let ring = layout.slots * layout.slot_size;
    let channel = CompChannel::new(&dev.ctx).map_err(|e| tag(e.into()))?;
    let cq = Cq::new(&channel, layout.cq_entries()).map_err(|e| tag(e.into()))?;
    let mut qps = Vec::with_capacity(1 + layout.nqp);
    qps.push(
        Qp::new(&dev.pd, &cq, layout.ctrl_depth(), layout.ctrl_depth())
            .map_err(|e| tag(e.into()))?,
    );
    for _ in 0..layout.nqp {
        qps.push(
            Qp::new(
                &dev.pd,
                &cq,
                layout.data_send_depth(),
                layout.data_recv_depth(),
            )
            .map_err(|e| tag(e.into()))?,
        );
    }
    let send_buf = dev.cache.get(ring, false).map_err(|e| tag(e.into()))?;
    let recv_buf = dev.cache.get(ring, true).map_err(|e| tag(e.into()))?;
    let psns: Vec<u32> = qps.iter().map(|_| random_psn()).collect();
    let mut res = Resources {
        qps,
        cq,
        channel,
        send_buf: Some(send_buf),
        recv_buf: Some(recv_buf),
    };
    // From here on, dropping `res` without the endpoint's Drop must still return the buffers
    // to the cache; a failure path builds the endpoint first so its Drop does the clean-up.
    let base = ConnParams {
        port: dev.port,
        path_mtu: 0,
        remote_qpn: 0,
        remote_psn: 0,
        local_psn: 0,
        remote_gid: [0; 16],
        remote_lid: 0,
        sgid_index: dev.gid.index as u8,
        traffic_class: 0,
        service_level: 0,
        timeout: ib.timeout,
        retry_cnt: ib.retry_cnt,
        rnr_retry: ib.rnr_retry,
    };
    let setup = (|| -> Result<QpInfo> {
        for qp in &res.qps {
            qp.modify(QpState::Init, &base)?;
        }
        for _ in 0..layout.ctrl_depth() {
            res.qps[0].post_recv(wr_id(CTRL_RECV, 0))?;
        }
        for (i, qp) in res.qps[1..].iter().enumerate() {
            for _ in 0..layout.data_recv_depth() {
                qp.post_recv(wr_id(DATA_RECV, i))?;
            }
        }
        let recv_buf = res.recv_buf.as_ref().expect("just set");
        let mine = QpInfo {
            rank: rank as u32,
            mtu: dev.port_attr.active_mtu,
            lid: dev.port_attr.lid,
            gid: dev.gid.gid,
            slots: layout.slots as u16,
            slot_size: layout.slot_size as u32,
            ring_addr: recv_buf.addr(),
            ring_rkey: recv_buf.rkey(),
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
        side_send(&mut *side, &mine.encode(), deadline)?;
        let mut head = [0u8; QpInfo::HEADER_LEN];
        side_recv(&mut *side, &mut head, deadline)?;
        let len = QpInfo::len_from_header(&head).map_err(|m| {
            Error::remote(format!(
                "verbs transport: bad QP information from peer {peer}: {m}"
            ))
        })?;
        let mut msg = vec![0u8; len];
        msg[..head.len()].copy_from_slice(&head);
        side_recv(&mut *side, &mut msg[head.len()..], deadline)?;
        let theirs = QpInfo::decode(&msg).map_err(|m| {
            Error::remote(format!(
                "verbs transport: bad QP information from peer {peer}: {m}"
            ))
        })?;
        if theirs.rank as usize != peer {
            return Err(Error::remote(format!(
                "verbs transport: peer {peer} says it is rank {}",
                theirs.rank
            )));
        }
        let mismatch = |name: &str, ours: usize, their: usize| {
            Error::invalid_usage(format!(
                "{name} is {ours} on rank {rank} but {their} on rank {peer}: set it alike on every rank"
            ))
        };
        if theirs.data.len() != layout.nqp {
            return Err(mismatch(
                "CCL_IB_QPS_PER_CONN",
                layout.nqp,
                theirs.data.len(),
            ));
        }
        if theirs.slots as usize != layout.slots {
            return Err(mismatch(
                "CCL_IB_SLOTS",
                layout.slots,
                theirs.slots as usize,
            ));
        }
        if theirs.slot_size as usize != layout.slot_size {
            return Err(mismatch(
                "CCL_IB_SLOT_SIZE",
                layout.slot_size,
                theirs.slot_size as usize,
            ));
        }
        let pairs = std::iter::once((&res.qps[0], theirs.ctrl, psns[0], ib.ctrl_tc)).chain(
            res.qps[1..]
                .iter()
                .zip(&theirs.data)
                .zip(&psns[1..])
                .map(|((q, t), &psn)| (q, *t, psn, ib.tc)),
        );
        for (qp, t, psn, tc) in pairs {
            let p = ConnParams {
                path_mtu: dev.port_attr.active_mtu.min(theirs.mtu),
                remote_qpn: t.qpn,
                remote_psn: t.psn,
                local_psn: psn,
                remote_gid: theirs.gid,
                remote_lid: theirs.lid,
                traffic_class: tc,
                ..base
            };
            qp.modify(QpState::Rtr, &p)?;
            qp.modify(QpState::Rts, &p)?;
        }
        side_send(&mut *side, &[READY], deadline)?;
        let mut r = [0u8; 1];
        side_recv(&mut *side, &mut r, deadline)?;
        if r[0] != READY {
            return Err(Error::remote(format!(
                "verbs transport: peer {peer} sent {:#x} instead of its ready mark",
                r[0]
            )));
        }
        Ok(theirs)
    })();
    match setup {
        Ok(theirs) => {
            ccl_core::ccl_trace!(
                Some(rank),
                "verbs transport: connected to peer {peer}: {} data QPs, {} x {} B slots, MTU {}",
                layout.nqp,
                layout.slots,
                layout.slot_size,
                mtu_bytes(dev.port_attr.active_mtu.min(theirs.mtu))
            );
            Ok(Box::new(IbEndpoint::new(
                peer,
                rank,
                dev.clone(),
                layout,
                res,
                Remote {
                    ring_addr: theirs.ring_addr,
                    rkey: theirs.ring_rkey,
                },
                side,
                ctx.config.timeout,
            )))
        }
        Err(e) => {
            // Stop the QPs before the buffers they may reference go back to the cache.
            for qp in &res.qps {
                let _ = qp.to_error();
            }
            res.qps.clear();
            if let Some(b) = res.send_buf.take() {
                dev.cache.put(b, false);
            }
            if let Some(b) = res.recv_buf.take() {
                dev.cache.put(b, true);
            }
            Err(tag(e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::tests::{FakeSysfs, rxe_like};

    #[test]
    fn no_device_is_a_clear_error() {
        let fs = FakeSysfs::new();
        let cfg = Config::default();
        let e = IbTransport::open_at(&cfg, &fs.root.join("none")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUsage);
        let s = e.to_string();
        assert!(s.contains("CCL_TRANSPORT=ib"), "{s}");
        assert!(s.contains("no verbs devices at all"), "{s}");
        assert!(s.contains("CCL_TRANSPORT=tcp"), "{s}");
        assert!(!probe_at(&cfg, &fs.root.join("none")));
    }

    #[test]
    fn filtered_out_devices_are_listed() {
        let fs = FakeSysfs::new();
        rxe_like(&fs);
        fs.port("mlx5_0", 1, "1: DOWN", "Ethernet");
        let mut cfg = Config::default();
        cfg.ib.hca = Some("mlx5".into());
        let e = IbTransport::open_at(&cfg, &fs.root).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("CCL_IB_HCA='mlx5'"), "{s}");
        assert!(s.contains("mlx5_0:1 not active"), "{s}");
        assert!(s.contains("rxe0:1 active Ethernet"), "{s}");
        assert!(!probe_at(&cfg, &fs.root));
        cfg.ib.hca = Some("rxe".into());
        assert!(probe_at(&cfg, &fs.root));
        cfg.ib.hca = Some("rxe0:x".into());
        assert!(!probe_at(&cfg, &fs.root));
        assert_eq!(
            IbTransport::open_at(&cfg, &fs.root).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn a_port_without_a_gid_says_so() {
        let fs = FakeSysfs::new();
        fs.port("rxe9", 1, "4: ACTIVE", "Ethernet");
        let e = IbTransport::open_at(&Config::default(), &fs.root).unwrap_err();
        assert!(
            e.to_string().contains("no usable GID on rxe9 port 1"),
            "{e}"
        );
    }
}
