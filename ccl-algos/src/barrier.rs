//! Barrier by dissemination: in round `k` every rank signals `r + 2^k` and waits for `r - 2^k`,
//! so after `ceil(log2 n)` rounds each rank has heard, directly or not, from every other. The
//! messages are one byte from scratch: zero-length transfers carry nothing and would not
//! synchronise.

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, Shape};

pub fn dissemination(s: &Shape) -> Schedule {
    let (r, n) = (s.rank, s.size);
    let mut sc = Schedule::new("rd");
    let rounds = if n <= 1 {
        0
    } else {
        n.next_power_of_two().trailing_zeros() as usize
    };
    let mut prev_recv: Option<OpId> = None;
    for k in 0..rounds {
        let d = 1 << k;
        let deps: Vec<OpId> = prev_recv.into_iter().collect();
        sc.push(
            Action::Send {
                peer: (r + d) % n,
                src: Region::new(Buf::Scratch, k, 1),
            },
            &deps,
            None,
            k as u32,
        );
        prev_recv = Some(sc.push(
            Action::Recv {
                peer: (r + n - d) % n,
                dst: Region::new(Buf::Scratch, rounds + k, 1),
                combine: Combine::Copy,
            },
            &[],
            None,
            k as u32,
        ));
    }
    sc.scratch = 2 * rounds;
    sc.finish()
}
