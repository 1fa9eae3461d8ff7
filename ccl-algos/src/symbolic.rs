//! A symbolic executor: runs the schedules of all ranks together without a network and checks
//! what they compute.
//!
//! Every element holds a symbolic value: the set of ranks whose input it contains (a bit mask;
//! reducing two values that share a rank is an error: that contribution would count twice), the
//! element index it belongs to (reducing element 3 of one rank with element 5 of another is an
//! error), a hash of the expression that produced it (reduction order included, so equal hashes
//! mean bit-identical results), and whether the `Avg` division was applied (only to a complete
//! sum, exactly once).
//!
//! Ops run in a random order among those the real executor could run (dependencies done, streams
//! done, head of their per-peer queue, data present), and each one is checked against the ops
//! before it in program order that have not run yet: reading data a previous op still has to
//! write, or overwriting data a previous op still has to read or write, is a hazard. Many seeds
//! make a check for all the interleavings that matter.
//!
//! In **rendezvous** mode a send happens only together with its matching receive (no buffering
//! at all). Transports buffer a little, but a large message behaves like this: a schedule that
//! deadlocks here can deadlock on a real network once the socket buffers fill.

use std::collections::{BTreeMap, VecDeque};

use ccl_core::ReduceOp;

use crate::schedule::{Action, Buf, Combine, OpId, Region, Schedule, access};

mod checks;
mod host_model;

use checks::{check_hazards, check_results};

