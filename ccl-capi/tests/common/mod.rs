//! Finding the built library and compiling C against it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The crate's directory.
pub(crate) fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory of `libccl.so` and `libccl.a` for this test's profile, built up to date.
///
/// Cargo builds a `cdylib`/`staticlib`-only crate's library for its own unit tests but not for
/// integration tests, so this builds it (a no-op when it is fresh). `--workspace --lib` resolves
/// features as `cargo build --workspace` does, so it shares that build's artifacts.
pub(crate) fn lib_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test executable path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("target/<profile>/deps")
                .to_path_buf();
            let profile = profile_dir
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "--workspace", "--lib", "--quiet"])
                .current_dir(crate_dir());
            if profile != "debug" {
                cmd.args(["--profile", &profile]);
            }
            let st = cmd.status().expect("run cargo build");
            assert!(st.success(), "building libccl failed");
            assert!(
                profile_dir.join("libccl.so").exists(),
                "libccl.so not in {}",
                profile_dir.display()
            );
            profile_dir
        })
        .clone()
}

/// The C compiler: `$CC` or `cc`.
pub(crate) fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Compiles `tests/c/<name>.c` (or `capi_test.c` for `capi_test_static`) with warnings as errors.
pub(crate) fn compile_c(name: &str, link: &[&str], rpath: bool) -> PathBuf {
    let src = crate_dir()
        .join("tests/c")
        .join(if name.starts_with("capi_test") {
            "capi_test.c"
        } else {
            name
        });
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut cmd = Command::new(c_compiler());
    cmd.args([
        "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread",
    ])
    .arg("-I")
    .arg(crate_dir().join("include"))
    .arg(&src)
    .arg("-o")
    .arg(&out)
    .args(link);
    if rpath {
        cmd.arg(format!("-Wl,-rpath,{}", lib_dir().display()));
    }
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{}': {e}", c_compiler()));
    assert!(
        o.status.success(),
        "compiling {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs a test program on loopback with a short timeout; asserts success and that stdout
/// contains `want`.
pub(crate) fn run_checked(mut cmd: Command, want: &str) {
    cmd.env("CCL_SOCKET_IFNAME", "=lo").env("CCL_TIMEOUT", "60");
    let o = cmd.output().expect("run the C test");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && stdout.contains(want),
        "{cmd:?} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        o.status
    );
}
