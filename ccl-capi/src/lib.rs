//! The C ABI of ccl: `libccl.so`, `libccl.a` and `include/ccl.h`, shaped like NCCL's `nccl.h`.
//!
//! Every exported function runs inside `guard`: arguments are checked before anything is
//! touched, errors become result codes with a thread-local message ([`cclGetLastError`]), and a
//! panic is caught and reported as `cclInternalError` instead of unwinding into C.
//!
//! Communicators and requests cross the boundary as ids looked up in registries
//! (`handles`), never as pointers to Rust objects, so a destroyed, forged or mixed-up handle is
//! an error code rather than a use of freed memory.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint};
use std::time::Duration;

use oxccl::{Communicator, Config, UniqueId};

mod buffers;
mod colls;
mod error;
mod group;
mod handles;
mod mem;
mod vcolls;

pub use colls::*;
pub use group::{cclGroupEnd, cclGroupStart, cclProbe, cclRecv, cclSend};
pub use mem::{cclCommDeregister, cclCommRegister, cclMemAlloc, cclMemFree};
pub use vcolls::*;

use error::{Fail, guard, out};
use handles::{comm_from, remove_comm};

/// `cclResult_t`: NCCL's result codes (`int`-sized, like the C enum).
pub type cclResult_t = c_int;
pub const cclSuccess: cclResult_t = 0;
pub const cclSystemError: cclResult_t = 2;
pub const cclInternalError: cclResult_t = 3;
pub const cclInvalidArgument: cclResult_t = 4;
pub const cclInvalidUsage: cclResult_t = 5;
pub const cclRemoteError: cclResult_t = 6;
pub const cclInProgress: cclResult_t = 7;
pub const cclTimeout: cclResult_t = 8;
pub const cclRevoked: cclResult_t = 9;
pub const cclNumResults: cclResult_t = 10;

/// `cclDataType_t`: NCCL's numbering. Taken as a plain `int` so any value can be checked.
pub type cclDataType_t = c_int;
pub const cclInt8: cclDataType_t = 0;
pub const cclChar: cclDataType_t = 0;
pub const cclUint8: cclDataType_t = 1;
pub const cclInt32: cclDataType_t = 2;
pub const cclInt: cclDataType_t = 2;
pub const cclUint32: cclDataType_t = 3;
pub const cclInt64: cclDataType_t = 4;
pub const cclUint64: cclDataType_t = 5;
pub const cclFloat16: cclDataType_t = 6;
pub const cclHalf: cclDataType_t = 6;
pub const cclFloat32: cclDataType_t = 7;
pub const cclFloat: cclDataType_t = 7;
pub const cclFloat64: cclDataType_t = 8;
pub const cclDouble: cclDataType_t = 8;
pub const cclBfloat16: cclDataType_t = 9;
pub const cclNumTypes: cclDataType_t = 10;

/// `cclRedOp_t`: NCCL's numbering, taken as a plain `int`; the bitwise operators (which NCCL
/// lacks) follow NCCL's five.
pub type cclRedOp_t = c_int;
pub const cclSum: cclRedOp_t = 0;
pub const cclProd: cclRedOp_t = 1;
pub const cclMax: cclRedOp_t = 2;
pub const cclMin: cclRedOp_t = 3;
pub const cclAvg: cclRedOp_t = 4;
pub const cclBAnd: cclRedOp_t = 5;
pub const cclBOr: cclRedOp_t = 6;
pub const cclBXor: cclRedOp_t = 7;
pub const cclNumOps: cclRedOp_t = 8;

/// `CCL_SPLIT_NOCOLOR`.
pub const CCL_SPLIT_NOCOLOR: c_int = -1;
/// `CCL_UNIQUE_ID_BYTES`.
pub const CCL_UNIQUE_ID_BYTES: usize = oxccl::UNIQUE_ID_BYTES;

/// `cclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cclUniqueId {
    pub internal: [c_char; CCL_UNIQUE_ID_BYTES],
}

/// Target of `cclComm_t`; never dereferenced (the handle's value is a registry id).
#[repr(C)]
#[derive(Debug)]
pub struct cclComm {
    _opaque: [u8; 0],
}
/// `cclComm_t`.
pub type cclComm_t = *mut cclComm;

/// Target of `cclRequest_t`; never dereferenced.
#[repr(C)]
#[derive(Debug)]
pub struct cclRequest {
    _opaque: [u8; 0],
}
/// `cclRequest_t`.
pub type cclRequest_t = *mut cclRequest;

/// `cclConfig_t`: settings of one communicator for [`cclCommInitRankConfig`], shaped like
/// NCCL's `ncclConfig_t`: `size`, `magic` and `version` come from `CCL_CONFIG_INITIALIZER`, so a
/// library can tell which fields a caller's header had; a field left at `CCL_CONFIG_UNDEF_INT`
/// takes its `CCL_*` variable (or default).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct cclConfig_t {
    pub size: usize,
    pub magic: c_uint,
    pub version: c_uint,
    /// Milliseconds any wait of this communicator may go without progress (`CCL_TIMEOUT`).
    pub timeoutMs: c_int,
}

