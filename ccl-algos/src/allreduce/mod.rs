//! Allreduce algorithms and the choice between them.

pub mod rd;
pub mod ring;

use std::fmt;
use std::str::FromStr;

use ccl_core::transport::TransportProperties;

use crate::schedule::{Schedule, Shape};

/// An allreduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Reduce-scatter + allgather around a ring: bandwidth-optimal.
    Ring,
    /// Recursive doubling: `log2(n)` whole-buffer exchanges, latency-optimal.
    RecursiveDoubling,
}

impl Algo {
    pub const ALL: [Algo; 2] = [Algo::Ring, Algo::RecursiveDoubling];

    pub const fn name(self) -> &'static str {
        match self {
            Algo::Ring => "ring",
            Algo::RecursiveDoubling => "rd",
        }
    }

    /// Builds this rank's schedule.
    pub fn build(self, shape: &Shape) -> Schedule {
        match self {
            Algo::Ring => ring::build(shape),
            Algo::RecursiveDoubling => rd::build(shape),
        }
    }

    /// Alpha-beta-gamma estimate of one allreduce of `bytes` over `n` ranks, in seconds:
    /// latency per step, bytes on the wire per rank over the link bandwidth, and bytes reduced
    /// per rank over the reduction rate (which separates the two algorithms at two ranks, where
    /// both send the same bytes).
    pub fn cost(self, n: usize, bytes: usize, t: &TransportProperties) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (alpha, beta, gamma) = (
            t.latency.as_secs_f64(),
            1.0 / t.bandwidth,
            1.0 / REDUCE_RATE,
        );
        let nf = n as f64;
        let b = bytes as f64;
        match self {
            Algo::Ring => {
                let share = (nf - 1.0) / nf * b;
                2.0 * (nf - 1.0) * alpha + 2.0 * share * beta + share * gamma
            }
            Algo::RecursiveDoubling => {
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
        }
    }
}

/// Bytes per second one core reduces (two operands in, one out) at sizes that leave the cache.
const REDUCE_RATE: f64 = 10.0e9;

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Algo, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" => Ok(Algo::Ring),
            "rd" | "recursive_doubling" | "recursive-doubling" => Ok(Algo::RecursiveDoubling),
            other => Err(format!(
                "unknown allreduce algorithm '{other}' (expected ring or rd)"
            )),
        }
    }
}

/// The algorithm with the lowest estimated time.
pub fn choose(n: usize, bytes: usize, t: &TransportProperties) -> Algo {
    let mut best = Algo::Ring;
    let mut best_cost = f64::INFINITY;
    for a in Algo::ALL {
        let c = a.cost(n, bytes, t);
        if c < best_cost {
            best = a;
            best_cost = c;
        }
    }
    best
}
