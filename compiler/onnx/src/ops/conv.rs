//! Convolution, transposed convolution and Col2Im. The window attributes
//! they share with pooling are in [`super::window`]; 1-D windows are lifted
//! to 2-D by inserting an H axis of 1.

use super::build::{accumulate, reshape_to};
use super::one;
use super::window::{conv_attrs, lift, positive_list, spatial_rank, window};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, Col2Im, Conv2d, Data, Op};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `Conv` (2-D; 1-D through a reshape; 3-D as 2-D convolutions per depth
/// tap, [`conv_3d`]).
pub fn conv(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let b = ctx.opt_input(node, 2);
    if ctx.ty(x).shape.len() == 5 {
        return one(conv_3d(ctx, node, x, w, b)?);
    }
    if let Some(y) = super::quant::qdq_conv(ctx, node, x, w, b)? {
        return one(y);
    }
    let nsp = spatial_rank(ctx, x, "convolutions")?;
    let xs = ctx.ty(x).shape.clone();
    let ws = ctx.ty(w).shape.clone();
    let op = Op::Conv(conv_attrs(ctx, node, &xs, &ws)?);
    if nsp == 2 {
        let mut inputs = vec![x, w];
        inputs.extend(b);
        return one(ctx.dense_op(op, &inputs, None)?);
    }
    let x4 = lift(ctx, x, "x2d")?;
    let w4 = lift(ctx, w, "w2d")?;
    let mut inputs = vec![x4, w4];
    inputs.extend(b);
    let y = ctx.dense_op(op, &inputs, Some("conv2d"))?;
    let ys = ctx.ty(y).shape.clone();
    one(reshape_to(ctx, y, &[ys[0], ys[1], ys[3]], None)?)
}

/// Most depth taps a 3-D convolution is unrolled into.
const MAX_DEPTH_TAPS: usize = 64;

/// A 3-D convolution `[N, C, D, H, W]` as one 2-D convolution per depth
/// tap `kd`: the input, padded along the depth and viewed depth-major
/// (`[N, D, C, H, W]`), is sliced at depths `kd·dd + od·sd` for every
/// output depth `od` and folded into the batch (`[N·OD, C, H, W]`), then
/// convolved over (H, W) with the weights' slice `W[:, :, kd]`; the
/// products summed over the taps (the bias added once) are the output,
/// viewed back channel-major. Each tap runs on the 2-D kernels (packed
/// weights, implicit GEMM) with `N·OD` images.
fn conv_3d(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    w: Val,
    b: Option<Val>,
) -> Result<Val, OnnxError> {
    let (xs, ws) = (ctx.ty(x).shape.clone(), ctx.ty(w).shape.clone());
    if ws.len() != 5 {
        return Err(ctx.invalid(format!("W has rank {} but X has rank 5", ws.len())));
    }
    if let Some(k) = ctx.attr_ints(node, "kernel_shape")? {
        if k.len() != 3 || k.iter().zip(&ws[2..]).any(|(&a, &b)| a != b as i64) {
            return Err(ctx.bad_attr("kernel_shape", format!("{k:?} does not match W {ws:?}")));
        }
    }
    let group = ctx.attr_i_or(node, "group", 1)?;
    let group = usize::try_from(group)
        .ok()
        .filter(|&g| g >= 1)
        .ok_or_else(|| ctx.bad_attr("group", format!("must be positive, got {group}")))?;
    let win = window(ctx, node, &xs[2..], &ws[2..])?;
    let (kd, sd, dd) = (ws[2], win.strides[0], win.dilations[0]);
    let (pd0, pd1) = (win.pads_begin[0], win.pads_end[0]);
    let padded = xs[2].checked_add(pd0).and_then(|v| v.checked_add(pd1));
    let span = (kd.max(1) - 1).checked_mul(dd).map(|v| v + 1);
    let out_depth = match (padded, span) {
        (Some(p), Some(s)) if p >= s && kd > 0 && p < 1 << 31 => (p - s) / sd + 1,
        _ => {
            return Err(ctx.invalid(format!(
                "the depth window of {kd} taps (dilation {dd}) does not fit the input {xs:?} with pads {pd0}/{pd1}"
            )))
        }
    };
    if kd > MAX_DEPTH_TAPS {
        return Err(ctx.unsupported(format!(
            "a 3-D convolution with {kd} depth taps (Kiln unrolls at most {MAX_DEPTH_TAPS})"
        )));
    }
    let (strides, pads, dilations) = win.to_2d();
    let attrs = Conv2d {
        strides,
        pads,
        dilations,
        group,
    };
    let (n, c) = (xs[0], xs[1]);
    let x = if pd0 + pd1 > 0 {
        let zero = super::build::scalar(ctx, ctx.ty(x).dtype, 0.0, "depth_pad_value");
        super::movement::pad_axis(ctx, x, 2, (pd0 as i64, pd1 as i64), "constant", zero)?
    } else {
        x
    };
    let depth_major = ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3, 4].into_iter().collect(),
        },
        &[x],
        Some("depth_major"),
    )?;
    let mut sum: Option<Val> = None;
    for t in 0..kd {
        let slices = super::build::slice_along(
            ctx,
            depth_major,
            1,
            t * dd,
            sd as i64,
            out_depth,
            &format!("depth_tap{t}"),
        )?;
        let images = reshape_to(
            ctx,
            slices,
            &[n * out_depth, c, xs[3], xs[4]],
            Some(&format!("depth_tap{t}_images")),
        )?;
        let wt = super::build::slice_along(ctx, w, 2, t, 1, 1, &format!("w_tap{t}"))?;
        let wt = reshape_to(
            ctx,
            wt,
            &[ws[0], ws[1], ws[3], ws[4]],
            Some(&format!("w_tap{t}_2d")),
        )?;
        let mut inputs = vec![images, wt];
        if t == 0 {
            inputs.extend(b);
        }
        let y = ctx.dense_op(
            Op::Conv(attrs.clone()),
            &inputs,
            Some(&format!("conv_tap{t}")),
        )?;
        sum = Some(accumulate(
            ctx,
            sum,
            Op::Binary(kiln_ir::BinaryOp::Add),
            y,
            &format!("sum_tap{t}"),
        )?);
    }
    let y = sum.expect("kd ≥ 1");
    let ys = ctx.ty(y).shape.clone();
    let y = reshape_to(ctx, y, &[n, out_depth, ys[1], ys[2], ys[3]], Some("depths"))?;
    ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3, 4].into_iter().collect(),
        },
        &[y],
        None,
    )
}

