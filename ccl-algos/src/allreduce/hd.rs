//! Recursive halving-doubling allreduce (Rabenseifner's algorithm): a reduce-scatter by
//! recursive halving, then an allgather by recursive doubling. `2 log2(p)` steps and
//! `2(p-1)/p` of the buffer sent per rank: the ring's bandwidth with logarithmic latency.
//!
//! Ranks are taken in ring order (position `v`), so the largest exchanges pair neighbours, which
//! share a host where they can. The buffer is cut into `p` blocks (`p` the largest power of two
//! `<= n`). Reduce-scatter step `m = 1, 2, 4, ..., p/2` pairs `v` with `v ^ m`: of the blocks it
//! still holds, each rank sends those whose bit `m` differs from its own and reduces the others
//! with what its partner sends; at the end position `v` holds block `v`, fully reduced. Allgather
//! runs the steps backwards, copying.
//!
//! Any world size: the ranks at positions `p..n` first hand their data to positions `0..n-p`,
//! which reduce it into theirs (the "fold"), and get the result back at the end: two more steps
//! and one more buffer on those links.
//!
//! Every op works on one block, so a block is forwarded at the next step while it is still
//! arriving (sends and reductions stream from the receive that produced the block), and empty
//! blocks (count below `p`) cost nothing. Each block is reduced once, at its owner, in a fixed
//! order (lower position first), and copied everywhere else: bit-identical on every rank.

