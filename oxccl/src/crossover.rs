//! Which allreduce runs at each size on one host, measured on the host it runs on.
//!
//! On one host an allreduce can run in the host's shared memory one-shot (one barrier, every
//! rank reduces the whole buffer from every slot) or two-shot (two barriers, each rank reduces
//! 1/n of it; `ccl_algos::host`), or point to point over the shared-memory rings (recursive
//! doubling, ring). Which is fastest at a size depends on what the host's cores pay for a
//! barrier against a byte read from another core's cache, on the element type (a bf16 byte costs
//! several times an f32 byte to reduce) and on whether the ranks have a CPU each: the cost
//! model's constants cannot know, and a table measured on one machine fits no other. So a
//! communicator of one host finds out, per power-of-two size class of the band where the
//! candidates trade places: the first calls of a class go round the candidates (every rank the
//! same way, since every rank makes the same calls); after [`TRIALS`] timed calls of each, one
//! small allreduce gives every rank the least time over the ranks of every call (the last rank
//! to arrive waited for nobody: its time is the algorithm's own), and every rank takes the
//! candidate with the least median of those. Outside the band, the cost
//! model chooses as before.
//!
//! `CCL_SHM_ONE_SHOT` set to a size turns the measuring off: the cost model chooses the
//! algorithm, and the host-memory one runs one-shot up to that many bytes.

use std::time::Duration;

use ccl_algos::algo::Algo;

/// The band: size classes from 2^LO to 2^HI bytes (1 KiB to 8 MiB) are measured.
const LO: u32 = 10;
const HI: u32 = 23;
const CLASSES: usize = (HI - LO + 1) as usize;

/// Timed calls of each candidate per class, after one untimed call of each (which builds and
/// compiles its schedule). The median of eight: a preempted call or a lucky one does not decide
/// (with more ranks than cores the fastest call of a candidate said little of its typical one:
/// 4 ranks on 2 cores, 512 KiB, the fastest one-shot call took 109 us where its calls averaged
/// 171);
/// a class's trials cost 36 calls once per communicator (under 40 ms at 8 MiB on 2 ranks). A
/// benchmark counts them as warm-up (`Communicator::measuring`): they run slower algorithms on
/// purpose.
pub(crate) const TRIALS: u32 = 8;

/// At most this many candidates.
pub(crate) const MAX_CANDIDATES: usize = 4;

/// What `CCL_SHM_ONE_SHOT` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setting {
    /// Measure (`auto`).
    Measure,
    /// The cost model's algorithm; the host-memory one one-shot up to this many bytes.
    UpTo(usize),
}

/// An algorithm and, for the host-memory one, its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Variant {
    pub algo: Algo,
    /// For `Shape::one_shot`.
    pub one_shot: Option<bool>,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.one_shot {
            Some(true) => write!(f, "{} one-shot", self.algo),
            Some(false) => write!(f, "{} two-shot", self.algo),
            None => write!(f, "{}", self.algo),
        }
    }
}

// The classes sit in one array per communicator, so the larger variant costs a few hundred
// bytes once; boxing it would allocate per class for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
enum Class {
    /// `calls` made so far; `took[i]` candidate i's timed calls, in ns.
    Trying {
        calls: u32,
        took: [[u64; TRIALS as usize]; MAX_CANDIDATES],
    },
    Decided(usize),
}

/// The choices of one communicator.
#[derive(Debug)]
pub(crate) struct Crossover {
    setting: Setting,
    candidates: Vec<Variant>,
    classes: [Class; CLASSES],
}

/// A call that is one of the trials: its class and candidate, to [`Crossover::record`] its time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Trial {
    class: usize,
    candidate: usize,
    timed: bool,
}

/// What an allreduce of some size runs.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Choice {
    /// `None`: as the cost model says.
    pub variant: Option<Variant>,
    /// Set when the call is a trial.
    pub trial: Option<Trial>,
}

