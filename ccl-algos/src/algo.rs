//! The collectives and algorithms, which collective has which algorithm, how each is built and
//! what each costs, and the choice between them.
//!
//! [`implementation`] is the one table of (collective, algorithm) pairs. The cost model
//! ([`crate::cost`]) is alpha-beta-gamma: `steps x latency + bytes on the wire per rank / link
//! bandwidth + bytes reduced per rank / reduction rate`, evaluated per algorithm; the cheapest
//! wins unless `CCL_ALGO` says otherwise.

use std::fmt;
use std::str::FromStr;

use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;

use crate::cost::{self, LinkCosts, Load};
use crate::schedule::{Schedule, Shape};
use crate::vcoll::{self, VShape};
use crate::{allgather, allreduce, alltoall, barrier, broadcast, host, reduce, reduce_scatter};

pub use crate::collective::{BufferLens, Collective, LenError};

impl FromStr for Collective {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Collective, AlgoError> {
        let t = s.trim().to_ascii_lowercase().replace(['_', '-'], "");
        Collective::ALL
            .into_iter()
            .find(|c| c.name() == t)
            .ok_or_else(|| AlgoError::UnknownCollective(s.to_string()))
    }
}

impl Collective {
    /// The algorithms that implement this collective, in [`Algo::ALL`] order (from
    /// [`implementation`]).
    pub fn algos(self) -> &'static [Algo] {
        let (list, len) = &ALGOS[self.id() as usize];
        &list[..*len]
    }
}

/// A collective or algorithm that does not exist, or a pair that is not offered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlgoError {
    #[error("unknown collective '{0}' (expected one of {list})", list = names(Collective::ALL.iter().map(|c| c.name())))]
    UnknownCollective(String),
    #[error("unknown algorithm '{0}' (expected one of {list})", list = names(Algo::ALL.iter().map(|a| a.name())))]
    UnknownAlgorithm(String),
    #[error("{coll} has no {algo} algorithm (it has {list})", list = names(coll.algos().iter().map(|a| a.name())))]
    NotOffered { coll: Collective, algo: Algo },
    #[error("no collective has a {0} algorithm")]
    NoCollectiveHas(Algo),
    /// A schedule asked for with one count where the collective takes counts per rank, or
    /// the other way round.
    #[error("{coll} takes {}", if *per_rank { "a count per rank" } else { "one count" })]
    Counts { coll: Collective, per_rank: bool },
    #[error("{coll} asked for with the counts of {shape}")]
    ShapeOf { coll: Collective, shape: Collective },
    #[error("'{0}' is not collective:algorithm")]
    NotAPair(String),
    #[error(
        "{coll}: the shm algorithm needs every rank on one host, connected by shared memory (not disabled by CCL_SHM_DISABLE or CCL_TRANSPORT)"
    )]
    NoHostMemory { coll: Collective },
    #[error(
        "{coll}: the hiershm algorithm needs ranks on more than one host (on one host use shm) and the ranks of every host connected by shared memory (not disabled by CCL_SHM_DISABLE or CCL_TRANSPORT), each host's ranks among themselves only"
    )]
    NoHostMemoryPerHost { coll: Collective },
    /// Any of the above, in the `CCL_ALGO` setting `spec`.
    #[error("CCL_ALGO='{spec}': {error}")]
    Setting { spec: String, error: Box<AlgoError> },
}

fn names<'n>(it: impl Iterator<Item = &'n str>) -> String {
    it.collect::<Vec<_>>().join(", ")
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
        /// In the memory the ranks of one host share: each rank's input is where every other
        /// rank reads it; flag barriers between the steps. Only when every rank of the
        /// communicator is on one host and the shared-memory transport connects them.
        Shm = 6 => "shm",
        /// Hierarchical on host memory: the ranks of each host reduce-scatter and allgather
        /// through their host's shared segment, and every rank allreduces its part with its
        /// counterparts on the other hosts over the network. Only when the ranks of every host
        /// share memory.
        HierShm = 7 => "hiershm",
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
            Algo::Shm => &["host", "shared_memory"],
            Algo::HierShm => &["hier_shm", "hierarchical_shm"],
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = AlgoError;
    fn from_str(s: &str) -> Result<Algo, AlgoError> {
        let t = s.trim().to_ascii_lowercase().replace('-', "_");
        Algo::ALL
            .into_iter()
            .find(|a| a.name() == t || a.aliases().contains(&t.as_str()))
            .ok_or_else(|| AlgoError::UnknownAlgorithm(s.to_string()))
    }
}

