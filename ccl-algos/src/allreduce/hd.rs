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
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("hd");
    let input_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        return super::alone(s, sc);
    }
    let order = topo.ring_order();
    let pos = order.iter().position(|&x| x == r).expect("rank in order");
    let p = core_size(n);
    let steps = p.trailing_zeros();
    let avg = s.op == ReduceOp::Avg;
    let block = |b: usize, buf: Buf| {
        let (off, len) = chunk(count, p, b);
        Region::new(buf, off, len)
    };
    let nonempty = |b: &usize| block(*b, Buf::Recv).len > 0;
    // Blocks that hold data.
    let blocks: Vec<usize> = (0..p).filter(nonempty).collect();

    if pos >= p {
        // Folded: hand every block to position pos - p, in the order it reduces them, and get
        // the results back in the order it finishes them.
        let v = pos - p;
        let partner = order[v];
        for b in rs_order(&blocks, v, p) {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: block(b, input_buf),
                },
                None,
                0,
            );
        }
        for b in ag_order(v, steps, p).into_iter().filter(nonempty) {
            sc.push_stream(
                Action::Recv {
                    peer: partner,
                    dst: block(b, Buf::Recv),
                    combine: Combine::Copy,
                },
                None,
                1 + 2 * steps,
            );
        }
        return sc.finish();
    }

    let v = pos;
    // Where each block's current value is and which op produces it.
    let mut cur: Vec<Data> = (0..p).map(|b| Data::ready(block(b, input_buf))).collect();
    let folded = (pos + p < n).then(|| order[pos + p]);
    if let Some(f) = folded {
        // Absorb the folded rank's data: own data first (lower position).
        for b in rs_order(&blocks, v, p) {
            let dst = block(b, Buf::Recv);
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

    // Reduce-scatter: before step m, this rank holds the blocks agreeing with v below bit m.
    for i in 0..steps {
        let m = 1usize << i;
        let u = v ^ m;
        let partner = order[u];
        let held: Vec<usize> = blocks
            .iter()
            .copied()
            .filter(|&b| b & (m - 1) == v & (m - 1))
            .collect();
        let give: Vec<usize> = held.iter().copied().filter(|&b| b & m != v & m).collect();
        let keep: Vec<usize> = held.iter().copied().filter(|&b| b & m == v & m).collect();
        for b in rs_order(&give, u, p) {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: cur[b].region,
                },
                cur[b].producer,
                1 + i,
            );
        }
        for b in rs_order(&keep, v, p) {
            let dst = block(b, Buf::Recv);
            let with = (cur[b].region != dst).then_some(cur[b].region);
            let id = sc.push_stream(
                Action::Recv {
                    peer: partner,
                    dst,
                    combine: Combine::Reduce {
                        with,
                        incoming_first: u < v,
                        finish_avg: avg && i + 1 == steps,
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
    // Allgather: step k (m = p/2, p/4, ..., 1) sends everything held, in the order it was
    // finished, and receives the partner's.
    for k in 0..steps {
        let m = p >> (k + 1);
        let partner = order[v ^ m];
        let step = 1 + steps + k;
        for b in ag_order(v, k, p).into_iter().filter(nonempty) {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: cur[b].region,
                },
                cur[b].producer,
                step,
            );
        }
        for b in ag_order(v ^ m, k, p).into_iter().filter(nonempty) {
            let dst = block(b, Buf::Recv);
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
    if let Some(f) = folded {
        for b in ag_order(v, steps, p).into_iter().filter(nonempty) {
            sc.push_stream(
                Action::Send {
                    peer: f,
                    src: cur[b].region,
                },
                cur[b].producer,
                1 + 2 * steps,
            );
        }
    }
    sc.finish()
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