/// `CausalConvWithState`: a depthwise 1-D convolution over the past state
/// (zeros without one) followed by the input, optionally with SiLU; the
/// second output is the last `k - 1` positions of that padded input, the
/// state of the next call.
pub fn causal_conv_with_state(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let b = ctx.opt_input(node, 2);
    let past = ctx.opt_input(node, 3);
    let (xs, ws) = (ctx.ty(x).shape.clone(), ctx.ty(w).shape.clone());
    let [batch, channels, len] = xs[..] else {
        return Err(ctx.invalid(format!(
            "input must be [batch, channels, length], got {xs:?}"
        )));
    };
    if ws.len() != 3 || ws[0] != channels || ws[1] != 1 || ws[2] == 0 {
        return Err(ctx.invalid(format!(
            "weight must be [{channels}, 1, k] with k ≥ 1, got {ws:?}"
        )));
    }
    let k = ws[2];
    let activation = ctx
        .attr_s(node, "activation")?
        .unwrap_or_else(|| "none".into());
    let silu = match activation.as_str() {
        "none" => false,
        "silu" | "swish" => true,
        a => return Err(ctx.bad_attr("activation", format!("unknown activation '{a}'"))),
    };
    let state = match past {
        Some(p) => {
            if ctx.ty(p).shape[..] != [batch, channels, k - 1] {
                return Err(ctx.invalid(format!(
                    "past_state must be [{batch}, {channels}, {}], got {}",
                    k - 1,
                    ctx.ty(p)
                )));
            }
            p
        }
        None => {
            let dt = ctx.ty(x).dtype;
            super::build::build_const(ctx, &[batch, channels, k - 1], dt, "no_past", |n| {
                Data::zeros(dt, n)
            })?
        }
    };
    let padded = if k == 1 {
        x
    } else {
        ctx.op(Op::Concat { axis: 2 }, &[state, x], Some("padded"))?
    };
    let conv = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [0; 4],
        dilations: [1, 1],
        group: channels,
    });
    let x4 = lift(ctx, padded, "x2d")?;
    let w4 = lift(ctx, w, "w2d")?;
    let mut inputs = vec![x4, w4];
    inputs.extend(b);
    let y = ctx.dense_op(conv, &inputs, Some("conv2d"))?;
    let y = reshape_to(ctx, y, &[batch, channels, len], Some("conv"))?;
    let y = if silu {
        super::elementwise::silu(ctx, y, 1.0)?
    } else {
        y
    };
    let present = super::build::slice_along(ctx, padded, 2, len, 1, k - 1, "present_state")?;
    Ok(vec![y, present])
}

