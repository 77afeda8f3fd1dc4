//! `Attention` (opsets 23-25) decomposed into MatMul, Softmax and masking
//! arithmetic, following the ONNX reference step by step: 3-D inputs split
//! into heads, Q and K each scaled by `sqrt(scale)`, the KV cache
//! concatenated, grouped KV heads repeated, an additive bias built from
//! `attn_mask`, `is_causal`, the sliding window and `nonpad_kv_seqlen`,
//! softcap before the bias, and rows whose bias is all `-inf` zeroed.
//!
//! With f16/bf16 inputs the decomposition runs in f32 and each output is
//! rounded to the input type once, where the reference rounds every
//! intermediate: on `test_attention_4d_causal_bf16` the reference is up to
//! 0.0044 from the exact (f64) result and a once-rounded result at most
//! 0.0020 (half a unit).

use super::build::{build_const, gen_const};
use super::build::{cast_to, reshape_to, scalar};
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, LogicalOp, Op, ReduceOp, Tensor, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `[B, S, H·D]` → `[B, H, S, D]`.
pub(crate) fn split_heads(
    ctx: &mut ImportCtx,
    x: Val,
    heads: usize,
    tag: &str,
) -> Result<Val, OnnxError> {
    let s = ctx.ty(x).shape.clone();
    if heads == 0 || !s[2].is_multiple_of(heads) {
        return Err(ctx.invalid(format!(
            "{tag} hidden size {} does not split into {heads} heads",
            s[2]
        )));
    }
    let v = reshape_to(
        ctx,
        x,
        &[s[0], s[1], heads, s[2] / heads],
        Some(&format!("{tag}_heads")),
    )?;
    ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3].into_iter().collect(),
        },
        &[v],
        Some(&format!("{tag}_bhsd")),
    )
}

/// `[B, Hkv, S, D]` with every KV head repeated for its group of `hq /
/// Hkv` consecutive query heads (`np.repeat` along axis 1): `[B, hq, S,
/// D]`.
fn repeat_kv_heads(ctx: &mut ImportCtx, x: Val, hq: usize, tag: &str) -> Result<Val, OnnxError> {
    let s = ctx.ty(x).shape.clone();
    let hkv = s[1];
    if hq == hkv {
        return Ok(x);
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(ctx.invalid(format!("{hq} query heads do not group over {hkv} KV heads")));
    }
    let view = reshape_to(
        ctx,
        x,
        &[s[0], hkv, 1, s[2], s[3]],
        Some(&format!("{tag}_group_view")),
    )?;
    let e = ctx.op(
        Op::Expand {
            shape: [s[0], hkv, hq / hkv, s[2], s[3]].into_iter().collect(),
        },
        &[view],
        Some(&format!("{tag}_group_repeat")),
    )?;
    reshape_to(
        ctx,
        e,
        &[s[0], hq, s[2], s[3]],
        Some(&format!("{tag}_grouped")),
    )
}

/// Where `cond`, 0, else `-inf`, in `dtype`.
fn bias_from(ctx: &mut ImportCtx, cond: Val, dtype: DType, tag: &str) -> Result<Val, OnnxError> {
    let zero = scalar(ctx, dtype, 0.0, &format!("{tag}_zero"));
    let ninf = scalar(ctx, dtype, f64::NEG_INFINITY, &format!("{tag}_ninf"));
    ctx.op(Op::Where, &[cond, zero, ninf], Some(tag))
}

