//! Scalar math in PTX on f32: exp, log, tanh, sigmoid, pow, erf, the
//! trigonometric and hyperbolic functions and their inverses, fmod.
//!
//! PTX has only base-2 approximations (`ex2.approx`, `lg2.approx`, about
//! 2 ulp); `exp` splits `x * log2(e)` into a rounded product and its exact
//! remainder (one `fma`) so the argument rounding does not grow with |x|.
//! f64 has no hardware transcendental in PTX: `exp` and `log` on f64 are
//! computed in software ([`exp`] and [`log`] dispatch on the register
//! type; argument reduction by a multiple of ln 2 in two parts, then
//! Taylor/`atanh` series to f64 rounding), which is what f64 Exp, Log,
//! Sigmoid, Tanh (through `expm1`), Pow, Softmax and ReduceLogSum(Exp)
//! need; the other transcendental ops refuse f64 with a typed error
//! instead of computing them in f32.
//!
//! `erf` uses the same rational approximation as the CPU target (Eigen's,
//! |error| < 7e-8 on [-4, 4]). The circular functions reduce the argument
//! to `[-pi/4, pi/4]` by a three-part Cody–Waite subtraction of a multiple
//! of `pi/2` (exact products while the quadrant count stays under 2^16,
//! i.e. |x| < ~1e5) and evaluate the single-precision minimax polynomials
//! of Cephes' `sinf`/`cosf`/`asinf`/`atanf`/`sinhf`; the results are
//! within a few ulp there (the `.approx` hardware `sin`/`cos` are not: their
//! absolute error of 2^-21 is a large relative error near zero).

use crate::ptx::{fimm, Bin, Cmp, KernelBuilder, Opnd, Reg, Ty};

const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `log2(e) - LOG2_E` as f32: the part of log2(e) an f32 cannot hold.
const LOG2_E_LO: f32 = (std::f64::consts::LOG2_E - LOG2_E as f64) as f32;

fn f(v: f32) -> Opnd {
    Opnd::F32(v)
}

/// `2^x` (f32).
pub(crate) fn exp2(kb: &mut KernelBuilder, x: Reg) -> Reg {
    kb.un("ex2.approx", x)
}

/// `e^x` (f32; f64 in software).
pub(crate) fn exp(kb: &mut KernelBuilder, x: Reg) -> Reg {
    if x.ty() == Ty::F64 {
        return exp_f64(kb, x);
    }
    let hi = kb.bin(Bin::Mul, x, f(LOG2_E));
    let neg_hi = kb.un("neg", hi);
    let lo = kb.mad(x, f(LOG2_E), neg_hi);
    let lo = kb.mad(x, f(LOG2_E_LO), lo);
    // Past |hi| = 128 the result is 0 or inf anyway, and for infinite x
    // the remainder is NaN: drop it there.
    let mag = kb.un("abs", hi);
    let small = kb.setp(Cmp::Lt, mag, f(128.0));
    let lo = kb.selp(Ty::F32, small, lo, f(0.0));
    let e_hi = exp2(kb, hi);
    let e_lo = exp2(kb, lo);
    kb.bin(Bin::Mul, e_hi, e_lo)
}

/// Natural logarithm (f32). `lg2.approx` is accurate to about 2^-22 in
/// absolute terms, which near 1 (where ln x is small) is no relative
/// accuracy at all: there `ln x = ln(1 + d)` with the exact `d = x - 1`
/// is summed as a series instead.
pub(crate) fn log(kb: &mut KernelBuilder, x: Reg) -> Reg {
    if x.ty() == Ty::F64 {
        return log_f64(kb, x);
    }
    let d = kb.bin(Bin::Sub, x, f(1.0));
    let near_one = ln_1p_series(kb, d);
    let l2 = kb.un("lg2.approx", x);
    let far = kb.bin(Bin::Mul, l2, f(std::f32::consts::LN_2));
    let ad = kb.un("abs", d);
    let is_near = kb.setp(Cmp::Lt, ad, f(LN_1P_SERIES_BOUND));
    kb.selp(Ty::F32, is_near, near_one, far)
}

