//! Transcendental functions in Cranelift IR.
//!
//! `exp` on f32 (scalar or `f32x4`) is inline: Cody–Waite range reduction
//! `x = n·ln2 + r`, |r| ≤ ln2/2, a degree-5 minimax polynomial for
//! `(e^r - 1 - r)/r²` (Cephes `expf` coefficients, < 1 ulp), and the scale
//! `2^n` applied as two exponent-built factors so results that round to
//! subnormals are exact-rounded once and overflow gives +inf. Other
//! functions call the host `libm` (lane by lane for vectors).

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F64, I32, I32X4, I64};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use kiln_format::HostFn;

use super::Kb;

/// Bit pattern of 1.5·2²³: adding it rounds a float below 2²² to an
/// integer and leaves that integer in the low mantissa bits.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// `ln 2` in two parts for `r = x - n·ln 2`: `n · LN2_HI` is exact in f32
/// for the `n` an f32 exponent allows.
pub(crate) const LN2_HI: f64 = 0.693_359_375;
/// The rest of `ln 2` after [`LN2_HI`].
pub(crate) const LN2_LO: f64 = -2.121_944_4e-4;
/// The minimax polynomial `P` (highest degree first) with
/// `e^r ≈ 1 + r + r²·P(r)` on `|r| ≤ ln 2 / 2`, f32 accuracy.
pub(crate) const EXP_POLY: [f64; 6] = [
    1.987_569_150_0e-4,
    1.398_199_950_7e-3,
    8.333_451_907_3e-3,
    4.166_579_589_4e-2,
    1.666_666_545_9e-1,
    5.000_000_120_1e-1,
];

/// `e^x` for an f32 / f32x4 / f64 value.
pub(crate) fn exp(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    if ty.lane_type() == F64 {
        return kb.call_host_lanes(HostFn::Exp, &[x]);
    }
    let ity = if ty.is_vector() { I32X4 } else { I32 };
    let hi = kb.fconst(ty, EXP_HIGHEST as f64);
    let lo = kb.fconst(ty, -104.0);
    let x = kb.b.ins().fmin(x, hi);
    let x = kb.b.ins().fmax(x, lo);
    // n = round(x / ln 2)
    let log2e = kb.fconst(ty, std::f64::consts::LOG2_E);
    let magic = kb.fconst(ty, ROUND_MAGIC as f64);
    let t = kb.fmadd(x, log2e, magic);
    let n = kb.b.ins().fsub(t, magic);
    // r = x - n ln2 (two parts; n·C1 is exact)
    let c1 = kb.fconst(ty, -LN2_HI);
    let c2 = kb.fconst(ty, -LN2_LO);
    let r = kb.fmadd(n, c1, x);
    let r = kb.fmadd(n, c2, r);
    // p(r) = 1 + r + r² · P(r)
    let coeffs = EXP_POLY;
    let mut p = kb.fconst(ty, coeffs[0]);
    for &c in &coeffs[1..] {
        let cv = kb.fconst(ty, c);
        p = kb.fmadd(p, r, cv);
    }
    let r2 = kb.b.ins().fmul(r, r);
    let one = kb.fconst(ty, 1.0);
    let r1 = kb.b.ins().fadd(r, one);
    let p = kb.fmadd(p, r2, r1);
    // 2^n = 2^n1 · 2^n2 with n1 = n >> 1, n2 = n - n1.
    let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    let tbits = kb.b.ins().bitcast(ity, flags, t);
    let magic_bits = kb.b.ins().iconst(I32, ROUND_MAGIC.to_bits() as i64);
    let magic_bits = kb.splat_to(ity, magic_bits);
    let ni = kb.b.ins().isub(tbits, magic_bits);
    let n1 = kb.b.ins().sshr_imm_s(ni, 1);
    let n2 = kb.b.ins().isub(ni, n1);
    let bias = kb.b.ins().iconst(I32, 127);
    let bias = kb.splat_to(ity, bias);
    let mut out = p;
    for e in [n1, n2] {
        let e = kb.b.ins().iadd(e, bias);
        let e = kb.b.ins().ishl_imm_u(e, 23);
        let s = kb.b.ins().bitcast(ty, flags, e);
        out = kb.b.ins().fmul(out, s);
    }
    out
}

