//! Which algorithm a call runs: forced, measured by trials on one host, or the cost model's.

use super::*;

impl Engine {
    /// The algorithm `coll` runs at `size_bytes` (the nccl-tests size): the one set by
    /// `CCL_ALGO` or `set_algorithm`, else the cost model's choice.
    pub(crate) fn algorithm(&self, coll: Collective, size_bytes: usize) -> Algo {
        let forced = self.forced(coll);
        let measured = (coll == Collective::AllReduce && forced.is_none())
            .then(|| self.lock().crossover.decided(size_bytes))
            .flatten();
        match measured {
            Some(v) => v.algo,
            None => self.choose(coll, forced, size_bytes),
        }
    }

    /// Whether an allreduce of `count` elements of `elem` bytes would be one of its size class's
    /// trials ([`Crossover`]). The same on every rank after the same calls.
    pub(crate) fn measuring(&self, coll: Collective, count: usize, elem: usize) -> bool {
        coll == Collective::AllReduce
            && self.forced(coll).is_none()
            && count >= self.size()
            && self.lock().crossover.measuring(count * elem)
    }

    /// Forces `algo` for `coll` (`None`: back to the cost model).
    pub(crate) fn set_override(
        &self,
        coll: Collective,
        algo: Option<Algo>,
    ) -> std::result::Result<(), algo::AlgoError> {
        let mut o = self.overrides.lock().unwrap_or_else(|p| p.into_inner());
        match algo {
            Some(a) => o.set(coll, a)?,
            None => o.clear(coll),
        }
        self.overrides_gen.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// The algorithm `CCL_ALGO` or `set_algorithm` forces for `coll`, if any.
    pub(super) fn forced(&self, coll: Collective) -> Option<Algo> {
        self.overrides
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(coll)
    }

    /// `forced`, else the cost model's choice.
    pub(super) fn choose(&self, coll: Collective, forced: Option<Algo>, size_bytes: usize) -> Algo {
        forced.unwrap_or_else(|| {
            algo::choose(
                coll,
                self.size(),
                size_bytes,
                &self.model,
                self.peers.topology(),
            )
        })
    }

    /// After the last trial of a size class, every call's least time over the ranks (one small
    /// allreduce, minimum) decides, the same on every rank. The small allreduce is below the
    /// measured sizes, so it runs as usual; it belongs to the call whose trial ended the class.
    pub(super) fn settle_crossover(&self, t: Trial, mine: Vec<i64>) -> Result<()> {
        let mut least: Vec<u8> = mine.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let votes = Call {
            coll: Collective::AllReduce,
            count: mine.len(),
            dtype: DataType::I64,
            op: ReduceOp::Min,
            root: 0,
        };
        let r = self.run(votes, None, &mut least);
        let least: Vec<i64> = match r {
            Ok(()) => least
                .chunks_exact(8)
                .map(|b| i64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            // The communicator failed; the class settles on the first candidate so that it is
            // not tried again, and the caller gets the error.
            Err(_) => Vec::new(),
        };
        let mut g = self.lock();
        let (won, medians) = g.crossover.decide(t, &least);
        if r.is_ok() && self.rank() == 0 {
            let each: Vec<String> = g
                .crossover
                .candidates()
                .iter()
                .zip(&medians)
                .map(|(v, ns)| format!("{v} {:.2} us", *ns as f64 / 1e3))
                .collect();
            ccl_info!(
                Some(0),
                "allreduce from {} bytes on this host: {won} (median over {} calls of the least \
                 time over the ranks: {})",
                crossover::class_start(t),
                crossover::TRIALS,
                each.join(", ")
            );
        }
        r
    }

    /// Logs, once, which algorithm the cost model picks for each collective at which size.
    pub(crate) fn log_algorithm_table(&self) {
        if !ccl_core::log::enabled(ccl_core::config::LogLevel::Info) || self.rank() != 0 {
            return;
        }
        for coll in Collective::ALL {
            if coll.algos().is_empty() {
                continue;
            }
            let forced = self
                .overrides
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(coll);
            if let Some(a) = forced {
                ccl_info!(Some(0), "{coll} algorithm: {a} (CCL_ALGO)");
                continue;
            }
            let mut table = String::new();
            let mut prev = None;
            for p in 0..=34 {
                let b = 1usize << p;
                let a = algo::choose(coll, self.size(), b, &self.model, self.peers.topology());
                if prev != Some(a) {
                    table.push_str(&format!(" {a} from {b} B;"));
                    prev = Some(a);
                }
            }
            ccl_info!(Some(0), "{coll} algorithms:{}", table.trim_end_matches(';'));
        }
    }
}

/// On one host, the allreduce measured fastest at this size (once measured; a trial before):
/// the algorithm to force and `shape`'s one-shot flag set, and the trial the call is, if any.
/// Anything else keeps `forced`.
pub(super) fn measured_choice(
    crossover: &Crossover,
    coll: Collective,
    forced: Option<Algo>,
    size_bytes: usize,
    shape: &mut Shape,
) -> (Option<Algo>, Option<Trial>) {
    if coll != Collective::AllReduce || forced.is_some() || shape.count < shape.size {
        return (forced, None);
    }
    let c = crossover.choose(size_bytes);
    match c.variant {
        Some(v) => {
            shape.one_shot = v.one_shot;
            (Some(v.algo), c.trial)
        }
        None => {
            shape.one_shot = crossover.fixed_one_shot(size_bytes);
            (None, c.trial)
        }
    }
}

/// What an allreduce of a communicator of `peers` may run on one host, for [`Crossover`] to
/// measure: the host-memory algorithm one-shot and two-shot, recursive doubling and the ring;
/// none when the ranks span hosts (or there is one rank), where the cost model chooses.
pub(super) fn allreduce_candidates(
    peers: &Peers,
    model: &TransportProperties,
    host_slot: usize,
) -> Vec<crossover::Variant> {
    let topo = peers.topology();
    if peers.size() < 2 || topo.num_hosts() > 1 {
        return Vec::new();
    }
    let mut v = Vec::new();
    if host_slot > 0 && algo::available(Algo::Shm, model, topo) {
        for one_shot in [true, false] {
            v.push(crossover::Variant {
                algo: Algo::Shm,
                one_shot: Some(one_shot),
            });
        }
    }
    for a in [Algo::RecursiveDoubling, Algo::Ring] {
        if algo::available(a, model, topo) {
            v.push(crossover::Variant {
                algo: a,
                one_shot: None,
            });
        }
    }
    v
}
