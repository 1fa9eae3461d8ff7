//! The modelled fabric: hosts in racks in zones, a two-stage Clos per zone (rack switches under
//! spine switches) with aggregation switches between zones, link speeds and oversubscription
//! per tier, and the path every QP takes through it.
//!
//! Paths are chosen per QP and per tier by hashing the QP's 5-tuple (the UDP source port is the
//! one the verbs transport gives the QP: [`ccl_core::entropy::qp_udp_sport`]) with a per-switch seed, as ECMP does; [`Hashing::DestQp`] adds the
//! destination QP number to the hash (enhanced ECMP) and [`Hashing::Spray`] spreads every
//! connection evenly over all equal-cost paths (ideal per-packet spraying).
//!
//! The fabric file (`docs/scale.md`) sits beside a `CCL_TOPO_FILE`: the topology file says where
//! ranks are, the fabric file what connects them. Lines are `KEY VALUE`, `#` starts a comment.

use std::fmt;
use std::str::FromStr;

use ccl_core::entropy;
use serde::Serialize;

/// The index [`Fabric`]'s QP numbering gives a connection's control QP (data QPs are `0..qps`).
const CTRL_QP: usize = 0xFFFF;

/// How switches pick among equal-cost next hops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hashing {
    /// Hash of (source IP, destination IP, UDP source port, UDP destination port, protocol).
    Ecmp,
    /// The 5-tuple and the destination QP number (enhanced ECMP, hashing on the BTH field).
    DestQp,
    /// Every connection spread evenly over every equal-cost path.
    Spray,
}

impl FromStr for Hashing {
    type Err = String;
    fn from_str(s: &str) -> Result<Hashing, String> {
        match s {
            "ecmp" => Ok(Hashing::Ecmp),
            "dqp" | "dest-qp" | "eecmp" => Ok(Hashing::DestQp),
            "spray" => Ok(Hashing::Spray),
            _ => Err(format!(
                "unknown hashing '{s}' (expected ecmp, dqp or spray)"
            )),
        }
    }
}

impl fmt::Display for Hashing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hashing::Ecmp => "ecmp",
            Hashing::DestQp => "dqp",
            Hashing::Spray => "spray",
        })
    }
}

/// Which UDP source port the QPs of one connection use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ports {
    /// One per QP, as the verbs transport sets them: consecutive flow labels from a base drawn
    /// from the control QPs' numbers ([`ccl_core::entropy`]).
    PerQp,
    /// All QPs of a connection share the port of its first QP (a transport or device that gives
    /// a connection one flow label).
    PerConn,
}

impl FromStr for Ports {
    type Err = String;
    fn from_str(s: &str) -> Result<Ports, String> {
        match s {
            "per-qp" | "qp" => Ok(Ports::PerQp),
            "per-conn" | "conn" => Ok(Ports::PerConn),
            _ => Err(format!(
                "unknown port rule '{s}' (expected per-qp or per-conn)"
            )),
        }
    }
}

/// How ranks sit on the fabric and what the library is told about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// Ranks host by host, hosts rack by rack; the library's topology names racks and zones
    /// (a `CCL_TOPO_FILE`), so its rings and trees follow the fabric.
    Racks,
    /// Hosts land in racks in a seeded random order and the library knows host names only (no
    /// topology file): its ring order ignores racks.
    Scattered,
}

impl FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Placement, String> {
        match s {
            "racks" | "rack-aware" => Ok(Placement::Racks),
            "scattered" | "hosts-only" => Ok(Placement::Scattered),
            _ => Err(format!(
                "unknown placement '{s}' (expected racks or scattered)"
            )),
        }
    }
}

