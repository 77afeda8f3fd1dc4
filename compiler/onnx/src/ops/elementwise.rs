//! Elementwise ops: binary arithmetic (with legacy broadcasting), variadic
//! Max/Min/Sum/Mean, unary activations, Clip and Softmax.

use super::build::{cast_to, reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{AttributeReader, BinaryOp, CompareOp, DType, Data, LogicalOp, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

fn binary(ctx: &mut ImportCtx, node: &NodeProto, op: BinaryOp) -> R {
    let (a, mut b) = binary_operands(ctx, node)?;
    if op == BinaryOp::Pow {
        // The exponent may have another type (opset 12+).
        let dt = ctx.ty(a).dtype;
        b = cast_to(ctx, b, dt, "exponent")?;
    }
    one(ctx.op(Op::Binary(op), &[a, b], None)?)
}

/// The two operands of a broadcasting binary op, with the legacy
/// (opset < 7) `broadcast`/`axis` alignment of B applied.
pub(crate) fn binary_operands(
    ctx: &mut ImportCtx,
    node: &NodeProto,
) -> Result<(Val, Val), OnnxError> {
    let a = ctx.input(node, 0)?;
    let mut b = ctx.input(node, 1)?;
    // Opsets 1-6: `broadcast=1` with `axis` aligns B's dims at `axis` of A.
    if ctx.opset < 7 && ctx.attr_i_or(node, "broadcast", 0)? == 1 {
        let (ra, rb) = (ctx.ty(a).shape.len(), ctx.ty(b).shape.len());
        if let Some(axis) = ctx.attr_i(node, "axis")? {
            let axis = if axis < 0 { axis + ra as i64 } else { axis };
            if axis < 0 || axis as usize + rb > ra {
                return Err(ctx.bad_attr(
                    "axis",
                    format!("B of rank {rb} does not fit A of rank {ra} at axis {axis}"),
                ));
            }
            let mut shape = vec![1; axis as usize];
            shape.extend(ctx.ty(b).shape.iter().copied());
            shape.resize(ra, 1);
            b = reshape_to(ctx, b, &shape, Some("broadcast"))?;
        }
    }
    Ok((a, b))
}

/// `Add`.
pub fn add(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    binary(ctx, node, BinaryOp::Add)
}
/// `Sub`.
pub fn sub(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    binary(ctx, node, BinaryOp::Sub)
}
/// `Mul`.
pub fn mul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    binary(ctx, node, BinaryOp::Mul)
}
/// `Div`.
pub fn div(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    binary(ctx, node, BinaryOp::Div)
}
/// `Pow`.
pub fn pow(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    binary(ctx, node, BinaryOp::Pow)
}

fn chain(ctx: &mut ImportCtx, node: &NodeProto, op: BinaryOp) -> Result<Val, OnnxError> {
    let inputs = ctx.inputs(node);
    let Some((&first, rest)) = inputs.split_first() else {
        return Err(ctx.invalid("needs at least one input"));
    };
    let mut acc = first;
    for (i, &x) in rest.iter().enumerate() {
        let suffix = format!("{}{}", op.name(), i + 1);
        let last = i + 1 == rest.len();
        acc = ctx.op(
            Op::Binary(op),
            &[acc, x],
            (!last).then_some(suffix.as_str()),
        )?;
    }
    Ok(acc)
}

/// `Max` (variadic).
pub fn max(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    one(chain(ctx, node, BinaryOp::Max)?)
}
/// `Min` (variadic).
pub fn min(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    one(chain(ctx, node, BinaryOp::Min)?)
}
/// `Sum` (variadic).
pub fn sum(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    one(chain(ctx, node, BinaryOp::Add)?)
}
/// `Mean` (variadic): the sum divided by the input count.
pub fn mean(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let n = ctx.inputs(node).len();
    let s = chain(ctx, node, BinaryOp::Add)?;
    if n == 1 {
        return one(s);
    }
    let dt = ctx.ty(s).dtype;
    let c = scalar(ctx, dt, n as f64, "count");
    one(ctx.op(Op::Binary(BinaryOp::Div), &[s, c], None)?)
}

fn unary(ctx: &mut ImportCtx, node: &NodeProto, op: UnaryOp) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::Unary(op), &[x], None)?)
}

