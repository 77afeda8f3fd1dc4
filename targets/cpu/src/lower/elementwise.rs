//! Elementwise kernels: unary ops, broadcasting binary ops, casts.
//!
//! [`map`] walks the (collapsed) output index space: outer dims as nested
//! loops, the innermost dim as a vector loop (unrolled twice) plus a scalar
//! tail when every operand is contiguous or broadcast along it, otherwise a
//! scalar loop. Broadcast operands along the inner dim are loaded once and
//! splatted outside the loop.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I16, I32, I64, I8};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Type, Value};
use kiln_format::HostFn;
use kiln_ir::{BinaryOp, DType, UnaryOp};

use super::loops::{collapse, for_range, nest};
use super::{math, scalar_type, strides, vector_type, Kb, NodeCx};
use crate::CpuError;

/// One input of [`map`]: base pointer, element type, strides in elements
/// over the output shape (0 where broadcast).
pub(crate) struct MapIn {
    pub ptr: Value,
    pub dtype: DType,
    pub strides: Vec<i64>,
}

/// The scalar or vector operation applied per element.
pub(crate) type MapFn<'a> = &'a dyn Fn(&mut Kb, &[Value]) -> Value;

/// Strides (elements) of an input of shape `input` broadcast to `out`.
pub(crate) fn broadcast_strides(input: &[usize], out: &[usize]) -> Vec<i64> {
    let off = out.len() - input.len();
    let st = strides(input);
    (0..out.len())
        .map(|d| {
            if d < off || input[d - off] == 1 {
                0
            } else {
                st[d - off]
            }
        })
        .collect()
}

/// Computes `out[idx] = f(in_0[idx], in_1[idx], ...)` over `shape`
/// (output contiguous). With `vector`, `f` must also accept vectors of that
/// type (all operands then share the element type).
pub(crate) fn map(
    kb: &mut Kb,
    shape: &[usize],
    out: (Value, DType),
    ins: &[MapIn],
    vector: Option<Type>,
    f: MapFn,
) {
    if shape.iter().product::<usize>() == 0 {
        return;
    }
    let osize = out.1.size_bytes() as i64;
    let mut all: Vec<Vec<i64>> = vec![strides(shape).iter().map(|s| s * osize).collect()];
    for i in ins {
        let es = i.dtype.size_bytes() as i64;
        all.push(i.strides.iter().map(|s| s * es).collect());
    }
    let (mut dims, mut st) = collapse(shape, &all);
    if dims.is_empty() {
        dims.push(1);
        for s in st.iter_mut() {
            s.push(0);
        }
    }
    let inner = *dims.last().expect("non-empty");
    let outer = &dims[..dims.len() - 1];
    let inner_st: Vec<i64> = st.iter().map(|s| *s.last().expect("non-empty")).collect();
    let outer_st: Vec<Vec<i64>> = st.iter().map(|s| s[..s.len() - 1].to_vec()).collect();
    let vec_ok = vector.is_some()
        && ins.iter().all(|i| i.dtype == out.1)
        && inner_st[0] == osize
        && inner_st[1..].iter().all(|&s| s == 0 || s == osize);
    let mut bases = vec![out.0];
    bases.extend(ins.iter().map(|i| i.ptr));
    let out_ty = scalar_type(out.1).expect("checked by caller");
    let in_tys: Vec<Type> = ins
        .iter()
        .map(|i| scalar_type(i.dtype).expect("checked by caller"))
        .collect();
    nest(kb, outer, &bases, &outer_st, &mut |kb, ptrs| {
        if vec_ok {
            inner_vector(
                kb,
                inner,
                osize,
                vector.expect("vec_ok"),
                ptrs,
                &inner_st,
                f,
            );
        } else {
            for_range(kb, 0, inner as i64, 1, &mut |kb, i| {
                let vals: Vec<Value> = (0..ins.len())
                    .map(|j| {
                        let p = kb.add_scaled(ptrs[j + 1], i, inner_st[j + 1]);
                        kb.load(in_tys[j], p, 0)
                    })
                    .collect();
                let r = f(kb, &vals);
                debug_assert_eq!(kb.b.func.dfg.value_type(r), out_ty);
                let p = kb.add_scaled(ptrs[0], i, inner_st[0]);
                kb.store(r, p, 0);
            });
        }
    });
}

/// The contiguous inner loop: two vectors per iteration, then one, then
/// scalars. `ptrs[0]` is the output.
fn inner_vector(
    kb: &mut Kb,
    n: usize,
    esize: i64,
    vty: Type,
    ptrs: &[Value],
    st: &[i64],
    f: MapFn,
) {
    let sty = vty.lane_type();
    let lanes = vty.lane_count() as usize;
    // Broadcast operands: one scalar load, one splat.
    let mut scalars = vec![None; ptrs.len()];
    let mut splats = vec![None; ptrs.len()];
    for j in 1..ptrs.len() {
        if st[j] == 0 {
            let s = kb.load(sty, ptrs[j], 0);
            scalars[j] = Some(s);
            if n >= lanes {
                splats[j] = Some(kb.b.ins().splat(vty, s));
            }
        }
    }
    let vbytes = lanes as i64 * esize;
    let nvec = (n / lanes) as i64;
    let pairs = nvec / 2;
    let one_vector = |kb: &mut Kb, off: Value, imm: i64| {
        let vals: Vec<Value> = (1..ptrs.len())
            .map(|j| match splats[j] {
                Some(s) => s,
                None => {
                    let p = kb.b.ins().iadd(ptrs[j], off);
                    kb.load(vty, p, imm)
                }
            })
            .collect();
        let r = f(kb, &vals);
        let p = kb.b.ins().iadd(ptrs[0], off);
        kb.store(r, p, imm);
    };
    for_range(kb, 0, pairs * 2 * vbytes, 2 * vbytes, &mut |kb, off| {
        one_vector(kb, off, 0);
        one_vector(kb, off, vbytes);
    });
    if nvec % 2 == 1 {
        let off = kb.iconst((nvec - 1) * vbytes);
        one_vector(kb, off, 0);
    }
    for t in (nvec as usize * lanes)..n {
        let imm = t as i64 * esize;
        let vals: Vec<Value> = (1..ptrs.len())
            .map(|j| match scalars[j] {
                Some(s) => s,
                None => kb.load(sty, ptrs[j], imm),
            })
            .collect();
        let r = f(kb, &vals);
        kb.store(r, ptrs[0], imm);
    }
}

