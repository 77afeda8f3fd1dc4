//! Matrix products: `MatMul` and `Gemm`; `Det`.

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

/// Most rows of a matrix whose determinant is unrolled.
const MAX_DET_ORDER: usize = 64;

/// `Det` of `[..., n, n]` matrices: LU elimination with partial pivoting
/// (LAPACK's `getrf`, what numpy's reference uses), unrolled over the `n`
/// columns. Step `k` picks the row of largest `|a[i, k]|` among `i ≥ k`
/// (the first on ties), swaps it with row `k` by a permutation matrix
/// (a batched MatMul, which also flips the sign unless the rows are the
/// same), multiplies the determinant by the pivot and subtracts the pivot
/// row's multiples from the rows below (a zero pivot leaves them: the
/// determinant is then 0). Computed in f32 (f64 for f64 input).
pub fn det(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    use super::build::ramp;
    use super::build::{cast_to, reshape_to, scalar};
    use super::index::arg_extreme;
    use kiln_ir::{BinaryOp, CompareOp, DType, LogicalOp, UnaryOp};
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let r = xt.shape.len();
    if r < 2 || xt.shape[r - 1] != xt.shape[r - 2] || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("Det takes float [..., n, n] matrices, got {xt}")));
    }
    let n = xt.shape[r - 1];
    if n > MAX_DET_ORDER {
        return Err(ctx.unsupported(format!(
            "Det of {n}×{n} matrices (Kiln unrolls the elimination up to {MAX_DET_ORDER} rows)"
        )));
    }
    let batch_dims = &xt.shape[..r - 2];
    let b: usize = batch_dims.iter().product();
    let dt = if xt.dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let bin = |ctx: &mut ImportCtx, op: BinaryOp, a: Val, c: Val, name: &str| {
        ctx.op(Op::Binary(op), &[a, c], Some(name))
    };
    let cmp = |ctx: &mut ImportCtx, op: CompareOp, a: Val, c: Val, name: &str| {
        ctx.op(Op::Compare(op), &[a, c], Some(name))
    };
    let logic = |ctx: &mut ImportCtx, op: LogicalOp, a: Val, c: Val, name: &str| {
        ctx.op(Op::Logical(op), &[a, c], Some(name))
    };
    let xf = cast_to(ctx, x, dt, "x_compute")?;
    let mut a = reshape_to(ctx, xf, &[b, n, n], Some("matrices"))?;
    let mut det = scalar(ctx, dt, 1.0, "one");
    let rows = ramp(ctx, n, 1, 3, DType::I64, "rows")?;
    let cols = ramp(ctx, n, 2, 3, DType::I64, "cols")?;
    let rows_of_col = ramp(ctx, n, 1, 2, DType::I64, "col_rows")?;
    let eye = cmp(ctx, CompareOp::Equal, rows, cols, "eye")?;
    let (zero, one_, minus) = (
        scalar(ctx, dt, 0.0, "zero"),
        scalar(ctx, dt, 1.0, "plus"),
        scalar(ctx, dt, -1.0, "minus"),
    );
    let below = scalar(ctx, dt, -1.0, "excluded");
    for k in 0..n {
        let tag = |s: &str| format!("step{k}_{s}");
        let kv = super::build::int_scalar(ctx, k as i64, &tag("k"))?;
        // The pivot row: the largest |a[i, k]| for i ≥ k.
        let col = super::build::slice_along(ctx, a, 2, k, 1, 1, &tag("col"))?;
        let col = reshape_to(ctx, col, &[b, n], Some(&tag("col_flat")))?;
        let mag = ctx.op(Op::Unary(UnaryOp::Abs), &[col], Some(&tag("magnitude")))?;
        let eligible = cmp(
            ctx,
            CompareOp::GreaterOrEqual,
            rows_of_col,
            kv,
            &tag("eligible"),
        )?;
        let mag = ctx.op(Op::Where, &[eligible, mag, below], Some(&tag("candidates")))?;
        let p = arg_extreme(ctx, mag, 1, true, false, true, Some(&tag("pivot_row")))?;
        let p = reshape_to(ctx, p, &[b, 1, 1], Some(&tag("pivot_row_view")))?;
        // P swaps rows k and p (the identity when p = k).
        let row_k = cmp(ctx, CompareOp::Equal, rows, kv, &tag("row_is_k"))?;
        let row_p = cmp(ctx, CompareOp::Equal, rows, p, &tag("row_is_p"))?;
        let col_k = cmp(ctx, CompareOp::Equal, cols, kv, &tag("col_is_k"))?;
        let col_p = cmp(ctx, CompareOp::Equal, cols, p, &tag("col_is_p"))?;
        let kp = logic(ctx, LogicalOp::And, row_k, col_p, &tag("k_to_p"))?;
        let pk = logic(ctx, LogicalOp::And, row_p, col_k, &tag("p_to_k"))?;
        let moved = logic(ctx, LogicalOp::Or, row_k, row_p, &tag("moved"))?;
        let kept = ctx.op(Op::Not, &[moved], Some(&tag("kept")))?;
        let stay = logic(ctx, LogicalOp::And, eye, kept, &tag("stay"))?;
        let swap = logic(ctx, LogicalOp::Or, kp, pk, &tag("swap"))?;
        let perm = logic(ctx, LogicalOp::Or, swap, stay, &tag("perm"))?;
        let perm = ctx.op(Op::Where, &[perm, one_, zero], Some(&tag("perm_matrix")))?;
        a = ctx.op(Op::MatMul, &[perm, a], Some(&tag("pivoted")))?;
        let same = cmp(ctx, CompareOp::Equal, p, kv, &tag("no_swap"))?;
        let sign = ctx.op(Op::Where, &[same, one_, minus], Some(&tag("sign")))?;
        let pivot = super::build::slice_along(ctx, a, 1, k, 1, 1, &tag("pivot_row_values"))?;
        let piv = super::build::slice_along(ctx, pivot, 2, k, 1, 1, &tag("pivot"))?;
        let signed = bin(ctx, BinaryOp::Mul, piv, sign, &tag("signed_pivot"))?;
        det = bin(ctx, BinaryOp::Mul, det, signed, &tag("det"))?;
        if k + 1 == n {
            break;
        }
        // Rows below k lose their multiple of the pivot row.
        let col = super::build::slice_along(ctx, a, 2, k, 1, 1, &tag("pivoted_col"))?;
        let zero_pivot = cmp(ctx, CompareOp::Equal, piv, zero, &tag("pivot_zero"))?;
        let nonzero = ctx.op(Op::Not, &[zero_pivot], Some(&tag("pivot_nonzero")))?;
        let under = cmp(ctx, CompareOp::Greater, rows, kv, &tag("below"))?;
        let apply = logic(ctx, LogicalOp::And, under, nonzero, &tag("eliminate"))?;
        let ratio = bin(ctx, BinaryOp::Div, col, piv, &tag("ratio"))?;
        let ratio = ctx.op(Op::Where, &[apply, ratio, zero], Some(&tag("factor")))?;
        let update = bin(ctx, BinaryOp::Mul, ratio, pivot, &tag("update"))?;
        a = bin(ctx, BinaryOp::Sub, a, update, &tag("reduced"))?;
    }
    let det = if n == 0 {
        super::build::build_const(ctx, &[b], dt, "empty_det", |len| {
            kiln_ir::Data::from_f64s(dt, std::iter::repeat_n(1.0, len))
        })?
    } else {
        reshape_to(ctx, det, &[b], Some("det_flat"))?
    };
    let det = reshape_to(ctx, det, batch_dims, Some("det_batch"))?;
    one(cast_to(ctx, det, xt.dtype, "y")?)
}
