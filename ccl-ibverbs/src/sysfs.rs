//! Device, port and GID discovery from sysfs (`/sys/class/infiniband`), as pure functions of a
//! root directory so tests run over a fake tree.
//!
//! Layout read, per device `<dev>` and port `<p>`:
//! - `<root>/<dev>/ports/<p>/state` (`4: ACTIVE`), `link_layer` (`Ethernet`, `InfiniBand`)
//! - `<root>/<dev>/ports/<p>/gids/<i>` (`0000:0000:0000:0000:0000:ffff:c000:0201`)
//! - `<root>/<dev>/ports/<p>/gid_attrs/types/<i>` (`RoCE v2`, `IB/RoCE v1`; unreadable (EINVAL)
//!   for an empty entry)
//!
//! GID choice is the most common RoCE misconfiguration in NCCL's and Gloo's issue trackers: the
//! rule here prefers a RoCE v2 GID holding an IPv4-mapped address, then another routable RoCE v2
//! GID, then RoCE v1; link-local (`fe80::`) and zero GIDs are never chosen automatically.

use std::fs;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

/// The real sysfs root of verbs devices.
pub const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// GID table entries looked at: tables are long (rxe: 1024) but filled from the start.
pub const GID_SCAN_LIMIT: u32 = 128;
/// Consecutive empty entries after which the scan stops.
pub const GID_EMPTY_RUN: u32 = 8;

/// What kind of GID an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    RoceV2,
    /// `IB/RoCE v1`: an InfiniBand GID or a RoCE v1 one.
    IbRoceV1,
    Other,
}

/// One GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: [u8; 16],
    pub kind: GidType,
}

impl GidEntry {
    /// The GID as an IPv6 address (RoCE GIDs are IP addresses).
    pub fn addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.gid)
    }

    pub fn is_zero(&self) -> bool {
        self.gid == [0; 16]
    }

    pub fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && (self.gid[1] & 0xc0) == 0x80
    }

    pub fn is_ipv4_mapped(&self) -> bool {
        self.gid[..10] == [0; 10] && self.gid[10] == 0xff && self.gid[11] == 0xff
    }
}

/// One port of a device, as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortInfo {
    pub device: String,
    pub port: u8,
    pub active: bool,
    /// `Ethernet` (RoCE) or `InfiniBand`.
    pub link_layer: String,
}

impl PortInfo {
    pub fn is_roce(&self) -> bool {
        self.link_layer.eq_ignore_ascii_case("ethernet")
    }
}

