//! Data-parallel training: logistic regression on synthetic data, gradients averaged with
//! allreduce.
//!
//! Every rank generates the same data set, keeps its shard (samples `i` with
//! `i % size == rank`), starts from rank 0's weights (broadcast), and each epoch computes the
//! gradient and loss of its shard, sums them over ranks with one allreduce (gradient, loss and
//! sample count in one buffer), and takes the same step. Rank 0 prints the loss per epoch. At the
//! end the ranks compare their weights bit for bit (allgather); the program exits non-zero if
//! they differ, or if the loss did not fall.
//!
//! With `--tolerate-failures`, a rank that dies does not end the job: the survivors shrink the
//! communicator, re-shard the data over the ranks left, take the lowest surviving rank's weights
//! and epoch (a survivor may have finished the epoch the death interrupted, another not), and
//! train on. `--kill RANK@EPOCH` makes that rank SIGKILL itself at the start of that epoch, to
//! try it.
//!
//! ```text
//! cargo build --release -p ccl-examples
//! target/release/train --np 4                     # 4 local processes over TCP
//! target/release/train --np 4 --transport local   # 4 threads of one process
//! target/release/train --np 4 --tolerate-failures --kill 2@10   # rank 2 dies at epoch 10
//! target/release/train --np 4 --root-in-rank0 --tolerate-failures --kill 0@10
//!                                                 # rank 0 dies, and the rendezvous with it
//! torchrun --nproc_per_node 2 --no-python target/release/train
//! mpirun -np 4 target/release/train
//! ```
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, ExitCode};

use oxccl::{Communicator, Config, ReduceOp, UniqueId};

struct Args {
    np: Option<usize>,
    transport: Option<String>,
    epochs: usize,
    samples: usize,
    features: usize,
    lr: f64,
    tolerate: bool,
    /// With `--np`: rank 0 runs the rendezvous (as under torchrun), not this launcher.
    root_in_rank0: bool,
    /// (rank, epoch): that rank kills itself at the start of that epoch.
    kill: Option<(usize, usize)>,
}

const USAGE: &str = "usage: train [--np N] [--transport tcp|local] [--epochs E] [--samples S] \
                     [--features F] [--lr RATE] [--tolerate-failures] [--kill RANK@EPOCH] \
                     [--root-in-rank0]";

fn parse() -> Result<Args, String> {
    let mut a = Args {
        np: None,
        transport: None,
        epochs: 30,
        samples: 20_000,
        features: 32,
        lr: 0.5,
        tolerate: false,
        root_in_rank0: false,
        kill: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        let num = |v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag}: '{v}' is not a count"))
        };
        match flag.as_str() {
            "--np" => a.np = Some(num(val()?)?),
            "--transport" => a.transport = Some(val()?),
            "--epochs" => a.epochs = num(val()?)?,
            "--samples" => a.samples = num(val()?)?,
            "--features" => a.features = num(val()?)?,
            "--lr" => {
                let v = val()?;
                a.lr = v
                    .parse()
                    .map_err(|_| format!("--lr: '{v}' is not a number"))?;
            }
            "--tolerate-failures" => a.tolerate = true,
            "--root-in-rank0" => a.root_in_rank0 = true,
            "--kill" => {
                let v = val()?;
                let bad = || format!("--kill: '{v}' is not RANK@EPOCH");
                let (r, e) = v.split_once('@').ok_or_else(bad)?;
                a.kill = Some((r.parse().map_err(|_| bad())?, e.parse().map_err(|_| bad())?));
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument '{flag}'\n{USAGE}")),
        }
    }
    if a.np == Some(0) {
        return Err("--np must be at least 1".into());
    }
    Ok(a)
}

