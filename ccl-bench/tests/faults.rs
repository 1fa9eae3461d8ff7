//! Failure injection with real processes: a rank killed with SIGKILL in the middle of large
//! allreduces must make every survivor fail within the timeout, naming the dead rank.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ccl-bench");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One rank process of an `n`-rank job meeting at `port` (rank 0 hosts the rendezvous),
/// running `iters` allreduces of `size` over TCP with `CCL_TIMEOUT=timeout_s` and `env` on top.
fn rank_with(
    r: usize,
    n: usize,
    port: u16,
    timeout_s: u32,
    size: &str,
    iters: &str,
    env: &[(&str, &std::path::Path)],
) -> Child {
    rank_over("tcp", r, n, port, timeout_s, size, iters, env)
}

/// [`rank_with`] over `transport`.
#[allow(clippy::too_many_arguments)]
fn rank_over(
    transport: &str,
    r: usize,
    n: usize,
    port: u16,
    timeout_s: u32,
    size: &str,
    iters: &str,
    env: &[(&str, &std::path::Path)],
) -> Child {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("CCL_") {
            c.env_remove(k);
        }
    }
    c.args(["allreduce", "-b", size, "-e", size, "-n", iters])
        .args(["-w", "0", "-c", "0", "--transport", transport])
        .env("CCL_RANK", r.to_string())
        .env("CCL_WORLD_SIZE", n.to_string())
        .env("CCL_COMM_ID", format!("127.0.0.1:{port}"))
        .env("CCL_SOCKET_IFNAME", "=lo")
        .env("CCL_TIMEOUT", timeout_s.to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// One rank of the kill test: large allreduces.
fn rank(transport: &str, r: usize, n: usize, port: u16, timeout_s: u32) -> Child {
    rank_over(transport, r, n, port, timeout_s, "32M", "1000", &[])
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn killing_a_rank_fails_every_survivor_naming_it() {
    kill_trials("tcp", 20);
}

/// On shared memory the survivors wait in host memory or on rings, not on sockets: they must
/// hear of the death all the same, and the killed rank leaves no file behind.
#[test]
fn killing_a_rank_on_shared_memory_fails_every_survivor_naming_it() {
    let shm_files = || std::fs::read_dir("/dev/shm").map_or(0, |d| d.count());
    let before = shm_files();
    kill_trials("shm", 10);
    assert!(
        shm_files() <= before,
        "files left in /dev/shm: {} before, {} after",
        before,
        shm_files()
    );
}

fn kill_trials(transport: &str, trials: usize) {
    let n = 4;
    let timeout_s = 30;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ std::process::id() as u64;
    let mut report = Vec::new();
    for trial in 0..trials {
        let port = free_port();
        // Rank 0 hosts the rendezvous (and so the job's monitor): kill one of the others, and in
        // some trials rank 0 itself.
        let victim = (xorshift(&mut seed) % n as u64) as usize;
        let delay = Duration::from_millis(300 + xorshift(&mut seed) % 1200);
        let mut kids: Vec<Child> = (0..n)
            .map(|r| rank(transport, r, n, port, timeout_s))
            .collect();
        std::thread::sleep(delay);
        kids[victim].kill().unwrap();
        let killed_at = Instant::now();
        let _ = kids[victim].wait();
        for (r, kid) in kids.iter_mut().enumerate() {
            if r == victim {
                continue;
            }
            // Every survivor exits on its own, well before its timeout would fire.
            let deadline = killed_at + Duration::from_secs(timeout_s as u64 + 10);
            let status = loop {
                if let Some(s) = kid.try_wait().unwrap() {
                    break s;
                }
                assert!(
                    Instant::now() < deadline,
                    "trial {trial}: rank {r} hangs after rank {victim} was killed"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            let took = killed_at.elapsed();
            let mut err = String::new();
            kid.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            assert!(
                !status.success(),
                "trial {trial}: rank {r} succeeded after rank {victim} died:\n{err}"
            );
            let line = err
                .lines()
                .find(|l| l.starts_with("ccl-bench:"))
                .unwrap_or_else(|| panic!("trial {trial}: rank {r} printed no error:\n{err}"));
            assert!(
                line.contains(&format!("(rank {r}")),
                "trial {trial}: {line}"
            );
            // The dead rank is named: as the peer, or as the rank that died.
            assert!(
                line.contains(&format!("peer {victim}"))
                    || line.contains(&format!("rank {victim} died")),
                "trial {trial}: rank {r} does not name dead rank {victim}: {line}"
            );
            assert!(!err.contains("panicked"), "{err}");
            report.push(took);
        }
    }
    report.sort();
    eprintln!(
        "{transport}, {trials} trials: survivors failed {:?} (median) / {:?} (max) after the kill",
        report[report.len() / 2],
        report[report.len() - 1]
    );
}

/// A rank stopped with SIGSTOP during a run: the others time out (or hear that one did), each
/// writes its flight recorder, and `ccl-trace` on those dumps names the stopped rank.
#[test]
fn a_stopped_rank_is_named_by_the_trace_analysis() {
    let n = 4;
    let victim = 2;
    let dir = std::env::temp_dir().join(format!("ccl-trace-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = free_port();
    let mut kids: Vec<Child> = (0..n)
        .map(|r| rank_with(r, n, port, 3, "4M", "100000", &[("CCL_TRACE_DIR", &dir)]))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let pid = nix::unistd::Pid::from_raw(kids[victim].id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let t0 = Instant::now();
    for (r, kid) in kids.iter_mut().enumerate() {
        if r == victim {
            continue;
        }
        loop {
            if kid.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "rank {r} did not give up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = kids[victim].kill();
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    let _ = kids[victim].wait();
    let trace = env!("CARGO_BIN_EXE_ccl-trace");
    let o = Command::new(trace).arg(&dir).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains(&format!("no dump from rank(s) {victim}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("=> the job waits for rank(s) {victim}")),
        "{out}"
    );
    // Every dump is well-formed JSON naming its rank.
    for r in (0..n).filter(|&r| r != victim) {
        let f = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().ends_with(&format!("-r{r}.json")))
            .unwrap_or_else(|| panic!("no dump from rank {r}"));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        assert_eq!(v["rank"], r);
        assert!(!v["entries"].as_array().unwrap().is_empty());
    }
    eprintln!("{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue-sized runs (100 trials, 4-8 ranks) are `scripts/shrink-trials.sh`; this is a small
/// case of each transport: random ranks SIGKILLed inside random collectives (every third trial
/// a second one during the shrink), every survivor shrinks and finishes checked allreduces.
#[test]
fn survivors_of_random_kills_shrink_and_finish_checked_allreduces() {
    for (transport, trials) in [("tcp", "6"), ("shm", "3")] {
        let out = Command::new(env!("CARGO_BIN_EXE_ccl-shrink-trials"))
            .args(["--trials", trials, "--np-min", "4", "--np-max", "6"])
            .args([
                "--transport",
                transport,
                "--second-every",
                "3",
                "--timeout",
                "20",
            ])
            .stderr(Stdio::null())
            .output()
            .expect("run ccl-shrink-trials");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{transport}:\n{text}");
        assert!(text.contains("trials passed"), "{transport}:\n{text}");
    }
}
