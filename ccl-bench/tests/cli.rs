//! Multi-process tests: the benchmark binary as users run it.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ccl-bench");

fn bench() -> Command {
    let mut c = Command::new(BIN);
    // Keep every test on loopback and bounded, whatever the caller's environment says.
    for (k, _) in std::env::vars() {
        if k.starts_with("CCL_")
            || [
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "MASTER_ADDR",
                "MASTER_PORT",
            ]
            .contains(&k.as_str())
            || k.starts_with("OMPI_")
            || k.starts_with("SLURM_")
            || k.starts_with("PMI_")
        {
            c.env_remove(k);
        }
    }
    c.env("CCL_SOCKET_IFNAME", "=lo").env("CCL_TIMEOUT", "60");
    c
}

fn text(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}\n--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The data rows of a result table: (size, wrong out-of-place, wrong in-place).
fn rows(stdout: &str) -> Vec<(usize, u64, u64)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 13, "row has 13 columns: {l}");
            (
                f[0].parse().unwrap(),
                f[8].parse().unwrap(),
                f[12].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn np4_checks_every_size_with_zero_wrong() {
    for dtype in ["float", "bf16", "int8"] {
        for op in ["sum", "avg"] {
            let o = bench()
                .args([
                    "allreduce",
                    "--np",
                    "4",
                    "-b",
                    "8",
                    "-e",
                    "4M",
                    "-f",
                    "8",
                    "-n",
                    "2",
                    "-w",
                    "1",
                    "-c",
                    "1",
                ])
                .args(["-d", dtype, "-o", op, "--transport", "tcp"])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", text(&o));
            let out = String::from_utf8_lossy(&o.stdout);
            let r = rows(&out);
            assert_eq!(r.len(), 7, "{out}");
            assert!(r.iter().all(|&(_, a, b)| a == 0 && b == 0), "{out}");
            assert!(out.contains("# Avg bus bandwidth : "), "{out}");
            assert!(out.contains("# Peak bus bandwidth : "), "{out}");
            assert!(out.contains("nranks 4 transport tcp"), "{out}");
        }
    }
}

#[test]
fn json_report() {
    let path = std::env::temp_dir().join(format!("ccl-bench-test-{}.json", std::process::id()));
    let o = bench()
        .args([
            "allreduce",
            "--np",
            "2",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "4",
            "-n",
            "2",
            "-w",
            "1",
        ])
        .args(["--json", path.to_str().unwrap(), "--transport", "tcp"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(v["collective"], "allreduce");
    assert_eq!(v["nranks"], 2);
    assert_eq!(v["transport"], "tcp");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 8);
    for (i, r) in results.iter().enumerate() {
        for k in [
            "size",
            "count",
            "dtype",
            "op",
            "placement",
            "time_us",
            "algbw_gbs",
            "busbw_gbs",
            "wrong",
        ] {
            assert!(r.get(k).is_some(), "{k} missing in {r}");
        }
        assert_eq!(
            r["placement"],
            if i % 2 == 0 {
                "out-of-place"
            } else {
                "in-place"
            }
        );
        assert_eq!(r["wrong"], 0);
        assert!(r["time_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(results[0]["size"], 1024);
    assert_eq!(results[0]["count"], 256);
}

/// `--algo`, `--trace`, `--plot` and the `plot` subcommand: the report names the algorithm
/// that ran, the trace is Chrome JSON with one track per rank holding every timed operation,
/// and the pictures are SVG with one line per placement of each report.
#[test]
fn trace_plot_and_algorithm_in_the_report() {
    let dir = std::env::temp_dir().join(format!("ccl-bench-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let mut reports = Vec::new();
    for (algo, np) in [("ring", "3"), ("rd", "2")] {
        let o = bench()
            .args(["allreduce", "--np", np, "-b", "1K", "-e", "16K", "-f", "4"])
            .args(["-n", "3", "-w", "1", "--transport", "tcp", "--algo", algo])
            .args(["--json", &f(&format!("{algo}.json"))])
            .args(["--plot", &f(&format!("{algo}.svg"))])
            .args(["--trace", &f(&format!("{algo}-trace.json"))])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f(&format!("{algo}.json"))).unwrap())
                .unwrap();
        let rows = v["results"].as_array().unwrap();
        assert!(rows.iter().all(|r| r["algo"] == algo), "{v}");
        let svg = std::fs::read_to_string(f(&format!("{algo}.svg"))).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2, "{svg}");
        let t: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(f(&format!("{algo}-trace.json"))).unwrap(),
        )
        .unwrap();
        let slices: Vec<&serde_json::Value> = t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .collect();
        let np: u64 = np.parse().unwrap();
        for rank in 0..np {
            let mine: Vec<_> = slices.iter().filter(|e| e["pid"] == rank).collect();
            // 2 sizes x 2 placements x (3 timed + 1 warm-up) allreduces with this algorithm.
            let timed = mine
                .iter()
                .filter(|e| {
                    e["args"]["algo"] == algo
                        && e["name"].as_str().unwrap().starts_with("allreduce")
                })
                .count();
            assert!(timed >= 16, "rank {rank}: {timed} {algo} slices in {t}");
        }
        reports.push(f(&format!("{algo}.json")));
    }
    let out = f("both.svg");
    let o = bench()
        .args(["plot", &out])
        .args(&reports)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    assert!(svg.contains("ring (tcp, ring) out-of-place"), "{svg}");
    // A file that is not a report is named.
    let o = bench().args(["plot", &out, &f("rd.svg")]).output().unwrap();
    assert!(!o.status.success());
    assert!(
        text(&o).contains("rd.svg: not a ccl-bench --json report"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn in_process_threads() {
    let o = bench()
        .args([
            "allreduce",
            "--np",
            "3",
            "-b",
            "4",
            "-e",
            "1M",
            "-f",
            "16",
            "-n",
            "2",
            "-w",
            "1",
            "--transport",
            "local",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("transport local"), "{out}");
    assert!(
        rows(&out).iter().all(|&(_, a, b)| a == 0 && b == 0),
        "{out}"
    );
}

/// Starts `n` rank processes with per-rank variables from `vars(rank)` and waits for all.
fn spawn_ranks(n: usize, vars: impl Fn(usize) -> Vec<(String, String)>) -> Vec<Output> {
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut c = bench();
            c.args([
                "allreduce",
                "-b",
                "8",
                "-e",
                "256K",
                "-f",
                "8",
                "-n",
                "2",
                "-w",
                "1",
                "--transport",
                "tcp",
            ]);
            for (k, v) in vars(r) {
                c.env(k, v);
            }
            c.stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn torchrun_style_environment() {
    let port = free_port();
    let outs = spawn_ranks(4, |r| {
        vec![
            ("RANK".into(), r.to_string()),
            ("WORLD_SIZE".into(), "4".into()),
            ("LOCAL_RANK".into(), r.to_string()),
            ("LOCAL_WORLD_SIZE".into(), "4".into()),
            ("MASTER_ADDR".into(), "127.0.0.1".into()),
            ("MASTER_PORT".into(), port.to_string()),
        ]
    });
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    let out = String::from_utf8_lossy(&outs[0].stdout);
    assert!(out.contains("nranks 4"), "{out}");
    assert!(
        rows(&out).iter().all(|&(_, a, b)| a == 0 && b == 0),
        "{out}"
    );
    // Only rank 0 prints the table.
    assert!(outs[1].stdout.is_empty());
}

#[test]
fn mpirun_style_environment_meets_through_a_file() {
    let job = format!("test{}", std::process::id());
    let outs = spawn_ranks(3, |r| {
        vec![
            ("OMPI_COMM_WORLD_RANK".into(), r.to_string()),
            ("OMPI_COMM_WORLD_SIZE".into(), "3".into()),
            ("OMPI_COMM_WORLD_LOCAL_RANK".into(), r.to_string()),
            ("OMPI_COMM_WORLD_LOCAL_SIZE".into(), "3".into()),
            ("OMPI_MCA_ess_base_jobid".into(), job.clone()),
        ]
    });
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
    }
    assert!(String::from_utf8_lossy(&outs[0].stdout).contains("nranks 3"));
}

fn fails_with(args: &[&str], vars: &[(&str, &str)], needle: &str) -> Duration {
    let mut c = bench();
    c.args(args);
    for (k, v) in vars {
        c.env(k, v);
    }
    let t0 = Instant::now();
    let o = c.output().unwrap();
    let took = t0.elapsed();
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(needle),
        "expected '{needle}' in:\n{}",
        text(&o)
    );
    assert!(!err.contains("panicked"), "{}", text(&o));
    took
}

#[test]
fn bad_input_gets_clear_errors() {
    let ar = ["allreduce", "-b", "8", "-e", "8"];
    fails_with(
        &ar,
        &[("RANK", "0"), ("WORLD_SIZE", "abc")],
        "WORLD_SIZE='abc'",
    );
    fails_with(
        &ar,
        &[
            ("RANK", "5"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1"),
        ],
        "rank 5 is out of range",
    );
    fails_with(
        &ar,
        &[
            ("CCL_RANK", "0"),
            ("CCL_WORLD_SIZE", "2"),
            ("CCL_UNIQUE_ID", "00ff"),
        ],
        "malformed unique id",
    );
    fails_with(&ar, &[("CCL_TIMEOUT", "soon")], "CCL_TIMEOUT='soon'");
    fails_with(&ar, &[], "no rank in the environment");
    fails_with(&["allreduce", "-e", "99999999999999G"], &[], "overflows");
    fails_with(
        &["allreduce", "-b", "1M", "-e", "1K", "--np", "2"],
        &[],
        "invalid size range",
    );
    fails_with(
        &["allreduce", "-d", "float128", "--np", "2"],
        &[],
        "float128",
    );
    fails_with(
        &["allreduce", "--np", "2", "--algo", "bogus"],
        &[],
        "unknown algorithm 'bogus'",
    );
    fails_with(
        &["allreduce", "--np", "2", "--transport", "carrier-pigeon"],
        &[],
        "carrier-pigeon",
    );
}

#[test]
fn unreachable_rendezvous_fails_within_the_timeout_naming_it() {
    let port = free_port();
    let took = fails_with(
        &["allreduce", "-b", "8", "-e", "8"],
        &[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &port.to_string()),
            ("CCL_TIMEOUT", "2"),
        ],
        &format!("127.0.0.1:{port}"),
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn every_collective_checks_clean() {
    for coll in [
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
        "sendrecv",
        "gather",
        "scatter",
        "alltoallv",
    ] {
        let o = bench()
            .args([
                coll, "--np", "3", "-b", "8", "-e", "2M", "-f", "64", "-n", "2", "-w", "1", "-c",
                "1", "-r", "2",
            ])
            .args(["-o", "prod", "-d", "int32", "--transport", "tcp"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{coll}: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains(&format!("ccl-bench {coll}: nranks 3")),
            "{out}"
        );
        let data: Vec<&str> = out
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .collect();
        assert_eq!(data.len(), 4, "{out}");
        for l in data {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f[8], "0", "{coll}: {l}");
            assert!(f[12] == "0" || f[12] == "N/A", "{coll}: {l}");
            let root = if matches!(coll, "broadcast" | "reduce" | "gather" | "scatter") {
                "2"
            } else {
                "-1"
            };
            assert_eq!(f[4], root, "{coll}: {l}");
        }
    }
    // An algorithm the collective lacks is refused by name.
    let o = bench()
        .args([
            "alltoall", "--np", "2", "--algo", "ring", "-b", "8", "-e", "8",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("alltoall has no ring"),
        "{}",
        text(&o)
    );
}

/// `CCL_DEBUG_SUBSYS` shows each subsystem's lines and only those, labelled with it: the label
/// is what each module says it is (its `LOG_SUBSYS`), so the set-up line is `init`, the
/// rendezvous's are `bootstrap` and the executor's are `coll`.
#[test]
fn log_lines_carry_their_modules_subsystem() {
    for (subsys, expect) in [
        ("init", "communicator ready"),
        ("bootstrap", "ranks joined"),
        ("coll", "schedule: "),
    ] {
        let o = bench()
            .args(["allreduce", "--np", "2", "--transport", "tcp"])
            .args(["-b", "8", "-e", "8", "-n", "1", "-w", "0"])
            .env("CCL_DEBUG", "trace")
            .env("CCL_DEBUG_SUBSYS", subsys)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        let shown: Vec<&str> = err
            .lines()
            .filter(|l| l.contains(" CCL INFO ") || l.contains(" CCL TRACE "))
            .collect();
        for l in &shown {
            let label = l.split(" CCL ").nth(1).and_then(|r| r.split(' ').nth(1));
            assert_eq!(label, Some(subsys), "{l}\n{}", text(&o));
        }
        assert!(
            shown.iter().any(|l| l.contains(expect)),
            "no {subsys} line with {expect:?}\n{}",
            text(&o)
        );
    }
}

/// A flag given twice takes its last value, so `scripts/bench.sh`'s defaults can be overridden
/// by the flags passed after them.
#[test]
fn a_flag_given_twice_takes_its_last_value() {
    let o = bench()
        .args([
            "allreduce",
            "--np",
            "1",
            "--transport",
            "tcp",
            "-b",
            "8",
            "-e",
            "64M",
        ])
        .args(["-n", "1", "-w", "0", "-b", "1K", "-e", "2K"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let sizes: Vec<usize> = rows(&String::from_utf8_lossy(&o.stdout))
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(sizes, [1024, 2048], "{}", text(&o));
}

/// Runs an 8-byte allreduce of `np` rank processes over TCP with `--scale-report`, `vars` in
/// the environment and `extra` flags; returns the run's output and the report's lines.
fn scale_run(np: &str, vars: &[(&str, &str)], extra: &[&str]) -> (Output, Vec<serde_json::Value>) {
    let path =
        std::env::temp_dir().join(format!("ccl-bench-scale-{np}-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut c = bench();
    c.envs(vars.iter().copied());
    let o = c
        .args([
            "allreduce",
            "--np",
            np,
            "-b",
            "8",
            "-e",
            "8",
            "-n",
            "1",
            "-w",
            "0",
        ])
        .args(["--bind", "none", "--transport", "tcp"])
        .args(["--scale-report", path.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let lines = std::fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let _ = std::fs::remove_file(&path);
    (o, lines)
}

/// `--scale-report`: a line per rank and one from the launcher, every figure measured: the
/// times ordered and within the run, connections to every peer (eager set-up connects all pairs),
/// sockets at least as many, memory nonzero, and the launcher's root traffic nonzero.
#[test]
fn scale_report_has_a_line_per_rank_and_the_launchers() {
    let start = Instant::now();
    let (o, lines) = scale_run("4", &[("CCL_CONNECT", "eager")], &[]);
    let wall = start.elapsed().as_micros() as u64;
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(lines.len(), 5, "{lines:?}");
    let mut ranks: Vec<u64> = Vec::new();
    for l in &lines[..4] {
        ranks.push(l["rank"].as_u64().unwrap());
        assert_eq!(l["size"], 4);
        assert_eq!(l["transport"], "tcp");
        let us = |k: &str| l[k].as_u64().unwrap();
        let (start, init, first, done) =
            (us("start_us"), us("init_us"), us("first_us"), us("done_us"));
        assert!(
            start < init && 0 < init && init <= first && first <= done && done <= wall,
            "{l}"
        );
        assert_eq!(l["peers"], 3, "{l}");
        assert!(l["sockets"].as_u64().unwrap() >= 3, "{l}");
        assert!(l["fds"].as_u64() >= l["sockets"].as_u64(), "{l}");
        assert!(l["rss_kib"].as_u64().unwrap() > 0, "{l}");
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3]);
    let l = &lines[4];
    assert_eq!(l["launcher"], true);
    assert_eq!(l["ranks"], 4);
    // Four hellos in, four welcomes out (the records travel among the ranks).
    assert!(l["root_in"].as_u64().unwrap() > 4 * 48, "{l}");
    assert!(l["root_out"].as_u64().unwrap() >= 4 * 5, "{l}");
    assert!(l["wall_us"].as_u64().unwrap() <= wall, "{l}");
    // Four ranks, fewer than CCL_MONITOR_FANOUT: each on its own line to the root.
    assert_eq!(l["root_lines"], 4, "{l}");
}

/// 256 rank processes over TCP with pairs connected on demand finish set-up and an 8-byte
/// allreduce (recursive doubling: log2 256 = 8 peers), every rank within 2*log2(N)+4
/// connections, not N-1, and the root moving a bounded number of bytes per rank (its hello,
/// welcome, monitor request and the connection requests it passes on), not the N records per
/// rank of a relayed allgather. The job monitor is a tree of fan-out 8 (three levels): the root
/// holds the lines of the four top-level ranks (0, 64, 128, 192) once the others moved to their
/// hubs. Counts connections and bytes, not time.
#[test]
fn two_hundred_fifty_six_ranks_hold_a_logarithmic_number_of_connections() {
    let n = 256;
    let (o, lines) = scale_run(
        "256",
        &[
            ("CCL_CONNECT", "lazy"),
            ("CCL_TIMEOUT", "300"),
            ("CCL_SPIN_US", "0"),
            ("CCL_MONITOR_FANOUT", "8"),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let ranks: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("rank").is_some()).collect();
    assert_eq!(ranks.len(), n);
    let bound = 2 * 8 + 4;
    for l in ranks {
        let peers = l["peers"].as_u64().unwrap();
        assert!((1..=bound).contains(&peers), "{l}");
        // The sockets a rank holds: its peers', its monitor line and its listener; a hub (a
        // multiple of 8) also its listener for the monitor and up to 7 lines per level below.
        let hub = if l["rank"].as_u64().unwrap() % 8 == 0 {
            1 + 2 * 7
        } else {
            0
        };
        assert!(l["sockets"].as_u64().unwrap() <= bound + 3 + hub, "{l}");
    }
    let root = lines.iter().find(|l| l.get("launcher").is_some()).unwrap();
    assert_eq!(root["root_lines"], 4, "{root}");
    for k in ["root_in", "root_out"] {
        assert!(root[k].as_u64().unwrap() <= 1024 * n as u64, "{k}: {root}");
    }
}

/// `--threads`: the ranks are threads of the launcher's process over real TCP sockets; each
/// reports its share of the process's descriptors and memory, read once while every rank is up,
/// and the launcher's line says its bytes are everyone's.
#[test]
fn ranks_as_threads_report_their_share_of_the_process() {
    let (o, lines) = scale_run("6", &[("CCL_CONNECT", "lazy")], &["--threads"]);
    assert!(o.status.success(), "{}", text(&o));
    let ranks: Vec<&serde_json::Value> = lines.iter().filter(|l| l.get("rank").is_some()).collect();
    let mut seen: Vec<u64> = ranks.iter().map(|l| l["rank"].as_u64().unwrap()).collect();
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4, 5], "{lines:?}");
    for l in &ranks {
        assert_eq!(l["transport"], "tcp", "{l}");
        assert_eq!(l["ranks_in_process"], 6, "{l}");
        // Each rank's connections, its listener and monitor line are sockets of the process.
        let peers = l["peers"].as_u64().unwrap();
        assert!((1..=5).contains(&peers), "{l}");
        assert!(l["sockets"].as_u64().unwrap() >= 1, "{l}");
        assert!(l["fds"].as_u64() >= l["sockets"].as_u64(), "{l}");
        assert!(l["rss_kib"].as_u64().unwrap() > 0, "{l}");
    }
    // Every rank read the same process figures.
    assert!(
        ranks.windows(2).all(|w| w[0]["fds"] == w[1]["fds"]),
        "{lines:?}"
    );
    let l = lines.iter().find(|l| l.get("launcher").is_some()).unwrap();
    assert_eq!(l["ranks_in_process"], true, "{l}");
    assert_eq!(l["ranks"], 6, "{l}");
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the name may hold spaces and parentheses.
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            v.push(child);
        }
    }
    v
}

/// Whether `pid` still runs (a zombie has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let after = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        after.split_whitespace().next() != Some("Z")
    })
}

/// Killing the launcher of `--np` ends the job, as killing mpirun or torchrun does: its helper
/// and every rank end (`SIGKILL`, which the launcher cannot pass on, as well as `SIGTERM`),
/// though the job itself would survive its rendezvous root's death.
#[test]
fn killing_the_launcher_ends_its_ranks() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for sig in [Signal::SIGKILL, Signal::SIGTERM] {
        let mut launcher = bench()
            .args([
                "allreduce",
                "--np",
                "3",
                "-b",
                "8",
                "-e",
                "8",
                "-n",
                "100000000",
            ])
            .args(["-w", "0", "-c", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let (helper, ranks) = loop {
            if let Some(found) = children_of(launcher.id())
                .into_iter()
                .map(|h| (h, children_of(h)))
                .find(|(_, r)| r.len() == 3)
            {
                break found;
            }
            assert!(Instant::now() < deadline, "the 3 ranks never started");
            std::thread::sleep(Duration::from_millis(50));
        };
        kill(Pid::from_raw(launcher.id() as i32), sig).unwrap();
        let _ = launcher.wait();
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Some(p) = std::iter::once(helper)
            .chain(ranks.iter().copied())
            .find(|&p| running(p))
        {
            if Instant::now() >= deadline {
                // Do not leave them behind for the next test.
                for p in std::iter::once(helper).chain(ranks.iter().copied()) {
                    let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
                }
                panic!(
                    "{sig}: process {p} (helper {helper}, ranks {ranks:?}) still runs 30 s after its launcher was killed"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