use crate::allreduce::ring::chunk;
use crate::schedule::{Action, Buf, Combine, Data, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// The largest power of two `<= n` (`n >= 1`).
pub fn core_size(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// `blocks` in the order position `v` wants them during reduce-scatter: the ones it passes on
/// soonest first (lowest bit where the block and `v` differ first), its own block last. The
/// blocks a rank passes on at one step arrived together, in this same order, at the step before,
/// so every send streams right behind the receive producing it.
fn rs_order(blocks: &[usize], v: usize, p: usize) -> Vec<usize> {
    let bits = p.trailing_zeros();
    let key = |b: usize| {
        if bits == 0 {
            0
        } else {
            (b ^ v).reverse_bits() >> (usize::BITS - bits)
        }
    };
    // Lowest differing bit first means the largest bit-reversed difference first.
    let mut out = blocks.to_vec();
    out.sort_by_key(|&b| std::cmp::Reverse(key(b)));
    out
}

/// The order in which position `v` holds final blocks after `k` allgather steps (its own, then
/// each step's arrivals in the order they came): the order it sends them in.
fn ag_order(v: usize, k: u32, p: usize) -> Vec<usize> {
    if k == 0 {
        return vec![v];
    }
    let m = p >> k;
    let mut out = ag_order(v, k - 1, p);
    out.extend(ag_order(v ^ m, k - 1, p));
    out
}

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let mut sc = Schedule::new("hd");
    if s.size == 1 {
        return super::alone(s, sc);
    }
    let h = Halving::new(s, topo);
    if h.pos >= h.p {
        h.fold_out(&mut sc);
        return sc.finish();
    }
    // Where each block's current value is and which op produces it.
    let mut cur: Vec<Data> = (0..h.p).map(|b| Data::ready(h.block(b, h.input))).collect();
    let folded = (h.pos + h.p < s.size).then(|| h.order[h.pos + h.p]);
    if let Some(f) = folded {
        h.fold_in(&mut sc, f, &mut cur);
    }
    h.reduce_scatter(&mut sc, &mut cur);
    h.allgather(&mut sc, &mut cur);
    if let Some(f) = folded {
        h.hand_back(&mut sc, f, &cur);
    }
    sc.finish()
}

/// What every phase of one rank's halving-doubling schedule needs to know.
struct Halving {
    order: Vec<usize>,
    /// This rank's position in the ring order.
    pos: usize,
    /// The largest power of two `<= n`, and its log: the steps of each phase.
    p: usize,
    steps: u32,
    count: usize,
    /// Where this rank's input is.
    input: Buf,
    avg: bool,
    /// Blocks that hold data.
    blocks: Vec<usize>,
}

impl Halving {
    fn new(s: &Shape, topo: &Topology) -> Halving {
        let order = topo.ring_order();
        let pos = order
            .iter()
            .position(|&x| x == s.rank)
            .expect("rank in order");
        let p = core_size(s.size);
        let mut h = Halving {
            order,
            pos,
            p,
            steps: p.trailing_zeros(),
            count: s.count,
            input: if s.in_place { Buf::Recv } else { Buf::Send },
            avg: s.op == ReduceOp::Avg,
            blocks: Vec::new(),
        };
        h.blocks = (0..p).filter(|&b| h.nonempty(b)).collect();
        h
    }

    fn block(&self, b: usize, buf: Buf) -> Region {
        let (off, len) = chunk(self.count, self.p, b);
        Region::new(buf, off, len)
    }

    fn nonempty(&self, b: usize) -> bool {
        self.block(b, Buf::Recv).len > 0
    }

    /// The non-empty blocks in the order position `v` holds them after `k` allgather steps.
    fn ag_blocks(&self, v: usize, k: u32) -> Vec<usize> {
        ag_order(v, k, self.p)
            .into_iter()
            .filter(|&b| self.nonempty(b))
            .collect()
    }

    /// A folded rank: hands every block to position `pos - p`, in the order it reduces them,
    /// and gets the results back in the order it finishes them.
    fn fold_out(&self, sc: &mut Schedule) {
        let v = self.pos - self.p;
        let partner = self.order[v];
        for b in rs_order(&self.blocks, v, self.p) {
            let src = self.block(b, self.input);
            sc.push_stream(Action::Send { peer: partner, src }, None, 0);
        }
        for b in self.ag_blocks(v, self.steps) {
            let dst = self.block(b, Buf::Recv);
            sc.push_stream(
                Action::Recv {
                    peer: partner,
                    dst,
                    combine: Combine::Copy,
                },
                None,
                1 + 2 * self.steps,
            );
        }
    }

    /// Reduces the folded rank `f`'s data into this rank's: own data first (lower position).
    fn fold_in(&self, sc: &mut Schedule, f: usize, cur: &mut [Data]) {
        for b in rs_order(&self.blocks, self.pos, self.p) {
            let dst = self.block(b, Buf::Recv);
            let with = (cur[b].region != dst).then_some(cur[b].region);
            let id = sc.push_stream(
                Action::Recv {
                    peer: f,
                    dst,
                    combine: Combine::Reduce {
                        with,
                        incoming_first: false,
                        finish_avg: false,
                    },
                },
                None,
                0,
            );
            cur[b] = Data {
                region: dst,
                producer: Some(id),
            };
        }
    }

    /// Reduce-scatter: before step `m`, this rank holds the blocks agreeing with its position
    /// below bit `m`; it passes on those whose bit `m` differs and reduces the others.
    fn reduce_scatter(&self, sc: &mut Schedule, cur: &mut [Data]) {
        let v = self.pos;
        for i in 0..self.steps {
            let m = 1usize << i;
            let u = v ^ m;
            let partner = self.order[u];
            let held: Vec<usize> = self
                .blocks
                .iter()
                .copied()
                .filter(|&b| b & (m - 1) == v & (m - 1))
                .collect();
            let give: Vec<usize> = held.iter().copied().filter(|&b| b & m != v & m).collect();
            let keep: Vec<usize> = held.iter().copied().filter(|&b| b & m == v & m).collect();
            for b in rs_order(&give, u, self.p) {
                sc.push_stream(
                    Action::Send {
                        peer: partner,
                        src: cur[b].region,
                    },
                    cur[b].producer,
                    1 + i,
                );
            }
            for b in rs_order(&keep, v, self.p) {
                let dst = self.block(b, Buf::Recv);
                let with = (cur[b].region != dst).then_some(cur[b].region);
                let id = sc.push_stream(
                    Action::Recv {
                        peer: partner,
                        dst,
                        combine: Combine::Reduce {
                            with,
                            incoming_first: u < v,
                            finish_avg: self.avg && i + 1 == self.steps,
                        },
                    },
                    cur[b].producer,
                    1 + i,
                );
                cur[b] = Data {
                    region: dst,
                    producer: Some(id),
                };
            }
        }
    }

    /// Allgather: step `k` (`m = p/2, p/4, ..., 1`) sends everything held, in the order it was
    /// finished, and receives the partner's.
    fn allgather(&self, sc: &mut Schedule, cur: &mut [Data]) {
        let v = self.pos;
        for k in 0..self.steps {
            let m = self.p >> (k + 1);
            let partner = self.order[v ^ m];
            let step = 1 + self.steps + k;
            for b in self.ag_blocks(v, k) {
                sc.push_stream(
                    Action::Send {
                        peer: partner,
                        src: cur[b].region,
                    },
                    cur[b].producer,
                    step,
                );
            }
            for b in self.ag_blocks(v ^ m, k) {
                let dst = self.block(b, Buf::Recv);
                let id = sc.push_stream(
                    Action::Recv {
                        peer: partner,
                        dst,
                        combine: Combine::Copy,
                    },
                    None,
                    step,
                );
                cur[b] = Data {
                    region: dst,
                    producer: Some(id),
                };
            }
        }
    }

    /// Sends the folded rank `f` the result, in the order this rank finished it.
    fn hand_back(&self, sc: &mut Schedule, f: usize, cur: &[Data]) {
        for b in self.ag_blocks(self.pos, self.steps) {
            sc.push_stream(
                Action::Send {
                    peer: f,
                    src: cur[b].region,
                },
                cur[b].producer,
                1 + 2 * self.steps,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_sizes() {
        let want = [
            (1, 1),
            (2, 2),
            (3, 2),
            (4, 4),
            (7, 4),
            (8, 8),
            (63, 32),
            (64, 64),
        ];
        for (n, p) in want {
            assert_eq!(core_size(n), p, "n={n}");
        }
    }

    #[test]
    fn orders() {
        // Position 0 of 8 passes odd blocks on at step 1 (7 first: it travels furthest), then 6
        // and 2 at step 2, 4 at step 3, and keeps 0.
        assert_eq!(
            rs_order(&(0..8).collect::<Vec<_>>(), 0, 8),
            [7, 3, 5, 1, 6, 2, 4, 0]
        );
        // Position 1 receives 7, 3, 5, 1 from 0 at step 1, in the order 0 sends them.
        assert_eq!(rs_order(&[1, 3, 5, 7], 1, 8), [7, 3, 5, 1]);
        assert_eq!(rs_order(&[0, 1], 1, 2), [0, 1]);
        assert_eq!(ag_order(5, 0, 8), [5]);
        assert_eq!(ag_order(5, 1, 8), [5, 1]);
        assert_eq!(ag_order(5, 3, 8), [5, 1, 7, 3, 4, 0, 6, 2]);
        let mut all = ag_order(3, 3, 8);
        all.sort();
        assert_eq!(all, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn bytes_match_the_ring_at_powers_of_two() {
        let count = 1 << 16;
        for n in [2, 4, 8, 16] {
            let sc = build(
                &Shape::new(1, n, count, false, ReduceOp::Sum),
                &Topology::flat(n),
            );
            let ideal = 2 * (n - 1) * count / n * 4;
            assert_eq!(sc.bytes_sent(4), ideal, "n={n}");
        }
    }
}