macro_rules! simple_unary {
    ($($f:ident => $op:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $f(ctx: &mut ImportCtx, node: &NodeProto) -> R {
            unary(ctx, node, UnaryOp::$op)
        }
    )*};
}

simple_unary! {
    relu => Relu, "`Relu`.";
    sigmoid => Sigmoid, "`Sigmoid`.";
    tanh => Tanh, "`Tanh`.";
    hard_swish => HardSwish, "`HardSwish`.";
    neg => Neg, "`Neg`.";
    abs => Abs, "`Abs`.";
    sqrt => Sqrt, "`Sqrt`.";
    exp => Exp, "`Exp`.";
    log => Log, "`Log`.";
    reciprocal => Reciprocal, "`Reciprocal`.";
    floor => Floor, "`Floor`.";
    ceil => Ceil, "`Ceil`.";
    round => Round, "`Round` (half to even).";
    sign => Sign, "`Sign`.";
    erf => Erf, "`Erf`.";
    softplus => Softplus, "`Softplus`.";
    softsign => Softsign, "`Softsign`.";
    mish => Mish, "`Mish`.";
    sin => Sin, "`Sin`.";
    cos => Cos, "`Cos`.";
    tan => Tan, "`Tan`.";
    asin => Asin, "`Asin`.";
    acos => Acos, "`Acos`.";
    atan => Atan, "`Atan`.";
    sinh => Sinh, "`Sinh`.";
    cosh => Cosh, "`Cosh`.";
    asinh => Asinh, "`Asinh`.";
    acosh => Acosh, "`Acosh`.";
    atanh => Atanh, "`Atanh`.";
}

/// `Gelu` (opset 20): exact (erf) or `approximate="tanh"`.
pub fn gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let tanh = match ctx.attr_s(node, "approximate")?.as_deref() {
        None | Some("none") => false,
        Some("tanh") => true,
        Some(other) => {
            return Err(ctx.bad_attr(
                "approximate",
                format!("must be \"none\" or \"tanh\", got \"{other}\""),
            ))
        }
    };
    unary(ctx, node, UnaryOp::Gelu { tanh })
}

/// A node's attributes as a unary op's table reads them.
struct NodeAttributes<'a, 'm> {
    ctx: &'a ImportCtx<'m>,
    node: &'a NodeProto,
}

impl AttributeReader for NodeAttributes<'_, '_> {
    type Error = OnnxError;

    fn read_f32(&mut self, name: &'static str, default: f32) -> Result<f32, OnnxError> {
        self.ctx.attr_f_or(self.node, name, default)
    }

    fn read_bool(&mut self, name: &'static str, default: bool) -> Result<bool, OnnxError> {
        Ok(self.ctx.attr_i_or(self.node, name, default as i64)? != 0)
    }
}

/// The IR unary op `name` (text format), its attributes read from the
/// node: for the ops that come here the ONNX attributes are the IR's, with
/// the same names and defaults (the table of [`UnaryOp`]).
fn unary_op_named(ctx: &ImportCtx, node: &NodeProto, name: &str) -> Result<UnaryOp, OnnxError> {
    UnaryOp::from_name(name)
        .expect("an IR unary op")
        .read_attributes(&mut NodeAttributes { ctx, node })
}

/// `Elu`.
pub fn elu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "elu")?;
    unary(ctx, node, op)
}

/// `Selu` (the defaults are the self-normalizing constants).
pub fn selu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "selu")?;
    unary(ctx, node, op)
}

/// `Celu` (alpha not 0).
pub fn celu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "celu")?;
    if op == (UnaryOp::Celu { alpha: 0.0 }) {
        return Err(ctx.bad_attr("alpha", "must not be 0"));
    }
    unary(ctx, node, op)
}

/// `ThresholdedRelu`.
pub fn thresholded_relu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "thresholded_relu")?;
    unary(ctx, node, op)
}

/// `Shrink`.
pub fn shrink(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "shrink")?;
    unary(ctx, node, op)
}

