//! Comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual), boolean
//! ops (And, Or, Xor, Not) and Where.

use super::elementwise::binary_operands;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{CompareOp, LogicalOp, Op};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

fn compare(ctx: &mut ImportCtx, node: &NodeProto, op: CompareOp) -> R {
    // Opsets 1-6 take the legacy `broadcast`/`axis` attributes (Equal,
    // Less, Greater); from 7 on numpy broadcasting.
    let (a, b) = binary_operands(ctx, node)?;
    one(ctx.op(Op::Compare(op), &[a, b], None)?)
}

fn logical(ctx: &mut ImportCtx, node: &NodeProto, op: LogicalOp) -> R {
    let (a, b) = binary_operands(ctx, node)?;
    one(ctx.op(Op::Logical(op), &[a, b], None)?)
}

/// `Equal`.
pub fn equal(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    compare(ctx, node, CompareOp::Equal)
}
/// `Less`.
pub fn less(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    compare(ctx, node, CompareOp::Less)
}
/// `Greater`.
pub fn greater(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    compare(ctx, node, CompareOp::Greater)
}
/// `LessOrEqual` (opset 12+).
pub fn less_or_equal(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    compare(ctx, node, CompareOp::LessOrEqual)
}
/// `GreaterOrEqual` (opset 12+).
pub fn greater_or_equal(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    compare(ctx, node, CompareOp::GreaterOrEqual)
}
/// `And`.
pub fn and(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    logical(ctx, node, LogicalOp::And)
}
/// `Or`.
pub fn or(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    logical(ctx, node, LogicalOp::Or)
}
/// `Xor`.
pub fn xor(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    logical(ctx, node, LogicalOp::Xor)
}

/// `Not`.
pub fn not(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::Not, &[x], None)?)
}

/// `Where` (opset 9+; numpy broadcasting of all three inputs).
pub fn where_(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let c = ctx.input(node, 0)?;
    let x = ctx.input(node, 1)?;
    let y = ctx.input(node, 2)?;
    one(ctx.op(Op::Where, &[c, x, y], None)?)
}
