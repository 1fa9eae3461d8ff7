//! The C ABI of ccl: `libccl.so`, `libccl.a` and `include/ccl.h`, shaped like NCCL's `nccl.h`.
//!
//! Every exported function runs inside `guard`: arguments are checked before anything is
//! touched, errors become result codes with a thread-local message ([`cclGetLastError`]), and a
//! panic is caught and reported as `cclInternalError` instead of unwinding into C.
//!
//! Communicators and requests cross the boundary as ids looked up in registries
//! (`handles`), never as pointers to Rust objects, so a destroyed, forged or mixed-up handle is
//! an error code rather than a use of freed memory.
//!
//! Each export is written once, inside `c_fn!`: `include/ccl.h`, the Python package's ctypes
//! declarations and the C++ torch backend's function list are generated from the exports'
//! signatures and doc comments (module `abi`; a unit test fails when a checked-in file is stale,
//! `CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi` rewrites them).

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
// The exports' doc comments are the header's, written for C readers: `recvbuff[i]` is an
// element, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::ffi::{c_char, c_int, c_uint};
use std::time::Duration;

use oxccl::{Communicator, Config, UniqueId};

#[macro_use]
mod abi;
mod buffers;
mod colls;
mod error;
mod group;
mod handles;
mod mem;
mod vcolls;

pub use colls::*;
pub use group::*;
pub use mem::*;
pub use vcolls::*;

use error::{Fail, guard, out};
use handles::{comm_from, remove_comm};

c_enum! {
    /// Result codes, numbered as NCCL's ncclResult_t (1, NCCL's CUDA error, is not used).
    pub enum cclResult_t as RESULT {
        cclSuccess = 0,
        /// an operating-system call failed (socket, memory, thread)
        cclSystemError = 2,
        /// a bug in ccl
        cclInternalError = 3,
        /// a value passed was out of range, NULL or malformed
        cclInvalidArgument = 4,
        /// the call is not allowed now (destroyed handle, failed or aborted communicator, group
        /// misuse)
        cclInvalidUsage = 5,
        /// a peer failed, closed its connection or broke the protocol
        cclRemoteError = 6,
        /// reserved (NCCL's non-blocking initialization)
        cclInProgress = 7,
        /// a wait passed its deadline (CCL_TIMEOUT without progress)
        cclTimeout = 8,
        /// the communicator was revoked (cclCommRevoke, or a shrink): shrink it
        cclRevoked = 9,
        cclNumResults = 10,
    }
}

c_enum! {
    /// Element types, numbered as NCCL's ncclDataType_t. Taken as a plain int, so that any value
    /// can be checked.
    pub enum cclDataType_t as DATA_TYPE {
        cclInt8 = 0,
        cclChar = 0,
        cclUint8 = 1,
        cclInt32 = 2,
        cclInt = 2,
        cclUint32 = 3,
        cclInt64 = 4,
        cclUint64 = 5,
        cclFloat16 = 6,
        cclHalf = 6,
        cclFloat32 = 7,
        cclFloat = 7,
        cclFloat64 = 8,
        cclDouble = 8,
        cclBfloat16 = 9,
        cclNumTypes = 10,
    }
}

c_enum! {
    /// Reduction operators, numbered as NCCL's ncclRedOp_t; the bitwise ones, which NCCL lacks,
    /// follow. Integer sum and product wrap; avg is the sum divided by the number of ranks
    /// (integers truncate toward zero). Bitwise and, or and exclusive or are defined for the
    /// integer types only: with a float type they are cclInvalidArgument.
    pub enum cclRedOp_t as RED_OP {
        cclSum = 0,
        cclProd = 1,
        cclMax = 2,
        cclMin = 3,
        cclAvg = 4,
        cclBAnd = 5,
        cclBOr = 6,
        cclBXor = 7,
        cclNumOps = 8,
    }
}

/// cclCommSplit color of a rank that joins no new communicator.
pub const CCL_SPLIT_NOCOLOR: c_int = -1;
/// Bytes of a cclUniqueId.
pub const CCL_UNIQUE_ID_BYTES: usize = oxccl::UNIQUE_ID_BYTES;

