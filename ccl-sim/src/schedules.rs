//! The one place the simulator touches the library's algorithms: building every rank's
//! schedule with `ccl_algos::algo::build`, turning the schedules into a [`Program`], asking the
//! cost model (`cost`, `choose`), and describing the fabric as the library's `Topology`.

use std::collections::HashMap;
use std::time::Duration;

use ccl_algos::algo::{self, Algo, Collective};
use ccl_algos::schedule::{Action, Combine, Schedule, Shape};
use ccl_core::ReduceOp;
use ccl_core::topology::Topology;
use ccl_core::transport::TransportProperties;

use crate::fabric::{Fabric, Placement};
use crate::program::{Dep, Flow, Local, Lock, Program};

/// Bytes per element of the simulated buffers (f32).
pub const ELEM: usize = 4;

/// The allreduce algorithms the fabric model runs, by name: all but those in host memory
/// (`shm`, which needs every rank on one host and moves nothing over the fabric, and
/// `hiershm`, whose host steps the model does not price).
pub fn allreduce_algos() -> Vec<&'static str> {
    Collective::AllReduce
        .algos()
        .iter()
        .filter(|&&a| !matches!(a, Algo::Shm | Algo::HierShm))
        .map(|a| a.name())
        .collect()
}

/// Parses an allreduce algorithm name (`ring`, `tree`, `hd`, `hier`, `rd`).
pub fn parse_algo(name: &str) -> Result<&'static str, String> {
    let a = name.parse::<Algo>().map_err(|e| e.to_string())?;
    if !Collective::AllReduce.algos().contains(&a) {
        return Err(format!("allreduce has no {a} algorithm"));
    }
    if matches!(a, Algo::Shm | Algo::HierShm) {
        return Err(format!(
            "the fabric model does not run the host-memory algorithms ({a})"
        ));
    }
    Ok(a.name())
}

fn algo(name: &str) -> Result<Algo, String> {
    name.parse::<Algo>().map_err(|e| e.to_string())
}

/// What the library would be told about the fabric: with [`Placement::Racks`] a topology file
/// placing every rank in its host, rack and zone with the link speeds; with
/// [`Placement::Scattered`] only the host names (one rack, one zone).
pub fn library_topology(f: &Fabric) -> Topology {
    let g = |x: f64| x * 1e9 / 8.0;
    match f.placement {
        Placement::Racks => Topology::grid(
            f.zones,
            f.racks_per_zone,
            f.hosts_per_rack,
            f.ranks_per_host,
        )
        .with_bandwidth(
            Some(g(f.nic_gbps * f.nics_per_host as f64)),
            (f.racks() > 1).then(|| g(f.rack_uplink_gbps * f.spines as f64)),
            (f.zones > 1).then(|| g(f.zone_uplink_gbps * (f.spines * f.aggs) as f64)),
        ),
        Placement::Scattered => Topology::grid(1, 1, f.hosts(), f.ranks_per_host).with_bandwidth(
            Some(g(f.nic_gbps * f.nics_per_host as f64)),
            None,
            None,
        ),
    }
}

/// What a transport on this fabric would report to the cost model: one step's latency (the
/// per-op overhead plus a path across the zone) and one connection's bandwidth (a NIC's).
pub fn transport_properties(f: &Fabric) -> TransportProperties {
    let hops = if f.zones > 1 {
        6.0
    } else if f.racks() > 1 {
        4.0
    } else {
        2.0
    };
    let nic = f.nic_gbps * 1e9 / 8.0;
    TransportProperties {
        latency: Duration::from_secs_f64(f.op_overhead + hops * f.hop_latency),
        bandwidth: f.conn_bps.map_or(nic, |c| c.min(nic)),
        spin: Duration::ZERO,
        host_memory: false,
    }
}

/// The cost model's estimate of one allreduce of `bytes` by `name` on this fabric (seconds).
pub fn model_cost(f: &Fabric, name: &str, bytes: usize) -> Option<f64> {
    let topo = library_topology(f);
    algo::cost(
        Collective::AllReduce,
        algo(name).ok()?,
        topo.size(),
        bytes,
        &transport_properties(f),
        &topo,
    )
}

