//! Reductions: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
//! ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceSumSquare.

use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{DType, Ints, Op, ReduceOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

fn reduce(ctx: &mut ImportCtx, node: &NodeProto, op: ReduceOp) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let keep_dims = ctx.attr_i_or(node, "keepdims", 1)? != 0;
    // `axes` moved from an attribute to an optional input: ReduceSum in
    // opset 13, the others in 18; `noop_with_empty_axes` came with it.
    let axes_input = match op {
        ReduceOp::Sum => ctx.opset >= 13,
        _ => ctx.opset >= 18,
    };
    let (axes, noop) = if axes_input {
        let axes = ctx
            .opt_const_input(node, 1)?
            .map(|t| t.to_i64_vec())
            .unwrap_or_default();
        (axes, ctx.attr_i_or(node, "noop_with_empty_axes", 0)? != 0)
    } else {
        (ctx.attr_ints(node, "axes")?.unwrap_or_default(), false)
    };
    // Max and Min of bools (opset 20+) are any and all: computed on u8.
    let bool_extreme = xt.dtype == DType::Bool && matches!(op, ReduceOp::Max | ReduceOp::Min);
    if !(xt.dtype.is_float() || op.accepts_int() && xt.dtype.is_int() || bool_extreme) {
        return Err(ctx.unsupported(format!("{} on {} is not supported", node.op_type, xt.dtype)));
    }
    let mut axes: Ints = if axes.is_empty() {
        if noop {
            return one(x);
        }
        (0..rank).collect()
    } else {
        axes.iter()
            .map(|&a| ctx.axis("axes", a, rank))
            .collect::<Result<_, _>>()?
    };
    axes.sort_unstable();
    axes.dedup();
    let reduce = Op::Reduce {
        op,
        axes,
        keep_dims,
    };
    if bool_extreme {
        let bytes = ctx.op(Op::Cast { to: DType::U8 }, &[x], Some("u8"))?;
        let r = ctx.op(reduce, &[bytes], Some("reduced"))?;
        return one(ctx.op(Op::Cast { to: DType::Bool }, &[r], None)?);
    }
    one(ctx.op(reduce, &[x], None)?)
}

macro_rules! reductions {
    ($($f:ident => $op:ident, $doc:literal;)*) => {$(
        #[doc = $doc]
        pub fn $f(ctx: &mut ImportCtx, node: &NodeProto) -> R {
            reduce(ctx, node, ReduceOp::$op)
        }
    )*};
}

reductions! {
    reduce_sum => Sum, "`ReduceSum`.";
    reduce_mean => Mean, "`ReduceMean`.";
    reduce_max => Max, "`ReduceMax`.";
    reduce_min => Min, "`ReduceMin`.";
    reduce_prod => Prod, "`ReduceProd`.";
    reduce_l1 => L1, "`ReduceL1`.";
    reduce_l2 => L2, "`ReduceL2`.";
    reduce_log_sum => LogSum, "`ReduceLogSum`.";
    reduce_log_sum_exp => LogSumExp, "`ReduceLogSumExp`.";
    reduce_sum_square => SumSquare, "`ReduceSumSquare`.";
}
