//! The list of every `CCL_*` setting: name, default and one line of help.

/// One documented setting.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// The default, as it would be written in the environment ("" = unset).
    pub default: &'static str,
    /// One line on what it does.
    pub help: &'static str,
}

/// Every setting the library reads. docs/env.md lists the same (a test checks it).
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "CCL_DEBUG",
        default: "warn",
        help: "log level: none, warn, info, trace",
    },
    Setting {
        name: "CCL_DEBUG_SUBSYS",
        default: "all",
        help: "subsystems shown at info/trace level: comma list of init, bootstrap, net, coll, topo, all; leading ^ excludes",
    },
    Setting {
        name: "CCL_DEBUG_FILE",
        default: "",
        help: "write log lines to this file instead of stderr; %h = host name, %p = process id",
    },
    Setting {
        name: "CCL_TIMEOUT",
        default: "600",
        help: "seconds any blocking wait may go without progress before it fails with a timeout naming the peer",
    },
    Setting {
        name: "CCL_CONTROL_SCALE",
        default: "1",
        help: "factor (0.25 to 100) on every fixed deadline of the rendezvous and job monitor (100 ms to 10 s); raise it on a host so loaded that they miss",
    },
    Setting {
        name: "CCL_TRACE_BUFFER",
        default: "1000",
        help: "operations the flight recorder keeps per communicator (0 = none)",
    },
    Setting {
        name: "CCL_TRACE_CLOCK",
        default: "auto",
        help: "the flight recorder's clock: auto (the CPU's time-stamp counter where the kernel \
               keeps time with it, else the system clock) or system",
    },
    Setting {
        name: "CCL_TRACE_DIR",
        default: "",
        help: "directory for flight-recorder dumps (on failure and SIGUSR1); %h = host, %p = pid",
    },
    Setting {
        name: "CCL_TRACE_TORCH_FILE",
        default: "",
        help: "also write each dump in PyTorch's flight-recorder format to this path + rank; %h, %p, %c = communicator id",
    },
    Setting {
        name: "CCL_SLOW_WINDOW",
        default: "200",
        help: "operations per window of the slow-rank report",
    },
    Setting {
        name: "CCL_SLOW_MS",
        default: "20",
        help: "a peer entering operations this many ms late on average, two windows in a row, is reported",
    },
    Setting {
        name: "CCL_SLOW_REPORT_S",
        default: "0",
        help: "log every rank's slow-rank figures at most this often, in seconds, at the end of a window (0 = only when a peer is slow)",
    },
    Setting {
        name: "CCL_LATE_WARN_MS",
        default: "auto",
        help: "an operation running this many ms logs one warning with the monitor's verdict (auto: 10x the recent median of that operation and size, at least CCL_LATE_WARN_FLOOR_MS; 0 = never)",
    },
    Setting {
        name: "CCL_LATE_WARN_FLOOR_MS",
        default: "1000",
        help: "the least CCL_LATE_WARN_MS=auto waits before the early warning",
    },
    Setting {
        name: "CCL_FAULT_STALL",
        default: "",
        help: "testing aid: op:N makes this rank stop moving inside its operation #N (its monitor still answers) until the job fails",
    },
    Setting {
        name: "CCL_TRANSPORT",
        default: "auto",
        help: "data transport for every pair of ranks: auto (shared memory within a host, ib or tcp across), shm, ib, tcp, local (in-process)",
    },
    Setting {
        name: "CCL_CONNECT",
        default: "lazy",
        help: "when pairs of ranks connect: lazy (a pair the first time an operation needs it; pairs in shared memory still connect at set-up) or eager (every pair at set-up)",
    },
    Setting {
        name: "CCL_MONITOR_FANOUT",
        default: "64",
        help: "ranks per hub of the job monitor's tree (2-65536): with more ranks than this, ranks report to the root through hub ranks, so the root holds at most this many connections",
    },
    Setting {
        name: "CCL_SOCKET_IFNAME",
        default: "",
        help: "interfaces for bootstrap and TCP: comma-separated name prefixes, '^' to exclude, '=' for an exact name",
    },
    Setting {
        name: "CCL_SPIN_US",
        default: "20",
        help: "microseconds a waiting rank busy-polls all its peers before it blocks in poll(2)",
    },
    Setting {
        name: "CCL_CHUNK_SIZE",
        default: "131072",
        help: "pipelining granularity in bytes: a rank forwards data once this much of a step has arrived",
    },
    Setting {
        name: "CCL_REG_MAX_BYTES",
        default: "0",
        help: "most bytes a communicator may hold registered (alloc and register) at once; 0 = no limit",
    },
    Setting {
        name: "CCL_PLANE_TIMEOUT_MS",
        default: "300",
        help: "with several planes (CCL_SOCKET_IFNAME matching several interfaces, or CCL_IB_HCA several ports): milliseconds a plane's bytes may go unread while another plane to the same peer answers, before the plane is taken as down and its bytes go again on the others (50-600000; the default is above Linux's least TCP retransmission timeout, 200 ms, so that one lost packet alone does not take a plane down)",
    },
    Setting {
        name: "CCL_SOCKET_BUFFER",
        default: "4194304",
        help: "SO_SNDBUF/SO_RCVBUF of TCP data connections in bytes (0 = kernel default)",
    },
    Setting {
        name: "CCL_SHM_DISABLE",
        default: "0",
        help: "1: ranks on one host talk through the network transport instead of shared memory",
    },
    Setting {
        name: "CCL_SHM_RING_SIZE",
        default: "auto",
        help: "bytes of each direction's ring between two ranks of one host (64K-256M, whole pages); auto: 3/4 of the CPU's level-2 cache, at most 1M",
    },
    Setting {
        name: "CCL_SHM_SLOT_SIZE",
        default: "2M",
        help: "bytes of each rank's slot in its host's shared segment, which collectives among the ranks of a host run on (64K-256M, whole pages)",
    },
    Setting {
        name: "CCL_SHM_ARENA_BYTES",
        default: "64G",
        help: "bytes of address space of each rank's shared arena, which Communicator::alloc takes registered buffers from on a host whose ranks share memory (sparse: only allocated buffers use memory; 0: private memory, no direct reads)",
    },
    Setting {
        name: "CCL_SHM_ONE_SHOT",
        default: "auto",
        help: "bytes up to which the host-memory allreduce runs one-shot (one barrier, every rank reduces all of it) rather than two-shot; auto: each communicator measures both at each power-of-two size from 1K to 8M on its first calls there and its ranks agree on the faster",
    },
    Setting {
        name: "CCL_SHM_SPIN_US",
        default: "1000",
        help: "microseconds more than CCL_SPIN_US that a rank waiting on shared memory polls before it sleeps: busy-polling when the host's ranks have a CPU each, yielding the CPU between polls when they outnumber the CPUs (0-10000000)",
    },
    Setting {
        name: "CCL_ALGO",
        default: "",
        help: "algorithm override, e.g. 'ring' or per collective 'allreduce:ring;allgather:ring'",
    },
    Setting {
        name: "CCL_TOPO_FILE",
        default: "",
        help: "file giving each rank's host, rack, zone and link speed (docs/topology.md)",
    },
    Setting {
        name: "CCL_RANK",
        default: "",
        help: "this process's rank (overrides the launcher's variables)",
    },
    Setting {
        name: "CCL_WORLD_SIZE",
        default: "",
        help: "number of ranks (overrides the launcher's variables)",
    },
    Setting {
        name: "CCL_LOCAL_RANK",
        default: "",
        help: "rank among the processes on this host (overrides the launcher's variables)",
    },
    Setting {
        name: "CCL_LOCAL_SIZE",
        default: "",
        help: "number of ranks on this host (lets a job without a rendezvous address meet through a file)",
    },
    Setting {
        name: "CCL_UNIQUE_ID",
        default: "",
        help: "the 128-byte unique id in hex (256 characters), as printed by UniqueId::to_hex",
    },
    Setting {
        name: "CCL_COMM_ID",
        default: "",
        help: "rendezvous address host:port; rank 0 listens there (like NCCL_COMM_ID)",
    },
    Setting {
        name: "CCL_BOOTSTRAP_PORT",
        default: "",
        help: "port rank 0 listens on when MASTER_ADDR is used (default MASTER_PORT, or MASTER_PORT+1 under torchrun's agent store)",
    },
    Setting {
        name: "CCL_SECRET",
        default: "",
        help: "shared secret for address-based rendezvous (CCL_COMM_ID, MASTER_ADDR); any string",
    },
    Setting {
        name: "CCL_BOOTSTRAP_DIR",
        default: "",
        help: "directory for the single-host file rendezvous (default: the temp dir)",
    },
    Setting {
        name: "CCL_IB_HCA",
        default: "",
        help: "verbs devices and ports to use, NCCL syntax: 'mlx5_0:1,rxe0' (name prefixes), '=' exact, '^' exclude",
    },
    Setting {
        name: "CCL_IB_GID_INDEX",
        default: "",
        help: "GID index to use (default: auto, preferring a RoCE v2 GID with an IPv4-mapped address)",
    },
    Setting {
        name: "CCL_IB_TIMEOUT",
        default: "20",
        help: "QP local ACK timeout exponent: 4.096 us x 2^value (1-31; 20 = 4.3 s)",
    },
    Setting {
        name: "CCL_IB_RETRY_CNT",
        default: "7",
        help: "QP transport retry count (0-7)",
    },
    Setting {
        name: "CCL_IB_RNR_RETRY",
        default: "7",
        help: "QP receiver-not-ready retry count (0-7; 7 = retry forever)",
    },
    Setting {
        name: "CCL_IB_TC",
        default: "0",
        help: "IP traffic class (DSCP << 2 | ECN) of data QPs (0-255)",
    },
    Setting {
        name: "CCL_IB_CTRL_TC",
        default: "0",
        help: "IP traffic class of the control QP that returns clear-to-send credits (0-255)",
    },
    Setting {
        name: "CCL_IB_QPS_PER_CONN",
        default: "1",
        help: "data QPs per peer; pieces go round-robin across them (1-64)",
    },
    Setting {
        name: "CCL_IB_SPLIT_DATA_ON_QPS",
        default: "0",
        help: "0: pieces of up to a slot go round-robin across the data QPs; 1: each send is split evenly across them",
    },
    Setting {
        name: "CCL_IB_SLOTS",
        default: "16",
        help: "staging slots per peer and direction; bytes in flight are at most slots x slot size (2-256)",
    },
    Setting {
        name: "CCL_IB_SPIN_US",
        default: "200",
        help: "microseconds more than CCL_SPIN_US that a rank waiting on verbs busy-polls all its peers before it sleeps on the completion channel (0 = CCL_SPIN_US alone)",
    },
    Setting {
        name: "CCL_IB_SLOT_SIZE",
        default: "256K",
        help: "bytes per staging slot, the largest piece one RDMA write carries (4K-8M)",
    },
    // Read by the Python package and the scripts, not by the library; listed so that setting
    // them draws no unknown-variable warning.
    Setting {
        name: "CCL_LIBRARY",
        default: "",
        help: "Python package: the libccl.so to load (and to ship, when installing)",
    },
    Setting {
        name: "CCL_VENV",
        default: "",
        help: "scripts: the Python venv the tests use (default ~/.cache/ccl/venv)",
    },
    Setting {
        name: "CCL_TORCH",
        default: "",
        help: "scripts: the torch requirement installed into the venv ('none' skips torch)",
    },
    Setting {
        name: "CCL_TORCH_BUILD",
        default: "1",
        help: "Python package: 0 never compiles the torch backend at import (a build for another torch is then an error)",
    },
    Setting {
        name: "CCL_TORCH_EXT_DIR",
        default: "",
        help: "Python package: where a torch backend compiled at import is kept (default ~/.cache/oxccl/ext/...)",
    },
    Setting {
        name: "CCL_SKIP_PYTHON",
        default: "",
        help: "scripts/test.sh: 1 skips the Python tests",
    },
];
