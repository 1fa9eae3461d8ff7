//! Alltoall: rank `r`'s block `k` goes to rank `k`'s block `r`.

use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};

/// Pairwise: all blocks at once, to staggered peers. In place, incoming blocks land in scratch
/// and are copied over once the block they replace has been sent.
pub fn pairwise(s: &Shape) -> Schedule {
    let c = s.count;
    let mut sc = Schedule::new("pairwise");
    let src = |k: usize| Region::new(if s.in_place { Buf::Recv } else { Buf::Send }, k * c, c);
    let dst = |k: usize| Region::new(Buf::Recv, k * c, c);
    exchange(&mut sc, s.rank, s.size, s.in_place, src, dst);
    sc.finish()
}

/// The pairwise exchange, for blocks anywhere: `src(k)` goes to rank `k`, `dst(k)` receives
/// rank `k`'s block (alltoall, and alltoallv with its per-rank blocks). Out of place this rank's
/// own block is copied; in place (`src` and `dst` are then the same blocks) incoming blocks go
/// through scratch, which this sizes.
pub(crate) fn exchange(
    sc: &mut Schedule,
    r: usize,
    n: usize,
    in_place: bool,
    src: impl Fn(usize) -> Region,
    dst: impl Fn(usize) -> Region,
) {
    if !in_place {
        sc.push_auto(
            Action::Copy {
                src: src(r),
                dst: dst(r),
            },
            None,
            0,
        );
    }
    // Sends first in program order: in place, a block may be overwritten only after it left.
    for k in 1..n {
        let to = (r + k) % n;
        sc.push_auto(
            Action::Send {
                peer: to,
                src: src(to),
            },
            None,
            0,
        );
    }
    let mut scratch = 0;
    for k in 1..n {
        let from = (r + n - k) % n;
        if in_place {
            let tmp = Region::new(Buf::Scratch, scratch, dst(from).len);
            scratch += tmp.len;
            sc.push_auto(
                Action::Recv {
                    peer: from,
                    dst: tmp,
                    combine: Combine::Copy,
                },
                None,
                0,
            );
            sc.push_auto(
                Action::Copy {
                    src: tmp,
                    dst: dst(from),
                },
                None,
                0,
            );
        } else {
            sc.push_auto(
                Action::Recv {
                    peer: from,
                    dst: dst(from),
                    combine: Combine::Copy,
                },
                None,
                0,
            );
        }
    }
    sc.scratch = scratch;
}