c_struct! {
    /// The token every rank of a communicator passes to cclCommInitRank.
    pub struct cclUniqueId as UNIQUE_ID {
        pub internal: [c_char; CCL_UNIQUE_ID_BYTES],
    }
}

/// Target of `cclComm_t`; never dereferenced (the handle's value is a registry id).
#[repr(C)]
#[derive(Debug)]
pub struct cclComm {
    _opaque: [u8; 0],
}
/// A communicator: an opaque handle, NULL when there is none.
pub type cclComm_t = *mut cclComm;

/// Target of `cclRequest_t`; never dereferenced.
#[repr(C)]
#[derive(Debug)]
pub struct cclRequest {
    _opaque: [u8; 0],
}
/// A non-blocking operation in flight: an opaque handle, finished by cclWait or cclTest.
pub type cclRequest_t = *mut cclRequest;

c_struct! {
    /// Settings of one communicator, for cclCommInitRankConfig (NCCL's ncclConfig_t shape).
    /// Declare it as `cclConfig_t config = CCL_CONFIG_INITIALIZER;` and set the fields wanted: a
    /// field left at CCL_CONFIG_UNDEF_INT takes its CCL_* variable, or its default. size, magic
    /// and version let the library tell which fields the caller's header had; do not change
    /// them.
    pub struct cclConfig_t as CONFIG {
        pub size: usize,
        pub magic: c_uint,
        pub version: c_uint,
        /// Milliseconds any wait of the communicator may go without progress before it fails
        /// with cclTimeout, as CCL_TIMEOUT (which is in seconds) does for the others.
        pub timeoutMs: c_int,
    }
}

/// Marks a cclConfig_t made by CCL_CONFIG_INITIALIZER.
pub const CCL_CONFIG_MAGIC: c_uint = 0xcc1c_0f16;
/// INT_MIN: a field of cclConfig_t left to its CCL_* variable.
pub const CCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// The caller's `cclConfig_t` as this library's struct: `size` bytes of it, the fields past that
/// (from a newer library than the caller's header) left undefined.
fn read_config(p: *const cclConfig_t) -> Result<cclConfig_t, Fail> {
    let mut c = cclConfig_t {
        size: std::mem::size_of::<cclConfig_t>(),
        magic: CCL_CONFIG_MAGIC,
        version: 0,
        timeoutMs: CCL_CONFIG_UNDEF_INT,
    };
    // SAFETY: `p` is not NULL (the caller checked) and the header requires it to point to a
    // `cclConfig_t` made by CCL_CONFIG_INITIALIZER, whose first field is its size; the read
    // makes no alignment assumption.
    let size = unsafe { std::ptr::read_unaligned(p.cast::<usize>()) };
    let head = std::mem::offset_of!(cclConfig_t, timeoutMs);
    if size < head || size > 1 << 16 {
        return Err(Fail::arg(format!(
            "config->size is {size}: initialize the config with CCL_CONFIG_INITIALIZER"
        )));
    }
    let n = size.min(std::mem::size_of::<cclConfig_t>());
    // SAFETY: the caller's struct is `size >= n` bytes (its own `size` field says so, and the
    // header makes that the caller's promise); `c` is a plain-old-data struct of at least `n`
    // bytes, so copying `n` bytes over its start leaves every field initialized; the regions
    // are distinct (one is a local).
    unsafe {
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut c).cast::<u8>(), n);
    }
    if c.magic != CCL_CONFIG_MAGIC {
        return Err(Fail::arg(format!(
            "config->magic is {:#x}, not CCL_CONFIG_MAGIC: initialize the config with \
             CCL_CONFIG_INITIALIZER",
            c.magic
        )));
    }
    Ok(c)
}

