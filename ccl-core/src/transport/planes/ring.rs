//! The byte rings of a striped endpoint: what a sender keeps until acknowledged, what a
//! receiver read ahead of what it delivered.

use super::WINDOW;

/// Bytes kept by stream offset: `[base, base + WINDOW)` lives at `offset % WINDOW`.
pub(super) struct Ring {
    pub(super) buf: Vec<u8>,
}

impl Ring {
    pub(super) fn new() -> Ring {
        Ring { buf: Vec::new() }
    }

    pub(super) fn ready(&mut self) {
        if self.buf.is_empty() {
            // Zeroed pages are mapped lazily: a peer that only ever sends a few bytes costs a
            // few pages, not the window.
            self.buf = vec![0u8; WINDOW];
        }
    }

    /// The contiguous slice from offset `off`, at most `len` bytes (less at the wrap).
    pub(super) fn at(&self, off: u64, len: usize) -> &[u8] {
        let i = (off % WINDOW as u64) as usize;
        &self.buf[i..(i + len).min(WINDOW)]
    }

    pub(super) fn at_mut(&mut self, off: u64, len: usize) -> &mut [u8] {
        let i = (off % WINDOW as u64) as usize;
        &mut self.buf[i..(i + len).min(WINDOW)]
    }

    pub(super) fn put(&mut self, mut off: u64, mut src: &[u8]) {
        self.ready();
        while !src.is_empty() {
            let d = self.at_mut(off, src.len());
            let n = d.len();
            d.copy_from_slice(&src[..n]);
            src = &src[n..];
            off += n as u64;
        }
    }
}

/// Sorted, disjoint stream ranges held in the receive ring.
#[derive(Default)]
pub(super) struct Ranges(pub(super) Vec<(u64, u64)>);

impl Ranges {
    pub(super) fn add(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let v = &mut self.0;
        let i = v.partition_point(|r| r.1 < s);
        let mut j = i;
        let (mut s, mut e) = (s, e);
        while j < v.len() && v[j].0 <= e {
            s = s.min(v[j].0);
            e = e.max(v[j].1);
            j += 1;
        }
        // In place, reusing the vector: ranges are added on the data path (a splice there
        // built and dropped a replacement iterator per received read).
        if i == j {
            v.insert(i, (s, e));
        } else {
            v[i] = (s, e);
            v.drain(i + 1..j);
        }
    }

    /// Forgets everything below `off`.
    pub(super) fn trim(&mut self, off: u64) {
        self.0.retain(|r| r.1 > off);
        if let Some(r) = self.0.first_mut() {
            r.0 = r.0.max(off);
        }
    }

    /// Bytes held from `off` on without a gap.
    pub(super) fn run_at(&self, off: u64) -> u64 {
        match self.0.first() {
            Some(&(s, e)) if s <= off && off < e => e - off,
            _ => 0,
        }
    }
}
