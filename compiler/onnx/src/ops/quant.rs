//! Linear quantization, decomposed into float arithmetic:
//! `DequantizeLinear` is `(float(x) - float(zero_point)) * scale` and
//! `QuantizeLinear` is `saturate(round_half_even(x / scale) + zero_point)`,
//! with per-tensor, per-axis and (opset 21+) blocked scales broadcast to
//! the input. The integer products (`MatMulInteger`, `ConvInteger` and
//! their `QLinear` forms) are exact i32 sums.

use super::build::{cast_to, reshape_to, scalar};
use super::one;
use super::window::{conv_attrs, lift, spatial_rank};
use crate::ctx::{Dequantized, ImportCtx, Val};
use crate::tensor::dtype_or_err;
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Op, ReduceOp, UnaryOp};
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
    if !xt.dtype.is_int() && !xt.dtype.is_narrow() {
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
        let y = ctx.op(Op::Binary(BinaryOp::Mul), &[centered, s], None)?;
        if block == 0 {
            let d = Dequantized {
                q: x,
                scale,
                zero: zp,
                axis,
            };
            ctx.note_dequantized(y, d);
        }
        return one(y);
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
    // Integer outputs round, shift and clip to their range; the 8- and
    // 4-bit floats take `x / scale + zero_point` and round (to nearest
    // even) and saturate in the cast.
    let range = match out {
        DType::U8 => Some((0.0, 255.0)),
        DType::I8 => Some((-128.0, 127.0)),
        DType::I16 => Some((-32768.0, 32767.0)),
        DType::U16 => Some((0.0, 65535.0)),
        DType::I32 => Some((i32::MIN as f32, i32::MAX as f32)),
        d if d.is_narrow() => kiln_ir::narrow::int_range(d).map(|(lo, hi)| (lo as f32, hi as f32)),
        d => return Err(ctx.unsupported(format!("QuantizeLinear to {d}"))),
    };
    if ctx.attr_i_or(node, "saturate", 1)? == 0 && range.is_none() {
        return Err(ctx.unsupported("QuantizeLinear with saturate=0"));
    }
    let xf = cast_to(ctx, x, DType::F32, "x_float")?;
    let s = cast_to(ctx, scale, DType::F32, "scale_float")?;
    let s = spread(ctx, s, &xt.shape, axis, block, "scale")?;
    let mut q = ctx.op(Op::Binary(BinaryOp::Div), &[xf, s], Some("scaled"))?;
    if range.is_some() {
        q = ctx.op(Op::Unary(UnaryOp::Round), &[q], Some("rounded"))?;
    }
    if let Some(z) = zp {
        let z = cast_to(ctx, z, DType::F32, "zero_point_float")?;
        let z = spread(ctx, z, &xt.shape, axis, block, "zero_point")?;
        q = ctx.op(Op::Binary(BinaryOp::Add), &[q, z], Some("shifted"))?;
    }
    let Some((lo, hi)) = range else {
        return one(ctx.op(Op::Cast { to: out }, &[q], None)?);
    };
    let q = ctx.op(
        Op::Unary(UnaryOp::Clip { min: lo, max: hi }),
        &[q],
        Some("saturated"),
    )?;
    one(ctx.op(Op::Cast { to: out }, &[q], None)?)
}

/// `DynamicQuantizeLinear`: u8 quantization with the scale and zero point
/// computed from the input's range (widened to include 0), as in the
/// reference; outputs y, y_scale and y_zero_point.
pub fn dynamic_quantize_linear(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    Ok(dynamic_quantize(ctx, x, "")?.to_vec())
}

