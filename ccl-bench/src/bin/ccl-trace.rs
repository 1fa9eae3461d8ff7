//! `ccl-trace DIR`: reads every rank's flight-recorder dump in DIR (`CCL_TRACE_DIR`) and says
//! which rank a stuck or failed job waits for. See docs/diagnosis.md.

use std::path::PathBuf;
use std::process::ExitCode;

#[path = "../trace_tool.rs"]
mod trace_tool;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 1 || args[0] == "-h" || args[0] == "--help" {
        eprintln!("usage: ccl-trace DIR   (the CCL_TRACE_DIR the ranks dumped into)");
        return ExitCode::from(2);
    }
    match trace_tool::read_dir(&PathBuf::from(&args[0])) {
        Ok(dumps) => {
            print!("{}", trace_tool::report(&dumps));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
