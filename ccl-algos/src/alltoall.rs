//! Alltoall: rank `r`'s block `k` goes to rank `k`'s block `r`.

use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};

/// Pairwise: all blocks at once, to staggered peers. In place, incoming blocks land in scratch
/// and are copied over once the block they replace has been sent.
pub fn pairwise(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("pairwise");
    let src = |k: usize| Region::new(if s.in_place { Buf::Recv } else { Buf::Send }, k * c, c);
    let dst = |k: usize| Region::new(Buf::Recv, k * c, c);
    if !s.in_place {
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
        sc.push_auto(
            Action::Send {
                peer: (r + k) % n,
                src: src((r + k) % n),
            },
            None,
            0,
        );
    }
    for k in 1..n {
        let from = (r + n - k) % n;
        if s.in_place {
            let tmp = Region::new(Buf::Scratch, from * c, c);
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
    if s.in_place && n > 1 {
        sc.scratch = n * c;
    }
    sc.finish()
}
