//! Every collective in the harness, with nccl-tests byte counts and bus factors.
//!
//! | collective | size column S | busbw factor |
//! |---|---|---|
//! | allreduce | count x typesize | 2(n-1)/n |
//! | broadcast, reduce | count x typesize | 1 |
//! | allgather, reducescatter, alltoall | per-rank count x typesize x n | (n-1)/n |
//! | sendrecv | count x typesize | 1 |
//! | gather, scatter | per-rank count x typesize x n | (n-1)/n |
//! | alltoallv | what each rank sends, about count x typesize x n | (n-1)/n |
//!
//! Alltoallv has no nccl-tests counterpart; its rows send uneven blocks: rank `a` sends rank
//! `b` `unit x ((a + b) mod n)` elements (none to one peer, up to `n-1` units to another), with
//! `unit = floor(2 count / (n-1))`, so every rank sends and receives the same total,
//! `unit x n(n-1)/2`, which is the size column.

use ccl_core::dispatch_dtype;
use ccl_core::test_values::{self, CheckValue};
use oxccl::{Collective, Communicator, DataType, ReduceOp, Result};

use crate::harness::Bench;

/// A benchmarked operation: a collective, or send/recv around a ring.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    Coll(Collective),
    SendRecv,
}

/// The benchmark of one operation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Coll {
    pub op: Op,
    pub root: usize,
}

impl Coll {
    /// Whether NCCL's count is one rank's block (the size column is `n` blocks).
    fn blocks(&self) -> bool {
        matches!(
            self.op,
            Op::Coll(
                Collective::AllGather
                    | Collective::ReduceScatter
                    | Collective::AllToAll
                    | Collective::Gather
                    | Collective::Scatter
            )
        )
    }
}

/// Elements rank `from` sends rank `to` in an alltoallv row of NCCL count `count`.
fn pair_count(from: usize, to: usize, n: usize, count: usize) -> usize {
    if n == 1 {
        return count;
    }
    2 * count / (n - 1) * ((from + to) % n)
}

/// Where rank `from`'s block for rank `to` starts in its send buffer (blocks packed).
fn pair_offset(from: usize, to: usize, n: usize, count: usize) -> usize {
    (0..to).map(|b| pair_count(from, b, n, count)).sum()
}

/// Elements every rank sends (and receives) in an alltoallv row.
fn alltoallv_total(n: usize, count: usize) -> usize {
    pair_offset(0, n, n, count)
}

/// This rank's alltoallv counts: symmetric, so the same layout serves in place.
fn alltoallv_counts(r: usize, n: usize, count: usize) -> oxccl::Counts {
    let c: Vec<usize> = (0..n).map(|k| pair_count(r, k, n, count)).collect();
    oxccl::Counts::AllToAllV {
        send_counts: c.clone(),
        send_displs: None,
        recv_counts: c,
        recv_displs: None,
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
        Op::Coll(Collective::AllGather | Collective::Gather) if in_place => {
            // Only this rank's block is input.
            let es = size_of::<T>();
            put::<T>(&mut buf[r * c * es..(r + 1) * c * es], |i| {
                test_values::input(sum, r, i)
            });
        }
        Op::Coll(
            Collective::AllGather
            | Collective::Broadcast
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter
            | Collective::AllToAllV,
        )
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
            Op::Coll(Collective::Gather) if r == b.root => {
                T::from_i64(test_values::input(sum, i / c1, i % c1))
            }
            Op::Coll(Collective::Gather) => return None,
            Op::Coll(Collective::Scatter) if in_place => {
                if i / c1 != r {
                    return None;
                }
                T::from_i64(test_values::input(sum, b.root, i))
            }
            Op::Coll(Collective::Scatter) => {
                T::from_i64(test_values::input(sum, b.root, r * c + i))
            }
            Op::Coll(Collective::AllToAllV) => {
                // Which sender's block element `i` lies in, and where that block starts.
                let (mut from, mut start) = (0, 0);
                while from < n && start + pair_count(from, r, n, c) <= i {
                    start += pair_count(from, r, n, c);
                    from += 1;
                }
                T::from_i64(test_values::input(
                    sum,
                    from,
                    pair_offset(from, r, n, c) + i - start,
                ))
            }
            Op::Coll(Collective::Barrier | Collective::AllGatherV | Collective::ReduceScatterV) => {
                return None;
            }
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

    fn measuring(&self, comm: &Communicator, count: usize, dtype: DataType) -> bool {
        match self.op {
            Op::Coll(c) => comm.measuring(c, count, dtype),
            Op::SendRecv => false,
        }
    }

    fn bus_factor(&self, n: usize) -> f64 {
        let n = n as f64;
        match self.op {
            Op::Coll(Collective::AllReduce) => 2.0 * (n - 1.0) / n,
            // nccl-tests' factor for every collective whose size column is n blocks.
            _ if self.blocks() || matches!(self.op, Op::Coll(Collective::AllToAllV)) => {
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
            Op::Coll(c) if c.rooted() => self.root as isize,
            _ => -1,
        }
    }

    fn count_for(&self, size: usize, dtype: DataType, n: usize) -> usize {
        if self.blocks() || matches!(self.op, Op::Coll(Collective::AllToAllV)) {
            size / (dtype.size() * n)
        } else {
            size / dtype.size()
        }
    }

    fn bytes_for(&self, count: usize, dtype: DataType, n: usize) -> usize {
        if matches!(self.op, Op::Coll(Collective::AllToAllV)) {
            alltoallv_total(n, count) * dtype.size()
        } else if self.blocks() {
            count * dtype.size() * n
        } else {
            count * dtype.size()
        }
    }

    fn buffer_lens(&self, count: usize, n: usize, in_place: bool) -> (usize, usize) {
        let lens = match self.op {
            Op::Coll(Collective::AllToAllV) => {
                let t = alltoallv_total(n, count);
                oxccl::BufferLens { send: t, recv: t }
            }
            // Counts come from the benchmark's buffer sizes, so their lengths fit.
            Op::Coll(c) => c
                .buffer_lens(count, n)
                .expect("a benchmark row's buffers fit"),
            Op::SendRecv => oxccl::BufferLens {
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
            Op::Coll(Collective::AllToAllV) => {
                let counts = alltoallv_counts(comm.rank(), comm.size(), count);
                comm.collective_v_bytes(&counts, send, recv, dtype, op)
            }
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
