//! Where ranks are: host, rack and zone of every rank, and how fast the links between them are.
//!
//! Algorithms use it to keep traffic local: a ring ordered by (zone, rack, host) crosses each
//! boundary as few times as possible ([`Topology::ring_order`]), and hierarchical algorithms
//! reduce inside a host before crossing the network. The cost model reads the link speeds.
//!
//! Hosts come from the host names the ranks report; racks, zones and link speeds from the file
//! named by `CCL_TOPO_FILE` ([`TopoFile`], format in `docs/topology.md`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::hash::Fnv1a;

/// Counts the cost model reads on every call, computed once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub hosts: usize,
    pub racks: usize,
    pub zones: usize,
    /// Fewest and most ranks on one host.
    pub min_per_host: usize,
    pub max_per_host: usize,
    /// Fewest and most ranks in one rack.
    pub min_per_rack: usize,
    pub max_per_rack: usize,
    /// Fewest and most ranks in one zone.
    pub min_per_zone: usize,
    pub max_per_zone: usize,
    /// Bytes per second of the slowest host link given.
    pub min_link: Option<u64>,
}

/// Location of every rank, as small integer ids per level (equal ids = same place), and the
/// link speeds the topology file gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    host: Vec<u32>,
    rack: Vec<u32>,
    zone: Vec<u32>,
    /// Bytes per second of each rank's host network link, if known.
    link: Vec<Option<u64>>,
    /// Bytes per second of a rack's uplink (shared by every flow leaving the rack), if known.
    rack_uplink: Option<u64>,
    /// Bytes per second of a zone's uplink (shared by every flow leaving the zone), if known.
    zone_uplink: Option<u64>,
    summary: Summary,
}

/// Numbers the distinct keys in order of first appearance. A map, not a scan of the keys seen:
/// a job with a rank per host has as many keys as ranks.
fn ids<T: Eq + std::hash::Hash>(keys: &[T]) -> Vec<u32> {
    let mut seen: std::collections::HashMap<&T, u32> = std::collections::HashMap::new();
    keys.iter()
        .map(|k| {
            let next = seen.len() as u32;
            *seen.entry(k).or_insert(next)
        })
        .collect()
}

fn count_distinct(v: &[u32]) -> usize {
    v.iter().max().map_or(0, |&m| m as usize + 1)
}

/// (groups, fewest members, most members) of the ids in `v`.
fn group_sizes(v: &[u32]) -> (usize, usize, usize) {
    let mut per = vec![0usize; count_distinct(v)];
    for &x in v {
        per[x as usize] += 1;
    }
    (
        per.len(),
        per.iter().copied().min().unwrap_or(0),
        per.iter().copied().max().unwrap_or(0),
    )
}

impl Topology {
    /// Every rank on its own host, one rack, one zone.
    pub fn flat(n: usize) -> Topology {
        Topology {
            host: (0..n as u32).collect(),
            rack: vec![0; n],
            zone: vec![0; n],
            link: vec![None; n],
            rack_uplink: None,
            zone_uplink: None,
            summary: Summary::default(),
        }
        .summarized()
    }

    /// Ranks with equal host names share a host; one rack, one zone.
    pub fn from_hosts(hosts: &[String]) -> Topology {
        Topology {
            host: ids(hosts),
            rack: vec![0; hosts.len()],
            zone: vec![0; hosts.len()],
            link: vec![None; hosts.len()],
            rack_uplink: None,
            zone_uplink: None,
            summary: Summary::default(),
        }
        .summarized()
    }

