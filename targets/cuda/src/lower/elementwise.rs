//! Elementwise kernels: unary, binary, cast, compare, logical, not, where.
//!
//! One thread per output element (1-D launch, [`BLOCK`](super::BLOCK)
//! threads a block). Operands with the output's shape are read at the
//! thread's index; broadcast operands at an offset computed from the
//! output coordinates with numpy broadcasting strides (0 on broadcast
//! axes), the shapes being immediates. Values are computed in their
//! compute type ([`cty`](super::cty)): integers as s64 with the reference
//! evaluator's wrapping semantics, bools as 0/1.

use kiln_ir::{BinaryOp, BitwiseOp, CompareOp, DType, FusedKernel, Instr, LogicalOp, UnaryOp};

use super::{
    broadcast_strides, coords, cty, global_index, linear_launch, load, offset, ptr, store, Cx,
    Kernel,
};
use super::{math, narrow};
use crate::ptx::{fimm, Bin, Cmp, KernelBuilder, Opnd, Reg, Ty};
use crate::CudaError;

type Body<'a> = dyn FnOnce(&mut KernelBuilder, &[Reg]) -> Reg + 'a;

/// The common kernel: loads every operand at the output element's
/// broadcast position, applies `body`, stores the result.
pub(crate) fn map(cx: &Cx, body: Box<Body>) -> Result<Kernel, CudaError> {
    let out_shape = &cx.out_ty.shape;
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let mut cs: Option<Vec<Option<Reg>>> = None;
    let mut vals = Vec::with_capacity(cx.inputs.len());
    for &(loc, ty) in &cx.inputs {
        let base = ptr(&mut kb, loc);
        let idx = if ty.shape == *out_shape {
            i
        } else {
            let c = cs
                .get_or_insert_with(|| coords(&mut kb, i, out_shape))
                .clone();
            offset(&mut kb, &c, &broadcast_strides(&ty.shape, out_shape), 0)
        };
        vals.push(load(&mut kb, base, idx, ty.dtype));
    }
    let v = body(&mut kb, &vals);
    let v = cx.epilogue(&mut kb, v);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, cx.out_ty.dtype, v);
    Ok(cx.finish(kb, linear_launch(n)))
}

/// Whether the op needs a transcendental function with no f64 form here
/// (PTX has none; `math::exp` and `math::log` compute f64 in software).
fn transcendental(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Gelu { .. }
            | UnaryOp::Elu { .. }
            | UnaryOp::Selu { .. }
            | UnaryOp::Celu { .. }
            | UnaryOp::Softplus
            | UnaryOp::Mish
            | UnaryOp::Erf
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Asin
            | UnaryOp::Acos
            | UnaryOp::Atan
            | UnaryOp::Sinh
            | UnaryOp::Cosh
            | UnaryOp::Asinh
            | UnaryOp::Acosh
            | UnaryOp::Atanh
    )
}

pub(crate) fn unary(cx: &Cx, op: UnaryOp) -> Result<Kernel, CudaError> {
    let t = cx.input_cty(0, op.accepts_int())?;
    if t == Ty::F64 && transcendental(op) {
        return Err(cx.dtype_err(DType::F64));
    }
    let unsigned = cx.inputs[0].1.dtype.is_unsigned();
    map(
        cx,
        Box::new(move |kb, v| {
            if t.is_float() {
                unary_float(kb, op, v[0])
            } else if let (true, UnaryOp::Clip { min, max }) = (unsigned, op) {
                // Bounds rounded inward and saturated to 0..=u64::MAX, as
                // the reference evaluator does; u8..u32 are zero-extended
                // in s64 (where bounds past i64::MAX clamp nothing), u64
                // compares unsigned (the immediate's bits are the u64).
                let lo = (min as f64).ceil() as u64;
                let hi = (max as f64).floor() as u64;
                let (lo, hi) = if t == Ty::U64 {
                    (lo, hi)
                } else {
                    (lo.min(i64::MAX as u64), hi.min(i64::MAX as u64))
                };
                let y = kb.bin(Bin::Max, v[0], Opnd::I(lo as i64));
                kb.bin(Bin::Min, y, Opnd::I(hi as i64))
            } else {
                unary_int(kb, op, v[0])
            }
        }),
    )
}

