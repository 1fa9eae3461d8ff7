//! Reduce kernels: combine two buffers element by element for every [`DataType`] x [`ReduceOp`].
//!
//! # Why byte slices
//! The data path is untyped: transports hand over `&[u8]` staging buffers, the C ABI passes a
//! `void*` plus a [`DataType`] tag, and one algorithm serves every element type. So the public
//! kernels take bytes and the tag, and [`reduce_slice`] is a thin typed front over them.
//!
//! Byte slices may start anywhere (a chunk at an odd offset of a receive buffer). Aligned input,
//! the normal case, is reinterpreted in place with `bytemuck` at no cost. Misaligned input is copied
//! block by block into aligned stack buffers and run through the same typed kernel, so both paths
//! compute the identical expression and give identical bytes.
//!
//! # Dispatch once per call
//! `dtype` and `op` are matched once per call, selecting a loop monomorphized for that element type
//! and operator; the loops themselves are branch-free straight-line code over zipped slices, which
//! the compiler vectorizes for the baseline target. No `target-cpu`/target features are enabled
//! because the binaries also run on machines (and emulators) without them; f16 conversions still
//! use F16C when the CPU has it, through `half`'s run-time detection. The same loops compiled
//! for AVX2 are chosen at run time where it pays, for reductions out of host memory
//! ([`Kernels`], `ccl_shm::simd`): [`reduce_into_inline`] and [`reduce_inplace_inline`] inline
//! every loop into a caller compiled with wider vector units.
//!
//! # Bit-identical results on every rank
//! Collectives are only correct if every rank ends up with the same bytes, and an allreduce may
//! evaluate `a op b` on one rank and `b op a` on another. Integer ops and float min/max are made
//! symmetric down to the bit: min/max return the canonical quiet NaN whenever an operand is NaN
//! (IEEE 754-2019 `minimum`/`maximum` leave the payload unspecified, hardware picks an operand's),
//! and order `-0.0` below `+0.0`. Float sum/prod are symmetric except for which NaN payload
//! survives; [`Order`] lets an algorithm fix the operand order so every rank evaluates the same
//! expression anyway. f16 and bf16 sums and products are computed in f32 and rounded back once per
//! element (round-to-nearest-even), so the result does not depend on how a buffer was blocked;
//! their min/max compare the bits directly, which picks the same operand without converting.

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::types::{DataType, Element, ReduceOp};

/// Which operand comes first when combining; matters only for NaN payloads of sum/prod on floats,
/// but algorithms use it so every rank evaluates exactly the same expression (bit-identical
/// results).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `acc (op) src`.
    AccFirst,
    /// `src (op) acc`.
    SrcFirst,
}

/// A set of reduce kernels with [`reduce_into`]'s and [`reduce_inplace`]'s contracts: the
/// baseline build's, or the same loops compiled for wider vector units that a transport found
/// at run time (the shared-memory transport's, `ccl_shm::simd`). Every set gives the same bits:
/// the loops are element by element, and a wider vector changes only how many run at once.
#[derive(Clone, Copy)]
pub struct Kernels {
    /// `dst = a (op) b`, as [`reduce_into`].
    pub into: fn(DataType, ReduceOp, &mut [u8], &[u8], &[u8]),
    /// `acc = acc (op) src` (or `src (op) acc`), as [`reduce_inplace`].
    pub inplace: fn(DataType, ReduceOp, &mut [u8], &[u8], Order),
    /// What the set is compiled for, for logs (`"baseline"`, `"avx2"`).
    pub name: &'static str,
}

