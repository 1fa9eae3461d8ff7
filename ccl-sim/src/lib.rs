//! `ccl-sim`: runs ccl's allreduce schedules over a modelled RoCE fabric.
//!
//! The fabric ([`fabric::Fabric`]) is hosts in racks in zones: a two-stage Clos in each zone
//! (rack switches under spines) and aggregation switches between zones, with link speeds and
//! oversubscription per tier. Each connection between hosts is split over its QPs; each QP's
//! path is picked per tier by hashing its 5-tuple (ECMP), optionally with the destination QP
//! (enhanced ECMP), or traffic is sprayed ideally. Bandwidth is shared max-min fairly; hops add
//! latency, ops add software overhead, reductions run at a measured kernel rate. The schedules
//! are the library's own (`ccl_algos::algo::build` for every rank), or for rings too large to
//! build op by op, the same ring grouped into two flows per rank ([`pattern`]).
//!
//! Quick start:
//!
//! ```
//! use ccl_sim::{Fabric, Source, simulate};
//! let fabric = Fabric { racks_per_zone: 2, hosts_per_rack: 2, ranks_per_host: 2, ..Fabric::default() };
//! let r = simulate(&fabric, "ring", 1 << 20, Source::Built).unwrap();
//! assert_eq!(r.ranks, 8);
//! assert!(r.busbw_gbs > 0.0 && r.time_us > 0.0);
//! ```
//!
//! `ccl-bench sim` is the command line (tables, JSON, SVG plots); `docs/scale.md` has the
//! experiments and what the model leaves out.
#![forbid(unsafe_code)]

pub mod engine;
pub mod fabric;
pub mod pattern;
pub mod program;
pub mod schedules;

use std::time::Instant;

use serde::Serialize;

pub use fabric::{Fabric, Hashing, Network, Placement, Ports, Tier};
pub use program::Program;

/// Where a program comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// The library's schedules for every rank, one flow per send.
    Built,
    /// The ring grouped into two flows per rank (ring only).
    Pattern,
    /// `pattern` for rings above [`AUTO_PATTERN_RANKS`] ranks, `built` otherwise.
    Auto,
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Source, String> {
        match s {
            "built" => Ok(Source::Built),
            "pattern" => Ok(Source::Pattern),
            "auto" => Ok(Source::Auto),
            _ => Err(format!(
                "unknown schedule source '{s}' (expected built, pattern or auto)"
            )),
        }
    }
}

/// Rings larger than this are simulated from the pattern under [`Source::Auto`]: building them
/// op by op takes the library about a second per rank at 1K ranks.
pub const AUTO_PATTERN_RANKS: usize = 256;

/// Utilisation of one tier of links over the operation.
#[derive(Clone, Debug, Serialize)]
pub struct TierUse {
    pub tier: &'static str,
    pub links: usize,
    /// Links that carried any byte.
    pub used: usize,
    /// Mean and highest of bytes carried / (capacity x time), over all links of the tier.
    pub mean: f64,
    pub max: f64,
    /// Highest over mean (1 = perfectly even).
    pub imbalance: f64,
    /// The link with the highest utilisation.
    pub busiest: String,
}

/// The flow between hosts with the lowest average rate.
#[derive(Clone, Debug, Serialize)]
pub struct SlowFlow {
    pub src: u32,
    pub dst: u32,
    pub src_host: usize,
    pub dst_host: usize,
    pub bytes: f64,
    pub start_us: f64,
    pub end_us: f64,
    pub gbps: f64,
    /// UDP source ports of its QPs.
    pub ports: Vec<u16>,
    /// The links it crossed, with the share of its bytes on each.
    pub path: Vec<String>,
}

/// When ranks finish: what the next operation's entry times (and so the library's slow-rank
/// report, which averages how late each peer enters) would see.
#[derive(Clone, Debug, Serialize)]
pub struct Lateness {
    /// Latest finish minus earliest.
    pub spread_us: f64,
    /// The rank finishing last and its host.
    pub last_rank: usize,
    pub last_host: usize,
    /// The largest lateness any rank sees of a peer it exchanges data with, and that peer.
    pub max_peer_late_us: f64,
    pub latest_peer: usize,
    pub latest_peer_host: usize,
}

