//! Deterministic inputs and their exact, closed-form reductions, for tests and for the
//! benchmark's `-c 1` check.
//!
//! Rank `r`'s input at element `i` is a small integer (1..=4, or 1..=2 for products), so sums,
//! products over up to eight ranks, minima, maxima and averages are exact in every data type and
//! the expected result of element `i` is known without any communication. The bitwise operators
//! (integer types only) get values in 0..127 with varied bits, which every integer type holds.

use half::{bf16, f16};

use crate::types::{DataType, Element, ReduceOp};

/// Rank `r`'s input value at element `i` for `op`.
pub fn input(op: ReduceOp, r: usize, i: usize) -> i64 {
    match op {
        ReduceOp::Prod => 1 + ((r + i) % 2) as i64,
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => ((r * 37 + i * 11 + 90) % 127) as i64,
        _ => 1 + ((r * 3 + i) % 4) as i64,
    }
}

/// A type the check can build values of.
pub trait CheckValue: Element + Copy {
    fn from_i64(v: i64) -> Self;
    /// `Avg` of values summing to `sum` over `n` ranks, computed as the library does.
    fn avg(sum: i64, n: usize) -> Self;
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl CheckValue for $t {
            fn from_i64(v: i64) -> Self { v as $t }
            fn avg(sum: i64, n: usize) -> Self { (sum as $t) / (n as $t) }
        }
    )*};
}
int_value!(i8, u8, i32, u32, i64, u64);

impl CheckValue for f32 {
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
}

impl CheckValue for f64 {
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
}

impl CheckValue for f16 {
    fn from_i64(v: i64) -> Self {
        f16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        f16::from_f32(sum as f32 / n as f32)
    }
}

impl CheckValue for bf16 {
    fn from_i64(v: i64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn avg(sum: i64, n: usize) -> Self {
        bf16::from_f32(sum as f32 / n as f32)
    }
}

/// The exact allreduce result at element `i` over `n` ranks.
pub fn expected<T: CheckValue>(op: ReduceOp, n: usize, i: usize) -> T {
    let vals = (0..n).map(|r| input(op, r, i));
    match op {
        ReduceOp::Sum => T::from_i64(vals.sum()),
        ReduceOp::Prod => T::from_i64(vals.product()),
        ReduceOp::Min => T::from_i64(vals.min().unwrap_or(0)),
        ReduceOp::Max => T::from_i64(vals.max().unwrap_or(0)),
        ReduceOp::Avg => T::avg(vals.sum(), n),
        ReduceOp::BAnd => T::from_i64(vals.fold(127, |a, v| a & v)),
        ReduceOp::BOr => T::from_i64(vals.fold(0, |a, v| a | v)),
        ReduceOp::BXor => T::from_i64(vals.fold(0, |a, v| a ^ v)),
    }
}

/// Fills `buf` with rank `r`'s inputs.
pub fn fill<T: CheckValue>(buf: &mut [T], op: ReduceOp, r: usize) {
    for (i, v) in buf.iter_mut().enumerate() {
        *v = T::from_i64(input(op, r, i));
    }
}

/// Number of elements of `buf` that differ from the allreduce result over `n` ranks.
pub fn count_wrong<T: CheckValue>(buf: &[T], op: ReduceOp, n: usize) -> usize {
    // Compare bit patterns: a NaN is wrong, and -0.0 is not 0.0.
    buf.iter()
        .enumerate()
        .filter(|(i, v)| bytemuck::bytes_of(*v) != bytemuck::bytes_of(&expected::<T>(op, n, *i)))
        .count()
}

/// Calls `$f::<T>` for the Rust type of a [`DataType`].
#[macro_export]
macro_rules! dispatch_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            $crate::DataType::I8 => $f::<i8>($($arg),*),
            $crate::DataType::U8 => $f::<u8>($($arg),*),
            $crate::DataType::I32 => $f::<i32>($($arg),*),
            $crate::DataType::U32 => $f::<u32>($($arg),*),
            $crate::DataType::I64 => $f::<i64>($($arg),*),
            $crate::DataType::U64 => $f::<u64>($($arg),*),
            $crate::DataType::F16 => $f::<$crate::half::f16>($($arg),*),
            $crate::DataType::F32 => $f::<f32>($($arg),*),
            $crate::DataType::F64 => $f::<f64>($($arg),*),
            $crate::DataType::Bf16 => $f::<$crate::half::bf16>($($arg),*),
        }
    };
}

fn fill_bytes_t<T: CheckValue>(buf: &mut [u8], op: ReduceOp, r: usize) {
    fill(bytemuck::cast_slice_mut::<u8, T>(buf), op, r)
}

fn wrong_bytes_t<T: CheckValue>(buf: &[u8], op: ReduceOp, n: usize) -> usize {
    count_wrong(bytemuck::cast_slice::<u8, T>(buf), op, n)
}

/// [`fill`] on an untyped buffer (aligned for `dtype`, a whole number of elements).
pub fn fill_bytes(dtype: DataType, buf: &mut [u8], op: ReduceOp, r: usize) {
    dispatch_dtype!(dtype, fill_bytes_t(buf, op, r))
}

/// [`count_wrong`] on an untyped buffer.
pub fn count_wrong_bytes(dtype: DataType, buf: &[u8], op: ReduceOp, n: usize) -> usize {
    dispatch_dtype!(dtype, wrong_bytes_t(buf, op, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_values() {
        // Over 3 ranks, element 0 inputs are 1, 4, 3 (sum/min/max/avg) and 1, 2, 1 (prod).
        assert_eq!(expected::<i32>(ReduceOp::Sum, 3, 0), 8);
        assert_eq!(expected::<i32>(ReduceOp::Prod, 3, 0), 2);
        assert_eq!(expected::<i32>(ReduceOp::Min, 3, 0), 1);
        assert_eq!(expected::<i32>(ReduceOp::Max, 3, 0), 4);
        assert_eq!(expected::<i32>(ReduceOp::Avg, 3, 0), 2);
        assert_eq!(expected::<f32>(ReduceOp::Avg, 3, 0), 8.0 / 3.0);
        // Element 0 bitwise inputs over 3 ranks: 90, 0, 37.
        assert_eq!(expected::<u8>(ReduceOp::BAnd, 3, 0), 0);
        assert_eq!(expected::<i8>(ReduceOp::BOr, 3, 0), 90 | 37);
        assert_eq!(expected::<i64>(ReduceOp::BXor, 2, 0), 90);
        assert_eq!(expected::<u32>(ReduceOp::BAnd, 1, 0), 90);
        let mut b = vec![0u8; 12];
        fill_bytes(DataType::F32, &mut b, ReduceOp::Sum, 0);
        assert_eq!(count_wrong_bytes(DataType::F32, &b, ReduceOp::Sum, 1), 0);
        assert_eq!(count_wrong_bytes(DataType::F32, &b, ReduceOp::Sum, 2), 3);
    }
}
