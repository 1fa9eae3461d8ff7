//! Handle registries: what a `cclComm_t` or `cclRequest_t` really is.
//!
//! A handle's value is an id, `tag << 40 | n`, with a tag per kind of handle and `n` counting up
//! from 1 and never reused. Looking an id up in its registry either finds the live object or
//! tells what the value is: a destroyed communicator or finished request (`n` was handed out),
//! the other kind of handle (the tag), or something this library never made. Nothing is ever
//! dereferenced, so no value a caller passes can reach freed memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use oxccl::Communicator;

use crate::error::Fail;
use crate::{cclComm, cclComm_t, cclRequest, cclRequest_t};

#[cfg(not(target_pointer_width = "64"))]
compile_error!("ccl-capi encodes handles in 64-bit pointers");

const COUNTER_BITS: u32 = 40;
const COMM_TAG: usize = 0xcc1c;
const REQUEST_TAG: usize = 0xcc1e;
const REG_TAG: usize = 0xcc1f;

/// A non-blocking operation behind a `cclRequest_t`.
pub(crate) trait Pending: Send {
    /// Whether it has finished.
    fn done(&self) -> bool;
    /// Waits for it and returns its result.
    fn finish(self: Box<Self>) -> oxccl::Result<()>;
    /// Whether it runs on communicator `comm` and uses memory overlapping `addr..addr + len`.
    fn touches(&self, _comm: usize, _addr: usize, _len: usize) -> bool {
        false
    }
}

/// A request with the communicator and caller memory it uses, so deregistering that memory
/// while the request is pending can be refused.
pub(crate) struct Tracked<P> {
    /// The communicator's handle value.
    pub comm: usize,
    /// `(address, length)` of each caller buffer.
    pub ranges: Vec<(usize, usize)>,
    pub inner: P,
}

impl<P: Pending> Pending for Tracked<P> {
    fn done(&self) -> bool {
        self.inner.done()
    }

    fn finish(self: Box<Self>) -> oxccl::Result<()> {
        Box::new(self.inner).finish()
    }

    fn touches(&self, comm: usize, addr: usize, len: usize) -> bool {
        comm == self.comm
            && self
                .ranges
                .iter()
                .any(|&(a, l)| l > 0 && len > 0 && a < addr + len && addr < a + l)
    }
}

impl<B: Send> Pending for oxccl::Request<B> {
    fn done(&self) -> bool {
        self.test()
    }

    fn finish(self: Box<Self>) -> oxccl::Result<()> {
        (*self).wait().map(drop)
    }
}

struct Registry<T> {
    tag: usize,
    kind: &'static str,
    gone: &'static str,
    next: usize,
    live: BTreeMap<usize, T>,
}

impl<T> Registry<T> {
    const fn new(tag: usize, kind: &'static str, gone: &'static str) -> Registry<T> {
        Registry {
            tag,
            kind,
            gone,
            next: 1,
            live: BTreeMap::new(),
        }
    }

    fn insert(&mut self, v: T) -> usize {
        let h = (self.tag << COUNTER_BITS) | self.next;
        self.next += 1;
        self.live.insert(h, v);
        h
    }

    /// Why `h` is not a live handle of this registry.
    fn why_not(&self, h: usize) -> Fail {
        if h == 0 {
            return Fail::arg(format!("the {} handle is NULL", self.kind));
        }
        let (tag, n) = (h >> COUNTER_BITS, h & ((1 << COUNTER_BITS) - 1));
        if tag == self.tag && n >= 1 && n < self.next {
            return Fail::usage(format!("{} {h:#x} was {}", self.kind, self.gone));
        }
        let other = match tag {
            COMM_TAG => Some("communicator"),
            REQUEST_TAG => Some("request"),
            REG_TAG => Some("registration"),
            _ => None,
        };
        match other {
            Some(o) if o != self.kind => {
                Fail::arg(format!("{h:#x} is a {o} handle, not a {}", self.kind))
            }
            _ => Fail::arg(format!(
                "{h:#x} is not a {} handle (this library never made it)",
                self.kind
            )),
        }
    }

    fn get(&self, h: usize) -> Result<&T, Fail> {
        self.live.get(&h).ok_or_else(|| self.why_not(h))
    }

