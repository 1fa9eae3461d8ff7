//! Binary trees over ranks, and the two moves every tree algorithm is made of: reduce toward the
//! root and broadcast away from it, each pipelined by streaming.
//!
//! Trees are **in order** over a list of ranks (usually [`Topology::ring_order`]): every subtree
//! covers a contiguous run of the list, so most edges join neighbours in the list (ranks of one
//! host), as in NCCL's `ncclGetBtree`.
//!
//! The **double binary tree** ([`double_tree`], NCCL's `ncclGetDtree`) is two trees in which
//! every rank is interior in at most one. Cutting the buffer in two and sending each half
//! through one tree uses every rank's links about evenly, while each half still takes `log2 n`
//! steps to reach the root and `log2 n` to come back.
//!
//! [`Topology::ring_order`]: ccl_core::topology::Topology::ring_order

use crate::schedule::{Action, Combine, Data, Region, Schedule};

/// A tree over some ranks: parent and children of each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub root: usize,
    parent: Vec<Option<usize>>,
    children: Vec<Vec<usize>>,
    member: Vec<bool>,
}

impl Tree {
    fn empty(n: usize, root: usize) -> Tree {
        Tree {
            root,
            parent: vec![None; n],
            children: vec![Vec::new(); n],
            member: vec![false; n],
        }
    }

    /// The parent of `rank` (`None` for the root).
    pub fn parent(&self, rank: usize) -> Option<usize> {
        self.parent[rank]
    }

    /// The children of `rank`, in the order their data is combined.
    pub fn children(&self, rank: usize) -> &[usize] {
        &self.children[rank]
    }

    /// Whether `rank` is in the tree.
    pub fn contains(&self, rank: usize) -> bool {
        self.member.get(rank).copied().unwrap_or(false)
    }

    /// Whether `rank` has children.
    pub fn is_interior(&self, rank: usize) -> bool {
        !self.children[rank].is_empty()
    }

    /// Edges on the longest path from the root to a leaf.
    pub fn depth(&self) -> usize {
        let mut best = 0;
        let mut stack = vec![(self.root, 0)];
        while let Some((r, d)) = stack.pop() {
            best = best.max(d);
            stack.extend(self.children[r].iter().map(|&c| (c, d + 1)));
        }
        best
    }

    fn link(&mut self, parent: usize, child: usize) {
        self.parent[child] = Some(parent);
        self.children[parent].push(child);
    }

    /// Builds an in-order balanced subtree over `order[lo..=hi]`; returns its root.
    ///
    /// For a run of odd length the tree is full (every interior node has two children) and
    /// its interior nodes sit at the odd offsets of the run.
    fn inorder(&mut self, order: &[usize], lo: usize, hi: usize) -> usize {
        let len = hi - lo + 1;
        for &r in &order[lo..=hi] {
            self.member[r] = true;
        }
        if len == 1 {
            return order[lo];
        }
        // Levels below the root: floor(log2(len)); the left subtree is perfect.
        let h = (usize::BITS - len.leading_zeros()) as usize - 1;
        let left = ((1usize << h) - 1).min(len - 1);
        let m = lo + left;
        let root = order[m];
        if left > 0 {
            let l = self.inorder(order, lo, m - 1);
            self.link(root, l);
        }
        if m < hi {
            let r = self.inorder(order, m + 1, hi);
            self.link(root, r);
        }
        root
    }

    /// A balanced in-order binary tree over `order`, ranks below `n`.
    pub fn over(order: &[usize], n: usize) -> Tree {
        assert!(!order.is_empty());
        let mut t = Tree::empty(n, order[0]);
        t.root = t.inorder(order, 0, order.len() - 1);
        t
    }

    /// A binary tree over `order` rooted at `order[0]`, which has one child: the root of a
    /// balanced in-order tree over the rest.
    pub fn rooted(order: &[usize], n: usize) -> Tree {
        assert!(!order.is_empty());
        let mut t = Tree::empty(n, order[0]);
        t.member[order[0]] = true;
        if order.len() > 1 {
            let c = t.inorder(order, 1, order.len() - 1);
            t.link(order[0], c);
        }
        t
    }

    /// The same tree with every rank `r` renamed `f(r)`.
    fn map(&self, n: usize, f: impl Fn(usize) -> usize) -> Tree {
        let mut t = Tree::empty(n, f(self.root));
        for r in 0..self.member.len() {
            if self.member[r] {
                t.member[f(r)] = true;
                t.parent[f(r)] = self.parent[r].map(&f);
                t.children[f(r)] = self.children[r].iter().map(|&c| f(c)).collect();
            }
        }
        t
    }
}

/// The ranks of `order` (all `n` ranks) rotated to start at `root`.
pub fn rotate_to(order: &[usize], root: usize) -> Vec<usize> {
    let i = order
        .iter()
        .position(|&r| r == root)
        .expect("root is in the order");
    order[i..].iter().chain(&order[..i]).copied().collect()
}

/// NCCL-style double binary tree over the ranks of `order` (all `n` ranks): two trees in which
/// every rank is interior in at most one.
///
/// With positions `0..n` in `order`: for even `n`, the first tree is position 0 above a full
/// in-order tree over positions `1..n` (interior: the even positions) and the second its mirror
/// image `p -> n-1-p` (interior: the odd positions). For odd `n`, the first is a full in-order
/// tree over all positions (interior: the odd ones) and the second the same shifted by one
/// (interior: the even ones but 0, which is a leaf in both).
pub fn double_tree(order: &[usize], n: usize) -> [Tree; 2] {
    assert_eq!(order.len(), n);
    let pos: Vec<usize> = (0..n).collect();
    let (t0, t1) = if n % 2 == 0 {
        let t = Tree::rooted(&pos, n);
        let m = t.map(n, |p| n - 1 - p);
        (t, m)
    } else {
        let t = Tree::over(&pos, n);
        let s = t.map(n, |p| (p + 1) % n);
        (t, s)
    };
    [t0.map(n, |p| order[p]), t1.map(n, |p| order[p])]
}

