//! The flight recorder: the last `CCL_TRACE_BUFFER` operations of a communicator, kept in a ring,
//! written out as a [`Dump`](crate::dump::Dump) on a failure or `SIGUSR1` (to `CCL_TRACE_DIR`),
//! and read by `ccl-trace` to say which rank a stuck job waits for.
//!
//! The executor fills an entry when an operation starts and brings it up to date when it
//! blocks and when it ends; the data path itself touches nothing here, so recording costs
//! nothing measurable. Slots are reused, so a recorder that has gone round once allocates no more.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use rustc_hash::FxBuildHasher;
use serde::{Deserialize, Serialize};

/// Microseconds since the Unix epoch (comparable across the processes of one host, and across
/// hosts as far as their clocks agree).
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Where an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Running,
    Done,
    Failed,
}

impl State {
    pub const fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Done => "done",
            State::Failed => "failed",
        }
    }
}

/// One peer's side of one operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStat {
    pub peer: usize,
    pub to_send: u64,
    pub sent: u64,
    pub to_recv: u64,
    pub received: u64,
    /// The peer's operation header arrived (it has entered this operation).
    pub arrived: bool,
    /// Microseconds this rank spent waiting for this peer's data.
    pub waited_us: u64,
    /// How much later (negative: earlier) the peer entered the operation, in microseconds.
    pub late_us: i64,
}

/// One operation.
#[derive(Clone, Debug)]
pub struct Entry {
    /// What the operation is.
    pub what: Begin,
    pub state: State,
    pub start_us: u64,
    pub end_us: u64,
    /// When something last moved in it, as of the last time it blocked.
    pub progress_us: u64,
    /// The peer the operation was waiting for when last seen blocked.
    pub waiting_on: Option<usize>,
    pub peers: Vec<PeerStat>,
    pub error: Option<String>,
}

impl Entry {
    fn blank() -> Entry {
        Entry {
            what: Begin::default(),
            state: State::Done,
            start_us: 0,
            end_us: 0,
            progress_us: 0,
            waiting_on: None,
            peers: Vec::new(),
            error: None,
        }
    }
}

/// What an operation is, for [`Recorder::begin`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Begin {
    pub seq: u64,
    pub name: &'static str,
    pub algo: &'static str,
    pub dtype: &'static str,
    pub op: &'static str,
    pub count: u64,
    pub bytes: u64,
    pub root: Option<usize>,
}

#[cfg(test)]
impl Begin {
    /// A float sum of 4 elements over a ring, for tests.
    pub(crate) fn test(seq: u64, name: &'static str) -> Begin {
        Begin {
            seq,
            name,
            algo: "ring",
            dtype: "float",
            op: "sum",
            count: 4,
            bytes: 16,
            root: None,
        }
    }
}

