"""Builds libccl.so with cargo and ships it inside the package, with the torch backend in C++.

`pip install ./python` (from the repository root) runs `cargo build --release -p ccl-capi` and
copies target/release/libccl.so into the package. With CCL_LIBRARY set to an existing
libccl.so, that file is shipped instead and cargo is not run.

The native torch backend (oxccl/csrc/backend.cpp, module oxccl._ctorch) is compiled against the
torch of the environment the package is installed into. pip builds in an isolated environment
where that torch cannot be imported, so its facts (version, include and library paths, ABI) are
asked of the target interpreter itself (oxccl/_build.py). Where there is no torch yet, or no
compiler, the package installs without it and the first `import oxccl.torch` compiles it for
the torch that runs (or says what is missing); nothing slower runs in its place.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
HEADER = REPO / "ccl-capi" / "include" / "ccl.h"


def _load_build():
    spec = importlib.util.spec_from_file_location("_oxccl_build", HERE / "oxccl" / "_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def build_torch_backend(pkg: Path):
    """Compiles the native backend into `pkg` for the target environment's torch, if it has
    one; leaves no earlier build behind either way (an extension of another torch would not
    load, or worse, load)."""
    b = _load_build()
    for old in pkg.glob(b.MODULE + "*"):
        old.unlink()
    try:
        facts = b.local_facts()
    except Exception:  # noqa: BLE001 - pip's isolated environment: ask the target interpreter
        facts = b.torch_facts(sys.executable)
    if facts is None:
        print("oxccl: no torch in the target environment; the native torch backend will be "
              "compiled at the first `import oxccl.torch`")
        return
    try:
        b.build(facts, pkg, csrc=pkg / "csrc", log=print)
    except b.BuildError as e:
        print(f"oxccl: {e}\noxccl: it will be tried again at the first `import oxccl.torch`")


class BuildWithCargo(build_py):
    def run(self):
        super().run()
        pkg = Path(self.build_lib) / "oxccl"
        pkg.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built_library(), pkg / "libccl.so")
        (pkg / "csrc").mkdir(exist_ok=True)
        shutil.copyfile(HEADER, pkg / "csrc" / "ccl.h")
        build_torch_backend(pkg)


class BinaryDistribution(Distribution):
    """The wheel holds a native library, so it is platform specific."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithCargo}, distclass=BinaryDistribution)