/// Settings from the environment with a config's defined fields on top.
fn settings(config: *const cclConfig_t) -> Result<Config, Fail> {
    let mut s = Config::from_env()?;
    if config.is_null() {
        return Ok(s);
    }
    let c = read_config(config)?;
    match c.timeoutMs {
        CCL_CONFIG_UNDEF_INT => {}
        t if t > 0 => s.timeout = Duration::from_millis(t as u64),
        t => {
            return Err(Fail::arg(format!(
                "config->timeoutMs is {t}: a timeout is a positive number of milliseconds \
                 (or CCL_CONFIG_UNDEF_INT for CCL_TIMEOUT)"
            )));
        }
    }
    Ok(s)
}

/// The crate's version: major, minor, patch.
fn version_parts() -> (c_int, c_int, c_int) {
    let p = |s: &str| s.parse::<c_int>().unwrap_or(0);
    (
        p(env!("CARGO_PKG_VERSION_MAJOR")),
        p(env!("CARGO_PKG_VERSION_MINOR")),
        p(env!("CARGO_PKG_VERSION_PATCH")),
    )
}

/// The version as NCCL encodes it: `major * 10000 + minor * 100 + patch`.
fn version_code() -> c_int {
    let (major, minor, patch) = version_parts();
    major * 10000 + minor * 100 + patch
}

c_fn! {
    /// Writes CCL_VERSION_CODE of the library (which may differ from this header's).
    pub fn cclGetVersion(version: *mut c_int) -> cclResult_t {
        guard("cclGetVersion", || out(version, "version", version_code()))
    }
}

c_fn! {
    /// A static description of a result code.
    pub fn cclGetErrorString(result: cclResult_t) -> *const c_char {
        let s: &'static [u8] = match result {
            cclSuccess => b"no error\0",
            cclSystemError => b"unhandled system error (socket, memory or thread failure)\0",
            cclInternalError => b"internal error (a bug in ccl)\0",
            cclInvalidArgument => b"invalid argument\0",
            cclInvalidUsage => b"invalid usage\0",
            cclRemoteError => b"remote process exited or there was a network error\0",
            cclInProgress => b"operation in progress\0",
            cclTimeout => b"timeout: a wait passed its deadline\0",
            cclRevoked => b"the communicator was revoked (shrink it to go on)\0",
            _ => b"unknown result code\0",
        };
        s.as_ptr().cast()
    }
}

c_fn! {
    /// The message of the last failed call on this thread, naming the function and what was wrong
    /// (for instance "cclAllReduce: invalid argument: datatype 42 is not a cclDataType_t"); "" if
    /// none failed yet. Successful calls leave it alone. The string stays valid until the next
    /// failing call on this thread. comm is ignored and may be NULL (NCCL's signature).
    pub fn cclGetLastError(_comm: cclComm_t) -> *const c_char {
        error::last_error_ptr()
    }
}

c_fn! {
    /// Creates a unique id and starts its rendezvous in this process. After set-up the rendezvous
    /// stays on as the job's monitor (failure notices, culprits of hangs, shrink), so this process
    /// should outlive the communicator's ranks. The root listens on CCL_SOCKET_IFNAME (default: the
    /// first non-loopback interface; CCL_SOCKET_IFNAME="=lo" keeps a job on one host on loopback).
    /// Pass the id to every rank.
    pub fn cclGetUniqueId(uniqueId: *mut cclUniqueId) -> cclResult_t {
        guard("cclGetUniqueId", || {
            if uniqueId.is_null() {
                return Err(Fail::arg("uniqueId is NULL"));
            }
            let id = UniqueId::new()?;
            let mut v = cclUniqueId {
                internal: [0; CCL_UNIQUE_ID_BYTES],
            };
            for (d, s) in v.internal.iter_mut().zip(id.as_bytes()) {
                *d = *s as c_char;
            }
            out(uniqueId, "uniqueId", v)
        })
    }
}

/// Publishes a new communicator through `comm`.
fn publish(comm: *mut cclComm_t, name: &str, c: Communicator) -> Result<(), Fail> {
    let h = handles::insert_comm(c);
    out(comm, name, h)
}