/// [`dynamic_quantize_linear`] of `x`: `[y, y_scale, y_zero_point]`; the
/// helper nodes' names start with `tag`.
pub(crate) fn dynamic_quantize(
    ctx: &mut ImportCtx,
    x: Val,
    tag: &str,
) -> Result<[Val; 3], OnnxError> {
    let xt = ctx.ty(x).clone();
    if xt.dtype != DType::F32 {
        return Err(ctx.unsupported(format!("DynamicQuantizeLinear of {} input", xt.dtype)));
    }
    let all = |op| Op::Reduce {
        op,
        axes: (0..xt.shape.len()).collect(),
        keep_dims: false,
    };
    let t = |s: &str| format!("{tag}{s}");
    let zero = scalar(ctx, DType::F32, 0.0, &t("zero"));
    let one_ = scalar(ctx, DType::F32, 1.0, &t("one"));
    let hi = ctx.op(all(ReduceOp::Max), &[x], Some(&t("max")))?;
    let hi = ctx.op(Op::Binary(BinaryOp::Max), &[hi, zero], Some(&t("max0")))?;
    let lo = ctx.op(all(ReduceOp::Min), &[x], Some(&t("min")))?;
    let lo = ctx.op(Op::Binary(BinaryOp::Min), &[lo, zero], Some(&t("min0")))?;
    let span = ctx.op(Op::Binary(BinaryOp::Sub), &[hi, lo], Some(&t("span")))?;
    let flat = ctx.op(Op::Compare(CompareOp::Equal), &[hi, lo], Some(&t("flat")))?;
    let span = ctx.op(Op::Where, &[flat, one_, span], Some(&t("span_nonzero")))?;
    let levels = scalar(ctx, DType::F32, 255.0, &t("levels"));
    let scale = ctx.op(
        Op::Binary(BinaryOp::Div),
        &[span, levels],
        Some(&t("y_scale")),
    )?;
    let shift = ctx.op(
        Op::Binary(BinaryOp::Div),
        &[lo, scale],
        Some(&t("min_scaled")),
    )?;
    let izp = ctx.op(
        Op::Binary(BinaryOp::Sub),
        &[zero, shift],
        Some(&t("zero_point_exact")),
    )?;
    let sat = UnaryOp::Clip {
        min: 0.0,
        max: 255.0,
    };
    let zp = ctx.op(Op::Unary(sat), &[izp], Some(&t("zero_point_clipped")))?;
    let zp = ctx.op(
        Op::Unary(UnaryOp::Round),
        &[zp],
        Some(&t("zero_point_float")),
    )?;
    let q = ctx.op(Op::Binary(BinaryOp::Div), &[x, scale], Some(&t("scaled")))?;
    let q = ctx.op(Op::Unary(UnaryOp::Round), &[q], Some(&t("rounded")))?;
    let q = ctx.op(Op::Binary(BinaryOp::Add), &[q, zp], Some(&t("shifted")))?;
    let q = ctx.op(Op::Unary(sat), &[q], Some(&t("saturated")))?;
    let y_name = t("y");
    let y = ctx.op(
        Op::Cast { to: DType::U8 },
        &[q],
        if tag.is_empty() { None } else { Some(&y_name) },
    )?;
    let zp = ctx.op(Op::Cast { to: DType::U8 }, &[zp], Some(&t("y_zero_point")))?;
    Ok([y, scale, zp])
}

/// `a · b` in f32 of two quantization scales (each a scalar, a
/// one-element tensor, made a scalar, or a vector), the node named `tag`.
pub(crate) fn scale_product(
    ctx: &mut ImportCtx,
    a: Val,
    b: Val,
    tag: &str,
) -> Result<Val, OnnxError> {
    let mut operands = [a, b];
    for (v, side) in operands.iter_mut().zip(["a", "b"]) {
        *v = cast_to(ctx, *v, DType::F32, &format!("{tag}_{side}"))?;
        if ctx.ty(*v).num_elements() == 1 {
            *v = reshape_to(ctx, *v, &[], Some(&format!("{tag}_{side}_scalar")))?;
        }
    }
    ctx.op(Op::Binary(BinaryOp::Mul), &operands, Some(tag))
}

/// onnxruntime's dynamically quantized product (`DynamicQuantizeMatMul`,
/// `DynamicQuantizeLSTM`): `a` (f32) quantized to u8 as
/// [`dynamic_quantize`] does, times the 8-bit matrix `b` less `b_zero`
/// exactly ([`integer_product`]), rescaled to f32 by `a`'s scale times
/// `b_scale` (a scalar or one per column). Helper names start with `tag`.
pub(crate) fn dynamic_quantized_matmul(
    ctx: &mut ImportCtx,
    a: Val,
    b: Val,
    b_scale: Val,
    b_zero: Option<Val>,
    tag: &str,
) -> Result<Val, OnnxError> {
    let [q, a_scale, a_zero] = dynamic_quantize(ctx, a, &format!("{tag}a_"))?;
    let p = integer_product(ctx, q, Some(a_zero), b, b_zero)?;
    let p = ctx.op(
        Op::Cast { to: DType::F32 },
        &[p],
        Some(&format!("{tag}product_float")),
    )?;
    let s = scale_product(ctx, a_scale, b_scale, &format!("{tag}scale"))?;
    ctx.op(
        Op::Binary(BinaryOp::Mul),
        &[p, s],
        Some(&format!("{tag}rescaled")),
    )
}