/// Builds one rank's schedule of an algorithm.
type Build = fn(&Shape, &Topology) -> Schedule;
/// Builds one rank's schedule of a collective with a count per rank.
type BuildPerRank = fn(&VShape) -> Schedule;
/// The load an algorithm puts on the links, for `n` ranks placed as the topology says.
type LoadOf = fn(usize, &Topology) -> Load;

/// How a schedule is built: from one count ([`Shape`]) or from counts per rank ([`VShape`]).
#[derive(Clone, Copy)]
enum Builder {
    One(Build),
    PerRank(BuildPerRank),
}

/// How one collective runs one algorithm: how its schedule is built and what the cost model
/// charges for it.
#[derive(Clone, Copy)]
pub struct Implementation {
    build: Builder,
    load: LoadOf,
}

impl fmt::Debug for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Implementation")
    }
}

/// Which collective has which algorithm, how it is built and what it costs: the one table.
///
/// The match is exhaustive, without a catch-all arm: a new collective or algorithm does not
/// compile until every pair says whether it exists. [`Collective::algos`], [`build`], [`cost`](fn@cost),
/// [`choose`] and `CCL_ALGO` all read this table.
pub const fn implementation(coll: Collective, algo: Algo) -> Option<Implementation> {
    use Algo::*;
    use Collective::*;
    let (build, load): (Build, LoadOf) = match (coll, algo) {
        (AllReduce, Ring) => (allreduce::ring::build, cost::ring_allreduce),
        (AllReduce, RecursiveDoubling) => {
            (|s, _| allreduce::rd::build(s), cost::recursive_doubling)
        }
        (AllReduce, Tree) => (allreduce::double_tree::build, cost::double_tree),
        (AllReduce, HalvingDoubling) => (allreduce::hd::build, cost::halving_doubling),
        (AllReduce, Hierarchical) => (allreduce::hier::build, cost::hierarchical),
        (AllReduce, HierShm) => (allreduce::hier_shm::build, cost::hier_shm),
        (Broadcast, Ring) => (
            |s, _| broadcast::ring::build(s),
            |n, _| cost::chain(n, false),
        ),
        (Broadcast, Tree) => (broadcast::rooted_tree::build, |n, _| {
            cost::rooted_tree(n, false)
        }),
        (Reduce, Ring) => (|s, _| reduce::ring::build(s), |n, _| cost::chain(n, true)),
        (Reduce, Tree) => (reduce::rooted_tree::build, |n, _| {
            cost::rooted_tree(n, true)
        }),
        (AllGather, Ring) => (
            |s, _| allgather::ring(s),
            |n, _| cost::ring_blocks(n, false),
        ),
        (AllGather, Pairwise) => (
            |s, _| allgather::pairwise(s),
            |n, t| cost::pairwise(n, t, false),
        ),
        (ReduceScatter, Ring) => (
            |s, _| reduce_scatter::ring(s),
            |n, _| cost::ring_blocks(n, true),
        ),
        (ReduceScatter, Pairwise) => (
            |s, _| reduce_scatter::pairwise(s),
            |n, t| cost::pairwise(n, t, true),
        ),
        (AllToAll, Pairwise) => (
            |s, _| alltoall::pairwise(s),
            |n, t| cost::pairwise(n, t, false),
        ),
        (Barrier, RecursiveDoubling) => (
            |s, _| barrier::dissemination(s),
            |n, _| cost::dissemination(n),
        ),
        (AllReduce, Shm) => (|s, _| host::allreduce(s), cost::host_allreduce),
        (Broadcast, Shm) => (|s, _| host::broadcast(s), |_, _| cost::host_copy(2.0)),
        (AllGather, Shm) => (
            |s, _| host::allgather(s),
            |n, _| cost::host_blocks(n, false),
        ),
        (ReduceScatter, Shm) => (
            |s, _| host::reduce_scatter(s),
            |n, _| cost::host_blocks(n, true),
        ),
        (Gather, Pairwise) => (|s, _| vcoll::gather(s), |n, t| cost::rooted_direct(n, t)),
        (Scatter, Pairwise) => (|s, _| vcoll::scatter(s), |n, t| cost::rooted_direct(n, t)),
        (AllGatherV | ReduceScatterV | AllToAllV, Pairwise) => {
            let (build, load): (BuildPerRank, LoadOf) = match coll {
                AllGatherV => (vcoll::all_gather_v, |n, t| cost::pairwise(n, t, false)),
                ReduceScatterV => (vcoll::reduce_scatter_v, |n, t| cost::pairwise(n, t, true)),
                _ => (vcoll::all_to_all_v, |n, t| cost::pairwise(n, t, false)),
            };
            return Some(Implementation {
                build: Builder::PerRank(build),
                load,
            });
        }
        // The pairs that do not exist.
        (AllReduce, Pairwise)
        | (
            Broadcast | Reduce,
            RecursiveDoubling | Pairwise | HalvingDoubling | Hierarchical | HierShm,
        )
        | (Reduce, Shm)
        | (
            AllGather | ReduceScatter,
            RecursiveDoubling | Tree | HalvingDoubling | Hierarchical | HierShm,
        )
        | (
            AllToAll,
            Ring | RecursiveDoubling | Tree | HalvingDoubling | Hierarchical | Shm | HierShm,
        )
        | (Barrier, Ring | Pairwise | Tree | HalvingDoubling | Hierarchical | Shm | HierShm)
        | (
            Gather | Scatter | AllGatherV | ReduceScatterV | AllToAllV,
            Ring | RecursiveDoubling | Tree | HalvingDoubling | Hierarchical | Shm | HierShm,
        ) => return None,
    };
    Some(Implementation {
        build: Builder::One(build),
        load,
    })
}

