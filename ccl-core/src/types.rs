//! Element types and reduction operators.
//!
//! The numeric values of [`DataType`] and [`ReduceOp`] match NCCL's `ncclDataType_t` and
//! `ncclRedOp_t`, so the C ABI can pass them through unchanged and code written for NCCL ports by
//! renaming.

use std::fmt;
use std::str::FromStr;

use half::{bf16, f16};

/// The element type of a buffer taking part in a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
}

impl DataType {
    /// Every data type, in NCCL's numbering order.
    pub const ALL: [DataType; 10] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    /// Whether the type is a floating-point type (NaN, signed zero, rounding apply).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16
        )
    }

    /// The short name used by the benchmark and the logs (nccl-tests spelling).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
        }
    }

    /// Decodes NCCL's numeric value.
    pub fn from_u8(v: u8) -> Option<DataType> {
        DataType::ALL.get(v as usize).copied()
    }

    /// Number of bytes of `count` elements, or `None` when that overflows `usize`.
    pub fn bytes_for(self, count: usize) -> Option<usize> {
        count.checked_mul(self.size())
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = String;

    /// Accepts nccl-tests names (`float`, `half`, `bfloat16`, ...) and Rust names (`f32`, `u8`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" | "fp16" => DataType::F16,
            "float" | "f32" | "float32" | "fp32" => DataType::F32,
            "double" | "f64" | "float64" | "fp64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            _ => {
                return Err(format!(
                    "unknown data type '{s}' (expected one of int8 uint8 int32 uint32 int64 uint64 half float double bfloat16)"
                ));
            }
        };
        Ok(t)
    }
}

/// A reduction operator.
///
/// Semantics, identical on every rank:
/// - `Sum` and `Prod` wrap on integer overflow (two's complement), like NCCL.
/// - `Min` and `Max` on floats follow IEEE 754-2019 `minimum`/`maximum`: a NaN operand gives NaN
///   (always the canonical quiet NaN, so the result bytes do not depend on which operand was NaN)
///   and `-0.0` orders below `+0.0`.
/// - `Avg` is the sum divided by the number of ranks. Floats divide in the element type (f16 and
///   bf16 through f32). Integers take the wrapping sum and divide with truncation toward zero, as C
///   integer division does; so `Avg` of `[1, 2]` over two ranks is `1`, and a sum that wrapped
///   gives the wrapped value divided.
/// - `BAnd`, `BOr` and `BXor` are bitwise and, or and exclusive or, for integer types only (as
///   in PyTorch's `ReduceOp.BAND`/`BOR`/`BXOR`); a float buffer is refused with an error (see
///   [`ReduceOp::check`]). NCCL has no bitwise operators, so they are numbered after `Avg`: the
///   number travels in operation headers, and the first five keep NCCL's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
    BAnd = 5,
    BOr = 6,
    BXor = 7,
}

impl ReduceOp {
    /// Every operator, in numbering order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
        ReduceOp::BAnd,
        ReduceOp::BOr,
        ReduceOp::BXor,
    ];

    /// The operators defined for every data type (NCCL's five).
    pub const ARITHMETIC: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The nccl-tests spelling (`band`, `bor`, `bxor` for the bitwise operators).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
            ReduceOp::BAnd => "band",
            ReduceOp::BOr => "bor",
            ReduceOp::BXor => "bxor",
        }
    }

    /// Whether this is one of the bitwise operators.
    pub const fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor)
    }

    /// Whether the operator is defined for `dtype`: the bitwise ones are not for floats.
    pub const fn supports(self, dtype: DataType) -> bool {
        !(self.is_bitwise() && dtype.is_float())
    }

    /// An invalid-argument error when the operator is not defined for `dtype`; every entry point
    /// that takes an operator and a type checks this before any byte moves.
    pub fn check(self, dtype: DataType) -> crate::Result<()> {
        if self.supports(dtype) {
            return Ok(());
        }
        Err(crate::Error::invalid_argument(format!(
            "reduce op {self} is bitwise and defined for integer types only, not {dtype}"
        )))
    }

    /// Decodes NCCL's numeric value.
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }

    /// The operator applied while combining partial results: `Avg` combines as `Sum` and divides
    /// once at the end.
    pub const fn combiner(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sum" => Ok(ReduceOp::Sum),
            "prod" => Ok(ReduceOp::Prod),
            "max" => Ok(ReduceOp::Max),
            "min" => Ok(ReduceOp::Min),
            "avg" | "mean" => Ok(ReduceOp::Avg),
            "band" => Ok(ReduceOp::BAnd),
            "bor" => Ok(ReduceOp::BOr),
            "bxor" => Ok(ReduceOp::BXor),
            _ => Err(format!(
                "unknown reduce op '{s}' (expected one of sum prod max min avg band bor bxor)"
            )),
        }
    }
}

/// A Rust type that can take part in a collective.
///
/// Implemented for the ten types of [`DataType`]; `bytemuck::Pod` lets buffers be viewed as bytes
/// without copying.
pub trait Element: bytemuck::Pod + Send + Sync + PartialEq + fmt::Debug + 'static {
    /// The matching runtime type tag.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: DataType = DataType::$d; })*
    };
}

element! {
    i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    f16 => F16, f32 => F32, f64 => F64, bf16 => Bf16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_matches_nccl() {
        // ncclInt8=0 ... ncclBfloat16=9; ncclSum=0, ncclProd=1, ncclMax=2, ncclMin=3, ncclAvg=4;
        // the bitwise operators follow.
        for (i, d) in DataType::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i);
            assert_eq!(DataType::from_u8(i as u8), Some(*d));
        }
        assert_eq!(DataType::from_u8(10), None);
        for (i, o) in ReduceOp::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i);
            assert_eq!(ReduceOp::from_u8(i as u8), Some(*o));
        }
        assert_eq!(ReduceOp::from_u8(8), None);
        assert_eq!(ReduceOp::BXor as u8, 7);
        assert_eq!(ReduceOp::ARITHMETIC, ReduceOp::ALL[..5]);
    }

    #[test]
    fn names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(d.name().parse::<DataType>().unwrap(), d);
        }
        for o in ReduceOp::ALL {
            assert_eq!(o.name().parse::<ReduceOp>().unwrap(), o);
        }
        assert!(
            "float128"
                .parse::<DataType>()
                .unwrap_err()
                .contains("float128")
        );
        assert!("xor".parse::<ReduceOp>().unwrap_err().contains("xor"));
    }

    #[test]
    fn bitwise_ops_refuse_floats() {
        for op in ReduceOp::ALL {
            for d in DataType::ALL {
                let ok = !(op.is_bitwise() && d.is_float());
                assert_eq!(op.supports(d), ok, "{op} {d}");
                assert_eq!(op.check(d).is_ok(), ok, "{op} {d}");
            }
        }
        let e = ReduceOp::BXor.check(DataType::Bf16).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidArgument);
        assert!(
            e.to_string().contains("bxor") && e.to_string().contains("bfloat16"),
            "{e}"
        );
    }

    #[test]
    fn sizes_and_overflow() {
        assert_eq!(DataType::F64.bytes_for(3), Some(24));
        assert_eq!(DataType::Bf16.size(), std::mem::size_of::<bf16>());
        assert_eq!(DataType::F16.size(), std::mem::size_of::<f16>());
        assert_eq!(DataType::U64.bytes_for(usize::MAX / 4), None);
        assert_eq!(<f32 as Element>::DTYPE, DataType::F32);
    }
}
