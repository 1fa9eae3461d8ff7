//! Helpers shared by the integration tests: run N ranks as threads of this process.

#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use ccl_core::config::TransportKind;
use half::{bf16, f16};
use oxccl::{Communicator, Config, UniqueId};

pub(crate) const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Settings for tests: loopback only, a deadline short enough that a hang fails the test.
/// `CCL_CONNECT` in the environment chooses when pairs connect (the library's default when
/// unset), so that whole suites run both ways (scripts/test.sh runs some with `eager`), and
/// `CCL_MONITOR_FANOUT` the job monitor's tree (scripts/test.sh runs the fault suites with 2,
/// so that a few ranks make hubs).
pub(crate) fn config(transport: TransportKind, timeout: Duration) -> Config {
    Config {
        transport,
        timeout,
        socket_ifname: Some("=lo".into()),
        connect: std::env::var("CCL_CONNECT")
            .map_or(Ok(Config::default().connect), |v| v.parse())
            .expect("CCL_CONNECT: eager or lazy"),
        monitor_fanout: std::env::var("CCL_MONITOR_FANOUT")
            .map_or(Config::default().monitor_fanout, |v| {
                v.parse().expect("CCL_MONITOR_FANOUT: a number")
            }),
        ..Config::default()
    }
}

/// Runs `f(comm)` on `n` ranks (threads) and returns their results in rank order.
pub(crate) fn run_ranks<R: Send + 'static>(
    n: usize,
    cfg: Config,
    f: impl Fn(Communicator) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    run_ranks_with(n, cfg, |_, _| {}, f)
}

/// As [`run_ranks`], with `tweak(rank, &mut cfg)` applied to each rank's settings first (ranks
/// that disagree on a setting).
pub(crate) fn run_ranks_with<R: Send + 'static>(
    n: usize,
    cfg: Config,
    tweak: impl Fn(usize, &mut Config),
    f: impl Fn(Communicator) -> R + Send + Sync + Clone + 'static,
) -> Vec<R> {
    let id = UniqueId::new_at(LOOPBACK, &cfg).expect("unique id");
    let hs: Vec<_> = (0..n)
        .map(|rank| {
            let (id, mut cfg, f) = (id.clone(), cfg.clone(), f.clone());
            tweak(rank, &mut cfg);
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || {
                    let comm = Communicator::init_with_config(&id, rank, n, cfg)
                        .unwrap_or_else(|e| panic!("rank {rank}: init: {e}"));
                    f(comm)
                })
                .expect("spawn")
        })
        .collect();
    hs.into_iter()
        .map(|h| h.join().expect("rank thread panicked"))
        .collect()
}

pub(crate) use ccl_core::test_values::{CheckValue as TestVal, input};

/// Runs one allreduce of `count` elements and returns the number of wrong elements.
pub(crate) fn allreduce_case<T: TestVal>(
    comm: &Communicator,
    count: usize,
    op: oxccl::ReduceOp,
    in_place: bool,
) -> usize {
    let (r, n) = (comm.rank(), comm.size());
    let send: Vec<T> = (0..count).map(|i| T::from_i64(input(op, r, i))).collect();
    let out = if in_place {
        let mut buf = send;
        comm.all_reduce_in_place(&mut buf, op)
            .unwrap_or_else(|e| panic!("rank {r}: {} count {count} {op}: {e}", T::DTYPE));
        buf
    } else {
        // Poison the output so an element that is never written shows up.
        let mut recv = vec![T::from_i64(99); count];
        comm.all_reduce(&send, &mut recv, op)
            .unwrap_or_else(|e| panic!("rank {r}: {} count {count} {op}: {e}", T::DTYPE));
        recv
    };
    ccl_core::test_values::count_wrong(&out, op, n)
}

/// Every dtype for one (count, op, placement).
pub(crate) fn all_dtypes(
    comm: &Communicator,
    count: usize,
    op: oxccl::ReduceOp,
    in_place: bool,
) -> Vec<(String, usize)> {
    vec![
        (
            "int8".into(),
            allreduce_case::<i8>(comm, count, op, in_place),
        ),
        (
            "uint8".into(),
            allreduce_case::<u8>(comm, count, op, in_place),
        ),
        (
            "int32".into(),
            allreduce_case::<i32>(comm, count, op, in_place),
        ),
        (
            "uint32".into(),
            allreduce_case::<u32>(comm, count, op, in_place),
        ),
        (
            "int64".into(),
            allreduce_case::<i64>(comm, count, op, in_place),
        ),
        (
            "uint64".into(),
            allreduce_case::<u64>(comm, count, op, in_place),
        ),
        (
            "half".into(),
            allreduce_case::<f16>(comm, count, op, in_place),
        ),
        (
            "float".into(),
            allreduce_case::<f32>(comm, count, op, in_place),
        ),
        (
            "double".into(),
            allreduce_case::<f64>(comm, count, op, in_place),
        ),
        (
            "bfloat16".into(),
            allreduce_case::<bf16>(comm, count, op, in_place),
        ),
    ]
}

/// Fails the test unless an active RoCE port exists. The verbs tests are ignored by default
/// (`scripts/rxe-tests.sh` runs them in a SoftRoCE VM with `--include-ignored`), so this stops a
/// run that asked for them on a host without a device from passing without running them.
#[cfg(feature = "ib")]
pub(crate) fn require_ib() {
    assert!(
        ccl_ibverbs::probe(&Config::default()),
        "no active RoCE port: this test needs one (scripts/rxe-tests.sh runs it in the SoftRoCE VM)"
    );
}
