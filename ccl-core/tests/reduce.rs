//! The reduce kernels against a straightforward scalar reference, plus the edge cases that make
//! results differ between ranks if got wrong: NaN, signed zero, wrapping, truncation, alignment.

use ccl_core::reduce::{Order, finish_avg, reduce_inplace, reduce_into, reduce_slice};
use ccl_core::{DataType, Element, ReduceOp};
use half::{bf16, f16};

/// splitmix64: deterministic data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A scalar reference written independently of the kernels: plain branches, one element at a time.
trait Ref: Element {
    /// `a (op.combiner()) b`.
    fn op(op: ReduceOp, a: Self, b: Self) -> Self;
    /// `x / n` as `ReduceOp::Avg` defines it.
    fn avg(x: Self, n: usize) -> Self;
    /// Any value that is not NaN or infinite (floats), so one combine never produces a NaN and
    /// results compare bit for bit. Edge values come up often.
    fn random(rng: &mut Rng) -> Self;
    /// A value of modest size, so sums of several ranks stay finite.
    fn small(rng: &mut Rng) -> Self;
}

macro_rules! int_ref {
    ($($t:ty),*) => {$(
        impl Ref for $t {
            fn op(op: ReduceOp, a: Self, b: Self) -> Self {
                match op.combiner() {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => if a < b { a } else { b },
                    ReduceOp::Max => if a > b { a } else { b },
                    ReduceOp::BAnd => a & b,
                    ReduceOp::BOr => a | b,
                    ReduceOp::BXor => a ^ b,
                    ReduceOp::Avg => unreachable!(),
                }
            }
            fn avg(x: Self, n: usize) -> Self {
                <$t>::try_from(i128::from(x) / n as i128).unwrap()
            }
            fn random(rng: &mut Rng) -> Self {
                let edges = [<$t>::MIN, <$t>::MAX, 0, 1, <$t>::MAX / 2, <$t>::MIN / 2];
                let r = rng.next();
                if r % 8 == 0 { edges[(r >> 8) as usize % edges.len()] } else { (r >> 16) as $t }
            }
            fn small(rng: &mut Rng) -> Self {
                (rng.next() >> 16) as $t
            }
        }
    )*};
}

int_ref!(i8, u8, i32, u32, i64, u64);

fn ref_minimum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_negative() { a } else { b }
    } else if a < b {
        a
    } else {
        b
    }
}

fn ref_maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_positive() { a } else { b }
    } else if a > b {
        a
    } else {
        b
    }
}

macro_rules! float_ref {
    ($t:ty, $bits:ty, $from:expr) => {
        impl Ref for $t {
            fn op(op: ReduceOp, a: Self, b: Self) -> Self {
                // Min/max through f64 are exact: they return an operand, and NaN maps to NaN.
                let canon = |x: f64| if x.is_nan() { <$t>::NAN } else { x as $t };
                match op.combiner() {
                    ReduceOp::Sum => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => canon(ref_minimum(a.into(), b.into())),
                    ReduceOp::Max => canon(ref_maximum(a.into(), b.into())),
                    // Refused for floats; `ops` leaves them out.
                    ReduceOp::Avg | ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => {
                        unreachable!()
                    }
                }
            }
            fn avg(x: Self, n: usize) -> Self {
                x / n as $t
            }
            fn random(rng: &mut Rng) -> Self {
                let edges = [
                    0.0,
                    -0.0,
                    1.0,
                    -1.0,
                    <$t>::MAX,
                    <$t>::MIN,
                    <$t>::MIN_POSITIVE,
                ];
                let r = rng.next();
                if r % 8 == 0 {
                    return edges[(r >> 8) as usize % edges.len()];
                }
                let x = <$t>::from_bits($from(r));
                if x.is_finite() { x } else { 0.5 }
            }
            fn small(rng: &mut Rng) -> Self {
                (rng.next() % 20001) as $t / 100.0 - 100.0
            }
        }
    };
}

float_ref!(f32, u32, |r: u64| (r >> 32) as u32);
float_ref!(f64, u64, |r: u64| r);

