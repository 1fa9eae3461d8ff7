//! The slow-rank report: how late each peer enters operations, and a warning naming the peer
//! that stays late.

use super::*;

#[derive(Debug, Default, Clone)]
pub(super) struct PeerLateness {
    sum_us: i64,
    ops: u64,
    slow_windows: u32,
}

#[derive(Debug)]
pub(super) struct SlowTracker {
    peers: Vec<PeerLateness>,
    ops: u64,
    report: Vec<SlowPeer>,
}

impl SlowTracker {
    pub(super) fn new(n: usize) -> SlowTracker {
        SlowTracker {
            peers: vec![PeerLateness::default(); n],
            ops: 0,
            report: Vec::new(),
        }
    }
}

impl Peers {
    /// Counts one operation's lateness of each peer (microseconds, from operation headers) and
    /// names a peer that stays late, as the slow-rank report.
    pub(crate) fn note_lateness(&self, late: impl Iterator<Item = (usize, i64)>) {
        let window = self.config.slow_window as u64;
        let limit_us = self.config.slow_ms as i64 * 1000;
        let mut s = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        for (peer, us) in late {
            if let Some(p) = s.peers.get_mut(peer) {
                p.sum_us += us;
                p.ops += 1;
            }
        }
        s.ops += 1;
        if s.ops < window {
            return;
        }
        let mut report = Vec::new();
        let mut figures = Vec::new();
        for (peer, p) in s.peers.iter_mut().enumerate() {
            let mean = if p.ops > 0 {
                p.sum_us / p.ops as i64
            } else {
                0
            };
            if p.ops > 0 {
                figures.push((peer, mean));
            }
            let slow = p.ops > 0 && mean >= limit_us;
            if slow && p.slow_windows >= 1 {
                ccl_warn!(
                    Some(self.rank),
                    "slow rank: peer {peer} entered operations {:.1} ms after this rank on average over the last {} operations with it (and the window before)",
                    mean as f64 / 1000.0,
                    p.ops
                );
                report.push(SlowPeer {
                    peer,
                    mean_late_us: mean,
                    ops: p.ops,
                });
            }
            p.slow_windows = if slow { p.slow_windows + 1 } else { 0 };
            p.sum_us = 0;
            p.ops = 0;
        }
        s.ops = 0;
        s.report = report;
        drop(s);
        self.log_slow_report(&figures, window);
    }

    /// The periodic slow-rank report (`CCL_SLOW_REPORT_S`): every peer's mean lateness over the
    /// window just ended, and the latest one by host and pid.
    pub(super) fn log_slow_report(&self, figures: &[(usize, i64)], window: u64) {
        let every = self.config.slow_report;
        if every.is_zero() || figures.is_empty() {
            return;
        }
        {
            let mut last = self.slow_logged.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < every) {
                return;
            }
            *last = Some(Instant::now());
        }
        let list: Vec<String> = figures
            .iter()
            .map(|(p, m)| format!("peer {p} {:+.1} ms", *m as f64 / 1e3))
            .collect();
        let &(worst, mean) = figures.iter().max_by_key(|(_, m)| *m).expect("not empty");
        let verdict = if mean >= self.config.slow_ms as i64 * 1000 {
            format!(
                "the rank this one waits for: {} ({:.1} ms late on average)",
                self.who(worst),
                mean as f64 / 1e3
            )
        } else {
            format!("no peer is {} ms late", self.config.slow_ms)
        };
        ccl_warn!(
            Some(self.rank),
            "slow-rank report over the last {window} operations: mean lateness {}; {verdict}",
            list.join(", ")
        );
    }

    /// The peers the last slow-rank window named.
    pub(crate) fn slow_peers(&self) -> Vec<SlowPeer> {
        self.slow
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .report
            .clone()
    }
}
