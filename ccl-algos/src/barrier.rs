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
    // A round's signal may leave only once every earlier round's signal has arrived: that is
    // what carries each rank's arrival on to the others.
    let mut heard: Vec<OpId> = Vec::with_capacity(rounds);
    for k in 0..rounds {
        let d = 1 << k;
        let src = Region::new(Buf::Scratch, k, 1);
        sc.push(
            Action::Send {
                peer: (r + d) % n,
                src,
            },
            &heard,
            None,
            k as u32,
        );
        let dst = Region::new(Buf::Scratch, rounds + k, 1);
        let from = (r + n - d) % n;
        heard.push(sc.push(
            Action::Recv {
                peer: from,
                dst,
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
