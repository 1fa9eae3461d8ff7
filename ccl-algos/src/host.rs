//! Collectives in the memory the ranks of one host share (`Algo::Shm`).
//!
//! Every rank has a slot in one host-wide segment (`ccl_core::transport::HostMemory`). A rank
//! copies its input into its slot and posts; once every rank has posted, each reads the others'
//! slots where they lie: no byte is sent anywhere, and a reduction reads every input once. Posts
//! and waits are the flag barriers between the steps (the shape of the fastest CPU
//! shared-memory allreduces).
//!
//! Counting: each rank posts as often as every other in one operation, so a wait for "every rank
//! has posted `k` times in this operation" is a barrier.
//!
//! Slots are used in two halves, in turn by successive chunks, and the turns go on from one
//! operation to the next (the executor swaps the halves of an operation that starts on the second
//! one, [`swap_halves`]). Every chunk has a barrier after its writes and before its reads, so a
//! rank's first post in a chunk also says that it has read everything of the chunk before; by
//! the time a rank writes a half again, it has waited for that post from every rank in the
//! chunk between, which used the other half. So no operation waits for the previous one's
//! readers at its start or posts "done reading" at its end: a small allreduce is one post and
//! one wait.
//!
//! Local ops run in the order they are listed, which is what orders them around the posts and
//! waits; the symbolic checker verifies every read of a slot against the posts that published it
//! and every write against the posts that said its readers were done, across operations too.

use crate::schedule::{Action, Buf, Region, Schedule, Shape};

/// Allreduces of up to this many elements are reduced whole by every rank (one barrier, every
/// rank reads every input); larger ones are reduced 1/n by each rank and copied out by all (two
/// barriers per chunk, each rank reads twice its buffer rather than n times).
pub const ONE_SHOT_MAX: usize = 16 * 1024;

/// A schedule being built: local ops in order, and the posts so far.
struct Steps<'a> {
    s: Schedule,
    shape: &'a Shape,
    posts: u32,
    /// Half of a slot, in elements: the largest chunk.
    half: usize,
    /// Chunks so far, each on the other half from the one before.
    chunks: usize,
}