macro_rules! half_ref {
    ($($t:ty),*) => {$(
        impl Ref for $t {
            fn op(op: ReduceOp, a: Self, b: Self) -> Self {
                // One rounding (half's scalar conversion) per element from the f32 result.
                <$t>::from_f32(f32::op(op, a.to_f32(), b.to_f32()))
            }
            fn avg(x: Self, n: usize) -> Self {
                <$t>::from_f32(x.to_f32() / n as f32)
            }
            fn random(rng: &mut Rng) -> Self {
                let edges = [<$t>::ZERO, <$t>::NEG_ZERO, <$t>::ONE, <$t>::MAX, <$t>::MIN,
                    <$t>::MIN_POSITIVE, <$t>::from_bits(1)];
                let r = rng.next();
                if r % 8 == 0 {
                    return edges[(r >> 8) as usize % edges.len()];
                }
                let x = <$t>::from_bits((r >> 48) as u16);
                if x.is_finite() { x } else { <$t>::ONE }
            }
            fn small(rng: &mut Rng) -> Self {
                <$t>::from_f32((rng.next() % 2001) as f32 / 10.0 - 100.0)
            }
        }
    )*};
}

half_ref!(f16, bf16);

/// Runs `$f::<T>()` for all ten element types.
macro_rules! for_all_types {
    ($f:ident) => {
        $f::<i8>();
        $f::<u8>();
        $f::<i32>();
        $f::<u32>();
        $f::<i64>();
        $f::<u64>();
        $f::<f16>();
        $f::<f32>();
        $f::<f64>();
        $f::<bf16>();
    };
}

/// The operators defined for `T`: all of them for integers, all but the bitwise ones for floats.
fn ops<T: Element>() -> impl Iterator<Item = ReduceOp> {
    ReduceOp::ALL.into_iter().filter(|o| o.supports(T::DTYPE))
}

/// Lengths around the block sizes the kernels use internally (256 and 512 elements).
const LENGTHS: [usize; 10] = [0, 1, 3, 8, 17, 255, 256, 257, 513, 1300];

fn random_vec<T: Ref>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::random(rng)).collect()
}

fn reference<T: Ref>(op: ReduceOp, a: &[T], b: &[T]) -> Vec<T> {
    a.iter().zip(b).map(|(&x, &y)| T::op(op, x, y)).collect()
}

fn as_bytes<T: Element>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn as_bytes_mut<T: Element>(v: &mut [T]) -> &mut [u8] {
    bytemuck::cast_slice_mut(v)
}

