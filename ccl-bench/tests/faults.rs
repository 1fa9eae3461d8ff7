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
/// running `iters` allreduces of `size` over `transport` with `CCL_TIMEOUT=timeout_s` and `env`
/// on top.
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
    command(transport, r, n, port, timeout_s, size, iters, env)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// The command of [`rank_over`], its stderr piped, not yet started.
#[allow(clippy::too_many_arguments)]
fn command(
    transport: &str,
    r: usize,
    n: usize,
    port: u16,
    timeout_s: u32,
    size: &str,
    iters: &str,
    env: &[(&str, &std::path::Path)],
) -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("CCL_") {
            c.env_remove(k);
        }
    }
    // `transport` may carry more flags after the transport's name.
    let mut words = transport.split(' ');
    c.args(["allreduce", "-b", size, "-e", size, "-n", iters])
        .args(["-w", "0", "-c", "0", "--transport"])
        .args(words.next())
        .args(words)
        .env("CCL_RANK", r.to_string())
        .env("CCL_WORLD_SIZE", n.to_string())
        .env("CCL_COMM_ID", format!("127.0.0.1:{port}"))
        .env("CCL_SOCKET_IFNAME", "=lo")
        .env("CCL_TIMEOUT", timeout_s.to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    c.stderr(Stdio::piped());
    c
}