pub(crate) fn out_and_input(kb: &mut Kb, cx: &NodeCx, i: usize) -> MapIn {
    let (loc, ty) = cx.inputs[i];
    MapIn {
        ptr: kb.ptr(loc),
        dtype: ty.dtype,
        strides: broadcast_strides(&ty.shape, &cx.node.ty.shape),
    }
}

/// Broadcast copy (any element type with a machine type).
pub(crate) fn expand(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    if scalar_type(d).is_none() {
        return Err(cx.dtype_err(d));
    }
    let input = out_and_input(kb, cx, 0);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[input], vector_type(d), &|_, v| v[0]);
    Ok(())
}

/// Unary elementwise ops.
pub(crate) fn unary(kb: &mut Kb, cx: &NodeCx, op: &UnaryOp) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    let op = *op;
    let int = d.is_int();
    if !(matches!(d, DType::F32 | DType::F64) || (int && op.accepts_int())) {
        return Err(cx.dtype_err(d));
    }
    // The host library offers these in f32 only.
    if d == DType::F64 && libm_f32(op).is_some() {
        return Err(cx.dtype_err(d));
    }
    let input = out_and_input(kb, cx, 0);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    if int {
        map(kb, &shape, out, &[input], None, &move |kb, v| {
            unary_int(kb, op, v[0], d)
        });
    } else {
        map(kb, &shape, out, &[input], vector_type(d), &move |kb, v| {
            unary_float(kb, op, v[0])
        });
    }
    Ok(())
}

fn clamp01(kb: &mut Kb, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    let zero = kb.fconst(ty, 0.0);
    let one = kb.fconst(ty, 1.0);
    let x = kb.b.ins().fmax(x, zero);
    kb.b.ins().fmin(x, one)
}

