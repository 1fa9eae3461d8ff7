//! Every `CCL_*` setting, read in one place, each with a default.
//!
//! [`SETTINGS`] is the single list: parsing, the warning about unknown `CCL_*` variables (a typo
//! such as `CCL_TIMOUT` would otherwise be ignored silently) and the test that `docs/env.md`
//! documents every setting all read it.
//!
//! Settings are read once, when a communicator is created ([`Config::from_env`]); a program that
//! wants different values per communicator builds a [`Config`] itself.

use std::time::Duration;

use crate::error::{Error, Result};

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
        default: "500",
        help: "with several planes (CCL_SOCKET_IFNAME matching several interfaces, or CCL_IB_HCA several ports): milliseconds a plane's bytes may go unread while another plane to the same peer answers, before the plane is taken as down and its bytes go again on the others (50-600000)",
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

/// Log verbosity (`CCL_DEBUG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    None,
    Warn,
    Info,
    Trace,
}

/// Transport choice (`CCL_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// RDMA when an active RoCE port exists, else TCP.
    Auto,
    Tcp,
    /// In-process: all ranks are threads of one process.
    Local,
    /// Verbs (RoCE) through the ibverbs transport.
    Ib,
    /// Shared memory: every rank on one host.
    Shm,
}

impl std::str::FromStr for TransportKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(TransportKind::Auto),
            "tcp" | "socket" => Ok(TransportKind::Tcp),
            "local" | "inproc" => Ok(TransportKind::Local),
            "ib" | "verbs" | "rdma" => Ok(TransportKind::Ib),
            "shm" | "shared" => Ok(TransportKind::Shm),
            _ => Err(format!(
                "unknown transport '{s}' (expected auto, shm, ib, tcp or local)"
            )),
        }
    }
}

impl TransportKind {
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::Auto => "auto",
            TransportKind::Tcp => "tcp",
            TransportKind::Local => "local",
            TransportKind::Ib => "ib",
            TransportKind::Shm => "shm",
        }
    }
}

/// When pairs of ranks connect (`CCL_CONNECT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectMode {
    /// Every pair at set-up.
    Eager,
    /// A pair the first time an operation of either rank needs it.
    Lazy,
}

impl std::str::FromStr for ConnectMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "eager" => Ok(ConnectMode::Eager),
            "lazy" => Ok(ConnectMode::Lazy),
            _ => Err(format!("unknown mode '{s}' (expected eager or lazy)")),
        }
    }
}

