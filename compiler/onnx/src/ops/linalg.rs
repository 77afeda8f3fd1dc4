//! Matrix products: `MatMul` and `Gemm`.

use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::Op;
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `MatMul` (numpy semantics).
pub fn matmul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    if let Some(y) = super::quant::qdq_matmul(ctx, a, b)? {
        return one(y);
    }
    one(ctx.dense_op(Op::MatMul, &[a, b], None)?)
}

/// `Gemm`: `alpha * op(A) @ op(B) + beta * C`. C is required before opset
/// 11 and optional after; the opset < 7 `broadcast` attribute is implied by
/// the IR's unidirectional broadcasting of C.
pub fn gemm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let alpha = ctx.attr_f_or(node, "alpha", 1.0)?;
    let beta = ctx.attr_f_or(node, "beta", 1.0)?;
    let trans_a = ctx.attr_i_or(node, "transA", 0)? != 0;
    let trans_b = ctx.attr_i_or(node, "transB", 0)? != 0;
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let mut inputs = vec![a, b];
    if let Some(c) = ctx.opt_input(node, 2) {
        inputs.push(c);
    }
    let op = Op::Gemm {
        alpha,
        beta,
        trans_a,
        trans_b,
    };
    one(ctx.dense_op(op, &inputs, None)?)
}
