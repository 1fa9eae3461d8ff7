//! `libccl.so` exports exactly the functions of `include/ccl.h`, and nothing else.
//!
//! The header is generated from the exports (`src/abi`; its unit test fails when the checked-in
//! header is stale), so its prototypes match them by construction. What the generator cannot
//! see is the linker's output: a function exported without going through `c_fn!`, or a Rust
//! symbol leaking out of the cdylib.

mod common;

use std::process::Command;

use common::{crate_dir, lib_dir};

/// The functions the header declares. Its prototypes are written one to a statement, the
/// return type and name on the first line (`cclResult_t cclAllReduce(...`), by the generator.
fn header_functions() -> Vec<String> {
    let h = std::fs::read_to_string(crate_dir().join("include/ccl.h")).expect("read ccl.h");
    let mut names: Vec<String> = h
        .lines()
        .filter(|l| l.starts_with("cclResult_t ccl") || l.starts_with("const char* ccl"))
        .map(|l| {
            let name = l.split('(').next().unwrap().rsplit(' ').next().unwrap();
            name.to_string()
        })
        .collect();
    names.sort();
    assert!(names.len() >= 50, "read only {} prototypes", names.len());
    names
}

/// `(kind, name)` of the shared library's defined dynamic symbols.
fn exported_symbols() -> Vec<(String, String)> {
    let so = lib_dir().join("libccl.so");
    let o = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
        .expect("run nm (binutils)");
    assert!(o.status.success(), "nm failed");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (_, kind, name) = (it.next()?, it.next()?, it.next()?);
            Some((kind.to_string(), name.to_string()))
        })
        .collect()
}

#[test]
fn shared_library_exports_exactly_the_header() {
    let symbols = exported_symbols();
    let mut exported: Vec<String> = symbols
        .iter()
        .filter(|(kind, name)| kind == "T" && name.starts_with("ccl"))
        .map(|(_, name)| name.clone())
        .collect();
    exported.sort();
    assert_eq!(
        exported,
        header_functions(),
        "libccl.so exports differ from include/ccl.h"
    );
    // Nothing but the C API (and no Rust symbols) leaks out of the cdylib.
    let others: Vec<&str> = symbols
        .iter()
        .filter(|(kind, name)| kind == "T" && !name.starts_with("ccl"))
        .map(|(_, name)| name.as_str())
        .collect();
    assert!(others.is_empty(), "unexpected exports: {others:?}");
}
