//! Element types: the one vocabulary of the compiler's IR (`kiln_ir::DType`
//! re-exports this type) and of the artifact.

use std::fmt;

/// Element type of a tensor; the on-disk code is the `u8` discriminant, and
/// the order (`Ord`) is the code order.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 1,
    /// IEEE 754 binary16.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// IEEE 754 binary64.
    F64 = 4,
    /// Signed 8-bit integer.
    I8 = 5,
    /// Unsigned 8-bit integer.
    U8 = 6,
    /// Signed 16-bit integer.
    I16 = 7,
    /// Signed 32-bit integer.
    I32 = 8,
    /// Signed 64-bit integer.
    I64 = 9,
    /// Boolean, one byte per element (0 or 1).
    Bool = 10,
    /// Unsigned 16-bit integer.
    U16 = 11,
    /// Unsigned 32-bit integer.
    U32 = 12,
    /// Unsigned 64-bit integer.
    U64 = 13,
    /// 8-bit float e4m3 without infinity (ONNX `FLOAT8E4M3FN`). This and
    /// the types below hold one element per byte, its code in the low bits
    /// (ONNX packs the 4- and 2-bit types two and four to a byte; Kiln's
    /// tensors do not); a kernel reads only those bits.
    F8E4M3FN = 14,
    /// 8-bit float e4m3, bias 8, no `-0` (`FLOAT8E4M3FNUZ`).
    F8E4M3FNUZ = 15,
    /// 8-bit float e5m2 (`FLOAT8E5M2`).
    F8E5M2 = 16,
    /// 8-bit float e5m2, bias 16, no `-0` (`FLOAT8E5M2FNUZ`).
    F8E5M2FNUZ = 17,
    /// 4-bit float e2m1 (`FLOAT4E2M1`).
    F4E2M1 = 18,
    /// Signed 4-bit integer.
    I4 = 19,
    /// Unsigned 4-bit integer.
    U4 = 20,
    /// Signed 2-bit integer.
    I2 = 21,
    /// Unsigned 2-bit integer.
    U2 = 22,
}

impl DType {
    /// Every dtype, in code order.
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

    /// Whether the type is a (signed or unsigned) integer type of 8 bits or
    /// more.
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

    /// Whether the type is a storage-only type of one code per byte (the 8-
    /// and 4-bit floats, the 4- and 2-bit integers; the compiler's
    /// `kiln_ir::narrow` converts them). Such types are neither
    /// [`DType::is_float`] nor [`DType::is_int`].
    pub fn is_narrow(self) -> bool {
        matches!(
            self,
            DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F4E2M1
                | DType::I4
                | DType::U4
                | DType::I2
                | DType::U2
        )
    }

    /// Lower-case name as used in messages and the IR text format (`"f32"`).
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

    /// The dtype with on-disk code `code`, if there is one.
    pub fn from_u8(code: u8) -> Option<DType> {
        DType::ALL.into_iter().find(|d| *d as u8 == code)
    }

    /// The dtype called `name` (as returned by [`DType::name`]).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_u8(d as u8), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(d.to_string(), d.name());
        }
        assert_eq!(DType::from_u8(0), None);
        assert_eq!(DType::from_u8(23), None);
        // Codes are on-disk: never renumbered.
        assert_eq!(DType::U8 as u8, 6);
        assert_eq!(DType::Bool as u8, 10);
        assert_eq!(DType::U64 as u8, 13);
        assert_eq!(DType::U2 as u8, 22);
    }

    #[test]
    fn every_type_is_exactly_one_kind() {
        for d in DType::ALL {
            let kinds = [d.is_float(), d.is_int(), d.is_narrow(), d == DType::Bool];
            assert_eq!(kinds.iter().filter(|&&k| k).count(), 1, "{d}");
            assert!(!d.is_unsigned() || d.is_int(), "{d}");
        }
        assert!(
            DType::ALL.windows(2).all(|w| w[0] < w[1]),
            "ALL is in code order"
        );
    }
}
