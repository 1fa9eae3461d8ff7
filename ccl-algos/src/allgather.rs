//! Allgather: every rank's block, in rank order, in every rank's buffer.
//!
//! In place (NCCL's rule) the input is already in the receive buffer at `rank * count`.

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, Shape};

fn block(k: usize, c: usize) -> Region {
    Region::new(Buf::Recv, k * c, c)
}

fn own_input(s: &Shape) -> Region {
    if s.in_place {
        block(s.rank, s.count)
    } else {
        Region::new(Buf::Send, 0, s.count)
    }
}

/// Ring: `n-1` steps; in step `s` a rank forwards the block it received in step `s-1` (streaming)
/// and receives the next. Each rank sends `(n-1)/n` of the result: bandwidth-optimal.
pub fn ring(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    if !s.in_place {
        sc.push_auto(
            Action::Copy {
                src: own_input(s),
                dst: block(r, c),
            },
            None,
            0,
        );
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let m = |x: isize| x.rem_euclid(n as isize) as usize;
    let mut last: Option<OpId> = None;
    for step in 0..n.saturating_sub(1) {
        let src = match last {
            None => own_input(s),
            Some(_) => block(m(r as isize - step as isize), c),
        };
        sc.push_auto(Action::Send { peer: next, src }, last, step as u32);
        let dst = block(m(r as isize - step as isize - 1), c);
        last = Some(sc.push_auto(
            Action::Recv {
                peer: prev,
                dst,
                combine: Combine::Copy,
            },
            None,
            step as u32,
        ));
    }
    sc.finish()
}

/// Pairwise: every rank sends its block to every other rank at once. One step of latency, the
/// same bytes as the ring; best for small blocks.
pub fn pairwise(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("pairwise");
    if !s.in_place {
        sc.push_auto(
            Action::Copy {
                src: own_input(s),
                dst: block(r, c),
            },
            None,
            0,
        );
    }
    // Staggered order so ranks do not all start with the same peer.
    for k in 1..n {
        sc.push_auto(
            Action::Send {
                peer: (r + k) % n,
                src: own_input(s),
            },
            None,
            0,
        );
        let from = (r + n - k) % n;
        sc.push_auto(
            Action::Recv {
                peer: from,
                dst: block(from, c),
                combine: Combine::Copy,
            },
            None,
            0,
        );
    }
    sc.finish()
}
