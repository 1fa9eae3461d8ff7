//! Devices: fork safety, the device list, an open device context and its port attributes.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use crate::ffi::{IBV_PORT_ACTIVE, ibv_context, ibv_port_attr};
use crate::sys::{
    ___ibv_query_port, ibv_close_device, ibv_fork_init, ibv_free_device_list, ibv_get_device_list,
    ibv_get_device_name, ibv_open_device,
};

use crate::LOG_SUBSYS;
use crate::error::{VerbsError, errno_error, last_os_error};

/// `ibv_port_attr.link_layer` values.
pub const LINK_LAYER_INFINIBAND: u8 = 1;
pub const LINK_LAYER_ETHERNET: u8 = 2;

static FORK_INIT: OnceLock<Result<(), i32>> = OnceLock::new();

/// Calls `ibv_fork_init` once per process, before any other verbs call this crate makes.
///
/// Registered memory must not be shared copy-on-write with a child process (the child's writes
/// would move pages under the device), and programs that use oxccl do fork: data loaders, the
/// benchmark's launcher, `subprocess`. `ibv_fork_init` marks registered ranges `MADV_DONTFORK`;
/// on kernels that copy pinned pages at fork (5.13+) it is a no-op. Every verbs entry point of
/// this crate goes through [`Context::open`] or [`device_names`], which call this first.
///
/// It first loads libibverbs ([`crate::sys::load`]): this is where a host without rdma-core
/// gets its error.
pub fn fork_init() -> Result<(), VerbsError> {
    crate::sys::load().map_err(VerbsError::Load)?;
    let r = FORK_INIT.get_or_init(|| {
        // SAFETY:
        // - `ibv_fork_init` takes no arguments and only sets library-global state.
        // - It runs once (OnceLock), before this crate makes any other verbs call, as the
        //   library requires; a verbs call made by other code in the process first makes it
        //   return an error, which is reported, not ignored.
        let rc = unsafe { ibv_fork_init() };
        if rc == 0 { Ok(()) } else { Err(rc) }
    });
    r.map_err(|rc| VerbsError::ForkInit(errno_error(rc)))
}

/// Names of the verbs devices libibverbs knows (`rxe0`, `mlx5_0`, ...).
pub fn device_names() -> Result<Vec<String>, VerbsError> {
    fork_init()?;
    let mut n: i32 = 0;
    // SAFETY:
    // - `n` is a valid, writable c_int for the count.
    // - The returned array is freed below with `ibv_free_device_list`, exactly once.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::GetDeviceList(last_os_error()));
    }
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY:
        // - `list` holds `n` valid device pointers (the library's contract), `i < n`.
        // - `ibv_get_device_name` returns a NUL-terminated name owned by the device, which
        //   lives until the list is freed; it is copied out before that.
        let name = unsafe {
            let dev = *list.add(i);
            CStr::from_ptr(ibv_get_device_name(dev))
                .to_string_lossy()
                .into_owned()
        };
        out.push(name);
    }
    // SAFETY: `list` came from `ibv_get_device_list` and is freed once; no pointer into it is
    // used afterwards.
    unsafe { ibv_free_device_list(list) };
    Ok(out)
}

/// What the transport needs to know about a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    pub active: bool,
    /// `ibv_mtu` code (1 = 256 ... 5 = 4096).
    pub active_mtu: u8,
    pub lid: u16,
    pub link_layer: u8,
}

/// An open device (`ibv_context`). Owned through `Arc` by every object made from it.
#[derive(Debug)]
pub struct Context {
    ctx: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe: every verb on a context may be called from any
// thread (the library locks internally where needed); the pointer is only freed in Drop.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only gives out the raw pointer for verbs calls.
unsafe impl Sync for Context {}

impl Context {
    /// Opens the device called `name`.
    pub fn open(name: &str) -> Result<Arc<Context>, VerbsError> {
        fork_init()?;
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below exactly once.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::GetDeviceList(last_os_error()));
        }
        let mut ctx = std::ptr::null_mut();
        let mut found = false;
        let mut open_err = None;
        for i in 0..n.max(0) as usize {
            // SAFETY:
            // - `list` holds `n` valid device pointers and `i < n`.
            // - The name pointer is valid while the list is alive and is only read here.
            // - `ibv_open_device` on a listed device returns a context that stays valid after
            //   the list is freed (documented by libibverbs).
            unsafe {
                let dev = *list.add(i);
                if CStr::from_ptr(ibv_get_device_name(dev)).to_bytes() == name.as_bytes() {
                    found = true;
                    ctx = ibv_open_device(dev);
                    if ctx.is_null() {
                        open_err = Some(last_os_error());
                    }
                    break;
                }
            }
        }
        // SAFETY: freed once; `ctx` does not point into the list.
        unsafe { ibv_free_device_list(list) };
        if !found {
            return Err(VerbsError::OpenDevice {
                device: name.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "libibverbs does not list this device (is its userspace provider, e.g. ibverbs-providers, installed?)",
                ),
            });
        }
        let ctx = NonNull::new(ctx).ok_or_else(|| VerbsError::OpenDevice {
            device: name.to_string(),
            source: open_err.unwrap_or_else(last_os_error),
        })?;
        Ok(Arc::new(Context {
            ctx,
            name: name.to_string(),
        }))
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw context, for verbs calls by the wrappers of this crate.
    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.ctx.as_ptr()
    }

    /// Queries port `port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        // SAFETY: an all-zero `ibv_port_attr` is a valid value of this plain C struct.
        let mut a: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY:
        // - `self.ctx` is an open context (valid until Drop).
        // - `a` is a valid, writable `ibv_port_attr`; `___ibv_query_port` is the
        //   size-checked form the C macro `ibv_query_port` expands to.
        let rc = unsafe { ___ibv_query_port(self.ctx.as_ptr(), port, &mut a) };
        if rc != 0 {
            return Err(VerbsError::QueryPort {
                device: self.name.clone(),
                port,
                source: errno_error(rc),
            });
        }
        Ok(PortAttr {
            active: a.state == IBV_PORT_ACTIVE,
            active_mtu: a.active_mtu as u8,
            lid: a.lid,
            link_layer: a.link_layer,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY:
        // - The context was opened by `ibv_open_device` and is closed once, here.
        // - Every object made from it holds an `Arc<Context>`, so none is left when the last
        //   reference drops.
        let rc = unsafe { ibv_close_device(self.ctx.as_ptr()) };
        if rc != 0 {
            ccl_core::ccl_warn!(None, "ibv_close_device({}) failed: {rc}", self.name);
        }
    }
}

/// Bytes of an `ibv_mtu` code (1 = 256 ... 5 = 4096); 0 for an unknown code.
pub fn mtu_bytes(code: u8) -> usize {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::{IBV_MTU_256, IBV_MTU_1024, IBV_MTU_4096};

    #[test]
    fn mtu_codes() {
        assert_eq!(mtu_bytes(IBV_MTU_256 as u8), 256);
        assert_eq!(mtu_bytes(IBV_MTU_1024 as u8), 1024);
        assert_eq!(mtu_bytes(IBV_MTU_4096 as u8), 4096);
        assert_eq!(mtu_bytes(0), 0);
        assert_eq!(mtu_bytes(9), 0);
    }
}
