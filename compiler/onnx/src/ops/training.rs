//! The optimizers of `ai.onnx.preview.training` (`Adagrad`, `Momentum`,
//! `Adam`): one update step of every tensor they are given, decomposed
//! into elementwise ops as the ONNX reference computes them. A compiled
//! step is what on-device fine-tuning runs after its gradient graph.
//!
//! Each takes the learning rate `R` and the step count `T` (scalars), then
//! `n` tensors of each kind (`X…`, `G…`, state…) and returns `n` of each
//! updated kind (`X_new…`, state_new…).

use super::build::{cast_to, scalar};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// The optimizer's operands: `R` and `T` (as the tensors' float type and
/// a `T > 0` flag), and the `kinds` groups of `n` tensors that follow.
struct Step {
    rate: Val,
    count: Val,
    started: Val,
    groups: Vec<Vec<Val>>,
    dtype: DType,
}

fn step(ctx: &mut ImportCtx, node: &NodeProto, kinds: usize) -> Result<Step, OnnxError> {
    let operands = ctx.inputs(node);
    let tensors = operands.len().saturating_sub(2);
    if operands.len() < 2 + kinds || !tensors.is_multiple_of(kinds) {
        return Err(ctx.invalid(format!(
            "expects R, T and {kinds} groups of equally many tensors, got {} inputs",
            operands.len()
        )));
    }
    let n = tensors / kinds;
    let groups: Vec<Vec<Val>> = operands[2..].chunks(n).map(<[Val]>::to_vec).collect();
    let dtype = ctx.ty(groups[0][0]).dtype;
    if !dtype.is_float() {
        return Err(ctx.invalid(format!("X must be float, got {}", ctx.ty(groups[0][0]))));
    }
    for i in 0..n {
        let shape = &ctx.ty(groups[0][i]).shape;
        for (kind, group) in groups.iter().enumerate().skip(1) {
            let other = ctx.ty(group[i]);
            if &other.shape != shape || other.dtype != dtype {
                return Err(ctx.invalid(format!(
                    "input {} ({other}) does not match X {i} ({})",
                    2 + kind * n + i,
                    ctx.ty(groups[0][i])
                )));
            }
        }
    }
    for (k, what) in [(0, "R"), (1, "T")] {
        if !ctx.ty(operands[k]).shape.is_empty() {
            return Err(ctx.invalid(format!(
                "{what} must be a scalar, got {}",
                ctx.ty(operands[k])
            )));
        }
    }
    let rate = cast_to(ctx, operands[0], dtype, "rate")?;
    let count = cast_to(ctx, operands[1], dtype, "count")?;
    let zero = scalar(ctx, dtype, 0.0, "zero");
    let started = ctx.op(
        Op::Compare(CompareOp::Greater),
        &[count, zero],
        Some("started"),
    )?;
    Ok(Step {
        rate,
        count,
        started,
        groups,
        dtype,
    })
}

/// `a ⊙ b` for one binary op, named `<node>/<tag>_<i>`.
fn bin(
    ctx: &mut ImportCtx,
    op: BinaryOp,
    a: Val,
    b: Val,
    tag: &str,
    i: usize,
) -> Result<Val, OnnxError> {
    ctx.op(Op::Binary(op), &[a, b], Some(&format!("{tag}_{i}")))
}

/// `√H + epsilon`, the adaptive denominator of Adagrad and Adam.
fn root_plus(ctx: &mut ImportCtx, h: Val, epsilon: Val, i: usize) -> Result<Val, OnnxError> {
    let root = ctx.op(Op::Unary(UnaryOp::Sqrt), &[h], Some(&format!("root_{i}")))?;
    bin(ctx, BinaryOp::Add, root, epsilon, "scale", i)
}

/// `norm_coefficient · X + G`, the gradient with its L2 regularization.
fn regularized(
    ctx: &mut ImportCtx,
    x: Val,
    g: Val,
    norm: f32,
    dtype: DType,
    i: usize,
) -> Result<Val, OnnxError> {
    if norm == 0.0 {
        return Ok(g);
    }
    let c = scalar(ctx, dtype, norm as f64, "norm_coefficient");
    let cx = bin(ctx, BinaryOp::Mul, c, x, "decay", i)?;
    bin(ctx, BinaryOp::Add, cx, g, "gradient", i)
}