/// `Attention`.
pub fn attention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut q = ctx.input(node, 0)?;
    let mut k = ctx.input(node, 1)?;
    let mut v = ctx.input(node, 2)?;
    let mask = ctx.opt_input(node, 3);
    let past_k = ctx.opt_input(node, 4);
    let past_v = ctx.opt_input(node, 5);
    let nonpad = ctx.opt_input(node, 6);
    let qt = ctx.ty(q).clone();
    let io_dt = qt.dtype;
    if !io_dt.is_float() {
        return Err(ctx.invalid(format!("Q must be a float tensor, got {qt}")));
    }
    // The type the decomposition computes in (see the module docs).
    let dt = if kiln_ir::infer::is_half(io_dt) {
        DType::F32
    } else {
        io_dt
    };
    q = cast_to(ctx, q, dt, "q_wide")?;
    k = cast_to(ctx, k, dt, "k_wide")?;
    v = cast_to(ctx, v, dt, "v_wide")?;
    let past_k = past_k
        .map(|p| cast_to(ctx, p, dt, "past_key_wide"))
        .transpose()?;
    let past_v = past_v
        .map(|p| cast_to(ctx, p, dt, "past_value_wide"))
        .transpose()?;
    let rank = qt.shape.len();
    if rank != 3 && rank != 4 || ctx.ty(k).shape.len() != rank || ctx.ty(v).shape.len() != rank {
        return Err(ctx.invalid("Q, K and V must all be 3-D or all 4-D"));
    }
    if past_k.is_some() != past_v.is_some() {
        return Err(ctx.invalid("past_key and past_value go together"));
    }
    if nonpad.is_some() && past_k.is_some() {
        return Err(ctx.invalid("nonpad_kv_seqlen cannot be combined with a past cache"));
    }
    let q_heads = ctx.attr_i(node, "q_num_heads")?;
    let kv_heads = ctx.attr_i(node, "kv_num_heads")?;
    if rank == 3 {
        let (Some(hq), Some(hkv)) = (q_heads, kv_heads) else {
            return Err(ctx.bad_attr(
                "q_num_heads",
                "3-D inputs need q_num_heads and kv_num_heads",
            ));
        };
        if hq < 1 || hkv < 1 {
            return Err(ctx.bad_attr("q_num_heads", "head counts must be positive"));
        }
        q = split_heads(ctx, q, hq as usize, "q")?;
        k = split_heads(ctx, k, hkv as usize, "k")?;
        v = split_heads(ctx, v, hkv as usize, "v")?;
    }
    let causal = ctx.attr_i_or(node, "is_causal", 0)? != 0;
    let softcap = ctx.attr_f_or(node, "softcap", 0.0)?;
    let mode = ctx.attr_i_or(node, "qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(ctx.bad_attr("qk_matmul_output_mode", format!("unknown mode {mode}")));
    }
    match ctx.attr_i(node, "softmax_precision")? {
        // f32 or f64 statistics: the f32 softmax is within tolerance of both.
        None | Some(1) | Some(11) => {}
        Some(p) => {
            return Err(ctx.unsupported(format!(
                "Attention with softmax_precision {p} (only float and double)"
            )))
        }
    }
    let (left, right) = if ctx.opset >= 25 {
        (
            ctx.attr_i_or(node, "left_window_size", -1)?,
            ctx.attr_i_or(node, "right_window_size", -1)?,
        )
    } else {
        (-1, -1)
    };
    if left < -1 || right < -1 {
        return Err(ctx.bad_attr("left_window_size", "window sizes are -1 or ≥ 0"));
    }
    let qs = ctx.ty(q).shape.clone();
    let (batch, hq, q_len, head) = (qs[0], qs[1], qs[2], qs[3]);
    let scale = match ctx.attr_f(node, "scale")? {
        Some(s) => s as f64,
        None => 1.0 / (head as f64).sqrt(),
    };
    // The reference rounds sqrt(scale) to the input type before use.
    let root = scalar(ctx, dt, scale.sqrt() as f32 as f64, "scale_root");

    let mut present_k = k;
    let mut present_v = v;
    let past_len = match past_k {
        Some(pk) => {
            let len = ctx.ty(pk).shape.get(2).copied().unwrap_or(0);
            let pv = past_v.expect("checked together");
            present_k = ctx.op(Op::Concat { axis: 2 }, &[pk, k], Some("present_key"))?;
            present_v = ctx.op(Op::Concat { axis: 2 }, &[pv, v], Some("present_value"))?;
            len
        }
        None => 0,
    };
    let kv_len = ctx.ty(present_k).shape[2];

    // The additive bias, broadcastable to [B, Hq, q, kv].
    let mut bias: Option<Val> = None;
    if let Some(m) = mask {
        let mt = ctx.ty(m).clone();
        let last = *mt.shape.last().unwrap_or(&0);
        let mut m = if mt.dtype == DType::Bool {
            bias_from(ctx, m, dt, "mask_bias")?
        } else {
            cast_to(ctx, m, dt, "mask_cast")?
        };
        if last < kv_len {
            // A short mask leaves the remaining keys masked.
            let mut ps: Vec<usize> = mt.shape.to_vec();
            *ps.last_mut().expect("rank ≥ 1") = kv_len - last;
            let fill = build_const(ctx, &ps, dt, "mask_fill", |n| {
                Data::from_f64s(dt, std::iter::repeat_n(f64::NEG_INFINITY, n))
            })?;
            let axis = mt.shape.len() - 1;
            m = ctx.op(Op::Concat { axis }, &[m, fill], Some("mask_padded"))?;
        }
        bias = Some(m);
    }
    // Causal and window masks compare `j - i` with the per-batch offset of
    // the query block: the past length, or nonpad_kv_seqlen - q_len.
    let windowed = left >= 0 || right >= 0;
    if causal || windowed {
        let rel = build_const(ctx, &[q_len, kv_len], DType::I64, "key_minus_query", |n| {
            Data::I64(
                (0..n)
                    .map(|f| (f % kv_len) as i64 - (f / kv_len) as i64)
                    .collect(),
            )
        })?;
        let rel = match (nonpad, past_len) {
            (Some(np), _) => {
                let np = cast_to(ctx, np, DType::I64, "nonpad_i64")?;
                let np = reshape_to(ctx, np, &[batch, 1, 1, 1], Some("nonpad_view"))?;
                let ql = gen_const(
                    ctx,
                    Tensor::new([], Data::I64(vec![q_len as i64])).expect("s"),
                    "q_len",
                )?;
                let off = ctx.op(Op::Binary(BinaryOp::Sub), &[np, ql], Some("offset"))?;
                ctx.op(Op::Binary(BinaryOp::Sub), &[rel, off], Some("relative"))?
            }
            (None, 0) => rel,
            (None, p) => {
                let off = gen_const(
                    ctx,
                    Tensor::new([], Data::I64(vec![p as i64])).expect("s"),
                    "offset",
                )?;
                ctx.op(Op::Binary(BinaryOp::Sub), &[rel, off], Some("relative"))?
            }
        };
        let bound = |ctx: &mut ImportCtx, cmp, b: i64, tag: &str| -> Result<Val, OnnxError> {
            let c = gen_const(
                ctx,
                Tensor::new([], Data::I64(vec![b])).expect("s"),
                &format!("{tag}_bound"),
            )?;
            ctx.op(Op::Compare(cmp), &[rel, c], Some(tag))
        };
        if causal {
            let allowed = bound(ctx, CompareOp::LessOrEqual, 0, "causal")?;
            let base = match bias {
                Some(b) => b,
                None => scalar(ctx, dt, 0.0, "zero_bias"),
            };
            let cb = bias_from(ctx, allowed, dt, "causal_bias")?;
            bias = Some(ctx.op(
                Op::Binary(BinaryOp::Add),
                &[base, cb],
                Some("causal_masked"),
            )?);
        }
        if windowed {
            let mut allowed: Option<Val> = None;
            for (b, cmp, tag) in [
                (left, CompareOp::GreaterOrEqual, "window_left"),
                (right, CompareOp::LessOrEqual, "window_right"),
            ] {
                if b < 0 {
                    continue;
                }
                let bb = if cmp == CompareOp::GreaterOrEqual {
                    -b
                } else {
                    b
                };
                let a = bound(ctx, cmp, bb, tag)?;
                allowed = Some(match allowed {
                    None => a,
                    Some(p) => ctx.op(Op::Logical(LogicalOp::And), &[p, a], Some("window"))?,
                });
            }
            let wb = bias_from(ctx, allowed.expect("windowed"), dt, "window_bias")?;
            bias = Some(match bias {
                None => wb,
                Some(b) => ctx.op(Op::Binary(BinaryOp::Add), &[b, wb], Some("window_masked"))?,
            });
        }
    }
    if let Some(np) = nonpad {
        let np = cast_to(ctx, np, DType::I64, "nonpad_len_i64")?;
        let np = reshape_to(ctx, np, &[batch, 1, 1, 1], Some("nonpad_len_view"))?;
        let pos = super::build::ramp(ctx, kv_len, 3, 4, DType::I64, "key_positions")?;
        let valid = ctx.op(Op::Compare(CompareOp::Less), &[pos, np], Some("key_valid"))?;
        let pb = bias_from(ctx, valid, dt, "padding_bias")?;
        bias = Some(match bias {
            None => pb,
            Some(b) => ctx.op(Op::Binary(BinaryOp::Add), &[b, pb], Some("padding_masked"))?,
        });
    }

    // Grouped KV heads: repeat each head for its group of query heads.
    let kk = repeat_kv_heads(ctx, present_k, hq, "k")?;
    let vv = repeat_kv_heads(ctx, present_v, hq, "v")?;

    let q_scaled = ctx.op(Op::Binary(BinaryOp::Mul), &[q, root], Some("q_scaled"))?;
    let k_scaled = ctx.op(Op::Binary(BinaryOp::Mul), &[kk, root], Some("k_scaled"))?;
    let k_t = ctx.op(
        Op::Transpose {
            perm: [0, 1, 3, 2].into_iter().collect(),
        },
        &[k_scaled],
        Some("k_transposed"),
    )?;
    let mut qk = ctx.dense_op(Op::MatMul, &[q_scaled, k_t], Some("qk"))?;
    if softcap > 0.0 {
        let c = scalar(ctx, dt, softcap as f64, "softcap");
        let d = ctx.op(Op::Binary(BinaryOp::Div), &[qk, c], Some("qk_capped_in"))?;
        let t = ctx.op(Op::Unary(UnaryOp::Tanh), &[d], Some("qk_tanh"))?;
        qk = ctx.op(Op::Binary(BinaryOp::Mul), &[t, c], Some("qk_capped"))?;
    }
    let qk_bias = match bias {
        Some(b) => ctx.op(Op::Binary(BinaryOp::Add), &[qk, b], Some("qk_bias"))?,
        None => qk,
    };
    let mut probs = ctx.op(Op::Softmax { axis: 3 }, &[qk_bias], Some("probs"))?;
    if let Some(b) = bias {
        // Rows with no attendable key are 0, decided on the bias alone.
        let brank = ctx.ty(b).shape.len();
        let bm = ctx.op(
            Op::Reduce {
                op: ReduceOp::Max,
                axes: [brank - 1].into_iter().collect(),
                keep_dims: true,
            },
            &[b],
            Some("bias_row_max"),
        )?;
        let ninf = scalar(ctx, dt, f64::NEG_INFINITY, "row_ninf");
        let dead = ctx.op(
            Op::Compare(CompareOp::Equal),
            &[bm, ninf],
            Some("row_masked"),
        )?;
        let never = ctx
            .konst(dead)
            .is_some_and(|t| t.to_i64_vec().iter().all(|&x| x == 0));
        if !never {
            let zero = scalar(ctx, dt, 0.0, "row_zero");
            probs = ctx.op(Op::Where, &[dead, zero, probs], Some("probs_guarded"))?;
        }
    }
    let y = ctx.dense_op(Op::MatMul, &[probs, vv], Some("y_heads"))?;
    let y = if rank == 3 {
        let t = ctx.op(
            Op::Transpose {
                perm: [0, 2, 1, 3].into_iter().collect(),
            },
            &[y],
            Some("y_bshd"),
        )?;
        let s = ctx.ty(t).shape.clone();
        reshape_to(ctx, t, &[s[0], s[1], s[2] * s[3]], Some("y"))?
    } else {
        y
    };
    let qk_out = match mode {
        2 => qk_bias,
        3 => probs,
        _ => qk,
    };
    Ok(vec![
        cast_to(ctx, y, io_dt, "y_narrow")?,
        cast_to(ctx, present_k, io_dt, "present_key_narrow")?,
        cast_to(ctx, present_v, io_dt, "present_value_narrow")?,
        cast_to(ctx, qk_out, io_dt, "qk_narrow")?,
    ])
}

