//! Randomised trials of surviving a rank's death: each trial starts N rank processes (with
//! `--root launcher` the rendezvous root runs here, in the launcher, so it outlives every rank;
//! with `--root rank0` rank 0 runs it, as under torchrun, and may die with it), lets them run random
//! checked collectives, SIGKILLs a random rank at a random time (in some trials a second one a
//! moment later, while the survivors shrink), and requires every survivor to shrink and finish
//! checked allreduces on the shrunk communicator: no hang, no wrong element, every survivor in
//! the same communicator. Prints, per trial, the time from the kill to the last survivor's first
//! successful allreduce after the shrink, and their median and maximum at the end.
//!
//! ```text
//! ccl-shrink-trials --trials 100 --np-min 4 --np-max 8 [--transport tcp|shm] [--timeout 10]
//!                   [--root launcher|rank0] [--victim R]
//! ```
//!
//! Exit status 0 when every trial passed. With `SHRINK_TRIAL_LOGS=DIR`, each rank's log goes
//! to `DIR/seed-S-rank-R.log`.
#![forbid(unsafe_code)]

use std::io::{BufRead, Read};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use oxccl::{Communicator, Config, ReduceOp, UniqueId};

/// Environment variable that makes this program a rank.
const WORKER: &str = "SHRINK_TRIAL_SEED";

/// A small deterministic generator (xorshift64*): every rank of a trial draws the same
/// collectives from the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn main() -> ExitCode {
    match std::env::var(WORKER) {
        Ok(seed) => worker(seed.parse().unwrap_or(1)),
        Err(_) => launcher(),
    }
}

/// Randomised trials of surviving a rank's death (see the crate doc of this program).
#[derive(Debug, Parser)]
#[command(name = "ccl-shrink-trials")]
struct Opts {
    /// Trials to run.
    #[arg(long, default_value_t = 10)]
    trials: usize,
    /// Fewest ranks in a trial.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..))]
    np_min: u64,
    /// Most ranks in a trial.
    #[arg(long, default_value_t = 8)]
    np_max: u64,
    /// The ranks' transport.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "shm"])]
    transport: String,
    /// CCL_TIMEOUT of the ranks, seconds.
    #[arg(long = "timeout", default_value_t = 10)]
    timeout_s: u64,
    /// Seed of the trials' random choices (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Every how many trials a second rank is killed during the shrink (0: never).
    #[arg(long, default_value_t = 4)]
    second_every: usize,
    /// Where the rendezvous root runs: in this launcher, or in rank 0's process (from
    /// `CCL_COMM_ID`, as under torchrun or MPI).
    #[arg(long, default_value = "launcher", value_parser = ["launcher", "rank0"])]
    root: String,
    /// Always kill this rank first (default: a random rank).
    #[arg(long)]
    victim: Option<usize>,
}

fn parse() -> Result<Opts, ExitCode> {
    let mut o = Opts::try_parse().map_err(|e| {
        let _ = e.print();
        ExitCode::from(if e.use_stderr() { 2 } else { 0 })
    })?;
    if o.np_max < o.np_min {
        eprintln!(
            "ccl-shrink-trials: need --np-min <= --np-max, got {} and {}",
            o.np_min, o.np_max
        );
        return Err(ExitCode::from(2));
    }
    if let Some(v) = o.victim.filter(|&v| v as u64 >= o.np_min) {
        eprintln!(
            "ccl-shrink-trials: --victim {v} is not a rank of every trial (--np-min {})",
            o.np_min
        );
        return Err(ExitCode::from(2));
    }
    o.seed = Some(o.seed.unwrap_or(now_ns() as u64) | 1);
    Ok(o)
}

/// What one trial saw.
struct Trial {
    ranks: usize,
    killed: Vec<usize>,
    /// From the first kill to the last survivor's first good allreduce after shrinking.
    recovery: Duration,
}