/// Elements out of a possibly misaligned byte slice.
fn read_unaligned<T: Element>(b: &[u8]) -> Vec<T> {
    b.chunks_exact(size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// Bytes equality with a readable failure message.
fn assert_same<T: Element>(got: &[T], want: &[T], what: &str) {
    if as_bytes(got) != as_bytes(want) {
        let i = as_bytes(got)
            .chunks(size_of::<T>())
            .zip(as_bytes(want).chunks(size_of::<T>()))
            .position(|(g, w)| g != w)
            .unwrap();
        panic!("{what}: element {i}: got {:?}, want {:?}", got[i], want[i]);
    }
}

fn check_against_reference<T: Ref>() {
    let mut rng = Rng(0x5EED ^ T::DTYPE as u64);
    for op in ops::<T>() {
        for n in LENGTHS {
            let a = random_vec::<T>(&mut rng, n);
            let b = random_vec::<T>(&mut rng, n);
            let want = reference(op, &a, &b);
            let what = format!("{} {op} n={n}", T::DTYPE);

            let mut acc = a.clone();
            reduce_inplace(
                T::DTYPE,
                op,
                as_bytes_mut(&mut acc),
                as_bytes(&b),
                Order::AccFirst,
            );
            assert_same(&acc, &want, &format!("{what} inplace AccFirst"));

            // SrcFirst evaluates `src op acc`: with acc = b and src = a that is `a op b` again.
            let mut acc = b.clone();
            reduce_inplace(
                T::DTYPE,
                op,
                as_bytes_mut(&mut acc),
                as_bytes(&a),
                Order::SrcFirst,
            );
            assert_same(&acc, &want, &format!("{what} inplace SrcFirst"));

            let mut dst = vec![T::zeroed(); n];
            reduce_into(
                T::DTYPE,
                op,
                as_bytes_mut(&mut dst),
                as_bytes(&a),
                as_bytes(&b),
            );
            assert_same(&dst, &want, &format!("{what} into"));
        }
    }
}

#[test]
fn every_dtype_and_op_matches_reference() {
    for_all_types!(check_against_reference);
}

fn check_avg_over_ranks<T: Ref>() {
    let mut rng = Rng(0xA76 ^ T::DTYPE as u64);
    for ranks in [1, 2, 3, 5, 8] {
        for n in [0, 1, 31, 300, 1300] {
            let bufs: Vec<Vec<T>> = (0..ranks)
                .map(|_| (0..n).map(|_| T::small(&mut rng)).collect())
                .collect();
            let mut want = bufs[0].clone();
            for b in &bufs[1..] {
                want = reference(ReduceOp::Avg, &want, b);
            }
            let want: Vec<T> = want.into_iter().map(|x| T::avg(x, ranks)).collect();

            let mut acc = bufs[0].clone();
            for b in &bufs[1..] {
                let acc = as_bytes_mut(&mut acc);
                reduce_inplace(T::DTYPE, ReduceOp::Avg, acc, as_bytes(b), Order::AccFirst);
            }
            finish_avg(T::DTYPE, as_bytes_mut(&mut acc), ranks);
            assert_same(
                &acc,
                &want,
                &format!("{} avg ranks={ranks} n={n}", T::DTYPE),
            );
        }
    }
}

#[test]
fn avg_over_ranks_matches_reference() {
    for_all_types!(check_avg_over_ranks);
}

fn check_order_agrees<T: Ref>() {
    let mut rng = Rng(0x0DE ^ T::DTYPE as u64);
    for op in ops::<T>() {
        let a = random_vec::<T>(&mut rng, 700);
        let b = random_vec::<T>(&mut rng, 700);
        let mut acc_first = a.clone();
        let mut src_first = a.clone();
        reduce_inplace(
            T::DTYPE,
            op,
            as_bytes_mut(&mut acc_first),
            as_bytes(&b),
            Order::AccFirst,
        );
        reduce_inplace(
            T::DTYPE,
            op,
            as_bytes_mut(&mut src_first),
            as_bytes(&b),
            Order::SrcFirst,
        );
        assert_same(&acc_first, &src_first, &format!("{} {op}", T::DTYPE));
    }
}

#[test]
fn order_does_not_matter_without_nan() {
    for_all_types!(check_order_agrees);
}

fn check_into_equals_copy_then_inplace<T: Ref>() {
    let mut rng = Rng(0x1270 ^ T::DTYPE as u64);
    for op in ops::<T>() {
        for n in LENGTHS {
            let a = random_vec::<T>(&mut rng, n);
            let b = random_vec::<T>(&mut rng, n);
            let mut dst = random_vec::<T>(&mut rng, n);
            reduce_into(
                T::DTYPE,
                op,
                as_bytes_mut(&mut dst),
                as_bytes(&a),
                as_bytes(&b),
            );
            let mut acc = a.clone();
            reduce_inplace(
                T::DTYPE,
                op,
                as_bytes_mut(&mut acc),
                as_bytes(&b),
                Order::AccFirst,
            );
            assert_same(&dst, &acc, &format!("{} {op} n={n}", T::DTYPE));
        }
    }
}

#[test]
fn reduce_into_equals_copy_then_inplace() {
    for_all_types!(check_into_equals_copy_then_inplace);
}

fn check_typed_wrapper<T: Ref>() {
    let mut rng = Rng(0x7E ^ T::DTYPE as u64);
    for op in ops::<T>() {
        for order in [Order::AccFirst, Order::SrcFirst] {
            let a = random_vec::<T>(&mut rng, 300);
            let b = random_vec::<T>(&mut rng, 300);
            let mut typed = a.clone();
            reduce_slice(op, &mut typed, &b, order);
            let mut bytes = a.clone();
            reduce_inplace(T::DTYPE, op, as_bytes_mut(&mut bytes), as_bytes(&b), order);
            assert_same(&typed, &bytes, &format!("{} {op}", T::DTYPE));
        }
    }
}

#[test]
fn reduce_slice_equals_byte_api() {
    for_all_types!(check_typed_wrapper);
}

fn check_empty<T: Ref>() {
    for op in ops::<T>() {
        reduce_inplace(T::DTYPE, op, &mut [], &[], Order::AccFirst);
        reduce_inplace(T::DTYPE, op, &mut [], &[], Order::SrcFirst);
        reduce_into(T::DTYPE, op, &mut [], &[], &[]);
        reduce_slice::<T>(op, &mut [], &[], Order::AccFirst);
    }
    finish_avg(T::DTYPE, &mut [], 3);
}

#[test]
fn empty_slices_are_fine() {
    for_all_types!(check_empty);
}

/// `data` copied into a fresh buffer at byte offset `off` from an 8-byte aligned start.
struct Placed {
    buf: Vec<u64>,
    off: usize,
    len: usize,
}

impl Placed {
    fn new(data: &[u8], off: usize) -> Placed {
        let mut buf = vec![0u64; (data.len() + off).div_ceil(8) + 1];
        bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[off..off + data.len()].copy_from_slice(data);
        Placed {
            buf,
            off,
            len: data.len(),
        }
    }
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.buf)[self.off..self.off + self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.buf)[self.off..self.off + self.len]
    }
}

