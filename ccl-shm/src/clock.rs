//! A wall clock read from the CPU's time-stamp counter, for the flight recorder's two
//! timestamps per operation.
//!
//! The system clock (`clock_gettime` in the vDSO) reads the same counter, but behind a fence
//! that waits for every earlier load to finish: at the end of a small operation in host memory
//! those are the last reads of the other ranks' data, so the read stalls the rank exactly where
//! the next operation could have started. Measured on the 2-CPU test machine (2 ranks, 2 KiB
//! allreduce in host memory, `ccl-bench` built each way, 40 paired runs): the recorder's two
//! system-clock reads cost 0.05 us of a 0.7 us call; the same recorder timing with a plain
//! `rdtsc` cost nothing measurable.
//!
//! How the counter becomes wall time: each thread anchors it to the system clock, and anchors
//! again once its anchor is more than [`WINDOW_NS`] old (one system-clock read per window,
//! whatever the call rate). The counter's rate is measured between a thread's successive anchors
//! (at least [`MIN_SPAN_NS`] apart; the first when a communicator is made, [`calibrate`]), and
//! shared by all threads; a rate more than 1 % from the
//! current one counts only when the next measurement agrees with it, so that a step of the
//! system clock between two anchors does not skew every thread's times. Until a rate is known,
//! every read is a system-clock read. Between anchors the error is the rate's error over at most
//! a window: well under a microsecond, the recorder's unit.
//!
//! Used only where the kernel itself keeps time with the counter (its clocksource is `tsc`,
//! which it chooses only when the counter runs at a constant rate, does not stop in idle states
//! and agrees across CPUs) and the CPU says so (`constant_tsc`, `nonstop_tsc`); elsewhere
//! [`now_us`] is the system clock.

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A thread re-anchors the counter to the system clock when its anchor is older than this.
pub const WINDOW_NS: u64 = 20_000_000;
/// The counter's rate is measured over at least this long (its error is the two system-clock
/// reads' jitter, some tens of nanoseconds, over this span).
pub const MIN_SPAN_NS: u64 = 10_000_000;

/// Nanoseconds per counter tick (`f64` bits); 0 until measured.
static RATE: AtomicU64 = AtomicU64::new(0);
/// The last rate measured between anchors (`f64` bits), taken once another agrees with it.
static CANDIDATE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static ANCHOR: Cell<Option<Anchor>> = const { Cell::new(None) };
    /// The thread's anchor and rate as a read between anchors takes them.
    static FAST: Cell<Fast> = const { Cell::new(Fast::NONE) };
}

/// An anchor with the rate it was taken under in 32.32 fixed point, and the ticks its window
/// lasts: a read within the window is a subtraction, a multiplication and a shift. The
/// floating-point conversions of [`read`] were half of a read's instructions, and a small
/// operation in host memory reads the clock twice.
#[derive(Clone, Copy, Debug)]
struct Fast {
    tsc: u64,
    ns: u64,
    /// Nanoseconds per tick, times 2^32.
    mult: u64,
    /// Ticks from `tsc` the anchor is good for (0: none).
    ticks: u64,
}

impl Fast {
    const NONE: Fast = Fast {
        tsc: 0,
        ns: 0,
        mult: 0,
        ticks: 0,
    };

    /// `anchor` under `ns_per_tick`, or none when the rate is not known.
    fn new(anchor: Option<Anchor>, ns_per_tick: f64) -> Fast {
        match anchor {
            Some(a) if ns_per_tick > 0.0 => Fast {
                tsc: a.tsc,
                ns: a.ns,
                mult: (ns_per_tick * 4_294_967_296.0) as u64,
                ticks: (WINDOW_NS as f64 / ns_per_tick) as u64,
            },
            _ => Fast::NONE,
        }
    }

    /// Nanoseconds since the epoch at counter value `tsc`, if it lies in the window.
    fn at(self, tsc: u64) -> Option<u64> {
        // A counter below the anchor wraps to a huge difference: outside too.
        let d = tsc.wrapping_sub(self.tsc);
        (d < self.ticks).then(|| self.ns + ((u128::from(d) * u128::from(self.mult)) >> 32) as u64)
    }
}

/// A counter value and the system time read beside it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Anchor {
    pub tsc: u64,
    pub ns: u64,
}

/// What a read does, given the thread's anchor, the shared rate and the counter now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Read {
    /// Wall time from the counter, nanoseconds since the epoch.
    Counter(u64),
    /// Read the system clock and anchor there.
    Anchor,
}

/// Where `tsc` lies in wall time, if the anchor is recent and the rate known.
pub fn read(anchor: Option<Anchor>, ns_per_tick: f64, tsc: u64) -> Read {
    let Some(a) = anchor else { return Read::Anchor };
    if ns_per_tick <= 0.0 || tsc < a.tsc {
        return Read::Anchor;
    }
    let ns = ((tsc - a.tsc) as f64 * ns_per_tick) as u64;
    if ns > WINDOW_NS {
        return Read::Anchor;
    }
    Read::Counter(a.ns + ns)
}

