//! `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` (inference of
//! the loss value), decomposed like the ONNX reference: the target class's
//! input is picked with the GatherElements decomposition, ignored targets
//! contribute 0, class weights are gathered per target, and `mean` divides
//! by the summed weights.

use super::build::int_scalar;
use super::build::{cast_to, reshape_to, scalar};
use super::elementwise::log_softmax_along;
use super::index::gather_along;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Ints, Op, ReduceOp, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// The loss of log-probabilities `x` `[N, C, d..]` against `target`
/// `[N, d..]`. `weigh_ignored` says whether, without class weights, an
/// ignore index still produces per-element weights (SoftmaxCrossEntropyLoss
/// always; NegativeLogLikelihoodLoss unless ignore_index is -1, as in the
/// reference).
fn nll(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    target: Val,
    weight: Option<Val>,
    weigh_without_index: bool,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    let tt = ctx.ty(target).clone();
    if xt.shape.len() < 2 || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("input must be float [N, C, ..], got {xt}")));
    }
    let mut want: Vec<usize> = xt.shape.to_vec();
    want.remove(1);
    if tt.shape.as_slice() != want.as_slice() || !tt.dtype.is_int() {
        return Err(ctx.invalid(format!("target {tt} does not match input {xt}")));
    }
    let reduction = ctx
        .attr_s(node, "reduction")?
        .unwrap_or_else(|| "mean".into());
    let ignore = ctx.attr_i(node, "ignore_index")?;
    let dt = xt.dtype;
    let target = cast_to(ctx, target, DType::I64, "target_i64")?;
    let (safe, valid) = match ignore {
        Some(ig) => {
            let igv = int_scalar(ctx, ig, "ignore_index")?;
            let valid = ctx.op(
                Op::Compare(CompareOp::Equal),
                &[target, igv],
                Some("ignored"),
            )?;
            let valid = ctx.op(Op::Not, &[valid], Some("counted"))?;
            let zero = int_scalar(ctx, 0, "class_zero")?;
            let safe = ctx.op(Op::Where, &[valid, target, zero], Some("safe_target"))?;
            (safe, Some(valid))
        }
        None => (target, None),
    };
    let mut ts = want.clone();
    ts.insert(1, 1);
    let ti = reshape_to(ctx, safe, &ts, Some("target_view"))?;
    let picked = gather_along(ctx, x, ti, 1, Some("picked"))?;
    let picked = reshape_to(ctx, picked, &want, Some("picked_flat"))?;
    let mut loss = ctx.op(Op::Unary(UnaryOp::Neg), &[picked], Some("neg_picked"))?;
    let zero = scalar(ctx, dt, 0.0, "zero");
    if let Some(valid) = valid {
        loss = ctx.op(Op::Where, &[valid, loss, zero], Some("loss_kept"))?;
    }
    let gw = match (weight, valid) {
        (Some(w), _) => {
            let c = xt.shape[1];
            // The reference clips out-of-range targets into the weights.
            let hi = int_scalar(ctx, c as i64 - 1, "class_max")?;
            let lo = int_scalar(ctx, 0, "class_min")?;
            let t = ctx.op(Op::Binary(BinaryOp::Min), &[safe, hi], Some("class_hi"))?;
            let t = ctx.op(Op::Binary(BinaryOp::Max), &[t, lo], Some("class_clip"))?;
            let w = cast_to(ctx, w, dt, "weight_cast")?;
            let g = ctx.op(Op::Gather { axis: 0 }, &[w, t], Some("target_weight"))?;
            Some(match valid {
                Some(v) => ctx.op(Op::Where, &[v, g, zero], Some("target_weight_kept"))?,
                None => g,
            })
        }
        (None, Some(v)) if weigh_without_index => {
            Some(ctx.op(Op::Cast { to: dt }, &[v], Some("target_weight"))?)
        }
        _ => None,
    };
    if let Some(g) = gw {
        loss = ctx.op(Op::Binary(BinaryOp::Mul), &[loss, g], Some("weighted"))?;
    }
    let all: Ints = (0..want.len()).collect();
    let total = |ctx: &mut ImportCtx, v: Val, op: ReduceOp, tag: &str| {
        ctx.op(
            Op::Reduce {
                op,
                axes: all.clone(),
                keep_dims: false,
            },
            &[v],
            Some(tag),
        )
    };
    match reduction.as_str() {
        "none" => Ok(loss),
        "sum" => total(ctx, loss, ReduceOp::Sum, "loss_sum"),
        "mean" => match gw {
            Some(g) => {
                let s = total(ctx, loss, ReduceOp::Sum, "loss_sum")?;
                let n = total(ctx, g, ReduceOp::Sum, "weight_sum")?;
                ctx.op(Op::Binary(BinaryOp::Div), &[s, n], Some("loss_mean"))
            }
            None => total(ctx, loss, ReduceOp::Mean, "loss_mean"),
        },
        r => Err(ctx.bad_attr("reduction", format!("unknown reduction '{r}'"))),
    }
}

/// `NegativeLogLikelihoodLoss`.
pub fn nll_loss(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let target = ctx.input(node, 1)?;
    let weight = ctx.opt_input(node, 2);
    let weigh = ctx.attr_i(node, "ignore_index")? != Some(-1);
    Ok(vec![nll(ctx, node, x, target, weight, weigh)?])
}

/// `SoftmaxCrossEntropyLoss`: the loss of `log_softmax(scores, axis 1)`,
/// and those log-probabilities as the optional second output.
pub fn softmax_cross_entropy_loss(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let scores = ctx.input(node, 0)?;
    let target = ctx.input(node, 1)?;
    let weight = ctx.opt_input(node, 2);
    if ctx.ty(scores).shape.len() < 2 {
        return Err(ctx.invalid("scores must be [N, C, ..]"));
    }
    let log_prob = log_softmax_along(ctx, scores, 1)?;
    let loss = nll(ctx, node, log_prob, target, weight, true)?;
    Ok(vec![loss, log_prob])
}
