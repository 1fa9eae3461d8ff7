//! The verbs [`Transport`]: listening and connecting.
//!
//! A listener is a TCP listener (the TCP transport's, so connections authenticate with the
//! communicator secret exactly as TCP ones do, and strangers are dropped without disturbing the
//! job); its address, wrapped in a versioned ib handle, is what peers get through the bootstrap.
//! Each accepted or opened TCP connection becomes the side channel over which the verbs
//! connection is set up ([`connect`](crate::connect)) and stays open as its liveness channel.
//!
//! **Several ports, several planes.** Where `CCL_IB_HCA` matches two or more usable ports (at
//! most [`MAX_PLANES`]), each is a plane: the listener listens on each port's IP address, a
//! peer connects on each plane (pairing ports by their place in the order [`IbDevice`]s are
//! chosen), sets up a verbs connection on that port over that plane's socket, and the planes
//! are one [`Striped`] endpoint: the stream striped across the ports by what each delivers, and
//! a port whose link dies (its queue pair in error, or its bytes unread while the other port
//! delivers) routed around without an error ([`ccl_core::transport::planes`]), and its
//! connection made again once its link is back ([`planes`](crate::planes)). Zero-copy sends
//! and receives are not used across planes (the striped stream stages through each
//! connection's slots).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::config::Config;
use ccl_core::transport::planes::MAX_PLANES;
use ccl_core::transport::tcp::{self, TcpTransport};
use ccl_core::transport::{
    ConnectContext, Endpoint, Handle, Listener, MemRegion, Transport, TransportProperties,
};
use ccl_core::{Error, Result, net};

use crate::LOG_SUBSYS;
use crate::connect::establish;
use crate::mr::UserMr;
use crate::planes;
use crate::port::IbDevice;
use crate::sysfs::SYSFS_ROOT;
use crate::wire;

/// The verbs (RoCE / InfiniBand) transport.
#[derive(Debug, Clone)]
pub struct IbTransport {
    dev: Arc<IbDevice>,
    /// Every port, a plane each, when `CCL_IB_HCA` matches several or several are found
    /// ([`found_planes`]); else empty.
    planes: Vec<Arc<IbDevice>>,
    /// Without `CCL_IB_HCA`: each port's interface address (one per port in use, or none
    /// when the port's network interface is unknown); planes pair with a peer's by network.
    nets: Vec<net::UpAddr>,
    tcp: TcpTransport,
    /// `CCL_IB_SPIN_US`: how much longer than `CCL_SPIN_US` a waiting rank polls its peers.
    spin: Duration,
}

impl IbTransport {
    /// Opens the first usable port: active, passing `CCL_IB_HCA`, RoCE before InfiniBand, with a
    /// usable GID. Fails with an error that says what was looked for and what was found.
    pub fn open(config: &Config) -> Result<IbTransport> {
        IbTransport::open_at(config, Path::new(SYSFS_ROOT))
    }

    /// [`open`](IbTransport::open) with another sysfs root (tests).
    pub fn open_at(config: &Config, root: &Path) -> Result<IbTransport> {
        let devs: Vec<Arc<IbDevice>> = IbDevice::open_ports_at(config, root, MAX_PLANES)?
            .into_iter()
            .map(Arc::new)
            .collect();
        let (devs, nets) = if config.ib.hca.is_some() {
            (devs, Vec::new())
        } else {
            found_planes(devs)
        };
        let planes = if devs.len() > 1 {
            devs.clone()
        } else {
            Vec::new()
        };
        if !planes.is_empty() {
            let names: Vec<String> = planes
                .iter()
                .map(|d| format!("{} port {}", d.name(), d.port()))
                .collect();
            ccl_core::ccl_info!(
                None,
                "verbs transport: {} planes ({}{}), striped with failover",
                planes.len(),
                names.join(", "),
                if nets.is_empty() {
                    ""
                } else {
                    "; found without CCL_IB_HCA, paired with peers' ports by network"
                }
            );
        }
        Ok(IbTransport {
            dev: devs[0].clone(),
            planes,
            nets,
            tcp: TcpTransport::new(),
            spin: config.ib.spin,
        })
    }

    /// The device in use (the first plane's, with several).
    pub fn device(&self) -> &Arc<IbDevice> {
        &self.dev
    }

    /// Every port in use when there are several planes (else empty).
    pub fn planes(&self) -> &[Arc<IbDevice>] {
        &self.planes
    }