/// `RotaryEmbedding` (opset 23): the first `rotary_embedding_dim` features
/// of each head rotate pairwise (halves, or even/odd with `interleaved`) by
/// the cos/sin caches, gathered by `position_ids` when given.
pub fn rotary_embedding(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    use super::build::slice_along;
    let x = ctx.input(node, 0)?;
    let cos = ctx.input(node, 1)?;
    let sin = ctx.input(node, 2)?;
    let pos = ctx.opt_input(node, 3);
    let xt = ctx.ty(x).clone();
    let dt = xt.dtype;
    if !dt.is_float() {
        return Err(ctx.invalid(format!("X must be a float tensor, got {xt}")));
    }
    let interleaved = ctx.attr_i_or(node, "interleaved", 0)? != 0;
    let x4 = match xt.shape.len() {
        4 => ctx.op(
            Op::Transpose {
                perm: [0, 2, 1, 3].into_iter().collect(),
            },
            &[x],
            Some("bshd"),
        )?,
        3 => {
            let heads = ctx.attr_i_or(node, "num_heads", 0)?;
            if heads < 1 || !xt.shape[2].is_multiple_of(heads as usize) {
                return Err(ctx.bad_attr(
                    "num_heads",
                    format!("{heads} does not split a hidden size of {}", xt.shape[2]),
                ));
            }
            let h = heads as usize;
            let s = &xt.shape;
            reshape_to(ctx, x, &[s[0], s[1], h, s[2] / h], Some("heads"))?
        }
        _ => return Err(ctx.invalid(format!("X must be 3-D or 4-D, got {xt}"))),
    };
    let s4 = ctx.ty(x4).shape.clone();
    let (b, seq, h, d) = (s4[0], s4[1], s4[2], s4[3]);
    let rd = match ctx.attr_i_or(node, "rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => {
            return Err(ctx.bad_attr(
                "rotary_embedding_dim",
                format!("{r} is not an even size up to the head size {d}"),
            ))
        }
    };
    let half = rd / 2;
    let mut caches = Vec::with_capacity(2);
    for (c, tag) in [(cos, "cos"), (sin, "sin")] {
        let c = cast_to(ctx, c, dt, &format!("{tag}_cast"))?;
        let c = match pos {
            Some(p) => ctx.op(Op::Gather { axis: 0 }, &[c, p], Some(&format!("{tag}_at")))?,
            None => c,
        };
        if ctx.ty(c).shape.last() != Some(&half) || ctx.ty(c).num_elements() != b * seq * half {
            return Err(ctx.invalid(format!(
                "{tag} cache {} does not give [{b}, {seq}, {half}]",
                ctx.ty(c)
            )));
        }
        caches.push(reshape_to(
            ctx,
            c,
            &[b, seq, 1, half],
            Some(&format!("{tag}_view")),
        )?);
    }
    let (cos, sin) = (caches[0], caches[1]);
    let rot = if rd < d {
        slice_along(ctx, x4, 3, 0, 1, rd, "rotated_part")?
    } else {
        x4
    };
    let (x1, x2) = if interleaved {
        (
            slice_along(ctx, rot, 3, 0, 2, half, "even")?,
            slice_along(ctx, rot, 3, 1, 2, half, "odd")?,
        )
    } else {
        (
            slice_along(ctx, rot, 3, 0, 1, half, "first_half")?,
            slice_along(ctx, rot, 3, half, 1, half, "second_half")?,
        )
    };
    let mul = |ctx: &mut ImportCtx, a: Val, c: Val, tag: &str| {
        ctx.op(Op::Binary(BinaryOp::Mul), &[a, c], Some(tag))
    };
    let c1 = mul(ctx, cos, x1, "cos_x1")?;
    let s2 = mul(ctx, sin, x2, "sin_x2")?;
    let s1 = mul(ctx, sin, x1, "sin_x1")?;
    let c2 = mul(ctx, cos, x2, "cos_x2")?;
    let real = ctx.op(Op::Binary(BinaryOp::Sub), &[c1, s2], Some("real"))?;
    let imag = ctx.op(Op::Binary(BinaryOp::Add), &[s1, c2], Some("imag"))?;
    let rotated = if interleaved {
        let r = reshape_to(ctx, real, &[b, seq, h, half, 1], Some("real_pairs"))?;
        let i = reshape_to(ctx, imag, &[b, seq, h, half, 1], Some("imag_pairs"))?;
        let p = ctx.op(Op::Concat { axis: 4 }, &[r, i], Some("pairs"))?;
        reshape_to(ctx, p, &[b, seq, h, rd], Some("rotated"))?
    } else {
        ctx.op(Op::Concat { axis: 3 }, &[real, imag], Some("rotated"))?
    };
    let full = if rd < d {
        let rest = slice_along(ctx, x4, 3, rd, 1, d - rd, "passed_part")?;
        ctx.op(Op::Concat { axis: 3 }, &[rotated, rest], Some("joined"))?
    } else {
        rotated
    };
    let y = if xt.shape.len() == 4 {
        ctx.op(
            Op::Transpose {
                perm: [0, 2, 1, 3].into_iter().collect(),
            },
            &[full],
            None,
        )?
    } else {
        reshape_to(ctx, full, &xt.shape, None)?
    };
    Ok(vec![y])
}

