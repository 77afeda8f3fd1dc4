//! Pooling: `MaxPool`, `AveragePool` (2-D, or 1-D through a reshape) and the
//! global pools.

use super::conv::{lift, spatial_rank, window};
use super::elementwise::reshape_to;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{Op, Pool2d};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Builds a windowed pool; `make` turns the resolved window into the op.
fn pool(ctx: &mut ImportCtx, node: &NodeProto, make: impl Fn(Pool2d) -> Op) -> R {
    let x = ctx.input(node, 0)?;
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
        return one(ctx.op(op, &[x], None)?);
    }
    let x4 = lift(ctx, x, "x2d")?;
    let y = ctx.op(op, &[x4], Some("pool2d"))?;
    let ys = ctx.ty(y).shape.clone();
    one(reshape_to(ctx, y, &[ys[0], ys[1], ys[3]], None)?)
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
