"""Builds libccl.so with cargo and ships it inside the package.

`pip install ./python` (from the repository root) runs `cargo build --release -p ccl-capi` and
copies target/release/libccl.so into the package. With CCL_LIBRARY set to an existing
libccl.so, that file is shipped instead and cargo is not run.
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


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
