//! Ring allreduce: reduce-scatter, then allgather, around the ring of [`Topology::ring_order`]
//! (rank `r`'s successor is the next rank in that order, so neighbours share a host where they
//! can, then a rack, then a zone).
//!
//! The buffer is cut into `n` chunks. With `p` the rank's position in the ring, in reduce-scatter
//! step `s` it sends chunk `p-s` to its successor and receives chunk `p-s-1` from its
//! predecessor, reducing it with its own data; after `n-1` steps it holds chunk `p+1` fully
//! reduced. Allgather then passes the reduced chunks around for `n-1` more steps, copying. Each
//! rank sends `2(n-1)/n` of the buffer: bandwidth-optimal.
//!
//! Every chunk is reduced once, along the ring in a fixed order, and then copied: all ranks end
//! with the same bytes. Each send streams from the receive that produced its data, so a step
//! forwards data while it is still arriving (pipelining within and across steps).
//!
//! [`Topology::ring_order`]: ccl_core::topology::Topology::ring_order

use crate::schedule::{Action, Buf, Combine, Data, OpId, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// The `n` chunks of `count` elements: the first `count % n` get one element more.
pub fn chunk(count: usize, n: usize, k: usize) -> (usize, usize) {
    let base = count / n;
    let rem = count % n;
    let off = k * base + k.min(rem);
    (off, base + usize::from(k < rem))
}

pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    let src_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        return super::alone(s, sc);
    }
    let order = topo.ring_order();
    let input: Vec<Data> = (0..n)
        .map(|k| {
            let (off, len) = chunk(count, n, k);
            Data::ready(Region::new(src_buf, off, len))
        })
        .collect();
    emit(&mut sc, &order, r, count, &input, s.op == ReduceOp::Avg, 0);
    sc.finish()
}

/// Order in which `emit` needs the local input chunks (by chunk index) at ring position `p` of
/// `m`: chunk `p` first (sent at step 0), then `p-1`, `p-2`, ... (reduced at steps 0, 1, ...).
pub fn input_order(p: usize, m: usize) -> Vec<usize> {
    (0..m).map(|s| (p + m - s) % m).collect()
}

/// Order in which `emit` finishes the chunks at ring position `p` of `m`: chunk `p+1` at the end
/// of reduce-scatter, then `p`, `p-1`, ... as allgather brings them.
pub fn output_order(p: usize, m: usize) -> Vec<usize> {
    (0..m).map(|s| (p + 1 + m - s) % m).collect()
}

/// Emits `rank`'s part of a ring allreduce over the ranks of `order` (at least two; `rank` among
/// them) of `count` elements cut into `order.len()` chunks. `input[k]` is where this rank's
/// contribution to chunk `k` is (its producer, if any, is streamed from); the result ends in the
/// receive buffer. `finish_avg` divides each chunk at its last reduction. Returns, per chunk,
/// where the final result is and the op that produces it.
pub fn emit(
    sc: &mut Schedule,
    order: &[usize],
    rank: usize,
    count: usize,
    input: &[Data],
    finish_avg: bool,
    step_base: u32,
) -> Vec<Data> {
    emit_at(sc, order, rank, 0, count, input, finish_avg, step_base)
}

