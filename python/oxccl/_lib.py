"""Loading libccl.so and declaring its functions (the prototypes of include/ccl.h)."""

import ctypes
import os
from pathlib import Path

c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_int_p = ctypes.POINTER(ctypes.c_int)
c_size_t_p = ctypes.POINTER(ctypes.c_size_t)

UNIQUE_ID_BYTES = 128


class UniqueIdStruct(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


class ConfigStruct(ctypes.Structure):
    """cclConfig_t; made as CCL_CONFIG_INITIALIZER does by ``config()``."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("timeoutMs", ctypes.c_int),
    ]


CONFIG_MAGIC = 0xCC1C0F16
CONFIG_UNDEF_INT = -(2**31)


def config(version):
    """A cclConfig_t with every field left to its CCL_* variable."""
    return ConfigStruct(ctypes.sizeof(ConfigStruct), CONFIG_MAGIC, version, CONFIG_UNDEF_INT)


# Handles are opaque pointers (cclComm_t, cclRequest_t).
Handle = c_void_p
Handle_p = ctypes.POINTER(c_void_p)

# name: (return type, argument types)
PROTOTYPES = {
    "cclGetVersion": (c_int, [c_int_p]),
    "cclGetErrorString": (ctypes.c_char_p, [c_int]),
    "cclGetLastError": (ctypes.c_char_p, [Handle]),
    "cclGetUniqueId": (c_int, [ctypes.POINTER(UniqueIdStruct)]),
    "cclCommInitRank": (c_int, [Handle_p, c_int, UniqueIdStruct, c_int]),
    "cclCommInitRankConfig": (
        c_int,
        [Handle_p, c_int, UniqueIdStruct, c_int, ctypes.POINTER(ConfigStruct)],
    ),
    "cclCommInitFromEnv": (c_int, [Handle_p]),
    "cclCommSplit": (c_int, [Handle, c_int, c_int, Handle_p, c_void_p]),
    "cclCommDestroy": (c_int, [Handle]),
    "cclCommAbort": (c_int, [Handle]),
    "cclCommRevoke": (c_int, [Handle, c_int]),
    "cclCommShrink": (c_int, [Handle, c_int_p, c_int, Handle_p, c_void_p, c_int]),
    "cclCommGrow": (
        c_int,
        [Handle, c_int, ctypes.POINTER(UniqueIdStruct), c_int, Handle_p, c_void_p],
    ),
    "cclCommGetFailedRanks": (c_int, [Handle, c_int_p, c_int, c_int_p]),
    "cclCommGetAsyncError": (c_int, [Handle, c_int_p]),
    "cclCommCount": (c_int, [Handle, c_int_p]),
    "cclCommUserRank": (c_int, [Handle, c_int_p]),
    "cclAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclBroadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, Handle]),
    "cclAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle]),
    "cclReduceScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclAlltoAll": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle]),
    "cclBarrier": (c_int, [Handle]),
    "cclSend": (c_int, [c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclRecv": (c_int, [c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclGroupStart": (c_int, []),
    "cclGroupEnd": (c_int, []),
    "cclProbe": (c_int, [c_int_p, c_size_t_p, Handle]),
    "cclAllReduceAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclBroadcastAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclReduceAsync": (
        c_int,
        [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, Handle, Handle_p],
    ),
    "cclAllGatherAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle, Handle_p]),
    "cclReduceScatterAsync": (
        c_int,
        [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p],
    ),
    "cclAlltoAllAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle, Handle_p]),
    "cclBarrierAsync": (c_int, [Handle, Handle_p]),
    "cclGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclAllGatherV": (c_int, [c_void_p, c_void_p, c_size_t_p, c_size_t_p, c_int, Handle]),
    "cclReduceScatterV": (c_int, [c_void_p, c_void_p, c_size_t_p, c_int, c_int, Handle]),
    "cclAlltoAllV": (
        c_int,
        [c_void_p, c_size_t_p, c_size_t_p, c_void_p, c_size_t_p, c_size_t_p, c_int, Handle],
    ),
    "cclGatherAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclScatterAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclAllGatherVAsync": (
        c_int,
        [c_void_p, c_void_p, c_size_t_p, c_size_t_p, c_int, Handle, Handle_p],
    ),
    "cclReduceScatterVAsync": (
        c_int,
        [c_void_p, c_void_p, c_size_t_p, c_int, c_int, Handle, Handle_p],
    ),
    "cclAlltoAllVAsync": (
        c_int,
        [
            c_void_p,
            c_size_t_p,
            c_size_t_p,
            c_void_p,
            c_size_t_p,
            c_size_t_p,
            c_int,
            Handle,
            Handle_p,
        ],
    ),
    "cclMemAlloc": (c_int, [ctypes.POINTER(c_void_p), c_size_t]),
    "cclCommMemAlloc": (c_int, [Handle, ctypes.POINTER(c_void_p), c_size_t]),
    "cclMemFree": (c_int, [c_void_p]),
    "cclCommRegister": (c_int, [Handle, c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "cclCommDeregister": (c_int, [Handle, c_void_p]),
    "cclTest": (c_int, [Handle, c_int_p]),
    "cclWait": (c_int, [Handle]),
}


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
