//! A symbolic executor: runs the schedules of all ranks together without a network and checks
//! what they compute.
//!
//! Every element holds a symbolic value: the set of ranks whose input it contains (a bit mask;
//! reducing two values that share a rank is an error: that contribution would count twice), a
//! hash of the expression that produced it (reduction order included, so equal hashes mean
//! bit-identical results), and whether the `Avg` division was applied (only to a complete sum,
//! exactly once).
//!
//! Ops run in a random order among those the real executor could run (dependencies done, streams
//! done, head of their per-peer queue, data present), and each one is checked against the ops
//! before it in program order that have not run yet: reading data a previous op still has to
//! write, or overwriting data a previous op still has to read or write, is a hazard. Many seeds
//! make a check for all the interleavings that matter.

use std::collections::VecDeque;

use ccl_core::ReduceOp;

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule};

/// Symbolic value of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    /// Ranks whose input this contains (up to 64 ranks).
    pub mask: u64,
    /// Hash of the expression that produced it.
    pub expr: u64,
    /// How many times the average division was applied.
    pub divided: u8,
}

impl Value {
    /// Rank `r`'s input for element `i`.
    pub fn input(r: usize, i: usize) -> Value {
        Value {
            mask: 1 << r,
            expr: mix(0x1234_5678 ^ r as u64, i as u64),
            divided: 0,
        }
    }

    fn combine(a: Value, b: Value) -> Result<Value, String> {
        if a.mask & b.mask != 0 {
            return Err(format!("ranks {:#x} contributed twice", a.mask & b.mask));
        }
        if a.divided != 0 || b.divided != 0 {
            return Err("reduced a value after dividing it".into());
        }
        Ok(Value {
            mask: a.mask | b.mask,
            expr: mix(a.expr, b.expr),
            divided: 0,
        })
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut h = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.rotate_left(29);
    h ^= h >> 31;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^ (h >> 27)
}

type Slot = Option<Value>;

struct RankState {
    send: Vec<Slot>,
    recv: Vec<Slot>,
    scratch: Vec<Slot>,
    executed: Vec<bool>,
    send_cur: Vec<usize>,
    recv_cur: Vec<usize>,
    local_cur: usize,
}

impl RankState {
    fn buf(&self, b: Buf) -> &Vec<Slot> {
        match b {
            Buf::Send => &self.send,
            Buf::Recv => &self.recv,
            Buf::Scratch => &self.scratch,
        }
    }

    fn buf_mut(&mut self, b: Buf) -> &mut Vec<Slot> {
        match b {
            Buf::Send => &mut self.send,
            Buf::Recv => &mut self.recv,
            Buf::Scratch => &mut self.scratch,
        }
    }

    fn read(&self, r: &Region) -> Vec<Slot> {
        self.buf(r.buf)[r.off..r.end()].to_vec()
    }
}

/// Regions an op reads and writes.
fn access(a: &Action) -> (Vec<Region>, Vec<Region>) {
    match *a {
        Action::Send { src, .. } => (vec![src], vec![]),
        Action::Recv { dst, combine, .. } => match combine {
            Combine::Copy => (vec![], vec![dst]),
            Combine::Reduce { with, .. } => (vec![with.unwrap_or(dst)], vec![dst]),
        },
        Action::Copy { src, dst } => (vec![src], vec![dst]),
        Action::Reduce { dst, src, .. } => (vec![src, dst], vec![dst]),
        Action::FinishAvg { region } => (vec![region], vec![region]),
    }
}

/// The expected contents of each rank's receive buffer at the end.
pub struct Check {
    /// What each rank's receive buffer must hold at the end, element by element: the set of
    /// contributing ranks. `None` = don't care.
    pub expect_mask: Box<dyn Fn(usize, usize) -> Option<u64>>,
    /// Whether all ranks must end with bit-identical receive buffers.
    pub identical: bool,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check")
            .field("identical", &self.identical)
            .finish_non_exhaustive()
    }
}

