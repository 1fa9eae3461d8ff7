//! Logging to stderr with a `host:pid:rank` prefix, filtered by `CCL_DEBUG`.
//!
//! The level is process-wide (read from `CCL_DEBUG` on first use, or set with [`set_level`]) because
//! log lines come from threads that are not tied to one communicator (bootstrap roots, listeners).

use std::io::Write;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::config::LogLevel;

static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
static HOST: OnceLock<String> = OnceLock::new();

fn encode(l: LogLevel) -> u8 {
    l as u8
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
    LEVEL.store(encode(l), Ordering::Relaxed);
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
    LEVEL.store(encode(l), Ordering::Relaxed);
}

/// Whether messages at `l` are shown.
#[inline]
pub fn enabled(l: LogLevel) -> bool {
    l != LogLevel::None && l <= level()
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

/// Writes one line; use the `ccl_warn!`/`ccl_info!`/`ccl_trace!` macros instead.
pub fn write(l: LogLevel, rank: Option<usize>, args: std::fmt::Arguments<'_>) {
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
    let line = format!("{who} CCL {tag} {args}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs at warn level: `ccl_warn!(Some(rank), "format", args...)`.
#[macro_export]
macro_rules! ccl_warn {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled($crate::config::LogLevel::Warn) {
            $crate::log::write($crate::config::LogLevel::Warn, $rank, format_args!($($arg)*))
        }
    };
}

/// Logs at info level.
#[macro_export]
macro_rules! ccl_info {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled($crate::config::LogLevel::Info) {
            $crate::log::write($crate::config::LogLevel::Info, $rank, format_args!($($arg)*))
        }
    };
}

/// Logs at trace level.
#[macro_export]
macro_rules! ccl_trace {
    ($rank:expr, $($arg:tt)*) => {
        if $crate::log::enabled($crate::config::LogLevel::Trace) {
            $crate::log::write($crate::config::LogLevel::Trace, $rank, format_args!($($arg)*))
        }
    };
}
