//! The short way through the executor: an operation whose schedule compiled to a
//! [`LocalPlan`] (a small operation in host memory, the same one over and over in a training
//! step) runs the plan's steps straight against the host memory. The generic run (`Run`) is
//! built only when a wait has to block, so that blocking, its deadline and what a stuck
//! operation reports stay in one place. Measured with the instruction counts of a 2 KiB
//! allreduce between 2 ranks: see docs/performance.md.

use ccl_core::comm::{Links, Peers};
use ccl_core::reduce::{self, Kernels};
use ccl_core::trace::Begin;
use ccl_core::transport::HostMemory;
use ccl_core::{DataType, Error, ReduceOp, Result};

use super::{
    Buffers, ExecState, Job, OpInfo, Registered, Run, begin_op, check_host_calls, end_op, fail_op,
    header_of, host_desc, no_host, outside, plan_slot,
};
use crate::local::{LocalPlan, Step};
use crate::schedule::{Buf, OpId, Schedule};

/// An operation whose schedule compiled to a [`LocalPlan`] for this rank, with its buffers.
#[derive(Debug)]
pub struct PlanJob<'s, 'b> {
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
pub fn run_plan(
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
    // The executor's state for this operation is set only if a wait blocks (`Planned::wait`):
    // nothing else here reads it.
    let mut host = links.host.take();
    let r = match host.as_deref_mut() {
        Some(h) => {
            let mut p = Planned {
                comm,
                links: &mut *links,
                base: h.posted(h.me()),
                kernels: *state.kernels.get_or_insert_with(|| h.kernels()),
                h,
                st: &mut *state,
                sched,
                // A plan's schedule has no scratch space (`LocalPlan::compile`).
                bufs: Buffers::caller(job.send, job.recv),
                dtype: job.dtype,
                op: job.op,
                info: job.info,
                seq: job.seq,
                elem,
                entry_us,
                announced: false,
            };
            p.drive(job.plan)
        }
        None => Err(fail_op(comm, &job.info, job.seq, sched, no_host())),
    };
    if r.is_ok() {
        state.next_local = sched.locals.len();
    }
    end_op(comm, host.as_deref(), state, sched, &r);
    links.host = host;
    r
}

/// One run of a plan.
struct Planned<'r, 'b> {
    comm: &'r Peers,
    /// Lent to the generic run when a wait blocks.
    links: &'r mut Links,
    h: &'r mut (dyn HostMemory + 'static),
    st: &'r mut ExecState,
    sched: &'r Schedule,
    bufs: Buffers<'b>,
    dtype: DataType,
    op: ReduceOp,
    info: OpInfo,
    seq: u64,
    elem: usize,
    entry_us: u64,
    kernels: Kernels,
    /// This rank's post count when the operation began: the plan's waits count from it.
    base: u64,
    /// Whether this rank has told the host which operation it is in.
    announced: bool,
}

impl Planned<'_, '_> {
    fn drive(&mut self, plan: &LocalPlan) -> Result<()> {
        // Announced at the first post and compared at every wait: worked out once.
        let desc = host_desc(self.header(), self.sched.direct);
        for step in plan.steps(self.st.host_second_half) {
            match step {
                Step::Post => {
                    if !self.announced {
                        self.h.announce(self.st.host_ops, desc);
                        self.announced = true;
                    }
                    self.h.post();
                }
                &Step::Wait { count, id, k } => {
                    self.wait(id, k, u64::from(count))?;
                    if count > 0 {
                        let (h, direct) = (&*self.h, self.sched.direct);
                        check_host_calls(h, self.st.host_ops, desc, direct, || self.header())
                            .map_err(|e| self.fail(e))?;
                    }
                }
                _ => self.data(step).map_err(|e| self.fail(e))?,
            }
        }
        Ok(())
    }

