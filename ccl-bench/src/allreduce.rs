//! Allreduce in the harness: S = count x typesize bytes, busbw factor 2(n-1)/n.

use ccl::{Communicator, DataType, ReduceOp, Result};
use ccl_core::check;

use crate::harness::Collective;

pub struct AllReduce;

impl Collective for AllReduce {
    fn name(&self) -> &'static str {
        "allreduce"
    }

    fn bus_factor(&self, n: usize) -> f64 {
        2.0 * (n as f64 - 1.0) / n as f64
    }

    fn run(
        &self,
        comm: &Communicator,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()> {
        comm.all_reduce_bytes(send, recv, count, dtype, op)
    }

    fn fill(&self, comm: &Communicator, buf: &mut [u8], dtype: DataType, op: ReduceOp) {
        check::fill_bytes(dtype, buf, op, comm.rank());
    }

    fn wrong(&self, comm: &Communicator, buf: &[u8], dtype: DataType, op: ReduceOp) -> usize {
        check::count_wrong_bytes(dtype, buf, op, comm.size())
    }
}
