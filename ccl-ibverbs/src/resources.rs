//! The verbs objects of one connection: a completion channel and CQ, a control QP and the data
//! QPs, and the two staging rings; how big each is; and their one teardown.
//!
//! Sizes follow from the in-flight bound (`CCL_IB_SLOTS x CCL_IB_SLOT_SIZE` per direction), so
//! the CQ cannot overrun even when every work request is flushed at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::LOG_SUBSYS;
use crate::cq::{CompChannel, Completion, Cq, POLL_BATCH};
use crate::error::VerbsError;
use crate::mr::RegisteredBuf;
use crate::port::IbDevice;
use crate::qp::{ConnParams, Qp, QpState};
use crate::wire::GRANT_LEN;

/// Work request id: kind in the top byte, an index below.
pub(crate) const KIND_SHIFT: u32 = 56;
pub(crate) const DATA_SEND: u64 = 1;
pub(crate) const DATA_RECV: u64 = 2;
pub(crate) const CTRL_SEND: u64 = 3;
pub(crate) const CTRL_RECV: u64 = 4;

pub(crate) fn wr_id(kind: u64, index: usize) -> u64 {
    (kind << KIND_SHIFT) | index as u64
}

/// Sizes fixed when the connection is made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub slots: usize,
    pub slot_size: usize,
    pub nqp: usize,
}

impl Layout {
    /// Send queue depth of each data QP: every slot may be in flight on one QP.
    pub(crate) fn data_send_depth(&self) -> u32 {
        self.slots as u32
    }
    /// Receives kept posted on each data QP.
    pub(crate) fn data_recv_depth(&self) -> u32 {
        self.slots as u32
    }
    /// Credit messages in flight are at most one per slot (see `IbEndpoint::flush_credits`), plus margin.
    pub(crate) fn ctrl_depth(&self) -> u32 {
        self.slots as u32 + 2
    }
    /// CQ entries: every work request that can be posted at once, so even the flush of all of
    /// them after a move to ERR cannot overrun the CQ.
    pub(crate) fn cq_entries(&self) -> u32 {
        (self.data_send_depth() + self.data_recv_depth()) * self.nqp as u32
            + 2 * self.ctrl_depth()
            + 4
    }
    /// Bytes of each staging ring.
    pub(crate) fn ring_bytes(&self) -> usize {
        self.slots * self.slot_size
    }
}

/// The verbs objects of one connection. Dropping it tears the connection down: the QPs go to
/// ERR and what they flush is reaped before anything is destroyed; then the fields are dropped
/// in declaration order, QPs before the CQ and the buffers they reference (every object also
/// holds `Arc`s of its parents).
pub(crate) struct Resources {
    /// `qps[0]` is the control QP, `qps[1..]` the data QPs.
    pub qps: Vec<Qp>,
    /// Holds the completion channel (destroyed after the CQ).
    pub cq: Arc<Cq>,
    /// Local send staging (local access only).
    pub send_buf: RegisteredBuf,
    /// Receive ring the peer writes into (remote write).
    pub recv_buf: RegisteredBuf,
    /// Where control messages with a payload (grants) land: one [`GRANT_LEN`] cell per control
    /// receive, the index of its work request id.
    pub ctrl_buf: RegisteredBuf,
    /// Who the connection joins, for the log lines of the teardown.
    rank: usize,
    peer: usize,
}

impl Resources {
    /// Creates the objects of a connection from `rank` to `peer`, QPs in RESET.
    pub(crate) fn new(
        dev: &IbDevice,
        layout: Layout,
        rank: usize,
        peer: usize,
    ) -> Result<Resources, VerbsError> {
        let channel = CompChannel::new(&dev.ctx)?;
        let cq = Cq::new(&channel, layout.cq_entries())?;
        let ctrl = Qp::new(
            &dev.pd,
            &cq,
            layout.ctrl_depth(),
            layout.ctrl_depth(),
            GRANT_LEN as u32,
        )?;
        let mut qps = vec![ctrl];
        for _ in 0..layout.nqp {
            qps.push(Qp::new(
                &dev.pd,
                &cq,
                layout.data_send_depth(),
                layout.data_recv_depth(),
                0,
            )?);
        }
        Ok(Resources {
            qps,
            cq,
            send_buf: RegisteredBuf::new(&dev.pd, layout.ring_bytes(), false)?,
            recv_buf: RegisteredBuf::new(&dev.pd, layout.ring_bytes(), true)?,
            ctrl_buf: RegisteredBuf::new(&dev.pd, layout.ctrl_depth() as usize * GRANT_LEN, false)?,
            rank,
            peer,
        })
    }

    /// Moves every QP to INIT and posts the receives each keeps posted from then on, so no
    /// message of the peer can find its QP without one.
    pub(crate) fn init(&self, layout: &Layout, base: &ConnParams) -> Result<(), VerbsError> {
        for qp in &self.qps {
            qp.modify(QpState::Init, base)?;
        }
        for i in 0..layout.ctrl_depth() as usize {
            self.post_ctrl_recv(i)?;
        }
        for (i, qp) in self.qps[1..].iter().enumerate() {
            for _ in 0..layout.data_recv_depth() {
                qp.post_recv(wr_id(DATA_RECV, i))?;
            }
        }
        Ok(())
    }
}

impl Resources {
    /// Posts control receive `i` (below `ctrl_depth`) with its cell of `ctrl_buf`.
    pub(crate) fn post_ctrl_recv(&self, i: usize) -> Result<(), VerbsError> {
        let off = i * GRANT_LEN;
        assert!(
            off + GRANT_LEN <= self.ctrl_buf.len(),
            "control cell {i} out of range"
        );
        // SAFETY: the cell lies inside `ctrl_buf` (checked above), registered with its lkey for
        // local write and alive as long as the QP (fields drop in order, QPs first). Each cell
        // belongs to one receive: it is read only after that receive's completion and posted
        // again only after the read.
        unsafe {
            self.qps[0].post_recv_buf(
                wr_id(CTRL_RECV, i),
                self.ctrl_buf.addr() + off as u64,
                GRANT_LEN as u32,
                self.ctrl_buf.lkey(),
            )
        }
    }

    /// The payload of control receive `i`, after its completion was polled.
    pub(crate) fn ctrl_cell(&self, i: usize) -> [u8; GRANT_LEN] {
        let mut b = [0u8; GRANT_LEN];
        let off = i * GRANT_LEN;
        assert!(
            off + GRANT_LEN <= self.ctrl_buf.len(),
            "control cell {i} out of range"
        );
        // SAFETY: in bounds (checked above); the receive that owned the cell completed and is
        // not posted again before this copy, so the device does not write it now.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ctrl_buf.as_ptr().add(off),
                b.as_mut_ptr(),
                GRANT_LEN,
            )
        };
        b
    }
}

impl Drop for Resources {
    fn drop(&mut self) {
        // Stop the QPs and drain what they flush before destroying anything.
        for qp in &self.qps {
            if let Err(e) = qp.to_error() {
                ccl_core::ccl_warn!(Some(self.rank), "peer {}: {e}", self.peer);
            }
        }
        let t0 = Instant::now();
        let mut quiet = 0;
        let mut wcs = [Completion::default(); POLL_BATCH];
        while quiet < 3 && t0.elapsed() < Duration::from_millis(500) {
            match self.cq.poll(&mut wcs) {
                Ok(0) => {
                    quiet += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(_) => quiet = 0,
                Err(_) => break,
            }
        }
        // Every event must be acknowledged before the CQ may be destroyed.
        while let Ok(true) = self.cq.take_event() {}
    }
}