/// A float unary op on a scalar or vector.
pub(crate) fn unary_float(kb: &mut Kb, op: UnaryOp, x: Value) -> Value {
    let ty = kb.b.func.dfg.value_type(x);
    match op {
        UnaryOp::Relu => {
            let z = kb.fconst(ty, 0.0);
            kb.b.ins().fmax(x, z)
        }
        UnaryOp::LeakyRelu { alpha } => {
            let z = kb.fconst(ty, 0.0);
            let pos = kb.b.ins().fmax(x, z);
            let neg = kb.b.ins().fmin(x, z);
            let a = kb.fconst(ty, alpha as f64);
            kb.fmadd(neg, a, pos)
        }
        UnaryOp::Sigmoid => {
            // 1 + e^-x is 1 where e^-x is subnormal, so the flush changes
            // no result and saves the assist.
            let n = kb.b.ins().fneg(x);
            let e = math::exp_or_zero(kb, n);
            let one = kb.fconst(ty, 1.0);
            let d = kb.b.ins().fadd(one, e);
            kb.b.ins().fdiv(one, d)
        }
        UnaryOp::Tanh => math::tanh(kb, x),
        UnaryOp::HardSigmoid { alpha, beta } => {
            let a = kb.fconst(ty, alpha as f64);
            let b = kb.fconst(ty, beta as f64);
            let t = kb.b.ins().fmul(x, a);
            let t = kb.b.ins().fadd(t, b);
            clamp01(kb, t)
        }
        UnaryOp::HardSwish => {
            // `x · clamp(x + 3, 0, 6) · (1/6)`: no division (about ten
            // multiplications' cost in a kernel's loop; HardSwish ends
            // most PP-OCR convolutions), and `x + 3` is exact where it
            // cancels (x in [−6, −1.5], Sterbenz), so the result stays
            // within a few ulps where `x/6 + 1/2` would lose digits.
            let three = kb.fconst(ty, 3.0);
            let zero = kb.fconst(ty, 0.0);
            let six = kb.fconst(ty, 6.0);
            let sixth = kb.fconst(ty, 1.0 / 6.0);
            let t = kb.b.ins().fadd(x, three);
            let t = kb.b.ins().fmax(t, zero);
            let t = kb.b.ins().fmin(t, six);
            let t = kb.b.ins().fmul(x, t);
            kb.b.ins().fmul(t, sixth)
        }
        UnaryOp::Clip { min, max } => {
            let lo = kb.fconst(ty, min as f64);
            let hi = kb.fconst(ty, max as f64);
            let t = kb.b.ins().fmax(x, lo);
            kb.b.ins().fmin(t, hi)
        }
        UnaryOp::Neg => kb.b.ins().fneg(x),
        UnaryOp::Abs => kb.b.ins().fabs(x),
        UnaryOp::Sqrt => kb.b.ins().sqrt(x),
        UnaryOp::Exp => math::exp(kb, x),
        UnaryOp::Log => math::log(kb, x),
        UnaryOp::Reciprocal => {
            let one = kb.fconst(ty, 1.0);
            kb.b.ins().fdiv(one, x)
        }
        UnaryOp::Floor => kb.b.ins().floor(x),
        UnaryOp::Ceil => kb.b.ins().ceil(x),
        UnaryOp::Round => kb.b.ins().nearest(x),
        UnaryOp::Sign => {
            let zero = kb.fconst(ty, 0.0);
            let one = kb.fconst(ty, 1.0);
            let minus_one = kb.fconst(ty, -1.0);
            let t = math::select_cmp(kb, FloatCC::GreaterThan, x, zero, one, x);
            math::select_cmp(kb, FloatCC::LessThan, x, zero, minus_one, t)
        }
        UnaryOp::Erf => math::erf(kb, x),
        UnaryOp::Gelu { tanh: false } => {
            let r = kb.fconst(ty, std::f64::consts::FRAC_1_SQRT_2);
            let t = kb.b.ins().fmul(x, r);
            let e = math::erf(kb, t);
            let one = kb.fconst(ty, 1.0);
            let half = kb.fconst(ty, 0.5);
            let t = kb.b.ins().fadd(e, one);
            let hx = kb.b.ins().fmul(x, half);
            kb.b.ins().fmul(hx, t)
        }
        UnaryOp::Gelu { tanh: true } => {
            // x/2 · (1 + tanh u) = x / (1 + e^(-2u)), u = √(2/π) · (x +
            // 0.044715·x³): no cancellation where tanh u is near -1.
            let k = kb.fconst(ty, -2.0 * (2.0 / std::f64::consts::PI).sqrt());
            let c = kb.fconst(ty, 0.044_715);
            let x3 = kb.b.ins().fmul(x, x);
            let x3 = kb.b.ins().fmul(x3, x);
            let inner = kb.fmadd(x3, c, x);
            let inner = kb.b.ins().fmul(inner, k);
            let e = math::exp(kb, inner);
            let one = kb.fconst(ty, 1.0);
            let d = kb.b.ins().fadd(e, one);
            kb.b.ins().fdiv(x, d)
        }
        UnaryOp::Elu { alpha } => {
            let zero = kb.fconst(ty, 0.0);
            let a = kb.fconst(ty, alpha as f64);
            let e = math::expm1(kb, x);
            let neg = kb.b.ins().fmul(e, a);
            math::select_cmp(kb, FloatCC::LessThan, x, zero, neg, x)
        }
        UnaryOp::Selu { alpha, gamma } => {
            let zero = kb.fconst(ty, 0.0);
            let a = kb.fconst(ty, alpha as f64);
            let g = kb.fconst(ty, gamma as f64);
            let e = math::expm1(kb, x);
            let neg = kb.b.ins().fmul(e, a);
            let y = math::select_cmp(kb, FloatCC::LessThanOrEqual, x, zero, neg, x);
            kb.b.ins().fmul(y, g)
        }
        UnaryOp::Celu { alpha } => {
            let zero = kb.fconst(ty, 0.0);
            let a = kb.fconst(ty, alpha as f64);
            let t = kb.b.ins().fdiv(x, a);
            let e = math::expm1(kb, t);
            let neg = kb.b.ins().fmul(e, a);
            let neg = kb.b.ins().fmin(neg, zero);
            let pos = kb.b.ins().fmax(x, zero);
            kb.b.ins().fadd(pos, neg)
        }
        UnaryOp::Softplus => math::softplus(kb, x),
        UnaryOp::Softsign => {
            let one = kb.fconst(ty, 1.0);
            let ax = kb.b.ins().fabs(x);
            let d = kb.b.ins().fadd(one, ax);
            kb.b.ins().fdiv(x, d)
        }
        UnaryOp::Mish => {
            let sp = math::softplus(kb, x);
            let t = math::tanh(kb, sp);
            kb.b.ins().fmul(x, t)
        }
        UnaryOp::ThresholdedRelu { alpha } => {
            let a = kb.fconst(ty, alpha as f64);
            let zero = kb.fconst(ty, 0.0);
            math::select_cmp(kb, FloatCC::GreaterThan, x, a, x, zero)
        }
        UnaryOp::Shrink { bias, lambd } => {
            let zero = kb.fconst(ty, 0.0);
            let l = kb.fconst(ty, lambd as f64);
            let nl = kb.fconst(ty, -(lambd as f64));
            let b = kb.fconst(ty, bias as f64);
            let up = kb.b.ins().fsub(x, b);
            let down = kb.b.ins().fadd(x, b);
            let t = math::select_cmp(kb, FloatCC::GreaterThan, x, l, up, zero);
            math::select_cmp(kb, FloatCC::LessThan, x, nl, down, t)
        }
        UnaryOp::Asinh => {
            // sign(x) · ln(|x| + sqrt(x² + 1)), odd by construction.
            let one = kb.fconst(ty, 1.0);
            let ax = kb.b.ins().fabs(x);
            let t = kb.fmadd(ax, ax, one);
            let t = kb.b.ins().sqrt(t);
            let t = kb.b.ins().fadd(ax, t);
            let l = math::log(kb, t);
            math::with_sign_of(kb, l, x)
        }
        UnaryOp::Acosh => {
            let one = kb.fconst(ty, 1.0);
            let t = kb.b.ins().fmul(x, x);
            let t = kb.b.ins().fsub(t, one);
            let t = kb.b.ins().sqrt(t);
            let t = kb.b.ins().fadd(x, t);
            math::log(kb, t)
        }
        UnaryOp::Atanh => {
            let one = kb.fconst(ty, 1.0);
            let half = kb.fconst(ty, 0.5);
            let n = kb.b.ins().fadd(one, x);
            let d = kb.b.ins().fsub(one, x);
            let q = kb.b.ins().fdiv(n, d);
            let l = math::log(kb, q);
            kb.b.ins().fmul(l, half)
        }
        UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Tan
        | UnaryOp::Asin
        | UnaryOp::Acos
        | UnaryOp::Atan
        | UnaryOp::Sinh
        | UnaryOp::Cosh => {
            let f = libm_f32(op).expect("every trigonometric op has an f32 host function");
            kb.call_host_lanes(f, &[x])
        }
    }
}