fn launcher() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(code) => return code,
    };
    let seed = o.seed.expect("set by parse");
    let mut rng = Rng(seed);
    println!(
        "# {} trials, {}-{} ranks over {}, root in the {}, CCL_TIMEOUT={} s, seed {}",
        o.trials,
        o.np_min,
        o.np_max,
        o.transport,
        if o.root == "rank0" {
            "process of rank 0"
        } else {
            "launcher"
        },
        o.timeout_s,
        seed
    );
    let mut times = Vec::new();
    // Per first victim: the times of its trials.
    let mut by_victim: std::collections::BTreeMap<usize, Vec<Duration>> = Default::default();
    for t in 0..o.trials {
        let n = (o.np_min + rng.below(o.np_max - o.np_min + 1)) as usize;
        let second = o.second_every > 0 && t % o.second_every == o.second_every - 1;
        match trial(&o, &mut rng, n, second) {
            Ok(tr) => {
                println!(
                    "trial {t}: {} ranks, killed {:?}: every survivor finished on a shrunk communicator; kill to first good allreduce {:.1} ms",
                    tr.ranks,
                    tr.killed,
                    tr.recovery.as_secs_f64() * 1e3
                );
                times.push(tr.recovery);
                if let Some(&v) = tr.killed.first() {
                    by_victim.entry(v).or_default().push(tr.recovery);
                }
            }
            Err(e) => {
                println!("trial {t}: FAILED ({n} ranks): {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    for (v, mut ts) in by_victim {
        ts.sort();
        println!(
            "# first victim rank {v}: {} trials, median {:.1} ms, max {:.1} ms",
            ts.len(),
            ts[ts.len() / 2].as_secs_f64() * 1e3,
            ts[ts.len() - 1].as_secs_f64() * 1e3
        );
    }
    times.sort();
    if let (Some(med), Some(max)) = (times.get(times.len() / 2), times.last()) {
        println!(
            "# all {} trials passed; kill to first good allreduce: median {:.1} ms, max {:.1} ms",
            times.len(),
            med.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3
        );
    }
    ExitCode::SUCCESS
}

/// How the ranks of a trial meet: a unique id whose root runs here, or the address where rank
/// 0 starts it.
enum Meet {
    Id(UniqueId),
    Rank0(std::net::SocketAddr),
}

fn spawn(o: &Opts, meet: &Meet, rank: usize, n: usize, seed: u64) -> std::io::Result<Child> {
    let exe = std::env::current_exe()?;
    let mut c = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("CCL_") && k != "CCL_DEBUG" {
            c.env_remove(k);
        }
    }
    match meet {
        Meet::Id(id) => c.env("CCL_UNIQUE_ID", id.to_hex()),
        Meet::Rank0(at) => c.env("CCL_COMM_ID", at.to_string()),
    };
    c.env(WORKER, seed.to_string())
        .env("CCL_RANK", rank.to_string())
        .env("CCL_WORLD_SIZE", n.to_string())
        .env("CCL_TRANSPORT", &o.transport)
        .env("CCL_SOCKET_IFNAME", "=lo")
        .env("CCL_TIMEOUT", o.timeout_s.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// A rank's output as it is read (stdout, stderr), each on a thread of its own.
type Drain = (
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
);

/// The line a rank prints once it has joined its communicator.
const READY: &str = "joined";

/// Reads a rank's output to its end on a thread of its own; with `ready`, passes the rank on
/// when it prints [`READY`] (that line is not kept).
fn drain(
    p: Option<Box<dyn Read + Send>>,
    ready: Option<(usize, std::sync::mpsc::Sender<usize>)>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let Some(p) = p else { return s };
        for line in std::io::BufReader::new(p).lines() {
            let Ok(line) = line else { break };
            match &ready {
                Some((r, tx)) if line == READY => drop(tx.send(*r)),
                _ => {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        }
        s
    })
}

/// Waits for every rank until `deadline` (then kills it): per rank, its exit status, output
/// and log (kept in `SHRINK_TRIAL_LOGS` when set).
fn finish(
    mut kids: Vec<Child>,
    drains: Vec<Drain>,
    deadline: Instant,
    seed: u64,
) -> Result<Vec<(usize, std::process::ExitStatus, String, String)>, String> {
    let mut outs = Vec::new();
    for ((r, k), (out, err)) in kids.iter_mut().enumerate().zip(drains) {
        let status = loop {
            match k.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = k.kill();
                    break k.wait().map_err(|e| e.to_string())?;
                }
            }
        };
        let out = out.join().unwrap_or_default();
        let err = err.join().unwrap_or_default();
        if let Ok(dir) = std::env::var("SHRINK_TRIAL_LOGS") {
            let _ = std::fs::write(format!("{dir}/seed-{seed}-rank-{r}.log"), &err);
        }
        outs.push((r, status, out, err));
    }
    Ok(outs)
}

/// One trial: start the ranks, kill one or two, check every survivor's report.
///
/// Not split, though 120 lines: it reads as the trial's script (start, wait until every rank
/// joined, kill, wait, judge), and its checks share the kill's time and victims with the steps
/// above them.
fn trial(o: &Opts, rng: &mut Rng, n: usize, second: bool) -> Result<Trial, String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    cfg.timeout = Duration::from_secs(o.timeout_s);
    let meet = if o.root == "rank0" {
        // A port free now, for rank 0 to listen on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        Meet::Rank0(l.local_addr().map_err(|e| e.to_string())?)
    } else {
        Meet::Id(UniqueId::new_at([127, 0, 0, 1].into(), &cfg).map_err(|e| e.to_string())?)
    };
    let seed = rng.next() | 1;
    let mut kids = Vec::new();
    // Each rank's output is read as it comes: a rank that logs more than a pipe holds must not
    // block on it. Its first line says it has joined (`READY`), which the kill waits for.
    let mut drains: Vec<Drain> = Vec::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    for r in 0..n {
        let mut k = spawn(o, &meet, r, n, seed).map_err(|e| format!("spawning rank {r}: {e}"))?;
        let out = k.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>);
        let err = k.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>);
        drains.push((drain(out, Some((r, ready_tx.clone()))), drain(err, None)));
        kids.push(k);
    }
    drop(ready_tx);
    // Every rank joined (on a loaded machine set-up alone can take seconds: a kill during it
    // would test set-up, not recovery), then a random time into the collectives.
    let joined_by = Instant::now() + cfg.timeout;
    let mut joined = vec![false; n];
    while joined.iter().any(|j| !j) {
        let left = joined_by.saturating_duration_since(Instant::now());
        match ready_rx.recv_timeout(left) {
            Ok(r) => joined[r] = true,
            Err(_) => {
                for k in &mut kids {
                    let _ = k.kill();
                }
                let missing: Vec<usize> = (0..n).filter(|&r| !joined[r]).collect();
                let outs = finish(kids, drains, Instant::now(), seed)?;
                let why: Vec<String> = missing
                    .iter()
                    .map(|&r| format!("rank {r}: {}", outs[r].3.trim()))
                    .collect();
                return Err(format!(
                    "ranks {missing:?} did not join within {} s: {}",
                    cfg.timeout.as_secs(),
                    why.join("; ")
                ));
            }
        }
    }
    std::thread::sleep(Duration::from_millis(rng.below(700)));
    let drawn = rng.below(n as u64) as usize;
    let victim = o.victim.unwrap_or(drawn);
    let kill_ns = now_ns();
    let _ = kids[victim].kill();
    let mut killed = vec![victim];
    if second {
        std::thread::sleep(Duration::from_millis(rng.below(40)));
        let mut v2 = rng.below(n as u64) as usize;
        if v2 == victim {
            v2 = (v2 + 1) % n;
        }
        let _ = kids[v2].kill();
        killed.push(v2);
    }
    let deadline = Instant::now() + Duration::from_secs(6 * o.timeout_s + 60);
    let outs = finish(kids, drains, deadline, seed)?;
    // A rank killed after it had already finished counts as a survivor.
    use std::os::unix::process::ExitStatusExt;
    killed.retain(|&v| outs[v].1.signal() == Some(9));
    killed.sort();
    killed.dedup();
    let survivors: Vec<usize> = (0..n).filter(|r| !killed.contains(r)).collect();
    let mut done = Vec::new();
    let mut finals: Vec<(usize, String)> = Vec::new();
    for &r in &survivors {
        let (_, status, out, err) = &outs[r];
        let Some(line) = out.lines().find(|l| l.starts_with("OK ")) else {
            let tail: String = err.lines().rev().take(6).collect::<Vec<_>>().join(" | ");
            return Err(format!("rank {r} ({status}) did not finish: {tail}"));
        };
        let field = |k: &str| -> Option<u128> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .and_then(|v| v.parse().ok())
        };
        let members = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("members="))
            .unwrap_or("")
            .to_string();
        // Every survivor ends in a communicator with itself in it; survivors that end in
        // communicators of one size end in the same one. (A survivor may end in a larger one
        // than another: it finished before a second rank died, and left.)
        if !members.split(',').any(|m| m == r.to_string()) {
            return Err(format!("rank {r} is not among its own members ({line})"));
        }
        let size = members.split(',').count();
        if let Some((_, other)) = finals.iter().find(|(s, m)| *s == size && *m != members) {
            return Err(format!(
                "rank {r} ended with members {members}, another survivor with {other}"
            ));
        }
        finals.push((size, members));
        // Destroying communicators with dead members waits for nothing that cannot come.
        let teardown = field("teardown_ms=").unwrap_or(u128::MAX);
        if teardown > u128::from(o.timeout_s) * 1000 / 2 {
            return Err(format!(
                "rank {r} took {teardown} ms to destroy its communicators ({line})"
            ));
        }
        done.push(field("first_ok_ns=").unwrap_or(0));
    }
    let last = done.into_iter().max().unwrap_or(kill_ns);
    Ok(Trial {
        ranks: n,
        killed,
        recovery: Duration::from_nanos(last.saturating_sub(kill_ns) as u64),
    })
}

