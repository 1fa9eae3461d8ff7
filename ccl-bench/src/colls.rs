//! Every collective in the harness, with nccl-tests byte counts and bus factors.
//!
//! | collective | size column S | busbw factor |
//! |---|---|---|
//! | allreduce | count x typesize | 2(n-1)/n |
//! | broadcast, reduce | count x typesize | 1 |
//! | allgather, reducescatter, alltoall | per-rank count x typesize x n | (n-1)/n |
//! | sendrecv | count x typesize | 1 |

use ccl::{Collective, Communicator, DataType, ReduceOp, Result};
use ccl_core::dispatch_dtype;
use ccl_core::test_values::{self, CheckValue};

use crate::harness::Bench;

/// A benchmarked operation: a collective, or send/recv around a ring.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    Coll(Collective),
    SendRecv,
}

/// The benchmark of one operation.
#[derive(Clone, Copy, Debug)]
pub struct Coll {
    pub op: Op,
    pub root: usize,
}

impl Coll {
    fn blocks(&self) -> bool {
        matches!(
            self.op,
            Op::Coll(Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll)
        )
    }
}

/// `v` written as element values of `T`.
fn put<T: CheckValue>(buf: &mut [u8], f: impl Fn(usize) -> i64) {
    for (i, x) in bytemuck::cast_slice_mut::<u8, T>(buf)
        .iter_mut()
        .enumerate()
    {
        *x = T::from_i64(f(i));
    }
}

fn fill_t<T: CheckValue>(
    b: &Coll,
    r: usize,
    c: usize,
    buf: &mut [u8],
    op: ReduceOp,
    in_place: bool,
) {
    let sum = ReduceOp::Sum;
    match b.op {
        Op::Coll(Collective::AllGather) if in_place => {
            // Only this rank's block is input.
            let es = size_of::<T>();
            put::<T>(&mut buf[r * c * es..(r + 1) * c * es], |i| {
                test_values::input(sum, r, i)
            });
        }
        Op::Coll(Collective::AllGather | Collective::Broadcast | Collective::AllToAll)
        | Op::SendRecv => put::<T>(buf, |i| test_values::input(sum, r, i)),
        _ => put::<T>(buf, |i| test_values::input(op, r, i)),
    }
}

fn wrong_t<T: CheckValue>(
    b: &Coll,
    r: usize,
    n: usize,
    c: usize,
    buf: &[u8],
    op: ReduceOp,
    in_place: bool,
) -> usize {
    let v: &[T] = bytemuck::cast_slice(buf);
    let sum = ReduceOp::Sum;
    let c1 = c.max(1);
    let want = |i: usize| -> Option<T> {
        Some(match b.op {
            Op::Coll(Collective::AllReduce) => test_values::expected(op, n, i),
            Op::Coll(Collective::Broadcast) => T::from_i64(test_values::input(sum, b.root, i)),
            Op::Coll(Collective::Reduce) if r == b.root => test_values::expected(op, n, i),
            Op::Coll(Collective::Reduce) => return None,
            Op::Coll(Collective::AllGather) => T::from_i64(test_values::input(sum, i / c1, i % c1)),
            Op::Coll(Collective::ReduceScatter) if in_place => {
                if i / c1 != r {
                    return None;
                }
                test_values::expected(op, n, i)
            }
            Op::Coll(Collective::ReduceScatter) => test_values::expected(op, n, r * c + i),
            Op::Coll(Collective::AllToAll) => {
                T::from_i64(test_values::input(sum, i / c1, r * c + i % c1))
            }
            Op::Coll(Collective::Barrier) => return None,
            Op::SendRecv => T::from_i64(test_values::input(sum, (r + n - 1) % n, i)),
        })
    };
    v.iter()
        .enumerate()
        .filter(|(i, x)| want(*i).is_some_and(|w| bytemuck::bytes_of(*x) != bytemuck::bytes_of(&w)))
        .count()
}

impl Bench for Coll {
    fn name(&self) -> &'static str {
        match self.op {
            Op::Coll(c) => c.name(),
            Op::SendRecv => "sendrecv",
        }
    }

    fn algo(&self, comm: &Communicator, bytes: usize) -> String {
        match self.op {
            Op::Coll(c) => comm.algorithm(c, bytes).name().to_string(),
            Op::SendRecv => "p2p".to_string(),
        }
    }

    fn bus_factor(&self, n: usize) -> f64 {
        let n = n as f64;
        match self.op {
            Op::Coll(Collective::AllReduce) => 2.0 * (n - 1.0) / n,
            Op::Coll(Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll) => {
                (n - 1.0) / n
            }
            _ => 1.0,
        }
    }

    fn has_in_place(&self) -> bool {
        !matches!(self.op, Op::SendRecv)
    }

    fn root(&self) -> isize {
        match self.op {
            Op::Coll(Collective::Broadcast | Collective::Reduce) => self.root as isize,
            _ => -1,
        }
    }

    fn count_for(&self, size: usize, dtype: DataType, n: usize) -> usize {
        if self.blocks() {
            size / (dtype.size() * n)
        } else {
            size / dtype.size()
        }
    }

    fn bytes_for(&self, count: usize, dtype: DataType, n: usize) -> usize {
        if self.blocks() {
            count * dtype.size() * n
        } else {
            count * dtype.size()
        }
    }

    fn buffer_lens(&self, count: usize, n: usize, in_place: bool) -> (usize, usize) {
        let lens = match self.op {
            // Counts come from the benchmark's buffer sizes, so their lengths fit.
            Op::Coll(c) => c
                .buffer_lens(count, n)
                .expect("a benchmark row's buffers fit"),
            Op::SendRecv => ccl::BufferLens {
                send: count,
                recv: count,
            },
        };
        if in_place {
            (0, lens.in_place())
        } else {
            (lens.send, lens.recv)
        }
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
        match self.op {
            Op::Coll(c) => comm.collective_bytes(c, send, recv, count, dtype, op, self.root),
            Op::SendRecv => {
                let (r, n) = (comm.rank(), comm.size());
                let mut g = comm.group();
                g.send(send.expect("sendrecv runs out of place"), (r + 1) % n)?;
                g.recv(recv, (r + n - 1) % n)?;
                g.run()
            }
        }
    }

    fn fill(
        &self,
        comm: &Communicator,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        in_place: bool,
    ) {
        dispatch_dtype!(dtype, fill_t(self, comm.rank(), count, buf, op, in_place))
    }

    fn wrong(
        &self,
        comm: &Communicator,
        buf: &[u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        in_place: bool,
    ) -> usize {
        let (r, n) = (comm.rank(), comm.size());
        dispatch_dtype!(dtype, wrong_t(self, r, n, count, buf, op, in_place))
    }
}
