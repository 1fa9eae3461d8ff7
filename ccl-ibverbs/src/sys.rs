//! libibverbs, opened at run time (`dlopen`) the first time this crate looks at a device.
//!
//! Linking it would make every program built with ccl load libibverbs and the netlink libraries
//! it depends on at start, whether or not it ever uses verbs: most runs use shared memory or
//! TCP. That costs about 0.5 ms of CPU per process (a 1,024-rank job started on one 2-CPU host
//! spends half a CPU-second on it), and a program would not even start on a host without
//! rdma-core installed. NCCL opens libibverbs the same way. The functions below have the names
//! and C prototypes of the library's, over the crate's own definitions of its types
//! ([`crate::ffi`]): building needs neither rdma-core's headers nor the library, and no verb
//! can reach a linked symbol by mistake, since none is declared (a binary that linked one would
//! list libibverbs as needed, which `nm -D` shows).
//!
//! Each symbol is looked up at the version rdma-core's headers bind it to, whose ABI is the one
//! `ffi` describes; with the `layout-check` feature a test compares `ffi` with the installed
//! headers.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io;
use std::sync::OnceLock;

use std::mem::{offset_of, size_of};

use crate::ffi::{
    _compat_ibv_port_attr, VERBS_ABI_IS_EXTENDED, ibv_comp_channel, ibv_context, ibv_cq,
    ibv_device, ibv_mr, ibv_pd, ibv_port_attr, ibv_qp, ibv_qp_attr, ibv_qp_init_attr,
    verbs_context,
};

/// The library's file name: the soname of rdma-core's libibverbs, ABI 1 since 2006.
pub const LIBRARY: &str = "libibverbs.so.1";

macro_rules! verbs {
    ($( $name:ident @ $version:literal ($($arg:ident : $ty:ty),*) $(-> $ret:ty)? ;)*) => {
        /// The entry points this crate uses, resolved once.
        struct Verbs {
            $( $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        impl Verbs {
            fn resolve(lib: *mut c_void) -> Result<Verbs, String> {
                Ok(Verbs {
                    $( $name: {
                        let f = symbol(
                            lib,
                            concat!(stringify!($name), "\0"),
                            concat!($version, "\0"),
                        )?;
                        // SAFETY: `f` is the address of libibverbs' `$name` at `$version`,
                        // the version the headers bind, whose C prototype is the one declared
                        // here over `ffi`'s types; function and data pointers have the same
                        // size and representation on Linux.
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(f)
                        }
                    }, )*
                })
            }
        }

        $(
            /// The verb of the same name, through the loaded library; see its manual page.
            ///
            /// # Safety
            /// As for the C function. The library must have been loaded ([`load`]), which
            /// every entry point of this crate ensures through [`crate::device::fork_init`].
            pub unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the caller upholds the verb's own contract; the pointer was
                // resolved from the library with this prototype.
                unsafe { (verbs().$name)($($arg),*) }
            }
        )*
    };
}

