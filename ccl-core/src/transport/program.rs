//! A small operation in host memory as one call into the host memory ([`HostMemory::run`]).
//!
//! A 2 KiB allreduce between two ranks of a host is five steps (copy in, post, wait, reduce
//! out of both slots), and when each step was its own round of calls through the
//! [`HostMemory`] interface (the slot's bounds, the counters, the fingerprints, each a call
//! that checks its rank), those calls and the walk over the steps cost more instructions than
//! the data: about 750 of a call's 1900, at about 0.13 us per 1000 on this path
//! (docs/performance.md). A [`HostProgram`] is such an operation with every region worked out
//! in bytes once, checked against the buffers' and slots' lengths once per run, and run by
//! the host memory itself in one call, which gives back control only when a wait would have
//! to block (the caller's wait knows how to sleep, give up and report) or when a rank is in
//! another operation.
//!
//! [`HostMemory`]: super::HostMemory
//! [`HostMemory::run`]: super::HostMemory::run

use crate::reduce::Order;
use crate::{DataType, ReduceOp};

/// A caller buffer a step reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallBuf {
    Send,
    Recv,
}

/// One step of a [`HostProgram`]; offsets and lengths in bytes, slots by host rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostStep {
    /// `len` bytes of caller buffer `src` at `from` into this rank's slot at `to`.
    CopyIn {
        src: CallBuf,
        from: usize,
        to: usize,
        len: usize,
    },
    /// `len` bytes of host rank `slot`'s slot at `from` out to the receive buffer at `to`.
    CopyOut {
        slot: u16,
        from: usize,
        to: usize,
        len: usize,
    },
    /// `len` bytes of caller buffer `src` at `from` to the receive buffer at `to`.
    CopyLocal {
        src: CallBuf,
        from: usize,
        to: usize,
        len: usize,
    },
    /// The receive buffer's `len` bytes at `to` = slot `a.0` at `a.1` (op) slot `b.0` at `b.1`.
    Fused {
        to: usize,
        len: usize,
        a: (u16, usize),
        b: (u16, usize),
    },
    /// The receive buffer's `len` bytes at `to` (op)= host rank `slot`'s slot at `from`, in
    /// `order`.
    ReduceOut {
        to: usize,
        len: usize,
        slot: u16,
        from: usize,
        order: Order,
    },
    /// The division of an average over the receive buffer's `len` bytes at `at`.
    FinishAvg { at: usize, len: usize },
    /// Publishes this rank's writes ([`HostMemory::post`](super::HostMemory::post)); the
    /// first post of a run announces the operation first.
    Post,
    /// Until every host rank has posted `count` times in this operation; then, if `count > 0`,
    /// every other rank must have announced the same operation.
    Wait { count: u32 },
}

/// The steps of one operation for one rank, with what they need of the buffers: a run checks
/// the buffers against it once and each step's regions are then within them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostProgram {
    steps: Vec<HostStep>,
    /// Bytes the send buffer, the receive buffer and every slot must have.
    need_send: usize,
    need_recv: usize,
    need_slot: usize,
    /// One more than the highest host rank whose slot a step names (0: none).
    slot_ranks: usize,
    /// Where in every rank's slot the program's one post also leaves [`mark_word`], right
    /// after the data it publishes, and where its one wait looks for the others' (`None`: the
    /// counters only). See [`HostProgram::with_mark`].
    mark: Option<usize>,
}

impl HostProgram {
    pub fn new(steps: Vec<HostStep>) -> HostProgram {
        let (mut send, mut recv, mut slot, mut ranks) = (0, 0, 0, 0);
        let mut caller = |b: CallBuf, end: usize| match b {
            CallBuf::Send => send = send.max(end),
            CallBuf::Recv => recv = recv.max(end),
        };
        let mut slot_at = |r: u16, end: usize| {
            slot = slot.max(end);
            ranks = ranks.max(usize::from(r) + 1);
        };
        for s in &steps {
            match *s {
                HostStep::CopyIn { src, from, to, len } => {
                    caller(src, from + len);
                    // This rank's own slot: its rank is checked by the runner.
                    slot_at(0, to + len);
                }
                HostStep::CopyOut {
                    slot: r,
                    from,
                    to,
                    len,
                } => {
                    slot_at(r, from + len);
                    caller(CallBuf::Recv, to + len);
                }
                HostStep::CopyLocal { src, from, to, len } => {
                    caller(src, from + len);
                    caller(CallBuf::Recv, to + len);
                }
                HostStep::Fused { to, len, a, b } => {
                    caller(CallBuf::Recv, to + len);
                    slot_at(a.0, a.1 + len);
                    slot_at(b.0, b.1 + len);
                }
                HostStep::ReduceOut {
                    to,
                    len,
                    slot: r,
                    from,
                    ..
                } => {
                    caller(CallBuf::Recv, to + len);
                    slot_at(r, from + len);
                }
                HostStep::FinishAvg { at, len } => caller(CallBuf::Recv, at + len),
                HostStep::Post | HostStep::Wait { .. } => {}
            }
        }
        HostProgram {
            steps,
            need_send: send,
            need_recv: recv,
            need_slot: slot,
            slot_ranks: ranks,
            mark: None,
        }
    }