/// Largest K for which an f32 dot product of 8-bit differences (each
/// |a|, |b| ≤ 255) is exact: every partial sum stays below 2^24.
const EXACT_K: usize = (1 << 24) / (255 * 255);

/// `acc + i32(p)`: one chunk's exact f32 sum (`p`, named `tag`) cast to
/// i32 and added to the running i32 total of the chunks before it.
fn add_exact_chunk(
    ctx: &mut ImportCtx,
    acc: Option<Val>,
    p: Val,
    tag: &str,
    chunk: usize,
) -> Result<Val, OnnxError> {
    let p = ctx.op(
        Op::Cast { to: DType::I32 },
        &[p],
        Some(&format!("{tag}_i32")),
    )?;
    match acc {
        None => Ok(p),
        Some(s) => ctx.op(
            Op::Binary(BinaryOp::Add),
            &[s, p],
            Some(&format!("sum{chunk}")),
        ),
    }
}

/// `(a - a_zp) @ (b - b_zp)` exactly, as i32: the f32 MatMul is exact on
/// K-chunks of at most [`EXACT_K`], whose i32 casts are then added.
fn int_matmul(
    ctx: &mut ImportCtx,
    a: Val,
    azp: Option<Val>,
    b: Val,
    bzp: Option<Val>,
) -> Result<Val, OnnxError> {
    for v in [a, b] {
        let d = ctx.ty(v).dtype;
        if d != DType::U8 && d != DType::I8 {
            return Err(ctx.unsupported(format!("integer MatMul of {d} (u8 and i8 only)")));
        }
    }
    let centered = |ctx: &mut ImportCtx, x: Val, zp: Option<Val>, tag: &str| {
        let xf = cast_to(ctx, x, DType::F32, &format!("{tag}_float"))?;
        match zp {
            None => Ok(xf),
            Some(z) => {
                let zf = cast_to(ctx, z, DType::F32, &format!("{tag}_zero_point_float"))?;
                // A per-row (a) or per-column (b) zero point lines up with
                // its matrix axis; a scalar broadcasts.
                let zn = ctx.ty(zf).num_elements();
                let xs = ctx.ty(xf).shape.clone();
                let r = xs.len();
                let zf = if zn > 1 && ctx.ty(zf).shape.len() == 1 && r >= 2 {
                    let mut view = vec![1; r];
                    let at = if tag == "a" { r - 2 } else { r - 1 };
                    view[at] = zn;
                    reshape_to(ctx, zf, &view, Some(&format!("{tag}_zero_point_view")))?
                } else {
                    zf
                };
                ctx.op(
                    Op::Binary(BinaryOp::Sub),
                    &[xf, zf],
                    Some(&format!("{tag}_centered")),
                )
            }
        }
    };
    let af = centered(ctx, a, azp, "a")?;
    let bf = centered(ctx, b, bzp, "b")?;
    let (ar, br) = (ctx.ty(af).shape.len(), ctx.ty(bf).shape.len());
    if ar < 2 || br < 2 {
        return Err(ctx.unsupported("integer MatMul of vectors (rank < 2)"));
    }
    let k = ctx.ty(af).shape[ar - 1];
    let mut acc: Option<Val> = None;
    let mut start = 0;
    let mut chunk = 0;
    while start < k || (k == 0 && chunk == 0) {
        let len = EXACT_K.min(k - start);
        let (ac, bc) = if len == k {
            (af, bf)
        } else {
            (
                super::build::slice_along(ctx, af, ar - 1, start, 1, len, &format!("a_k{chunk}"))?,
                super::build::slice_along(ctx, bf, br - 2, start, 1, len, &format!("b_k{chunk}"))?,
            )
        };
        let p = ctx.op(Op::MatMul, &[ac, bc], Some(&format!("product{chunk}")))?;
        acc = Some(add_exact_chunk(
            ctx,
            acc,
            p,
            &format!("product{chunk}"),
            chunk,
        )?);
        start += len;
        chunk += 1;
        if k == 0 {
            break;
        }
    }
    Ok(acc.expect("at least one chunk"))
}