impl Kernels {
    /// The loops of the baseline build (SSE2 on x86-64).
    pub const BASELINE: Kernels = Kernels {
        into: reduce_into,
        inplace: reduce_inplace,
        name: "baseline",
    };
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// `acc[i] = acc[i] (op) src[i]` ([`Order::AccFirst`]) or `src[i] (op) acc[i]`
/// ([`Order::SrcFirst`]).
///
/// `op` is applied as [`ReduceOp::combiner`]: `Avg` combines as `Sum`, and the division happens
/// once in [`finish_avg`].
///
/// # Panics
/// If `acc.len() != src.len()`, the length is not a multiple of `dtype.size()`, or `op` is a
/// bitwise operator and `dtype` a float type ([`ReduceOp::check`]); callers validate user input
/// before reaching the data path.
pub fn reduce_inplace(dtype: DataType, op: ReduceOp, acc: &mut [u8], src: &[u8], order: Order) {
    reduce_inplace_inline(dtype, op, acc, src, order);
}

/// [`reduce_inplace`] inlined into its caller with every loop under it, so that a caller
/// compiled for wider vector units (a `#[target_feature]` function chosen at run time, as the
/// shared-memory transport's [`Kernels`] are) gets them in the loops too.
#[inline(always)]
pub fn reduce_inplace_inline(
    dtype: DataType,
    op: ReduceOp,
    acc: &mut [u8],
    src: &[u8],
    order: Order,
) {
    check_len(dtype, acc.len(), src.len());
    match dtype {
        DataType::I8 => inplace_bytes::<i8>(op, acc, src, order),
        DataType::U8 => inplace_bytes::<u8>(op, acc, src, order),
        DataType::I32 => inplace_bytes::<i32>(op, acc, src, order),
        DataType::U32 => inplace_bytes::<u32>(op, acc, src, order),
        DataType::I64 => inplace_bytes::<i64>(op, acc, src, order),
        DataType::U64 => inplace_bytes::<u64>(op, acc, src, order),
        DataType::F16 => inplace_bytes::<f16>(op, acc, src, order),
        DataType::F32 => inplace_bytes::<f32>(op, acc, src, order),
        DataType::F64 => inplace_bytes::<f64>(op, acc, src, order),
        DataType::Bf16 => inplace_bytes::<bf16>(op, acc, src, order),
    }
}

/// `dst[i] = a[i] (op) b[i]`, with `a` as the first operand; same rules as [`reduce_inplace`].
///
/// # Panics
/// If the three lengths differ or are not a multiple of `dtype.size()`, or `op` is not defined for
/// `dtype` ([`ReduceOp::check`]).
pub fn reduce_into(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    reduce_into_inline(dtype, op, dst, a, b);
}

/// [`reduce_into`] inlined into its caller with every loop under it (see
/// [`reduce_inplace_inline`]).
#[inline(always)]
pub fn reduce_into_inline(dtype: DataType, op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    check_len(dtype, dst.len(), a.len());
    check_len(dtype, dst.len(), b.len());
    match dtype {
        DataType::I8 => into_bytes::<i8>(op, dst, a, b),
        DataType::U8 => into_bytes::<u8>(op, dst, a, b),
        DataType::I32 => into_bytes::<i32>(op, dst, a, b),
        DataType::U32 => into_bytes::<u32>(op, dst, a, b),
        DataType::I64 => into_bytes::<i64>(op, dst, a, b),
        DataType::U64 => into_bytes::<u64>(op, dst, a, b),
        DataType::F16 => into_bytes::<f16>(op, dst, a, b),
        DataType::F32 => into_bytes::<f32>(op, dst, a, b),
        DataType::F64 => into_bytes::<f64>(op, dst, a, b),
        DataType::Bf16 => into_bytes::<bf16>(op, dst, a, b),
    }
}

/// `x[i] = x[i] / n`: the final step of [`ReduceOp::Avg`], run once on the reduced sum.
///
/// Floats divide in the element type (f16 and bf16 through f32, rounded back to nearest-even).
/// Integers divide the wrapped sum with truncation toward zero, as C does, even when `n` does not
/// fit in the element type.
///
/// # Panics
/// If `n == 0` or `x.len()` is not a multiple of `dtype.size()`.
pub fn finish_avg(dtype: DataType, x: &mut [u8], n: usize) {
    assert!(n > 0, "finish_avg: division by zero ranks");
    check_len(dtype, x.len(), x.len());
    match dtype {
        DataType::I8 => avg_bytes::<i8>(x, n),
        DataType::U8 => avg_bytes::<u8>(x, n),
        DataType::I32 => avg_bytes::<i32>(x, n),
        DataType::U32 => avg_bytes::<u32>(x, n),
        DataType::I64 => avg_bytes::<i64>(x, n),
        DataType::U64 => avg_bytes::<u64>(x, n),
        DataType::F16 => avg_bytes::<f16>(x, n),
        DataType::F32 => avg_bytes::<f32>(x, n),
        DataType::F64 => avg_bytes::<f64>(x, n),
        DataType::Bf16 => avg_bytes::<bf16>(x, n),
    }
}

/// Typed form of [`reduce_inplace`].
///
/// # Panics
/// If `acc.len() != src.len()`.
pub fn reduce_slice<T: Element>(op: ReduceOp, acc: &mut [T], src: &[T], order: Order) {
    // Typed slices are always aligned, so this lands on the fast path; going through the byte
    // entry point keeps a single dispatch table.
    reduce_inplace(
        T::DTYPE,
        op,
        bytemuck::cast_slice_mut(acc),
        bytemuck::cast_slice(src),
        order,
    );
}

#[inline(always)]
fn check_len(dtype: DataType, a: usize, b: usize) {
    assert!(a == b, "reduce: operand lengths differ ({a} and {b} bytes)");
    assert!(
        a % dtype.size() == 0,
        "reduce: {a} bytes is not a whole number of {dtype} elements"
    );
}

/// Elements per stack block on the misaligned path. 512 x 8 bytes keeps three blocks within a few
/// KiB of stack yet long enough that the per-block copies are plain `memcpy`s.
const UNALIGNED_BLOCK: usize = 512;

/// Elements per f32 staging block for f16: a multiple of the widest conversion vector, small
/// enough for three blocks to stay in L1 next to the operands.
const HALF_BLOCK: usize = 256;

#[inline(always)]
fn inplace_bytes<T: Kernel>(op: ReduceOp, acc: &mut [u8], src: &[u8], order: Order) {
    if let (Ok(a), Ok(s)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(acc),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        return T::inplace(op, a, s, order);
    }
    let size = size_of::<T>();
    let mut ta = [T::zeroed(); UNALIGNED_BLOCK];
    let mut ts = [T::zeroed(); UNALIGNED_BLOCK];
    for (ac, sc) in acc
        .chunks_mut(UNALIGNED_BLOCK * size)
        .zip(src.chunks(UNALIGNED_BLOCK * size))
    {
        let n = ac.len() / size;
        let (ta, ts) = (&mut ta[..n], &mut ts[..n]);
        bytemuck::cast_slice_mut(&mut *ta).copy_from_slice(ac);
        bytemuck::cast_slice_mut(&mut *ts).copy_from_slice(sc);
        T::inplace(op, ta, ts, order);
        ac.copy_from_slice(bytemuck::cast_slice(ta));
    }
}

#[inline(always)]
fn into_bytes<T: Kernel>(op: ReduceOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    if let (Ok(d), Ok(x), Ok(y)) = (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(a),
        bytemuck::try_cast_slice::<u8, T>(b),
    ) {
        return T::into(op, d, x, y);
    }
    let size = size_of::<T>();
    let mut td = [T::zeroed(); UNALIGNED_BLOCK];
    let mut ta = [T::zeroed(); UNALIGNED_BLOCK];
    let mut tb = [T::zeroed(); UNALIGNED_BLOCK];
    let block = UNALIGNED_BLOCK * size;
    for ((dc, ac), bc) in dst
        .chunks_mut(block)
        .zip(a.chunks(block))
        .zip(b.chunks(block))
    {
        let n = dc.len() / size;
        let (td, ta, tb) = (&mut td[..n], &mut ta[..n], &mut tb[..n]);
        bytemuck::cast_slice_mut(&mut *ta).copy_from_slice(ac);
        bytemuck::cast_slice_mut(&mut *tb).copy_from_slice(bc);
        T::into(op, td, ta, tb);
        dc.copy_from_slice(bytemuck::cast_slice(td));
    }
}

fn avg_bytes<T: Kernel>(x: &mut [u8], n: usize) {
    if let Ok(t) = bytemuck::try_cast_slice_mut::<u8, T>(x) {
        return T::div(t, n);
    }
    let size = size_of::<T>();
    let mut tx = [T::zeroed(); UNALIGNED_BLOCK];
    for xc in x.chunks_mut(UNALIGNED_BLOCK * size) {
        let tx = &mut tx[..xc.len() / size];
        bytemuck::cast_slice_mut(&mut *tx).copy_from_slice(xc);
        T::div(tx, n);
        xc.copy_from_slice(bytemuck::cast_slice(tx));
    }
}

/// A type with typed kernels; `op` is matched here once, outside the element loops.
trait Kernel: Element {
    fn inplace(op: ReduceOp, acc: &mut [Self], src: &[Self], order: Order);
    fn into(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]);
    fn div(x: &mut [Self], n: usize);
}