/// A 64-bit mixer (splitmix64's finalizer): deterministic, well spread.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Everything the simulator needs to know about the fabric and the job on it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fabric {
    pub ranks_per_host: usize,
    pub hosts_per_rack: usize,
    pub racks_per_zone: usize,
    pub zones: usize,
    /// NICs per host; rank `i` of a host uses NIC `i % nics`.
    pub nics_per_host: usize,
    /// Gbit/s of each NIC, each direction.
    pub nic_gbps: f64,
    /// Gbit/s between the ranks of one host (shared memory or loopback), shared by the host.
    pub host_gbps: f64,
    /// Spine switches per zone: each rack switch has one uplink to each.
    pub spines: usize,
    /// Gbit/s of one rack uplink.
    pub rack_uplink_gbps: f64,
    /// Aggregation switches between zones: each spine has one uplink to each.
    pub aggs: usize,
    /// Gbit/s of one spine uplink.
    pub zone_uplink_gbps: f64,
    /// Seconds per link crossed (wire and switch).
    pub hop_latency: f64,
    /// Seconds between ranks of one host.
    pub host_latency: f64,
    /// Seconds of software work per operation of a schedule (the executor and transport).
    pub op_overhead: f64,
    /// Bytes per second one rank reduces (incoming data combined with its own).
    pub reduce_bps: f64,
    /// Bytes per second one rank copies locally.
    pub copy_bps: f64,
    /// Most bytes per second one connection moves (a transport limit), if any.
    pub conn_bps: Option<f64>,
    /// Bytes a streamed send waits for before forwarding (`CCL_CHUNK_SIZE`).
    pub chunk: f64,
    /// QPs per connection between hosts (`CCL_IB_QPS_PER_CONN`).
    pub qps: usize,
    pub hashing: Hashing,
    pub ports: Ports,
    pub placement: Placement,
    /// Seeds QP numbers, switch hash seeds and scattered placement.
    pub seed: u64,
    /// Hosts whose NIC runs at a fraction of its speed: (host, fraction).
    pub slow_hosts: Vec<(usize, f64)>,
    /// A connection between hosts stripes over every NIC of the host (each a network plane,
    /// NIC `i` of one host to NIC `i` of the other), each NIC's share in proportion to its
    /// rate, as the TCP transport's planes share a transfer by the rate each delivers; without
    /// it rank `i` of a host uses NIC `i % nics` alone.
    pub stripe_nics: bool,
    /// NICs running at a fraction of their speed, 0 for a plane that is down (with
    /// `stripe_nics`): (host, NIC, fraction).
    pub slow_nics: Vec<(usize, usize, f64)>,
}

impl Default for Fabric {
    /// One zone of 16 racks of 16 hosts of 8 ranks at 400 Gbit/s, 1:1 at every tier.
    fn default() -> Fabric {
        Fabric {
            ranks_per_host: 8,
            hosts_per_rack: 16,
            racks_per_zone: 16,
            zones: 1,
            nics_per_host: 1,
            nic_gbps: 400.0,
            host_gbps: 800.0,
            spines: 16,
            rack_uplink_gbps: 400.0,
            aggs: 16,
            zone_uplink_gbps: 400.0,
            hop_latency: 1e-6,
            host_latency: 0.5e-6,
            op_overhead: 2e-6,
            reduce_bps: DEFAULT_REDUCE_BPS,
            copy_bps: 2.0 * DEFAULT_REDUCE_BPS,
            conn_bps: None,
            chunk: 131072.0,
            qps: 1,
            hashing: Hashing::Ecmp,
            ports: Ports::PerQp,
            placement: Placement::Racks,
            seed: 1,
            slow_hosts: Vec::new(),
            stripe_nics: false,
            slow_nics: Vec::new(),
        }
    }
}

/// Bytes per second one rank reduces by default: the library's cost model assumes 10 GB/s
/// (`REDUCE_RATE`), and `ccl-bench sim --measure-reduce` (f32 sum `reduce_inplace` on 16 MiB
/// operands, beyond L2) measured 9.5-13 GB/s on the project's 2-core VM under load.
pub const DEFAULT_REDUCE_BPS: f64 = 10.0e9;

/// A kind of link, for utilisation per tier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tier {
    /// Between the ranks of one host.
    Host,
    /// Host NIC to its rack switch.
    NicUp,
    /// Rack switch to a host NIC.
    NicDown,
    /// Rack switch to a spine.
    RackUp,
    /// Spine to a rack switch.
    RackDown,
    /// Spine to an aggregation switch.
    ZoneUp,
    /// Aggregation switch to a spine.
    ZoneDown,
    /// A rank's CPU reducing incoming data.
    Reduce,
}

impl Tier {
    pub const ALL: [Tier; 8] = [
        Tier::Host,
        Tier::NicUp,
        Tier::NicDown,
        Tier::RackUp,
        Tier::RackDown,
        Tier::ZoneUp,
        Tier::ZoneDown,
        Tier::Reduce,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Host => "host",
            Tier::NicUp => "nic-up",
            Tier::NicDown => "nic-down",
            Tier::RackUp => "rack-up",
            Tier::RackDown => "rack-down",
            Tier::ZoneUp => "zone-up",
            Tier::ZoneDown => "zone-down",
            Tier::Reduce => "reduce",
        }
    }
}

