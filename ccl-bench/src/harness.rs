//! The shared benchmark loop (nccl-tests semantics): for each size, warm up, time `iters`
//! back-to-back operations between barriers out of place and then in place, optionally check
//! one more operation against closed-form results, and report the slowest rank's time.
//!
//! algbw = bytes / time (GB = 1e9 bytes); busbw = algbw x the collective's bus factor
//! (allreduce: 2(n-1)/n), so numbers compare with every published nccl-tests table.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use oxccl::{Communicator, DataType, ReduceOp, Result};
use serde::{Deserialize, Serialize};

/// One operation plugged into the harness (nccl-tests: one file per collective).
pub(crate) trait Bench {
    /// Name in the header and the JSON (`allreduce`).
    fn name(&self) -> &'static str;
    /// busbw / algbw for `n` ranks.
    fn bus_factor(&self, n: usize) -> f64;
    /// Whether an in-place form exists.
    fn has_in_place(&self) -> bool;
    /// The root, for the root column (`-1`: none).
    fn root(&self) -> isize;
    /// NCCL's count for a row of `size` bytes.
    fn count_for(&self, size: usize, dtype: DataType, n: usize) -> usize;
    /// The size column for `count` (what algbw divides).
    fn bytes_for(&self, count: usize, dtype: DataType, n: usize) -> usize;
    /// Send and receive buffer lengths in elements (in place: `(0, buffer)`).
    fn buffer_lens(&self, count: usize, n: usize, in_place: bool) -> (usize, usize);
    /// Runs once: from `send` into `recv`, or in place in `recv` when `send` is `None`.
    fn run(
        &self,
        comm: &Communicator,
        send: Option<&[u8]>,
        recv: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
    ) -> Result<()>;
    /// The algorithm the communicator runs this benchmark's operation with at `bytes`.
    fn algo(&self, comm: &Communicator, bytes: usize) -> String;
    /// Whether the communicator is still measuring which algorithm this operation runs at
    /// `count` elements (`Communicator::measuring`).
    fn measuring(&self, comm: &Communicator, count: usize, dtype: DataType) -> bool;
    /// Writes this rank's inputs into `buf` (the send buffer, or the in-place buffer).
    fn fill(
        &self,
        comm: &Communicator,
        buf: &mut [u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        in_place: bool,
    );
    /// Counts the wrong elements of this rank's result.
    fn wrong(
        &self,
        comm: &Communicator,
        buf: &[u8],
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        in_place: bool,
    ) -> usize;
}

/// What to measure.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub sizes: Vec<usize>,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    pub op: ReduceOp,
    pub dtype: DataType,
    /// Buffers from `Communicator::alloc` (registered: zero-copy sends where the transport has
    /// them) instead of plain vectors.
    pub registered: bool,
    /// A rank made late on purpose (diagnosis tests).
    pub delay: Option<Delay>,
}

/// Rank `rank` sleeps `each` before every timed call from call `from` on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Delay {
    pub rank: usize,
    pub each: std::time::Duration,
    pub from: usize,
}

/// One row of results (one size, one placement).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Row {
    pub size: usize,
    pub count: usize,
    pub dtype: String,
    pub op: String,
    pub placement: String,
    /// The algorithm that ran (what `CCL_ALGO` or the cost model picked).
    #[serde(default)]
    pub algo: String,
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
    pub wrong: u64,
}

/// The sizes from `min` to `max`, multiplying by `factor`.
pub(crate) fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = min;
    loop {
        v.push(s);
        if factor <= 1 || s >= max {
            break;
        }
        match s.checked_mul(factor) {
            Some(next) if next <= max => s = next,
            _ => break,
        }
    }
    v
}

fn barrier(comm: &Communicator) -> Result<()> {
    let mut x = [0u32; 1];
    comm.all_reduce_in_place(&mut x, ReduceOp::Sum)
}

