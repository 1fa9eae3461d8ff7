//! Registered memory and the registration cache.
//!
//! The transport registers only memory it allocated itself ([`RegisteredBuf`]: page-aligned,
//! anonymous `mmap`, so `MADV_DONTFORK` from fork safety touches nothing else). It does **not**
//! register or cache arbitrary user pointers: without memory hooks (and rxe on the 6.1 kernel
//! has no on-demand paging), a buffer the program frees and the allocator maps again at the same
//! address would keep the old pinned pages in a cached registration and the device would send
//! stale data, silently. See the crate documentation on zero copy.
//!
//! Registering is slow (pinning every page), so [`MrCache`] keeps released buffers for reuse:
//! a communicator created after another one reuses its staging memory. The cache also indexes
//! every live registration by address range, for lookups of memory the library handed out.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rdma_sys::*;

use crate::error::{VerbsError, last_os_error};
use crate::pd::Pd;

/// Memory allocated and registered by the transport. The registration is dropped before the
/// memory is unmapped.
#[derive(Debug)]
pub struct RegisteredBuf {
    ptr: NonNull<u8>,
    len: usize,
    mr: NonNull<ibv_mr>,
    pd: Arc<Pd>,
}

// SAFETY: the buffer is plain memory owned by this value; the MR may be used from any thread.
// Concurrent access to the bytes is governed by the users of `as_ptr` (raw pointers only).
unsafe impl Send for RegisteredBuf {}
// SAFETY: `&RegisteredBuf` exposes only raw pointers and keys; no `&[u8]` over the whole buffer.
unsafe impl Sync for RegisteredBuf {}

impl RegisteredBuf {
    /// Allocates `len` bytes (rounded up to pages, zeroed) and registers them for local write
    /// and, with `remote_write`, RDMA writes from peers.
    pub fn new(pd: &Arc<Pd>, len: usize, remote_write: bool) -> Result<RegisteredBuf, VerbsError> {
        let page = 4096;
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY:
        // - Anonymous private mapping with no address hint: the kernel picks a fresh range,
        //   nothing existing is replaced.
        // - The result is checked against MAP_FAILED before use and unmapped once in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::Alloc {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(p.cast::<u8>()).expect("mmap never returns null on success");
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if remote_write {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY:
        // - `pd` is a live protection domain (kept alive by the Arc stored below).
        // - `ptr..ptr+len` is a mapping we own for the life of the registration: Drop
        //   deregisters before it unmaps.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), p, len, access.0 as i32) };
        let Some(mr) = NonNull::new(mr) else {
            let source = last_os_error();
            // SAFETY: the mapping above, not registered, not referenced by anything else.
            unsafe { libc::munmap(p, len) };
            return Err(VerbsError::RegMr { len, source });
        };
        Ok(RegisteredBuf {
            ptr,
            len,
            mr,
            pd: pd.clone(),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` is a live registration (freed only in Drop); lkey is a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as in `lkey`.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }
}

impl Drop for RegisteredBuf {
    fn drop(&mut self) {
        // SAFETY:
        // - `mr` came from `ibv_reg_mr` and is deregistered once, here.
        // - Users drop their buffers only after the QPs that used them are destroyed or
        //   drained (the endpoint's Drop), so no work request still references the memory.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_dereg_mr failed: {rc}");
        }
        // SAFETY: the mapping from `new`, no longer registered; no reference into it outlives
        // `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Idle bytes the cache keeps for reuse at most; beyond that released buffers are freed.
const IDLE_LIMIT: usize = 512 << 20;

/// Registrations of one protection domain, indexed by address range, with released buffers kept
/// for reuse.
#[derive(Debug)]
pub struct MrCache {
    pd: Arc<Pd>,
    inner: Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    /// Every buffer handed out or idle, by start address: (length, lkey, rkey).
    ranges: BTreeMap<u64, (usize, u32, u32)>,
    /// Released buffers: (remote_write, buffer).
    idle: Vec<(bool, RegisteredBuf)>,
    idle_bytes: usize,
}

impl MrCache {
    pub fn new(pd: Arc<Pd>) -> MrCache {
        MrCache {
            pd,
            inner: Mutex::new(CacheInner::default()),
        }
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A registered buffer of at least `len` bytes: a released one of the same size and access
    /// if there is one, else a new registration.
    pub fn get(&self, len: usize, remote_write: bool) -> Result<RegisteredBuf, VerbsError> {
        let want = len.max(1).div_ceil(4096) * 4096;
        {
            let mut g = self.lock();
            if let Some(i) = g
                .idle
                .iter()
                .position(|(rw, b)| *rw == remote_write && b.len() == want)
            {
                let (_, b) = g.idle.swap_remove(i);
                g.idle_bytes -= b.len();
                return Ok(b);
            }
        }
        let b = RegisteredBuf::new(&self.pd, want, remote_write)?;
        self.lock()
            .ranges
            .insert(b.addr(), (b.len(), b.lkey(), b.rkey()));
        Ok(b)
    }

    /// Takes a buffer back for reuse (or frees it when the cache holds enough).
    pub fn put(&self, b: RegisteredBuf, remote_write: bool) {
        let mut g = self.lock();
        if g.idle_bytes + b.len() <= IDLE_LIMIT {
            g.idle_bytes += b.len();
            g.idle.push((remote_write, b));
        } else {
            g.ranges.remove(&b.addr());
            drop(g);
            drop(b);
        }
    }

    /// `(lkey, rkey)` of the registration holding `addr..addr+len`, if one does.
    pub fn lookup(&self, addr: u64, len: usize) -> Option<(u32, u32)> {
        let g = self.lock();
        let (&start, &(blen, lkey, rkey)) = g.ranges.range(..=addr).next_back()?;
        (addr.checked_add(len as u64)? <= start + blen as u64).then_some((lkey, rkey))
    }

    /// Number of live registrations (handed out or idle).
    pub fn registrations(&self) -> usize {
        self.lock().ranges.len()
    }
}
