//! Normalizations: `BatchNormalization` in its inference form (`y = x * a +
//! b` with `a = scale / sqrt(var + eps)` and `b = B - mean * a`) and
//! `LayerNormalization`.

use super::build::{cast_to, reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, Data, Op, ReduceOp, Tensor, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `BatchNormalization` (inference). With constant parameters `a` and `b`
/// are computed here in f64 and the node becomes one `mul` and one `add`
/// with `[C, 1, 1]`-shaped constants; otherwise they are computed by IR ops.
/// Training mode (opset 14+) is [`batch_norm_training`]; the statistics
/// outputs of older opsets are rejected up front.
pub fn batch_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    if ctx.opset >= 14 && ctx.attr_i_or(node, "training_mode", 0)? != 0 {
        return batch_norm_training(ctx, node);
    }
    let x = ctx.input(node, 0)?;
    let params: Vec<Val> = (1..5)
        .map(|i| ctx.input(node, i))
        .collect::<Result<_, _>>()?;
    let eps = ctx.attr_f_or(node, "epsilon", 1e-5)? as f64;
    let xt = ctx.ty(x).clone();
    if xt.shape.len() < 2 {
        return Err(ctx.invalid(format!("X must have a channel axis, got {xt}")));
    }
    let c = xt.shape[1];
    // Opsets < 9: `spatial=0` gives per-activation parameters shaped like
    // X without its batch axis, which already broadcast as they are.
    let spatial = ctx.opset >= 9 || ctx.attr_i_or(node, "spatial", 1)? != 0;
    let pshape: Vec<usize> = if spatial {
        let mut s = vec![c];
        s.resize(xt.shape.len() - 1, 1);
        s
    } else {
        xt.shape[1..].to_vec()
    };
    let n: usize = pshape.iter().product();
    for (&p, name) in params.iter().zip(["scale", "B", "mean", "var"]) {
        if ctx.ty(p).num_elements() != n {
            return Err(ctx.invalid(format!(
                "{name} has shape {:?}, expected {n} elements",
                ctx.ty(p).shape.as_slice()
            )));
        }
    }
    if params.iter().all(|&p| ctx.konst(p).is_some()) {
        // The folded scale and shift, charged before anything is computed.
        ctx.charge_generated(2 * (n as u64) * xt.dtype.size_bytes() as u64)?;
    }
    let konsts: Option<Vec<Vec<f64>>> = params
        .iter()
        .map(|&p| ctx.konst(p).map(|t| t.to_f64_vec()))
        .collect();
    let (a, b) = if let Some(k) = konsts {
        let (scale, bias, mean, var) = (&k[0], &k[1], &k[2], &k[3]);
        let a: Vec<f64> = (0..n).map(|i| scale[i] / (var[i] + eps).sqrt()).collect();
        let b: Vec<f64> = (0..n).map(|i| bias[i] - mean[i] * a[i]).collect();
        let mk = |v: Vec<f64>| {
            Tensor::new(&pshape, Data::from_f64s(xt.dtype, v.into_iter())).expect("param shape")
        };
        let name = ctx.node_name().to_string();
        (
            ctx.constant(mk(a), format!("{name}/scale")),
            ctx.constant(mk(b), format!("{name}/shift")),
        )
    } else {
        let mut p = Vec::with_capacity(4);
        for (&v, name) in params.iter().zip(["scale", "B", "mean", "var"]) {
            let v = cast_to(ctx, v, xt.dtype, &format!("{name}_cast"))?;
            p.push(reshape_to(
                ctx,
                v,
                &pshape,
                Some(&format!("{name}_reshape")),
            )?);
        }
        let e = scalar(ctx, xt.dtype, eps, "epsilon");
        let ve = ctx.op(Op::Binary(BinaryOp::Add), &[p[3], e], Some("var_eps"))?;
        let sd = ctx.op(Op::Unary(UnaryOp::Sqrt), &[ve], Some("std"))?;
        let a = ctx.op(Op::Binary(BinaryOp::Div), &[p[0], sd], Some("scale"))?;
        let ma = ctx.op(Op::Binary(BinaryOp::Mul), &[p[2], a], Some("mean_scale"))?;
        let b = ctx.op(Op::Binary(BinaryOp::Sub), &[p[1], ma], Some("shift"))?;
        (a, b)
    };
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[x, a], Some("mul"))?;
    one(ctx.op(Op::Binary(BinaryOp::Add), &[y, b], None)?)
}