/// `Mod`: `fmod=1` is C's fmod (the dividend's sign), `fmod=0` takes the
/// divisor's sign, like Python and numpy (on floats: C's fmod, plus the
/// divisor where a nonzero remainder's sign differs from it).
pub fn modulo(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let fmod = ctx.attr_i_or(node, "fmod", 0)? == 1;
    let (a, b) = binary_operands(ctx, node)?;
    let dtype = ctx.ty(a).dtype;
    if fmod || !dtype.is_float() {
        let op = if fmod { BinaryOp::Fmod } else { BinaryOp::Mod };
        return one(ctx.op(Op::Binary(op), &[a, b], None)?);
    }
    let r = ctx.op(Op::Binary(BinaryOp::Fmod), &[a, b], Some("fmod"))?;
    let zero = scalar(ctx, dtype, 0.0, "zero");
    let r_negative = ctx.op(Op::Compare(CompareOp::Less), &[r, zero], Some("r_negative"))?;
    let b_negative = ctx.op(Op::Compare(CompareOp::Less), &[b, zero], Some("b_negative"))?;
    let signs_differ = ctx.op(
        Op::Logical(LogicalOp::Xor),
        &[r_negative, b_negative],
        Some("signs_differ"),
    )?;
    let r_zero = ctx.op(Op::Compare(CompareOp::Equal), &[r, zero], Some("r_zero"))?;
    let r_nonzero = ctx.op(Op::Not, &[r_zero], Some("r_nonzero"))?;
    let shift = ctx.op(
        Op::Logical(LogicalOp::And),
        &[signs_differ, r_nonzero],
        Some("shift"),
    )?;
    let shifted = ctx.op(Op::Binary(BinaryOp::Add), &[r, b], Some("shifted"))?;
    one(ctx.op(Op::Where, &[shift, shifted, r], None)?)
}

/// `PRelu`: the slope broadcasts to X (unidirectionally; before opset 7 a
/// per-channel slope of shape `[C]` aligns with axis 1).
pub fn prelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let mut slope = ctx.input(node, 1)?;
    let xs = ctx.ty(x).shape.clone();
    let ss = ctx.ty(slope).shape.clone();
    if ss.len() == 1 && xs.len() > 2 && ss[0] == xs[1] && ss[0] != xs[xs.len() - 1] {
        let mut shape = vec![1; xs.len() - 1];
        shape[0] = ss[0];
        slope = reshape_to(ctx, slope, &shape, Some("slope"))?;
    }
    one(ctx.op(Op::Binary(BinaryOp::PRelu), &[x, slope], None)?)
}

/// `LeakyRelu`.
pub fn leaky_relu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "leaky_relu")?;
    unary(ctx, node, op)
}

/// `HardSigmoid`.
pub fn hard_sigmoid(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = unary_op_named(ctx, node, "hard_sigmoid")?;
    unary(ctx, node, op)
}

/// `Clip`: limits are attributes before opset 11 and optional constant
/// inputs from 11 on; a missing limit is unbounded.
pub fn clip(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let (min, max) = if ctx.opset < 11 {
        (
            ctx.attr_f_or(node, "min", f32::NEG_INFINITY)?,
            ctx.attr_f_or(node, "max", f32::INFINITY)?,
        )
    } else {
        let runtime = |i: usize| {
            ctx.opt_input(node, i)
                .is_some_and(|v| ctx.konst(v).is_none())
        };
        // An integer limit that f32 cannot hold exactly (beyond 2^24, as
        // large u32/u64/i64 limits are) is applied exactly as Max/Min.
        let inexact = |i: usize| {
            ctx.opt_input(node, i)
                .and_then(|v| ctx.konst(v))
                .is_some_and(|t| {
                    !t.dtype().is_float()
                        && t.len() == 1
                        && t.data().get_u64(0) as f32 as u64 != t.data().get_u64(0)
                        && t.data().get_i64(0) as f32 as i64 != t.data().get_i64(0)
                })
        };
        if runtime(1) || runtime(2) || inexact(1) || inexact(2) {
            return clip_by_values(ctx, node);
        }
        let limit = |ctx: &ImportCtx, i: usize, default: f32| -> Result<f32, OnnxError> {
            match ctx.opt_const_input(node, i)? {
                None => Ok(default),
                Some(t) if t.len() == 1 => Ok(t.to_f64_vec()[0] as f32),
                Some(t) => Err(ctx.bad_attr(
                    if i == 1 { "min" } else { "max" },
                    format!("must be a scalar, got shape {:?}", t.shape().as_slice()),
                )),
            }
        };
        (
            limit(ctx, 1, f32::NEG_INFINITY)?,
            limit(ctx, 2, f32::INFINITY)?,
        )
    };
    unary(ctx, node, UnaryOp::Clip { min, max })
}