/// One rank of the kill test: large allreduces (`ccl-bench --registered` when `registered`:
/// on shared memory, buffers the ranks read and write in place).
fn rank(transport: &str, r: usize, n: usize, port: u16, timeout_s: u32, registered: bool) -> Child {
    let t = if registered {
        format!("{transport} --registered")
    } else {
        transport.to_string()
    };
    rank_over(&t, r, n, port, timeout_s, "32M", "1000", &[])
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn killing_a_rank_fails_every_survivor_naming_it() {
    kill_trials("tcp", 20, false);
}

/// On shared memory the survivors wait in host memory or on rings, not on sockets: they must
/// hear of the death all the same, and the killed rank leaves no file behind.
#[test]
fn killing_a_rank_on_shared_memory_fails_every_survivor_naming_it() {
    let shm_files = || std::fs::read_dir("/dev/shm").map_or(0, |d| d.count());
    let before = shm_files();
    kill_trials("shm", 10, false);
    assert!(
        shm_files() <= before,
        "files left in /dev/shm: {} before, {} after",
        before,
        shm_files()
    );
}

/// The same with buffers from `Communicator::alloc`, which the ranks read and write in place
/// in each other's arenas: a survivor waiting at a flag barrier hears of the death too, and
/// the arenas (memory files) leave nothing behind.
#[test]
fn killing_a_rank_during_registered_allreduces_on_shared_memory_fails_every_survivor() {
    let shm_files = || std::fs::read_dir("/dev/shm").map_or(0, |d| d.count());
    let before = shm_files();
    kill_trials("shm", 6, true);
    assert!(
        shm_files() <= before,
        "files left in /dev/shm: {} before, {} after",
        before,
        shm_files()
    );
}

fn kill_trials(transport: &str, trials: usize, registered: bool) {
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
            .map(|r| rank(transport, r, n, port, timeout_s, registered))
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
    let env = [("CCL_TRACE_DIR", dir.as_path())];
    let mut kids: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = command("tcp", r, n, port, 3, "4M", "100000", &env);
            c.stdout(if r == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            });
            c.spawn().unwrap()
        })
        .collect();
    // Rank 0 prints its header once the communicator exists, every rank's included: from then
    // on each rank records operations, whatever the machine's load made set-up take (a fixed
    // sleep stopped the victim before set-up on a loaded machine, and no rank wrote a dump).
    let out0 = kids[0].stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out0).lines().map_while(Result::ok) {
            if line.starts_with("# ccl-bench") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("rank 0 did not start its benchmark within 60 s");
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

/// Runs `ccl-shrink-trials` over `transport` with `args` (and a 20 s timeout); every trial must
/// pass. Its report.
fn shrink_trials(transport: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ccl-shrink-trials"))
        .args(args)
        .args(["--transport", transport, "--timeout", "20"])
        .stderr(Stdio::null())
        .output()
        .expect("run ccl-shrink-trials");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{transport}:\n{text}");
    assert!(text.contains("trials passed"), "{transport}:\n{text}");
    text
}

/// Issue-sized runs (100 trials, 4-8 ranks) are `scripts/shrink-trials.sh`; this is a small
/// case of each transport: random ranks SIGKILLed inside random collectives (every third trial
/// a second one during the shrink), every survivor shrinks and finishes checked allreduces.
#[test]
fn survivors_of_random_kills_shrink_and_finish_checked_allreduces() {
    for (transport, trials) in [("tcp", "6"), ("shm", "3")] {
        shrink_trials(
            transport,
            &[
                "--trials",
                trials,
                "--np-min",
                "4",
                "--np-max",
                "6",
                "--second-every",
                "3",
            ],
        );
    }
}

/// The process that made the rendezvous is rank 0's (as under torchrun, or an application's
/// rank 0 that made the unique id), and rank 0 dies: another rank takes the job's monitor over
/// and the survivors shrink through it; in every other trial a second rank dies too, during
/// the takeover or the shrink.
#[test]
fn survivors_of_rank_0_and_its_rendezvous_dying_shrink_and_finish() {
    for (transport, trials) in [("tcp", "4"), ("shm", "2")] {
        let text = shrink_trials(
            transport,
            &[
                "--trials",
                trials,
                "--np-min",
                "4",
                "--np-max",
                "6",
                "--root",
                "rank0",
                "--victim",
                "0",
                "--second-every",
                "2",
            ],
        );
        assert!(text.contains("first victim rank 0"), "{transport}:\n{text}");
    }
}

/// Trials of each fault per algorithm: the ten. A trial costs little more than the
/// timeout below (the fault comes within a second of the start, the job is small), so the
/// verdict tests take a few minutes on a loaded two-core machine; `FAULT_REPEATS` overrides.
const REPEATS: usize = 10;
/// The timeout the verdict tests give the ranks, seconds: short, for cheap trials, and still
/// far above any pause of a healthy 1 MiB allreduce on a loaded machine.
const VERDICT_TIMEOUT_S: u64 = 2;

fn repeats() -> usize {
    std::env::var("FAULT_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(REPEATS)
}

/// One verdict trial at a time: their ranks time out after a few seconds, which a machine
/// loaded by other trials' ranks could trip before the fault.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// SIGSTOP: the rank cannot answer.
    Stop,
    /// The rank sleeps in its own code before a call and never enters it in time.
    Sleep,
    /// SIGKILL.
    Kill,
    /// The rank stops moving inside an operation while its monitor thread answers
    /// (`CCL_FAULT_STALL`), as one deadlocked inside ccl would.
    Stall,
}

impl Fault {
    /// How the verdict describes the culprit.
    fn phrase(self) -> &'static str {
        match self {
            Fault::Stop => "which does not answer",
            Fault::Sleep => "which never entered it",
            Fault::Kill => "which died",
            Fault::Stall => "which is inside it but has stopped moving",
        }
    }
}

