//! A built network: where each rank sits, and the links a transfer crosses.

use super::*;

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
