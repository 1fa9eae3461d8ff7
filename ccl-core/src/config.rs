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

mod settings;
pub use settings::{SETTINGS, Setting};

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
    /// `CCL_CONTROL_SCALE`: the factor on the control plane's fixed deadlines (the bootstrap
    /// reads it itself, once per process; here it is checked when a communicator starts).
    pub control_scale: f64,
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
            control_scale: parse_scale("CCL_CONTROL_SCALE", &req("CCL_CONTROL_SCALE"))?,
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

/// Parses `CCL_CONTROL_SCALE`: a factor from 0.25 to 100 for the control plane's deadlines.
pub fn parse_scale(name: &str, v: &str) -> Result<f64> {
    match v.trim().parse::<f64>() {
        Ok(x) if (0.25..=100.0).contains(&x) => Ok(x),
        _ => Err(Error::invalid_argument(format!(
            "{name}='{v}' is not a factor from 0.25 to 100"
        ))),
    }
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
mod tests;
