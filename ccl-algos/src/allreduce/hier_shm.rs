//! Hierarchical allreduce on host memory (`Algo::HierShm`): the ranks of each host
//! reduce-scatter through their host's segment, each rank allreduces the parts it holds with
//! its counterparts on the other hosts over the network (a ring per part), and the host's ranks
//! allgather through the segment again.
//!
//! The buffer is cut into chunks of half a slot (the pipeline) and every chunk into `parts`
//! parts. On a host of `k` ranks, part `p` belongs to host rank `p % k`; its owners on all hosts
//! (one per host, hosts in ring order) run a ring allreduce of it. With `parts` the most ranks
//! any host has, every rank of the largest hosts uses the network at once, not only a leader;
//! small buffers take `parts = 1`, leader-based (host rank 0 reduces, crosses the network and
//! hands the result back), which saves the steps of the other rings.
//!
//! Per chunk `j`, in host memory: every rank copies the parts it does not own into its slot
//! (half `j % 2`), a flag barrier, each owner reduces its parts from its own input and the
//! others' slots (into its receive buffer) and starts their rings. Two iterations later, when
//! the rings of chunk `j` have had the time of one more chunk to finish, the owners publish the
//! results in their slots (at the positions of their own parts, which nobody else writes in
//! that half) behind the barrier of chunk `j + 2`, after which every rank copies the parts it
//! does not own out. So the rings of two chunks are in flight while the host works on a third,
//! and a barrier serves both the copy-in of one chunk and the publication of another.
//!
//! Slot reuse: half `j % 2` is written again in iteration `j + 2` (the copy-in of chunk `j + 2`
//! at non-owned positions, the publication of chunk `j` at owned ones). Every read of chunk
//! `j`'s copy-in happened before the reader's post of iteration `j + 1`, which the writer waited
//! for; reads of chunk `j - 2`'s results (owned positions of the same half) likewise. The
//! symbolic checker verifies this with several hosts (`symbolic::simulate_hosts`).
//!
//! Each element is reduced inside its host by one rank, then once along its ring in a fixed
//! order, then copied everywhere: every rank ends with the same bits. A rank alone on its host
//! has no segment and skips the host steps (its parts are all its own).

use crate::allreduce::ring::{self, chunk};
use crate::schedule::{Action, Buf, Data, Region, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;

/// Allreduces of up to this many elements go leader-based (one part per chunk). Set from the
/// cost model, not measured apart: the leader sends `k` times the bytes of a rank of `k`, which
/// matters once they outweigh a network step (TCP here: 5 us x 3 GB/s = 15 KB, about 4096
/// floats); below that, one ring and fewer copies are cheaper.
pub const LEADER_MAX: usize = 4096;

/// This rank's schedule; see the module documentation.
pub fn build(s: &Shape, topo: &Topology) -> Schedule {
    build_with(s, topo, LEADER_MAX)
}

/// [`build`] with buffers of up to `leader_max` elements leader-based.
pub fn build_with(s: &Shape, topo: &Topology, leader_max: usize) -> Schedule {
    let (n, count) = (s.size, s.count);
    let sc = Schedule::new("hiershm");
    if n == 1 {
        return super::alone(s, sc);
    }
    if count == 0 {
        return sc.finish();
    }
    let groups = topo.host_groups();
    let max_k = groups.iter().map(Vec::len).max().unwrap_or(1);
    let parts = if count <= leader_max { 1 } else { max_k };
    let mut b = Builder::new(s, &groups, parts, sc);
    let m = count.div_ceil(b.chunk);
    if !b.shared() {
        for j in 0..m {
            b.reduce_and_ring(j);
        }
        return b.sc.finish();
    }
    b.push(Action::WaitPosts { count: 0 });
    // Iteration `j` copies chunk `j` in and publishes chunk `j - 2`.
    for j in 0..m + 2 {
        let (rs, ag) = (j < m, (2..m + 2).contains(&j));
        if !rs && !ag {
            continue;
        }
        if rs {
            b.copy_in(j);
        }
        if ag {
            b.publish(j - 2);
        }
        b.barrier();
        if rs {
            b.reduce_and_ring(j);
        }
        if ag {
            b.copy_out(j - 2);
        }
    }
    b.push(Action::Post);
    b.sc.finish()
}

/// One rank's schedule as it is built.
struct Builder<'a> {
    s: &'a Shape,
    sc: Schedule,
    groups: &'a [Vec<usize>],
    /// This rank's host and its index there.
    host: usize,
    me: usize,
    parts: usize,
    /// Half a slot, in elements.
    half: usize,
    /// Elements of a part's place in each half: every chunk puts part `p` at the same place,
    /// whatever its length, so a half holds one chunk's copy-ins and another's results apart.
    stride: usize,
    /// Elements of a chunk (the last may be shorter): `parts` strides.
    chunk: usize,
    posts: u32,
}

