//! Registered memory that the other ranks of the host map too: one sparse arena per rank.
//!
//! At set-up every rank of a host creates an arena, a `memfd` of `CCL_SHM_ARENA_BYTES` bytes
//! of which nothing but a small head is allocated, and hands it to the host's other ranks with
//! its ring segments; each maps every peer's arena whole. Untouched pages cost nothing, so the
//! arena can be far larger than memory. `Communicator::alloc` then carves a page-aligned
//! [`Block`] out of it and allocates that range's pages first (`fallocate`: a host short of
//! memory gives an error naming the size, never a `SIGBUS`); dropping the block gives the pages
//! back (a punched hole) and the range to the free list. Allocating needs no other rank: ranks
//! allocate at different times, in different orders.
//!
//! The head holds what peers need to trust a buffer: the table of live blocks (offset and
//! length, written by the owner before the block is handed out and cleared before its range is
//! released) and, per operation, where the owner's input and output lie (an announcement, two
//! places used by even and odd operations in turn). An operation that reads a peer's buffers in
//! place names them by (table index, offset, length) there before its first post; the peers
//! read that after waiting for the post and check the range lies inside the live block the
//! index names and inside the arena, so a wrong or stale announcement is an error naming the
//! rank, never a read of memory the owner did not lend.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ccl_core::{Error, Result};
use ccl_diag::human_bytes;

use crate::mem::{Mapping, MemFile, PAGE};

const MAGIC: [u8; 8] = *b"CCLARENA";

/// Bytes at the start of every arena for the header, the announcements and the block table.
pub const HEAD: usize = 64 * 1024;
const ANNOUNCE_AT: usize = 64;
const TABLE_AT: usize = PAGE;
/// Live blocks one arena can hold.
pub const TABLE: usize = (HEAD - TABLE_AT) / std::mem::size_of::<Entry>();

/// Where an operation's input and output lie: `tag` is the operation number plus one (0: none
/// yet); then table index, offset and length of each.
#[repr(C)]
struct Announce {
    tag: AtomicU64,
    input: [AtomicU64; 3],
    output: [AtomicU64; 3],
    _pad: AtomicU64,
}

/// A live block: offset and length in bytes (length 0: a free entry).
#[repr(C)]
struct Entry {
    off: AtomicU64,
    len: AtomicU64,
}

const _: () = assert!(ANNOUNCE_AT + 2 * std::mem::size_of::<Announce>() <= TABLE_AT);
const _: () = assert!(ANNOUNCE_AT % std::mem::align_of::<Announce>() == 0);

/// A range of an arena: the block table index it lies in, its offset and length in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub idx: usize,
    pub off: usize,
    pub len: usize,
}

/// The head of an arena, mapped: header, announcements and table.
#[derive(Debug)]
struct Head {
    map: Mapping,
}

impl Head {
    fn announce(&self, op: u64) -> &Announce {
        // SAFETY: both places lie in the first page of the mapping (checked at compile time),
        // aligned, in a file that started zeroed (a valid state for atomics); only atomics are
        // accessed through them, and the mapping lives as long as `&self`.
        unsafe {
            &*self
                .map
                .ptr()
                .as_ptr()
                .add(ANNOUNCE_AT + (op % 2) as usize * std::mem::size_of::<Announce>())
                .cast::<Announce>()
        }
    }

    fn entry(&self, idx: usize) -> &Entry {
        assert!(idx < TABLE, "arena table index {idx} out of range");
        // SAFETY: entry `idx < TABLE` lies inside the head (`TABLE` is sized so), aligned, in
        // zeroed (allocated) pages; only atomics are accessed through it.
        unsafe {
            &*self
                .map
                .ptr()
                .as_ptr()
                .add(TABLE_AT + idx * std::mem::size_of::<Entry>())
                .cast::<Entry>()
        }
    }
}

#[derive(Debug, Default)]
struct State {
    /// Free ranges `(offset, bytes)`, by offset, never adjacent.
    free: Vec<(usize, usize)>,
    /// Live blocks `(offset, bytes, table index)`.
    live: Vec<(usize, usize, usize)>,
    /// Table indices free for reuse, and the first never used.
    free_idx: Vec<usize>,
    next_idx: usize,
    used: usize,
}