/// `BatchNormalization` with `training_mode=1` (opset 14+), as the ONNX
/// reference computes it: the batch's mean and (population) variance over
/// every axis but the channels normalize X, and the running statistics
/// outputs are `input · momentum + batch · (1 − momentum)`.
fn batch_norm_training(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    if rank < 2 || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!(
            "X must be a float tensor with a channel axis, got {xt}"
        )));
    }
    let c = xt.shape[1];
    let eps = ctx.attr_f_or(node, "epsilon", 1e-5)? as f64;
    let momentum = ctx.attr_f_or(node, "momentum", 0.9)? as f64;
    let mut per_channel = vec![1usize; rank];
    per_channel[1] = c;
    let mut params = Vec::with_capacity(4);
    for (i, name) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        let p = ctx.input(node, i)?;
        if ctx.ty(p).num_elements() != c {
            return Err(ctx.invalid(format!("{name} must have {c} elements, one per channel")));
        }
        let p = cast_to(ctx, p, xt.dtype, &format!("{name}_cast"))?;
        params.push(reshape_to(
            ctx,
            p,
            &per_channel,
            Some(&format!("{name}_view")),
        )?);
    }
    let axes: kiln_ir::Ints = (0..rank).filter(|&a| a != 1).collect();
    let mean_of = |ctx: &mut ImportCtx, v: Val, name: &str| {
        ctx.op(
            Op::Reduce {
                op: ReduceOp::Mean,
                axes: axes.clone(),
                keep_dims: true,
            },
            &[v],
            Some(name),
        )
    };
    let mean = mean_of(ctx, x, "batch_mean")?;
    let d = ctx.op(Op::Binary(BinaryOp::Sub), &[x, mean], Some("centered"))?;
    let d2 = ctx.op(Op::Binary(BinaryOp::Mul), &[d, d], Some("squares"))?;
    let var = mean_of(ctx, d2, "batch_var")?;
    let e = scalar(ctx, xt.dtype, eps, "epsilon");
    let ve = ctx.op(Op::Binary(BinaryOp::Add), &[var, e], Some("var_eps"))?;
    let sd = ctx.op(Op::Unary(UnaryOp::Sqrt), &[ve], Some("std"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Div), &[d, sd], Some("normalized"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[y, params[0]], Some("scaled"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Add), &[y, params[1]], Some("y"))?;
    let keep = scalar(ctx, xt.dtype, momentum, "momentum");
    let take = scalar(ctx, xt.dtype, 1.0 - momentum, "one_minus_momentum");
    let mut outs = vec![y];
    for (input, batch, name) in [
        (params[2], mean, "running_mean"),
        (params[3], var, "running_var"),
    ] {
        let old = ctx.op(
            Op::Binary(BinaryOp::Mul),
            &[input, keep],
            Some(&format!("{name}_kept")),
        )?;
        let new = ctx.op(
            Op::Binary(BinaryOp::Mul),
            &[batch, take],
            Some(&format!("{name}_taken")),
        )?;
        let r = ctx.op(
            Op::Binary(BinaryOp::Add),
            &[old, new],
            Some(&format!("{name}_sum")),
        )?;
        outs.push(reshape_to(ctx, r, &[c], Some(name))?);
    }
    Ok(outs)
}

/// `LayerNormalization` (opset 17): statistics over the axes from `axis`
/// (default -1) on; Scale and B are expanded to the normalized shape when
/// they broadcast to it from a smaller shape.
pub fn layer_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let axis = ctx.attr_i_or(node, "axis", -1)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let epsilon = ctx.attr_f_or(node, "epsilon", 1e-5)?;
    if ctx.attr_i_or(node, "stash_type", 1)? != 1 {
        return Err(
            ctx.unsupported("LayerNormalization with stash_type other than 1 (float32 statistics)")
        );
    }
    let normalized: Vec<usize> = xt.shape[axis..].to_vec();
    let mut inputs = vec![x];
    for (i, name) in [(1, "scale"), (2, "bias")] {
        let Some(p) = ctx.opt_input(node, i) else {
            continue;
        };
        let p = if ctx.ty(p).shape.as_slice() == normalized.as_slice() {
            p
        } else {
            ctx.op(
                Op::Expand {
                    shape: normalized.iter().copied().collect(),
                },
                &[p],
                Some(&format!("{name}_expand")),
            )?
        };
        inputs.push(p);
    }
    let y = ctx.op(Op::LayerNorm { axis, epsilon }, &inputs, None)?;
    let wants = |i: usize| node.output.get(i).is_some_and(|n| !n.is_empty());
    if !wants(1) && !wants(2) {
        return one(y);
    }
    // The statistics outputs, kept-dim shaped, from their own reductions.
    let (mean, inv_std) = moments(ctx, x, axis, epsilon)?;
    Ok(vec![y, mean, inv_std])
}

