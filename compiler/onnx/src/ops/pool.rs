//! Pooling: `MaxPool`, `AveragePool` (2-D; 1-D through a reshape; 3-D as
//! per-slice 2-D pools combined along the depth) and the global pools.

use super::build::{reshape_to, scalar};
use super::one;
use super::window::{lift, spatial_rank, window};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, DType, Data, Op, Pool2d, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Builds a windowed pool; `make` turns the resolved window into the op.
fn pool(ctx: &mut ImportCtx, node: &NodeProto, make: impl Fn(Pool2d) -> Op) -> R {
    let x = ctx.input(node, 0)?;
    pool_of(ctx, node, x, make, None)
}

/// The required `kernel_shape`: `dims` positive sizes.
fn kernel_shape(ctx: &ImportCtx, node: &NodeProto, dims: usize) -> Result<Vec<usize>, OnnxError> {
    match ctx.attr_ints(node, "kernel_shape")? {
        Some(k) if k.len() == dims && k.iter().all(|&v| v > 0) => {
            Ok(k.iter().map(|&v| v as usize).collect())
        }
        Some(k) => Err(ctx.bad_attr(
            "kernel_shape",
            format!("expected {dims} positive values, got {k:?}"),
        )),
        None => Err(ctx.bad_attr("kernel_shape", "is required")),
    }
}

/// [`pool`] on the value `x` (not necessarily the node's input); `suffix`
/// names the result (`None`: the node's own output).
fn pool_of(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    make: impl Fn(Pool2d) -> Op,
    suffix: Option<&str>,
) -> R {
    if ctx.ty(x).shape.len() == 5 {
        return pool_3d(ctx, node, x, make, suffix);
    }
    let nsp = spatial_rank(ctx, x, "pools")?;
    let xs = ctx.ty(x).shape.clone();
    let kernel = kernel_shape(ctx, node, nsp)?;
    let win = window(ctx, node, &xs[2..], &kernel)?;
    let ceil_mode = ctx.attr_i_or(node, "ceil_mode", 0)? != 0;
    let (strides, pads, dilations) = win.to_2d();
    let kernel2 = if nsp == 1 {
        [1, kernel[0]]
    } else {
        [kernel[0], kernel[1]]
    };
    let op = make(Pool2d {
        kernel: kernel2,
        strides,
        pads,
        dilations,
        ceil_mode,
    });
    if nsp == 2 {
        return one(ctx.op(op, &[x], suffix)?);
    }
    let x4 = lift(ctx, x, "x2d")?;
    let y = ctx.op(op, &[x4], Some("pool2d"))?;
    let ys = ctx.ty(y).shape.clone();
    one(reshape_to(ctx, y, &[ys[0], ys[1], ys[3]], suffix)?)
}

/// Most (output depth × kernel depth) slices a 3-D pool is unrolled into.
const MAX_DEPTH_TAPS: usize = 4096;