/// This rank's arena, which its host's other ranks map too.
#[derive(Debug)]
pub struct Arena {
    file: MemFile,
    head: Head,
    state: Mutex<State>,
}

impl Arena {
    /// Creates an arena of `len` bytes (rounded down to whole pages; more than its head).
    pub fn create(len: usize) -> Result<Arc<Arena>> {
        let len = len / PAGE * PAGE;
        if len <= HEAD {
            return Err(Error::invalid_argument(format!(
                "CCL_SHM_ARENA_BYTES={len} is too small for a shared-memory arena (more than {} \
                 needed; 0 turns arenas off)",
                human_bytes(HEAD as u64)
            )));
        }
        let file = MemFile::create_sparse(
            "ccl-arena",
            len,
            HEAD,
            "CCL_SHM_ARENA_BYTES sizes the arena",
        )?;
        let map = Mapping::lazy(&file)?;
        let head = Head { map };
        // SAFETY: the first page is allocated and mapped read-write; nobody else has the file
        // yet.
        unsafe {
            let p = head.map.ptr().as_ptr();
            std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), p, 8);
            std::ptr::copy_nonoverlapping((len as u64).to_le_bytes().as_ptr(), p.add(8), 8);
        }
        Ok(Arc::new(Arena {
            file,
            head,
            state: Mutex::new(State {
                free: vec![(HEAD, len - HEAD)],
                ..State::default()
            }),
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes of address space, head included.
    pub fn len(&self) -> usize {
        self.file.len()
    }

    pub fn is_empty(&self) -> bool {
        self.file.is_empty()
    }

    /// Bytes held by live blocks (whole pages).
    pub fn used(&self) -> usize {
        self.state().used
    }

    /// The file, to hand to the host's other ranks.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd()
    }

    /// A zeroed block of `bytes` bytes (at least one page, whole pages held), its pages
    /// allocated.
    pub fn alloc(self: &Arc<Arena>, bytes: usize) -> Result<Block> {
        let pages = bytes.max(1).div_ceil(PAGE) * PAGE;
        if let Some(avail) = mem_available()
            && pages > avail
        {
            return Err(Error::invalid_usage(format!(
                "alloc of {} from shared memory: the host has {} available (MemAvailable)",
                human_bytes(pages as u64),
                human_bytes(avail as u64)
            )));
        }
        let (off, idx) = {
            let mut st = self.state();
            let Some(i) = st.free.iter().position(|&(_, l)| l >= pages) else {
                let largest = st.free.iter().map(|&(_, l)| l).max().unwrap_or(0);
                return Err(Error::invalid_usage(format!(
                    "alloc of {} from the shared-memory arena: its largest free range is {} \
                     ({} of CCL_SHM_ARENA_BYTES={} in use; raise it, or CCL_SHM_DISABLE=1 for \
                     private memory)",
                    human_bytes(pages as u64),
                    human_bytes(largest as u64),
                    human_bytes(st.used as u64),
                    self.len()
                )));
            };
            let idx = match st.free_idx.pop() {
                Some(i) => i,
                None if st.next_idx < TABLE => {
                    st.next_idx += 1;
                    st.next_idx - 1
                }
                None => {
                    return Err(Error::invalid_usage(format!(
                        "alloc from the shared-memory arena: {TABLE} buffers are live already \
                         (free some first)"
                    )));
                }
            };
            let (off, l) = st.free[i];
            if l == pages {
                st.free.remove(i);
            } else {
                st.free[i] = (off + pages, l - pages);
            }
            st.used += pages;
            (off, idx)
        };
        if let Err(e) = self.file.allocate(
            off,
            pages,
            "registered buffers come from shared memory on a host whose ranks share it \
             (CCL_SHM_DISABLE=1 for private memory)",
        ) {
            self.give_back(off, pages, idx);
            return Err(e);
        }
        let ent = self.head.entry(idx);
        ent.off.store(off as u64, Ordering::Relaxed);
        ent.len.store(pages as u64, Ordering::Release);
        self.state().live.push((off, pages, idx));
        Ok(Block {
            arena: self.clone(),
            off,
            len: bytes,
            pages,
            idx,
        })
    }

    fn give_back(&self, off: usize, pages: usize, idx: usize) {
        let mut st = self.state();
        st.used -= pages;
        st.free_idx.push(idx);
        let i = st.free.partition_point(|&(o, _)| o < off);
        st.free.insert(i, (off, pages));
        // Merge with the neighbours.
        if i + 1 < st.free.len() && st.free[i].0 + st.free[i].1 == st.free[i + 1].0 {
            st.free[i].1 += st.free[i + 1].1;
            st.free.remove(i + 1);
        }
        if i > 0 && st.free[i - 1].0 + st.free[i - 1].1 == st.free[i].0 {
            st.free[i - 1].1 += st.free[i].1;
            st.free.remove(i);
        }
    }

    fn free(&self, off: usize, pages: usize, idx: usize) {
        // Out of the table before the pages go, so no peer trusts the range after.
        self.head.entry(idx).len.store(0, Ordering::Release);
        self.state().live.retain(|&(o, _, _)| o != off);
        self.file.release(off, pages);
        self.give_back(off, pages, idx);
    }

    /// Whether `p` is an address inside the arena's mapping (no lock: the quick test).
    pub fn contains(&self, p: usize) -> bool {
        let base = self.head.map.ptr().as_ptr() as usize;
        p >= base && p < base + self.len()
    }

    /// Where `bytes` lie, when inside one live block.
    pub fn place(&self, bytes: &[u8]) -> Option<Place> {
        let p = bytes.as_ptr() as usize;
        if !self.contains(p) {
            return None;
        }
        let off = p - self.head.map.ptr().as_ptr() as usize;
        let end = off.checked_add(bytes.len())?;
        self.state()
            .live
            .iter()
            .find(|&&(o, l, _)| off >= o && end <= o + l)
            .map(|&(_, _, idx)| Place {
                idx,
                off,
                len: bytes.len(),
            })
    }

    /// Tells the peers where this rank's input and output of operation `op` lie (published by
    /// the next post).
    pub fn announce(&self, op: u64, input: Place, output: Place) {
        let a = self.head.announce(op);
        for (dst, p) in [(&a.input, input), (&a.output, output)] {
            dst[0].store(p.idx as u64, Ordering::Relaxed);
            dst[1].store(p.off as u64, Ordering::Relaxed);
            dst[2].store(p.len as u64, Ordering::Relaxed);
        }
        a.tag.store(op + 1, Ordering::Release);
    }
}

fn mem_available() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Memory from this rank's [`Arena`]: zeroed, page-aligned, mapped by the host's other ranks
/// too; its pages and its range go back to the arena when dropped.
#[derive(Debug)]
pub struct Block {
    arena: Arc<Arena>,
    off: usize,
    /// Bytes asked for.
    len: usize,
    /// Bytes held (whole pages).
    pages: usize,
    idx: usize,
}

impl Block {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `off..off + pages` lies inside the arena's mapping, which `self.arena` keeps
        // alive, with its pages allocated; the range is this block's alone in this process (the
        // free list hands it out once) and is mutated here only through `&mut self`. The host's
        // other ranks write it only inside an operation that borrows this block and announced
        // it, between the posts and waits that order those writes before this rank reads.
        unsafe {
            std::slice::from_raw_parts(self.arena.head.map.ptr().as_ptr().add(self.off), self.len)
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only borrow in this process.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.arena.head.map.ptr().as_ptr().add(self.off),
                self.len,
            )
        }
    }

    /// Its table index, offset and length in the arena.
    pub fn place(&self) -> Place {
        Place {
            idx: self.idx,
            off: self.off,
            len: self.len,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.arena.free(self.off, self.pages, self.idx);
    }
}