    /// From explicit (host, rack, zone) names per rank. A host name is only unique within its
    /// rack and a rack name within its zone.
    pub fn from_places(places: &[(String, String, String)]) -> Topology {
        let hosts: Vec<(String, String, String)> = places.to_vec();
        let racks: Vec<(String, String)> = places
            .iter()
            .map(|(_, r, z)| (r.clone(), z.clone()))
            .collect();
        let zones: Vec<String> = places.iter().map(|(_, _, z)| z.clone()).collect();
        Topology {
            host: ids(&hosts),
            rack: ids(&racks),
            zone: ids(&zones),
            link: vec![None; places.len()],
            rack_uplink: None,
            zone_uplink: None,
            summary: Summary::default(),
        }
        .summarized()
    }

    fn summarized(mut self) -> Topology {
        let (hosts, min_per_host, max_per_host) = group_sizes(&self.host);
        let (racks, min_per_rack, max_per_rack) = group_sizes(&self.rack);
        let (zones, min_per_zone, max_per_zone) = group_sizes(&self.zone);
        self.summary = Summary {
            hosts,
            racks,
            zones,
            min_per_host,
            max_per_host,
            min_per_rack,
            max_per_rack,
            min_per_zone,
            max_per_zone,
            min_link: self.link.iter().flatten().min().copied(),
        };
        self
    }

    /// Group counts and sizes.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// `zones x racks x hosts x ranks` ranks, numbered host by host: the shape tests and
    /// examples use (`grid(1, 2, 2, 2)` is 2 racks of 2 hosts of 2 ranks).
    pub fn grid(zones: usize, racks: usize, hosts: usize, ranks: usize) -> Topology {
        let mut places = Vec::new();
        for z in 0..zones {
            for r in 0..racks {
                for h in 0..hosts {
                    for _ in 0..ranks {
                        places.push((format!("h{h}"), format!("r{r}"), format!("z{z}")));
                    }
                }
            }
        }
        Topology::from_places(&places)
    }

    /// Sets the link speeds (bytes per second): every rank's host link, a rack's uplink and a
    /// zone's uplink.
    pub fn with_bandwidth(
        mut self,
        link: Option<f64>,
        rack_uplink: Option<f64>,
        zone_uplink: Option<f64>,
    ) -> Topology {
        let bps = |b: f64| b.max(1.0) as u64;
        self.link = vec![link.map(bps); self.size()];
        self.rack_uplink = rack_uplink.map(bps);
        self.zone_uplink = zone_uplink.map(bps);
        self.summarized()
    }

    /// The part of this topology that `members` (ranks here, in their new rank order) form:
    /// what a communicator split off this one sees.
    pub fn subset(&self, members: &[usize]) -> Topology {
        let key = |r: usize| (self.zone[r], self.rack[r], self.host[r]);
        let hosts: Vec<(u32, u32, u32)> = members.iter().map(|&r| key(r)).collect();
        let racks: Vec<(u32, u32)> = members
            .iter()
            .map(|&r| (self.zone[r], self.rack[r]))
            .collect();
        let zones: Vec<u32> = members.iter().map(|&r| self.zone[r]).collect();
        Topology {
            host: ids(&hosts),
            rack: ids(&racks),
            zone: ids(&zones),
            link: members.iter().map(|&r| self.link[r]).collect(),
            rack_uplink: self.rack_uplink,
            zone_uplink: self.zone_uplink,
            summary: Summary::default(),
        }
        .summarized()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.host.len()
    }

    pub fn host(&self, rank: usize) -> u32 {
        self.host[rank]
    }

    pub fn rack(&self, rank: usize) -> u32 {
        self.rack[rank]
    }

    pub fn zone(&self, rank: usize) -> u32 {
        self.zone[rank]
    }

    /// Number of distinct hosts.
    pub fn num_hosts(&self) -> usize {
        self.summary.hosts
    }

    /// Number of distinct racks.
    pub fn num_racks(&self) -> usize {
        self.summary.racks
    }

    /// Number of distinct zones.
    pub fn num_zones(&self) -> usize {
        self.summary.zones
    }

    /// Ranks on `rank`'s host, in rank order.
    pub fn host_peers(&self, rank: usize) -> Vec<usize> {
        (0..self.size())
            .filter(|&r| self.host[r] == self.host[rank])
            .collect()
    }

