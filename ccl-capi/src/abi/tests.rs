use std::path::PathBuf;

use super::*;
use crate::{DATA_TYPE, RED_OP};

/// The generated files, each with what this build of the exports writes.
fn generated() -> Vec<(PathBuf, String)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = dir.join("../python/oxccl");
    vec![
        (dir.join("include/ccl.h"), render_header()),
        (python.join("_abi.py"), render_python()),
        (python.join("csrc/ccl_functions.hpp"), render_cpp()),
    ]
}

#[test]
fn generated_files_are_current() {
    let write = std::env::var_os("CCL_ABI_WRITE").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (path, want) in generated() {
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have == want {
            continue;
        }
        if write {
            std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            eprintln!("wrote {}", path.display());
        } else {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .map_or(have.lines().count().min(want.lines().count()), |i| i)
                + 1;
            stale.push(format!(
                "{} (first difference at line {line})",
                path.display()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "not what the exports give: {}; run `CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi` \
         and commit the files",
        stale.join(", ")
    );
}

#[test]
fn every_export_is_in_the_layout_once() {
    let names: Vec<&str> = layout::layout()
        .iter()
        .filter_map(|i| match i {
            Item::Fn(f) => Some(f.name),
            _ => None,
        })
        .collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "a function is listed twice");
    // The shared library's exports are compared with the header in tests/header.rs; here the
    // count guards against a layout that lost a section.
    assert!(names.len() >= 50, "{} functions", names.len());
}

#[test]
fn enums_are_the_librarys_numbering() {
    let value = |e: &CEnum, name: &str| {
        e.values
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("{} has no {name}", e.name))
            .value
    };
    for t in oxccl::DataType::ALL {
        assert!(
            DATA_TYPE.values.iter().any(|v| v.value == t as i64),
            "{t:?} has no cclDataType_t value"
        );
    }
    assert_eq!(
        value(&DATA_TYPE, "cclNumTypes"),
        oxccl::DataType::ALL.len() as i64
    );
    assert_eq!(
        value(&DATA_TYPE, "cclBfloat16"),
        oxccl::DataType::Bf16 as i64
    );
    assert_eq!(
        value(&RED_OP, "cclNumOps"),
        oxccl::ReduceOp::ALL.len() as i64
    );
    for (name, op) in [
        ("cclAvg", oxccl::ReduceOp::Avg),
        ("cclBAnd", oxccl::ReduceOp::BAnd),
        ("cclBXor", oxccl::ReduceOp::BXor),
    ] {
        assert_eq!(value(&RED_OP, name), op as i64, "{name}");
    }
}

#[test]
fn types_are_written_as_c_and_ctypes_spell_them() {
    let items = layout::layout();
    let n = render::tests_support::names(&items);
    let c = |t: &str, p: &str| render::tests_support::c_decl(&n, t, p);
    assert_eq!(c("*const c_void", "sendbuff"), "const void* sendbuff");
    assert_eq!(c("* mut * mut c_void", "ptr"), "void** ptr");
    assert_eq!(c("*mut cclComm_t", "comm"), "cclComm_t* comm");
    assert_eq!(c("usize", "count"), "size_t count");
    assert_eq!(
        c("[c_char; CCL_UNIQUE_ID_BYTES]", "internal"),
        "char internal[CCL_UNIQUE_ID_BYTES]"
    );
    let py = |t: &str| render::tests_support::py_type(&n, t);
    assert_eq!(py("*mut *mut c_void"), "ctypes.POINTER(c_void_p)");
    assert_eq!(py("*mut cclRequest_t"), "Handle_p");
    assert_eq!(py("cclUniqueId"), "UniqueIdStruct");
    assert_eq!(py("*const c_char"), "ctypes.c_char_p");
    assert_eq!(
        py("[c_char; CCL_UNIQUE_ID_BYTES]"),
        "ctypes.c_ubyte * UNIQUE_ID_BYTES"
    );
    let unknown = std::panic::catch_unwind(|| render::tests_support::py_type(&n, "f32"));
    assert!(
        unknown.is_err(),
        "a type without a spelling must not be guessed"
    );
}
