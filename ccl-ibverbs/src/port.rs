//! The port a transport uses: which one (sysfs, `CCL_IB_HCA`, the GID), and opening it.
//!
//! Choosing reads sysfs only, so `auto` can ask whether verbs is usable ([`probe`]) without
//! opening anything. Opening takes the first candidate port that really works and keeps what
//! every connection of the transport shares: the device context, one protection domain, the
//! port's attributes and the GID.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use ccl_core::config::{Config, IbConfig};
use ccl_core::{Error, Result, ccl_info};

use crate::LOG_SUBSYS;
use crate::device::{Context, LINK_LAYER_ETHERNET, PortAttr, mtu_bytes};
use crate::pd::Pd;
use crate::sysfs::{self, GidEntry, HcaFilter, PortInfo, SYSFS_ROOT};

/// The opened port: context, protection domain, port attributes and GID. Shared by every
/// endpoint of the transport.
#[derive(Debug)]
pub struct IbDevice {
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

    /// The IP address of the port's network device, where its GID is one (RoCE).
    pub fn ip(&self) -> Option<IpAddr> {
        let g = self.gid;
        if self.port_attr.link_layer != LINK_LAYER_ETHERNET || g.is_zero() || g.is_link_local() {
            return None;
        }
        let v6 = g.addr();
        Some(match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        })
    }

    /// Opens the first usable port under the sysfs `root`: active, passing `CCL_IB_HCA`, RoCE
    /// before InfiniBand, with a usable GID. Fails with an error that says what was looked for
    /// and what was found.
    #[cfg(test)]
    pub(crate) fn open_at(config: &Config, root: &Path) -> Result<IbDevice> {
        let mut v = IbDevice::open_ports_at(config, root, 1)?;
        Ok(v.remove(0))
    }

    /// Opens up to `most` usable ports as [`open_at`](IbDevice::open_at) chooses them, in that
    /// order; ports that do not open are skipped (logged when another did). Fails when none
    /// opens.
    pub(crate) fn open_ports_at(
        config: &Config,
        root: &Path,
        most: usize,
    ) -> Result<Vec<IbDevice>> {
        let filter = filter_of(&config.ib)?;
        let cands = sysfs::candidate_ports(root, filter.as_ref());
        if cands.is_empty() {
            return Err(no_candidates(config, root));
        }
        let mut reasons = Vec::new();
        let mut opened = Vec::new();
        for p in &cands {
            if opened.len() == most {
                break;
            }
            match IbDevice::open_port(config, root, p) {
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
                    opened.push(dev);
                }
                Err(e) => reasons.push(format!("{}:{}: {}", p.device, p.port, e.message())),
            }
        }
        if opened.is_empty() {
            return Err(Error::invalid_usage(format!(
                "CCL_TRANSPORT=ib: no usable verbs device: {}",
                reasons.join("; ")
            )));
        }
        if !reasons.is_empty() && config.ib.hca.is_some() {
            ccl_core::ccl_warn!(
                None,
                "verbs transport: ports matching CCL_IB_HCA left out: {}",
                reasons.join("; ")
            );
        } else if !reasons.is_empty() {
            ccl_info!(
                None,
                "verbs transport: ports left out: {}",
                reasons.join("; ")
            );
        }
        Ok(opened)
    }

    fn open_port(config: &Config, root: &Path, p: &PortInfo) -> Result<IbDevice> {
        let (name, port, roce) = (p.device.as_str(), p.port, p.is_roce());
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
        Ok(IbDevice {
            pd: Pd::new(&ctx)?,
            ctx,
            port,
            port_attr,
            gid,
        })
    }
}

/// The error for "no port passes the filter": what was looked for, and every port there is.
fn no_candidates(config: &Config, root: &Path) -> Error {
    let what = match &config.ib.hca {
        Some(h) => format!(
            "an active port in {} matching CCL_IB_HCA='{h}'",
            root.display()
        ),
        None => format!("an active port in {}", root.display()),
    };
    let all = sysfs::ports(root);
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
    Error::invalid_usage(format!(
        "CCL_TRANSPORT=ib: no usable verbs device: looked for {what}; {found}"
    ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::tests::{FakeSysfs, rxe_like};
    use ccl_core::ErrorKind;

    #[test]
    fn no_device_is_a_clear_error() {
        let fs = FakeSysfs::new();
        let cfg = Config::default();
        let e = IbDevice::open_at(&cfg, &fs.root.join("none")).unwrap_err();
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
        let e = IbDevice::open_at(&cfg, &fs.root).unwrap_err();
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
            IbDevice::open_at(&cfg, &fs.root).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn a_port_without_a_gid_says_so() {
        let fs = FakeSysfs::new();
        fs.port("rxe9", 1, "4: ACTIVE", "Ethernet");
        let e = IbDevice::open_at(&Config::default(), &fs.root).unwrap_err();
        assert!(
            e.to_string().contains("no usable GID on rxe9 port 1"),
            "{e}"
        );
    }
}