    /// The program with its post leaving a mark at byte `at` of this rank's slot, and its wait
    /// looking for every rank's mark there rather than at the counters. A wait on the counters
    /// sees the post, then reads the data: two lines from the other CPU, one after the other;
    /// with the mark in the line of the data, the look that sees it has brought the data too
    /// (about 0.1 us of a 0.4 us operation in the slower phases of the machine measured,
    /// docs/performance.md). The counters are posted as before, so a wait that gives up looking
    /// and blocks counts them.
    ///
    /// For programs of one post and then one wait for one post, every other slot read where
    /// every rank wrote its own before it posted, as every rank's program of the same
    /// operation does (`ccl_algos::local` decides): the word at `at` then belongs to no
    /// region, and every rank looks where the others leave their marks. A mark says which post
    /// of which operation it is ([`mark_word`]), so that a rank in another operation, or data
    /// of an earlier one, does not pass for it. `at` is a multiple of 8.
    ///
    /// # Panics
    /// If `at` is not a multiple of 8.
    pub fn with_mark(mut self, at: usize) -> HostProgram {
        assert!(at % 8 == 0, "a post's mark at byte {at} is not 8-aligned");
        self.need_slot = self.need_slot.max(at + 8);
        self.mark = Some(at);
        self
    }

    pub fn steps(&self) -> &[HostStep] {
        &self.steps
    }

    /// Where the post leaves its mark, if it does ([`with_mark`](HostProgram::with_mark)).
    pub fn mark(&self) -> Option<usize> {
        self.mark
    }

    /// Why `call`'s buffers, or host memory of `ranks` ranks with `slot_len`-byte slots, cannot
    /// hold the program's regions (`None`: they can).
    #[inline]
    pub fn misfit(&self, call: &HostCall<'_>, ranks: usize, slot_len: usize) -> Option<String> {
        let fits = match call.send {
            Some(s) => s.len() >= self.need_send,
            None => self.need_send == 0,
        } && call.recv.len() >= self.need_recv
            && slot_len >= self.need_slot
            && ranks >= self.slot_ranks;
        if fits {
            None
        } else {
            Some(self.why_misfit(call, ranks, slot_len))
        }
    }

    #[cold]
    fn why_misfit(&self, call: &HostCall<'_>, ranks: usize, slot_len: usize) -> String {
        let send = call.send.map_or(0, <[u8]>::len);
        if call.send.is_none() && self.need_send > 0 {
            "a host program reads the send buffer of an operation in place".into()
        } else if send < self.need_send || call.recv.len() < self.need_recv {
            format!(
                "a host program needs {} send and {} receive bytes; the call has {send} and {}",
                self.need_send,
                self.need_recv,
                call.recv.len()
            )
        } else {
            format!(
                "a host program needs {} slots of {} bytes; the host memory has {ranks} of \
                 {slot_len}",
                self.slot_ranks, self.need_slot
            )
        }
    }
}

