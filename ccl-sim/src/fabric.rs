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

mod network;
pub use network::Spot;

#[cfg(test)]
mod tests;
