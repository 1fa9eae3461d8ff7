//! Topology-aware hierarchical allreduce: reduce inside each host to a leader, allreduce among
//! the leaders across hosts (a ring in topology order, so it enters and leaves each rack and zone
//! once), broadcast inside each host.
//!
//! Only leaders touch the network: with `k` ranks per host, a host sends `2(h-1)/h` of the buffer
//! (`h` hosts) instead of `k` times that, at the price of `2 log2(k)` more steps inside the host.
//!
//! Inside a host the reduce and the broadcast run over a binary tree rooted at the leader (the
//! host's first rank in ring order). The buffer is cut into the leaders' ring chunks and every
//! phase works chunk by chunk, in the order the ring consumes (and produces) them, with every op
//! streaming from the one producing its data: the ring starts on the first chunk while the host
//! is still reducing the next, and the host broadcast of a chunk starts as soon as the ring has
//! finished it. Each element is reduced once, along a fixed path, and copied to every rank:
//! bit-identical everywhere.

use crate::allreduce::ring::{self, chunk};
use crate::binary_tree::{Tree, bcast_down, reduce_up};
use crate::schedule::{Buf, Data, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("hier");
    let input_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        return super::alone(s, sc);
    }
    let groups = topo.host_groups();
    let leaders: Vec<usize> = groups.iter().map(|g| g[0]).collect();
    let hosts = leaders.len();
    let gi = groups
        .iter()
        .position(|g| g.contains(&r))
        .expect("rank on a host");
    let group = &groups[gi];
    let host_tree = Tree::rooted(group, n);
    let leader = group[0] == r;
    let avg = s.op == ReduceOp::Avg;
    // The leaders' ring chunks (one chunk when there is a single host), in the order the ring at
    // this host's position consumes them and finishes them.
    let (reduce_order, bcast_order) = if hosts == 1 {
        (vec![0], vec![0])
    } else {
        (ring::input_order(gi, hosts), ring::output_order(gi, hosts))
    };
    let at = |k: usize, buf: Buf| {
        let (off, len) = chunk(count, hosts, k);
        Region::new(buf, off, len)
    };
    let interior_member = !leader && host_tree.is_interior(r);
    if interior_member {
        sc.scratch = count;
    }
    let depth = host_tree.depth() as u32;

    // Reduce inside the host, chunk by chunk. With a single host the leader's last reduction
    // completes the sum, so it divides an average.
    let mut partial: Vec<Data> = (0..hosts).map(|k| Data::ready(at(k, input_buf))).collect();
    for &k in &reduce_order {
        if at(k, Buf::Recv).len == 0 {
            continue;
        }
        let acc = if interior_member {
            at(k, Buf::Scratch)
        } else {
            at(k, Buf::Recv)
        };
        partial[k] = reduce_up(
            &mut sc,
            &host_tree,
            r,
            Data::ready(at(k, input_buf)),
            acc,
            avg && hosts == 1,
            0,
        );
    }

    // Across hosts, among leaders.
    let mut result = partial;
    if leader && hosts > 1 {
        result = ring::emit(&mut sc, &leaders, r, count, &result, avg, depth);
    }

    // Broadcast inside the host, chunk by chunk as they are finished.
    let base = depth + if hosts > 1 { 2 * (hosts as u32 - 1) } else { 0 };
    for &k in &bcast_order {
        let dst = at(k, Buf::Recv);
        if dst.len == 0 {
            continue;
        }
        let src = leader.then_some(result[k]);
        bcast_down(&mut sc, &host_tree, r, src, dst, base);
    }
    sc.finish()
}
