//! Throughput of the reduce kernels for every data type x operator.
//!
//! Throughput counts the bytes of one operand: a 64 KiB `reduce_inplace` reads 128 KiB and writes
//! 64 KiB. 64 KiB keeps both operands in L2 and measures the kernel itself; 16 MiB is beyond L2
//! (memory bound, or L3 bound on CPUs with a very large L3).

use std::hint::black_box;
use std::time::Duration;

use ccl_core::reduce::{Order, finish_avg, reduce_inplace, reduce_into};
use ccl_core::{DataType, ReduceOp};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use half::{bf16, f16};

const SIZES: [(usize, &str); 2] = [(64 << 10, "64KiB"), (16 << 20, "16MiB")];

/// An 8-byte aligned buffer of `bytes` bytes holding ordinary finite values of `dtype` (`base`
/// plus a small index-dependent offset), so no kernel runs into NaNs or subnormals, which would
/// measure the FPU's slow paths instead of the loop.
fn buffer(dtype: DataType, bytes: usize, base: f32) -> Vec<u64> {
    let mut v = vec![0u64; bytes.div_ceil(8)];
    let b: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut v)[..bytes];
    let val = |i: usize| base + (i % 7) as f32 * 0.125;
    match dtype {
        DataType::F16 => fill(b, |i| f16::from_f32(val(i))),
        DataType::Bf16 => fill(b, |i| bf16::from_f32(val(i))),
        DataType::F32 => fill(b, val),
        DataType::F64 => fill(b, |i| f64::from(val(i))),
        _ => b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8 | 1),
    }
    v
}

fn fill<T: bytemuck::Pod>(b: &mut [u8], f: impl Fn(usize) -> T) {
    for (i, x) in bytemuck::cast_slice_mut::<u8, T>(b).iter_mut().enumerate() {
        *x = f(i);
    }
}

fn bytes(v: &mut [u64], n: usize) -> &mut [u8] {
    &mut bytemuck::cast_slice_mut(v)[..n]
}

fn bench_inplace(c: &mut Criterion) {
    for (size, label) in SIZES {
        let mut g = c.benchmark_group(format!("reduce_inplace/{label}"));
        g.throughput(Throughput::Bytes(size as u64));
        for dtype in DataType::ALL {
            // Operands are >= 1, so repeated sums and products only grow (at worst to infinity,
            // which costs nothing) and never reach the slow subnormal range.
            let mut acc = buffer(dtype, size, 2.0);
            let src = buffer(dtype, size, 1.0);
            for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                let id = BenchmarkId::new(dtype.name(), op.name());
                let src: &[u8] = &bytemuck::cast_slice(&src)[..size];
                g.bench_function(id, |b| {
                    b.iter(|| {
                        reduce_inplace(
                            dtype,
                            op,
                            bytes(&mut acc, size),
                            black_box(src),
                            Order::AccFirst,
                        )
                    })
                });
            }
        }
        g.finish();
    }
}

fn bench_f32_variants(c: &mut Criterion) {
    let dtype = DataType::F32;
    for (size, label) in SIZES {
        let mut g = c.benchmark_group(format!("f32_variants/{label}"));
        g.throughput(Throughput::Bytes(size as u64));
        let mut dst = buffer(dtype, size + 8, 0.0);
        let mut acc = buffer(dtype, size + 8, 2.0);
        let src = buffer(dtype, size + 8, 1.0);
        let src_b: &[u8] = bytemuck::cast_slice(&src);
        g.bench_function("reduce_into_sum", |b| {
            b.iter(|| {
                let (a, s) = (&bytemuck::cast_slice(&acc)[..size], &src_b[..size]);
                reduce_into(dtype, ReduceOp::Sum, bytes(&mut dst, size), a, black_box(s))
            })
        });
        g.bench_function("unaligned_sum", |b| {
            b.iter(|| {
                let acc = &mut bytemuck::cast_slice_mut(&mut acc)[1..size + 1];
                reduce_inplace(
                    dtype,
                    ReduceOp::Sum,
                    acc,
                    black_box(&src_b[3..size + 3]),
                    Order::AccFirst,
                )
            })
        });
        g.finish();
    }
}

fn bench_finish_avg(c: &mut Criterion) {
    for (size, label) in SIZES {
        let mut g = c.benchmark_group(format!("finish_avg/{label}"));
        g.throughput(Throughput::Bytes(size as u64));
        for dtype in DataType::ALL {
            let orig = buffer(dtype, size, 2.0);
            // A fresh copy per run (not timed): dividing the same floats again and again would
            // drift into subnormals.
            g.bench_function(dtype.name(), |b| {
                b.iter_batched_ref(
                    || orig.clone(),
                    |x| finish_avg(dtype, bytes(x, size), black_box(3)),
                    BatchSize::LargeInput,
                )
            });
        }
        g.finish();
    }
}

fn config() -> Criterion {
    // 80+ benchmarks on a shared 2-core machine: short runs, enough samples for a stable mean.
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_inplace, bench_f32_variants, bench_finish_avg
}
criterion_main!(benches);
