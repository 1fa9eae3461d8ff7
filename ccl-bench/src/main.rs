//! `ccl-bench`: an nccl-tests-compatible bus-bandwidth benchmark.
//!
//! ```text
//! ccl-bench allreduce --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -o sum -d float --transport tcp
//! mpirun -np 4 ccl-bench allreduce        # ranks from the launcher's variables
//! ```
//!
//! With `--np N` the command starts N local ranks itself (processes; threads for
//! `--transport local`) and acts as their rendezvous root; without it, the process is one rank
//! of a job whose launcher set `RANK`/`WORLD_SIZE` (torchrun), `OMPI_COMM_WORLD_*` (mpirun),
//! `SLURM_*` (srun) or `CCL_*`. Rank 0 prints the table; the exit status is non-zero when any rank
//! fails or any element is wrong.
//!
//! Besides a subcommand per collective: `plot` and `compare` over `--json` reports, and `sim`,
//! the command line of `ccl-sim`. The crate's other programs (`src/bin`) are `ccl-trace`, which
//! names the rank a stuck job waits for, and `ccl-shrink-trials`, randomised trials of surviving
//! a rank's death.
#![forbid(unsafe_code)]

mod colls;
mod harness;
mod plot;
mod scale;
mod sim;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ccl_core::config::{TransportKind, parse_size};
use ccl_diag::human_bytes;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use oxccl::{Communicator, Config, DataType, ReduceOp, UniqueId};

use harness::{Bench, Plan, Row};

#[derive(Parser, Debug)]
#[command(
    name = "ccl-bench",
    version,
    about = "nccl-tests-compatible bus-bandwidth benchmark for ccl"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Allreduce (busbw factor 2(n-1)/n).
    Allreduce(BenchArgs),
    /// Allgather (size = whole result; busbw factor (n-1)/n).
    Allgather(BenchArgs),
    /// Reduce-scatter (size = whole input; busbw factor (n-1)/n).
    Reducescatter(BenchArgs),
    /// Broadcast from -r ROOT (busbw factor 1).
    Broadcast(BenchArgs),
    /// Reduce to -r ROOT (busbw factor 1).
    Reduce(BenchArgs),
    /// Alltoall (size = whole buffer; busbw factor (n-1)/n).
    Alltoall(BenchArgs),
    /// Each rank sends to the next and receives from the previous (busbw factor 1).
    Sendrecv(BenchArgs),
    /// Gather to -r ROOT (size = whole result; busbw factor (n-1)/n).
    Gather(BenchArgs),
    /// Scatter from -r ROOT (size = whole input; busbw factor (n-1)/n).
    Scatter(BenchArgs),
    /// Alltoall with uneven blocks, rank a sending rank b a share growing with (a+b) mod n
    /// (size = what each rank sends; busbw factor (n-1)/n).
    Alltoallv(BenchArgs),
    /// Draws the busbw curves of one or more `--json` reports into one SVG picture.
    Plot(PlotArgs),
    /// Compares `--json` reports of one collective size by size: a Markdown table of
    /// out-of-place times, the fastest marked, and how far the automatic choice (the report
    /// named `auto`) is from the fastest.
    Compare(CompareArgs),
    /// Simulates allreduce schedules on a modelled fabric (Clos, ECMP, QPs per connection):
    /// a table, `--json`, `--plot`; see docs/scale.md.
    Sim(Box<sim::SimArgs>),
}

#[derive(Args, Debug)]
struct CompareArgs {
    /// `--json` reports; each is a column named after its file up to the first dot
    /// (`ring.json` -> `ring`). Files with the same name are repeats (`ring.1.json`,
    /// `ring.2.json`): the column shows their median time per size.
    #[arg(required = true)]
    reports: Vec<PathBuf>,
}

#[derive(Args, Debug)]
struct PlotArgs {
    /// The SVG file to write.
    out: PathBuf,
    /// `--json` reports; each placement of each becomes one line.
    #[arg(required = true)]
    reports: Vec<PathBuf>,
    /// Title of the picture (default: the collectives and rank counts of the reports).
    #[arg(long)]
    title: Option<String>,
}

