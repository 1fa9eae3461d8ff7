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
use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};
use crate::tree::Data;
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// The largest power of two `<= n` (`n >= 1`).
pub fn core_size(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("hd");
    let input_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        if !s.in_place && count > 0 {
            sc.push_auto(
                Action::Copy {
                    src: Region::new(Buf::Send, 0, count),
                    dst: Region::new(Buf::Recv, 0, count),
                },
                None,
                0,
            );
        }
        return sc.finish();
    }
    let order = topo.ring_order();
    let pos = order.iter().position(|&x| x == r).expect("rank in order");
    let p = core_size(n);
    let avg = s.op == ReduceOp::Avg;
    let block = |b: usize, buf: Buf| {
        let (off, len) = chunk(count, p, b);
        Region::new(buf, off, len)
    };
    // Blocks that hold data, in order.
    let blocks: Vec<usize> = (0..p).filter(|&b| block(b, Buf::Recv).len > 0).collect();

    if pos >= p {
        // Folded: hand every block to position pos - p, get the results back.
        let partner = order[pos - p];
        for &b in &blocks {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: block(b, input_buf),
                },
                None,
                0,
            );
        }
        let last = 1 + 2 * p.trailing_zeros();
        for &b in &blocks {
            sc.push_stream(
                Action::Recv {
                    peer: partner,
                    dst: block(b, Buf::Recv),
                    combine: Combine::Copy,
                },
                None,
                last,
            );
        }
        return sc.finish();
    }

    // Where each block's current value is and which op produces it.
    let mut cur: Vec<Data> = (0..p).map(|b| Data::ready(block(b, input_buf))).collect();
    let folded = (pos + p < n).then(|| order[pos + p]);
    if let Some(f) = folded {
        // Absorb the folded rank's data: own data first (lower position).
        for &b in &blocks {
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

    let v = pos;
    let steps = p.trailing_zeros();
    // Reduce-scatter: before step m, this rank holds the blocks agreeing with v below bit m.
    for i in 0..steps {
        let m = 1usize << i;
        let partner = order[v ^ m];
        let held = |b: usize| b & (m - 1) == v & (m - 1);
        for &b in blocks.iter().filter(|&&b| held(b) && b & m != v & m) {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: cur[b].region,
                },
                cur[b].producer,
                1 + i,
            );
        }
        for &b in blocks.iter().filter(|&&b| held(b) && b & m == v & m) {
            let dst = block(b, Buf::Recv);
            let with = (cur[b].region != dst).then_some(cur[b].region);
            let id = sc.push_stream(
                Action::Recv {
                    peer: partner,
                    dst,
                    combine: Combine::Reduce {
                        with,
                        incoming_first: (v ^ m) < v,
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
    // Allgather: before step m (going down), this rank holds the blocks agreeing with v below
    // bit 2m; it sends them and receives its partner's.
    for i in (0..steps).rev() {
        let m = 1usize << i;
        let partner = order[v ^ m];
        let mask = 2 * m - 1;
        let step = 1 + steps + (steps - 1 - i);
        for &b in blocks.iter().filter(|&&b| b & mask == v & mask) {
            sc.push_stream(
                Action::Send {
                    peer: partner,
                    src: cur[b].region,
                },
                cur[b].producer,
                step,
            );
        }
        for &b in blocks.iter().filter(|&&b| b & mask == (v ^ m) & mask) {
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
        for &b in &blocks {
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
