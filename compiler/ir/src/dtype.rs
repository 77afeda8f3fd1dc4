//! Element types of IR values.

use std::fmt;

/// The element type of a tensor value.
///
/// Quantized types arrive with the quantization work; the float and integer
/// types here are the ones ONNX models use for activations, weights and
/// shape arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE 754 binary64.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Boolean, one byte per element (0 or 1).
    Bool,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// 8-bit float, 4 exponent and 3 mantissa bits, no infinity
    /// (`FLOAT8E4M3FN`). This and the types below are storage types of one
    /// code per byte: see [`crate::narrow`].
    F8E4M3FN,
    /// 8-bit float like `f8e4m3fn` with bias 8, no `-0`, NaN = `0x80`.
    F8E4M3FNUZ,
    /// 8-bit float, 5 exponent and 2 mantissa bits, IEEE specials.
    F8E5M2,
    /// 8-bit float like `f8e5m2` with bias 16, no infinity, no `-0`.
    F8E5M2FNUZ,
    /// 4-bit float, 2 exponent and 1 mantissa bit (`FLOAT4E2M1`).
    F4E2M1,
    /// Signed 4-bit integer.
    I4,
    /// Unsigned 4-bit integer.
    U4,
    /// Signed 2-bit integer.
    I2,
    /// Unsigned 2-bit integer.
    U2,
}

impl DType {
    /// Every type, in a fixed order (used by the text parser and tests).
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::Bool,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
    ];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F4E2M1
            | DType::I4
            | DType::U4
            | DType::I2
            | DType::U2 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// Whether the type is a (signed or unsigned) integer type.
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::U8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U16
                | DType::U32
                | DType::U64
        )
    }

    /// Whether the type is an unsigned integer type (`u8` to `u64`).
    pub fn is_unsigned(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64)
    }

    /// The short name used in the text format (`f32`, `i64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F8E4M3FN => "f8e4m3fn",
            DType::F8E4M3FNUZ => "f8e4m3fnuz",
            DType::F8E5M2 => "f8e5m2",
            DType::F8E5M2FNUZ => "f8e5m2fnuz",
            DType::F4E2M1 => "f4e2m1",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::I2 => "i2",
            DType::U2 => "u2",
        }
    }

    /// Whether the type is a storage-only type of one code per byte
    /// (the 8- and 4-bit floats, the 4- and 2-bit integers: see
    /// [`crate::narrow`]). Such types are neither [`DType::is_float`] nor
    /// [`DType::is_int`].
    pub fn is_narrow(self) -> bool {
        crate::narrow::is_narrow(self)
    }

    /// Parses a name produced by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