/// A 3-D pool `[N, C, D, H, W]`: the 2-D pool over (H, W) of every depth
/// slice (the input viewed as `[N, C·D, H, W]`), then, per output depth,
/// the max or the mean of the valid depth taps. Rectangular windows make
/// this exact: the max of maxes is the max, and a mean of equal-count means
/// is the mean, the count being the product of the per-axis counts (with or
/// without padding, as `count_include_pad` says).
fn pool_3d(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    make: impl Fn(Pool2d) -> Op,
    suffix: Option<&str>,
) -> R {
    let xs = ctx.ty(x).shape.clone();
    let dt = ctx.ty(x).dtype;
    let kernel = kernel_shape(ctx, node, 3)?;
    let win = window(ctx, node, &xs[2..], &kernel)?;
    let ceil_mode = ctx.attr_i_or(node, "ceil_mode", 0)? != 0;
    let (depth, kd, sd, dd) = (xs[2], kernel[0], win.strides[0], win.dilations[0]);
    let (pd, pd_end) = (win.pads_begin[0], win.pads_end[0]);
    let out_depth = kiln_ir::infer::window_output_len(depth, kd, sd, pd, pd_end, dd, ceil_mode)
        .ok_or_else(|| ctx.invalid(format!("the depth window does not fit the input {xs:?}")))?;
    if out_depth.saturating_mul(kd) > MAX_DEPTH_TAPS {
        return Err(ctx.unsupported(format!(
            "a 3-D pool with {out_depth} output depths of {kd} taps (more than {MAX_DEPTH_TAPS} slices)"
        )));
    }
    let (strides, pads, dilations) = win.to_2d();
    let op = make(Pool2d {
        kernel: [kernel[1], kernel[2]],
        strides,
        pads,
        dilations,
        ceil_mode,
    });
    let average = match &op {
        Op::AveragePool {
            count_include_pad, ..
        } => Some(*count_include_pad),
        _ => None,
    };
    let combine = Op::Binary(if average.is_some() {
        BinaryOp::Add
    } else {
        BinaryOp::Max
    });
    let planes = reshape_to(
        ctx,
        x,
        &[xs[0], xs[1] * depth, xs[3], xs[4]],
        Some("planes"),
    )?;
    let pooled = ctx.op(op, &[planes], Some("pool_hw"))?;
    let ps = ctx.ty(pooled).shape.clone();
    let pooled = reshape_to(
        ctx,
        pooled,
        &[xs[0], xs[1], depth, ps[2], ps[3]],
        Some("depths"),
    )?;
    let mut outs = Vec::with_capacity(out_depth);
    for od in 0..out_depth {
        let start = (od * sd) as i64 - pd as i64;
        let taps: Vec<i64> = (0..kd as i64).map(|k| start + k * dd as i64).collect();
        let valid: Vec<usize> = taps
            .iter()
            .filter(|&&d| d >= 0 && d < depth as i64)
            .map(|&d| d as usize)
            .collect();
        if valid.is_empty() {
            return Err(ctx.unsupported(format!(
                "output depth {od} of the 3-D pool covers only padding"
            )));
        }
        let mut acc: Option<Val> = None;
        for &d in &valid {
            let slice = super::build::slice_along(ctx, pooled, 2, d, 1, 1, &format!("d{od}_{d}"))?;
            acc = Some(match acc {
                None => slice,
                Some(a) => ctx.op(combine.clone(), &[a, slice], Some(&format!("d{od}_acc{d}")))?,
            });
        }
        let mut v = acc.expect("at least one tap");
        if let Some(include_pad) = average {
            let count = if include_pad {
                let padded_end = (depth + pd_end) as i64;
                taps.iter()
                    .filter(|&&d| d >= -(pd as i64) && d < padded_end)
                    .count()
            } else {
                valid.len()
            };
            let c = scalar(ctx, dt, count as f64, &format!("d{od}_count"));
            v = ctx.op(
                Op::Binary(BinaryOp::Div),
                &[v, c],
                Some(&format!("d{od}_mean")),
            )?;
        }
        outs.push(v);
    }
    match outs[..] {
        [only] => one(only),
        _ => one(ctx.op(Op::Concat { axis: 2 }, &outs, suffix)?),
    }
}

/// `MaxPool` (the `Indices` output is rejected up front; `storage_order`
/// only affects `Indices` and is ignored).
pub fn max_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    if node.output.get(1).is_some_and(|o| !o.is_empty()) {
        return max_pool_with_indices(ctx, node, x);
    }
    if !matches!(dt, DType::U8 | DType::I8 | DType::U16 | DType::I16) {
        return pool(ctx, node, Op::MaxPool);
    }
    // 8- and 16-bit integers are exact in f32, and the max of exact values
    // is one of them: pooled in f32, cast back.
    let wide = super::build::cast_to(ctx, x, DType::F32, "wide")?;
    let y = pool_of(ctx, node, wide, Op::MaxPool, Some("pooled"))?;
    one(ctx.op(Op::Cast { to: dt }, &[y[0]], None)?)
}