/// The library's settings. Field docs name the variable each comes from.
#[derive(Clone, Debug)]
pub struct Config {
    /// `CCL_DEBUG`
    pub log_level: LogLevel,
    /// `CCL_TIMEOUT`: how long a wait may go without progress.
    pub timeout: Duration,
    /// `CCL_TRACE_BUFFER`
    pub trace_buffer: usize,
    /// `CCL_TRACE_CLOCK`: whether the flight recorder may read the CPU's time-stamp counter
    /// (`auto`) rather than only the system clock (`system`).
    pub trace_counter: bool,
    /// `CCL_TRACE_DIR`
    pub trace_dir: Option<String>,
    /// `CCL_TRACE_TORCH_FILE`: path prefix of dumps in PyTorch's flight-recorder format.
    pub trace_torch_file: Option<String>,
    /// `CCL_SLOW_WINDOW`
    pub slow_window: usize,
    /// `CCL_SLOW_MS`
    pub slow_ms: u64,
    /// `CCL_SLOW_REPORT_S` (zero: off)
    pub slow_report: Duration,
    /// `CCL_LATE_WARN_MS` (`None`: auto; 0: never)
    pub late_warn_ms: Option<u64>,
    /// `CCL_LATE_WARN_FLOOR_MS`
    pub late_warn_floor_ms: u64,
    /// `CCL_FAULT_STALL=op:N`: the operation this rank stalls in on purpose (a testing aid).
    pub fault_stall: Option<u64>,
    /// `CCL_TRANSPORT`
    pub transport: TransportKind,
    /// `CCL_CONNECT`
    pub connect: ConnectMode,
    /// `CCL_MONITOR_FANOUT`
    pub monitor_fanout: usize,
    /// `CCL_SOCKET_IFNAME`
    pub socket_ifname: Option<String>,
    /// `CCL_SPIN_US`
    pub spin: Duration,
    /// `CCL_CHUNK_SIZE`
    pub chunk_size: usize,
    /// `CCL_SOCKET_BUFFER`
    pub socket_buffer: usize,
    /// `CCL_PLANE_TIMEOUT_MS`
    pub plane_timeout: Duration,
    /// `CCL_REG_MAX_BYTES` (0 = no limit)
    pub reg_max_bytes: usize,
    /// `CCL_SHM_DISABLE`
    pub shm_disable: bool,
    /// `CCL_SHM_RING_SIZE`
    pub shm_ring_size: usize,
    /// `CCL_SHM_SLOT_SIZE`
    pub shm_slot_size: usize,
    /// `CCL_SHM_ARENA_BYTES`
    pub shm_arena_bytes: usize,
    /// `CCL_SHM_SPIN_US`
    pub shm_spin: Duration,
    /// `CCL_SHM_ONE_SHOT`: `None` for `auto` (measured), else one-shot up to these many bytes.
    pub shm_one_shot: Option<usize>,
    /// `CCL_ALGO`
    pub algo: Option<String>,
    /// `CCL_TOPO_FILE`
    pub topo_file: Option<String>,
    /// A topology given in code instead of read from `CCL_TOPO_FILE` (not an environment
    /// setting): a communicator split off another takes its members' part of the parent's.
    pub topology: Option<crate::topology::Topology>,
    /// `CCL_RANK`
    pub rank: Option<usize>,
    /// `CCL_WORLD_SIZE`
    pub world_size: Option<usize>,
    /// `CCL_LOCAL_RANK`
    pub local_rank: Option<usize>,
    /// `CCL_LOCAL_SIZE`
    pub local_size: Option<usize>,
    /// `CCL_UNIQUE_ID`
    pub unique_id: Option<String>,
    /// `CCL_COMM_ID`
    pub comm_id: Option<String>,
    /// `CCL_BOOTSTRAP_PORT`
    pub bootstrap_port: Option<u16>,
    /// `CCL_SECRET`
    pub secret: Option<String>,
    /// `CCL_BOOTSTRAP_DIR`
    pub bootstrap_dir: Option<String>,
    /// `CCL_IB_*`: the verbs transport.
    pub ib: IbConfig,
    /// `CCL_*` variables that were set but are not settings (likely typos).
    pub unknown: Vec<String>,
}

/// Settings of the verbs (RoCE) transport, `CCL_IB_*`.
///
/// They live here rather than in ccl-ibverbs so that every value is checked when the
/// configuration is read, on every rank and whatever the transport (a bad value is an error on
/// a TCP run or a build without verbs too, and `auto` cannot turn it into a silent fallback),
/// and so a communicator's verbs settings can be set in code like any other. They are plain
/// numbers and a device filter: ccl-core knows no verbs type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IbConfig {
    /// `CCL_IB_HCA`: device/port filter in NCCL syntax.
    pub hca: Option<String>,
    /// `CCL_IB_GID_INDEX`: fixed GID index instead of auto-selection.
    pub gid_index: Option<u32>,
    /// `CCL_IB_TIMEOUT`: local ACK timeout exponent.
    pub timeout: u8,
    /// `CCL_IB_RETRY_CNT`
    pub retry_cnt: u8,
    /// `CCL_IB_RNR_RETRY`
    pub rnr_retry: u8,
    /// `CCL_IB_TC`: traffic class of data QPs.
    pub tc: u8,
    /// `CCL_IB_CTRL_TC`: traffic class of the control (credit) QP.
    pub ctrl_tc: u8,
    /// `CCL_IB_QPS_PER_CONN`
    pub qps_per_conn: usize,
    /// `CCL_IB_SPLIT_DATA_ON_QPS`: split each send evenly across the data QPs instead of cutting
    /// it into slot-sized pieces.
    pub split_data_on_qps: bool,
    /// `CCL_IB_SLOTS`
    pub slots: usize,
    /// `CCL_IB_SLOT_SIZE`
    pub slot_size: usize,
    /// `CCL_IB_SPIN_US`: busy-poll time before sleeping on the completion channel.
    pub spin: Duration,
}