verbs! {
    ibv_fork_init @ "IBVERBS_1.1" () -> c_int;
    ibv_get_device_list @ "IBVERBS_1.1" (num_devices: *mut c_int) -> *mut *mut ibv_device;
    ibv_free_device_list @ "IBVERBS_1.1" (list: *mut *mut ibv_device);
    ibv_get_device_name @ "IBVERBS_1.1" (device: *mut ibv_device) -> *const c_char;
    ibv_open_device @ "IBVERBS_1.1" (device: *mut ibv_device) -> *mut ibv_context;
    ibv_close_device @ "IBVERBS_1.1" (context: *mut ibv_context) -> c_int;
    ibv_query_port @ "IBVERBS_1.1" (
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut _compat_ibv_port_attr
    ) -> c_int;
    ibv_alloc_pd @ "IBVERBS_1.1" (context: *mut ibv_context) -> *mut ibv_pd;
    ibv_dealloc_pd @ "IBVERBS_1.1" (pd: *mut ibv_pd) -> c_int;
    ibv_reg_mr @ "IBVERBS_1.1" (
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int
    ) -> *mut ibv_mr;
    ibv_dereg_mr @ "IBVERBS_1.1" (mr: *mut ibv_mr) -> c_int;
    ibv_create_comp_channel @ "IBVERBS_1.0" (context: *mut ibv_context) -> *mut ibv_comp_channel;
    ibv_destroy_comp_channel @ "IBVERBS_1.0" (channel: *mut ibv_comp_channel) -> c_int;
    ibv_create_cq @ "IBVERBS_1.1" (
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut ibv_comp_channel,
        comp_vector: c_int
    ) -> *mut ibv_cq;
    ibv_destroy_cq @ "IBVERBS_1.1" (cq: *mut ibv_cq) -> c_int;
    ibv_get_cq_event @ "IBVERBS_1.1" (
        channel: *mut ibv_comp_channel,
        cq: *mut *mut ibv_cq,
        cq_context: *mut *mut c_void
    ) -> c_int;
    ibv_ack_cq_events @ "IBVERBS_1.1" (cq: *mut ibv_cq, nevents: c_uint);
    ibv_create_qp @ "IBVERBS_1.1" (pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    ibv_modify_qp @ "IBVERBS_1.1" (qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
    ibv_destroy_qp @ "IBVERBS_1.1" (qp: *mut ibv_qp) -> c_int;
}

/// `ibv_query_port` as the C header's inline form has it: the provider's own query with the
/// whole attribute struct when the context is an extended one that offers it, else the
/// library's entry point, which fills the struct's older (compatible) prefix.
///
/// # Safety
/// `context` is an open device context and `port_attr` a valid, writable `ibv_port_attr`.
pub unsafe fn ___ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY:
    // - `context` is a live context (the caller's contract). A context whose `abi_compat` is
    //   the header's `__VERBS_ABI_IS_EXTENDED` (`(void *)UINTPTR_MAX`) is the `context` member
    //   of a `verbs_context`, whose `sz` says how much of it the library filled: the op is read
    //   only when it lies inside that part, as the header's `verbs_get_ctx_op` does.
    // - `port_attr` is valid and writable for one `ibv_port_attr` (the caller's contract),
    //   which is at least the compatible struct's size.
    unsafe {
        if (*context).abi_compat as usize == VERBS_ABI_IS_EXTENDED {
            let vc = context
                .cast::<u8>()
                .sub(offset_of!(verbs_context, context))
                .cast::<verbs_context>();
            if (*vc).sz >= size_of::<verbs_context>() - offset_of!(verbs_context, query_port)
                && let Some(query) = (*vc).query_port
            {
                return query(context, port_num, port_attr, size_of::<ibv_port_attr>());
            }
        }
        std::ptr::write_bytes(port_attr, 0, 1);
        ibv_query_port(context, port_num, port_attr.cast())
    }
}

static LIB: OnceLock<Result<Verbs, String>> = OnceLock::new();

/// Opens libibverbs and resolves every verb this crate uses, once per process; later calls
/// return the first outcome. The library stays loaded for the life of the process (verbs
/// objects and the providers it loads may outlive any one owner here).
pub fn load() -> io::Result<()> {
    let lib = LIB.get_or_init(|| {
        let name = format!("{LIBRARY}\0");
        // SAFETY: `name` is NUL-terminated; loading runs the library's constructors, which
        // only set up its own state. The handle is never closed.
        let h = unsafe { libc::dlopen(name.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(dl_error());
        }
        Verbs::resolve(h)
    });
    lib.as_ref().map(|_| ()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{e} (the verbs transport needs rdma-core's {LIBRARY}: on Debian or Ubuntu, \
                 `apt-get install libibverbs1 ibverbs-providers`)"
            ),
        )
    })
}

fn verbs() -> &'static Verbs {
    match LIB.get() {
        Some(Ok(v)) => v,
        // Every verb is reached through an object made after `device::fork_init`, which loads
        // the library first or fails: reaching here is a bug in this crate.
        _ => panic!("ccl-ibverbs: a verb was called before {LIBRARY} was loaded"),
    }
}

/// `name` at `version` (both NUL-terminated) in `lib`.
fn symbol(lib: *mut c_void, name: &str, version: &str) -> Result<*mut c_void, String> {
    // SAFETY: `lib` is a live handle from `dlopen`; both strings are NUL-terminated literals.
    let f = unsafe { libc::dlvsym(lib, name.as_ptr().cast(), version.as_ptr().cast()) };
    if f.is_null() {
        Err(format!(
            "{LIBRARY} has no {}@{}: {}",
            name.trim_end_matches('\0'),
            version.trim_end_matches('\0'),
            dl_error()
        ))
    } else {
        Ok(f)
    }
}

/// The dynamic loader's last error message.
fn dl_error() -> String {
    // SAFETY: `dlerror` returns null or a NUL-terminated message valid until the next dl*
    // call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dynamic-loader error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where rdma-core is installed (the build needs it), every verb this crate uses resolves
    /// at the version its headers bind.
    #[test]
    fn every_verb_resolves() {
        match load() {
            Ok(()) => {
                assert!(matches!(LIB.get(), Some(Ok(_))));
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_missing_symbol_is_named() {
        load().unwrap();
        let name = format!("{LIBRARY}\0");
        // SAFETY: as in `load`; the library is already loaded, so this only takes a reference.
        let h = unsafe { libc::dlopen(name.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null());
        let e = symbol(h, "ibv_no_such_verb\0", "IBVERBS_1.1\0").unwrap_err();
        assert!(e.contains("ibv_no_such_verb@IBVERBS_1.1"), "{e}");
    }
}