/// `AveragePool` (`count_include_pad` from opset 7).
pub fn average_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let count_include_pad = ctx.attr_i_or(node, "count_include_pad", 0)? != 0;
    pool(ctx, node, |pool| Op::AveragePool {
        pool,
        count_include_pad,
    })
}

/// `GlobalAveragePool`.
pub fn global_average_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::GlobalAveragePool, &[x], None)?)
}

/// `GlobalMaxPool`.
pub fn global_max_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::GlobalMaxPool, &[x], None)?)
}

/// `LpPool`: `(Σ |x|^p)^(1/p)` over each window, zero padding included: an
/// average pool of `|x|^p` counting the padding, times the window size.
pub fn lp_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    if !dt.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {}", ctx.ty(x))));
    }
    let p = ctx.attr_i_or(node, "p", 2)?;
    if p < 1 {
        return Err(ctx.bad_attr("p", format!("must be ≥ 1, got {p}")));
    }
    let powered = match p {
        1 => ctx.op(Op::Unary(UnaryOp::Abs), &[x], Some("abs"))?,
        2 => ctx.op(Op::Binary(BinaryOp::Mul), &[x, x], Some("square"))?,
        _ => {
            let a = ctx.op(Op::Unary(UnaryOp::Abs), &[x], Some("abs"))?;
            let e = scalar(ctx, dt, p as f64, "p");
            ctx.op(Op::Binary(BinaryOp::Pow), &[a, e], Some("power"))?
        }
    };
    let mean = pool_of(
        ctx,
        node,
        powered,
        |pool| Op::AveragePool {
            pool,
            count_include_pad: true,
        },
        Some("window_mean"),
    )?[0];
    let k = ctx
        .attr_ints(node, "kernel_shape")?
        .unwrap_or_default()
        .iter()
        .try_fold(1i64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ctx.bad_attr("kernel_shape", "the window size overflows"))?;
    let kc = scalar(ctx, dt, k as f64, "window_size");
    let sum = ctx.op(Op::Binary(BinaryOp::Mul), &[mean, kc], Some("window_sum"))?;
    let y = match p {
        1 => sum,
        2 => ctx.op(Op::Unary(UnaryOp::Sqrt), &[sum], None)?,
        _ => {
            let r = scalar(ctx, dt, 1.0 / p as f64, "inv_p");
            ctx.op(Op::Binary(BinaryOp::Pow), &[sum, r], None)?
        }
    };
    one(y)
}

