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

/// Whether the direct schedule of `coll` exists and costs less at `bytes` than `chosen`, the
/// algorithm the cost model picks for plain buffers (the model's
/// [`cost::host_direct_allreduce`] against that algorithm's cost).
pub fn pays(
    coll: Collective,
    chosen: Algo,
    n: usize,
    bytes: usize,
    t: &TransportProperties,
    topo: &Topology,
) -> bool {
    if coll != Collective::AllReduce || n < 2 || bytes == 0 || !algo::available(Algo::Shm, t, topo)
    {
        return false;
    }
    let Some(other) = algo::cost(coll, chosen, n, bytes, t, topo) else {
        return false;
    };
    let direct = LinkCosts::new(t, topo).time(&cost::host_direct_allreduce(n), bytes as f64);
    direct < other
}

/// Allreduce in place on shared buffers: rank `j` reduces part `j` of every rank's input into
/// its own output, then copies it into every other rank's output.
pub fn allreduce(shape: &Shape) -> Schedule {
    let (n, me, c) = (shape.size, shape.rank, shape.count);
    if c == 0 {
        return Schedule::new("shm").finish();
    }
    let mut s = Schedule::new("shm-direct");
    // Posts and waits need host memory; no slot is used.
    s.host_slot = shape.host_slot.max(1);
    // Counted as host operations are (each is announced in the place of its turn), and even,
    // so that the slot halves of the staged schedules go on as they were.
    s.host_chunks = 2;
    s.direct = true;
    let mut step = 0;
    let push = |s: &mut Schedule, a: Action, step: u32| {
        s.push(a, &[], None, step);
    };
    push(&mut s, Action::Post, step);
    push(&mut s, Action::WaitPosts { count: 1 }, step);
    step += 1;
    let (a, l) = part(c, n, me);
    if l > 0 {
        let out = Region::new(Buf::Recv, a, l);
        // Out of place, the first reduction reads this rank's input and writes the output in
        // one pass (no copy of the own part first).
        let first = (me + 1) % n;
        if !shape.in_place {
            push(
                &mut s,
                Action::ReduceInto {
                    dst: out,
                    a: Region::new(Buf::Send, a, l),
                    b: Region::new(Buf::PeerIn(first as u16), a, l),
                },
                step,
            );
        }
        for j in (0..n).filter(|&j| j != me && (shape.in_place || j != first)) {
            push(
                &mut s,
                Action::Reduce {
                    dst: out,
                    src: Region::new(Buf::PeerIn(j as u16), a, l),
                    src_first: false,
                },
                step,
            );
        }
        push(&mut s, Action::FinishAvg { region: out }, step);
        for j in (0..n).filter(|&j| j != me) {
            push(
                &mut s,
                Action::Copy {
                    src: out,
                    dst: Region::new(Buf::PeerOut(j as u16), a, l),
                },
                step,
            );
        }
    }
    push(&mut s, Action::Post, step);
    push(&mut s, Action::WaitPosts { count: 2 }, step);
    s.finish()
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
        let c = Collective::AllReduce;
        let pays_at = |b: usize| pays(c, algo::choose(c, 2, b, &t, &topo), 2, b, &t, &topo);
        assert!(pays_at(1 << 20) && pays_at(128 << 20));
        assert!(!pays_at(8));
        let ag = Collective::AllGather;
        assert!(!pays(ag, Algo::Shm, 2, 1 << 20, &t, &topo));
        // Not across hosts.
        let two = Topology::from_hosts(&["a".to_string(), "b".to_string()]);
        assert!(!pays(c, Algo::Ring, 2, 1 << 20, &t, &two));
    }
}
