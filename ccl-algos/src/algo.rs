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

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Barrier,
}

impl Collective {
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Barrier,
    ];

    /// Its number in operation headers.
    pub fn id(self) -> u8 {
        Collective::ALL
            .iter()
            .position(|c| *c == self)
            .expect("listed") as u8
    }

    /// The name used by `CCL_ALGO`, logs and the benchmark (`allreduce`, `reducescatter`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllToAll => "alltoall",
            Collective::Barrier => "barrier",
        }
    }

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

/// An algorithm; which collectives it implements is [`Collective::algos`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Around a ring (a chain for rooted collectives): bandwidth-optimal, pipelined.
    Ring,
    /// `log2(n)` exchanges with partner `r ^ 2^k` (dissemination for the barrier):
    /// latency-optimal.
    RecursiveDoubling,
    /// Every rank sends straight to every other at once: one step.
    Pairwise,
    /// Binary trees: NCCL's double binary tree for allreduce, one tree from or to the root for
    /// broadcast and reduce. `log2(n)` latency, pipelined.
    Tree,
    /// Recursive halving, then recursive doubling (Rabenseifner): the ring's bytes in `2 log2(n)`
    /// steps.
    HalvingDoubling,
    /// Inside each host, then across hosts among one leader per host, then inside each host.
    Hierarchical,
}

impl Algo {
    /// Its number in operation headers.
    pub fn id(self) -> u8 {
        Algo::ALL.iter().position(|a| *a == self).expect("listed") as u8
    }

    pub const ALL: [Algo; 6] = [
        Algo::Ring,
        Algo::RecursiveDoubling,
        Algo::Pairwise,
        Algo::Tree,
        Algo::HalvingDoubling,
        Algo::Hierarchical,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "rd",
            Algo::Pairwise => "pairwise",
            Algo::Tree => "tree",
            Algo::HalvingDoubling => "hd",
            Algo::Hierarchical => "hier",
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
        match t.as_str() {
            "ring" | "chain" => Ok(Algo::Ring),
            "rd" | "recursive_doubling" | "dissemination" => Ok(Algo::RecursiveDoubling),
            "pairwise" | "direct" => Ok(Algo::Pairwise),
            "tree" | "dbtree" => Ok(Algo::Tree),
            "hd" | "halving_doubling" | "rabenseifner" => Ok(Algo::HalvingDoubling),
            "hier" | "hierarchical" => Ok(Algo::Hierarchical),
            _ => {
                let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
                Err(format!(
                    "unknown algorithm '{s}' (expected one of {})",
                    names.join(", ")
                ))
            }
        }
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

fn log2_ceil(n: usize) -> f64 {
    n.next_power_of_two().trailing_zeros() as f64
}

/// Estimated seconds of one `coll` by `algo` over `n` ranks of `bytes` (the nccl-tests size:
/// the buffer of allreduce/broadcast/reduce, the total of allgather/reduce-scatter/alltoall).
pub fn cost(
    coll: Collective,
    algo: Algo,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    _topo: &Topology,
) -> Option<f64> {
    if !coll.algos().contains(&algo) {
        return None;
    }
    if n <= 1 {
        return Some(0.0);
    }
    let (alpha, beta, gamma) = (
        t.latency.as_secs_f64(),
        1.0 / t.bandwidth,
        1.0 / REDUCE_RATE,
    );
    let nf = n as f64;
    let b = bytes as f64;
    let share = (nf - 1.0) / nf * b;
    Some(match (coll, algo) {
        (Collective::AllReduce, Algo::Ring) => {
            2.0 * (nf - 1.0) * alpha + 2.0 * share * beta + share * gamma
        }
        (Collective::AllReduce, Algo::RecursiveDoubling) => {
            let p = if n.is_power_of_two() {
                n
            } else {
                n.next_power_of_two() / 2
            };
            let exchanges = p.trailing_zeros() as f64;
            // Non-powers of two fold in and hand back: two more whole-buffer transfers.
            let extra = if p == n { 0.0 } else { 2.0 };
            (exchanges + extra) * (alpha + b * beta) + (exchanges + extra / 2.0) * b * gamma
        }
        (Collective::Broadcast, Algo::Ring) => (nf - 1.0) * alpha + b * beta,
        (Collective::Reduce, Algo::Ring) => (nf - 1.0) * alpha + b * beta + b * gamma,
        (Collective::AllGather, Algo::Ring) => (nf - 1.0) * alpha + share * beta,
        (Collective::ReduceScatter, Algo::Ring) => (nf - 1.0) * alpha + share * (beta + gamma),
        // All messages leave at once: one latency plus a per-message cost, and the same bytes.
        (Collective::AllGather | Collective::AllToAll, Algo::Pairwise) => {
            (1.0 + 0.25 * (nf - 1.0)) * alpha + share * beta
        }
        (Collective::ReduceScatter, Algo::Pairwise) => {
            (1.0 + 0.25 * (nf - 1.0)) * alpha + share * (beta + gamma)
        }
        (Collective::Barrier, Algo::RecursiveDoubling) => log2_ceil(n) * alpha,
        _ => return None,
    })
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
