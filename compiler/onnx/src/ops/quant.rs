//! Linear quantization, decomposed into float arithmetic:
//! `DequantizeLinear` is `(float(x) - float(zero_point)) * scale` and
//! `QuantizeLinear` is `saturate(round_half_even(x / scale) + zero_point)`,
//! with per-tensor, per-axis and (opset 21+) blocked scales broadcast to
//! the input.

use super::elementwise::{cast_to, reshape_to};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::tensor::dtype_or_err;
use crate::OnnxError;
use kiln_ir::{BinaryOp, DType, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `p` (a scale or zero point) reshaped and expanded so that it broadcasts
/// against `shape`: a scalar stays, a 1-D per-axis vector lies along
/// `axis`, a blocked tensor (same rank) repeats each entry `block` times
/// along `axis`.
fn spread(
    ctx: &mut ImportCtx,
    p: Val,
    shape: &[usize],
    axis: i64,
    block: usize,
    tag: &str,
) -> Result<Val, OnnxError> {
    let ps = ctx.ty(p).shape.clone();
    let n = ctx.ty(p).num_elements();
    let rank = shape.len();
    if ps.len() <= 1 && n == 1 {
        return reshape_to(ctx, p, &[], Some(&format!("{tag}_scalar")));
    }
    // The axis only matters (and must be valid) for a per-axis parameter.
    let axis = ctx.axis("axis", axis, rank)?;
    if ps.len() == 1 && block == 0 {
        if n != shape[axis] {
            return Err(ctx.invalid(format!(
                "{tag} has {n} entries for an axis of {}",
                shape[axis]
            )));
        }
        let mut view = vec![1; rank];
        view[axis] = n;
        return reshape_to(ctx, p, &view, Some(&format!("{tag}_axis")));
    }
    if block == 0 || ps.len() != rank {
        return Err(ctx.invalid(format!(
            "{tag} of shape {:?} does not fit an input of shape {shape:?}",
            ps.as_slice()
        )));
    }
    let d = shape[axis];
    if ps[axis] != d.div_ceil(block) || (0..rank).any(|k| k != axis && ps[k] != shape[k]) {
        return Err(ctx.invalid(format!(
            "blocked {tag} of shape {:?} does not fit {shape:?} with block {block}",
            ps.as_slice()
        )));
    }
    if !d.is_multiple_of(block) {
        return Err(ctx.unsupported(format!(
            "blocked quantization with a partial last block (axis of {d}, block {block})"
        )));
    }
    let mut view: Vec<usize> = ps.to_vec();
    view.insert(axis + 1, 1);
    let mut big = view.clone();
    big[axis + 1] = block;
    let v = reshape_to(ctx, p, &view, Some(&format!("{tag}_blocks")))?;
    let e = ctx.op(
        Op::Expand {
            shape: big.into_iter().collect(),
        },
        &[v],
        Some(&format!("{tag}_repeat")),
    )?;
    reshape_to(ctx, e, shape, Some(&format!("{tag}_blocked")))
}

/// The axis and block size of a quantization node.
fn axis_and_block(ctx: &ImportCtx, node: &NodeProto) -> Result<(i64, usize), OnnxError> {
    let axis = ctx.attr_i_or(node, "axis", 1)?;
    let block = if ctx.opset >= 21 {
        ctx.attr_i_or(node, "block_size", 0)?
    } else {
        0
    };
    if block < 0 {
        return Err(ctx.bad_attr("block_size", format!("must be ≥ 0, got {block}")));
    }
    Ok((axis, block as usize))
}

/// `DequantizeLinear`: the output has the scale's type (or `output_dtype`,
/// opset 23+).
pub fn dequantize_linear(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let zp = ctx.opt_input(node, 2);
    let xt = ctx.ty(x).clone();
    if !xt.dtype.is_int() {
        return Err(ctx.unsupported(format!("DequantizeLinear of {} input", xt.dtype)));
    }
    let (axis, block) = axis_and_block(ctx, node)?;
    let out = match ctx.attr_i(node, "output_dtype")? {
        Some(code) if code != 0 && ctx.opset >= 23 => {
            let what = format!("{}.output_dtype", ctx.node_name());
            dtype_or_err(code as i32, &what)?
        }
        _ => ctx.ty(scale).dtype,
    };
    let xf = cast_to(ctx, x, DType::F32, "x_float")?;
    let centered = match zp {
        Some(z) => {
            let z = cast_to(ctx, z, DType::F32, "zero_point_float")?;
            let z = spread(ctx, z, &xt.shape, axis, block, "zero_point")?;
            ctx.op(Op::Binary(BinaryOp::Sub), &[xf, z], Some("centered"))?
        }
        None => xf,
    };
    let s = cast_to(ctx, scale, DType::F32, "scale_float")?;
    let s = spread(ctx, s, &xt.shape, axis, block, "scale")?;
    if out == DType::F32 {
        return one(ctx.op(Op::Binary(BinaryOp::Mul), &[centered, s], None)?);
    }
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[centered, s], Some("scaled"))?;
    one(ctx.op(Op::Cast { to: out }, &[y], None)?)
}

/// `QuantizeLinear`: the output type is the zero point's (or
/// `output_dtype`, opset 21+; u8 by default), values saturate to its range.
pub fn quantize_linear(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let zp = ctx.opt_input(node, 2);
    let xt = ctx.ty(x).clone();
    if !xt.dtype.is_float() && xt.dtype != DType::I32 {
        return Err(ctx.unsupported(format!("QuantizeLinear of {} input", xt.dtype)));
    }
    let (axis, block) = axis_and_block(ctx, node)?;
    let attr_dtype = match ctx.attr_i(node, "output_dtype")? {
        Some(code) if code != 0 && ctx.opset >= 21 => {
            let what = format!("{}.output_dtype", ctx.node_name());
            Some(dtype_or_err(code as i32, &what)?)
        }
        _ => None,
    };
    let out = match (zp, attr_dtype) {
        (_, Some(d)) => d,
        (Some(z), None) => ctx.ty(z).dtype,
        (None, None) => DType::U8,
    };
    let (lo, hi) = match out {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::I32 => (i32::MIN as f32, i32::MAX as f32),
        d => return Err(ctx.unsupported(format!("QuantizeLinear to {d}"))),
    };
    if ctx.attr_i_or(node, "saturate", 1)? == 0 && !out.is_int() {
        return Err(ctx.unsupported("QuantizeLinear with saturate=0"));
    }
    let xf = cast_to(ctx, x, DType::F32, "x_float")?;
    let s = cast_to(ctx, scale, DType::F32, "scale_float")?;
    let s = spread(ctx, s, &xt.shape, axis, block, "scale")?;
    let q = ctx.op(Op::Binary(BinaryOp::Div), &[xf, s], Some("scaled"))?;
    let mut q = ctx.op(Op::Unary(UnaryOp::Round), &[q], Some("rounded"))?;
    if let Some(z) = zp {
        let z = cast_to(ctx, z, DType::F32, "zero_point_float")?;
        let z = spread(ctx, z, &xt.shape, axis, block, "zero_point")?;
        q = ctx.op(Op::Binary(BinaryOp::Add), &[q, z], Some("shifted"))?;
    }
    let q = ctx.op(
        Op::Unary(UnaryOp::Clip { min: lo, max: hi }),
        &[q],
        Some("saturated"),
    )?;
    one(ctx.op(Op::Cast { to: out }, &[q], None)?)
}