/// One connection's footprint: the links its QPs cross with the share of the connection's
/// bytes each carries, and its latency and narrowest capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Footprint {
    pub links: Vec<(u32, f64)>,
    /// Seconds from first byte out to first byte in.
    pub latency: f64,
    /// Bytes per second the connection could move alone.
    pub capacity: f64,
    /// The source port of each QP (empty between ranks of one host).
    pub ports: Vec<u16>,
}

/// The links of a fabric, numbered, and where each rank is.
#[derive(Clone, Debug)]
pub struct Network {
    pub fabric: Fabric,
    /// Bytes per second of each link.
    pub capacity: Vec<f64>,
    tiers: [(Tier, u32, u32); 8],
    /// Physical host of each logical host (scattered placement shuffles them).
    host_of: Vec<u32>,
    /// Seed of each switch's hash: rack switches, then spines, then aggregation switches.
    switch_seed: Vec<u64>,
}

fn gbps(g: f64) -> f64 {
    g * 1e9 / 8.0
}

impl Fabric {
    pub fn ranks(&self) -> usize {
        self.ranks_per_host * self.hosts()
    }

    pub fn hosts(&self) -> usize {
        self.hosts_per_rack * self.racks()
    }

    pub fn racks(&self) -> usize {
        self.racks_per_zone * self.zones
    }

    /// Capacity into a rack switch from its hosts over capacity out of it.
    pub fn rack_oversubscription(&self) -> f64 {
        (self.hosts_per_rack * self.nics_per_host) as f64 * self.nic_gbps
            / (self.spines as f64 * self.rack_uplink_gbps)
    }

    /// Capacity into a spine from its racks over capacity out of it.
    pub fn zone_oversubscription(&self) -> f64 {
        self.racks_per_zone as f64 * self.rack_uplink_gbps
            / (self.aggs as f64 * self.zone_uplink_gbps)
    }

    /// Sets the uplink speeds so that each tier is oversubscribed `rack:1` and `zone:1`.
    pub fn with_oversubscription(mut self, rack: f64, zone: f64) -> Fabric {
        self.rack_uplink_gbps = (self.hosts_per_rack * self.nics_per_host) as f64 * self.nic_gbps
            / (self.spines as f64 * rack);
        self.zone_uplink_gbps =
            self.racks_per_zone as f64 * self.rack_uplink_gbps / (self.aggs as f64 * zone);
        self
    }