fn read_trim(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Parses a sysfs GID (`xxxx:xxxx:...`, 8 groups of 4 hex digits).
pub fn parse_gid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        if g.is_empty() || g.len() > 4 {
            return None;
        }
        let v = u16::from_str_radix(g, 16).ok()?;
        out[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

fn parse_gid_type(s: &str) -> GidType {
    let t = s.trim().to_ascii_lowercase();
    if t == "roce v2" {
        GidType::RoceV2
    } else if t.contains("v1") || t == "ib" {
        GidType::IbRoceV1
    } else {
        GidType::Other
    }
}

/// Every device port under `root`, sorted by device name then port.
pub fn ports(root: &Path) -> Vec<PortInfo> {
    let mut out = Vec::new();
    let Ok(devs) = fs::read_dir(root) else {
        return out;
    };
    let mut names: Vec<String> = devs
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for dev in names {
        let Ok(ps) = fs::read_dir(root.join(&dev).join("ports")) else {
            continue;
        };
        let mut nums: Vec<u8> = ps
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        nums.sort();
        for p in nums {
            let dir = port_dir(root, &dev, p);
            let state = read_trim(&dir.join("state")).unwrap_or_default();
            out.push(PortInfo {
                device: dev.clone(),
                port: p,
                active: state.ends_with("ACTIVE") || state.starts_with('4'),
                link_layer: read_trim(&dir.join("link_layer")).unwrap_or_default(),
            });
        }
    }
    out
}

fn port_dir(root: &Path, dev: &str, port: u8) -> PathBuf {
    root.join(dev).join("ports").join(port.to_string())
}

/// Reads one GID entry; `None` when the entry is empty or unreadable.
pub fn read_gid(root: &Path, dev: &str, port: u8, index: u32) -> Option<GidEntry> {
    let dir = port_dir(root, dev, port);
    let gid = parse_gid(&read_trim(&dir.join("gids").join(index.to_string()))?)?;
    // Empty entries fail to read their type (EINVAL); a GID without a type is not usable.
    let kind = parse_gid_type(&read_trim(
        &dir.join("gid_attrs").join("types").join(index.to_string()),
    )?);
    let e = GidEntry { index, gid, kind };
    (!e.is_zero()).then_some(e)
}

/// The GID entries of a port, scanning from 0 until [`GID_SCAN_LIMIT`] or a run of
/// [`GID_EMPTY_RUN`] empty entries.
pub fn gid_table(root: &Path, dev: &str, port: u8) -> Vec<GidEntry> {
    let mut out = Vec::new();
    let mut empty = 0;
    for i in 0..GID_SCAN_LIMIT {
        match read_gid(root, dev, port, i) {
            Some(e) => {
                empty = 0;
                out.push(e);
            }
            None => {
                empty += 1;
                if empty >= GID_EMPTY_RUN {
                    break;
                }
            }
        }
    }
    out
}

/// How good an entry is for RoCE traffic (higher is better; `None` = never pick).
fn gid_rank(e: &GidEntry, roce: bool) -> Option<u8> {
    if e.is_zero() {
        return None;
    }
    if !roce {
        // InfiniBand: the port GID (index 0 normally) is the one.
        return Some(if e.kind == GidType::IbRoceV1 { 2 } else { 1 });
    }
    if e.is_link_local() {
        return None;
    }
    Some(match (e.kind, e.is_ipv4_mapped()) {
        (GidType::RoceV2, true) => 4,
        (GidType::RoceV2, false) => 3,
        (GidType::IbRoceV1, true) => 2,
        (GidType::IbRoceV1, false) => 1,
        (GidType::Other, _) => return None,
    })
}

/// Picks the GID to use from `table`: the best-ranked entry, the lowest index among equals.
pub fn pick_gid(table: &[GidEntry], roce: bool) -> Option<GidEntry> {
    table
        .iter()
        .filter_map(|e| gid_rank(e, roce).map(|r| (r, e)))
        .max_by(|(ra, a), (rb, b)| ra.cmp(rb).then(b.index.cmp(&a.index)))
        .map(|(_, e)| *e)
}

/// Chooses the GID of `dev`/`port`: `forced` (`CCL_IB_GID_INDEX`) when given, else
/// [`pick_gid`] over the table. The error says what was found.
pub fn choose_gid(
    root: &Path,
    dev: &str,
    port: u8,
    roce: bool,
    forced: Option<u32>,
) -> Result<GidEntry, String> {
    if let Some(i) = forced {
        return read_gid(root, dev, port, i).ok_or_else(|| {
            format!(
                "CCL_IB_GID_INDEX={i}: GID {i} of {dev} port {port} is empty or unreadable (see {})",
                port_dir(root, dev, port).join("gids").display()
            )
        });
    }
    let table = gid_table(root, dev, port);
    pick_gid(&table, roce).ok_or_else(|| {
        let seen: Vec<String> = table
            .iter()
            .map(|e| format!("{}: {} ({:?})", e.index, e.addr(), e.kind))
            .collect();
        format!(
            "no usable GID on {dev} port {port} (want RoCE v2, not link-local; found: {}); \
             does the network interface under it have an IP address? CCL_IB_GID_INDEX picks one by hand",
            if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join(", ")
            }
        )
    })
}

/// One element of a `CCL_IB_HCA` list: a device name (prefix, or exact with `=`) and an
/// optional port.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HcaItem {
    name: String,
    port: Option<u8>,
}

/// A parsed `CCL_IB_HCA` filter (NCCL's `NCCL_IB_HCA` syntax): `mlx5_0:1,rxe0` selects by name
/// prefix and optional port, a leading `=` makes every name exact, a leading `^` excludes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    items: Vec<HcaItem>,
}