/// The rate two anchors give, when they are at least `min_span_ns` apart and it is plausible
/// (a counter between 10 MHz and 100 GHz).
pub fn rate(old: Anchor, new: Anchor, min_span_ns: u64) -> Option<f64> {
    let (dt, dn) = (new.tsc.checked_sub(old.tsc)?, new.ns.checked_sub(old.ns)?);
    if dn < min_span_ns || dt == 0 {
        return None;
    }
    let r = dn as f64 / dt as f64;
    (0.01..=100.0).contains(&r).then_some(r)
}

/// Whether a rate measured between two anchors may replace the `current` one: within 1 % of
/// it (or there is none yet). A step of the system clock between the anchors (a time server's
/// correction) would give a wrong rate, which then stands for every thread until the next anchor.
pub fn agrees(current: f64, measured: f64) -> bool {
    current <= 0.0 || (measured / current - 1.0).abs() < 0.01
}

/// [`agrees`] with a rate that is known (`known` > 0).
fn agrees_known(known: f64, measured: f64) -> bool {
    known > 0.0 && agrees(known, measured)
}

/// The counter and the system clock read together: the counter on both sides of the system
/// clock's read, taken again when something (a preemption) came between them, and the counter
/// value in the middle kept.
fn take_anchor() -> Anchor {
    let mut best: Option<(u64, Anchor)> = None;
    for _ in 0..4 {
        let (before, ns, after) = (counter(), system_ns(), counter());
        // A counter that went back (it should not, the kernel checked) counts as the worst try.
        let gap = after.checked_sub(before).unwrap_or(u64::MAX);
        let a = Anchor {
            tsc: before.saturating_add(gap / 2).min(after.max(before)),
            ns,
        };
        if best.is_none_or(|(g, _)| gap < g) {
            best = Some((gap, a));
        }
        // A few microseconds at any counter rate: nothing came between.
        if gap < ANCHOR_GAP_TICKS {
            break;
        }
    }
    best.expect("at least one try").1
}

/// Counter ticks between the two reads around an anchor's system-clock read beyond which the
/// anchor is taken again.
const ANCHOR_GAP_TICKS: u64 = 20_000;

fn system_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
        d.as_secs() * 1_000_000_000 + u64::from(d.subsec_nanos())
    })
}

#[cfg(target_arch = "x86_64")]
fn counter() -> u64 {
    // SAFETY: `rdtsc` reads a register and has no preconditions; it is in every x86-64 CPU.
    // Without a fence it may run a little before or after its neighbours, which moves the
    // timestamp by nanoseconds.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn counter() -> u64 {
    0
}

/// Whether this machine's counter keeps time (see the module docs); looked at once.
pub fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .unwrap_or_default();
        let has = |f: &str| flags.split_whitespace().any(|w| w == f);
        cfg!(target_arch = "x86_64")
            && source.trim() == "tsc"
            && has("constant_tsc")
            && has("nonstop_tsc")
    })
}

/// Whether [`now_us`] reads the counter on this machine; anchors the calling thread, so that
/// the rate is measured from here on. No busy waiting: until a span of [`MIN_SPAN_NS`] between
/// two anchors gives the rate, reads are system-clock reads. (A calibration that spun for a few
/// milliseconds cost every rank of a thousand-rank job on a few CPUs that much CPU time, more
/// when preempted, to save system-clock reads in the first ten milliseconds of its life.)
pub fn calibrate() -> bool {
    if !usable() {
        return false;
    }
    let _ = now_us();
    true
}

/// Microseconds since the Unix epoch: from the counter where it is [`usable`], else (and
/// until its rate is known) from the system clock.
pub fn now_us() -> u64 {
    let tsc = counter();
    // Only a usable counter with a known rate ever makes a window (`now_us_slow`).
    match FAST.with(Cell::get).at(tsc) {
        Some(ns) => ns / 1000,
        None => now_us_slow(tsc),
    }
}

/// [`now_us`] outside the thread's window: reads the system clock where the counter is not
/// usable, else anchors again (measuring the rate) and opens a new window.
#[inline(never)]
fn now_us_slow(tsc: u64) -> u64 {
    if !usable() {
        return system_ns() / 1000;
    }
    let us = now_us_anchored(tsc);
    let rate = f64::from_bits(RATE.load(Ordering::Relaxed));
    FAST.with(|f| f.set(Fast::new(ANCHOR.with(Cell::get), rate)));
    us
}

