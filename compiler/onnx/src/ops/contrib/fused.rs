//! onnxruntime's fused ops from its graph optimizer: `FusedConv` (a Conv
//! plus an optional residual sum and activation), `FusedGemm` (a Gemm plus
//! activation) and `FusedMatMul` (a MatMul with transposes and a scale).

use super::{attributes_except, standard_one};
use crate::ctx::{ImportCtx, Val};
use crate::ops::build::scalar;
use crate::ops::elementwise::silu;
use crate::ops::{conv, linalg, one};
use crate::OnnxError;
use kiln_ir::{BinaryOp, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// The activations onnxruntime fuses (MLAS's activation kinds), with the
/// number of parameters each reads.
const ACTIVATIONS: &[(&str, usize)] = &[
    ("Relu", 0),
    ("Tanh", 0),
    ("Sigmoid", 0),
    ("Silu", 0),
    ("LeakyRelu", 1),
    ("Clip", 2),
    ("HardSigmoid", 2),
];

/// `y` through the node's `activation`, if any, with `params` (FusedConv's
/// `activation_params`; FusedGemm's `activation_alpha`, `_beta`).
fn activate(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    y: Val,
    params: Vec<f32>,
) -> Result<Val, OnnxError> {
    let Some(name) = ctx.attr_s(node, "activation")? else {
        return Ok(y);
    };
    if name == "Silu" {
        return silu(ctx, y, 1.0);
    }
    let Some(&(_, wants)) = ACTIVATIONS.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = ACTIVATIONS.iter().map(|(n, _)| *n).collect();
        return Err(ctx.bad_attr("activation", format!("'{name}' is not one of {known:?}")));
    };
    if params.len() < wants {
        return Err(ctx.bad_attr(
            "activation_params",
            format!("{name} needs {wants} parameters, got {}", params.len()),
        ));
    }
    let op = match name.as_str() {
        "Relu" => UnaryOp::Relu,
        "Tanh" => UnaryOp::Tanh,
        "Sigmoid" => UnaryOp::Sigmoid,
        "LeakyRelu" => UnaryOp::LeakyRelu { alpha: params[0] },
        "Clip" => UnaryOp::Clip {
            min: params[0],
            max: params[1],
        },
        _ => UnaryOp::HardSigmoid {
            alpha: params[0],
            beta: params[1],
        },
    };
    ctx.op(Op::Unary(op), &[y], None)
}

/// Attributes of the fused node that belong to the activation.
const ACTIVATION_ATTRS: &[&str] = &[
    "activation",
    "activation_params",
    "activation_alpha",
    "activation_beta",
    "activation_gamma",
];

/// `FusedConv`: X, W, B, Z → `activation(Conv(X, W, B) + Z)`.
pub fn fused_conv(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let inputs: Vec<Option<Val>> = (0..3).map(|i| ctx.opt_input(node, i)).collect();
    let attrs = attributes_except(node, ACTIVATION_ATTRS);
    let mut y = standard_one(ctx, conv::conv, "Conv", &inputs, attrs)?;
    if let Some(z) = ctx.opt_input(node, 3) {
        y = ctx.op(Op::Binary(BinaryOp::Add), &[y, z], Some("sum"))?;
    }
    let params = ctx
        .attr_floats(node, "activation_params")?
        .unwrap_or_default();
    one(activate(ctx, node, y, params)?)
}

/// `FusedGemm`: `activation(Gemm(A, B, C))`.
pub fn fused_gemm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let inputs: Vec<Option<Val>> = (0..3).map(|i| ctx.opt_input(node, i)).collect();
    let attrs = attributes_except(node, ACTIVATION_ATTRS);
    let y = standard_one(ctx, linalg::gemm, "Gemm", &inputs, attrs)?;
    let mut params = Vec::new();
    for name in ["activation_alpha", "activation_beta"] {
        match ctx.attr_f(node, name)? {
            Some(p) => params.push(p),
            None => break,
        }
    }
    one(activate(ctx, node, y, params)?)
}

/// The permutation `FusedMatMul` applies to an operand of rank `rank`:
/// `trans_batch` moves the leading axis behind the batch axes (the operand
/// is `[M, batch..., K]`), `trans` swaps the last two.
fn operand_perm(rank: usize, trans: bool, trans_batch: bool) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    if trans_batch && rank > 2 {
        // [d0, d1, ..., d_{r-2}, d_{r-1}] -> [d1, ..., d_{r-2}, d0, d_{r-1}]
        p = (1..rank - 1).chain([0, rank - 1]).collect();
    }
    if trans && rank >= 2 {
        p.swap(rank - 2, rank - 1);
    }
    p
}

/// `FusedMatMul`: `alpha · op(A) @ op(B)` with `transA`/`transB` (the last
/// two axes) and `transBatchA`/`transBatchB`.
pub fn fused_matmul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut operands = [ctx.input(node, 0)?, ctx.input(node, 1)?];
    for (k, (t, tb)) in [("transA", "transBatchA"), ("transB", "transBatchB")]
        .iter()
        .enumerate()
    {
        let trans = ctx.attr_i_or(node, t, 0)? != 0;
        let trans_batch = ctx.attr_i_or(node, tb, 0)? != 0;
        let rank = ctx.ty(operands[k]).shape.len();
        let perm = operand_perm(rank, trans, trans_batch);
        if perm.iter().enumerate().any(|(i, &p)| i != p) {
            operands[k] = ctx.op(
                Op::Transpose {
                    perm: perm.into_iter().collect(),
                },
                &[operands[k]],
                Some(if k == 0 {
                    "a_transposed"
                } else {
                    "b_transposed"
                }),
            )?;
        }
    }
    let alpha = ctx.attr_f_or(node, "alpha", 1.0)?;
    let y = ctx.dense_op(Op::MatMul, &operands, Some("product"))?;
    if alpha == 1.0 {
        return one(y);
    }
    let dt = ctx.ty(y).dtype;
    let a = scalar(ctx, dt, alpha as f64, "alpha");
    one(ctx.op(Op::Binary(BinaryOp::Mul), &[y, a], None)?)
}