/// One simulated allreduce.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub algo: String,
    pub source: Source,
    pub ranks: usize,
    pub hosts: usize,
    pub racks: usize,
    pub zones: usize,
    pub qps: usize,
    pub hashing: Hashing,
    pub ports: Ports,
    pub placement: Placement,
    pub rack_oversub: f64,
    pub zone_oversub: f64,
    pub seed: u64,
    pub bytes: usize,
    pub time_us: f64,
    /// nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n, GB = 1e9 bytes.
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    /// The library's cost model for the same operation, and its choice.
    pub model_us: Option<f64>,
    pub model_choice: String,
    pub tiers: Vec<TierUse>,
    pub slowest: Option<SlowFlow>,
    pub lateness: Lateness,
    pub flows: usize,
    pub events: usize,
    pub recomputes: usize,
    /// Seconds it took: building the program, and running it.
    pub build_s: f64,
    pub run_s: f64,
}

/// The program of allreduce `algo` of `bytes` on `fabric`.
pub fn program(
    fabric: &Fabric,
    algo: &str,
    bytes: usize,
    source: Source,
) -> Result<Program, String> {
    let algo = schedules::parse_algo(algo)?;
    let n = fabric.ranks();
    let pattern = match source {
        Source::Built => false,
        Source::Pattern => true,
        Source::Auto => algo == "ring" && n > AUTO_PATTERN_RANKS,
    };
    if pattern {
        if algo != "ring" {
            return Err(format!(
                "no grouped pattern for {algo}: only the ring has one (use --schedules built)"
            ));
        }
        return Ok(pattern::ring(&schedules::library_topology(fabric), bytes));
    }
    schedules::built(fabric, algo, bytes)
}

/// Simulates one allreduce of `bytes` by `algo` on `fabric`.
pub fn simulate(
    fabric: &Fabric,
    algo: &str,
    bytes: usize,
    source: Source,
) -> Result<Report, String> {
    let t0 = Instant::now();
    let prog = program(fabric, algo, bytes, source)?;
    let build_s = t0.elapsed().as_secs_f64();
    let mut r = run_program(fabric, &prog, algo, bytes)?;
    r.build_s = build_s;
    Ok(r)
}

/// Runs an already built program of allreduce `algo` of `bytes` on `fabric`. A program depends
/// only on the algorithm, the size and what the library knows of the topology, so sweeps over
/// QPs, hashing, oversubscription or seeds build it once.
pub fn run_program(
    fabric: &Fabric,
    prog: &Program,
    algo: &str,
    bytes: usize,
) -> Result<Report, String> {
    if prog.ranks != fabric.ranks() {
        return Err(format!(
            "the program has {} ranks, the fabric {}",
            prog.ranks,
            fabric.ranks()
        ));
    }
    let net = Network::new(fabric)?;
    let t1 = Instant::now();
    let out = engine::run(&net, prog)?;
    let run_s = t1.elapsed().as_secs_f64();
    Ok(report(&net, prog, &out, algo, bytes, 0.0, run_s))
}

/// Puts an outcome into numbers.
pub fn report(
    net: &Network,
    prog: &Program,
    out: &engine::Outcome,
    algo: &str,
    bytes: usize,
    build_s: f64,
    run_s: f64,
) -> Report {
    let f = &net.fabric;
    let n = prog.ranks;
    let time = out.time;
    let algbw = if time > 0.0 {
        bytes as f64 / time / 1e9
    } else {
        0.0
    };
    let factor = if n > 1 {
        2.0 * (n as f64 - 1.0) / n as f64
    } else {
        0.0
    };
    let tiers = tier_use(net, out, time);
    let slowest = slowest_flow(net, prog, out);
    Report {
        algo: algo.to_string(),
        source: if prog.source == "pattern" {
            Source::Pattern
        } else {
            Source::Built
        },
        ranks: n,
        hosts: f.hosts(),
        racks: f.racks(),
        zones: f.zones,
        qps: f.qps,
        hashing: f.hashing,
        ports: f.ports,
        placement: f.placement,
        rack_oversub: f.rack_oversubscription(),
        zone_oversub: f.zone_oversubscription(),
        seed: f.seed,
        bytes,
        time_us: time * 1e6,
        algbw_gbs: algbw,
        busbw_gbs: algbw * factor,
        model_us: schedules::model_cost(f, algo, bytes).map(|c| c * 1e6),
        model_choice: schedules::model_choice(f, bytes).to_string(),
        tiers,
        slowest,
        lateness: lateness(net, prog, &out.finish),
        flows: prog.flows.len(),
        events: out.events,
        recomputes: out.recomputes,
        build_s,
        run_s,
    }
}

