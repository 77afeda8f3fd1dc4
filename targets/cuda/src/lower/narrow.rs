//! Casts from and to the narrow storage types (`kiln_ir::narrow`: the 8-
//! and 4-bit floats, the 4- and 2-bit integers), one code per byte.
//!
//! Kernels move codes as bytes (loaded into a `u32`, stored with
//! `st.u8`), so copies, transposes, slices, concatenations and gathers
//! keep every code, NaN payloads included. Only `Cast` converts: these
//! functions are the evaluator's rules (`kiln_ir::narrow::{decode,
//! encode}`) and the CPU target's (`targets/cpu/src/lower/narrow.rs`) on
//! the f32 bits in integer instructions, so every SM computes the same
//! codes (the hardware f8 conversions of sm_89+ saturate differently).

use kiln_ir::narrow::{int_format, int_range, FloatFormat, Specials};
use kiln_ir::DType;

use crate::ptx::{fimm, Bin, Cmp, KernelBuilder, Opnd, Reg, Ty};

/// The type a narrow code converts through: f32 for the small floats,
/// s64 for the small integers.
pub(crate) fn value_ty(d: DType) -> Option<Ty> {
    if FloatFormat::of(d).is_some() {
        Some(Ty::F32)
    } else if int_format(d).is_some() {
        Some(Ty::S64)
    } else {
        None
    }
}

/// The value of code `c` (a `u32`) of narrow type `d`: f32 for the float
/// types (exact), s64 for the integer types.
pub(crate) fn decode(kb: &mut KernelBuilder, c: Reg, d: DType) -> Reg {
    if let Some((bits, signed)) = int_format(d) {
        let wide = kb.cvt(Ty::U64, "", c);
        let wide = kb.bitcast(Ty::S64, wide);
        let up = kb.bin(Bin::Shl, wide, 64 - bits);
        // `shr.s64` sign-fills, `shr.u64` zero-fills.
        return if signed {
            kb.bin(Bin::Shr, up, 64 - bits)
        } else {
            let u = kb.bitcast(Ty::U64, up);
            let v = kb.bin(Bin::Shr, u, 64 - bits);
            kb.bitcast(Ty::S64, v)
        };
    }
    let f = FloatFormat::of(d).expect("a narrow float type");
    let sign_bit = f.sign_bit();
    let c = kb.bin(Bin::And, c, sign_bit * 2 - 1);
    let mag = kb.bin(Bin::And, c, sign_bit - 1);
    let exp = kb.bin(Bin::Shr, mag, f.man_bits);
    let man = kb.bin(Bin::And, mag, (1u32 << f.man_bits) - 1);
    // Subnormal (exponent field 0): man · 2^(1 − bias − m); else
    // (man + 2^m) · 2^(exp − bias − m).
    let is_sub = kb.setp(Cmp::Eq, exp, 0u32);
    let implicit = kb.bin(Bin::Or, man, 1u32 << f.man_bits);
    let significand = kb.selp(Ty::U32, is_sub, man, implicit);
    let e = kb.bin(Bin::Max, exp, 1u32);
    let biased = kb.bin(
        Bin::Add,
        e,
        Opnd::I(127 - f.bias as i64 - f.man_bits as i64),
    );
    let p2 = kb.bin(Bin::Shl, biased, 23u32);
    let p2 = kb.bitcast(Ty::F32, p2);
    let s = kb.cvt(Ty::F32, "rn", significand);
    let mut v = kb.bin(Bin::Mul, s, p2);
    let all_ones = (1u32 << f.exp_bits) - 1;
    let nan = fimm(Ty::F32, f64::NAN);
    match f.specials {
        Specials::Ieee => {
            let top = kb.setp(Cmp::Eq, exp, all_ones);
            let no_man = kb.setp(Cmp::Eq, man, 0u32);
            let special = kb.selp(Ty::F32, no_man, fimm(Ty::F32, f64::INFINITY), nan);
            v = kb.selp(Ty::F32, top, special, v);
        }
        Specials::NanAllOnes => {
            let is_nan = kb.setp(Cmp::Eq, mag, sign_bit - 1);
            v = kb.selp(Ty::F32, is_nan, nan, v);
        }
        Specials::Fnuz => {
            let is_nan = kb.setp(Cmp::Eq, c, sign_bit);
            v = kb.selp(Ty::F32, is_nan, nan, v);
        }
        Specials::Finite => {}
    }
    // The sign goes onto the bits, so that -0 and -NaN come out too.
    let neg = kb.bin(Bin::And, c, sign_bit);
    let neg = kb.bin(Bin::Shl, neg, 31 - (f.exp_bits + f.man_bits));
    let bits = kb.bitcast(Ty::U32, v);
    let bits = kb.bin(Bin::Or, bits, neg);
    kb.bitcast(Ty::F32, bits)
}