/// The f32 host function behind `op`, for ops computed by libm.
fn libm_f32(op: UnaryOp) -> Option<HostFn> {
    Some(match op {
        UnaryOp::Sin => HostFn::Sinf,
        UnaryOp::Cos => HostFn::Cosf,
        UnaryOp::Tan => HostFn::Tanf,
        UnaryOp::Asin => HostFn::Asinf,
        UnaryOp::Acos => HostFn::Acosf,
        UnaryOp::Atan => HostFn::Atanf,
        UnaryOp::Sinh => HostFn::Sinhf,
        UnaryOp::Cosh => HostFn::Coshf,
        _ => return None,
    })
}

/// Extends an integer element to i64 (signed, or zero-extended for the
/// unsigned types and bool; u64 keeps its bits).
pub(crate) fn widen(kb: &mut Kb, x: Value, d: DType) -> Value {
    match d {
        DType::I64 | DType::U64 => x,
        DType::U8 | DType::U16 | DType::U32 | DType::Bool => kb.b.ins().uextend(I64, x),
        _ => kb.b.ins().sextend(I64, x),
    }
}

/// Narrows an i64 to the element type of `d` (wrapping).
pub(crate) fn narrow(kb: &mut Kb, x: Value, d: DType) -> Value {
    let t = scalar_type(d).expect("integer type");
    if t == I64 {
        x
    } else {
        kb.b.ins().ireduce(t, x)
    }
}

fn select_lt(kb: &mut Kb, x: Value, bound: i64, then: i64) -> Value {
    let c = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, bound);
    let t = kb.iconst(then);
    kb.b.ins().select(c, t, x)
}

fn select_gt(kb: &mut Kb, x: Value, bound: i64, then: i64) -> Value {
    let c = kb.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, bound);
    let t = kb.iconst(then);
    kb.b.ins().select(c, t, x)
}

/// Unary ops on unsigned elements zero-extended to i64, compared as
/// unsigned (a u64 above `i64::MAX` is not negative).
fn unary_uint(kb: &mut Kb, op: UnaryOp, x: Value) -> Value {
    match op {
        UnaryOp::Relu | UnaryOp::Abs => x,
        UnaryOp::Neg => kb.b.ins().ineg(x),
        UnaryOp::Sign => {
            let nz = kb.b.ins().icmp_imm_u(IntCC::NotEqual, x, 0);
            kb.b.ins().uextend(I64, nz)
        }
        UnaryOp::Clip { min, max } => {
            // As the reference: bounds rounded inward, saturated to u64.
            let lo = (min as f64).ceil() as u64 as i64;
            let hi = (max as f64).floor() as u64 as i64;
            let lo = kb.iconst(lo);
            let hi = kb.iconst(hi);
            let y = kb.b.ins().umax(x, lo);
            kb.b.ins().umin(y, hi)
        }
        _ => unreachable!("checked by accepts_int"),
    }
}

fn unary_int(kb: &mut Kb, op: UnaryOp, x: Value, d: DType) -> Value {
    let x = widen(kb, x, d);
    if d.is_unsigned() {
        let r = unary_uint(kb, op, x);
        return narrow(kb, r, d);
    }
    let r = match op {
        UnaryOp::Relu => select_lt(kb, x, 0, 0),
        UnaryOp::Neg => kb.b.ins().ineg(x),
        UnaryOp::Abs => {
            let n = kb.b.ins().ineg(x);
            let c = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
            kb.b.ins().select(c, n, x)
        }
        UnaryOp::Sign => {
            let one = kb.iconst(1);
            let minus_one = kb.iconst(-1);
            let pos = kb.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
            let t = kb.b.ins().select(pos, one, x);
            let neg = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
            kb.b.ins().select(neg, minus_one, t)
        }
        UnaryOp::Clip { min, max } => {
            // Reference semantics: clamp in f64, then truncate toward zero.
            let (min, max) = (min as f64, max as f64);
            let y = select_lt(kb, x, min.ceil() as i64, min.trunc() as i64);
            select_gt(kb, y, max.floor() as i64, max.trunc() as i64)
        }
        _ => unreachable!("checked by accepts_int"),
    };
    narrow(kb, r, d)
}

/// Binary elementwise ops with broadcasting.
pub(crate) fn binary(kb: &mut Kb, cx: &NodeCx, op: BinaryOp) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    if matches!(d, DType::F16 | DType::BF16 | DType::Bool) {
        return Err(cx.dtype_err(d));
    }
    let a = out_and_input(kb, cx, 0);
    let b = out_and_input(kb, cx, 1);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    if d.is_float() {
        let vector = if matches!(op, BinaryOp::Pow | BinaryOp::Mod | BinaryOp::Fmod) {
            None
        } else {
            vector_type(d)
        };
        map(kb, &shape, out, &[a, b], vector, &move |kb, v| {
            binary_float(kb, op, v[0], v[1])
        });
    } else {
        map(kb, &shape, out, &[a, b], None, &move |kb, v| {
            let x = widen(kb, v[0], d);
            let y = widen(kb, v[1], d);
            let r = if d.is_unsigned() {
                binary_uint(kb, op, x, y)
            } else {
                binary_int(kb, op, x, y)
            };
            narrow(kb, r, d)
        });
    }
    Ok(())
}

