//! The verbs [`Transport`]: listening and connecting.
//!
//! A listener is a TCP listener (the TCP transport's, so connections authenticate with the
//! communicator secret exactly as TCP ones do, and strangers are dropped without disturbing the
//! job); its address, wrapped in a versioned ib handle, is what peers get through the bootstrap.
//! Each accepted or opened TCP connection becomes the side channel over which the verbs
//! connection is set up ([`connect`](crate::connect)) and stays open as its liveness channel.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::config::Config;
use ccl_core::transport::tcp::{self, TcpTransport};
use ccl_core::transport::{
    ConnectContext, Endpoint, Handle, Listener, MemRegion, Transport, TransportProperties,
};
use ccl_core::{Error, Result};

use crate::connect::establish;
use crate::mr::UserMr;
use crate::port::IbDevice;
use crate::sysfs::SYSFS_ROOT;
use crate::wire;

/// The verbs (RoCE / InfiniBand) transport.
#[derive(Debug, Clone)]
pub struct IbTransport {
    dev: Arc<IbDevice>,
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
        Ok(IbTransport {
            dev: Arc::new(IbDevice::open_at(config, root)?),
            tcp: TcpTransport::new(),
            spin: config.ib.spin,
        })
    }

    /// The device in use.
    pub fn device(&self) -> &Arc<IbDevice> {
        &self.dev
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
        let addr = wire::decode_handle(handle).map_err(|e| e.rank(ctx.rank).peer(peer))?;
        let side = self
            .tcp
            .connect(ctx, peer, &tcp::encode_handle(addr), deadline)?;
        establish(&self.dev, ctx, peer, side, deadline)
    }

    /// One registration in the device's protection domain serves every connection of the
    /// communicator (they all share it).
    fn register(&self, mem: &[u8]) -> Result<Option<Box<dyn MemRegion>>> {
        if mem.is_empty() {
            return Ok(None);
        }
        let mr = UserMr::new(&self.dev.pd, mem).map_err(Error::from)?;
        Ok(Some(Box::new(mr)))
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
        // `deadline` bounds the wait for a peer; set-up gets the communicator's timeout.
        let setup = Instant::now() + self.ctx.config.timeout;
        let ep = establish(&self.dev, &self.ctx, peer, side, setup)?;
        Ok((peer, ep))
    }
}