/// `ln(1 + u)` (f32), accurate relative to the result for small `u` (where
/// `1 + u` would round `u` away).
pub(crate) fn ln_1p(kb: &mut KernelBuilder, u: Reg) -> Reg {
    let series = ln_1p_series(kb, u);
    let w = kb.bin(Bin::Add, u, f(1.0));
    let l2 = kb.un("lg2.approx", w);
    let far = kb.bin(Bin::Mul, l2, f(std::f32::consts::LN_2));
    let au = kb.un("abs", u);
    let small = kb.setp(Cmp::Lt, au, f(LN_1P_SERIES_BOUND));
    kb.selp(Ty::F32, small, series, far)
}

/// Below this `|u|`, the six terms of [`ln_1p_series`] are within f32
/// rounding of `ln(1 + u)` (the first term left out, `u^7/7`, is under
/// 2^-24 of the sum); above it `lg2.approx`'s absolute error is under
/// 3e-6 of the result.
const LN_1P_SERIES_BOUND: f32 = 1.0 / 16.0;

/// `u - u²/2 + u³/3 - u⁴/4 + u⁵/5 - u⁶/6`.
fn ln_1p_series(kb: &mut KernelBuilder, u: Reg) -> Reg {
    let p = horner(
        kb,
        u,
        &[
            -1.0 / 6.0,
            1.0 / 5.0,
            -1.0 / 4.0,
            1.0 / 3.0,
            -1.0 / 2.0,
            1.0,
        ],
    );
    kb.bin(Bin::Mul, p, u)
}

/// ln 2 in two parts for f64 argument reduction: `LN2_HI` has its low 32
/// bits zero, so `k * LN2_HI` is exact for |k| < 2^20.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;

/// `2^k` for an integral f64 `k` in [-2044, 2046], as two factors (each
/// exponent field in range), applied to `p`: `p * 2^(k/2) * 2^(k - k/2)`
/// reaches subnormal results and overflows to infinity where `2^k` alone
/// would not fit an exponent field.
fn scale_by_pow2_f64(kb: &mut KernelBuilder, p: Reg, k: Reg) -> Reg {
    let ki = kb.cvt(Ty::S64, "rzi", k);
    let half = kb.bin(Bin::Shr, ki, 1u32);
    let rest = kb.bin(Bin::Sub, ki, half);
    let mut r = p;
    for e in [half, rest] {
        let biased = kb.bin(Bin::Add, e, Opnd::I(1023));
        let bits = kb.bin(Bin::Shl, biased, 52u32);
        let factor = kb.bitcast(Ty::F64, bits);
        r = kb.bin(Bin::Mul, r, factor);
    }
    r
}

/// `1/13!, 1/12!, ..., 1/1!`: the Taylor coefficients of `e^r` after the
/// constant, highest first (what [`horner_f64`] takes).
fn exp_taylor_f64() -> Vec<f64> {
    let mut factorial = 1.0f64;
    let mut coeffs: Vec<f64> = (1..=13)
        .map(|n| {
            factorial *= n as f64;
            1.0 / factorial
        })
        .collect();
    coeffs.reverse();
    coeffs
}

/// `c[0]·z^(n-1) + ... + c[n-1]` by Horner's rule (f64).
fn horner_f64(kb: &mut KernelBuilder, z: Reg, coeffs: &[f64]) -> Reg {
    let mut p = kb.mov(Ty::F64, Opnd::F64(coeffs[0]));
    for &c in &coeffs[1..] {
        p = kb.mad(p, z, Opnd::F64(c));
    }
    p
}