/// Above this `e^x` is +inf in f32 (`e^88.8` > `f32::MAX`): the inputs of
/// the `exp` kernels are clamped to it.
pub(crate) const EXP_HIGHEST: f32 = 88.8;

/// Below this `e^x` leaves the normal f32 range (`e^-87` ≈ 1.6·10⁻³⁸ is
/// still normal).
pub(crate) const EXP_NORMAL_LOWEST: f32 = -87.0;

/// `e^x`, 0 where that is below the normal range: softmax's
/// `exp(x - max)`, where a subnormal changes no probability that matters
/// but producing one costs a microcode assist of about a hundred cycles,
/// and the masked positions of an attention row are most of the row.
pub(crate) fn exp_or_zero(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    // f64's normal range ends at e^-708.
    let bound = if ty.lane_type() == F64 {
        -708.0
    } else {
        EXP_NORMAL_LOWEST as f64
    };
    let lowest = kb.fconst(ty, bound);
    let clamped = kb.b.ins().fmax(x, lowest);
    let e = exp(kb, clamped);
    let zero = kb.fconst(ty, 0.0);
    // `x < lowest` is false for NaN, which stays NaN.
    select_cmp(kb, FloatCC::LessThan, x, lowest, zero, e)
}

/// `tanh(x)`: on f32 (scalar or vector) inline, the rational function
/// [`TANH`]; on f64 the host `tanh`.
pub(crate) fn tanh(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    if ty.lane_type() != F32 {
        return kb.call_host_lanes(HostFn::Tanh, &[x]);
    }
    odd_rational(kb, x, &TANH)
}

/// `r` (≥ 0 or NaN) with the sign bit of `x` or-ed in: `copysign` for
/// non-negative magnitudes, which Cranelift's x86-64 backend has no
/// lowering of for vectors (`fcopysign.f32x4`). f32 and f64, scalar or
/// vector.
pub(crate) fn with_sign_of(kb: &mut Kb, r: Value, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(r);
    let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    let (lane, min) = if ty.lane_type() == F64 {
        (I64, i64::MIN)
    } else {
        (I32, i64::from(i32::MIN))
    };
    let ity = if ty.is_vector() {
        lane.by(ty.lane_count()).expect("a vector of 2 or 4 lanes")
    } else {
        lane
    };
    let xb = kb.b.ins().bitcast(ity, flags, x);
    let sign = kb.b.ins().iconst(lane, min);
    let sign = kb.splat_to(ity, sign);
    let sign = kb.b.ins().band(xb, sign);
    let rb = kb.b.ins().bitcast(ity, flags, r);
    let rb = kb.b.ins().bor(rb, sign);
    kb.b.ins().bitcast(ty, flags, rb)
}

/// `ln(x)` via the host (lane by lane).
pub(crate) fn log(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let f = if ty.lane_type() == F32 {
        HostFn::Logf
    } else {
        HostFn::Log
    };
    kb.call_host_lanes(f, &[x])
}

/// `x^y` via the host (lane by lane).
pub(crate) fn pow(kb: &mut Kb, x: Value, y: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let f = if ty.lane_type() == F32 {
        HostFn::Powf
    } else {
        HostFn::Pow
    };
    kb.call_host_lanes(f, &[x, y])
}

/// `erf(x)` inline on f32/f64 scalars and vectors: the odd/even rational
/// approximation used by Eigen and TensorFlow on [-4, 4] (|error| < 7e-8;
/// outside that range erf is ±1 in f32).
pub(crate) fn erf(kb: &mut Kb, x: Value) -> Value {
    odd_rational(kb, x, &ERF)
}

/// An odd function as `x · N(x²) / D(x²)` on `x` clamped to `±clamp`
/// (where the function is ±1 to f32 precision). The Cranelift kernels
/// ([`odd_rational`]) and the AVX-512/AVX2 store-loop and elementwise
/// steps (`dense::Steps::odd_rational`) evaluate the same one, so both
/// paths give the same values.
pub(crate) struct OddRational {
    pub clamp: f32,
    /// Coefficients of N, highest power first.
    pub numerator: &'static [f64],
    /// Coefficients of D, highest power first.
    pub denominator: &'static [f64],
}