/// Each collective's algorithms (in `Algo::ALL` order) and how many there are, worked out from
/// [`implementation`] when the library is compiled.
static ALGOS: [([Algo; Algo::ALL.len()], usize); Collective::ALL.len()] = {
    let mut table = [([Algo::Ring; Algo::ALL.len()], 0); Collective::ALL.len()];
    let mut c = 0;
    while c < Collective::ALL.len() {
        let mut a = 0;
        while a < Algo::ALL.len() {
            if implementation(Collective::ALL[c], Algo::ALL[a]).is_some() {
                let (list, len) = &mut table[c];
                list[*len] = Algo::ALL[a];
                *len += 1;
            }
            a += 1;
        }
        assert!(table[c].1 > 0, "every collective needs an algorithm");
        c += 1;
    }
    table
};

/// Builds this rank's schedule of `algo` for `coll`, or says the pair does not exist.
pub fn build(
    coll: Collective,
    algo: Algo,
    shape: &Shape,
    topo: &Topology,
) -> Result<Schedule, AlgoError> {
    let imp = implementation(coll, algo).ok_or(AlgoError::NotOffered { coll, algo })?;
    // Room for at least one element per rank in each half of a slot.
    if algo == Algo::Shm && shape.host_slot < 2 * shape.size {
        return Err(AlgoError::NoHostMemory { coll });
    }
    // At least one element in each half.
    if algo == Algo::HierShm && shape.host_slot < 2 {
        return Err(AlgoError::NoHostMemoryPerHost { coll });
    }
    match imp.build {
        Builder::One(f) => Ok(f(shape, topo)),
        Builder::PerRank(_) => Err(AlgoError::Counts {
            coll,
            per_rank: true,
        }),
    }
}