/// `e^x` (f64): `x = k ln 2 + r` with `|r| <= ln 2 / 2` (ln 2 in two parts),
/// `e^r` by its Taylor series to `r^13/13!` (under 2^-53 of the sum), then
/// scaled by `2^k`. NaN stays NaN; beyond ±1100 the result is 0 or inf.
fn exp_f64(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let c = |v: f64| Opnd::F64(v);
    let clamped = kb.bin(Bin::Max, x, c(-1100.0));
    let clamped = kb.bin(Bin::Min, clamped, c(1100.0));
    let k = kb.bin(Bin::Mul, clamped, c(std::f64::consts::LOG2_E));
    let k = kb.cvt(Ty::F64, "rni", k);
    let nk = kb.un("neg", k);
    let r = kb.mad(nk, c(LN2_HI), clamped);
    let r = kb.mad(nk, c(LN2_LO), r);
    let mut coeffs = exp_taylor_f64();
    coeffs.push(1.0);
    let p = horner_f64(kb, r, &coeffs);
    let y = scale_by_pow2_f64(kb, p, k);
    let nan = kb.setp(Cmp::Ne, x, x);
    kb.selp(Ty::F64, nan, x, y)
}

/// `e^y - 1` (f64) without cancellation for small `y`: below `ln 2 / 2`
/// in magnitude its Taylor series to `y^13/13!`, else `e^y - 1`.
fn expm1_f64(kb: &mut KernelBuilder, y: Reg) -> Reg {
    let c = |v: f64| Opnd::F64(v);
    let p = horner_f64(kb, y, &exp_taylor_f64());
    let series = kb.bin(Bin::Mul, p, y);
    let e = exp_f64(kb, y);
    let far = kb.bin(Bin::Sub, e, c(1.0));
    let ay = kb.un("abs", y);
    let small = kb.setp(Cmp::Lt, ay, c(std::f64::consts::LN_2 / 2.0));
    kb.selp(Ty::F64, small, series, far)
}

/// `tanh x` (f64) as `sign(x) · -t / (2 + t)` with `t = e^{-2|x|} - 1`
/// from [`expm1_f64`]: accurate near 0, no overflow for large |x|.
fn tanh_f64(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let y = kb.bin(Bin::Mul, a, Opnd::F64(-2.0));
    let t = expm1_f64(kb, y);
    let nt = kb.un("neg", t);
    let d = kb.bin(Bin::Add, t, Opnd::F64(2.0));
    let r = kb.bin(Bin::Div, nt, d);
    with_sign_of(kb, r, x)
}

/// `ln x` (f64): `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2))` (subnormal
/// `x` scaled up by 2^54 first), `ln m = 2 atanh(s)` with
/// `s = (m - 1) / (m + 1)` (|s| < 0.172) by its series to `s^25`, plus
/// `e ln 2` in two parts. 0 gives -inf, a negative `x` NaN, inf inf, NaN
/// NaN.
fn log_f64(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let c = |v: f64| Opnd::F64(v);
    let tiny = kb.setp(Cmp::Lt, x, c(f64::MIN_POSITIVE));
    let scaled = kb.bin(Bin::Mul, x, c(2f64.powi(54)));
    let v = kb.selp(Ty::F64, tiny, scaled, x);
    let bits = kb.bitcast(Ty::S64, v);
    let biased = kb.bin(Bin::Shr, bits, 52u32);
    let biased = kb.bin(Bin::And, biased, Opnd::I(0x7ff));
    let mantissa = kb.bin(Bin::And, bits, Opnd::I((1i64 << 52) - 1));
    let one_bits = kb.bin(Bin::Or, mantissa, Opnd::I(1023 << 52));
    let m = kb.bitcast(Ty::F64, one_bits);
    let e = kb.bin(Bin::Sub, biased, Opnd::I(1023));
    let e = kb.cvt(Ty::F64, "rn", e);
    let adjust = kb.selp(Ty::F64, tiny, c(-54.0), c(0.0));
    let e = kb.bin(Bin::Add, e, adjust);
    let high = kb.setp(Cmp::Gt, m, c(std::f64::consts::SQRT_2));
    let halved = kb.bin(Bin::Mul, m, c(0.5));
    let m = kb.selp(Ty::F64, high, halved, m);
    let e_up = kb.bin(Bin::Add, e, c(1.0));
    let e = kb.selp(Ty::F64, high, e_up, e);
    let num = kb.bin(Bin::Sub, m, c(1.0));
    let den = kb.bin(Bin::Add, m, c(1.0));
    let s = kb.bin(Bin::Div, num, den);
    let z = kb.bin(Bin::Mul, s, s);
    // 2 (1 + z/3 + z^2/5 + ... + z^12/25).
    let coeffs: Vec<f64> = (0..=12).rev().map(|n| 2.0 / (2 * n + 1) as f64).collect();
    let p = horner_f64(kb, z, &coeffs);
    let ln_m = kb.bin(Bin::Mul, p, s);
    let lo = kb.mad(e, c(LN2_LO), ln_m);
    let y = kb.mad(e, c(LN2_HI), lo);
    // Special inputs: 0 (and -0), negatives, inf, NaN.
    let zero = kb.setp(Cmp::Eq, x, c(0.0));
    let y = kb.selp(Ty::F64, zero, c(f64::NEG_INFINITY), y);
    let inf = kb.setp(Cmp::Eq, x, c(f64::INFINITY));
    let y = kb.selp(Ty::F64, inf, x, y);
    let negative = kb.setp(Cmp::Lt, x, c(0.0));
    let y = kb.selp(Ty::F64, negative, c(f64::NAN), y);
    let nan = kb.setp(Cmp::Ne, x, x);
    kb.selp(Ty::F64, nan, x, y)
}

