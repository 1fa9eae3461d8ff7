//! `ccl-bench sim` from the outside: a small sweep writes its JSON and plot; bad input is an
//! error that says what was wrong.

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ccl-bench"))
        .arg("sim")
        .args(args)
        .output()
        .expect("ccl-bench runs")
}

#[test]
fn a_small_sweep_writes_json_and_a_plot() {
    let dir = std::env::temp_dir().join(format!("ccl-bench-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let svg = dir.join("out.svg");
    let out = bench(&[
        "--ranks-per-host",
        "2",
        "--hosts-per-rack",
        "2",
        "--racks",
        "2",
        "--algo",
        "ring,tree",
        "-b",
        "1K",
        "-e",
        "1M",
        "-f",
        "32",
        "--qps",
        "1,2",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("model pick / simulated best"), "{text}");
    let runs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // 2 algorithms x 3 sizes x 2 QP counts.
    assert_eq!(runs.as_array().unwrap().len(), 12);
    assert!(runs[0]["busbw_gbs"].as_f64().unwrap() > 0.0);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("</svg>"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_named() {
    for (args, want) in [
        (
            vec!["--fabric", "/nonexistent/fabric"],
            "/nonexistent/fabric",
        ),
        (vec!["--algo", "pairwise"], "allreduce has no pairwise"),
        (
            vec!["--algo", "tree", "--schedules", "pattern"],
            "only the ring",
        ),
        (vec!["--slow-host", "5"], "HOST:FRACTION"),
        (vec!["--qps", "0"], "qps must be at least 1"),
    ] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