/// Another rank's arena, mapped whole, read-write: this rank reads its inputs and writes its
/// outputs inside operations that it announced.
#[derive(Debug)]
pub struct PeerArena {
    head: Head,
    file: MemFile,
}

impl PeerArena {
    /// Maps the arena a peer passed (`len` bytes, as it said), checking its header.
    pub fn open(fd: OwnedFd, len: usize) -> Result<PeerArena> {
        if len <= HEAD || len % PAGE != 0 {
            return Err(Error::remote(format!("bad shared arena size {len}")));
        }
        let file = MemFile::open(fd, len)?;
        let head = Head {
            map: Mapping::lazy(&file)?,
        };
        let mut h = [0u8; 16];
        // SAFETY: the first page is allocated (the creator allocated the head before passing
        // the file) and mapped; the creator wrote the header then and never writes it again.
        unsafe { std::ptr::copy_nonoverlapping(head.map.ptr().as_ptr(), h.as_mut_ptr(), 16) };
        if h[..8] != MAGIC || u64::from_le_bytes(h[8..].try_into().expect("8")) != len as u64 {
            return Err(Error::remote("the peer's arena file is not a ccl arena"));
        }
        Ok(PeerArena { head, file })
    }

    /// The arena's file, to pass on to another rank of the host.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.fd()
    }

    /// The range the owner announced as its input (`output` false) or output of operation
    /// `op`, checked against its live blocks. The caller must have waited for the owner's post
    /// that published the announcement.
    pub fn announced(
        &self,
        op: u64,
        output: bool,
    ) -> std::result::Result<(NonNull<u8>, usize), String> {
        let a = self.head.announce(op);
        let tag = a.tag.load(Ordering::Acquire);
        if tag != op + 1 {
            return Err(format!(
                "announced no buffers for this operation (its last announcement there is for \
                 operation {})",
                tag.wrapping_sub(1)
            ));
        }
        let w = if output { &a.output } else { &a.input };
        let [idx, off, len] = [0, 1, 2].map(|i| w[i].load(Ordering::Relaxed) as usize);
        let what = if output { "output" } else { "input" };
        if idx >= TABLE {
            return Err(format!("announced its {what} in block {idx} of {TABLE}"));
        }
        let e = self.head.entry(idx);
        let (eo, el) = (
            e.off.load(Ordering::Acquire) as usize,
            e.len.load(Ordering::Acquire) as usize,
        );
        let end = off.checked_add(len);
        if el == 0
            || off < eo
            || end.is_none_or(|end| end > eo.saturating_add(el) || end > self.head.map.len())
            || eo < HEAD
        {
            return Err(format!(
                "announced its {what} at [{off}, +{len}) of its arena, which is not inside a \
                 live allocation (block {idx}: [{eo}, +{el}))"
            ));
        }
        // SAFETY: `off + len` lies inside the mapping (checked above).
        let p = unsafe { self.head.map.ptr().add(off) };
        Ok((p, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer_of(a: &Arena) -> PeerArena {
        PeerArena::open(a.fd().try_clone_to_owned().unwrap(), a.len()).unwrap()
    }

    #[test]
    fn blocks_are_zeroed_shared_and_reused() {
        let a = Arena::create(64 << 20).unwrap();
        let peer = peer_of(&a);
        let mut b = a.alloc(10_000).unwrap();
        assert_eq!(b.as_slice().len(), 10_000);
        assert_eq!(b.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[..3].copy_from_slice(b"abc");
        let p = a.place(&b.as_slice()[1..3]).unwrap();
        assert_eq!((p.idx, p.len), (b.place().idx, 2));
        a.announce(4, b.place(), p);
        let (ptr, len) = peer.announced(4, false).unwrap();
        assert_eq!(len, 10_000);
        // SAFETY: the peer's mapping of the announced block; nothing writes it meanwhile.
        let seen = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), 3) };
        assert_eq!(seen, b"abc");
        assert!(peer.announced(6, false).unwrap_err().contains("no buffers"));
        let used = a.used();
        drop(b);
        assert_eq!(a.used(), used - 3 * PAGE);
        // The table no longer vouches for it.
        assert!(peer.announced(4, false).unwrap_err().contains("not inside"));
        let b = a.alloc(PAGE).unwrap();
        assert!(
            b.as_slice().iter().all(|&x| x == 0),
            "reused pages are zeroed"
        );
    }

    #[test]
    fn too_large_and_foreign_are_refused() {
        let a = Arena::create(HEAD + 4 * PAGE).unwrap();
        let _x = a.alloc(4 * PAGE).unwrap();
        let e = a.alloc(1).unwrap_err().to_string();
        assert!(e.contains("CCL_SHM_ARENA_BYTES"), "{e}");
        let e = Arena::create(1 << 40).unwrap().alloc(1 << 39);
        assert!(e.unwrap_err().to_string().contains("MemAvailable"));
        assert!(a.place(&[0u8; 4]).is_none());
        assert!(Arena::create(HEAD).is_err());
    }
}
