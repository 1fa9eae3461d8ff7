//! Collectives on buffers the ranks of one host read and write in place ([`Schedule::direct`]).
//!
//! When every rank's input and output lie in memory the host's ranks share (`Communicator::alloc`
//! carves them from per-rank arenas that every rank of the host maps), nothing needs copying
//! into the host slots: each rank announces where its buffers lie and posts; once every rank
//! has posted, rank `j` reduces part `j` reading every rank's input where it lies
//! ([`Buf::PeerIn`]) and writes the result into every rank's output ([`Buf::PeerOut`]), then
//! posts again; the second barrier hands every buffer back to its owner. Each byte of the buffer
//! is read once from every input and written once into every output, whatever the size: no
//! slot limits it, so there are no chunks.
//!
//! Why this is safe, which the symbolic checker verifies for every schedule here: a rank reads
//! another's input only after the post that follows its announcement (the owner wrote the input
//! before entering the operation); part `j` of any output is written by rank `j` alone, and read
//! by nobody else during the operation (in place, rank `j` reads part `j` of that buffer before
//! it writes it, and nobody else reads it); and no rank leaves the operation, handing its buffers
//! back to its caller, before every rank posted that it is done with them.
//!
//! Which ranks run this and which the staged schedules of [`crate::host`] is the communicator's
//! choice from each rank's own buffers; a rank that runs one while another runs the other fails
//! with an error naming it at the first barrier (the operation fingerprints differ), before it
//! reads anything.

use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;

use crate::algo::{self, Algo, Collective};
use crate::cost::{self, LinkCosts};
use crate::schedule::{Action, Buf, Region, Schedule, Shape};

/// Block `j` of `parts` nearly equal blocks of `len` elements: `(offset, length)`.
fn part(len: usize, parts: usize, j: usize) -> (usize, usize) {
    let (q, r) = (len / parts, len % parts);
    (j * q + j.min(r), q + usize::from(j < r))
}

/// Whether `coll` has a direct schedule and the cost model prices it at `bytes` below `chosen`,
/// the algorithm it picks for plain buffers ([`cost::host_direct_allreduce`],
/// [`cost::host_direct`] against that algorithm's cost).
pub fn pays(
    coll: Collective,
    chosen: Algo,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    topo: &Topology,
) -> bool {
    use Collective::*;
    let nf = n as f64;
    let load = match coll {
        AllReduce => cost::host_direct_allreduce(n),
        AllGather => cost::host_direct((nf - 1.0) / nf, 0.0),
        Broadcast => cost::host_direct(1.0, 0.0),
        ReduceScatter => cost::host_direct(1.0 / nf, (nf - 1.0) / nf),
        _ => return false,
    };
    if n < 2 || bytes == 0 || !algo::available(Algo::Shm, t, topo) {
        return false;
    }
    let Some(other) = algo::cost(coll, chosen, n, bytes, t, topo) else {
        return false;
    };
    LinkCosts::new(t, topo).time(&load, bytes as f64) < other
}

/// The direct schedule of `coll`, if it has one.
pub fn build(coll: Collective, shape: &Shape) -> Option<Schedule> {
    Some(match coll {
        Collective::AllReduce => allreduce(shape),
        Collective::AllGather => allgather(shape),
        Collective::Broadcast => broadcast(shape),
        Collective::ReduceScatter => reduce_scatter(shape),
        _ => return None,
    })
}

/// A direct schedule being built: its first barrier is in, [`Direct::finish`] adds the second.
struct Direct {
    s: Schedule,
}

impl Direct {
    fn new(shape: &Shape) -> Direct {
        let mut s = Schedule::new("shm-direct");
        // Posts and waits need host memory; no slot is used.
        s.host_slot = shape.host_slot.max(1);
        // Counted as host operations are (each is announced in the place of its turn), and
        // even, so that the slot halves of the staged schedules go on as they were.
        s.host_chunks = 2;
        s.direct = true;
        let mut d = Direct { s };
        d.push(Action::Post);
        d.push(Action::WaitPosts { count: 1 });
        d
    }

    fn push(&mut self, a: Action) {
        let step = u32::from(self.s.ops.len() > 2);
        self.s.push(a, &[], None, step);
    }

    fn copy(&mut self, src: Region, dst: Region) {
        self.push(Action::Copy { src, dst });
    }

