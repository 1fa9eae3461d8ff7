//! Recursive-doubling allreduce: `log2(n)` exchanges of the whole buffer. Latency-optimal, so it
//! wins for small messages; it sends `log2(n)` times the buffer, so the ring wins for large ones.
//!
//! With `p` the largest power of two `<= n`, ranks `p..n` first fold their data into ranks
//! `0..n-p`, the `p` remaining ranks exchange with partner `r ^ mask` for each mask, and the
//! folded ranks get the result back.
//!
//! Bit-identical results: in every exchange both partners compute `lower (op) higher`, where
//! `lower` is the partial result of the lower-ranked half, so both evaluate the same expression.
//! Each exchange reads one buffer and writes the other (receive buffer and scratch alternate),
//! because a rank must not overwrite data it is still sending.

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, Shape};
use ccl_core::ReduceOp;

pub fn build(s: &Shape) -> Schedule {
    let (r, n, count) = (s.rank, s.size, s.count);
    let mut sc = Schedule::new("rd");
    let whole = |buf: Buf| Region::new(buf, 0, count);
    let p = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let extra = n - p;
    let avg = s.op == ReduceOp::Avg;
    let mut cur = if s.in_place { Buf::Recv } else { Buf::Send };
    // The op that produced `cur` (None: the caller's input), and the last send from each buffer
    // (a buffer may be overwritten only once its last send is done).
    let mut producer: Option<OpId> = None;
    let mut sent_from: [(Buf, Option<OpId>); 3] =
        [(Buf::Send, None), (Buf::Recv, None), (Buf::Scratch, None)];
    let sent = |tbl: &[(Buf, Option<OpId>); 3], b: Buf| {
        tbl.iter().find(|(x, _)| *x == b).and_then(|(_, o)| *o)
    };
    let set_sent = |tbl: &mut [(Buf, Option<OpId>); 3], b: Buf, id: OpId| {
        for e in tbl.iter_mut() {
            if e.0 == b {
                e.1 = Some(id);
            }
        }
    };
    let other = |b: Buf| {
        if b == Buf::Recv {
            Buf::Scratch
        } else {
            Buf::Recv
        }
    };
    let mut uses_scratch = false;
    let mut step = 0u32;

    if r >= p {
        // Folded rank: hand the data to r - p, get the result back.
        let partner = r - p;
        let snd = sc.push(
            Action::Send {
                peer: partner,
                src: whole(cur),
            },
            &[],
            None,
            step,
        );
        let deps: Vec<OpId> = if cur == Buf::Recv { vec![snd] } else { vec![] };
        sc.push(
            Action::Recv {
                peer: partner,
                dst: whole(Buf::Recv),
                combine: Combine::Copy,
            },
            &deps,
            None,
            step + 1,
        );
        return sc.finish();
    }

    let reduce_step = |sc: &mut Schedule,
                       cur: &mut Buf,
                       producer: &mut Option<OpId>,
                       sent_from: &mut [(Buf, Option<OpId>); 3],
                       peer: usize,
                       send: bool,
                       own_first: bool,
                       finish: bool,
                       step: u32| {
        if send {
            let id = sc.push(
                Action::Send {
                    peer,
                    src: whole(*cur),
                },
                &[],
                *producer,
                step,
            );
            set_sent(sent_from, *cur, id);
        }
        let dst = other(*cur);
        // Reads `cur` (its producer must be done) and overwrites `dst` (its last send must be done).
        let deps: Vec<OpId> = sent(sent_from, dst).into_iter().chain(*producer).collect();
        let id = sc.push(
            Action::Recv {
                peer,
                dst: whole(dst),
                combine: Combine::Reduce {
                    with: Some(whole(*cur)),
                    incoming_first: !own_first,
                    finish_avg: finish,
                },
            },
            &deps,
            None,
            step,
        );
        *cur = dst;
        *producer = Some(id);
    };

    let exchanges = p.trailing_zeros();
    if r < extra {
        // Absorb the folded partner r + p: own data first (lower rank).
        reduce_step(
            &mut sc,
            &mut cur,
            &mut producer,
            &mut sent_from,
            r + p,
            false,
            true,
            avg && exchanges == 0,
            step,
        );
        step += 1;
        uses_scratch |= cur == Buf::Scratch;
    }
    for i in 0..exchanges {
        let mask = 1usize << i;
        let partner = r ^ mask;
        let last = i + 1 == exchanges;
        reduce_step(
            &mut sc,
            &mut cur,
            &mut producer,
            &mut sent_from,
            partner,
            true,
            r & mask == 0,
            avg && last,
            step,
        );
        step += 1;
        uses_scratch |= cur == Buf::Scratch;
    }
    if cur != Buf::Recv {
        let mut deps: Vec<OpId> = producer.into_iter().collect();
        deps.extend(sent(&sent_from, Buf::Recv));
        let id = sc.push(
            Action::Copy {
                src: whole(cur),
                dst: whole(Buf::Recv),
            },
            &deps,
            None,
            step,
        );
        producer = Some(id);
        cur = Buf::Recv;
    }
    if r < extra {
        sc.push(
            Action::Send {
                peer: r + p,
                src: whole(cur),
            },
            &[],
            producer,
            step,
        );
    }
    if uses_scratch {
        sc.scratch = count;
    }
    sc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_validate() {
        for n in 1..=16 {
            for r in 0..n {
                for in_place in [false, true] {
                    let sh = Shape::new(r, n, 5, in_place, ReduceOp::Avg);
                    build(&sh)
                        .validate(5, 5, in_place)
                        .unwrap_or_else(|e| panic!("n={n} r={r}: {e}"));
                }
            }
        }
    }
}