/// Utilisation of every tier that carried traffic.
fn tier_use(net: &Network, out: &engine::Outcome, time: f64) -> Vec<TierUse> {
    Tier::ALL
        .iter()
        .filter_map(|&t| {
            let r = net.tier_links(t);
            if r.is_empty() || time <= 0.0 {
                return None;
            }
            let util: Vec<f64> = r
                .clone()
                .map(|l| out.link_bytes[l] / (net.capacity[l] * time))
                .collect();
            let used = util.iter().filter(|&&u| u > 0.0).count();
            if used == 0 {
                return None;
            }
            let mean = util.iter().sum::<f64>() / util.len() as f64;
            let (arg, max) = util
                .iter()
                .copied()
                .enumerate()
                .fold((0, 0.0f64), |a, (i, u)| if u > a.1 { (i, u) } else { a });
            Some(TierUse {
                tier: t.name(),
                links: util.len(),
                used,
                mean,
                max,
                imbalance: if mean > 0.0 { max / mean } else { 0.0 },
                busiest: net.link_name((r.start + arg) as u32),
            })
        })
        .collect()
}

/// The flow between hosts with the lowest average rate.
fn slowest_flow(net: &Network, prog: &Program, out: &engine::Outcome) -> Option<SlowFlow> {
    prog.flows
        .iter()
        .enumerate()
        .filter(|(_, fl)| {
            fl.bytes > 0.0 && net.spot(fl.src as usize).host != net.spot(fl.dst as usize).host
        })
        .map(|(i, fl)| {
            let t = out.flows[i];
            (i, fl.bytes / (t.sent - t.start).max(1e-15))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, rate)| {
            let fl = &prog.flows[i];
            let fp = &out.footprints[out.footprint_of[i] as usize];
            SlowFlow {
                src: fl.src,
                dst: fl.dst,
                src_host: net.spot(fl.src as usize).host,
                dst_host: net.spot(fl.dst as usize).host,
                bytes: fl.bytes,
                start_us: out.flows[i].start * 1e6,
                end_us: out.flows[i].arrived * 1e6,
                gbps: rate * 8e-9,
                ports: fp.ports.clone(),
                path: fp
                    .links
                    .iter()
                    .map(|&(l, w)| {
                        if (w - 1.0).abs() < 1e-9 {
                            net.link_name(l)
                        } else {
                            format!("{} ({:.0}%)", net.link_name(l), w * 100.0)
                        }
                    })
                    .collect(),
            }
        })
}

fn lateness(net: &Network, prog: &Program, finish: &[f64]) -> Lateness {
    let n = finish.len().max(1);
    let (mut lo, mut hi, mut last) = (f64::INFINITY, 0.0f64, 0);
    for (r, &t) in finish.iter().enumerate() {
        lo = lo.min(t);
        if t > hi {
            hi = t;
            last = r;
        }
    }
    // Every rank compares the peers it exchanges data with to itself.
    let (mut worst, mut peer) = (0.0f64, 0usize);
    for fl in &prog.flows {
        for (me, other) in [(fl.src, fl.dst), (fl.dst, fl.src)] {
            let l = finish[other as usize] - finish[me as usize];
            if l > worst {
                worst = l;
                peer = other as usize;
            }
        }
    }
    Lateness {
        spread_us: if n > 0 && lo.is_finite() {
            (hi - lo) * 1e6
        } else {
            0.0
        },
        last_rank: last,
        last_host: net.spot(last).host,
        max_peer_late_us: worst * 1e6,
        latest_peer: peer,
        latest_peer_host: net.spot(peer).host,
    }
}

/// Bytes per second of the f32 sum reduction kernel (`reduce_inplace`) on `bytes`-byte operands
/// on this machine: the median of a few runs.
pub fn measure_reduce_rate(bytes: usize) -> f64 {
    use ccl_core::reduce::{Order, reduce_inplace};
    use ccl_core::{DataType, ReduceOp};
    let n = bytes / 4;
    let acc_v: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.125).collect();
    let src_v = acc_v.clone();
    let mut acc: Vec<u8> = acc_v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let src: Vec<u8> = src_v.iter().flat_map(|x| x.to_ne_bytes()).collect();
    let mut rates = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        reduce_inplace(
            DataType::F32,
            ReduceOp::Sum,
            &mut acc,
            &src,
            Order::AccFirst,
        );
        rates.push(bytes as f64 / t.elapsed().as_secs_f64().max(1e-9));
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[rates.len() / 2]
}
