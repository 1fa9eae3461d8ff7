//! The engine: an event-driven fluid model of a [`Program`] on a [`Network`].
//!
//! Between events every transmitting flow moves at a constant rate. Rates are recomputed only
//! when a flow starts or stops transmitting, by progressive filling (max-min fairness): all rates
//! rise together until a link is full, the flows crossing it keep their rate, and the rest go
//! on rising. A flow that streams from another never outruns it while both transmit: it freezes
//! with its producer. A connection's QPs move in lock-step (its bytes are dealt to them in turn),
//! so a QP on a crowded link holds back the whole connection.
//!
//! Times: a flow may start once what it waits for has happened and, when it streams from a
//! flow without a head start, once that flow's first piece (`chunk` bytes) has crossed the
//! fabric; it then spends `ops x op_overhead` of software time before its first byte moves.
//! Its last byte arrives one path latency after it leaves. A flow standing for a chain of `ops`
//! streamed ops cannot beat one path latency per op. Local ops run in order on their rank at the
//! copy or reduction rate; reducing receives also load their receiver's reduction "link".

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::fabric::{Footprint, Network};
use crate::program::{Dep, Program};

/// A time that orders totally (no NaN reaches the queue).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);
impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Time {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Start(u32),
    Gate(u32),
    Arrive(u32),
    LocalDone(u32),
}

/// Whom an event releases: a flow or a local op.
#[derive(Clone, Copy, Debug)]
enum Waiter {
    Flow(u32),
    Local(u32),
}

const WAITING: u8 = 0;
const SCHEDULED: u8 = 1;
const ACTIVE: u8 = 2;
const SENT: u8 = 3;
const ARRIVED: u8 = 4;

/// What happened to one flow.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowTimes {
    /// First byte out.
    pub start: f64,
    /// Last byte out.
    pub sent: f64,
    /// Last byte in.
    pub arrived: f64,
}

/// The result of running a program.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// When the last rank finished (seconds).
    pub time: f64,
    /// When each rank finished its part.
    pub finish: Vec<f64>,
    pub flows: Vec<FlowTimes>,
    /// Bytes each link carried.
    pub link_bytes: Vec<f64>,
    /// The connection footprint of each flow (index into `footprints`).
    pub footprint_of: Vec<u32>,
    pub footprints: Vec<Footprint>,
    /// Events handled and rate recomputations.
    pub events: usize,
    pub recomputes: usize,
}

struct Engine<'a> {
    net: &'a Network,
    p: &'a Program,
    fp_of: Vec<u32>,
    fps: Vec<Footprint>,
    /// Per flow: links with their coefficient (footprint plus the receiver's reduce link).
    links: Vec<Vec<(u32, f64)>>,
    cap: Vec<f64>,
    pending: Vec<u32>,
    gates: Vec<u32>,
    ready_at: Vec<f64>,
    status: Vec<u8>,
    done: Vec<f64>,
    rate: Vec<f64>,
    times: Vec<FlowTimes>,
    local_pending: Vec<u32>,
    local_end: Vec<f64>,
    on_sent: Vec<Vec<Waiter>>,
    on_arrived: Vec<Vec<Waiter>>,
    on_local: Vec<Vec<Waiter>>,
    /// Consumers gated by each flow's start.
    on_start: Vec<Vec<u32>>,
    heap: BinaryHeap<Reverse<(Time, Ev)>>,
    active: Vec<u32>,
    pos: Vec<u32>,
    link_bytes: Vec<f64>,
    finish: Vec<f64>,
    // Scratch for the rate computation, sized to the links.
    rem: Vec<f64>,
    ucoef: Vec<f64>,
    stamp: Vec<u32>,
    /// Each touched link's index among the touched links.
    slot: Vec<u32>,
    touched: Vec<u32>,
    events: usize,
    recomputes: usize,
}