/// A float unary op on `x` (f32, or f64 for the non-transcendental ones).
pub(crate) fn unary_float(kb: &mut KernelBuilder, op: UnaryOp, x: Reg) -> Reg {
    let t = x.ty();
    let c = |v: f64| fimm(t, v);
    match op {
        UnaryOp::Relu => kb.bin(Bin::Max, x, c(0.0)),
        UnaryOp::LeakyRelu { alpha } => {
            let neg = kb.setp(Cmp::Lt, x, c(0.0));
            let scaled = kb.bin(Bin::Mul, x, c(alpha as f64));
            kb.selp(t, neg, scaled, x)
        }
        UnaryOp::Sigmoid => math::sigmoid(kb, x),
        UnaryOp::Tanh => math::tanh(kb, x),
        UnaryOp::HardSigmoid { alpha, beta } => {
            let y = kb.mad(x, c(alpha as f64), c(beta as f64));
            math::clamp(kb, y, 0.0, 1.0)
        }
        UnaryOp::HardSwish => {
            let y = kb.mad(x, c(1.0 / 6.0), c(0.5));
            let g = math::clamp(kb, y, 0.0, 1.0);
            kb.bin(Bin::Mul, x, g)
        }
        UnaryOp::Clip { min, max } => math::clamp(kb, x, min as f64, max as f64),
        UnaryOp::Neg => kb.un("neg", x),
        UnaryOp::Abs => kb.un("abs", x),
        UnaryOp::Sqrt => kb.un("sqrt.rn", x),
        UnaryOp::Exp => math::exp(kb, x),
        UnaryOp::Log => math::log(kb, x),
        UnaryOp::Reciprocal => kb.un("rcp.rn", x),
        UnaryOp::Floor => kb.cvt(t, "rmi", x),
        UnaryOp::Ceil => kb.cvt(t, "rpi", x),
        UnaryOp::Round => kb.cvt(t, "rni", x),
        UnaryOp::Sign => {
            let pos = kb.setp(Cmp::Gt, x, c(0.0));
            let y = kb.selp(t, pos, c(1.0), x);
            let neg = kb.setp(Cmp::Lt, x, c(0.0));
            kb.selp(t, neg, c(-1.0), y)
        }
        UnaryOp::Elu { alpha } | UnaryOp::Selu { alpha, .. } => {
            let e = math::exp(kb, x);
            let em1 = kb.bin(Bin::Sub, e, c(1.0));
            let neg = kb.bin(Bin::Mul, em1, c(alpha as f64));
            let y = match op {
                UnaryOp::Selu { .. } => {
                    let le = kb.setp(Cmp::Le, x, c(0.0));
                    kb.selp(t, le, neg, x)
                }
                _ => {
                    let lt = kb.setp(Cmp::Lt, x, c(0.0));
                    kb.selp(t, lt, neg, x)
                }
            };
            match op {
                UnaryOp::Selu { gamma, .. } => kb.bin(Bin::Mul, y, c(gamma as f64)),
                _ => y,
            }
        }
        UnaryOp::Celu { alpha } => {
            let s = kb.bin(Bin::Mul, x, c(1.0 / alpha as f64));
            let e = math::exp(kb, s);
            let em1 = kb.bin(Bin::Sub, e, c(1.0));
            let neg = kb.bin(Bin::Mul, em1, c(alpha as f64));
            let neg = kb.bin(Bin::Min, neg, c(0.0));
            let pos = kb.bin(Bin::Max, x, c(0.0));
            kb.bin(Bin::Add, pos, neg)
        }
        UnaryOp::Softplus => softplus(kb, x),
        UnaryOp::Mish => {
            let sp = softplus(kb, x);
            let th = math::tanh(kb, sp);
            kb.bin(Bin::Mul, x, th)
        }
        UnaryOp::Softsign => {
            let ax = kb.un("abs", x);
            let d = kb.bin(Bin::Add, ax, c(1.0));
            kb.bin(Bin::Div, x, d)
        }
        UnaryOp::ThresholdedRelu { alpha } => {
            let gt = kb.setp(Cmp::Gt, x, c(alpha as f64));
            kb.selp(t, gt, x, c(0.0))
        }
        UnaryOp::Shrink { bias, lambd } => {
            let up = kb.bin(Bin::Sub, x, c(bias as f64));
            let down = kb.bin(Bin::Add, x, c(bias as f64));
            let gt = kb.setp(Cmp::Gt, x, c(lambd as f64));
            let y = kb.selp(t, gt, up, c(0.0));
            let lt = kb.setp(Cmp::Lt, x, c(-(lambd as f64)));
            kb.selp(t, lt, down, y)
        }
        UnaryOp::Gelu { tanh: true } => {
            let x3 = kb.bin(Bin::Mul, x, x);
            let x3 = kb.bin(Bin::Mul, x3, x);
            let inner = kb.mad(x3, c(0.044_715), x);
            let inner = kb.bin(Bin::Mul, inner, c((2.0 / std::f64::consts::PI).sqrt()));
            let th = math::tanh(kb, inner);
            let one_plus = kb.bin(Bin::Add, th, c(1.0));
            let hx = kb.bin(Bin::Mul, x, c(0.5));
            kb.bin(Bin::Mul, hx, one_plus)
        }
        UnaryOp::Erf => math::erf(kb, x),
        UnaryOp::Gelu { tanh: false } => math::gelu_erf(kb, x),
        UnaryOp::Sin => math::sin_cos(kb, x).0,
        UnaryOp::Cos => math::sin_cos(kb, x).1,
        UnaryOp::Tan => {
            let (s, c) = math::sin_cos(kb, x);
            kb.bin(Bin::Div, s, c)
        }
        UnaryOp::Asin => math::asin(kb, x),
        UnaryOp::Acos => math::acos(kb, x),
        UnaryOp::Atan => math::atan(kb, x),
        UnaryOp::Sinh => math::sinh(kb, x),
        UnaryOp::Cosh => math::cosh(kb, x),
        UnaryOp::Asinh => {
            // sign(x) · ln(|x| + sqrt(x² + 1)), as on the CPU target.
            let ax = kb.un("abs", x);
            let r = kb.mad(ax, ax, c(1.0));
            let r = kb.un("sqrt.rn", r);
            let r = kb.bin(Bin::Add, ax, r);
            let l = math::log(kb, r);
            let neg = kb.setp(Cmp::Lt, x, c(0.0));
            let nl = kb.un("neg", l);
            kb.selp(t, neg, nl, l)
        }
        UnaryOp::Acosh => {
            let r = kb.mad(x, x, c(-1.0));
            let r = kb.un("sqrt.rn", r);
            let r = kb.bin(Bin::Add, x, r);
            math::log(kb, r)
        }
        UnaryOp::Atanh => {
            let n = kb.bin(Bin::Add, x, c(1.0));
            let one = kb.mov(t, c(1.0));
            let d = kb.bin(Bin::Sub, one, x);
            let q = kb.bin(Bin::Div, n, d);
            let l = math::log(kb, q);
            kb.bin(Bin::Mul, l, c(0.5))
        }
    }
}

/// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^-|x|)`.
fn softplus(kb: &mut KernelBuilder, x: Reg) -> Reg {
    let t = x.ty();
    let ax = kb.un("abs", x);
    let nax = kb.un("neg", ax);
    let e = math::exp(kb, nax);
    let l = math::ln_1p(kb, e);
    let pos = kb.bin(Bin::Max, x, fimm(t, 0.0));
    kb.bin(Bin::Add, pos, l)
}

/// An integer unary op on `x` (s64, or u64 with unsigned semantics:
/// `abs` is the identity and `neg` wraps).
fn unary_int(kb: &mut KernelBuilder, op: UnaryOp, x: Reg) -> Reg {
    let t = x.ty();
    match op {
        UnaryOp::Relu => kb.bin(Bin::Max, x, Opnd::I(0)),
        UnaryOp::Neg if t == Ty::U64 => {
            let zero = kb.mov(t, Opnd::I(0));
            kb.bin(Bin::Sub, zero, x)
        }
        UnaryOp::Abs if t == Ty::U64 => x,
        UnaryOp::Neg => kb.un("neg", x),
        UnaryOp::Abs => kb.un("abs", x),
        UnaryOp::Sign => {
            let pos = kb.setp(Cmp::Gt, x, Opnd::I(0));
            let y = kb.selp(t, pos, Opnd::I(1), x);
            let neg = kb.setp(Cmp::Lt, x, Opnd::I(0));
            kb.selp(t, neg, Opnd::I(-1), y)
        }
        UnaryOp::Clip { min, max } => {
            // Reference semantics: clamp in f64, then truncate toward zero.
            let (min, max) = (min as f64, max as f64);
            let lt = kb.setp(Cmp::Lt, x, Opnd::I(min.ceil() as i64));
            let y = kb.selp(t, lt, Opnd::I(min.trunc() as i64), x);
            let gt = kb.setp(Cmp::Gt, y, Opnd::I(max.floor() as i64));
            kb.selp(t, gt, Opnd::I(max.trunc() as i64), y)
        }
        _ => unreachable!("checked by accepts_int"),
    }
}