/// Runs `scheds[r]` for every rank with `seed` choosing the interleaving. `recv_len` is the
/// receive buffer size and `send_len` the send buffer size in elements; `in_place` makes the
/// receive buffer hold the input.
#[allow(clippy::too_many_arguments)]
pub fn simulate(
    scheds: &[Schedule],
    send_len: usize,
    recv_len: usize,
    in_place: bool,
    op: ReduceOp,
    check: &Check,
    seed: u64,
) -> Result<Vec<Vec<Slot>>, String> {
    let n = scheds.len();
    let mut states: Vec<RankState> = scheds
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let input: Vec<Slot> = (0..send_len).map(|i| Some(Value::input(r, i))).collect();
            let (send, recv) = if in_place {
                let mut recv = input;
                recv.resize(recv_len, None);
                (Vec::new(), recv)
            } else {
                (input, vec![None; recv_len])
            };
            RankState {
                send,
                recv,
                scratch: vec![None; s.scratch],
                executed: vec![false; s.ops.len()],
                send_cur: vec![0; s.peers.len()],
                recv_cur: vec![0; s.peers.len()],
                local_cur: 0,
            }
        })
        .collect();
    // channels[src][dst]: messages in flight.
    let mut channels: Vec<Vec<VecDeque<Vec<Slot>>>> = vec![vec![VecDeque::new(); n]; n];
    let mut rng = seed | 1;
    let mut next_rand = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    loop {
        // Collect ready ops.
        let mut ready: Vec<(usize, OpId)> = Vec::new();
        for (r, s) in scheds.iter().enumerate() {
            let st = &states[r];
            let deps_ok = |id: OpId| s.ops[id].deps.iter().all(|&d| st.executed[d]);
            if let Some(&id) = s.locals.get(st.local_cur)
                && deps_ok(id)
            {
                ready.push((r, id));
            }
            for (pi, p) in s.peers.iter().enumerate() {
                if p.peer >= n || p.peer == r {
                    return Err(format!("rank {r}: bad peer {}", p.peer));
                }
                if let Some(&id) = p.sends.get(st.send_cur[pi])
                    && deps_ok(id)
                    && s.ops[id].stream_from.is_none_or(|x| st.executed[x])
                {
                    ready.push((r, id));
                }
                if let Some(&id) = p.recvs.get(st.recv_cur[pi])
                    && deps_ok(id)
                    && s.ops[id].stream_from.is_none_or(|x| st.executed[x])
                    && !channels[p.peer][r].is_empty()
                {
                    ready.push((r, id));
                }
            }
        }
        if ready.is_empty() {
            break;
        }
        let (r, id) = ready[(next_rand() % ready.len() as u64) as usize];
        let s = &scheds[r];
        // Hazards against earlier ops that have not run.
        let (reads, writes) = access(&s.ops[id].action);
        for e in 0..id {
            if states[r].executed[e] {
                continue;
            }
            let (er, ew) = access(&s.ops[e].action);
            let hit = |a: &[Region], b: &[Region]| {
                a.iter()
                    .any(|x| b.iter().any(|y| x.overlaps(y) && x.len > 0))
            };
            if hit(&ew, &reads) || hit(&er, &writes) || hit(&ew, &writes) {
                return Err(format!(
                    "rank {r}: op {id} ({:?}) ran before earlier op {e} ({:?}) touching the same data",
                    s.ops[id].action, s.ops[e].action
                ));
            }
        }
        let st = &mut states[r];
        match s.ops[id].action {
            Action::Send { peer, src } => {
                channels[r][peer].push_back(st.read(&src));
                let pi = s
                    .peers
                    .iter()
                    .position(|p| p.peer == peer)
                    .expect("peer queue");
                st.send_cur[pi] += 1;
            }
            Action::Recv { peer, dst, combine } => {
                let msg = channels[peer][r].pop_front().expect("ready");
                if msg.len() != dst.len {
                    return Err(format!(
                        "rank {r}: op {id} expects {} elements from {peer}, the message has {}",
                        dst.len,
                        msg.len()
                    ));
                }
                let out: Vec<Slot> = match combine {
                    Combine::Copy => msg,
                    Combine::Reduce {
                        with,
                        incoming_first,
                        finish_avg,
                    } => {
                        let mine = st.read(&with.unwrap_or(dst));
                        let mut out = Vec::with_capacity(msg.len());
                        for (i, (a, b)) in msg.iter().zip(&mine).enumerate() {
                            let (Some(a), Some(b)) = (a, b) else {
                                return Err(format!(
                                    "rank {r}: op {id} reduces an uninitialised element {i}"
                                ));
                            };
                            let mut v = if incoming_first {
                                Value::combine(*a, *b)
                            } else {
                                Value::combine(*b, *a)
                            }
                            .map_err(|e| format!("rank {r}: op {id} element {i}: {e}"))?;
                            if finish_avg {
                                v = divide(v, n).map_err(|e| format!("rank {r}: op {id}: {e}"))?;
                            }
                            out.push(Some(v));
                        }
                        out
                    }
                };
                st.buf_mut(dst.buf)[dst.off..dst.end()].copy_from_slice(&out);
                let pi = s
                    .peers
                    .iter()
                    .position(|p| p.peer == peer)
                    .expect("peer queue");
                st.recv_cur[pi] += 1;
            }
            Action::Copy { src, dst } => {
                let v = st.read(&src);
                st.buf_mut(dst.buf)[dst.off..dst.end()].copy_from_slice(&v);
                st.local_cur += 1;
            }
            Action::Reduce {
                dst,
                src,
                src_first,
            } => {
                let (a, b) = (st.read(&dst), st.read(&src));
                let mut out = Vec::with_capacity(a.len());
                for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                    let (Some(x), Some(y)) = (x, y) else {
                        return Err(format!(
                            "rank {r}: op {id} reduces an uninitialised element {i}"
                        ));
                    };
                    let v = if src_first {
                        Value::combine(*y, *x)
                    } else {
                        Value::combine(*x, *y)
                    }
                    .map_err(|e| format!("rank {r}: op {id}: {e}"))?;
                    out.push(Some(v));
                }
                st.buf_mut(dst.buf)[dst.off..dst.end()].copy_from_slice(&out);
                st.local_cur += 1;
            }
            Action::FinishAvg { region } => {
                if op == ReduceOp::Avg {
                    for i in region.off..region.end() {
                        let v = st.buf(region.buf)[i].ok_or_else(|| {
                            format!("rank {r}: op {id} divides an uninitialised element")
                        })?;
                        st.buf_mut(region.buf)[i] =
                            Some(divide(v, n).map_err(|e| format!("rank {r}: op {id}: {e}"))?);
                    }
                }
                st.local_cur += 1;
            }
        }
        st.executed[id] = true;
    }
    // Everything must have run and every message been consumed.
    for (r, st) in states.iter().enumerate() {
        if let Some(id) = st.executed.iter().position(|e| !e) {
            return Err(format!(
                "rank {r}: op {id} ({:?}) never ran (deadlock)",
                scheds[r].ops[id].action
            ));
        }
        for (d, ch) in channels[r].iter().enumerate() {
            if !ch.is_empty() {
                return Err(format!(
                    "rank {r} sent {} message(s) to rank {d} that were never received",
                    ch.len()
                ));
            }
        }
    }
    for (r, st) in states.iter().enumerate() {
        for (i, v) in st.recv.iter().enumerate() {
            if let Some(m) = (check.expect_mask)(r, i) {
                let v = v.ok_or_else(|| {
                    format!("rank {r}: element {i} of the result was never written")
                })?;
                if v.mask != m {
                    return Err(format!(
                        "rank {r}: element {i} holds ranks {:#x}, expected {m:#x}",
                        v.mask
                    ));
                }
                // Dividing by a world size of one is exact, so schedules may skip it.
                if op == ReduceOp::Avg && v.divided != 1 && !(n == 1 && v.divided == 0) {
                    return Err(format!("rank {r}: element {i} divided {} times", v.divided));
                }
            }
        }
    }
    if check.identical {
        for r in 1..n {
            if states[r].recv != states[0].recv {
                let i = states[r]
                    .recv
                    .iter()
                    .zip(&states[0].recv)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(format!(
                    "rank {r} and rank 0 differ at element {i} (not bit-identical)"
                ));
            }
        }
    }
    Ok(states.into_iter().map(|s| s.recv).collect())
}

fn divide(v: Value, n: usize) -> Result<Value, String> {
    let full = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
    if v.mask != full {
        return Err(format!("divided a partial sum (ranks {:#x})", v.mask));
    }
    if v.divided != 0 {
        return Err("divided twice".into());
    }
    Ok(Value {
        divided: 1,
        expr: mix(v.expr, 0xa5a5),
        ..v
    })
}
