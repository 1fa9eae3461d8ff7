//! The short way through the executor: an operation whose schedule compiled to a
//! [`LocalPlan`] (a small operation in host memory, the same one over and over in a training
//! step) runs as the plan's program, in one call into the host memory
//! ([`HostMemory::run`]). The generic run (`Run`) is built only when a wait has to block, so
//! that blocking, its deadline and what a stuck operation reports stay in one place. Measured
//! with the instruction counts of a 2 KiB allreduce between 2 ranks: see docs/performance.md.

use crate::peers::{Links, Peers};
use ccl_core::transport::HostMemory;
use ccl_core::transport::program::{HostCall, Stop};
use ccl_core::{DataType, Error, ReduceOp, Result};
use ccl_diag::recorder::Begin;

use super::{
    Buffers, ExecState, Job, OpInfo, Registered, Run, begin_op, check_host_calls, end_op, fail_op,
    header_of, host_desc, no_host, shares_cpus, unlike,
};
use ccl_algos::local::{LocalPlan, Step};
use ccl_algos::schedule::Schedule;

/// An operation whose schedule compiled to a [`LocalPlan`] for this rank, with its buffers.
#[derive(Debug)]
pub(crate) struct PlanJob<'s, 'b> {
    pub schedule: &'s Schedule,
    pub plan: &'s LocalPlan,
    /// Input of an out-of-place collective (`None` in place).
    pub send: Option<&'b [u8]>,
    pub recv: &'b mut [u8],
    pub dtype: DataType,
    pub op: ReduceOp,
    pub info: OpInfo,
    /// The communicator's number for this operation (1, 2, ...).
    pub seq: u64,
    /// What the flight recorder records of it ([`op_record`](super::op_record)): a caller that
    /// runs the same operation again keeps it and changes the number only.
    pub record: Begin,
}

/// Runs `job` by its plan to completion (or error), recording it in the communicator's flight
/// recorder.
pub(crate) fn run_plan(
    comm: &Peers,
    links: &mut Links,
    state: &mut ExecState,
    job: PlanJob<'_, '_>,
) -> Result<()> {
    let sched = job.schedule;
    // A stall injected for tests takes the generic way, which knows how to stall.
    if comm.config().fault_stall == Some(job.seq) {
        let generic = Job {
            schedule: sched,
            buffers: Buffers::caller(job.send, job.recv),
            dtype: job.dtype,
            op: job.op,
            info: job.info,
            seq: job.seq,
            registered: Registered::default(),
            local: None,
        };
        return super::run(comm, links, state, generic);
    }
    let elem = job.dtype.size();
    let entry_us = begin_op(comm, job.record, sched, elem);
    let mut host = links.host.take();
    let r = match host.as_deref_mut() {
        Some(h) => drive(comm, links, h, state, job, entry_us),
        None => Err(fail_op(comm, &job.info, job.seq, sched, no_host())),
    };
    if r.is_ok() {
        state.next_local = sched.locals.len();
    }
    end_op(comm, host.as_deref(), state, sched, &r);
    links.host = host;
    r
}

/// Looks at the counters a wait takes in the host memory before it stops the program and the
/// generic wait takes over ([`HostCall::spin`]): about 3 us on the machine this was measured on
/// (a look and a `pause`, about 22 ns there), several times the usual wait of a small operation
/// whose ranks run in step. 2048 looks measured the same (docs/performance.md).
const WAIT_POLLS: u32 = 128;

/// Runs the plan's program in the host memory, and each wait that would block by the generic
/// run. The executor's state for the operation is set only then: nothing else here reads it.
fn drive(
    comm: &Peers,
    links: &mut Links,
    h: &mut (dyn HostMemory + 'static),
    st: &mut ExecState,
    job: PlanJob<'_, '_>,
    entry_us: u64,
) -> Result<()> {
    let (sched, elem) = (job.schedule, job.dtype.size());
    let fail = |e: Error| fail_op(comm, &job.info, job.seq, sched, e);
    let header = || header_of(&job.info, job.dtype, job.op, 0, 0, entry_us);
    let half = st.host_second_half;
    let (prog, steps) = (job.plan.program(half), job.plan.steps(half));
    // Announced at the first post and compared at every wait: worked out once.
    let desc = host_desc(header(), sched.direct);
    let mut call = HostCall {
        send: job.send,
        recv: job.recv,
        dtype: job.dtype,
        op: job.op,
        world: comm.size(),
        host_op: st.host_ops,
        desc,
        base: 0,
        spin: if shares_cpus(comm, st) { 0 } else { WAIT_POLLS },
    };
    let mut from = 0;
    loop {
        let at = match h.run(prog, from, &mut call).map_err(fail)? {
            Stop::Done => return Ok(()),
            Stop::Blocked { at } => at,
            Stop::Unlike {
                rank, desc: theirs, ..
            } => {
                return Err(fail(unlike(h, rank, theirs, desc, sched.direct, header())));
            }
        };
        let Step::Wait { count, id, k } = steps[at] else {
            return Err(fail(Error::internal(format!(
                "host program stopped at step {at}, which is not a wait"
            ))));
        };
        st.reset_local(sched, elem, entry_us);
        st.next_local = k;
        let resumed = Job {
            schedule: sched,
            buffers: Buffers::caller(call.send, std::mem::take(&mut call.recv)),
            dtype: job.dtype,
            op: job.op,
            info: job.info,
            seq: job.seq,
            registered: Registered::default(),
            local: None,
        };
        let mut run = Run::new(
            comm,
            &mut *links,
            Some(&mut *h),
            &mut *st,
            resumed,
            entry_us,
        );
        (run.host_base, run.announced) = (call.base, steps[..at].contains(&Step::Post));
        let r = run.wait_host(id);
        call.recv = run.bufs.recv;
        r?;
        if count > 0 {
            check_host_calls(h, st.host_ops, desc, sched.direct, header).map_err(fail)?;
        }
        from = at + 1;
    }
}
