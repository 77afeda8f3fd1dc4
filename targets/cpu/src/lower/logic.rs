//! Comparisons, boolean ops and Where, on top of [`elementwise::map`]
//! (scalar loops: the output element type differs from the inputs', or the
//! operands are bytes).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::InstBuilder;
use kiln_ir::{BitwiseOp, CompareOp, DType, LogicalOp};

use super::elementwise::{map, narrow, out_and_input, widen};
use super::{scalar_type, Kb, NodeCx};
use crate::CpuError;

/// Elementwise comparison with broadcasting; writes bools (bytes 0/1).
pub(crate) fn compare(kb: &mut Kb, cx: &NodeCx, op: CompareOp) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    if scalar_type(d).is_none() {
        return Err(cx.dtype_err(d));
    }
    let a = out_and_input(kb, cx, 0);
    let b = out_and_input(kb, cx, 1);
    let out = (kb.ptr(cx.out), DType::Bool);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[a, b], None, &move |kb, v| {
        if d.is_float() {
            let cc = match op {
                CompareOp::Equal => FloatCC::Equal,
                CompareOp::Less => FloatCC::LessThan,
                CompareOp::Greater => FloatCC::GreaterThan,
                CompareOp::LessOrEqual => FloatCC::LessThanOrEqual,
                CompareOp::GreaterOrEqual => FloatCC::GreaterThanOrEqual,
            };
            kb.b.ins().fcmp(cc, v[0], v[1])
        } else if d.is_unsigned() {
            let cc = match op {
                CompareOp::Equal => IntCC::Equal,
                CompareOp::Less => IntCC::UnsignedLessThan,
                CompareOp::Greater => IntCC::UnsignedGreaterThan,
                CompareOp::LessOrEqual => IntCC::UnsignedLessThanOrEqual,
                CompareOp::GreaterOrEqual => IntCC::UnsignedGreaterThanOrEqual,
            };
            let x = widen(kb, v[0], d);
            let y = widen(kb, v[1], d);
            kb.b.ins().icmp(cc, x, y)
        } else {
            let cc = match op {
                CompareOp::Equal => IntCC::Equal,
                CompareOp::Less => IntCC::SignedLessThan,
                CompareOp::Greater => IntCC::SignedGreaterThan,
                CompareOp::LessOrEqual => IntCC::SignedLessThanOrEqual,
                CompareOp::GreaterOrEqual => IntCC::SignedGreaterThanOrEqual,
            };
            let x = widen(kb, v[0], d);
            let y = widen(kb, v[1], d);
            kb.b.ins().icmp(cc, x, y)
        }
    });
    Ok(())
}

/// And/Or/Xor on bool bytes (always 0 or 1, so bitwise ops are exact).
pub(crate) fn logical(kb: &mut Kb, cx: &NodeCx, op: LogicalOp) -> Result<(), CpuError> {
    let a = out_and_input(kb, cx, 0);
    let b = out_and_input(kb, cx, 1);
    let out = (kb.ptr(cx.out), DType::Bool);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[a, b], None, &move |kb, v| match op {
        LogicalOp::And => kb.b.ins().band(v[0], v[1]),
        LogicalOp::Or => kb.b.ins().bor(v[0], v[1]),
        LogicalOp::Xor => kb.b.ins().bxor(v[0], v[1]),
    });
    Ok(())
}

/// Boolean negation of bool bytes.
pub(crate) fn not(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let x = out_and_input(kb, cx, 0);
    let out = (kb.ptr(cx.out), DType::Bool);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[x], None, &|kb, v| {
        kb.b.ins().bxor_imm_u(v[0], 1)
    });
    Ok(())
}

/// And/Or/Xor on integers of any width (on the element type itself), and
/// shifts on the value extended to i64 (Cranelift masks the amount, numpy
/// does not): an amount out of range, negative or the bit width or more
/// (one unsigned compare of the extended amount), gives 0, or the sign
/// fill for an arithmetic right shift.
pub(crate) fn bitwise(kb: &mut Kb, cx: &NodeCx, op: BitwiseOp) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    if !d.is_int() || scalar_type(d).is_none() {
        return Err(cx.dtype_err(d));
    }
    let a = out_and_input(kb, cx, 0);
    let b = out_and_input(kb, cx, 1);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    let bits = 8 * d.size_bytes() as i64;
    map(kb, &shape, out, &[a, b], None, &move |kb, v| match op {
        BitwiseOp::And => kb.b.ins().band(v[0], v[1]),
        BitwiseOp::Or => kb.b.ins().bor(v[0], v[1]),
        BitwiseOp::Xor => kb.b.ins().bxor(v[0], v[1]),
        BitwiseOp::ShiftLeft | BitwiseOp::ShiftRight => {
            let x = widen(kb, v[0], d);
            let n = widen(kb, v[1], d);
            let too_far =
                kb.b.ins()
                    .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, n, bits);
            let r = if op == BitwiseOp::ShiftRight && !d.is_unsigned() {
                // sshr by 63 is the sign fill.
                let all = kb.iconst(63);
                let n = kb.b.ins().select(too_far, all, n);
                kb.b.ins().sshr(x, n)
            } else {
                let r = if op == BitwiseOp::ShiftLeft {
                    kb.b.ins().ishl(x, n)
                } else {
                    kb.b.ins().ushr(x, n)
                };
                let z = kb.iconst(0);
                kb.b.ins().select(too_far, z, r)
            };
            narrow(kb, r, d)
        }
    });
    Ok(())
}

/// Bitwise complement of integers.
pub(crate) fn bitwise_not(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let d = cx.inputs[0].1.dtype;
    if !d.is_int() || scalar_type(d).is_none() {
        return Err(cx.dtype_err(d));
    }
    let x = out_and_input(kb, cx, 0);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[x], None, &|kb, v| kb.b.ins().bnot(v[0]));
    Ok(())
}

/// `cond ? x : y` with three-way broadcasting.
pub(crate) fn where_(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let d = cx.node.ty.dtype;
    if scalar_type(d).is_none() {
        return Err(cx.dtype_err(d));
    }
    let c = out_and_input(kb, cx, 0);
    let x = out_and_input(kb, cx, 1);
    let y = out_and_input(kb, cx, 2);
    let out = (kb.ptr(cx.out), d);
    let shape = cx.node.ty.shape.clone();
    map(kb, &shape, out, &[c, x, y], None, &|kb, v| {
        kb.b.ins().select(v[0], v[1], v[2])
    });
    Ok(())
}
