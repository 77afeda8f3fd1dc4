//! Data movement decomposed into existing IR ops: `Split` (one Slice per
//! output), `Tile` (Reshape → Expand → Reshape), `Pad` (Slices for
//! cropping and for the reflect/edge/wrap borders, Concat to assemble),
//! `DepthToSpace`/`SpaceToDepth` (Reshape → Transpose → Reshape) and
//! `Trilu` (a constant mask and Where).

use super::build::gen_const;
use super::build::slice_along;
use super::build::{cast_to, reshape_to};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{CompareOp, DType, Data, Op, Tensor};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `Split` into `node.output.len()` parts: sizes from the `split` attribute
/// (before opset 13) or input (13+; opset 1 also took it as input), else
/// `num_outputs` chunks (18+, the last one smaller), else equal parts.
pub fn split(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let shape = ctx.ty(x).shape.clone();
    let axis = ctx.attr_i_or(node, "axis", 0)?;
    let axis = ctx.axis("axis", axis, shape.len())?;
    let d = shape[axis];
    let n = node.output.len();
    let sizes = if ctx.opset >= 13 || (ctx.opset < 2 && ctx.opt_input(node, 1).is_some()) {
        ctx.opt_const_input(node, 1)?.map(|t| t.to_i64_vec())
    } else {
        ctx.attr_ints(node, "split")?
    };
    let sizes: Vec<usize> = match sizes {
        Some(s) => {
            if s.iter().any(|&v| v < 0)
                || s.iter().try_fold(0i64, |a, &v| a.checked_add(v)) != Some(d as i64)
                || s.len() != n
            {
                return Err(ctx.bad_attr(
                    "split",
                    format!("{s:?} does not split a dim of {d} into {n} outputs"),
                ));
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            let parts = match ctx.attr_i(node, "num_outputs")? {
                Some(m) if ctx.opset >= 18 => {
                    if m as usize != n || m < 1 {
                        return Err(ctx
                            .bad_attr("num_outputs", format!("{m} differs from the {n} outputs")));
                    }
                    n
                }
                _ => n,
            };
            if parts == 0 {
                return Err(ctx.invalid("Split has no outputs"));
            }
            let chunk = d.div_ceil(parts);
            if ctx.opset < 18 && !d.is_multiple_of(parts) {
                return Err(ctx.invalid(format!(
                    "a dim of {d} does not split into {parts} equal parts"
                )));
            }
            (0..parts)
                .map(|i| chunk.min(d.saturating_sub(i * chunk)))
                .collect()
        }
    };
    let mut outs = Vec::with_capacity(n);
    let mut start = 0;
    for (i, &len) in sizes.iter().enumerate() {
        outs.push(slice_along(
            ctx,
            x,
            axis,
            start,
            1,
            len,
            &format!("out{i}"),
        )?);
        start += len;
    }
    Ok(outs)
}

/// `Tile` (repeats a constant input): `[d0, d1, ..]` viewed as
/// `[1, d0, 1, d1, ..]`, expanded to `[r0, d0, r1, d1, ..]`, then merged.
pub fn tile(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    if ctx.opset < 6 {
        return Err(ctx.unsupported("Tile before opset 6 (tiles/axis inputs) is not supported"));
    }
    let x = ctx.input(node, 0)?;
    let reps = ctx.const_input(node, 1)?.to_i64_vec();
    let shape = ctx.ty(x).shape.clone();
    if reps.len() != shape.len() || reps.iter().any(|&r| r < 0) {
        return Err(ctx.invalid(format!(
            "repeats {reps:?} do not fit an input of rank {}",
            shape.len()
        )));
    }
    let mut view = Vec::with_capacity(2 * shape.len());
    let mut big = Vec::with_capacity(2 * shape.len());
    let mut out = Vec::with_capacity(shape.len());
    for (&d, &r) in shape.iter().zip(&reps) {
        let r = r as usize;
        view.extend([1, d]);
        big.extend([r, d]);
        out.push(
            r.checked_mul(d)
                .ok_or_else(|| ctx.invalid("output too large"))?,
        );
    }
    let bytes = out
        .iter()
        .try_fold(ctx.ty(x).dtype.size_bytes(), |a, &d| a.checked_mul(d));
    if bytes.is_none() {
        return Err(ctx.invalid("output too large"));
    }
    let v = reshape_to(ctx, x, &view, Some("view"))?;
    let e = ctx.op(
        Op::Expand {
            shape: big.into_iter().collect(),
        },
        &[v],
        Some("expand"),
    )?;
    one(reshape_to(ctx, e, &out, None)?)
}

/// `Pad` in constant, reflect, edge and wrap (opset 19+) modes. Pads are an
/// attribute before opset 11 and a constant input from 11 (with optional
/// `axes` from 18); negative pads crop. The constant value may be a run-time
/// scalar.
pub fn pad(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let mode = ctx
        .attr_s(node, "mode")?
        .unwrap_or_else(|| "constant".into());
    let (pads, axes, value): (Vec<i64>, Option<Vec<i64>>, Option<Val>) = if ctx.opset < 11 {
        let name = if ctx.opset < 2 { "paddings" } else { "pads" };
        let pads = ctx
            .attr_ints(node, name)?
            .ok_or_else(|| ctx.bad_attr(name, "is required"))?;
        let v = ctx.attr_f_or(node, "value", 0.0)? as f64;
        let t = Tensor::new([], Data::from_f64s(xt.dtype, std::iter::once(v))).expect("scalar");
        (pads, None, Some(gen_const(ctx, t, "value")?))
    } else {
        let pads = ctx.const_input(node, 1)?.to_i64_vec();
        let axes = if ctx.opset >= 18 {
            ctx.opt_const_input(node, 3)?.map(|t| t.to_i64_vec())
        } else {
            None
        };
        (pads, axes, ctx.opt_input(node, 2))
    };
    let axes: Vec<usize> = match axes {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&a| ctx.axis("axes", a, rank))
            .collect::<Result<_, _>>()?,
    };
    let k = axes.len();
    if pads.len() != 2 * k {
        return Err(ctx.bad_attr(
            "pads",
            format!("{} values for {k} axes (need {})", pads.len(), 2 * k),
        ));
    }
    let value = match value {
        Some(v) => {
            if ctx.ty(v).num_elements() != 1 {
                return Err(ctx.invalid("constant_value must be a scalar"));
            }
            reshape_to(ctx, v, &vec![1; rank], Some("value_view"))?
        }
        None => {
            let t = Tensor::new(vec![1; rank], Data::zeros(xt.dtype, 1)).expect("one");
            gen_const(ctx, t, "zero")?
        }
    };
    for (j, &axis) in axes.iter().enumerate() {
        x = pad_axis(ctx, x, axis, (pads[j], pads[j + k]), &mode, value)?;
    }
    one(x)
}

