//! Chain broadcast: the root sends to its successor, each rank forwards what it receives while
//! it is still arriving. `n-1` hops of latency, but every link carries the buffer once and the
//! pieces move down the chain together, so large broadcasts run at link bandwidth.

use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};

pub fn build(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    let whole = |b: Buf| Region::new(b, 0, c);
    let pos = (r + n - s.root) % n;
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    if pos == 0 {
        let src = if s.in_place { Buf::Recv } else { Buf::Send };
        if n > 1 {
            sc.push_auto(
                Action::Send {
                    peer: next,
                    src: whole(src),
                },
                None,
                0,
            );
        }
        if !s.in_place {
            sc.push_auto(
                Action::Copy {
                    src: whole(Buf::Send),
                    dst: whole(Buf::Recv),
                },
                None,
                0,
            );
        }
    } else {
        let recv = sc.push_auto(
            Action::Recv {
                peer: prev,
                dst: whole(Buf::Recv),
                combine: Combine::Copy,
            },
            None,
            pos as u32,
        );
        if pos + 1 < n {
            sc.push_auto(
                Action::Send {
                    peer: next,
                    src: whole(Buf::Recv),
                },
                Some(recv),
                pos as u32,
            );
        }
    }
    sc.finish()
}
