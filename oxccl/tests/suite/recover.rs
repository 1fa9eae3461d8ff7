//! Revoke, shrink and grow with ranks as threads (ranks killed as processes: ccl-bench's
//! `shrink-trials`, run by ccl-bench/tests/faults.rs).

use crate::common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use common::*;
use oxccl::{Communicator, ErrorKind, ReduceOp, UniqueId};

const BOTH: [TransportKind; 2] = [TransportKind::Tcp, TransportKind::Local];

/// An allreduce every member checks: each contributes its rank + 1.
fn checked_sum(c: &Communicator) {
    let mine = vec![(c.rank() + 1) as f64; 1000];
    let mut out = vec![0.0; 1000];
    c.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
    let n = c.size() as f64;
    assert!(
        out.iter().all(|&x| x == n * (n + 1.0) / 2.0),
        "{:?}",
        &out[..4]
    );
}

#[test]
fn revoke_from_one_rank_ends_every_blocked_rank_with_revoked() {
    for t in BOTH {
        let res = run_ranks(4, config(t, Duration::from_secs(60)), |comm| {
            let started = Instant::now();
            if comm.rank() == 3 {
                // The others are blocked waiting for this rank, which never joins.
                std::thread::sleep(Duration::from_millis(300));
                comm.revoke();
                let e = comm.barrier().unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Revoked, "{e}");
                return started.elapsed();
            }
            let mut x = vec![1.0f32; 1 << 16];
            let e = if comm.rank() == 2 {
                // Blocked in a wait on a non-blocking call rather than in the call.
                comm.all_reduce_async(x, ReduceOp::Sum).wait().unwrap_err()
            } else {
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err()
            };
            assert_eq!(e.kind(), ErrorKind::Revoked, "rank {}: {e}", comm.rank());
            assert!(e.to_string().contains("rank 3 revoked"), "{e}");
            // Sticky, like every failure.
            assert_eq!(comm.barrier().unwrap_err().kind(), ErrorKind::Revoked);
            started.elapsed()
        });
        for (r, d) in res.iter().enumerate() {
            assert!(*d < Duration::from_secs(30), "{t:?} rank {r} took {d:?}");
        }
    }
}

#[test]
fn shrink_leaves_out_an_excluded_live_rank_that_keeps_calling() {
    for t in BOTH {
        let res = run_ranks(4, config(t, Duration::from_secs(60)), |comm| {
            if comm.rank() == 3 {
                // Excluded by the others; keeps calling collectives.
                let mut x = vec![1.0f32; 64];
                let e = comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Revoked, "{e}");
                let e = comm.shrink(&[]).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Revoked, "{e}");
                assert!(
                    e.to_string().contains("excluded") || e.to_string().contains("left out"),
                    "{e}"
                );
                return None;
            }
            let s = comm.shrink(&[3]).unwrap();
            assert_eq!((s.rank(), s.size()), (comm.rank(), 3));
            checked_sum(&s);
            Some(s.size())
        });
        assert_eq!(res, vec![Some(3), Some(3), Some(3), None], "{t:?}");
    }
}

#[test]
fn teardown_returns_with_an_excluded_rank_gone_and_the_parent_destroyed() {
    // The two hangs NCCL users meet: an excluded rank that leaves without calling shrink, and
    // survivors that destroy (not abort) the parent after shrinking. Neither may stall.
    let timeout = Duration::from_secs(20);
    for t in BOTH {
        let res = run_ranks(4, config(t, timeout), move |comm| {
            if comm.rank() == 3 {
                // Leaves at once: never calls shrink, drops its communicator.
                let started = Instant::now();
                drop(comm);
                return (None, started.elapsed());
            }
            let s = comm.shrink(&[3]).unwrap();
            checked_sum(&s);
            let started = Instant::now();
            // Destroyed, not aborted, with a member gone and its child alive.
            drop(comm);
            checked_sum(&s);
            drop(s);
            (Some(3), started.elapsed())
        });
        for (r, (size, took)) in res.iter().enumerate() {
            assert_eq!(*size, (r != 3).then_some(3), "{t:?} rank {r}");
            // Well within the timeout: the drops wait for nothing that cannot come.
            assert!(
                *took < timeout / 2,
                "{t:?} rank {r}: teardown took {took:?}"
            );
        }
    }
}

