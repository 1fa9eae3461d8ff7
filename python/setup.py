"""Builds libccl.so with cargo and ships it inside the package, with the torch backend in C++.

`pip install ./python` (from the repository root) runs `cargo build --release -p ccl-capi` and
copies target/release/libccl.so into the package. With CCL_LIBRARY set to an existing
libccl.so, that file is shipped instead and cargo is not run.

When torch is importable at build time (install with --no-build-isolation, as
scripts/python-setup.sh does) and a C++ compiler is there, the native torch backend
(ccl/csrc/backend.cpp, module ccl._ctorch) is compiled against that torch. If it cannot be
built, the package installs without it and ``ccl.torch`` runs its Python backend, saying so.
CCL_TORCH_NATIVE=0 skips it.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def built_library() -> Path:
    given = os.environ.get("CCL_LIBRARY")
    if given:
        p = Path(given)
        if not p.is_file():
            raise SystemExit(f"CCL_LIBRARY={given} is not a file")
        return p
    if not (REPO / "Cargo.toml").is_file():
        raise SystemExit(
            f"no Cargo workspace at {REPO}: build from a clone of the repository or set CCL_LIBRARY"
        )
    cargo = os.environ.get("CARGO", "cargo")
    subprocess.run([cargo, "build", "--release", "-p", "ccl-capi"], cwd=REPO, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "release" / "libccl.so"


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        lib = built_library()
        dest = Path(self.build_lib) / "ccl" / "libccl.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(lib, dest)


class BinaryDistribution(Distribution):
    """The wheel holds a native library, so it is platform specific."""

    def has_ext_modules(self):
        return True


def torch_extension():
    """The native torch backend's extension and the build command for it, or (None, None)."""
    if os.environ.get("CCL_TORCH_NATIVE", "1") == "0":
        return None, None
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except Exception as e:  # noqa: BLE001 - no torch: the Python backend only
        print(f"ccl: torch not importable ({e}); the native torch backend is not built")
        return None, None
    ext = CppExtension(
        "ccl._ctorch",
        ["ccl/csrc/backend.cpp"],
        include_dirs=[str(REPO / "ccl-capi" / "include")],
        extra_compile_args=["-O2", "-g0"],
    )

    class OptionalBuild(BuildExtension.with_options(use_ninja=False)):
        """A failed build of the native backend leaves the package with its Python backend."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001 - reported, then the fallback is used
                print(f"ccl: the native torch backend did not build ({e}); ccl.torch will "
                      "use the Python backend")

    return ext, OptionalBuild


ext, build_ext_cmd = torch_extension()
cmdclass = {"build_py": BuildWithCargo}
if ext is not None:
    cmdclass["build_ext"] = build_ext_cmd
setup(
    cmdclass=cmdclass,
    distclass=BinaryDistribution,
    ext_modules=[ext] if ext is not None else [],
)
