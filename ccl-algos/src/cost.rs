//! The cost model: what each algorithm puts on each kind of link, and what that costs.
//!
//! Alpha-beta-gamma with the topology: `steps x latency + bytes x (the busiest link's load / its
//! bandwidth) + bytes reduced / reduction rate`, where the links are each rank's transport
//! connections, each host's network link, and each rack's and zone's uplink. Every load function
//! here gives, per byte of the nccl-tests size, what the busiest rank, host, rack and zone send
//! and reduce, and how many latency-bound steps there are; [`crate::algo`] says which collective
//! and algorithm uses which.

use std::time::Duration;

use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;

/// Bytes per second one core reduces (two operands in, one out) at sizes that leave the cache.
pub const REDUCE_RATE: f64 = 10.0e9;

/// A rank that waits on a machine with more ranks than CPUs cannot spin: each step of an
/// algorithm waits until the scheduler runs the peer that sends. What that costs per step was
/// fitted to measurements of 4 ranks on 2 CPUs over loopback TCP (docs/algorithms.md): recursive
/// doubling and halving-doubling cross between 128 and 256 KiB, which puts the extra cost of a
/// step at 33-71 us; an idle vCPU takes about 50 us to wake. (An 8-byte allreduce alone shows
/// 27-37 us per step, against 4-5 us with a CPU each: there the peer is often already running.)
const HAND_OFF: Duration = Duration::from_micros(50);

/// The same hand-off where the transport's waits keep polling (`spin` > 0: shared memory) and
/// an oversubscribed rank yields between polls, so the rank it waits for runs at once instead
/// of after a wake-up: fitted to 4 ranks on 2 CPUs over shared memory (ring, recursive
/// doubling, trees and halving-doubling, 16 KiB-1 MiB, `TRANSPORT=shm scripts/crossover.sh`
/// on an idle machine): 4.9-5.8 us per step. With the TCP figure instead, the model took
/// recursive doubling (fewest steps) at 128-256 KiB, 1.35-1.5x slower than the trees or
/// halving-doubling there.
const YIELD_HAND_OFF: Duration = Duration::from_micros(5);

/// The transport's properties as the cost model should see them when `ranks_here` ranks share
/// `cpus` CPUs (0: unknown): oversubscribed, every step also pays a scheduler hand-off, and the
/// ranks split the CPUs that copy and reduce, so each gets that share of the bandwidth.
pub fn on_shared_cpus(
    p: TransportProperties,
    ranks_here: usize,
    cpus: usize,
) -> TransportProperties {
    if cpus == 0 || ranks_here <= cpus {
        return p;
    }
    let hand_off = if p.spin.is_zero() {
        HAND_OFF
    } else {
        YIELD_HAND_OFF
    };
    TransportProperties {
        latency: p.latency + hand_off,
        bandwidth: p.bandwidth * cpus as f64 / ranks_here as f64,
        ..p
    }
}

pub(crate) fn log2_floor(n: usize) -> usize {
    (usize::BITS - 1 - n.leading_zeros()) as usize
}

/// Largest power of two `<= n` (`n >= 1`).
fn pow2_floor(n: usize) -> usize {
    1 << log2_floor(n.max(1))
}

/// What one algorithm puts on each kind of link, per byte of the buffer, and how many
/// latency-bound steps it takes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
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
    /// Flag barriers in host memory (the host-memory steps of [`hier_shm`]; the single-host
    /// algorithms price theirs as steps of the transport).
    barriers: f64,
    /// Copied through host memory by the busiest rank (into its slot and out of others').
    mem: f64,
}

impl Load {
    /// `steps` steps in which the busiest rank sends `sent` and reduces `reduced` of the buffer,
    /// and the same crosses every host, rack and zone boundary (one edge of a ring, tree or
    /// chain in topology order leaves each).
    fn even(steps: f64, sent: f64, reduced: f64) -> Load {
        Load {
            steps,
            link: sent,
            host: sent,
            rack: sent,
            zone: sent,
            reduce: reduced,
            ..Load::default()
        }
    }
}

