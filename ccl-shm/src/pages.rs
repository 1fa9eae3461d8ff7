//! Private page-aligned memory for `ccl`'s registered buffers (`Communicator::alloc`).
//!
//! Anonymous private mappings, so a buffer starts on a page and owns whole pages (registering
//! it pins nothing else, and fork-safety's `MADV_DONTFORK` touches nothing else). A buffer of
//! at least one huge page asks for huge pages first (`MAP_HUGETLB`, when the administrator
//! reserved some) and otherwise for transparent huge pages (`MADV_HUGEPAGE`): fewer pages mean
//! fewer address-translation misses on the NIC and a faster registration.

use std::num::NonZeroUsize;
use std::ptr::NonNull;

use ccl_core::{Error, ErrorKind, Result};
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap_anonymous, munmap};

/// Bytes of a huge page on x86-64 and arm64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// Zeroed, page-aligned memory owned by this value.
#[derive(Debug)]
pub struct Pages {
    ptr: NonNull<u8>,
    /// Bytes usable (what was asked for).
    len: usize,
    /// Bytes mapped.
    mapped: usize,
    huge: bool,
}

// SAFETY: `Pages` owns its mapping like a `Box<[u8]>`; the bytes are reached only through
// `&self`/`&mut self`, so the usual borrow rules govern them across threads.
unsafe impl Send for Pages {}
// SAFETY: as for `Send`: shared access gives only `&[u8]`.
unsafe impl Sync for Pages {}

impl Pages {
    /// Maps `len` bytes (at least one page), huge pages when `len` is a huge page or more and
    /// the system has them.
    pub fn new(len: usize) -> Result<Pages> {
        let page = crate::mem::page_size();
        let mapped = len.max(1).div_ceil(page) * page;
        let size = NonZeroUsize::new(mapped).expect("at least one page");
        let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
        let private = MapFlags::MAP_PRIVATE;
        if mapped >= HUGE {
            // Reserved huge pages come in whole huge pages.
            let hmapped = mapped.next_multiple_of(HUGE);
            let hsize = NonZeroUsize::new(hmapped).expect("at least one huge page");
            let flags = private | MapFlags::MAP_HUGETLB;
            // SAFETY: an anonymous mapping with no address hint replaces nothing; it is
            // unmapped once, in Drop, with the length it was made with.
            let r = unsafe { mmap_anonymous(None, hsize, prot, flags) };
            if let Ok(p) = r {
                return Ok(Pages {
                    ptr: p.cast(),
                    len,
                    mapped: hmapped,
                    huge: true,
                });
            }
        }
        // SAFETY: an anonymous mapping with no address hint replaces nothing; it is unmapped
        // once, in Drop.
        let p = unsafe { mmap_anonymous(None, size, prot, private) }.map_err(|e| {
            Error::io(
                ErrorKind::System,
                format!("cannot map {mapped} bytes for a registered buffer"),
                e.into(),
            )
        })?;
        let mut huge = false;
        if mapped >= HUGE {
            // SAFETY: advice on the mapping just made; MADV_HUGEPAGE changes no contents.
            huge = unsafe { madvise(p, mapped, MmapAdvise::MADV_HUGEPAGE) }.is_ok();
        }
        Ok(Pages {
            ptr: p.cast(),
            len,
            mapped,
            huge,
        })
    }

    /// Whether huge pages back it (reserved ones, or transparent huge pages were asked for).
    pub fn huge(&self) -> bool {
        self.huge
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is mapped readable and writable for the life of `self`, zeroed
        // at first, and mutated only through `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped only here; every slice into it borrowed
        // `self`, so none outlives it.
        let _ = unsafe { munmap(self.ptr.cast(), self.mapped) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_aligned_zeroed_and_writable() {
        for len in [1, 4096, 10_000, 4 << 20] {
            let mut p = Pages::new(len).unwrap();
            assert_eq!(p.as_slice().len(), len);
            assert_eq!(p.as_slice().as_ptr() as usize % 4096, 0);
            assert!(p.as_slice().iter().all(|&b| b == 0));
            p.as_mut_slice().fill(7);
            assert!(p.as_slice().iter().all(|&b| b == 7));
        }
    }
}