/// The algorithm the library would pick for an allreduce of `bytes` on this fabric.
pub fn model_choice(f: &Fabric, bytes: usize) -> &'static str {
    let topo = library_topology(f);
    algo::choose(
        Collective::AllReduce,
        topo.size(),
        bytes,
        &transport_properties(f),
        &topo,
    )
    .name()
}

/// Every rank's schedule of an in-place f32 sum allreduce of `bytes`, built in parallel.
fn build_all(name: &str, topo: &Topology, bytes: usize) -> Result<Vec<Schedule>, String> {
    let a = algo(name)?;
    let n = topo.size();
    let count = bytes / ELEM;
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(n.max(1));
    let per = n.div_ceil(threads);
    let parts: Vec<Result<Vec<Schedule>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t * per..((t + 1) * per).min(n))
                        .map(|r| {
                            let shape = Shape::new(r, n, count, true, ReduceOp::Sum);
                            algo::build(Collective::AllReduce, a, &shape, topo)
                                .map_err(|e| e.to_string())
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a schedule builder panicked".into()))
            })
            .collect()
    });
    let mut all = Vec::with_capacity(n);
    for p in parts {
        all.extend(p?);
    }
    Ok(all)
}

#[derive(Clone, Copy)]
enum Ref {
    Send(u32),
    Recv(u32),
    Local(u32),
}

/// The library's own schedules of allreduce `name` over the fabric's ranks, one flow per send.
pub fn built(f: &Fabric, name: &str, bytes: usize) -> Result<Program, String> {
    let topo = library_topology(f);
    let scheds = build_all(name, &topo, bytes)?;
    to_program(&scheds)
}

/// Turns every rank's schedule into a program: each send matched with the receive at its peer
/// that takes the same place in the wire order, dependencies and streams carried over, the
/// per-peer wire order and each rank's order of local ops made explicit. Three passes, each
/// needing the ids the one before assigned.
pub fn to_program(scheds: &[Schedule]) -> Result<Program, String> {
    let mut p = Program {
        ranks: scheds.len(),
        source: "built",
        ..Program::default()
    };
    let (mut refs, conn) = sends_and_locals(scheds, &mut p)?;
    match_receives(scheds, &mut p, &mut refs, &conn)?;
    dependencies(scheds, &mut p, &refs);
    for f in &mut p.flows {
        f.deps.sort_unstable_by_key(|d| match *d {
            Dep::Sent(x) => (0, x),
            Dep::Arrived(x) => (1, x),
            Dep::Local(x) => (2, x),
        });
        f.deps.dedup();
    }
    p.check()?;
    Ok(p)
}

/// Messages each rank sends each peer, in wire order: `(from, to)` -> flows.
type Connections = HashMap<(u32, u32), Vec<u32>>;

/// The first pass: a flow for every send and a local op for every copy or reduction; receives
/// are left for [`match_receives`].
fn sends_and_locals(
    scheds: &[Schedule],
    p: &mut Program,
) -> Result<(Vec<Vec<Ref>>, Connections), String> {
    let n = scheds.len();
    let mut refs: Vec<Vec<Ref>> = Vec::with_capacity(n);
    let mut conn: Connections = HashMap::new();
    for (r, sc) in scheds.iter().enumerate() {
        if sc.uses_host() {
            return Err(format!(
                "the {} schedule of rank {r} works in host memory, which the fabric model does not model",
                sc.algo
            ));
        }
        let mut mine = Vec::with_capacity(sc.ops.len());
        for op in &sc.ops {
            let bytes = (op.action.len() * ELEM) as f64;
            mine.push(match op.action {
                Action::Send { peer, .. } => {
                    let id = p.flows.len() as u32;
                    p.flows.push(Flow {
                        src: r as u32,
                        dst: peer as u32,
                        bytes,
                        ops: 1,
                        deps: Vec::new(),
                        locks: Vec::new(),
                        reduce: 0.0,
                        step: op.step,
                    });
                    conn.entry((r as u32, peer as u32)).or_default().push(id);
                    Ref::Send(id)
                }
                Action::Recv { .. } => Ref::Recv(u32::MAX),
                Action::Post | Action::WaitPosts { .. } => {
                    unreachable!("host memory schedules are refused above")
                }
                Action::Copy { .. }
                | Action::Reduce { .. }
                | Action::ReduceInto { .. }
                | Action::FinishAvg { .. } => {
                    p.locals.push(Local {
                        rank: r as u32,
                        bytes,
                        reduce: !matches!(op.action, Action::Copy { .. }),
                        deps: Vec::new(),
                    });
                    Ref::Local(p.locals.len() as u32 - 1)
                }
            });
        }
        refs.push(mine);
    }
    Ok((refs, conn))
}