/// Seconds per byte of each kind of link (`None`: not a bottleneck), and seconds per step.
#[derive(Clone, Copy, Debug)]
pub struct LinkCosts {
    alpha: f64,
    rank: f64,
    host: Option<f64>,
    rack: Option<f64>,
    zone: Option<f64>,
    gamma: f64,
    /// Seconds per flag barrier in host memory, and per byte copied there.
    barrier: f64,
    mem: f64,
}

impl LinkCosts {
    /// Ranks of one host talk over the transport; traffic leaving a host also crosses the host's
    /// network link (the slowest one the topology names, else as fast as one transport
    /// connection, shared by the host's ranks); traffic leaving a rack or zone crosses its
    /// uplink when the topology gives one.
    pub fn new(t: &TransportProperties, topo: &Topology) -> LinkCosts {
        let sm = topo.summary();
        let host_bw = topo
            .min_link_bandwidth()
            .map_or(t.bandwidth, |b| b.min(t.bandwidth));
        LinkCosts {
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
            barrier: HOST_BARRIER.as_secs_f64(),
            mem: 1.0 / COPY_RATE,
        }
    }

    /// Seconds for `bytes` under load `l`.
    pub fn time(&self, l: &Load, bytes: f64) -> f64 {
        let wire = [
            Some(l.link * self.rank),
            self.host.map(|b| l.host * b),
            self.rack.map(|b| l.rack * b),
            self.zone.map(|b| l.zone * b),
        ]
        .into_iter()
        .flatten()
        .fold(0.0, f64::max);
        l.steps * self.alpha
            + l.barriers * self.barrier
            + bytes * (wire + l.reduce * self.gamma + l.mem * self.mem)
    }
}

/// Depth of the deeper tree of [`crate::binary_tree::double_tree`] over `n` ranks.
pub(crate) fn double_tree_depth(n: usize) -> usize {
    match n {
        0 | 1 => 0,
        _ if n % 2 == 0 => 1 + log2_floor(n - 1),
        _ => log2_floor(n),
    }
}

/// Depth of [`crate::binary_tree::Tree::rooted`] over `k` ranks.
pub(crate) fn rooted_depth(k: usize) -> usize {
    if k <= 1 { 0 } else { 1 + log2_floor(k - 1) }
}

/// Ring allreduce: every rank sends `2(n-1)/n` of the buffer to its successor; in topology order
/// one edge leaves each host, rack and zone.
pub fn ring_allreduce(n: usize, _topo: &Topology) -> Load {
    let nf = n as f64;
    let f = 2.0 * (nf - 1.0) / nf;
    Load::even(2.0 * (nf - 1.0), f, f / 2.0)
}

/// Recursive-doubling allreduce: the whole buffer at every step; non-powers of two fold in and
/// hand back, two more whole-buffer transfers.
pub fn recursive_doubling(n: usize, _topo: &Topology) -> Load {
    let p = pow2_floor(n);
    let e = log2_floor(p) as f64;
    let x = if p == n { 0.0 } else { 2.0 };
    Load::even(e + x, e + x, e + x / 2.0)
}

/// Double-binary-tree allreduce: a rank with two children in one tree sends half the buffer up
/// and two halves down there, and half up as a leaf of the other tree.
pub fn double_tree(n: usize, _topo: &Topology) -> Load {
    let (link, reduce) = match n {
        2 => (1.0, 0.5),
        3 => (1.5, 1.0),
        _ => (2.0, 1.0),
    };
    Load::even(2.0 * double_tree_depth(n) as f64, link, reduce)
}