/// `(a - a_zp) @ (b - b_zp)` as i32: the IR's `MatMulInteger` when the
/// zero points are a scalar (A) and a scalar or one per column (B), which
/// is what quantizers write; the exact float decomposition ([`int_matmul`])
/// for per-row zero points of A and other layouts.
fn integer_product(
    ctx: &mut ImportCtx,
    a: Val,
    azp: Option<Val>,
    b: Val,
    bzp: Option<Val>,
) -> Result<Val, OnnxError> {
    let (ta, tb) = (ctx.ty(a).clone(), ctx.ty(b).clone());
    if !eight_bit(ta.dtype) || !eight_bit(tb.dtype) || ta.shape.len() < 2 || tb.shape.len() < 2 {
        return int_matmul(ctx, a, azp, b, bzp);
    }
    let n = tb.shape[tb.shape.len() - 1];
    let fits_a = azp.is_none_or(|z| one_value(ctx.ty(z)));
    let fits_b = bzp.is_none_or(|z| {
        let t = ctx.ty(z);
        one_value(t) || (t.shape.len() == 1 && t.shape[0] == n)
    });
    if !fits_a || !fits_b {
        return int_matmul(ctx, a, azp, b, bzp);
    }
    let azp = match azp {
        Some(z) => reshape_to(ctx, z, &[], Some("a_zero_point_scalar"))?,
        None => scalar(ctx, ta.dtype, 0.0, "a_zero_point"),
    };
    let bzp = match bzp {
        Some(z) if ctx.ty(z).num_elements() == 1 => {
            reshape_to(ctx, z, &[], Some("b_zero_point_scalar"))?
        }
        Some(z) => z,
        None => scalar(ctx, tb.dtype, 0.0, "b_zero_point"),
    };
    ctx.op(Op::MatMulInteger, &[a, b, azp, bzp], Some("product"))
}

/// u8 or i8.
fn eight_bit(d: DType) -> bool {
    matches!(d, DType::U8 | DType::I8)
}

/// One value: a scalar or a one-element vector (a quantization parameter
/// per tensor).
fn one_value(t: &kiln_ir::ValueType) -> bool {
    t.num_elements() == 1 && t.shape.len() <= 1
}

/// Whether the scale and zero point of dequantized value `d` are one value
/// each, or (with `per_axis = Some((len, axes))`) `len` values along an
/// axis written as one of `axes`: the layouts the integer products take.
fn parameters_fit(ctx: &ImportCtx, d: &Dequantized, per_axis: Option<(usize, &[i64])>) -> bool {
    let fits = |v: Val| {
        let t = ctx.ty(v);
        one_value(t)
            || per_axis
                .is_some_and(|(len, axes)| t.shape.as_slice() == [len] && axes.contains(&d.axis))
    };
    fits(d.scale) && d.zero.is_none_or(fits)
}

/// A QDQ MatMul: `DequantizeLinear(a) @ DequantizeLinear(b)` with A per
/// tensor and B (a matrix) per tensor or per column, imported as the
/// integer product of the quantized inputs rescaled by `a_scale · b_scale`
/// (the same value up to f32 rounding, on the int8 kernels instead of
/// dequantized f32). `None` when the operands are not of that form.
pub fn qdq_matmul(ctx: &mut ImportCtx, a: Val, b: Val) -> Result<Option<Val>, OnnxError> {
    let (Some(da), Some(db)) = (ctx.dequantized(a), ctx.dequantized(b)) else {
        return Ok(None);
    };
    let (ta, tb) = (ctx.ty(da.q).clone(), ctx.ty(db.q).clone());
    if !eight_bit(ta.dtype) || !eight_bit(tb.dtype) || ta.shape.len() < 2 || tb.shape.len() != 2 {
        return Ok(None);
    }
    let n = tb.shape[1];
    if !parameters_fit(ctx, &da, None) || !parameters_fit(ctx, &db, Some((n, &[1, -1]))) {
        return Ok(None);
    }
    let p = integer_product(ctx, da.q, da.zero, db.q, db.zero)?;
    let p = ctx.op(Op::Cast { to: DType::F32 }, &[p], Some("qdq_product_float"))?;
    let sa = cast_to(ctx, da.scale, DType::F32, "qdq_a_scale")?;
    let sa = reshape_to(ctx, sa, &[], Some("qdq_a_scale_scalar"))?;
    let sb = cast_to(ctx, db.scale, DType::F32, "qdq_b_scale")?;
    let s = ctx.op(Op::Binary(BinaryOp::Mul), &[sa, sb], Some("qdq_scale"))?;
    Ok(Some(ctx.op(Op::Binary(BinaryOp::Mul), &[p, s], None)?))
}