/// The most time steps [`linear_attention`] unrolls.
const MAX_LINEAR_ATTENTION_STEPS: usize = 512;

/// `LinearAttention`: the recurrent state `S` (`[B, H_kv, d_k, d_v]`, zero
/// or `past_state`) updated per time step by the update rule (`linear`:
/// `S += kᵀv`; `gated`: `S ← S·e^g` first; `delta`: `v ← β(v − kS)`
/// first; `gated_delta`: both), each query head reading `scale · q S` of
/// its KV head. The static time steps are unrolled at import (up to
/// [`MAX_LINEAR_ATTENTION_STEPS`]) in f32; the outputs are rounded to the
/// input types once.
pub fn linear_attention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let inputs: Vec<Val> = (0..3)
        .map(|i| ctx.input(node, i))
        .collect::<Result<_, _>>()?;
    let past = ctx.opt_input(node, 3);
    let decay = ctx.opt_input(node, 4);
    let beta = ctx.opt_input(node, 5);
    let rule = ctx
        .attr_s(node, "update_rule")?
        .unwrap_or_else(|| "gated_delta".into());
    let (gating, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        r => return Err(ctx.bad_attr("update_rule", format!("unknown update rule '{r}'"))),
    };
    if gating != decay.is_some() || delta != beta.is_some() {
        return Err(ctx.invalid(format!(
            "update rule '{rule}' takes decay {} and beta {}",
            if gating { "(required)" } else { "(forbidden)" },
            if delta { "(required)" } else { "(forbidden)" },
        )));
    }
    let heads = |ctx: &ImportCtx, name: &str| -> Result<usize, OnnxError> {
        match ctx.attr_i(node, name)? {
            Some(h) if h > 0 => Ok(h as usize),
            _ => Err(ctx.bad_attr(name, "is required and positive")),
        }
    };
    let (hq, hkv) = (heads(ctx, "q_num_heads")?, heads(ctx, "kv_num_heads")?);
    if !hq.is_multiple_of(hkv) {
        return Err(ctx.bad_attr("q_num_heads", format!("{hq} is not a multiple of {hkv}")));
    }
    let io_dt = ctx.ty(inputs[0]).dtype;
    for &v in &inputs {
        if ctx.ty(v).shape.len() != 3 || !ctx.ty(v).dtype.is_float() {
            return Err(ctx.invalid(format!(
                "query, key and value must be float [B, T, H·D], got {}",
                ctx.ty(v)
            )));
        }
    }
    let [batch, steps, _] = ctx.ty(inputs[0]).shape[..] else {
        unreachable!("rank 3, checked")
    };
    if steps == 0 {
        return Err(ctx.invalid("LinearAttention over zero time steps"));
    }
    if steps > MAX_LINEAR_ATTENTION_STEPS {
        return Err(ctx.unsupported(format!(
            "LinearAttention over {steps} time steps (Kiln unrolls the recurrence at import, up to {MAX_LINEAR_ATTENTION_STEPS})"
        )));
    }
    let f = DType::F32;
    let wide: Vec<Val> = (inputs.iter().zip(["q", "k", "v"]))
        .map(|(&v, tag)| cast_to(ctx, v, f, &format!("{tag}_f32")))
        .collect::<Result<_, _>>()?;
    let q = split_heads(ctx, wide[0], hq, "q")?;
    let k = split_heads(ctx, wide[1], hkv, "k")?;
    let v = split_heads(ctx, wide[2], hkv, "v")?;
    let (dk, dv) = (ctx.ty(q).shape[3], ctx.ty(v).shape[3]);
    if ctx.ty(k).shape[3] != dk || ctx.ty(k).shape[2] != steps || ctx.ty(v).shape[2] != steps {
        return Err(ctx.invalid("query, key and value disagree on time steps or head size"));
    }
    let group = hq / hkv;
    let scale = match ctx.attr_f(node, "scale")? {
        Some(s) if s != 0.0 => s as f64,
        _ => 1.0 / (dk as f64).sqrt(),
    };
    // Per-step factors as [B, H_kv, T, n]: the decay (already
    // exponentiated) and β.
    let per_step =
        |ctx: &mut ImportCtx, x: Val, width: usize, tag: &str| -> Result<Val, OnnxError> {
            let x = cast_to(ctx, x, f, &format!("{tag}_f32"))?;
            let lanes = ctx.ty(x).shape.get(2).copied().unwrap_or(0);
            if ctx.ty(x).shape[..2] != [batch, steps] || lanes % width != 0 || lanes == 0 {
                return Err(ctx.invalid(format!(
                    "{tag} must be [{batch}, {steps}, n], got {}",
                    ctx.ty(x)
                )));
            }
            let x = reshape_to(
                ctx,
                x,
                &[batch, steps, lanes / width, width],
                Some(&format!("{tag}_heads")),
            )?;
            ctx.op(
                Op::Transpose {
                    perm: [0, 2, 1, 3].into_iter().collect(),
                },
                &[x],
                Some(&format!("{tag}_bhtn")),
            )
        };
    let decay = match decay {
        Some(g) => {
            let lanes = ctx.ty(g).shape.get(2).copied().unwrap_or(0);
            let width = if lanes == hkv { 1 } else { dk };
            if lanes != hkv && lanes != hkv * dk {
                return Err(ctx.invalid(format!("decay's last dim must be {hkv} or {}", hkv * dk)));
            }
            let g = per_step(ctx, g, width, "decay")?;
            Some((
                ctx.op(Op::Unary(UnaryOp::Exp), &[g], Some("decay_exp"))?,
                width,
            ))
        }
        None => None,
    };
    let beta = match beta {
        Some(b) => {
            let lanes = ctx.ty(b).shape.get(2).copied().unwrap_or(0);
            if lanes != hkv && lanes != 1 {
                return Err(ctx.invalid(format!("beta's last dim must be {hkv} or 1")));
            }
            Some(per_step(ctx, b, 1, "beta")?)
        }
        None => None,
    };
    let state_shape = [batch, hkv, dk, dv];
    let state_dt = past.map_or(io_dt, |p| ctx.ty(p).dtype);
    let mut state = match past {
        Some(p) => {
            if ctx.ty(p).shape[..] != state_shape {
                return Err(ctx.invalid(format!(
                    "past_state must be {state_shape:?}, got {}",
                    ctx.ty(p)
                )));
            }
            cast_to(ctx, p, f, "past_f32")?
        }
        None => build_const(ctx, &state_shape, f, "state0", |n| Data::zeros(f, n))?,
    };
    let step = |ctx: &mut ImportCtx, x: Val, t: usize, tag: &str| {
        super::build::slice_along(ctx, x, 2, t, 1, 1, &format!("{tag}{t}"))
    };
    let mut outs = Vec::with_capacity(steps);
    for t in 0..steps {
        if let Some((g, width)) = decay {
            let g = step(ctx, g, t, "decay_t")?;
            let g = reshape_to(
                ctx,
                g,
                &[batch, hkv, width, 1],
                Some(&format!("decay_col{t}")),
            )?;
            state = ctx.op(
                Op::Binary(BinaryOp::Mul),
                &[state, g],
                Some(&format!("decayed{t}")),
            )?;
        }
        let k_t = step(ctx, k, t, "k_t")?;
        let mut v_t = step(ctx, v, t, "v_t")?;
        if let Some(b) = beta {
            let read = ctx.dense_op(Op::MatMul, &[k_t, state], Some(&format!("retrieved{t}")))?;
            let diff = ctx.op(
                Op::Binary(BinaryOp::Sub),
                &[v_t, read],
                Some(&format!("innovation{t}")),
            )?;
            let b_t = step(ctx, b, t, "beta_t")?;
            v_t = ctx.op(
                Op::Binary(BinaryOp::Mul),
                &[b_t, diff],
                Some(&format!("corrected{t}")),
            )?;
        }
        let k_col = reshape_to(ctx, k_t, &[batch, hkv, dk, 1], Some(&format!("k_col{t}")))?;
        let outer = ctx.op(
            Op::Binary(BinaryOp::Mul),
            &[k_col, v_t],
            Some(&format!("kv{t}")),
        )?;
        state = ctx.op(
            Op::Binary(BinaryOp::Add),
            &[state, outer],
            Some(&format!("state{t}")),
        )?;
        // The query heads of one KV head read its state together.
        let q_t = step(ctx, q, t, "q_t")?;
        let q_t = reshape_to(
            ctx,
            q_t,
            &[batch, hkv, group, dk],
            Some(&format!("q_group{t}")),
        )?;
        let o_t = ctx.dense_op(Op::MatMul, &[q_t, state], Some(&format!("read{t}")))?;
        outs.push(reshape_to(
            ctx,
            o_t,
            &[batch, hq, 1, dv],
            Some(&format!("out{t}")),
        )?);
    }
    let o = if outs.len() == 1 {
        outs[0]
    } else {
        ctx.op(Op::Concat { axis: 2 }, &outs, Some("outputs"))?
    };
    let s = scalar(ctx, f, scale, "scale");
    let o = ctx.op(Op::Binary(BinaryOp::Mul), &[o, s], Some("scaled"))?;
    let o = ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3].into_iter().collect(),
        },
        &[o],
        Some("bthd"),
    )?;
    let o = reshape_to(ctx, o, &[batch, steps, hq * dv], Some("merged"))?;
    Ok(vec![
        cast_to(ctx, o, io_dt, "output_narrow")?,
        cast_to(ctx, state, state_dt, "present_state_narrow")?,
    ])
}

