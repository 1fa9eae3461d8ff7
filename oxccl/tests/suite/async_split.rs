//! Non-blocking operations and `split`.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Collective, ErrorKind, ReduceOp};

#[test]
fn outstanding_operations_complete_in_issue_order_and_return_buffers() {
    for t in [TransportKind::Local, TransportKind::Tcp] {
        run_ranks(4, config(t, Duration::from_secs(60)), |comm| {
            let (r, n) = (comm.rank(), comm.size());
            // Eight allreduces in flight, each seeded differently; a blocking one in between
            // must wait its turn and still see its own data.
            let reqs: Vec<_> = (0..8)
                .map(|k| comm.all_reduce_async(vec![(r * 10 + k) as i64; 1000 + k], ReduceOp::Sum))
                .collect();
            let mut mid = vec![1u32; 100];
            comm.all_reduce_in_place(&mut mid, ReduceOp::Sum).unwrap();
            assert_eq!(mid, vec![n as u32; 100]);
            let gathered = comm.collective_async(
                Collective::AllGather,
                Some(vec![r as u32; 3]),
                vec![0u32; 3 * n],
                ReduceOp::Sum,
                0,
            );
            for (k, req) in reqs.into_iter().enumerate() {
                let v = req.wait().unwrap();
                let want: i64 = (0..n).map(|q| (q * 10 + k) as i64).sum();
                assert_eq!(v.len(), 1000 + k);
                assert!(v.iter().all(|&x| x == want), "request {k}");
            }
            let (send, recv) = gathered.wait().unwrap();
            assert_eq!(send.unwrap(), vec![r as u32; 3]);
            assert_eq!(recv, (0..n).flat_map(|q| [q as u32; 3]).collect::<Vec<_>>());
            comm.barrier_async().wait().unwrap();
        });
    }
}

#[test]
fn waiters_run_their_own_operations_and_unwaited_ones_still_progress() {
    for t in [TransportKind::Local, TransportKind::Tcp] {
        run_ranks(2, config(t, Duration::from_secs(60)), |comm| {
            let r = comm.rank();
            // Waited last first: the last waiter may run its operation itself, and it must still
            // come after the five issued before it, which the progress thread runs.
            let reqs: Vec<_> = (0..6)
                .map(|k| comm.all_reduce_async(vec![(r + k) as i64; 64 << k], ReduceOp::Sum))
                .collect();
            for (k, req) in reqs.into_iter().enumerate().rev() {
                let v = req.wait().unwrap();
                assert_eq!(v.len(), 64 << k);
                assert!(v.iter().all(|&x| x == (1 + 2 * k) as i64), "request {k}");
            }
            // Rank 0 waits for nothing on `comm` while it blocks on `other`, which rank 1 joins
            // only once the operation on `comm` is done: it completes only if the progress
            // thread runs it without a waiter.
            let other = comm.split(Some(0), r as i64).unwrap().unwrap();
            let mut x = [r as u32 + 1];
            if r == 0 {
                let q = comm.all_reduce_async(vec![7u32; 1000], ReduceOp::Sum);
                other.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                assert!(q.wait().unwrap().iter().all(|&v| v == 14));
            } else {
                let mut v = vec![7u32; 1000];
                comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                assert!(v.iter().all(|&v| v == 14));
                other.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
            }
            assert_eq!(x, [3]);
        });
    }
}

#[test]
fn computation_overlaps_an_operation_in_flight() {
    run_ranks(
        2,
        config(TransportKind::Tcp, Duration::from_secs(60)),
        |comm| {
            let req = comm.all_reduce_async(vec![1.0f32; 4 << 20], ReduceOp::Sum);
            // The caller's thread is free while the progress thread communicates.
            let mut acc = 0u64;
            for i in 0..1_000_000u64 {
                acc = acc.wrapping_mul(31).wrapping_add(i);
            }
            assert_ne!(acc, 1);
            let v = req.wait().unwrap();
            assert!(v.iter().all(|&x| x == 2.0));
            assert!(
                !format!("{:?}", comm.all_reduce_async(vec![0u8; 1], ReduceOp::Max)).is_empty()
            );
        },
    );
}

#[test]
fn errors_arrive_through_wait_and_abort_ends_queued_work() {
    run_ranks(
        2,
        config(TransportKind::Local, Duration::from_secs(60)),
        |comm| {
            // Bad arguments: reported by wait, the communicator stays usable.
            let bad = comm.collective_async(
                Collective::AllGather,
                Some(vec![1u8; 3]),
                vec![0u8; 5],
                ReduceOp::Sum,
                0,
            );
            let e = bad.wait().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            comm.barrier().unwrap();
            if comm.rank() == 1 {
                // Rank 1 issues nothing more; rank 0's operations wait for it.
                std::thread::sleep(Duration::from_millis(1500));
                return;
            }
            let comm = Arc::new(comm);
            let reqs: Vec<_> = (0..4)
                .map(|_| comm.all_reduce_async(vec![1u8; 1 << 16], ReduceOp::Sum))
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            let t0 = Instant::now();
            comm.abort();
            for r in reqs {
                assert_eq!(r.wait().unwrap_err().kind(), ErrorKind::Aborted);
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            // Later calls fail at once with the same error.
            assert_eq!(comm.barrier().unwrap_err().kind(), ErrorKind::Aborted);
        },
    );
}

#[test]
fn split_by_color_and_key() {
    for t in [TransportKind::Local, TransportKind::Tcp] {
        let out = run_ranks(6, config(t, Duration::from_secs(60)), |comm| {
            let r = comm.rank();
            // Even and odd ranks, ordered by descending rank; rank 5 opts out.
            let color = if r == 5 { None } else { Some((r % 2) as u32) };
            let sub = comm.split(color, -(r as i64)).unwrap();
            let got = sub.map(|sub| {
                let mut x = [r as u64];
                sub.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                (sub.rank(), sub.size(), x[0])
            });
            // The parent still works after the split, with every rank.
            comm.barrier().unwrap();
            (r, got)
        });
        for (r, got) in out {
            let want = match r {
                0 => Some((2, 3, 6)),
                2 => Some((1, 3, 6)),
                4 => Some((0, 3, 6)),
                1 => Some((1, 2, 4)),
                3 => Some((0, 2, 4)),
                _ => None,
            };
            assert_eq!(got, want, "rank {r} over {t:?}");
        }
    }
}