/// The mean and `1/sqrt(var + epsilon)` of `x` over the axes from `axis`
/// on, with the reduced axes kept as size 1.
fn moments(
    ctx: &mut ImportCtx,
    x: Val,
    axis: usize,
    epsilon: f32,
) -> Result<(Val, Val), OnnxError> {
    let xt = ctx.ty(x).clone();
    let mean_of = || Op::Reduce {
        op: ReduceOp::Mean,
        axes: (axis..xt.shape.len()).collect(),
        keep_dims: true,
    };
    let mean = ctx.op(mean_of(), &[x], Some("mean"))?;
    let d = ctx.op(Op::Binary(BinaryOp::Sub), &[x, mean], Some("centered"))?;
    let d2 = ctx.op(Op::Binary(BinaryOp::Mul), &[d, d], Some("squared"))?;
    let var = ctx.op(mean_of(), &[d2], Some("variance"))?;
    let e = scalar(ctx, xt.dtype, epsilon as f64, "epsilon");
    let ve = ctx.op(Op::Binary(BinaryOp::Add), &[var, e], Some("var_eps"))?;
    let sd = ctx.op(Op::Unary(UnaryOp::Sqrt), &[ve], Some("std"))?;
    let inv = ctx.op(Op::Unary(UnaryOp::Reciprocal), &[sd], Some("inv_std"))?;
    Ok((mean, inv))
}

/// `RMSNormalization` (opset 23): `x / sqrt(mean(x²) + epsilon) * scale`
/// over the axes from `axis` (default -1) on; Scale broadcasts to X.
pub fn rms_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    if !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {xt}")));
    }
    let axis = ctx.attr_i_or(node, "axis", -1)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let epsilon = ctx.attr_f_or(node, "epsilon", 1e-5)?;
    if ctx.attr_i_or(node, "stash_type", 1)? != 1 {
        return Err(
            ctx.unsupported("RMSNormalization with stash_type other than 1 (float32 statistics)")
        );
    }
    let x2 = ctx.op(Op::Binary(BinaryOp::Mul), &[x, x], Some("squared"))?;
    let ms = ctx.op(
        Op::Reduce {
            op: ReduceOp::Mean,
            axes: (axis..rank).collect(),
            keep_dims: true,
        },
        &[x2],
        Some("mean_square"),
    )?;
    let e = scalar(ctx, xt.dtype, epsilon as f64, "epsilon");
    let me = ctx.op(Op::Binary(BinaryOp::Add), &[ms, e], Some("mean_square_eps"))?;
    let rms = ctx.op(Op::Unary(UnaryOp::Sqrt), &[me], Some("rms"))?;
    let n = ctx.op(Op::Binary(BinaryOp::Div), &[x, rms], Some("normalized"))?;
    let scale = cast_to(ctx, scale, xt.dtype, "scale_cast")?;
    one(ctx.op(Op::Binary(BinaryOp::Mul), &[n, scale], None)?)
}

