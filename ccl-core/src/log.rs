//! Logging with a `host:pid:rank` prefix, filtered by `CCL_DEBUG` and `CCL_DEBUG_SUBSYS`, to
//! stderr or to `CCL_DEBUG_FILE`.
//!
//! Settings are process-wide (read on first use, or set with [`set_level`]) because log lines
//! come from threads that belong to no single communicator (bootstrap roots, listeners).
//!
//! Every module that logs names its subsystem: the macros read the `LOG_SUBSYS` constant in
//! scope where they are called (a module's own, or its crate's brought in with
//! `use crate::LOG_SUBSYS`), so a module without one does not compile and moving a file never
//! relabels its lines (a function can name another for its own lines, as the topology's summary
//! does). The subsystems: `bootstrap` (rendezvous, the job monitor), `net` (transports), `coll`
//! (the executor and the engine), `topo` (the topology read from `CCL_TOPO_FILE`), `init`
//! (communicator set-up, settings, failures, recovery). Warnings are shown whatever
//! `CCL_DEBUG_SUBSYS` says.

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
/// Bit per subsystem, valid once `SUBSYS_SET`.
static SUBSYS: AtomicU32 = AtomicU32::new(u32::MAX);
static SUBSYS_SET: AtomicBool = AtomicBool::new(false);
static HOST: OnceLock<String> = OnceLock::new();
static SINK: OnceLock<Mutex<Option<File>>> = OnceLock::new();

/// Where a log line comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subsys {
    Init = 0,
    Bootstrap = 1,
    Net = 2,
    Coll = 3,
    Topo = 4,
}

impl Subsys {
    pub const ALL: [Subsys; 5] = [
        Subsys::Init,
        Subsys::Bootstrap,
        Subsys::Net,
        Subsys::Coll,
        Subsys::Topo,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Subsys::Init => "init",
            Subsys::Bootstrap => "bootstrap",
            Subsys::Net => "net",
            Subsys::Coll => "coll",
            Subsys::Topo => "topo",
        }
    }
}

/// Parses `CCL_DEBUG_SUBSYS` (NCCL's syntax: a comma-separated list, `all`, a leading `^` to
/// exclude) into a bit mask; unknown names are ignored with a warning on stderr.
pub fn parse_subsys(spec: &str) -> u32 {
    let (exclude, list) = match spec.trim().strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec.trim()),
    };
    let mut mask = 0u32;
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if name.eq_ignore_ascii_case("all") {
            mask = u32::MAX;
            continue;
        }
        match Subsys::ALL
            .iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
        {
            Some(s) => mask |= 1 << (*s as u32),
            None => eprintln!(
                "ccl: CCL_DEBUG_SUBSYS: unknown subsystem '{name}' (known: all, init, bootstrap, net, coll, topo)"
            ),
        }
    }
    if exclude { !mask } else { mask }
}

fn subsys_mask() -> u32 {
    if SUBSYS_SET.load(Ordering::Acquire) {
        return SUBSYS.load(Ordering::Relaxed);
    }
    let m = match std::env::var("CCL_DEBUG_SUBSYS") {
        Ok(s) if !s.trim().is_empty() => parse_subsys(&s),
        _ => u32::MAX,
    };
    SUBSYS.store(m, Ordering::Relaxed);
    SUBSYS_SET.store(true, Ordering::Release);
    m
}

/// The current level.
pub fn level() -> LogLevel {
    let v = LEVEL.load(Ordering::Relaxed);
    if v != u8::MAX {
        return decode(v);
    }
    let l = crate::config::Config::from_lookup(|k| {
        (k == "CCL_DEBUG").then(|| std::env::var(k).ok()).flatten()
    })
    .map(|c| c.log_level)
    .unwrap_or(LogLevel::Warn);
    LEVEL.store(l as u8, Ordering::Relaxed);
    l
}

fn decode(v: u8) -> LogLevel {
    match v {
        0 => LogLevel::None,
        1 => LogLevel::Warn,
        2 => LogLevel::Info,
        _ => LogLevel::Trace,
    }
}

/// Overrides the level for the whole process.
pub fn set_level(l: LogLevel) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

/// Overrides the subsystems shown at info and trace level (a `CCL_DEBUG_SUBSYS` value).
pub fn set_subsys(spec: &str) {
    SUBSYS.store(parse_subsys(spec), Ordering::Relaxed);
    SUBSYS_SET.store(true, Ordering::Release);
}

/// Whether messages at `l` are shown at all.
#[inline]
pub fn enabled(l: LogLevel) -> bool {
    l != LogLevel::None && l <= level()
}

