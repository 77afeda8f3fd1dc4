//! Pooling: `MaxPool`, `AveragePool` (2-D, or 1-D through a reshape) and the
//! global pools.

use super::conv::{lift, spatial_rank, window};
use super::elementwise::{reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, Op, Pool2d, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Builds a windowed pool; `make` turns the resolved window into the op.
fn pool(ctx: &mut ImportCtx, node: &NodeProto, make: impl Fn(Pool2d) -> Op) -> R {
    let x = ctx.input(node, 0)?;
    pool_of(ctx, node, x, make, None)
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
    let nsp = spatial_rank(ctx, x, "pools")?;
    let xs = ctx.ty(x).shape.clone();
    let kernel = match ctx.attr_ints(node, "kernel_shape")? {
        Some(k) if k.len() == nsp && k.iter().all(|&v| v > 0) => {
            k.iter().map(|&v| v as usize).collect::<Vec<_>>()
        }
        Some(k) => {
            return Err(ctx.bad_attr(
                "kernel_shape",
                format!("expected {nsp} positive values, got {k:?}"),
            ))
        }
        None => return Err(ctx.bad_attr("kernel_shape", "is required")),
    };
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

/// `MaxPool` (the `Indices` output is rejected up front; `storage_order`
/// only affects `Indices` and is ignored).
pub fn max_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    pool(ctx, node, Op::MaxPool)
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
