//! Registered memory: [`Communicator::alloc`](crate::Communicator::alloc) and
//! [`Communicator::register`](crate::Communicator::register).
//!
//! A registration is tied to its memory by the type system, not by a cache of raw pointers: a
//! [`Registration`] mutably borrows the caller's slice for its whole life and deregisters when
//! dropped, and a [`Buffer`] owns its memory, so neither can outlive what it pins (NCCL's and
//! MPI's registration caches need memory hooks to notice a freed buffer; this needs none). An
//! operation runs on slices borrowed from them (blocking calls) or owns the `Buffer` it works on
//! (non-blocking calls), so the memory cannot be freed or deregistered while an operation uses
//! it.
//!
//! The communicator keeps a table of its live registrations so an operation can tell that a
//! slice it is given lies in one; an entry leaves the table when its owner is dropped, before
//! the memory can be released. Each entry holds one region per transport of the communicator
//! that wants registered memory (verbs); the others (TCP, shared memory, in-process) read and
//! write caller memory directly and register nothing, so registered buffers work everywhere.
//!
//! On a host whose ranks share memory, [`Buffer`]s come from this rank's shared arena
//! (`ccl_shm::arena`), which the host's other ranks map: an allreduce whose buffers lie there
//! on every rank of the host reads and writes them in place (`ccl_algos::direct`).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ccl_core::transport::{MemRegion, Transport};
use ccl_shm::arena::{Arena, Block};
use ccl_shm::pages::Pages;

use crate::{Element, Error, Result};

/// One live registration: the bytes it covers and its regions with the transports.
#[derive(Debug)]
pub(crate) struct Entry {
    id: u64,
    addr: usize,
    len: usize,
    pub regions: Vec<Box<dyn MemRegion>>,
}

impl Entry {
    fn covers(&self, bytes: &[u8]) -> bool {
        let a = bytes.as_ptr() as usize;
        !bytes.is_empty() && a >= self.addr && a + bytes.len() <= self.addr + self.len
    }
}

#[derive(Debug, Default)]
struct State {
    entries: Vec<Arc<Entry>>,
    bytes: usize,
    next_id: u64,
}