/// A binary operator as a type, so each (type, operator) pair gets its own monomorphized loop.
trait BinOp<T> {
    fn apply(a: T, b: T) -> T;
}

struct Sum;
struct Prod;
struct Min;
struct Max;
struct BAnd;
struct BOr;
struct BXor;

#[inline(always)]
fn apply_inplace<T: Copy, O: BinOp<T>>(acc: &mut [T], src: &[T], order: Order) {
    // Two loops rather than a select inside one: the order is fixed for the whole call.
    match order {
        Order::AccFirst => {
            for (a, &s) in acc.iter_mut().zip(src) {
                *a = O::apply(*a, s);
            }
        }
        Order::SrcFirst => {
            for (a, &s) in acc.iter_mut().zip(src) {
                *a = O::apply(s, *a);
            }
        }
    }
}

#[inline(always)]
fn apply_into<T: Copy, O: BinOp<T>>(dst: &mut [T], a: &[T], b: &[T]) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = O::apply(x, y);
    }
}

macro_rules! native_kernel {
    // `$bitwise` is the arm for the bitwise operators: their loops for integers, a panic for
    // floats (the entry points refuse that pairing first, with `ReduceOp::check`).
    ($($t:ty => $bitwise:ident),*) => {$(
        impl Kernel for $t {
            #[inline(always)]
            fn inplace(op: ReduceOp, acc: &mut [Self], src: &[Self], order: Order) {
                match op.combiner() {
                    ReduceOp::Sum | ReduceOp::Avg => apply_inplace::<$t, Sum>(acc, src, order),
                    ReduceOp::Prod => apply_inplace::<$t, Prod>(acc, src, order),
                    ReduceOp::Min => apply_inplace::<$t, Min>(acc, src, order),
                    ReduceOp::Max => apply_inplace::<$t, Max>(acc, src, order),
                    b @ (ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) => {
                        $bitwise!($t, b, apply_inplace(acc, src, order))
                    }
                }
            }

            #[inline(always)]
            fn into(op: ReduceOp, dst: &mut [Self], a: &[Self], b: &[Self]) {
                match op.combiner() {
                    ReduceOp::Sum | ReduceOp::Avg => apply_into::<$t, Sum>(dst, a, b),
                    ReduceOp::Prod => apply_into::<$t, Prod>(dst, a, b),
                    ReduceOp::Min => apply_into::<$t, Min>(dst, a, b),
                    ReduceOp::Max => apply_into::<$t, Max>(dst, a, b),
                    o @ (ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor) => {
                        $bitwise!($t, o, apply_into(dst, a, b))
                    }
                }
            }

            fn div(x: &mut [Self], n: usize) {
                <$t as Divide>::divide(x, n);
            }
        }
    )*};
}

