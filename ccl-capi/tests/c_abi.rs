//! Builds the C test program against `include/ccl.h` and the freshly built `libccl.so` (and
//! `libccl.a`) with the system C compiler, and runs it: every collective from several
//! processes and threads, and every kind of bad argument.

mod common;

use std::process::Command;

use common::{c_compiler, lib_dir, run_checked};

#[test]
fn c_program_through_the_shared_library_in_processes() {
    let dir = lib_dir();
    let exe = common::compile_c("capi_test", &["-L", dir.to_str().unwrap(), "-lccl"], true);
    let mut cmd = Command::new(&exe);
    cmd.args(["procs", "3"]);
    run_checked(cmd, "3 passed, 0 failed");
}

#[test]
fn c_program_through_the_shared_library_in_threads() {
    let dir = lib_dir();
    let exe = common::compile_c("capi_test", &["-L", dir.to_str().unwrap(), "-lccl"], true);
    let mut cmd = Command::new(&exe);
    cmd.args(["threads", "4"]);
    run_checked(cmd, "4 passed, 0 failed");
}

#[test]
fn c_program_through_the_static_library() {
    let lib = lib_dir().join("libccl.a");
    assert!(lib.exists(), "{} was not built", lib.display());
    let exe = common::compile_c(
        "capi_test_static",
        &[lib.to_str().unwrap(), "-lpthread", "-ldl", "-lm"],
        false,
    );
    let mut cmd = Command::new(&exe);
    cmd.args(["threads", "2"]);
    run_checked(cmd, "2 passed, 0 failed");
    let _ = c_compiler();
}