/// `MatMulInteger`: exact i32 products of u8/i8 matrices.
pub fn matmul_integer(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let azp = ctx.opt_input(node, 2);
    let bzp = ctx.opt_input(node, 3);
    one(integer_product(ctx, a, azp, b, bzp)?)
}

/// `QLinearMatMul`: the exact integer product, rescaled by
/// `a_scale·b_scale/y_scale`, rounded half to even, shifted by the output
/// zero point and saturated to its type ([`requantize`]).
pub fn qlinear_matmul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let q = QLinearInputs::read(ctx, node)?;
    let c = integer_product(ctx, q.a, q.a_zero, q.b, q.b_zero)?;
    one(requantize(
        ctx,
        c,
        [q.a_scale, q.b_scale, q.y_scale],
        q.y_zero,
        q.out,
    )?)
}

/// The eight inputs `QLinearMatMul` and `QLinearConv` share (A, its scale
/// and zero point, B, its scale and zero point, Y's scale and zero point)
/// and the output type: Y's zero point's, else A's.
struct QLinearInputs {
    a: Val,
    a_scale: Val,
    a_zero: Option<Val>,
    b: Val,
    b_scale: Val,
    b_zero: Option<Val>,
    y_scale: Val,
    y_zero: Option<Val>,
    out: DType,
}

impl QLinearInputs {
    fn read(ctx: &ImportCtx, node: &NodeProto) -> Result<QLinearInputs, OnnxError> {
        let a = ctx.input(node, 0)?;
        let y_zero = ctx.opt_input(node, 7);
        Ok(QLinearInputs {
            a,
            a_scale: ctx.input(node, 1)?,
            a_zero: ctx.opt_input(node, 2),
            b: ctx.input(node, 3)?,
            b_scale: ctx.input(node, 4)?,
            b_zero: ctx.opt_input(node, 5),
            y_scale: ctx.input(node, 6)?,
            y_zero,
            out: ctx.ty(y_zero.unwrap_or(a)).dtype,
        })
    }
}

/// The output stage of `QLinearMatMul` and `QLinearConv`: the exact i32
/// accumulator `c` rescaled by `a_scale·b_scale/y_scale` (`scales`, each
/// broadcasting against `c`: a per-channel scale already laid along its
/// axis), shifted by the output zero point, rounded half to even and
/// saturated to `out` (u8 or i8). The zero point is added before rounding,
/// as in the ONNX reference.
fn requantize(
    ctx: &mut ImportCtx,
    c: Val,
    scales: [Val; 3],
    yzp: Option<Val>,
    out: DType,
) -> Result<Val, OnnxError> {
    let (lo, hi) = match out {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        d => {
            let op = ctx.op_type().to_string();
            return Err(ctx.unsupported(format!("{op} to {d}")));
        }
    };
    let [a_s, b_s, y_s] = scales;
    let c = ctx.op(Op::Cast { to: DType::F32 }, &[c], Some("product_float"))?;
    let a_s = cast_to(ctx, a_s, DType::F32, "a_scale_float")?;
    let b_s = cast_to(ctx, b_s, DType::F32, "b_scale_float")?;
    let y_s = cast_to(ctx, y_s, DType::F32, "y_scale_float")?;
    let f = ctx.op(Op::Binary(BinaryOp::Mul), &[a_s, b_s], Some("scale_ab"))?;
    let f = ctx.op(Op::Binary(BinaryOp::Div), &[f, y_s], Some("scale"))?;
    let mut d = ctx.op(Op::Binary(BinaryOp::Mul), &[c, f], Some("rescaled"))?;
    if let Some(z) = yzp {
        let z = cast_to(ctx, z, DType::F32, "y_zero_point_float")?;
        d = ctx.op(Op::Binary(BinaryOp::Add), &[d, z], Some("shifted"))?;
    }
    let d = ctx.op(Op::Unary(UnaryOp::Round), &[d], Some("rounded"))?;
    let d = ctx.op(
        Op::Unary(UnaryOp::Clip { min: lo, max: hi }),
        &[d],
        Some("saturated"),
    )?;
    ctx.op(Op::Cast { to: out }, &[d], None)
}