c_fn! {
    /// Joins the communicator of commId as rank of nranks; blocks until every rank has joined
    /// (or CCL_TIMEOUT passes). Settings come from CCL_* environment variables.
    pub fn cclCommInitRank(
        comm: *mut cclComm_t,
        nranks: c_int,
        commId: cclUniqueId,
        rank: c_int,
    ) -> cclResult_t {
        guard("cclCommInitRank", || {
            init_rank(comm, nranks, commId, rank, std::ptr::null())
        })
    }
}

c_fn! {
    /// cclCommInitRank with the settings of config (see cclConfig_t) on top of the CCL_* variables;
    /// config may be NULL. A config with a wrong size or magic, or a timeoutMs that is not
    /// positive, is cclInvalidArgument.
    pub fn cclCommInitRankConfig(
        comm: *mut cclComm_t,
        nranks: c_int,
        commId: cclUniqueId,
        rank: c_int,
        config: *mut cclConfig_t,
    ) -> cclResult_t {
        guard("cclCommInitRankConfig", || {
            init_rank(comm, nranks, commId, rank, config)
        })
    }
}

/// cclCommInitRank and cclCommInitRankConfig: checks, then joins.
fn init_rank(
    comm: *mut cclComm_t,
    nranks: c_int,
    commId: cclUniqueId,
    rank: c_int,
    config: *const cclConfig_t,
) -> Result<(), Fail> {
    if comm.is_null() {
        return Err(Fail::arg("comm is NULL"));
    }
    if nranks < 1 {
        return Err(Fail::arg(format!("nranks is {nranks}, must be at least 1")));
    }
    if rank < 0 || rank >= nranks {
        return Err(Fail::arg(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    let settings = settings(config)?;
    let bytes: Vec<u8> = commId.internal.iter().map(|&c| c as u8).collect();
    let id = UniqueId::from_bytes(&bytes)?;
    let c = Communicator::init_with_config(&id, rank as usize, nranks as usize, settings)?;
    publish(comm, "comm", c)
}

c_fn! {
    /// Joins the job described by launcher variables (torchrun, mpirun, srun or CCL_RANK,
    /// CCL_WORLD_SIZE and CCL_UNIQUE_ID / CCL_COMM_ID / MASTER_ADDR).
    pub fn cclCommInitFromEnv(comm: *mut cclComm_t) -> cclResult_t {
        guard("cclCommInitFromEnv", || {
            if comm.is_null() {
                return Err(Fail::arg("comm is NULL"));
            }
            let c = Communicator::from_env()?;
            publish(comm, "comm", c)
        })
    }
}

c_fn! {
    /// Collective over comm: ranks with the same color form a new communicator, ordered by key then
    /// by their rank in comm. A rank passing CCL_SPLIT_NOCOLOR takes part and gets *newcomm = NULL.
    /// config must be NULL: the new communicator has comm's settings.
    pub fn cclCommSplit(
        comm: cclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut cclComm_t,
        config: *mut cclConfig_t,
    ) -> cclResult_t {
        guard("cclCommSplit", || {
            let c = comm_from(comm)?;
            if newcomm.is_null() {
                return Err(Fail::arg("newcomm is NULL"));
            }
            if !config.is_null() {
                return Err(Fail::arg(
                    "config must be NULL (a split communicator has its parent's settings)",
                ));
            }
            let color = match color {
                CCL_SPLIT_NOCOLOR => None,
                c if c >= 0 => Some(c as u32),
                c => {
                    return Err(Fail::arg(format!(
                        "color {c} is negative (use a color >= 0 or CCL_SPLIT_NOCOLOR)"
                    )));
                }
            };
            match c.split(color, i64::from(key))? {
                Some(n) => publish(newcomm, "newcomm", n),
                None => out(newcomm, "newcomm", std::ptr::null_mut()),
            }
        })
    }
}

c_fn! {
    /// Revokes comm on every rank: pending and later operations fail with cclRevoked, here at once
    /// and on the other ranks within milliseconds. revokeFlags must be 0.
    pub fn cclCommRevoke(comm: cclComm_t, revokeFlags: c_int) -> cclResult_t {
        guard("cclCommRevoke", || {
            let c = comm_from(comm)?;
            if revokeFlags != 0 {
                return Err(Fail::arg(format!(
                    "revokeFlags is {revokeFlags}, must be 0"
                )));
            }
            c.revoke();
            Ok(())
        })
    }
}

/// Writes the first `room` of `vals` to `p` (non-NULL when `room > 0`, checked by the caller).
fn write_ints(p: *mut c_int, room: usize, vals: &[usize]) {
    for (i, &v) in vals.iter().take(room).enumerate() {
        // SAFETY: the caller checked `p` is non-NULL when `room > 0`; the C caller passes `room`
        // writable ints, and `i < room`.
        unsafe { p.add(i).write(v as c_int) };
    }
}

/// Copies `n` ints from `p` (non-NULL, checked by the caller).
fn read_ints(p: *const c_int, n: usize) -> Vec<c_int> {
    // SAFETY: the caller checked `p` is non-NULL; the C caller passes `n` readable ints, `n` is
    // bounded by the communicator's size; the slice is copied at once and not kept.
    unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
}

/// Copies a unique id from `p` (non-NULL, checked by the caller).
fn read_uid(p: *const cclUniqueId) -> cclUniqueId {
    // SAFETY: the caller checked `p` is non-NULL; a cclUniqueId is plain bytes, so any value is
    // valid, and it is copied at once.
    unsafe { std::ptr::read(p) }
}

c_fn! {
    /// The ranks the job's rendezvous has reported failed or dead so far, in rank order: the first
    /// min(count, maxRanks) go to ranks; *count is how many there are.
    pub fn cclCommGetFailedRanks(
        comm: cclComm_t,
        ranks: *mut c_int,
        maxRanks: c_int,
        count: *mut c_int,
    ) -> cclResult_t {
        guard("cclCommGetFailedRanks", || {
            let c = comm_from(comm)?;
            let failed = c.failed_ranks();
            let room = usize::try_from(maxRanks)
                .map_err(|_| Fail::arg(format!("maxRanks is {maxRanks}, must be >= 0")))?;
            if room > 0 && ranks.is_null() {
                return Err(Fail::arg(format!("ranks is NULL with maxRanks {room}")));
            }
            write_ints(ranks, room, &failed);
            out(count, "count", failed.len() as c_int)
        })
    }
}

c_fn! {
    /// The survivors of comm: every rank still alive that calls it within CCL_TIMEOUT, minus the
    /// ranks in excludeRanksList (the union over callers), numbered densely in their old order. A
    /// rank dying during the shrink is left out by a further round. An excluded caller gets
    /// cclRevoked. Revokes comm everywhere. config must be NULL, shrinkFlags 0. Needs the process
    /// that made the unique id (it decides who survives) to be alive.
    pub fn cclCommShrink(
        comm: cclComm_t,
        excludeRanksList: *const c_int,
        excludeRanksCount: c_int,
        newcomm: *mut cclComm_t,
        config: *mut cclConfig_t,
        shrinkFlags: c_int,
    ) -> cclResult_t {
        guard("cclCommShrink", || {
            let c = comm_from(comm)?;
            if newcomm.is_null() {
                return Err(Fail::arg("newcomm is NULL"));
            }
            if !config.is_null() {
                return Err(Fail::arg(
                    "config must be NULL (a shrunk communicator has its parent's settings)",
                ));
            }
            if shrinkFlags != 0 {
                return Err(Fail::arg(format!(
                    "shrinkFlags is {shrinkFlags}, must be 0"
                )));
            }
            let n = usize::try_from(excludeRanksCount).map_err(|_| {
                Fail::arg(format!(
                    "excludeRanksCount is {excludeRanksCount}, must be >= 0"
                ))
            })?;
            let exclude: Vec<usize> = if n == 0 {
                Vec::new()
            } else {
                if excludeRanksList.is_null() {
                    return Err(Fail::arg(format!(
                        "excludeRanksList is NULL with {n} entries"
                    )));
                }
                if n > c.size() {
                    return Err(Fail::arg(format!(
                        "excludeRanksCount {n} exceeds the communicator's {} ranks",
                        c.size()
                    )));
                }
                read_ints(excludeRanksList, n)
                    .iter()
                    .map(|&r| {
                        usize::try_from(r)
                            .map_err(|_| Fail::arg(format!("excludeRanksList holds rank {r}")))
                    })
                    .collect::<Result<_, _>>()?
            };
            let s = c.shrink(&exclude)?;
            publish(newcomm, "newcomm", s)
        })
    }
}

c_fn! {
    /// A communicator of nRanks: the ranks of comm keep their ranks (they pass comm and rank -1,
    /// and config NULL); new processes pass comm NULL and their rank (>= comm's size). Every party
    /// passes the same uniqueId, made with cclGetUniqueId by one rank of comm.
    pub fn cclCommGrow(
        comm: cclComm_t,
        nRanks: c_int,
        uniqueId: *const cclUniqueId,
        rank: c_int,
        newcomm: *mut cclComm_t,
        config: *mut cclConfig_t,
    ) -> cclResult_t {
        guard("cclCommGrow", || {
            if uniqueId.is_null() {
                return Err(Fail::arg("uniqueId is NULL"));
            }
            let uid = read_uid(uniqueId);
            if comm.is_null() {
                return init_rank(newcomm, nRanks, uid, rank, config);
            }
            let c = comm_from(comm)?;
            if newcomm.is_null() {
                return Err(Fail::arg("newcomm is NULL"));
            }
            if !config.is_null() {
                return Err(Fail::arg(
                    "config must be NULL for an existing rank (it keeps its communicator's \
                     settings)",
                ));
            }
            if rank != -1 && rank as i64 != c.rank() as i64 {
                return Err(Fail::arg(format!(
                    "rank is {rank} on existing rank {}: pass -1 (an existing rank keeps its rank)",
                    c.rank()
                )));
            }
            let new_size = usize::try_from(nRanks)
                .map_err(|_| Fail::arg(format!("nRanks is {nRanks}, must be positive")))?;
            let bytes: Vec<u8> = uid.internal.iter().map(|&b| b as u8).collect();
            let id = UniqueId::from_bytes(&bytes)?;
            let g = c.grow(&id, new_size)?;
            publish(newcomm, "newcomm", g)
        })
    }
}

c_fn! {
    /// Finishes the operations already issued on comm, then frees it. The handle is invalid
    /// afterwards: later calls with it return cclInvalidUsage.
    pub fn cclCommDestroy(comm: cclComm_t) -> cclResult_t {
        guard("cclCommDestroy", || {
            // Dropping the last reference finishes what was issued; a thread still inside a call
            // holds its own reference and the communicator goes when that call returns.
            drop(remove_comm(comm)?);
            Ok(())
        })
    }
}

c_fn! {
    /// Fails comm at once, ending every wait on it (also on other threads), then frees it.
    pub fn cclCommAbort(comm: cclComm_t) -> cclResult_t {
        guard("cclCommAbort", || {
            let c = remove_comm(comm)?;
            c.abort();
            drop(c);
            Ok(())
        })
    }
}

c_fn! {
    /// The error comm has failed with (sticky: every later operation returns it), or cclSuccess.
    pub fn cclCommGetAsyncError(
        comm: cclComm_t,
        asyncError: *mut cclResult_t,
    ) -> cclResult_t {
        guard("cclCommGetAsyncError", || {
            let c = comm_from(comm)?;
            let code = c.error().map_or(cclSuccess, |e| error::code_of(&e));
            out(asyncError, "asyncError", code)
        })
    }
}

c_fn! {
    /// Number of ranks of comm.
    pub fn cclCommCount(comm: cclComm_t, count: *mut c_int) -> cclResult_t {
        guard("cclCommCount", || {
            let c = comm_from(comm)?;
            out(count, "count", c.size() as c_int)
        })
    }
}

c_fn! {
    /// This process's rank in comm.
    pub fn cclCommUserRank(comm: cclComm_t, rank: *mut c_int) -> cclResult_t {
        guard("cclCommUserRank", || {
            let c = comm_from(comm)?;
            out(rank, "rank", c.rank() as c_int)
        })
    }
}