/// A small deterministic generator (xorshift64*), so every rank makes the same data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// This rank's shard of the data set: features (row-major) and 0/1 labels.
fn shard(a: &Args, rank: usize, size: usize) -> (Vec<f64>, Vec<f64>) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let truth: Vec<f64> = (0..a.features).map(|_| rng.normal()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for i in 0..a.samples {
        let row: Vec<f64> = (0..a.features).map(|_| rng.normal()).collect();
        let z: f64 = row.iter().zip(&truth).map(|(p, q)| p * q).sum::<f64>() + 0.5;
        let label = f64::from(rng.uniform() < sigmoid(2.0 * z));
        if i % size == rank {
            x.extend(row);
            y.push(label);
        }
    }
    (x, y)
}

/// Trains as one rank; returns an error message when a check fails.
fn train(comm: Communicator, a: &Args) -> Result<(), String> {
    let mut comm = comm;
    let first_rank = comm.rank();
    let f = a.features;
    let (mut x, mut y) = shard(a, comm.rank(), comm.size());
    let err = |e: oxccl::Error| e.to_string();

    // Weights and bias; every rank starts from rank 0's (different) random values.
    let mut w = vec![0.0f64; f + 1];
    let mut rng = Rng(1 + first_rank as u64);
    w.iter_mut().for_each(|v| *v = 0.1 * rng.normal());
    comm.broadcast_in_place(&mut w, 0).map_err(err)?;

    let mut losses = Vec::with_capacity(a.epochs);
    // [gradient (f + 1), loss sum, samples]
    let mut acc = vec![0.0f64; f + 3];
    let mut epoch = 0;
    while epoch < a.epochs {
        if a.kill == Some((first_rank, epoch)) {
            // Dies the way a crashed or OOM-killed process does: no goodbye.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        acc.iter_mut().for_each(|v| *v = 0.0);
        for (row, &label) in x.chunks_exact(f).zip(&y) {
            let z = row.iter().zip(&w).map(|(p, q)| p * q).sum::<f64>() + w[f];
            let p = sigmoid(z);
            let d = p - label;
            for (g, xi) in acc[..f].iter_mut().zip(row) {
                *g += d * xi;
            }
            acc[f] += d;
            acc[f + 1] -= label * p.max(1e-12).ln() + (1.0 - label) * (1.0 - p).max(1e-12).ln();
            acc[f + 2] += 1.0;
        }
        match comm.all_reduce_in_place(&mut acc, ReduceOp::Sum) {
            Ok(()) => {}
            Err(e) if a.tolerate => {
                eprintln!("rank {first_rank}: epoch {epoch} failed ({e}); shrinking");
                comm = comm.shrink(&[]).map_err(err)?;
                let (rank, size) = (comm.rank(), comm.size());
                (x, y) = shard(a, rank, size);
                // Where training stands is the lowest surviving rank's weights and epoch.
                let mut state = w.clone();
                state.push(epoch as f64);
                comm.broadcast_in_place(&mut state, 0).map_err(err)?;
                epoch = state.pop().unwrap_or(0.0) as usize;
                w = state;
                losses.truncate(epoch);
                if rank == 0 {
                    println!("continuing with {size} ranks from epoch {epoch}");
                }
                continue;
            }
            Err(e) => return Err(err(e)),
        }
        let n = acc[f + 2];
        for (wi, g) in w.iter_mut().zip(&acc[..=f]) {
            *wi -= a.lr * g / n;
        }
        let loss = acc[f + 1] / n;
        losses.push(loss);
        if comm.rank() == 0 {
            println!("epoch {epoch:3}  loss {loss:.5}");
        }
        epoch += 1;
    }
    let (rank, size) = (comm.rank(), comm.size());

    // Every rank's weights, compared bit for bit.
    let bits: Vec<u64> = w.iter().map(|v| v.to_bits()).collect();
    let mut all = vec![0u64; bits.len() * size];
    comm.all_gather(&bits, &mut all).map_err(err)?;
    let differ: Vec<usize> = (0..size)
        .filter(|&r| all[r * bits.len()..(r + 1) * bits.len()] != bits[..])
        .collect();
    if !differ.is_empty() {
        return Err(format!("rank {rank}: weights differ from ranks {differ:?}"));
    }
    let (first, last) = (losses[0], *losses.last().unwrap_or(&losses[0]));
    if rank == 0 {
        println!(
            "loss {first:.5} -> {last:.5}; weights bit-identical on all {size} ranks ({})",
            comm.transport_name()
        );
    }
    if a.epochs > 1 && last >= 0.8 * first {
        return Err(format!(
            "rank {rank}: the loss did not fall ({first} -> {last})"
        ));
    }
    Ok(())
}

fn config(a: &Args) -> Result<Config, String> {
    let mut c = Config::from_env().map_err(|e| e.to_string())?;
    if let Some(t) = &a.transport {
        c.transport = t.parse().map_err(|e| format!("--transport: {e}"))?;
    }
    Ok(c)
}

/// `--np N --transport local`: the ranks are threads of this process.
fn threads(a: &Args, n: usize) -> Result<(), String> {
    let cfg = config(a)?;
    let id = UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).map_err(|e| e.to_string())?;
    let errors: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let (id, cfg) = (id.clone(), cfg.clone());
                s.spawn(move || {
                    let comm = Communicator::init_with_config(&id, rank, n, cfg)
                        .map_err(|e| e.to_string())?;
                    train(comm, a)
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank panicked".into()))
                    .err()
            })
            .collect()
    });
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// `--np N`: N processes of this program on loopback, with this process as their rendezvous.
fn processes(a: &Args, n: usize) -> Result<(), String> {
    let cfg = config(a)?;
    let id = match a.root_in_rank0 {
        true => None,
        false => Some(
            UniqueId::new_at(IpAddr::V4(Ipv4Addr::LOCALHOST), &cfg).map_err(|e| e.to_string())?,
        ),
    };
    let exe = std::env::current_exe().map_err(|e| format!("cannot find my executable: {e}"))?;
    let mut args: Vec<String> = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        if x == "--np" {
            it.next();
        } else {
            args.push(x);
        }
    }
    // With the rendezvous in rank 0's process, rank 0's death takes the job's monitor with it,
    // as under torchrun: the survivors move it to another rank.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free port: {e}"))?
        .port();
    let mut children = Vec::new();
    for rank in 0..n {
        let mut c = Command::new(&exe);
        match &id {
            Some(id) => c.env("CCL_UNIQUE_ID", id.to_hex()),
            None => c.env("CCL_COMM_ID", format!("127.0.0.1:{port}")),
        };
        let c = c
            .args(&args)
            .env("CCL_RANK", rank.to_string())
            .env("CCL_WORLD_SIZE", n.to_string())
            .env("CCL_SOCKET_IFNAME", "=lo")
            .spawn()
            .map_err(|e| format!("cannot start rank {rank}: {e}"))?;
        children.push(c);
    }
    let mut failed = Vec::new();
    for (rank, mut c) in children.into_iter().enumerate() {
        use std::os::unix::process::ExitStatusExt;
        match c.wait() {
            Ok(s) if s.success() => {}
            // The rank asked to die did.
            Ok(s) if a.kill.is_some_and(|(r, _)| r == rank) && s.signal() == Some(9) => {}
            Ok(s) => failed.push(format!("rank {rank} ({s})")),
            Err(e) => failed.push(format!("rank {rank} (wait: {e})")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

fn main() -> ExitCode {
    let r = parse().and_then(|a| match a.np {
        Some(n) if a.transport.as_deref() == Some("local") => threads(&a, n),
        Some(n) => processes(&a, n),
        None => {
            let comm =
                Communicator::from_env_with_config(config(&a)?).map_err(|e| e.to_string())?;
            train(comm, &a)
        }
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("train: {e}");
            ExitCode::FAILURE
        }
    }
}
