//! IR builders every op family uses: generated constants and scalars,
//! reshapes, casts, slices along one axis and sums. This module depends on
//! no op family, so the families depend on it and never on each other for
//! these.

use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{DType, Data, Op, SliceAxis, Tensor};

/// A constant the current node creates, named `{node}/{suffix}`.
pub(crate) fn gen_const(ctx: &mut ImportCtx, t: Tensor, suffix: &str) -> Result<Val, OnnxError> {
    let name = format!("{}/{suffix}", ctx.node_name());
    ctx.generated_constant(t, name)
}

/// A constant of `shape` and `dtype` the current node creates, named
/// `{node}/{suffix}`, its data made by `data` from the element count only
/// after the generated-constant budget has been charged: `shape` comes from
/// the model, so it may claim far more memory than the machine has.
pub(crate) fn build_const(
    ctx: &mut ImportCtx,
    shape: &[usize],
    dtype: DType,
    suffix: &str,
    data: impl FnOnce(usize) -> Data,
) -> Result<Val, OnnxError> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let bytes = n.and_then(|n| n.checked_mul(dtype.size_bytes()));
    ctx.charge_generated(bytes.map_or(u64::MAX, |b| b as u64))?;
    let n = n.expect("charged, so it fits");
    let t = Tensor::new(shape, data(n)).expect("n elements");
    let name = format!("{}/{suffix}", ctx.node_name());
    Ok(ctx.constant(t, name))
}

/// `0, 1, .., n-1` of `dtype` laid along `axis` of a rank-`rank` tensor whose
/// other dims are 1, so it broadcasts against a tensor of that rank.
pub(crate) fn ramp(
    ctx: &mut ImportCtx,
    n: usize,
    axis: usize,
    rank: usize,
    dtype: DType,
    suffix: &str,
) -> Result<Val, OnnxError> {
    let mut shape = vec![1; rank];
    shape[axis] = n;
    build_const(ctx, &shape, dtype, suffix, |n| {
        Data::from_i64s(dtype, 0..n as i64)
    })
}

/// An i64 scalar constant.
pub(crate) fn int_scalar(ctx: &mut ImportCtx, x: i64, suffix: &str) -> Result<Val, OnnxError> {
    gen_const(
        ctx,
        Tensor::new([], Data::I64(vec![x])).expect("scalar"),
        suffix,
    )
}

/// A scalar constant of type `dtype`.
pub(crate) fn scalar(ctx: &mut ImportCtx, dtype: DType, x: f64, name: &str) -> Val {
    let t = Tensor::new([], Data::from_f64s(dtype, std::iter::once(x))).expect("scalar");
    let name = format!("{}/{name}", ctx.node_name());
    ctx.constant(t, name)
}

/// Reshapes `v` to `shape` (no node when it already has that shape). With
/// `suffix` `None` the reshape is the ONNX node's own output.
pub(crate) fn reshape_to(
    ctx: &mut ImportCtx,
    v: Val,
    shape: &[usize],
    suffix: Option<&str>,
) -> Result<Val, OnnxError> {
    if ctx.ty(v).shape.as_slice() == shape {
        return Ok(v);
    }
    ctx.op(
        Op::Reshape {
            shape: shape.iter().copied().collect(),
        },
        &[v],
        suffix,
    )
}

/// Casts `v` to `dtype` (no node when it already has that type).
pub(crate) fn cast_to(
    ctx: &mut ImportCtx,
    v: Val,
    dtype: DType,
    suffix: &str,
) -> Result<Val, OnnxError> {
    if ctx.ty(v).dtype == dtype {
        return Ok(v);
    }
    ctx.op(Op::Cast { to: dtype }, &[v], Some(suffix))
}

/// Folds a variadic op into a chain of binary ops.
/// `acc op x` named `suffix`, or `x` itself when nothing is accumulated
/// yet: how decompositions fold a run of values into one.
pub(crate) fn accumulate(
    ctx: &mut ImportCtx,
    acc: Option<Val>,
    op: Op,
    x: Val,
    suffix: &str,
) -> Result<Val, OnnxError> {
    match acc {
        None => Ok(x),
        Some(a) => ctx.op(op, &[a, x], Some(suffix)),
    }
}

/// `x[start .. start + len]` (by `step`) along `axis`, every other axis whole.
pub(crate) fn slice_along(
    ctx: &mut ImportCtx,
    x: Val,
    axis: usize,
    start: usize,
    step: i64,
    len: usize,
    suffix: &str,
) -> Result<Val, OnnxError> {
    let shape = ctx.ty(x).shape.clone();
    let axes = shape
        .iter()
        .enumerate()
        .map(|(a, &d)| {
            if a == axis {
                SliceAxis { start, step, len }
            } else {
                SliceAxis {
                    start: 0,
                    step: 1,
                    len: d,
                }
            }
        })
        .collect();
    ctx.op(Op::Slice { axes }, &[x], Some(suffix))
}