/// `1 / (1 + e^-x)` (f32).
pub(crate) fn sigmoid(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let t = x.ty();
    let n = kb.un("neg", x);
    let e = exp(kb, n);
    let d = kb.bin(Bin::Add, e, fimm(t, 1.0));
    let one = kb.mov(t, fimm(t, 1.0));
    kb.bin(Bin::Div, one, d)
}

/// `tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})` (f32): no overflow
/// for large |x|. Below |x| = 0.625 the difference `1 - e^{-2|x|}` cancels
/// (near 0 it keeps no relative accuracy), so there Cephes' odd
/// polynomial is used instead.
pub(crate) fn tanh(kb: &mut KernelBuilder, x: Reg) -> Reg {
    if x.ty() == Ty::F64 {
        return tanh_f64(kb, x);
    }
    let a = kb.un("abs", x);
    let m = kb.bin(Bin::Mul, a, f(-2.0));
    let t = exp(kb, m);
    let one = kb.mov(Ty::F32, f(1.0));
    let num = kb.bin(Bin::Sub, one, t);
    let den = kb.bin(Bin::Add, t, f(1.0));
    let large = kb.bin(Bin::Div, num, den);
    let small = odd_series(
        kb,
        a,
        &[
            -5.704_988_7e-3,
            2.063_908_8e-2,
            -5.373_971_6e-2,
            1.333_144_2e-1,
            -3.333_328e-1,
        ],
    );
    let is_small = kb.setp(Cmp::Lt, a, f(0.625));
    let r = kb.selp(Ty::F32, is_small, small, large);
    with_sign_of(kb, r, x)
}

/// `a^b` (f32) with C `powf` conventions for the common cases: `b == 0`
/// gives 1, a negative base gives a real result only for integral `b`
/// (negated for odd `b`), NaN otherwise.
pub(crate) fn pow(kb: &mut KernelBuilder, a: Reg, b: Reg) -> Reg {
    let t = a.ty();
    let c = |v: f64| fimm(t, v);
    let mag = kb.un("abs", a);
    let r = if t == Ty::F64 {
        let l = log_f64(kb, mag);
        let e = kb.bin(Bin::Mul, b, l);
        exp_f64(kb, e)
    } else {
        let l = kb.un("lg2.approx", mag);
        let e = kb.bin(Bin::Mul, b, l);
        exp2(kb, e)
    };
    let bi = kb.cvt(t, "rzi", b);
    let integral = kb.setp(Cmp::Eq, bi, b);
    let half = kb.bin(Bin::Mul, b, c(0.5));
    let half_i = kb.cvt(t, "rzi", half);
    let even = kb.setp(Cmp::Eq, half_i, half);
    let nr = kb.un("neg", r);
    let signed = kb.selp(t, even, r, nr);
    let neg_result = kb.selp(t, integral, signed, c(f64::NAN));
    let negative = kb.setp(Cmp::Lt, a, c(0.0));
    let r = kb.selp(t, negative, neg_result, r);
    let zero_exp = kb.setp(Cmp::Eq, b, c(0.0));
    kb.selp(t, zero_exp, c(1.0), r)
}