/// `CenterCropPad` (opset 18): each listed axis cropped (centred, the
/// extra element at the end) or zero-padded (likewise) to the given size.
pub fn center_crop_pad(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let shape = ctx.const_input(node, 1)?.to_i64_vec();
    let axes: Vec<usize> = match ctx.attr_ints(node, "axes")? {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&a| ctx.axis("axes", a, rank))
            .collect::<Result<_, _>>()?,
    };
    if shape.len() != axes.len() {
        return Err(ctx.invalid(format!(
            "shape has {} values for {} axes",
            shape.len(),
            axes.len()
        )));
    }
    let zero = Tensor::new(vec![1; rank], Data::zeros(xt.dtype, 1)).expect("one");
    let zero = gen_const(ctx, zero, "zero")?;
    for (&axis, &target) in axes.iter().zip(&shape) {
        if target < 0 {
            return Err(ctx.invalid(format!("negative size {target} for axis {axis}")));
        }
        let diff = target - xt.shape[axis] as i64;
        // A crop removes (-diff)/2 before and the rest after; a pad adds
        // diff/2 before and the rest after.
        let before = if diff < 0 { -(-diff / 2) } else { diff / 2 };
        x = pad_axis(ctx, x, axis, (before, diff - before), "constant", zero)?;
    }
    one(x)
}