/// The mark a rank's `count`-th post leaves in an operation of fingerprint `desc`
/// ([`HostProgram::with_mark`]): a mix of both, so that neither another operation's mark nor
/// data left at the place matches it but by a 2^-64 chance.
pub fn mark_word(count: u64, desc: u64) -> u64 {
    // splitmix64's finalizer, over the fingerprint and then the count: every input bit moves
    // every output bit, and no pair of words gives zero.
    let mix = |mut x: u64| {
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    mix(mix(desc.wrapping_add(0x9e37_79b9_7f4a_7c15)) ^ count)
}

/// One run of a [`HostProgram`]: the caller's buffers and what the steps need to know.
#[derive(Debug)]
pub struct HostCall<'a> {
    /// Input of an out-of-place collective (`None` in place).
    pub send: Option<&'a [u8]>,
    pub recv: &'a mut [u8],
    pub dtype: DataType,
    pub op: ReduceOp,
    /// Ranks of the communicator (an average divides by it).
    pub world: usize,
    /// The operation's number among those in host memory, and its fingerprint
    /// ([`HostMemory::announce`](super::HostMemory::announce)).
    pub host_op: u64,
    pub desc: u64,
    /// This rank's post count when the operation began: waits count from it. A run from the
    /// first step sets it.
    pub base: u64,
    /// How many looks at the counters a wait takes before the run stops at it. The caller's
    /// wait knows how to sleep and when to give up, but reacts later to the last post and
    /// costs the operation a return, a set-up and a call back in; with a CPU per rank, the
    /// post usually comes within a few looks. 0 when the ranks outnumber the CPUs (the rank
    /// awaited may need this one's CPU).
    pub spin: u32,
}

/// Where a run of a [`HostProgram`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every step ran.
    Done,
    /// Step `at` is a wait whose ranks have not all posted (in [`HostCall::spin`] looks): the
    /// caller waits (and may sleep), then runs the program on from `at + 1`. The ranks that
    /// wait for this one's posts were woken ([`HostMemory::wake`](super::HostMemory::wake)).
    Blocked { at: usize },
    /// After the wait at step `at`, host rank `rank` had announced `desc`, another operation.
    Unlike { at: usize, rank: usize, desc: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call<'a>(send: Option<&'a [u8]>, recv: &'a mut [u8]) -> HostCall<'a> {
        HostCall {
            send,
            recv,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            world: 2,
            host_op: 0,
            desc: 1,
            base: 0,
            spin: 0,
        }
    }

    #[test]
    fn a_run_needs_buffers_and_slots_that_hold_every_region() {
        let prog = HostProgram::new(vec![
            HostStep::CopyIn {
                src: CallBuf::Send,
                from: 8,
                to: 4096,
                len: 16,
            },
            HostStep::Post,
            HostStep::Wait { count: 1 },
            HostStep::Fused {
                to: 4,
                len: 16,
                a: (0, 4096),
                b: (1, 4096),
            },
        ]);
        let (send, mut recv) = ([0u8; 24], [0u8; 20]);
        assert_eq!(prog.misfit(&call(Some(&send), &mut recv), 2, 8192), None);
        // One byte short, anywhere.
        assert!(
            prog.misfit(&call(Some(&send[..23]), &mut recv), 2, 8192)
                .is_some()
        );
        assert!(
            prog.misfit(&call(Some(&send), &mut recv[..19]), 2, 8192)
                .is_some()
        );
        assert!(
            prog.misfit(&call(Some(&send), &mut recv), 2, 4111)
                .is_some()
        );
        // Fewer ranks than it reads the slots of, or no send buffer to read.
        assert!(
            prog.misfit(&call(Some(&send), &mut recv), 1, 8192)
                .is_some()
        );
        let e = prog.misfit(&call(None, &mut recv), 2, 8192).unwrap();
        assert!(e.contains("in place"), "{e}");
        // A mark needs its word in every slot.
        let marked = prog.with_mark(4112);
        assert_eq!(marked.mark(), Some(4112));
        assert_eq!(marked.misfit(&call(Some(&send), &mut recv), 2, 4120), None);
        assert!(
            marked
                .misfit(&call(Some(&send), &mut recv), 2, 4119)
                .is_some()
        );
    }

    #[test]
    fn marks_differ_by_post_and_operation() {
        let words: Vec<u64> = [(1, 7), (2, 7), (3, 7), (1, 8), (2, 8), (0, 0), (1, 0)]
            .iter()
            .map(|&(count, desc)| mark_word(count, desc))
            .collect();
        for (i, w) in words.iter().enumerate() {
            assert!(!words[i + 1..].contains(w), "{words:x?}");
        }
        // Data that often lies in buffers (zeros, small counts) is not a mark.
        assert!(words.iter().all(|&w| w != 0 && w > u64::from(u32::MAX)));
    }

    #[test]
    #[should_panic(expected = "8-aligned")]
    fn a_mark_is_a_whole_word() {
        let _ = HostProgram::new(vec![HostStep::Post]).with_mark(12);
    }
}