/// The four ranks of a verdict trial, with `algo` forced and `extra` arguments and
/// `victim_env` on `victim`.
fn verdict_job(
    port: u16,
    algo: &str,
    (extra, victim_env): (&[String], &[(&str, String)]),
    victim: usize,
    env: &[(&str, &str)],
) -> Vec<Child> {
    (0..4)
        .map(|r| {
            let mut c = Command::new(BIN);
            for (k, _) in std::env::vars() {
                if k.starts_with("CCL_") {
                    c.env_remove(k);
                }
            }
            c.args(["allreduce", "-b", "1M", "-e", "1M", "-n", "100000"])
                .args(["-w", "0", "-c", "0", "--transport", "tcp"])
                .env("CCL_RANK", r.to_string())
                .env("CCL_WORLD_SIZE", "4")
                .env("CCL_COMM_ID", format!("127.0.0.1:{port}"))
                .env("CCL_SOCKET_IFNAME", "=lo")
                .env("CCL_TIMEOUT", VERDICT_TIMEOUT_S.to_string())
                .env("CCL_ALGO", format!("allreduce:{algo}"));
            for (k, v) in env {
                c.env(k, v);
            }
            if r == victim {
                c.args(extra);
                c.envs(victim_env.iter().map(|(k, v)| (k, v)));
            }
            c.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Waits for `kid` to exit (at most `limit` after `t0`) and returns its stderr and when it
/// exited.
fn finish(kid: &mut Child, t0: Instant, limit: Duration, what: &str) -> (String, Duration) {
    let took = loop {
        if kid.try_wait().unwrap().is_some() {
            break t0.elapsed();
        }
        assert!(t0.elapsed() < limit, "{what} hangs");
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    kid.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (err, took)
}

/// Runs `fault` on a random rank `repeats()` times under `algo`, and checks that every
/// survivor's error starts with a verdict naming that rank and the kind of fault.
fn verdict_trials(fault: Fault, algo: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ std::process::id() as u64 ^ (fault as u64) << 32;
    let mut worst = Duration::ZERO;
    // Injected from inside the victim: the fault's moment is not known here.
    let inside = matches!(fault, Fault::Sleep | Fault::Stall);
    for trial in 0..repeats() {
        let port = free_port();
        let victim = (xorshift(&mut seed) % 4) as usize;
        let extra: Vec<String> = match fault {
            // Long enough to outlast the others' timeout; it is killed after the check.
            Fault::Sleep => ["--delay-rank", &victim.to_string(), "--delay-ms", "600000"]
                .into_iter()
                .map(String::from)
                .chain([
                    "--delay-from".into(),
                    (5 + xorshift(&mut seed) % 20).to_string(),
                ])
                .collect(),
            _ => Vec::new(),
        };
        let stall = [(
            "CCL_FAULT_STALL",
            format!("op:{}", 5 + xorshift(&mut seed) % 20),
        )];
        let victim_env: &[(&str, String)] = if fault == Fault::Stall { &stall } else { &[] };
        let mut kids = verdict_job(port, algo, (&extra, victim_env), victim, &[]);
        let pid = nix::unistd::Pid::from_raw(kids[victim].id() as i32);
        let t0 = if inside {
            Instant::now()
        } else {
            // Connected and running by then (a 4-rank TCP job connects within tens of ms).
            std::thread::sleep(Duration::from_millis(500 + xorshift(&mut seed) % 500));
            let sig = match fault {
                Fault::Stop => nix::sys::signal::Signal::SIGSTOP,
                _ => nix::sys::signal::Signal::SIGKILL,
            };
            nix::sys::signal::kill(pid, sig).unwrap();
            Instant::now()
        };
        // Generous: the verdict is due within the timeout and two seconds of the fault (the
        // sleeping rank's fault comes some seconds after the start).
        let limit = Duration::from_secs(VERDICT_TIMEOUT_S + 30);
        let mut lines = Vec::new();
        for r in (0..4).filter(|&r| r != victim) {
            let what = format!("{fault:?} {algo} trial {trial}: rank {r} (victim {victim})");
            let (err, took) = finish(&mut kids[r], t0, limit, &what);
            if !inside {
                worst = worst.max(took);
            }
            let line = err
                .lines()
                .find(|l| l.starts_with("ccl-bench:"))
                .unwrap_or_else(|| panic!("{what}: no error printed:\n{err}"))
                .to_string();
            let verdict = line
                .split_once("verdict: ")
                .unwrap_or_else(|| panic!("{what}: no verdict: {line}"))
                .1;
            let head = verdict.split(';').next().unwrap();
            assert!(
                head.contains(&format!("behind rank {victim} (")) && head.contains(fault.phrase()),
                "{what}: the verdict does not name rank {victim} as '{}': {line}",
                fault.phrase()
            );
            assert!(!err.contains("panicked"), "{err}");
            lines.push(line);
        }
        let _ = kids[victim].kill();
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = kids[victim].wait();
        if trial == 0 {
            eprintln!(
                "{fault:?} {algo}, victim {victim}:\n  {}",
                lines.join("\n  ")
            );
        }
    }
    if !inside {
        eprintln!(
            "{fault:?} {algo}: {} trials, the last survivor exited {worst:?} after the fault at worst (CCL_TIMEOUT {VERDICT_TIMEOUT_S} s)",
            repeats()
        );
    }
}

#[test]
fn a_stopped_rank_is_named_by_every_survivors_error() {
    verdict_trials(Fault::Stop, "ring");
    verdict_trials(Fault::Stop, "halving_doubling");
}

#[test]
fn a_rank_that_never_enters_the_call_is_named_by_every_survivors_error() {
    verdict_trials(Fault::Sleep, "ring");
    verdict_trials(Fault::Sleep, "halving_doubling");
}

#[test]
fn a_rank_that_stops_moving_inside_the_call_is_named_by_every_survivors_error() {
    verdict_trials(Fault::Stall, "ring");
    verdict_trials(Fault::Stall, "halving_doubling");
}

#[test]
fn a_killed_rank_is_named_dead_by_every_survivors_error() {
    verdict_trials(Fault::Kill, "ring");
    verdict_trials(Fault::Kill, "halving_doubling");
}

/// Collects `kid`'s stderr as it comes, so a test can stop the job once it has seen enough.
fn collect_stderr(kid: &mut Child) -> std::sync::Arc<std::sync::Mutex<String>> {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (mut err, sink) = (kid.stderr.take().unwrap(), text.clone());
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(k) = err.read(&mut buf) {
            if k == 0 {
                break;
            }
            let s = String::from_utf8_lossy(&buf[..k]);
            sink.lock().unwrap().push_str(&s);
        }
    });
    text
}

/// A rank that delays every call from some point on fails nothing: the others' early warning
/// (an operation far longer than its recent median) carries the verdict naming it, and the
/// periodic slow-rank report of a rank that hears from it names it by host and pid. The job
/// runs until every survivor has warned and one has reported (at most 60 s).
#[test]
fn a_rank_slowed_on_purpose_is_named_by_the_early_warning_and_the_slow_rank_report() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut seed = 0x51ed_270b_a3c4_9f1d_u64 ^ std::process::id() as u64;
    for algo in ["ring", "halving_doubling"] {
        for trial in 0..repeats() {
            let victim = (xorshift(&mut seed) % 4) as usize;
            let extra: Vec<String> = ["--delay-rank", &victim.to_string()]
                .into_iter()
                .map(String::from)
                .chain(["--delay-ms", "250", "--delay-from", "20"].map(String::from))
                .collect();
            let env = [
                ("CCL_TIMEOUT", "60"),
                ("CCL_LATE_WARN_FLOOR_MS", "100"),
                ("CCL_SLOW_WINDOW", "4"),
                ("CCL_SLOW_MS", "60"),
                ("CCL_SLOW_REPORT_S", "1"),
            ];
            let mut kids = verdict_job(free_port(), algo, (&extra, &[]), victim, &env);
            let logs: Vec<_> = kids.iter_mut().map(collect_stderr).collect();
            let named = format!("behind rank {victim} (");
            let warned = |err: &str| {
                err.lines().any(|l| {
                    l.contains("late operation:")
                        && l.contains(&named)
                        && l.contains("never entered it")
                })
            };
            let reports = |err: &str| -> Vec<String> {
                err.lines()
                    .filter(|l| l.contains("the rank this one waits for: "))
                    .map(String::from)
                    .collect()
            };
            let survivors = || (0..4).filter(|&r| r != victim);
            // 20 quick calls, then late ones; the job would run 100000 calls.
            let t0 = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(200));
                let text: Vec<String> = logs.iter().map(|l| l.lock().unwrap().clone()).collect();
                let all_warned = survivors().all(|r| warned(&text[r]));
                let reported = survivors().any(|r| !reports(&text[r]).is_empty());
                if (all_warned && reported) || t0.elapsed() > Duration::from_secs(60) {
                    break;
                }
            }
            for k in &mut kids {
                let _ = k.kill();
                let _ = k.wait();
            }
            // The readers end with the pipes; give them a moment to take the last bytes.
            std::thread::sleep(Duration::from_millis(100));
            let mut reported = 0;
            for r in survivors() {
                let what = format!("slow {algo} trial {trial}: rank {r} (victim {victim})");
                let err = logs[r].lock().unwrap().clone();
                assert!(
                    warned(&err),
                    "{what}: no early warning names rank {victim}:\n{err}"
                );
                for l in reports(&err) {
                    assert!(
                        l.contains(&format!("waits for: rank {victim} (")),
                        "{what}: the slow-rank report names another rank: {l}"
                    );
                    reported += 1;
                }
                if trial == 0 && r == (victim + 1) % 4 {
                    eprintln!(
                        "slow {algo}, victim {victim}, rank {r}:\n  {}",
                        err.lines()
                            .filter(
                                |l| l.contains("late operation:") || l.contains("slow-rank report")
                            )
                            .take(3)
                            .collect::<Vec<_>>()
                            .join("\n  ")
                    );
                }
            }
            assert!(
                reported > 0,
                "slow {algo} trial {trial}: no slow-rank report named rank {victim}"
            );
        }
    }
}

