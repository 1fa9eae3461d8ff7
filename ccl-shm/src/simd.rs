//! Reduce kernels compiled for AVX-512 or AVX2 and chosen at run time.
//!
//! The library is built for the baseline x86-64 target (SSE2), so that one binary runs on every
//! machine; [`ccl_core::reduce`]'s loops vectorize to 16-byte loads there. A one-shot allreduce
//! in host memory reads another CPU's cache lines as it reduces, and 32-byte loads keep more of
//! them in flight: the same protocol in C (`scripts/peers/host_floor.c`, 2 ranks, 2 KiB of f32)
//! takes 0.46-0.50 us per operation with AVX2 against 0.53-0.58 with SSE on this project's
//! 2-core test machine. The loops are [`ccl_core::reduce`]'s own, inlined into functions compiled
//! with AVX2 enabled, so both sets compute the same expression element by element and give the
//! same bits, but for one thing: where both operands of a float sum or product are NaN, which
//! payload survives is the instruction's pick of operand, and the compiler orders a commutative
//! instruction's operands as it likes for each vector width. The ranks of one host run the same
//! kernels (one CPU), and a hierarchical operation computes each element in one place, so the
//! ranks still end with the same bytes.

use ccl_core::reduce::{self, Kernels, Order};
use ccl_core::{DataType, ReduceOp};

/// The widest kernels this CPU runs.
///
/// AVX-512 (F, BW, VL) where present: the bf16 loops run 2.2x the AVX2 rate on 64 KiB in L2 and
/// the f32 sum 1.2-1.6x (AMD EPYC family 26, `cargo bench -p ccl-core`'s loops compiled both
/// ways), and a small reduction is fewer instructions.
pub fn kernels() -> Kernels {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            return AVX512;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            return AVX2;
        }
    }
    Kernels::BASELINE
}

/// A kernel set: `reduce`'s loops inlined into functions compiled with `$features`, named `$name`.
/// `kernels` hands a set out only after the CPU said it has every one of its features, which is
/// what makes calling them sound.
macro_rules! kernel_set {
    ($set:ident, $name:literal, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        const $set: Kernels = {
            fn into(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
                // SAFETY: the set is handed out only by `kernels`, after the CPU said it has
                // every feature the body is compiled for.
                unsafe { into_body(dtype, op, dst, a, b) }
            }
            fn inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8], order: Order) {
                // SAFETY: as in `into`.
                unsafe { inplace_body(dtype, op, acc, src, order) }
            }
            #[target_feature(enable = $features)]
            fn into_body(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
                reduce::reduce_into_inline(dtype, op, dst, a, b);
            }
            #[target_feature(enable = $features)]
            fn inplace_body(
                dtype: DataType,
                op: ReduceOp,
                acc: &mut [u8],
                src: &[u8],
                order: Order,
            ) {
                reduce::reduce_inplace_inline(dtype, op, acc, src, order);
            }
            Kernels {
                into,
                inplace,
                name: $name,
            }
        };
    };
}

kernel_set!(AVX512, "avx512", "avx512f,avx512bw,avx512vl");
kernel_set!(AVX2, "avx2", "avx2");

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that exercise every rule of the kernels: NaNs with payloads, signed zeros,
    /// infinities, wrap-around and the integer extremes, as raw bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let special: [u64; 8] = [
            0,
            0x8000_0000_8000_0000,
            0x7fc0_0001_7fc0_0001,
            0xffc0_1234_ff80_0000,
            0x7f80_0000_7ff0_0000,
            u64::MAX,
            0x8000_0000_0000_0000,
            0x3ff0_0000_3f80_0000,
        ];
        (0..n.div_ceil(8))
            .flat_map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = if x % 5 == 0 {
                    special[(x >> 8) as usize % special.len()]
                } else {
                    x
                };
                let _ = i;
                v.to_le_bytes()
            })
            .take(n)
            .collect()
    }

    /// Whether `got` is `want` bit for bit, except that where both are NaN in a float sum or
    /// product the payload may differ (see the module's docs).
    fn same(dt: DataType, op: ReduceOp, want: &[u8], got: &[u8]) -> bool {
        let payload_free = matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Avg);
        let nan = |b: &[u8]| match dt {
            DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DataType::F16 => ccl_core::half::f16::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DataType::Bf16 => ccl_core::half::bf16::from_le_bytes(b.try_into().unwrap()).is_nan(),
            _ => false,
        };
        want.len() == got.len()
            && want
                .chunks(dt.size())
                .zip(got.chunks(dt.size()))
                .all(|(w, g)| w == g || (payload_free && nan(w) && nan(g)))
    }

    #[test]
    fn every_set_this_cpu_runs_gives_the_baseline_bits() {
        // Every set the CPU can run, not only the chosen one, so that a CPU with AVX-512 tests
        // the AVX2 set too.
        #[allow(unused_mut)]
        let mut sets = vec![kernels()];
        #[cfg(target_arch = "x86_64")]
        {
            let x = |f: &str| match f {
                "avx2" => std::arch::is_x86_feature_detected!("avx2"),
                _ => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                }
            };
            assert_eq!(
                sets[0].name,
                if x("avx512") {
                    "avx512"
                } else if x("avx2") {
                    "avx2"
                } else {
                    "baseline"
                }
            );
            if x("avx512") && x("avx2") {
                sets.push(AVX2);
            }
        }
        for k in sets {
            check_against_baseline(k);
        }
    }

    fn check_against_baseline(k: Kernels) {
        for dt in DataType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|o| o.supports(dt)) {
                // Odd counts, and a start off the element's alignment (the blocked path).
                for (count, skew) in [(1, 0), (7, 0), (513, 0), (4099, 0), (300, 1)] {
                    let n = count * dt.size();
                    let (a, b) = (
                        bytes(count as u64, n + skew),
                        bytes(!count as u64, n + skew),
                    );
                    let (a, b) = (&a[skew..], &b[skew..]);
                    let mut want = vec![0u8; n + skew];
                    let mut got = vec![0u8; n + skew];
                    reduce::reduce_into(dt, op, &mut want[skew..], a, b);
                    (k.into)(dt, op, &mut got[skew..], a, b);
                    assert!(
                        same(dt, op, &want, &got),
                        "into {dt} {op} count {count} skew {skew} ({k:?})"
                    );
                    for order in [Order::AccFirst, Order::SrcFirst] {
                        let mut want = a.to_vec();
                        let mut got = a.to_vec();
                        reduce::reduce_inplace(dt, op, &mut want, b, order);
                        (k.inplace)(dt, op, &mut got, b, order);
                        assert!(
                            same(dt, op, &want, &got),
                            "inplace {dt} {op} {order:?} count {count}"
                        );
                    }
                }
            }
        }
    }
}
