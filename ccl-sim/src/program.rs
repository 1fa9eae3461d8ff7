//! What the engine runs: every rank's transfers and local work with what each waits for.
//!
//! A [`Flow`] is one or more consecutive sends of one rank to one peer, matched with the
//! peer's receives. Built from a library schedule ([`crate::schedules`]) each flow is one send
//! op; a pattern ([`crate::pattern`]) groups a chain of ops into one flow so that a 32K-rank ring
//! is 64K flows instead of two billion.

/// What an op waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dep {
    /// The sender of flow `f` handed its last byte to the transport.
    Sent(u32),
    /// The last byte of flow `f` arrived (and was combined) at its receiver.
    Arrived(u32),
    /// Local op `l` finished.
    Local(u32),
}

/// A flow streams from another: it forwards (or combines) data as that flow delivers it, so
/// while both run it goes no faster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    pub flow: u32,
    /// The flow has data of its own to send first (a ring's first chunk), so it need not wait
    /// for the producer's first bytes before starting.
    pub head_start: bool,
}

/// One transfer (or a chain of them) on the connection `src -> dst`.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub src: u32,
    pub dst: u32,
    pub bytes: f64,
    /// Schedule ops it stands for: each costs the per-op overhead, and each after the first in
    /// a stream chain waits for data that crossed the fabric once.
    pub ops: u32,
    pub deps: Vec<Dep>,
    pub locks: Vec<Lock>,
    /// Share of the bytes the receiver reduces as they arrive (0 for copies).
    pub reduce: f64,
    /// The schedule step of its first op, for reports.
    pub step: u32,
}

/// Local work of one rank: a copy, a reduction or a final division.
#[derive(Clone, Debug, PartialEq)]
pub struct Local {
    pub rank: u32,
    pub bytes: f64,
    pub reduce: bool,
    pub deps: Vec<Dep>,
}

/// One collective of every rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Program {
    pub ranks: usize,
    pub flows: Vec<Flow>,
    pub locals: Vec<Local>,
    /// Where it came from: `built` (the library's schedules) or `pattern`.
    pub source: &'static str,
}

impl Program {
    /// Bytes sent between each pair of ranks, sorted: what two programs of one collective must
    /// agree on.
    pub fn traffic(&self) -> Vec<(u32, u32, f64)> {
        let mut m: std::collections::BTreeMap<(u32, u32), f64> = Default::default();
        for f in &self.flows {
            *m.entry((f.src, f.dst)).or_default() += f.bytes;
        }
        m.into_iter()
            .filter(|e| e.1 > 0.0)
            .map(|((a, b), x)| (a, b, x))
            .collect()
    }

    /// Checks that every reference points at something that exists and comes first, so the
    /// engine can never wait forever on a missing op.
    pub fn check(&self) -> Result<(), String> {
        let (nf, nl) = (self.flows.len() as u32, self.locals.len() as u32);
        let dep_ok = |d: &Dep| match *d {
            Dep::Sent(f) | Dep::Arrived(f) => f < nf,
            Dep::Local(l) => l < nl,
        };
        for (i, f) in self.flows.iter().enumerate() {
            if f.src as usize >= self.ranks || f.dst as usize >= self.ranks || f.src == f.dst {
                return Err(format!("flow {i}: bad ranks {} -> {}", f.src, f.dst));
            }
            if !(f.bytes.is_finite() && f.bytes >= 0.0) {
                return Err(format!("flow {i}: bad size {}", f.bytes));
            }
            if let Some(d) = f.deps.iter().find(|d| !dep_ok(d)) {
                return Err(format!("flow {i}: waits for missing {d:?}"));
            }
            if f.deps
                .iter()
                .any(|d| *d == Dep::Sent(i as u32) || *d == Dep::Arrived(i as u32))
            {
                return Err(format!("flow {i} waits for itself"));
            }
            if let Some(l) = f.locks.iter().find(|l| l.flow >= nf || l.flow == i as u32) {
                return Err(format!("flow {i}: streams from bad flow {}", l.flow));
            }
        }
        for (i, l) in self.locals.iter().enumerate() {
            if l.rank as usize >= self.ranks {
                return Err(format!("local {i}: bad rank {}", l.rank));
            }
            if let Some(d) = l
                .deps
                .iter()
                .find(|d| !dep_ok(d) || **d == Dep::Local(i as u32))
            {
                return Err(format!("local {i}: waits for bad {d:?}"));
            }
        }
        Ok(())
    }
}