/// `x` padded along `axis` by `(before, after)` elements (a negative
/// amount crops) in Pad's `mode`, `value` (broadcastable, rank of `x`)
/// filling constant padding.
pub(crate) fn pad_axis(
    ctx: &mut ImportCtx,
    x: Val,
    axis: usize,
    (before, after): (i64, i64),
    mode: &str,
    value: Val,
) -> Result<Val, OnnxError> {
    let mut x = x;
    let (mut b, mut e) = (before, after);
    let d = ctx.ty(x).shape[axis] as i64;
    // Crop first: a negative pad removes elements.
    if b < 0 || e < 0 {
        let lo = b.checked_neg().unwrap_or(i64::MAX).max(0);
        let hi = e.checked_neg().unwrap_or(i64::MAX).max(0);
        if lo.saturating_add(hi) > d {
            return Err(ctx.bad_attr("pads", format!("crops more than the dim of {d}")));
        }
        x = slice_along(
            ctx,
            x,
            axis,
            lo as usize,
            1,
            (d - lo - hi) as usize,
            &format!("crop{axis}"),
        )?;
        b = b.max(0);
        e = e.max(0);
    }
    if b == 0 && e == 0 {
        return Ok(x);
    }
    let d = ctx.ty(x).shape[axis];
    let (b, e) = (b as usize, e as usize);
    let tag = |s: &str| format!("{s}{axis}");
    let border = |ctx: &mut ImportCtx, x: Val, n: usize, before: bool| -> Result<Val, OnnxError> {
        let side = if before { "before" } else { "after" };
        let mut shape = ctx.ty(x).shape.clone();
        match mode {
            "constant" => {
                shape[axis] = n;
                ctx.op(
                    Op::Expand {
                        shape: shape.iter().copied().collect(),
                    },
                    &[value],
                    Some(&tag(&format!("{side}_value"))),
                )
            }
            "edge" => {
                if d == 0 {
                    return Err(ctx.invalid("edge padding of an empty axis"));
                }
                let at = if before { 0 } else { d - 1 };
                let s = slice_along(ctx, x, axis, at, 1, 1, &tag(&format!("{side}_edge")))?;
                shape[axis] = n;
                ctx.op(
                    Op::Expand {
                        shape: shape.iter().copied().collect(),
                    },
                    &[s],
                    Some(&tag(&format!("{side}_edges"))),
                )
            }
            "reflect" => {
                if n >= d {
                    return Err(ctx.unsupported(format!(
                        "reflect padding of {n} on an axis of {d} (Kiln needs pads smaller than the dim)"
                    )));
                }
                let start = if before { n } else { d - 2 };
                slice_along(ctx, x, axis, start, -1, n, &tag(&format!("{side}_reflect")))
            }
            "wrap" if ctx.opset >= 19 => {
                if n > d {
                    return Err(ctx.unsupported(format!(
                        "wrap padding of {n} on an axis of {d} (Kiln needs pads no larger than the dim)"
                    )));
                }
                let start = if before { d - n } else { 0 };
                slice_along(ctx, x, axis, start, 1, n, &tag(&format!("{side}_wrap")))
            }
            m => Err(ctx.bad_attr("mode", format!("unknown Pad mode '{m}'"))),
        }
    };
    let mut parts = Vec::with_capacity(3);
    if b > 0 {
        parts.push(border(ctx, x, b, true)?);
    }
    parts.push(x);
    if e > 0 {
        parts.push(border(ctx, x, e, false)?);
    }
    ctx.op(Op::Concat { axis }, &parts, Some(&tag("padded")))
}

/// Reshape → Transpose → Reshape, the last step named after the node.
fn shuffle(
    ctx: &mut ImportCtx,
    x: Val,
    view: &[usize],
    perm: &[usize],
    out: &[usize],
) -> Result<Val, OnnxError> {
    let v = reshape_to(ctx, x, view, Some("view"))?;
    let t = ctx.op(
        Op::Transpose {
            perm: perm.iter().copied().collect(),
        },
        &[v],
        Some("shuffle"),
    )?;
    ctx.op(
        Op::Reshape {
            shape: out.iter().copied().collect(),
        },
        &[t],
        None,
    )
}

/// `[N, C, H, W]` and the positive `blocksize` of a DepthToSpace or
/// SpaceToDepth node.
fn block_args(ctx: &ImportCtx, node: &NodeProto, x: Val) -> Result<([usize; 4], usize), OnnxError> {
    let s = ctx.ty(x).shape.clone();
    if s.len() != 4 {
        return Err(ctx.invalid(format!("needs a 4-D input, got {}", ctx.ty(x))));
    }
    let b = ctx
        .attr_i(node, "blocksize")?
        .ok_or_else(|| ctx.bad_attr("blocksize", "is required"))?;
    if !(1..=1 << 20).contains(&b) {
        return Err(ctx.bad_attr("blocksize", format!("must be in 1..=2^20, got {b}")));
    }
    Ok(([s[0], s[1], s[2], s[3]], b as usize))
}