/// Builds this rank's schedule of `algo` for a collective with a count per rank
/// ([`Collective::per_rank`]).
pub fn build_per_rank(coll: Collective, algo: Algo, shape: &VShape) -> Result<Schedule, AlgoError> {
    let imp = implementation(coll, algo).ok_or(AlgoError::NotOffered { coll, algo })?;
    match imp.build {
        Builder::PerRank(_) if shape.coll != coll => Err(AlgoError::ShapeOf {
            coll,
            shape: shape.coll,
        }),
        Builder::PerRank(f) => Ok(f(shape)),
        Builder::One(_) => Err(AlgoError::Counts {
            coll,
            per_rank: false,
        }),
    }
}

/// Estimated seconds of one `coll` by `algo` over `n` ranks of `bytes` (the nccl-tests size:
/// the buffer of allreduce/broadcast/reduce, the total of allgather/reduce-scatter/alltoall),
/// by the model of [`crate::cost`]; `None` when `coll` has no `algo`.
pub fn cost(
    coll: Collective,
    algo: Algo,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    topo: &Topology,
) -> Option<f64> {
    let imp = implementation(coll, algo)?;
    if !available(algo, t, topo) {
        return None;
    }
    if n <= 1 {
        return Some(0.0);
    }
    let load = match (coll, algo) {
        // The one algorithm whose shape changes with the size (one shot for small buffers).
        (Collective::AllReduce, Algo::Shm) => crate::cost::host_allreduce_of(n, bytes),
        _ => (imp.load)(n, topo),
    };
    Some(LinkCosts::new(t, topo).time(&load, bytes as f64))
}

/// Whether a communicator whose transports are `t` (as `ccl`'s `Peers::cost_properties` gives them:
/// `host_memory` when the ranks of every host share a segment) and whose ranks are placed as
/// `topo` says can run `algo`: `shm` needs every rank on one host, `hiershm` ranks on several
/// hosts and host memory on every one; the others need nothing.
pub fn available(algo: Algo, t: &TransportProperties, topo: &Topology) -> bool {
    match algo {
        Algo::Shm => t.host_memory && topo.num_hosts() <= 1,
        // Never on one host: there `shm` runs too, and the two hand host memory from one
        // operation to the next differently (`shm` takes turns on the slot halves with no
        // barrier at its ends, `hiershm` waits for the previous operation's readers and posts
        // its own), so mixing them could overwrite a slot a peer still reads.
        Algo::HierShm => t.host_memory && topo.num_hosts() > 1,
        _ => true,
    }
}

/// Why `coll` cannot run `algo` on a communicator where it is not [`available`].
pub fn unavailable(coll: Collective, algo: Algo) -> AlgoError {
    if algo == Algo::HierShm {
        AlgoError::NoHostMemoryPerHost { coll }
    } else {
        AlgoError::NoHostMemory { coll }
    }
}

