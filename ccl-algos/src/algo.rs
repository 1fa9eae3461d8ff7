//! Which algorithms implement which collective, what each costs, and the choice between them.
//!
//! The cost model is alpha-beta-gamma: `steps x latency + bytes on the wire per rank / link
//! bandwidth + bytes reduced per rank / reduction rate`, evaluated per algorithm; the cheapest
//! wins unless `CCL_ALGO` says otherwise.

use std::fmt;
use std::str::FromStr;

use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;

use crate::schedule::{Schedule, Shape};
use crate::{allgather, allreduce, alltoall, barrier, broadcast, reduce, reduce_scatter};

/// Declares an enum that travels on the wire as a number. One list gives every variant its fixed
/// id and its name, and from it come `ALL` (in id order), `id`, `from_id` and `name`, so no
/// variant can be missing from any of them. Ids are compared between ranks in operation headers:
/// never reuse or change one.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $id:literal => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $id, )+
        }

        impl $name {
            /// Every variant, in id order.
            pub const ALL: [$name; [$($id),+].len()] = [$($name::$variant),+];

            /// Its number in operation headers.
            pub const fn id(self) -> u8 {
                self as u8
            }

            /// The variant whose number is `id`, if any.
            pub const fn from_id(id: u8) -> Option<$name> {
                match id {
                    $( $id => Some($name::$variant), )+
                    _ => None,
                }
            }

            /// The name used by `CCL_ALGO`, logs and the benchmark.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        // Ids count 0, 1, 2, ... in the order listed, so `ALL[id]` is the variant of `id`.
        const _: () = {
            let mut i = 0;
            while i < $name::ALL.len() {
                assert!($name::ALL[i] as usize == i, "ids must be 0, 1, 2, ... in order");
                i += 1;
            }
        };
    };
}

wire_enum! {
    /// A collective operation.
    pub enum Collective {
        AllReduce = 0 => "allreduce",
        Broadcast = 1 => "broadcast",
        Reduce = 2 => "reduce",
        AllGather = 3 => "allgather",
        ReduceScatter = 4 => "reducescatter",
        AllToAll = 5 => "alltoall",
        Barrier = 6 => "barrier",
    }
}

impl Collective {
    /// Send and receive buffer lengths in elements for NCCL's `count` (per-rank count for
    /// allgather's input, reduce-scatter's output and alltoall's per-peer block).
    pub const fn buffer_lens(self, count: usize, n: usize) -> (usize, usize) {
        match self {
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (count, count),
            Collective::AllGather => (count, count * n),
            Collective::ReduceScatter => (count * n, count),
            Collective::AllToAll => (count * n, count * n),
            Collective::Barrier => (0, 0),
        }
    }