fn check_unaligned<T: Ref>() {
    let mut rng = Rng(0xA119 ^ T::DTYPE as u64);
    let n = 1100; // more than one 512-element staging block
    let a = random_vec::<T>(&mut rng, n);
    let b = random_vec::<T>(&mut rng, n);
    let small: Vec<T> = (0..n).map(|_| T::small(&mut rng)).collect();
    for op in ops::<T>() {
        let mut want_inplace = a.clone();
        reduce_inplace(
            T::DTYPE,
            op,
            as_bytes_mut(&mut want_inplace),
            as_bytes(&b),
            Order::SrcFirst,
        );
        let want_into = reference(op, &a, &b);
        for acc_off in 0..8 {
            for src_off in [0, 1, 3, acc_off] {
                if acc_off == 0 && src_off == 0 {
                    continue;
                }
                let what = format!("{} {op} acc+{acc_off} src+{src_off}", T::DTYPE);
                let mut acc = Placed::new(as_bytes(&a), acc_off);
                let src = Placed::new(as_bytes(&b), src_off);
                if size_of::<T>() > 1 && acc_off % 2 == 1 {
                    // Make sure the misaligned path is what runs here.
                    assert!(bytemuck::try_cast_slice::<u8, T>(acc.bytes()).is_err());
                }
                reduce_inplace(T::DTYPE, op, acc.bytes_mut(), src.bytes(), Order::SrcFirst);
                assert_same(
                    read_unaligned::<T>(acc.bytes()).as_slice(),
                    &want_inplace,
                    &format!("{what} inplace"),
                );

                let mut dst = Placed::new(&vec![0u8; n * size_of::<T>()], (acc_off + 5) % 8);
                reduce_into(
                    T::DTYPE,
                    op,
                    dst.bytes_mut(),
                    Placed::new(as_bytes(&a), acc_off).bytes(),
                    src.bytes(),
                );
                assert_same(
                    read_unaligned::<T>(dst.bytes()).as_slice(),
                    &want_into,
                    &format!("{what} into"),
                );
            }
        }
    }
    let mut want = small.clone();
    finish_avg(T::DTYPE, as_bytes_mut(&mut want), 3);
    for off in 1..8 {
        let mut x = Placed::new(as_bytes(&small), off);
        finish_avg(T::DTYPE, x.bytes_mut(), 3);
        let got = read_unaligned::<T>(x.bytes());
        assert_same(&got, &want, &format!("{} finish_avg +{off}", T::DTYPE));
    }
}

#[test]
fn unaligned_slices_match_aligned() {
    for_all_types!(check_unaligned);
}

/// Runs `op` on single elements through both entry points and both orders; returns the results.
fn combine_all<T: Element>(op: ReduceOp, a: T, b: T) -> [T; 3] {
    let mut r1 = [a];
    reduce_slice(op, &mut r1, &[b], Order::AccFirst);
    let mut r2 = [b];
    reduce_slice(op, &mut r2, &[a], Order::SrcFirst);
    let mut r3 = [T::zeroed()];
    reduce_into(
        T::DTYPE,
        op,
        as_bytes_mut(&mut r3),
        as_bytes(&[a]),
        as_bytes(&[b]),
    );
    [r1[0], r2[0], r3[0]]
}

trait Float: Element {
    fn canonical_nan() -> Self;
    fn nans() -> Vec<Self>;
    fn others() -> Vec<Self>;
    fn is_nan_value(self) -> bool;
}