impl IbConfig {
    /// Parses the `CCL_IB_*` settings; `get` gives a setting's value, or its default if it has
    /// one.
    fn from_settings(get: &impl Fn(&str) -> Option<String>) -> Result<IbConfig> {
        let req = |name: &str| get(name).expect("setting has a default");
        let int = |name: &str, lo: u64, hi: u64| parse_in(name, &req(name), lo, hi);
        let ib = IbConfig {
            hca: get("CCL_IB_HCA"),
            gid_index: get("CCL_IB_GID_INDEX")
                .map(|v| parse_in("CCL_IB_GID_INDEX", &v, 0, 65535))
                .transpose()?
                .map(|v| v as u32),
            timeout: int("CCL_IB_TIMEOUT", 1, 31)? as u8,
            retry_cnt: int("CCL_IB_RETRY_CNT", 0, 7)? as u8,
            rnr_retry: int("CCL_IB_RNR_RETRY", 0, 7)? as u8,
            tc: int("CCL_IB_TC", 0, 255)? as u8,
            ctrl_tc: int("CCL_IB_CTRL_TC", 0, 255)? as u8,
            qps_per_conn: int("CCL_IB_QPS_PER_CONN", 1, 64)? as usize,
            split_data_on_qps: int("CCL_IB_SPLIT_DATA_ON_QPS", 0, 1)? == 1,
            spin: Duration::from_micros(int("CCL_IB_SPIN_US", 0, 10_000_000)?),
            slots: int("CCL_IB_SLOTS", 2, 256)? as usize,
            slot_size: parse_size("CCL_IB_SLOT_SIZE", &req("CCL_IB_SLOT_SIZE"), 4096)?,
        };
        if ib.slot_size > 8 << 20 {
            return Err(Error::invalid_argument(format!(
                "CCL_IB_SLOT_SIZE='{}' must be at most 8M",
                req("CCL_IB_SLOT_SIZE")
            )));
        }
        Ok(ib)
    }
}

impl Default for IbConfig {
    fn default() -> Self {
        Config::default().ib
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::from_lookup(|_| None).expect("defaults parse")
    }
}

impl Config {
    /// Reads every setting from the process environment.
    pub fn from_env() -> Result<Config> {
        let mut cfg = Config::from_lookup(|k| std::env::var(k).ok())?;
        cfg.unknown = std::env::vars()
            .map(|(k, _)| k)
            .filter(|k| {
                // CCL_RXE_VM_* belong to the SoftRoCE test harness (scripts/rxe-vm.sh).
                k.starts_with("CCL_")
                    && !k.starts_with("CCL_RXE_")
                    && !SETTINGS.iter().any(|s| s.name == k)
            })
            .collect();
        cfg.unknown.sort();
        Ok(cfg)
    }

