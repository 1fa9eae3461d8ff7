//! The shape of the job monitor: an F-ary tree over the ranks, so that the root holds a few
//! connections however many ranks the job has.
//!
//! With `L = ceil(log_F N)` levels, rank `r` is at level `j`, the largest `j < L` with `F^j`
//! dividing `r` (rank 0 at the top level, `L - 1`). A rank below the top level reports to its
//! *hub* `r - (r mod F^(j+1))`; the top-level ranks (the multiples of `F^(L-1)`) report to the
//! root itself, which so holds at most `F` connections. With `N <= F` every rank is at the top:
//! the star the monitor always was. A hub's subtree is the block `[r, r + F^j)`: launchers place
//! consecutive ranks on one host, so most lines stay within a host.
//!
//! Everything here is arithmetic on `(N, F)`, which every rank knows; nothing is exchanged.

/// The monitor tree of `n` ranks with fan-out `f`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tree {
    n: usize,
    f: usize,
    levels: u32,
}

impl Tree {
    /// The tree of `n >= 1` ranks with fan-out `f >= 2` (smaller values are taken as 2).
    pub(crate) fn new(n: usize, f: usize) -> Tree {
        let f = f.max(2);
        let mut levels = 1;
        let mut span = f;
        while span < n {
            span = span.saturating_mul(f);
            levels += 1;
        }
        Tree { n, f, levels }
    }

    pub(crate) fn fanout(&self) -> usize {
        self.f
    }

    /// Whether every rank reports to the root directly.
    pub(crate) fn is_star(&self) -> bool {
        self.levels == 1
    }

    fn pow(&self, j: u32) -> usize {
        self.f.saturating_pow(j)
    }

    /// The level of rank `r` (0 for a leaf).
    pub(crate) fn level(&self, r: usize) -> u32 {
        let mut j = 0;
        while j + 1 < self.levels && r % self.pow(j + 1) == 0 {
            j += 1;
        }
        j
    }

    /// The hub rank `r` reports to, or `None` for the root.
    pub(crate) fn parent(&self, r: usize) -> Option<usize> {
        let j = self.level(r);
        (j + 1 < self.levels).then(|| r - r % self.pow(j + 1))
    }

    /// The first rank after the subtree of `r`.
    pub(crate) fn end(&self, r: usize) -> usize {
        r.saturating_add(self.pow(self.level(r))).min(self.n)
    }

    /// Whether rank `r` has ranks reporting to it.
    pub(crate) fn is_hub(&self, r: usize) -> bool {
        r < self.n && self.children(Some(r)).next().is_some()
    }

    /// The ranks that report to `hub` (`None`: the root), in rank order.
    pub(crate) fn children(&self, hub: Option<usize>) -> impl Iterator<Item = usize> + '_ {
        let (start, top) = match hub {
            Some(h) => (h, self.level(h)),
            None => (0, self.levels),
        };
        // A child at level i < top sits at start + m * F^i, 0 < m < F; the root's children
        // are the multiples of F^(L-1), m = 0 included.
        (0..top).rev().flat_map(move |i| {
            let step = self.pow(i);
            let first = if hub.is_none() { 0 } else { 1 };
            (first..self.f)
                .map(move |m| start + m * step)
                .filter(move |&c| c < self.n && (hub.is_some() || i + 1 == top))
        })
    }

    /// The child of `hub` (`None`: the root) whose subtree holds rank `t`, if `t` is below it.
    pub(crate) fn toward(&self, hub: Option<usize>, t: usize) -> Option<usize> {
        if t >= self.n {
            return None;
        }
        let mut a = t;
        loop {
            let p = self.parent(a);
            if p == hub {
                return (Some(a) != hub).then_some(a);
            }
            a = p?;
        }
    }

    /// `r` and its hubs up to the top, lowest first.
    pub(crate) fn path(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(Some(r), move |&a| self.parent(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_f_ranks_is_a_star() {
        for n in 1..=8 {
            let t = Tree::new(n, 8);
            assert!(t.is_star());
            for r in 0..n {
                assert_eq!(t.parent(r), None);
                assert!(!t.is_hub(r));
            }
            assert_eq!(
                t.children(None).collect::<Vec<_>>(),
                (0..n).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn two_levels() {
        let t = Tree::new(16, 4);
        assert_eq!(t.children(None).collect::<Vec<_>>(), [0, 4, 8, 12]);
        assert_eq!(t.children(Some(4)).collect::<Vec<_>>(), [5, 6, 7]);
        assert_eq!(t.parent(7), Some(4));
        assert_eq!(t.parent(8), None);
        assert_eq!(t.end(8), 12);
        assert_eq!(t.toward(None, 13), Some(12));
        assert_eq!(t.toward(Some(12), 13), Some(13));
        assert_eq!(t.toward(Some(4), 13), None);
        assert_eq!(t.toward(Some(13), 13), None);
    }

    /// Every rank has exactly one way up; children, parents, subtrees and routes agree, for
    /// sizes around the powers of the fan-out.
    #[test]
    fn parents_children_and_routes_agree() {
        for f in [2, 3, 4, 64] {
            for n in [1, 2, 3, f - 1, f, f + 1, f * f - 1, f * f, f * f + 1, 300] {
                let n = n.max(1);
                let t = Tree::new(n, f);
                let mut seen = vec![0; n];
                for hub in std::iter::once(None).chain((0..n).map(Some)) {
                    let kids: Vec<usize> = t.children(hub).collect();
                    assert!(
                        kids.len() <= f * t.levels as usize,
                        "n {n} f {f} hub {hub:?}"
                    );
                    for c in kids {
                        assert_eq!(t.parent(c), hub, "n {n} f {f}");
                        seen[c] += 1;
                        if let Some(h) = hub {
                            assert!(h < c && t.end(c) <= t.end(h), "n {n} f {f} {h} {c}");
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "n {n} f {f}: {seen:?}");
                assert!(t.children(None).count() <= f, "n {n} f {f}");
                for r in 0..n {
                    let path: Vec<usize> = t.path(r).collect();
                    assert!(path.len() <= t.levels as usize);
                    let top = *path.last().expect("r itself");
                    assert_eq!(t.toward(None, r), Some(top));
                    for w in path.windows(2) {
                        assert_eq!(t.toward(Some(w[1]), r), Some(w[0]));
                        assert!(w[1] <= r && r < t.end(w[1]));
                    }
                }
            }
        }
    }
}