/// A float binary op on scalars or vectors.
pub(crate) fn binary_float(kb: &mut Kb, op: BinaryOp, a: Value, b: Value) -> Value {
    match op {
        BinaryOp::Add => kb.b.ins().fadd(a, b),
        BinaryOp::Sub => kb.b.ins().fsub(a, b),
        BinaryOp::Mul => kb.b.ins().fmul(a, b),
        BinaryOp::Div => kb.b.ins().fdiv(a, b),
        BinaryOp::Pow => math::pow(kb, a, b),
        BinaryOp::Max => kb.b.ins().fmax(a, b),
        BinaryOp::Min => kb.b.ins().fmin(a, b),
        BinaryOp::Fmod => math::fmod(kb, a, b),
        BinaryOp::Mod => {
            // fmod, then moved into the divisor's sign: r + b when r != 0
            // and the signs differ.
            let ty = kb.b.func.dfg.value_type(a);
            let r = math::fmod(kb, a, b);
            let zero = kb.fconst(ty, 0.0);
            let rb = kb.b.ins().fmul(r, b);
            let shifted = kb.b.ins().fadd(r, b);
            math::select_cmp(kb, FloatCC::LessThan, rb, zero, shifted, r)
        }
        BinaryOp::PRelu => {
            let ty = kb.b.func.dfg.value_type(a);
            let zero = kb.fconst(ty, 0.0);
            let scaled = kb.b.ins().fmul(a, b);
            math::select_cmp(kb, FloatCC::LessThan, a, zero, scaled, a)
        }
    }
}

/// `a % b` on i64 with the remainder taking the dividend's sign (0 when
/// `b` is 0, and for `i64::MIN % -1`).
fn rem_int(kb: &mut Kb, a: Value, b: Value) -> Value {
    let zero = kb.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
    let neg1 = kb.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
    let either = kb.b.ins().bor(zero, neg1);
    let one = kb.iconst(1);
    let safe = kb.b.ins().select(either, one, b);
    let r = kb.b.ins().srem(a, safe);
    let z = kb.iconst(0);
    kb.b.ins().select(either, z, r)
}

/// Integer semantics on i64 (wrapping; division by zero gives 0 instead of
/// trapping, and a negative exponent gives 0).
fn binary_int(kb: &mut Kb, op: BinaryOp, a: Value, b: Value) -> Value {
    match op {
        BinaryOp::Add => kb.b.ins().iadd(a, b),
        BinaryOp::Sub => kb.b.ins().isub(a, b),
        BinaryOp::Mul => kb.b.ins().imul(a, b),
        BinaryOp::Div => {
            let zero = kb.b.ins().icmp_imm_s(IntCC::Equal, b, 0);
            let neg1 = kb.b.ins().icmp_imm_s(IntCC::Equal, b, -1);
            let either = kb.b.ins().bor(zero, neg1);
            let one = kb.iconst(1);
            let safe = kb.b.ins().select(either, one, b);
            let q = kb.b.ins().sdiv(a, safe);
            let na = kb.b.ins().ineg(a);
            let r = kb.b.ins().select(neg1, na, q);
            let z = kb.iconst(0);
            kb.b.ins().select(zero, z, r)
        }
        BinaryOp::Pow => {
            let mut r = kb.iconst(1);
            let mut base = a;
            for bit in 0..32 {
                let m = kb.b.ins().band_imm_u(b, 1i64 << bit);
                let set = kb.b.ins().icmp_imm_s(IntCC::NotEqual, m, 0);
                let rb = kb.b.ins().imul(r, base);
                r = kb.b.ins().select(set, rb, r);
                base = kb.b.ins().imul(base, base);
            }
            let neg = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, b, 0);
            let z = kb.iconst(0);
            kb.b.ins().select(neg, z, r)
        }
        BinaryOp::Max => kb.b.ins().smax(a, b),
        BinaryOp::Min => kb.b.ins().smin(a, b),
        BinaryOp::Fmod => rem_int(kb, a, b),
        BinaryOp::Mod => {
            let r = rem_int(kb, a, b);
            let x = kb.b.ins().bxor(r, b);
            let signs_differ = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
            let nonzero = kb.b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
            let fix = kb.b.ins().band(signs_differ, nonzero);
            let shifted = kb.b.ins().iadd(r, b);
            kb.b.ins().select(fix, shifted, r)
        }
        BinaryOp::PRelu => {
            let scaled = kb.b.ins().imul(a, b);
            let neg = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, a, 0);
            kb.b.ins().select(neg, scaled, a)
        }
    }
}

/// Unsigned integer semantics on zero-extended i64 (wrapping; division and
/// remainder by zero give 0 instead of trapping; `Mod` and `Fmod` agree,
/// and `PRelu` is the identity).
fn binary_uint(kb: &mut Kb, op: BinaryOp, a: Value, b: Value) -> Value {
    let safe_div = |kb: &mut Kb, rem: bool| {
        let zero = kb.b.ins().icmp_imm_u(IntCC::Equal, b, 0);
        let one = kb.iconst(1);
        let safe = kb.b.ins().select(zero, one, b);
        let q = if rem {
            kb.b.ins().urem(a, safe)
        } else {
            kb.b.ins().udiv(a, safe)
        };
        let z = kb.iconst(0);
        kb.b.ins().select(zero, z, q)
    };
    match op {
        BinaryOp::Div => safe_div(kb, false),
        BinaryOp::Mod | BinaryOp::Fmod => safe_div(kb, true),
        BinaryOp::Max => kb.b.ins().umax(a, b),
        BinaryOp::Min => kb.b.ins().umin(a, b),
        BinaryOp::PRelu => a,
        BinaryOp::Pow => {
            // The exponent is unsigned: one at or above 2^32 gives 0, as the
            // reference evaluator rejects it.
            let r = binary_int(kb, op, a, b);
            let big =
                kb.b.ins()
                    .icmp_imm_u(IntCC::UnsignedGreaterThan, b, u32::MAX as i64);
            let z = kb.iconst(0);
            kb.b.ins().select(big, z, r)
        }
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul => binary_int(kb, op, a, b),
    }
}