/// `min(max(x, lo), hi)` in `x`'s float type.
pub(crate) fn clamp(kb: &mut KernelBuilder, x: Reg, lo: f64, hi: f64) -> Reg {
    let t = x.ty();
    let m = kb.bin(Bin::Max, x, fimm(t, lo));
    kb.bin(Bin::Min, m, fimm(t, hi))
}

/// `x + x·z·P(z)` with `z = x²` and `P` by [`horner`] (f32): the odd
/// polynomials of Cephes' `tanhf`, `asinf`, `atanf` and `sinhf`.
fn odd_series(kb: &mut KernelBuilder, x: Reg, coeffs: &[f32]) -> Reg {
    let z = kb.bin(Bin::Mul, x, x);
    let p = horner(kb, z, coeffs);
    let p = kb.bin(Bin::Mul, p, z);
    kb.mad(p, x, x)
}

/// `c[0]·z^(n-1) + ... + c[n-1]` by Horner's rule (f32).
fn horner(kb: &mut KernelBuilder, z: Reg, coeffs: &[f32]) -> Reg {
    let mut p = kb.mov(Ty::F32, f(coeffs[0]));
    for &c in &coeffs[1..] {
        p = kb.mad(p, z, f(c));
    }
    p
}

/// `-x` when `neg_if` is negative, else `x`.
fn with_sign_of(kb: &mut KernelBuilder, x: Reg, neg_if: Reg) -> Reg {
    let t = x.ty();
    let neg = kb.setp(Cmp::Lt, neg_if, fimm(t, 0.0));
    let nx = kb.un("neg", x);
    kb.selp(t, neg, nx, x)
}

/// `erf(x)` (f32): the odd/even rational approximation of the CPU target.
pub(crate) fn erf(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let x = clamp(kb, x, -4.0, 4.0);
    let x2 = kb.bin(Bin::Mul, x, x);
    let p = horner(
        kb,
        x2,
        &[
            -2.726_142_3e-10,
            2.770_681_4e-8,
            -2.101_024e-6,
            -5.692_506_4e-5,
            -7.349_906e-4,
            -2.954_6e-3,
            -1.609_603_3e-2,
        ],
    );
    let p = kb.bin(Bin::Mul, x, p);
    let q = horner(
        kb,
        x2,
        &[
            -1.456_607_2e-5,
            -2.133_740_6e-4,
            -1.682_827e-3,
            -7.373_329e-3,
            -1.426_473_9e-2,
        ],
    );
    kb.bin(Bin::Div, p, q)
}

/// `x * (1 + erf(x / sqrt 2)) / 2` (f32).
pub(crate) fn gelu_erf(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let t = kb.bin(Bin::Mul, x, f(std::f32::consts::FRAC_1_SQRT_2));
    let e = erf(kb, t);
    let onep = kb.bin(Bin::Add, e, f(1.0));
    let hx = kb.bin(Bin::Mul, x, f(0.5));
    kb.bin(Bin::Mul, hx, onep)
}

