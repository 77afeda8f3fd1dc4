//! The `ai.onnx.ml` ops Kiln imports: `Binarizer` and
//! `ArrayFeatureExtractor`.

use super::build::{reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{CompareOp, Op};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `Binarizer`: 1 where `x > threshold` (default 0), else 0, in x's type.
pub fn binarizer(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    if !dt.is_float() && !dt.is_int() {
        return Err(ctx.invalid(format!("X must be numeric, got {}", ctx.ty(x))));
    }
    let threshold = ctx.attr_f_or(node, "threshold", 0.0)? as f64;
    let t = scalar(ctx, dt, threshold, "threshold");
    let above = ctx.op(Op::Compare(CompareOp::Greater), &[x, t], Some("above"))?;
    let (on, off) = (scalar(ctx, dt, 1.0, "one"), scalar(ctx, dt, 0.0, "zero"));
    one(ctx.op(Op::Where, &[above, on, off], None)?)
}

/// `ArrayFeatureExtractor`: the elements of X's last axis at the given
/// indices (all of them, flattened), a `gather`; a 1-D X gives `[1, n]`.
pub fn array_feature_extractor(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let xs = ctx.ty(x).shape.clone();
    let count = ctx.ty(idx).num_elements();
    if xs.is_empty() || !ctx.ty(idx).dtype.is_int() {
        return Err(ctx.invalid(format!(
            "X {} and indices {} must be a tensor and integers",
            ctx.ty(x),
            ctx.ty(idx)
        )));
    }
    let flat = reshape_to(ctx, idx, &[count], Some("indices"))?;
    let axis = xs.len() - 1;
    let y = ctx.op(Op::Gather { axis }, &[x, flat], Some("gathered"))?;
    let mut shape: Vec<usize> = if xs.len() == 1 {
        vec![1]
    } else {
        xs[..axis].to_vec()
    };
    shape.push(count);
    one(reshape_to(ctx, y, &shape, None)?)
}