/// The code (a `u32`) in narrow float type `d` of the f32 `x`.
pub(crate) fn encode_float(kb: &mut KernelBuilder, x: Reg, d: DType) -> Reg {
    let f = FloatFormat::of(d).expect("a narrow float type");
    let sign_bit = f.sign_bit();
    let bits = kb.bitcast(Ty::U32, x);
    let sign = kb.bin(Bin::Shr, bits, 31u32);
    let sign = kb.bin(Bin::Shl, sign, f.exp_bits + f.man_bits);
    let a_bits = kb.bin(Bin::And, bits, 0x7fff_ffffu32);
    let a = kb.bitcast(Ty::F32, a_bits);
    // Below the smallest normal: the nearest (even) multiple of the
    // smallest subnormal.
    let scale = 2f64.powi(f.man_bits as i32 - f.min_exp());
    let q = kb.bin(Bin::Mul, a, fimm(Ty::F32, scale));
    let q = kb.cvt(Ty::F32, "rni", q);
    let sub_mag = kb.cvt(Ty::U32, "rzi", q);
    // Normal: round the significand to nearest even, then re-bias (a carry
    // moves into the exponent; infinity and large values land above the
    // largest code and saturate below).
    let shift = 23 - f.man_bits;
    let odd = kb.bin(Bin::Shr, a_bits, shift);
    let odd = kb.bin(Bin::And, odd, 1u32);
    let rounded = kb.bin(Bin::Add, a_bits, (1u32 << (shift - 1)) - 1);
    let rounded = kb.bin(Bin::Add, rounded, odd);
    let norm = kb.bin(Bin::Shr, rounded, shift);
    let rebias = ((127 - f.bias) as u32) << f.man_bits;
    let norm_mag = kb.bin(Bin::Sub, norm, rebias);
    let is_sub = kb.setp(Cmp::Lt, a, fimm(Ty::F32, 2f64.powi(f.min_exp())));
    let mag = kb.selp(Ty::U32, is_sub, sub_mag, norm_mag);
    let mag = kb.bin(Bin::Min, mag, f.max);
    let mut code = kb.bin(Bin::Or, sign, mag);
    if f.specials == Specials::Fnuz {
        // No -0: a zero magnitude is code 0 whatever the sign.
        let zero = kb.setp(Cmp::Eq, mag, 0u32);
        code = kb.selp(Ty::U32, zero, 0u32, code);
    }
    let nan_code = match f.specials {
        Specials::NanAllOnes | Specials::Ieee => kb.bin(Bin::Or, sign, sign_bit - 1),
        Specials::Fnuz | Specials::Finite => kb.mov(Ty::U32, f.nan_code(0)),
    };
    let is_nan = kb.is_nan(x, x);
    kb.selp(Ty::U32, is_nan, nan_code, code)
}

/// The code in narrow integer type `d` of `v` (an s64): its low bits.
/// `from_float`: `v` is a float truncated toward zero, and one outside
/// `d`'s range (or NaN, which the truncation made 0) gives 0, as the
/// evaluator does.
pub(crate) fn encode_int(kb: &mut KernelBuilder, v: Reg, d: DType, from_float: bool) -> Reg {
    let (bits, _) = int_format(d).expect("a narrow integer type");
    let (lo, hi) = int_range(d).expect("a narrow integer type");
    let v = if from_float {
        let below = kb.setp(Cmp::Lt, v, Opnd::I(lo));
        let above = kb.setp(Cmp::Gt, v, Opnd::I(hi));
        let out = kb.pred_op("or", below, above);
        kb.selp(Ty::S64, out, Opnd::I(0), v)
    } else {
        v
    };
    let low = kb.bin(Bin::And, v, Opnd::I((1i64 << bits) - 1));
    kb.cvt(Ty::U32, "", low)
}