impl<'a> Steps<'a> {
    fn new(shape: &'a Shape) -> Steps<'a> {
        let mut s = Schedule::new("shm");
        s.host_slot = shape.host_slot;
        Steps {
            s,
            shape,
            posts: 0,
            half: half_of(shape.host_slot),
            chunks: 0,
        }
    }

    fn push(&mut self, a: Action) {
        let step = self.posts;
        self.s.push(a, &[], None, step);
    }

    fn copy(&mut self, src: Region, dst: Region) {
        self.push(Action::Copy { src, dst });
    }

    /// `dst = dst (op) src`.
    fn reduce(&mut self, dst: Region, src: Region) {
        self.push(Action::Reduce {
            dst,
            src,
            src_first: false,
        });
    }

    /// Post, then wait until every rank has posted as often: a barrier.
    fn barrier(&mut self) {
        self.posts += 1;
        self.push(Action::Post);
        self.push(Action::WaitPosts { count: self.posts });
    }

    fn finish(mut self) -> Schedule {
        self.s.host_chunks = self.chunks;
        self.s.finish()
    }

    /// Where the caller's input is: the send buffer, or in place the receive buffer.
    fn input(&self) -> Buf {
        if self.shape.in_place {
            Buf::Recv
        } else {
            Buf::Send
        }
    }

    /// Chunks `(index, offset, length)` of `len` elements, at most `max` each.
    fn chunks(len: usize, max: usize) -> impl Iterator<Item = (usize, usize, usize)> {
        (0..len)
            .step_by(max.max(1))
            .enumerate()
            .map(move |(k, off)| (k, off, max.min(len - off)))
    }

    /// Starts chunk `k` (counted from 0 in this operation); returns the start of the slot half
    /// it uses. Every chunk must have a barrier between its writes and its reads.
    fn half_at(&mut self, k: usize) -> usize {
        debug_assert_eq!(k, self.chunks, "chunks are started in order");
        self.chunks += 1;
        (k % 2) * self.half
    }
}

/// Half of a slot of `slot` elements: where the second half starts.
pub(crate) fn half_of(slot: usize) -> usize {
    (slot / 2).max(1)
}

/// Region `r` of a schedule of `chunks` chunks in slots of `slot` elements, in the other half
/// of its slot: where it lies when the operation starts on the second half, because the
/// operation before ended on the first (an odd number of chunks since the segment was made).
/// Every host region of a schedule lies within one half. Other buffers are left alone.
pub fn swap_half(r: Region, slot: usize) -> Region {
    let Buf::Host(_) = r.buf else { return r };
    let half = half_of(slot);
    let off = if r.off >= half {
        r.off - half
    } else {
        r.off + half
    };
    Region { off, ..r }
}

/// Consecutive operations of one rank as one schedule, as the executor runs them: each one's
/// waits count on from the posts before it, and each one on the halves its predecessors leave
/// it (`second_half`: the first starts on the second half). For the symbolic checker, which
/// then sees every hazard between operations.
pub fn in_sequence(ops: &[Schedule], mut second_half: bool) -> Schedule {
    let mut t = Schedule::new(ops.first().map_or("shm", |s| s.algo));
    t.host_slot = ops.iter().map(|s| s.host_slot).max().unwrap_or(0);
    t.direct = ops.iter().any(|s| s.direct);
    let mut posts = 0u32;
    for s in ops {
        let s = if second_half && s.uses_host() {
            swap_halves(s)
        } else {
            s.clone()
        };
        let base = t.ops.len();
        for o in &s.ops {
            let action = match o.action {
                Action::WaitPosts { count } => Action::WaitPosts {
                    count: count + posts,
                },
                a => a,
            };
            let deps: Vec<usize> = o.deps.iter().map(|d| d + base).collect();
            t.push(action, &deps, o.stream_from.map(|f| f + base), o.step);
        }
        posts += s
            .ops
            .iter()
            .filter(|o| matches!(o.action, Action::Post))
            .count() as u32;
        second_half ^= s.uses_host() && s.host_chunks % 2 == 1;
        t.host_chunks += s.host_chunks;
    }
    t.finish()
}

/// `s` with every host region in the other half of its slot ([`swap_half`]): the schedule the
/// executor runs when the operation starts on the second half.
pub fn swap_halves(s: &Schedule) -> Schedule {
    let sw = |r: Region| swap_half(r, s.host_slot);
    let mut t = s.clone();
    for o in &mut t.ops {
        o.action = match o.action {
            Action::Send { peer, src } => Action::Send { peer, src: sw(src) },
            Action::Recv { peer, dst, combine } => Action::Recv {
                peer,
                dst: sw(dst),
                combine: match combine {
                    crate::schedule::Combine::Reduce {
                        with,
                        incoming_first,
                        finish_avg,
                    } => crate::schedule::Combine::Reduce {
                        with: with.map(sw),
                        incoming_first,
                        finish_avg,
                    },
                    c => c,
                },
            },
            Action::Copy { src, dst } => Action::Copy {
                src: sw(src),
                dst: sw(dst),
            },
            Action::Reduce {
                dst,
                src,
                src_first,
            } => Action::Reduce {
                dst: sw(dst),
                src: sw(src),
                src_first,
            },
            Action::ReduceInto { dst, a, b } => Action::ReduceInto {
                dst: sw(dst),
                a: sw(a),
                b: sw(b),
            },
            Action::FinishAvg { region } => Action::FinishAvg { region: sw(region) },
            a @ (Action::Post | Action::WaitPosts { .. }) => a,
        };
    }
    t
}

fn slot(rank: usize, off: usize, len: usize) -> Region {
    Region::new(Buf::Host(rank as u16), off, len)
}

/// Block `j` of `parts` nearly equal blocks of `len` elements: `(offset, length)`.
fn part(len: usize, parts: usize, j: usize) -> (usize, usize) {
    let (q, r) = (len / parts, len % parts);
    (j * q + j.min(r), q + usize::from(j < r))
}

/// Allreduce: one-shot (every rank reduces all of it, in rank order, so every rank computes the
/// same bits) or two-shot (rank `j` reduces part `j` of the buffer into its output and publishes
/// it in its slot, then everyone copies the other parts out), as [`Shape::one_shot`] says; by
/// default small buffers one-shot and large ones two-shot.
pub fn allreduce(shape: &Shape) -> Schedule {
    let max = match shape.one_shot {
        None => ONE_SHOT_MAX,
        Some(true) => usize::MAX,
        Some(false) => 0,
    };
    allreduce_with(shape, max)
}

/// [`allreduce`] with counts up to `one_shot_max` one-shot.
pub fn allreduce_with(shape: &Shape, one_shot_max: usize) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut st = Steps::new(shape);
    let one_shot = c <= one_shot_max;
    let input = st.input();
    for (k, off, len) in Steps::chunks(c, st.half) {
        let h = st.half_at(k);
        if one_shot {
            st.copy(Region::new(input, off, len), slot(me, h, len));
            st.barrier();
            let out = Region::new(Buf::Recv, off, len);
            // Rank order (slot 0, then 1, ...); rank 0 starts from slot 1 with the operands
            // in that order. The executor runs each copy and the reduction after it as one
            // pass (`out = slot 0 (op) slot 1`, the `ccl` executor's `Run::run_fused`), which reads the other
            // CPU's lines faster than a copy and then a reduction.
            if me == 0 && n > 1 {
                st.copy(slot(1, h, len), out);
                st.push(Action::Reduce {
                    dst: out,
                    src: slot(0, h, len),
                    src_first: true,
                });
            } else {
                st.copy(slot(0, h, len), out);
                if n > 1 {
                    st.reduce(out, slot(1, h, len));
                }
            }
            for j in 2..n {
                st.reduce(out, slot(j, h, len));
            }
            st.push(Action::FinishAvg { region: out });
            continue;
        }
        // Rank `j` reduces part `j`: the others need only the other parts of this rank's
        // input, and this rank reduces its part from its own input directly.
        for j in (0..n).filter(|&j| j != me) {
            let (a, l) = part(len, n, j);
            st.copy(Region::new(input, off + a, l), slot(me, h + a, l));
        }
        st.barrier();
        let (a, l) = part(len, n, me);
        let out = Region::new(Buf::Recv, off + a, l);
        if !shape.in_place {
            st.copy(Region::new(input, off + a, l), out);
        }
        for j in (0..n).filter(|&j| j != me) {
            st.reduce(out, slot(j, h + a, l));
        }
        st.push(Action::FinishAvg { region: out });
        // Published where the part would have been.
        st.copy(out, slot(me, h + a, l));
        st.barrier();
        for j in (0..n).filter(|&j| j != me) {
            let (a, l) = part(len, n, j);
            st.copy(slot(j, h + a, l), Region::new(Buf::Recv, off + a, l));
        }
    }
    st.finish()
}