impl HcaFilter {
    pub fn parse(spec: &str) -> Result<HcaFilter, String> {
        let mut s = spec.trim();
        let mut exclude = false;
        let mut exact = false;
        // NCCL accepts the two markers in either order.
        for _ in 0..2 {
            if let Some(r) = s.strip_prefix('^') {
                exclude = true;
                s = r;
            } else if let Some(r) = s.strip_prefix('=') {
                exact = true;
                s = r;
            }
        }
        let mut items = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let part = part.strip_prefix('=').unwrap_or(part);
            let (name, port) = match part.split_once(':') {
                Some((n, p)) => {
                    let port = p.trim().parse::<u8>().map_err(|_| {
                        format!("CCL_IB_HCA='{spec}': '{p}' in '{part}' is not a port number")
                    })?;
                    (n.trim(), Some(port))
                }
                None => (part, None),
            };
            if name.is_empty() {
                return Err(format!(
                    "CCL_IB_HCA='{spec}': empty device name in '{part}'"
                ));
            }
            items.push(HcaItem {
                name: name.to_string(),
                port,
            });
        }
        if items.is_empty() {
            return Err(format!("CCL_IB_HCA='{spec}' names no device"));
        }
        Ok(HcaFilter {
            exclude,
            exact,
            items,
        })
    }

    /// Whether `dev`/`port` passes the filter.
    pub fn matches(&self, dev: &str, port: u8) -> bool {
        let hit = self.items.iter().any(|it| {
            let name_ok = if self.exact {
                dev == it.name
            } else {
                dev.starts_with(&it.name)
            };
            name_ok && it.port.is_none_or(|p| p == port)
        });
        hit != self.exclude
    }
}

/// Ports usable by the transport under `root`, in preference order: active ones that pass
/// `filter`, RoCE before InfiniBand.
pub fn candidate_ports(root: &Path, filter: Option<&HcaFilter>) -> Vec<PortInfo> {
    let mut v: Vec<PortInfo> = ports(root)
        .into_iter()
        .filter(|p| p.active && filter.is_none_or(|f| f.matches(&p.device, p.port)))
        .collect();
    v.sort_by_key(|p| !p.is_roce());
    v
}