pub(crate) fn binary(cx: &Cx, op: BinaryOp) -> Result<Kernel, CudaError> {
    let t = cx.input_cty(0, true)?;
    if cx.inputs[0].1.dtype == DType::Bool {
        return Err(cx.dtype_err(cx.inputs[0].1.dtype));
    }
    map(
        cx,
        Box::new(move |kb, v| {
            if t.is_float() {
                binary_float(kb, op, v[0], v[1])
            } else {
                binary_int(kb, op, v[0], v[1])
            }
        }),
    )
}

/// A float binary op (f32 or f64).
fn binary_float(kb: &mut KernelBuilder, op: BinaryOp, a: Reg, b: Reg) -> Reg {
    let t = a.ty();
    match op {
        BinaryOp::Add => kb.bin(Bin::Add, a, b),
        BinaryOp::Sub => kb.bin(Bin::Sub, a, b),
        BinaryOp::Mul => kb.bin(Bin::Mul, a, b),
        BinaryOp::Div => kb.bin(Bin::Div, a, b),
        BinaryOp::Pow => math::pow(kb, a, b),
        BinaryOp::Max => kb.bin(Bin::Max, a, b),
        BinaryOp::Min => kb.bin(Bin::Min, a, b),
        BinaryOp::PRelu => {
            let neg = kb.setp(Cmp::Lt, a, fimm(t, 0.0));
            let scaled = kb.bin(Bin::Mul, a, b);
            kb.selp(t, neg, scaled, a)
        }
        BinaryOp::Fmod => math::fmod(kb, a, b),
        BinaryOp::Mod => {
            // fmod moved into the divisor's sign, as on the CPU.
            let r = math::fmod(kb, a, b);
            let rb = kb.bin(Bin::Mul, r, b);
            let differ = kb.setp(Cmp::Lt, rb, fimm(t, 0.0));
            let shifted = kb.bin(Bin::Add, r, b);
            kb.selp(t, differ, shifted, r)
        }
    }
}

/// Float `x` converted to integer type `to` as the reference evaluator
/// casts: truncated toward zero, saturated (NaN to 0: `cvt.rzi.s64`, and
/// `cvt.rzi.u64` for u64, which saturates at 0 and 2^64 - 1).
fn float_to_int(kb: &mut KernelBuilder, x: Reg, to: DType) -> Reg {
    if to == DType::U64 {
        return kb.cvt(Ty::U64, "rzi", x);
    }
    let wide = kb.cvt(Ty::S64, "rzi", x);
    let (lo, hi) = int_range(to);
    if (lo, hi) == (i64::MIN, i64::MAX) {
        wide
    } else {
        let m = kb.bin(Bin::Max, wide, Opnd::I(lo));
        kb.bin(Bin::Min, m, Opnd::I(hi))
    }
}