/// Element type conversion (ONNX Cast: float to int truncates toward zero
/// and saturates, like Rust `as`; to bool is `!= 0`).
pub(crate) fn cast(kb: &mut Kb, cx: &NodeCx, to: DType) -> Result<(), CpuError> {
    let from = cx.inputs[0].1.dtype;
    if matches!(
        (from, to),
        (DType::F32, DType::BF16) | (DType::BF16, DType::F32)
    ) {
        return cast_bf16(kb, cx, to);
    }
    if matches!(
        (from, to),
        (DType::F32, DType::F16) | (DType::F16, DType::F32)
    ) {
        return cast_f16(kb, cx, to);
    }
    for d in [from, to] {
        if scalar_type(d).is_none() {
            return Err(cx.dtype_err(d));
        }
    }
    if cast_vector(kb, cx, from, to) {
        return Ok(());
    }
    let input = out_and_input(kb, cx, 0);
    let out = (kb.ptr(cx.out), to);
    let shape = cx.node.ty.shape.clone();
    let vector = if from == to { vector_type(from) } else { None };
    map(kb, &shape, out, &[input], vector, &move |kb, v| {
        cast_value(kb, v[0], from, to)
    });
    Ok(())
}

/// Elements per iteration of [`cast_vector`]: four 128-bit vectors of 32-bit
/// lanes, which narrow into one vector of 16 bytes.
const CAST_BLOCK: usize = 16;

/// The casts of int8 quantization (f32 → i32/i8/u8, i32/i8/u8 → f32) as
/// vector loops over the contiguous elements, `CAST_BLOCK` at a time, with
/// the scalar [`cast_value`] for the tail: the same truncation, saturation
/// and NaN → 0 as the scalar code (the saturating f32x4 → i32x4
/// conversion, then a clamp to the target range and saturating packs that
/// cannot saturate further; bytes are widened exactly). Returns false for
/// other pairs.
fn cast_vector(kb: &mut Kb, cx: &NodeCx, from: DType, to: DType) -> bool {
    use cranelift_codegen::ir::types::{F32X4, I16X8, I32X4, I8X16};
    let pairs = matches!(
        (from, to),
        (DType::F32, DType::I32 | DType::I8 | DType::U8)
            | (DType::I32 | DType::I8 | DType::U8, DType::F32)
    );
    let n = cx.node.ty.num_elements();
    if !pairs || n < CAST_BLOCK {
        return false;
    }
    let src = kb.ptr(cx.inputs[0].0);
    let dst = kb.ptr(cx.out);
    let out_size = to.size_bytes() as i64;
    let blocks = n / CAST_BLOCK;
    let lane_range = match to {
        DType::I8 | DType::U8 => {
            let (lo, hi) = int_range(to);
            let lo = kb.b.ins().iconst(I32, lo);
            let hi = kb.b.ins().iconst(I32, hi);
            Some((kb.b.ins().splat(I32X4, lo), kb.b.ins().splat(I32X4, hi)))
        }
        _ => None,
    };
    let in_size = from.size_bytes() as i64;
    for_range(kb, 0, blocks as i64, 1, &mut |kb, b| {
        let s = kb.add_scaled(src, b, CAST_BLOCK as i64 * in_size);
        let d = kb.add_scaled(dst, b, CAST_BLOCK as i64 * out_size);
        if in_size == 1 {
            // 16 bytes → 2 × i16x8 → 4 × i32x4 → 4 × f32x4.
            let v = kb.load(I8X16, s, 0);
            let signed = from == DType::I8;
            let widen = |kb: &mut Kb, v: Value, high: bool| match (signed, high) {
                (true, false) => kb.b.ins().swiden_low(v),
                (true, true) => kb.b.ins().swiden_high(v),
                (false, false) => kb.b.ins().uwiden_low(v),
                (false, true) => kb.b.ins().uwiden_high(v),
            };
            for (h, high) in [false, true].into_iter().enumerate() {
                let half = widen(kb, v, high);
                for (q, high) in [false, true].into_iter().enumerate() {
                    let quarter = widen(kb, half, high);
                    let f = kb.b.ins().fcvt_from_sint(F32X4, quarter);
                    kb.store(f, d, 16 * (2 * h + q) as i64);
                }
            }
            return;
        }
        let lanes: Vec<Value> = (0..4)
            .map(|q| {
                if from == DType::I32 {
                    let v = kb.load(I32X4, s, 16 * q);
                    kb.b.ins().fcvt_from_sint(F32X4, v)
                } else {
                    let v = kb.load(F32X4, s, 16 * q);
                    kb.b.ins().fcvt_to_sint_sat(I32X4, v)
                }
            })
            .collect();
        match lane_range {
            None => {
                for (q, v) in lanes.into_iter().enumerate() {
                    kb.store(v, d, 16 * q as i64);
                }
            }
            Some((lo, hi)) => {
                let clamped: Vec<Value> = lanes
                    .into_iter()
                    .map(|v| {
                        let v = kb.b.ins().smax(v, lo);
                        kb.b.ins().smin(v, hi)
                    })
                    .collect();
                let w0 = kb.b.ins().snarrow(clamped[0], clamped[1]);
                let w1 = kb.b.ins().snarrow(clamped[2], clamped[3]);
                debug_assert_eq!(kb.b.func.dfg.value_type(w0), I16X8);
                let bytes = if to == DType::U8 {
                    kb.b.ins().unarrow(w0, w1)
                } else {
                    kb.b.ins().snarrow(w0, w1)
                };
                kb.store(bytes, d, 0);
            }
        }
    });
    let from_ty = scalar_type(from).expect("checked");
    for_range(
        kb,
        (blocks * CAST_BLOCK) as i64,
        n as i64,
        1,
        &mut |kb, i| {
            let s = kb.add_scaled(src, i, in_size);
            let x = kb.load(from_ty, s, 0);
            let y = cast_value(kb, x, from, to);
            let d = kb.add_scaled(dst, i, out_size);
            kb.store(y, d, 0);
        },
    );
    true
}

