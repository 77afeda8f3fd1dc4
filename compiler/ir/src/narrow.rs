//! Element types narrower than a byte or than f16: the 8-bit floats
//! (`f8e4m3fn`, `f8e4m3fnuz`, `f8e5m2`, `f8e5m2fnuz`), the 4-bit float
//! `f4e2m1` and the 4- and 2-bit integers (`i4`, `u4`, `i2`, `u2`).
//!
//! They are storage types: Kiln holds one element per byte (its code in
//! the low bits; ONNX packs the 4- and 2-bit types two and four to a byte,
//! and the frontend unpacks them), moves them like bytes, and converts them
//! with Cast, QuantizeLinear and DequantizeLinear. Arithmetic on them is
//! refused by type inference, as in ONNX, where only those ops take them.
//!
//! Conversions follow the ONNX specification and the reference data of
//! its backend tests: to a float type, round to nearest even and saturate
//! to the largest finite value (infinities included); NaN to the type's
//! NaN (`f4e2m1` has none and its tests expect `-0`); the `fnuz` types
//! have no `-0`. To an integer type from a float: truncation toward zero,
//! and 0 for NaN and out-of-range values (undefined in the specification;
//! what its reference implementation gives); from an integer: the low
//! bits, as for every integer narrowing.

use crate::DType;

/// How a small float type encodes its special values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Specials {
    /// Infinities and NaNs as in IEEE 754 (`f8e5m2`).
    Ieee,
    /// No infinity; NaN is the all-ones magnitude (`f8e4m3fn`).
    NanAllOnes,
    /// No infinity, no `-0`; NaN is the code of `-0` (`fnuz`).
    Fnuz,
    /// No infinity, no NaN (`f4e2m1`).
    Finite,
}

/// The layout of a small float type.
#[derive(Clone, Copy, Debug)]
pub struct FloatFormat {
    /// Exponent bits.
    pub exp_bits: u32,
    /// Mantissa bits.
    pub man_bits: u32,
    /// Exponent bias.
    pub bias: i32,
    /// The special values.
    pub specials: Specials,
    /// The largest finite magnitude's code (sign bit clear).
    pub max: u32,
}

impl FloatFormat {
    /// The format of `dtype`, if it is a small float type.
    pub fn of(dtype: DType) -> Option<FloatFormat> {
        let (exp_bits, man_bits, bias, specials, max) = match dtype {
            DType::F8E4M3FN => (4, 3, 7, Specials::NanAllOnes, 0x7e),
            DType::F8E4M3FNUZ => (4, 3, 8, Specials::Fnuz, 0x7f),
            DType::F8E5M2 => (5, 2, 15, Specials::Ieee, 0x7b),
            DType::F8E5M2FNUZ => (5, 2, 16, Specials::Fnuz, 0x7f),
            DType::F4E2M1 => (2, 1, 1, Specials::Finite, 0x7),
            _ => return None,
        };
        Some(FloatFormat {
            exp_bits,
            man_bits,
            bias,
            specials,
            max,
        })
    }

    /// The sign bit of a code.
    pub fn sign_bit(self) -> u32 {
        1 << (self.exp_bits + self.man_bits)
    }

    /// The exponent of the smallest normal value.
    pub fn min_exp(self) -> i32 {
        1 - self.bias
    }

    /// The code of NaN with sign bit `sign` (0 or [`Self::sign_bit`]):
    /// `f4e2m1` has no NaN and gives `-0`, as the ONNX reference does.
    pub fn nan_code(self, sign: u32) -> u32 {
        match self.specials {
            Specials::Fnuz | Specials::Finite => self.sign_bit(),
            Specials::NanAllOnes | Specials::Ieee => sign | (self.sign_bit() - 1),
        }
    }

    fn decode(self, code: u8) -> f32 {
        let code = code as u32 & (self.sign_bit() * 2 - 1);
        let negative = code & self.sign_bit() != 0;
        let mag = code & (self.sign_bit() - 1);
        let exp = mag >> self.man_bits;
        let man = mag & ((1 << self.man_bits) - 1);
        let all_ones = (1 << self.exp_bits) - 1;
        let special = match self.specials {
            Specials::Fnuz if code == self.sign_bit() => Some(f32::NAN),
            Specials::NanAllOnes if mag == self.sign_bit() - 1 => Some(f32::NAN),
            Specials::Ieee if exp == all_ones && man == 0 => Some(f32::INFINITY),
            Specials::Ieee if exp == all_ones => Some(f32::NAN),
            _ => None,
        };
        let value = special.unwrap_or_else(|| {
            let (significand, exp) = if exp == 0 {
                (man, 1)
            } else {
                (man | 1 << self.man_bits, exp as i32)
            };
            significand as f32 * (2f32).powi(exp - self.bias - self.man_bits as i32)
        });
        if negative {
            -value
        } else {
            value
        }
    }