/// Normalizes `x` over groups: `x` viewed as `[N, groups, rest]` goes
/// through a LayerNorm on its last axis (unit scale), comes back as
/// `[N, C, S]`, and the per-channel (or, with `per_group`, per-group)
/// `scale` and `bias` apply. InstanceNormalization is the case
/// `groups == C`.
fn grouped_norm(
    ctx: &mut ImportCtx,
    x: Val,
    groups: usize,
    scale: Val,
    bias: Val,
    epsilon: f32,
    per_group: bool,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    if xt.shape.len() < 2 || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor with channels, got {xt}")));
    }
    let (n, c) = (xt.shape[0], xt.shape[1]);
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(ctx.invalid(format!("{c} channels do not split into {groups} groups")));
    }
    let s: usize = xt.shape[2..].iter().product();
    let rest = c / groups * s;
    let want = if per_group { groups } else { c };
    for (p, name) in [(scale, "scale"), (bias, "bias")] {
        if ctx.ty(p).num_elements() != want {
            return Err(ctx.invalid(format!(
                "{name} has {} elements, expected {want}",
                ctx.ty(p).num_elements()
            )));
        }
    }
    let v = reshape_to(ctx, x, &[n, groups, rest], Some("groups"))?;
    let ones = super::build::build_const(ctx, &[rest], xt.dtype, "unit_scale", |n| {
        Data::from_f64s(xt.dtype, std::iter::repeat_n(1.0, n))
    })?;
    let normed = ctx.op(
        Op::LayerNorm { axis: 2, epsilon },
        &[v, ones],
        Some("normalized"),
    )?;
    let (view, pshape): (Vec<usize>, Vec<usize>) = if per_group {
        (vec![n, groups, rest], vec![groups, 1])
    } else {
        (vec![n, c, s], vec![c, 1])
    };
    let y = reshape_to(ctx, normed, &view, Some("channels"))?;
    let sc = cast_to(ctx, scale, xt.dtype, "scale_cast")?;
    let sc = reshape_to(ctx, sc, &pshape, Some("scale_view"))?;
    let bi = cast_to(ctx, bias, xt.dtype, "bias_cast")?;
    let bi = reshape_to(ctx, bi, &pshape, Some("bias_view"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[y, sc], Some("scaled"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Add), &[y, bi], Some("shifted"))?;
    reshape_to(ctx, y, &xt.shape, Some("out"))
}

/// `InstanceNormalization`: statistics per sample and channel.
pub fn instance_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let bias = ctx.input(node, 2)?;
    let epsilon = ctx.attr_f_or(node, "epsilon", 1e-5)?;
    let c = ctx.ty(x).shape.get(1).copied().unwrap_or(0);
    one(grouped_norm(ctx, x, c, scale, bias, epsilon, false)?)
}

/// `GroupNormalization`: statistics per sample and group of channels. Opset
/// 18 scales per group, opset 21 per channel.
pub fn group_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scale = ctx.input(node, 1)?;
    let bias = ctx.input(node, 2)?;
    let epsilon = ctx.attr_f_or(node, "epsilon", 1e-5)?;
    let groups = ctx
        .attr_i(node, "num_groups")?
        .ok_or_else(|| ctx.bad_attr("num_groups", "is required"))?;
    if groups < 1 {
        return Err(ctx.bad_attr("num_groups", format!("must be positive, got {groups}")));
    }
    if ctx.attr_i_or(node, "stash_type", 1)? != 1 {
        return Err(
            ctx.unsupported("GroupNormalization with stash_type other than 1 (float32 statistics)")
        );
    }
    let per_group = ctx.opset < 21;
    one(grouped_norm(
        ctx,
        x,
        groups as usize,
        scale,
        bias,
        epsilon,
        per_group,
    )?)
}

/// `LpNormalization`: `x / ‖x‖_p` along `axis` (default -1), p = 1 or 2.
pub fn lp_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    if !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {xt}")));
    }
    let axis = ctx.attr_i_or(node, "axis", -1)?;
    let axis = ctx.axis("axis", axis, xt.shape.len())?;
    let op = match ctx.attr_i_or(node, "p", 2)? {
        1 => ReduceOp::L1,
        2 => ReduceOp::L2,
        p => return Err(ctx.bad_attr("p", format!("must be 1 or 2, got {p}"))),
    };
    let norm = ctx.op(
        Op::Reduce {
            op,
            axes: [axis].into_iter().collect(),
            keep_dims: true,
        },
        &[x],
        Some("norm"),
    )?;
    // A zero norm means a zero slice, which stays zero (the reference
    // divides by 1 there instead of producing NaN).
    let zero = scalar(ctx, xt.dtype, 0.0, "zero");
    let unit = scalar(ctx, xt.dtype, 1.0, "one");
    let null = ctx.op(
        Op::Compare(kiln_ir::CompareOp::Equal),
        &[norm, zero],
        Some("is_zero"),
    )?;
    let safe = ctx.op(Op::Where, &[null, unit, norm], Some("safe_norm"))?;
    one(ctx.op(Op::Binary(BinaryOp::Div), &[x, safe], None)?)
}