impl Crossover {
    /// `candidates`: what this communicator can run, at most [`MAX_CANDIDATES`] (none: the
    /// cost model always chooses).
    pub(crate) fn new(setting: Setting, mut candidates: Vec<Variant>) -> Crossover {
        candidates.truncate(MAX_CANDIDATES);
        Crossover {
            setting,
            candidates,
            classes: [Class::Trying {
                calls: 0,
                took: [[u64::MAX; TRIALS as usize]; MAX_CANDIDATES],
            }; CLASSES],
        }
    }

    /// What an allreduce of `bytes` runs.
    pub(crate) fn choose(&self, bytes: usize) -> Choice {
        let class = match self.setting {
            Setting::UpTo(_) => return Choice::default(),
            Setting::Measure => match class_of(bytes) {
                Some(c) if self.candidates.len() > 1 => c,
                _ => return Choice::default(),
            },
        };
        match self.classes[class] {
            Class::Decided(i) => Choice {
                variant: Some(self.candidates[i]),
                trial: None,
            },
            Class::Trying { calls, .. } => {
                let k = self.candidates.len() as u32;
                let candidate = (calls % k) as usize;
                Choice {
                    variant: Some(self.candidates[candidate]),
                    trial: Some(Trial {
                        class,
                        candidate,
                        timed: calls >= k,
                    }),
                }
            }
        }
    }

    /// Whether calls of `bytes` are still trials.
    pub(crate) fn measuring(&self, bytes: usize) -> bool {
        self.choose(bytes).trial.is_some()
    }

    /// What allreduces of `bytes` run, once measured.
    pub(crate) fn decided(&self, bytes: usize) -> Option<Variant> {
        match (self.setting, class_of(bytes)) {
            (Setting::Measure, Some(c)) => match self.classes[c] {
                Class::Decided(i) => Some(self.candidates[i]),
                Class::Trying { .. } => None,
            },
            _ => None,
        }
    }

    /// Under `UpTo`, the host-memory algorithm's shape for `bytes` (any other algorithm ignores
    /// it).
    pub(crate) fn fixed_one_shot(&self, bytes: usize) -> Option<bool> {
        match self.setting {
            Setting::UpTo(max) => Some(bytes <= max),
            Setting::Measure => None,
        }
    }

    /// Counts trial `t`, which took `took`. After the last trial of its class, returns this
    /// rank's time of every timed call, candidate by candidate (ns, bounded), for the ranks to
    /// take the least of each call over the ranks and hand to [`decide`](Self::decide).
    pub(crate) fn record(&mut self, t: Trial, took: Duration) -> Option<Vec<i64>> {
        let k = self.candidates.len() as u32;
        let Class::Trying { calls, took: times } = &mut self.classes[t.class] else {
            return None;
        };
        if t.timed {
            // Timed calls of a candidate: the class's calls after the first round, one in k.
            let i = ((*calls - k) / k) as usize;
            times[t.candidate][i] = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        }
        *calls += 1;
        (*calls == k * (1 + TRIALS)).then(|| {
            times[..k as usize]
                .iter()
                .flatten()
                .map(|&ns| ns.min(1 << 40) as i64)
                .collect()
        })
    }

    /// Settles `t`'s class from every timed call's least time over the ranks (`least`, as
    /// [`record`](Self::record) lays them out): the rank that came last to a call waited for
    /// nobody, so its time is the algorithm's own, whatever the program did between calls (in
    /// a program that computes between them, a rank's own time is mostly its wait for the
    /// others: 134-1918 us per 2 KiB call while tensor-parallel decoding, against 0.5-1 us of
    /// allreduce). The candidate with the least median wins (a tie: the first). Returns it and
    /// the medians, in ns.
    pub(crate) fn decide(&mut self, t: Trial, least: &[i64]) -> (Variant, Vec<i64>) {
        let medians: Vec<i64> = least
            .chunks(TRIALS as usize)
            .map(|c| {
                let mut c = c.to_vec();
                c.sort_unstable();
                c[c.len() / 2]
            })
            .collect();
        let best = (0..self.candidates.len())
            .min_by_key(|&i| (medians.get(i).copied().unwrap_or(i64::MAX), i))
            .unwrap_or(0);
        self.classes[t.class] = Class::Decided(best);
        (self.candidates[best], medians)
    }