    fn encode(self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        if x.is_nan() {
            return self.nan_code(sign) as u8;
        }
        let a = x.abs();
        let min_exp = self.min_exp();
        let mag = if a.is_infinite() {
            self.max
        } else if a < (2f32).powi(min_exp) {
            // Below the smallest normal: a multiple of the smallest
            // subnormal, rounded to nearest even (exact in f32: the scale
            // is a power of two and the product stays normal or zero).
            let q = (a * (2f32).powi(self.man_bits as i32 - min_exp)).round_ties_even();
            q as u32
        } else {
            // Round the f32 significand to `man_bits` bits, nearest even
            // (a carry moves into the exponent, as it should), then re-bias.
            let bits = a.to_bits();
            let shift = 23 - self.man_bits;
            let rounded = bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1);
            let rebias = ((127 - self.bias) as u32) << self.man_bits;
            (rounded >> shift) - rebias
        };
        let mag = mag.min(self.max);
        if mag == 0 && self.specials == Specials::Fnuz {
            return 0;
        }
        (sign | mag) as u8
    }
}

/// The bit width and signedness of a narrow integer type.
pub fn int_format(dtype: DType) -> Option<(u32, bool)> {
    match dtype {
        DType::I4 => Some((4, true)),
        DType::U4 => Some((4, false)),
        DType::I2 => Some((2, true)),
        DType::U2 => Some((2, false)),
        _ => None,
    }
}

/// Whether `dtype` is one of the narrow integer types (`i4`, `u4`, `i2`,
/// `u2`).
pub fn is_narrow_int(dtype: DType) -> bool {
    int_format(dtype).is_some()
}

/// Whether `dtype` is one of the small float types (the 8- and 4-bit
/// floats).
pub fn is_narrow_float(dtype: DType) -> bool {
    FloatFormat::of(dtype).is_some()
}