/// A rank: random checked collectives until one fails (a rank was killed), then shrink until a
/// checked allreduce succeeds on the shrunk communicator, then a few more, then report.
fn worker(seed: u64) -> ExitCode {
    match work(seed) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-shrink-trials rank: {e}");
            ExitCode::FAILURE
        }
    }
}

fn work(seed: u64) -> Result<String, String> {
    let comm = Communicator::from_env().map_err(|e| format!("init: {e}"))?;
    println!("{READY}");
    let orig = comm.rank();
    let mut rng = Rng(seed);
    let started = Instant::now();
    let first = loop {
        if started.elapsed() > Duration::from_secs(120) {
            return Err("no collective failed within 120 s (no rank was killed?)".into());
        }
        if let Err(e) = random_collective(&comm, &mut rng) {
            break e;
        }
    };
    // Shrink until four checked allreduces in a row succeed: a second rank may die after a
    // shrink, and then the shrunk communicator fails and shrinks in turn.
    let mut cur = comm;
    let mut shrinks = 0;
    let mut first_ok_ns = None;
    loop {
        shrinks += 1;
        if shrinks > 8 {
            return Err(format!(
                "still failing after 8 shrinks (first error: {first})"
            ));
        }
        let next = cur
            .shrink(&[])
            .map_err(|e| format!("shrink {shrinks} (after: {first}): {e}"))?;
        let mut good = 0;
        let mut members = Vec::new();
        while good < 4 {
            match checked_allreduce(&next, orig) {
                Ok(m) => {
                    members = m;
                    first_ok_ns.get_or_insert_with(now_ns);
                    good += 1;
                }
                // A rank died after this shrink: go again.
                Err(_) if next.error().is_some() => break,
                Err(e) => return Err(e),
            }
        }
        if good == 4 {
            let line = format!(
                "OK rank={} size={} orig={orig} shrinks={shrinks} first_ok_ns={} members={}",
                next.rank(),
                next.size(),
                first_ok_ns.unwrap_or(0),
                members
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            );
            // Destroyed, not aborted: the communicators with dead members, then the last.
            let t0 = Instant::now();
            drop(cur);
            drop(next);
            return Ok(format!("{line} teardown_ms={}", t0.elapsed().as_millis()));
        }
        cur = next;
    }
}