/// The counter's time at `tsc` from the thread's anchor and the shared rate, anchoring again
/// when they do not give it.
fn now_us_anchored(tsc: u64) -> u64 {
    let anchor = ANCHOR.with(Cell::get);
    let ns_per_tick = f64::from_bits(RATE.load(Ordering::Relaxed));
    match read(anchor, ns_per_tick, tsc) {
        Read::Counter(ns) => ns / 1000,
        Read::Anchor => {
            let new = take_anchor();
            match anchor.and_then(|old| rate(old, new, MIN_SPAN_NS)) {
                Some(r) => {
                    // A rate unlike the current one is taken once the next span confirms it:
                    // one span across a step of the system clock is not, and a wrong rate
                    // (a calibration that was preempted) does not stand for good.
                    let candidate = f64::from_bits(CANDIDATE.swap(r.to_bits(), Ordering::Relaxed));
                    if agrees(ns_per_tick, r) || agrees_known(candidate, r) {
                        RATE.store(r.to_bits(), Ordering::Relaxed);
                    }
                    ANCHOR.with(|a| a.set(Some(new)));
                }
                // Too close to measure a rate: keep the older anchor, so the span grows.
                None if anchor.is_some_and(|old| new.tsc >= old.tsc && new.ns >= old.ns) => {}
                None => ANCHOR.with(|a| a.set(Some(new))),
            }
            new.ns / 1000
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_converts_ticks_in_fixed_point_and_ends() {
        let a = Anchor {
            tsc: 1_000,
            ns: 5_000_000_000,
        };
        let f = Fast::new(Some(a), 0.5);
        assert_eq!(f.at(3_000), Some(5_000_001_000));
        assert_eq!(f.at(1_000), Some(5_000_000_000));
        // Before the anchor, and past the window (20 ms at 0.5 ns a tick).
        assert_eq!(f.at(999), None);
        assert_eq!(f.at(1_000 + 40_000_000), None);
        assert!(f.at(1_000 + 39_999_999).is_some());
        // A rate like 1/2.9 GHz keeps sub-nanosecond precision over the whole window.
        let r = 1.0 / 2.9;
        let g = Fast::new(Some(a), r);
        let ticks = 57_000_000;
        let exact = (ticks as f64 * r) as u64;
        let got = g.at(1_000 + ticks).unwrap() - a.ns;
        assert!(got.abs_diff(exact) <= 1, "{got} vs {exact}");
        // No rate or no anchor: no window.
        assert_eq!(Fast::new(Some(a), 0.0).at(1_000), None);
        assert_eq!(Fast::new(None, 0.5).at(1_000), None);
    }

    #[test]
    fn a_recent_anchor_and_a_rate_give_counter_time() {
        let a = Anchor {
            tsc: 1_000,
            ns: 5_000_000_000,
        };
        assert_eq!(read(Some(a), 0.5, 3_000), Read::Counter(5_000_001_000));
        // No anchor, no rate, a counter behind the anchor, an anchor too old: the system clock.
        assert_eq!(read(None, 0.5, 3_000), Read::Anchor);
        assert_eq!(read(Some(a), 0.0, 3_000), Read::Anchor);
        assert_eq!(read(Some(a), 0.5, 999), Read::Anchor);
        let late = 1_000 + 2 * WINDOW_NS + 2;
        assert_eq!(read(Some(a), 0.5, late), Read::Anchor);
    }

    #[test]
    fn the_rate_needs_a_long_enough_and_plausible_span() {
        let a = Anchor { tsc: 0, ns: 0 };
        let b = |tsc, ns| Anchor { tsc, ns };
        let m = MIN_SPAN_NS;
        assert_eq!(rate(a, b(30_000_000, m), m), Some(1.0 / 3.0));
        assert_eq!(rate(a, b(30_000_000, m - 1), m), None);
        assert_eq!(rate(a, b(0, m), m), None);
        // 1 GHz of nanoseconds over 1 tick: no counter runs that slowly.
        assert_eq!(rate(a, b(1, m), m), None);
        assert_eq!(rate(b(5, 5), a, m), None);
    }

    #[test]
    fn a_rate_far_from_the_current_one_is_not_taken() {
        assert!(agrees(0.0, 0.4));
        assert!(agrees(0.4, 0.4 * 1.005));
        // A one-second step of the system clock within a 20 ms span.
        assert!(!agrees(0.4, 0.4 * 51.0));
        assert!(!agrees(0.4, 0.4 * 0.98));
    }

    #[test]
    fn counter_time_follows_the_system_clock() {
        if !usable() {
            eprintln!("skipped: this machine's time-stamp counter is not its clocksource");
            return;
        }
        assert!(calibrate());
        // Over more than a window, so that reads re-anchor, measure the rate and refine it.
        for _ in 0..100 {
            let before = system_ns() / 1000;
            let t = now_us();
            let after = system_ns() / 1000;
            // The system clock's own steps and a loaded machine's preemptions: a few ms.
            assert!(
                t + 2_000 >= before && t <= after + 2_000,
                "{before} <= {t} <= {after}"
            );
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        assert!(f64::from_bits(RATE.load(Ordering::Relaxed)) > 0.0);
    }
}