/// A headless fused kernel: the program per element, its result stored as
/// the kernel says (f32, or cast to u8).
pub(crate) fn fused(cx: &Cx, k: &FusedKernel) -> Result<Kernel, CudaError> {
    let program = k.body().clone();
    let store = k.store().dtype();
    map(
        cx,
        Box::new(move |kb, v| {
            let mut regs: Vec<Reg> = v.to_vec();
            for instr in program.instrs() {
                let r = match *instr {
                    Instr::Unary(u, a) => unary_float(kb, u, regs[a.index()]),
                    Instr::Binary(b, x, y) => binary_float(kb, b, regs[x.index()], regs[y.index()]),
                };
                regs.push(r);
            }
            let result = regs[program.result().index()];
            if store == DType::F32 {
                result
            } else {
                float_to_int(kb, result, store)
            }
        }),
    )
}

/// Integer semantics on s64: wrapping; division truncates, a division by
/// zero gives 0 (the CPU target's choice) and `x / -1` wraps; a negative
/// exponent gives 0. On u64 the same with unsigned division, remainder,
/// comparisons and shifts (no `-1` special case).
fn binary_int(kb: &mut KernelBuilder, op: BinaryOp, a: Reg, b: Reg) -> Reg {
    let t = a.ty();
    match op {
        BinaryOp::Add => kb.bin(Bin::Add, a, b),
        BinaryOp::Sub => kb.bin(Bin::Sub, a, b),
        BinaryOp::Mul => kb.bin(Bin::Mul, a, b),
        BinaryOp::Div if t == Ty::U64 => {
            let zero = kb.setp(Cmp::Eq, b, Opnd::I(0));
            let safe = kb.selp(t, zero, Opnd::I(1), b);
            let q = kb.bin(Bin::Div, a, safe);
            kb.selp(t, zero, Opnd::I(0), q)
        }
        BinaryOp::Div => {
            let zero = kb.setp(Cmp::Eq, b, Opnd::I(0));
            let neg1 = kb.setp(Cmp::Eq, b, Opnd::I(-1));
            let either = kb.pred_op("or", zero, neg1);
            let safe = kb.selp(Ty::S64, either, Opnd::I(1), b);
            let q = kb.bin(Bin::Div, a, safe);
            let na = kb.un("neg", a);
            let r = kb.selp(Ty::S64, neg1, na, q);
            kb.selp(Ty::S64, zero, Opnd::I(0), r)
        }
        BinaryOp::Pow => {
            // Square-and-multiply over the exponent's 32 low bits.
            let r = kb.mov(t, Opnd::I(1));
            let base = kb.mov(t, a);
            let e = kb.mov(t, b);
            kb.for_range(0u32, 32u32, 1u32, |kb, _| {
                let bit = kb.bin(Bin::And, e, Opnd::I(1));
                let set = kb.setp(Cmp::Ne, bit, Opnd::I(0));
                let rb = kb.bin(Bin::Mul, r, base);
                let next = kb.selp(t, set, rb, r);
                kb.assign(r, next);
                kb.bin_into(base, Bin::Mul, base, base);
                kb.bin_into(e, Bin::Shr, e, Opnd::I(1));
            });
            let neg = kb.setp(Cmp::Lt, b, Opnd::I(0));
            kb.selp(t, neg, Opnd::I(0), r)
        }
        BinaryOp::Max => kb.bin(Bin::Max, a, b),
        BinaryOp::Min => kb.bin(Bin::Min, a, b),
        BinaryOp::PRelu => {
            let neg = kb.setp(Cmp::Lt, a, Opnd::I(0));
            let scaled = kb.bin(Bin::Mul, a, b);
            kb.selp(t, neg, scaled, a)
        }
        BinaryOp::Fmod => rem_int(kb, a, b),
        BinaryOp::Mod => {
            let r = rem_int(kb, a, b);
            let x = kb.bin(Bin::Xor, r, b);
            let differ = kb.setp(Cmp::Lt, x, Opnd::I(0));
            let nonzero = kb.setp(Cmp::Ne, r, Opnd::I(0));
            let fix = kb.pred_op("and", differ, nonzero);
            let shifted = kb.bin(Bin::Add, r, b);
            kb.selp(t, fix, shifted, r)
        }
    }
}

