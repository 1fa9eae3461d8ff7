//! A schedule without peers, compiled once for the executor.
//!
//! A small operation in host memory runs a handful of local ops (copy in, post, wait, reduce
//! out), and the generic walk over them (the `ccl` executor's `Run::drive_local`: which half of
//! the slots each region lies in, whether a copy and the reduction after it run as one pass,
//! which of the operand shapes an op has) cost it more than its data at a few KiB. A [`LocalPlan`]
//! answers those questions once per cached schedule, for both halves of the slots, and leaves
//! the executor a list of steps to run. The schedule stays the data the symbolic checker reads;
//! the plan is derived from it mechanically and runs its ops in the same order.

use ccl_core::reduce::Order;
use ccl_core::transport::program::{CallBuf, HostProgram, HostStep};

use crate::host::{half_of, swap_half};
use crate::schedule::{Action, Buf, OpId, Region, Schedule};

/// The steps of a schedule without peers, for each half its host regions may lie in.
#[derive(Debug)]
pub struct LocalPlan {
    /// `[as the schedule names them, in the other halves]`.
    halves: [Vec<Step>; 2],
    /// The same steps in bytes, one for one, for the host memory to run
    /// ([`HostMemory::run`](ccl_core::transport::HostMemory::run)).
    programs: [HostProgram; 2],
}

/// One step; regions are in elements, host slots as `(host rank, region)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The caller's input (or any caller buffer) into this rank's slot.
    CopyIn {
        src: Region,
        dst: Region,
    },
    /// A host slot out to a caller buffer.
    CopyOut {
        src: Region,
        dst: Region,
    },
    /// Between the caller's buffers (an out-of-place two-shot's own part).
    CopyLocal {
        src: Region,
        dst: Region,
    },
    /// `dst = a (op) b` with `a` and `b` in host slots: a copy out of one and the reduction of
    /// the other into it, as one pass (the `ccl` executor's `Run::run_fused`).
    Fused {
        dst: Region,
        a: Region,
        b: Region,
    },
    /// `dst = dst (op) src` with `dst` a caller buffer and `src` a host slot.
    ReduceOut {
        dst: Region,
        src: Region,
        order: Order,
    },
    /// The division of an average.
    FinishAvg {
        region: Region,
    },
    Post,
    /// Waits until every host rank has posted `count` times in this operation; `id` is the
    /// schedule's op and `k` its place among the local ops (what the waiting reports).
    Wait {
        count: u32,
        id: OpId,
        k: usize,
    },
}

impl LocalPlan {
    /// The plan of `s` for host rank `me` of `ranks`, when it has no peers, is not a direct
    /// schedule, needs no scratch space, names only those ranks' slots, and each of its local
    /// ops has a shape the plan
    /// knows (every host-memory schedule of `crate::host` has); `None` sends the executor the
    /// generic way. The executor takes a plan's slots without checking their ranks again.
    /// Its regions are in elements of `elem` bytes.
    pub fn compile(s: &Schedule, me: usize, ranks: usize, elem: usize) -> Option<LocalPlan> {
        if !s.peers.is_empty()
            || s.direct
            || !s.uses_host()
            || s.locals.len() != s.ops.len()
            || s.scratch > 0
        {
            return None;
        }
        let named = steps(s, me)?;
        if !named.iter().all(|st| slots_below(st, ranks)) {
            return None;
        }
        let swapped: Vec<Step> = named.iter().map(|st| swap(*st, s.host_slot)).collect();
        let half = half_of(s.host_slot) * elem;
        let program = |steps: &[Step]| -> Option<HostProgram> {
            let bytes: Vec<HostStep> = steps
                .iter()
                .map(|st| in_bytes(st, elem))
                .collect::<Option<_>>()?;
            let mark = mark_of(&bytes, half);
            let p = HostProgram::new(bytes);
            Some(match mark {
                Some(at) => p.with_mark(at),
                None => p,
            })
        };
        let programs = [program(&named)?, program(&swapped)?];
        Some(LocalPlan {
            halves: [named, swapped],
            programs,
        })
    }

    pub fn steps(&self, second_half: bool) -> &[Step] {
        &self.halves[usize::from(second_half)]
    }

    /// [`steps`](LocalPlan::steps) in bytes: the same steps at the same places.
    pub fn program(&self, second_half: bool) -> &HostProgram {
        &self.programs[usize::from(second_half)]
    }
}

