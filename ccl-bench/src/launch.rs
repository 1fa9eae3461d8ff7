//! `--np N`: the launcher, the helper process that starts the ranks, and how each of them ends
//! with the process that started it.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use oxccl::{Config, UniqueId};

use crate::{BenchArgs, scale};

/// Set in the environment of the helper that starts the ranks of `--np` ([`launch`]).
pub(crate) const SPAWNER_VAR: &str = "CCLBENCH_SPAWNER";
/// The process id of the process that started this one under `--np` (the launcher for its
/// helper, the helper for the ranks): see [`end_with_parent`].
const PARENT_VAR: &str = "CCLBENCH_PARENT";

/// Under `--np`, a job ends when its launcher does, as under mpirun or torchrun: the helper and
/// each rank ask the kernel for `SIGTERM` when the process that started them ends (the launcher
/// killed, even with `SIGKILL`, ends the helper, which ends the ranks). Without this, a killed
/// launcher left its ranks running: their rendezvous root lived in it, and the job survives its
/// root's death by design. Fails when that process is already gone.
pub(crate) fn end_with_parent() -> Result<(), ExitCode> {
    let Some(parent) = std::env::var(PARENT_VAR)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return Ok(());
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM) {
        eprintln!("ccl-bench: cannot ask to end with the launcher (prctl: {e}); going on");
    }
    // Set after the fork: a parent that ended before it is not signalled for.
    if nix::unistd::getppid().as_raw() != parent {
        eprintln!("ccl-bench: the process that started this one (pid {parent}) is gone; ending");
        return Err(ExitCode::FAILURE);
    }
    Ok(())
}

