//! Ring allreduce: reduce-scatter, then allgather, around the ring `r -> r+1`.
//!
//! The buffer is cut into `n` chunks. In reduce-scatter step `s` rank `r` sends chunk `r-s` to its
//! successor and receives chunk `r-s-1` from its predecessor, reducing it with its own data; after
//! `n-1` steps it holds chunk `r+1` fully reduced. Allgather then passes the reduced chunks around
//! for `n-1` more steps, copying. Each rank sends `2(n-1)/n` of the buffer: bandwidth-optimal.
//!
//! Every chunk is reduced once, along the ring in a fixed order, and then copied: all ranks end
//! with the same bytes. Each send streams from the receive that produced its data, so a step
//! forwards data while it is still arriving (pipelining within and across steps).

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, Shape};
use ccl_core::ReduceOp;

/// The `n` chunks of `count` elements: the first `count % n` get one element more.
pub fn chunk(count: usize, n: usize, k: usize) -> (usize, usize) {
    let base = count / n;
    let rem = count % n;
    let off = k * base + k.min(rem);
    (off, base + usize::from(k < rem))
}

pub fn build(s: &Shape) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    let src_buf = if s.in_place { Buf::Recv } else { Buf::Send };
    if n == 1 {
        if !s.in_place && count > 0 {
            sc.push(
                Action::Copy {
                    src: Region::new(Buf::Send, 0, count),
                    dst: Region::new(Buf::Recv, 0, count),
                },
                &[],
                None,
                0,
            );
        }
        // Avg over one rank divides by one: nothing to do.
        return sc.finish();
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let at = |k: usize, buf: Buf| {
        let (off, len) = chunk(count, n, k);
        Region::new(buf, off, len)
    };
    let m = |x: isize| x.rem_euclid(n as isize) as usize;
    let avg = s.op == ReduceOp::Avg;

    // Reduce-scatter.
    let mut rs_send: Vec<OpId> = Vec::with_capacity(n - 1);
    let mut last_recv: Option<OpId> = None;
    for step in 0..n - 1 {
        let send_chunk = m(r as isize - step as isize);
        let src = if step == 0 {
            at(send_chunk, src_buf)
        } else {
            at(send_chunk, Buf::Recv)
        };
        let send = sc.push(
            Action::Send { peer: next, src },
            &[],
            last_recv,
            step as u32,
        );
        rs_send.push(send);
        let recv_chunk = m(r as isize - step as isize - 1);
        let dst = at(recv_chunk, Buf::Recv);
        let with = if s.in_place {
            None
        } else {
            Some(at(recv_chunk, Buf::Send))
        };
        let recv = sc.push(
            Action::Recv {
                peer: prev,
                dst,
                combine: Combine::Reduce {
                    with,
                    incoming_first: true,
                    finish_avg: avg && step == n - 2,
                },
            },
            &[],
            None,
            step as u32,
        );
        last_recv = Some(recv);
    }

    // Allgather: chunk r+1 is final here; pass it on and copy in the others.
    let base = (n - 1) as u32;
    for (step, &overwritten_send) in rs_send.iter().enumerate() {
        let send_chunk = m(r as isize + 1 - step as isize);
        sc.push(
            Action::Send {
                peer: next,
                src: at(send_chunk, Buf::Recv),
            },
            &[],
            last_recv,
            base + step as u32,
        );
        let recv_chunk = m(r as isize - step as isize);
        // The chunk being overwritten was sent from the receive buffer during reduce-scatter
        // (step `step`); that send must be done first.
        let recv = sc.push(
            Action::Recv {
                peer: prev,
                dst: at(recv_chunk, Buf::Recv),
                combine: Combine::Copy,
            },
            &[overwritten_send],
            None,
            base + step as u32,
        );
        last_recv = Some(recv);
    }
    sc.finish()
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
            let sc = build(&Shape::new(0, n, count, true, ReduceOp::Sum));
            sc.validate(count, count, true).unwrap();
            // 2(n-1) chunks of about count/n elements.
            let sent = sc.bytes_sent(4) as f64;
            let ideal = 2.0 * (n as f64 - 1.0) / n as f64 * count as f64 * 4.0;
            assert!((sent - ideal).abs() <= 2.0 * n as f64 * 4.0, "n={n}");
        }
    }
}