/// Maps a cast between f32 and the 16-bit float `half` over the node's
/// elements, the 16-bit side moved as `i16` bits: `convert` gets the
/// loaded value (an f32, or the bits as `i16`) and little-endian flags for
/// bitcasts, and returns the value to store.
fn map_half_cast(
    kb: &mut Kb,
    cx: &NodeCx,
    to: DType,
    half: DType,
    convert: &dyn Fn(&mut Kb, &[Value], MemFlagsData) -> Value,
) {
    let mut input = out_and_input(kb, cx, 0);
    let bits = |d: DType| if d == half { DType::I16 } else { d };
    input.dtype = bits(input.dtype);
    let out = (kb.ptr(cx.out), bits(to));
    let shape = cx.node.ty.shape.clone();
    let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    map(kb, &shape, out, &[input], None, &move |kb, v| {
        convert(kb, v, flags)
    });
}

/// f32 ↔ bf16 with integer arithmetic (bf16 is the high half of an f32):
/// to bf16 rounds to nearest even and keeps NaNs quiet NaNs, as
/// `half::bf16::from_f32` and the reference evaluator do; to f32 is exact.
/// The 16-bit side is moved as `i16` bits.
fn cast_bf16(kb: &mut Kb, cx: &NodeCx, to: DType) -> Result<(), CpuError> {
    map_half_cast(kb, cx, to, DType::BF16, &move |kb, v, flags| {
        if to == DType::F32 {
            let w = kb.b.ins().uextend(I32, v[0]);
            let w = kb.b.ins().ishl_imm_u(w, 16);
            return kb.b.ins().bitcast(F32, flags, w);
        }
        let x = v[0];
        let b = kb.b.ins().bitcast(I32, flags, x);
        let hi = kb.b.ins().ushr_imm_u(b, 16);
        let lsb = kb.b.ins().band_imm_u(hi, 1);
        let bias = kb.b.ins().iadd_imm_u(lsb, 0x7fff);
        let r = kb.b.ins().iadd(b, bias);
        let r = kb.b.ins().ushr_imm_u(r, 16);
        let quiet = kb.b.ins().bor_imm_u(hi, 0x40);
        let nan = kb.b.ins().fcmp(FloatCC::Unordered, x, x);
        let r = kb.b.ins().select(nan, quiet, r);
        kb.b.ins().ireduce(I16, r)
    });
    Ok(())
}

/// f32 ↔ f16 with integer arithmetic, so it needs no F16C and runs on
/// every target (F. Giesen's branch-free conversions): to f16 rounds to
/// nearest even, overflows to infinity and keeps NaNs NaN, as
/// `half::f16::from_f32` does; to f32 is exact, subnormals included.
/// The 16-bit side is moved as `i16` bits.
fn cast_f16(kb: &mut Kb, cx: &NodeCx, to: DType) -> Result<(), CpuError> {
    map_half_cast(kb, cx, to, DType::F16, &move |kb, v, flags| {
        if to == DType::F32 {
            let h = kb.b.ins().uextend(I32, v[0]);
            let sign = kb.b.ins().band_imm_u(h, 0x8000);
            let sign = kb.b.ins().ishl_imm_u(sign, 16);
            let magnitude = kb.b.ins().band_imm_u(h, 0x7fff);
            let shifted = kb.b.ins().ishl_imm_u(magnitude, 13);
            let exp = kb.b.ins().band_imm_u(shifted, 0x0f80_0000);
            // Rebias the exponent (15 → 127).
            let normal = kb.b.ins().iadd_imm_u(shifted, (127 - 15) << 23);
            // Inf/NaN: the exponent goes all ones.
            let special = kb.b.ins().iadd_imm_u(normal, (128 - 16) << 23);
            // Zero and subnormals: renormalize through a float subtraction.
            let denormal = kb.b.ins().iadd_imm_u(normal, 1 << 23);
            let denormal = kb.b.ins().bitcast(F32, flags, denormal);
            let magic = kb.b.ins().f32const(f32::from_bits(113 << 23));
            let denormal = kb.b.ins().fsub(denormal, magic);
            let denormal = kb.b.ins().bitcast(I32, flags, denormal);
            let is_special = kb.b.ins().icmp_imm_u(IntCC::Equal, exp, 0x0f80_0000);
            let is_denormal = kb.b.ins().icmp_imm_u(IntCC::Equal, exp, 0);
            let r = kb.b.ins().select(is_denormal, denormal, normal);
            let r = kb.b.ins().select(is_special, special, r);
            let r = kb.b.ins().bor(r, sign);
            return kb.b.ins().bitcast(F32, flags, r);
        }
        let f = kb.b.ins().bitcast(I32, flags, v[0]);
        let sign = kb.b.ins().band_imm_u(f, 0x8000_0000);
        let u = kb.b.ins().bxor(f, sign);
        // |x| ≥ 65520 rounds to infinity; NaN stays a (quiet) NaN.
        let is_nan =
            kb.b.ins()
                .icmp_imm_u(IntCC::UnsignedGreaterThan, u, 255 << 23);
        let inf = kb.b.ins().iconst(I32, 0x7c00);
        let nan = kb.b.ins().iconst(I32, 0x7e00);
        let overflow = kb.b.ins().select(is_nan, nan, inf);
        let is_overflow =
            kb.b.ins()
                .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, u, (127 + 16) << 23);
        // Results below the smallest normal f16: adding a magic float makes
        // the FPU round the mantissa into place.
        const DENORM_MAGIC: u32 = ((127 - 15) + (23 - 10) + 1) << 23;
        let uf = kb.b.ins().bitcast(F32, flags, u);
        let magic = kb.b.ins().f32const(f32::from_bits(DENORM_MAGIC));
        let sub = kb.b.ins().fadd(uf, magic);
        let sub = kb.b.ins().bitcast(I32, flags, sub);
        let sub = kb.b.ins().iadd_imm_s(sub, -(DENORM_MAGIC as i64));
        let is_sub = kb.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, u, 113 << 23);
        // Normal results: rebias and round to nearest even.
        let odd = kb.b.ins().ushr_imm_u(u, 13);
        let odd = kb.b.ins().band_imm_u(odd, 1);
        let normal = kb.b.ins().iadd_imm_s(u, ((15 - 127) << 23) + 0xfff);
        let normal = kb.b.ins().iadd(normal, odd);
        let normal = kb.b.ins().ushr_imm_u(normal, 13);
        let r = kb.b.ins().select(is_sub, sub, normal);
        let r = kb.b.ins().select(is_overflow, overflow, r);
        let sign = kb.b.ins().ushr_imm_u(sign, 16);
        let r = kb.b.ins().bor(r, sign);
        kb.b.ins().ireduce(I16, r)
    });
    Ok(())
}

