//! `ccl-bench sim`: the library's allreduce schedules on a modelled fabric (the `ccl-sim`
//! crate), swept over algorithms, sizes, QPs per connection, hashing, oversubscription, racks
//! and seeds; a table on stdout, JSON and an SVG plot on request.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use ccl_diag::human_bytes;
use ccl_sim::{Fabric, Hashing, Placement, Ports, Report, Source};
use clap::Args;

use crate::plot;

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// Fabric file (format in docs/scale.md); the flags below override it.
    #[arg(long, value_name = "PATH")]
    fabric: Option<PathBuf>,
    /// Algorithms, comma-separated (ring, tree, hd, hier, rd), `all`, or `auto` (the cost
    /// model's choice at each size). With more than one, a table compares the model's choice
    /// with the simulated best.
    #[arg(long, default_value = "ring")]
    algo: String,
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "1M", value_parser = size_arg)]
    min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "1M", value_parser = size_arg)]
    max_bytes: usize,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: usize,
    /// QPs per connection between hosts (a list sweeps).
    #[arg(long, value_delimiter = ',')]
    qps: Vec<usize>,
    /// ecmp, dqp (enhanced ECMP: the destination QP too), spray (a list sweeps).
    #[arg(long, value_delimiter = ',')]
    hashing: Vec<Hashing>,
    /// per-qp or per-conn: which UDP source ports the QPs of a connection use.
    #[arg(long)]
    ports: Option<Ports>,
    /// Rack oversubscription (hosts' NIC capacity over uplink capacity; a list sweeps).
    #[arg(long, value_delimiter = ',')]
    oversub: Vec<f64>,
    /// Racks per zone (a list sweeps the job size).
    #[arg(long, value_delimiter = ',')]
    racks: Vec<usize>,
    /// Seeds of QP numbers, switch hashes and placement (a list sweeps; plots average them).
    #[arg(long, value_delimiter = ',')]
    seeds: Vec<u64>,
    #[arg(long)]
    ranks_per_host: Option<usize>,
    #[arg(long)]
    hosts_per_rack: Option<usize>,
    #[arg(long)]
    zones: Option<usize>,
    #[arg(long)]
    spines: Option<usize>,
    #[arg(long)]
    nic_gbps: Option<f64>,
    #[arg(long)]
    reduce_gbps: Option<f64>,
    #[arg(long)]
    op_overhead_us: Option<f64>,
    /// racks (the library's topology names racks) or scattered (it knows hosts only).
    #[arg(long)]
    placement: Option<Placement>,
    /// HOST:FRACTION: that host's NIC runs at FRACTION of its speed (repeatable).
    #[arg(long, value_name = "HOST:FRACTION")]
    slow_host: Vec<String>,
    /// Measure the reduction kernel here and use its rate (else the fabric's `reduce-gbps`).
    #[arg(long)]
    measure_reduce: bool,
    /// built (the library's schedules op by op), pattern (the ring grouped per rank), auto.
    #[arg(long, default_value = "auto")]
    schedules: Source,
    /// Write every run as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Draw busbw against `--x` as SVG to this file.
    #[arg(long, value_name = "PATH")]
    plot: Option<PathBuf>,
    /// The plot's x axis: size, qps, ranks or oversub.
    #[arg(long, default_value = "size", value_parser = ["size", "qps", "ranks", "oversub"])]
    x: String,
    /// Plot busbw (default) or time.
    #[arg(long, default_value = "busbw", value_parser = ["busbw", "time"])]
    y: String,
    #[arg(long)]
    title: Option<String>,
}

fn size_arg(s: &str) -> Result<usize, String> {
    ccl_core::config::parse_size("size", s, 1).map_err(|e| e.message().to_string())
}