#[test]
fn a_rank_that_does_not_ask_is_left_out_after_the_timeout() {
    let res = run_ranks(
        3,
        config(TransportKind::Tcp, Duration::from_millis(1500)),
        |comm| {
            if comm.rank() == 1 {
                // Stuck in user code past the timeout, then asks too late.
                std::thread::sleep(Duration::from_secs(4));
                let e = comm.shrink(&[]).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Revoked, "{e}");
                assert!(e.to_string().contains("left out"), "{e}");
                return None;
            }
            let s = comm.shrink(&[]).unwrap();
            // Rank 2 is rank 1 now: ranks keep their order, numbered densely.
            assert_eq!(s.rank(), comm.rank() / 2);
            checked_sum(&s);
            Some(s.size())
        },
    );
    assert_eq!(res, vec![Some(2), None, Some(2)]);
}

#[test]
fn shrink_refuses_bad_excludes_and_shrinks_down_to_one_rank() {
    let res = run_ranks(
        3,
        config(TransportKind::Tcp, Duration::from_secs(30)),
        |comm| {
            let e = comm.shrink(&[7]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("rank 7"), "{e}");
            let e = comm.shrink(&[comm.rank()]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.to_string().contains("excludes itself"), "{e}");
            if comm.rank() != 0 {
                let e = comm.shrink(&[]).unwrap_err();
                assert_eq!(e.kind(), ErrorKind::Revoked, "{e}");
                return 0;
            }
            // Rank 0 leaves out everyone else: a communicator of one, which shrinks again to one.
            let one = comm.shrink(&[1, 2]).unwrap();
            assert_eq!((one.rank(), one.size()), (0, 1));
            checked_sum(&one);
            let again = one.shrink(&[]).unwrap();
            checked_sum(&again);
            assert_eq!(one.barrier().unwrap_err().kind(), ErrorKind::Revoked);
            again.size()
        },
    );
    assert_eq!(res, vec![1, 0, 0]);
}

#[test]
fn grow_adds_a_process_and_refuses_forged_and_stale_ids() {
    let cfg = config(TransportKind::Tcp, Duration::from_secs(30));
    let (tx, rx) = mpsc::channel::<UniqueId>();
    let newcomer = {
        let cfg = cfg.clone();
        std::thread::spawn(move || {
            let id = rx.recv().unwrap();
            let c = Communicator::init_with_config(&id, 2, 3, cfg.clone()).unwrap();
            checked_sum(&c);
            // A forged id: the right address, another secret.
            let forged = UniqueId::for_address(id.root_addr(), [7u8; 32]);
            let mut short = cfg.clone();
            short.timeout = Duration::from_secs(3);
            let e = Communicator::init_with_config(&forged, 2, 3, short).unwrap_err();
            e.to_string()
        })
    };
    let tx = std::sync::Mutex::new(Some(tx));
    let tx = std::sync::Arc::new(tx);
    let res = run_ranks(2, cfg, move |comm| {
        let id = comm.grow_id(0).unwrap();
        if comm.rank() == 0 {
            tx.lock().unwrap().take().unwrap().send(id.clone()).unwrap();
        }
        let g = comm.grow(&id, 3).unwrap();
        assert_eq!((g.rank(), g.size()), (comm.rank(), 3));
        checked_sum(&g);
        // The old communicator still works.
        checked_sum(&comm);
        let e = comm.grow(&id, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        drop(g);
        id
    });
    let forged = newcomer.join().unwrap();
    // The root tells a stranger nothing: the forged joiner is never let in (it times out or
    // the root drops its connection), and learns nothing of the job.
    assert!(forged.contains("bootstrap"), "{forged}");
    assert!(
        !forged.contains("rank 0") && !forged.contains("rank 1"),
        "{forged}"
    );
    // A stale id: its rendezvous ends with the grown communicator (refused once the root is
    // gone; until then the join finds nobody admitting).
    let mut short = config(TransportKind::Tcp, Duration::from_secs(3));
    short.timeout = Duration::from_secs(3);
    let e = Communicator::init_with_config(&res[0], 2, 3, short).unwrap_err();
    assert!(e.to_string().contains("bootstrap"), "{e}");
}