/// `Adagrad`: `r = R / (1 + T·decay_factor)`, `G' = norm·X + G`,
/// `H' = H + G'²`, `X' = X − r·G' / (√H' + epsilon)`.
pub fn adagrad(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let decay = ctx.attr_f_or(node, "decay_factor", 0.0)?;
    let epsilon = ctx.attr_f_or(node, "epsilon", 0.0)?;
    let norm = ctx.attr_f_or(node, "norm_coefficient", 0.0)?;
    let s = step(ctx, node, 3)?;
    let dt = s.dtype;
    let one = scalar(ctx, dt, 1.0, "one");
    let decay = scalar(ctx, dt, decay as f64, "decay_factor");
    let decayed = bin(ctx, BinaryOp::Mul, s.count, decay, "decayed", 0)?;
    let divisor = bin(ctx, BinaryOp::Add, one, decayed, "divisor", 0)?;
    let rate = bin(ctx, BinaryOp::Div, s.rate, divisor, "rate", 0)?;
    let epsilon = scalar(ctx, dt, epsilon as f64, "epsilon");
    let (mut xs, mut hs) = (Vec::new(), Vec::new());
    for i in 0..s.groups[0].len() {
        let (x, g, h) = (s.groups[0][i], s.groups[1][i], s.groups[2][i]);
        let g = regularized(ctx, x, g, norm, dt, i)?;
        let g2 = bin(ctx, BinaryOp::Mul, g, g, "squared", i)?;
        let h_new = bin(ctx, BinaryOp::Add, h, g2, "H_new", i)?;
        let scale = root_plus(ctx, h_new, epsilon, i)?;
        let rg = bin(ctx, BinaryOp::Mul, rate, g, "scaled_gradient", i)?;
        let update = bin(ctx, BinaryOp::Div, rg, scale, "update", i)?;
        xs.push(bin(ctx, BinaryOp::Sub, x, update, "X_new", i)?);
        hs.push(h_new);
    }
    xs.extend(hs);
    Ok(xs)
}

/// `Momentum`: `G' = norm·X + G`, `V' = alpha·V + beta'·G'` with `beta' =
/// beta` after the first step (`T > 0`) and 1 on it; `standard`: `X' = X −
/// R·V'`, `nesterov`: `X' = X − R·(G' + alpha·V')`.
pub fn momentum(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let (Some(alpha), Some(beta), Some(norm)) = (
        ctx.attr_f(node, "alpha")?,
        ctx.attr_f(node, "beta")?,
        ctx.attr_f(node, "norm_coefficient")?,
    ) else {
        return Err(ctx.invalid("alpha, beta and norm_coefficient are required"));
    };
    let mode = ctx
        .attr_s(node, "mode")?
        .unwrap_or_else(|| "standard".into());
    let nesterov = match mode.as_str() {
        "standard" => false,
        "nesterov" => true,
        other => {
            return Err(ctx.bad_attr(
                "mode",
                format!("'{other}' is neither 'standard' nor 'nesterov'"),
            ))
        }
    };
    let s = step(ctx, node, 3)?;
    let dt = s.dtype;
    let alpha = scalar(ctx, dt, alpha as f64, "alpha");
    let (beta, first) = (
        scalar(ctx, dt, beta as f64, "beta"),
        scalar(ctx, dt, 1.0, "one"),
    );
    let beta = ctx.op(Op::Where, &[s.started, beta, first], Some("beta_adjusted"))?;
    let (mut xs, mut vs) = (Vec::new(), Vec::new());
    for i in 0..s.groups[0].len() {
        let (x, g, v) = (s.groups[0][i], s.groups[1][i], s.groups[2][i]);
        let g = regularized(ctx, x, g, norm, dt, i)?;
        let kept = bin(ctx, BinaryOp::Mul, alpha, v, "kept", i)?;
        let added = bin(ctx, BinaryOp::Mul, beta, g, "added", i)?;
        let v_new = bin(ctx, BinaryOp::Add, kept, added, "V_new", i)?;
        let direction = if nesterov {
            let ahead = bin(ctx, BinaryOp::Mul, alpha, v_new, "ahead", i)?;
            bin(ctx, BinaryOp::Add, g, ahead, "direction", i)?
        } else {
            v_new
        };
        let update = bin(ctx, BinaryOp::Mul, s.rate, direction, "update", i)?;
        xs.push(bin(ctx, BinaryOp::Sub, x, update, "X_new", i)?);
        vs.push(v_new);
    }
    xs.extend(vs);
    Ok(xs)
}