/// A per-tensor parameter of an integer convolution (a zero point or
/// scale: one element, made a scalar) or, where `per_channel` gives the
/// number M of output channels, a vector `[M]` viewed as `[M, 1, ...]`
/// (`view_rank` axes) so that it broadcasts along W's axis 0 (`view_rank`
/// 4) or the output's axis 1 (`view_rank` = the output's rank - 1).
/// Anything else is invalid.
fn conv_param(
    ctx: &mut ImportCtx,
    p: Val,
    per_channel: Option<usize>,
    view_rank: usize,
    tag: &str,
) -> Result<Val, OnnxError> {
    let t = ctx.ty(p).clone();
    if one_value(&t) {
        return reshape_to(ctx, p, &[], Some(&format!("{tag}_scalar")));
    }
    match per_channel {
        Some(m) if t.shape.as_slice() == [m] => {
            let mut view = vec![1; view_rank];
            view[0] = m;
            reshape_to(ctx, p, &view, Some(&format!("{tag}_per_channel")))
        }
        Some(m) => Err(ctx.invalid(format!(
            "{tag} must be a scalar or have one entry per output channel ({m}), got {t}"
        ))),
        None => Err(ctx.invalid(format!("{tag} must be a scalar, got {t}"))),
    }
}

/// `conv(x - x_zp, w - w_zp)` exactly, as i32, with the `Conv` attributes
/// of `node` (`ConvInteger`, `QLinearConv`): x and w (u8/i8) are centered
/// in f32 (a per-output-channel w zero point along W's first axis), so
/// the convolution's zero padding is padding with the zero point, then
/// convolved by the IR's f32 `conv`, which is exact while every output
/// sums at most [`EXACT_K`] terms (`C/group·kH·kW`). Larger windows are
/// split into chunks of input channels (within each group), whose i32
/// casts are added; a single channel's window of more than [`EXACT_K`]
/// taps is unsupported.
fn int_conv(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    xzp: Option<Val>,
    w: Val,
    wzp: Option<Val>,
) -> Result<Val, OnnxError> {
    let what = ctx.op_type().to_string();
    for (v, zp, tag) in [(x, xzp, "x"), (w, wzp, "w")] {
        let d = ctx.ty(v).dtype;
        if d != DType::U8 && d != DType::I8 {
            return Err(ctx.unsupported(format!("{what} of {d} {tag} (u8 and i8 only)")));
        }
        if let Some(z) = zp {
            let zd = ctx.ty(z).dtype;
            if zd != d {
                return Err(ctx.invalid(format!("{tag} is {d} but its zero point is {zd}")));
            }
        }
    }
    let nsp = spatial_rank(ctx, x, "integer convolutions")?;
    let xs = ctx.ty(x).shape.clone();
    let ws = ctx.ty(w).shape.clone();
    let attrs = conv_attrs(ctx, node, &xs, &ws)?;
    let (x4, w4) = if nsp == 1 {
        (lift(ctx, x, "x2d")?, lift(ctx, w, "w2d")?)
    } else {
        (x, w)
    };
    let (x4s, w4s) = (ctx.ty(x4).shape.clone(), ctx.ty(w4).shape.clone());
    let (n, c, h, wd) = (x4s[0], x4s[1], x4s[2], x4s[3]);
    let (m, cg, taps) = (w4s[0], w4s[1], w4s[2] * w4s[3]);
    let g = attrs.group;
    if cg * g != c || !m.is_multiple_of(g) {
        return Err(ctx.invalid(format!(
            "W {:?} does not fit X {:?} in {g} groups (W must be [M, C/group, ...] with M a multiple of group)",
            ws.as_slice(),
            xs.as_slice()
        )));
    }
    let vnni_form = g == 1 && ctx.ty(x4).dtype == DType::U8 && ctx.ty(w4).dtype == DType::I8;
    if taps > EXACT_K || vnni_form {
        // The IR's integer convolution (exact i32): for a window no
        // channel chunking keeps exact in f32, and for the u8 × i8
        // ungrouped form, which runs on the int8 (VNNI) kernel.
        let xz = match xzp {
            Some(z) => conv_param(ctx, z, None, 0, "x_zero_point")?,
            None => scalar(ctx, ctx.ty(x4).dtype, 0.0, "x_zero_point"),
        };
        let xz = reshape_to(ctx, xz, &[], Some("x_zero_point_scalar"))?;
        let wz = match wzp {
            Some(z) if ctx.ty(z).num_elements() == 1 => {
                reshape_to(ctx, z, &[], Some("w_zero_point_scalar"))?
            }
            Some(z) => reshape_to(ctx, z, &[m], Some("w_zero_point_per_channel"))?,
            None => scalar(ctx, ctx.ty(w4).dtype, 0.0, "w_zero_point"),
        };
        let y = ctx.op(
            Op::ConvInteger(attrs),
            &[x4, w4, xz, wz],
            Some("conv_integer"),
        )?;
        return unlift(ctx, y, nsp);
    }
    let xf = cast_to(ctx, x4, DType::F32, "x_float")?;
    let xf = match xzp {
        Some(z) => {
            let z = conv_param(ctx, z, None, 0, "x_zero_point")?;
            let z = cast_to(ctx, z, DType::F32, "x_zero_point_float")?;
            ctx.op(Op::Binary(BinaryOp::Sub), &[xf, z], Some("x_centered"))?
        }
        None => xf,
    };
    let wf = cast_to(ctx, w4, DType::F32, "w_float")?;
    let wf = match wzp {
        Some(z) => {
            // W is [M, C/group, kH, kW]: a per-channel zero point lies
            // along its first axis, as `[M, 1, 1, 1]`.
            let z = conv_param(ctx, z, Some(m), 4, "w_zero_point")?;
            let z = cast_to(ctx, z, DType::F32, "w_zero_point_float")?;
            ctx.op(Op::Binary(BinaryOp::Sub), &[wf, z], Some("w_centered"))?
        }
        None => wf,
    };
    let conv = Op::Conv(attrs);
    let y = if cg * taps <= EXACT_K {
        let y = ctx.op(conv, &[xf, wf], Some("conv"))?;
        ctx.op(Op::Cast { to: DType::I32 }, &[y], Some("conv_i32"))?
    } else {
        // Chunks of `per` input channels of every group: X viewed as
        // [N, group, C/group, H, W] and sliced along C/group, then viewed
        // back as [N, group·len, H, W], which a grouped conv of the W
        // chunk [M, len, kH, kW] reads group by group.
        let per = EXACT_K / taps;
        let x5 = if g > 1 {
            Some(reshape_to(ctx, xf, &[n, g, cg, h, wd], Some("x_groups"))?)
        } else {
            None
        };
        let mut acc: Option<Val> = None;
        for (chunk, start) in (0..cg).step_by(per).enumerate() {
            let len = per.min(cg - start);
            let tag = |s: &str| format!("{s}{chunk}");
            let xc = match x5 {
                None => super::build::slice_along(ctx, xf, 1, start, 1, len, &tag("x_c"))?,
                Some(x5) => {
                    let s = super::build::slice_along(ctx, x5, 2, start, 1, len, &tag("x_c"))?;
                    reshape_to(ctx, s, &[n, g * len, h, wd], Some(&tag("x_c_flat")))?
                }
            };
            let wc = super::build::slice_along(ctx, wf, 1, start, 1, len, &tag("w_c"))?;
            let p = ctx.op(conv.clone(), &[xc, wc], Some(&tag("conv")))?;
            acc = Some(add_exact_chunk(ctx, acc, p, &tag("conv"), chunk)?);
        }
        acc.expect("at least one chunk: cg·taps > EXACT_K")
    };
    unlift(ctx, y, nsp)
}