/// `LRN`: `x / (bias + alpha/size · Σ x²)^beta`, the sum over the `size`
/// channels around each one (zero beyond the edges), as shifted slices of
/// the zero-padded squares.
pub fn lrn(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    if xt.shape.len() < 2 || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float [N, C, ..] tensor, got {xt}")));
    }
    let size = ctx
        .attr_i(node, "size")?
        .ok_or_else(|| ctx.bad_attr("size", "is required"))?;
    if size < 1 {
        return Err(ctx.bad_attr("size", format!("must be positive, got {size}")));
    }
    let size = size as usize;
    let alpha = ctx.attr_f_or(node, "alpha", 1e-4)? as f64;
    let beta = ctx.attr_f_or(node, "beta", 0.75)? as f64;
    let bias = ctx.attr_f_or(node, "bias", 1.0)? as f64;
    let c = xt.shape[1];
    let (lo, hi) = ((size - 1) / 2, size / 2);
    let sq = ctx.op(Op::Binary(BinaryOp::Mul), &[x, x], Some("square"))?;
    let mut parts = Vec::with_capacity(3);
    let zeros = |ctx: &mut ImportCtx, n: usize, tag: &str| {
        let mut s = xt.shape.to_vec();
        s[1] = n;
        let z = Tensor::new(&s, Data::zeros(xt.dtype, s.iter().product())).expect("zeros");
        super::build::gen_const(ctx, z, tag)
    };
    if lo > 0 {
        parts.push(zeros(ctx, lo, "pad_lo")?);
    }
    parts.push(sq);
    if hi > 0 {
        parts.push(zeros(ctx, hi, "pad_hi")?);
    }
    let padded = if parts.len() == 1 {
        sq
    } else {
        ctx.op(Op::Concat { axis: 1 }, &parts, Some("padded"))?
    };
    let mut sum: Option<Val> = None;
    for i in 0..size {
        let s = super::build::slice_along(ctx, padded, 1, i, 1, c, &format!("window{i}"))?;
        sum = Some(match sum {
            None => s,
            Some(p) => ctx.op(Op::Binary(BinaryOp::Add), &[p, s], Some(&format!("sum{i}")))?,
        });
    }
    let sum = sum.expect("size ≥ 1");
    let a = scalar(ctx, xt.dtype, alpha / size as f64, "alpha_over_size");
    let b = scalar(ctx, xt.dtype, bias, "bias");
    let e = scalar(ctx, xt.dtype, beta, "beta");
    let t = ctx.op(Op::Binary(BinaryOp::Mul), &[sum, a], Some("scaled"))?;
    let t = ctx.op(Op::Binary(BinaryOp::Add), &[t, b], Some("biased"))?;
    let d = ctx.op(Op::Binary(BinaryOp::Pow), &[t, e], Some("denominator"))?;
    one(ctx.op(Op::Binary(BinaryOp::Div), &[x, d], None)?)
}

/// `MeanVarianceNormalization`: `(x - mean) / sqrt(var + 1e-9)` over `axes`
/// (default N, H, W).
pub fn mean_variance_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    if !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {xt}")));
    }
    let axes = ctx
        .attr_ints(node, "axes")?
        .unwrap_or_else(|| vec![0, 2, 3]);
    let mut axes: kiln_ir::Ints = axes
        .iter()
        .map(|&a| ctx.axis("axes", a, rank))
        .collect::<Result<_, _>>()?;
    axes.sort_unstable();
    axes.dedup();
    let mean_of = || Op::Reduce {
        op: ReduceOp::Mean,
        axes: axes.clone(),
        keep_dims: true,
    };
    let mean = ctx.op(mean_of(), &[x], Some("mean"))?;
    let d = ctx.op(Op::Binary(BinaryOp::Sub), &[x, mean], Some("centered"))?;
    let d2 = ctx.op(Op::Binary(BinaryOp::Mul), &[d, d], Some("squared"))?;
    let var = ctx.op(mean_of(), &[d2], Some("variance"))?;
    let e = scalar(ctx, xt.dtype, 1e-9, "epsilon");
    let ve = ctx.op(Op::Binary(BinaryOp::Add), &[var, e], Some("var_eps"))?;
    let sd = ctx.op(Op::Unary(UnaryOp::Sqrt), &[ve], Some("std"))?;
    one(ctx.op(Op::Binary(BinaryOp::Div), &[d, sd], None)?)
}
