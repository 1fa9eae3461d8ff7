//! An operation's life around its schedule: the flight-recorder entry it opens and closes,
//! the error it ends with.

use super::*;

/// Whether this host's ranks outnumber its CPUs (worked out once per communicator).
pub(super) fn shares_cpus(comm: &Peers, st: &mut ExecState) -> bool {
    *st.shares_cpus.get_or_insert_with(|| {
        comm.machine_cpus() > 0 && comm.ranks_on_host() > comm.machine_cpus()
    })
}

/// Adds what operation `seq` was doing to `e`, and what the job monitor knows of its cause.
pub(super) fn fail_op(comm: &Peers, info: &OpInfo, seq: u64, sched: &Schedule, e: Error) -> Error {
    let e = e.rank(comm.rank()).context(format!(
        "{} #{} ({}, {} bytes)",
        info.name(),
        seq,
        sched.algo,
        info.bytes
    ));
    comm.explain(e)
}

/// Starts the recorder's entry for `job`; returns the time the operation entered (the entry's
/// start: one clock read fewer per operation).
#[inline]
pub(super) fn begin_op(comm: &Peers, b: Begin, sched: &Schedule, elem: usize) -> u64 {
    let start = comm.recorder().begin(
        b,
        sched.peers.iter().map(|p| {
            (
                p.peer,
                (p.send_elems * elem) as u64,
                (p.recv_elems * elem) as u64,
            )
        }),
    );
    start.unwrap_or_else(trace::now_us)
}

/// Ends the recorder's entry of an operation that failed before it began to run (its
/// connections could not be made); nothing of it ran, so only the error and the peer it names
/// are recorded.
pub(super) fn abandon_op(comm: &Peers, e: &Error) {
    let mut rec = comm.recorder();
    if let Some(entry) = rec.current() {
        entry.waiting_on = e.peer_id();
    }
    rec.end(Some(e.to_string()));
}

/// What the flight recorder records of operation `seq`.
pub(crate) fn op_record(
    info: &OpInfo,
    seq: u64,
    dtype: DataType,
    op: ReduceOp,
    algo: &'static str,
) -> Begin {
    Begin {
        seq,
        name: info.name(),
        algo,
        dtype: dtype.name(),
        op: op.name(),
        count: info.count as u64,
        bytes: info.bytes as u64,
        root: info.rooted().then_some(info.root),
    }
}

/// What every run does once its schedule ran (to completion or to error `r`): wakes the ranks
/// that wait for this one's last posts, turns the host memory's halves, and closes the
/// recorder's entry.
#[inline]
pub(super) fn end_op(
    comm: &Peers,
    host: Option<&(dyn HostMemory + 'static)>,
    state: &mut ExecState,
    sched: &Schedule,
    r: &Result<()>,
) {
    // Posts wake nobody: the ranks that wait for this one's last posts are woken now.
    if sched.uses_host()
        && let Some(h) = host
    {
        h.wake();
    }
    // Every rank of the host runs the same operations in host memory (a mismatch fails the
    // communicator), so all count them and turn the halves alike.
    if sched.uses_host() && sched.host_chunks > 0 {
        state.host_ops += 1;
        state.host_second_half ^= sched.host_chunks % 2 == 1;
    }
    state.end_idle();
    // A failed operation waits on the peer it waited for, or else on the one its error blames
    // (an operation in host memory has no peer of its own to wait on, yet its error names the
    // rank that left): a monitor's verdict follows that wait instead of ending at this rank.
    let waiting = r.as_ref().err().and_then(|e| {
        state
            .first_waited_peer(sched)
            .or(crate::peers::blamed_peer(e).filter(|&p| p != comm.rank()))
    });
    {
        let mut rec = comm.recorder();
        if let Some(e) = rec.current() {
            // Without peers (idle already ended), only what it waits on is left to say.
            if sched.peers.is_empty() {
                e.waiting_on = waiting;
            } else {
                state.sync_entry(e, sched, waiting);
            }
        }
        rec.end(r.as_ref().err().map(|e| e.to_string()));
    }
    // An operation with no peer's header (one in host memory) says nothing of lateness.
    if r.is_ok() && !sched.peers.is_empty() {
        comm.note_lateness(
            sched
                .peers
                .iter()
                .zip(&state.peers)
                .filter_map(|(p, q)| q.late_us.map(|l| (p.peer, l))),
        );
    }
}