    /// The algorithms that implement this collective.
    pub fn algos(self) -> &'static [Algo] {
        match self {
            Collective::AllReduce => &[
                Algo::Ring,
                Algo::RecursiveDoubling,
                Algo::Tree,
                Algo::HalvingDoubling,
                Algo::Hierarchical,
            ],
            Collective::Broadcast | Collective::Reduce => &[Algo::Ring, Algo::Tree],
            Collective::AllGather | Collective::ReduceScatter => &[Algo::Ring, Algo::Pairwise],
            Collective::AllToAll => &[Algo::Pairwise],
            Collective::Barrier => &[Algo::RecursiveDoubling],
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;
    fn from_str(s: &str) -> Result<Collective, String> {
        let t = s.trim().to_ascii_lowercase().replace(['_', '-'], "");
        Collective::ALL
            .into_iter()
            .find(|c| c.name() == t)
            .ok_or_else(|| {
                let names: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "unknown collective '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

wire_enum! {
    /// An algorithm; which collectives it implements is [`Collective::algos`].
    pub enum Algo {
        /// Around a ring (a chain for rooted collectives): bandwidth-optimal, pipelined.
        Ring = 0 => "ring",
        /// `log2(n)` exchanges with partner `r ^ 2^k` (dissemination for the barrier):
        /// latency-optimal.
        RecursiveDoubling = 1 => "rd",
        /// Every rank sends straight to every other at once: one step.
        Pairwise = 2 => "pairwise",
        /// Binary trees: NCCL's double binary tree for allreduce, one tree from or to the root for
        /// broadcast and reduce. `log2(n)` latency, pipelined.
        Tree = 3 => "tree",
        /// Recursive halving, then recursive doubling (Rabenseifner): the ring's bytes in
        /// `2 log2(n)` steps.
        HalvingDoubling = 4 => "hd",
        /// Inside each host, then across hosts among one leader per host, then inside each host.
        Hierarchical = 5 => "hier",
    }
}

impl Algo {
    /// Other names `CCL_ALGO` accepts for it.
    const fn aliases(self) -> &'static [&'static str] {
        match self {
            Algo::Ring => &["chain"],
            Algo::RecursiveDoubling => &["recursive_doubling", "dissemination"],
            Algo::Pairwise => &["direct"],
            Algo::Tree => &["dbtree"],
            Algo::HalvingDoubling => &["halving_doubling", "rabenseifner"],
            Algo::Hierarchical => &["hierarchical"],
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Algo, String> {
        let t = s.trim().to_ascii_lowercase().replace('-', "_");
        Algo::ALL
            .into_iter()
            .find(|a| a.name() == t || a.aliases().contains(&t.as_str()))
            .ok_or_else(|| {
                let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
                format!(
                    "unknown algorithm '{s}' (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// Builds this rank's schedule of `algo` for `coll`, or says the pair does not exist.
pub fn build(
    coll: Collective,
    algo: Algo,
    shape: &Shape,
    topo: &Topology,
) -> Result<Schedule, String> {
    match (coll, algo) {
        (Collective::AllReduce, Algo::Ring) => Ok(allreduce::ring::build(shape, topo)),
        (Collective::AllReduce, Algo::RecursiveDoubling) => Ok(allreduce::rd::build(shape)),
        (Collective::Broadcast, Algo::Ring) => Ok(broadcast::ring::build(shape)),
        (Collective::Reduce, Algo::Ring) => Ok(reduce::ring::build(shape)),
        (Collective::AllGather, Algo::Ring) => Ok(allgather::ring(shape)),
        (Collective::AllGather, Algo::Pairwise) => Ok(allgather::pairwise(shape)),
        (Collective::ReduceScatter, Algo::Ring) => Ok(reduce_scatter::ring(shape)),
        (Collective::ReduceScatter, Algo::Pairwise) => Ok(reduce_scatter::pairwise(shape)),
        (Collective::AllToAll, Algo::Pairwise) => Ok(alltoall::pairwise(shape)),
        (Collective::Barrier, Algo::RecursiveDoubling) => Ok(barrier::dissemination(shape)),
        (Collective::AllReduce, Algo::Tree) => Ok(allreduce::tree::build(shape, topo)),
        (Collective::AllReduce, Algo::HalvingDoubling) => Ok(allreduce::hd::build(shape, topo)),
        (Collective::AllReduce, Algo::Hierarchical) => Ok(allreduce::hier::build(shape, topo)),
        (Collective::Broadcast, Algo::Tree) => Ok(broadcast::tree::build(shape, topo)),
        (Collective::Reduce, Algo::Tree) => Ok(reduce::tree::build(shape, topo)),
        _ => Err(format!("{coll} has no {algo} algorithm")),
    }
}

/// Bytes per second one core reduces (two operands in, one out) at sizes that leave the cache.
pub const REDUCE_RATE: f64 = 10.0e9;

fn log2_floor(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

/// Largest power of two `<= n` (`n >= 1`).
fn pow2_floor(n: usize) -> usize {
    1 << log2_floor(n.max(1))
}

/// What one algorithm puts on each kind of link, per byte of the buffer, and how many
/// latency-bound steps it takes.
#[derive(Clone, Copy, Debug, Default)]
struct Load {
    steps: f64,
    /// Sent by the busiest rank (over its own connections).
    link: f64,
    /// Leaving the busiest host (over its network link).
    host: f64,
    /// Leaving the busiest rack (over its uplink).
    rack: f64,
    /// Leaving the busiest zone.
    zone: f64,
    /// Reduced by the busiest rank.
    reduce: f64,
}

/// Seconds per byte of each kind of link (`None`: not a bottleneck).
struct Links {
    alpha: f64,
    rank: f64,
    host: Option<f64>,
    rack: Option<f64>,
    zone: Option<f64>,
    gamma: f64,
}

impl Links {
    /// Ranks of one host talk over the transport; traffic leaving a host also crosses the host's
    /// network link (the slowest one the topology names, else as fast as one transport
    /// connection, shared by the host's ranks); traffic leaving a rack or zone crosses its
    /// uplink when the topology gives one.
    fn new(t: &TransportProperties, topo: &Topology) -> Links {
        let sm = topo.summary();
        let host_bw = topo
            .min_link_bandwidth()
            .map_or(t.bandwidth, |b| b.min(t.bandwidth));
        Links {
            alpha: t.latency.as_secs_f64(),
            rank: 1.0 / t.bandwidth,
            host: (sm.hosts > 1).then_some(1.0 / host_bw),
            rack: (sm.racks > 1)
                .then(|| topo.rack_uplink().map(|b| 1.0 / b))
                .flatten(),
            zone: (sm.zones > 1)
                .then(|| topo.zone_uplink().map(|b| 1.0 / b))
                .flatten(),
            gamma: 1.0 / REDUCE_RATE,
        }
    }

    fn time(&self, l: &Load, bytes: f64) -> f64 {
        let wire = [
            Some(l.link * self.rank),
            self.host.map(|b| l.host * b),
            self.rack.map(|b| l.rack * b),
            self.zone.map(|b| l.zone * b),
        ]
        .into_iter()
        .flatten()
        .fold(0.0, f64::max);
        l.steps * self.alpha + bytes * (wire + l.reduce * self.gamma)
    }
}

/// Depth of the deeper tree of [`crate::tree::double_tree`] over `n` ranks.
fn double_tree_depth(n: usize) -> usize {
    match n {
        0 | 1 => 0,
        _ if n % 2 == 0 => 1 + log2_floor(n - 1),
        _ => log2_floor(n),
    }
}

/// Depth of [`crate::tree::Tree::rooted`] over `k` ranks.
fn rooted_depth(k: usize) -> usize {
    if k <= 1 { 0 } else { 1 + log2_floor(k - 1) }
}

/// The load of allreduce by `algo` over `n` ranks placed as `topo` says.
fn allreduce_load(algo: Algo, n: usize, topo: &Topology) -> Option<Load> {
    let sm = topo.summary();
    let nf = n as f64;
    Some(match algo {
        Algo::Pairwise => return None,
        Algo::Ring => {
            // Every rank sends 2(n-1)/n of the buffer to its successor; in topology order one
            // edge leaves each host, rack and zone.
            let f = 2.0 * (nf - 1.0) / nf;
            Load {
                steps: 2.0 * (nf - 1.0),
                link: f,
                host: f,
                rack: f,
                zone: f,
                reduce: f / 2.0,
            }
        }
        Algo::RecursiveDoubling => {
            let p = pow2_floor(n);
            let e = log2_floor(p) as f64;
            // Non-powers of two fold in and hand back: two more whole-buffer transfers.
            let x = if p == n { 0.0 } else { 2.0 };
            Load {
                steps: e + x,
                link: e + x,
                host: e + x,
                rack: e + x,
                zone: e + x,
                reduce: e + x / 2.0,
            }
        }
        Algo::Tree => {
            // A rank with two children in one tree sends half the buffer up and two halves
            // down there, and half up as a leaf of the other tree.
            let (link, reduce) = match n {
                2 => (1.0, 0.5),
                3 => (1.5, 1.0),
                _ => (2.0, 1.0),
            };
            Load {
                steps: 2.0 * double_tree_depth(n) as f64,
                link,
                host: link,
                rack: link,
                zone: link,
                reduce,
            }
        }
        Algo::HalvingDoubling => {
            let p = pow2_floor(n);
            let pf = p as f64;
            let folded = n - p;
            let x = if folded > 0 { 1.0 } else { 0.0 };
            // Exchanges at distance m carry 1/(2m) of the buffer each way, so a group of g
            // ranks (a power of two, aligned) sends 2(1 - g/p) of it out in both phases; the
            // fold moves whole buffers between its pairs.
            let out = |min: usize, max: usize| {
                let g = pow2_floor(min).min(p) as f64;
                2.0 * (1.0 - g / pf) * (max as f64 / g) + x * max.min(folded) as f64
            };
            Load {
                steps: 2.0 * log2_floor(p) as f64 + 2.0 * x,
                link: 2.0 * (pf - 1.0) / pf + x,
                host: out(sm.min_per_host, sm.max_per_host),
                rack: out(sm.min_per_rack, sm.max_per_rack),
                zone: out(sm.min_per_zone, sm.max_per_zone),
                reduce: (pf - 1.0) / pf + x,
            }
        }
        Algo::Hierarchical => {
            let h = sm.hosts as f64;
            let k = sm.max_per_host;
            let ring = if sm.hosts > 1 {
                2.0 * (h - 1.0) / h
            } else {
                0.0
            };
            // Inside a host: the leader has one child; members below have up to two, each
            // sending the buffer up once and down to every child.
            let (member_link, member_reduce) = match k {
                0..=2 => (1.0, 0.0),
                3 => (2.0, 1.0),
                _ => (3.0, 2.0),
            };
            let leader = if k > 1 { 1.0 } else { 0.0 };
            Load {
                steps: 2.0 * rooted_depth(k) as f64 + 2.0 * (h - 1.0),
                link: (leader + ring).max(if k > 1 { member_link } else { 0.0 }),
                host: ring,
                rack: ring,
                zone: ring,
                reduce: (leader + ring / 2.0).max(if k > 1 { member_reduce } else { 0.0 }),
            }
        }
    })
}

/// Estimated seconds of one `coll` by `algo` over `n` ranks of `bytes` (the nccl-tests size:
/// the buffer of allreduce/broadcast/reduce, the total of allgather/reduce-scatter/alltoall).
///
/// Alpha-beta-gamma with the topology: `steps x latency + bytes x (the busiest link's load /
/// its bandwidth) + bytes reduced / reduction rate`, where the links are each rank's transport
/// connections, each host's network link, and each rack's and zone's uplink (see `Links`).
pub fn cost(
    coll: Collective,
    algo: Algo,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    topo: &Topology,
) -> Option<f64> {
    if !coll.algos().contains(&algo) {
        return None;
    }
    if n <= 1 {
        return Some(0.0);
    }
    let links = Links::new(t, topo);
    let b = bytes as f64;
    let nf = n as f64;
    // Share of the nccl-tests size each rank sends in allgather and reduce-scatter.
    let share = (nf - 1.0) / nf;
    let load = match (coll, algo) {
        (Collective::AllReduce, a) => allreduce_load(a, n, topo)?,
        (Collective::Broadcast | Collective::Reduce, Algo::Tree) => {
            // The buffer flows once down (or up) a tree of depth log2(n) + 1; ranks with two
            // children send (or reduce) it twice.
            let two = if n >= 4 { 2.0 } else { 1.0 };
            Load {
                steps: rooted_depth(n) as f64,
                link: two,
                host: two,
                rack: two,
                zone: two,
                reduce: if coll == Collective::Reduce { two } else { 0.0 },
            }
        }
        (Collective::Broadcast | Collective::Reduce, Algo::Ring) => {
            // A chain: the buffer passes every rank once, pipelined.
            Load {
                steps: nf - 1.0,
                link: 1.0,
                host: 1.0,
                rack: 1.0,
                zone: 1.0,
                reduce: if coll == Collective::Reduce { 1.0 } else { 0.0 },
            }
        }
        (Collective::AllGather | Collective::ReduceScatter, Algo::Ring) => Load {
            steps: nf - 1.0,
            link: share,
            host: share,
            rack: share,
            zone: share,
            reduce: if coll == Collective::ReduceScatter {
                share
            } else {
                0.0
            },
        },
        // All messages leave at once: one latency plus a per-message cost, and the same bytes.
        // What leaves a group of k ranks is what its ranks send to the other n - k.
        (
            Collective::AllGather | Collective::AllToAll | Collective::ReduceScatter,
            Algo::Pairwise,
        ) => {
            let sm = topo.summary();
            let out = |k: usize| (k * (n - k.min(n))) as f64 / nf;
            Load {
                steps: 1.0 + 0.25 * (nf - 1.0),
                link: share,
                host: out(sm.max_per_host),
                rack: out(sm.max_per_rack),
                zone: out(sm.max_per_zone),
                reduce: if coll == Collective::ReduceScatter {
                    share
                } else {
                    0.0
                },
            }
        }
        (Collective::Barrier, Algo::RecursiveDoubling) => Load {
            steps: n.next_power_of_two().trailing_zeros() as f64,
            ..Load::default()
        },
        _ => return None,
    };
    Some(links.time(&load, b))
}

/// The cheapest algorithm for `coll` by [`cost`].
pub fn choose(
    coll: Collective,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    topo: &Topology,
) -> Algo {
    let mut best = coll.algos()[0];
    let mut best_cost = f64::INFINITY;
    for &a in coll.algos() {
        if let Some(c) = cost(coll, a, n, bytes, t, topo)
            && c < best_cost
        {
            best = a;
            best_cost = c;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// TCP between hosts as the TCP transport describes itself.
    fn tcp() -> TransportProperties {
        TransportProperties {
            latency: Duration::from_micros(5),
            bandwidth: 3.0e9,
        }
    }

    fn choice(topo: &Topology, bytes: usize) -> Algo {
        choose(Collective::AllReduce, topo.size(), bytes, &tcp(), topo)
    }

    /// The fixture: six ranks on six hosts. Small messages go to an algorithm with
    /// logarithmic latency, large ones to the bandwidth-optimal ring (halving-doubling pays for
    /// folding in the two ranks beyond the power of two; the trees send twice the buffer).
    #[test]
    fn small_messages_take_a_logarithmic_algorithm_and_large_ones_the_ring() {
        let topo = Topology::flat(6);
        for b in [8, 64, 1024] {
            let a = choice(&topo, b);
            assert!(
                matches!(
                    a,
                    Algo::RecursiveDoubling | Algo::Tree | Algo::HalvingDoubling
                ),
                "{b} B: {a}"
            );
        }
        for b in [16 << 10, 32 << 10, 64 << 10] {
            let a = choice(&topo, b);
            assert!(
                matches!(a, Algo::Tree | Algo::HalvingDoubling),
                "{b} B: {a}"
            );
        }
        for b in [4 << 20, 64 << 20, 1 << 30] {
            assert_eq!(choice(&topo, b), Algo::Ring, "{b} B");
        }
        // Cost grows with size, and a forced algorithm is always priced.
        for a in Collective::AllReduce.algos() {
            let t = |b| cost(Collective::AllReduce, *a, 6, b, &tcp(), &topo).unwrap();
            assert!(t(1 << 20) > t(1 << 10), "{a}");
        }
    }

    /// Hosts of three ranks behind network links slower than the transport: only leaders cross
    /// the network, so the hierarchical algorithm wins for large messages, and the intra-host
    /// part is charged at the transport's speed, not the network's.
    #[test]
    fn hierarchical_wins_behind_slow_host_links() {
        let slow = Topology::grid(1, 1, 3, 3).with_bandwidth(Some(1.0e9), None, None);
        assert_eq!(choice(&slow, 256 << 20), Algo::Hierarchical);
        // The same hosts with fast links: the network is no bottleneck, the ring wins.
        let fast = Topology::grid(1, 1, 3, 3).with_bandwidth(Some(100.0e9), None, None);
        assert_eq!(choice(&fast, 256 << 20), Algo::Ring);
        let c = |topo: &Topology| {
            cost(
                Collective::AllReduce,
                Algo::Hierarchical,
                9,
                1 << 28,
                &tcp(),
                topo,
            )
            .unwrap()
        };
        let r = |topo: &Topology| {
            cost(Collective::AllReduce, Algo::Ring, 9, 1 << 28, &tcp(), topo).unwrap()
        };
        // Slower host links cost the ring (every rank's data crosses them) more than the
        // hierarchical algorithm (only the leaders' ring does).
        assert!(r(&slow) / r(&fast) > c(&slow) / c(&fast));
    }

    /// A slow rack uplink: algorithms that cross it less win.
    #[test]
    fn rack_uplink_is_charged() {
        let topo = Topology::grid(1, 2, 2, 2);
        let slow = Topology::grid(1, 2, 2, 2).with_bandwidth(None, Some(0.1e9), None);
        for a in Collective::AllReduce.algos() {
            let c = |t: &Topology| cost(Collective::AllReduce, *a, 8, 1 << 26, &tcp(), t).unwrap();
            assert!(c(&slow) > 5.0 * c(&topo), "{a}");
        }
        // One host: no network link at all, so nothing is charged for it (the hierarchical
        // algorithm changes shape: one host is all tree).
        let one = Topology::from_hosts(&vec!["box".to_string(); 4]);
        let flat = Topology::flat(4).with_bandwidth(Some(1.0e9), None, None);
        for a in Collective::AllReduce
            .algos()
            .iter()
            .filter(|&&a| a != Algo::Hierarchical)
        {
            let c = |t: &Topology| cost(Collective::AllReduce, *a, 4, 1 << 20, &tcp(), t).unwrap();
            assert!(c(&one) <= c(&flat), "{a}");
        }
    }

    /// The depths the model charges are those of the trees the schedules use.
    #[test]
    fn model_depths_match_the_trees() {
        for n in 1..=200 {
            let order: Vec<usize> = (0..n).collect();
            let [a, b] = crate::tree::double_tree(&order, n);
            assert_eq!(double_tree_depth(n), a.depth().max(b.depth()), "n={n}");
            assert_eq!(
                rooted_depth(n),
                crate::tree::Tree::rooted(&order, n).depth(),
                "n={n}"
            );
        }
    }

    #[test]
    fn rooted_trees_are_priced() {
        for coll in [Collective::Broadcast, Collective::Reduce] {
            // Few steps win small buffers; the chain, which sends each byte once, large ones.
            let pick = |b| choose(coll, 16, b, &tcp(), &Topology::flat(16));
            assert_eq!(pick(1 << 10), Algo::Tree);
            assert_eq!(pick(64 << 20), Algo::Ring);
            let t = |n| cost(coll, Algo::Tree, n, 1 << 20, &tcp(), &Topology::flat(n)).unwrap();
            assert!(t(16) > t(2));
        }
    }
}
