//! 10,000 random operations (collective, algorithm, type, operator, placement, size up to 4 MiB),
//! every result checked against closed-form values, and the process's resident memory before and
//! after: flat (no leak).

use crate::common;

use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use ccl_core::dispatch_dtype;
use ccl_core::test_values::{self, CheckValue};
use common::*;
use oxccl::{Collective, Communicator, DataType, ReduceOp};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One random call on typed buffers; returns the number of wrong elements.
fn one<T: CheckValue>(
    comm: &Communicator,
    coll: Collective,
    count: usize,
    op: ReduceOp,
    in_place: bool,
    root: usize,
) -> usize {
    let (r, n) = (comm.rank(), comm.size());
    let c1 = count.max(1);
    let val = |o: ReduceOp, k: usize, i: usize| T::from_i64(test_values::input(o, k, i));
    let fail = |e: oxccl::Error| {
        panic!(
            "rank {r}: {coll} count {count} {} {op} in_place={in_place}: {e}",
            T::DTYPE
        )
    };
    let (send_len, recv_len) = match coll {
        Collective::AllGather => (count, count * n),
        Collective::ReduceScatter => (count * n, count),
        Collective::AllToAll => (count * n, count * n),
        _ => (count, count),
    };
    let input_op = if matches!(
        coll,
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
    ) {
        op
    } else {
        ReduceOp::Sum
    };
    let mut buf: Vec<T>;
    if in_place {
        buf = vec![T::from_i64(0); send_len.max(recv_len)];
        if coll == Collective::AllGather {
            for i in 0..count {
                buf[r * count + i] = val(input_op, r, i);
            }
        } else {
            for (i, x) in buf.iter_mut().enumerate() {
                *x = val(input_op, r, i);
            }
        }
        comm.collective(coll, None, &mut buf, op, root)
            .unwrap_or_else(fail);
    } else {
        let send: Vec<T> = (0..send_len).map(|i| val(input_op, r, i)).collect();
        buf = vec![T::from_i64(0); recv_len];
        comm.collective(coll, Some(&send), &mut buf, op, root)
            .unwrap_or_else(fail);
    }
    let want = |i: usize| -> Option<T> {
        Some(match coll {
            Collective::AllReduce => test_values::expected(op, n, i),
            Collective::Broadcast => val(ReduceOp::Sum, root, i),
            Collective::Reduce if r == root => test_values::expected(op, n, i),
            Collective::AllGather => val(ReduceOp::Sum, i / c1, i % c1),
            Collective::ReduceScatter if in_place => {
                if i / c1 != r {
                    return None;
                }
                test_values::expected(op, n, i)
            }
            Collective::ReduceScatter => test_values::expected(op, n, r * count + i),
            Collective::AllToAll => val(ReduceOp::Sum, i / c1, r * count + i % c1),
            _ => return None,
        })
    };
    buf.iter()
        .enumerate()
        .filter(|(i, x)| want(*i).is_some_and(|w| bytemuck::bytes_of(*x) != bytemuck::bytes_of(&w)))
        .count()
}

fn run_one(
    comm: &Communicator,
    dtype: DataType,
    coll: Collective,
    count: usize,
    op: ReduceOp,
    in_place: bool,
    root: usize,
) -> usize {
    dispatch_dtype!(dtype, one(comm, coll, count, op, in_place, root))
}

#[test]
fn ten_thousand_random_operations() {
    let ops: usize = std::env::var("CCL_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let n = 3;
    let res = run_ranks(
        n,
        config(TransportKind::Tcp, Duration::from_secs(120)),
        move |comm| {
            // The same seed on every rank: they draw the same sequence of calls.
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let colls = [
                Collective::AllReduce,
                Collective::Broadcast,
                Collective::Reduce,
                Collective::AllGather,
                Collective::ReduceScatter,
                Collective::AllToAll,
            ];
            let mut rss = (0, 0, 0);
            let t0 = Instant::now();
            let mut wrong = 0;
            let mut moved = 0u64;
            for k in 0..ops {
                if k == 200 {
                    // After warm-up: scratch and socket buffers are in place.
                    rss.0 = rss_kib();
                }
                if k == ops / 2 {
                    // By now the plan cache has been full (and emptied) more than once.
                    rss.1 = rss_kib();
                }
                let coll = colls[rng.below(colls.len() as u64) as usize];
                let algos = comm.algorithms(coll);
                let algo = algos[rng.below(algos.len() as u64) as usize];
                comm.set_algorithm(coll, Some(algo)).unwrap();
                let dtype = DataType::ALL[rng.below(10) as usize];
                let op = ReduceOp::ARITHMETIC[rng.below(5) as usize];
                let in_place = rng.below(2) == 0;
                let root = rng.below(n as u64) as usize;
                // Log-uniform total size from 1 byte to 4 MiB.
                let total = (1u64 << rng.below(23)) + rng.below(1 << 10);
                let per = match coll {
                    Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => n,
                    _ => 1,
                };
                let count =
                    (total as usize / dtype.size() / per).min((4 << 20) / dtype.size() / per);
                moved += (count * dtype.size() * per) as u64;
                let w = run_one(&comm, dtype, coll, count, op, in_place, root);
                if w > 0 {
                    wrong += w;
                    eprintln!(
                        "rank {}: op {k}: {coll} {algo} count {count} {dtype} {op} in_place={in_place} root={root}: {w} wrong",
                        comm.rank()
                    );
                }
            }
            comm.barrier().unwrap();
            rss.2 = rss_kib();
            (comm.rank(), wrong, rss, t0.elapsed(), moved)
        },
    );
    let mut rss_seen = (0, 0, 0);
    for (rank, wrong, rss, took, moved) in &res {
        assert_eq!(*wrong, 0, "rank {rank} had wrong elements");
        rss_seen = *rss;
        if *rank == 0 {
            eprintln!(
                "{ops} random operations on {n} ranks in {took:?} ({} MB moved per rank); process RSS {} KiB after warm-up, {} KiB halfway, {} KiB at the end",
                moved / 1_000_000,
                rss.0,
                rss.1,
                rss.2
            );
        }
    }
    // The ranks are threads of this process: one RSS. Buffers come and go each operation;
    // what stays must not grow with the number of operations: the second half of the run may
    // not add more than allocator noise.
    let growth = rss_seen.2.saturating_sub(rss_seen.0);
    assert!(
        growth < 64 * 1024,
        "RSS grew by {growth} KiB over {ops} operations"
    );
    let late = rss_seen.2.saturating_sub(rss_seen.1);
    assert!(
        late < 8 * 1024,
        "RSS grew by {late} KiB over the second half ({} operations)",
        ops - ops / 2
    );
}