    /// `out` = `input` (op) the region at `at` of every other rank's input, then the average's
    /// division; out of place the first reduction reads this rank's input and one peer's into
    /// the output in one pass.
    fn reduce_all(&mut self, shape: &Shape, out: Region, input: Region, at: usize) {
        let (n, me, l) = (shape.size, shape.rank, out.len);
        let peer = |j: usize| Region::new(Buf::PeerIn(j as u16), at, l);
        let first = (me + 1) % n;
        if !shape.in_place {
            self.push(Action::ReduceInto {
                dst: out,
                a: input,
                b: peer(first),
            });
        }
        for j in (0..n).filter(|&j| j != me && (shape.in_place || j != first)) {
            self.push(Action::Reduce {
                dst: out,
                src: peer(j),
                src_first: false,
            });
        }
        self.push(Action::FinishAvg { region: out });
    }

    fn finish(mut self) -> Schedule {
        self.push(Action::Post);
        self.push(Action::WaitPosts { count: 2 });
        self.s.finish()
    }
}

/// Allreduce in place on shared buffers: rank `j` reduces part `j` of every rank's input into
/// its own output, then copies it into every other rank's output.
pub fn allreduce(shape: &Shape) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut d = Direct::new(shape);
    let (a, l) = part(c, n, me);
    // In pieces that stay in the cache between their reduction and their copies out, so the
    // copies read the result there rather than from memory.
    let piece = (shape.host_slot / 8).max(1);
    for off in (a..a + l).step_by(piece) {
        let len = piece.min(a + l - off);
        let out = Region::new(Buf::Recv, off, len);
        d.reduce_all(shape, out, Region::new(Buf::Send, off, len), off);
        for j in (0..n).filter(|&j| j != me) {
            d.copy(out, Region::new(Buf::PeerOut(j as u16), off, len));
        }
    }
    d.finish()
}

/// Allgather: every rank writes its block into block `rank` of every other rank's output (the
/// offset is the same whatever each rank's placement; in place a rank's input is its own block,
/// which no other rank writes).
pub fn allgather(shape: &Shape) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut d = Direct::new(shape);
    let mine = Region::new(Buf::Recv, me * c, c);
    let input = if shape.in_place {
        mine
    } else {
        Region::new(Buf::Send, 0, c)
    };
    if !shape.in_place {
        d.copy(input, mine);
    }
    for j in (0..n).filter(|&j| j != me) {
        d.copy(input, Region::new(Buf::PeerOut(j as u16), me * c, c));
    }
    d.finish()
}

/// Broadcast: every other rank copies the root's input into its output.
pub fn broadcast(shape: &Shape) -> Schedule {
    let (me, root, c) = (shape.rank, shape.root, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut d = Direct::new(shape);
    let out = Region::new(Buf::Recv, 0, c);
    if me != root {
        d.copy(Region::new(Buf::PeerIn(root as u16), 0, c), out);
    } else if !shape.in_place {
        d.copy(Region::new(Buf::Send, 0, c), out);
    }
    d.finish()
}

/// Reduce-scatter: every rank reduces its block of every rank's input into its output (block
/// `rank` of every input lies at the same offset whatever each rank's placement).
pub fn reduce_scatter(shape: &Shape) -> Schedule {
    let (me, c) = (shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut d = Direct::new(shape);
    let at = me * c;
    let out = if shape.in_place {
        Region::new(Buf::Recv, at, c)
    } else {
        Region::new(Buf::Recv, 0, c)
    };
    d.reduce_all(shape, out, Region::new(Buf::Send, at, c), at);
    d.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_direct_path_pays_for_large_buffers_only() {
        let t = TransportProperties {
            latency: std::time::Duration::from_nanos(500),
            bandwidth: 10.0e9,
            spin: std::time::Duration::ZERO,
            host_memory: true,
        };
        let topo = Topology::from_hosts(&["h".to_string(), "h".to_string()]);
        for c in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::Broadcast,
        ] {
            let pays_at = |b: usize| pays(c, algo::choose(c, 2, b, &t, &topo), 2, b, &t, &topo);
            assert!(pays_at(1 << 20) && pays_at(128 << 20), "{c}");
            assert!(!pays_at(8), "{c}");
            assert!(build(c, &Shape::new(0, 2, 5, false, ccl_core::ReduceOp::Sum)).is_some());
        }
        assert!(!pays(
            Collective::AllToAll,
            Algo::Pairwise,
            2,
            1 << 20,
            &t,
            &topo
        ));
        // Not across hosts.
        let two = Topology::from_hosts(&["a".to_string(), "b".to_string()]);
        let c = Collective::AllReduce;
        assert!(!pays(c, Algo::Ring, 2, 1 << 20, &t, &two));
    }
}