    fn remove(&mut self, h: usize) -> Result<T, Fail> {
        match self.live.remove(&h) {
            Some(v) => Ok(v),
            None => Err(self.why_not(h)),
        }
    }
}

static COMMS: Mutex<Registry<Arc<Communicator>>> =
    Mutex::new(Registry::new(COMM_TAG, "communicator", "destroyed"));
static REGS: Mutex<Registry<(usize, oxccl::UnboundRegistration)>> =
    Mutex::new(Registry::new(REG_TAG, "registration", "deregistered"));
static REQUESTS: Mutex<Registry<Box<dyn Pending>>> = Mutex::new(Registry::new(
    REQUEST_TAG,
    "request",
    "already completed (by cclWait, or cclTest reporting done)",
));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The registries hold no invariant a panic could break halfway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers a communicator and returns its handle.
pub(crate) fn insert_comm(c: Communicator) -> cclComm_t {
    lock(&COMMS).insert(Arc::new(c)) as *mut cclComm
}

/// The live communicator behind `h`.
pub(crate) fn comm_from(h: cclComm_t) -> Result<Arc<Communicator>, Fail> {
    lock(&COMMS).get(h as usize).cloned()
}

/// Whether `h` is a live communicator.
pub(crate) fn comm_live(h: cclComm_t) -> bool {
    lock(&COMMS).get(h as usize).is_ok()
}

/// Unregisters the communicator behind `h`; it is freed when the last user lets go.
pub(crate) fn remove_comm(h: cclComm_t) -> Result<Arc<Communicator>, Fail> {
    lock(&COMMS).remove(h as usize)
}

/// Registers a request and returns its handle.
pub(crate) fn insert_request(p: Box<dyn Pending>) -> cclRequest_t {
    lock(&REQUESTS).insert(p) as *mut cclRequest
}

/// The request's result if it has finished (then it is unregistered), `None` if it has not.
pub(crate) fn test_request(h: cclRequest_t) -> Result<Option<oxccl::Result<()>>, Fail> {
    let p = {
        let mut r = lock(&REQUESTS);
        if !r.get(h as usize)?.done() {
            return Ok(None);
        }
        r.remove(h as usize)?
    };
    Ok(Some(p.finish()))
}

/// Unregisters the request behind `h` so the caller can wait for it.
pub(crate) fn take_request(h: cclRequest_t) -> Result<Box<dyn Pending>, Fail> {
    lock(&REQUESTS).remove(h as usize)
}

/// A registration of caller memory with communicator `comm` (`cclCommRegister`).
pub(crate) fn insert_reg(comm: cclComm_t, r: oxccl::UnboundRegistration) -> usize {
    let comm = comm as usize;
    lock(&REGS).insert((comm, r))
}

/// Unregisters registration `h` of `comm`, unless an operation uses its memory: a running one,
/// or a pending request on `comm` whose buffers overlap it.
pub(crate) fn remove_reg(comm: cclComm_t, h: usize) -> Result<(), Fail> {
    let comm = comm as usize;
    let mut regs = lock(&REGS);
    let (owner, r) = regs.get(h)?;
    if *owner != comm {
        return Err(Fail::arg(format!(
            "registration {h:#x} belongs to communicator {:#x}, not {:#x}",
            *owner, comm
        )));
    }
    let (addr, len) = (r.addr(), r.len());
    let busy = r.in_use()
        || lock(&REQUESTS)
            .live
            .iter()
            .find(|(_, p)| !p.done() && p.touches(comm, addr, len))
            .map(|(k, _)| *k)
            .is_some();
    if busy {
        return Err(Fail::usage(format!(
            "registration {h:#x} ({len} bytes at {addr:#x}) is used by an operation in flight: \
             wait for it (cclWait) before deregistering"
        )));
    }
    regs.remove(h)?;
    Ok(())
}

/// Whether some live registration (with any communicator) overlaps `addr..addr + len`.
pub(crate) fn registered_overlap(addr: usize, len: usize) -> Option<usize> {
    lock(&REGS)
        .live
        .iter()
        .find(|(_, (_, r))| r.addr() < addr + len && addr < r.addr() + r.len())
        .map(|(h, _)| *h)
}