/// `st` in bytes of elements of `elem` bytes; `None` for what a host program does not hold:
/// scratch space, or a copy between regions of different lengths.
fn in_bytes(st: &Step, elem: usize) -> Option<HostStep> {
    let caller = |b: Buf| match b {
        Buf::Send => Some(CallBuf::Send),
        Buf::Recv => Some(CallBuf::Recv),
        _ => None,
    };
    let recv = |r: &Region| (r.buf == Buf::Recv).then_some(r.off * elem);
    let slot = |r: &Region| match r.buf {
        Buf::Host(i) => Some((i, r.off * elem)),
        _ => None,
    };
    let same = |a: &Region, b: &Region| (a.len == b.len).then_some(a.len * elem);
    Some(match st {
        Step::CopyIn { src, dst } => HostStep::CopyIn {
            src: caller(src.buf)?,
            from: src.off * elem,
            to: slot(dst)?.1,
            len: same(src, dst)?,
        },
        Step::CopyOut { src, dst } => {
            let (i, from) = slot(src)?;
            HostStep::CopyOut {
                slot: i,
                from,
                to: recv(dst)?,
                len: same(src, dst)?,
            }
        }
        Step::CopyLocal { src, dst } => HostStep::CopyLocal {
            src: caller(src.buf)?,
            from: src.off * elem,
            to: recv(dst)?,
            len: same(src, dst)?,
        },
        Step::Fused { dst, a, b } => {
            same(a, b)?;
            HostStep::Fused {
                to: recv(dst)?,
                len: same(dst, a)?,
                a: slot(a)?,
                b: slot(b)?,
            }
        }
        Step::ReduceOut { dst, src, order } => {
            let (i, from) = slot(src)?;
            HostStep::ReduceOut {
                to: recv(dst)?,
                len: same(dst, src)?,
                slot: i,
                from,
                order: *order,
            }
        }
        Step::FinishAvg { region } => HostStep::FinishAvg {
            at: recv(region)?,
            len: region.len * elem,
        },
        Step::Post => HostStep::Post,
        Step::Wait { count, .. } => HostStep::Wait { count: *count },
    })
}

/// Data up to this many bytes from the start of its half of the slot is published with a mark
/// after it ([`HostProgram::with_mark`]). Measured with the same protocol in C
/// (`scripts/peers/host_floor.c`'s shape, 2 ranks): the mark beside the data saved 0.03-0.1 us
/// up to 512 B in the machine's slower phases, and cost 0.05 us at 2 KiB, where the look at
/// the line beside the last data line got in the way of its writing.
pub const MARK_SPAN: usize = 512;

/// Where a program's post can leave its mark: right after everything it names in any slot, in
/// the same half, when it posts once, after all its copies in, and then waits for one post
/// (the one-shot shape), and all it names lies within [`MARK_SPAN`] bytes of the half's start.
/// Every rank's program of a one-shot operation names the same bytes of every slot, so all
/// agree on the place. (A rank whose place differed would only never see the others' marks
/// and wait on the counters: a mark lies beyond every byte this rank writes or reads, so it
/// covers no data the others read from its slot.)
fn mark_of(steps: &[HostStep], half: usize) -> Option<usize> {
    let post = steps.iter().position(|s| *s == HostStep::Post)?;
    let wait = steps
        .iter()
        .position(|s| matches!(s, HostStep::Wait { .. }))?;
    let one = |f: fn(&HostStep) -> bool| steps.iter().filter(|s| f(s)).count() == 1;
    if !(one(|s| *s == HostStep::Post)
        && one(|s| matches!(s, HostStep::Wait { .. }))
        && steps[wait] == HostStep::Wait { count: 1 }
        && post < wait
        && !steps[post..]
            .iter()
            .any(|s| matches!(s, HostStep::CopyIn { .. })))
    {
        return None;
    }
    let (mut lo, mut hi) = (usize::MAX, 0);
    let mut named = |at: usize, len: usize| {
        lo = lo.min(at);
        hi = hi.max(at + len);
    };
    for s in steps {
        match *s {
            HostStep::CopyIn { to, len, .. } => named(to, len),
            HostStep::CopyOut { from, len, .. } | HostStep::ReduceOut { from, len, .. } => {
                named(from, len)
            }
            HostStep::Fused { len, a, b, .. } => {
                named(a.1, len);
                named(b.1, len);
            }
            HostStep::CopyLocal { .. }
            | HostStep::FinishAvg { .. }
            | HostStep::Post
            | HostStep::Wait { .. } => {}
        }
    }
    if hi == 0 || half == 0 {
        return None;
    }
    let start = lo / half * half;
    let at = hi.next_multiple_of(8);
    (hi - start <= MARK_SPAN && at + 8 <= start + half).then_some(at)
}

/// Whether every host slot `st` names belongs to one of `ranks` host ranks.
fn slots_below(st: &Step, ranks: usize) -> bool {
    let ok = |r: &Region| !matches!(r.buf, Buf::Host(i) if usize::from(i) >= ranks);
    match st {
        Step::CopyIn { src, dst } | Step::CopyOut { src, dst } | Step::CopyLocal { src, dst } => {
            ok(src) && ok(dst)
        }
        Step::Fused { dst, a, b } => ok(dst) && ok(a) && ok(b),
        Step::ReduceOut { dst, src, .. } => ok(dst) && ok(src),
        Step::FinishAvg { region } => ok(region),
        Step::Post | Step::Wait { .. } => true,
    }
}

