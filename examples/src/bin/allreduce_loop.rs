//! Allreduce in a loop, every result checked, one line per iteration with its wall-clock end:
//! what `scripts/two-planes.sh` runs while it cuts, flaps and throttles network planes under
//! the job, to see the stall a failure costs and the bandwidth before, during and after it.
//!
//! Settings (environment): `LOOP_BYTES` (default 64M; K/M/G suffixes), `LOOP_ITERS` (default
//! 20) or `LOOP_SECONDS` (run until that many seconds passed; wins over `LOOP_ITERS`). The rank
//! comes from the launcher's environment as for any ccl program (`CCL_RANK`,
//! `CCL_WORLD_SIZE`, `CCL_COMM_ID`, or a launcher's).
//!
//! Output (rank 0, stdout): `iter I end EPOCH_S ms T busbw GBPS ok|WRONG` per iteration, then
//! `summary iters N wrong W median_ms M max_ms X median_busbw GBPS`. Every rank exits non-zero
//! on an error or a wrong result.
#![forbid(unsafe_code)]

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use oxccl::{Communicator, ReduceOp};

fn size_from_env(name: &str, default: usize) -> usize {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    let v = v.trim();
    let (num, mult) = match v.chars().last() {
        Some('K' | 'k') => (&v[..v.len() - 1], 1 << 10),
        Some('M' | 'm') => (&v[..v.len() - 1], 1 << 20),
        Some('G' | 'g') => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 => n * mult,
        _ => {
            eprintln!("allreduce_loop: {name}='{v}' is not a positive size");
            std::process::exit(2);
        }
    }
}

/// What rank `r` puts at element `i` in iteration `it`: small integers, so the float sums are
/// exact and any lost, repeated or misplaced byte shows.
fn value(r: usize, i: usize, it: usize) -> f32 {
    ((r + 1) * (i % 7 + 1) + (it + i / 4099) % 5) as f32
}

fn main() {
    let comm = Communicator::from_env().unwrap_or_else(|e| {
        eprintln!("allreduce_loop: {e}");
        std::process::exit(1);
    });
    let (rank, n) = (comm.rank(), comm.size());
    let bytes = size_from_env("LOOP_BYTES", 64 << 20);
    let iters = size_from_env("LOOP_ITERS", 20);
    let seconds = std::env::var("LOOP_SECONDS").ok().map(|s| {
        s.parse::<f64>().unwrap_or_else(|_| {
            eprintln!("allreduce_loop: LOOP_SECONDS='{s}' is not a number");
            std::process::exit(2);
        })
    });
    let count = bytes / 4;
    let mut mine = vec![0f32; count];
    let mut sum = vec![0f32; count];
    let start = Instant::now();
    let mut times = Vec::new();
    let mut wrong = 0usize;
    let mut it = 0usize;
    loop {
        // Every rank decides from rank 0's clock, so all run the same number of iterations.
        let go = match seconds {
            Some(s) => {
                let mut flag = [u8::from(start.elapsed().as_secs_f64() < s)];
                if let Err(e) = comm.broadcast_in_place(&mut flag, 0) {
                    eprintln!("allreduce_loop: rank {rank}: {e}");
                    std::process::exit(1);
                }
                flag[0] == 1
            }
            None => it < iters,
        };
        if !go {
            break;
        }
        for (i, x) in mine.iter_mut().enumerate() {
            *x = value(rank, i, it);
        }
        let t0 = Instant::now();
        if let Err(e) = comm.all_reduce(&mine, &mut sum, ReduceOp::Sum) {
            eprintln!("allreduce_loop: rank {rank}, iteration {it}: {e}");
            std::process::exit(1);
        }
        let dt = t0.elapsed().as_secs_f64();
        let ok = sum
            .iter()
            .enumerate()
            .all(|(i, &s)| s == (0..n).map(|r| value(r, i, it)).sum::<f32>());
        wrong += usize::from(!ok);
        let busbw = bytes as f64 * 2.0 * (n - 1) as f64 / n as f64 / dt / 1e9;
        if rank == 0 {
            let end = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            println!(
                "iter {it} end {end:.3} ms {:.1} busbw {busbw:.3} {}",
                dt * 1e3,
                if ok { "ok" } else { "WRONG" }
            );
        }
        times.push(dt);
        it += 1;
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let max = sorted.last().copied().unwrap_or(0.0);
    if rank == 0 {
        println!(
            "summary iters {} wrong {wrong} median_ms {:.1} max_ms {:.1} median_busbw {:.3}",
            times.len(),
            median * 1e3,
            max * 1e3,
            if median > 0.0 {
                bytes as f64 * 2.0 * (n - 1) as f64 / n as f64 / median / 1e9
            } else {
                0.0
            }
        );
    }
    // Destroy the communicator before exiting: the bytes of the last operation may still be
    // on their way to a peer (over several planes they are this process's until acknowledged).
    drop(comm);
    std::process::exit(if wrong == 0 { 0 } else { 1 });
}