/// A communicator's live registrations and the transports that register memory.
pub(crate) struct Registry {
    rank: usize,
    /// The transports the communicator's connections use.
    transports: Vec<Arc<dyn Transport>>,
    /// `CCL_REG_MAX_BYTES` (0 = no limit).
    limit: usize,
    /// This rank's shared arena, when its host's ranks share memory: `alloc` takes memory from
    /// it, which the host's other ranks read and write in place.
    arena: Option<Arc<Arena>>,
    state: Mutex<State>,
    /// Entries in `state`, readable without its lock: every operation looks its buffers up,
    /// and most communicators have no registrations at all.
    live: AtomicUsize,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("rank", &self.rank)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(
        rank: usize,
        transports: Vec<Arc<dyn Transport>>,
        limit: usize,
        arena: Option<Arc<Arena>>,
    ) -> Registry {
        Registry {
            rank,
            transports,
            limit,
            arena,
            state: Mutex::default(),
            live: AtomicUsize::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `mem` with every transport that wants it, within `CCL_REG_MAX_BYTES`.
    fn add(&self, mem: &[u8]) -> Result<Arc<Entry>> {
        let len = mem.len();
        {
            let st = self.state();
            if self.limit > 0 && st.bytes.saturating_add(len) > self.limit {
                return Err(Error::invalid_usage(format!(
                    "registering {len} bytes would exceed CCL_REG_MAX_BYTES={} ({} bytes are \
                     registered already in {} registrations)",
                    self.limit,
                    st.bytes,
                    st.entries.len()
                ))
                .rank(self.rank));
            }
        }
        let mut regions = Vec::new();
        for t in &self.transports {
            if let Some(r) = t.register(mem).map_err(|e| {
                e.context(format!(
                    "registering {len} bytes with the {} transport",
                    t.name()
                ))
                .rank(self.rank)
            })? {
                regions.push(r);
            }
        }
        let mut st = self.state();
        // Checked again: another thread may have registered meanwhile.
        if self.limit > 0 && st.bytes.saturating_add(len) > self.limit {
            return Err(Error::invalid_usage(format!(
                "registering {len} bytes would exceed CCL_REG_MAX_BYTES={} ({} bytes are \
                 registered already)",
                self.limit, st.bytes
            ))
            .rank(self.rank));
        }
        st.next_id += 1;
        let e = Arc::new(Entry {
            id: st.next_id,
            addr: mem.as_ptr() as usize,
            len,
            regions,
        });
        st.entries.push(e.clone());
        st.bytes += len;
        self.live.store(st.entries.len(), Ordering::Release);
        Ok(e)
    }

    fn remove(&self, id: u64) {
        let mut st = self.state();
        if let Some(i) = st.entries.iter().position(|e| e.id == id) {
            let e = st.entries.swap_remove(i);
            st.bytes -= e.len;
            self.live.store(st.entries.len(), Ordering::Release);
        }
    }

    /// The live registration `bytes` lies in, when it has regions with some transport.
    pub(crate) fn lookup(&self, bytes: &[u8]) -> Option<Arc<Entry>> {
        if self.live.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.state()
            .entries
            .iter()
            .find(|e| !e.regions.is_empty() && e.covers(bytes))
            .cloned()
    }

    /// Bytes registered now.
    pub(crate) fn bytes(&self) -> usize {
        self.state().bytes
    }

    /// Registrations live now.
    pub(crate) fn count(&self) -> usize {
        self.state().entries.len()
    }
}

/// Removes an entry from the table when its owner goes; the transports' regions are
/// deregistered when the last reference to the entry is dropped (an operation that looked it up
/// holds one until it ends).
#[derive(Debug)]
struct Ticket {
    registry: Arc<Registry>,
    entry: Arc<Entry>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.registry.remove(self.entry.id);
    }
}

/// A registration that does not borrow its memory, for callers that manage the memory's life
/// themselves: the C ABI's `cclCommRegister`, whose callers promise (as NCCL's do) to
/// deregister before they free. From [`Communicator::register_unbound`](
/// crate::Communicator::register_unbound); deregisters when dropped.
///
/// Nothing unsafe follows from breaking that promise: the transports only read registered
/// memory, and only for a collective whose buffers lie in it, which the collective borrows. But
/// pinned pages outlive a `free`: if the range is freed while registered and the address is
/// mapped again, a collective on the new memory there may send the old pages' bytes. Rust code
/// should use [`Communicator::register`](crate::Communicator::register), where that cannot
/// happen.
#[derive(Debug)]
pub struct UnboundRegistration {
    ticket: Ticket,
}

impl UnboundRegistration {
    pub(crate) fn new(registry: &Arc<Registry>, mem: &[u8]) -> Result<UnboundRegistration> {
        Ok(UnboundRegistration {
            ticket: Ticket {
                registry: registry.clone(),
                entry: registry.add(mem)?,
            },
        })
    }

    /// First byte registered.
    pub fn addr(&self) -> usize {
        self.ticket.entry.addr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.ticket.entry.len
    }

    pub fn is_empty(&self) -> bool {
        self.ticket.entry.len == 0
    }

    /// Whether an operation that is running now uses it (it holds the registration until it
    /// ends).
    pub fn in_use(&self) -> bool {
        // The table's reference and this one; any other is a running operation's.
        Arc::strong_count(&self.ticket.entry) > 2
    }
}

/// The caller's memory registered with a communicator's transports, from
/// [`Communicator::register`](crate::Communicator::register).
///
/// It borrows the memory mutably for its whole life and deregisters it when dropped: the
/// memory cannot be freed, moved or touched other than through the registration while it
/// lives. Use it as the slice it derefs to; collectives given (part of) it send from it without
/// copying on transports that support zero copy, and exactly as from any slice on the others.
///
/// ```no_run
/// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
/// let mut v = vec![0f32; 1024];
/// let mut reg = comm.register(&mut v)?;
/// comm.all_reduce_in_place(&mut reg, oxccl::ReduceOp::Sum)?;
/// drop(reg); // deregisters
/// drop(v);
/// # Ok(()) }
/// ```
///
/// The memory cannot go first:
///
/// ```compile_fail
/// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
/// let mut v = vec![0f32; 1024];
/// let mut reg = comm.register(&mut v)?;
/// drop(v); // error: `v` is borrowed by the registration
/// comm.all_reduce_in_place(&mut reg, oxccl::ReduceOp::Sum)?;
/// # Ok(()) }
/// ```
pub struct Registration<'a, T> {
    mem: &'a mut [T],
    _ticket: Ticket,
}

