//! Casts from and to the narrow storage types (`kiln_ir::narrow`: the 8-
//! and 4-bit floats, the 4- and 2-bit integers), one code per byte, in
//! scalar Cranelift code. The rules are the evaluator's
//! (`kiln_ir::narrow::{decode, encode}`), computed on the f32 bits:
//! decoding builds `significand · 2^(exponent − bias − mantissa bits)`
//! from the code's fields, encoding rounds the f32 significand to nearest
//! even (or, below the smallest normal, the multiple of the smallest
//! subnormal with `nearest`) and saturates.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, I32, I64, I8};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use kiln_ir::narrow::{int_format, int_range, FloatFormat, Specials};
use kiln_ir::DType;

use super::Kb;

fn flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
}

fn i32const(kb: &mut Kb, v: i64) -> Value {
    kb.b.ins().iconst(I32, v)
}

/// The value of the code `x` (an `I8`) of narrow type `d`: an f32 for the
/// float types, an i64 for the integer types.
pub(crate) fn decode(kb: &mut Kb, x: Value, d: DType) -> Value {
    let c = kb.b.ins().uextend(I32, x);
    if let Some((bits, signed)) = int_format(d) {
        // Shift the code's bits to the top of the byte and back.
        let up = kb.b.ins().ishl_imm_u(x, 8 - bits as i64);
        let v = if signed {
            kb.b.ins().sshr_imm_s(up, 8 - bits as i64)
        } else {
            kb.b.ins().ushr_imm_u(up, 8 - bits as i64)
        };
        return if signed {
            kb.b.ins().sextend(I64, v)
        } else {
            kb.b.ins().uextend(I64, v)
        };
    }
    let f = FloatFormat::of(d).expect("a narrow float type");
    let sign_bit = f.sign_bit() as i64;
    let c = kb.b.ins().band_imm_u(c, sign_bit * 2 - 1);
    let mag = kb.b.ins().band_imm_u(c, sign_bit - 1);
    let exp = kb.b.ins().ushr_imm_u(mag, f.man_bits as i64);
    let man = kb.b.ins().band_imm_u(mag, (1 << f.man_bits) - 1);
    // Subnormal (exponent field 0): man · 2^(1 − bias − m); else
    // (man + 2^m) · 2^(exp − bias − m).
    let is_sub = kb.b.ins().icmp_imm_u(IntCC::Equal, exp, 0);
    let implicit = kb.b.ins().bor_imm_u(man, 1 << f.man_bits);
    let significand = kb.b.ins().select(is_sub, man, implicit);
    let one = i32const(kb, 1);
    let e = kb.b.ins().umax(exp, one);
    let biased =
        kb.b.ins()
            .iadd_imm_s(e, 127 - f.bias as i64 - f.man_bits as i64);
    let p2 = kb.b.ins().ishl_imm_u(biased, 23);
    let p2 = kb.b.ins().bitcast(F32, flags(), p2);
    let s = kb.b.ins().fcvt_from_uint(F32, significand);
    let mut v = kb.b.ins().fmul(s, p2);
    let all_ones = (1i64 << f.exp_bits) - 1;
    let nan = kb.fconst(F32, f64::NAN);
    match f.specials {
        Specials::Ieee => {
            let top = kb.b.ins().icmp_imm_u(IntCC::Equal, exp, all_ones);
            let no_man = kb.b.ins().icmp_imm_u(IntCC::Equal, man, 0);
            let inf = kb.fconst(F32, f64::INFINITY);
            let special = kb.b.ins().select(no_man, inf, nan);
            v = kb.b.ins().select(top, special, v);
        }
        Specials::NanAllOnes => {
            let is_nan = kb.b.ins().icmp_imm_u(IntCC::Equal, mag, sign_bit - 1);
            v = kb.b.ins().select(is_nan, nan, v);
        }
        Specials::Fnuz => {
            let is_nan = kb.b.ins().icmp_imm_u(IntCC::Equal, c, sign_bit);
            v = kb.b.ins().select(is_nan, nan, v);
        }
        Specials::Finite => {}
    }
    // The sign goes onto the bits, so that -0 and -NaN come out too.
    let neg = kb.b.ins().band_imm_u(c, sign_bit);
    let shift = 31 - (f.exp_bits + f.man_bits) as i64;
    let neg = kb.b.ins().ishl_imm_u(neg, shift);
    let bits = kb.b.ins().bitcast(I32, flags(), v);
    let bits = kb.b.ins().bor(bits, neg);
    kb.b.ins().bitcast(F32, flags(), bits)
}