    /// Checks that the numbers describe a fabric.
    pub fn check(&self) -> Result<(), String> {
        let counts = [
            ("ranks-per-host", self.ranks_per_host),
            ("hosts-per-rack", self.hosts_per_rack),
            ("racks-per-zone", self.racks_per_zone),
            ("zones", self.zones),
            ("nics-per-host", self.nics_per_host),
            ("spines", self.spines),
            ("aggs", self.aggs),
            ("qps", self.qps),
        ];
        for (k, v) in counts {
            if v == 0 {
                return Err(format!("{k} must be at least 1"));
            }
        }
        if self.ranks() > 1 << 24 {
            return Err(format!(
                "{} ranks is beyond what the simulator handles (16M)",
                self.ranks()
            ));
        }
        let speeds = [
            ("nic-gbps", self.nic_gbps),
            ("host-gbps", self.host_gbps),
            ("rack-uplink-gbps", self.rack_uplink_gbps),
            ("zone-uplink-gbps", self.zone_uplink_gbps),
            ("reduce-gbps", self.reduce_bps),
            ("copy-gbps", self.copy_bps),
            ("chunk", self.chunk),
        ];
        for (k, v) in speeds {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{k} must be a positive number, not {v}"));
            }
        }
        for (k, v) in [
            ("hop-latency-us", self.hop_latency),
            ("host-latency-us", self.host_latency),
            ("op-overhead-us", self.op_overhead),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{k} must be a number >= 0, not {v}"));
            }
        }
        if let Some(c) = self.conn_bps
            && !(c.is_finite() && c > 0.0)
        {
            return Err(format!("conn-gbps must be a positive number, not {c}"));
        }
        for &(h, f) in &self.slow_hosts {
            if h >= self.hosts() {
                return Err(format!(
                    "slow-host {h}: there are only {} hosts",
                    self.hosts()
                ));
            }
            if !(f.is_finite() && f > 0.0) {
                return Err(format!(
                    "slow-host {h}: the rate fraction must be positive, not {f}"
                ));
            }
        }
        for &(h, n, f) in &self.slow_nics {
            if h >= self.hosts() || n >= self.nics_per_host {
                return Err(format!(
                    "slow-nic {h} {n}: there are {} hosts of {} NICs",
                    self.hosts(),
                    self.nics_per_host
                ));
            }
            if !(f.is_finite() && (f > 0.0 || (f == 0.0 && self.stripe_nics))) {
                return Err(format!(
                    "slow-nic {h} {n}: the rate fraction must be positive (or 0, a plane down, \
                     with stripe-nics), not {f}"
                ));
            }
        }
        Ok(())
    }

    /// Parses a fabric file over the defaults; `name` appears in errors.
    pub fn parse(name: &str, text: &str) -> Result<Fabric, String> {
        let mut f = Fabric::default();
        let mut over: (Option<f64>, Option<f64>) = (None, None);
        for (i, raw) in text.lines().enumerate() {
            let t: Vec<&str> = raw
                .split('#')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            let Some(&key) = t.first() else { continue };
            let bad = |why: String| format!("{name} line {}: {why} (in '{}')", i + 1, raw.trim());
            let one = || -> Result<&str, String> {
                match t[..] {
                    [_, v] => Ok(v),
                    _ => Err(bad(format!("expected '{key} VALUE'"))),
                }
            };
            let num = |v: &str| -> Result<f64, String> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| bad(format!("'{v}' is not a number")))
            };
            let count = |v: &str| -> Result<usize, String> {
                v.parse::<usize>()
                    .map_err(|_| bad(format!("'{v}' is not a whole number")))
            };
            match key {
                "ranks-per-host" => f.ranks_per_host = count(one()?)?,
                "hosts-per-rack" => f.hosts_per_rack = count(one()?)?,
                "racks-per-zone" => f.racks_per_zone = count(one()?)?,
                "zones" => f.zones = count(one()?)?,
                "nics-per-host" => f.nics_per_host = count(one()?)?,
                "spines" => f.spines = count(one()?)?,
                "aggs" => f.aggs = count(one()?)?,
                "qps" => f.qps = count(one()?)?,
                "seed" => f.seed = count(one()?)? as u64,
                "nic-gbps" => f.nic_gbps = num(one()?)?,
                "host-gbps" => f.host_gbps = num(one()?)?,
                "rack-uplink-gbps" => f.rack_uplink_gbps = num(one()?)?,
                "zone-uplink-gbps" => f.zone_uplink_gbps = num(one()?)?,
                "rack-oversub" => over.0 = Some(num(one()?)?),
                "zone-oversub" => over.1 = Some(num(one()?)?),
                "hop-latency-us" => f.hop_latency = num(one()?)? * 1e-6,
                "host-latency-us" => f.host_latency = num(one()?)? * 1e-6,
                "op-overhead-us" => f.op_overhead = num(one()?)? * 1e-6,
                "reduce-gbps" => f.reduce_bps = gbps(num(one()?)?),
                "copy-gbps" => f.copy_bps = gbps(num(one()?)?),
                "conn-gbps" => f.conn_bps = Some(gbps(num(one()?)?)),
                "chunk" => f.chunk = num(one()?)?,
                "hashing" => f.hashing = one()?.parse().map_err(bad)?,
                "ports" => f.ports = one()?.parse().map_err(bad)?,
                "placement" => f.placement = one()?.parse().map_err(bad)?,
                "slow-host" => match t[..] {
                    [_, h, x] => f.slow_hosts.push((count(h)?, num(x)?)),
                    _ => return Err(bad("expected 'slow-host HOST FRACTION'".into())),
                },
                "stripe-nics" => f.stripe_nics = count(one()?)? != 0,
                "slow-nic" => match t[..] {
                    [_, h, n, x] => f.slow_nics.push((count(h)?, count(n)?, num(x)?)),
                    _ => return Err(bad("expected 'slow-nic HOST NIC FRACTION'".into())),
                },
                _ => return Err(bad(format!("unknown key '{key}'"))),
            }
        }
        if over.0.is_some() || over.1.is_some() {
            let (r, z) = (
                over.0.unwrap_or(f.rack_oversubscription()),
                over.1.unwrap_or(f.zone_oversubscription()),
            );
            if !(r > 0.0 && z > 0.0) {
                return Err(format!("{name}: oversubscription must be positive"));
            }
            f = f.with_oversubscription(r, z);
        }
        f.check().map_err(|e| format!("{name}: {e}"))?;
        Ok(f)
    }

    /// The fabric as a fabric file.
    pub fn to_file(&self) -> String {
        let mut s = String::new();
        let mut kv = |k: &str, v: String| {
            s.push_str(&format!("{k} {v}\n"));
        };
        kv("ranks-per-host", self.ranks_per_host.to_string());
        kv("hosts-per-rack", self.hosts_per_rack.to_string());
        kv("racks-per-zone", self.racks_per_zone.to_string());
        kv("zones", self.zones.to_string());
        kv("nics-per-host", self.nics_per_host.to_string());
        kv("nic-gbps", self.nic_gbps.to_string());
        kv("host-gbps", self.host_gbps.to_string());
        kv("spines", self.spines.to_string());
        kv("rack-uplink-gbps", self.rack_uplink_gbps.to_string());
        kv("aggs", self.aggs.to_string());
        kv("zone-uplink-gbps", self.zone_uplink_gbps.to_string());
        kv("hop-latency-us", (self.hop_latency * 1e6).to_string());
        kv("host-latency-us", (self.host_latency * 1e6).to_string());
        kv("op-overhead-us", (self.op_overhead * 1e6).to_string());
        kv("reduce-gbps", (self.reduce_bps * 8e-9).to_string());
        kv("copy-gbps", (self.copy_bps * 8e-9).to_string());
        if let Some(c) = self.conn_bps {
            kv("conn-gbps", (c * 8e-9).to_string());
        }
        kv("chunk", self.chunk.to_string());
        kv("qps", self.qps.to_string());
        kv("hashing", self.hashing.to_string());
        kv(
            "ports",
            match self.ports {
                Ports::PerQp => "per-qp".into(),
                Ports::PerConn => "per-conn".into(),
            },
        );
        kv(
            "placement",
            match self.placement {
                Placement::Racks => "racks".into(),
                Placement::Scattered => "scattered".into(),
            },
        );
        kv("seed", self.seed.to_string());
        if self.stripe_nics {
            kv("stripe-nics", "1".into());
        }
        for (h, n, x) in &self.slow_nics {
            kv("slow-nic", format!("{h} {n} {x}"));
        }
        for (h, x) in &self.slow_hosts {
            kv("slow-host", format!("{h} {x}"));
        }
        s
    }
}