/// The bitwise loops of an integer type.
macro_rules! int_bitwise {
    ($t:ty, $op:expr, $apply:ident ( $($arg:expr),* )) => {
        match $op {
            ReduceOp::BAnd => $apply::<$t, BAnd>($($arg),*),
            ReduceOp::BOr => $apply::<$t, BOr>($($arg),*),
            _ => $apply::<$t, BXor>($($arg),*),
        }
    };
}

/// Bitwise operators on a float type: unreachable through the public entry points.
macro_rules! no_bitwise {
    ($t:ty, $op:expr, $apply:ident ( $($arg:expr),* )) => {
        no_bitwise_on_floats($op, <$t as Element>::DTYPE)
    };
}

#[cold]
fn no_bitwise_on_floats(op: ReduceOp, dtype: DataType) -> ! {
    panic!(
        "reduce: {op} is defined for integer types only, not {dtype} (callers check \
         ReduceOp::check before reducing)"
    )
}

native_kernel!(
    i8 => int_bitwise, u8 => int_bitwise, i32 => int_bitwise, u32 => int_bitwise,
    i64 => int_bitwise, u64 => int_bitwise, f32 => no_bitwise, f64 => no_bitwise
);

macro_rules! int_ops {
    ($($t:ty),*) => {$(
        impl BinOp<$t> for Sum {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_add(b) }
        }
        impl BinOp<$t> for Prod {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.wrapping_mul(b) }
        }
        impl BinOp<$t> for Min {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.min(b) }
        }
        impl BinOp<$t> for Max {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a.max(b) }
        }
        impl BinOp<$t> for BAnd {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a & b }
        }
        impl BinOp<$t> for BOr {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a | b }
        }
        impl BinOp<$t> for BXor {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a ^ b }
        }
    )*};
}