impl Cmd {
    fn parts(&self) -> Option<(colls::Op, &BenchArgs)> {
        use colls::Op;
        use oxccl::Collective as C;
        Some(match self {
            Cmd::Allreduce(a) => (Op::Coll(C::AllReduce), a),
            Cmd::Allgather(a) => (Op::Coll(C::AllGather), a),
            Cmd::Reducescatter(a) => (Op::Coll(C::ReduceScatter), a),
            Cmd::Broadcast(a) => (Op::Coll(C::Broadcast), a),
            Cmd::Reduce(a) => (Op::Coll(C::Reduce), a),
            Cmd::Alltoall(a) => (Op::Coll(C::AllToAll), a),
            Cmd::Sendrecv(a) => (Op::SendRecv, a),
            Cmd::Gather(a) => (Op::Coll(C::Gather), a),
            Cmd::Scatter(a) => (Op::Coll(C::Scatter), a),
            Cmd::Alltoallv(a) => (Op::Coll(C::AllToAllV), a),
            Cmd::Plot(_) | Cmd::Compare(_) | Cmd::Sim(_) => return None,
        })
    }
}

fn size_arg(s: &str) -> Result<usize, String> {
    parse_size("size", s, 0).map_err(|e| e.message().to_string())
}

#[derive(Args, Debug, Clone)]
struct BenchArgs {
    /// Start N local ranks (processes; threads with --threads or --transport local) instead of
    /// reading the rank from a launcher's environment.
    #[arg(long, value_name = "N")]
    np: Option<usize>,
    /// With --np: the ranks are threads of this process, over the transport chosen (real
    /// sockets over tcp), rather than processes.
    #[arg(long)]
    threads: bool,
    /// Smallest size in bytes (K/M/G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = size_arg)]
    min_bytes: usize,
    /// Largest size in bytes (K/M/G suffixes).
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = size_arg)]
    max_bytes: usize,
    /// Multiply the size by this between steps.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Check results against closed-form values (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    check: u8,
    /// Reduction: sum, prod, min, max, avg.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    op: ReduceOp,
    /// Root of broadcast, reduce, gather and scatter.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 (or f32, bf16, ...).
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: DataType,
    /// auto, shm, tcp, ib, local (in-process threads). Default: CCL_TRANSPORT, else auto.
    #[arg(long)]
    transport: Option<TransportKind>,
    /// Force an algorithm for this collective (a name such as `ring`, or CCL_ALGO syntax).
    #[arg(long)]
    algo: Option<String>,
    /// With --np: bind rank r to the r-th CPU this process may use (`core`, the default when
    /// there are at least as many CPUs as ranks, as Open MPI does), or leave placement to the
    /// scheduler (`none`). Two ranks sharing a CPU take turns instead of overlapping.
    #[arg(long, default_value = "core", value_parser = ["core", "none"])]
    bind: String,
    /// Run on buffers from `Communicator::alloc` (registered with the transports: zero-copy
    /// sends over verbs) instead of plain vectors.
    #[arg(long)]
    registered: bool,
    /// Fault injection for diagnosis tests: this rank sleeps --delay-ms before each call of the
    /// timed loop, from call --delay-from on (a rank that is late, or never enters a call).
    #[arg(long, value_name = "RANK", hide = true)]
    delay_rank: Option<usize>,
    #[arg(long, value_name = "MS", default_value_t = 0, hide = true)]
    delay_ms: u64,
    #[arg(long, value_name = "CALL", default_value_t = 0, hide = true)]
    delay_from: usize,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// Also draw busbw against size (both placements) as an SVG picture to this file.
    #[arg(long, value_name = "PATH")]
    plot: Option<PathBuf>,
    /// Append a line per rank to this file on what set-up cost it (times from the job's start,
    /// connections, descriptors, memory), and with --np the launcher's own (the bytes its
    /// rendezvous root moved); see scripts/scale-init.sh.
    #[arg(long, value_name = "PATH")]
    scale_report: Option<PathBuf>,
    /// Record every operation of every rank and write them as one Chrome trace (open in
    /// chrome://tracing or Perfetto; one track per rank) to this file.
    #[arg(long, value_name = "PATH")]
    trace: Option<PathBuf>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    collective: String,
    nranks: usize,
    transport: String,
    results: Vec<Row>,
}