/// Symbolic value of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    /// Ranks whose input this contains (up to 64 ranks).
    pub mask: u64,
    /// The input element index this value derives from.
    pub idx: u32,
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
            idx: i as u32,
            expr: mix(0x1234_5678 ^ r as u64, i as u64),
            divided: 0,
        }
    }

    fn combine(a: Value, b: Value) -> Result<Value, String> {
        if a.mask & b.mask != 0 {
            return Err(format!("ranks {:#x} contributed twice", a.mask & b.mask));
        }
        if a.idx != b.idx {
            return Err(format!("reduced element {} with element {}", a.idx, b.idx));
        }
        if a.divided != 0 || b.divided != 0 {
            return Err("reduced a value after dividing it".into());
        }
        Ok(Value {
            mask: a.mask | b.mask,
            idx: a.idx,
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

/// An element: `None` until written.
pub type Slot = Option<Value>;

/// Rank `r`'s inputs for elements `0..len`.
pub fn inputs(r: usize, len: usize) -> Vec<Slot> {
    (0..len).map(|i| Some(Value::input(r, i))).collect()
}

/// What one element of a result must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly this value (a copy of some rank's input).
    Exact(Value),
    /// The reduction of input element `idx` over the ranks in `mask`.
    Reduced { mask: u64, idx: u32 },
    /// Never written (the collective must leave it alone).
    Unwritten,
}

/// The mask of all `n` ranks.
pub fn all_ranks(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

/// Builds rank `r`'s send and receive buffers before the collective.
pub type InitFn = Box<dyn Fn(usize) -> (Vec<Slot>, Vec<Slot>)>;

/// An op ready to run: rank, op, and in rendezvous mode the receive a send pairs with.
type Ready = (usize, OpId, Option<(usize, OpId)>);

/// The collective being checked.
pub struct Setup {
    /// Rank `r`'s send and receive buffers before the collective.
    pub init: InitFn,
    /// What element `i` of rank `r`'s receive buffer must hold at the end (`None`: anything).
    pub expect: Box<dyn Fn(usize, usize) -> Option<Expect>>,
    /// Whether all ranks must end with bit-identical receive buffers.
    pub identical: bool,
    pub op: ReduceOp,
    /// No buffering: a send happens together with its receive.
    pub rendezvous: bool,
    /// Sizes of extra buffers (`Buf::Extra(i)`) per rank, all initialised with inputs.
    pub extra: Vec<usize>,
    /// Every rank must finish having heard, directly or through others, from every rank (what a
    /// barrier guarantees, and any collective whose result depends on all inputs).
    pub causal: bool,
}

impl Setup {
    /// Allreduce of `count` elements over `n` ranks: every element of every rank's result is
    /// the reduction of all inputs, bit-identical across ranks, and (for a count above 0) every
    /// rank has heard from every other.
    pub fn allreduce(
        n: usize,
        count: usize,
        in_place: bool,
        op: ReduceOp,
        rendezvous: bool,
    ) -> Setup {
        Setup {
            init: Box::new(move |r| {
                if in_place {
                    (Vec::new(), inputs(r, count))
                } else {
                    (inputs(r, count), vec![None; count])
                }
            }),
            expect: Box::new(move |_, i| {
                Some(Expect::Reduced {
                    mask: all_ranks(n),
                    idx: i as u32,
                })
            }),
            identical: true,
            op,
            rendezvous,
            extra: Vec::new(),
            // A count of 0 moves no data, so it synchronises nothing.
            causal: count > 0,
        }
    }
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("identical", &self.identical)
            .field("op", &self.op)
            .field("rendezvous", &self.rendezvous)
            .finish_non_exhaustive()
    }
}

/// Regions an op reads and writes.
type Access = (Vec<Region>, Vec<Region>);

/// A message in flight: the ranks its sender had heard from, and the data.
type Message = (u64, Vec<Slot>);

struct RankState {
    bufs: BTreeMap<Buf, Vec<Slot>>,
    /// Ranks this rank has heard from, directly or through others.
    heard: u64,
    executed: Vec<bool>,
    /// `access()` of every op, computed once.
    access: Vec<Access>,
    /// Every op before this index has run.
    first_pending: usize,
    send_cur: Vec<usize>,
    recv_cur: Vec<usize>,
    local_cur: usize,
}

impl RankState {
    /// Rank `r`'s state before schedule `s` runs: its buffers as `setup` initialises them.
    fn new(r: usize, s: &Schedule, setup: &Setup) -> RankState {
        let (send, recv) = (setup.init)(r);
        let mut bufs = BTreeMap::new();
        bufs.insert(Buf::Send, send);
        bufs.insert(Buf::Recv, recv);
        bufs.insert(Buf::Scratch, vec![None; s.scratch]);
        for (i, &len) in setup.extra.iter().enumerate() {
            bufs.insert(Buf::Extra(i as u16), inputs(r, len));
        }
        RankState {
            bufs,
            heard: 1 << r,
            executed: vec![false; s.ops.len()],
            access: s.ops.iter().map(|o| access(&o.action)).collect(),
            first_pending: 0,
            send_cur: vec![0; s.peers.len()],
            recv_cur: vec![0; s.peers.len()],
            local_cur: 0,
        }
    }

    fn read(&self, r: &Region) -> Result<Vec<Slot>, String> {
        self.bufs
            .get(&r.buf)
            .and_then(|b| b.get(r.off..r.end()))
            .map(|s| s.to_vec())
            .ok_or_else(|| format!("{r:?} is outside its buffer"))
    }

    fn write(&mut self, r: &Region, v: &[Slot]) -> Result<(), String> {
        self.bufs
            .get_mut(&r.buf)
            .and_then(|b| b.get_mut(r.off..r.end()))
            .ok_or_else(|| format!("{r:?} is outside its buffer"))?
            .copy_from_slice(v);
        Ok(())
    }
}

/// Reduces `incoming` with `mine` element by element (lower operand first as the op says).
fn reduce_values(
    incoming: &[Slot],
    mine: &[Slot],
    incoming_first: bool,
) -> Result<Vec<Slot>, String> {
    incoming
        .iter()
        .zip(mine)
        .enumerate()
        .map(|(i, (a, b))| {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(format!("element {i} is reduced before it was written"));
            };
            let v = if incoming_first {
                Value::combine(*a, *b)
            } else {
                Value::combine(*b, *a)
            };
            v.map(Some).map_err(|e| format!("element {i}: {e}"))
        })
        .collect()
}

fn divide(v: Value, n: usize) -> Result<Value, String> {
    if v.mask != all_ranks(n) {
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

/// Runs `scheds[r]` for every rank with `seed` choosing the interleaving; returns every rank's
/// receive buffer.
pub fn simulate(scheds: &[Schedule], setup: &Setup, seed: u64) -> Result<Vec<Vec<Slot>>, String> {
    simulate_hosts(scheds, setup, &[(0..scheds.len()).collect()], seed)
}

/// Schedule `s` run twice in a row, as two operations (the second's waits in host memory count
/// on from the first's posts): to check the hand-over between operations.
pub fn twice(s: &Schedule) -> Schedule {
    crate::host::in_sequence(&[s.clone(), s.clone()], false)
}

/// [`simulate`] with the ranks on several hosts: each of `hosts` (ranks, ascending) shares its
/// own host memory, where host rank `i` is the `i`-th of them. A rank reads only the slots of
/// its own host and its waits count only its own host's posts.
pub fn simulate_hosts(
    scheds: &[Schedule],
    setup: &Setup,
    hosts: &[Vec<usize>],
    seed: u64,
) -> Result<Vec<Vec<Slot>>, String> {
    let mut sim = Sim::new(scheds, setup, hosts, seed)?;
    sim.run()?;
    sim.check_finished()?;
    let results = sim.results();
    check_results(&results, setup)?;
    Ok(results)
}

/// All ranks' state during one simulation.
struct Sim<'a> {
    scheds: &'a [Schedule],
    setup: &'a Setup,
    states: Vec<RankState>,
    /// `channels[src][dst]`: messages in flight.
    channels: Vec<Vec<VecDeque<Message>>>,
    /// `peer_index[r][p]`: position of peer `p` in rank `r`'s peer list.
    peer_index: Vec<Vec<Option<usize>>>,
    /// Each host's memory, when its ranks' schedules use it.
    hosts: Vec<HostModel>,
    /// Each rank's host and its host rank there.
    place: Vec<(usize, usize)>,
    /// Each host's ranks, by host rank.
    members: Vec<Vec<usize>>,
    /// Some schedule reads or writes other ranks' buffers in place ([`Schedule::direct`]): then
    /// every access to a send or receive buffer is checked against the posts and waits.
    direct: bool,
    rng: u64,
}

/// Who last wrote one element of a rank's buffer and who read it since, with their post counts
/// then (for buffers other ranks access in place).
#[derive(Clone, Debug)]
struct Touch {
    writer: (usize, u64),
    readers: Vec<(usize, u64)>,
}

/// The memory the ranks of one host share, with what orders its reads and writes: posts and the
/// waits that saw them.
#[derive(Default)]
struct HostModel {
    /// Every rank's slot.
    slots: Vec<Vec<Slot>>,
    /// Times each rank has posted, and the ranks it had heard from at its last post.
    posted: Vec<u64>,
    post_heard: Vec<u64>,
    /// `seen[r][i]`: posts of rank `i` that rank `r`'s waits guarantee happened.
    seen: Vec<Vec<u64>>,
    /// `written[i][e]`: rank `i`'s post count when it last wrote element `e` of its slot (the
    /// write is published by its next post).
    written: Vec<Vec<u64>>,
    /// `reads[i][e]`: who read element `e` of rank `i`'s slot since it was written, and their
    /// post count then (the read is known done once they post again).
    reads: Vec<Vec<Vec<(usize, u64)>>>,
    /// Accesses to the host ranks' own buffers, by (owner, buffer), when schedules access them
    /// in place; the owner's input counts as written by it before its first post.
    touched: BTreeMap<(usize, Buf), Vec<Touch>>,
}

impl<'a> Sim<'a> {
    fn new(
        scheds: &'a [Schedule],
        setup: &'a Setup,
        hosts: &[Vec<usize>],
        seed: u64,
    ) -> Result<Sim<'a>, String> {
        let n = scheds.len();
        let mut place = vec![None; n];
        for (g, ranks) in hosts.iter().enumerate() {
            for (i, &r) in ranks.iter().enumerate() {
                match place.get_mut(r) {
                    Some(p @ None) => *p = Some((g, i)),
                    _ => return Err(format!("host {g}: rank {r} is out of range or twice")),
                }
            }
        }
        let place: Vec<(usize, usize)> = place
            .into_iter()
            .enumerate()
            .map(|(r, p)| p.ok_or_else(|| format!("rank {r} is on no host")))
            .collect::<Result<_, _>>()?;
        for (r, s) in scheds.iter().enumerate() {
            if let Some(p) = s.peers.iter().find(|p| p.peer >= n || p.peer == r) {
                return Err(format!("rank {r}: bad peer {}", p.peer));
            }
        }
        let states = scheds
            .iter()
            .enumerate()
            .map(|(r, s)| RankState::new(r, s, setup))
            .collect();
        let peer_index = scheds
            .iter()
            .map(|s| {
                let mut v = vec![None; n];
                for (pi, p) in s.peers.iter().enumerate() {
                    v[p.peer] = Some(pi);
                }
                v
            })
            .collect();
        let models = hosts
            .iter()
            .map(|g| {
                let slot = g.iter().map(|&r| scheds[r].host_slot).max().unwrap_or(0);
                HostModel::new(g.len(), slot)
            })
            .collect();
        Ok(Sim {
            scheds,
            setup,
            states,
            channels: vec![vec![VecDeque::new(); n]; n],
            peer_index,
            hosts: models,
            place,
            members: hosts.to_vec(),
            direct: scheds.iter().any(|s| s.direct),
            rng: seed | 1,
        })
    }

    fn next_rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The receive at the head of rank `dst`'s queue from `src`, if ready but for its data.
    fn recv_head(&self, dst: usize, src: usize) -> Option<OpId> {
        let s = &self.scheds[dst];
        let st = &self.states[dst];
        let pi = self.peer_index[dst][src]?;
        let &id = s.peers[pi].recvs.get(st.recv_cur[pi])?;
        let ok = s.ops[id].deps.iter().all(|&d| st.executed[d])
            && s.ops[id].stream_from.is_none_or(|x| st.executed[x]);
        ok.then_some(id)
    }

    /// What rank `r` can run now. It depends only on `r`'s own state, the channels into `r`,
    /// and in rendezvous mode on the receive heads of `r`'s peers; so after an op runs only the
    /// ranks it touched (and, in rendezvous mode, their peers) need a new look.
    fn ready_of(&self, r: usize, out: &mut Vec<Ready>) {
        out.clear();
        let s = &self.scheds[r];
        let st = &self.states[r];
        let deps_ok = |id: OpId| s.ops[id].deps.iter().all(|&d| st.executed[d]);
        if let Some(&id) = s.locals.get(st.local_cur)
            && deps_ok(id)
            && match s.ops[id].action {
                Action::WaitPosts { count } => self.hosts[self.place[r].0].reached(count),
                _ => true,
            }
        {
            out.push((r, id, None));
        }
        for (pi, p) in s.peers.iter().enumerate() {
            if let Some(&id) = p.sends.get(st.send_cur[pi])
                && deps_ok(id)
                && s.ops[id].stream_from.is_none_or(|x| st.executed[x])
            {
                if !self.setup.rendezvous {
                    out.push((r, id, None));
                } else if let Some(rid) = self.recv_head(p.peer, r) {
                    out.push((r, id, Some((p.peer, rid))));
                }
            }
            if !self.setup.rendezvous
                && !self.channels[p.peer][r].is_empty()
                && let Some(id) = self.recv_head(r, p.peer)
            {
                out.push((r, id, None));
            }
        }
    }

    /// Runs ready ops, picked at random, until none is ready.
    fn run(&mut self) -> Result<(), String> {
        let n = self.scheds.len();
        let mut ready: Vec<Vec<Ready>> = vec![Vec::new(); n];
        for (r, v) in ready.iter_mut().enumerate() {
            self.ready_of(r, v);
        }
        let mut dirty: Vec<bool> = vec![false; n];
        loop {
            let total: usize = ready.iter().map(|v| v.len()).sum();
            if total == 0 {
                return Ok(());
            }
            let mut k = (self.next_rand() % total as u64) as usize;
            let mut pick = None;
            for v in &ready {
                if k < v.len() {
                    pick = Some(v[k]);
                    break;
                }
                k -= v.len();
            }
            let (r, id, pair) = pick.expect("k < total");
            self.execute(r, id)?;
            let mut touched = vec![r];
            if let Some(p) = self.scheds[r].ops[id].action.peer() {
                touched.push(p);
            }
            // A post may let any rank's wait go.
            if matches!(self.scheds[r].ops[id].action, Action::Post) {
                touched.extend(0..n);
            }
            if let Some((peer, rid)) = pair {
                self.execute(peer, rid)?;
                touched.push(peer);
            }
            for &t in &touched {
                dirty[t] = true;
                if self.setup.rendezvous {
                    for p in &self.scheds[t].peers {
                        dirty[p.peer] = true;
                    }
                }
            }
            for r in 0..n {
                if dirty[r] {
                    dirty[r] = false;
                    let mut v = std::mem::take(&mut ready[r]);
                    self.ready_of(r, &mut v);
                    ready[r] = v;
                }
            }
        }
    }

    /// Everything must have run, every message been consumed, and (when the setup asks) every
    /// rank have heard from every other.
    fn check_finished(&self) -> Result<(), String> {
        let n = self.scheds.len();
        for h in &self.hosts {
            h.check_handed_back()?;
        }
        for (r, st) in self.states.iter().enumerate() {
            if let Some(id) = st.executed.iter().position(|e| !e) {
                return Err(format!(
                    "rank {r}: op {id} ({:?}) never ran (deadlock{})",
                    self.scheds[r].ops[id].action,
                    if self.setup.rendezvous {
                        " without buffering"
                    } else {
                        ""
                    }
                ));
            }
            for (d, ch) in self.channels[r].iter().enumerate() {
                if !ch.is_empty() {
                    return Err(format!(
                        "rank {r} sent {} message(s) to rank {d} that were never received",
                        ch.len()
                    ));
                }
            }
        }
        if self.setup.causal
            && let Some((r, st)) = self
                .states
                .iter()
                .enumerate()
                .find(|(_, st)| st.heard != all_ranks(n))
        {
            return Err(format!(
                "rank {r} finished having heard only from ranks {:#x} (not from every rank)",
                st.heard
            ));
        }
        Ok(())
    }

    /// Every rank's receive buffer.
    fn results(self) -> Vec<Vec<Slot>> {
        self.states
            .into_iter()
            .map(|mut s| s.bufs.remove(&Buf::Recv).unwrap_or_default())
            .collect()
    }

    /// Reads region `reg` for rank `r`: its own buffers, host memory, or another rank's input.
    fn read(&mut self, r: usize, reg: &Region) -> Result<Vec<Slot>, String> {
        let (g, me) = self.place[r];
        match reg.buf {
            Buf::Host(i) => self.hosts[g].read(me, i as usize, reg.off, reg.len),
            Buf::PeerIn(i) => {
                let (owner, b) = self.peer_buf(g, i, false)?;
                self.hosts[g].access_buf(me, (i as usize, b), reg.off, reg.len, false)?;
                self.states[owner].read(&Region { buf: b, ..*reg })
            }
            Buf::PeerOut(i) => Err(format!("reads host rank {i}'s output")),
            Buf::Send | Buf::Recv if self.direct => {
                self.hosts[g].access_buf(me, (me, reg.buf), reg.off, reg.len, false)?;
                self.states[r].read(reg)
            }
            _ => self.states[r].read(reg),
        }
    }

    fn write(&mut self, r: usize, reg: &Region, v: &[Slot]) -> Result<(), String> {
        let (g, me) = self.place[r];
        match reg.buf {
            Buf::Host(i) => self.hosts[g].write(me, i as usize, reg.off, v),
            Buf::PeerOut(i) => {
                let (owner, b) = self.peer_buf(g, i, true)?;
                self.hosts[g].access_buf(me, (i as usize, b), reg.off, reg.len, true)?;
                self.states[owner].write(&Region { buf: b, ..*reg }, v)
            }
            Buf::PeerIn(i) => Err(format!("writes host rank {i}'s input")),
            Buf::Send | Buf::Recv if self.direct => {
                self.hosts[g].access_buf(me, (me, reg.buf), reg.off, reg.len, true)?;
                self.states[r].write(reg, v)
            }
            _ => self.states[r].write(reg, v),
        }
    }

    /// Host rank `i` of host `g`: its communicator rank and the buffer its input (`output`
    /// false: the send buffer, or the receive buffer in place) or output is.
    fn peer_buf(&self, g: usize, i: u16, output: bool) -> Result<(usize, Buf), String> {
        let owner = *self.members[g]
            .get(i as usize)
            .ok_or_else(|| format!("no host rank {i}"))?;
        if !self.scheds[owner].direct {
            return Err(format!(
                "accesses host rank {i}'s buffers in place, but its schedule is not direct (it \
                 announces none)"
            ));
        }
        let in_place = self.states[owner]
            .bufs
            .get(&Buf::Send)
            .is_none_or(Vec::is_empty);
        Ok((
            owner,
            if output || in_place {
                Buf::Recv
            } else {
                Buf::Send
            },
        ))
    }

    /// Runs a local op of rank `r`: copy, reduce, average, or a post or wait in host memory.
    fn run_local(
        &mut self,
        r: usize,
        action: Action,
        n: usize,
        op: ReduceOp,
    ) -> Result<(), String> {
        match action {
            Action::Copy { src, dst } => {
                let v = self.read(r, &src)?;
                self.write(r, &dst, &v)?;
            }
            Action::Reduce {
                dst,
                src,
                src_first,
            } => {
                let (a, b) = (self.read(r, &src)?, self.read(r, &dst)?);
                let out = reduce_values(&a, &b, src_first)?;
                self.write(r, &dst, &out)?;
            }
            Action::ReduceInto { dst, a, b } => {
                let (x, y) = (self.read(r, &a)?, self.read(r, &b)?);
                let out = reduce_values(&x, &y, true)?;
                self.write(r, &dst, &out)?;
            }
            Action::FinishAvg { region } => {
                if op == ReduceOp::Avg {
                    let mut v = self.read(r, &region)?;
                    for x in v.iter_mut() {
                        let val = x.ok_or_else(|| "divides an unwritten element".to_string())?;
                        *x = Some(divide(val, n)?);
                    }
                    self.write(r, &region, &v)?;
                }
            }
            Action::Post => {
                let (g, me) = self.place[r];
                let h = &mut self.hosts[g];
                if h.posted.is_empty() {
                    return Err("posts without host memory (host_slot 0)".into());
                }
                h.posted[me] += 1;
                h.post_heard[me] = self.states[r].heard;
            }
            Action::WaitPosts { count } => {
                let (g, me) = self.place[r];
                let h = &mut self.hosts[g];
                if h.posted.is_empty() {
                    return Err("waits without host memory (host_slot 0)".into());
                }
                for i in 0..h.posted.len() {
                    // What the wait guarantees, not what the others happen to have done.
                    h.seen[me][i] = h.seen[me][i].max(u64::from(count));
                    if count > 0 {
                        self.states[r].heard |= h.post_heard[i];
                    }
                }
            }
            Action::Send { .. } | Action::Recv { .. } => {
                unreachable!("sends and receives are not local")
            }
        }
        self.states[r].local_cur += 1;
        Ok(())
    }

    /// Runs op `id` of rank `r` after checking it against unexecuted earlier ops.
    fn execute(&mut self, r: usize, id: OpId) -> Result<(), String> {
        let s = &self.scheds[r];
        check_hazards(&self.states[r], s, r, id)?;
        let fail = |e: String| format!("rank {r}: op {id}: {e}");
        let (n, op) = (self.scheds.len(), self.setup.op);
        let pi_of = |peer: usize| self.peer_index[r][peer].expect("peer queue");
        match s.ops[id].action {
            Action::Send { peer, src } => {
                let st = &mut self.states[r];
                // An empty transfer moves no bytes (the executor completes it at once, without
                // touching the wire), so it tells the receiver nothing.
                let heard = if src.len > 0 { st.heard } else { 0 };
                self.channels[r][peer].push_back((heard, st.read(&src).map_err(fail)?));
                st.send_cur[pi_of(peer)] += 1;
            }
            Action::Recv { peer, dst, combine } => {
                let msg = self.channels[peer][r]
                    .pop_front()
                    .ok_or_else(|| fail("no message".into()))?;
                let st = &mut self.states[r];
                receive(st, msg, peer, dst, combine, n).map_err(fail)?;
                st.recv_cur[pi_of(peer)] += 1;
            }
            action => self.run_local(r, action, n, op).map_err(fail)?,
        }
        let st = &mut self.states[r];
        st.executed[id] = true;
        while st.first_pending < st.executed.len() && st.executed[st.first_pending] {
            st.first_pending += 1;
        }
        Ok(())
    }
}

/// Takes message `msg` from `peer` into `dst`, combining it as the receive says.
fn receive(
    st: &mut RankState,
    (heard, msg): Message,
    peer: usize,
    dst: Region,
    combine: Combine,
    n: usize,
) -> Result<(), String> {
    st.heard |= heard;
    if msg.len() != dst.len {
        return Err(format!(
            "expects {} elements from rank {peer}, the message has {}",
            dst.len,
            msg.len()
        ));
    }
    let out = match combine {
        Combine::Copy => msg,
        Combine::Reduce {
            with,
            incoming_first,
            finish_avg,
        } => {
            let mine = st.read(&with.unwrap_or(dst))?;
            let mut out = reduce_values(&msg, &mine, incoming_first)?;
            if finish_avg {
                for v in out.iter_mut() {
                    *v = Some(divide(v.expect("reduced"), n)?);
                }
            }
            out
        }
    };
    st.write(&dst, &out)
}
