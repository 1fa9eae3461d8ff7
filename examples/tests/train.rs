//! The data-parallel training example: loss falls and every rank ends with the same weights,
//! with ranks as processes over TCP, as threads over the in-process transport, and under
//! launcher-style variables.

use std::net::TcpListener;
use std::process::{Command, Output};

fn train() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_train"));
    c.env("CCL_SOCKET_IFNAME", "=lo").env("CCL_TIMEOUT", "60");
    c
}

fn check(o: &Output, ranks: usize) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "train failed ({}):\n{out}\n{err}",
        o.status
    );
    let losses: Vec<f64> = out
        .lines()
        .filter_map(|l| l.split("loss ").nth(1)?.trim().parse().ok())
        .collect();
    assert!(losses.len() >= 10, "no per-epoch losses:\n{out}");
    assert!(losses.last().unwrap() < &(0.8 * losses[0]), "{out}");
    assert!(
        out.contains(&format!("weights bit-identical on all {ranks} ranks")),
        "{out}"
    );
}

#[test]
fn processes_over_tcp() {
    let o = train()
        .args(["--np", "3", "--epochs", "15", "--samples", "6000"])
        .output()
        .unwrap();
    check(&o, 3);
}

#[test]
fn threads_over_the_local_transport() {
    let o = train()
        .args([
            "--np",
            "4",
            "--transport",
            "local",
            "--epochs",
            "15",
            "--samples",
            "6000",
        ])
        .output()
        .unwrap();
    check(&o, 4);
}

#[test]
fn under_launcher_variables() {
    // What torchrun or mpirun would set: rank, size and where rank 0 runs the rendezvous.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = (0..2)
        .map(|r| {
            train()
                .args(["--epochs", "12", "--samples", "4000"])
                .env("CCL_RANK", r.to_string())
                .env("CCL_WORLD_SIZE", "2")
                .env("CCL_COMM_ID", format!("127.0.0.1:{port}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    check(&outs[0], 2);
    assert!(outs[1].status.success(), "{:?}", outs[1]);
}

#[test]
fn a_killed_rank_does_not_end_training_with_tolerate_failures() {
    let o = train()
        .args(["--np", "4", "--epochs", "20", "--samples", "6000"])
        .args(["--tolerate-failures", "--kill", "2@8"])
        .output()
        .unwrap();
    check(&o, 3);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("continuing with 3 ranks from epoch"), "{out}");
}

#[test]
fn rank_0_running_the_rendezvous_dies_and_training_goes_on() {
    // As under torchrun: rank 0's process runs the rendezvous and the job's monitor, and dies.
    let o = train()
        .args(["--np", "4", "--epochs", "20", "--samples", "6000"])
        .args(["--root-in-rank0", "--tolerate-failures", "--kill", "0@8"])
        .output()
        .unwrap();
    check(&o, 3);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("continuing with 3 ranks from epoch"), "{out}");
}