/// `(sin x, cos x)` (f32) by quadrant: `x = j·pi/2 + r`, `|r| <= pi/4`.
pub(crate) fn sin_cos(kb: &mut KernelBuilder, x: Reg) -> (Reg, Reg) {
    // pi/2 in three parts; the first two have few enough bits that
    // `j * part` is exact for |j| < 2^16.
    const P1: f32 = 1.570_312_5;
    const P2: f32 = 4.837_513e-4;
    const P3: f32 = 7.549_79e-8;
    let t = kb.bin(Bin::Mul, x, f(std::f32::consts::FRAC_2_PI));
    let j = kb.cvt(Ty::F32, "rni", t);
    let nj = kb.un("neg", j);
    let r = kb.mad(nj, f(P1), x);
    let r = kb.mad(nj, f(P2), r);
    let r = kb.mad(nj, f(P3), r);
    let z = kb.bin(Bin::Mul, r, r);
    let ps = horner(kb, z, &[-1.951_529_6e-4, 8.332_161e-3, -1.666_665_5e-1]);
    let ps = kb.bin(Bin::Mul, ps, z);
    let s = kb.mad(ps, r, r);
    let pc = horner(kb, z, &[2.443_315_7e-5, -1.388_731_6e-3, 4.166_664_6e-2]);
    let pc = kb.bin(Bin::Mul, pc, z);
    let pc = kb.bin(Bin::Mul, pc, z);
    let pc = kb.mad(z, f(-0.5), pc);
    let c = kb.bin(Bin::Add, pc, f(1.0));
    // Quadrant q = j mod 4 (as a float in 0..4).
    let j4 = kb.bin(Bin::Mul, j, f(0.25));
    let j4 = kb.cvt(Ty::F32, "rmi", j4);
    let q = kb.mad(j4, f(-4.0), j);
    let odd_q = |kb: &mut KernelBuilder, a: f32, b: f32| {
        let pa = kb.setp(Cmp::Eq, q, f(a));
        let pb = kb.setp(Cmp::Eq, q, f(b));
        kb.pred_op("or", pa, pb)
    };
    // sin x: q=0 s, 1 c, 2 -s, 3 -c; cos x: q=0 c, 1 -s, 2 -c, 3 s.
    let swap = odd_q(kb, 1.0, 3.0);
    let sin_mag = kb.selp(Ty::F32, swap, c, s);
    let cos_mag = kb.selp(Ty::F32, swap, s, c);
    let sin_neg = kb.setp(Cmp::Ge, q, f(2.0));
    let cos_neg = odd_q(kb, 1.0, 2.0);
    let ns = kb.un("neg", sin_mag);
    let nc = kb.un("neg", cos_mag);
    let sin = kb.selp(Ty::F32, sin_neg, ns, sin_mag);
    let cos = kb.selp(Ty::F32, cos_neg, nc, cos_mag);
    (sin, cos)
}

/// `asin(t)` for |t| <= 1/2 (Cephes' polynomial).
fn asin_small(kb: &mut KernelBuilder, t: Reg) -> Reg {
    odd_series(
        kb,
        t,
        &[
            4.216_32e-2,
            2.418_131e-2,
            4.547_002_6e-2,
            7.495_300_3e-2,
            1.666_675_2e-1,
        ],
    )
}

/// `asin(x)` (f32; NaN outside [-1, 1]).
pub(crate) fn asin(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let small = asin_small(kb, a);
    // asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2)) for a > 1/2.
    let h = kb.mov(Ty::F32, f(1.0));
    let h = kb.bin(Bin::Sub, h, a);
    let h = kb.bin(Bin::Mul, h, f(0.5));
    let h = kb.un("sqrt.rn", h);
    let big = asin_small(kb, h);
    let big = kb.mad(big, f(-2.0), f(std::f32::consts::FRAC_PI_2));
    let is_big = kb.setp(Cmp::Gt, a, f(0.5));
    let r = kb.selp(Ty::F32, is_big, big, small);
    with_sign_of(kb, r, x)
}

/// `acos(x)` (f32) without the cancellation of `pi/2 - asin(x)` near ±1.
pub(crate) fn acos(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let mid = asin_small(kb, x);
    let mid = kb.mad(mid, f(-1.0), f(std::f32::consts::FRAC_PI_2));
    // x > 1/2: 2 asin(sqrt((1 - x) / 2)); x < -1/2: pi - that of -x.
    let a = kb.un("abs", x);
    let one = kb.mov(Ty::F32, f(1.0));
    let h = kb.bin(Bin::Sub, one, a);
    let h = kb.bin(Bin::Mul, h, f(0.5));
    let h = kb.un("sqrt.rn", h);
    let edge = asin_small(kb, h);
    let edge = kb.bin(Bin::Mul, edge, f(2.0));
    let far = kb.mad(edge, f(-1.0), f(std::f32::consts::PI));
    let pos = kb.setp(Cmp::Gt, x, f(0.5));
    let neg = kb.setp(Cmp::Lt, x, f(-0.5));
    let r = kb.selp(Ty::F32, pos, edge, mid);
    kb.selp(Ty::F32, neg, far, r)
}