/// `ConvTranspose` as a MatMul of the transposed weights with the input
/// (every input pixel's contribution to every block element) followed by
/// `Col2Im`, which adds the blocks into the output, plus the bias. This is
/// the GEMM formulation onnxruntime uses too; the MatMul gets the fast
/// matrix kernels and Col2Im is a single scatter pass. 1-D runs as 2-D;
/// 3-D uses [`col2im_3d`].
pub fn conv_transpose(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let b = ctx.opt_input(node, 2);
    let nsp = match ctx.ty(x).shape.len() {
        5 => 3,
        _ => spatial_rank(ctx, x, "transposed convolutions")?,
    };
    let (x, w) = if nsp == 1 {
        (lift(ctx, x, "x2d")?, lift(ctx, w, "w2d")?)
    } else {
        (x, w)
    };
    let xs = ctx.ty(x).shape.clone();
    let ws = ctx.ty(w).shape.clone();
    if ws.len() != xs.len() {
        return Err(ctx.invalid(format!(
            "W must have rank {}, got {:?}",
            xs.len(),
            ws.as_slice()
        )));
    }
    let group = ctx.attr_i_or(node, "group", 1)?;
    if group < 1 || !xs[1].is_multiple_of(group as usize) || ws[0] != xs[1] {
        return Err(ctx.invalid(format!(
            "X {:?}, W {:?} and group {group} do not agree (W must be [C_in, C_out/group, k...])",
            xs.as_slice(),
            ws.as_slice()
        )));
    }
    let group = group as usize;
    let (n, ci) = (xs[0], xs[1]);
    let co_g = ws[1];
    let co = co_g * group;
    // The spatial axes as computed (1-D lifted to 2-D).
    let nd = xs.len() - 2;
    let input: Vec<usize> = xs[2..].to_vec();
    let kernel: Vec<usize> = ws[2..].to_vec();
    // Attributes are given for `nsp` axes; lift 1-D ones to 2-D.
    let lifted = |v: Vec<usize>, neutral: usize| -> Vec<usize> {
        if nsp == 1 {
            vec![neutral, v[0]]
        } else {
            v
        }
    };
    let strides = lifted(positive_list(ctx, node, "strides", nsp)?, 1);
    let dilations = lifted(positive_list(ctx, node, "dilations", nsp)?, 1);
    let output_padding = match ctx.attr_ints(node, "output_padding")? {
        None => vec![0; nsp],
        Some(v) if v.len() == nsp && v.iter().all(|&p| p >= 0) => {
            v.iter().map(|&p| p as usize).collect()
        }
        Some(v) => {
            return Err(ctx.bad_attr(
                "output_padding",
                format!("expected {nsp} non-negative values, got {v:?}"),
            ))
        }
    };
    let output_padding = lifted(output_padding, 0);
    // The output size without padding, per axis (checked: strides and
    // dilations come from the model).
    let mut natural_sizes = Vec::with_capacity(nd);
    for i in 0..nd {
        let size = strides[i]
            .checked_mul(input[i].saturating_sub(1))
            .zip(kernel[i].saturating_sub(1).checked_mul(dilations[i]))
            .and_then(|(a, b)| a.checked_add(b)?.checked_add(output_padding[i] + 1))
            .filter(|&s| s < (1 << 40))
            .ok_or_else(|| {
                ctx.unsupported(format!(
                    "a transposed convolution whose axis {i} would be larger than 2^40 elements"
                ))
            })?;
        natural_sizes.push(size);
    }
    let natural = |i: usize| natural_sizes[i];
    let auto_pad = ctx.attr_s(node, "auto_pad")?.unwrap_or_default();
    let output_shape = ctx.attr_ints(node, "output_shape")?;
    let mut pads_begin = vec![0usize; nd];
    let mut image = vec![0usize; nd];
    // Zeros added around the result where an output_shape beyond the
    // natural size asks for negative padding (as the ONNX reference does).
    let mut extend = vec![(0usize, 0usize); nd];
    if output_shape.is_some() || auto_pad.starts_with("SAME") {
        let target: Vec<usize> = match &output_shape {
            Some(s) if s.len() >= nsp && s.iter().all(|&d| d > 0) => {
                lifted(s[s.len() - nsp..].iter().map(|&d| d as usize).collect(), 1)
            }
            Some(s) => {
                return Err(
                    ctx.bad_attr("output_shape", format!("{s:?} is not {nsp} positive dims"))
                )
            }
            None => (0..nd).map(|i| input[i] * strides[i]).collect(),
        };
        for i in 0..nd {
            let total = natural(i) as i64 - target[i] as i64;
            // The reference's split, with floor division for negatives.
            let begin = if auto_pad == "SAME_UPPER" {
                total.div_euclid(2)
            } else {
                total - total.div_euclid(2)
            };
            let end = total - begin;
            extend[i] = ((-begin).max(0) as usize, (-end).max(0) as usize);
            pads_begin[i] = begin.max(0) as usize;
            image[i] = target[i] - extend[i].0 - extend[i].1;
        }
    } else {
        let pads = match ctx.attr_ints(node, "pads")? {
            None => vec![0; 2 * nsp],
            Some(p) if p.len() == 2 * nsp && p.iter().all(|&v| v >= 0) => {
                p.iter().map(|&v| v as usize).collect()
            }
            Some(p) => {
                return Err(ctx.bad_attr(
                    "pads",
                    format!("expected {} non-negative values, got {p:?}", 2 * nsp),
                ))
            }
        };
        let (begin, end) = (
            lifted(pads[..nsp].to_vec(), 0),
            lifted(pads[nsp..].to_vec(), 0),
        );
        for i in 0..nd {
            let out = natural(i)
                .checked_sub(begin[i] + end[i])
                .filter(|&o| o > 0)
                .ok_or_else(|| {
                    ctx.bad_attr(
                        "pads",
                        format!("padding {}+{} removes the whole axis {i}", begin[i], end[i]),
                    )
                })?;
            pads_begin[i] = begin[i];
            image[i] = out;
        }
    }
    // cols[n, g, co_g·k..., pixels] = Wᵀ[g, co_g·k..., ci/g] · X[n, g, ci/g, pixels];
    // without groups the group axis is left out, so the product is already
    // `cols` (and an epilogue can join it, `layout` and `fuse`).
    let ci_g = ci / group;
    let taps: usize = kernel.iter().product();
    let pixels: usize = input.iter().product();
    let m = co_g * taps;
    let (x_shape, w_shape, perm): (&[usize], &[usize], &[usize]) = if group == 1 {
        (&[n, ci, pixels], &[ci, m], &[1, 0])
    } else {
        (&[n, group, ci_g, pixels], &[group, ci_g, m], &[0, 2, 1])
    };
    let xg = reshape_to(ctx, x, x_shape, Some("x_groups"))?;
    let wg = reshape_to(ctx, w, w_shape, Some("w_groups"))?;
    let wt = ctx.op(
        Op::Transpose {
            perm: perm.iter().copied().collect(),
        },
        &[wg],
        Some("w_t"),
    )?;
    let cols = ctx.dense_op(Op::MatMul, &[wt, xg], Some("cols"))?;
    let cols = reshape_to(ctx, cols, &[n, co * taps, pixels], Some("cols_flat"))?;
    let extended = extend.iter().any(|&e| e != (0, 0));
    let mut y = if nd == 3 {
        let geo = Geometry3 {
            grid: [input[0], input[1], input[2]],
            image: [image[0], image[1], image[2]],
            block: [kernel[0], kernel[1], kernel[2]],
            strides: [strides[0], strides[1], strides[2]],
            dilations: [dilations[0], dilations[1], dilations[2]],
            pads: [pads_begin[0], pads_begin[1], pads_begin[2]],
        };
        col2im_3d(ctx, cols, &geo, (b.is_none() && !extended).then_some(()))?
    } else {
        let col2im = Op::Col2Im(Col2Im {
            grid: [input[0], input[1]],
            image: [image[0], image[1]],
            block: [kernel[0], kernel[1]],
            strides: [strides[0], strides[1]],
            dilations: [dilations[0], dilations[1]],
            pads: [pads_begin[0], pads_begin[1]],
        });
        let last_is_output = b.is_none() && nsp == 2 && !extended;
        ctx.op(col2im, &[cols], (!last_is_output).then_some("col2im"))?
    };
    for (i, &(before, after)) in extend.iter().enumerate() {
        if (before, after) != (0, 0) {
            let zero = super::build::scalar(ctx, ctx.ty(y).dtype, 0.0, "extension_zero");
            let range = (before as i64, after as i64);
            y = super::movement::pad_axis(ctx, y, 2 + i, range, "constant", zero)?;
        }
    }
    if let Some(b) = b {
        let mut bias_shape = vec![1, co];
        bias_shape.resize(nd + 2, 1);
        let bias = reshape_to(ctx, b, &bias_shape, Some("bias"))?;
        y = ctx.op(
            Op::Binary(BinaryOp::Add),
            &[y, bias],
            (nsp == 1).then_some("bias_add"),
        )?;
    }
    if nsp == 1 {
        y = reshape_to(ctx, y, &[n, co, image[1]], None)?;
    }
    one(y)
}