    /// The TCP transport that makes the planes' side channels: one listener on each port's
    /// address (the set-up address for a port without one), each peer's set of sockets made a
    /// verbs connection per plane and one striped endpoint.
    fn plane_tcp(&self, ctx: &ConnectContext) -> TcpTransport {
        if !self.nets.is_empty() {
            let devs = if self.planes.is_empty() {
                vec![self.dev.clone()]
            } else {
                self.planes.clone()
            };
            return TcpTransport::on_networks(&self.nets).building(planes::builder(devs));
        }
        let ips: Vec<IpAddr> = self
            .planes
            .iter()
            .map(|d| d.ip().unwrap_or(ctx.local_ip))
            .collect();
        TcpTransport::on_planes(&ips).building(planes::builder(self.planes.clone()))
    }
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
            host_memory: false,
        }
    }

    fn listen(&self, ctx: &ConnectContext) -> Result<Box<dyn Listener>> {
        let planes = !self.planes.is_empty();
        let tcp = if planes {
            self.plane_tcp(ctx).listen(ctx)?
        } else {
            self.tcp.listen(ctx)?
        };
        let addrs = tcp::decode_handles(&tcp.handle())?;
        Ok(Box::new(IbListener {
            tcp,
            handle: wire::encode_handles(&addrs),
            dev: self.dev.clone(),
            ctx: ctx.clone(),
            planes,
        }))
    }

    fn connect(
        &self,
        ctx: &ConnectContext,
        peer: usize,
        handle: &Handle,
        deadline: Instant,
    ) -> Result<Box<dyn Endpoint>> {
        let addrs = wire::decode_handles(handle).map_err(|e| e.rank(ctx.rank).peer(peer))?;
        let ours = self.planes.len().max(1);
        let found = !self.nets.is_empty();
        if !found && (addrs.len() > 1) != (ours > 1) {
            return Err(Error::invalid_usage(format!(
                "verbs transport: peer {peer} listens on {} port(s), this rank on {ours} (with \
                 several, every rank's CCL_IB_HCA must match several usable ports)",
                addrs.len()
            ))
            .rank(ctx.rank)
            .peer(peer));
        }
        if addrs.len() > 1 {
            // Planes at both ends, or (found without a setting) this rank's one port paired
            // with the peer's on its network: the peer's listener takes planes only.
            return self
                .plane_tcp(ctx)
                .connect(ctx, peer, &tcp::encode_handles(&addrs), deadline);
        }
        // The peer listens on one port: this rank's port on its network, else the first.
        let dev = match self
            .planes
            .iter()
            .zip(&self.nets)
            .find(|(_, n)| n.on_link(addrs[0].ip()))
        {
            Some((d, _)) => d,
            None => &self.dev,
        };
        let side = self
            .tcp
            .connect(ctx, peer, &tcp::encode_handles(&addrs), deadline)?;
        establish(dev, ctx, peer, side, deadline)
    }

    /// One registration in the device's protection domain serves every connection of the
    /// communicator (they all share it).
    fn register(&self, mem: &[u8]) -> Result<Option<Box<dyn MemRegion>>> {
        // Striped planes stage every byte: a registration would only pin memory.
        if mem.is_empty() || !self.planes.is_empty() {
            return Ok(None);
        }
        let mr = UserMr::new(&self.dev.pd, mem).map_err(Error::from)?;
        Ok(Some(Box::new(mr)))
    }
}

/// Without `CCL_IB_HCA`, the ports that are planes: the first, then every other whose network
/// interface is like the first's (as [`net::auto_planes`] finds interfaces: up, same address
/// family and link speed, not a bridge; one port per interface), with each one's interface
/// address for pairing by network. The first port alone where there is no such other (with
/// its address, so that it pairs with a peer's ports by network), and with no address where
/// its interface is not known (InfiniBand, or no address: then as with `CCL_IB_HCA`).
fn found_planes(devs: Vec<Arc<IbDevice>>) -> (Vec<Arc<IbDevice>>, Vec<net::UpAddr>) {
    let Some(primary) = devs[0].ip() else {
        return (devs.into_iter().take(1).collect(), Vec::new());
    };
    let ips: Vec<IpAddr> = devs[1..]
        .iter()
        .map(|d| {
            d.ip()
                .unwrap_or(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED))
        })
        .collect();
    let ifs = match net::plane_interfaces(primary, &ips) {
        Ok(v) => v,
        Err(e) => {
            ccl_core::ccl_warn!(
                None,
                "verbs transport: one port ({} port {}): the network interfaces could not be \
                 read ({e})",
                devs[0].name(),
                devs[0].port()
            );
            return (devs.into_iter().take(1).collect(), Vec::new());
        }
    };
    let Some(first) = ifs[0].clone() else {
        return (devs.into_iter().take(1).collect(), Vec::new());
    };
    let mut kept = vec![devs[0].clone()];
    let mut nets = vec![first];
    for (d, a) in devs[1..].iter().zip(&ifs[1..]) {
        if let Some(a) = a {
            kept.push(d.clone());
            nets.push(a.clone());
        }
    }
    (kept, nets)
}

struct IbListener {
    tcp: Box<dyn Listener>,
    handle: Handle,
    dev: Arc<IbDevice>,
    ctx: ConnectContext,
    /// The TCP listener's endpoints are already striped verbs planes.
    planes: bool,
}

impl Listener for IbListener {
    fn handle(&self) -> Handle {
        self.handle.clone()
    }

    fn accept(&mut self, deadline: Instant) -> Result<(usize, Box<dyn Endpoint>)> {
        let (peer, side) = self.tcp.accept(deadline)?;
        if self.planes {
            return Ok((peer, side));
        }
        // `deadline` bounds the wait for a peer; set-up gets the communicator's timeout.
        let setup = Instant::now() + self.ctx.config.timeout;
        let ep = establish(&self.dev, &self.ctx, peer, side, setup)?;
        Ok((peer, ep))
    }
}
