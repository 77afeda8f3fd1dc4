//! Data movement: `Flatten`, `Reshape`, `Transpose`, `Concat`, `Identity`,
//! `Dropout`, `Gather`, `Slice`, `Squeeze`, `Unsqueeze`, `Cast`, `Expand`.

use super::build::{cast_to, reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val, FOLD_LIMIT_BYTES};
use crate::tensor::{dtype_from_onnx_name, dtype_or_err};
use crate::OnnxError;
use kiln_ir::narrow::{FloatFormat, Specials};
use kiln_ir::{infer::broadcast_shapes, CompareOp, DType, Data, Op, SliceAxis, Tensor, UnaryOp};
use tract_onnx::pb::attribute_proto::AttributeType;
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `Flatten`: `[prod(dims[..axis]), prod(dims[axis..])]`.
pub fn flatten(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let r = shape.len() as i64;
    let axis = ctx.attr_i_or(node, "axis", 1)?;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a > r {
        return Err(ctx.bad_attr("axis", format!("axis {axis} is out of range for rank {r}")));
    }
    let a = a as usize;
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a..].iter().product();
    one(reshape_to(ctx, x, &[outer, inner], None)?)
}

/// Resolves an ONNX Reshape target (`0` copies the input dim unless
/// `allowzero`, one `-1` is inferred).
fn resolve_shape(
    ctx: &ImportCtx,
    input: &[usize],
    target: &[i64],
    allowzero: bool,
) -> Result<Vec<usize>, OnnxError> {
    let bad = |m: String| ctx.bad_attr("shape", m);
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            -1 => return Err(bad(format!("more than one -1 in {target:?}"))),
            0 if !allowzero => match input.get(i) {
                Some(&v) => out.push(v),
                None => {
                    return Err(bad(format!(
                        "0 at position {i} of {target:?} has no input dim to copy"
                    )))
                }
            },
            d if d >= 0 => out.push(d as usize),
            d => return Err(bad(format!("invalid dim {d} in {target:?}"))),
        }
    }
    let total: usize = input.iter().product();
    if let Some(i) = infer_at {
        // A product that overflows cannot divide the (addressable) total.
        let known = (out.iter()).try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let known = known.unwrap_or(0);
        if known == 0 || !total.is_multiple_of(known) {
            return Err(bad(format!(
                "cannot infer -1 in {target:?} for input shape {input:?}"
            )));
        }
        out[i] = total / known;
    }
    Ok(out)
}

/// `Reshape`: the target is an attribute before opset 5 and a constant
/// input from 5 on.
pub fn reshape(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let target = if ctx.opset < 5 {
        ctx.attr_ints(node, "shape")?
            .ok_or_else(|| ctx.bad_attr("shape", "is required"))?
    } else {
        ctx.const_input(node, 1)?.to_i64_vec()
    };
    let allowzero = ctx.opset >= 14 && ctx.attr_i_or(node, "allowzero", 0)? != 0;
    let input = ctx.ty(x).shape.clone();
    let shape = resolve_shape(ctx, &input, &target, allowzero)?;
    one(reshape_to(ctx, x, &shape, None)?)
}

/// `Transpose` (default: reverse the axes).
pub fn transpose(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let r = ctx.ty(x).shape.len();
    let perm = match ctx.attr_ints(node, "perm")? {
        None => (0..r).rev().collect(),
        Some(p) => p
            .iter()
            .map(|&a| ctx.axis("perm", a, r))
            .collect::<Result<_, _>>()?,
    };
    one(ctx.op(Op::Transpose { perm }, &[x], None)?)
}

/// `Concat` (`axis` defaults to 1 before opset 4; negative from 11).
pub fn concat(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let inputs = ctx.inputs(node);
    let Some(&first) = inputs.first() else {
        return Err(ctx.invalid("needs at least one input"));
    };
    let axis = match ctx.attr_i(node, "axis")? {
        Some(a) => a,
        None if ctx.opset < 4 => 1,
        None => return Err(ctx.bad_attr("axis", "is required")),
    };
    let axis = ctx.axis("axis", axis, ctx.ty(first).shape.len())?;
    if inputs.len() == 1 {
        return one(first);
    }
    one(ctx.op(Op::Concat { axis }, &inputs, None)?)
}