/// `y` of a convolution with `nsp` spatial dims, computed in 2-D: a 1-D
/// convolution's neutral H axis removed again.
fn unlift(ctx: &mut ImportCtx, y: Val, nsp: usize) -> Result<Val, OnnxError> {
    if nsp == 2 {
        return Ok(y);
    }
    let ys = ctx.ty(y).shape.clone();
    reshape_to(ctx, y, &[ys[0], ys[1], ys[3]], Some("conv1d"))
}

/// A QDQ Conv: `Conv(DequantizeLinear(x), DequantizeLinear(w), b)` with X
/// per tensor and W per tensor or per output channel (axis 0), imported as
/// the integer convolution of the quantized inputs ([`int_conv`]) rescaled
/// by `x_scale · w_scale` per channel, plus the float bias: the same value
/// up to f32 rounding, on the int8 kernel. `None` when the operands are not
/// of that form.
pub fn qdq_conv(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    w: Val,
    b: Option<Val>,
) -> Result<Option<Val>, OnnxError> {
    let (Some(dx), Some(dw)) = (ctx.dequantized(x), ctx.dequantized(w)) else {
        return Ok(None);
    };
    let (tx, tw) = (ctx.ty(dx.q).clone(), ctx.ty(dw.q).clone());
    if !eight_bit(tx.dtype) || !eight_bit(tw.dtype) || !matches!(tw.shape.len(), 3 | 4) {
        return Ok(None);
    }
    let m = tw.shape[0];
    let b_fits =
        b.is_none_or(|b| ctx.ty(b).dtype == DType::F32 && ctx.ty(b).shape.as_slice() == [m]);
    if !parameters_fit(ctx, &dx, None) || !parameters_fit(ctx, &dw, Some((m, &[0]))) || !b_fits {
        return Ok(None);
    }
    let acc = int_conv(ctx, node, dx.q, dx.zero, dw.q, dw.zero)?;
    let view = ctx.ty(acc).shape.len() - 1;
    let y = ctx.op(Op::Cast { to: DType::F32 }, &[acc], Some("qdq_conv_float"))?;
    let sx = cast_to(ctx, dx.scale, DType::F32, "qdq_x_scale")?;
    let sx = conv_param(ctx, sx, None, view, "qdq_x_scale")?;
    let sw = cast_to(ctx, dw.scale, DType::F32, "qdq_w_scale")?;
    let sw = conv_param(ctx, sw, Some(m), view, "qdq_w_scale")?;
    let s = ctx.op(Op::Binary(BinaryOp::Mul), &[sx, sw], Some("qdq_scale"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[y, s], Some("qdq_dequantized"))?;
    Ok(Some(match b {
        Some(b) => {
            let b = conv_param(ctx, b, Some(m), view, "bias")?;
            ctx.op(Op::Binary(BinaryOp::Add), &[y, b], None)?
        }
        None => y,
    }))
}

/// `ConvInteger`: the exact i32 convolution of u8/i8 X and W less their
/// zero points (X's a scalar, W's a scalar or one per output channel),
/// padding with the zero point.
pub fn conv_integer(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let xzp = ctx.opt_input(node, 2);
    let wzp = ctx.opt_input(node, 3);
    one(int_conv(ctx, node, x, xzp, w, wzp)?)
}

/// `QLinearConv`: the exact integer convolution ([`int_conv`]) plus the
/// optional i32 bias, rescaled by `x_scale·w_scale/y_scale` (`w_scale` a
/// scalar or one per output channel), shifted by the output zero point,
/// rounded half to even and saturated to its type ([`requantize`]).
pub fn qlinear_conv(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let q = QLinearInputs::read(ctx, node)?;
    let b = ctx.opt_input(node, 8);
    let acc = int_conv(ctx, node, q.a, q.a_zero, q.b, q.b_zero)?;
    let ys = ctx.ty(acc).shape.clone();
    // Per-channel parameters broadcast along the output's axis 1.
    let (m, view) = (ys[1], ys.len() - 1);
    let acc = match b {
        Some(b) => {
            let bt = ctx.ty(b).clone();
            if bt.dtype != DType::I32 || bt.shape.as_slice() != [m] {
                return Err(ctx.invalid(format!("B must be i32[{m}], got {bt}")));
            }
            let b = conv_param(ctx, b, Some(m), view, "bias")?;
            ctx.op(Op::Binary(BinaryOp::Add), &[acc, b], Some("biased"))?
        }
        None => acc,
    };
    let x_s = conv_param(ctx, q.a_scale, None, view, "x_scale")?;
    let w_s = conv_param(ctx, q.b_scale, Some(m), view, "w_scale")?;
    let y_s = conv_param(ctx, q.y_scale, None, view, "y_scale")?;
    let yzp = match q.y_zero {
        Some(z) => Some(conv_param(ctx, z, None, view, "y_zero_point")?),
        None => None,
    };
    one(requantize(ctx, acc, [x_s, w_s, y_s], yzp, q.out)?)
}