/// `ccl-trace --live` answers a running job's state, keeps answering during a hang (naming the
/// stopped rank), and tells a caller without the secret nothing.
#[test]
fn the_live_query_answers_during_a_hang_and_refuses_a_stranger() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = free_port();
    let victim = 2;
    let env = [("CCL_TIMEOUT", "120"), ("CCL_SECRET", "live-test-secret")];
    let mut kids = verdict_job(port, "ring", (&[], &[]), victim, &env);
    let trace = env!("CARGO_BIN_EXE_ccl-trace");
    let addr = format!("127.0.0.1:{port}");
    let ask = |secret: &str| {
        Command::new(trace)
            .args(["--live", &addr, "--secret", secret])
            .output()
            .unwrap()
    };
    // Running: every rank describes its operation. (Retried while the job connects.)
    let t0 = Instant::now();
    let out = loop {
        let o = ask("live-test-secret");
        if o.status.success() {
            break String::from_utf8_lossy(&o.stdout).into_owned();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no live answer: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    for r in 0..4 {
        assert!(out.contains(&format!("rank {r} (")), "{out}");
    }
    assert!(out.contains("=> "), "{out}");
    // Hung: the stopped rank is named.
    let pid = nix::unistd::Pid::from_raw(kids[victim].id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let o = ask("live-test-secret");
    let hung = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        hung.contains(&format!("rank {victim} (")) && hung.contains("does not answer"),
        "{hung}"
    );
    assert!(
        hung.contains("=> allreduce #") && hung.contains(&format!("behind rank {victim} (")),
        "{hung}"
    );
    // A stranger learns nothing.
    let o = ask("not-the-secret");
    assert!(!o.status.success());
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!e.contains("rank 1 (") && !e.contains("allreduce"), "{e}");
    // Nor does one that presents a wrong unique id.
    let root = format!("127.0.0.1:{port}").parse().unwrap();
    let id = oxccl::UniqueId::for_address(root, [0x5a; 32]).to_hex();
    let o = Command::new(trace)
        .args(["--live", "--id", &id])
        .output()
        .unwrap();
    assert!(!o.status.success() && o.stdout.is_empty());
    eprintln!("live query during the hang:\n{hung}");
    for k in &mut kids {
        let _ = k.kill();
    }
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    for k in &mut kids {
        let _ = k.wait();
    }
}