/// `a % b` on s64 with the dividend's sign; 0 when `b` is 0 or -1 (the CPU
/// target's semantics, which also avoid the `i64::MIN % -1` trap). On u64
/// (no sign to fix, no trap) 0 when `b` is 0.
fn rem_int(kb: &mut KernelBuilder, a: Reg, b: Reg) -> Reg {
    let t = a.ty();
    let zero = kb.setp(Cmp::Eq, b, Opnd::I(0));
    let either = if t == Ty::U64 {
        zero
    } else {
        let neg1 = kb.setp(Cmp::Eq, b, Opnd::I(-1));
        kb.pred_op("or", zero, neg1)
    };
    let safe = kb.selp(t, either, Opnd::I(1), b);
    let r = kb.bin(Bin::Rem, a, safe);
    kb.selp(t, either, Opnd::I(0), r)
}

/// Broadcast copy: the elementwise map with the identity.
pub(crate) fn expand(cx: &Cx) -> Result<Kernel, CudaError> {
    cx.input_cty(0, true)?;
    map(cx, Box::new(|_, v| v[0]))
}

/// The range of an integer type, as the CPU target clamps float casts.
fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

/// ONNX Cast: float to int truncates toward zero and saturates (NaN gives
/// 0), to bool is `!= 0` (NaN is true), int to int wraps.
///
/// The narrow types convert through their value (`narrow.rs`): a code is
/// decoded to f32 or s64 first, and the value in f32 or s64 is encoded
/// last.
pub(crate) fn cast(cx: &Cx, to: DType) -> Result<Kernel, CudaError> {
    let from = cx.inputs[0].1.dtype;
    let ft = match narrow::value_ty(from) {
        Some(t) => t,
        None => cx.input_cty(0, true)?,
    };
    let tt = (narrow::value_ty(to).or_else(|| cty(to))).ok_or_else(|| cx.dtype_err(to))?;
    map(
        cx,
        Box::new(move |kb, v| {
            let x = if from.is_narrow() {
                narrow::decode(kb, v[0], from)
            } else {
                v[0]
            };
            let y = convert(kb, x, (from, ft), (to, tt));
            if kiln_ir::narrow::is_narrow_float(to) {
                narrow::encode_float(kb, y, to)
            } else if kiln_ir::narrow::is_narrow_int(to) {
                narrow::encode_int(kb, y, to, ft.is_float())
            } else {
                y
            }
        }),
    )
}

/// `x` (of type `from`, computed in `ft`) converted to `to`'s compute type
/// `tt`: the value a Cast stores (for a narrow `to`, the value it encodes).
fn convert(kb: &mut KernelBuilder, x: Reg, (from, ft): (DType, Ty), (to, tt): (DType, Ty)) -> Reg {
    if to == DType::Bool && from != DType::Bool {
        let nz = if ft.is_float() {
            kb.setp(Cmp::Ne, x, fimm(ft, 0.0))
        } else {
            kb.setp(Cmp::Ne, x, Opnd::I(0))
        };
        return kb.selp(Ty::S64, nz, Opnd::I(1), Opnd::I(0));
    }
    match (ft.is_float(), tt.is_float()) {
        (true, true) if ft == tt => x,
        (true, true) if tt == Ty::F64 => kb.cvt(Ty::F64, "", x),
        (true, true) => kb.cvt(Ty::F32, "rn", x),
        // Truncated into s64; a narrow `to` checks its own range.
        (true, false) if to.is_narrow() => float_to_int(kb, x, DType::I64),
        (true, false) => float_to_int(kb, x, to),
        (false, true) => kb.cvt(tt, "rn", x),
        (false, false) => x,
    }
}