fn is_caller(b: Buf) -> bool {
    matches!(b, Buf::Send | Buf::Recv | Buf::Scratch)
}

fn steps(s: &Schedule, me: usize) -> Option<Vec<Step>> {
    let mine = |b: Buf| b == Buf::Host(me as u16);
    let host = |b: Buf| matches!(b, Buf::Host(_));
    let mut out = Vec::with_capacity(s.locals.len());
    let mut k = 0;
    while let Some(&id) = s.locals.get(k) {
        let next = s.locals.get(k + 1).map(|&n| s.ops[n].action);
        let step = match s.ops[id].action {
            Action::Copy { src, dst } => {
                // The pair the `ccl` executor's `Run::run_fused` runs as one pass.
                if let Some(Action::Reduce {
                    dst: into,
                    src: b,
                    src_first,
                }) = next
                    && into == dst
                    && host(src.buf)
                    && host(b.buf)
                    && matches!(dst.buf, Buf::Recv | Buf::Scratch)
                    && dst.len > 0
                {
                    k += 2;
                    let (a, b) = if src_first { (b, src) } else { (src, b) };
                    out.push(Step::Fused { dst, a, b });
                    continue;
                }
                if is_caller(src.buf) && mine(dst.buf) {
                    Step::CopyIn { src, dst }
                } else if host(src.buf) && matches!(dst.buf, Buf::Recv | Buf::Scratch) {
                    Step::CopyOut { src, dst }
                } else if is_caller(src.buf) && matches!(dst.buf, Buf::Recv | Buf::Scratch) {
                    Step::CopyLocal { src, dst }
                } else {
                    return None;
                }
            }
            Action::Reduce {
                dst,
                src,
                src_first,
            } if matches!(dst.buf, Buf::Recv | Buf::Scratch) && host(src.buf) => Step::ReduceOut {
                dst,
                src,
                order: if src_first {
                    Order::SrcFirst
                } else {
                    Order::AccFirst
                },
            },
            Action::FinishAvg { region } if matches!(region.buf, Buf::Recv | Buf::Scratch) => {
                Step::FinishAvg { region }
            }
            Action::Post => Step::Post,
            Action::WaitPosts { count } => Step::Wait { count, id, k },
            _ => return None,
        };
        out.push(step);
        k += 1;
    }
    Some(out)
}