    /// Most ranks on one host.
    pub fn max_ranks_per_host(&self) -> usize {
        self.summary.max_per_host
    }

    /// Bytes per second of `rank`'s host network link, if the topology file gave it.
    pub fn link_bandwidth(&self, rank: usize) -> Option<f64> {
        self.link[rank].map(|b| b as f64)
    }

    /// Bytes per second of the slowest host link the topology file gave.
    pub fn min_link_bandwidth(&self) -> Option<f64> {
        self.summary.min_link.map(|b| b as f64)
    }

    /// Bytes per second of a rack's uplink, shared by every flow leaving the rack.
    pub fn rack_uplink(&self) -> Option<f64> {
        self.rack_uplink.map(|b| b as f64)
    }

    /// Bytes per second of a zone's uplink, shared by every flow leaving the zone.
    pub fn zone_uplink(&self) -> Option<f64> {
        self.zone_uplink.map(|b| b as f64)
    }

    /// The ranks in ring order: sorted by (zone, rack, host, rank), so that ring neighbours
    /// share a host where they can, then a rack, then a zone, and each host, rack and zone is
    /// entered and left once.
    pub fn ring_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.size()).collect();
        order.sort_by_key(|&r| (self.zone[r], self.rack[r], self.host[r], r));
        order
    }

    /// The hosts in ring order, each as its ranks in ring order (the first is the host's
    /// leader in hierarchical algorithms).
    pub fn host_groups(&self) -> Vec<Vec<usize>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for r in self.ring_order() {
            match groups.last_mut() {
                Some(g) if self.host[g[0]] == self.host[r] => g.push(r),
                _ => groups.push(vec![r]),
            }
        }
        groups
    }

    /// A fingerprint of everything that shapes schedules, so ranks can check they agree.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv1a::new();
        for r in 0..self.size() {
            h = h
                .word(self.host[r] as u64)
                .word(self.rack[r] as u64)
                .word(self.zone[r] as u64)
                .word(self.link[r].unwrap_or(0));
        }
        h.word(self.rack_uplink.unwrap_or(0))
            .word(self.zone_uplink.unwrap_or(0))
            .finish()
    }
}

/// Where a rank is, as written in a topology file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    /// `None`: the host name the rank reports.
    host: Option<String>,
    rack: String,
    zone: String,
    /// Bytes per second.
    link: Option<u64>,
    line: usize,
}

/// A parsed `CCL_TOPO_FILE` (format in `docs/topology.md`).
///
/// Lines, `#` starting a comment:
/// - `RANK HOST RACK ZONE [LINK_GBPS]`: where rank `RANK` is; `HOST` `-` means the host name the
///   rank reports.
/// - `host HOST RACK ZONE [LINK_GBPS]`: every rank reporting host name `HOST`.
/// - `rack-uplink GBPS`, `zone-uplink GBPS`: speed of each rack's (zone's) link to the rest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopoFile {
    /// Name for error messages.
    name: String,
    ranks: BTreeMap<usize, Place>,
    hosts: BTreeMap<String, Place>,
    rack_uplink: Option<u64>,
    zone_uplink: Option<u64>,
}

fn gbps(v: &str) -> Option<u64> {
    let g: f64 = v.parse().ok()?;
    (g.is_finite() && g > 0.0 && g < 1e7).then(|| (g * 1e9 / 8.0) as u64)
}