pub(crate) fn compare(cx: &Cx, op: CompareOp) -> Result<Kernel, CudaError> {
    cx.input_cty(0, true)?;
    let cmp = match op {
        CompareOp::Equal => Cmp::Eq,
        CompareOp::Less => Cmp::Lt,
        CompareOp::Greater => Cmp::Gt,
        CompareOp::LessOrEqual => Cmp::Le,
        CompareOp::GreaterOrEqual => Cmp::Ge,
    };
    map(
        cx,
        Box::new(move |kb, v| {
            let p = kb.setp(cmp, v[0], v[1]);
            kb.selp(Ty::S64, p, Opnd::I(1), Opnd::I(0))
        }),
    )
}

pub(crate) fn logical(cx: &Cx, op: LogicalOp) -> Result<Kernel, CudaError> {
    let bin = match op {
        LogicalOp::And => Bin::And,
        LogicalOp::Or => Bin::Or,
        LogicalOp::Xor => Bin::Xor,
    };
    map(cx, Box::new(move |kb, v| kb.bin(bin, v[0], v[1])))
}

/// Bitwise ops on integers held in s64 (sign- or zero-extended; stores
/// truncate) or u64 (logical right shifts). Shifts: a negative amount becomes 64,
/// amounts are capped at 64 and moved to a u32 register, and PTX clamps
/// shifts to the register width, so an amount of the bit width or more
/// leaves only bits the store drops (left, and right of a non-negative
/// value: 0) or the sign fill (`shr.s64` of a negative value: -1), as
/// numpy gives.
pub(crate) fn bitwise(cx: &Cx, op: BitwiseOp) -> Result<Kernel, CudaError> {
    let d = cx.inputs[0].1.dtype;
    cx.input_cty(0, true)?;
    if !d.is_int() {
        return Err(cx.dtype_err(d));
    }
    map(
        cx,
        Box::new(move |kb, v| match op {
            BitwiseOp::And => kb.bin(Bin::And, v[0], v[1]),
            BitwiseOp::Or => kb.bin(Bin::Or, v[0], v[1]),
            BitwiseOp::Xor => kb.bin(Bin::Xor, v[0], v[1]),
            BitwiseOp::ShiftLeft | BitwiseOp::ShiftRight => {
                let neg = kb.setp(Cmp::Lt, v[1], Opnd::I(0));
                let n = kb.selp(v[1].ty(), neg, Opnd::I(64), v[1]);
                let n = kb.bin(Bin::Min, n, Opnd::I(64));
                let n = kb.cvt(Ty::U32, "", n);
                let bin = if op == BitwiseOp::ShiftLeft {
                    Bin::Shl
                } else {
                    Bin::Shr
                };
                kb.bin(bin, v[0], n)
            }
        }),
    )
}

/// Bitwise complement of integers (`xor` with all ones; stores truncate).
pub(crate) fn bitwise_not(cx: &Cx) -> Result<Kernel, CudaError> {
    let d = cx.inputs[0].1.dtype;
    cx.input_cty(0, true)?;
    if !d.is_int() {
        return Err(cx.dtype_err(d));
    }
    map(cx, Box::new(|kb, v| kb.bin(Bin::Xor, v[0], Opnd::I(-1))))
}

pub(crate) fn not(cx: &Cx) -> Result<Kernel, CudaError> {
    map(cx, Box::new(|kb, v| kb.bin(Bin::Xor, v[0], Opnd::I(1))))
}

pub(crate) fn where_(cx: &Cx) -> Result<Kernel, CudaError> {
    // Narrow codes are selected as the bytes they are.
    let t = if cx.inputs[1].1.dtype.is_narrow() {
        Ty::U32
    } else {
        cx.input_cty(1, true)?
    };
    map(
        cx,
        Box::new(move |kb, v| {
            let p = kb.setp(Cmp::Ne, v[0], Opnd::I(0));
            kb.selp(t, p, v[1], v[2])
        }),
    )
}