macro_rules! float_impl {
    ($t:ty, $bits:ty, $sign:expr, $quiet:expr, $inf:expr) => {
        impl Float for $t {
            fn canonical_nan() -> Self {
                <$t>::NAN
            }
            fn nans() -> Vec<Self> {
                let (sign, quiet, inf): ($bits, $bits, $bits) = ($sign, $quiet, $inf);
                // Quiet, quiet with payload, signalling, and all of those negative.
                [
                    inf | quiet,
                    inf | quiet | 1,
                    inf | 1,
                    inf | (quiet >> 1) | 5,
                ]
                .into_iter()
                .flat_map(|b| [<$t>::from_bits(b), <$t>::from_bits(b | sign)])
                .collect()
            }
            fn others() -> Vec<Self> {
                let v = [0.0f32, -0.0, 1.0, -2.5, f32::INFINITY, f32::NEG_INFINITY];
                v.into_iter().map(|x| <$t>::from_f64(x as f64)).collect()
            }
            fn is_nan_value(self) -> bool {
                self.is_nan()
            }
        }
    };
}

/// Conversion from f64 for the four float types, so the NaN tests can share one value list.
trait FromF64 {
    fn from_f64(x: f64) -> Self;
}
impl FromF64 for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}
impl FromF64 for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
}
impl FromF64 for f16 {
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}
impl FromF64 for bf16 {
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

float_impl!(f32, u32, 1 << 31, 1 << 22, 0x7F80_0000);
float_impl!(f64, u64, 1 << 63, 1 << 51, 0x7FF0_0000_0000_0000);
float_impl!(f16, u16, 1 << 15, 1 << 9, 0x7C00);
float_impl!(bf16, u16, 1 << 15, 1 << 6, 0x7F80);

fn check_nan<T: Float>() {
    let nan = T::canonical_nan();
    let mut cases = Vec::new();
    for x in T::nans() {
        for y in T::others() {
            cases.push((x, y)); // NaN in acc
            cases.push((y, x)); // NaN in src
        }
        for y in T::nans() {
            cases.push((x, y)); // both
        }
    }
    for (a, b) in cases {
        for op in [ReduceOp::Min, ReduceOp::Max] {
            for r in combine_all(op, a, b) {
                assert_eq!(
                    as_bytes(&[r]),
                    as_bytes(&[nan]),
                    "{} {op}({a:?}, {b:?}) = {r:?}, want the canonical NaN",
                    T::DTYPE
                );
            }
        }
        for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Avg] {
            for r in combine_all(op, a, b) {
                assert!(r.is_nan_value(), "{} {op}({a:?}, {b:?}) = {r:?}", T::DTYPE);
            }
        }
    }
    // Also inside a longer vector, where the vectorized loop body (not a remainder) handles it.
    let others = T::others();
    let a: Vec<T> = (0..64).map(|i| others[i % others.len()]).collect();
    let mut b = a.clone();
    b[37] = T::nans()[3];
    for op in [ReduceOp::Min, ReduceOp::Max] {
        let mut acc = a.clone();
        reduce_slice(op, &mut acc, &b, Order::AccFirst);
        assert_eq!(
            as_bytes(&acc[37..38]),
            as_bytes(&[nan]),
            "{} {op}",
            T::DTYPE
        );
        assert!(
            acc.iter()
                .enumerate()
                .all(|(i, x)| x.is_nan_value() == (i == 37))
        );
    }
}

#[test]
fn nan_min_max_canonical_sum_prod_propagate() {
    check_nan::<f32>();
    check_nan::<f64>();
    check_nan::<f16>();
    check_nan::<bf16>();
}

fn check_signed_zero<T: Float>() {
    let z = T::others();
    let (pos, neg) = (z[0], z[1]);
    let bits = |x: T| as_bytes(&[x]).to_vec();
    for (a, b) in [(pos, neg), (neg, pos), (neg, neg), (pos, pos)] {
        let both_pos = bits(a) == bits(pos) && bits(b) == bits(pos);
        let any_pos = bits(a) == bits(pos) || bits(b) == bits(pos);
        let min = if both_pos { pos } else { neg };
        let max = if any_pos { pos } else { neg };
        for r in combine_all(ReduceOp::Min, a, b) {
            assert_eq!(bits(r), bits(min), "{} min({a:?}, {b:?})", T::DTYPE);
        }
        for r in combine_all(ReduceOp::Max, a, b) {
            assert_eq!(bits(r), bits(max), "{} max({a:?}, {b:?})", T::DTYPE);
        }
    }
    // Vector case with alternating signs in both operands.
    let a: Vec<T> = (0..100)
        .map(|i| if i % 2 == 0 { pos } else { neg })
        .collect();
    let b: Vec<T> = (0..100)
        .map(|i| if i % 3 == 0 { pos } else { neg })
        .collect();
    let mut min = a.clone();
    reduce_slice(ReduceOp::Min, &mut min, &b, Order::AccFirst);
    let mut max = a.clone();
    reduce_slice(ReduceOp::Max, &mut max, &b, Order::AccFirst);
    for i in 0..100 {
        let both_pos = i % 2 == 0 && i % 3 == 0;
        let any_pos = i % 2 == 0 || i % 3 == 0;
        assert_eq!(
            bits(min[i]),
            bits(if both_pos { pos } else { neg }),
            "min {i}"
        );
        assert_eq!(
            bits(max[i]),
            bits(if any_pos { pos } else { neg }),
            "max {i}"
        );
    }
}

