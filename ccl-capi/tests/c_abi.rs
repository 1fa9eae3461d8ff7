//! Builds the C test program against `include/ccl.h` and the freshly built `libccl.so` (and
//! `libccl.a`) with the system C compiler, and runs it: every collective from several
//! processes and threads, and every kind of bad argument.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::{lib_dir, run_checked};

/// The C test program linked to libccl.so, compiled once for all tests of this file (they run
/// in parallel).
fn shared_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = lib_dir();
        common::compile_c("capi_test", &["-L", dir.to_str().unwrap(), "-lccl"], true)
    })
    .clone()
}

#[test]
fn c_program_through_the_shared_library_in_processes() {
    let mut cmd = Command::new(shared_exe());
    cmd.args(["procs", "3"]);
    run_checked(cmd, "3 passed, 0 failed");
}

#[test]
fn c_program_through_the_shared_library_in_threads() {
    let mut cmd = Command::new(shared_exe());
    cmd.args(["threads", "4"]);
    run_checked(cmd, "4 passed, 0 failed");
}

#[test]
fn abort_from_another_thread_ends_a_blocked_collective() {
    let mut cmd = Command::new(shared_exe());
    cmd.args(["abort", "2"]);
    run_checked(cmd, " passed, 0 failed");
}

#[test]
fn config_timeout_is_the_communicators_deadline() {
    let mut cmd = Command::new(shared_exe());
    cmd.args(["timeout", "2"]);
    run_checked(cmd, " passed, 0 failed");
}

#[test]
fn header_compiles_as_cpp_and_links() {
    let dir = lib_dir();
    let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join("from_cpp.cpp");
    std::fs::write(
        &src,
        "#include <ccl.h>\n#include <cstdio>\nint main() {\n  int v = 0;\n  \
         if (cclGetVersion(&v) != cclSuccess || v != CCL_VERSION_CODE) return 1;\n  \
         cclComm_t c = nullptr;\n  \
         if (cclCommCount(c, &v) != cclInvalidArgument) return 1;\n  \
         std::printf(\"%s\\n\", cclGetLastError(nullptr));\n  return 0;\n}\n",
    )
    .unwrap();
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("from_cpp");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let o = Command::new(&cxx)
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(common::crate_dir().join("include"))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .args(["-L", dir.to_str().unwrap(), "-lccl"])
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler '{cxx}': {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    run_checked(Command::new(&exe), "cclCommCount: invalid argument");
}

#[test]
fn c_program_through_the_static_library() {
    let lib = lib_dir().join("libccl.a");
    assert!(lib.exists(), "{} was not built", lib.display());
    let exe = common::compile_c(
        "capi_test_static",
        // What the header says a static link needs: no verbs library (the verbs transport
        // opens libibverbs at run time), only the C library's parts.
        &[lib.to_str().unwrap(), "-lpthread", "-ldl", "-lm"],
        false,
    );
    let mut cmd = Command::new(&exe);
    cmd.args(["threads", "2"]);
    run_checked(cmd, "2 passed, 0 failed");
}
