//! The header's order: its version macros, types and constants, then the functions under
//! their section headings. Every name here is the Rust item itself (a function's `ABI`, an
//! enum's or struct's description, a constant's value), so the list cannot name what does not
//! exist or give a value the library does not use.

use super::{Define, Item};
use crate::{
    CCL_CONFIG_MAGIC, CCL_CONFIG_UNDEF_INT, CCL_SPLIT_NOCOLOR, CCL_UNIQUE_ID_BYTES, CONFIG,
    DATA_TYPE, RED_OP, RESULT, UNIQUE_ID,
};

/// An integer `#define`: its name, its C text and value.
fn int(name: &'static str, c: String, value: i64, doc: &'static [&'static str]) -> Item {
    Item::Define(Define {
        name,
        c,
        int: Some(value),
        doc,
    })
}

/// A `#define` that is C text only (a macro with arguments, an initializer).
fn text(name: &'static str, c: &str, doc: &'static [&'static str]) -> Item {
    Item::Define(Define {
        name,
        c: c.to_string(),
        int: None,
        doc,
    })
}

/// Everything `include/ccl.h` declares, in its order.
// Long (185 lines): it is the header's table of contents, one entry per item; split, the order
// of the header would be spread over several functions.
pub(super) fn layout() -> Vec<Item> {
    macro_rules! f {
        ($name:ident) => {
            Item::Fn(&crate::$name::ABI)
        };
    }
    let (major, minor, patch) = crate::version_parts();
    vec![
        int("CCL_MAJOR", major.to_string(), major.into(), &[]),
        int("CCL_MINOR", minor.to_string(), minor.into(), &[]),
        int("CCL_PATCH", patch.to_string(), patch.into(), &[]),
        text(
            "CCL_VERSION(X, Y, Z)",
            "((X) * 10000 + (Y) * 100 + (Z))",
            &["NCCL's encoding: cclGetVersion() reports CCL_VERSION_CODE."],
        ),
        int(
            "CCL_VERSION_CODE",
            "CCL_VERSION(CCL_MAJOR, CCL_MINOR, CCL_PATCH)".into(),
            crate::version_code().into(),
            &[],
        ),
        Item::Handle {
            name: "cclComm_t",
            tag: "cclComm",
            doc: &["A communicator: an opaque handle, NULL when there is none."],
        },
        Item::Handle {
            name: "cclRequest_t",
            tag: "cclRequest",
            doc: &[
                "A non-blocking operation in flight: an opaque handle, finished by cclWait or",
                "cclTest.",
            ],
        },
        Item::Struct(&CONFIG),
        int(
            "CCL_CONFIG_MAGIC",
            format!("{CCL_CONFIG_MAGIC:#x}"),
            CCL_CONFIG_MAGIC.into(),
            &[],
        ),
        int(
            "CCL_CONFIG_UNDEF_INT",
            // limits.h's spelling: a literal -2147483648 is not an int in C.
            if CCL_CONFIG_UNDEF_INT == std::ffi::c_int::MIN {
                "INT_MIN".into()
            } else {
                CCL_CONFIG_UNDEF_INT.to_string()
            },
            CCL_CONFIG_UNDEF_INT.into(),
            &[],
        ),
        text(
            "CCL_CONFIG_INITIALIZER",
            "{ sizeof(cclConfig_t), CCL_CONFIG_MAGIC, CCL_VERSION_CODE, CCL_CONFIG_UNDEF_INT }",
            &[],
        ),
        int(
            "CCL_SPLIT_NOCOLOR",
            CCL_SPLIT_NOCOLOR.to_string(),
            CCL_SPLIT_NOCOLOR.into(),
            &["cclCommSplit color of a rank that joins no new communicator."],
        ),
        int(
            "CCL_UNIQUE_ID_BYTES",
            CCL_UNIQUE_ID_BYTES.to_string(),
            CCL_UNIQUE_ID_BYTES as i64,
            &[],
        ),
        Item::Struct(&UNIQUE_ID),
        Item::Enum(&RESULT),
        Item::Enum(&DATA_TYPE),
        Item::Enum(&RED_OP),
        Item::Section("Library and errors", &[]),
        f!(cclGetVersion),
        f!(cclGetErrorString),
        f!(cclGetLastError),
        Item::Section("Communicators", &[]),
        f!(cclGetUniqueId),
        f!(cclCommInitRank),
        f!(cclCommInitRankConfig),
        f!(cclCommInitFromEnv),
        f!(cclCommSplit),
        f!(cclCommRevoke),
        f!(cclCommGetFailedRanks),
        f!(cclCommShrink),
        f!(cclCommGrow),
        f!(cclCommDestroy),
        f!(cclCommAbort),
        f!(cclCommGetAsyncError),
        f!(cclCommCount),
        f!(cclCommUserRank),
        Item::Section(
            "Registered memory (NCCL's ncclMemAlloc / ncclCommRegister)",
            &[
                "Collectives whose buffers lie in memory registered with their communicator send",
                "straight from it where the transport can (verbs: RDMA writes from it instead of",
                "a copy into staging buffers); on other transports registration changes nothing.",
                "Registered bytes count toward CCL_REG_MAX_BYTES. Memory must stay allocated",
                "until it is deregistered.",
            ],
        ),
        f!(cclMemAlloc),
        f!(cclCommMemAlloc),
        f!(cclMemFree),
        f!(cclCommRegister),
        f!(cclCommDeregister),
        Item::Section(
            "Collectives",
            &[
                "Counts are in elements, as in NCCL. In place when sendbuff == recvbuff, except:",
                "allgather is in place when sendbuff == recvbuff + rank * sendcount * size,",
                "reduce-scatter when recvbuff == sendbuff + rank * recvcount * size. Any other",
                "overlap of the send and receive buffers is cclInvalidArgument. Buffers may be",
                "NULL when their size is 0.",
            ],
        ),
        f!(cclAllReduce),
        f!(cclBroadcast),
        f!(cclReduce),
        f!(cclAllGather),
        f!(cclReduceScatter),
        f!(cclAlltoAll),
        f!(cclGather),
        f!(cclScatter),
        Item::Section(
            "Collectives with a count per rank (MPI's v-forms)",
            &[
                "Counts and displacements are arrays of nranks size_t, in elements; a NULL",
                "displacement array places the blocks back to back in rank order. Buffers must",
                "hold every block (exactly, when packed). Every rank passes the counts MPI's",
                "forms take; ranks whose counts disagree get cclInvalidUsage naming the peer",
                "(every pair of ranks compares them), never a hang.",
            ],
        ),
        f!(cclAllGatherV),
        f!(cclReduceScatterV),
        f!(cclAlltoAllV),
        f!(cclBarrier),
        Item::Section(
            "Point to point and groups",
            &[
                "Between cclGroupStart and cclGroupEnd (on this thread; groups nest) operations",
                "are recorded and run together at the outermost cclGroupEnd: all sends and",
                "receives of a group on a communicator run as one exchange, so patterns such as",
                "\"send right, receive left\" cannot deadlock; collectives recorded in a group run",
                "first, in order. Buffers must stay valid until cclGroupEnd returns. Arguments",
                "are checked when an operation is recorded; failures of the exchange come from",
                "cclGroupEnd. Sends and receives with the same peer match in order, and a receive",
                "must have the byte length of its send.",
            ],
        ),
        f!(cclSend),
        f!(cclRecv),
        f!(cclGroupStart),
        f!(cclGroupEnd),
        f!(cclProbe),
        Item::Section(
            "Non-blocking collectives",
            &[
                "Same arguments as the blocking forms plus request, which receives a handle. The",
                "operation runs in the background, in issue order with every other operation on",
                "comm. THE BUFFERS MUST STAY VALID AND UNTOUCHED until cclWait returns or cclTest",
                "reports done. Argument errors are returned at once (and *request is NULL);",
                "failures of the operation come from cclWait or cclTest. Not allowed inside a",
                "group.",
            ],
        ),
        f!(cclAllReduceAsync),
        f!(cclBroadcastAsync),
        f!(cclReduceAsync),
        f!(cclAllGatherAsync),
        f!(cclReduceScatterAsync),
        f!(cclAlltoAllAsync),
        f!(cclGatherAsync),
        f!(cclScatterAsync),
        f!(cclAllGatherVAsync),
        f!(cclReduceScatterVAsync),
        f!(cclAlltoAllVAsync),
        f!(cclBarrierAsync),
        f!(cclTest),
        f!(cclWait),
    ]
}