fn base_fabric(a: &SimArgs) -> Result<Fabric, String> {
    let mut f = match &a.fabric {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            Fabric::parse(&p.display().to_string(), &text)?
        }
        None => Fabric::default(),
    };
    let over = f.rack_oversubscription();
    let zover = f.zone_oversubscription();
    if let Some(v) = a.ranks_per_host {
        f.ranks_per_host = v;
    }
    if let Some(v) = a.hosts_per_rack {
        f.hosts_per_rack = v;
    }
    if let Some(v) = a.zones {
        f.zones = v;
    }
    if let Some(v) = a.spines {
        f.spines = v;
    }
    if let Some(v) = a.nic_gbps {
        f.nic_gbps = v;
    }
    if let Some(v) = a.reduce_gbps {
        f.reduce_bps = v * 1e9 / 8.0;
    }
    if let Some(v) = a.op_overhead_us {
        f.op_overhead = v * 1e-6;
    }
    if let Some(v) = a.placement {
        f.placement = v;
    }
    if let Some(v) = a.ports {
        f.ports = v;
    }
    for s in &a.slow_host {
        let (h, x) = s
            .split_once(':')
            .ok_or_else(|| format!("--slow-host {s}: expected HOST:FRACTION"))?;
        let h: usize = h
            .parse()
            .map_err(|_| format!("--slow-host {s}: '{h}' is not a host number"))?;
        let x: f64 = x
            .parse()
            .map_err(|_| format!("--slow-host {s}: '{x}' is not a fraction"))?;
        f.slow_hosts.push((h, x));
    }
    if a.measure_reduce {
        f.reduce_bps = ccl_sim::measure_reduce_rate(16 << 20);
        eprintln!(
            "# measured reduction rate: {:.2} GB/s (f32 sum, 16 MiB)",
            f.reduce_bps / 1e9
        );
    }
    // Keep the oversubscription of the file when the shape changes.
    Ok(f.with_oversubscription(over, zover))
}

fn algos(a: &SimArgs) -> Result<Vec<String>, String> {
    if a.algo == "all" {
        return Ok(ccl_sim::schedules::allreduce_algos()
            .into_iter()
            .map(String::from)
            .collect());
    }
    a.algo
        .split(',')
        .map(|x| {
            if x == "auto" {
                Ok("auto".to_string())
            } else {
                ccl_sim::schedules::parse_algo(x).map(String::from)
            }
        })
        .collect()
}

/// One point of the sweep.
#[derive(Clone, Debug)]
struct Point {
    fabric: Fabric,
    algo: String,
    bytes: usize,
}

