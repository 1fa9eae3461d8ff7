"""Loading libccl.so and declaring its functions (the prototypes of include/ccl.h)."""

import ctypes
import os
from pathlib import Path

from ._abi import CONFIG_MAGIC, CONFIG_UNDEF_INT, PROTOTYPES, ConfigStruct

# The declarations (PROTOTYPES, the structs and constants) are in _abi.py, which is generated
# from the library's exports as include/ccl.h is.


def config(version):
    """A cclConfig_t with every field left to its CCL_* variable, as CCL_CONFIG_INITIALIZER."""
    return ConfigStruct(ctypes.sizeof(ConfigStruct), CONFIG_MAGIC, version, CONFIG_UNDEF_INT)


def candidates():
    """Where the library is looked for, in order."""
    env = os.environ.get("CCL_LIBRARY")
    if env:
        return [Path(env)]
    here = Path(__file__).resolve().parent
    out = [here / "libccl.so"]
    # A source checkout: python/oxccl/ -> target/release/libccl.so of the workspace.
    repo = here.parent.parent
    target = Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
    out.append(target / "release" / "libccl.so")
    return out


def load():
    tried = []
    for p in candidates():
        if p.is_file():
            lib = ctypes.CDLL(str(p))
            for name, (res, args) in PROTOTYPES.items():
                f = getattr(lib, name)
                f.restype = res
                f.argtypes = args
            lib.path = str(p)
            return lib
        tried.append(str(p))
    raise ImportError(
        "ccl: libccl.so not found (tried "
        + ", ".join(tried)
        + "); install the package with pip from the repository, or set CCL_LIBRARY"
    )