/// `st` with its host regions in the other halves of their slots (`crate::host::swap_half`).
fn swap(st: Step, slot: usize) -> Step {
    let sw = |r: Region| swap_half(r, slot);
    match st {
        Step::CopyIn { src, dst } => Step::CopyIn { src, dst: sw(dst) },
        Step::CopyOut { src, dst } => Step::CopyOut { src: sw(src), dst },
        Step::Fused { dst, a, b } => Step::Fused {
            dst,
            a: sw(a),
            b: sw(b),
        },
        Step::ReduceOut { dst, src, order } => Step::ReduceOut {
            dst,
            src: sw(src),
            order,
        },
        s @ (Step::CopyLocal { .. } | Step::FinishAvg { .. } | Step::Post | Step::Wait { .. }) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Shape;
    use ccl_core::ReduceOp;

    fn shape(rank: usize, size: usize, count: usize, in_place: bool) -> Shape {
        Shape {
            rank,
            size,
            count,
            in_place,
            op: ReduceOp::Sum,
            root: 0,
            host_slot: 4096,
            one_shot: None,
        }
    }

    #[test]
    fn one_shot_allreduce_compiles_to_copy_post_wait_and_one_pass() {
        for (rank, size) in [(0, 2), (1, 2), (2, 4)] {
            let s = crate::host::allreduce(&shape(rank, size, 100, false));
            let p = LocalPlan::compile(&s, rank, size, 4).expect("a host schedule compiles");
            // Compiled for fewer ranks than it reads, it is not compiled at all.
            assert!(LocalPlan::compile(&s, rank, size - 1, 4).is_none());
            let st = p.steps(false);
            assert!(matches!(st[0], Step::CopyIn { .. }), "{st:?}");
            assert_eq!(st[1], Step::Post);
            assert!(matches!(st[2], Step::Wait { count: 1, .. }), "{st:?}");
            assert!(matches!(st[3], Step::Fused { .. }), "{st:?}");
            // Ranks 2.. of 4 reduce slots 2 and 3 after the pass.
            let reduces = st
                .iter()
                .filter(|s| matches!(s, Step::ReduceOut { .. }))
                .count();
            assert_eq!(reduces, size - 2, "{st:?}");
            // The other halves: every host region moves by half a slot, nothing else does.
            let (Step::CopyIn { src, dst }, Step::CopyIn { src: s2, dst: d2 }) =
                (st[0], p.steps(true)[0])
            else {
                unreachable!()
            };
            assert_eq!(src, s2);
            assert_eq!(d2.off, dst.off + 2048);
            // The programs are the same steps in bytes, one for one.
            for half in [false, true] {
                let (st, prog) = (p.steps(half), p.program(half).steps());
                assert_eq!(st.len(), prog.len());
                let Step::CopyIn { src, dst } = st[0] else {
                    unreachable!()
                };
                assert_eq!(
                    prog[0],
                    HostStep::CopyIn {
                        src: CallBuf::Send,
                        from: src.off * 4,
                        to: dst.off * 4,
                        len: 400
                    }
                );
                assert_eq!(prog[1..3], [HostStep::Post, HostStep::Wait { count: 1 }]);
                let (
                    Step::Fused { a, b, .. },
                    HostStep::Fused {
                        to,
                        len,
                        a: ba,
                        b: bb,
                    },
                ) = (st[3], prog[3])
                else {
                    panic!("{prog:?}")
                };
                assert_eq!((to, len), (0, 400));
                let Buf::Host(ia) = a.buf else { unreachable!() };
                assert_eq!(ba, (ia, a.off * 4));
                assert_eq!(bb.1, b.off * 4);
            }
        }
    }

    #[test]
    fn a_small_one_shot_posts_a_mark_beside_its_data_in_either_half() {
        // Slots of 4096 floats: halves of 8 KiB.
        for (count, mark) in [
            (2, Some(8)),
            (3, Some(16)),
            (100, Some(400)),
            (128, Some(512)),
            (129, None),
            (512, None),
        ] {
            for (rank, size, in_place) in [(0, 2, false), (1, 2, true), (3, 4, false)] {
                let s = crate::host::allreduce(&shape(rank, size, count, in_place));
                let p = LocalPlan::compile(&s, rank, size, 4).unwrap();
                let at = (p.program(false).mark(), p.program(true).mark());
                assert_eq!(at, (mark, mark.map(|m| m + 8192)), "{count} on {size}");
            }
        }
        // Two posts and two waits per chunk: the counters.
        let two_shot = crate::host::allreduce_with(&shape(0, 2, 100, false), 10);
        let p = LocalPlan::compile(&two_shot, 0, 2, 4).unwrap();
        assert_eq!(
            (p.program(false).mark(), p.program(true).mark()),
            (None, None)
        );
    }

    /// A rank that looked for marks where the others leave none would wait on the counters
    /// every time: every rank of one operation must decide alike, for each collective in host
    /// memory, placement, root and size.
    #[test]
    fn every_rank_of_an_operation_agrees_on_the_mark() {
        type Build = fn(&Shape) -> Schedule;
        let colls: [(&str, Build); 4] = [
            ("allreduce", crate::host::allreduce),
            ("allgather", crate::host::allgather),
            ("reduce_scatter", crate::host::reduce_scatter),
            ("broadcast", crate::host::broadcast),
        ];
        let mut marked = 0;
        for (name, build) in colls {
            for size in [2, 3, 4, 8] {
                for count in [1, 2, 7, 32, 100, 128, 129, 5000] {
                    for (in_place, root) in [(false, 0), (true, 0), (false, size - 1)] {
                        let marks: Vec<_> = (0..size)
                            .map(|rank| {
                                let mut sh = shape(rank, size, count, in_place);
                                sh.root = root;
                                let p = LocalPlan::compile(&build(&sh), rank, size, 4)?;
                                Some((p.program(false).mark(), p.program(true).mark()))
                            })
                            .collect();
                        assert!(
                            marks.windows(2).all(|w| w[0] == w[1]),
                            "{name} of {count} on {size} ranks (in place {in_place}, root \
                             {root}): {marks:?}"
                        );
                        marked += usize::from(matches!(marks[0], Some((Some(_), _))));
                    }
                }
            }
        }
        assert!(marked > 0, "no schedule took a mark");
    }

    #[test]
    fn schedules_with_peers_or_other_shapes_take_the_generic_way() {
        let two_shot = crate::host::allreduce_with(&shape(0, 2, 100, false), 10);
        assert!(LocalPlan::compile(&two_shot, 0, 2, 4).is_some());
        let mut ring = Schedule::new("ring");
        ring.push(
            Action::Send {
                peer: 1,
                src: Region::new(Buf::Send, 0, 4),
            },
            &[],
            None,
            0,
        );
        assert!(LocalPlan::compile(&ring.finish(), 0, 2, 4).is_none());
    }
}
