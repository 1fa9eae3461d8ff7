//! Registered memory.
//!
//! The transport's own memory ([`RegisteredBuf`]: page-aligned, anonymous `mmap`, so
//! `MADV_DONTFORK` from fork safety touches nothing else): each connection registers its two
//! staging rings when it is made and deregisters them when it is torn down. Caller memory
//! ([`UserMr`]) only on request, for a registration whose owner cannot outlive the memory. It
//! does **not** register or cache arbitrary user pointers: without memory hooks (and rxe on
//! the 6.1 kernel has no on-demand paging), a buffer the program frees and the allocator maps
//! again at the same address would keep the old pinned pages in a cached registration and the
//! device would send stale data, silently. See the crate documentation on zero copy.

use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::Arc;

use nix::sys::mman::{MapFlags, ProtFlags, mmap_anonymous, munmap};

use crate::ffi::{IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, ibv_mr};
use crate::sys::{ibv_dereg_mr, ibv_reg_mr};

use crate::LOG_SUBSYS;
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
        let size = NonZeroUsize::new(len).expect("at least one page");
        // SAFETY:
        // - Anonymous private mapping with no address hint: the kernel picks a fresh range,
        //   nothing existing is replaced.
        // - It is unmapped once, in Drop (or below when registration fails).
        let p = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|e| VerbsError::Alloc {
            len,
            source: e.into(),
        })?;
        let ptr = p.cast::<u8>();
        let mut access = IBV_ACCESS_LOCAL_WRITE;
        if remote_write {
            access |= IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY:
        // - `pd` is a live protection domain (kept alive by the Arc stored below).
        // - `ptr..ptr+len` is a mapping we own for the life of the registration: Drop
        //   deregisters before it unmaps.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), p.as_ptr(), len, access as i32) };
        let Some(mr) = NonNull::new(mr) else {
            let source = last_os_error();
            // SAFETY: the mapping above, not registered, not referenced by anything else.
            let _ = unsafe { munmap(p, len) };
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
        // - Users drop their buffers only after the QPs that used them are destroyed (a
        //   connection's `Resources` drops its QPs first), so no work request still references
        //   the memory.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_dereg_mr failed: {rc}");
        }
        // SAFETY: the mapping from `new`, no longer registered; no reference into it outlives
        // `self`.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Memory the program owns, registered for zero-copy sends and receives
/// ([`ccl_core::transport::Transport::register`]).
///
/// Unlike a registration cache, this value is made for one borrowed buffer and dropped before
/// the buffer is released (`ccl`'s `Registration` borrows it, `Buffer` owns it), so it never
/// pins pages the program has freed and the allocator handed out again. It records the address
/// only; the device reads the memory only during a `send_registered` whose caller keeps it
/// borrowed, and peers write it only inside the range a `recv_registered` granted, whose caller
/// keeps it borrowed mutably until those bytes are received.
#[derive(Debug)]
pub struct UserMr {
    addr: usize,
    len: usize,
    mr: NonNull<ibv_mr>,
    pd: Arc<Pd>,
}

// SAFETY: the MR handle may be used from any thread; the value holds no reference to the bytes.
unsafe impl Send for UserMr {}
// SAFETY: `&UserMr` exposes only the address, length and keys.
unsafe impl Sync for UserMr {}

impl UserMr {
    /// Registers `mem` for local access by the device (the source of RDMA writes) and for RDMA
    /// writes from peers (into ranges the receiver grants, see `IbEndpoint`).
    pub fn new(pd: &Arc<Pd>, mem: &[u8]) -> Result<UserMr, VerbsError> {
        let len = mem.len().max(1);
        let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        // SAFETY:
        // - `pd` is a live protection domain (kept alive by the Arc stored below).
        // - `mem` is live, readable memory for this call; the registration only pins its pages
        //   and grants the device access. Remote write needs the rkey, which goes only to a
        //   connected peer, in a grant for a range that a receive borrows mutably until the
        //   peer's bytes in it are reported received. The owner drops this value before it
        //   frees the memory (see the type docs).
        let mr = unsafe {
            ibv_reg_mr(
                pd.as_ptr(),
                mem.as_ptr() as *mut libc::c_void,
                len,
                access as i32,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            return Err(VerbsError::RegMr {
                len,
                source: last_os_error(),
            });
        };
        Ok(UserMr {
            addr: mem.as_ptr() as usize,
            len: mem.len(),
            mr,
            pd: pd.clone(),
        })
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

    /// Whether `bytes` lies entirely inside the registered range.
    pub fn covers(&self, bytes: &[u8]) -> bool {
        let a = bytes.as_ptr() as usize;
        a >= self.addr && a + bytes.len() <= self.addr + self.len
    }
}

impl ccl_core::transport::MemRegion for UserMr {
    fn transport(&self) -> &'static str {
        "ib"
    }
    fn addr(&self) -> usize {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for UserMr {
    fn drop(&mut self) {
        // SAFETY: `mr` came from `ibv_reg_mr` and is deregistered once, here. A write still in
        // flight from it (only after a failed operation left the connection broken) completes
        // with an error instead of reading unpinned pages.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_dereg_mr of a user registration failed: {rc}");
        }
    }
}