fn sweep(a: &SimArgs) -> Result<Vec<Point>, String> {
    let base = base_fabric(a)?;
    let sizes = crate::harness::sizes(a.min_bytes, a.max_bytes, a.factor);
    let algos = algos(a)?;
    let or = |v: &[usize], d: usize| if v.is_empty() { vec![d] } else { v.to_vec() };
    let qps = or(&a.qps, base.qps);
    let racks = or(&a.racks, base.racks_per_zone);
    let hashing = if a.hashing.is_empty() {
        vec![base.hashing]
    } else {
        a.hashing.clone()
    };
    let over = if a.oversub.is_empty() {
        vec![base.rack_oversubscription()]
    } else {
        a.oversub.clone()
    };
    let seeds = if a.seeds.is_empty() {
        vec![base.seed]
    } else {
        a.seeds.clone()
    };
    let mut out = Vec::new();
    for &rk in &racks {
        for &o in &over {
            for &h in &hashing {
                for &q in &qps {
                    for &s in &seeds {
                        let zo = base.zone_oversubscription();
                        let f = Fabric {
                            racks_per_zone: rk,
                            hashing: h,
                            qps: q,
                            seed: s,
                            ..base.clone()
                        }
                        .with_oversubscription(o, zo);
                        f.check()?;
                        for algo in &algos {
                            for &bytes in &sizes {
                                out.push(Point {
                                    fabric: f.clone(),
                                    algo: algo.clone(),
                                    bytes,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The label of a run's line: every swept setting but the x axis and the seed.
fn line_label(r: &Report, x: &str, vary: &Vary) -> String {
    let mut parts = Vec::new();
    if vary.algo {
        parts.push(r.algo.clone());
    }
    if vary.ranks && x != "ranks" {
        parts.push(format!("{} ranks", r.ranks));
    }
    if vary.oversub && x != "oversub" {
        parts.push(format!("{}:1", r.rack_oversub));
    }
    if vary.hashing {
        parts.push(r.hashing_name());
    }
    if vary.qps && x != "qps" {
        parts.push(format!("{} QP", r.qps));
    }
    if vary.size && x != "size" {
        parts.push(human_bytes(r.bytes as u64));
    }
    if parts.is_empty() {
        parts.push(r.algo.clone());
    }
    parts.join(", ")
}

trait Named {
    fn hashing_name(&self) -> String;
}

impl Named for Report {
    fn hashing_name(&self) -> String {
        match (self.hashing, self.ports) {
            (Hashing::Ecmp, Ports::PerConn) => "ecmp (1 port/conn)".into(),
            (h, _) => h.to_string(),
        }
    }
}

#[derive(Default)]
struct Vary {
    algo: bool,
    ranks: bool,
    oversub: bool,
    hashing: bool,
    qps: bool,
    size: bool,
}

fn x_of(r: &Report, x: &str) -> f64 {
    match x {
        "qps" => r.qps as f64,
        "ranks" => r.ranks as f64,
        "oversub" => r.rack_oversub,
        _ => r.bytes as f64,
    }
}

/// Runs the sweep and prints it.
pub(crate) fn run(a: &SimArgs) -> ExitCode {
    match run_inner(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ccl-bench sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_inner(a: &SimArgs) -> Result<(), String> {
    let mut points = sweep(a)?;
    // Runs sharing a program next to each other, so one cached program serves them all.
    points.sort_by_key(|p| (p.fabric.racks_per_zone, p.algo.clone(), p.bytes));
    type Key = (String, usize, [usize; 4], Placement);
    let mut cache: std::collections::HashMap<Key, (ccl_sim::Program, f64)> =
        std::collections::HashMap::new();
    let mut reports: Vec<Report> = Vec::new();
    println!(
        "# {:>6} {:>7} {:>3} {:>18} {:>5} {:>4} {:>10} | {:>12} {:>9} {:>12} {:>6} | {:>9} {:>6} {:>6}",
        "algo",
        "ranks",
        "qps",
        "hashing",
        "over",
        "seed",
        "size",
        "time(us)",
        "busbw",
        "model(us)",
        "pick",
        "worst",
        "util",
        "imbal"
    );
    for p in &points {
        let algo = if p.algo == "auto" {
            ccl_sim::schedules::model_choice(&p.fabric, p.bytes).to_string()
        } else {
            p.algo.clone()
        };
        let f = &p.fabric;
        let key = (
            algo.clone(),
            p.bytes,
            [
                f.ranks_per_host,
                f.hosts_per_rack,
                f.racks_per_zone,
                f.zones,
            ],
            f.placement,
        );
        if !cache.contains_key(&key) {
            let t = std::time::Instant::now();
            let prog = ccl_sim::program(f, &algo, p.bytes, a.schedules)?;
            cache.clear();
            cache.insert(key.clone(), (prog, t.elapsed().as_secs_f64()));
        }
        let (prog, build_s) = &cache[&key];
        let mut r = ccl_sim::run_program(f, prog, &algo, p.bytes)?;
        r.build_s = *build_s;
        r.source = if prog.source == "pattern" {
            Source::Pattern
        } else {
            Source::Built
        };
        if p.algo == "auto" {
            r.algo = format!("auto ({algo})");
        }
        // The most utilised network tier.
        let worst = r
            .tiers
            .iter()
            .filter(|t| t.tier != "host" && t.tier != "reduce")
            .max_by(|x, y| x.max.total_cmp(&y.max));
        println!(
            "  {:>6} {:>7} {:>3} {:>18} {:>5} {:>4} {:>10} | {:>12.1} {:>9.2} {:>12} {:>6} | {:>9} {:>6.2} {:>6.2}",
            r.algo,
            r.ranks,
            r.qps,
            r.hashing_name(),
            format!("{}:1", r.rack_oversub),
            r.seed,
            human_bytes(r.bytes as u64),
            r.time_us,
            r.busbw_gbs,
            r.model_us.map_or("-".into(), |m| format!("{m:.1}")),
            r.model_choice,
            worst.map_or("-", |t| t.tier),
            worst.map_or(0.0, |t| t.max),
            worst.map_or(0.0, |t| t.imbalance),
        );
        reports.push(r);
    }
    let algos = algos(a)?;
    if algos.len() > 1 {
        print!("{}", choice_table(&reports));
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())? + "\n";
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.plot {
        let svg = plot_reports(a, &reports);
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Per fabric and size: every algorithm's simulated time, the best, the cost model's pick and
/// how far the pick is from the best.
fn choice_table(reports: &[Report]) -> String {
    use std::collections::BTreeMap;
    let mut groups: BTreeMap<(usize, String, String, u64, usize), Vec<&Report>> = BTreeMap::new();
    for r in reports {
        let key = (
            r.ranks,
            format!("{}:1 {} {}QP", r.rack_oversub, r.hashing_name(), r.qps),
            format!("{:?}", r.placement),
            r.seed,
            r.bytes,
        );
        groups.entry(key).or_default().push(r);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| ranks | fabric | size | best (us) | best | model pick | pick / best |\n|---|---|---|---|---|---|---|"
    );
    let mut worst: f64 = 1.0;
    for ((ranks, fab, _, _, bytes), rs) in &groups {
        let Some(best) = rs
            .iter()
            .filter(|r| !r.algo.starts_with("auto"))
            .min_by(|x, y| x.time_us.total_cmp(&y.time_us))
        else {
            continue;
        };
        let pick = &best.model_choice;
        let picked = rs.iter().find(|r| &r.algo == pick);
        let ratio = picked.map(|p| p.time_us / best.time_us);
        if let Some(x) = ratio {
            worst = worst.max(x);
        }
        let _ = writeln!(
            out,
            "| {ranks} | {fab} | {} | {:.1} | {} | {pick} | {} |",
            human_bytes(*bytes as u64),
            best.time_us,
            best.algo,
            ratio.map_or("(not simulated)".into(), |x| format!("{x:.2}"))
        );
    }
    let _ = writeln!(out, "\nWorst model pick / simulated best: {worst:.2}");
    out
}

fn plot_reports(a: &SimArgs, reports: &[Report]) -> String {
    use std::collections::BTreeMap;
    let distinct = |f: &dyn Fn(&Report) -> String| {
        reports
            .iter()
            .map(f)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            > 1
    };
    let vary = Vary {
        algo: distinct(&|r| r.algo.clone()),
        ranks: distinct(&|r| r.ranks.to_string()),
        oversub: distinct(&|r| r.rack_oversub.to_string()),
        hashing: distinct(&|r| r.hashing_name()),
        qps: distinct(&|r| r.qps.to_string()),
        size: distinct(&|r| r.bytes.to_string()),
    };
    // label -> x -> values over seeds
    let mut lines: Vec<(String, BTreeMap<u64, Vec<f64>>)> = Vec::new();
    for r in reports {
        let label = line_label(r, &a.x, &vary);
        let i = match lines.iter().position(|l| l.0 == label) {
            Some(i) => i,
            None => {
                lines.push((label, BTreeMap::new()));
                lines.len() - 1
            }
        };
        let y = if a.y == "time" {
            r.time_us
        } else {
            r.busbw_gbs
        };
        lines[i]
            .1
            .entry(x_of(r, &a.x).to_bits())
            .or_default()
            .push(y);
    }
    let series: Vec<plot::Series> = lines
        .into_iter()
        .map(|(label, pts)| plot::Series {
            label,
            points: pts
                .into_iter()
                .map(|(x, ys)| (f64::from_bits(x), ys.iter().sum::<f64>() / ys.len() as f64))
                .collect(),
        })
        .collect();
    let first = &reports[0];
    let title = a.title.clone().unwrap_or_else(|| {
        format!(
            "simulated allreduce, {} ranks ({} per host, {} hosts per rack)",
            first.ranks,
            first.ranks / first.hosts.max(1),
            first.hosts / first.racks.max(1)
        )
    });
    let (x_label, x) = match a.x.as_str() {
        "qps" => ("QPs per connection", plot::Axis::Number { log: true }),
        "ranks" => ("ranks", plot::Axis::Number { log: true }),
        "oversub" => (
            "rack oversubscription (x:1)",
            plot::Axis::Number { log: false },
        ),
        _ => ("size (bytes)", plot::Axis::Bytes),
    };
    let y_label = if a.y == "time" {
        "time per operation (us)"
    } else {
        "busbw (GB/s)"
    };
    let seeds = reports
        .iter()
        .map(|r| r.seed)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let title = if seeds > 1 {
        format!("{title}; mean of {seeds} seeds")
    } else {
        title
    };
    plot::chart(
        &plot::Chart {
            title,
            x_label: x_label.into(),
            y_label: y_label.into(),
            x,
            y_log: None,
        },
        &series,
    )
}