/// Where a rank is on the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spot {
    /// Physical host, rack (global) and zone.
    pub host: usize,
    pub rack: usize,
    pub zone: usize,
    pub nic: usize,
}

impl Network {
    pub fn new(fabric: &Fabric) -> Result<Network, String> {
        fabric.check()?;
        let f = fabric.clone();
        let hosts = f.hosts();
        let nics = hosts * f.nics_per_host;
        let racks = f.racks();
        let sizes = [
            (Tier::Host, hosts),
            (Tier::NicUp, nics),
            (Tier::NicDown, nics),
            (Tier::RackUp, racks * f.spines),
            (Tier::RackDown, racks * f.spines),
            (Tier::ZoneUp, f.zones * f.spines * f.aggs),
            (Tier::ZoneDown, f.zones * f.spines * f.aggs),
            (Tier::Reduce, f.ranks()),
        ];
        let mut tiers = [(Tier::Host, 0u32, 0u32); 8];
        let mut capacity = Vec::new();
        for (i, &(t, k)) in sizes.iter().enumerate() {
            let bps = match t {
                Tier::Host => gbps(f.host_gbps),
                Tier::NicUp | Tier::NicDown => gbps(f.nic_gbps),
                Tier::RackUp | Tier::RackDown => gbps(f.rack_uplink_gbps),
                Tier::ZoneUp | Tier::ZoneDown => gbps(f.zone_uplink_gbps),
                Tier::Reduce => f.reduce_bps,
            };
            tiers[i] = (t, capacity.len() as u32, k as u32);
            capacity.extend(std::iter::repeat_n(bps, k));
        }
        for &(h, x) in &f.slow_hosts {
            for nic in 0..f.nics_per_host {
                for t in [Tier::NicUp, Tier::NicDown] {
                    let (_, base, _) = tiers[Tier::ALL.iter().position(|&y| y == t).expect("tier")];
                    capacity[(base as usize) + h * f.nics_per_host + nic] *= x;
                }
            }
        }
        for &(h, nic, x) in &f.slow_nics {
            for t in [Tier::NicUp, Tier::NicDown] {
                let (_, base, _) = tiers[Tier::ALL.iter().position(|&y| y == t).expect("tier")];
                capacity[(base as usize) + h * f.nics_per_host + nic] *= x;
            }
        }
        let mut host_of: Vec<u32> = (0..hosts as u32).collect();
        if f.placement == Placement::Scattered {
            // Fisher-Yates with the seeded mixer.
            for i in (1..hosts).rev() {
                let j = (mix(f.seed ^ 0x5CA7_7E2E ^ (i as u64) << 20) % (i as u64 + 1)) as usize;
                host_of.swap(i, j);
            }
        }
        let switches = racks + f.zones * f.spines + f.aggs;
        let switch_seed = (0..switches as u64)
            .map(|s| mix(f.seed.wrapping_mul(0x1000_0000_01B3) ^ s))
            .collect();
        Ok(Network {
            fabric: f,
            capacity,
            tiers,
            host_of,
            switch_seed,
        })
    }

