//! A single-producer, single-consumer byte ring in shared memory, with the wake-up protocol that
//! lets either side sleep.
//!
//! Positions are byte counts since the start (`u64`, never wrapping in practice): the producer
//! owns `tail`, the consumer owns `head`, and `tail - head` bytes are readable. Each sits on its
//! own cache line (with the line after it, which x86 prefetches in pairs), so a write to one does
//! not evict the other; the sleep flags, written only by a side that is about to sleep, sit on
//! lines of their own that both sides otherwise only read.
//!
//! Sleeping without losing a wake-up (both sides follow the same pattern):
//! - the sleeper raises its flag, issues a full fence, then looks once more for work; only if
//!   there is none does it block (on an eventfd it polls);
//! - the other side publishes its position, issues a full fence, then reads the flag; if it is
//!   raised, it lowers it and writes the eventfd.
//!
//! With both fences, at least one side sees the other's store, so either the sleeper finds the
//! work or the eventfd is written. The bytes between `head` and `tail` are written only before
//! `tail` moves past them and read only before `head` does, so the side that reads them sees
//! finished data (release/acquire on the positions) and nobody writes them while they are lent.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

use crossbeam_utils::CachePadded;

/// The shared control block of one ring. Lives in shared memory that starts zeroed, which is
/// its initial state.
#[repr(C)]
pub(crate) struct RingCtl {
    tail: CachePadded<AtomicU64>,
    head: CachePadded<AtomicU64>,
    reader_sleeping: CachePadded<AtomicU32>,
    writer_sleeping: CachePadded<AtomicU32>,
    closed: CachePadded<AtomicU32>,
}

const PRODUCER_CLOSED: u32 = 1;
const CONSUMER_CLOSED: u32 = 2;

/// Where a ring lives: its control block and its data, mapped twice back to back.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingMem {
    ctl: *const RingCtl,
    data: *mut u8,
    cap: usize,
}

impl RingMem {
    /// # Safety
    /// - `ctl` points to a `RingCtl` in shared memory that was zeroed before first use, is
    ///   aligned for it, and stays mapped while any `Producer` or `Consumer` made from this value
    ///   lives;
    /// - `data` points to `2 * cap` mapped bytes in which byte `i + cap` is byte `i`, for as long;
    /// - at most one `Producer` and one `Consumer` of the ring exist, in all processes together.
    pub(crate) unsafe fn new(ctl: *const RingCtl, data: *mut u8, cap: usize) -> RingMem {
        RingMem { ctl, data, cap }
    }

    fn ctl(&self) -> &RingCtl {
        // SAFETY: `new`'s contract: valid, aligned and mapped while this value is used.
        unsafe { &*self.ctl }
    }
}

/// The writing side.
#[derive(Debug)]
pub(crate) struct Producer {
    mem: RingMem,
    tail: u64,
    /// The consumer's position as last read (it only grows).
    head_seen: u64,
}

// SAFETY: the raw pointers refer to shared memory whose lifetime `RingMem::new`'s caller
// guarantees; the producer is the ring's only writer, whichever thread it is on.
unsafe impl Send for Producer {}

impl Producer {
    pub(crate) fn new(mem: RingMem) -> Producer {
        let c = mem.ctl();
        let tail = c.tail.load(Ordering::Acquire);
        let head_seen = c.head.load(Ordering::Acquire);
        Producer {
            mem,
            tail,
            head_seen,
        }
    }

    fn free(&mut self, want: usize) -> usize {
        let cap = self.mem.cap as u64;
        if cap - (self.tail - self.head_seen) < want as u64 {
            self.head_seen = self.mem.ctl().head.load(Ordering::Acquire);
        }
        (cap - (self.tail - self.head_seen)) as usize
    }