/// The geometry of a 3-D Col2Im: the block grid, the image, the block and
/// the window's strides, dilations and leading pads, per (D, H, W).
struct Geometry3 {
    grid: [usize; 3],
    image: [usize; 3],
    block: [usize; 3],
    strides: [usize; 3],
    dilations: [usize; 3],
    pads: [usize; 3],
}

/// A 3-D Col2Im (`cols` `[N, C·kd·kh·kw, gd·gh·gw]` into `[N, C, D, H,
/// W]`) as one 2-D Col2Im per depth tap: the tap's columns, depth-major
/// (`[N·gd, C·kh·kw, gh·gw]`), fold into `[N·gd, C, H, W]` planes, which
/// land at depths `gi·sd + t·dd − pad`: spread by `sd` (zeros between), then
/// shifted into place (padded or cropped along the depth) and summed over
/// the taps. `as_output`: the last node is the op's own output.
fn col2im_3d(
    ctx: &mut ImportCtx,
    cols: Val,
    g: &Geometry3,
    as_output: Option<()>,
) -> Result<Val, OnnxError> {
    let n = ctx.ty(cols).shape[0];
    let [kd, kh, kw] = g.block;
    let [gd, gh, gw] = g.grid;
    let [d, h, w] = g.image;
    let taps = kd * kh * kw;
    if kd > MAX_DEPTH_TAPS {
        return Err(ctx.unsupported(format!(
            "a 3-D Col2Im with {kd} depth taps (Kiln unrolls at most {MAX_DEPTH_TAPS})"
        )));
    }
    let reach = (kd.max(1) - 1).checked_mul(g.dilations[0]);
    if reach.is_none_or(|r| r >= 1 << 31)
        || gd.checked_mul(g.strides[0]).is_none_or(|l| l >= 1 << 31)
    {
        return Err(ctx.unsupported(format!(
            "a 3-D Col2Im spreading {gd} depths by a stride of {} with a dilation of {}",
            g.strides[0], g.dilations[0]
        )));
    }
    let c = ctx.ty(cols).shape[1] / taps.max(1);
    let view = reshape_to(
        ctx,
        cols,
        &[n, c, kd, kh * kw, gd, gh * gw],
        Some("cols_3d"),
    )?;
    let plane = c * h * w;
    let dtype = ctx.ty(cols).dtype;
    let zero = super::build::scalar(ctx, dtype, 0.0, "col2im_zero");
    let mut sum: Option<Val> = None;
    for t in 0..kd {
        let tap = super::build::slice_along(ctx, view, 2, t, 1, 1, &format!("tap{t}"))?;
        let tap = ctx.op(
            Op::Transpose {
                perm: [0, 4, 1, 2, 3, 5].into_iter().collect(),
            },
            &[tap],
            Some(&format!("tap{t}_depth_major")),
        )?;
        let tap = reshape_to(
            ctx,
            tap,
            &[n * gd, c * kh * kw, gh * gw],
            Some(&format!("tap{t}_cols")),
        )?;
        let planes = ctx.op(
            Op::Col2Im(Col2Im {
                grid: [gh, gw],
                image: [h, w],
                block: [kh, kw],
                strides: [g.strides[1], g.strides[2]],
                dilations: [g.dilations[1], g.dilations[2]],
                pads: [g.pads[1], g.pads[2]],
            }),
            &[tap],
            Some(&format!("tap{t}_planes")),
        )?;
        // [N, gd, 1, plane] spread to [N, gd·sd, plane]: grid depth gi at gi·sd.
        let sd = g.strides[0];
        let spread = reshape_to(
            ctx,
            planes,
            &[n, gd, 1, plane],
            Some(&format!("tap{t}_rows")),
        )?;
        let spread = if sd > 1 {
            let s =
                super::movement::pad_axis(ctx, spread, 2, (0, sd as i64 - 1), "constant", zero)?;
            reshape_to(
                ctx,
                s,
                &[n, gd * sd, plane],
                Some(&format!("tap{t}_spread")),
            )?
        } else {
            reshape_to(
                ctx,
                spread,
                &[n, gd, plane],
                Some(&format!("tap{t}_spread")),
            )?
        };
        // Shift by t·dd − pad into the D depths.
        let before = (t * g.dilations[0]) as i64 - g.pads[0] as i64;
        let after = d as i64 - (gd * sd) as i64 - before;
        let placed = super::movement::pad_axis(ctx, spread, 1, (before, after), "constant", zero)?;
        sum = Some(accumulate(
            ctx,
            sum,
            Op::Binary(BinaryOp::Add),
            placed,
            &format!("sum_tap{t}"),
        )?);
    }
    let y = reshape_to(ctx, sum.expect("kd ≥ 1"), &[n, d, c, h, w], Some("depths"))?;
    ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3, 4].into_iter().collect(),
        },
        &[y],
        if as_output.is_some() {
            None
        } else {
            Some("col2im_3d")
        },
    )
}

