//! `--scale-report PATH`: what starting a job costs, rank by rank. Each rank runs one 8-byte
//! allreduce before the benchmark and appends one JSON line when the benchmark is done: when its
//! process started, when its communicator was ready, when that first allreduce's result came and
//! when the benchmark ended, counted from the job's start; the peers it
//! holds connections to; its file descriptors, sockets and threads; its resident and shared
//! memory. A launcher (`--np`) appends its own line at the end: the bytes of bootstrap and
//! monitor traffic its process, which runs only the rendezvous root and job monitor, read and
//! wrote (counted by the bootstrap's wire layer), and its wall time. `scripts/scale-init.sh` runs jobs of growing size and tabulates the lines.
//! Nothing here is estimated: every figure is read from the kernel or a clock.

use std::io::Write;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use ccl::Communicator;

/// The launcher's start, in microseconds since the epoch, passed to the ranks it starts so that
/// their times include being started.
pub(crate) const T0_VAR: &str = "CCLBENCH_T0_US";

static START: OnceLock<u64> = OnceLock::new();
static PROCESS_START: OnceLock<u64> = OnceLock::new();

/// Microseconds since the epoch.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Notes when the job started: the launcher's start when it said so, else now (called first
/// thing in `main`).
pub(crate) fn mark_start() -> u64 {
    PROCESS_START.get_or_init(now_us);
    *START.get_or_init(|| {
        std::env::var(T0_VAR)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(now_us)
    })
}

fn since_start(t: u64) -> u64 {
    t.saturating_sub(mark_start())
}

/// A value in kB from `/proc/self/status` (`VmRSS`, `RssShmem`, `Threads`).
fn status_field(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// (open file descriptors, of which sockets).
fn descriptors() -> (usize, usize) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return (0, 0);
    };
    let mut fds = 0;
    let mut sockets = 0;
    for e in dir.flatten() {
        fds += 1;
        if std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:")) {
            sockets += 1;
        }
    }
    (fds, sockets)
}

#[derive(serde::Serialize)]
struct RankLine {
    rank: usize,
    size: usize,
    transport: String,
    /// From the job's start to this process's start (the launcher's share).
    start_us: u64,
    /// From the job's start to the communicator being ready.
    init_us: u64,
    /// Set-up's phases on this rank ([`ccl::InitTimings`]): joining, exchanging records,
    /// connecting.
    join_us: u64,
    exchange_us: u64,
    connect_us: u64,
    /// From the job's start to the result of the first allreduce.
    first_us: u64,
    /// From the job's start to the end of the benchmark.
    done_us: u64,
    /// Peers this rank holds a connection to.
    peers: usize,
    fds: usize,
    sockets: usize,
    threads: u64,
    rss_kib: u64,
    shmem_kib: u64,
}

#[derive(serde::Serialize)]
struct LauncherLine {
    launcher: bool,
    ranks: usize,
    wall_us: u64,
    /// Bytes the rendezvous root and the job monitor read and wrote.
    root_in: u64,
    root_out: u64,
    rss_kib: u64,
}

fn append(path: &Path, line: String) -> Result<(), String> {
    // One write of one line to a file opened for appending: the ranks' lines do not interleave.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    f.write_all((line + "\n").as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Runs one 8-byte allreduce (a sum of ones, checked) and returns when its result came
/// ([`now_us`]).
pub(crate) fn first_allreduce(comm: &Communicator) -> Result<u64, String> {
    let mut x = [1u64];
    comm.all_reduce_in_place(&mut x, ccl::ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let t = now_us();
    if x[0] != comm.size() as u64 {
        return Err(format!(
            "the first allreduce of {} ones gave {}",
            comm.size(),
            x[0]
        ));
    }
    Ok(t)
}

/// This rank's line; `init_done` is when its communicator was ready and `first_result` when
/// [`first_allreduce`] returned ([`now_us`]).
pub(crate) fn report_rank(
    path: &Path,
    comm: &Communicator,
    init_done: u64,
    first_result: u64,
) -> Result<(), String> {
    let done = now_us();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let (fds, sockets) = descriptors();
    let line = RankLine {
        rank: comm.rank(),
        size: comm.size(),
        transport: comm.transport_name().to_string(),
        start_us: since_start(PROCESS_START.get().copied().unwrap_or(0)),
        init_us: since_start(init_done),
        join_us: comm.init_timings().join.as_micros() as u64,
        exchange_us: comm.init_timings().exchange.as_micros() as u64,
        connect_us: comm.init_timings().connect.as_micros() as u64,
        first_us: since_start(first_result),
        done_us: since_start(done),
        peers: comm.connected_peers().len(),
        fds,
        sockets,
        threads: status_field(&status, "Threads"),
        rss_kib: status_field(&status, "VmRSS"),
        shmem_kib: status_field(&status, "RssShmem"),
    };
    append(path, serde_json::to_string(&line).expect("plain fields"))
}

/// The launcher's line, once its ranks are done.
pub(crate) fn report_launcher(path: &Path, ranks: usize) -> Result<(), String> {
    let (root_in, root_out) = ccl_bootstrap::wire::traffic();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = LauncherLine {
        launcher: true,
        ranks,
        wall_us: since_start(now_us()),
        root_in,
        root_out,
        rss_kib: status_field(&status, "VmRSS"),
    };
    append(path, serde_json::to_string(&line).expect("plain fields"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_by_their_key_only() {
        let s = "Name:\tx\nVmRSS:\t  1234 kB\nRssShmem:\t 56 kB\nThreads:\t7\n";
        assert_eq!(status_field(s, "VmRSS"), 1234);
        assert_eq!(status_field(s, "RssShmem"), 56);
        assert_eq!(status_field(s, "Threads"), 7);
        assert_eq!(status_field(s, "Rss"), 0);
    }
}