#[test]
fn signed_zeros_order_for_min_max() {
    check_signed_zero::<f32>();
    check_signed_zero::<f64>();
    check_signed_zero::<f16>();
    check_signed_zero::<bf16>();
}

#[test]
fn bf16_sum_rounds_to_nearest_even() {
    let b = bf16::from_bits;
    // 1 + 2^-8 is exactly halfway between 1.0 (even) and its successor: stays 1.0.
    // 1.0078125 + 2^-8 is halfway between an odd and an even mantissa: rounds up to the even one.
    // Slightly above halfway always rounds up.
    let cases = [
        (0x3F80, 0x3B80, 0x3F80),
        (0x3F81, 0x3B80, 0x3F82),
        (0x3F80, 0x3B81, 0x3F81),
    ];
    for (x, y, want) in cases {
        for r in combine_all(ReduceOp::Sum, b(x), b(y)) {
            assert_eq!(r.to_bits(), want, "{x:#06x} + {y:#06x}");
        }
    }
}

#[test]
fn f16_sum_rounds_once_from_f32() {
    // 2048 + 1 is a tie in f16 (spacing 2 above 2048): round to even keeps 2048; 2048 + 3 -> 2052.
    let h = f16::from_f32;
    for (x, y, want) in [
        (2048.0, 1.0, 2048.0),
        (2048.0, 3.0, 2052.0),
        (65504.0, 8.0, 65504.0),
    ] {
        for r in combine_all(ReduceOp::Sum, h(x), h(y)) {
            assert_eq!(r, h(want), "{x} + {y}");
        }
    }
    // Overflow to infinity in f16 even though the f32 sum is finite.
    assert_eq!(
        combine_all(ReduceOp::Sum, h(65504.0), h(32.0))[0],
        f16::INFINITY
    );
}

fn check_wrap<T: Element>(op: ReduceOp, a: T, b: T, want: T) {
    for r in combine_all(op, a, b) {
        assert_eq!(r, want, "{} {op}({a:?}, {b:?})", T::DTYPE);
    }
    // And within a vector long enough to take the vectorized loop.
    let mut acc = vec![a; 67];
    reduce_slice(op, &mut acc, &[b; 67], Order::AccFirst);
    assert!(acc.iter().all(|&r| r == want), "{} {op} vector", T::DTYPE);
}

#[test]
fn integer_sum_and_prod_wrap() {
    use ReduceOp::{Prod, Sum};
    check_wrap(Sum, i8::MAX, 1, i8::MIN);
    check_wrap(Sum, i8::MIN, -1, i8::MAX);
    check_wrap(Prod, 16i8, 16, 0);
    check_wrap(Prod, i8::MIN, -1, i8::MIN);
    check_wrap(Prod, 100i8, 3, 44);
    check_wrap(Sum, u8::MAX, 1, 0);
    check_wrap(Sum, 200u8, 100, 44);
    check_wrap(Prod, u8::MAX, u8::MAX, 1);
    check_wrap(Prod, 16u8, 16, 0);
    check_wrap(Sum, i32::MAX, 1, i32::MIN);
    check_wrap(Sum, i32::MIN, i32::MIN, 0);
    check_wrap(Prod, i32::MIN, -1, i32::MIN);
    check_wrap(Prod, 65536i32, 65536, 0);
    check_wrap(Sum, u32::MAX, u32::MAX, u32::MAX - 1);
    check_wrap(Prod, u32::MAX, u32::MAX, 1);
    check_wrap(Sum, i64::MAX, 1, i64::MIN);
    check_wrap(Prod, i64::MIN, -1, i64::MIN);
    check_wrap(Prod, i64::MAX, i64::MAX, 1);
    check_wrap(Sum, u64::MAX, 2, 1);
    check_wrap(Prod, u64::MAX, 3, u64::MAX - 2);
    check_wrap(Prod, 1u64 << 32, 1 << 32, 0);
}