    pub(crate) fn candidates(&self) -> &[Variant] {
        &self.candidates
    }
}

/// The class of `bytes`: floor(log2), within the band.
fn class_of(bytes: usize) -> Option<usize> {
    let log = bytes.checked_ilog2()?;
    (LO..=HI).contains(&log).then(|| (log - LO) as usize)
}

/// The bytes `t`'s class starts at, for logs.
pub(crate) fn class_start(t: Trial) -> usize {
    1 << (t.class as u32 + LO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Vec<Variant> {
        vec![
            Variant {
                algo: Algo::Shm,
                one_shot: Some(true),
            },
            Variant {
                algo: Algo::Shm,
                one_shot: Some(false),
            },
            Variant {
                algo: Algo::Ring,
                one_shot: None,
            },
        ]
    }

    #[test]
    fn a_class_goes_round_the_candidates_then_follows_the_least_times() {
        let mut c = Crossover::new(Setting::Measure, three());
        assert!(c.choose(512).variant.is_none() && c.choose(512).trial.is_none());
        assert!(c.choose(32 << 20).variant.is_none());
        let mut seen = [0; 3];
        let mut mine = None;
        let calls = 3 * (1 + TRIALS);
        for k in 0..calls {
            let ch = c.choose(3000);
            let t = ch.trial.expect("a trial");
            assert_eq!(ch.variant, Some(three()[t.candidate]));
            assert_eq!(t.timed, k >= 3);
            seen[t.candidate] += 1;
            // Two-shot fastest here, but once preempted, and the ring once lucky: the medians
            // ignore both.
            let ns = match k {
                4 => 5800,
                5 => 100,
                _ => [900, 800, 1000][t.candidate],
            };
            mine = c.record(t, Duration::from_nanos(ns));
            assert_eq!(mine.is_some(), k == calls - 1);
        }
        assert_eq!(seen, [1 + TRIALS; 3]);
        let mine = mine.unwrap();
        assert_eq!(mine.len(), 3 * TRIALS as usize);
        // Another rank came last to every call and waited for nobody: one-shot took it 100 ns,
        // two-shot 700, the ring 1000. The least over the ranks per call picks one-shot.
        let t = c.choose(3000).trial.unwrap();
        let least: Vec<i64> = mine
            .iter()
            .enumerate()
            .map(|(i, &a)| a.min([100, 700, 1000][i / TRIALS as usize]))
            .collect();
        let (won, medians) = c.decide(t, &least);
        assert_eq!((won, medians), (three()[0], vec![100, 700, 1000]));
        for b in [2048, 4095] {
            let ch = c.choose(b);
            assert_eq!((ch.variant, ch.trial.is_none()), (Some(three()[0]), true));
        }
        // The class above is still to be measured.
        assert!(c.choose(4096).trial.is_some());
    }

    #[test]
    fn ties_a_single_candidate_and_a_fixed_setting() {
        let mut c = Crossover::new(Setting::Measure, three());
        let t = c.choose(1 << 20).trial.unwrap();
        assert_eq!(c.decide(t, &[5; 3 * TRIALS as usize]).0, three()[0]);
        let one = Crossover::new(Setting::Measure, three()[2..].to_vec());
        assert!(one.choose(4096).variant.is_none());
        let c = Crossover::new(Setting::UpTo(65536), three());
        for (b, one) in [(8, true), (65536, true), (65537, false), (1 << 30, false)] {
            let ch = c.choose(b);
            assert!(ch.variant.is_none() && ch.trial.is_none());
            assert_eq!(c.fixed_one_shot(b), Some(one), "{b}");
        }
    }
}