/// `Adam`: `G' = norm·X + G`, `V' = alpha·V + (1 − alpha)·G'`, `H' =
/// beta·H + (1 − beta)·G'²`, `r = R·√(1 − beta^T) / (1 − alpha^T)` after the
/// first step (`R` on it), `X' = (1 − norm_post)·(X − r·V' / (√H' +
/// epsilon))`.
pub fn adam(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let alpha = ctx.attr_f_or(node, "alpha", 0.9)? as f64;
    let beta = ctx.attr_f_or(node, "beta", 0.999)? as f64;
    let epsilon = ctx.attr_f_or(node, "epsilon", 1e-6)? as f64;
    let norm = ctx.attr_f_or(node, "norm_coefficient", 0.0)?;
    let norm_post = ctx.attr_f_or(node, "norm_coefficient_post", 0.0)? as f64;
    let s = step(ctx, node, 4)?;
    let dt = s.dtype;
    let one = scalar(ctx, dt, 1.0, "one");
    let corrected = |ctx: &mut ImportCtx, base: f64, tag: &str| {
        // 1 − base^T
        let b = scalar(ctx, dt, base, tag);
        let power = bin(ctx, BinaryOp::Pow, b, s.count, &format!("{tag}_power"), 0)?;
        bin(
            ctx,
            BinaryOp::Sub,
            one,
            power,
            &format!("{tag}_correction"),
            0,
        )
    };
    let alpha_correction = corrected(ctx, alpha, "alpha")?;
    let beta_correction = corrected(ctx, beta, "beta")?;
    let root = ctx.op(
        Op::Unary(UnaryOp::Sqrt),
        &[beta_correction],
        Some("beta_correction_root"),
    )?;
    let scaled = bin(ctx, BinaryOp::Mul, s.rate, root, "rate_scaled", 0)?;
    let corrected_rate = bin(
        ctx,
        BinaryOp::Div,
        scaled,
        alpha_correction,
        "rate_corrected",
        0,
    )?;
    let rate = ctx.op(
        Op::Where,
        &[s.started, corrected_rate, s.rate],
        Some("rate_adjusted"),
    )?;
    let (alpha_v, alpha_g) = (
        scalar(ctx, dt, alpha, "alpha"),
        scalar(ctx, dt, 1.0 - alpha, "one_minus_alpha"),
    );
    let (beta_h, beta_g) = (
        scalar(ctx, dt, beta, "beta"),
        scalar(ctx, dt, 1.0 - beta, "one_minus_beta"),
    );
    let epsilon = scalar(ctx, dt, epsilon, "epsilon");
    let keep = scalar(ctx, dt, 1.0 - norm_post, "one_minus_norm_post");
    let (mut xs, mut vs, mut hs) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..s.groups[0].len() {
        let (x, g) = (s.groups[0][i], s.groups[1][i]);
        let (v, h) = (s.groups[2][i], s.groups[3][i]);
        let g = regularized(ctx, x, g, norm, dt, i)?;
        let v_kept = bin(ctx, BinaryOp::Mul, alpha_v, v, "v_kept", i)?;
        let v_added = bin(ctx, BinaryOp::Mul, alpha_g, g, "v_added", i)?;
        let v_new = bin(ctx, BinaryOp::Add, v_kept, v_added, "V_new", i)?;
        let g2 = bin(ctx, BinaryOp::Mul, g, g, "squared", i)?;
        let h_kept = bin(ctx, BinaryOp::Mul, beta_h, h, "h_kept", i)?;
        let h_added = bin(ctx, BinaryOp::Mul, beta_g, g2, "h_added", i)?;
        let h_new = bin(ctx, BinaryOp::Add, h_kept, h_added, "H_new", i)?;
        let scale = root_plus(ctx, h_new, epsilon, i)?;
        let ratio = bin(ctx, BinaryOp::Div, v_new, scale, "ratio", i)?;
        let update = bin(ctx, BinaryOp::Mul, rate, ratio, "update", i)?;
        let x_new = bin(ctx, BinaryOp::Sub, x, update, "stepped", i)?;
        let x_new = if norm_post == 0.0 {
            x_new
        } else {
            bin(ctx, BinaryOp::Mul, keep, x_new, "X_new", i)?
        };
        xs.push(x_new);
        vs.push(v_new);
        hs.push(h_new);
    }
    xs.extend(vs);
    xs.extend(hs);
    Ok(xs)
}