fn avg_of<T: Element>(values: &[T], n: usize) -> T {
    let mut acc = [values[0]];
    for v in &values[1..] {
        reduce_slice(ReduceOp::Avg, &mut acc, &[*v], Order::AccFirst);
    }
    finish_avg(T::DTYPE, as_bytes_mut(&mut acc), n);
    acc[0]
}

#[test]
fn integer_avg_truncates_toward_zero() {
    assert_eq!(avg_of(&[1i32, 2], 2), 1);
    assert_eq!(avg_of(&[-1i32, -2], 2), -1); // -1.5 -> -1, not floor's -2
    assert_eq!(avg_of(&[-7i32, 2, 0], 3), -1); // -5/3
    assert_eq!(avg_of(&[-7i8, 2], 2), -2); // -2.5 -> -2
    assert_eq!(avg_of(&[i64::MIN, 1], 2), (i64::MIN + 1) / 2);
    assert_eq!(avg_of(&[7u32, 0, 0, 0], 4), 1);
    // The wrapped sum is what gets divided.
    assert_eq!(avg_of(&[100i8, 100], 2), -28); // 200 wraps to -56
    assert_eq!(avg_of(&[200u8, 100], 2), 22); // 300 wraps to 44
    assert_eq!(avg_of(&[u64::MAX, 3], 2), 1);
    // More ranks than the type can count: still C's truncating division of the exact values.
    let mut x = [i8::MIN, i8::MAX, -1, 0];
    finish_avg(DataType::I8, as_bytes_mut(&mut x), 128);
    assert_eq!(x, [-1, 0, 0, 0]);
    let mut x = [i8::MIN, i8::MAX];
    finish_avg(DataType::I8, as_bytes_mut(&mut x), 1000);
    assert_eq!(x, [0, 0]);
    let mut x = [u8::MAX, 255];
    finish_avg(DataType::U8, as_bytes_mut(&mut x), 255);
    assert_eq!(x, [1, 1]);
    let mut x = [u8::MAX];
    finish_avg(DataType::U8, as_bytes_mut(&mut x), 256);
    assert_eq!(x, [0]);
    // A vector long enough to take the vectorized loop.
    let mut x: Vec<i32> = (-50..50).collect();
    finish_avg(DataType::I32, as_bytes_mut(&mut x), 7);
    let want: Vec<i32> = (-50..50).map(|v| v / 7).collect();
    assert_eq!(x, want);
}

/// `finish_avg` on every value in `xs` for each `n` against exact wide division.
fn check_int_division<T: Element + Into<i128> + TryFrom<i128>>(xs: &[T], ns: &[usize])
where
    <T as TryFrom<i128>>::Error: std::fmt::Debug,
{
    for &n in ns {
        let mut got = xs.to_vec();
        finish_avg(T::DTYPE, as_bytes_mut(&mut got), n);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = T::try_from(x.into() / n as i128).unwrap();
            assert_eq!(g, want, "{} {x:?} / {n}", T::DTYPE);
        }
    }
}

#[test]
fn integer_avg_division_is_exact() {
    let mut ns: Vec<usize> = (1..=300).collect();
    ns.extend([
        1000,
        65535,
        65536,
        (1 << 24) - 1,
        1 << 24,
        (1 << 31) - 1,
        1 << 31,
        (1 << 32) + 1,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        (1 << 63) - 1,
        1 << 63,
        usize::MAX,
    ]);
    let i8s: Vec<i8> = (i8::MIN..=i8::MAX).collect();
    check_int_division(&i8s, &ns);
    let u8s: Vec<u8> = (0..=u8::MAX).collect();
    check_int_division(&u8s, &ns);

    let mut rng = Rng(0xD1F);
    let mut i32s = vec![i32::MIN, i32::MIN + 1, i32::MAX, i32::MAX - 1, -1, 0, 1];
    i32s.extend((0..500).map(|_| rng.next() as i32));
    check_int_division(&i32s, &ns);
    let mut u32s = vec![u32::MAX, u32::MAX - 1, 1 << 31, 0, 1];
    u32s.extend((0..500).map(|_| rng.next() as u32));
    check_int_division(&u32s, &ns);
    let mut i64s = vec![i64::MIN, i64::MIN + 1, i64::MAX, -1, 0, 1];
    i64s.extend((0..500).map(|_| rng.next() as i64));
    check_int_division(&i64s, &ns);
    let mut u64s = vec![u64::MAX, 1 << 63, 0, 1];
    u64s.extend((0..500).map(|_| rng.next()));
    check_int_division(&u64s, &ns);
}