/// `Identity`: an alias, no node.
pub fn identity(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    one(ctx.input(node, 0)?)
}

/// `Dropout` at inference: an alias, with an all-true `mask` (opset 10+;
/// an older, non-boolean mask is rejected up front). A constant
/// `training_mode` of true is the same when the ratio is a constant 0;
/// with another ratio it draws a random mask every run, which Kiln does
/// not compile.
pub fn dropout(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    if ctx.opset >= 12 {
        if let Some(t) = ctx.opt_const_input(node, 2)? {
            if t.to_i64_vec().first().copied().unwrap_or(0) != 0 {
                let ratio = match ctx.opt_const_input(node, 1)? {
                    Some(r) => r.to_f64_vec().first().copied().unwrap_or(0.5),
                    None => 0.5,
                };
                if ratio != 0.0 {
                    return Err(ctx.unsupported(format!(
                        "training-mode Dropout with ratio {ratio} draws a random mask every run; export the model in inference mode"
                    )));
                }
            }
        }
    }
    let x = ctx.input(node, 0)?;
    if node.output.len() < 2 || node.output[1].is_empty() {
        return one(x);
    }
    // The mask of an inference-mode Dropout keeps everything.
    let shape = ctx.ty(x).shape.clone();
    let mask = super::build::build_const(ctx, &shape, DType::Bool, "mask", |n| {
        Data::Bool(vec![true; n])
    })?;
    Ok(vec![x, mask])
}

/// `OptionalHasElement` (opset 15+): false without an input (or with an
/// empty name), true for a tensor: every value Kiln imports is a present
/// tensor (optional-typed graph inputs and outputs are refused).
pub fn optional_has_element(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let present = ctx.opt_input(node, 0).is_some();
    let t = kiln_ir::Tensor::new([], Data::Bool(vec![present])).expect("scalar");
    let name = format!("{}/has_element", ctx.node_name());
    one(ctx.constant(t, name))
}

/// `OptionalGetElement` of a tensor: the tensor itself.
pub fn optional_get_element(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    one(ctx.input(node, 0)?)
}

/// `Gather` along `axis` (negative allowed).
pub fn gather(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let axis = ctx.attr_i_or(node, "axis", 0)?;
    let axis = ctx.axis("axis", axis, ctx.ty(x).shape.len())?;
    one(ctx.op(Op::Gather { axis }, &[x, idx], None)?)
}

/// Resolves one ONNX slice range over a dim of size `d` (ONNX clamping
/// rules, including INT64_MAX/INT64_MIN sentinels and negative steps).
pub(crate) fn slice_axis(d: usize, start: i64, end: i64, step: i64) -> SliceAxis {
    let d = d as i128;
    let (mut s, mut e, st) = (start as i128, end as i128, step as i128);
    if s < 0 {
        s += d;
    }
    if e < 0 {
        e += d;
    }
    let (s, e) = if st > 0 {
        (s.clamp(0, d), e.clamp(0, d))
    } else {
        (s.clamp(0, (d - 1).max(0)), e.clamp(-1, d - 1))
    };
    let len = if st > 0 {
        if e > s {
            (e - s + st - 1) / st
        } else {
            0
        }
    } else if s > e {
        (s - e + (-st) - 1) / (-st)
    } else {
        0
    };
    let len = if d == 0 { 0 } else { len };
    SliceAxis {
        start: if len == 0 { 0 } else { s as usize },
        step,
        len: len as usize,
    }
}