/// `CCL_CONFIG_MAGIC`: marks a `cclConfig_t` made by `CCL_CONFIG_INITIALIZER`.
pub const CCL_CONFIG_MAGIC: c_uint = 0xcc1c_0f16;
/// `CCL_CONFIG_UNDEF_INT` (`INT_MIN`): a field left to its `CCL_*` variable.
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

/// The version as NCCL encodes it: `major * 10000 + minor * 100 + patch`.
pub fn version_code() -> c_int {
    let p = |s: &str| s.parse::<c_int>().unwrap_or(0);
    p(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + p(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + p(env!("CARGO_PKG_VERSION_PATCH"))
}

/// Writes the library's version code.
#[unsafe(no_mangle)]
pub extern "C" fn cclGetVersion(version: *mut c_int) -> cclResult_t {
    guard("cclGetVersion", || out(version, "version", version_code()))
}

/// A static description of `result`.
#[unsafe(no_mangle)]
pub extern "C" fn cclGetErrorString(result: cclResult_t) -> *const c_char {
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

/// The message of the last failed call on this thread ("" if none).
#[unsafe(no_mangle)]
pub extern "C" fn cclGetLastError(_comm: cclComm_t) -> *const c_char {
    error::last_error_ptr()
}

/// Creates a unique id (and its rendezvous root in this process).
#[unsafe(no_mangle)]
pub extern "C" fn cclGetUniqueId(uniqueId: *mut cclUniqueId) -> cclResult_t {
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

/// Publishes a new communicator through `comm`.
fn publish(comm: *mut cclComm_t, name: &str, c: Communicator) -> Result<(), Fail> {
    let h = handles::insert_comm(c);
    out(comm, name, h)
}

/// Joins a communicator by unique id.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommInitRank(
    comm: *mut cclComm_t,
    nranks: c_int,
    commId: cclUniqueId,
    rank: c_int,
) -> cclResult_t {
    guard("cclCommInitRank", || {
        init_rank(comm, nranks, commId, rank, std::ptr::null())
    })
}

/// Joins a communicator by unique id with the settings of `config` (NULL: as cclCommInitRank).
#[unsafe(no_mangle)]
pub extern "C" fn cclCommInitRankConfig(
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

/// Joins the job described by launcher variables.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommInitFromEnv(comm: *mut cclComm_t) -> cclResult_t {
    guard("cclCommInitFromEnv", || {
        if comm.is_null() {
            return Err(Fail::arg("comm is NULL"));
        }
        let c = Communicator::from_env()?;
        publish(comm, "comm", c)
    })
}

/// Splits `comm` by color and key.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommSplit(
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

/// Revokes `comm` on every rank.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommRevoke(comm: cclComm_t, revokeFlags: c_int) -> cclResult_t {
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

/// The ranks the job's root has reported failed or dead.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommGetFailedRanks(
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

/// The survivors' communicator, without the excluded ranks and the dead.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommShrink(
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

/// A larger communicator: existing ranks pass `comm`, new processes pass NULL and their rank.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommGrow(
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
                "config must be NULL for an existing rank (it keeps its communicator's settings)",
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

/// Finishes issued operations and frees the communicator.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommDestroy(comm: cclComm_t) -> cclResult_t {
    guard("cclCommDestroy", || {
        // Dropping the last reference finishes what was issued; a thread still inside a call
        // holds its own reference and the communicator goes when that call returns.
        drop(remove_comm(comm)?);
        Ok(())
    })
}

/// Aborts and frees the communicator.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommAbort(comm: cclComm_t) -> cclResult_t {
    guard("cclCommAbort", || {
        let c = remove_comm(comm)?;
        c.abort();
        drop(c);
        Ok(())
    })
}

/// The communicator's sticky error, or success.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommGetAsyncError(
    comm: cclComm_t,
    asyncError: *mut cclResult_t,
) -> cclResult_t {
    guard("cclCommGetAsyncError", || {
        let c = comm_from(comm)?;
        let code = c.error().map_or(cclSuccess, |e| error::code_of(&e));
        out(asyncError, "asyncError", code)
    })
}

/// Number of ranks.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommCount(comm: cclComm_t, count: *mut c_int) -> cclResult_t {
    guard("cclCommCount", || {
        let c = comm_from(comm)?;
        out(count, "count", c.size() as c_int)
    })
}

/// This process's rank.
#[unsafe(no_mangle)]
pub extern "C" fn cclCommUserRank(comm: cclComm_t, rank: *mut c_int) -> cclResult_t {
    guard("cclCommUserRank", || {
        let c = comm_from(comm)?;
        out(rank, "rank", c.rank() as c_int)
    })
}