/// Allgather: every rank copies its block into its slot, then every other rank's out of theirs.
pub fn allgather(shape: &Shape) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut st = Steps::new(shape);
    // In place, this rank's block already sits at block `me` of the output.
    let (input, at) = if shape.in_place {
        (Buf::Recv, me * c)
    } else {
        (Buf::Send, 0)
    };
    for (k, off, len) in Steps::chunks(c, st.half) {
        let h = st.half_at(k);
        let src = Region::new(input, at + off, len);
        st.copy(src, slot(me, h, len));
        if !shape.in_place {
            st.copy(src, Region::new(Buf::Recv, me * c + off, len));
        }
        st.barrier();
        for j in (0..n).filter(|&j| j != me) {
            st.copy(slot(j, h, len), Region::new(Buf::Recv, j * c + off, len));
        }
    }
    st.finish()
}

/// Reduce-scatter: every rank copies all its blocks' chunks into its slot, then reduces its own
/// block from every slot, in rank order.
pub fn reduce_scatter(shape: &Shape) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut st = Steps::new(shape);
    let input = st.input();
    let out_at = if shape.in_place { me * c } else { 0 };
    // A chunk of every block fits in half a slot.
    let max = (st.half / n).max(1);
    for (k, off, len) in Steps::chunks(c, max) {
        let h = st.half_at(k);
        for j in 0..n {
            st.copy(
                Region::new(input, j * c + off, len),
                slot(me, h + j * max, len),
            );
        }
        st.barrier();
        let out = Region::new(Buf::Recv, out_at + off, len);
        st.copy(slot(0, h + me * max, len), out);
        for j in 1..n {
            st.reduce(out, slot(j, h + me * max, len));
        }
        st.push(Action::FinishAvg { region: out });
    }
    st.finish()
}

/// Broadcast: the root copies each chunk into its slot; the others copy it out.
pub fn broadcast(shape: &Shape) -> Schedule {
    let (me, root, c) = (shape.rank, shape.root, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut st = Steps::new(shape);
    let input = st.input();
    for (k, off, len) in Steps::chunks(c, st.half) {
        let h = st.half_at(k);
        if me == root {
            st.copy(Region::new(input, off, len), slot(root, h, len));
            if !shape.in_place {
                st.copy(
                    Region::new(input, off, len),
                    Region::new(Buf::Recv, off, len),
                );
            }
        }
        st.barrier();
        if me != root {
            st.copy(slot(root, h, len), Region::new(Buf::Recv, off, len));
        }
    }
    st.finish()
}
