//! Double-binary-tree allreduce (NCCL's tree algorithm).
//!
//! The buffer is cut in two halves; half `t` is reduced up tree `t` of a [`double_tree`] over the
//! ring order and broadcast back down the same tree. A rank is interior (has children) in at most
//! one tree, so its links carry about the same load in both; each half takes `depth` steps up and
//! `depth` down, `depth <= log2(n) + 1`: latency `O(log n)` instead of the ring's `2(n-1)` steps.
//!
//! Everything streams: a rank forwards its partial sum to its parent while its children's data is
//! still arriving, the root broadcasts each piece as soon as it is reduced, and every rank forwards
//! what it receives to its children at once, so the whole allreduce is one pipeline.
//!
//! Every element is reduced once, at its tree's root, and copied everywhere else: all ranks end
//! with the same bytes. Non-root ranks with children accumulate in scratch, so the result coming
//! down never waits for the partial sum going up.
//!
//! Wire order: all up-tree messages before all down-tree ones. Two ranks exchange at most one
//! message per direction per tree, and never two up-tree (or two down-tree) messages in one
//! direction (that would make a rank interior in both trees), so both ends agree on the order.

use crate::binary_tree::{bcast_down, double_tree, reduce_up};
use crate::schedule::{Buf, Data, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// The two halves: `(offset, length)` of half 0 and half 1.
pub fn halves(count: usize) -> [(usize, usize); 2] {
    let h0 = count.div_ceil(2);
    [(0, h0), (h0, count - h0)]
}

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("tree");
    let input_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        return super::alone(s, sc);
    }
    let trees = double_tree(&topo.ring_order(), n);
    let avg = s.op == ReduceOp::Avg;
    let mut result: [Option<Data>; 2] = [None, None];
    let depth = trees.iter().map(|t| t.depth()).max().unwrap_or(0) as u32;
    for (t, &(off, len)) in halves(count).iter().enumerate() {
        if len == 0 {
            continue;
        }
        let tree = &trees[t];
        let input = Data::ready(Region::new(input_buf, off, len));
        // Where partial sums accumulate: the result itself at the root; scratch at other ranks
        // with children (unused at leaves).
        let acc = if tree.parent(r).is_some() && tree.is_interior(r) {
            sc.scratch = sc.scratch.max(len);
            Region::new(Buf::Scratch, 0, len)
        } else {
            Region::new(Buf::Recv, off, len)
        };
        result[t] = Some(reduce_up(&mut sc, tree, r, input, acc, avg, 0));
    }
    for (t, &(off, len)) in halves(count).iter().enumerate() {
        if len == 0 {
            continue;
        }
        let tree = &trees[t];
        let src = (tree.parent(r).is_none()).then(|| result[t].expect("reduced"));
        bcast_down(
            &mut sc,
            tree,
            r,
            src,
            Region::new(Buf::Recv, off, len),
            depth,
        );
    }
    sc.finish()
}