/// `atan(x)` (f32): reduced to |t| <= tan(pi/8) (Cephes' `atanf`).
pub(crate) fn atan(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let big = kb.setp(Cmp::Gt, a, f(2.414_213_6));
    let mid = kb.setp(Cmp::Gt, a, f(0.414_213_57));
    let one = kb.mov(Ty::F32, f(-1.0));
    let inv = kb.bin(Bin::Div, one, a);
    let num = kb.bin(Bin::Sub, a, f(1.0));
    let den = kb.bin(Bin::Add, a, f(1.0));
    let shifted = kb.bin(Bin::Div, num, den);
    let t = kb.selp(Ty::F32, mid, shifted, a);
    let t = kb.selp(Ty::F32, big, inv, t);
    let y0 = kb.selp(Ty::F32, mid, f(std::f32::consts::FRAC_PI_4), f(0.0));
    let y0 = kb.selp(Ty::F32, big, f(std::f32::consts::FRAC_PI_2), y0);
    let r = odd_series(
        kb,
        t,
        &[
            8.053_744_5e-2,
            -1.387_768_6e-1,
            1.997_771_1e-1,
            -3.333_295e-1,
        ],
    );
    let r = kb.bin(Bin::Add, r, y0);
    with_sign_of(kb, r, x)
}

/// `(e^|x| / 2, e^-|x| / 2)`, computed as `E = e^(|x| - ln 2)` and
/// `1 / (4E)` so that neither overflows before the result does.
fn half_exps(kb: &mut KernelBuilder, a: Reg) -> (Reg, Reg) {
    let s = kb.bin(Bin::Sub, a, f(std::f32::consts::LN_2));
    let e = exp(kb, s);
    let e4 = kb.bin(Bin::Mul, e, f(4.0));
    let inv = kb.un("rcp.rn", e4);
    (e, inv)
}

/// `sinh(x)` (f32): Cephes' polynomial below 1, exponentials above.
pub(crate) fn sinh(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let small = odd_series(kb, a, &[2.037_219_1e-4, 8.330_284e-3, 1.666_671_6e-1]);
    let (e, inv) = half_exps(kb, a);
    let large = kb.bin(Bin::Sub, e, inv);
    let is_small = kb.setp(Cmp::Lt, a, f(1.0));
    let r = kb.selp(Ty::F32, is_small, small, large);
    with_sign_of(kb, r, x)
}

/// `cosh(x)` (f32).
pub(crate) fn cosh(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let (e, inv) = half_exps(kb, a);
    kb.bin(Bin::Add, e, inv)
}

/// C `fmod(a, b)` (f32 or f64): the remainder of `|a| / |b|` computed with one
/// fused multiply-add and corrected by one step if the rounded quotient
/// was off by one, carrying `a`'s sign.
pub(crate) fn fmod(kb: &mut KernelBuilder, a: Reg, b: Reg) -> Reg {
    let t = a.ty();
    let aa = kb.un("abs", a);
    let ab = kb.un("abs", b);
    let q = kb.bin(Bin::Div, aa, ab);
    let q = kb.cvt(t, "rzi", q);
    let nq = kb.un("neg", q);
    let r = kb.mad(nq, ab, aa);
    let under = kb.setp(Cmp::Lt, r, fimm(t, 0.0));
    let up = kb.bin(Bin::Add, r, ab);
    let r = kb.selp(t, under, up, r);
    let over = kb.setp(Cmp::Ge, r, ab);
    let down = kb.bin(Bin::Sub, r, ab);
    let r = kb.selp(t, over, down, r);
    // |a| < |b| (an infinite b too, where the product above is NaN): a.
    let whole = kb.setp(Cmp::Eq, q, fimm(t, 0.0));
    let r = kb.selp(t, whole, aa, r);
    with_sign_of(kb, r, a)
}
