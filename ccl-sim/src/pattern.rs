//! Programs of schedules too large to build op by op, with every chain of streamed ops of one
//! connection grouped into one flow.
//!
//! The library's ring builder takes seconds per rank at 4K ranks and grows with the square of
//! the ranks (each op is checked against every earlier one), so a 32K-rank ring cannot be built
//! rank by rank here; nor would two billion single-op flows fit. The ring's shape is simple: in
//! ring order each rank sends its successor `2(n-1)` chunks, every chunk after the first
//! streaming from the one just received. [`ring`] writes that down as two flows per rank (reduce-scatter, allgather). Tests
//! check it against the built schedules: the same bytes between the same ranks, and the same
//! simulated time within a few percent.

use ccl_core::topology::Topology;

use crate::program::{Dep, Flow, Lock, Program};
use crate::schedules::ELEM;

/// Elements of chunk `k` of `n` over `count` (the ring builder's cut: the first `count % n`
/// chunks one element longer).
fn chunk_len(count: usize, n: usize, k: usize) -> usize {
    count / n + usize::from(k < count % n)
}

/// Ring allreduce of `bytes` (in place, f32) over `topo`'s ring order, two flows per rank.
pub fn ring(topo: &Topology, bytes: usize) -> Program {
    let n = topo.size();
    let count = bytes / ELEM;
    let mut p = Program {
        ranks: n,
        source: "pattern",
        ..Program::default()
    };
    if n < 2 {
        return p;
    }
    let order = topo.ring_order();
    // Reduce-scatter (reducing, every chunk but pos+1) then allgather (copying, every chunk but
    // pos+2): two cycles of flows, since they are bound by different things (the reduction and
    // the wire). Flow `pos` is position pos's reduce-scatter, flow `n + pos` its allgather.
    let dst = |pos: usize| order[(pos + 1) % n] as u32;
    for phase in 0..2 {
        for (pos, &r) in order.iter().enumerate() {
            let skip = chunk_len(count, n, (pos + 1 + phase) % n);
            let prev = (pos + n - 1) % n + phase * n;
            let mut deps = Vec::new();
            if phase == 1 {
                // The wire order: allgather sends follow this rank's reduce-scatter sends.
                deps.push(Dep::Sent(pos as u32));
            }
            p.flows.push(Flow {
                src: r as u32,
                dst: dst(pos),
                bytes: ((count - skip) * ELEM) as f64,
                ops: n as u32 - 1,
                deps,
                locks: vec![Lock {
                    flow: prev as u32,
                    head_start: true,
                }],
                reduce: if phase == 0 { 1.0 } else { 0.0 },
                step: (phase * (n - 1)) as u32,
            });
        }
    }
    p
}