impl TopoFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<TopoFile> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_argument(format!(
                "CCL_TOPO_FILE: cannot read {}: {e}",
                path.display()
            ))
        })?;
        TopoFile::parse(&path.display().to_string(), &text)
    }

    /// Parses the text of a topology file; `name` appears in errors.
    pub fn parse(name: &str, text: &str) -> Result<TopoFile> {
        let mut f = TopoFile {
            name: name.to_string(),
            ..TopoFile::default()
        };
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let bad = |why: String| {
                Error::invalid_argument(format!(
                    "CCL_TOPO_FILE {name} line {line}: {why} (in '{}')",
                    raw.trim()
                ))
            };
            let t: Vec<&str> = raw
                .split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            let Some(&first) = t.first() else { continue };
            match first {
                "rack-uplink" | "zone-uplink" => {
                    let [_, v] = t[..] else {
                        return Err(bad(format!("expected '{first} GBPS'")));
                    };
                    let b =
                        gbps(v).ok_or_else(|| bad(format!("'{v}' is not a speed in Gbit/s")))?;
                    if first == "rack-uplink" {
                        f.rack_uplink = Some(b);
                    } else {
                        f.zone_uplink = Some(b);
                    }
                }
                _ => {
                    let (key, rest) = if first == "host" {
                        (None, &t[1..])
                    } else {
                        let r: usize = first.parse().map_err(|_| {
                            bad(format!(
                                "'{first}' is neither a rank nor 'host', 'rack-uplink', 'zone-uplink'"
                            ))
                        })?;
                        (Some(r), &t[1..])
                    };
                    if !(3..=4).contains(&rest.len()) {
                        return Err(bad("expected RANK|host HOST RACK ZONE [LINK_GBPS]".into()));
                    }
                    let link = match rest.get(3) {
                        Some(v) => Some(
                            gbps(v)
                                .ok_or_else(|| bad(format!("'{v}' is not a speed in Gbit/s")))?,
                        ),
                        None => None,
                    };
                    let host = (rest[0] != "-").then(|| rest[0].to_string());
                    let place = Place {
                        host: host.clone(),
                        rack: rest[1].to_string(),
                        zone: rest[2].to_string(),
                        link,
                        line,
                    };
                    match key {
                        Some(r) => {
                            if let Some(p) = f.ranks.insert(r, place) {
                                return Err(bad(format!("rank {r} is already on line {}", p.line)));
                            }
                        }
                        None => {
                            let h =
                                host.ok_or_else(|| bad("a host line needs a host name".into()))?;
                            if let Some(p) = f.hosts.insert(h.clone(), place) {
                                return Err(bad(format!("host {h} is already on line {}", p.line)));
                            }
                        }
                    }
                }
            }
        }
        Ok(f)
    }

    /// A fingerprint of the placements and speeds (not of comments, spacing or line numbers),
    /// so ranks can check they read the same file; never 0.
    pub fn fingerprint(&self) -> u64 {
        let mut canon = String::new();
        let place = |p: &Place| {
            format!(
                "{}|{}|{}|{}",
                p.host.as_deref().unwrap_or("-"),
                p.rack,
                p.zone,
                p.link.unwrap_or(0)
            )
        };
        for (r, p) in &self.ranks {
            canon.push_str(&format!("{r}:{};", place(p)));
        }
        for (h, p) in &self.hosts {
            canon.push_str(&format!("{h}={};", place(p)));
        }
        canon.push_str(&format!(
            "{}/{}",
            self.rack_uplink.unwrap_or(0),
            self.zone_uplink.unwrap_or(0)
        ));
        crate::hash::fnv1a(canon.as_bytes()).max(1)
    }

    /// The topology of a world whose ranks report host names `hosts`. Every rank must be
    /// placed, by a rank line or by a host line for its host name.
    pub fn resolve(&self, hosts: &[String]) -> Result<Topology> {
        let n = hosts.len();
        let name = &self.name;
        if let Some((&r, p)) = self.ranks.iter().find(|&(&r, _)| r >= n) {
            return Err(Error::invalid_argument(format!(
                "CCL_TOPO_FILE {name} line {}: rank {r} does not exist in a world of {n} ranks",
                p.line
            )));
        }
        let mut places = Vec::with_capacity(n);
        let mut link = Vec::with_capacity(n);
        for (r, reported) in hosts.iter().enumerate() {
            let p = self
                .ranks
                .get(&r)
                .or_else(|| self.hosts.get(reported))
                .ok_or_else(|| {
                    Error::invalid_argument(format!(
                        "CCL_TOPO_FILE {name} places neither rank {r} nor its host {reported} \
                         (a world of {n} ranks needs every rank placed)"
                    ))
                })?;
            let host = p.host.clone().unwrap_or_else(|| reported.clone());
            places.push((host, p.rack.clone(), p.zone.clone()));
            link.push(p.link);
        }
        let mut t = Topology::from_places(&places);
        t.link = link;
        t.rack_uplink = self.rack_uplink;
        t.zone_uplink = self.zone_uplink;
        Ok(t.summarized())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn hosts_group_ranks() {
        let t = Topology::from_hosts(&["a".into(), "b".into(), "a".into(), "c".into()]);
        assert_eq!(t.num_hosts(), 3);
        assert_eq!(t.host_peers(2), vec![0, 2]);
        assert_eq!(t.host(3), 2);
        assert_eq!(t.ring_order(), vec![0, 2, 1, 3]);
        assert_eq!(t.host_groups(), vec![vec![0, 2], vec![1], vec![3]]);
        let f = Topology::flat(3);
        assert_eq!(f.num_hosts(), 3);
        assert_eq!(f.ring_order(), vec![0, 1, 2]);
        let p = Topology::from_places(&[
            ("h0".into(), "r0".into(), "z".into()),
            ("h1".into(), "r0".into(), "z".into()),
            ("h0".into(), "r1".into(), "z".into()),
        ]);
        // A host name is only unique within its rack.
        assert_eq!(p.num_hosts(), 3);
        assert_eq!(p.rack(2), 1);
    }

    #[test]
    fn ring_order_keeps_neighbours_close() {
        // Ranks dealt round-robin over 2 zones x 2 racks x 2 hosts.
        let places: Vec<(String, String, String)> = (0..16)
            .map(|r| {
                (
                    format!("h{}", r % 2),
                    format!("r{}", (r / 2) % 2),
                    format!("z{}", (r / 4) % 2),
                )
            })
            .collect();
        let t = Topology::from_places(&places);
        let order = t.ring_order();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>());
        // Around the ring, the host changes 8 times, the rack 4 times, the zone twice: each
        // group is entered once.
        let changes = |f: &dyn Fn(usize) -> u32| {
            (0..16)
                .filter(|&i| f(order[i]) != f(order[(i + 1) % 16]))
                .count()
        };
        assert_eq!(changes(&|r| t.host(r)), 8);
        assert_eq!(changes(&|r| t.rack(r)), 4);
        assert_eq!(changes(&|r| t.zone(r)), 2);
        assert_eq!(t.host_groups().len(), 8);
        assert!(t.host_groups().iter().all(|g| g.len() == 2));
    }

    #[test]
    fn subsets_keep_places() {
        let t = Topology::grid(1, 2, 2, 2).with_bandwidth(Some(1e9), Some(2e9), None);
        // Every other rank: one rank on each of the 4 hosts, 2 racks.
        let s = t.subset(&[6, 4, 2, 0]);
        assert_eq!(s.size(), 4);
        assert_eq!((s.num_hosts(), s.num_racks(), s.num_zones()), (4, 2, 1));
        assert_eq!(s.ring_order(), vec![0, 1, 2, 3]);
        assert_eq!(s.rack(0), s.rack(1));
        assert_ne!(s.rack(1), s.rack(2));
        assert_eq!(s.link_bandwidth(1), Some(1e9));
        assert_eq!(s.rack_uplink(), Some(2e9));
        let s = t.subset(&[0, 1, 4]);
        assert_eq!(s.host_groups(), vec![vec![0, 1], vec![2]]);
        assert_eq!(t.subset(&(0..8).collect::<Vec<_>>()), t);
    }

    #[test]
    fn grid_shape() {
        let t = Topology::grid(1, 2, 2, 2);
        assert_eq!(t.size(), 8);
        assert_eq!((t.num_zones(), t.num_racks(), t.num_hosts()), (1, 2, 4));
        assert_eq!(t.ring_order(), (0..8).collect::<Vec<_>>());
        assert_eq!(t.max_ranks_per_host(), 2);
    }

    fn hosts(n: usize) -> Vec<String> {
        vec!["box".to_string(); n]
    }

    #[test]
    fn file_places_ranks() {
        let text = "\
# 2 racks x 2 hosts x 2 ranks
rack-uplink 50
0 h0 r0 z 100
1 h0 r0 z 100   # same host
2 h1 r0 z
3 h1 r0 z
4 h0 r1 z 25
5 h0 r1 z
6 - r1 z
7 - r1 z
";
        let f = TopoFile::parse("t.txt", text).unwrap();
        let t = f.resolve(&hosts(8)).unwrap();
        assert_eq!((t.num_zones(), t.num_racks(), t.num_hosts()), (1, 2, 4));
        assert_eq!(t.host_peers(6), vec![6, 7]);
        assert_eq!(t.link_bandwidth(0), Some(12.5e9));
        assert_eq!(t.link_bandwidth(2), None);
        assert_eq!(t.min_link_bandwidth(), Some(25e9 / 8.0));
        assert_eq!(t.rack_uplink(), Some(50e9 / 8.0));
        assert_eq!(t.zone_uplink(), None);
        assert_ne!(
            t.fingerprint(),
            Topology::from_hosts(&hosts(8)).fingerprint()
        );
    }

    #[test]
    fn file_host_lines() {
        let text = "host a r0 z\nhost b r1 z 10\n3 c r1 z\n";
        let f = TopoFile::parse("t", text).unwrap();
        let names: Vec<String> = ["a", "b", "a", "zzz"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let t = f.resolve(&names).unwrap();
        assert_eq!(t.num_racks(), 2);
        assert_eq!(t.host_peers(0), vec![0, 2]);
        assert_eq!(t.rack(3), t.rack(1));
        let f = TopoFile::parse("t", "host a r0 z\n").unwrap();
        let e = f.resolve(&["a".into(), "q".into()]).unwrap_err();
        assert!(e.to_string().contains("rank 1"), "{e}");
    }

    #[test]
    fn bad_files_name_file_and_line() {
        for (text, line, what) in [
            ("0 a r z\nx a r z\n", 2, "'x'"),
            ("0 a r z\n0 b r z\n", 2, "already on line 1"),
            ("\n\n0 a r\n", 3, "expected"),
            ("0 a r z fast\n", 1, "'fast'"),
            ("rack-uplink\n", 1, "rack-uplink GBPS"),
            ("zone-uplink -3\n", 1, "'-3'"),
            ("host - r z\n", 1, "host name"),
        ] {
            let e = TopoFile::parse("/etc/topo", text).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let m = e.to_string();
            assert!(m.contains(&format!("/etc/topo line {line}")), "{m}");
            assert!(m.contains(what), "{m}");
        }
        // Checked against the world size.
        let f = TopoFile::parse("/etc/topo", "0 a r z\n1 a r z\n5 b r z\n").unwrap();
        let e = f.resolve(&hosts(2)).unwrap_err();
        assert!(
            e.to_string().contains("line 3: rank 5 does not exist"),
            "{e}"
        );
        let f = TopoFile::parse("/etc/topo", "0 a r z\n1 a r z\n").unwrap();
        let e = f.resolve(&hosts(3)).unwrap_err();
        assert!(
            e.to_string().contains("/etc/topo places neither rank 2"),
            "{e}"
        );
        let e = TopoFile::read(Path::new("/nonexistent/topo")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/topo"), "{e}");
    }
}