/// `--np N`: start N rank processes of this program and be their rendezvous root.
///
/// A helper process, started first, starts the ranks and waits for them ([`spawner`]). A new
/// process gets a copy of its parent's descriptor table and closes it again at exec, and the
/// launcher's fills with the rendezvous root's connections as the ranks arrive: starting 1,024
/// ranks from it cost about a CPU-second more on a 2-CPU machine, taken from the ranks.
pub(crate) fn launch(config: &Config, n: usize, args: &BenchArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ccl-bench: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut helper = match Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(SPAWNER_VAR, "1")
        .env(PARENT_VAR, std::process::id().to_string())
        .env(scale::T0_VAR, scale::mark_start().to_string())
        .stdin(Stdio::piped())
        .spawn()
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ccl-bench: cannot start the process that starts the ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let id = match unique_id(config) {
        Ok(id) => id,
        Err((code, e)) => {
            // The helper reads an empty line and ends.
            eprintln!("ccl-bench: {e}");
            drop(helper.stdin.take());
            let _ = helper.wait();
            return code;
        }
    };
    if let Some(mut to) = helper.stdin.take() {
        // A helper that died already is reported by its exit status below.
        let _ = writeln!(to, "{}", id.to_hex());
    }
    let status = helper.wait();
    if let Some(path) = &args.scale_report
        && let Err(e) = scale::report_launcher(path, n, false)
    {
        eprintln!("ccl-bench: {e}");
        return ExitCode::FAILURE;
    }
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ccl-bench: waiting for the process that starts the ranks: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The job's id, its rendezvous root on the address the ranks will reach (loopback unless
/// `CCL_SOCKET_IFNAME` says otherwise); on failure the exit code and the error.
fn unique_id(config: &Config) -> Result<UniqueId, (ExitCode, String)> {
    let ip = match &config.socket_ifname {
        Some(spec) => ccl_core::net::pick_local_ip(Some(spec))
            .map_err(|e| (ExitCode::from(2), e.to_string()))?,
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    UniqueId::new_at(ip, config).map_err(|e| (ExitCode::FAILURE, e.to_string()))
}

/// The helper of [`launch`]: reads the job's id from its standard input, starts the ranks,
/// waits for them and says which failed.
pub(crate) fn spawner(config: &Config, n: usize, args: &BenchArgs) -> ExitCode {
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
        // The launcher could not make the id, and said why.
        return ExitCode::FAILURE;
    }
    let id = match UniqueId::from_hex(line.trim()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("ccl-bench: the job's id from the launcher: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut children = match spawn_ranks(config, &id, n, args.bind == "core") {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccl-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = wait_ranks(&mut children, config);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("ccl-bench: failed: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

/// Starts `n` rank processes of this program, with this process's arguments less `--np`, joining
/// the job of `id`; on failure, stops those already started.
fn spawn_ranks(
    config: &Config,
    id: &UniqueId,
    n: usize,
    bind: bool,
) -> Result<Vec<Option<Child>>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let mut child_args: Vec<String> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--np" {
            it.next();
        } else if a.starts_with("--np=") {
        } else {
            child_args.push(a);
        }
    }
    let mut children: Vec<Option<Child>> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&child_args)
            .stdin(Stdio::null())
            .env_remove(SPAWNER_VAR)
            .env(PARENT_VAR, std::process::id().to_string())
            .env("CCL_UNIQUE_ID", id.to_hex())
            .env(scale::T0_VAR, scale::mark_start().to_string())
            .env("CCL_RANK", rank.to_string())
            .env("CCL_WORLD_SIZE", n.to_string())
            .env("CCL_LOCAL_RANK", rank.to_string())
            .env("CCL_LOCAL_SIZE", n.to_string());
        if config.socket_ifname.is_none() {
            // A local job stays on loopback.
            cmd.env("CCL_SOCKET_IFNAME", "=lo");
        }
        match cmd.spawn() {
            Ok(c) => {
                if bind {
                    bind_to_cpu(&c, rank, n);
                }
                children.push(Some(c))
            }
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    Ok(children)
}

/// Waits for every rank process and returns those that failed. Once one fails, the others get a
/// grace period to fail on their own (they see the dead peer) and are then stopped, so a failure
/// never leaves the launcher hanging.
///
/// Children are reaped as they end (`waitpid(-1)`), not polled one by one: polling a thousand
/// ranks 50 times a second would take a CPU-second of a 2-CPU machine from the ranks it waits
/// for.
fn wait_ranks(children: &mut [Option<Child>], config: &Config) -> Vec<String> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let grace = Duration::from_secs(10).min(config.timeout);
    let rank_of: std::collections::HashMap<u32, usize> = children
        .iter()
        .enumerate()
        .filter_map(|(rank, c)| Some((c.as_ref()?.id(), rank)))
        .collect();
    let mut failed: Vec<String> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    let mut left = children.iter().flatten().count();
    while left > 0 {
        loop {
            let (pid, why) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, 0)) => (pid, None),
                Ok(WaitStatus::Exited(pid, code)) => (pid, Some(format!("exit status: {code}"))),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    (pid, Some(format!("signal: {} ({sig})", sig as i32)))
                }
                // None ended since the last look (or one was stopped or continued: a
                // debugger; it is still running).
                Ok(_) => break,
                Err(e) => {
                    // ECHILD: none left to wait for, though some were thought alive.
                    for (rank, slot) in children.iter_mut().enumerate() {
                        if slot.take().is_some() {
                            failed.push(format!("rank {rank} (wait failed: {e})"));
                        }
                    }
                    return failed;
                }
            };
            let Some(&rank) = u32::try_from(pid.as_raw())
                .ok()
                .and_then(|p| rank_of.get(&p))
            else {
                continue;
            };
            // Reaped: the handle must not be waited for or signalled again.
            if children[rank].take().is_some() {
                left -= 1;
            }
            if let Some(why) = why {
                failed.push(format!("rank {rank} ({why})"));
                first_failure.get_or_insert_with(Instant::now);
            }
        }
        if left == 0 {
            break;
        }
        if first_failure.is_some_and(|t| t.elapsed() > grace) {
            for (rank, slot) in children.iter().enumerate() {
                if slot.is_some() {
                    failed.push(format!("rank {rank} (stopped after another rank failed)"));
                }
            }
            kill_all(children);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    failed
}

/// Pins a rank process to one of the CPUs this process may run on, when there is one per rank.
fn bind_to_cpu(child: &Child, rank: usize, n: usize) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let Ok(mine) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| mine.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() < n {
        return;
    }
    let mut set = CpuSet::new();
    if set.set(cpus[rank]).is_ok() {
        // Best effort: an unpinned rank still runs correctly.
        let _ = sched_setaffinity(Pid::from_raw(child.id() as i32), &set);
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
}
