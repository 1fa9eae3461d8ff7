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
    let (r, n) = (s.rank, s.size);
    let p = if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    };
    let extra = n - p;
    let avg = s.op == ReduceOp::Avg;
    let mut b = Doubling::new(s);
    if r >= p {
        return b.folded(r - p);
    }
    let exchanges = p.trailing_zeros();
    if r < extra {
        // Absorb the folded partner r + p: own data first (lower rank).
        b.exchange(r + p, false, true, avg && exchanges == 0);
    }
    for i in 0..exchanges {
        let mask = 1usize << i;
        b.exchange(r ^ mask, true, r & mask == 0, avg && i + 1 == exchanges);
    }
    b.finish((r < extra).then_some(r + p))
}

/// One rank's recursive-doubling schedule as it is built: where its partial result is, and
/// what must finish before each buffer may be overwritten.
struct Doubling {
    sc: Schedule,
    count: usize,
    /// The buffer holding this rank's partial result, and the op that produced it (`None`: the
    /// caller's input).
    cur: Buf,
    producer: Option<OpId>,
    /// The last send from the receive buffer and from scratch: a buffer may be overwritten only
    /// once its last send is done. (The send buffer is never overwritten.)
    last_send_recv: Option<OpId>,
    last_send_scratch: Option<OpId>,
    uses_scratch: bool,
    step: u32,
}

impl Doubling {
    fn new(s: &Shape) -> Doubling {
        Doubling {
            sc: Schedule::new("rd"),
            count: s.count,
            cur: if s.in_place { Buf::Recv } else { Buf::Send },
            producer: None,
            last_send_recv: None,
            last_send_scratch: None,
            uses_scratch: false,
            step: 0,
        }
    }

    fn whole(&self, buf: Buf) -> Region {
        Region::new(buf, 0, self.count)
    }

    fn last_send(&self, buf: Buf) -> Option<OpId> {
        match buf {
            Buf::Recv => self.last_send_recv,
            Buf::Scratch => self.last_send_scratch,
            _ => None,
        }
    }

    /// A folded rank: hands its data to `partner` and gets the result back.
    fn folded(mut self, partner: usize) -> Schedule {
        let src = self.whole(self.cur);
        let sent = self
            .sc
            .push(Action::Send { peer: partner, src }, &[], None, 0);
        // In place the result lands where the data was sent from.
        let deps: Vec<OpId> = if self.cur == Buf::Recv {
            vec![sent]
        } else {
            vec![]
        };
        let dst = self.whole(Buf::Recv);
        self.sc.push(
            Action::Recv {
                peer: partner,
                dst,
                combine: Combine::Copy,
            },
            &deps,
            None,
            1,
        );
        self.sc.finish()
    }

    /// One step with `peer`: send the partial result (unless `send` is false: a folded rank's
    /// data is only received) and reduce what arrives with it into the other buffer (the
    /// receive buffer and scratch alternate, because a rank must not overwrite data it is still
    /// sending). `own_first` puts this rank's operand first (it is the lower half).
    fn exchange(&mut self, peer: usize, send: bool, own_first: bool, finish_avg: bool) {
        let cur = self.whole(self.cur);
        if send {
            let id = self.sc.push(
                Action::Send { peer, src: cur },
                &[],
                self.producer,
                self.step,
            );
            match self.cur {
                Buf::Recv => self.last_send_recv = Some(id),
                Buf::Scratch => self.last_send_scratch = Some(id),
                _ => {}
            }
        }
        let dst = if self.cur == Buf::Recv {
            Buf::Scratch
        } else {
            Buf::Recv
        };
        // Reads `cur` (its producer must be done) and overwrites `dst` (its last send must be
        // done).
        let deps: Vec<OpId> = self
            .last_send(dst)
            .into_iter()
            .chain(self.producer)
            .collect();
        let id = self.sc.push(
            Action::Recv {
                peer,
                dst: self.whole(dst),
                combine: Combine::Reduce {
                    with: Some(cur),
                    incoming_first: !own_first,
                    finish_avg,
                },
            },
            &deps,
            None,
            self.step,
        );
        self.cur = dst;
        self.producer = Some(id);
        self.step += 1;
        self.uses_scratch |= dst == Buf::Scratch;
    }

    /// Puts the result in the receive buffer and hands it back to the folded rank, if any.
    fn finish(mut self, folded: Option<usize>) -> Schedule {
        if self.cur != Buf::Recv {
            let mut deps: Vec<OpId> = self.producer.into_iter().collect();
            deps.extend(self.last_send(Buf::Recv));
            let (src, dst) = (self.whole(self.cur), self.whole(Buf::Recv));
            let id = self
                .sc
                .push(Action::Copy { src, dst }, &deps, None, self.step);
            self.producer = Some(id);
            self.cur = Buf::Recv;
        }
        if let Some(peer) = folded {
            let src = self.whole(self.cur);
            self.sc
                .push(Action::Send { peer, src }, &[], self.producer, self.step);
        }
        if self.uses_scratch {
            self.sc.scratch = self.count;
        }
        self.sc.finish()
    }
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