/// A ring of the last operations.
#[derive(Debug)]
pub struct Recorder {
    cap: usize,
    slots: Vec<Entry>,
    /// Operations begun so far.
    begun: u64,
    /// Where the newest is: `(begun - 1) % cap`, kept so that the calls of every operation
    /// divide nothing.
    newest: usize,
    /// Recent durations per (operation, bytes), for what is usual ([`Recorder::usual_us`]):
    /// where in `rings` each key's are. The map is updated at the end of every operation,
    /// where the standard hasher took over a tenth of a small operation's instructions; the
    /// keys come from the library, not from outside, so collisions cannot be forced.
    durations: HashMap<(&'static str, u64), usize, FxBuildHasher>,
    rings: Vec<Durations>,
    /// The key the last operation's duration went to, and its ring: a program calls the same
    /// operation over and over, and then no hashing is needed.
    last: Option<((&'static str, u64), usize)>,
    /// Where start and end times come from: microseconds since the epoch.
    clock: fn() -> u64,
}

/// A faster clock than [`now_us`] that another crate of the library provides
/// (`ccl_shm::clock`, which reads the CPU's counter, needs `unsafe`), for recorders to use.
static FAST_CLOCK: OnceLock<fn() -> u64> = OnceLock::new();

/// Offers `clock` to the recorders made from now on (the first offer stays).
pub fn set_fast_clock(clock: fn() -> u64) {
    let _ = FAST_CLOCK.set(clock);
}

/// The fast clock if one was offered, else [`now_us`].
pub fn fast_clock() -> fn() -> u64 {
    FAST_CLOCK.get().copied().unwrap_or(now_us)
}

/// The last [`HISTORY`] durations of one kind of operation, microseconds.
#[derive(Debug, Clone)]
struct Durations {
    key: (&'static str, u64),
    ring: [u64; HISTORY],
    n: usize,
}

/// Kinds of operation (name and size) whose durations are kept: a program that calls ever new
/// sizes would otherwise grow the table without end. When it is full, a new kind takes the place
/// of the one seen least often.
const MAX_KINDS: usize = 512;

/// Entries a recorder makes when it is made (more come as they are needed).
const PREFILL: usize = 4096;

/// Durations kept per kind of operation for its median.
const HISTORY: usize = 31;
/// Fewer durations than this say nothing about what is usual.
const MIN_HISTORY: usize = 5;

impl Recorder {
    /// A recorder of `cap` operations (0 = record nothing), timed by the system clock.
    pub fn new(cap: usize) -> Recorder {
        Recorder::with_clock(cap, now_us)
    }

    /// A recorder of `cap` operations timed by `clock` (microseconds since the epoch).
    pub fn with_clock(cap: usize, clock: fn() -> u64) -> Recorder {
        Recorder {
            clock,
            cap,
            // Made and touched now rather than one by one in the first operations, where
            // growing the ring (page faults, copies) cost 2 ranks' 2 KiB allreduces in host
            // memory 0.08 us a call over their first 3000; a huge ring grows the rest of the way.
            slots: (0..cap.min(PREFILL)).map(|_| Entry::blank()).collect(),
            begun: 0,
            newest: 0,
            durations: HashMap::default(),
            rings: Vec::new(),
            last: None,
        }
    }

    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// Starts an entry; `peers` gives (peer, bytes to send, bytes to receive). Returns its
    /// start time (none when the recorder records nothing).
    pub fn begin(
        &mut self,
        b: Begin,
        peers: impl Iterator<Item = (usize, u64, u64)>,
    ) -> Option<u64> {
        if self.cap == 0 {
            return None;
        }
        let i = if self.begun == 0 || self.newest + 1 == self.cap {
            0
        } else {
            self.newest + 1
        };
        if self.slots.len() <= i {
            self.slots.push(Entry::blank());
        }
        let clock = self.clock;
        let e = &mut self.slots[i];
        e.what = b;
        e.state = State::Running;
        e.start_us = clock();
        e.progress_us = e.start_us;
        e.end_us = 0;
        e.waiting_on = None;
        e.error = None;
        e.peers.clear();
        e.peers
            .extend(peers.map(|(peer, to_send, to_recv)| PeerStat {
                peer,
                to_send,
                to_recv,
                ..PeerStat::default()
            }));
        self.begun += 1;
        self.newest = i;
        Some(e.start_us)
    }

    /// The operation begun last, to bring up to date.
    pub fn current(&mut self) -> Option<&mut Entry> {
        if self.cap == 0 || self.begun == 0 {
            return None;
        }
        self.slots.get_mut(self.newest)
    }

    /// Ends the current operation.
    pub fn end(&mut self, error: Option<String>) {
        let clock = self.clock;
        let Some(e) = self.current() else { return };
        e.end_us = clock();
        e.state = if error.is_some() {
            State::Failed
        } else {
            State::Done
        };
        e.error = error;
        if e.state == State::Done {
            e.progress_us = e.end_us;
            let (key, took) = (
                (e.what.name, e.what.bytes),
                e.end_us.saturating_sub(e.start_us),
            );
            let i = self.ring_of(key);
            let d = &mut self.rings[i];
            d.ring[d.n % HISTORY] = took;
            d.n += 1;
        }
    }

    /// Where the durations of `key` are kept (made on first use).
    fn ring_of(&mut self, key: (&'static str, u64)) -> usize {
        // Names are static strings: the same pointer is the same name. Another pointer to the
        // same text goes through the map, which compares the text.
        if let Some(((name, bytes), i)) = self.last
            && std::ptr::eq(name, key.0)
            && bytes == key.1
        {
            return i;
        }
        let i = match self.durations.get(&key) {
            Some(&i) => i,
            None => {
                let fresh = Durations {
                    key,
                    ring: [0; HISTORY],
                    n: 0,
                };
                let i = if self.rings.len() < MAX_KINDS {
                    self.rings.push(fresh);
                    self.rings.len() - 1
                } else {
                    let (i, _) = self
                        .rings
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, d)| d.n)
                        .expect("the table is full");
                    self.durations.remove(&self.rings[i].key);
                    self.rings[i] = fresh;
                    i
                };
                self.durations.insert(key, i);
                i
            }
        };
        self.last = Some((key, i));
        i
    }

    /// The median duration of the recent operations `name` of `bytes` that succeeded,
    /// microseconds (`None` until a few have).
    pub fn usual_us(&self, name: &'static str, bytes: u64) -> Option<u64> {
        let d = &self.rings[*self.durations.get(&(name, bytes))?];
        let k = d.n.min(HISTORY);
        if k < MIN_HISTORY {
            return None;
        }
        let mut v = d.ring[..k].to_vec();
        v.sort_unstable();
        Some(v[k / 2])
    }

    /// Entries from oldest to newest.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        let n = usize::try_from(self.begun).map_or(self.cap, |b| b.min(self.cap));
        let start = if (self.begun as usize) > n {
            (self.begun % self.cap as u64) as usize
        } else {
            0
        };
        (0..n).map(move |k| &self.slots[(start + k) % n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(seq: u64) -> Begin {
        Begin::test(seq, "allreduce")
    }

    #[test]
    fn ring_keeps_the_newest() {
        let mut r = Recorder::new(3);
        for s in 1..=5 {
            r.begin(b(s), [(1usize, 8u64, 8u64)].into_iter());
            r.end(None);
        }
        let seqs: Vec<u64> = r.entries().map(|e| e.what.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        let off = Recorder::new(0);
        assert!(!off.enabled());
        assert_eq!(off.entries().count(), 0);
        // A ring not yet full holds only what was recorded, not the slots made in advance.
        let mut r = Recorder::new(10);
        assert_eq!(r.entries().count(), 0);
        for s in 1..=3 {
            r.begin(b(s), std::iter::empty());
            r.end(None);
        }
        let seqs: Vec<u64> = r.entries().map(|e| e.what.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
    }

    #[test]
    fn usual_durations_are_kept_per_operation_and_size() {
        let mut r = Recorder::new(4);
        // The same name from another place in memory is the same operation.
        let other: &'static str = Box::leak(String::from("allreduce").into_boxed_str());
        let mut run = |name: &'static str, bytes: u64, took_us: u64| {
            r.begin(
                Begin {
                    name,
                    bytes,
                    ..b(1)
                },
                std::iter::empty(),
            );
            r.current().unwrap().start_us -= took_us;
            r.end(None);
        };
        for k in 0..6 {
            // Alternating keys: the one remembered as the last is not the one asked for.
            run("allreduce", 16, 2_000_000);
            run("allreduce", 32, 0);
            run(if k % 2 == 0 { other } else { "allreduce" }, 16, 2_000_000);
            run("broadcast", 16, 0);
        }
        let slow = r.usual_us("allreduce", 16).unwrap();
        assert!((2_000_000..2_100_000).contains(&slow), "{slow}");
        assert!(r.usual_us(other, 32).unwrap() < 100_000);
        assert!(r.usual_us("broadcast", 16).unwrap() < 100_000);
        assert_eq!(r.usual_us("allgather", 16), None);
        assert_eq!(r.usual_us("allreduce", 64), None);
    }

    #[test]
    fn ever_new_sizes_do_not_grow_the_durations_table() {
        let mut r = Recorder::new(4);
        for k in 0..(3 * MAX_KINDS as u64) {
            // One size seen often among many seen once: it keeps its place.
            for bytes in [8, 1000 + k] {
                r.begin(Begin { bytes, ..b(k) }, std::iter::empty());
                r.end(None);
            }
        }
        assert_eq!(r.rings.len(), MAX_KINDS);
        assert_eq!(r.durations.len(), MAX_KINDS);
        assert!(r.usual_us("allreduce", 8).is_some());
        // The newest size is there; the oldest ones made room.
        let newest = 1000 + 3 * MAX_KINDS as u64 - 1;
        assert!(r.durations.contains_key(&("allreduce", newest)));
        assert!(!r.durations.contains_key(&("allreduce", 1000)));
    }
}
