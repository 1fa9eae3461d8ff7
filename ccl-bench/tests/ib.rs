//! The benchmark over the verbs transport, ranks as processes: results check out, and a rank
//! killed with SIGKILL mid-collective makes the others fail promptly with an error naming it.
//! Both need an RDMA device, so they are ignored by default and `scripts/rxe-tests.sh` runs them
//! in the SoftRoCE VM (`--include-ignored`).

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ccl-bench");

/// Fails the test without an RDMA device (only a run that includes ignored tests gets here).
fn require_device() {
    let n = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(
        n > 0,
        "no RDMA device: this test needs one (scripts/rxe-tests.sh runs it in the SoftRoCE VM)"
    );
}

fn bench() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("CCL_") {
            c.env_remove(k);
        }
    }
    c.env("CCL_SOCKET_IFNAME", "=lo")
        .env("CCL_TIMEOUT", "120")
        .env("CCL_TRANSPORT", "ib");
    c
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_bench_np_checks_results() {
    require_device();
    for (np, qps) in [(2, "1"), (4, "4")] {
        let o = bench()
            .env("CCL_IB_QPS_PER_CONN", qps)
            .args(["allreduce", "--np", &np.to_string(), "--transport", "ib"])
            .args([
                "-b", "8", "-e", "4M", "-f", "8", "-n", "2", "-w", "1", "-c", "1",
            ])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "np {np}: {}\n{out}\n{err}", o.status);
        assert!(out.contains("transport ib"), "{out}");
        assert!(out.contains("Out of bounds values : 0 OK"), "{out}");
    }
}

fn wait_timeout(c: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
#[ignore = "needs an RDMA device; scripts/rxe-tests.sh runs it in the SoftRoCE VM"]
fn ib_sigkill_of_a_rank_is_named_by_the_others() {
    require_device();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut ranks: Vec<Child> = (0..3)
        .map(|r| {
            bench()
                .env("CCL_RANK", r.to_string())
                .env("CCL_WORLD_SIZE", "3")
                .env("CCL_COMM_ID", format!("127.0.0.1:{port}"))
                .env("CCL_SECRET", "ib-sigkill-test")
                .args([
                    "allreduce",
                    "-b",
                    "8M",
                    "-e",
                    "8M",
                    "-n",
                    "100000",
                    "-w",
                    "0",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Let the collectives run, then kill rank 1 in the middle of one.
    std::thread::sleep(Duration::from_secs(8));
    for (r, c) in ranks.iter_mut().enumerate() {
        assert!(
            c.try_wait().unwrap().is_none(),
            "rank {r} ended before the kill"
        );
    }
    let t_kill = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ranks[1].id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = ranks[1].wait();
    let mut named = 0;
    for r in [0, 2] {
        let status = wait_timeout(&mut ranks[r], Duration::from_secs(60));
        let took = t_kill.elapsed();
        if status.is_none() {
            let _ = ranks[r].kill();
        }
        let _ = ranks[r].wait();
        let mut err = String::new();
        ranks[r]
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = status.unwrap_or_else(|| panic!("rank {r} hung after rank 1 died:\n{err}"));
        assert!(!status.success(), "rank {r} succeeded?\n{err}");
        eprintln!(
            "rank {r} failed {:.2} s after the kill: {}",
            took.as_secs_f64(),
            err.trim()
        );
        assert!(took < Duration::from_secs(30), "rank {r} took {took:?}");
        if err.contains("peer 1") {
            named += 1;
        }
    }
    assert!(named >= 1, "no surviving rank named peer 1");
}