impl<'a> Engine<'a> {
    // Long: one pass over the flows for footprints and caps, one for the latency cycles, one
    // for the waiter lists; split, each would need most of the others' locals.
    fn new(net: &'a Network, p: &'a Program) -> Engine<'a> {
        let nf = p.flows.len();
        let nl = p.locals.len();
        let f = &net.fabric;
        let mut conn: HashMap<(u32, u32), u32> = HashMap::new();
        let mut fps: Vec<Footprint> = Vec::new();
        let mut fp_of = Vec::with_capacity(nf);
        let mut links = Vec::with_capacity(nf);
        let mut cap = Vec::with_capacity(nf);
        for fl in &p.flows {
            let id = *conn.entry((fl.src, fl.dst)).or_insert_with(|| {
                fps.push(net.footprint(fl.src as usize, fl.dst as usize));
                fps.len() as u32 - 1
            });
            fp_of.push(id);
            let fp = &fps[id as usize];
            let mut l = fp.links.clone();
            if fl.reduce > 0.0 {
                l.push((net.reduce_link(fl.dst as usize), fl.reduce));
            }
            links.push(l);
            cap.push(f.conn_bps.unwrap_or(f64::INFINITY));
        }
        // A flow standing for a chain of streamed ops waits, per op, for data that crossed the
        // fabric once (and a first piece of it): at most `bytes per op / that latency`. Around a
        // ring every chunk crosses every hop in turn, so a cycle of such flows shares the mean
        // of its hops' latencies.
        let grouped = |i: usize| p.flows[i].ops > 1 && !p.flows[i].locks.is_empty();
        let lat: Vec<f64> = (0..nf)
            .map(|i| {
                let fp = &fps[fp_of[i] as usize];
                let per = p.flows[i].bytes / p.flows[i].ops.max(1) as f64;
                fp.latency + per.min(f.chunk) / fp.capacity
            })
            .collect();
        let mut mean_lat = lat.clone();
        let mut seen = vec![false; nf];
        for i in 0..nf {
            if seen[i] || !grouped(i) {
                continue;
            }
            let mut walk = vec![i];
            seen[i] = true;
            let mut j = p.flows[i].locks[0].flow as usize;
            while grouped(j) && !seen[j] {
                seen[j] = true;
                walk.push(j);
                j = p.flows[j].locks[0].flow as usize;
            }
            if let Some(k) = walk.iter().position(|&x| x == j) {
                let cycle = &walk[k..];
                let m = cycle.iter().map(|&x| lat[x]).sum::<f64>() / cycle.len() as f64;
                for &x in cycle {
                    mean_lat[x] = m;
                }
            }
        }
        for i in (0..nf).filter(|&i| grouped(i)) {
            let per = p.flows[i].bytes / p.flows[i].ops as f64;
            if mean_lat[i] > 0.0 {
                cap[i] = cap[i].min(per / mean_lat[i]);
            }
        }
        let mut on_sent = vec![Vec::new(); nf];
        let mut on_arrived = vec![Vec::new(); nf];
        let mut on_local = vec![Vec::new(); nl];
        let mut on_start = vec![Vec::new(); nf];
        let mut pending = vec![0u32; nf];
        let mut gates = vec![0u32; nf];
        let mut hook = |d: &Dep, w: Waiter| match *d {
            Dep::Sent(x) => on_sent[x as usize].push(w),
            Dep::Arrived(x) => on_arrived[x as usize].push(w),
            Dep::Local(x) => on_local[x as usize].push(w),
        };
        for (i, fl) in p.flows.iter().enumerate() {
            for d in &fl.deps {
                hook(d, Waiter::Flow(i as u32));
            }
            pending[i] = fl.deps.len() as u32;
            for l in fl.locks.iter().filter(|l| !l.head_start) {
                on_start[l.flow as usize].push(i as u32);
                gates[i] += 1;
            }
        }
        let mut local_pending = vec![0u32; nl];
        for (i, l) in p.locals.iter().enumerate() {
            for d in &l.deps {
                hook(d, Waiter::Local(i as u32));
            }
            local_pending[i] = l.deps.len() as u32;
        }
        let nlinks = net.capacity.len();
        Engine {
            net,
            p,
            fp_of,
            fps,
            links,
            cap,
            pending,
            gates,
            ready_at: vec![0.0; nf],
            status: vec![WAITING; nf],
            done: vec![0.0; nf],
            rate: vec![0.0; nf],
            times: vec![FlowTimes::default(); nf],
            local_pending,
            local_end: vec![f64::NAN; nl],
            on_sent,
            on_arrived,
            on_local,
            on_start,
            heap: BinaryHeap::new(),
            active: Vec::new(),
            pos: vec![u32::MAX; nf],
            link_bytes: vec![0.0; nlinks],
            finish: vec![0.0; p.ranks],
            rem: vec![0.0; nlinks],
            ucoef: vec![0.0; nlinks],
            stamp: vec![0; nlinks],
            slot: vec![0; nlinks],
            touched: Vec::new(),
            events: 0,
            recomputes: 0,
        }
    }

    fn push(&mut self, t: f64, e: Ev) {
        self.heap.push(Reverse((Time(t), e)));
    }

    /// Everything flow `f` waits for has happened (deps and gates): it starts after its
    /// software overhead.
    fn maybe_schedule(&mut self, f: u32, t: f64) {
        let i = f as usize;
        if self.status[i] != WAITING || self.pending[i] > 0 || self.gates[i] > 0 {
            return;
        }
        self.status[i] = SCHEDULED;
        let t0 = t.max(self.ready_at[i]);
        let fl = &self.p.flows[i];
        let o = if fl.bytes > 0.0 {
            fl.ops as f64 * self.net.fabric.op_overhead
        } else {
            0.0
        };
        self.push(t0 + o, Ev::Start(f));
    }

    fn release(&mut self, w: Waiter, t: f64) {
        match w {
            Waiter::Flow(f) => {
                let i = f as usize;
                self.pending[i] -= 1;
                self.ready_at[i] = self.ready_at[i].max(t);
                self.maybe_schedule(f, t);
            }
            Waiter::Local(l) => {
                let i = l as usize;
                self.local_pending[i] -= 1;
                if self.local_pending[i] == 0 {
                    self.run_local(l, t);
                }
            }
        }
    }

    fn run_local(&mut self, l: u32, t: f64) {
        let lo = &self.p.locals[l as usize];
        let f = &self.net.fabric;
        let rate = if lo.reduce { f.reduce_bps } else { f.copy_bps };
        self.push(t + lo.bytes / rate, Ev::LocalDone(l));
    }

    fn activate(&mut self, f: u32, t: f64) {
        let i = f as usize;
        self.times[i].start = t;
        let fl = &self.p.flows[i];
        // Consumers may go once this flow's first piece has crossed.
        let fp = &self.fps[self.fp_of[i] as usize];
        let first = fp.latency + fl.bytes.min(self.net.fabric.chunk) / fp.capacity;
        for k in 0..self.on_start[i].len() {
            let c = self.on_start[i][k];
            self.push(t + first, Ev::Gate(c));
        }
        if fl.bytes <= 0.0 {
            self.status[i] = ACTIVE;
            self.sent(f, t);
            return;
        }
        self.status[i] = ACTIVE;
        self.pos[i] = self.active.len() as u32;
        self.active.push(f);
    }

    fn sent(&mut self, f: u32, t: f64) {
        let i = f as usize;
        if self.pos[i] != u32::MAX {
            let k = self.pos[i] as usize;
            self.active.swap_remove(k);
            if k < self.active.len() {
                self.pos[self.active[k] as usize] = k as u32;
            }
            self.pos[i] = u32::MAX;
        }
        self.status[i] = SENT;
        self.rate[i] = 0.0;
        self.done[i] = self.p.flows[i].bytes;
        self.times[i].sent = t;
        let b = self.p.flows[i].bytes;
        for &(l, c) in &self.links[i] {
            self.link_bytes[l as usize] += c * b;
        }
        let src = self.p.flows[i].src as usize;
        self.finish[src] = self.finish[src].max(t);
        let lat = self.fps[self.fp_of[i] as usize].latency;
        self.push(t + lat, Ev::Arrive(f));
        for k in 0..self.on_sent[i].len() {
            let w = self.on_sent[i][k];
            self.release(w, t);
        }
    }

    fn handle(&mut self, t: f64, e: Ev) -> bool {
        self.events += 1;
        match e {
            Ev::Start(f) => {
                self.activate(f, t);
                true
            }
            Ev::Gate(f) => {
                let i = f as usize;
                self.gates[i] -= 1;
                self.ready_at[i] = self.ready_at[i].max(t);
                self.maybe_schedule(f, t);
                false
            }
            Ev::Arrive(f) => {
                let i = f as usize;
                self.status[i] = ARRIVED;
                self.times[i].arrived = t;
                let dst = self.p.flows[i].dst as usize;
                self.finish[dst] = self.finish[dst].max(t);
                for k in 0..self.on_arrived[i].len() {
                    let w = self.on_arrived[i][k];
                    self.release(w, t);
                }
                false
            }
            Ev::LocalDone(l) => {
                let i = l as usize;
                self.local_end[i] = t;
                let r = self.p.locals[i].rank as usize;
                self.finish[r] = self.finish[r].max(t);
                for k in 0..self.on_local[i].len() {
                    let w = self.on_local[i][k];
                    self.release(w, t);
                }
                false
            }
        }
    }

    /// Max-min fair rates of the transmitting flows by progressive filling, with every flow
    /// no faster than the transmitting flows it streams from.
    // Long: progressive filling is one loop over shared scratch (the link heap, the frozen
    // set, the per-link flow lists); its setup builds those lists for this call's flows.
    fn recompute(&mut self) {
        self.recomputes += 1;
        let act = std::mem::take(&mut self.active);
        for &l in &self.touched {
            self.ucoef[l as usize] = 0.0;
        }
        self.touched.clear();
        for &f in &act {
            for &(l, c) in &self.links[f as usize] {
                let li = l as usize;
                if self.ucoef[li] == 0.0 {
                    self.touched.push(l);
                    self.rem[li] = self.net.capacity[li];
                }
                self.ucoef[li] += c;
            }
        }
        // Flows per link (CSR) and consumers per flow among the active ones.
        let mut start = vec![0u32; self.touched.len() + 1];
        for (k, &l) in self.touched.iter().enumerate() {
            self.slot[l as usize] = k as u32;
        }
        for &f in &act {
            for &(l, _) in &self.links[f as usize] {
                start[self.slot[l as usize] as usize + 1] += 1;
            }
        }
        for k in 0..self.touched.len() {
            start[k + 1] += start[k];
        }
        let mut fill = start.clone();
        let mut on_link = vec![0u32; start[self.touched.len()] as usize];
        for (k, &f) in act.iter().enumerate() {
            for &(l, _) in &self.links[f as usize] {
                let s = self.slot[l as usize] as usize;
                on_link[fill[s] as usize] = k as u32;
                fill[s] += 1;
            }
        }
        let mut consumers: Vec<Vec<u32>> = vec![Vec::new(); act.len()];
        for (k, &f) in act.iter().enumerate() {
            for lk in &self.p.flows[f as usize].locks {
                let pk = self.pos[lk.flow as usize];
                if pk != u32::MAX {
                    consumers[pk as usize].push(k as u32);
                }
            }
        }
        let mut heap: BinaryHeap<Reverse<(Time, u32, u32)>> = BinaryHeap::new();
        for (k, &l) in self.touched.iter().enumerate() {
            let li = l as usize;
            self.stamp[li] = self.stamp[li].wrapping_add(1);
            heap.push(Reverse((
                Time(self.rem[li] / self.ucoef[li]),
                k as u32,
                self.stamp[li],
            )));
        }
        let mut caps: Vec<(f64, u32)> = act
            .iter()
            .enumerate()
            .filter(|(_, f)| self.cap[**f as usize].is_finite())
            .map(|(k, f)| (self.cap[*f as usize], k as u32))
            .collect();
        caps.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut ci = 0;
        let mut frozen = vec![false; act.len()];
        let mut left = act.len();
        let mut stack: Vec<u32> = Vec::new();
        let mut level = 0.0f64;
        while left > 0 {
            // Drop stale heap entries.
            while let Some(Reverse((_, k, st))) = heap.peek() {
                let li = self.touched[*k as usize] as usize;
                if *st != self.stamp[li] {
                    heap.pop();
                } else {
                    break;
                }
            }
            let link = heap.peek().map(|Reverse((t, k, _))| (t.0, *k));
            let capped = caps.get(ci).copied();
            let take_cap = capped.is_some_and(|(c, _)| link.is_none_or(|(x, _)| c <= x));
            if let (true, Some((c, k))) = (take_cap, capped) {
                ci += 1;
                if !frozen[k as usize] {
                    level = level.max(c);
                    stack.push(k);
                }
            } else if let Some((x, k)) = link {
                heap.pop();
                level = level.max(x);
                let s = k as usize;
                for j in start[s]..start[s + 1] {
                    let fk = on_link[j as usize];
                    if !frozen[fk as usize] {
                        stack.push(fk);
                    }
                }
            } else {
                // Nothing limits the rest (cannot happen: every flow crosses a link).
                for (k, fz) in frozen.iter().enumerate() {
                    if !fz {
                        stack.push(k as u32);
                    }
                }
                level = level.max(1e30);
            }
            while let Some(k) = stack.pop() {
                let ku = k as usize;
                if frozen[ku] {
                    continue;
                }
                frozen[ku] = true;
                left -= 1;
                let f = act[ku] as usize;
                self.rate[f] = level;
                for &(l, c) in &self.links[f] {
                    let li = l as usize;
                    self.rem[li] -= c * level;
                    self.ucoef[li] -= c;
                    self.stamp[li] = self.stamp[li].wrapping_add(1);
                    if self.ucoef[li] > 1e-12 {
                        let s = self.slot[li];
                        let x = (self.rem[li].max(0.0) / self.ucoef[li]).max(level);
                        heap.push(Reverse((Time(x), s, self.stamp[li])));
                    }
                }
                for &c in &consumers[ku] {
                    if !frozen[c as usize] {
                        stack.push(c);
                    }
                }
            }
        }
        self.active = act;
    }

    fn run(mut self) -> Result<Outcome, String> {
        for i in 0..self.p.flows.len() {
            self.maybe_schedule(i as u32, 0.0);
        }
        for l in 0..self.p.locals.len() {
            if self.local_pending[l] == 0 {
                self.run_local(l as u32, 0.0);
            }
        }
        let mut t = 0.0f64;
        loop {
            // The next transmission to end, at current rates.
            let mut tc = f64::INFINITY;
            for &f in &self.active {
                let i = f as usize;
                if self.rate[i] > 0.0 {
                    tc = tc.min(t + (self.p.flows[i].bytes - self.done[i]) / self.rate[i]);
                }
            }
            let th = self
                .heap
                .peek()
                .map_or(f64::INFINITY, |Reverse((x, _))| x.0);
            let tn = tc.min(th);
            if !tn.is_finite() {
                break;
            }
            let dt = tn - t;
            for &f in &self.active {
                let i = f as usize;
                self.done[i] += self.rate[i] * dt;
            }
            t = tn;
            let mut changed = false;
            let ended: Vec<u32> = self
                .active
                .iter()
                .copied()
                .filter(|&f| {
                    let i = f as usize;
                    let b = self.p.flows[i].bytes;
                    b - self.done[i] <= b * 1e-9 + 1e-6
                })
                .collect();
            for f in ended {
                self.events += 1;
                self.sent(f, t);
                changed = true;
            }
            let eps = t * 1e-12 + 1e-15;
            while let Some(Reverse((x, _))) = self.heap.peek() {
                if x.0 > t + eps {
                    break;
                }
                let Some(Reverse((_, e))) = self.heap.pop() else {
                    break;
                };
                changed |= self.handle(t, e);
            }
            if changed {
                self.recompute();
            }
        }
        let stuck: Vec<usize> = (0..self.p.flows.len())
            .filter(|&i| self.status[i] != ARRIVED)
            .collect();
        if let Some(&i) = stuck.first() {
            let fl = &self.p.flows[i];
            return Err(format!(
                "the program cannot finish: {} flows never completed, the first (rank {} -> {}, \
                 step {}) waits for {} of {:?}",
                stuck.len(),
                fl.src,
                fl.dst,
                fl.step,
                self.pending[i],
                fl.deps
            ));
        }
        if let Some(l) = self.local_end.iter().position(|x| x.is_nan()) {
            return Err(format!(
                "the program cannot finish: local op {l} of rank {} never ran",
                self.p.locals[l].rank
            ));
        }
        let time = self.finish.iter().copied().fold(0.0, f64::max);
        Ok(Outcome {
            time,
            finish: self.finish,
            flows: self.times,
            link_bytes: self.link_bytes,
            footprint_of: self.fp_of,
            footprints: self.fps,
            events: self.events,
            recomputes: self.recomputes,
        })
    }
}

/// Runs `p` on `net` to the end.
pub fn run(net: &Network, p: &Program) -> Result<Outcome, String> {
    p.check()?;
    Engine::new(net, p).run()
}