/// One collective every rank of the trial draws alike, its result checked.
fn random_collective(c: &Communicator, rng: &mut Rng) -> Result<(), String> {
    let (n, r) = (c.size(), c.rank());
    let count = 1 + rng.below(1 << 17) as usize;
    let wrong = |what: &str| Err(format!("{what}: wrong result on rank {r}"));
    match rng.below(4) {
        0 => {
            let mine = vec![(r + 1) as f32; count];
            let mut out = vec![0.0f32; count];
            c.all_reduce(&mine, &mut out, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            let want = (n * (n + 1) / 2) as f32;
            if out.iter().any(|&x| x != want) {
                return wrong("allreduce");
            }
        }
        1 => {
            let per = count / n + 1;
            let mine = vec![r as u32; per];
            let mut out = vec![0u32; per * n];
            c.all_gather(&mine, &mut out).map_err(|e| e.to_string())?;
            if out.iter().enumerate().any(|(i, &x)| x as usize != i / per) {
                return wrong("allgather");
            }
        }
        2 => {
            let root = rng.below(n as u64) as usize;
            let mut buf = vec![if r == root { 7u8 } else { 0 }; count];
            c.broadcast_in_place(&mut buf, root)
                .map_err(|e| e.to_string())?;
            if buf.iter().any(|&x| x != 7) {
                return wrong("broadcast");
            }
        }
        _ => {
            let per = count / n + 1;
            let mine = vec![1.0f64; per * n];
            let mut out = vec![0.0f64; per];
            c.reduce_scatter(&mine, &mut out, ReduceOp::Sum)
                .map_err(|e| e.to_string())?;
            if out.iter().any(|&x| x != n as f64) {
                return wrong("reduce-scatter");
            }
        }
    }
    Ok(())
}

/// Every member contributes its rank in the first communicator plus one; the members' first
/// ranks, gathered, must be increasing (ranks keep their order) and sum to the result.
fn checked_allreduce(c: &Communicator, orig: usize) -> Result<Vec<u64>, String> {
    let mut ranks = vec![0u64; c.size()];
    c.all_gather(&[orig as u64], &mut ranks)
        .map_err(|e| e.to_string())?;
    if ranks.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("members out of order: {ranks:?}"));
    }
    let want: f64 = ranks.iter().map(|&x| (x + 1) as f64).sum();
    let mine = vec![(orig + 1) as f64; 4096];
    let mut out = vec![0.0f64; 4096];
    c.all_reduce(&mine, &mut out, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    if out.iter().any(|&x| x != want) {
        return Err(format!("allreduce after the shrink: {} != {want}", out[0]));
    }
    Ok(ranks)
}