    fn base(&self, t: Tier) -> usize {
        self.tiers[Tier::ALL.iter().position(|&x| x == t).expect("tier")].1 as usize
    }

    /// The tier a link belongs to and its index within the tier.
    pub fn tier_of(&self, link: u32) -> (Tier, u32) {
        for &(t, base, k) in self.tiers.iter().rev() {
            if link >= base && link < base + k {
                return (t, link - base);
            }
        }
        unreachable!("link {link} out of range")
    }

    /// The range of link ids of a tier.
    pub fn tier_links(&self, t: Tier) -> std::ops::Range<usize> {
        let (_, base, k) = self.tiers[Tier::ALL.iter().position(|&x| x == t).expect("tier")];
        base as usize..(base + k) as usize
    }

    /// A readable name for a link: `rack-up r3->s7`.
    pub fn link_name(&self, link: u32) -> String {
        let f = &self.fabric;
        let (t, i) = self.tier_of(link);
        let i = i as usize;
        match t {
            Tier::Host => format!("host h{i}"),
            Tier::NicUp => format!(
                "nic-up h{}.{}->rack",
                i / f.nics_per_host,
                i % f.nics_per_host
            ),
            Tier::NicDown => format!(
                "nic-down rack->h{}.{}",
                i / f.nics_per_host,
                i % f.nics_per_host
            ),
            Tier::RackUp => format!("rack-up r{}->s{}", i / f.spines, i % f.spines),
            Tier::RackDown => format!("rack-down s{}->r{}", i % f.spines, i / f.spines),
            Tier::ZoneUp => {
                let (zs, a) = (i / f.aggs, i % f.aggs);
                format!("zone-up z{}s{}->a{a}", zs / f.spines, zs % f.spines)
            }
            Tier::ZoneDown => {
                let (zs, a) = (i / f.aggs, i % f.aggs);
                format!("zone-down a{a}->z{}s{}", zs / f.spines, zs % f.spines)
            }
            Tier::Reduce => format!("reduce rank {i}"),
        }
    }

    pub fn spot(&self, rank: usize) -> Spot {
        let f = &self.fabric;
        let host = self.host_of[rank / f.ranks_per_host] as usize;
        let rack = host / f.hosts_per_rack;
        Spot {
            host,
            rack,
            zone: rack / f.racks_per_zone,
            nic: (rank % f.ranks_per_host) % f.nics_per_host,
        }
    }

    /// The CPU "link" a rank reduces incoming data on.
    pub fn reduce_link(&self, rank: usize) -> u32 {
        (self.base(Tier::Reduce) + rank) as u32
    }

    fn ip(&self, s: &Spot) -> u64 {
        ((s.host as u64) << 8) | s.nic as u64
    }

    /// QP number of data QP `i` (or [`CTRL_QP`]) of the connection `src -> dst` at `src`'s end (seeded, as a device
    /// hands them out: unpredictable to the application).
    fn qpn(&self, src: usize, dst: usize, i: usize) -> u32 {
        (mix(self.fabric.seed ^ ((src as u64) << 40) ^ ((dst as u64) << 16) ^ i as u64) & 0xFF_FFFF)
            as u32
    }