/// `MaxUnpool`: zeros with every value of X written at its index from I
/// (MaxPool's `Indices`: flat over the whole tensor of the inferred shape
/// `(in − 1)·stride − pads + kernel` per spatial axis), as a scatter of
/// one-element rows (`scatter::scatter_rows`; an index outside writes
/// nothing). With the constant `output_shape` input, that result is
/// padded with zeros after each spatial axis to it, as the ONNX reference
/// does.
pub fn max_unpool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let indices = ctx.input(node, 1)?;
    let xt = ctx.ty(x).clone();
    let it = ctx.ty(indices).clone();
    if it.shape != xt.shape || !it.dtype.is_int() {
        return Err(ctx.invalid(format!("I is {it}; it must be integers of X's shape {xt}")));
    }
    let nsp = spatial_rank(ctx, x, "MaxUnpool")?;
    let kernel = kernel_shape(ctx, node, nsp)?;
    let win = window(ctx, node, &xt.shape[2..], &kernel)?;
    let mut inferred = xt.shape[..2].to_vec();
    for (d, &k) in kernel.iter().enumerate() {
        let size = (xt.shape[2 + d] as i64 - 1) * win.strides[d] as i64
            - (win.pads_begin[d] + win.pads_end[d]) as i64
            + k as i64;
        let size = usize::try_from(size)
            .map_err(|_| ctx.invalid(format!("spatial axis {d} would have size {size}")))?;
        inferred.push(size);
    }
    let total: usize = inferred.iter().product();
    let n = xt.num_elements();
    let zeros = super::build::build_const(ctx, &[total, 1], xt.dtype, "zeros", |n| {
        kiln_ir::Data::zeros(xt.dtype, n)
    })?;
    let updates = reshape_to(ctx, x, &[n, 1], Some("updates"))?;
    let positions = super::build::cast_to(ctx, indices, DType::I64, "positions")?;
    let positions = reshape_to(ctx, positions, &[n], Some("flat_positions"))?;
    let mut y = super::scatter::scatter_rows(ctx, zeros, positions, updates, "none", &inferred)?;
    if ctx.opt_input(node, 2).is_some() {
        let shape = ctx.const_input(node, 2)?.to_i64_vec();
        if shape.len() != inferred.len() || shape[..2] != [inferred[0] as i64, inferred[1] as i64] {
            return Err(ctx.invalid(format!(
                "output_shape {shape:?} must keep N and C of {inferred:?}"
            )));
        }
        let rank = inferred.len();
        let zero = kiln_ir::Tensor::new(vec![1; rank], kiln_ir::Data::zeros(xt.dtype, 1))
            .expect("one zero");
        let zero = super::build::gen_const(ctx, zero, "zero")?;
        for axis in 2..rank {
            let extra = shape[axis] - inferred[axis] as i64;
            y = super::movement::pad_axis(ctx, y, axis, (0, extra), "constant", zero)?;
        }
    }
    one(y)
}