#[test]
fn float_avg_divides_in_element_type() {
    assert_eq!(avg_of(&[1.0f32, 2.0], 2), 1.5);
    assert_eq!(avg_of(&[1.0f64, 2.0, 4.0], 3), 7.0 / 3.0);
    assert_eq!(avg_of(&[-1.0f32, 1.0], 2).to_bits(), 0.0f32.to_bits());
    // f16: 1/3 through f32, rounded once to f16.
    let third = avg_of(&[f16::ONE, f16::ZERO, f16::ZERO], 3);
    assert_eq!(third, f16::from_f32(1.0 / 3.0));
    let third = avg_of(&[bf16::ONE, bf16::ZERO, bf16::ZERO], 3);
    assert_eq!(third, bf16::from_f32(1.0 / 3.0));
}

#[test]
#[should_panic(expected = "lengths differ")]
fn length_mismatch_panics() {
    reduce_inplace(
        DataType::F32,
        ReduceOp::Sum,
        &mut [0; 8],
        &[0; 4],
        Order::AccFirst,
    );
}

#[test]
#[should_panic(expected = "lengths differ")]
fn reduce_into_length_mismatch_panics() {
    reduce_into(DataType::U8, ReduceOp::Max, &mut [0; 4], &[0; 4], &[0; 3]);
}

#[test]
#[should_panic(expected = "lengths differ")]
fn reduce_slice_length_mismatch_panics() {
    reduce_slice(ReduceOp::Min, &mut [0u64; 3], &[0u64; 2], Order::SrcFirst);
}

#[test]
#[should_panic(expected = "whole number")]
fn partial_element_panics() {
    reduce_inplace(
        DataType::F64,
        ReduceOp::Prod,
        &mut [0; 12],
        &[0; 12],
        Order::AccFirst,
    );
}

#[test]
#[should_panic(expected = "whole number")]
fn finish_avg_partial_element_panics() {
    finish_avg(DataType::Bf16, &mut [0; 3], 2);
}

#[test]
#[should_panic(expected = "zero ranks")]
fn finish_avg_zero_ranks_panics() {
    finish_avg(DataType::I32, &mut [0; 4], 0);
}

#[test]
fn bitwise_ops_on_integers() {
    let mut acc = [0b1100u8, 0xFF, 0];
    reduce_slice(
        ReduceOp::BAnd,
        &mut acc,
        &[0b1010, 0x0F, 0xFF],
        Order::AccFirst,
    );
    assert_eq!(acc, [0b1000, 0x0F, 0]);
    let mut acc = [0b1100i32, -1, 0];
    reduce_slice(
        ReduceOp::BOr,
        &mut acc,
        &[0b1010, 0, i32::MIN],
        Order::SrcFirst,
    );
    assert_eq!(acc, [0b1110, -1, i32::MIN]);
    let mut dst = [0u64; 2];
    reduce_into(
        DataType::U64,
        ReduceOp::BXor,
        bytemuck::cast_slice_mut(&mut dst),
        bytemuck::cast_slice(&[u64::MAX, 5u64]),
        bytemuck::cast_slice(&[1u64, 5]),
    );
    assert_eq!(dst, [u64::MAX - 1, 0]);
}

/// Every entry point checks `ReduceOp::check` first; the kernels themselves refuse loudly.
#[test]
#[should_panic(expected = "band is defined for integer types only, not float")]
fn bitwise_on_floats_panics_in_the_kernel() {
    reduce_inplace(
        DataType::F32,
        ReduceOp::BAnd,
        &mut [0; 8],
        &[0; 8],
        Order::AccFirst,
    );
}

#[test]
#[should_panic(expected = "bxor is defined for integer types only, not bfloat16")]
fn bitwise_on_half_floats_panics_in_the_kernel() {
    reduce_into(
        DataType::Bf16,
        ReduceOp::BXor,
        &mut [0; 4],
        &[0; 4],
        &[0; 4],
    );
}