impl<'a, T: Element> Registration<'a, T> {
    pub(crate) fn new(registry: &Arc<Registry>, mem: &'a mut [T]) -> Result<Registration<'a, T>> {
        let entry = registry.add(bytemuck::cast_slice(&*mem))?;
        Ok(Registration {
            mem,
            _ticket: Ticket {
                registry: registry.clone(),
                entry,
            },
        })
    }
}

impl<T> Deref for Registration<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.mem
    }
}

impl<T> DerefMut for Registration<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.mem
    }
}

impl<T> fmt::Debug for Registration<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Registration({} elements)", self.mem.len())
    }
}

/// Memory allocated and registered by a communicator ([`Communicator::alloc`](
/// crate::Communicator::alloc)): page aligned, zeroed, from the rank's shared arena when its
/// host's ranks share memory ([`is_shared`](Buffer::is_shared)), else private pages (on huge
/// pages when the system has them),
/// registered with every transport of the communicator that needs it, freed and deregistered
/// when dropped. Derefs to `[T]`; being owned and `Send`, it can also be handed to the
/// non-blocking calls, which give it back when the operation ends, so it cannot be freed while
/// an operation uses it:
///
/// ```no_run
/// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
/// let buf = comm.alloc::<f32>(1024)?;
/// let req = comm.all_reduce_async(buf, oxccl::ReduceOp::Sum);
/// let buf = req.wait()?; // given back when the operation ends
/// drop(buf);
/// # Ok(()) }
/// ```
///
/// ```compile_fail
/// # fn f(comm: &oxccl::Communicator) -> oxccl::Result<()> {
/// let buf = comm.alloc::<f32>(1024)?;
/// let req = comm.all_reduce_async(buf, oxccl::ReduceOp::Sum);
/// drop(buf); // error: `buf` was moved into the pending operation
/// let buf = req.wait()?;
/// # Ok(()) }
/// ```
pub struct Buffer<T> {
    // Declared before `mem`: the registration goes before the memory it pins.
    ticket: Ticket,
    mem: Memory,
    len: usize,
    _t: PhantomData<T>,
}

/// Where a [`Buffer`]'s bytes live.
#[derive(Debug)]
enum Memory {
    /// Private pages of this process.
    Private(Pages),
    /// A block of the rank's shared arena, which the host's other ranks map too.
    Shared(Block),
}

impl Memory {
    fn bytes(&self) -> &[u8] {
        match self {
            Memory::Private(p) => p.as_slice(),
            Memory::Shared(b) => b.as_slice(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Memory::Private(p) => p.as_mut_slice(),
            Memory::Shared(b) => b.as_mut_slice(),
        }
    }
}

impl<T: Element> Buffer<T> {
    pub(crate) fn new(registry: &Arc<Registry>, n: usize) -> Result<Buffer<T>> {
        let bytes = n.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::invalid_argument(format!("alloc of {n} elements overflows")).rank(registry.rank)
        })?;
        let mem = match &registry.arena {
            Some(a) => Memory::Shared(a.alloc(bytes).map_err(|e| e.rank(registry.rank))?),
            None => Memory::Private(Pages::new(bytes).map_err(|e| e.rank(registry.rank))?),
        };
        let entry = registry.add(mem.bytes())?;
        Ok(Buffer {
            ticket: Ticket {
                registry: registry.clone(),
                entry,
            },
            mem,
            len: n,
            _t: PhantomData,
        })
    }

    /// Whether huge pages back it (never for shared memory: [`is_shared`](Buffer::is_shared)).
    pub fn huge_pages(&self) -> bool {
        matches!(&self.mem, Memory::Private(p) if p.huge())
    }

    /// Whether it lies in shared memory that the other ranks of this host map too, so
    /// collectives among them read and write it in place (see `docs/design.md`).
    pub fn is_shared(&self) -> bool {
        matches!(self.mem, Memory::Shared(_))
    }

    /// Whether some transport of the communicator holds a registration of it (false when every
    /// connection reads caller memory directly: TCP, shared memory, in-process).
    pub fn is_registered(&self) -> bool {
        !self.ticket.entry.regions.is_empty()
    }
}

impl<T: Element> Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        bytemuck::cast_slice(self.mem.bytes())
    }
}

impl<T: Element> DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        bytemuck::cast_slice_mut(self.mem.bytes_mut())
    }
}

impl<T: Element> AsRef<[T]> for Buffer<T> {
    fn as_ref(&self) -> &[T] {
        self
    }
}

impl<T: Element> AsMut<[T]> for Buffer<T> {
    fn as_mut(&mut self) -> &mut [T] {
        self
    }
}

impl<T> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} elements)", self.len)
    }
}