/// Halving-doubling allreduce. Exchanges at distance `m` carry `1/(2m)` of the buffer each way,
/// so a group of `g` ranks (a power of two, aligned) sends `2(1 - g/p)` of it out in both phases;
/// the fold moves whole buffers between its pairs.
pub fn halving_doubling(n: usize, topo: &Topology) -> Load {
    let sm = topo.summary();
    let p = pow2_floor(n);
    let pf = p as f64;
    let folded = n - p;
    let x = if folded > 0 { 1.0 } else { 0.0 };
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
        ..Load::default()
    }
}

/// Hierarchical allreduce: a tree inside each host, a ring among the hosts' leaders. Inside a
/// host the leader has one child; members below have up to two, each sending the buffer up once
/// and down to every child.
pub fn hierarchical(_n: usize, topo: &Topology) -> Load {
    let sm = topo.summary();
    let h = sm.hosts as f64;
    let k = sm.max_per_host;
    let ring = if sm.hosts > 1 {
        2.0 * (h - 1.0) / h
    } else {
        0.0
    };
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
        ..Load::default()
    }
}

/// Bytes per second one core copies at sizes that leave the cache (`ccl-bench ... shm` on this
/// machine: 12.1 GB/s, docs/performance.md).
pub const COPY_RATE: f64 = 12.0e9;

/// A flag barrier among the ranks of one host with a CPU each: an 8 B allreduce in host memory
/// (one barrier and two small copies) takes 0.9-1.3 us on this machine.
const HOST_BARRIER: Duration = Duration::from_micros(1);

/// Hierarchical allreduce on host memory ([`crate::allreduce::hier_shm`]), with `p` parts per
/// chunk (the most ranks on a host): on a host of `k` ranks each owns `ceil(p / k)` parts of
/// `1/p` of the buffer, reduces them from the `k - 1` other slots, and runs a ring of `h` hosts
/// on each; every rank copies what it does not own into its slot and the results out, about
/// twice the buffer through host memory. The busiest rank is on the host with the fewest ranks;
/// every host sends the ring's share of the whole buffer across its link. Two flag barriers per
/// chunk (the copies of large buffers outweigh the barriers of the later chunks).
pub fn hier_shm(_n: usize, topo: &Topology) -> Load {
    let sm = topo.summary();
    let h = sm.hosts as f64;
    let (kmax, kmin) = (sm.max_per_host.max(1), sm.min_per_host.max(1));
    let share = kmax.div_ceil(kmin) as f64 / kmax as f64;
    let ring = if sm.hosts > 1 {
        2.0 * (h - 1.0) / h
    } else {
        0.0
    };
    let host_reduce = |k: usize| (k - 1) as f64 * kmax.div_ceil(k) as f64 / kmax as f64;
    Load {
        steps: 2.0 * (h - 1.0),
        link: ring * share,
        host: ring,
        rack: ring,
        zone: ring,
        reduce: host_reduce(kmax).max(host_reduce(kmin)) + ring / 2.0 * share,
        barriers: if kmax > 1 { 2.0 } else { 0.0 },
        mem: if kmax > 1 { 2.0 } else { 0.0 },
    }
}

/// Broadcast (or reduce, with `reduces`) down (or up) a tree rooted at the root: the buffer
/// flows once over a tree of depth `log2(n) + 1`; ranks with two children send (or reduce) it
/// twice.
pub fn rooted_tree(n: usize, reduces: bool) -> Load {
    let two = if n >= 4 { 2.0 } else { 1.0 };
    Load::even(rooted_depth(n) as f64, two, if reduces { two } else { 0.0 })
}

/// Broadcast (or reduce, with `reduces`) along a chain: the buffer passes every rank once,
/// pipelined.
pub fn chain(n: usize, reduces: bool) -> Load {
    Load::even(n as f64 - 1.0, 1.0, if reduces { 1.0 } else { 0.0 })
}