/// `Clip` with a run-time limit: `min(max(x, lo), hi)` as broadcasting
/// binary ops (a limit above the other gives `hi`, as numpy's clip does).
fn clip_by_values(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    let mut y = x;
    for (i, op, tag) in [
        (1, BinaryOp::Max, "at_least_min"),
        (2, BinaryOp::Min, "at_most_max"),
    ] {
        let Some(l) = ctx.opt_input(node, i) else {
            continue;
        };
        if ctx.ty(l).num_elements() != 1 {
            return Err(ctx.bad_attr(
                if i == 1 { "min" } else { "max" },
                format!("must be a scalar, got {}", ctx.ty(l)),
            ));
        }
        let l = reshape_to(ctx, l, &[], Some(&format!("{tag}_scalar")))?;
        let l = cast_to(ctx, l, dt, &format!("{tag}_cast"))?;
        y = ctx.op(Op::Binary(op), &[y, l], Some(tag))?;
    }
    one(y)
}

/// `IsNaN`: `x != x`.
pub fn is_nan(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    if !ctx.ty(x).dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {}", ctx.ty(x))));
    }
    let same = ctx.op(Op::Compare(CompareOp::Equal), &[x, x], Some("self_equal"))?;
    one(ctx.op(Op::Not, &[same], None)?)
}

/// `IsInf` (`detect_positive`/`detect_negative`, both on by default):
/// equality with the infinities.
pub fn is_inf(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    if !dt.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {}", ctx.ty(x))));
    }
    let pos = ctx.attr_i_or(node, "detect_positive", 1)? != 0;
    let neg = ctx.attr_i_or(node, "detect_negative", 1)? != 0;
    let mut hit: Option<Val> = None;
    for (on, v, tag) in [
        (pos, f64::INFINITY, "pos_inf"),
        (neg, f64::NEG_INFINITY, "neg_inf"),
    ] {
        if !on {
            continue;
        }
        let c = scalar(ctx, dt, v, tag);
        let h = ctx.op(
            Op::Compare(CompareOp::Equal),
            &[x, c],
            Some(&format!("is_{tag}")),
        )?;
        hit = Some(match hit {
            None => h,
            Some(p) => ctx.op(Op::Logical(LogicalOp::Or), &[p, h], Some("either"))?,
        });
    }
    match hit {
        Some(h) => one(h),
        None => {
            // Neither sign detected: all false.
            let shape = ctx.ty(x).shape.clone();
            one(super::build::build_const(
                ctx,
                &shape,
                DType::Bool,
                "none",
                |n| Data::Bool(vec![false; n]),
            )?)
        }
    }
}

/// `Swish` (opset 24): `x · sigmoid(alpha · x)`.
pub fn swish(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let alpha = ctx.attr_f_or(node, "alpha", 1.0)?;
    one(silu(ctx, x, alpha as f64)?)
}

/// `SwiGLU`: `A · sigmoid(α·A) · B` (A and B of one shape).
pub fn swiglu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    if ctx.ty(a) != ctx.ty(b) {
        return Err(ctx.invalid(format!(
            "A {} and B {} must have one shape and type",
            ctx.ty(a),
            ctx.ty(b)
        )));
    }
    let alpha = ctx.attr_f_or(node, "alpha", 1.0)?;
    let gated = silu(ctx, a, alpha as f64)?;
    one(ctx.op(Op::Binary(BinaryOp::Mul), &[gated, b], None)?)
}