/// `Slice`: `starts`/`ends`/`axes` attributes before opset 10, constant
/// inputs (plus `steps`) from 10 on. Untouched axes are copied whole.
pub fn slice(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let r = shape.len();
    let (starts, ends, axes, steps) = if ctx.opset < 10 {
        let starts = ctx
            .attr_ints(node, "starts")?
            .ok_or_else(|| ctx.bad_attr("starts", "is required"))?;
        let ends = ctx
            .attr_ints(node, "ends")?
            .ok_or_else(|| ctx.bad_attr("ends", "is required"))?;
        (starts, ends, ctx.attr_ints(node, "axes")?, None)
    } else {
        let starts = ctx.const_input(node, 1)?.to_i64_vec();
        let ends = ctx.const_input(node, 2)?.to_i64_vec();
        let axes = ctx.opt_const_input(node, 3)?.map(|t| t.to_i64_vec());
        let steps = ctx.opt_const_input(node, 4)?.map(|t| t.to_i64_vec());
        (starts, ends, axes, steps)
    };
    let n = starts.len();
    let axes = axes.unwrap_or_else(|| (0..n as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(ctx.bad_attr(
            "starts",
            format!(
                "starts, ends, axes and steps differ in length ({n}, {}, {}, {})",
                ends.len(),
                axes.len(),
                steps.len()
            ),
        ));
    }
    let mut spec: Vec<Option<SliceAxis>> = vec![None; r];
    for i in 0..n {
        let a = ctx.axis("axes", axes[i], r)?;
        if spec[a].is_some() {
            return Err(ctx.bad_attr("axes", format!("axis {} is repeated", axes[i])));
        }
        if steps[i] == 0 {
            return Err(ctx.bad_attr("steps", "a step is 0"));
        }
        spec[a] = Some(slice_axis(shape[a], starts[i], ends[i], steps[i]));
    }
    let axes = spec
        .into_iter()
        .zip(shape.iter())
        .map(|(s, &d)| {
            s.unwrap_or(SliceAxis {
                start: 0,
                step: 1,
                len: d,
            })
        })
        .collect();
    one(ctx.op(Op::Slice { axes }, &[x], None)?)
}

/// The `axes` of Squeeze/Unsqueeze: an attribute before opset 13, an
/// optional constant input from 13.
fn axes_arg(ctx: &ImportCtx, node: &NodeProto) -> Result<Option<Vec<i64>>, OnnxError> {
    if ctx.opset < 13 {
        ctx.attr_ints(node, "axes")
    } else {
        Ok(ctx.opt_const_input(node, 1)?.map(|t| t.to_i64_vec()))
    }
}

/// `Squeeze` → Reshape (no axes: drop every dim of 1).
pub fn squeeze(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let mut drop = vec![false; shape.len()];
    match axes_arg(ctx, node)? {
        None => {
            for (i, &d) in shape.iter().enumerate() {
                drop[i] = d == 1;
            }
        }
        Some(axes) => {
            for a in axes {
                let i = ctx.axis("axes", a, shape.len())?;
                if shape[i] != 1 {
                    return Err(ctx.bad_attr(
                        "axes",
                        format!("cannot squeeze axis {a} of size {}", shape[i]),
                    ));
                }
                drop[i] = true;
            }
        }
    }
    let out: Vec<usize> = shape
        .iter()
        .zip(&drop)
        .filter(|(_, &d)| !d)
        .map(|(&s, _)| s)
        .collect();
    one(reshape_to(ctx, x, &out, None)?)
}

/// `Unsqueeze` → Reshape (axes refer to the output rank).
pub fn unsqueeze(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let axes = axes_arg(ctx, node)?.ok_or_else(|| ctx.bad_attr("axes", "is required"))?;
    let rank = shape.len() + axes.len();
    let mut insert = vec![false; rank];
    for a in axes {
        let i = ctx.axis("axes", a, rank)?;
        if std::mem::replace(&mut insert[i], true) {
            return Err(ctx.bad_attr("axes", format!("axis {a} is repeated")));
        }
    }
    let mut dims = shape.iter();
    let out: Vec<usize> = insert
        .iter()
        .map(|&ins| {
            if ins {
                1
            } else {
                *dims.next().expect("rank counted")
            }
        })
        .collect();
    one(reshape_to(ctx, x, &out, None)?)
}

/// `Cast` (`to` is a type code from opset 6, a type name before).
pub fn cast(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let to = cast_target(ctx, node)?;
    one(narrowing_cast(ctx, node, x, to)?)
}

/// `Cast` of `x` to `to` with the node's `saturate` attribute. The IR's
/// casts to the 8- and 4-bit floats saturate (ONNX's default); with
/// `saturate=0` a value whose rounding leaves the finite range becomes NaN
/// (or ±infinity for `f8e5m2`) instead: the saturating cast, then a `where`
/// on `|x|` against the rounding threshold.
fn narrowing_cast(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    to: DType,
) -> Result<Val, OnnxError> {
    // `saturate` applies to the 8-bit floats only.
    let format = FloatFormat::of(to).filter(|f| f.specials != Specials::Finite);
    let from = ctx.ty(x).dtype;
    let (Some(f), false) = (format, ctx.attr_i_or(node, "saturate", 1)? != 0) else {
        return ctx.op(Op::Cast { to }, &[x], None);
    };
    if !from.is_float() {
        return Err(ctx.unsupported(format!(
            "casting {from} to {to} with saturate=0 (only from floating-point types)"
        )));
    }
    let saturated = ctx.op(Op::Cast { to }, &[x], Some("saturated"))?;
    // The smallest |x| that rounds (to nearest even) past the largest
    // finite value: the midpoint to the next step, itself included when
    // the largest value's last mantissa bit is odd.
    let max = kiln_ir::narrow::decode(to, f.max as u8) as f64;
    let step = 2f64.powi((f.max >> f.man_bits) as i32 - f.bias - f.man_bits as i32);
    let threshold = max + step / 2.0;
    let tie_overflows = f.max & 1 == 1;
    let xf = cast_to(ctx, x, DType::F32, "x_float")?;
    let magnitude = ctx.op(Op::Unary(UnaryOp::Abs), &[xf], Some("magnitude"))?;
    let limit = scalar(ctx, DType::F32, threshold, "threshold");
    let cmp = if tie_overflows {
        CompareOp::GreaterOrEqual
    } else {
        CompareOp::Greater
    };
    let overflows = ctx.op(Op::Compare(cmp), &[magnitude, limit], Some("overflows"))?;
    let code = |ctx: &mut ImportCtx, code: u32, name: &str| {
        let t = Tensor::new([], Data::Narrow(to, vec![code as u8])).expect("scalar");
        let name = format!("{}/{name}", ctx.node_name());
        ctx.constant(t, name)
    };
    let special = if f.specials == Specials::Ieee {
        let inf = f.max + 1;
        let positive = code(ctx, inf, "infinity");
        let negative = code(ctx, f.sign_bit() | inf, "negative_infinity");
        let zero = scalar(ctx, DType::F32, 0.0, "zero");
        let below = ctx.op(Op::Compare(CompareOp::Less), &[xf, zero], Some("negative"))?;
        ctx.op(Op::Where, &[below, negative, positive], Some("infinities"))?
    } else {
        code(ctx, f.nan_code(0), "nan")
    };
    ctx.op(Op::Where, &[overflows, special, saturated], None)
}

/// `BitCast`: the same bytes as another type of the same size.
pub fn bitcast(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let to = cast_target(ctx, node)?;
    one(ctx.op(Op::Bitcast { to }, &[x], None)?)
}

/// The `to` attribute of Cast and BitCast (a type code, or a type name in
/// old models).
fn cast_target(ctx: &ImportCtx, node: &NodeProto) -> Result<DType, OnnxError> {
    let what = format!("{}.to", ctx.node_name());
    let to = match ctx.raw_attr(node, "to") {
        None => return Err(ctx.bad_attr("to", "is required")),
        Some(a) if a.r#type == AttributeType::String as i32 => {
            let name = String::from_utf8_lossy(&a.s).into_owned();
            dtype_from_onnx_name(&name).ok_or(OnnxError::UnsupportedDType {
                value: what,
                dtype: name,
            })?
        }
        Some(_) => {
            let code = ctx.attr_i(node, "to")?.unwrap_or_default();
            let code = i32::try_from(code)
                .map_err(|_| ctx.bad_attr("to", format!("invalid type code {code}")))?;
            dtype_or_err(code, &what)?
        }
    };
    Ok(to)
}

