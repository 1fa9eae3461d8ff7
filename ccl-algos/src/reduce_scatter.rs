//! Reduce-scatter: rank `r` gets the reduction of every rank's block `r`.
//!
//! In place (NCCL's rule) the input is the whole receive buffer and the result lands in its block
//! `rank`.

use ccl_core::ReduceOp;

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, Shape};

/// Block `k` of the input.
fn input(s: &Shape, k: usize) -> Region {
    let b = if s.in_place { Buf::Recv } else { Buf::Send };
    Region::new(b, k * s.count, s.count)
}

/// Where the result goes.
fn output(s: &Shape) -> Region {
    if s.in_place {
        Region::new(Buf::Recv, s.rank * s.count, s.count)
    } else {
        Region::new(Buf::Recv, 0, s.count)
    }
}

/// Ring: `n-1` steps; block `k` starts at rank `k+1`, is reduced by each rank it passes (streamed
/// on as it is reduced) and ends at rank `k`. Partial blocks alternate between two scratch slots,
/// so the caller's other blocks are never written, in place or not.
pub fn ring(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    if n == 1 {
        if !s.in_place {
            sc.push_auto(
                Action::Copy {
                    src: input(s, 0),
                    dst: output(s),
                },
                None,
                0,
            );
        }
        return sc.finish();
    }
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    let m = |x: isize| x.rem_euclid(n as isize) as usize;
    let avg = s.op == ReduceOp::Avg;
    let mut last: Option<(OpId, Region)> = None;
    for step in 0..n - 1 {
        let src = match last {
            None => input(s, m(r as isize - 1)),
            Some((_, partial)) => partial,
        };
        sc.push_auto(
            Action::Send { peer: next, src },
            last.map(|(id, _)| id),
            step as u32,
        );
        let k = m(r as isize - step as isize - 2);
        let final_step = step == n - 2;
        let dst = if final_step {
            output(s)
        } else {
            Region::new(Buf::Scratch, (step % 2) * c, c)
        };
        let mine = input(s, k);
        let recv = sc.push_auto(
            Action::Recv {
                peer: prev,
                dst,
                combine: Combine::Reduce {
                    with: Some(mine).filter(|x| *x != dst),
                    incoming_first: true,
                    finish_avg: final_step && avg,
                },
            },
            None,
            step as u32,
        );
        last = Some((recv, dst));
    }
    if n > 2 {
        sc.scratch = 2 * c;
    }
    sc.finish()
}

/// Pairwise: every rank sends block `k` straight to rank `k` and reduces the `n-1` blocks it
/// receives, one peer after another in rank order. One step of latency; best for small blocks.
pub fn pairwise(s: &Shape) -> Schedule {
    let mut sc = Schedule::new("pairwise");
    reduce_exchange(&mut sc, s.rank, s.size, s.op, |k| input(s, k), output(s));
    sc.finish()
}

/// The pairwise reduce-scatter, for blocks anywhere: `input(k)` goes to rank `k`, and the
/// blocks that arrive are reduced into `out` with this rank's own `input(rank)` (reduce-scatter,
/// and reduce-scatterv with its per-rank blocks).
pub(crate) fn reduce_exchange(
    sc: &mut Schedule,
    r: usize,
    n: usize,
    op: ReduceOp,
    input: impl Fn(usize) -> Region,
    out: Region,
) {
    let mine = input(r);
    if n == 1 {
        if mine != out {
            sc.push_auto(
                Action::Copy {
                    src: mine,
                    dst: out,
                },
                None,
                0,
            );
        }
        return;
    }
    for k in 1..n {
        let to = (r + k) % n;
        sc.push_auto(
            Action::Send {
                peer: to,
                src: input(to),
            },
            None,
            0,
        );
    }
    let peers: Vec<usize> = (0..n).filter(|&p| p != r).collect();
    for (i, &from) in peers.iter().enumerate() {
        sc.push_auto(
            Action::Recv {
                peer: from,
                dst: out,
                combine: Combine::Reduce {
                    with: if i == 0 {
                        Some(mine).filter(|x| *x != out)
                    } else {
                        None
                    },
                    incoming_first: false,
                    finish_avg: i + 1 == peers.len() && op == ReduceOp::Avg,
                },
            },
            None,
            0,
        );
    }
}