/// Whether messages at `l` from `subsys` are shown.
#[inline]
pub fn enabled_in(l: LogLevel, subsys: Subsys) -> bool {
    enabled(l) && (l == LogLevel::Warn || subsys_mask() & (1 << subsys as u32) != 0)
}

/// This host's name, computed once (used in log prefixes and topology).
pub fn hostname() -> &'static str {
    HOST.get_or_init(|| {
        nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown-host".to_string())
    })
}

/// The state letter `/proc` gives process `pid` of this host (`R`, `S`, `D`, `T` stopped, `Z`
/// ended but not yet reaped, ...), or `None` when no such process exists.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) S ...`: the name may hold anything, so the state follows the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// Expands `%h` (host name) and `%p` (process id) in a `CCL_DEBUG_FILE` or `CCL_TRACE_DIR`
/// pattern.
pub fn expand_path(pattern: &str) -> String {
    pattern
        .replace("%h", hostname())
        .replace("%p", &std::process::id().to_string())
}

fn sink() -> &'static Mutex<Option<File>> {
    SINK.get_or_init(|| {
        let file = std::env::var("CCL_DEBUG_FILE")
            .ok()
            .filter(|p| !p.trim().is_empty())
            .and_then(|p| {
                let path = expand_path(p.trim());
                match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                {
                    Ok(f) => Some(f),
                    Err(e) => {
                        eprintln!(
                            "ccl: CCL_DEBUG_FILE: cannot open {path}: {e}; logging to stderr"
                        );
                        None
                    }
                }
            });
        Mutex::new(file)
    })
}

/// Writes one line; use the `ccl_warn!`/`ccl_info!`/`ccl_trace!` macros instead.
pub fn write(l: LogLevel, subsys: Subsys, rank: Option<usize>, args: std::fmt::Arguments<'_>) {
    let tag = match l {
        LogLevel::Warn => "WARN",
        LogLevel::Info => "INFO",
        LogLevel::Trace => "TRACE",
        LogLevel::None => return,
    };
    let who = match rank {
        Some(r) => format!("{}:{}:{r}", hostname(), std::process::id()),
        None => format!("{}:{}", hostname(), std::process::id()),
    };
    // One write call per line so lines from concurrent ranks do not interleave.
    let line = format!("{who} CCL {tag} {} {args}\n", subsys.name());
    let mut g = sink().lock().unwrap_or_else(|p| p.into_inner());
    match g.as_mut() {
        Some(f) => {
            let _ = f.write_all(line.as_bytes());
        }
        None => {
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
    }
}

/// Logs at warn level: `ccl_warn!(Some(rank), "format", args...)`, labelled with the
/// `LOG_SUBSYS` in scope at the call.
#[macro_export]
macro_rules! ccl_warn {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled($crate::config::LogLevel::Warn) {
            $crate::log::write($crate::config::LogLevel::Warn, LOG_SUBSYS, $rank, format_args!($($arg)*))
        }
    };
}

/// Logs at info level (filtered by subsystem).
#[macro_export]
macro_rules! ccl_info {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled_in($crate::config::LogLevel::Info, LOG_SUBSYS) {
            $crate::log::write($crate::config::LogLevel::Info, LOG_SUBSYS, $rank, format_args!($($arg)*))
        }
    };
}

/// Logs at trace level (filtered by subsystem).
#[macro_export]
macro_rules! ccl_trace {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled_in($crate::config::LogLevel::Trace, LOG_SUBSYS) {
            $crate::log::write($crate::config::LogLevel::Trace, LOG_SUBSYS, $rank, format_args!($($arg)*))
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_runs() {
        let s = super::process_state(std::process::id());
        assert!(matches!(s, Some('R' | 'S' | 'D')), "{s:?}");
        assert_eq!(super::process_state(u32::MAX), None);
    }

    use super::*;

    #[test]
    fn subsystems() {
        let m = parse_subsys("net,coll");
        assert_eq!(m, (1 << Subsys::Net as u32) | (1 << Subsys::Coll as u32));
        let x = parse_subsys("^net");
        assert_eq!(x & (1 << Subsys::Net as u32), 0);
        assert_ne!(x & (1 << Subsys::Init as u32), 0);
        assert_eq!(parse_subsys("all"), u32::MAX);
    }

    #[test]
    fn paths_expand() {
        let p = expand_path("/tmp/ccl-%h-%p.log");
        assert!(p.contains(hostname()) && p.contains(&std::process::id().to_string()));
    }
}