/// The cheapest algorithm for `coll` by [`cost`](fn@cost).
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
            spin: Duration::ZERO,
            host_memory: false,
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
        for a in Collective::AllReduce
            .algos()
            .iter()
            .filter(|&&a| !matches!(a, Algo::Shm | Algo::HierShm))
        {
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

    /// Hosts whose ranks share memory: `hiershm` is priced only with host memory and several
    /// hosts. Behind host links as fast as a connection, with four ranks a host, it wins large
    /// buffers: every rank crosses the network with a quarter of the buffer, where `hier`'s
    /// leader alone sends twice the buffer and the ring's ranks 1.75 times it each.
    #[test]
    fn hierarchical_on_host_memory_is_priced_where_hosts_share_memory() {
        let host = TransportProperties {
            host_memory: true,
            ..tcp()
        };
        let two_by_four = Topology::grid(1, 1, 2, 4);
        let c = |a, t: &TransportProperties, topo: &Topology, b| {
            cost(Collective::AllReduce, a, topo.size(), b, t, topo)
        };
        assert!(c(Algo::HierShm, &tcp(), &two_by_four, 1 << 20).is_none());
        let one_host = Topology::from_hosts(&vec!["box".to_string(); 4]);
        assert!(c(Algo::HierShm, &host, &one_host, 1 << 20).is_none());
        // Nor run there, even when forced: `shm` and `hiershm` hand host memory from one
        // operation to the next differently, so one host runs `shm` alone.
        assert!(!available(Algo::HierShm, &host, &one_host));
        assert!(available(Algo::HierShm, &host, &two_by_four));
        assert!(available(Algo::Shm, &host, &one_host));
        assert!(c(Algo::Shm, &host, &two_by_four, 1 << 20).is_none());
        assert_eq!(
            choose(Collective::AllReduce, 8, 256 << 20, &host, &two_by_four),
            Algo::HierShm
        );
        for other in [Algo::Ring, Algo::Hierarchical, Algo::HalvingDoubling] {
            let (h, o) = (
                c(Algo::HierShm, &host, &two_by_four, 256 << 20).unwrap(),
                c(other, &host, &two_by_four, 256 << 20).unwrap(),
            );
            assert!(h < o, "hiershm {h} s against {other} {o} s");
        }
        // Uneven hosts load the ranks of the smallest host with more parts.
        let uneven = Topology::from_hosts(&["a", "a", "a", "a", "b", "b"].map(String::from));
        let even = Topology::from_hosts(&["a", "a", "a", "b", "b", "b"].map(String::from));
        assert!(
            c(Algo::HierShm, &host, &uneven, 1 << 26).unwrap()
                > c(Algo::HierShm, &host, &even, 1 << 26).unwrap()
        );
    }

    /// One host over shared memory, as its transport describes itself, priced as measured
    /// (docs/algorithms.md, docs/performance.md): 2 ranks, host memory for small buffers and
    /// the connections beyond; 4 ranks on 2 CPUs, host memory at every size (its two-shot
    /// form took 0.63-0.91x halving-doubling's time from 128 KiB to 32 MiB; at 64 KiB, the
    /// last one-shot size, the two were within 6%).
    #[test]
    fn one_host_over_shared_memory_is_priced_as_measured() {
        let shm = TransportProperties {
            latency: Duration::from_nanos(500),
            bandwidth: 10.0e9,
            spin: Duration::from_millis(1),
            host_memory: true,
        };
        let pick = |n: usize, cpus, b| {
            let topo = Topology::from_hosts(&vec!["box".to_string(); n]);
            let t = crate::cost::on_shared_cpus(shm, n, cpus);
            choose(Collective::AllReduce, n, b, &t, &topo)
        };
        for b in [8, 512, 2 << 10] {
            assert_eq!(pick(2, 2, b), Algo::Shm, "2 ranks, {b} B");
        }
        for b in [4 << 10, 64 << 10, 8 << 20, 128 << 20] {
            assert_ne!(pick(2, 2, b), Algo::Shm, "2 ranks, {b} B");
        }
        // (At 64 KiB, the last one-shot size, the two were within 6% of each other.)
        for b in [
            8,
            2 << 10,
            16 << 10,
            128 << 10,
            1 << 20,
            32 << 20,
            128 << 20,
        ] {
            assert_eq!(pick(4, 2, b), Algo::Shm, "4 ranks, {b} B");
        }
    }

    /// Broadcast, allgather and reduce-scatter on one host over shared memory, priced as
    /// measured (`cost::HOST_COPY_BYTE`, `cost::HOST_ALLGATHER_BYTE`): broadcast in host memory
    /// at every size; allgather there for small buffers with 2 ranks and at every size with 4
    /// on 2 CPUs; reduce-scatter over the connections past a few KiB.
    #[test]
    fn copies_in_host_memory_are_priced_as_measured() {
        let shm = TransportProperties {
            latency: Duration::from_nanos(500),
            bandwidth: 10.0e9,
            spin: Duration::from_millis(1),
            host_memory: true,
        };
        let pick = |coll, n: usize, b| {
            let topo = Topology::from_hosts(&vec!["box".to_string(); n]);
            let t = crate::cost::on_shared_cpus(shm, n, 2);
            choose(coll, n, b, &t, &topo)
        };
        for n in [2, 4] {
            for b in [8, 2 << 10, 1 << 20, 32 << 20] {
                assert_eq!(
                    pick(Collective::Broadcast, n, b),
                    Algo::Shm,
                    "{n} ranks, {b} B"
                );
            }
            assert_eq!(
                pick(Collective::AllGather, n, 2 << 10),
                Algo::Shm,
                "{n} ranks"
            );
            for b in [128 << 10, 2 << 20, 32 << 20] {
                assert_ne!(
                    pick(Collective::ReduceScatter, n, b),
                    Algo::Shm,
                    "{n} ranks, {b} B"
                );
            }
        }
        for b in [2 << 20, 32 << 20] {
            assert_ne!(
                pick(Collective::AllGather, 2, b),
                Algo::Shm,
                "2 ranks, {b} B"
            );
        }
        for b in [32 << 10, 2 << 20, 32 << 20] {
            assert_eq!(
                pick(Collective::AllGather, 4, b),
                Algo::Shm,
                "4 ranks, {b} B"
            );
        }
    }

    /// A slow rack uplink: algorithms that cross it less win.
    #[test]
    fn rack_uplink_is_charged() {
        let topo = Topology::grid(1, 2, 2, 2);
        let slow = Topology::grid(1, 2, 2, 2).with_bandwidth(None, Some(0.1e9), None);
        for a in Collective::AllReduce
            .algos()
            .iter()
            .filter(|&&a| !matches!(a, Algo::Shm | Algo::HierShm))
        {
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
            .filter(|&&a| !matches!(a, Algo::Hierarchical | Algo::Shm | Algo::HierShm))
        {
            let c = |t: &Topology| cost(Collective::AllReduce, *a, 4, 1 << 20, &tcp(), t).unwrap();
            assert!(c(&one) <= c(&flat), "{a}");
        }
    }

    /// Which collective has which algorithm, as the table says; every listed pair builds and
    /// is priced, and no other pair is.
    #[test]
    fn the_table_lists_each_collectives_algorithms() {
        use Algo::*;
        let want: [(Collective, &[Algo]); 12] = [
            (
                Collective::AllReduce,
                &[
                    Ring,
                    RecursiveDoubling,
                    Tree,
                    HalvingDoubling,
                    Hierarchical,
                    Shm,
                    HierShm,
                ],
            ),
            (Collective::Broadcast, &[Ring, Tree, Shm]),
            (Collective::Reduce, &[Ring, Tree]),
            (Collective::AllGather, &[Ring, Pairwise, Shm]),
            (Collective::ReduceScatter, &[Ring, Pairwise, Shm]),
            (Collective::AllToAll, &[Pairwise]),
            (Collective::Barrier, &[RecursiveDoubling]),
            (Collective::Gather, &[Pairwise]),
            (Collective::Scatter, &[Pairwise]),
            (Collective::AllGatherV, &[Pairwise]),
            (Collective::ReduceScatterV, &[Pairwise]),
            (Collective::AllToAllV, &[Pairwise]),
        ];
        let topo = Topology::flat(4);
        let one_host = Topology::from_hosts(&vec!["box".to_string(); 4]);
        for (coll, algos) in want {
            let counts = [1, 2, 3, 4];
            let v = match coll {
                Collective::ReduceScatterV => {
                    VShape::reduce_scatter_v(1, 4, &counts, false, ccl_core::ReduceOp::Sum)
                }
                Collective::AllToAllV => {
                    VShape::all_to_all_v(1, 4, (&counts, None), (&counts, None), false)
                }
                _ => VShape::all_gather_v(1, 4, &counts, None, false),
            }
            .unwrap();
            assert_eq!(coll.algos(), algos, "{coll}");
            for a in Algo::ALL {
                let listed = algos.contains(&a);
                let shape = Shape {
                    host_slot: 64,
                    ..Shape::new(1, 4, 8, false, ccl_core::ReduceOp::Sum)
                };
                let one = build(coll, a, &shape, &topo);
                let per_rank = build_per_rank(coll, a, &v);
                assert_eq!(one.is_ok() || per_rank.is_ok(), listed, "{coll} {a}");
                assert!(one.is_err() || per_rank.is_err(), "{coll} {a}");
                if listed {
                    let e = if coll.per_rank() { one } else { per_rank };
                    assert!(matches!(e, Err(AlgoError::Counts { .. })), "{coll} {a}");
                }
                if listed && coll == Collective::AllToAllV {
                    let ag = VShape::all_gather_v(1, 4, &counts, None, false).unwrap();
                    let e = build_per_rank(coll, a, &ag).unwrap_err().to_string();
                    assert_eq!(e, "alltoallv asked for with the counts of allgatherv");
                }
                let host = TransportProperties {
                    host_memory: true,
                    ..tcp()
                };
                // `shm` runs on one host only; `hiershm` is priced across hosts.
                let priced_on = if a == Shm { &one_host } else { &topo };
                assert_eq!(
                    cost(coll, a, 4, 1 << 20, &host, priced_on).is_some(),
                    listed
                );
                // Without host memory, the host-memory algorithms are neither priced nor built.
                if a == Shm || a == HierShm {
                    assert!(cost(coll, a, 4, 1 << 20, &tcp(), priced_on).is_none());
                    let none = Shape::new(1, 4, 8, false, ccl_core::ReduceOp::Sum);
                    assert!(build(coll, a, &none, &topo).is_err());
                }
                if a == Shm {
                    assert!(cost(coll, a, 4, 1 << 20, &host, &topo).is_none());
                }
            }
        }
    }

    #[test]
    fn buffer_lengths_and_counts_are_inverse() {
        let n = 3;
        for coll in Collective::ALL {
            if coll.per_rank() {
                assert_eq!(coll.buffer_lens(1, n), Err(LenError::PerRank(coll)));
                assert_eq!(coll.count_for(None, 3, n), Err(LenError::PerRank(coll)));
                continue;
            }
            for count in [0, 1, 5] {
                let l = coll.buffer_lens(count, n).unwrap();
                let want = if coll == Collective::Barrier {
                    0
                } else {
                    count
                };
                assert_eq!(coll.count_for(Some(l.send), l.recv, n), Ok(want), "{coll}");
                assert_eq!(coll.count_for(None, l.in_place(), n), Ok(want), "{coll}");
            }
        }
        let ag = Collective::AllGather.buffer_lens(4, n).unwrap();
        assert_eq!((ag.send, ag.recv, ag.in_place()), (4, 12, 12));
        let g = Collective::Gather.buffer_lens(4, n).unwrap();
        assert_eq!((g.send, g.recv, g.in_place()), (4, 12, 12));
        let sc = Collective::Scatter.buffer_lens(4, n).unwrap();
        assert_eq!((sc.send, sc.recv, sc.in_place()), (12, 4, 12));
        let rs = Collective::ReduceScatter.buffer_lens(4, n).unwrap();
        assert_eq!((rs.send, rs.recv, rs.in_place()), (12, 4, 12));
        assert_eq!(rs.bytes(4), Some(BufferLens { send: 48, recv: 16 }));
        assert_eq!(rs.bytes(usize::MAX), None);
        assert_eq!(
            Collective::AllToAll.buffer_lens(usize::MAX / 2 + 1, 2),
            Err(LenError::Overflow {
                count: usize::MAX / 2 + 1,
                ranks: 2
            })
        );
        let e = Collective::AllGather.count_for(None, 10, n).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a buffer of 10 elements does not split into 3 equal blocks"
        );
        let e = Collective::Reduce.count_for(Some(3), 10, n).unwrap_err();
        assert_eq!(
            e.to_string(),
            "send buffer has 3 elements but receive buffer has 10"
        );
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
