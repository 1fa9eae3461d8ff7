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
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::sys::resource::{UsageWho, getrusage};
use oxccl::Communicator;

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

/// What the process holds, read from the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    fds: usize,
    sockets: usize,
    threads: u64,
    rss_kib: u64,
    shmem_kib: u64,
}

impl Usage {
    fn of_this_process() -> Usage {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let (fds, sockets) = descriptors();
        Usage {
            fds,
            sockets,
            threads: status_field(&status, "Threads"),
            rss_kib: status_field(&status, "VmRSS"),
            shmem_kib: status_field(&status, "RssShmem"),
        }
    }

    /// One rank's share of a process that runs `n` ranks (rounded up).
    fn share(self, n: usize) -> Usage {
        let n = n.max(1);
        Usage {
            fds: self.fds.div_ceil(n),
            sockets: self.sockets.div_ceil(n),
            threads: self.threads.div_ceil(n as u64),
            rss_kib: self.rss_kib.div_ceil(n as u64),
            shmem_kib: self.shmem_kib.div_ceil(n as u64),
        }
    }
}

/// Ranks that are threads of one process (`--threads`) meet here after their first allreduce,
/// so that the process's descriptors and memory are read once, while every rank's
/// communicator is up, and shared among them: reading `/proc/self/fd` per rank would cost
/// N times the whole table.
pub(crate) struct Gate {
    ranks: usize,
    /// How long a rank waits for the others (the communicators' deadline).
    wait: Duration,
    state: Mutex<(usize, Option<Usage>)>,
    all_in: Condvar,
}

impl Gate {
    pub(crate) fn new(ranks: usize, wait: Duration) -> Gate {
        Gate {
            ranks,
            wait,
            state: Mutex::new((0, None)),
            all_in: Condvar::new(),
        }
    }

    /// Called once by every rank, whether its first allreduce worked or not; the last to come
    /// reads the process's usage. Returns this rank's share of it, or none when some rank did
    /// not come in time (a rank whose thread ended early).
    pub(crate) fn meet(&self) -> Option<Usage> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.0 += 1;
        if st.0 == self.ranks {
            st.1 = Some(Usage::of_this_process());
            self.all_in.notify_all();
        }
        let (st, _) = self
            .all_in
            .wait_timeout_while(st, self.wait, |st| st.1.is_none())
            .unwrap_or_else(|e| e.into_inner());
        st.1.map(|u| u.share(self.ranks))
    }
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
    /// Set-up's phases on this rank ([`oxccl::InitTimings`]): joining, exchanging records,
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
    /// CPU time of the process from its start to this rank's first result (all its threads;
    /// with `--threads`, of every rank's so far: none then).
    cpu_us: Option<u64>,
    /// Ranks in this process (more than 1 with `--threads`): the figures below are then the
    /// process's divided among them.
    ranks_in_process: usize,
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
    /// CPU time of this process's threads but the main one: the rendezvous root's and the job
    /// monitor's (the main thread starts the ranks and waits for them).
    root_cpu_us: u64,
    /// Monitor connections the root held once the ranks had moved to their hubs.
    root_lines: usize,
    rss_kib: u64,
    /// Whether the ranks ran in this process too (`--threads`): the bytes are then everyone's.
    ranks_in_process: bool,
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

/// CPU time (user and system) of this process's threads, live and ended, or of the calling
/// thread only, in microseconds.
fn cpu_us(who: UsageWho) -> u64 {
    getrusage(who).map_or(0, |u| {
        let us = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
        us(u.user_time()) + us(u.system_time())
    })
}

/// The process's CPU time when this rank's first allreduce returned: its share of starting
/// the job, for the set-up model (`scripts/scale-model.py`).
static FIRST_CPU: OnceLock<u64> = OnceLock::new();

/// Runs one 8-byte allreduce (a sum of ones, checked) and returns when its result came
/// ([`now_us`]).
pub(crate) fn first_allreduce(comm: &Communicator) -> Result<u64, String> {
    let mut x = [1u64];
    comm.all_reduce_in_place(&mut x, oxccl::ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let t = now_us();
    FIRST_CPU.get_or_init(|| cpu_us(UsageWho::RUSAGE_SELF));
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
/// [`first_allreduce`] returned ([`now_us`]). `shared`: with ranks as threads, the ranks in
/// the process and this rank's share of its usage ([`Gate::meet`]), if it was read.
pub(crate) fn report_rank(
    path: &Path,
    comm: &Communicator,
    init_done: u64,
    first_result: u64,
    shared: Option<(usize, Option<Usage>)>,
) -> Result<(), String> {
    let done = now_us();
    let (ranks_in_process, usage) = match shared {
        Some((n, u)) => (n, u.unwrap_or_default()),
        None => (1, Usage::of_this_process()),
    };
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
        cpu_us: FIRST_CPU.get().copied().filter(|_| ranks_in_process == 1),
        ranks_in_process,
        fds: usage.fds,
        sockets: usage.sockets,
        threads: usage.threads,
        rss_kib: usage.rss_kib,
        shmem_kib: usage.shmem_kib,
    };
    append(path, serde_json::to_string(&line).expect("plain fields"))
}

/// The launcher's line, once its ranks are done; `in_process`: they were its threads.
pub(crate) fn report_launcher(path: &Path, ranks: usize, in_process: bool) -> Result<(), String> {
    let (root_in, root_out) = ccl_bootstrap::wire::traffic();
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = LauncherLine {
        launcher: true,
        ranks,
        wall_us: since_start(now_us()),
        root_in,
        root_out,
        root_cpu_us: cpu_us(UsageWho::RUSAGE_SELF).saturating_sub(cpu_us(UsageWho::RUSAGE_THREAD)),
        root_lines: ccl_bootstrap::root_lines(),
        rss_kib: status_field(&status, "VmRSS"),
        ranks_in_process: in_process,
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

    #[test]
    fn a_share_rounds_up() {
        let u = Usage {
            fds: 10,
            sockets: 4,
            threads: 9,
            rss_kib: 1001,
            shmem_kib: 0,
        };
        let s = u.share(4);
        assert_eq!((s.fds, s.sockets, s.threads, s.rss_kib), (3, 1, 3, 251));
        assert_eq!(u.share(0), u);
    }

    #[test]
    fn the_gate_reads_once_all_came_and_does_not_wait_forever() {
        let gate = Gate::new(3, Duration::from_secs(60));
        let shares: Vec<Option<Usage>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3).map(|_| s.spawn(|| gate.meet())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(shares.iter().all(|u| u.is_some_and(|u| u.fds > 0)));
        assert!(shares.windows(2).all(|w| w[0] == w[1]));
        // A rank that never comes: the others' wait ends at the deadline, without figures.
        let gate = Gate::new(2, Duration::from_millis(50));
        assert_eq!(gate.meet(), None);
    }
}