/// Allgather (or reduce-scatter, with `reduces`) around a ring: each rank sends its share,
/// `(n-1)/n` of the nccl-tests size, in `n-1` steps.
pub fn ring_blocks(n: usize, reduces: bool) -> Load {
    let nf = n as f64;
    let share = (nf - 1.0) / nf;
    Load::even(nf - 1.0, share, if reduces { share } else { 0.0 })
}

/// Allgather, alltoall or reduce-scatter (`reduces`) with every message leaving at once: one
/// latency plus a per-message cost, and the ring's bytes. What leaves a group of `k` ranks is
/// what its ranks send to the other `n - k`.
pub fn pairwise(n: usize, topo: &Topology, reduces: bool) -> Load {
    let sm = topo.summary();
    let nf = n as f64;
    let share = (nf - 1.0) / nf;
    let out = |k: usize| (k * (n - k.min(n))) as f64 / nf;
    Load {
        steps: 1.0 + 0.25 * (nf - 1.0),
        link: share,
        host: out(sm.max_per_host),
        rack: out(sm.max_per_rack),
        zone: out(sm.max_per_zone),
        reduce: if reduces { share } else { 0.0 },
        ..Load::default()
    }
}

/// How much more a byte copied through host memory costs than a byte over a connection, as
/// measured on this development machine (2 cores; idle; allreduce in host memory, every size up
/// to 64 KiB reduced whole by every rank, against the best algorithm over the shared-memory
/// connections). 2 ranks: host memory grows by 0.2-0.4 ns a byte, and is even with the
/// connections at 1-2 KiB (1 KiB: 0.59 against 0.61 us); 4 ranks on 2 CPUs: 0.7-0.8 ns a byte,
/// fastest up to 32 KiB (16 KiB: 16.8 against 22 us) and slower from 64 KiB (54 against
/// 42 us). With the reduction of every input by every rank charged at [`REDUCE_RATE`], both fit
/// about 4 times a connection's cost for the copies (the copy in, chunk by chunk behind flag
/// barriers, where the connections pipeline).
const HOST_BYTE_PENALTY: f64 = 4.0;

/// What a byte of the two-shot allreduce in host memory (past [`crate::host::ONE_SHOT_MAX`]
/// elements) costs against a byte sent over a connection, fitted to measurements on this
/// development machine (idle, fast phase, 25 Nov 2026, rings sized from the L2: `ccl-bench
/// allreduce --transport shm` with `CCL_ALGO=allreduce:shm` against the algorithm over the
/// connections, alternating, docs/performance.md): 2 ranks took 0.94-0.96x the ring's time at
/// 128 KiB-2 MiB and 1.05-1.12x at 8-32 MiB; 4 ranks on 2 CPUs 0.63x halving-doubling's at
/// 128 KiB and 0.76-0.91x at 512 KiB-32 MiB. Its bytes cross memory about as often as a
/// transfer's (copy in, reduce a slice, copy out), and the barriers between its chunks are
/// few beside them: 1.25 keeps the ring for 2 ranks (a byte there costs 1.0) and host memory
/// for 4 (halving-doubling's 1.5 on half the bandwidth each). [`HOST_BYTE_PENALTY`] stays for
/// the one-shot sizes, where every rank reduces every input.
const HOST_TWO_SHOT_BYTE: f64 = 1.25;

/// A flag barrier in host memory against a step over a connection (an operation header and the
/// data through a ring): about half, by the same measurements (8 B: 1.1 against 1.4 us).
const HOST_STEP: f64 = 0.5;

/// Allreduce in host memory (`Algo::Shm`) as the table prices it without a size: the load of
/// large buffers ([`host_allreduce_of`]).
pub fn host_allreduce(n: usize, _topo: &Topology) -> Load {
    host_allreduce_of(n, usize::MAX)
}