    /// The NICs a connection between hosts `a` and `b` uses, with the share of its bytes each
    /// carries: its own NIC, or with `stripe_nics` every plane in proportion to the lesser of
    /// its two ends' rates (a plane down carries nothing).
    fn nic_shares(&self, a: &Spot, b: &Spot) -> Vec<(usize, f64)> {
        let f = &self.fabric;
        if !f.stripe_nics {
            return vec![(a.nic, 1.0)];
        }
        let rate = |nic: usize| {
            let up = self.capacity[self.base(Tier::NicUp) + a.host * f.nics_per_host + nic];
            let down = self.capacity[self.base(Tier::NicDown) + b.host * f.nics_per_host + nic];
            up.min(down)
        };
        let total: f64 = (0..f.nics_per_host).map(rate).sum();
        if total == 0.0 {
            // Every plane down: the connection has nothing left (its time is infinite).
            return vec![(a.nic, 1.0)];
        }
        (0..f.nics_per_host)
            .filter(|&n| rate(n) > 0.0)
            .map(|n| (n, rate(n) / total))
            .collect()
    }

    /// The links of connection `src -> dst` and the share of its bytes each carries.
    // Long: the path of every QP at every tier, and spraying's spread over all of them, for the
    // three kinds of connection (same rack, same zone, across zones), then merged.
    pub fn footprint(&self, src: usize, dst: usize) -> Footprint {
        let f = &self.fabric;
        let (a, b) = (self.spot(src), self.spot(dst));
        if a.host == b.host {
            return Footprint {
                links: vec![((self.base(Tier::Host) + a.host) as u32, 1.0)],
                latency: f.host_latency,
                capacity: gbps(f.host_gbps).min(f.conn_bps.unwrap_or(f64::INFINITY)),
                ports: Vec::new(),
            };
        }
        let q = f.qps;
        let share = 1.0 / q as f64;
        let mut links: Vec<(u32, f64)> = Vec::with_capacity(2 * f.nics_per_host + 4 * q);
        for (nic, w) in self.nic_shares(&a, &b) {
            let up = (self.base(Tier::NicUp) + a.host * f.nics_per_host + nic) as u32;
            let down = (self.base(Tier::NicDown) + b.host * f.nics_per_host + nic) as u32;
            links.push((up, w));
            links.push((down, w));
        }
        let hops = if a.rack == b.rack {
            2
        } else if a.zone == b.zone {
            4
        } else {
            6
        };
        let mut ports = Vec::with_capacity(q);
        let rack_up = self.base(Tier::RackUp);
        let rack_down = self.base(Tier::RackDown);
        let zone_up = self.base(Tier::ZoneUp);
        let zone_down = self.base(Tier::ZoneDown);
        let (s, ag) = (f.spines, f.aggs);
        let add = |links: &mut Vec<(u32, f64)>, spine: usize, agg: usize, spine2: usize, w| {
            if a.rack == b.rack {
                return;
            }
            links.push(((rack_up + a.rack * s + spine) as u32, w));
            if a.zone == b.zone {
                links.push(((rack_down + b.rack * s + spine) as u32, w));
            } else {
                links.push(((zone_up + (a.zone * s + spine) * ag + agg) as u32, w));
                links.push(((zone_down + (b.zone * s + spine2) * ag + agg) as u32, w));
                links.push(((rack_down + b.rack * s + spine2) as u32, w));
            }
        };
        let base = entropy::conn_base(self.qpn(src, dst, CTRL_QP), self.qpn(dst, src, CTRL_QP));
        for i in 0..q {
            let rq = self.qpn(dst, src, i);
            // Data QP `i` is the transport's QP `1 + i` (its QP 0 carries credits).
            let port = match f.ports {
                Ports::PerQp => entropy::qp_udp_sport(base, 1 + i),
                Ports::PerConn => entropy::qp_udp_sport(base, 1),
            };
            ports.push(port);
            if f.hashing == Hashing::Spray {
                continue;
            }
            let mut key = mix(self.ip(&a))
                ^ mix(self.ip(&b) << 1)
                ^ mix(((port as u64) << 16 | entropy::ROCE_V2_DPORT as u64) << 8 | 17);
            if f.hashing == Hashing::DestQp {
                key ^= mix(0xD0_0000_0000 | rq as u64);
            }
            let pick =
                |switch: usize, n: usize| (mix(key ^ self.switch_seed[switch]) % n as u64) as usize;
            let racks = f.racks();
            let spine = pick(a.rack, s);
            let agg = pick(racks + a.zone * s + spine, ag);
            let spine2 = pick(racks + f.zones * s + agg, s);
            add(&mut links, spine, agg, spine2, share);
        }
        if f.hashing == Hashing::Spray && a.rack != b.rack {
            let w = 1.0 / s as f64;
            if a.zone == b.zone {
                for sp in 0..s {
                    add(&mut links, sp, 0, 0, w);
                }
            } else {
                // Every (spine, agg, spine) path equally: each link gets its share.
                let wa = 1.0 / (s * ag) as f64;
                for sp in 0..s {
                    links.push(((rack_up + a.rack * s + sp) as u32, w));
                    links.push(((rack_down + b.rack * s + sp) as u32, w));
                    for g in 0..ag {
                        links.push(((zone_up + (a.zone * s + sp) * ag + g) as u32, wa));
                        links.push(((zone_down + (b.zone * s + sp) * ag + g) as u32, wa));
                    }
                }
            }
        }
        // Merge QPs that share a link.
        links.sort_unstable_by_key(|l| l.0);
        let mut merged: Vec<(u32, f64)> = Vec::with_capacity(links.len());
        for (l, w) in links {
            match merged.last_mut() {
                Some(m) if m.0 == l => m.1 += w,
                _ => merged.push((l, w)),
            }
        }
        let capacity = merged
            .iter()
            .map(|&(l, w)| self.capacity[l as usize] / w)
            .fold(f.conn_bps.unwrap_or(f64::INFINITY), f64::min);
        Footprint {
            links: merged,
            latency: hops as f64 * f.hop_latency,
            capacity,
            ports,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecmp_is_deterministic_with_a_seed_and_qps_spread() {
        let mut f = Fabric {
            qps: 8,
            ..Fabric::default()
        };
        let n = Network::new(&f).unwrap();
        let a = n.footprint(0, 8 * 16 * 5);
        assert_eq!(a, Network::new(&f).unwrap().footprint(0, 8 * 16 * 5));
        assert_eq!(a.ports.len(), 8);
        let distinct: std::collections::BTreeSet<u16> = a.ports.iter().copied().collect();
        assert!(distinct.len() > 1, "{:?}", a.ports);
        // Shares on each tier add up to the whole connection.
        for t in [Tier::NicUp, Tier::RackUp, Tier::RackDown, Tier::NicDown] {
            let r = n.tier_links(t);
            let sum: f64 = a
                .links
                .iter()
                .filter(|l| r.contains(&(l.0 as usize)))
                .map(|l| l.1)
                .sum();
            assert!((sum - 1.0).abs() < 1e-12, "{t:?} {sum}");
        }
        // Another seed, other paths somewhere.
        f.seed = 2;
        let m = Network::new(&f).unwrap();
        let differs =
            (1..64).any(|h| n.footprint(0, 128 * h % 2048) != m.footprint(0, 128 * h % 2048));
        assert!(differs);
        // One port per connection: every QP on one path.
        f.ports = Ports::PerConn;
        let c = Network::new(&f).unwrap().footprint(0, 8 * 16 * 5);
        assert_eq!(c.links.len(), 4);
        assert!(c.links.iter().all(|l| (l.1 - 1.0).abs() < 1e-12));
    }

    #[test]
    fn fabric_files_parse_and_name_bad_lines() {
        let f = Fabric::parse(
            "fab",
            "hosts-per-rack 4 # four\nspines 2\nrack-oversub 2\nhashing dqp\nslow-host 3 0.5\n",
        )
        .unwrap();
        assert_eq!(f.hosts_per_rack, 4);
        assert!((f.rack_oversubscription() - 2.0).abs() < 1e-9);
        assert_eq!(f.hashing, Hashing::DestQp);
        assert_eq!(Fabric::parse("x", &f.to_file()).unwrap(), f);
        for (text, want) in [
            ("spines 0\n", "spines must be at least 1"),
            ("nic-gbps fast\n", "line 1: 'fast' is not a number"),
            ("\nbogus 1\n", "line 2: unknown key 'bogus'"),
            ("hashing magic\n", "unknown hashing 'magic'"),
            ("slow-host 99999 0.5\n", "slow-host 99999"),
            ("qps\n", "expected 'qps VALUE'"),
        ] {
            let e = Fabric::parse("fab", text).unwrap_err();
            assert!(e.contains(want), "{e}");
            assert!(e.starts_with("fab"), "{e}");
        }
    }
}