/// Emits `rank`'s part of reducing one region up `tree`: it combines its `input` with what its
/// children send (in child order, own data first) into `acc`, and sends the result to its parent.
/// The root ends with the full reduction in `acc`, divided for an average if `finish_avg`.
/// Every receive streams from the one before it and the send to the parent streams from the
/// last receive, so data flows up the tree as it arrives.
///
/// Returns where this rank's partial result is: `acc` for ranks with children, `input` for
/// leaves.
pub fn reduce_up(
    sc: &mut Schedule,
    tree: &Tree,
    rank: usize,
    input: Data,
    acc: Region,
    finish_avg: bool,
    step: u32,
) -> Data {
    let kids = tree.children(rank);
    let is_root = tree.parent(rank).is_none();
    let mut cur = input;
    for (i, &child) in kids.iter().enumerate() {
        let with = (cur.region != acc).then_some(cur.region);
        let id = sc.push_stream(
            Action::Recv {
                peer: child,
                dst: acc,
                combine: Combine::Reduce {
                    with,
                    incoming_first: false,
                    finish_avg: finish_avg && is_root && i + 1 == kids.len(),
                },
            },
            cur.producer,
            step,
        );
        cur = Data {
            region: acc,
            producer: Some(id),
        };
    }
    if let Some(parent) = tree.parent(rank) {
        sc.push_stream(
            Action::Send {
                peer: parent,
                src: cur.region,
            },
            cur.producer,
            step,
        );
    }
    cur
}

/// Emits `rank`'s part of broadcasting one region down `tree`: the root sends `src` to its
/// children; every other rank receives into `dst` from its parent and forwards it to its
/// children as it arrives. Returns where this rank's copy is.
pub fn bcast_down(
    sc: &mut Schedule,
    tree: &Tree,
    rank: usize,
    src: Option<Data>,
    dst: Region,
    step: u32,
) -> Data {
    let have = match tree.parent(rank) {
        None => src.expect("the root has the data"),
        Some(parent) => {
            let id = sc.push_stream(
                Action::Recv {
                    peer: parent,
                    dst,
                    combine: Combine::Copy,
                },
                None,
                step,
            );
            Data {
                region: dst,
                producer: Some(id),
            }
        }
    };
    for &child in tree.children(rank) {
        sc.push_stream(
            Action::Send {
                peer: child,
                src: have.region,
            },
            have.producer,
            step,
        );
    }
    have
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_tree(t: &Tree, members: &[usize]) {
        // Every member but the root has a parent that lists it as a child; no cycles.
        for &r in members {
            assert!(t.contains(r));
            match t.parent(r) {
                None => assert_eq!(r, t.root),
                Some(p) => assert!(t.children(p).contains(&r)),
            }
            assert!(t.children(r).len() <= 2);
        }
        let mut seen = vec![false; t.member.len()];
        let mut stack = vec![t.root];
        let mut count = 0;
        while let Some(r) = stack.pop() {
            assert!(!seen[r], "cycle at {r}");
            seen[r] = true;
            count += 1;
            stack.extend(t.children(r));
        }
        assert_eq!(count, members.len());
    }

    fn log2_ceil(n: usize) -> usize {
        n.next_power_of_two().trailing_zeros() as usize
    }

    #[test]
    fn double_tree_interior_in_at_most_one() {
        for n in 1..=130 {
            // A scrambled order, to show the property does not depend on it.
            let order: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
            let mut sorted = order.clone();
            sorted.sort();
            if sorted != (0..n).collect::<Vec<_>>() {
                continue;
            }
            let [a, b] = double_tree(&order, n);
            check_tree(&a, &order);
            check_tree(&b, &order);
            for r in 0..n {
                assert!(
                    !(a.is_interior(r) && b.is_interior(r)),
                    "n={n}: rank {r} is interior in both trees"
                );
            }
            // log2(n) latency.
            assert!(a.depth() <= log2_ceil(n + 1), "n={n} depth {}", a.depth());
            assert!(b.depth() <= log2_ceil(n + 1), "n={n} depth {}", b.depth());
            if n > 1 {
                assert_ne!(a.root, b.root);
            }
        }
    }

    #[test]
    fn trees_are_in_order_and_local() {
        // 8 ranks: subtrees are contiguous runs, so edges join near neighbours.
        let order: Vec<usize> = (0..8).collect();
        let [a, b] = double_tree(&order, 8);
        assert_eq!(a.root, 0);
        assert_eq!(a.children(0), &[4]);
        assert_eq!(a.children(4), &[2, 6]);
        assert_eq!(a.children(2), &[1, 3]);
        assert_eq!(a.children(6), &[5, 7]);
        assert_eq!(b.root, 7);
        assert_eq!(b.children(3), &[5, 1]);
        let r = Tree::rooted(&rotate_to(&order, 5), 8);
        assert_eq!(r.root, 5);
        check_tree(&r, &order);
        assert!(r.depth() <= 4);
        let t = Tree::over(&[3], 8);
        assert_eq!(t.root, 3);
        assert_eq!(t.depth(), 0);
    }
}