int_ops!(i8, u8, i32, u32, i64, u64);

/// The division of [`finish_avg`], per type family.
trait Divide: Sized {
    fn divide(x: &mut [Self], n: usize);
}

/// Integer division with truncation toward zero, as C does, valid for any `n >= 1`: the path for
/// more ranks than the element type can count, where `n` cannot be converted to it.
fn wide_divide<T: Copy + Into<i128> + TryFrom<i128>>(x: &mut [T], n: usize) {
    for v in x {
        let q = (*v).into() / n as i128;
        // |x / n| <= |x|, so the quotient always fits.
        *v = T::try_from(q).unwrap_or_else(|_| unreachable!());
    }
}

macro_rules! int_divide_by_table {
    ($($t:ty),*) => {$(
        impl Divide for $t {
            fn divide(x: &mut [Self], n: usize) {
                // Integer division does not vectorize and costs many cycles per element; with
                // only 256 possible values, dividing each once and looking results up is several
                // times faster on any buffer worth averaging.
                let mut table = [0 as $t; 256];
                for (b, q) in table.iter_mut().enumerate() {
                    let v = i32::from(b as u8 as $t);
                    // `/` truncates toward zero like C; every |v| <= 255 < n gives 0.
                    *q = if n <= 255 { (v / n as i32) as $t } else { 0 };
                }
                x.iter_mut().for_each(|v| *v = table[*v as u8 as usize]);
            }
        }
    )*};
}

int_divide_by_table!(i8, u8);

macro_rules! int_divide {
    ($($t:ty),*) => {$(
        impl Divide for $t {
            fn divide(x: &mut [Self], n: usize) {
                match <$t>::try_from(n) {
                    // `/` truncates toward zero like C; `n >= 1` rules out MIN / -1.
                    Ok(d) => x.iter_mut().for_each(|v| *v /= d),
                    Err(_) => wide_divide(x, n),
                }
            }
        }
    )*};
}

int_divide!(i32, u32, i64, u64);

macro_rules! float_ops {
    ($($t:ty),*) => {$(
        impl BinOp<$t> for Sum {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a + b }
        }
        impl BinOp<$t> for Prod {
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t { a * b }
        }
        impl BinOp<$t> for Min {
            /// IEEE 754-2019 `minimum` with a canonical NaN, written as selects so it vectorizes.
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                // On x86 each select is one `minps`/`minpd`, which returns its second operand when
                // the two compare equal. OR-ing both operand orders gives -0 for (+0, -0) in
                // either order and the operand itself otherwise; cheaper than a separate
                // equality test and select.
                let ab = if a < b { a } else { b };
                let ba = if b < a { b } else { a };
                let r = <$t>::from_bits(ab.to_bits() | ba.to_bits());
                if a.is_nan() | b.is_nan() { <$t>::NAN } else { r }
            }
        }
        impl BinOp<$t> for Max {
            /// IEEE 754-2019 `maximum` with a canonical NaN, written as selects so it vectorizes.
            #[inline(always)]
            fn apply(a: $t, b: $t) -> $t {
                // As for `Min`; AND-ing the bits of +0 and -0 gives +0.
                let ab = if a > b { a } else { b };
                let ba = if b > a { b } else { a };
                let r = <$t>::from_bits(ab.to_bits() & ba.to_bits());
                if a.is_nan() | b.is_nan() { <$t>::NAN } else { r }
            }
        }
        impl Divide for $t {
            fn divide(x: &mut [Self], n: usize) {
                let d = n as $t;
                x.iter_mut().for_each(|v| *v /= d);
            }
        }
    )*};
}

float_ops!(f32, f64);

// f16 and bf16. Sum and prod are computed in f32 and rounded back once per element. Min and max
// only ever pick an operand (or NaN), so they compare the bits directly and never convert.

mod halves;

#[cfg(test)]
mod tests;
