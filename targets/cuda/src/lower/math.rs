//! Scalar math in PTX: exp, log, tanh, sigmoid, pow on f32.
//!
//! PTX has only base-2 approximations (`ex2.approx`, `lg2.approx`, about
//! 2 ulp); `exp` splits `x * log2(e)` into a rounded product and its exact
//! remainder (one `fma`) so the argument rounding does not grow with |x|.
//! f64 has no hardware transcendental in PTX; the lowerings refuse f64 for
//! these ops with a typed error instead of computing them in f32.

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

/// `e^x` (f32).
pub(crate) fn exp(kb: &mut KernelBuilder, x: Reg) -> Reg {
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

/// Natural logarithm (f32).
pub(crate) fn log(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let l2 = kb.un("lg2.approx", x);
    kb.bin(Bin::Mul, l2, f(std::f32::consts::LN_2))
}

/// `1 / (1 + e^-x)` (f32).
pub(crate) fn sigmoid(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let n = kb.un("neg", x);
    let e = exp(kb, n);
    let d = kb.bin(Bin::Add, e, f(1.0));
    let one = kb.mov(Ty::F32, f(1.0));
    kb.bin(Bin::Div, one, d)
}

/// `tanh(x) = sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})` (f32): no overflow
/// for large |x|.
pub(crate) fn tanh(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let a = kb.un("abs", x);
    let m = kb.bin(Bin::Mul, a, f(-2.0));
    let t = exp(kb, m);
    let one = kb.mov(Ty::F32, f(1.0));
    let num = kb.bin(Bin::Sub, one, t);
    let den = kb.bin(Bin::Add, t, f(1.0));
    let r = kb.bin(Bin::Div, num, den);
    let neg = kb.setp(Cmp::Lt, x, f(0.0));
    let nr = kb.un("neg", r);
    kb.selp(Ty::F32, neg, nr, r)
}

/// `a^b` (f32) with C `powf` conventions for the common cases: `b == 0`
/// gives 1, a negative base gives a real result only for integral `b`
/// (negated for odd `b`), NaN otherwise.
pub(crate) fn pow(kb: &mut KernelBuilder, a: Reg, b: Reg) -> Reg {
    let mag = kb.un("abs", a);
    let l = kb.un("lg2.approx", mag);
    let t = kb.bin(Bin::Mul, b, l);
    let r = exp2(kb, t);
    let bi = kb.cvt(Ty::F32, "rzi", b);
    let integral = kb.setp(Cmp::Eq, bi, b);
    let half = kb.bin(Bin::Mul, b, f(0.5));
    let half_i = kb.cvt(Ty::F32, "rzi", half);
    let even = kb.setp(Cmp::Eq, half_i, half);
    let nr = kb.un("neg", r);
    let signed = kb.selp(Ty::F32, even, r, nr);
    let neg_result = kb.selp(Ty::F32, integral, signed, f(f32::NAN));
    let negative = kb.setp(Cmp::Lt, a, f(0.0));
    let r = kb.selp(Ty::F32, negative, neg_result, r);
    let zero_exp = kb.setp(Cmp::Eq, b, f(0.0));
    kb.selp(Ty::F32, zero_exp, f(1.0), r)
}

/// `min(max(x, lo), hi)` in `x`'s float type.
pub(crate) fn clamp(kb: &mut KernelBuilder, x: Reg, lo: f64, hi: f64) -> Reg {
    let t = x.ty();
    let m = kb.bin(Bin::Max, x, fimm(t, lo));
    kb.bin(Bin::Min, m, fimm(t, hi))
}