/// `x · sigmoid(α·x)` (Swish; SiLU for α = 1).
pub(crate) fn silu(ctx: &mut ImportCtx, x: Val, alpha: f64) -> Result<Val, OnnxError> {
    let dt = ctx.ty(x).dtype;
    let ax = if alpha == 1.0 {
        x
    } else {
        let a = scalar(ctx, dt, alpha, "alpha");
        ctx.op(Op::Binary(BinaryOp::Mul), &[x, a], Some("scaled"))?
    };
    let s = ctx.op(Op::Unary(UnaryOp::Sigmoid), &[ax], Some("gate"))?;
    ctx.op(Op::Binary(BinaryOp::Mul), &[x, s], Some("swish"))
}

/// `Softmax`. Before opset 13 it normalizes over the input flattened to 2-D
/// at `axis` (default 1); from 13 over the single `axis` (default -1).
pub fn softmax(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let rank = shape.len();
    if ctx.opset >= 13 {
        let axis = ctx.attr_i_or(node, "axis", -1)?;
        let axis = ctx.axis("axis", axis, rank)?;
        return one(ctx.op(Op::Softmax { axis }, &[x], None)?);
    }
    let axis = ctx.attr_i_or(node, "axis", 1)?;
    // axis may equal rank here (a [n, 1] view); normalize by hand.
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a as usize > rank {
        return Err(ctx.bad_attr(
            "axis",
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    let a = a as usize;
    if rank > 0 && a == rank - 1 {
        // The flattened view has the last axis as its second dim.
        return one(ctx.op(Op::Softmax { axis: a }, &[x], None)?);
    }
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a..].iter().product();
    let flat = reshape_to(ctx, x, &[outer, inner], Some("flatten"))?;
    let sm = ctx.op(Op::Softmax { axis: 1 }, &[flat], Some("softmax"))?;
    one(reshape_to(ctx, sm, &shape, None)?)
}

/// `LogSoftmax` in the stable form `d - log(Σ exp(d))` with `d = x - max(x)`.
/// Before opset 13 over the input flattened to 2-D at `axis` (default 1),
/// from 13 over the single `axis` (default -1).
pub fn log_softmax(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let rank = shape.len();
    let (view, axis) = if ctx.opset >= 13 {
        let axis = ctx.attr_i_or(node, "axis", -1)?;
        (x, ctx.axis("axis", axis, rank)?)
    } else {
        let axis = ctx.attr_i_or(node, "axis", 1)?;
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        if a < 0 || a as usize > rank {
            return Err(ctx.bad_attr(
                "axis",
                format!("axis {axis} is out of range for rank {rank}"),
            ));
        }
        let a = a as usize;
        let outer: usize = shape[..a].iter().product();
        let inner: usize = shape[a..].iter().product();
        (reshape_to(ctx, x, &[outer, inner], Some("flatten"))?, 1)
    };
    if !ctx.ty(x).dtype.is_float() {
        return Err(ctx.unsupported(format!("LogSoftmax on {}", ctx.ty(x).dtype)));
    }
    let y = log_softmax_along(ctx, view, axis)?;
    one(reshape_to(ctx, y, &shape, None)?)
}

/// `x - max - log(Σ exp(x - max))` along `axis`.
pub(crate) fn log_softmax_along(
    ctx: &mut ImportCtx,
    view: Val,
    axis: usize,
) -> Result<Val, OnnxError> {
    let reduce = |op| Op::Reduce {
        op,
        axes: [axis].into_iter().collect(),
        keep_dims: true,
    };
    let m = ctx.op(reduce(kiln_ir::ReduceOp::Max), &[view], Some("max"))?;
    let d = ctx.op(Op::Binary(BinaryOp::Sub), &[view, m], Some("shifted"))?;
    let e = ctx.op(Op::Unary(UnaryOp::Exp), &[d], Some("exp"))?;
    let s = ctx.op(reduce(kiln_ir::ReduceOp::Sum), &[e], Some("sum"))?;
    let l = ctx.op(Op::Unary(UnaryOp::Log), &[s], Some("log_sum"))?;
    ctx.op(Op::Binary(BinaryOp::Sub), &[d, l], Some("log_softmax"))
}