/// `CastLike` (opset 15+): Cast to the element type of the second input.
pub fn cast_like(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let like = ctx.input(node, 1)?;
    let to = ctx.ty(like).dtype;
    one(narrowing_cast(ctx, node, x, to)?)
}

/// `Expand`: the IR has no broadcast op, so Expand folds when both inputs
/// are constants and is unsupported otherwise.
pub fn expand(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let target = ctx.const_input(node, 1)?.to_i64_vec();
    if target.iter().any(|&d| d < 0) {
        return Err(ctx.bad_attr("shape", format!("negative dim in {target:?}")));
    }
    let target: Vec<usize> = target.iter().map(|&d| d as usize).collect();
    let xs = ctx.ty(x).shape.clone();
    let out = broadcast_shapes(&xs, &target).ok_or_else(|| {
        ctx.bad_attr(
            "shape",
            format!("{target:?} does not broadcast with {:?}", xs.as_slice()),
        )
    })?;
    if out == xs {
        return one(x);
    }
    // Folds when the input is constant and the result small enough. A
    // constant too large to fold still becomes that much data at run time,
    // so it counts against the generated-data budget (a tiny model must not
    // ask for terabytes).
    let bytes = out
        .iter()
        .try_fold(ctx.ty(x).dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
        .unwrap_or(usize::MAX);
    if ctx.konst(x).is_some() && bytes > FOLD_LIMIT_BYTES {
        ctx.charge_generated(bytes as u64)?;
    }
    let expand = Op::Expand {
        shape: out.iter().copied().collect(),
    };
    one(ctx.op(expand, &[x], None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_clamping() {
        let s = slice_axis(10, 0, i64::MAX, 1);
        assert_eq!((s.start, s.step, s.len), (0, 1, 10));
        let s = slice_axis(10, -1, i64::MIN, -1);
        assert_eq!((s.start, s.step, s.len), (9, -1, 10));
        let s = slice_axis(10, 8, 2, -3);
        assert_eq!((s.start, s.step, s.len), (8, -3, 2));
        let s = slice_axis(10, 5, 3, 1);
        assert_eq!(s.len, 0);
        let s = slice_axis(10, 20, 30, 1);
        assert_eq!(s.len, 0);
        let s = slice_axis(10, -100, 3, 2);
        assert_eq!((s.start, s.len), (0, 2));
        let s = slice_axis(10, 100, -100, -2);
        assert_eq!((s.start, s.len), (9, 5));
    }

    #[test]
    fn reshape_targets() {
        let opts = crate::ImportOptions::default();
        let ctx = ImportCtx::new(13, &opts, None);
        assert_eq!(
            resolve_shape(&ctx, &[2, 3, 4], &[0, -1], false).unwrap(),
            vec![2, 12]
        );
        assert_eq!(
            resolve_shape(&ctx, &[2, 3, 4], &[-1], false).unwrap(),
            vec![24]
        );
        assert!(resolve_shape(&ctx, &[2, 3, 4], &[-1, -1], false).is_err());
        assert!(resolve_shape(&ctx, &[2, 3, 4], &[5, -1], false).is_err());
        assert_eq!(
            resolve_shape(&ctx, &[0, 3], &[0, 3], true).unwrap(),
            vec![0, 3]
        );
    }
}
