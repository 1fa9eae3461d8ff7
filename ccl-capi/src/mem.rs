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

/// Allocates `size` bytes of page-aligned memory (huge pages when the system has them), zeroed,
/// for registration with `cclCommRegister`. Free it with `cclMemFree`.
#[unsafe(no_mangle)]
pub extern "C" fn cclMemAlloc(ptr: *mut *mut c_void, size: usize) -> cclResult_t {
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

fn keep(p: *mut u8, a: Alloc) {
    let mut g = allocs();
    let all = g.get_or_insert_with(Allocs::default);
    all.freed.remove(&(p as usize));
    all.live.insert(p as usize, a);
}

/// Allocates `size` bytes registered with `comm` (`Communicator::alloc`): on a host whose
/// ranks share memory, from `comm`'s shared arena, so that collectives on `comm` read and write
/// it in place from the host's other ranks. Free it with `cclMemFree` (also after `comm` was
/// destroyed).
#[unsafe(no_mangle)]
pub(crate) extern "C" fn cclCommMemAlloc(
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

/// Frees memory from `cclMemAlloc`. Refuses NULL, pointers it did not return (or not their
/// start), memory already freed, and memory still registered with a communicator.
#[unsafe(no_mangle)]
pub extern "C" fn cclMemFree(ptr: *mut c_void) -> cclResult_t {
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

/// Registers `size` bytes at `buff` with `comm` and returns the registration in `*handle`.
/// Collectives on `comm` whose buffers lie in registered memory send straight from it where the
/// transport can (verbs). The memory must stay allocated until `cclCommDeregister`.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommRegister(
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

/// Ends registration `handle` of `comm`. Refuses a handle that is not a live registration of
/// `comm`, and memory that an operation in flight on `comm` uses (wait for it first). `comm`
/// may have been destroyed already: the registration does not need it.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommDeregister(comm: cclComm_t, handle: *mut c_void) -> cclResult_t {
    guard("cclCommDeregister", || remove_reg(comm, handle as usize))
}