pub(crate) fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        // Bits of 0 and u64::MAX; compared as unsigned by the callers.
        DType::U64 => (0, -1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// `x` (of type `from`) converted to `to` as the `Cast` kernel converts one
/// element (the reference evaluator's rules).
pub(crate) fn cast_value(kb: &mut Kb, x: Value, from: DType, to: DType) -> Value {
    if from == to {
        return x;
    }
    // The narrow types convert through their value: f32 for the floats,
    // i64 for the integers.
    if from.is_narrow() {
        let v = super::narrow::decode(kb, x, from);
        let wide = if kiln_ir::narrow::is_narrow_int(from) {
            DType::I64
        } else {
            DType::F32
        };
        return cast_value(kb, v, wide, to);
    }
    if to.is_narrow() {
        let int_source = !from.is_float();
        let v = match from {
            DType::F64 => kb.b.ins().fdemote(F32, x),
            DType::F32 => x,
            _ => widen(kb, x, from),
        };
        return super::narrow::encode(kb, v, to, int_source);
    }
    let to_ty = scalar_type(to).expect("checked");
    if from.is_float() {
        let from_ty = scalar_type(from).expect("checked");
        if to.is_float() {
            return if to_ty == F64 {
                kb.b.ins().fpromote(F64, x)
            } else {
                kb.b.ins().fdemote(F32, x)
            };
        }
        if to == DType::Bool {
            let z = kb.fconst(from_ty, 0.0);
            return kb.b.ins().fcmp(FloatCC::NotEqual, x, z);
        }
        if to == DType::U64 {
            return kb.b.ins().fcvt_to_uint_sat(I64, x);
        }
        let v = kb.b.ins().fcvt_to_sint_sat(I64, x);
        if to == DType::I64 {
            return v;
        }
        let (lo, hi) = int_range(to);
        let lo = kb.iconst(lo);
        let hi = kb.iconst(hi);
        let v = kb.b.ins().smax(v, lo);
        let v = kb.b.ins().smin(v, hi);
        return kb.b.ins().ireduce(to_ty, v);
    }
    let v = widen(kb, x, from);
    if to.is_float() {
        return if from == DType::U64 {
            kb.b.ins().fcvt_from_uint(to_ty, v)
        } else {
            kb.b.ins().fcvt_from_sint(to_ty, v)
        };
    }
    if to == DType::Bool {
        return kb.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0);
    }
    match to_ty {
        I64 => v,
        I8 | I16 | I32 => kb.b.ins().ireduce(to_ty, v),
        _ => unreachable!("integer target"),
    }
}

/// A contiguous f32 → u8 cast (the end of every int8 activation
/// quantization) as the AVX-512 [`NarrowSpec`] kernel, split into at most
/// `tasks` ranges of [`MIN_NARROW_TASK`] elements or more; `None` for any
/// other node.
///
/// [`NarrowSpec`]: crate::microkernel::narrow::NarrowSpec
pub(crate) fn narrow_avx512(
    cx: &NodeCx,
    tasks: usize,
) -> Option<Vec<Result<Vec<u8>, crate::microkernel::MicrokernelError>>> {
    let (x, ty) = *cx.inputs.first()?;
    if cx.node.op != (kiln_ir::Op::Cast { to: DType::U8 }) || ty.dtype != DType::F32 {
        return None;
    }
    let len = ty.num_elements();
    if len == 0 {
        return None;
    }
    let spec = crate::microkernel::narrow::NarrowSpec { len, x, y: cx.out };
    let tasks = tasks.min(len / MIN_NARROW_TASK).max(1);
    Some(spec.split(tasks).iter().map(|s| s.assemble()).collect())
}

/// The fewest elements worth a task of their own in [`narrow_avx512`]
/// (a few microseconds of streaming).
const MIN_NARROW_TASK: usize = 64 << 10;
