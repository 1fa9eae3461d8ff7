//! `ccl-trace DIR`: reads every rank's flight-recorder dump in DIR (`CCL_TRACE_DIR`) and says
//! which rank a stuck or failed job waits for.
//! `ccl-trace --live HOST:PORT --secret S` (or `--live --id HEX`): asks a running job the same,
//! without stopping it. See docs/diagnosis.md.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Says which rank a stuck or failed job waits for: from the flight-recorder dumps in DIR, or by
/// asking a running job's monitor (--live).
#[derive(Debug, Parser)]
#[command(name = "ccl-trace")]
struct Args {
    /// The CCL_TRACE_DIR the ranks dumped into.
    #[arg(required_unless_present = "live", conflicts_with = "live")]
    dir: Option<PathBuf>,
    /// Ask a running job: its rendezvous HOST:PORT (with --secret), or nothing (with --id).
    #[arg(long, value_name = "HOST:PORT", num_args = 0..=1)]
    live: Option<Option<String>>,
    /// The running job's CCL_SECRET (with --live HOST:PORT).
    #[arg(long, requires = "live")]
    secret: Option<String>,
    /// The running job's unique id, as in CCL_UNIQUE_ID (with --live).
    #[arg(long, requires = "live", conflicts_with = "secret")]
    id: Option<String>,
}

/// Where to ask and with which secret.
fn live_target(addr: Option<&str>, a: &Args) -> Result<(SocketAddr, [u8; 32]), String> {
    match (addr, &a.secret, &a.id) {
        (None, None, Some(hex)) => {
            let id = ccl_bootstrap::UniqueId::from_hex(hex).map_err(|e| e.to_string())?;
            Ok((id.root_addr(), id.secret()))
        }
        (Some(at), Some(s), None) => {
            let addr = at
                .parse()
                .map_err(|_| format!("{at} is not a numeric HOST:PORT address"))?;
            Ok((addr, ccl_bootstrap::env::expand_secret(s.as_bytes())))
        }
        _ => Err("--live needs either HOST:PORT and --secret, or --id".into()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let text = match &args.live {
        Some(addr) => {
            let (addr, secret) = match live_target(addr.as_deref(), &args) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("ccl-trace: {e}");
                    return ExitCode::from(2);
                }
            };
            ccl_bootstrap::live_query(addr, &secret, Duration::from_secs(10))
                .map_err(|e| e.to_string())
        }
        None => {
            let dir = args
                .dir
                .as_deref()
                .expect("clap requires DIR without --live");
            ccl_diag::dump::read_dir(dir).map(|dumps| ccl_diag::report::report(&dumps))
        }
    };
    match text {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