/// Allreduce in host memory (`Algo::Shm`) of `bytes`: nothing leaves the host. Up to
/// [`crate::host::ONE_SHOT_MAX`] elements (counted here as 4-byte ones) every rank copies its
/// buffer in and reduces all `n` inputs into its output, behind one flag barrier; larger ones
/// are copied in, reduced `1/n` by each rank and copied out (two copies: as much memory traffic
/// as one transfer over a connection, which copies in and out), behind two barriers per chunk
/// (which their bytes outweigh). One-shot copies at `HOST_BYTE_PENALTY`, two-shot bytes at
/// `HOST_TWO_SHOT_BYTE`.
pub fn host_allreduce_of(n: usize, bytes: usize) -> Load {
    let nf = n as f64;
    let one_shot = bytes <= crate::host::ONE_SHOT_MAX * 4;
    Load {
        steps: HOST_STEP,
        link: if one_shot {
            0.5 * HOST_BYTE_PENALTY
        } else {
            HOST_TWO_SHOT_BYTE
        },
        reduce: if one_shot { nf - 1.0 } else { (nf - 1.0) / nf },
        ..Load::default()
    }
}

/// Allreduce in place on buffers the host's ranks share (`crate::direct`): each rank reads
/// its part of every input where it lies and writes the result into every output, one read and
/// one write of the buffer (half the memory traffic of a transfer over a connection, which
/// copies in and out), behind two flag barriers (one after the buffers are announced, one
/// before they are handed back). Its bytes carry no `HOST_BYTE_PENALTY`: that prices the
/// staged path's slot copies, which this path does not make.
pub fn host_direct_allreduce(n: usize) -> Load {
    let nf = n as f64;
    Load {
        steps: 2.0 * HOST_STEP,
        link: 0.5,
        reduce: (nf - 1.0) / nf,
        ..Load::default()
    }
}

/// Allgather, broadcast or reduce-scatter in place on shared buffers (`crate::direct`): two flag
/// barriers, `copied` of the size copied by the busiest rank (allgather: its block into every
/// other output, `(n-1)/n`; broadcast: the root's buffer into its own, all of it;
/// reduce-scatter: its block written, `1/n`) and `reduced` of it reduced (reduce-scatter:
/// `(n-1)/n`).
pub fn host_direct(copied: f64, reduced: f64) -> Load {
    Load {
        steps: 2.0 * HOST_STEP,
        link: 0.5 * copied,
        reduce: reduced,
        ..Load::default()
    }
}

/// What a byte of broadcast in host memory costs against a byte sent over a connection: the
/// same, by measurements on this development machine (idle, 25 Nov 2026,
/// `CCL_ALGO=broadcast:shm` against the automatic choice, the ring, alternating, 6 sweeps each,
/// docs/algorithms.md): 0.53-0.97x the ring's time at 2 KiB-32 MiB with 2 ranks and 0.57-0.85x
/// with 4 on 2 CPUs. The root's copy in and the others' copy out move as many bytes through
/// memory as the ring does, behind fewer steps. [`HOST_BYTE_PENALTY`] had priced them at 4.
const HOST_COPY_BYTE: f64 = 1.0;

/// The same for allgather in host memory, measured the same way: 0.37-0.81x the ring's time
/// with 2 ranks up to 512 KiB, but 1.1-1.2x from 2 MiB (1.8x within a sweep of every size), and
/// 0.56-0.87x pairwise's with 4 ranks on 2 CPUs at 32 KiB-32 MiB. At 1.25 the model keeps the
/// ring for 2 ranks past a few KiB (a ring byte costs 1.0 there, and host memory's fewer steps
/// win only on small buffers) and takes host memory for 4 (pairwise's `(n-1)/n` on half the
/// bandwidth each).
const HOST_ALLGATHER_BYTE: f64 = 1.25;

/// A collective in host memory that copies the buffer `copies` times one after the other
/// (broadcast: the root's copy in, then the others' copy out), behind one flag barrier; bytes
/// at `HOST_COPY_BYTE`.
pub fn host_copy(copies: f64) -> Load {
    Load {
        steps: HOST_STEP,
        link: copies / 2.0 * HOST_COPY_BYTE,
        ..Load::default()
    }
}

