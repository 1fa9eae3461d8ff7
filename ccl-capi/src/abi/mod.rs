//! The C ABI as data: `include/ccl.h`, the Python package's ctypes declarations
//! (`python/oxccl/_abi.py`) and the C++ torch backend's function list
//! (`python/oxccl/csrc/ccl_functions.hpp`) are written from it, so that each function's
//! signature and documentation is written once, at its export.
//!
//! Every export is written inside [`c_fn!`], which emits the `extern "C"` function and, beside it,
//! a module of the same name whose `ABI` holds the signature and doc comment as text (the types
//! exactly as the compiler took them); [`c_enum!`] and [`c_struct!`] do the same for the enums
//! and structs. [`layout`] puts them in the header's order, under its section headings. The unit
//! test `abi::tests::generated_files_are_current` renders the three files and fails when a
//! checked-in one differs; `CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi` rewrites them.

// The description is only read by the generator, which runs as a unit test; a library build
// carries none of it.
#[cfg(test)]
mod layout;
#[cfg(test)]
mod render;
#[cfg(test)]
mod tests;

#[cfg(test)]
use render::{render_cpp, render_header, render_python};

/// One exported function: its name, doc comment lines and types as written in Rust.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CFn {
    pub(crate) name: &'static str,
    pub(crate) doc: &'static [&'static str],
    /// `(name, Rust type)` of each parameter.
    pub(crate) params: &'static [(&'static str, &'static str)],
    pub(crate) ret: &'static str,
}

/// A C enum: an `int` typedef and named values.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CEnum {
    pub(crate) name: &'static str,
    pub(crate) doc: &'static [&'static str],
    pub(crate) values: &'static [CValue],
}

/// One value of a [`CEnum`].
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CValue {
    pub(crate) name: &'static str,
    pub(crate) value: i64,
    pub(crate) doc: &'static [&'static str],
}

/// A `#[repr(C)]` struct passed by value or pointer.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CStruct {
    pub(crate) name: &'static str,
    pub(crate) doc: &'static [&'static str],
    pub(crate) fields: &'static [CField],
}

/// One field of a [`CStruct`].
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct CField {
    pub(crate) name: &'static str,
    pub(crate) ty: &'static str,
    pub(crate) doc: &'static [&'static str],
}

/// A `#define` of the header.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Define {
    pub(crate) name: &'static str,
    /// The replacement text in C.
    pub(crate) c: String,
    /// Its value when it is an integer (the Python package gets these, without `CCL_`).
    pub(crate) int: Option<i64>,
    pub(crate) doc: &'static [&'static str],
}

/// What the header holds, in order.
#[cfg(test)]
#[derive(Debug)]
pub(crate) enum Item {
    /// A heading (`---- title ----`) with the prose that applies to the functions under it.
    Section(&'static str, &'static [&'static str]),
    /// A typedef of a pointer to an incomplete struct: `typedef struct tag* name;`.
    Handle {
        name: &'static str,
        tag: &'static str,
        doc: &'static [&'static str],
    },
    Define(Define),
    Enum(&'static CEnum),
    Struct(&'static CStruct),
    Fn(&'static CFn),
}

/// An exported function, and its signature and doc comment as data (`<name>::ABI`).
///
/// Written as a plain `pub fn`; the macro makes it `extern "C"` and unmangled. Every
/// parameter is `name: Type`, and the return type is spelled out.
macro_rules! c_fn {
    (
        $(#[doc = $doc:literal])*
        pub fn $name:ident($($p:ident: $t:ty),* $(,)?) -> $ret:ty $body:block
    ) => {
        $(#[doc = $doc])*
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub extern "C" fn $name($($p: $t),*) -> $ret $body

        #[cfg(test)]
        pub(crate) mod $name {
            pub(crate) const ABI: $crate::abi::CFn = $crate::abi::CFn {
                name: stringify!($name),
                doc: &[$($doc),*],
                params: &[$((stringify!($p), stringify!($t))),*],
                ret: stringify!($ret),
            };
        }
    };
}

/// A C enum as an `int` type alias with a constant per value, and its description as data
/// (`$data`).
macro_rules! c_enum {
    (
        $(#[doc = $doc:literal])*
        pub enum $name:ident as $data:ident {
            $($(#[doc = $vdoc:literal])* $v:ident = $e:expr,)*
        }
    ) => {
        $(#[doc = $doc])*
        pub type $name = std::ffi::c_int;
        $($(#[doc = $vdoc])* pub const $v: $name = $e;)*
        #[cfg(test)]
        pub(crate) static $data: $crate::abi::CEnum = $crate::abi::CEnum {
            name: stringify!($name),
            doc: &[$($doc),*],
            values: &[$($crate::abi::CValue {
                name: stringify!($v),
                value: $v as i64,
                doc: &[$($vdoc),*],
            }),*],
        };
    };
}

/// A `#[repr(C)]` struct with public fields, and its description as data (`$data`).
macro_rules! c_struct {
    (
        $(#[doc = $doc:literal])*
        pub struct $name:ident as $data:ident {
            $($(#[doc = $fdoc:literal])* pub $f:ident: $t:ty,)*
        }
    ) => {
        $(#[doc = $doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            $($(#[doc = $fdoc])* pub $f: $t,)*
        }
        #[cfg(test)]
        pub(crate) static $data: $crate::abi::CStruct = $crate::abi::CStruct {
            name: stringify!($name),
            doc: &[$($doc),*],
            fields: &[$($crate::abi::CField {
                name: stringify!($f),
                ty: stringify!($t),
                doc: &[$($fdoc),*],
            }),*],
        };
    };
}
