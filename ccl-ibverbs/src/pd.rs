//! Protection domains.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::ffi::ibv_pd;
use crate::sys::{ibv_alloc_pd, ibv_dealloc_pd};

use crate::LOG_SUBSYS;
use crate::device::Context;
use crate::error::{VerbsError, last_os_error};

/// A protection domain (`ibv_pd`); owns its device context.
#[derive(Debug)]
pub struct Pd {
    pd: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is freed only in Drop, after
// every child (which holds an `Arc<Pd>`) is gone.
unsafe impl Send for Pd {}
// SAFETY: `&Pd` only hands the pointer to thread-safe verbs calls.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: `ctx` is an open context, kept alive by the `Arc` stored in the result.
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::AllocPd {
            device: ctx.name().to_string(),
            source: last_os_error(),
        })?;
        Ok(Arc::new(Pd {
            pd,
            ctx: ctx.clone(),
        }))
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once; MRs and QPs hold `Arc<Pd>`, so none
        // is left.
        let rc = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_dealloc_pd failed: {rc}");
        }
    }
}