fn main() -> ExitCode {
    scale::mark_start();
    if let Err(code) = end_with_parent() {
        return code;
    }
    // A flag given twice takes its last value (as in nccl-tests), so a wrapper's defaults
    // (scripts/bench.sh) can be overridden by the flags passed after them.
    let cmd = Cli::command().mut_subcommands(|c| c.args_override_self(true));
    let cli = match Cli::from_arg_matches(&cmd.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match &cli.cmd {
        Cmd::Plot(p) => return plot_reports(p),
        Cmd::Compare(c) => return compare_reports(c),
        Cmd::Sim(s) => return sim::run(s),
        _ => {}
    }
    let Some((op, args)) = cli.cmd.parts() else {
        unreachable!("every other subcommand is a benchmark")
    };
    let coll = colls::Coll {
        op,
        root: args.root,
    };
    if args.factor == 0 || args.min_bytes > args.max_bytes {
        eprintln!(
            "ccl-bench: invalid size range: -b {} -e {} -f {} (need min <= max and a factor >= 1)",
            args.min_bytes, args.max_bytes, args.factor
        );
        return ExitCode::from(2);
    }
    let config = match settings(args, op) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccl-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match args.np {
        Some(0) => {
            eprintln!("ccl-bench: --np must be at least 1");
            ExitCode::from(2)
        }
        Some(n) if config.transport == TransportKind::Local || args.threads => {
            run_threads(&coll, args, config, n)
        }
        Some(n) if std::env::var_os(SPAWNER_VAR).is_some() => spawner(&config, n, args),
        Some(n) => launch(&config, n, args),
        None => match Communicator::from_env_with_config(config) {
            Ok(comm) => bench_rank(&coll, &comm, args, scale::now_us(), None),
            Err(e) => {
                eprintln!("ccl-bench: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Settings from the environment with the command line on top.
fn settings(args: &BenchArgs, op: colls::Op) -> oxccl::Result<Config> {
    let mut c = Config::from_env()?;
    if let Some(t) = args.transport {
        c.transport = t;
    }
    if args.trace.is_some() {
        // Room for every operation of the run: the timed and warm-up ones of both placements
        // and the few the harness adds per size.
        let per_size = 2 * (args.iters + args.warmup) + 8;
        let sizes = harness::sizes(args.min_bytes, args.max_bytes, args.factor).len();
        c.trace_buffer = c.trace_buffer.max(per_size * sizes + 16);
    }
    if let Some(a) = &args.algo {
        // A bare name means "for the collective being measured", so a name that collective lacks
        // is an error rather than silently ignored.
        c.algo = Some(match op {
            colls::Op::Coll(coll) if !a.contains(':') => format!("{}:{a}", coll.name()),
            _ => a.clone(),
        });
    }
    Ok(c)
}

fn plan(args: &BenchArgs) -> Plan {
    Plan {
        sizes: harness::sizes(args.min_bytes, args.max_bytes, args.factor),
        iters: args.iters,
        warmup: args.warmup,
        check: args.check == 1,
        op: args.op,
        dtype: args.dtype,
        registered: args.registered,
        delay: args.delay_rank.map(|rank| harness::Delay {
            rank,
            each: std::time::Duration::from_millis(args.delay_ms),
            from: args.delay_from,
        }),
    }
}

/// Runs the benchmark as one rank; rank 0 prints and writes the JSON.
/// `init_done`: when the communicator was ready ([`scale::now_us`]).
/// `gate`: where ranks that are threads of this process meet for the scale report.
fn bench_rank(
    coll: &dyn Bench,
    comm: &Communicator,
    args: &BenchArgs,
    init_done: u64,
    gate: Option<&scale::Gate>,
) -> ExitCode {
    // Only rank 0 prints. Never hold the stdout lock across a collective: in thread mode the
    // other ranks share this process's stdout.
    let mut out: Box<dyn Write> = if comm.rank() == 0 {
        Box::new(std::io::stdout())
    } else {
        Box::new(std::io::sink())
    };
    // What a job's start costs ends at its first collective's result, connections included.
    let first = args
        .scale_report
        .as_ref()
        .map(|_| scale::first_allreduce(comm));
    let shared = gate.map(|g| (comm.size(), g.meet()));
    let first_result = match first {
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            eprintln!("ccl-bench: {e}");
            return ExitCode::FAILURE;
        }
        None => 0,
    };
    let rows = match harness::run(coll, comm, &plan(args), &mut out) {
        Ok(r) => r,
        Err(e) => {
            let _ = out.flush();
            eprintln!("ccl-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(path) = &args.scale_report
        && let Err(e) = scale::report_rank(path, comm, init_done, first_result, shared)
    {
        eprintln!("ccl-bench: {e}");
        return ExitCode::FAILURE;
    }
    let report = Report {
        collective: coll.name().to_string(),
        nranks: comm.size(),
        transport: comm.transport_name().to_string(),
        results: rows,
    };
    let mut files: Vec<(&PathBuf, String)> = Vec::new();
    if let Some(path) = &args.trace {
        // Every rank takes part in gathering the recorders; only rank 0 writes.
        match gather_traces(comm) {
            Ok(dumps) => files.push((path, ccl_diag::chrome::trace(&dumps))),
            Err(e) => {
                eprintln!("ccl-bench: cannot gather the trace: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(path) = &args.json {
        files.push((
            path,
            serde_json::to_string_pretty(&report).expect("rows serialize") + "\n",
        ));
    }
    if let Some(path) = &args.plot {
        files.push((path, plot::svg(&title(&[&report]), &series(&report, ""))));
    }
    if comm.rank() == 0 {
        for (path, text) in files {
            if let Err(e) = std::fs::write(path, text) {
                eprintln!("ccl-bench: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let rows = report.results;
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    if wrong > 0 {
        if comm.rank() == 0 {
            eprintln!("ccl-bench: {wrong} wrong element(s)");
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `--np N --transport local`: the ranks are threads of this process.
fn run_threads(coll: &colls::Coll, args: &BenchArgs, config: Config, n: usize) -> ExitCode {
    let id = match UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &config) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("ccl-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gate = args
        .scale_report
        .as_ref()
        .map(|_| scale::Gate::new(n, config.timeout));
    let codes: Vec<ExitCode> = std::thread::scope(|s| {
        let mut hs = Vec::with_capacity(n);
        for rank in 0..n {
            let (id, config, gate) = (id.clone(), config.clone(), gate.as_ref());
            let run = move || match Communicator::init_with_config(&id, rank, n, config) {
                Ok(comm) => bench_rank(coll, &comm, args, scale::now_us(), gate),
                Err(e) => {
                    eprintln!("ccl-bench: rank {rank}: {e}");
                    ExitCode::FAILURE
                }
            };
            match std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn_scoped(s, run)
            {
                Ok(h) => hs.push(h),
                Err(e) => {
                    // The ranks started fail at their deadline, naming those that never came.
                    eprintln!("ccl-bench: cannot start a thread for rank {rank}: {e}");
                    break;
                }
            }
        }
        // A rank whose thread did not start counts as failed.
        let mut codes: Vec<ExitCode> = hs
            .into_iter()
            .map(|h| h.join().unwrap_or(ExitCode::FAILURE))
            .collect();
        codes.resize(n, ExitCode::FAILURE);
        codes
    });
    if let Some(path) = &args.scale_report
        && let Err(e) = scale::report_launcher(path, n, true)
    {
        eprintln!("ccl-bench: {e}");
        return ExitCode::FAILURE;
    }
    if codes.iter().all(|c| *c == ExitCode::SUCCESS) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Set in the environment of the helper that starts the ranks of `--np` ([`launch`]).
const SPAWNER_VAR: &str = "CCLBENCH_SPAWNER";
/// The process id of the process that started this one under `--np` (the launcher for its
/// helper, the helper for the ranks): see [`end_with_parent`].
const PARENT_VAR: &str = "CCLBENCH_PARENT";

/// Under `--np`, a job ends when its launcher does, as under mpirun or torchrun: the helper and
/// each rank ask the kernel for `SIGTERM` when the process that started them ends (the launcher
/// killed, even with `SIGKILL`, ends the helper, which ends the ranks). Without this, a killed
/// launcher left its ranks running: their rendezvous root lived in it, and the job survives its
/// root's death by design. Fails when that process is already gone.
fn end_with_parent() -> Result<(), ExitCode> {
    let Some(parent) = std::env::var(PARENT_VAR)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return Ok(());
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM) {
        eprintln!("ccl-bench: cannot ask to end with the launcher (prctl: {e}); going on");
    }
    // Set after the fork: a parent that ended before it is not signalled for.
    if nix::unistd::getppid().as_raw() != parent {
        eprintln!("ccl-bench: the process that started this one (pid {parent}) is gone; ending");
        return Err(ExitCode::FAILURE);
    }
    Ok(())
}

/// `--np N`: start N rank processes of this program and be their rendezvous root.
///
/// A helper process, started first, starts the ranks and waits for them ([`spawner`]). A new
/// process gets a copy of its parent's descriptor table and closes it again at exec, and the
/// launcher's fills with the rendezvous root's connections as the ranks arrive: starting 1,024
/// ranks from it cost about a CPU-second more on a 2-CPU machine, taken from the ranks.
fn launch(config: &Config, n: usize, args: &BenchArgs) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ccl-bench: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut helper = match Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(SPAWNER_VAR, "1")
        .env(PARENT_VAR, std::process::id().to_string())
        .env(scale::T0_VAR, scale::mark_start().to_string())
        .stdin(Stdio::piped())
        .spawn()
    {
        Ok(h) => h,
        Err(e) => {
            eprintln!("ccl-bench: cannot start the process that starts the ranks: {e}");
            return ExitCode::FAILURE;
        }
    };
    let id = match unique_id(config) {
        Ok(id) => id,
        Err((code, e)) => {
            // The helper reads an empty line and ends.
            eprintln!("ccl-bench: {e}");
            drop(helper.stdin.take());
            let _ = helper.wait();
            return code;
        }
    };
    if let Some(mut to) = helper.stdin.take() {
        // A helper that died already is reported by its exit status below.
        let _ = writeln!(to, "{}", id.to_hex());
    }
    let status = helper.wait();
    if let Some(path) = &args.scale_report
        && let Err(e) = scale::report_launcher(path, n, false)
    {
        eprintln!("ccl-bench: {e}");
        return ExitCode::FAILURE;
    }
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ccl-bench: waiting for the process that starts the ranks: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The job's id, its rendezvous root on the address the ranks will reach (loopback unless
/// `CCL_SOCKET_IFNAME` says otherwise); on failure the exit code and the error.
fn unique_id(config: &Config) -> Result<UniqueId, (ExitCode, String)> {
    let ip = match &config.socket_ifname {
        Some(spec) => ccl_core::net::pick_local_ip(Some(spec))
            .map_err(|e| (ExitCode::from(2), e.to_string()))?,
        None => IpAddr::V4(Ipv4Addr::LOCALHOST),
    };
    UniqueId::new_at(ip, config).map_err(|e| (ExitCode::FAILURE, e.to_string()))
}

/// The helper of [`launch`]: reads the job's id from its standard input, starts the ranks,
/// waits for them and says which failed.
fn spawner(config: &Config, n: usize, args: &BenchArgs) -> ExitCode {
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() || line.trim().is_empty() {
        // The launcher could not make the id, and said why.
        return ExitCode::FAILURE;
    }
    let id = match UniqueId::from_hex(line.trim()) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("ccl-bench: the job's id from the launcher: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut children = match spawn_ranks(config, &id, n, args.bind == "core") {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ccl-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = wait_ranks(&mut children, config);
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!("ccl-bench: failed: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

/// Starts `n` rank processes of this program, with this process's arguments less `--np`, joining
/// the job of `id`; on failure, stops those already started.
fn spawn_ranks(
    config: &Config,
    id: &UniqueId,
    n: usize,
    bind: bool,
) -> Result<Vec<Option<Child>>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my own executable: {e}"))?;
    let mut child_args: Vec<String> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--np" {
            it.next();
        } else if a.starts_with("--np=") {
        } else {
            child_args.push(a);
        }
    }
    let mut children: Vec<Option<Child>> = Vec::with_capacity(n);
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&child_args)
            .stdin(Stdio::null())
            .env_remove(SPAWNER_VAR)
            .env(PARENT_VAR, std::process::id().to_string())
            .env("CCL_UNIQUE_ID", id.to_hex())
            .env(scale::T0_VAR, scale::mark_start().to_string())
            .env("CCL_RANK", rank.to_string())
            .env("CCL_WORLD_SIZE", n.to_string())
            .env("CCL_LOCAL_RANK", rank.to_string())
            .env("CCL_LOCAL_SIZE", n.to_string());
        if config.socket_ifname.is_none() {
            // A local job stays on loopback.
            cmd.env("CCL_SOCKET_IFNAME", "=lo");
        }
        match cmd.spawn() {
            Ok(c) => {
                if bind {
                    bind_to_cpu(&c, rank, n);
                }
                children.push(Some(c))
            }
            Err(e) => {
                kill_all(&mut children);
                return Err(format!("cannot start rank {rank}: {e}"));
            }
        }
    }
    Ok(children)
}

/// Waits for every rank process and returns those that failed. Once one fails, the others get a
/// grace period to fail on their own (they see the dead peer) and are then stopped, so a failure
/// never leaves the launcher hanging.
///
/// Children are reaped as they end (`waitpid(-1)`), not polled one by one: polling a thousand
/// ranks 50 times a second would take a CPU-second of a 2-CPU machine from the ranks it waits
/// for.
fn wait_ranks(children: &mut [Option<Child>], config: &Config) -> Vec<String> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let grace = Duration::from_secs(10).min(config.timeout);
    let rank_of: std::collections::HashMap<u32, usize> = children
        .iter()
        .enumerate()
        .filter_map(|(rank, c)| Some((c.as_ref()?.id(), rank)))
        .collect();
    let mut failed: Vec<String> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    let mut left = children.iter().flatten().count();
    while left > 0 {
        loop {
            let (pid, why) = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, 0)) => (pid, None),
                Ok(WaitStatus::Exited(pid, code)) => (pid, Some(format!("exit status: {code}"))),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    (pid, Some(format!("signal: {} ({sig})", sig as i32)))
                }
                // None ended since the last look (or one was stopped or continued: a
                // debugger; it is still running).
                Ok(_) => break,
                Err(e) => {
                    // ECHILD: none left to wait for, though some were thought alive.
                    for (rank, slot) in children.iter_mut().enumerate() {
                        if slot.take().is_some() {
                            failed.push(format!("rank {rank} (wait failed: {e})"));
                        }
                    }
                    return failed;
                }
            };
            let Some(&rank) = u32::try_from(pid.as_raw())
                .ok()
                .and_then(|p| rank_of.get(&p))
            else {
                continue;
            };
            // Reaped: the handle must not be waited for or signalled again.
            if children[rank].take().is_some() {
                left -= 1;
            }
            if let Some(why) = why {
                failed.push(format!("rank {rank} ({why})"));
                first_failure.get_or_insert_with(Instant::now);
            }
        }
        if left == 0 {
            break;
        }
        if first_failure.is_some_and(|t| t.elapsed() > grace) {
            for (rank, slot) in children.iter().enumerate() {
                if slot.is_some() {
                    failed.push(format!("rank {rank} (stopped after another rank failed)"));
                }
            }
            kill_all(children);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    failed
}

/// Pins a rank process to one of the CPUs this process may run on, when there is one per rank.
fn bind_to_cpu(child: &Child, rank: usize, n: usize) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let Ok(mine) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| mine.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() < n {
        return;
    }
    let mut set = CpuSet::new();
    if set.set(cpus[rank]).is_ok() {
        // Best effort: an unpinned rank still runs correctly.
        let _ = sched_setaffinity(Pid::from_raw(child.id() as i32), &set);
    }
}

fn kill_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Every rank's flight recorder, parsed, in rank order (on every rank).
fn gather_traces(comm: &Communicator) -> oxccl::Result<Vec<ccl_diag::Dump>> {
    let mine = comm.trace_json().into_bytes();
    let n = comm.size();
    let mut lens = vec![0u64; n];
    comm.all_gather(&[mine.len() as u64], &mut lens)?;
    let width = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = mine;
    padded.resize(width, b' ');
    let mut all = vec![0u8; width * n];
    comm.all_gather(&padded, &mut all)?;
    all.chunks(width.max(1))
        .zip(&lens)
        .enumerate()
        .map(|(r, (c, &len))| {
            serde_json::from_slice(&c[..len as usize]).map_err(|e| {
                oxccl::Error::new(
                    oxccl::ErrorKind::Internal,
                    format!(
                        "rank {}: the recorder of rank {r} is not a dump: {e}",
                        comm.rank()
                    ),
                )
            })
        })
        .collect()
}

/// One line per placement of a report, labelled with `prefix`.
fn series(r: &Report, prefix: &str) -> Vec<plot::Series> {
    ["out-of-place", "in-place"]
        .iter()
        .filter_map(|&placement| {
            let points: Vec<(f64, f64)> = r
                .results
                .iter()
                .filter(|row| row.placement == placement)
                .map(|row| (row.size as f64, row.busbw_gbs))
                .collect();
            (!points.is_empty()).then(|| plot::Series {
                label: format!("{prefix}{placement}"),
                points,
            })
        })
        .collect()
}

fn title(reports: &[&Report]) -> String {
    let mut parts: Vec<String> = reports
        .iter()
        .map(|r| format!("{}, {} ranks", r.collective, r.nranks))
        .collect();
    parts.dedup();
    format!("{} (busbw)", parts.join("; "))
}

fn read_reports(paths: &[PathBuf]) -> Result<Vec<Report>, String> {
    paths
        .iter()
        .map(|path| {
            std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<Report>(&t).map_err(|e| e.to_string()))
                .map_err(|e| format!("{}: not a ccl-bench --json report: {e}", path.display()))
        })
        .collect()
}

fn stem(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `ccl-bench compare A.json B.json ... auto.json`
fn compare_reports(c: &CompareArgs) -> ExitCode {
    let table = read_reports(&c.reports).and_then(|r| compare_table(&r, &c.reports));
    match table {
        Ok(t) => {
            print!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ccl-bench compare: {e}");
            ExitCode::from(2)
        }
    }
}

/// The Markdown table `compare` prints.
fn compare_table(reports: &[Report], paths: &[PathBuf]) -> Result<String, String> {
    let first = reports.first().ok_or("no reports")?;
    for (r, p) in reports.iter().zip(paths) {
        if r.collective != first.collective || r.nranks != first.nranks {
            return Err(format!(
                "{} is {} over {} ranks, {} is {} over {} ranks",
                p.display(),
                r.collective,
                r.nranks,
                paths[0].display(),
                first.collective,
                first.nranks
            ));
        }
    }
    Ok(Medians::of(reports, paths).render())
}

/// One (time in us, algorithm) per size and column.
type Cells = std::collections::BTreeMap<usize, Vec<Option<(f64, String)>>>;

/// The out-of-place results of several reports as columns: one per name (a report's file name up
/// to its first dot; repeats of a name share its column, which holds their median).
struct Medians {
    names: Vec<String>,
    /// The column named `auto`, if any: runs that let the cost model choose.
    auto: Option<usize>,
    cells: Cells,
}

impl Medians {
    fn of(reports: &[Report], paths: &[PathBuf]) -> Medians {
        // Columns in order of first appearance; repeats share one.
        let mut names: Vec<String> = Vec::new();
        let column: Vec<usize> = paths
            .iter()
            .map(|p| {
                let n = stem(p).split('.').next().unwrap_or_default().to_string();
                names.iter().position(|x| *x == n).unwrap_or_else(|| {
                    names.push(n);
                    names.len() - 1
                })
            })
            .collect();
        let auto = names.iter().position(|n| n == "auto");
        // size -> per column the (time, algorithm) of every repeat, out of place.
        let mut samples: std::collections::BTreeMap<usize, Vec<Vec<(f64, String)>>> =
            Default::default();
        for (r, &c) in reports.iter().zip(&column) {
            for row in r.results.iter().filter(|x| x.placement == "out-of-place") {
                samples
                    .entry(row.size)
                    .or_insert_with(|| vec![Vec::new(); names.len()])[c]
                    .push((row.time_us, row.algo.clone()));
            }
        }
        let cells = samples
            .into_iter()
            .map(|(size, cols)| {
                let medians = cols
                    .into_iter()
                    .map(|mut v| {
                        v.sort_by(|a, b| a.0.total_cmp(&b.0));
                        let mid = v.len() / 2;
                        v.into_iter().nth(mid)
                    })
                    .collect();
                (size, medians)
            })
            .collect();
        Medians { names, auto, cells }
    }

    fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        out.push_str("| size |");
        for n in &self.names {
            let _ = write!(out, " {n} (us) |");
        }
        if self.auto.is_some() {
            out.push_str(" auto picked | picked / best | auto run / best |");
        }
        out.push('\n');
        out.push_str(&"|---".repeat(self.names.len() + 1 + 3 * usize::from(self.auto.is_some())));
        out.push_str("|\n");
        // Two views of the automatic choice: the time its algorithm took in that algorithm's own
        // sweep (what the choice is worth, free of the auto run's noise), and the auto run itself.
        let mut worst: (f64, f64) = (0.0, 0.0);
        for (size, cols) in &self.cells {
            // The fastest among the fixed algorithms (the auto column is not a contender).
            let best = cols
                .iter()
                .enumerate()
                .filter(|&(i, _)| Some(i) != self.auto)
                .filter_map(|(i, c)| c.as_ref().map(|(t, _)| (i, *t)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let _ = write!(out, "| {} |", human_bytes(*size as u64));
            for (i, c) in cols.iter().enumerate() {
                match c {
                    Some((t, _)) if best.is_some_and(|b| b.0 == i) => {
                        let _ = write!(out, " **{t:.1}** |");
                    }
                    Some((t, _)) => {
                        let _ = write!(out, " {t:.1} |");
                    }
                    None => out.push_str(" - |"),
                }
            }
            if let Some(a) = self.auto {
                out.push_str(&self.auto_cells(cols, a, best.map(|b| b.1), &mut worst));
            }
            out.push('\n');
        }
        if self.auto.is_some() {
            let _ = writeln!(
                out,
                "\nWorst picked / best: {:.2}; worst auto run / best: {:.2}",
                worst.0, worst.1
            );
        }
        out
    }

    /// The auto column's extra cells of one row (its algorithm, its own sweep's time and the
    /// auto run's time over the `best` fixed time), raising the worst ratios seen so far.
    fn auto_cells(
        &self,
        cols: &[Option<(f64, String)>],
        auto: usize,
        best: Option<f64>,
        worst: &mut (f64, f64),
    ) -> String {
        let (Some((t, algo)), Some(b)) = (&cols[auto], best) else {
            return " - | - | - |".into();
        };
        if b <= 0.0 {
            return " - | - | - |".into();
        }
        let picked = self
            .names
            .iter()
            .position(|n| n == algo)
            .and_then(|i| cols[i].as_ref())
            .map(|(tp, _)| tp / b);
        worst.1 = worst.1.max(t / b);
        let picked = match picked {
            Some(x) => {
                worst.0 = worst.0.max(x);
                format!("{x:.2}")
            }
            None => "-".into(),
        };
        format!(" {algo} | {picked} | {:.2} |", t / b)
    }
}

/// `ccl-bench plot OUT.svg A.json B.json ...`
fn plot_reports(p: &PlotArgs) -> ExitCode {
    let reports = match read_reports(&p.reports) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ccl-bench plot: {e}");
            return ExitCode::from(2);
        }
    };
    let lines: Vec<plot::Series> = reports
        .iter()
        .zip(&p.reports)
        .flat_map(|(r, path)| {
            let name = stem(path);
            let algos: Vec<&str> = {
                let mut a: Vec<&str> = r.results.iter().map(|x| x.algo.as_str()).collect();
                a.dedup();
                a
            };
            series(
                r,
                &format!("{name} ({}, {}) ", r.transport, algos.join("/")),
            )
        })
        .collect();
    let refs: Vec<&Report> = reports.iter().collect();
    let t = p.title.clone().unwrap_or_else(|| title(&refs));
    if let Err(e) = std::fs::write(&p.out, plot::svg(&t, &lines)) {
        eprintln!("ccl-bench plot: cannot write {}: {e}", p.out.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rows: &[(usize, f64, &str)]) -> Report {
        let row = |&(size, time_us, algo): &(usize, f64, &str), placement: &str| Row {
            size,
            count: size,
            dtype: "uint8".into(),
            op: "sum".into(),
            placement: placement.into(),
            algo: algo.into(),
            time_us,
            algbw_gbs: 0.0,
            busbw_gbs: 0.0,
            wrong: 0,
        };
        Report {
            collective: "allreduce".into(),
            nranks: 4,
            transport: "tcp".into(),
            // In-place rows are left out of the comparison.
            results: rows
                .iter()
                .flat_map(|r| [row(r, "out-of-place"), row(r, "in-place")])
                .collect(),
        }
    }

    #[test]
    fn compare_table_takes_medians_and_rates_the_automatic_choice() {
        let reports = [
            report(&[(8, 10.0, "ring"), (64, 4.0, "ring"), (1024, 100.0, "ring")]),
            report(&[(8, 5.0, "tree"), (1024, 200.0, "tree")]),
            report(&[(8, 6.0, "tree"), (64, 3.0, "hd"), (1024, 150.0, "ring")]),
            report(&[(8, 7.0, "tree"), (1024, 110.0, "ring")]),
            report(&[(8, 100.0, "tree"), (1024, 120.0, "ring")]),
        ];
        let paths: Vec<PathBuf> = ["ring.json", "tree.json", "auto.1.json", "auto.2.json"]
            .iter()
            .chain(&["x/auto.3.json"])
            .map(PathBuf::from)
            .collect();
        let want = "\
| size | ring (us) | tree (us) | auto (us) | auto picked | picked / best | auto run / best |
|---|---|---|---|---|---|---|
| 8 B | 10.0 | **5.0** | 7.0 | tree | 1.00 | 1.40 |
| 64 B | **4.0** | - | 3.0 | hd | - | 0.75 |
| 1 KiB | **100.0** | 200.0 | 120.0 | ring | 1.00 | 1.20 |

Worst picked / best: 1.00; worst auto run / best: 1.40
";
        assert_eq!(compare_table(&reports, &paths).unwrap(), want);
    }

    #[test]
    fn compare_table_refuses_reports_of_different_jobs() {
        let mut other = report(&[(8, 1.0, "ring")]);
        other.nranks = 8;
        let reports = [report(&[(8, 1.0, "ring")]), other];
        let paths = [PathBuf::from("a.json"), PathBuf::from("b.json")];
        let e = compare_table(&reports, &paths).unwrap_err();
        assert!(e.contains("b.json is allreduce over 8 ranks"), "{e}");
    }
}
