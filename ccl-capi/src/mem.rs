//! Registered memory with NCCL's names and rules: `cclMemAlloc`/`cclMemFree` (memory suited to
//! registration, not tied to a communicator) and `cclCommRegister`/`cclCommDeregister` (a
//! registration of caller memory with one communicator, behind an opaque handle).
//!
//! What NCCL leaves undefined is an error code here: freeing memory twice or memory
//! `cclMemAlloc` did not return, freeing memory that is still registered, deregistering a
//! handle twice or with another communicator, and deregistering memory that an operation in
//! flight uses.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard};

use oxccl::Pages;

use crate::cclComm_t;
use crate::cclResult_t;
use crate::error::{Fail, guard, out};
use crate::handles::{comm_from, insert_reg, registered_overlap, remove_reg};

/// One allocation: private pages (`cclMemAlloc`) or a communicator's registered memory
/// (`cclCommMemAlloc`).
enum Alloc {
    Pages(Pages),
    Comm(oxccl::Buffer<u8>),
}

impl Alloc {
    fn len(&self) -> usize {
        match self {
            Alloc::Pages(p) => p.as_slice().len(),
            Alloc::Comm(b) => b.len(),
        }
    }
}

#[derive(Default)]
struct Allocs {
    /// Live allocations by address.
    live: BTreeMap<usize, Alloc>,
    /// Addresses freed and not handed out again, to tell a double free from a foreign pointer.
    freed: BTreeSet<usize>,
}

static ALLOCS: Mutex<Option<Allocs>> = Mutex::new(None);

fn allocs() -> MutexGuard<'static, Option<Allocs>> {
    ALLOCS.lock().unwrap_or_else(|p| p.into_inner())
}

c_fn! {
    /// Allocates size bytes (page aligned, zeroed, huge pages when the system has them) into *ptr,
    /// for registration. size 0 is cclInvalidArgument.
    pub fn cclMemAlloc(ptr: *mut *mut c_void, size: usize) -> cclResult_t {
        guard("cclMemAlloc", || {
            out(ptr, "ptr", std::ptr::null_mut())?;
            if size == 0 {
                return Err(Fail::arg("size is 0"));
            }
            if size > isize::MAX as usize {
                return Err(Fail::arg(format!("size {size} exceeds the address space")));
            }
            let mut pages = Pages::new(size)?;
            let p = pages.as_mut_slice().as_mut_ptr();
            keep(p, Alloc::Pages(pages));
            out(ptr, "ptr", p.cast())
        })
    }
}

fn keep(p: *mut u8, a: Alloc) {
    let mut g = allocs();
    let all = g.get_or_insert_with(Allocs::default);
    all.freed.remove(&(p as usize));
    all.live.insert(p as usize, a);
}

c_fn! {
    /// Allocates size bytes registered with comm into *ptr (zeroed, page aligned; no
    /// cclCommRegister needed). On a host whose ranks share memory it comes from comm's shared
    /// arena (CCL_SHM_ARENA_BYTES), which the host's other ranks map: an allreduce whose buffers
    /// lie in such memory on every rank of the host reads and writes them in place. size 0 is
    /// cclInvalidArgument; beyond the arena or the host's memory, cclInvalidUsage. Free it with
    /// cclMemFree (also after comm is destroyed), never while an operation uses it.
    pub fn cclCommMemAlloc(
        comm: cclComm_t,
        ptr: *mut *mut c_void,
        size: usize,
    ) -> cclResult_t {
        guard("cclCommMemAlloc", || {
            out(ptr, "ptr", std::ptr::null_mut())?;
            let c = comm_from(comm)?;
            if size == 0 {
                return Err(Fail::arg("size is 0"));
            }
            let mut b = c.alloc::<u8>(size)?;
            let p = b.as_mut_ptr();
            keep(p, Alloc::Comm(b));
            out(ptr, "ptr", p.cast())
        })
    }
}

c_fn! {
    /// Frees memory from cclMemAlloc or cclCommMemAlloc. A pointer neither returned (or not its
    /// start) is cclInvalidArgument; a double free, or memory still registered with a communicator,
    /// is cclInvalidUsage.
    pub fn cclMemFree(ptr: *mut c_void) -> cclResult_t {
        guard("cclMemFree", || {
            if ptr.is_null() {
                return Err(Fail::arg("ptr is NULL"));
            }
            let at = ptr as usize;
            let mut g = allocs();
            let a = g.get_or_insert_with(Allocs::default);
            let Some(len) = a.live.get(&at).map(Alloc::len) else {
                if a.freed.contains(&at) {
                    return Err(Fail::usage(format!(
                        "{at:#x} was already freed by cclMemFree"
                    )));
                }
                if let Some((start, p)) = a.live.range(..at).next_back()
                    && at < start + p.len()
                {
                    return Err(Fail::arg(format!(
                        "{at:#x} lies inside the allocation at {start:#x}; pass the pointer \
                         cclMemAlloc returned"
                    )));
                }
                return Err(Fail::arg(format!(
                    "{at:#x} was not allocated by cclMemAlloc"
                )));
            };
            if let Some(h) = registered_overlap(at, len) {
                return Err(Fail::usage(format!(
                    "memory at {at:#x} is still registered (registration {h:#x}): \
                     cclCommDeregister it first"
                )));
            }
            a.live.remove(&at);
            a.freed.insert(at);
            Ok(())
        })
    }
}

c_fn! {
    /// Registers size bytes at buff (any caller memory, not only cclMemAlloc's) with comm; *handle
    /// identifies the registration.
    pub fn cclCommRegister(
        comm: cclComm_t,
        buff: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> cclResult_t {
        guard("cclCommRegister", || {
            out(handle, "handle", std::ptr::null_mut())?;
            let c = comm_from(comm)?;
            if buff.is_null() {
                return Err(Fail::arg("buff is NULL"));
            }
            if size == 0 {
                return Err(Fail::arg("size is 0"));
            }
            if size > isize::MAX as usize || (buff as usize).checked_add(size).is_none() {
                return Err(Fail::arg(format!(
                    "{size} bytes at {:#x} exceed the address space",
                    buff as usize
                )));
            }
            // SAFETY: the header's contract: `buff..buff + size` is memory the caller allocated
            // and keeps allocated until it deregisters. The slice lives for this call only; the
            // registration keeps the address, not a reference.
            let mem = unsafe { std::slice::from_raw_parts(buff as *const u8, size) };
            let r = c.register_unbound(mem)?;
            out(handle, "handle", insert_reg(comm, r) as *mut c_void)
        })
    }
}

c_fn! {
    /// Ends a registration (also after comm was destroyed). A handle that is not a live
    /// registration of comm is an error; so is memory an operation in flight on comm uses (a
    /// non-blocking call not yet completed by cclWait/cclTest, or a running one): cclInvalidUsage,
    /// and the registration stays.
    pub fn cclCommDeregister(comm: cclComm_t, handle: *mut c_void) -> cclResult_t {
        guard("cclCommDeregister", || remove_reg(comm, handle as usize))
    }
}