/// `FlexAttention` (domain `ai.onnx.preview`, opset 1), as the ONNX
/// reference computes it: Q and K each scaled by `sqrt(scale)` (default
/// `scale` = 1/√head_size) in the input type, KV heads repeated for grouped
/// query heads, the scores `Q·Kᵀ` rounded to the input type, then in the
/// softmax precision (`softmax_precision`, else f32 for 16-bit inputs and
/// the input type otherwise): the `score_mod` subgraph, Softmax over the
/// keys, the `prob_mod` subgraph, the product with V, and the result in
/// V's type. The modifier subgraphs are imported inline and may read
/// outer-scope values.
pub fn flex_attention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let q = ctx.input(node, 0)?;
    let k = ctx.input(node, 1)?;
    let v = ctx.input(node, 2)?;
    let (qt, kt, vt) = (ctx.ty(q).clone(), ctx.ty(k).clone(), ctx.ty(v).clone());
    let float = |d: DType| matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    if qt.shape.len() != 4 || kt.shape.len() != 4 || vt.shape.len() != 4 || !float(qt.dtype) {
        return Err(ctx.invalid(format!(
            "FlexAttention takes rank-4 float Q, K and V, got {qt}, {kt}, {vt}"
        )));
    }
    let (hq, e) = (qt.shape[1], qt.shape[3]);
    if kt.shape[0] != qt.shape[0]
        || vt.shape[0] != qt.shape[0]
        || kt.shape[3] != e
        || vt.shape[1] != kt.shape[1]
        || vt.shape[2] != kt.shape[2]
        || kt.dtype != qt.dtype
    {
        return Err(ctx.invalid(format!(
            "Q {qt}, K {kt} and V {vt} do not form an attention (batch, KV heads, key length or head size differ)"
        )));
    }
    let scale = match ctx.attr_f(node, "scale")? {
        Some(s) => s as f64,
        None => 1.0 / (e as f64).sqrt(),
    };
    let compute = match ctx.attr_i(node, "softmax_precision")? {
        Some(code) => crate::tensor::dtype_from_onnx(code as i32)
            .filter(|&d| float(d))
            .ok_or_else(|| {
                ctx.bad_attr("softmax_precision", format!("{code} is not a float type"))
            })?,
        None if matches!(qt.dtype, DType::F16 | DType::BF16) => DType::F32,
        None => qt.dtype,
    };
    let root = scalar(ctx, qt.dtype, (scale as f32).sqrt() as f64, "sqrt_scale");
    let qs = ctx.op(Op::Binary(BinaryOp::Mul), &[q, root], Some("q_scaled"))?;
    let k = repeat_kv_heads(ctx, k, hq, "k")?;
    let v = repeat_kv_heads(ctx, v, hq, "v")?;
    let ks = ctx.op(Op::Binary(BinaryOp::Mul), &[k, root], Some("k_scaled"))?;
    let kt_ = ctx.op(
        Op::Transpose {
            perm: [0, 1, 3, 2].into_iter().collect(),
        },
        &[ks],
        Some("k_t"),
    )?;
    let scores = ctx.op(Op::MatMul, &[qs, kt_], Some("scores"))?;
    // A 16-bit MatMul returns f32; the reference's scores are in Q's type.
    let scores = cast_to(ctx, scores, qt.dtype, "scores_rounded")?;
    let mut scores = cast_to(ctx, scores, compute, "scores_compute")?;
    if let Some(s) = super::control::inline_modifier(ctx, node, "score_mod", scores)? {
        scores = cast_to(ctx, s, compute, "score_mod_out")?;
    }
    let mut probs = ctx.op(Op::Softmax { axis: 3 }, &[scores], Some("probs"))?;
    if let Some(p) = super::control::inline_modifier(ctx, node, "prob_mod", probs)? {
        probs = cast_to(ctx, p, compute, "prob_mod_out")?;
    }
    let v = cast_to(ctx, v, compute, "v_compute")?;
    let y = ctx.op(Op::MatMul, &[probs, v], Some("y_compute"))?;
    Ok(vec![cast_to(ctx, y, vt.dtype, "y")?])
}
