//! Comparisons (Equal, Less, Greater, LessOrEqual, GreaterOrEqual), boolean
//! ops (And, Or, Xor, Not), bitwise ops (BitShift, BitwiseAnd/Or/Xor/Not)
//! and Where.

use super::elementwise::binary_operands;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BitwiseOp, CompareOp, LogicalOp, Op};
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

fn bitwise(ctx: &mut ImportCtx, node: &NodeProto, op: BitwiseOp) -> R {
    let (a, b) = binary_operands(ctx, node)?;
    one(ctx.op(Op::Bitwise(op), &[a, b], None)?)
}

/// `BitShift` (opset 11+, `direction` LEFT or RIGHT): unsigned integers,
/// and signed ones (as the opset 28 tests use them) with numpy semantics.
pub fn bit_shift(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let op = match ctx.attr_s(node, "direction")?.as_deref() {
        Some("LEFT") => BitwiseOp::ShiftLeft,
        Some("RIGHT") => BitwiseOp::ShiftRight,
        Some(other) => {
            return Err(ctx.bad_attr("direction", format!("must be LEFT or RIGHT, got {other:?}")))
        }
        None => return Err(ctx.bad_attr("direction", "is required")),
    };
    bitwise(ctx, node, op)
}
/// `BitwiseAnd` (opset 18+).
pub fn bitwise_and(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    bitwise(ctx, node, BitwiseOp::And)
}
/// `BitwiseOr` (opset 18+).
pub fn bitwise_or(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    bitwise(ctx, node, BitwiseOp::Or)
}
/// `BitwiseXor` (opset 18+).
pub fn bitwise_xor(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    bitwise(ctx, node, BitwiseOp::Xor)
}
/// `BitwiseNot` (opset 18+).
pub fn bitwise_not(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::BitwiseNot, &[x], None)?)
}

/// `Where` (opset 9+; numpy broadcasting of all three inputs).
pub fn where_(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let c = ctx.input(node, 0)?;
    let x = ctx.input(node, 1)?;
    let y = ctx.input(node, 2)?;
    one(ctx.op(Op::Where, &[c, x, y], None)?)
}