/// `erf` (Eigen's and TensorFlow's coefficients).
pub(crate) const ERF: OddRational = OddRational {
    clamp: 4.0,
    numerator: &[
        -2.726_142_258_013_06e-10,
        2.770_681_424_959_02e-8,
        -2.101_024_020_825_08e-6,
        -5.692_506_394_623_46e-5,
        -7.349_906_303_268_55e-4,
        -2.954_599_808_540_25e-3,
        -1.609_603_332_624_15e-2,
    ],
    denominator: &[
        -1.456_607_184_649_96e-5,
        -2.133_740_552_789_05e-4,
        -1.682_826_974_382_03e-3,
        -7.373_329_167_204_68e-3,
        -1.426_473_905_141_89e-2,
    ],
};

/// `tanh` on f32 (Eigen's `generic_fast_tanh_float` coefficients, as
/// onnxruntime's MLAS uses): within 3.5e-7 relative (6 ulp) of the f64
/// `tanh` over ±12 and down to 1e-30, checked on 4.4 million points
/// (`scripts/check_rational.py`); the clamp gives ±1 beyond ±7.9.
pub(crate) const TANH: OddRational = OddRational {
    clamp: 7.905_311,
    numerator: &[
        -2.760_768_477_423_55e-16,
        2.000_187_904_824_77e-13,
        -8.604_671_522_137_35e-11,
        5.122_297_090_371_14e-8,
        1.485_722_357_179_79e-5,
        6.372_619_288_754_36e-4,
        4.893_524_558_917_86e-3,
    ],
    denominator: &[
        1.198_258_394_667_02e-6,
        1.185_347_056_866_54e-4,
        2.268_434_632_439_00e-3,
        4.893_525_185_543_85e-3,
    ],
};

/// `r` at `x` (see [`OddRational`]); the clamps keep a NaN.
pub(crate) fn odd_rational(kb: &mut Kb, x: Value, r: &OddRational) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let hi = kb.fconst(ty, r.clamp as f64);
    let lo = kb.fconst(ty, -r.clamp as f64);
    let x = kb.b.ins().fmin(x, hi);
    let x = kb.b.ins().fmax(x, lo);
    let x2 = kb.b.ins().fmul(x, x);
    let p = horner(kb, x2, r.numerator);
    let p = kb.b.ins().fmul(x, p);
    let q = horner(kb, x2, r.denominator);
    kb.b.ins().fdiv(p, q)
}

/// `c[0]·z^(n-1) + ... + c[n-1]` by Horner's rule.
fn horner(kb: &mut Kb, z: Value, coeffs: &[f64]) -> Value {
    let ty = kb.b.func.dfg.value_type(z);
    let mut p = kb.fconst(ty, coeffs[0]);
    for &c in &coeffs[1..] {
        let cv = kb.fconst(ty, c);
        p = kb.fmadd(p, z, cv);
    }
    p
}

/// `cond(a, b) ? then : otherwise` on f32/f64 scalars or vectors.
pub(crate) fn select_cmp(
    kb: &mut Kb,
    cc: FloatCC,
    a: Value,
    b: Value,
    then: Value,
    otherwise: Value,
) -> Value {
    let ty = kb.b.func.dfg.value_type(a);
    let c = kb.b.ins().fcmp(cc, a, b);
    if ty.is_vector() {
        let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
        let mask = kb.b.ins().bitcast(ty, flags, c);
        kb.b.ins().bitselect(mask, then, otherwise)
    } else {
        kb.b.ins().select(c, then, otherwise)
    }
}

/// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^-|x|)`, which neither overflows
/// nor loses the small tail.
pub(crate) fn softplus(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let zero = kb.fconst(ty, 0.0);
    let one = kb.fconst(ty, 1.0);
    let ax = kb.b.ins().fabs(x);
    let nax = kb.b.ins().fneg(ax);
    let e = exp(kb, nax);
    let t = kb.b.ins().fadd(one, e);
    let l = log(kb, t);
    let pos = kb.b.ins().fmax(x, zero);
    kb.b.ins().fadd(pos, l)
}

/// `e^x - 1` (with the inline `exp`; absolute error ~1 ulp of 1).
pub(crate) fn expm1(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let e = exp(kb, x);
    let one = kb.fconst(ty, 1.0);
    kb.b.ins().fsub(e, one)
}

/// C `fmod` via the host (lane by lane).
pub(crate) fn fmod(kb: &mut Kb, x: Value, y: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let f = if ty.lane_type() == F32 {
        HostFn::Fmodf
    } else {
        HostFn::Fmod
    };
    kb.call_host_lanes(f, &[x, y])
}