    /// Reads every setting through `lookup` (tests pass a map). Empty values count as unset.
    // Long: one field of the struct literal per setting, each parsed where it is named; split,
    // the settings would be listed twice.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let get = |name: &str| -> Option<String> {
            let v = lookup(name).filter(|v| !v.trim().is_empty());
            v.or_else(|| {
                let d = setting(name).default;
                (!d.is_empty()).then(|| d.to_string())
            })
        };
        let req = |name: &str| get(name).expect("setting has a default");
        Ok(Config {
            log_level: parse_log_level(&req("CCL_DEBUG"))?,
            timeout: parse_seconds("CCL_TIMEOUT", &req("CCL_TIMEOUT"))?,
            trace_buffer: parse_size("CCL_TRACE_BUFFER", &req("CCL_TRACE_BUFFER"), 0)?,
            trace_counter: match req("CCL_TRACE_CLOCK").trim() {
                "auto" => true,
                "system" => false,
                v => {
                    return Err(Error::invalid_argument(format!(
                        "CCL_TRACE_CLOCK='{v}' is not auto or system"
                    )));
                }
            },
            trace_dir: get("CCL_TRACE_DIR"),
            trace_torch_file: get("CCL_TRACE_TORCH_FILE"),
            slow_window: parse_size("CCL_SLOW_WINDOW", &req("CCL_SLOW_WINDOW"), 1)?,
            slow_ms: parse_num("CCL_SLOW_MS", &req("CCL_SLOW_MS"))?,
            slow_report: Duration::from_secs(parse_num(
                "CCL_SLOW_REPORT_S",
                &req("CCL_SLOW_REPORT_S"),
            )?),
            late_warn_ms: match req("CCL_LATE_WARN_MS").trim() {
                "auto" => None,
                v => Some(parse_num("CCL_LATE_WARN_MS", v)?),
            },
            late_warn_floor_ms: parse_num(
                "CCL_LATE_WARN_FLOOR_MS",
                &req("CCL_LATE_WARN_FLOOR_MS"),
            )?,
            fault_stall: get("CCL_FAULT_STALL")
                .map(|v| match v.trim().strip_prefix("op:") {
                    Some(n) => parse_num("CCL_FAULT_STALL", n),
                    None => Err(Error::invalid_argument(format!(
                        "CCL_FAULT_STALL='{v}' is not op:N (the operation number to stall in)"
                    ))),
                })
                .transpose()?,
            transport: req("CCL_TRANSPORT")
                .parse()
                .map_err(|e| Error::invalid_argument(format!("CCL_TRANSPORT: {e}")))?,
            connect: req("CCL_CONNECT")
                .parse()
                .map_err(|e| Error::invalid_argument(format!("CCL_CONNECT: {e}")))?,
            monitor_fanout: parse_in("CCL_MONITOR_FANOUT", &req("CCL_MONITOR_FANOUT"), 2, 65536)?
                as usize,
            socket_ifname: get("CCL_SOCKET_IFNAME"),
            spin: Duration::from_micros(parse_num("CCL_SPIN_US", &req("CCL_SPIN_US"))?),
            chunk_size: parse_size("CCL_CHUNK_SIZE", &req("CCL_CHUNK_SIZE"), 1)?,
            socket_buffer: parse_size("CCL_SOCKET_BUFFER", &req("CCL_SOCKET_BUFFER"), 0)?,
            plane_timeout: Duration::from_millis(parse_in(
                "CCL_PLANE_TIMEOUT_MS",
                &req("CCL_PLANE_TIMEOUT_MS"),
                50,
                600_000,
            )?),
            reg_max_bytes: parse_size("CCL_REG_MAX_BYTES", &req("CCL_REG_MAX_BYTES"), 0)?,
            shm_disable: parse_bool("CCL_SHM_DISABLE", &req("CCL_SHM_DISABLE"))?,
            shm_ring_size: parse_ring_size(&req("CCL_SHM_RING_SIZE"))?,
            shm_slot_size: parse_pages("CCL_SHM_SLOT_SIZE", &req("CCL_SHM_SLOT_SIZE"))?,
            shm_arena_bytes: parse_size("CCL_SHM_ARENA_BYTES", &req("CCL_SHM_ARENA_BYTES"), 0)?,
            shm_spin: Duration::from_micros(parse_in(
                "CCL_SHM_SPIN_US",
                &req("CCL_SHM_SPIN_US"),
                0,
                10_000_000,
            )?),
            shm_one_shot: match req("CCL_SHM_ONE_SHOT").trim() {
                v if v.eq_ignore_ascii_case("auto") => None,
                v => Some(parse_size("CCL_SHM_ONE_SHOT", v, 0)?),
            },
            algo: get("CCL_ALGO"),
            topo_file: get("CCL_TOPO_FILE"),
            topology: None,
            rank: get("CCL_RANK")
                .map(|v| parse_num("CCL_RANK", &v))
                .transpose()?,
            world_size: get("CCL_WORLD_SIZE")
                .map(|v| parse_num("CCL_WORLD_SIZE", &v))
                .transpose()?,
            local_rank: get("CCL_LOCAL_RANK")
                .map(|v| parse_num("CCL_LOCAL_RANK", &v))
                .transpose()?,
            local_size: get("CCL_LOCAL_SIZE")
                .map(|v| parse_num("CCL_LOCAL_SIZE", &v))
                .transpose()?,
            unique_id: get("CCL_UNIQUE_ID"),
            comm_id: get("CCL_COMM_ID"),
            bootstrap_port: get("CCL_BOOTSTRAP_PORT")
                .map(|v| parse_num("CCL_BOOTSTRAP_PORT", &v))
                .transpose()?,
            secret: get("CCL_SECRET"),
            bootstrap_dir: get("CCL_BOOTSTRAP_DIR"),
            ib: IbConfig::from_settings(&get)?,
            unknown: Vec::new(),
        })
    }
}