    /// A step that moves or reduces data. Host slots are taken without checking the host rank
    /// against the host's ranks: the plan was compiled for them (`LocalPlan::compile`).
    fn data(&mut self, step: &Step) -> Result<()> {
        let (elem, dtype, op) = (self.elem, self.dtype, self.op);
        match *step {
            Step::CopyIn { src, dst } => {
                let s = self.bufs.get(&src, elem)?;
                // Only into this rank's own slot (`LocalPlan::compile`).
                self.h
                    .my_slot()
                    .get_mut(Buffers::range(&dst, elem))
                    .ok_or_else(|| outside(&dst))?
                    .copy_from_slice(s);
            }
            Step::CopyOut { src, dst } => {
                let Buf::Host(i) = src.buf else {
                    unreachable!("a plan copies out of a host slot")
                };
                let s = plan_slot(self.h, i, &src, elem)?;
                self.bufs.get_mut(&dst, elem)?.copy_from_slice(s);
            }
            Step::CopyLocal { src, dst } => {
                let (d, s) = self.bufs.pair(&dst, &src, elem)?;
                if let Some(s) = s {
                    d.copy_from_slice(s);
                }
            }
            Step::Fused { dst, a, b } => {
                let (Buf::Host(ia), Buf::Host(ib)) = (a.buf, b.buf) else {
                    unreachable!("a plan's one pass reads host slots")
                };
                let (x, y) = (
                    plan_slot(self.h, ia, &a, elem)?,
                    plan_slot(self.h, ib, &b, elem)?,
                );
                (self.kernels.into)(dtype, op, self.bufs.get_mut(&dst, elem)?, x, y);
            }
            Step::ReduceOut { dst, src, order } => {
                let Buf::Host(i) = src.buf else {
                    unreachable!("a plan reduces out of a host slot")
                };
                let s = plan_slot(self.h, i, &src, elem)?;
                (self.kernels.inplace)(dtype, op, self.bufs.get_mut(&dst, elem)?, s, order);
            }
            Step::FinishAvg { region } => {
                if op == ReduceOp::Avg {
                    let world = self.comm.size();
                    reduce::finish_avg(dtype, self.bufs.get_mut(&region, elem)?, world);
                }
            }
            Step::Post | Step::Wait { .. } => unreachable!("run by `drive`"),
        }
        Ok(())
    }

    /// Local op `id`, the `k`th, a wait until every host rank has posted `count` times in this
    /// operation. When nobody has to be waited for, only the ranks seen asleep are woken (the
    /// fenced wake comes when the operation ends); otherwise the generic run waits, having woken
    /// those that may sleep waiting for this rank's posts (a post wakes nobody).
    fn wait(&mut self, id: OpId, k: usize, count: u64) -> Result<()> {
        let target = self.base + count;
        if self.h.all_posted(target) {
            self.h.wake_seen();
            return Ok(());
        }
        self.h.wake();
        self.st.reset_local(self.sched, self.elem, self.entry_us);
        self.st.next_local = k;
        let mut run = Run {
            comm: self.comm,
            links: &mut *self.links,
            host: Some(&mut *self.h),
            host_base: self.base,
            host_swap: self.st.host_second_half.then_some(self.sched.host_slot),
            announced: self.announced,
            entry_us: self.entry_us,
            st: &mut *self.st,
            sched: self.sched,
            bufs: std::mem::replace(&mut self.bufs, Buffers::caller(None, Default::default())),
            registered: Registered::default(),
            dtype: self.dtype,
            op: self.op,
            info: self.info,
            seq: self.seq,
            elem: self.elem,
            chunk: self.comm.config().chunk_size.max(self.elem),
            kernels: self.kernels,
        };
        let r = run.wait_host(id);
        self.bufs = run.bufs;
        r
    }

    fn header(&self) -> super::Header {
        header_of(&self.info, self.dtype, self.op, 0, 0, self.entry_us)
    }

    fn fail(&self, e: Error) -> Error {
        fail_op(self.comm, &self.info, self.seq, self.sched, e)
    }
}