    /// Copies as much of `src` as fits and publishes it; returns how many bytes.
    pub(crate) fn push(&mut self, src: &[u8]) -> usize {
        let n = self.free(src.len()).min(src.len());
        if n == 0 {
            return 0;
        }
        let at = (self.tail % self.mem.cap as u64) as usize;
        // SAFETY:
        // - `at + n <= 2 * cap`: `at < cap` and `n <= cap`; the data is mapped twice, so the
        //   destination is `n` contiguous mapped bytes.
        // - Those bytes are free: the consumer has read past them (`head_seen` <= its head), and
        //   it reads nothing at or after `tail` until `tail` is published below.
        // - `src` is caller memory, not in the ring, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.mem.data.add(at), n) };
        self.tail += n as u64;
        self.mem.ctl().tail.store(self.tail, Ordering::Release);
        n
    }

    /// After a push: whether the consumer was asleep and must be woken (the flag is lowered).
    pub(crate) fn consumer_wants_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        let f = &self.mem.ctl().reader_sleeping;
        f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::AcqRel) != 0
    }

    /// Raises the writer's sleep flag unless there is room now or the consumer has gone; returns
    /// whether the caller may sleep.
    pub(crate) fn arm(&mut self) -> bool {
        let mem = self.mem;
        let c = mem.ctl();
        c.writer_sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.free(1) > 0 || self.consumer_closed() {
            c.writer_sleeping.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    pub(crate) fn consumer_closed(&self) -> bool {
        self.mem.ctl().closed.load(Ordering::Acquire) & CONSUMER_CLOSED != 0
    }

    /// Marks the ring closed for writing; the consumer reads what is left, then sees the close.
    pub(crate) fn close(&self) {
        self.mem
            .ctl()
            .closed
            .fetch_or(PRODUCER_CLOSED, Ordering::AcqRel);
    }
}

/// The reading side.
#[derive(Debug)]
pub(crate) struct Consumer {
    mem: RingMem,
    head: u64,
    /// The producer's position as last read.
    tail_seen: u64,
}

// SAFETY: as for `Producer`; the consumer is the ring's only reader.
unsafe impl Send for Consumer {}

impl Consumer {
    pub(crate) fn new(mem: RingMem) -> Consumer {
        let c = mem.ctl();
        let head = c.head.load(Ordering::Acquire);
        Consumer {
            mem,
            head,
            tail_seen: c.tail.load(Ordering::Acquire),
        }
    }

    fn available(&mut self, want: usize) -> usize {
        if ((self.tail_seen - self.head) as usize) < want {
            self.tail_seen = self.mem.ctl().tail.load(Ordering::Acquire);
        }
        (self.tail_seen - self.head) as usize
    }

    /// Lends up to `max` readable bytes, contiguous, to `f`, which returns how many it used;
    /// those are released to the producer. Returns that count.
    pub(crate) fn read_with(&mut self, max: usize, f: &mut dyn FnMut(&[u8]) -> usize) -> usize {
        let n = self.available(max).min(max);
        if n == 0 {
            return 0;
        }
        let at = (self.head % self.mem.cap as u64) as usize;
        // SAFETY:
        // - `at + n <= 2 * cap` (`at < cap`, `n <= cap`) and the data is mapped twice, so these
        //   are `n` contiguous mapped bytes.
        // - They lie between `head` and the published `tail`: the producer finished writing them
        //   before publishing (acquire above) and writes none of them again until `head` moves
        //   past them, which happens below, after the borrow ends.
        let bytes = unsafe { std::slice::from_raw_parts(self.mem.data.add(at), n) };
        let used = f(bytes).min(n);
        if used > 0 {
            self.head += used as u64;
            self.mem.ctl().head.store(self.head, Ordering::Release);
        }
        used
    }

    /// Copies readable bytes into `dst`; returns how many.
    pub(crate) fn read(&mut self, dst: &mut [u8]) -> usize {
        self.read_with(dst.len(), &mut |b| {
            dst[..b.len()].copy_from_slice(b);
            b.len()
        })
    }

    /// After a read: whether the producer was asleep on a full ring and must be woken.
    pub(crate) fn producer_wants_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        let f = &self.mem.ctl().writer_sleeping;
        f.load(Ordering::Relaxed) != 0 && f.swap(0, Ordering::AcqRel) != 0
    }

    /// Raises the reader's sleep flag unless bytes are readable or the producer has gone;
    /// returns whether the caller may sleep.
    pub(crate) fn arm(&mut self) -> bool {
        let mem = self.mem;
        let c = mem.ctl();
        c.reader_sleeping.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.available(1) > 0 || self.producer_closed() {
            c.reader_sleeping.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Whether the ring is empty now.
    pub(crate) fn is_empty(&mut self) -> bool {
        self.available(1) == 0
    }

    pub(crate) fn producer_closed(&self) -> bool {
        self.mem.ctl().closed.load(Ordering::Acquire) & PRODUCER_CLOSED != 0
    }

    /// Marks the ring closed for reading: the producer's next push fails.
    pub(crate) fn close(&self) {
        self.mem
            .ctl()
            .closed
            .fetch_or(CONSUMER_CLOSED, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{Mapping, MemFile, Mirror, PAGE};

    struct Fixture {
        // Field order: the rings' memory outlives nothing that uses it, since the users are
        // returned separately and dropped first in each test.
        _ctl: Mapping,
        _data: Mirror,
        mem: RingMem,
    }

    fn ring(cap: usize) -> Fixture {
        let f = MemFile::create("ring-test", PAGE + cap, "CCL_TEST").unwrap();
        let ctl = Mapping::new(&f, 0, PAGE).unwrap();
        let data = Mirror::new(&f, PAGE, cap).unwrap();
        // SAFETY: the control page is fresh (zeroed), page-aligned and large enough; the data is
        // a mirror of `cap` bytes; the fixture keeps both mapped while the test uses the ring;
        // each test makes one producer and one consumer.
        let mem = unsafe { RingMem::new(ctl.ptr().as_ptr().cast(), data.ptr().as_ptr(), cap) };
        Fixture {
            _ctl: ctl,
            _data: data,
            mem,
        }
    }

    #[test]
    fn bytes_arrive_in_order_across_the_wrap_and_never_overrun() {
        let fx = ring(PAGE);
        let (mut p, mut c) = (Producer::new(fx.mem), Consumer::new(fx.mem));
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        let mut k = 0usize;
        while got.len() < data.len() {
            let piece = [1, 4095, 3, 5000, 17][k % 5];
            k += 1;
            sent += p.push(&data[sent..(sent + piece).min(data.len())]);
            assert!(sent - got.len() <= PAGE, "overran the ring");
            let mut buf = vec![0u8; [7, 4096, 100][k % 3]];
            let n = c.read(&mut buf);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
    }

    #[test]
    fn a_lender_that_takes_whole_elements_sees_them_whole_at_the_wrap() {
        let fx = ring(PAGE);
        let (mut p, mut c) = (Producer::new(fx.mem), Consumer::new(fx.mem));
        // Fill to 3 bytes short of the end, drain, then write 8-byte elements across the wrap.
        assert_eq!(p.push(&[0u8; PAGE - 3]), PAGE - 3);
        assert_eq!(c.read(&mut [0u8; PAGE]), PAGE - 3);
        let elems: Vec<u8> = (0..64u8).collect();
        assert_eq!(p.push(&elems), 64);
        let mut seen = Vec::new();
        let used = c.read_with(64, &mut |b| {
            seen.extend_from_slice(&b[..b.len() / 8 * 8]);
            b.len() / 8 * 8
        });
        assert_eq!(used, 64);
        assert_eq!(seen, elems);
    }

    #[test]
    fn sleep_flags_follow_the_protocol() {
        let fx = ring(PAGE);
        let (mut p, mut c) = (Producer::new(fx.mem), Consumer::new(fx.mem));
        // Empty: the reader may sleep, and the next push must wake it, once.
        assert!(c.arm());
        assert_eq!(p.push(b"x"), 1);
        assert!(p.consumer_wants_wake());
        assert!(!p.consumer_wants_wake());
        // Data waiting: the reader must not sleep.
        assert!(!c.arm());
        // Full: the writer may sleep; a read wakes it.
        p.push(&[0u8; PAGE]);
        assert!(p.arm());
        c.read(&mut [0u8; 10]);
        assert!(c.producer_wants_wake());
        // Closing ends both kinds of sleep.
        c.close();
        assert!(!p.arm() && p.consumer_closed());
        p.close();
        c.read(&mut [0u8; PAGE]);
        assert!(!c.arm() && c.producer_closed());
    }
}
