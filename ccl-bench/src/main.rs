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
mod launch;
mod plot;
mod reports;
mod scale;
mod sim;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::ExitCode;

use ccl_core::config::{TransportKind, parse_size};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use oxccl::{Communicator, Config, DataType, ReduceOp, UniqueId};

use harness::{Bench, Plan, Row};
use launch::{SPAWNER_VAR, end_with_parent, launch, spawner};
use reports::{compare_reports, plot_reports, series, title};

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
