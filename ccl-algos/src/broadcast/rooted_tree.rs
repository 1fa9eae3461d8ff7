//! Pipelined binary-tree broadcast rooted at `shape.root`.
//!
//! The tree is over the ring order rotated to start at the root: the root has one child, the
//! root of a balanced in-order binary tree over the other ranks, so the data reaches every rank
//! in at most `log2(n) + 1` hops and most hops stay inside a host. Every rank forwards to its
//! children what it has received so far (streaming), so the whole buffer flows down as one
//! pipeline; a rank with two children sends the buffer twice.
//!
//! NCCL semantics: the root's send buffer (its receive buffer, in place) ends up in every rank's
//! receive buffer; the root copies it locally when out of place. Other ranks never read their
//! send buffer.

use crate::binary_tree::{Tree, bcast_down, rotate_to};
use crate::schedule::{Action, Buf, Data, Region, Schedule, Shape};
use ccl_core::topology::Topology;

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("tree");
    if count == 0 {
        return sc.finish();
    }
    let whole = |buf: Buf| Region::new(buf, 0, count);
    let tree = Tree::rooted(&rotate_to(&topo.ring_order(), s.root), n);
    let src = if r == s.root {
        let src = if s.in_place { Buf::Recv } else { Buf::Send };
        Some(Data::ready(whole(src)))
    } else {
        None
    };
    bcast_down(&mut sc, &tree, r, src, whole(Buf::Recv), 0);
    if r == s.root && !s.in_place {
        sc.push_auto(
            Action::Copy {
                src: whole(Buf::Send),
                dst: whole(Buf::Recv),
            },
            None,
            0,
        );
    }
    sc.finish()
}
