"""Compiling the native torch backend (``csrc/backend.cpp``) for one torch.

One routine serves both places it is built: ``pip install`` (setup.py loads this file by path,
and asks the interpreter it installs into which torch that is, since pip's isolated build
environment cannot import it) and the first ``import oxccl.torch`` under a torch the installed
extension was not built for (or a package installed before torch was). A C++ extension must be
compiled against the very torch that loads it: its C++ ABI is not stable across releases.

The compiler is called directly, with the flags torch's own extension builder uses (C++20, the
torch and Python include directories, the C++11 ABI setting torch was built with), so that
neither ninja nor setuptools is needed at run time. Each build is recorded beside the module in
``_ctorch.json`` (torch version, Python ABI), which is what a later import checks.
"""

import inspect
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

MODULE = "_ctorch"
HERE = Path(__file__).resolve().parent
SOURCES = ("backend.cpp",)

def local_facts():
    """The facts about this interpreter's torch that a build needs."""
    import sys
    import sysconfig

    import torch
    from torch.utils import cpp_extension as c

    return {
        "torch": torch.__version__,
        "cxx11_abi": int(torch._C._GLIBCXX_USE_CXX11_ABI),
        "include": c.include_paths(),
        "lib": c.library_paths(),
        "python_include": sysconfig.get_paths()["include"],
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        "python": sys.version.split()[0],
    }


class BuildError(RuntimeError):
    """The native backend could not be compiled; the message says why and what to install."""


def torch_facts(python=None):
    """What a build for the torch of `python` (default: this interpreter) needs, or None when
    that interpreter has no torch. `-I` keeps pip's isolation variables out of the child, so it
    sees the environment a package is installed into, not pip's temporary build one."""
    probe = inspect.getsource(local_facts) + "\nimport json\nprint(json.dumps(local_facts()))"
    cmd = [python or sys.executable, "-I", "-c", probe]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def stamp(facts):
    """What an extension is tied to: the torch version and the Python ABI."""
    return {"torch": facts["torch"], "ext_suffix": facts["ext_suffix"]}


def missing_tools(facts):
    """The Debian packages a build lacks (a C++ compiler, the Python headers)."""
    missing = []
    if not _which(os.environ.get("CXX", "g++")):
        missing.append("g++")
    if not (Path(facts["python_include"]) / "Python.h").is_file():
        missing.append("python3-dev")
    return missing


def build(facts, out_dir, csrc=None, capi_include=None, log=None):
    """Compiles the extension for `facts` into `out_dir` and records the build there; returns
    the module's path. Raises BuildError with the compiler's own message when it fails."""
    csrc = Path(csrc or HERE / "csrc")
    capi_include = Path(capi_include or csrc)
    missing = missing_tools(facts)
    if missing:
        raise BuildError(
            f"cannot compile the native torch backend: {' and '.join(missing)} missing "
            f"(Debian/Ubuntu: apt-get install {' '.join(missing)})"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / (MODULE + facts["ext_suffix"])
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    cxx = os.environ.get("CXX", "g++")
    cmd = [cxx, "-O2", "-g0", "-std=c++20", "-fPIC", "-shared",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={MODULE}",
           f"-D_GLIBCXX_USE_CXX11_ABI={facts['cxx11_abi']}",
           "-Wno-deprecated-declarations"]
    cmd += [f"-I{d}" for d in [*facts["include"], facts["python_include"], str(csrc),
                               str(capi_include)]]
    cmd += [str(csrc / s) for s in SOURCES]
    cmd += [f"-L{d}" for d in facts["lib"]]
    cmd += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", str(tmp)]
    if log:
        log(f"compiling the native torch backend for torch {facts['torch']} (about 30 s)")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = "\n".join(p.stderr.strip().splitlines()[-25:])
        raise BuildError(
            f"compiling the native torch backend for torch {facts['torch']} failed "
            f"({shlex.join(cmd[:1])} exit {p.returncode}):\n{tail}"
        )
    os.replace(tmp, target)
    (out_dir / (MODULE + ".json")).write_text(json.dumps(stamp(facts)) + "\n")
    return target


def recorded(directory):
    """The stamp of the build in `directory` and its module's path, or (None, None)."""
    directory = Path(directory)
    try:
        info = json.loads((directory / (MODULE + ".json")).read_text())
    except (OSError, ValueError):
        return None, None
    module = directory / (MODULE + info.get("ext_suffix", ""))
    return (info, module) if module.is_file() else (None, None)


def cache_dir(facts):
    """Where a build made at first use lives: per user, per torch and Python."""
    root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "oxccl")
    tag = f"torch-{facts['torch']}-py{sysconfig.get_config_var('py_version_nodot')}"
    return Path(root) / "ext" / tag


def _which(cmd):
    if os.sep in cmd:
        return os.access(cmd, os.X_OK)
    return any(os.access(os.path.join(d, cmd), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep) if d)
