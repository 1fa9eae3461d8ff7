"""The C ABI (include/ccl.h) for ctypes: generated from ccl-capi's exports by
`CCL_ABI_WRITE=1 cargo test -p ccl-capi --lib abi`; do not edit."""

import ctypes

c_int = ctypes.c_int
c_size_t = ctypes.c_size_t
c_void_p = ctypes.c_void_p
c_int_p = ctypes.POINTER(ctypes.c_int)
c_size_t_p = ctypes.POINTER(ctypes.c_size_t)

# Handles are opaque pointers (cclComm_t, cclRequest_t).
Handle = c_void_p
Handle_p = ctypes.POINTER(c_void_p)

# The integer #defines, without CCL_.
MAJOR = 0
MINOR = 1
PATCH = 0
VERSION_CODE = 100
CONFIG_MAGIC = 3424390934
CONFIG_UNDEF_INT = -2147483648
SPLIT_NOCOLOR = -1
UNIQUE_ID_BYTES = 128

# Each enum's values by name.
ENUMS = {
    "cclResult_t": {
        "cclSuccess": 0,
        "cclSystemError": 2,
        "cclInternalError": 3,
        "cclInvalidArgument": 4,
        "cclInvalidUsage": 5,
        "cclRemoteError": 6,
        "cclInProgress": 7,
        "cclTimeout": 8,
        "cclRevoked": 9,
        "cclNumResults": 10,
    },
    "cclDataType_t": {
        "cclInt8": 0,
        "cclChar": 0,
        "cclUint8": 1,
        "cclInt32": 2,
        "cclInt": 2,
        "cclUint32": 3,
        "cclInt64": 4,
        "cclUint64": 5,
        "cclFloat16": 6,
        "cclHalf": 6,
        "cclFloat32": 7,
        "cclFloat": 7,
        "cclFloat64": 8,
        "cclDouble": 8,
        "cclBfloat16": 9,
        "cclNumTypes": 10,
    },
    "cclRedOp_t": {
        "cclSum": 0,
        "cclProd": 1,
        "cclMax": 2,
        "cclMin": 3,
        "cclAvg": 4,
        "cclBAnd": 5,
        "cclBOr": 6,
        "cclBXor": 7,
        "cclNumOps": 8,
    },
}


class ConfigStruct(ctypes.Structure):
    """cclConfig_t."""

    _fields_ = [
        ("size", c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("timeoutMs", c_int),
    ]


class UniqueIdStruct(ctypes.Structure):
    """cclUniqueId."""

    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


# name: (return type, argument types)
PROTOTYPES = {
    "cclGetVersion": (c_int, [c_int_p]),
    "cclGetErrorString": (ctypes.c_char_p, [c_int]),
    "cclGetLastError": (ctypes.c_char_p, [Handle]),
    "cclGetUniqueId": (c_int, [ctypes.POINTER(UniqueIdStruct)]),
    "cclCommInitRank": (c_int, [Handle_p, c_int, UniqueIdStruct, c_int]),
    "cclCommInitRankConfig": (c_int, [
        Handle_p,
        c_int,
        UniqueIdStruct,
        c_int,
        ctypes.POINTER(ConfigStruct),
    ]),
    "cclCommInitFromEnv": (c_int, [Handle_p]),
    "cclCommSplit": (c_int, [Handle, c_int, c_int, Handle_p, ctypes.POINTER(ConfigStruct)]),
    "cclCommRevoke": (c_int, [Handle, c_int]),
    "cclCommGetFailedRanks": (c_int, [Handle, c_int_p, c_int, c_int_p]),
    "cclCommShrink": (c_int, [
        Handle,
        c_int_p,
        c_int,
        Handle_p,
        ctypes.POINTER(ConfigStruct),
        c_int,
    ]),
    "cclCommGrow": (c_int, [
        Handle,
        c_int,
        ctypes.POINTER(UniqueIdStruct),
        c_int,
        Handle_p,
        ctypes.POINTER(ConfigStruct),
    ]),
    "cclCommDestroy": (c_int, [Handle]),
    "cclCommAbort": (c_int, [Handle]),
    "cclCommGetAsyncError": (c_int, [Handle, ctypes.POINTER(c_int)]),
    "cclCommCount": (c_int, [Handle, c_int_p]),
    "cclCommUserRank": (c_int, [Handle, c_int_p]),
    "cclMemAlloc": (c_int, [ctypes.POINTER(c_void_p), c_size_t]),
    "cclCommMemAlloc": (c_int, [Handle, ctypes.POINTER(c_void_p), c_size_t]),
    "cclMemFree": (c_int, [c_void_p]),
    "cclCommRegister": (c_int, [Handle, c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "cclCommDeregister": (c_int, [Handle, c_void_p]),
    "cclAllReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclBroadcast": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclReduce": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, Handle]),
    "cclAllGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle]),
    "cclReduceScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclAlltoAll": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle]),
    "cclGather": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclScatter": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclAllGatherV": (c_int, [c_void_p, c_void_p, c_size_t_p, c_size_t_p, c_int, Handle]),
    "cclReduceScatterV": (c_int, [c_void_p, c_void_p, c_size_t_p, c_int, c_int, Handle]),
    "cclAlltoAllV": (c_int, [
        c_void_p,
        c_size_t_p,
        c_size_t_p,
        c_void_p,
        c_size_t_p,
        c_size_t_p,
        c_int,
        Handle,
    ]),
    "cclBarrier": (c_int, [Handle]),
    "cclSend": (c_int, [c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclRecv": (c_int, [c_void_p, c_size_t, c_int, c_int, Handle]),
    "cclGroupStart": (c_int, []),
    "cclGroupEnd": (c_int, []),
    "cclProbe": (c_int, [c_int_p, c_size_t_p, Handle]),
    "cclAllReduceAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclBroadcastAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclReduceAsync": (c_int, [
        c_void_p,
        c_void_p,
        c_size_t,
        c_int,
        c_int,
        c_int,
        Handle,
        Handle_p,
    ]),
    "cclAllGatherAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle, Handle_p]),
    "cclReduceScatterAsync": (c_int, [
        c_void_p,
        c_void_p,
        c_size_t,
        c_int,
        c_int,
        Handle,
        Handle_p,
    ]),
    "cclAlltoAllAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, Handle, Handle_p]),
    "cclGatherAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclScatterAsync": (c_int, [c_void_p, c_void_p, c_size_t, c_int, c_int, Handle, Handle_p]),
    "cclAllGatherVAsync": (c_int, [
        c_void_p,
        c_void_p,
        c_size_t_p,
        c_size_t_p,
        c_int,
        Handle,
        Handle_p,
    ]),
    "cclReduceScatterVAsync": (c_int, [
        c_void_p,
        c_void_p,
        c_size_t_p,
        c_int,
        c_int,
        Handle,
        Handle_p,
    ]),
    "cclAlltoAllVAsync": (c_int, [
        c_void_p,
        c_size_t_p,
        c_size_t_p,
        c_void_p,
        c_size_t_p,
        c_size_t_p,
        c_int,
        Handle,
        Handle_p,
    ]),
    "cclBarrierAsync": (c_int, [Handle, Handle_p]),
    "cclTest": (c_int, [Handle, c_int_p]),
    "cclWait": (c_int, [Handle]),
}