impl<'a> Builder<'a> {
    fn new(s: &'a Shape, groups: &'a [Vec<usize>], parts: usize, mut sc: Schedule) -> Self {
        let host = groups
            .iter()
            .position(|g| g.contains(&s.rank))
            .expect("rank on a host");
        let me = groups[host]
            .iter()
            .position(|&x| x == s.rank)
            .expect("rank in its host");
        if groups[host].len() > 1 {
            sc.host_slot = s.host_slot;
        }
        let half = (s.host_slot / 2).max(1);
        let parts = parts.min(half);
        let stride = half / parts;
        Builder {
            s,
            sc,
            groups,
            host,
            me,
            parts,
            half,
            stride,
            chunk: stride * parts,
            posts: 0,
        }
    }

    /// Ranks of this host.
    fn k(&self) -> usize {
        self.groups[self.host].len()
    }

    /// Whether this rank shares a segment with others (else it skips the host steps).
    fn shared(&self) -> bool {
        self.k() > 1
    }

    fn owns(&self, p: usize) -> bool {
        p % self.k() == self.me
    }

    fn input(&self) -> Buf {
        if self.s.in_place {
            Buf::Recv
        } else {
            Buf::Send
        }
    }

    /// Chunk `j`: `(offset, length)` in the buffer.
    fn chunk_at(&self, j: usize) -> (usize, usize) {
        let off = j * self.chunk;
        (off, self.chunk.min(self.s.count - off))
    }

    /// Part `p` of chunk `j`: `(offset in the chunk, length)`, the first `len % parts` parts one
    /// element longer.
    fn part(&self, j: usize, p: usize) -> (usize, usize) {
        chunk(self.chunk_at(j).1, self.parts, p)
    }

    /// Where part `p` of chunk `j` lies in host rank `i`'s slot.
    fn slot(&self, i: usize, j: usize, p: usize) -> Region {
        let l = self.part(j, p).1;
        Region::new(
            Buf::Host(i as u16),
            (j % 2) * self.half + p * self.stride,
            l,
        )
    }

    /// Part `p` of chunk `j` in buffer `buf`.
    fn at(&self, buf: Buf, j: usize, p: usize) -> Region {
        let (a, l) = self.part(j, p);
        Region::new(buf, self.chunk_at(j).0 + a, l)
    }

    /// The non-empty parts of chunk `j` this rank owns (`mine`) or not.
    fn parts_of(&self, j: usize, mine: bool) -> Vec<usize> {
        (0..self.parts)
            .filter(|&p| self.owns(p) == mine && self.part(j, p).1 > 0)
            .collect()
    }

    fn push(&mut self, a: Action) {
        let step = self.posts;
        self.sc.push_auto(a, None, step);
    }

    fn barrier(&mut self) {
        self.posts += 1;
        self.push(Action::Post);
        self.push(Action::WaitPosts { count: self.posts });
    }

    /// The parts of chunk `j` that others reduce, into this rank's slot.
    fn copy_in(&mut self, j: usize) {
        for p in self.parts_of(j, false) {
            let (src, dst) = (self.at(self.input(), j, p), self.slot(self.me, j, p));
            self.push(Action::Copy { src, dst });
        }
    }

    /// Reduces the parts of chunk `j` this rank owns over its host, then allreduces them with
    /// their owners on the other hosts.
    fn reduce_and_ring(&mut self, j: usize) {
        let hosts = self.groups.len();
        let avg = self.s.op == ReduceOp::Avg;
        for p in self.parts_of(j, true) {
            let out = self.at(Buf::Recv, j, p);
            // Where the ring finds this rank's contribution: alone on the host, the input
            // itself (the ring copies it over); else the host's reduction in the output.
            let mut contribution = self.at(self.input(), j, p);
            if self.shared() {
                if !self.s.in_place {
                    self.push(Action::Copy {
                        src: contribution,
                        dst: out,
                    });
                }
                let me = self.me;
                for i in (0..self.k()).filter(|&i| i != me) {
                    let src = self.slot(i, j, p);
                    self.push(Action::Reduce {
                        dst: out,
                        src,
                        src_first: false,
                    });
                }
                contribution = out;
            }
            if hosts == 1 {
                if contribution != out {
                    self.push(Action::Copy {
                        src: contribution,
                        dst: out,
                    });
                }
                self.push(Action::FinishAvg { region: out });
                continue;
            }
            let owners: Vec<usize> = self.groups.iter().map(|g| g[p % g.len()]).collect();
            let input: Vec<Data> = (0..hosts)
                .map(|i| {
                    let (o, l) = chunk(out.len, hosts, i);
                    Data::ready(Region::new(contribution.buf, contribution.off + o, l))
                })
                .collect();
            let step = 2 * self.posts;
            ring::emit_at(
                &mut self.sc,
                &owners,
                self.s.rank,
                out.off,
                out.len,
                &input,
                avg,
                step,
            );
        }
    }

    /// The results of chunk `j` this rank owns, into its slot for the others.
    fn publish(&mut self, j: usize) {
        for p in self.parts_of(j, true) {
            let (src, dst) = (self.at(Buf::Recv, j, p), self.slot(self.me, j, p));
            self.push(Action::Copy { src, dst });
        }
    }

    /// The results of chunk `j` that other ranks own, out of their slots.
    fn copy_out(&mut self, j: usize) {
        for p in self.parts_of(j, false) {
            let owner = p % self.k();
            let (src, dst) = (self.slot(owner, j, p), self.at(Buf::Recv, j, p));
            self.push(Action::Copy { src, dst });
        }
    }
}