/// What `auto` checks: an active RoCE port with a usable GID exists (no verbs call made).
pub fn active_roce_port(root: &Path, filter: Option<&HcaFilter>, forced: Option<u32>) -> bool {
    candidate_ports(root, filter)
        .iter()
        .any(|p| p.is_roce() && choose_gid(root, &p.device, p.port, true, forced).is_ok())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A throw-away sysfs tree.
    pub(crate) struct FakeSysfs {
        pub root: PathBuf,
    }

    impl FakeSysfs {
        pub(crate) fn new() -> FakeSysfs {
            static N: AtomicUsize = AtomicUsize::new(0);
            let root = std::env::temp_dir().join(format!(
                "ccl-ib-sysfs-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            FakeSysfs { root }
        }

        pub(crate) fn port(&self, dev: &str, port: u8, state: &str, link: &str) -> &Self {
            let d = port_dir(&self.root, dev, port);
            fs::create_dir_all(d.join("gids")).unwrap();
            fs::create_dir_all(d.join("gid_attrs/types")).unwrap();
            fs::write(d.join("state"), format!("{state}\n")).unwrap();
            fs::write(d.join("link_layer"), format!("{link}\n")).unwrap();
            self
        }

        /// A GID entry; `kind` None leaves the type file out (an empty entry reads EINVAL).
        pub(crate) fn gid(
            &self,
            dev: &str,
            port: u8,
            i: u32,
            gid: &str,
            kind: Option<&str>,
        ) -> &Self {
            let d = port_dir(&self.root, dev, port);
            fs::write(d.join("gids").join(i.to_string()), format!("{gid}\n")).unwrap();
            if let Some(k) = kind {
                fs::write(
                    d.join("gid_attrs/types").join(i.to_string()),
                    format!("{k}\n"),
                )
                .unwrap();
            }
            self
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    pub(crate) const ZERO: &str = "0000:0000:0000:0000:0000:0000:0000:0000";
    pub(crate) const LINK_LOCAL: &str = "fe80:0000:0000:0000:b0a1:e2ff:fe33:4455";
    pub(crate) const V4_MAPPED: &str = "0000:0000:0000:0000:0000:ffff:c000:0201";
    pub(crate) const GLOBAL_V6: &str = "fd00:0000:0000:0000:0000:0000:0000:0009";

    /// rxe on Debian 12's 6.1 kernel: 0 link-local v2, 1 IPv4-mapped v2, the rest empty.
    pub(crate) fn rxe_like(fs: &FakeSysfs) {
        fs.port("rxe0", 1, "4: ACTIVE", "Ethernet")
            .gid("rxe0", 1, 0, LINK_LOCAL, Some("RoCE v2"))
            .gid("rxe0", 1, 1, V4_MAPPED, Some("RoCE v2"));
        for i in 2..1024 {
            fs.gid("rxe0", 1, i, ZERO, None);
        }
    }

    #[test]
    fn gid_parsing() {
        let g = parse_gid(V4_MAPPED).unwrap();
        assert_eq!(&g[10..], &[0xff, 0xff, 192, 0, 2, 1]);
        assert!(parse_gid("").is_none());
        assert!(parse_gid("0000:0000").is_none());
        assert!(parse_gid("zzzz:0000:0000:0000:0000:0000:0000:0000").is_none());
        assert!(parse_gid("00000:0000:0000:0000:0000:0000:0000:000").is_none());
    }

    #[test]
    fn picks_the_ipv4_mapped_roce_v2_gid_on_rxe() {
        let fs = FakeSysfs::new();
        rxe_like(&fs);
        let g = choose_gid(&fs.root, "rxe0", 1, true, None).unwrap();
        assert_eq!(g.index, 1);
        assert!(g.is_ipv4_mapped());
        assert_eq!(g.kind, GidType::RoceV2);
        // The scan stops after a short run of empty entries.
        assert_eq!(gid_table(&fs.root, "rxe0", 1).len(), 2);
        assert!(active_roce_port(&fs.root, None, None));
    }

    #[test]
    fn gid_preferences() {
        let fs = FakeSysfs::new();
        fs.port("mlx5_0", 1, "4: ACTIVE", "Ethernet")
            .gid("mlx5_0", 1, 0, LINK_LOCAL, Some("IB/RoCE v1"))
            .gid("mlx5_0", 1, 1, LINK_LOCAL, Some("RoCE v2"))
            .gid("mlx5_0", 1, 2, GLOBAL_V6, Some("IB/RoCE v1"))
            .gid("mlx5_0", 1, 3, GLOBAL_V6, Some("RoCE v2"))
            .gid("mlx5_0", 1, 4, V4_MAPPED, Some("IB/RoCE v1"))
            .gid("mlx5_0", 1, 5, V4_MAPPED, Some("RoCE v2"));
        assert_eq!(
            choose_gid(&fs.root, "mlx5_0", 1, true, None).unwrap().index,
            5
        );
        // Without the v4-mapped v2 entry: the global IPv6 v2 one.
        let t: Vec<GidEntry> = gid_table(&fs.root, "mlx5_0", 1)
            .into_iter()
            .filter(|e| e.index != 5)
            .collect();
        assert_eq!(pick_gid(&t, true).unwrap().index, 3);
        // Only link-local and zero: nothing.
        let t: Vec<GidEntry> = gid_table(&fs.root, "mlx5_0", 1)
            .into_iter()
            .filter(|e| e.index < 2)
            .collect();
        assert!(pick_gid(&t, true).is_none());
        // The override wins, even over a better entry.
        assert_eq!(
            choose_gid(&fs.root, "mlx5_0", 1, true, Some(2))
                .unwrap()
                .index,
            2
        );
        let e = choose_gid(&fs.root, "mlx5_0", 1, true, Some(9)).unwrap_err();
        assert!(e.contains("CCL_IB_GID_INDEX=9"), "{e}");
    }

    #[test]
    fn gaps_and_empty_tables() {
        let fs = FakeSysfs::new();
        fs.port("rxe1", 1, "4: ACTIVE", "Ethernet")
            .gid("rxe1", 1, 0, LINK_LOCAL, Some("RoCE v2"))
            .gid("rxe1", 1, 1, ZERO, None)
            .gid("rxe1", 1, 2, ZERO, Some("RoCE v2"))
            .gid("rxe1", 1, 3, V4_MAPPED, Some("RoCE v2"));
        // A short gap does not end the scan.
        assert_eq!(
            choose_gid(&fs.root, "rxe1", 1, true, None).unwrap().index,
            3
        );
        fs.port("rxe2", 1, "4: ACTIVE", "Ethernet")
            .gid("rxe2", 1, 0, LINK_LOCAL, Some("RoCE v2"));
        let e = choose_gid(&fs.root, "rxe2", 1, true, None).unwrap_err();
        assert!(e.contains("no usable GID on rxe2 port 1"), "{e}");
        assert!(e.contains("fe80::"), "{e}");
        // A GID beyond a long run of empty entries is not seen.
        fs.port("rxe3", 1, "4: ACTIVE", "Ethernet");
        fs.gid("rxe3", 1, 40, V4_MAPPED, Some("RoCE v2"));
        assert!(choose_gid(&fs.root, "rxe3", 1, true, None).is_err());
    }

    #[test]
    fn infiniband_ports_use_the_port_gid() {
        let fs = FakeSysfs::new();
        fs.port("mlx5_1", 1, "4: ACTIVE", "InfiniBand").gid(
            "mlx5_1",
            1,
            0,
            "fe80:0000:0000:0000:0002:c903:0000:1234",
            Some("IB/RoCE v1"),
        );
        assert_eq!(
            choose_gid(&fs.root, "mlx5_1", 1, false, None)
                .unwrap()
                .index,
            0
        );
        assert!(!active_roce_port(&fs.root, None, None));
    }

    #[test]
    fn ports_and_states() {
        let fs = FakeSysfs::new();
        rxe_like(&fs);
        fs.port("mlx5_0", 1, "1: DOWN", "Ethernet")
            .port("mlx5_0", 2, "4: ACTIVE", "InfiniBand")
            .gid("mlx5_0", 2, 0, GLOBAL_V6, Some("IB/RoCE v1"));
        let all = ports(&fs.root);
        assert_eq!(all.len(), 3);
        assert_eq!((all[0].device.as_str(), all[0].port), ("mlx5_0", 1));
        assert!(!all[0].active);
        let c = candidate_ports(&fs.root, None);
        // Active only, RoCE first.
        assert_eq!(
            c.iter()
                .map(|p| (p.device.as_str(), p.port))
                .collect::<Vec<_>>(),
            vec![("rxe0", 1), ("mlx5_0", 2)]
        );
        let f = HcaFilter::parse("mlx5").unwrap();
        assert_eq!(candidate_ports(&fs.root, Some(&f)).len(), 1);
        assert!(!active_roce_port(&fs.root, Some(&f), None));
        // No tree at all.
        assert!(ports(&fs.root.join("missing")).is_empty());
        assert!(!active_roce_port(&fs.root.join("missing"), None, None));
    }

    #[test]
    fn hca_filter_syntax() {
        let f = HcaFilter::parse("mlx5_0:1,rxe0").unwrap();
        assert!(f.matches("mlx5_0", 1));
        assert!(!f.matches("mlx5_0", 2));
        assert!(f.matches("rxe0", 1));
        assert!(f.matches("rxe0", 2));
        assert!(!f.matches("mlx5_1", 1));
        // Prefixes unless '='.
        let f = HcaFilter::parse("mlx5").unwrap();
        assert!(f.matches("mlx5_3", 1));
        let f = HcaFilter::parse("=mlx5").unwrap();
        assert!(!f.matches("mlx5_3", 1));
        let f = HcaFilter::parse("=mlx5_3").unwrap();
        assert!(f.matches("mlx5_3", 1));
        // Exclusion.
        let f = HcaFilter::parse("^mlx5_1,rxe").unwrap();
        assert!(f.matches("mlx5_0", 1));
        assert!(!f.matches("mlx5_1", 1));
        assert!(!f.matches("rxe0", 1));
        let f = HcaFilter::parse("^=mlx5_1:2").unwrap();
        assert!(f.matches("mlx5_1", 1));
        assert!(!f.matches("mlx5_1", 2));
        assert!(f.matches("mlx5_10", 2));
        // Errors.
        assert!(HcaFilter::parse("").is_err());
        assert!(HcaFilter::parse("^").is_err());
        assert!(HcaFilter::parse("mlx5_0:x").unwrap_err().contains("'x'"));
        assert!(HcaFilter::parse(":1").is_err());
    }
}