/// `DepthToSpace` in DCR (default) or CRD mode.
pub fn depth_to_space(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let ([n, c, h, w], b) = block_args(ctx, node, x)?;
    if !c.is_multiple_of(b * b) {
        return Err(ctx.invalid(format!(
            "{c} channels do not divide by blocksize² = {}",
            b * b
        )));
    }
    let c2 = c / (b * b);
    let out = [n, c2, h * b, w * b];
    let mode = ctx.attr_s(node, "mode")?.unwrap_or_else(|| "DCR".into());
    let y = match mode.as_str() {
        "DCR" => shuffle(ctx, x, &[n, b, b, c2, h, w], &[0, 3, 4, 1, 5, 2], &out)?,
        "CRD" => shuffle(ctx, x, &[n, c2, b, b, h, w], &[0, 1, 4, 2, 5, 3], &out)?,
        m => return Err(ctx.bad_attr("mode", format!("unknown mode '{m}'"))),
    };
    one(y)
}

/// `SpaceToDepth` (DCR order; CRD where the node asks for it).
pub fn space_to_depth(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let ([n, c, h, w], b) = block_args(ctx, node, x)?;
    if !h.is_multiple_of(b) || !w.is_multiple_of(b) {
        return Err(ctx.invalid(format!("{h}×{w} does not divide by blocksize {b}")));
    }
    let view = [n, c, h / b, b, w / b, b];
    let out = [n, c * b * b, h / b, w / b];
    let mode = ctx.attr_s(node, "mode")?.unwrap_or_else(|| "DCR".into());
    let y = match mode.as_str() {
        "DCR" => shuffle(ctx, x, &view, &[0, 3, 5, 1, 2, 4], &out)?,
        "CRD" => shuffle(ctx, x, &view, &[0, 1, 3, 5, 2, 4], &out)?,
        m => return Err(ctx.bad_attr("mode", format!("unknown mode '{m}'"))),
    };
    one(y)
}

/// `Trilu`: keeps `j - i >= k` (upper) or `j - i <= k` (lower) of the last
/// two axes. The mask compares a constant `j - i` table with `k`, so `k`
/// may be a run-time scalar (with a constant one the mask folds).
pub fn trilu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let r = xt.shape.len();
    if r < 2 {
        return Err(ctx.invalid(format!("needs a rank ≥ 2 input, got {xt}")));
    }
    let k = match ctx.opt_input(node, 1) {
        None => gen_const(
            ctx,
            Tensor::new([], Data::I64(vec![0])).expect("scalar"),
            "k",
        )?,
        Some(k) => {
            if ctx.ty(k).num_elements() != 1 {
                return Err(ctx.invalid("k must be a scalar"));
            }
            let k = reshape_to(ctx, k, &[], Some("k_scalar"))?;
            cast_to(ctx, k, DType::I64, "k_i64")?
        }
    };
    let upper = ctx.attr_i_or(node, "upper", 1)? != 0;
    let (rows, cols) = (xt.shape[r - 2], xt.shape[r - 1]);
    ctx.charge_generated((rows * cols * 8) as u64)?;
    let diag: Vec<i64> = (0..rows * cols)
        .map(|f| (f % cols) as i64 - (f / cols) as i64)
        .collect();
    let diag = gen_const(
        ctx,
        Tensor::new([rows, cols], Data::I64(diag)).expect("rows*cols"),
        "diagonal_offset",
    )?;
    let cmp = if upper {
        CompareOp::GreaterOrEqual
    } else {
        CompareOp::LessOrEqual
    };
    let mask = ctx.op(Op::Compare(cmp), &[diag, k], Some("mask"))?;
    let zero = gen_const(
        ctx,
        Tensor::new([], Data::zeros(xt.dtype, 1)).expect("scalar"),
        "zero",
    )?;
    one(ctx.op(Op::Where, &[mask, x, zero], None)?)
}