/// The second pass: the k-th receive from a peer takes the peer's k-th send here, and every
/// send must be received.
fn match_receives(
    scheds: &[Schedule],
    p: &mut Program,
    refs: &mut [Vec<Ref>],
    conn: &Connections,
) -> Result<(), String> {
    let mut taken: HashMap<(u32, u32), usize> = HashMap::new();
    for (r, sc) in scheds.iter().enumerate() {
        for (id, op) in sc.ops.iter().enumerate() {
            if let Action::Recv { peer, combine, .. } = op.action {
                let key = (peer as u32, r as u32);
                let k = taken.entry(key).or_default();
                let f = conn
                    .get(&key)
                    .and_then(|v| v.get(*k))
                    .copied()
                    .ok_or_else(|| {
                        format!("rank {r} receives more from rank {peer} than rank {peer} sends it")
                    })?;
                *k += 1;
                let fl = &mut p.flows[f as usize];
                if fl.bytes != (op.action.len() * ELEM) as f64 {
                    return Err(format!(
                        "rank {peer} sends {} bytes where rank {r} receives {}",
                        fl.bytes,
                        op.action.len() * ELEM
                    ));
                }
                if matches!(combine, Combine::Reduce { .. }) {
                    fl.reduce = 1.0;
                }
                refs[r][id] = Ref::Recv(f);
            }
        }
    }
    for (key, v) in conn {
        let got = taken.get(key).copied().unwrap_or(0);
        if got != v.len() {
            return Err(format!(
                "rank {} sends {} messages to rank {}, which receives {got}",
                key.0,
                v.len(),
                key.1
            ));
        }
    }
    Ok(())
}

/// The third pass: each op's dependencies and streams, the per-peer wire order of sends and
/// each rank's order of local ops.
fn dependencies(scheds: &[Schedule], p: &mut Program, refs: &[Vec<Ref>]) {
    let dep = |r: Ref| match r {
        Ref::Send(f) => Dep::Sent(f),
        Ref::Recv(f) => Dep::Arrived(f),
        Ref::Local(l) => Dep::Local(l),
    };
    for (r, sc) in scheds.iter().enumerate() {
        let mut last_local: Option<u32> = None;
        let mut last_send: HashMap<usize, u32> = HashMap::new();
        for (id, op) in sc.ops.iter().enumerate() {
            let mut deps: Vec<Dep> = op.deps.iter().map(|&d| dep(refs[r][d])).collect();
            let mut lock = None;
            if let Some(s) = op.stream_from {
                match refs[r][s] {
                    Ref::Recv(g) => lock = Some(g),
                    other => deps.push(dep(other)),
                }
            }
            match (refs[r][id], op.action) {
                (Ref::Send(f), Action::Send { peer, .. }) => {
                    if let Some(prev) = last_send.insert(peer, f) {
                        deps.push(Dep::Sent(prev));
                    }
                    let fl = &mut p.flows[f as usize];
                    fl.deps.extend(deps);
                    fl.locks.extend(lock.map(|flow| Lock {
                        flow,
                        head_start: false,
                    }));
                }
                (Ref::Recv(f), _) => {
                    let fl = &mut p.flows[f as usize];
                    fl.deps.extend(deps);
                    fl.locks.extend(lock.map(|flow| Lock {
                        flow,
                        head_start: false,
                    }));
                }
                (Ref::Local(l), _) => {
                    deps.extend(last_local.map(Dep::Local));
                    p.locals[l as usize].deps = deps;
                    last_local = Some(l);
                }
                _ => unreachable!("refs follow the ops"),
            }
        }
    }
}
