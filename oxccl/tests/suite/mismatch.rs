//! Ranks that call different operations get an error that describes both calls, on every rank,
//! instead of corrupt data or a hang: on the call itself, or at the latest on the next call that
//! waits for the other side (a send completes once the transport has the bytes; two "roots" both
//! only send, and the next operation finds the streams out of step).

use crate::common;

use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Algo, Collective, Communicator, ReduceOp};

/// Runs `a` on rank 0 and `b` on rank 1 (each returns the error it got) and checks both errors.
fn clash(
    transport: TransportKind,
    a: impl Fn(&Communicator) -> oxccl::Result<()> + Send + Sync + Clone + 'static,
    b: impl Fn(&Communicator) -> oxccl::Result<()> + Send + Sync + Clone + 'static,
    needles: &'static [&'static str],
) {
    let errs = run_ranks(2, config(transport, Duration::from_secs(20)), move |comm| {
        let t0 = Instant::now();
        let r = if comm.rank() == 0 { a(&comm) } else { b(&comm) };
        let e = r
            .and_then(|()| comm.barrier())
            .expect_err("a mismatch must fail by the next synchronising call");
        let later = comm.barrier().expect_err("the communicator stays failed");
        assert_eq!(later.to_string(), e.to_string());
        // Keep the connections until both sides have their errors.
        std::thread::sleep(Duration::from_millis(300));
        (comm.rank(), e, t0.elapsed())
    });
    for (rank, e, took) in errs {
        let s = e.to_string();
        assert!(
            needles.iter().any(|n| s.contains(n)),
            "{transport:?} rank {rank}: {s} lacks one of {needles:?}"
        );
        assert!(
            took < Duration::from_secs(15),
            "rank {rank} took {took:?} (a hang until the timeout?)"
        );
    }
}

const MISMATCH: &[&str] = &["mismatched calls", "out of step"];

#[test]
fn different_counts_types_ops_roots_collectives_and_algorithms() {
    for t in [TransportKind::Local, TransportKind::Tcp, TransportKind::Shm] {
        clash(
            t,
            |c| c.all_reduce_in_place(&mut [1f32; 100], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [1f32; 200], ReduceOp::Sum),
            &["allreduce of 100 x float", "allreduce of 200 x float"],
        );
        clash(
            t,
            |c| c.all_reduce_in_place(&mut [1f32; 64], ReduceOp::Sum),
            |c| c.broadcast_in_place(&mut [1f32; 64], 0),
            &["broadcast of 64 x float"],
        );
        clash(
            t,
            |c| c.all_reduce_in_place(&mut [1f32; 64], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [1i32; 64], ReduceOp::Sum),
            &["x int32", "x float"],
        );
        clash(
            t,
            |c| c.all_reduce_in_place(&mut [1f64; 64], ReduceOp::Sum),
            |c| c.all_reduce_in_place(&mut [1f64; 64], ReduceOp::Max),
            &["max)", "sum)"],
        );
        clash(
            t,
            |c| c.broadcast_in_place(&mut [1u8; 4096], 0),
            |c| c.broadcast_in_place(&mut [1u8; 4096], 1),
            MISMATCH,
        );
        clash(
            t,
            |c| {
                c.set_algorithm(Collective::AllReduce, Some(Algo::Ring))?;
                c.all_reduce_in_place(&mut [1f32; 1000], ReduceOp::Sum)
            },
            |c| {
                c.set_algorithm(Collective::AllReduce, Some(Algo::RecursiveDoubling))?;
                c.all_reduce_in_place(&mut [1f32; 1000], ReduceOp::Sum)
            },
            MISMATCH,
        );
    }
}

/// In shared memory a collective may run in host memory on one rank and over the connection on
/// the other: each side notices the other's kind of call and fails at once.
#[test]
fn host_memory_and_connection_calls_do_not_wait_for_each_other() {
    clash(
        TransportKind::Shm,
        |c| c.all_reduce_in_place(&mut [1f32; 64], ReduceOp::Sum),
        |c| c.reduce_in_place(&mut [1f32; 64], ReduceOp::Sum, 0),
        &["allreduce of 64 x float", "reduce of 64 x float"],
    );
    clash(
        TransportKind::Shm,
        |c| c.send(&[1u8; 32], 1),
        |c| c.all_reduce_in_place(&mut [1f32; 8], ReduceOp::Sum),
        &["allreduce of 8 x float", "send/recv"],
    );
}

#[test]
fn an_extra_call_on_one_side_is_out_of_step() {
    clash(
        TransportKind::Tcp,
        |c| {
            c.all_reduce_in_place(&mut [1u32; 8], ReduceOp::Sum)?;
            c.all_reduce_in_place(&mut [1u32; 8], ReduceOp::Sum)?;
            c.all_reduce_in_place(&mut [1u32; 8], ReduceOp::Sum)
        },
        |c| {
            c.all_reduce_in_place(&mut [1u32; 8], ReduceOp::Sum)?;
            c.all_gather(&[1u32; 4], &mut [0u32; 8])?;
            c.all_reduce_in_place(&mut [1u32; 8], ReduceOp::Sum)
        },
        &["allgather of 4 x uint32", "mismatched calls"],
    );
}

#[test]
fn send_and_receive_sizes_must_match() {
    for t in [TransportKind::Local, TransportKind::Tcp, TransportKind::Shm] {
        clash(
            t,
            |c| c.send(&[7u8; 100], 1),
            |c| c.recv(&mut [0u8; 80], 0),
            &["send/recv of 100 bytes", "send/recv of 80 bytes"],
        );
    }
}
