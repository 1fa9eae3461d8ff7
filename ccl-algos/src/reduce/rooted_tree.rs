//! Pipelined binary-tree reduce to `shape.root`.
//!
//! The tree is over the ring order rotated to start at the root (see
//! [`crate::broadcast::rooted_tree`]). Every rank combines its input with its children's partial results
//! (own data first, then children in order) and streams the combination to its parent while it
//! is still arriving; the root ends with the full reduction, divided once for an average.
//!
//! NCCL semantics: only the root's receive buffer holds the result. Other ranks accumulate in
//! scratch and never write their receive buffer (in place, it is their input and is only read).

use crate::binary_tree::{Tree, reduce_up, rotate_to};
use crate::schedule::{Action, Buf, Data, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("tree");
    if count == 0 {
        return sc.finish();
    }
    let whole = |buf: Buf| Region::new(buf, 0, count);
    let input = Data::ready(whole(if s.in_place { Buf::Recv } else { Buf::Send }));
    if n == 1 {
        if !s.in_place {
            sc.push_auto(
                Action::Copy {
                    src: whole(Buf::Send),
                    dst: whole(Buf::Recv),
                },
                None,
                0,
            );
        }
        return sc.finish();
    }
    let tree = Tree::rooted(&rotate_to(&topo.ring_order(), s.root), n);
    let acc = if r == s.root {
        whole(Buf::Recv)
    } else {
        if tree.is_interior(r) {
            sc.scratch = count;
        }
        whole(Buf::Scratch)
    };
    reduce_up(&mut sc, &tree, r, input, acc, s.op == ReduceOp::Avg, 0);
    sc.finish()
}
