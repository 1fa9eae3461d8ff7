//! Where ranks are: host, rack and zone of every rank.
//!
//! Algorithms use it to keep traffic local: a ring ordered by (zone, rack, host) crosses each
//! boundary as few times as possible, and hierarchical algorithms reduce inside a host before
//! crossing the network.

/// Location of every rank, as small integer ids per level (equal ids = same place).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    host: Vec<u32>,
    rack: Vec<u32>,
    zone: Vec<u32>,
}

fn ids<T: PartialEq + Clone>(keys: &[T]) -> Vec<u32> {
    let mut seen: Vec<T> = Vec::new();
    keys.iter()
        .map(|k| match seen.iter().position(|s| s == k) {
            Some(i) => i as u32,
            None => {
                seen.push(k.clone());
                (seen.len() - 1) as u32
            }
        })
        .collect()
}

impl Topology {
    /// Every rank on its own host, one rack, one zone.
    pub fn flat(n: usize) -> Topology {
        Topology {
            host: (0..n as u32).collect(),
            rack: vec![0; n],
            zone: vec![0; n],
        }
    }

    /// Ranks with equal host names share a host; one rack, one zone.
    pub fn from_hosts(hosts: &[String]) -> Topology {
        Topology {
            host: ids(hosts),
            rack: vec![0; hosts.len()],
            zone: vec![0; hosts.len()],
        }
    }

    /// From explicit (host, rack, zone) names per rank.
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
        }
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
        self.host.iter().max().map_or(0, |&m| m as usize + 1)
    }

    /// Ranks on `rank`'s host, in rank order.
    pub fn host_peers(&self, rank: usize) -> Vec<usize> {
        (0..self.size())
            .filter(|&r| self.host[r] == self.host[rank])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_group_ranks() {
        let t = Topology::from_hosts(&["a".into(), "b".into(), "a".into(), "c".into()]);
        assert_eq!(t.num_hosts(), 3);
        assert_eq!(t.host_peers(2), vec![0, 2]);
        assert_eq!(t.host(3), 2);
        let f = Topology::flat(3);
        assert_eq!(f.num_hosts(), 3);
        let p = Topology::from_places(&[
            ("h0".into(), "r0".into(), "z".into()),
            ("h1".into(), "r0".into(), "z".into()),
            ("h0".into(), "r1".into(), "z".into()),
        ]);
        // A host name is only unique within its rack.
        assert_eq!(p.num_hosts(), 3);
        assert_eq!(p.rack(2), 1);
    }
}