/// Allgather (or reduce-scatter, with `reduces`) in host memory: allgather copies its block in
/// and the others' out, one buffer in all; reduce-scatter copies its whole input in, then
/// reduces its block out of every slot. Reduce-scatter keeps `HOST_BYTE_PENALTY`: measured as
/// above, it took 0.38-0.68x the ring's time up to 32 KiB with 2 ranks but 1.1-1.56x from
/// 128 KiB, and 1.3x pairwise's at 128 KiB-2 MiB with 4.
pub fn host_blocks(n: usize, reduces: bool) -> Load {
    let nf = n as f64;
    if !reduces {
        return Load {
            steps: HOST_STEP,
            link: 0.5 * HOST_ALLGATHER_BYTE,
            ..Load::default()
        };
    }
    Load {
        steps: HOST_STEP,
        link: (1.0 + 1.0 / nf) / 2.0 * HOST_BYTE_PENALTY,
        reduce: (nf - 1.0) / nf,
        ..Load::default()
    }
}

/// Gather or scatter straight to or from the root: one latency plus a per-message cost, and the
/// root's link carries `(n-1)/n` of the nccl-tests size (every other rank's block). A group of
/// `k` ranks sends its own blocks across its uplink, or, holding the root, receives the other
/// `n - k`: the larger crosses the busiest group's link.
pub fn rooted_direct(n: usize, topo: &Topology) -> Load {
    let sm = topo.summary();
    let nf = n as f64;
    let out = |k: usize| {
        if k >= n {
            0.0
        } else {
            k.max(n - k) as f64 / nf
        }
    };
    Load {
        steps: 1.0 + 0.25 * (nf - 1.0),
        link: (nf - 1.0) / nf,
        host: out(sm.max_per_host),
        rack: out(sm.max_per_rack),
        zone: out(sm.max_per_zone),
        reduce: 0.0,
        ..Load::default()
    }
}

/// The dissemination barrier: `ceil(log2 n)` rounds of one byte.
pub fn dissemination(n: usize) -> Load {
    Load {
        steps: n.next_power_of_two().trailing_zeros() as f64,
        ..Load::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binary_tree::{Tree, double_tree as trees};

    #[test]
    fn oversubscribed_ranks_pay_a_hand_off_per_step_and_share_the_cpus() {
        let p = TransportProperties {
            latency: Duration::from_micros(5),
            bandwidth: 3.0e9,
            spin: Duration::ZERO,
            host_memory: false,
        };
        // A CPU each (or an unknown CPU count): as the transport says.
        for (ranks, cpus) in [(2, 2), (1, 8), (4, 0)] {
            let q = on_shared_cpus(p, ranks, cpus);
            assert_eq!((q.latency, q.bandwidth), (p.latency, p.bandwidth));
        }
        let q = on_shared_cpus(p, 4, 2);
        assert_eq!(q.latency, Duration::from_micros(55));
        assert_eq!(q.bandwidth, 1.5e9);
        // A transport whose waits poll and yield hands over in a yield, not a wake-up.
        let polling = TransportProperties {
            spin: Duration::from_millis(1),
            ..p
        };
        let q = on_shared_cpus(polling, 4, 2);
        assert_eq!(q.latency, Duration::from_micros(10));
        assert_eq!(q.bandwidth, 1.5e9);
    }

    /// The depths the model charges are those of the trees the schedules use.
    #[test]
    fn model_depths_match_the_trees() {
        for n in 1..=200 {
            let order: Vec<usize> = (0..n).collect();
            let [a, b] = trees(&order, n);
            assert_eq!(double_tree_depth(n), a.depth().max(b.depth()), "n={n}");
            assert_eq!(rooted_depth(n), Tree::rooted(&order, n).depth(), "n={n}");
        }
    }
}