/// [`emit`] over elements `base..base + count` of the receive buffer (chunk `k` of the ring is
/// chunk `k` of that range).
#[allow(clippy::too_many_arguments)]
pub fn emit_at(
    sc: &mut Schedule,
    order: &[usize],
    rank: usize,
    base: usize,
    count: usize,
    input: &[Data],
    finish_avg: bool,
    step_base: u32,
) -> Vec<Data> {
    let n = order.len();
    debug_assert!(n >= 2 && input.len() == n);
    let p = order
        .iter()
        .position(|&x| x == rank)
        .expect("rank is in the ring");
    let next = order[(p + 1) % n];
    let prev = order[(p + n - 1) % n];
    let at = |k: usize| {
        let (off, len) = chunk(count, n, k);
        Region::new(Buf::Recv, base + off, len)
    };
    let m = |x: isize| x.rem_euclid(n as isize) as usize;
    let mut out: Vec<Data> = (0..n).map(|k| Data::ready(at(k))).collect();

    // Reduce-scatter.
    let mut last_recv: Option<OpId> = None;
    for step in 0..n - 1 {
        let send_chunk = m(p as isize - step as isize);
        let (src, from) = if step == 0 {
            (input[send_chunk].region, input[send_chunk].producer)
        } else {
            (at(send_chunk), last_recv)
        };
        sc.push_stream(
            Action::Send { peer: next, src },
            from,
            step_base + step as u32,
        );
        let recv_chunk = m(p as isize - step as isize - 1);
        let dst = at(recv_chunk);
        let mine = input[recv_chunk];
        let with = (mine.region != dst).then_some(mine.region);
        let recv = sc.push_stream(
            Action::Recv {
                peer: prev,
                dst,
                combine: Combine::Reduce {
                    with,
                    incoming_first: true,
                    finish_avg: finish_avg && step == n - 2,
                },
            },
            mine.producer,
            step_base + step as u32,
        );
        last_recv = Some(recv);
    }
    out[m(p as isize + 1)].producer = last_recv;

    // Allgather: chunk p+1 is final here; pass it on and copy in the others. Each receive
    // overwrites a chunk sent during reduce-scatter; push_stream makes it wait for that send.
    let gather_base = step_base + (n - 1) as u32;
    for step in 0..n - 1 {
        let send_chunk = m(p as isize + 1 - step as isize);
        sc.push_stream(
            Action::Send {
                peer: next,
                src: at(send_chunk),
            },
            last_recv,
            gather_base + step as u32,
        );
        let recv_chunk = m(p as isize - step as isize);
        let recv = sc.push_stream(
            Action::Recv {
                peer: prev,
                dst: at(recv_chunk),
                combine: Combine::Copy,
            },
            None,
            gather_base + step as u32,
        );
        out[recv_chunk].producer = Some(recv);
        last_recv = Some(recv);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_exactly() {
        for count in [0, 1, 2, 7, 8, 1023, 1 << 20] {
            for n in 1..=9 {
                let mut next = 0;
                for k in 0..n {
                    let (off, len) = chunk(count, n, k);
                    assert_eq!(off, next);
                    next = off + len;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn ring_bytes_are_bandwidth_optimal() {
        let count = 1 << 20;
        for n in 2..=8 {
            let sc = build(
                &Shape::new(0, n, count, true, ReduceOp::Sum),
                &Topology::flat(n),
            );
            sc.validate(count, count, true).unwrap();
            // 2(n-1) chunks of about count/n elements.
            let sent = sc.bytes_sent(4) as f64;
            let ideal = 2.0 * (n as f64 - 1.0) / n as f64 * count as f64 * 4.0;
            assert!((sent - ideal).abs() <= 2.0 * n as f64 * 4.0, "n={n}");
        }
    }

    #[test]
    fn ring_walks_the_topology_order() {
        // Ranks 0, 2 on one host and 1, 3 on another: the ring is 0 -> 2 -> 1 -> 3 -> 0.
        let topo = Topology::from_hosts(&["a".into(), "b".into(), "a".into(), "b".into()]);
        let next = |r: usize| {
            let sc = build(&Shape::new(r, 4, 8, false, ReduceOp::Sum), &topo);
            let peers: Vec<usize> = sc
                .ops
                .iter()
                .filter_map(|o| match o.action {
                    Action::Send { peer, .. } => Some(peer),
                    _ => None,
                })
                .collect();
            assert!(peers.iter().all(|&p| p == peers[0]));
            peers[0]
        };
        assert_eq!((next(0), next(2), next(1), next(3)), (2, 1, 3, 0));
    }
}
