//! `ccl-trace DIR`: reads every rank's flight-recorder dump in DIR (`CCL_TRACE_DIR`) and says
//! which rank a stuck or failed job waits for.
//! `ccl-trace --live ADDR --secret S` (or `--live --id HEX`): asks a running job the same, without
//! stopping it. See docs/diagnosis.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str =
    "usage: ccl-trace DIR                         (the CCL_TRACE_DIR the ranks dumped into)
       ccl-trace --live HOST:PORT --secret S   (a running job's rendezvous and its CCL_SECRET)
       ccl-trace --live --id HEX               (a running job's unique id, as in CCL_UNIQUE_ID)";

/// Where to ask and with which secret.
fn live_target(args: &[String]) -> Result<(std::net::SocketAddr, [u8; 32]), String> {
    let mut addr = None;
    let mut secret = None;
    let mut id = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--live" => {}
            "--secret" => secret = Some(value()?),
            "--id" => id = Some(value()?),
            s if addr.is_none() && !s.starts_with('-') => addr = Some(s.to_string()),
            s => return Err(format!("unexpected argument {s}")),
        }
    }
    match (addr, secret, id) {
        (None, None, Some(hex)) => {
            let id = ccl_bootstrap::UniqueId::from_hex(&hex).map_err(|e| e.to_string())?;
            Ok((id.root_addr(), id.secret()))
        }
        (Some(a), Some(s), None) => {
            let addr = a
                .parse()
                .map_err(|_| format!("{a} is not a numeric HOST:PORT address"))?;
            Ok((addr, ccl_bootstrap::env::expand_secret(s.as_bytes())))
        }
        _ => Err("--live needs either HOST:PORT and --secret, or --id".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() || args[0] == "-h" || args[0] == "--help" {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    if args[0] == "--live" {
        let (addr, secret) = match live_target(&args) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("ccl-trace: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        return match ccl_bootstrap::live_query(addr, &secret, Duration::from_secs(10)) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ccl-trace: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if args.len() != 1 {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    match ccl_diag::dump::read_dir(&PathBuf::from(&args[0])) {
        Ok(dumps) => {
            print!("{}", ccl_diag::report::report(&dumps));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
