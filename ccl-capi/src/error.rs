//! Result codes, the thread-local last-error message, and the guard every export runs in.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use oxccl::ErrorKind;

use crate::{
    cclInternalError, cclInvalidArgument, cclInvalidUsage, cclRemoteError, cclResult_t, cclRevoked,
    cclSuccess, cclSystemError, cclTimeout,
};

/// A failed call: the code to return and the message for `cclGetLastError`.
#[derive(Debug)]
pub(crate) struct Fail {
    pub code: cclResult_t,
    pub msg: String,
}

impl Fail {
    /// `cclInvalidArgument` with `msg`.
    pub(crate) fn arg(msg: impl Into<String>) -> Fail {
        Fail {
            code: cclInvalidArgument,
            msg: format!("invalid argument: {}", msg.into()),
        }
    }

    /// `cclInvalidUsage` with `msg`.
    pub(crate) fn usage(msg: impl Into<String>) -> Fail {
        Fail {
            code: cclInvalidUsage,
            msg: format!("invalid usage: {}", msg.into()),
        }
    }
}

/// The result code of a library error. An aborted communicator is a usage error: the caller
/// (or another thread of it) ended the communicator.
pub(crate) fn code_of(e: &oxccl::Error) -> cclResult_t {
    match e.kind() {
        ErrorKind::InvalidArgument => cclInvalidArgument,
        ErrorKind::InvalidUsage | ErrorKind::Aborted => cclInvalidUsage,
        ErrorKind::System => cclSystemError,
        ErrorKind::Remote => cclRemoteError,
        ErrorKind::Timeout => cclTimeout,
        ErrorKind::Revoked => cclRevoked,
        _ => cclInternalError,
    }
}

impl From<oxccl::Error> for Fail {
    fn from(e: oxccl::Error) -> Fail {
        Fail {
            code: code_of(&e),
            msg: e.to_string(),
        }
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // Ignore a thread that is being torn down.
    let _ = LAST.try_with(|l| *l.borrow_mut() = c);
}

/// Pointer to this thread's last message; valid until the next failing call on this thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    static EMPTY: &[u8] = b"\0";
    catch_unwind(|| LAST.try_with(|l| l.borrow().as_ptr()).ok())
        .ok()
        .flatten()
        .unwrap_or(EMPTY.as_ptr().cast())
}

/// Runs an export: its error becomes a code and this thread's message, prefixed with the
/// function's name; a panic becomes `cclInternalError`.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Result<(), Fail>) -> cclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => cclSuccess,
        Ok(Err(e)) => {
            set_last(format!("{name}: {}", e.msg));
            e.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Dropping the payload could itself panic; leak it instead.
            std::mem::forget(p);
            set_last(format!("{name}: internal error: {what}"));
            cclInternalError
        }
    }
}

/// Writes `v` through an output pointer, refusing NULL; the pointer need not be aligned.
pub(crate) fn out<T>(p: *mut T, name: &str, v: T) -> Result<(), Fail> {
    if p.is_null() {
        return Err(Fail::arg(format!("{name} is NULL")));
    }
    // SAFETY:
    // - `p` is not NULL, and the header documents that it must point to a writable `T`: that is
    //   the caller's part of the contract, which cannot be checked here.
    // - `write_unaligned` makes no alignment assumption, so a misaligned pointer is no UB.
    unsafe { p.write_unaligned(v) };
    Ok(())
}