fn time_loop(
    b: &dyn Bench,
    comm: &Communicator,
    send: Option<&[u8]>,
    recv: &mut [u8],
    count: usize,
    p: &Plan,
) -> Result<f64> {
    for _ in 0..p.warmup {
        b.run(comm, send, recv, count, p.dtype, p.op)?;
    }
    // The calls in which the library still measures which algorithm to run at this size are
    // warm-up too (they try slower algorithms on purpose). Bounded, in case a collective other
    // than allreduce ever counts as measuring without its calls moving it on.
    let mut extra = 0;
    while b.measuring(comm, count, p.dtype) && extra < 1000 {
        b.run(comm, send, recv, count, p.dtype, p.op)?;
        extra += 1;
    }
    barrier(comm)?;
    let t0 = Instant::now();
    for i in 0..p.iters {
        if let Some(d) = p.delay.filter(|d| d.rank == comm.rank() && i >= d.from) {
            std::thread::sleep(d.each);
        }
        b.run(comm, send, recv, count, p.dtype, p.op)?;
    }
    Ok(t0.elapsed().as_secs_f64() / p.iters.max(1) as f64)
}

/// Times one placement of one size; returns (seconds per operation, wrong elements).
fn measure(
    b: &dyn Bench,
    comm: &Communicator,
    send_store: &mut [u64],
    recv_store: &mut [u64],
    count: usize,
    in_place: bool,
    p: &Plan,
) -> Result<(f64, usize)> {
    let (es, n) = (p.dtype.size(), comm.size());
    let (sl, rl) = b.buffer_lens(count, n, in_place);
    let send: &mut [u8] = &mut bytemuck::cast_slice_mut(send_store)[..sl * es];
    let recv: &mut [u8] = &mut bytemuck::cast_slice_mut(recv_store)[..rl * es];
    if in_place {
        b.fill(comm, recv, count, p.dtype, p.op, true);
        let t = time_loop(b, comm, None, recv, count, p)?;
        if !p.check {
            return Ok((t, 0));
        }
        b.fill(comm, recv, count, p.dtype, p.op, true);
        b.run(comm, None, recv, count, p.dtype, p.op)?;
        Ok((t, b.wrong(comm, recv, count, p.dtype, p.op, true)))
    } else {
        b.fill(comm, send, count, p.dtype, p.op, false);
        let t = time_loop(b, comm, Some(send), recv, count, p)?;
        if !p.check {
            return Ok((t, 0));
        }
        b.fill(comm, send, count, p.dtype, p.op, false);
        b.run(comm, Some(send), recv, count, p.dtype, p.op)?;
        Ok((t, b.wrong(comm, recv, count, p.dtype, p.op, false)))
    }
}

/// Runs the plan on this rank; every rank gets the same rows (times are the maximum over ranks,
/// wrong counts the sum).
pub(crate) fn run(
    b: &dyn Bench,
    comm: &Communicator,
    p: &Plan,
    out: &mut dyn Write,
) -> Result<Vec<Row>> {
    let n = comm.size();
    let max = p.sizes.iter().copied().max().unwrap_or(0);
    // u64 storage keeps the buffers aligned for every element type; no buffer exceeds the
    // largest size.
    let words = max.div_ceil(8);
    let (mut send_vec, mut recv_vec, mut send_reg, mut recv_reg);
    let (send_store, recv_store): (&mut [u64], &mut [u64]) = if p.registered {
        send_reg = comm.alloc::<u64>(words)?;
        recv_reg = comm.alloc::<u64>(words)?;
        (&mut send_reg, &mut recv_reg)
    } else {
        send_vec = vec![0u64; words];
        recv_vec = vec![0u64; words];
        (&mut send_vec, &mut recv_vec)
    };
    let rank0 = comm.rank() == 0;
    let progress = rank0 && std::io::stderr().is_terminal();
    if rank0 {
        header(b, comm, p, out);
    }
    let mut rows = Vec::new();
    for (k, &size) in p.sizes.iter().enumerate() {
        let count = b.count_for(size, p.dtype, n);
        let bytes = b.bytes_for(count, p.dtype, n);
        if progress {
            eprint!("\r# size {} ({}/{})   ", bytes, k + 1, p.sizes.len());
        }
        let (t_oop, w_oop) = measure(b, comm, send_store, recv_store, count, false, p)?;
        let (t_ip, w_ip) = if b.has_in_place() {
            measure(b, comm, send_store, recv_store, count, true, p)?
        } else {
            (0.0, 0)
        };
        // The slowest rank defines the time; wrong elements add up.
        let mut times = [t_oop, t_ip];
        comm.all_reduce_in_place(&mut times, ReduceOp::Max)?;
        let mut wrong = [w_oop as u64, w_ip as u64];
        comm.all_reduce_in_place(&mut wrong, ReduceOp::Sum)?;
        let algo = b.algo(comm, bytes);
        let mk = |placement: &str, t: f64, w: u64| {
            let algbw = if t > 0.0 { bytes as f64 / t / 1e9 } else { 0.0 };
            Row {
                size: bytes,
                count,
                dtype: p.dtype.name().to_string(),
                op: p.op.name().to_string(),
                placement: placement.to_string(),
                algo: algo.clone(),
                time_us: t * 1e6,
                algbw_gbs: algbw,
                busbw_gbs: algbw * b.bus_factor(n),
                wrong: w,
            }
        };
        let oop = mk("out-of-place", times[0], wrong[0]);
        let ip = b.has_in_place().then(|| mk("in-place", times[1], wrong[1]));
        if rank0 {
            if progress {
                eprint!("\r\x1b[K");
            }
            row_line(&oop, ip.as_ref(), b.root(), out);
        }
        rows.push(oop);
        rows.extend(ip);
    }
    if rank0 {
        footer(&rows, out);
    }
    Ok(rows)
}