fn setting(name: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} is not in SETTINGS"))
}

fn parse_log_level(v: &str) -> Result<LogLevel> {
    match v.to_ascii_lowercase().as_str() {
        "none" | "off" | "0" => Ok(LogLevel::None),
        "warn" | "warning" => Ok(LogLevel::Warn),
        "info" => Ok(LogLevel::Info),
        "trace" | "debug" => Ok(LogLevel::Trace),
        _ => Err(Error::invalid_argument(format!(
            "CCL_DEBUG='{v}' is not a log level (expected none, warn, info or trace)"
        ))),
    }
}

/// Parses a non-negative integer, naming the variable in the error.
pub fn parse_num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.trim().parse::<T>().map_err(|_| {
        Error::invalid_argument(format!("{name}='{v}' is not a valid non-negative integer"))
    })
}

/// Parses an integer in `lo..=hi`, naming the variable and the range in the error.
pub fn parse_in(name: &str, v: &str, lo: u64, hi: u64) -> Result<u64> {
    let n: u64 = v.trim().parse().map_err(|_| {
        Error::invalid_argument(format!(
            "{name}='{v}' is not an integer (expected {lo} to {hi})"
        ))
    })?;
    if !(lo..=hi).contains(&n) {
        return Err(Error::invalid_argument(format!(
            "{name}='{v}' is out of range (expected {lo} to {hi})"
        )));
    }
    Ok(n)
}