/// The code (an `I8`) of f32 `x` in narrow float type `d`, or of an f32 or
/// i64 value in a narrow integer type (`is_int`: `x` is an i64).
pub(crate) fn encode(kb: &mut Kb, x: Value, d: DType, is_int: bool) -> Value {
    if let (Some((bits, _)), Some((lo, hi))) = (int_format(d), int_range(d)) {
        let v = if is_int {
            x
        } else {
            // Truncation, then 0 for NaN (the saturating conversion's 0)
            // and for values outside the type's range.
            let t = kb.b.ins().fcvt_to_sint_sat(I64, x);
            let below = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, t, lo);
            let above = kb.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, t, hi);
            let out = kb.b.ins().bor(below, above);
            let zero = kb.iconst(0);
            kb.b.ins().select(out, zero, t)
        };
        let v = kb.b.ins().band_imm_u(v, (1 << bits) - 1);
        return kb.b.ins().ireduce(I8, v);
    }
    let f = FloatFormat::of(d).expect("a narrow float type");
    let x = if is_int {
        kb.b.ins().fcvt_from_sint(F32, x)
    } else {
        x
    };
    let sign_bit = f.sign_bit() as i64;
    let bits = kb.b.ins().bitcast(I32, flags(), x);
    let sign = kb.b.ins().ushr_imm_u(bits, 31);
    let sign =
        kb.b.ins()
            .ishl_imm_u(sign, (f.exp_bits + f.man_bits) as i64);
    let a_bits = kb.b.ins().band_imm_u(bits, 0x7fff_ffff);
    let a = kb.b.ins().bitcast(F32, flags(), a_bits);
    // Below the smallest normal: the nearest (even) multiple of the
    // smallest subnormal.
    let scale = kb.fconst(F32, 2f64.powi(f.man_bits as i32 - f.min_exp()));
    let q = kb.b.ins().fmul(a, scale);
    let q = kb.b.ins().nearest(q);
    let sub_mag = kb.b.ins().fcvt_to_uint_sat(I32, q);
    // Normal: round the significand to nearest even, then re-bias (a carry
    // moves into the exponent; infinity and large values land above the
    // largest code and saturate below).
    let shift = 23 - f.man_bits as i64;
    let odd = kb.b.ins().ushr_imm_u(a_bits, shift);
    let odd = kb.b.ins().band_imm_u(odd, 1);
    let rounded = kb.b.ins().iadd_imm_s(a_bits, (1 << (shift - 1)) - 1);
    let rounded = kb.b.ins().iadd(rounded, odd);
    let norm = kb.b.ins().ushr_imm_u(rounded, shift);
    let rebias = ((127 - f.bias) as i64) << f.man_bits;
    let norm_mag = kb.b.ins().iadd_imm_s(norm, -rebias);
    let smallest_normal = kb.fconst(F32, 2f64.powi(f.min_exp()));
    let is_sub = kb.b.ins().fcmp(FloatCC::LessThan, a, smallest_normal);
    let mag = kb.b.ins().select(is_sub, sub_mag, norm_mag);
    let max = i32const(kb, f.max as i64);
    let mag = kb.b.ins().umin(mag, max);
    let mut code = kb.b.ins().bor(sign, mag);
    if f.specials == Specials::Fnuz {
        // No -0: a zero magnitude is code 0 whatever the sign.
        let zero = kb.b.ins().icmp_imm_u(IntCC::Equal, mag, 0);
        code = kb.b.ins().select(zero, mag, code);
    }
    let nan_code = match f.specials {
        Specials::NanAllOnes | Specials::Ieee => kb.b.ins().bor_imm_u(sign, sign_bit - 1),
        Specials::Fnuz | Specials::Finite => i32const(kb, f.nan_code(0) as i64),
    };
    let is_nan = kb.b.ins().fcmp(FloatCC::Unordered, x, x);
    let code = kb.b.ins().select(is_nan, nan_code, code);
    kb.b.ins().ireduce(I8, code)
}