/// The smallest and largest value of a narrow integer type.
pub fn int_range(dtype: DType) -> Option<(i64, i64)> {
    let (bits, signed) = int_format(dtype)?;
    Some(if signed {
        (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
    } else {
        (0, (1i64 << bits) - 1)
    })
}

/// The code's bits: every code of `dtype` is below `1 << code_bits`.
pub fn code_bits(dtype: DType) -> Option<u32> {
    match (FloatFormat::of(dtype), int_format(dtype)) {
        (Some(f), _) => Some(1 + f.exp_bits + f.man_bits),
        (_, Some((bits, _))) => Some(bits),
        _ => None,
    }
}

/// The value of `code` as f32 (exact: every value of these types is an
/// f32). Only the code's low [`code_bits`] count.
pub fn decode(dtype: DType, code: u8) -> f32 {
    if let Some(f) = FloatFormat::of(dtype) {
        return f.decode(code);
    }
    decode_int(dtype, code) as f32
}

/// The integer value of `code` for `i4`/`u4`/`i2`/`u2` (others: the value
/// truncated toward zero, saturating).
pub fn decode_int(dtype: DType, code: u8) -> i64 {
    match int_format(dtype) {
        Some((bits, signed)) => {
            let low = (code as i64) & ((1 << bits) - 1);
            if signed && low >= 1 << (bits - 1) {
                low - (1 << bits)
            } else {
                low
            }
        }
        None => decode(dtype, code) as i64,
    }
}

/// The code of `x` in `dtype` (see the module docs for the rounding and
/// the out-of-range rules).
pub fn encode(dtype: DType, x: f32) -> u8 {
    if let Some(f) = FloatFormat::of(dtype) {
        return f.encode(x);
    }
    let Some((lo, hi)) = int_range(dtype) else {
        return 0;
    };
    let t = x.trunc();
    if t.is_nan() || t < lo as f32 || t > hi as f32 {
        return 0;
    }
    encode_int(dtype, t as i64)
}

/// The code of integer `v` in `dtype`: its low bits for the integer types,
/// the rounded value for the float types.
pub fn encode_int(dtype: DType, v: i64) -> u8 {
    match int_format(dtype) {
        Some((bits, _)) => (v & ((1 << bits) - 1)) as u8,
        None => encode(dtype, v as f32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_module_converts_exactly_the_narrow_types() {
        for d in DType::ALL {
            let here = FloatFormat::of(d).is_some() || int_format(d).is_some();
            assert_eq!(here, d.is_narrow(), "{d}");
        }
    }

    const FLOATS: [DType; 5] = [
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
    ];

    #[test]
    fn every_code_round_trips_and_the_limits_are_the_specifications() {
        for dtype in FLOATS {
            let bits = code_bits(dtype).unwrap();
            for code in 0..(1u32 << bits) as u8 {
                let v = decode(dtype, code);
                if v.is_nan() {
                    assert!(
                        decode(dtype, encode(dtype, v)).is_nan(),
                        "{dtype} {code:#x}"
                    );
                    continue;
                }
                let back = encode(dtype, v);
                let fnuz_zero = v == 0.0 && matches!(dtype, DType::F8E4M3FNUZ | DType::F8E5M2FNUZ);
                if !fnuz_zero && !v.is_infinite() {
                    assert_eq!(back, code, "{dtype} {code:#x} = {v}");
                }
            }
        }
        let max = |d| encode(d, f32::INFINITY);
        assert_eq!(decode(DType::F8E4M3FN, max(DType::F8E4M3FN)), 448.0);
        assert_eq!(decode(DType::F8E4M3FNUZ, max(DType::F8E4M3FNUZ)), 240.0);
        assert_eq!(decode(DType::F8E5M2, max(DType::F8E5M2)), 57344.0);
        assert_eq!(decode(DType::F8E5M2FNUZ, max(DType::F8E5M2FNUZ)), 57344.0);
        assert_eq!(decode(DType::F4E2M1, max(DType::F4E2M1)), 6.0);
        // Smallest subnormals.
        assert_eq!(decode(DType::F8E4M3FN, 1), 2f32.powi(-9));
        assert_eq!(decode(DType::F8E5M2, 1), 2f32.powi(-16));
        assert_eq!(decode(DType::F8E5M2FNUZ, 1), 2f32.powi(-17));
        assert_eq!(decode(DType::F4E2M1, 1), 0.5);
        assert!(decode(DType::F8E5M2, 0x7c).is_infinite());
        assert!(decode(DType::F8E4M3FNUZ, 0x80).is_nan());
    }

    #[test]
    fn rounding_is_to_nearest_even_and_saturates() {
        // The ONNX backend tests' values (test_cast_FLOAT_to_*).
        let e4m3 = |x: f32| decode(DType::F8E4M3FN, encode(DType::F8E4M3FN, x));
        assert_eq!(e4m3(0.478_925_47), 0.468_75);
        assert_eq!(e4m3(0.499_684_87), 0.5);
        assert_eq!(e4m3(0.819_105_45), 0.8125);
        assert_eq!(e4m3(1e6), 448.0);
        assert_eq!(e4m3(-1e-7).to_bits(), (-0f32).to_bits());
        let fp4 = |x: f32| decode(DType::F4E2M1, encode(DType::F4E2M1, x));
        let got: Vec<f32> = [0.48, 0.25, 1.05, -3.5, -8.0, 9.0, 0.01]
            .into_iter()
            .map(fp4)
            .collect();
        assert_eq!(got, [0.5, 0.0, 1.0, -4.0, -6.0, 6.0, 0.0]);
        assert_eq!(fp4(f32::NAN).to_bits(), (-0f32).to_bits());
        // Ties: 1.0625 is halfway between 1.0 and 1.125 in e4m3.
        assert_eq!(e4m3(1.0625), 1.0);
        assert_eq!(e4m3(1.1875), 1.25);
        // fnuz has no -0.
        assert_eq!(encode(DType::F8E4M3FNUZ, -0.0), 0);
    }

    #[test]
    fn narrow_integers_truncate_wrap_and_zero_out_of_range_floats() {
        let i4: Vec<i64> = (-9..16)
            .map(|v| decode_int(DType::I4, encode(DType::I4, v as f32)))
            .collect();
        let mut want = vec![0];
        want.extend(-8..8);
        want.extend([0; 8]);
        assert_eq!(i4, want);
        assert_eq!(decode_int(DType::U2, encode(DType::U2, 3.7)), 3);
        assert_eq!(decode_int(DType::I2, encode(DType::I2, -2.0)), -2);
        assert_eq!(decode_int(DType::I2, encode(DType::I2, 2.0)), 0);
        assert_eq!(decode_int(DType::I4, encode_int(DType::I4, 200)), -8);
        assert_eq!(decode_int(DType::U4, encode_int(DType::U4, 17)), 1);
    }
}