/// Parses seconds (fractions allowed) into a Duration; must be positive and finite.
pub fn parse_seconds(name: &str, v: &str) -> Result<Duration> {
    let s: f64 = v
        .trim()
        .parse()
        .map_err(|_| Error::invalid_argument(format!("{name}='{v}' is not a number of seconds")))?;
    if !(s.is_finite() && s > 0.0 && s < 1e9) {
        return Err(Error::invalid_argument(format!(
            "{name}='{v}' must be a positive number of seconds below 1e9"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Parses a byte size with an optional K/M/G suffix (powers of 1024), e.g. `128K`, `4M`, `1G`.
pub fn parse_size(name: &str, v: &str, min: usize) -> Result<usize> {
    let bad = |why: &str| Error::invalid_argument(format!("{name}='{v}' {why}"));
    let t = v.trim();
    let (digits, mult): (&str, u64) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(bad("has an unknown size suffix (expected K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| bad("is not a byte size (e.g. 4096, 128K, 4M, 1G)"))?;
    let bytes = n
        .checked_mul(mult)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| bad("overflows the address space"))?;
    if bytes < min {
        return Err(bad(&format!("must be at least {min}")));
    }
    Ok(bytes)
}

/// `0`/`1` (also `false`/`true`, `no`/`yes`, `off`/`on`).
pub fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "0" | "false" | "no" | "off" => Ok(false),
        "1" | "true" | "yes" | "on" => Ok(true),
        _ => Err(Error::invalid_argument(format!(
            "{name}='{v}' is not a boolean (expected 0 or 1)"
        ))),
    }
}

/// `CCL_SHM_RING_SIZE`: a size, or `auto` for [`auto_ring_size`] of this CPU's level-2 cache.
fn parse_ring_size(v: &str) -> Result<usize> {
    if v.trim().eq_ignore_ascii_case("auto") {
        return Ok(auto_ring_size(l2_cache_bytes()));
    }
    parse_pages("CCL_SHM_RING_SIZE", v)
}

/// The ring between two ranks of a host, for a level-2 cache of `l2` bytes per core: three
/// quarters of it, in whole pages, from 64K to 1M (512K when the size is unknown).
///
/// A producer runs up to a ring's capacity ahead of its consumer. Once that exceeds the L2, the
/// lines it wrote leave its L2 before the consumer reads them, and every byte of a large
/// operation goes the long way. On this project's earlier test machine (1 MiB of L2 per core),
/// while the two vCPUs sat on cores that share no cache (the phase in which the C floor of the
/// one-shot protocol takes 0.71-0.87 us), 2 ranks took 1090-1340 us for an 8 MiB allreduce with
/// a ring of 1M and 1113-1380 us with 1028K, 1536K, 2M or 3M, against 484-606 us with 512K,
/// 768K, 896K or 1020K; with cores that share one the step is small (768K against 1M: 481
/// against 521 us at 8 MiB and 3062 against 3351 at 32 MiB out of place, 328 against 331 and
/// 2207 against 2438 in place; docs/performance.md).
/// Smaller rings make the pair wait for each other more often (256K took 1.03-1.10x the time of
/// 512K). Three quarters leaves room for the rest of what the core reads and writes.
pub fn auto_ring_size(l2: Option<usize>) -> usize {
    let Some(l2) = l2 else {
        return 512 << 10;
    };
    (l2 / 4 * 3 / 4096 * 4096).clamp(64 << 10, 1 << 20)
}

/// Bytes of the level-2 data cache of CPU 0, as Linux reports it; `None` where it does not.
fn l2_cache_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.flatten().find_map(|e| {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).ok();
        let level = read("level")?;
        let kind = read("type")?;
        if level.trim() != "2" || kind.trim() == "Instruction" {
            return None;
        }
        parse_size("cache size", &read("size")?, 1).ok()
    })
}

/// Shared-memory sizes: whole 4 KiB pages, 64K to 256M.
fn parse_pages(name: &str, v: &str) -> Result<usize> {
    let b = parse_size(name, v, 64 << 10)?;
    if b > 256 << 20 || b % 4096 != 0 {
        return Err(Error::invalid_argument(format!(
            "{name}='{v}' must be a multiple of 4K between 64K and 256M"
        )));
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = Config::default();
        assert_eq!(c.log_level, LogLevel::Warn);
        assert_eq!(c.timeout, Duration::from_secs(600));
        assert_eq!(c.transport, TransportKind::Auto);
        assert_eq!(c.chunk_size, 128 << 10);
        assert!(c.rank.is_none() && c.socket_ifname.is_none());
    }

    #[test]
    fn values_parse() {
        let c = cfg(&[
            ("CCL_TIMEOUT", "2.5"),
            ("CCL_DEBUG", "INFO"),
            ("CCL_TRANSPORT", "tcp"),
            ("CCL_CHUNK_SIZE", "1M"),
            ("CCL_RANK", "3"),
            ("CCL_SOCKET_IFNAME", "=lo"),
        ])
        .unwrap();
        assert_eq!(c.timeout, Duration::from_millis(2500));
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.transport, TransportKind::Tcp);
        assert_eq!(c.chunk_size, 1 << 20);
        assert_eq!(c.rank, Some(3));
        assert_eq!(c.socket_ifname.as_deref(), Some("=lo"));
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("CCL_TIMEOUT", "soon"),
            ("CCL_TIMEOUT", "-1"),
            ("CCL_TIMEOUT", "inf"),
            ("CCL_DEBUG", "loud"),
            ("CCL_TRANSPORT", "carrier-pigeon"),
            ("CCL_CONNECT", "whenever"),
            ("CCL_MONITOR_FANOUT", "1"),
            ("CCL_CHUNK_SIZE", "0"),
            ("CCL_CHUNK_SIZE", "12Q"),
            ("CCL_CHUNK_SIZE", "99999999999999999999G"),
            ("CCL_RANK", "abc"),
            ("CCL_WORLD_SIZE", "-2"),
            ("CCL_BOOTSTRAP_PORT", "70000"),
            ("CCL_IB_TIMEOUT", "0"),
            ("CCL_IB_TIMEOUT", "32"),
            ("CCL_IB_RETRY_CNT", "8"),
            ("CCL_IB_TC", "256"),
            ("CCL_IB_CTRL_TC", "x"),
            ("CCL_IB_QPS_PER_CONN", "0"),
            ("CCL_IB_SPLIT_DATA_ON_QPS", "2"),
            ("CCL_IB_SLOTS", "1"),
            ("CCL_IB_SLOTS", "257"),
            ("CCL_IB_SLOT_SIZE", "1K"),
            ("CCL_IB_SLOT_SIZE", "9M"),
            ("CCL_IB_GID_INDEX", "-1"),
            ("CCL_IB_SPIN_US", "ms"),
            ("CCL_TRACE_CLOCK", "sundial"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{k}={v}");
            assert!(e.to_string().contains(k), "{e}");
            assert!(e.to_string().contains(v), "{e}");
        }
    }

    #[test]
    fn ib_settings() {
        let d = Config::default().ib;
        assert_eq!((d.timeout, d.retry_cnt, d.rnr_retry), (20, 7, 7));
        assert_eq!((d.tc, d.ctrl_tc, d.qps_per_conn), (0, 0, 1));
        assert_eq!((d.slots, d.slot_size), (16, 256 << 10));
        assert!(!d.split_data_on_qps);
        assert!(d.hca.is_none() && d.gid_index.is_none());
        let c = cfg(&[
            ("CCL_IB_HCA", "^mlx5_1,=rxe0:1"),
            ("CCL_IB_GID_INDEX", "3"),
            ("CCL_IB_TC", "106"),
            ("CCL_IB_CTRL_TC", "224"),
            ("CCL_IB_QPS_PER_CONN", "4"),
            ("CCL_IB_SPLIT_DATA_ON_QPS", "1"),
            ("CCL_IB_SLOTS", "8"),
            ("CCL_IB_SLOT_SIZE", "1M"),
        ])
        .unwrap()
        .ib;
        assert_eq!(c.hca.as_deref(), Some("^mlx5_1,=rxe0:1"));
        assert_eq!(c.gid_index, Some(3));
        assert_eq!((c.tc, c.ctrl_tc, c.qps_per_conn), (106, 224, 4));
        assert!(c.split_data_on_qps);
        assert_eq!((c.slots, c.slot_size), (8, 1 << 20));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("X", "4096", 0).unwrap(), 4096);
        assert_eq!(parse_size("X", "128K", 0).unwrap(), 128 << 10);
        assert_eq!(parse_size("X", "2g", 0).unwrap(), 2 << 30);
        assert!(parse_size("X", "", 0).is_err());
        assert!(parse_size("X", "K", 0).is_err());
    }

    #[test]
    fn the_automatic_ring_is_three_quarters_of_the_l2_within_bounds() {
        assert_eq!(auto_ring_size(Some(1 << 20)), 768 << 10);
        assert_eq!(auto_ring_size(Some(256 << 10)), 192 << 10);
        assert_eq!(auto_ring_size(Some(1280 << 10)), 960 << 10);
        // Whole pages; never past 1M nor under 64K.
        assert_eq!(auto_ring_size(Some(1_000_000)), 749_568);
        assert_eq!(auto_ring_size(Some(2 << 20)), 1 << 20);
        assert_eq!(auto_ring_size(Some(64 << 10)), 64 << 10);
        assert_eq!(auto_ring_size(None), 512 << 10);
        let auto = cfg(&[("CCL_SHM_RING_SIZE", "auto")]).unwrap().shm_ring_size;
        assert_eq!(Config::default().shm_ring_size, auto);
        assert!(auto % 4096 == 0 && (64 << 10..=1 << 20).contains(&auto));
        let set = cfg(&[("CCL_SHM_RING_SIZE", "2M")]).unwrap().shm_ring_size;
        assert_eq!(set, 2 << 20);
        let e = cfg(&[("CCL_SHM_RING_SIZE", "automatic")]).unwrap_err();
        assert!(e.to_string().contains("CCL_SHM_RING_SIZE"), "{e}");
    }

    #[test]
    fn every_setting_is_documented() {
        let doc = include_str!("../../docs/env.md");
        for s in SETTINGS {
            assert!(
                doc.contains(&format!("`{}`", s.name)),
                "docs/env.md does not document {}",
                s.name
            );
        }
    }
}