/// `Col2Im` (opset 18) on two spatial axes, or three ([`col2im_3d`]).
pub fn col2im(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let image = ctx.const_input(node, 1)?.to_i64_vec();
    let block = ctx.const_input(node, 2)?.to_i64_vec();
    let nd = image.len();
    if !(2..=3).contains(&nd) || block.len() != nd {
        return Err(ctx.unsupported(format!(
            "only 2-D and 3-D Col2Im are supported, got image_shape {image:?} and block_shape {block:?}"
        )));
    }
    if image.iter().chain(&block).any(|&d| d <= 0) {
        return Err(ctx.invalid(format!(
            "image_shape {image:?} and block_shape {block:?} must be positive"
        )));
    }
    let image: Vec<usize> = image.iter().map(|&d| d as usize).collect();
    let block: Vec<usize> = block.iter().map(|&d| d as usize).collect();
    let strides = positive_list(ctx, node, "strides", nd)?;
    let dilations = positive_list(ctx, node, "dilations", nd)?;
    let pads = match ctx.attr_ints(node, "pads")? {
        None => vec![0; 2 * nd],
        Some(p) if p.len() == 2 * nd && p.iter().all(|&v| v >= 0) => {
            p.iter().map(|&v| v as usize).collect()
        }
        Some(p) => {
            return Err(ctx.bad_attr(
                "pads",
                format!("expected {} non-negative values, got {p:?}", 2 * nd),
            ))
        }
    };
    let mut grid = vec![0usize; nd];
    for i in 0..nd {
        grid[i] = kiln_ir::infer::window_output_len(
            image[i],
            block[i],
            strides[i],
            pads[i],
            pads[i + nd],
            dilations[i],
            false,
        )
        .ok_or_else(|| {
            ctx.invalid(format!(
                "block {block:?} does not fit the padded image {image:?}"
            ))
        })?;
    }
    if nd == 3 {
        let xs = ctx.ty(x).shape.clone();
        let taps: usize = block.iter().product();
        let cells: usize = grid.iter().product();
        if xs.len() != 3 || !xs[1].is_multiple_of(taps) || xs[2] != cells {
            return Err(ctx.invalid(format!(
                "input {xs:?} is not [N, C·{taps}, {cells}] for blocks {block:?} over the grid {grid:?}"
            )));
        }
        let geo = Geometry3 {
            grid: [grid[0], grid[1], grid[2]],
            image: [image[0], image[1], image[2]],
            block: [block[0], block[1], block[2]],
            strides: [strides[0], strides[1], strides[2]],
            dilations: [dilations[0], dilations[1], dilations[2]],
            pads: [pads[0], pads[1], pads[2]],
        };
        return one(col2im_3d(ctx, x, &geo, Some(()))?);
    }
    one(ctx.op(
        Op::Col2Im(Col2Im {
            grid: [grid[0], grid[1]],
            image: [image[0], image[1]],
            block: [block[0], block[1]],
            strides: [strides[0], strides[1]],
            dilations: [dilations[0], dilations[1]],
            pads: [pads[0], pads[1]],
        }),
        &[x],
        None,
    )?)
}