fn header(b: &dyn Bench, comm: &Communicator, p: &Plan, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "# ccl-bench {}: nranks {} transport {} dtype {} op {} iters {} warmup {} check {}",
        b.name(),
        comm.size(),
        comm.transport_name(),
        p.dtype,
        p.op,
        p.iters,
        p.warmup,
        u8::from(p.check)
    );
    if p.registered {
        let _ = writeln!(out, "# buffers: registered (Communicator::alloc)");
    }
    let _ = writeln!(out, "#");
    let _ = writeln!(
        out,
        "# {:>48}  {:>30}   {:>30}",
        "", "out-of-place", "in-place"
    );
    let _ = writeln!(
        out,
        "# {:>10} {:>12} {:>8} {:>6} {:>5}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        out,
        "# {:>10} {:>12} {:>8} {:>6} {:>5}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

fn fmt_time(us: f64) -> String {
    if us < 1e4 {
        format!("{us:.2}")
    } else if us < 1e6 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

fn row_line(a: &Row, b: Option<&Row>, root: isize, out: &mut dyn Write) {
    let second = match b {
        Some(b) => format!(
            "{:>9} {:>7.3} {:>7.3} {:>6}",
            fmt_time(b.time_us),
            b.algbw_gbs,
            b.busbw_gbs,
            b.wrong
        ),
        None => format!("{:>9} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A"),
    };
    let _ = writeln!(
        out,
        "  {:>10} {:>12} {:>8} {:>6} {:>5}  {:>9} {:>7.3} {:>7.3} {:>6}  {second}",
        a.size,
        a.count,
        a.dtype,
        a.op,
        root,
        fmt_time(a.time_us),
        a.algbw_gbs,
        a.busbw_gbs,
        a.wrong,
    );
    let _ = out.flush();
}

fn footer(rows: &[Row], out: &mut dyn Write) {
    let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
    let avg = if rows.is_empty() {
        0.0
    } else {
        rows.iter().map(|r| r.busbw_gbs).sum::<f64>() / rows.len() as f64
    };
    let peak = rows.iter().map(|r| r.busbw_gbs).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    let _ = writeln!(out, "# Avg bus bandwidth : {avg:.4}");
    let _ = writeln!(out, "# Peak bus bandwidth : {peak:.4}");
    let _ = writeln!(out, "#");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_ladder() {
        assert_eq!(sizes(8, 64, 2), vec![8, 16, 32, 64]);
        assert_eq!(sizes(8, 100, 4), vec![8, 32]);
        assert_eq!(sizes(1 << 20, 1 << 20, 2), vec![1 << 20]);
        assert_eq!(sizes(8, 8, 1), vec![8]);
        assert_eq!(
            sizes(usize::MAX / 2 + 1, usize::MAX, 2),
            vec![usize::MAX / 2 + 1]
        );
    }
}
