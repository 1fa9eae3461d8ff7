//! Chain reduce ending at the root: the root's successor starts, every rank reduces what arrives
//! with its own data and forwards the partial result while it is still arriving; the root
//! reduces last. Partial results live in scratch, so only the root's receive buffer is written.

use ccl_core::ReduceOp;

use crate::schedule::{Action, Buf, Combine, Region, Schedule, Shape};

pub fn build(s: &Shape) -> Schedule {
    let (r, n, c) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("ring");
    let whole = |b: Buf| Region::new(b, 0, c);
    let own = whole(if s.in_place { Buf::Recv } else { Buf::Send });
    if n == 1 {
        if !s.in_place {
            sc.push_auto(
                Action::Copy {
                    src: own,
                    dst: whole(Buf::Recv),
                },
                None,
                0,
            );
        }
        return sc.finish();
    }
    // Position along the chain: 0 is the root's successor, n-1 the root.
    let pos = (r + n - s.root - 1) % n;
    let next = (r + 1) % n;
    let prev = (r + n - 1) % n;
    if pos == 0 {
        sc.push_auto(
            Action::Send {
                peer: next,
                src: own,
            },
            None,
            0,
        );
        return sc.finish();
    }
    let is_root = pos + 1 == n;
    let dst = if is_root {
        whole(Buf::Recv)
    } else {
        whole(Buf::Scratch)
    };
    // The chain folds left to right: (x[root+1] op x[root+2]) op ... op x[root].
    let recv = sc.push_auto(
        Action::Recv {
            peer: prev,
            dst,
            combine: Combine::Reduce {
                with: Some(own).filter(|o| *o != dst),
                incoming_first: true,
                finish_avg: is_root && s.op == ReduceOp::Avg,
            },
        },
        None,
        pos as u32,
    );
    if !is_root {
        sc.push_auto(
            Action::Send {
                peer: next,
                src: dst,
            },
            Some(recv),
            pos as u32,
        );
        sc.scratch = c;
    }
    sc.finish()
}
