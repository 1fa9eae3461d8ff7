//! Completion queues and completion channels: busy-poll the CQ, then sleep on the channel's fd.

use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::ffi::{
    IBV_WC_WITH_IMM, ibv_comp_channel, ibv_cq, ibv_poll_cq, ibv_req_notify_cq, ibv_wc,
};
use crate::sys::{
    ibv_ack_cq_events, ibv_create_comp_channel, ibv_create_cq, ibv_destroy_comp_channel,
    ibv_destroy_cq, ibv_get_cq_event,
};

use crate::LOG_SUBSYS;
use crate::device::Context;
use crate::error::{VerbsError, errno_error, last_os_error};

/// A completion channel (`ibv_comp_channel`): a file descriptor that becomes readable when an
/// armed CQ gets a completion. Its fd is non-blocking.
#[derive(Debug)]
pub struct CompChannel {
    ch: NonNull<ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: verbs objects may be used from any thread; freed only in Drop after the CQs that
// use it (they hold an `Arc<CompChannel>`).
unsafe impl Send for CompChannel {}
// SAFETY: `&CompChannel` only exposes the fd and the pointer for thread-safe verbs calls.
unsafe impl Sync for CompChannel {}

impl CompChannel {
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<CompChannel>, VerbsError> {
        // SAFETY: `ctx` is open and outlives the channel (Arc stored below).
        let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| VerbsError::CreateCompChannel {
            device: ctx.name().to_string(),
            source: last_os_error(),
        })?;
        let c = CompChannel {
            ch,
            ctx: ctx.clone(),
        };
        let fd = c.raw_fd();
        let nonblocking = fcntl(fd, FcntlArg::F_GETFL).and_then(|fl| {
            let fl = OFlag::from_bits_retain(fl) | OFlag::O_NONBLOCK;
            fcntl(fd, FcntlArg::F_SETFL(fl))
        });
        if let Err(e) = nonblocking {
            return Err(VerbsError::CreateCompChannel {
                device: ctx.name().to_string(),
                source: e.into(),
            });
        }
        Ok(Arc::new(c))
    }

    fn raw_fd(&self) -> RawFd {
        // SAFETY: the channel is live until Drop; `fd` is a plain field.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The descriptor to `poll(2)` for POLLIN.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the fd is owned by the channel and stays open until the channel is destroyed,
        // which cannot happen while `&self` is borrowed.
        unsafe { BorrowedFd::borrow_raw(self.raw_fd()) }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_comp_channel`, destroyed once; CQs hold an Arc to it so
        // none is attached any more.
        let rc = unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(
                None,
                "ibv_destroy_comp_channel({}) failed: {rc}",
                self.ctx.name()
            );
        }
    }
}

/// A completion queue bound to a completion channel, shared through `Arc` by the QPs that
/// report to it.
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<ibv_cq>,
    entries: u32,
    channel: Arc<CompChannel>,
}

// SAFETY: a CQ may be used from any thread; freed only in Drop.
unsafe impl Send for Cq {}
// SAFETY: CQs made by `ibv_create_cq` (not the single-threaded extended kind) are thread-safe:
// providers serialize polling and arming with their own lock.
unsafe impl Sync for Cq {}

/// A work completion, copied out of the CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// Host order; `None` without `IBV_WC_WITH_IMM`.
    pub imm: Option<u32>,
    pub qp_num: u32,
}

/// How many completions one poll reads at most.
pub const POLL_BATCH: usize = 32;

impl Cq {
    /// A CQ with room for `entries` completions (size it from the in-flight bound: an overrun
    /// puts the CQ in error).
    pub fn new(channel: &Arc<CompChannel>, entries: u32) -> Result<Arc<Cq>, VerbsError> {
        // SAFETY:
        // - The channel's context is open and the channel outlives the CQ (Arc stored below).
        // - No cq_context; completion vector 0.
        let cq = unsafe {
            ibv_create_cq(
                channel.ctx.as_ptr(),
                entries as i32,
                std::ptr::null_mut(),
                channel.ch.as_ptr(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::CreateCq {
            entries,
            source: last_os_error(),
        })?;
        Ok(Arc::new(Cq {
            cq,
            entries,
            channel: channel.clone(),
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    pub fn channel(&self) -> &Arc<CompChannel> {
        &self.channel
    }

    /// Reads up to `out.len()` (at most [`POLL_BATCH`]) completions; returns how many.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize, VerbsError> {
        // SAFETY: `ibv_wc` is a plain C struct (integers and a union of integers); all-zero is
        // a valid value.
        let mut wcs: [ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        let want = out.len().min(POLL_BATCH) as i32;
        // SAFETY:
        // - `self.cq` is a live CQ, thread-safe (see the Sync impl).
        // - `wcs` has room for `want` entries.
        let n = unsafe { ibv_poll_cq(self.cq.as_ptr(), want, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::PollCq(errno_error(n)));
        }
        let n = n as usize;
        for (o, w) in out.iter_mut().zip(&wcs[..n]) {
            let has_imm = w.wc_flags & IBV_WC_WITH_IMM != 0;
            // SAFETY: the union holds `imm_data` when IBV_WC_WITH_IMM is set (read only then);
            // both members are plain u32 anyway.
            let imm = has_imm.then(|| u32::from_be(unsafe { w.imm.imm_data }));
            *o = Completion {
                wr_id: w.wr_id,
                status: w.status,
                opcode: w.opcode,
                vendor_err: w.vendor_err,
                byte_len: w.byte_len,
                imm,
                qp_num: w.qp_num,
            };
        }
        Ok(n)
    }

    /// Arms the CQ: the channel's fd becomes readable at the next completion. Poll again after
    /// arming, before sleeping, or a completion that arrived in between is missed.
    pub fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: live CQ; arming is thread-safe.
        let rc = unsafe { ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(VerbsError::ReqNotifyCq(errno_error(rc)));
        }
        Ok(())
    }

    /// Consumes a pending event of the channel without blocking (and acknowledges it); returns
    /// whether there was one. The CQ is disarmed after an event.
    pub fn take_event(&self) -> Result<bool, VerbsError> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY:
        // - The channel is live and non-blocking, so this returns at once.
        // - `cq` and `ctx` are valid out-pointers.
        let rc = unsafe { ibv_get_cq_event(self.channel.ch.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(VerbsError::GetCqEvent(e));
        }
        debug_assert_eq!(cq, self.cq.as_ptr(), "one CQ per channel");
        // SAFETY: `cq` is the CQ the event came from (ours: one CQ per channel); acknowledging
        // each event right away keeps the count of unacknowledged events at zero for destroy.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(true)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY:
        // - Created by `ibv_create_cq`, destroyed once.
        // - QPs using it hold an `Arc<Cq>` (the endpoint drops them first); every event was
        //   acknowledged in `take_event`, as `ibv_destroy_cq` requires.
        let rc = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_destroy_cq failed: {rc}");
        }
    }
}
