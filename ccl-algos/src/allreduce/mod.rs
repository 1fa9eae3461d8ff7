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

    /// Alpha-beta estimate of the time of one allreduce of `bytes` over `n` ranks, in seconds.
    pub fn cost(self, n: usize, bytes: usize, t: &TransportProperties) -> f64 {
        if n <= 1 {
            return 0.0;
        }
        let (alpha, beta) = (t.latency.as_secs_f64(), 1.0 / t.bandwidth);
        let nf = n as f64;
        let b = bytes as f64;
        match self {
            Algo::Ring => 2.0 * (nf - 1.0) * alpha + 2.0 * (nf - 1.0) / nf * b * beta,
            Algo::RecursiveDoubling => {
                let p = if n.is_power_of_two() {
                    n
                } else {
                    n.next_power_of_two() / 2
                };
                let steps = p.trailing_zeros() as f64 + if p == n { 0.0 } else { 2.0 };
                steps * (alpha + b * beta)
            }
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