/// MaxPool with its `Indices` output (2-D, float): Y as without it; the
/// indices from the window unrolled into one strided slice of the input
/// padded with −∞ per kernel tap, a running maximum over the taps (strictly greater replaces, so the first
/// maximum in row-major tap order wins, as in onnxruntime) and the flat
/// index of each tap's pixel in the unpadded input, `((n·C + c)·H + h)·W
/// + w` (or `…·H + h` after `w` with `storage_order=1`), picked alongside.
fn max_pool_with_indices(ctx: &mut ImportCtx, node: &NodeProto, x: Val) -> R {
    let xt = ctx.ty(x).clone();
    if xt.shape.len() != 4 || !xt.dtype.is_float() {
        return Err(ctx.unsupported(format!(
            "the 'Indices' output of MaxPool on {xt} (only 2-D float pools)"
        )));
    }
    let (n, c, h, w) = (xt.shape[0], xt.shape[1], xt.shape[2], xt.shape[3]);
    let kernel = kernel_shape(ctx, node, 2)?;
    let win = window(ctx, node, &xt.shape[2..], &kernel)?;
    let ceil_mode = ctx.attr_i_or(node, "ceil_mode", 0)? != 0;
    let column_major = ctx.attr_i_or(node, "storage_order", 0)? == 1;
    let out = |d: usize| {
        kiln_ir::infer::window_output_len(
            xt.shape[2 + d],
            kernel[d],
            win.strides[d],
            win.pads_begin[d],
            win.pads_end[d],
            win.dilations[d],
            ceil_mode,
        )
    };
    let (Some(oh), Some(ow)) = (out(0), out(1)) else {
        return Err(ctx.invalid(format!("the window does not fit the input {xt}")));
    };
    let taps = kernel[0] * kernel[1];
    if taps.saturating_mul(n * c * oh * ow) > 1 << 26 {
        return Err(ctx.unsupported(format!(
            "MaxPool indices over {taps} taps of a {n}x{c}x{oh}x{ow} output (too large to unroll)"
        )));
    }
    // Padded so that every tap of every window (ceil_mode included) is
    // inside; the padding is −∞, never a maximum.
    let lowest = kiln_ir::Tensor::new(
        [1, 1, 1, 1],
        Data::from_f64s(xt.dtype, [f64::NEG_INFINITY].into_iter()),
    )
    .expect("one value");
    let lowest = super::build::gen_const(ctx, lowest, "lowest")?;
    let outputs = [oh, ow];
    let mut padded = x;
    for (d, &k) in kernel.iter().enumerate() {
        let reach = (outputs[d] - 1) * win.strides[d] + (k - 1) * win.dilations[d] + 1;
        let size = xt.shape[2 + d] + win.pads_begin[d];
        let after = reach.saturating_sub(size);
        padded = super::movement::pad_axis(
            ctx,
            padded,
            2 + d,
            (win.pads_begin[d] as i64, after as i64),
            "constant",
            lowest,
        )?;
    }
    // The flat index of output (n, c, i, j)'s tap (ki, kj): the plane's
    // base plus the row and column parts, each a small constant.
    let (row_scale, col_scale) = if column_major {
        (1, h as i64)
    } else {
        (w as i64, 1)
    };
    let plane = super::build::build_const(ctx, &[n, c, 1, 1], DType::I64, "plane_base", |len| {
        Data::I64((0..len as i64).map(|p| p * (h * w) as i64).collect())
    })?;
    // Per axis `d` and kernel tap `k`: the tap's value at every output
    // position along the axis (a strided slice of `v`), and its pixel's
    // part of the flat index (a constant broadcast along that axis).
    let scales = [row_scale, col_scale];
    let along = |ctx: &mut ImportCtx, v: Val, d: usize, k: usize, tag: &str| {
        let start = k * win.dilations[d];
        let step = win.strides[d];
        let value = super::build::slice_along(
            ctx,
            v,
            2 + d,
            start,
            step as i64,
            outputs[d],
            &format!("{tag}_axis{d}"),
        )?;
        let mut shape = [1, 1, 1, 1];
        shape[2 + d] = outputs[d];
        let index = super::build::build_const(
            ctx,
            &shape,
            DType::I64,
            &format!("{tag}_index{d}"),
            |len| {
                Data::I64(
                    (0..len)
                        .map(|i| ((i * step + start) as i64 - win.pads_begin[d] as i64) * scales[d])
                        .collect(),
                )
            },
        )?;
        Ok::<_, OnnxError>((value, index))
    };
    let mut best: Option<(Val, Val)> = None;
    for ki in 0..kernel[0] {
        let (rows, row_index) = along(ctx, padded, 0, ki, &format!("tap{ki}"))?;
        for kj in 0..kernel[1] {
            let tag = format!("tap{ki}_{kj}");
            let (value, col_index) = along(ctx, rows, 1, kj, &tag)?;
            let index = ctx.op(
                Op::Binary(BinaryOp::Add),
                &[row_index, col_index],
                Some(&format!("{tag}_pixel")),
            )?;
            let index = ctx.op(
                Op::Binary(BinaryOp::Add),
                &[plane, index],
                Some(&format!("{tag}_index")),
            )?;
            best = Some(match best {
                None => (value, index),
                Some((b, bi)) => {
                    let better = ctx.op(
                        Op::Compare(kiln_ir::CompareOp::Greater),
                        &[value, b],
                        Some(&format!("{tag}_better")),
                    )?;
                    let b = ctx.op(Op::Where, &[better, value, b], Some(&format!("{tag}_max")))?;
                    let bi = ctx.op(
                        Op::Where,
                        &[better, index, bi],
                        Some(&format!("{tag}_argmax")),
                    )?;
                    (b, bi)
                }
            });
        }
    }
    // Y from the pooling kernel (the same maxima): when Indices goes
    // unused, dead code removal drops the unrolled taps.
    let (_, indices) = best.expect("a kernel has a tap");
    let y = pool(ctx, node, Op::MaxPool)?[0];
    Ok(vec![y, indices])
}
