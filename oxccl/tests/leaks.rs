//! Communicators made, used and dropped one after another leave nothing behind in the process:
//! its threads and open files come back to where they were. Each communicator runs threads of
//! its own (its bootstrap's server, the monitor line, the accept and connect threads of
//! connections made on demand) and holds descriptors (listeners, life lines, eventfds); a job
//! that splits, shrinks or re-creates communicators for hours must not pile them up. Its own
//! test binary, so no other test's threads are counted. And a job that does not use verbs does
//! not load libibverbs.

mod common;

use std::time::{Duration, Instant};

use ccl_core::config::TransportKind;
use common::*;
use oxccl::ReduceOp;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Four ranks over `transport`: an 8-byte and a 1 MiB allreduce (connecting what they need),
/// then every communicator dropped.
fn cycle(transport: TransportKind) {
    let wrong = run_ranks(4, config(transport, Duration::from_secs(60)), |comm| {
        allreduce_case::<f32>(&comm, 2, ReduceOp::Sum, true)
            + allreduce_case::<f32>(&comm, 1 << 18, ReduceOp::Sum, false)
    });
    assert!(wrong.iter().all(|&w| w == 0), "{transport:?}: {wrong:?}");
}

/// Waits until the counts stop falling (threads that end on their own timers, such as an idle
/// connect thread, are gone), for at most `limit`; returns them.
fn settled(limit: Duration) -> (usize, usize) {
    let end = Instant::now() + limit;
    let mut last = (threads(), descriptors());
    let mut steady_since = Instant::now();
    while Instant::now() < end && steady_since.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
        let now = (threads(), descriptors());
        if now != last {
            last = now;
            steady_since = Instant::now();
        }
    }
    last
}

#[test]
fn communicators_leave_no_threads_or_descriptors_behind() {
    let transports = [
        TransportKind::Tcp,
        TransportKind::Auto,
        TransportKind::Local,
    ];
    // The first round sets up what lives for the whole process (the logger, lazy statics).
    cycle(TransportKind::Tcp);
    // libibverbs is opened only by the verbs transport: a TCP job does not load it (nor its
    // netlink libraries), which costs every process at start and needs rdma-core installed.
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(
        !maps.contains("libibverbs"),
        "a TCP job loaded libibverbs:\n{maps}"
    );
    for &t in &transports {
        cycle(t);
    }
    let (t0, f0) = settled(Duration::from_secs(30));
    let rounds = 15;
    for _ in 0..rounds {
        for &t in &transports {
            cycle(t);
        }
    }
    // Every round made 4 communicators per transport: one thread or descriptor left behind
    // by each would show as 60 or more.
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (t, f) = (threads(), descriptors());
        if t <= t0 && f <= f0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "after {rounds} rounds of 4 communicators over {transports:?}: threads {t0} -> {t}, \
             open files {f0} -> {f}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
