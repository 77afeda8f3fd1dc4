//! Element types of tensors in an artifact.

use std::fmt;

/// Element type of a tensor; the on-disk code is the `u8` discriminant.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
}

impl DType {
    /// Every dtype, in code order.
    pub const ALL: [DType; 13] = [
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
    ];

    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
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
        assert_eq!(DType::from_u8(14), None);
        // Codes are on-disk: never renumbered.
        assert_eq!(DType::U8 as u8, 6);
        assert_eq!(DType::Bool as u8, 10);
        assert_eq!(DType::U64 as u8, 13);
    }
}
