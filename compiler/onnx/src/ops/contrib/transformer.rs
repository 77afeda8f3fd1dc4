//! The transformer contrib ops of onnxruntime's transformer optimizer:
//! `Attention` (merged QKV projection), `MultiHeadAttention`,
//! `SkipLayerNormalization`, `SkipSimplifiedLayerNormalization`,
//! `EmbedLayerNormalization`, the Gelu family, `BiasAdd` and
//! `RotaryEmbedding`.
//!
//! The attention ops share [`attend`]: onnxruntime's mask formats become
//! one additive f32 bias (`mask_filter_value` where a key is masked, and
//! where `unidirectional` hides a later key, as onnxruntime adds it), then
//! `softmax(scale · Q Kᵀ + bias) V` in the form the `recognize` pass makes
//! one `attention` kernel of.

use super::{attributes_except, float_attr, int_attr, standard, standard_one, wants_output};
use crate::ctx::{ImportCtx, Val};
use crate::ops::build::{build_const, ramp};
use crate::ops::build::{cast_to, reshape_to, scalar};
use crate::ops::elementwise::silu;
use crate::ops::{attention, norm, one};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, LogicalOp, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `a + b`.
fn add(ctx: &mut ImportCtx, a: Val, b: Val, tag: &str) -> Result<Val, OnnxError> {
    ctx.op(Op::Binary(BinaryOp::Add), &[a, b], Some(tag))
}

/// `[B, S, N·H]` → `[B, N, S, H]` ([`attention::split_heads`], for a
/// 3-D `x`).
fn heads_first(ctx: &mut ImportCtx, x: Val, heads: usize, tag: &str) -> Result<Val, OnnxError> {
    if ctx.ty(x).shape.len() != 3 {
        return Err(ctx.invalid(format!(
            "{tag} must be [batch, sequence, heads·head_size], got {}",
            ctx.ty(x)
        )));
    }
    attention::split_heads(ctx, x, heads, tag)
}

/// `x[.., start..start + len]` along the last axis.
fn last_axis_slice(
    ctx: &mut ImportCtx,
    x: Val,
    start: usize,
    len: usize,
    tag: &str,
) -> Result<Val, OnnxError> {
    let axis = ctx.ty(x).shape.len() - 1;
    crate::ops::build::slice_along(ctx, x, axis, start, 1, len, tag)
}

/// What [`attend`] needs besides Q, K and V.
pub(super) struct Attend {
    pub heads: usize,
    /// Softmax scale; `None`: `1/sqrt(head_size)`.
    pub scale: Option<f32>,
    pub unidirectional: bool,
    /// The additive value of a masked key (onnxruntime's
    /// `mask_filter_value`, default -10000).
    pub filter: f32,
    /// onnxruntime's `mask_index` / `key_padding_mask`, any CPU format.
    pub mask: Option<Val>,
    pub attention_bias: Option<Val>,
    /// `[B, N, P, H]` each.
    pub past: Option<(Val, Val)>,
}

/// Where `valid`, 0, else `filter`: the additive bias of a key mask.
fn filter_bias(ctx: &mut ImportCtx, valid: Val, filter: f32, tag: &str) -> Result<Val, OnnxError> {
    let zero = scalar(ctx, DType::F32, 0.0, &format!("{tag}_zero"));
    let f = scalar(ctx, DType::F32, filter as f64, &format!("{tag}_filter"));
    ctx.op(Op::Where, &[valid, zero, f], Some(tag))
}

/// onnxruntime's key mask (`mask_index` of `Attention`, `key_padding_mask`
/// of `MultiHeadAttention`) as an additive bias broadcasting to `[B, N, S,
/// T]`: `[B]` valid lengths (keys `j < len` attend), `[2B]` ends then
/// starts (`start ≤ j < end`), `[B, T]` or `[B, S, T]` 0/1 masks.
fn mask_bias(
    ctx: &mut ImportCtx,
    mask: Val,
    (batch, q_len, total): (usize, usize, usize),
    filter: f32,
) -> Result<Option<Val>, OnnxError> {
    let mt = ctx.ty(mask).clone();
    let shape = mt.shape.as_slice();
    if shape == [batch, 1] || shape == [1, 1] {
        // onnxruntime's "dummy" mask: nothing is masked.
        return Ok(None);
    }
    let m = cast_to(ctx, mask, DType::I64, "mask_i64")?;
    let valid = if shape == [batch] || shape == [2 * batch] {
        let pos = ramp(ctx, total, 3, 4, DType::I64, "key_positions")?;
        let ends = if shape == [batch] {
            m
        } else {
            crate::ops::build::slice_along(ctx, m, 0, 0, 1, batch, "mask_ends")?
        };
        let ends = reshape_to(ctx, ends, &[batch, 1, 1, 1], Some("mask_ends_view"))?;
        let before_end = ctx.op(
            Op::Compare(CompareOp::Less),
            &[pos, ends],
            Some("key_before_end"),
        )?;
        if shape == [batch] {
            before_end
        } else {
            let starts = crate::ops::build::slice_along(ctx, m, 0, batch, 1, batch, "mask_starts")?;
            let starts = reshape_to(ctx, starts, &[batch, 1, 1, 1], Some("mask_starts_view"))?;
            let after = ctx.op(
                Op::Compare(CompareOp::GreaterOrEqual),
                &[pos, starts],
                Some("key_after_start"),
            )?;
            ctx.op(
                Op::Logical(LogicalOp::And),
                &[before_end, after],
                Some("key_in_range"),
            )?
        }
    } else {
        let view: Vec<usize> = match shape {
            [b, t] if *b == batch && *t == total => vec![batch, 1, 1, total],
            [b, s, t] if *b == batch && *s == q_len && *t == total => vec![batch, 1, q_len, total],
            _ => {
                return Err(ctx.unsupported(format!(
                    "a key mask of shape {mt}: onnxruntime's CPU formats are [batch] lengths, [2·batch] ends and starts, [batch, {total}] or [batch, {q_len}, {total}] 0/1 masks"
                )))
            }
        };
        let zero = scalar(ctx, DType::I64, 0.0, "mask_zero");
        let v = ctx.op(
            Op::Compare(CompareOp::Greater),
            &[m, zero],
            Some("key_unmasked"),
        )?;
        reshape_to(ctx, v, &view, Some("key_unmasked_view"))?
    };
    filter_bias(ctx, valid, filter, "mask_bias").map(Some)
}

/// Multi-head attention of `q` (`[B, S, N·H]`) over `k`, `v` (`[B, L,
/// N·H]`, or `[B, N, L, H]` already split), onnxruntime-style masking
/// ([`Attend`]). Returns the output `[B, S, N·Hv]` and the present key and
/// value `[B, N, P + L, H]`.
pub(super) fn attend(
    ctx: &mut ImportCtx,
    q: Val,
    k: Val,
    v: Val,
    a: Attend,
) -> Result<(Val, Val, Val), OnnxError> {
    let q4 = heads_first(ctx, q, a.heads, "q")?;
    let k4 = if ctx.ty(k).shape.len() == 4 {
        k
    } else {
        heads_first(ctx, k, a.heads, "k")?
    };
    let v4 = if ctx.ty(v).shape.len() == 4 {
        v
    } else {
        heads_first(ctx, v, a.heads, "v")?
    };
    let qs = ctx.ty(q4).shape.clone();
    let (batch, q_len, head) = (qs[0], qs[2], qs[3]);
    let past_len = a
        .past
        .map_or(0, |(pk, _)| ctx.ty(pk).shape.get(2).copied().unwrap_or(0));
    let total = past_len + ctx.ty(k4).shape[2];
    let mut bias = match a.mask {
        Some(m) => mask_bias(ctx, m, (batch, q_len, total), a.filter)?,
        None => None,
    };
    if a.unidirectional {
        // Key j is hidden from query i when j > past_len + i.
        let filter = a.filter as f64;
        let causal = build_const(ctx, &[q_len, total], DType::F32, "causal_bias", |n| {
            Data::from_f64s(
                DType::F32,
                (0..n).map(|f| {
                    if f % total > past_len + f / total {
                        filter
                    } else {
                        0.0
                    }
                }),
            )
        })?;
        bias = Some(match bias {
            Some(b) => add(ctx, b, causal, "causal_masked")?,
            None => causal,
        });
    }
    if let Some(ab) = a.attention_bias {
        let ab = cast_to(ctx, ab, DType::F32, "attention_bias_f32")?;
        bias = Some(match bias {
            Some(b) => add(ctx, b, ab, "biased_mask")?,
            None => ab,
        });
    }
    let scale = a.scale.unwrap_or(1.0 / (head as f32).sqrt());
    // Half-precision models compute in f32 and round each output once,
    // as the ONNX Attention builder does.
    let io = ctx.ty(q4).dtype;
    let wide = |ctx: &mut ImportCtx, v: Val, tag: &str| cast_to(ctx, v, DType::F32, tag);
    let (q4, mut k_all, mut v_all) = (
        wide(ctx, q4, "q_f32")?,
        wide(ctx, k4, "k_f32")?,
        wide(ctx, v4, "v_f32")?,
    );
    if let Some((pk, pv)) = a.past {
        let pk = wide(ctx, pk, "past_key_f32")?;
        let pv = wide(ctx, pv, "past_value_f32")?;
        k_all = ctx.op(Op::Concat { axis: 2 }, &[pk, k_all], Some("present_key"))?;
        v_all = ctx.op(Op::Concat { axis: 2 }, &[pv, v_all], Some("present_value"))?;
    }
    // softmax(scale · (Q @ Kᵀ) + bias) @ V, in the form the `recognize`
    // pass turns into one `attention` kernel, as for exported attention.
    let kt = ctx.op(
        Op::Transpose {
            perm: [0, 1, 3, 2].into_iter().collect(),
        },
        &[k_all],
        Some("k_transposed"),
    )?;
    let qk = ctx.dense_op(Op::MatMul, &[q4, kt], Some("qk"))?;
    let s = scalar(ctx, DType::F32, scale as f64, "scale");
    let mut scores = ctx.op(Op::Binary(BinaryOp::Mul), &[qk, s], Some("qk_scaled"))?;
    if let Some(b) = bias {
        scores = add(ctx, scores, b, "qk_masked")?;
    }
    let probs = ctx.op(Op::Softmax { axis: 3 }, &[scores], Some("probs"))?;
    let y = ctx.dense_op(Op::MatMul, &[probs, v_all], Some("y_heads"))?;
    let y = ctx.op(
        Op::Transpose {
            perm: [0, 2, 1, 3].into_iter().collect(),
        },
        &[y],
        Some("y_bsnh"),
    )?;
    let ys = ctx.ty(y).shape.clone();
    let y = reshape_to(ctx, y, &[ys[0], ys[1], ys[2] * ys[3]], Some("y_wide"))?;
    Ok((
        cast_to(ctx, y, io, "y")?,
        cast_to(ctx, k_all, io, "present_key_narrow")?,
        cast_to(ctx, v_all, io, "present_value_narrow")?,
    ))
}

/// The shared attributes of the attention ops.
fn attend_attrs(ctx: &ImportCtx, node: &NodeProto) -> Result<Attend, OnnxError> {
    let heads = ctx
        .attr_i(node, "num_heads")?
        .ok_or_else(|| ctx.bad_attr("num_heads", "is required"))?;
    if heads < 1 {
        return Err(ctx.bad_attr("num_heads", format!("must be ≥ 1, got {heads}")));
    }
    for (flag, what) in [
        ("do_rotary", "rotary embedding inside Attention"),
        (
            "past_present_share_buffer",
            "a past/present buffer shared in place",
        ),
    ] {
        if ctx.attr_i_or(node, flag, 0)? != 0 {
            return Err(ctx.unsupported(format!(
                "{flag}=1 ({what}): apply RotaryEmbedding as its own op"
            )));
        }
    }
    Ok(Attend {
        heads: heads as usize,
        scale: ctx.attr_f(node, "scale")?.filter(|&s| s != 0.0),
        unidirectional: ctx.attr_i_or(node, "unidirectional", 0)? != 0,
        filter: ctx.attr_f_or(node, "mask_filter_value", -10000.0)?,
        mask: None,
        attention_bias: None,
        past: None,
    })
}

/// `Attention` and `QAttention` after their input projection: `qkv` is
/// `[B, S, q + k + v]` (`qkv_hidden_sizes`, default thirds), `past` the
/// `[2, B, N, P, H]` cache; outputs the attention and `present` `[2, B,
/// N, P + S, H]`.
pub(super) fn attention_on(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    qkv: Val,
    mask: Option<Val>,
    past: Option<Val>,
    attention_bias: Option<Val>,
) -> R {
    let mut a = attend_attrs(ctx, node)?;
    let width = *ctx.ty(qkv).shape.last().unwrap_or(&0);
    let sizes = match ctx.attr_ints(node, "qkv_hidden_sizes")? {
        Some(s) if s.len() == 3 && s.iter().all(|&x| x > 0) && s[0] == s[1] => {
            [s[0] as usize, s[1] as usize, s[2] as usize]
        }
        Some(s) => {
            return Err(ctx.bad_attr(
                "qkv_hidden_sizes",
                format!("must be three positive sizes with q = k, got {s:?}"),
            ))
        }
        None => [width / 3; 3],
    };
    let needed = sizes.iter().try_fold(0usize, |acc, &s| acc.checked_add(s));
    if needed != Some(width) {
        return Err(ctx.invalid(format!(
            "the QKV projection is {width} wide, qkv_hidden_sizes {sizes:?} do not add up to it"
        )));
    }
    let q = last_axis_slice(ctx, qkv, 0, sizes[0], "q")?;
    let k = last_axis_slice(ctx, qkv, sizes[0], sizes[1], "k")?;
    let v = last_axis_slice(ctx, qkv, sizes[0] + sizes[1], sizes[2], "v")?;
    if let Some(p) = past {
        let ps = ctx.ty(p).shape.clone();
        if ps.len() != 5 || ps[0] != 2 {
            return Err(ctx.invalid(format!(
                "past must be [2, batch, heads, past_length, head_size], got {}",
                ctx.ty(p)
            )));
        }
        let one_of = |ctx: &mut ImportCtx, i: usize, tag: &str| -> Result<Val, OnnxError> {
            let s = crate::ops::build::slice_along(ctx, p, 0, i, 1, 1, tag)?;
            reshape_to(ctx, s, &ps[1..], Some(&format!("{tag}_view")))
        };
        a.past = Some((one_of(ctx, 0, "past_key")?, one_of(ctx, 1, "past_value")?));
    }
    a.mask = mask;
    a.attention_bias = attention_bias;
    let (y, pk, pv) = attend(ctx, q, k, v, a)?;
    if !wants_output(node, 1) {
        return one(y);
    }
    let stacked: Vec<Val> = [pk, pv]
        .into_iter()
        .map(|t| {
            let mut s: Vec<usize> = vec![1];
            s.extend(ctx.ty(t).shape.iter().copied());
            reshape_to(ctx, t, &s, Some("present_part"))
        })
        .collect::<Result<_, _>>()?;
    let present = ctx.op(Op::Concat { axis: 0 }, &stacked, Some("present"))?;
    Ok(vec![y, present])
}

/// `Attention`: input `[B, S, in]`, weights `[in, q + k + v]`, bias,
/// mask_index, past, attention_bias (past_sequence_length is for the
/// shared-buffer mode, which is refused).
pub fn attention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let mut qkv = ctx.dense_op(Op::MatMul, &[x, w], Some("qkv"))?;
    if let Some(b) = ctx.opt_input(node, 2) {
        qkv = add(ctx, qkv, b, "qkv_biased")?;
    }
    let mask = ctx.opt_input(node, 3);
    let past = ctx.opt_input(node, 4);
    let bias = ctx.opt_input(node, 5);
    attention_on(ctx, node, qkv, mask, past, bias)
}

/// `MultiHeadAttention`: query `[B, S, D]`, key and value `[B, L, D]` (or
/// `[B, N, L, H]`), bias `[D + D + Dv]`, key_padding_mask,
/// attention_bias, past_key, past_value `[B, N, P, H]`; outputs, present
/// key and value. The packed QKV and KV layouts, which onnxruntime runs
/// on CUDA only, are refused.
pub fn multi_head_attention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut a = attend_attrs(ctx, node)?;
    let mut q = ctx.input(node, 0)?;
    let (Some(mut k), Some(mut v)) = (ctx.opt_input(node, 1), ctx.opt_input(node, 2)) else {
        return Err(ctx.unsupported(
            "packed QKV or packed KV MultiHeadAttention (onnxruntime runs it on CUDA only): give query, key and value",
        ));
    };
    if ctx.ty(q).shape.len() != 3
        || !matches!(ctx.ty(k).shape.len(), 3 | 4)
        || ctx.ty(k).shape.len() != ctx.ty(v).shape.len()
    {
        return Err(ctx.unsupported(format!(
            "MultiHeadAttention with query {}, key {}, value {}: query is [batch, sequence, hidden], key and value both [batch, length, hidden] or both [batch, heads, length, head_size]",
            ctx.ty(q),
            ctx.ty(k),
            ctx.ty(v)
        )));
    }
    if let Some(b) = ctx.opt_input(node, 3) {
        let d = ctx.ty(q).shape[2];
        let dv = *ctx.ty(v).shape.last().unwrap_or(&0);
        if ctx.ty(k).shape.len() == 4 {
            return Err(ctx.unsupported("a bias with key and value already split into heads"));
        }
        if ctx.ty(b).shape.as_slice() != [2 * d + dv] {
            return Err(ctx.invalid(format!("bias must be [{}], got {}", 2 * d + dv, ctx.ty(b))));
        }
        let bq = last_axis_slice(ctx, b, 0, d, "bias_q")?;
        let bk = last_axis_slice(ctx, b, d, d, "bias_k")?;
        let bv = last_axis_slice(ctx, b, 2 * d, dv, "bias_v")?;
        q = add(ctx, q, bq, "q_biased")?;
        k = add(ctx, k, bk, "k_biased")?;
        v = add(ctx, v, bv, "v_biased")?;
    }
    a.mask = ctx.opt_input(node, 4);
    a.attention_bias = ctx.opt_input(node, 5);
    a.past = match (ctx.opt_input(node, 6), ctx.opt_input(node, 7)) {
        (Some(pk), Some(pv)) => Some((pk, pv)),
        (None, None) => None,
        _ => return Err(ctx.invalid("past_key and past_value go together")),
    };
    if ctx.opt_input(node, 9).is_some() {
        return Err(ctx.unsupported("cache_indirection (beam search)"));
    }
    let (y, pk, pv) = attend(ctx, q, k, v, a)?;
    Ok(vec![y, pk, pv])
}

/// `x + skip (+ bias)`: the residual sum the skip norms normalize.
fn skip_sum(ctx: &mut ImportCtx, node: &NodeProto, bias_at: usize) -> Result<Val, OnnxError> {
    let x = ctx.input(node, 0)?;
    let skip = ctx.input(node, 1)?;
    let mut s = add(ctx, x, skip, "input_skip")?;
    if let Some(b) = ctx.opt_input(node, bias_at) {
        s = add(ctx, s, b, "input_skip_bias")?;
    }
    Ok(s)
}

/// `SkipLayerNormalization`: input, skip (`[B, S, H]`, `[S, H]` or `[1,
/// S, H]`), gamma, beta, bias → LayerNorm over the last axis of `input +
/// skip + bias`; outputs the result, mean, inverse std and the sum.
pub fn skip_layer_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let sum = skip_sum(ctx, node, 4)?;
    let gamma = ctx.input(node, 2)?;
    let beta = ctx.opt_input(node, 3);
    let eps = ctx.attr_f_or(node, "epsilon", 1e-12)?;
    let stats = wants_output(node, 1) || wants_output(node, 2);
    let mut out = standard(
        ctx,
        norm::layer_norm,
        "LayerNormalization",
        &[Some(sum), Some(gamma), beta],
        vec![float_attr("epsilon", eps), int_attr("axis", -1)],
        if stats { 3 } else { 1 },
    )?;
    while out.len() < 3 {
        out.push(out[0]); // unnamed outputs: never bound
    }
    out.push(sum);
    Ok(out)
}

/// `SkipSimplifiedLayerNormalization`: input, skip, gamma, bias → RMS
/// normalization of the sum (no mean, no beta); outputs the result and,
/// fourth, the sum (the statistics outputs are refused).
pub fn skip_simplified_layer_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    if wants_output(node, 1) || wants_output(node, 2) {
        return Err(
            ctx.unsupported("the mean and inv_std_var outputs of SkipSimplifiedLayerNormalization")
        );
    }
    let sum = skip_sum(ctx, node, 3)?;
    let gamma = ctx.input(node, 2)?;
    let eps = ctx.attr_f_or(node, "epsilon", 1e-12)?;
    let y = standard_one(
        ctx,
        norm::rms_norm,
        "RMSNormalization",
        &[Some(sum), Some(gamma)],
        vec![float_attr("epsilon", eps), int_attr("axis", -1)],
    )?;
    Ok(vec![y, y, y, sum])
}

/// `EmbedLayerNormalization`: input_ids `[B, S]`, segment_ids,
/// word_embedding, position_embedding, segment_embedding, gamma, beta,
/// mask, position_ids → LayerNorm(word[ids] + position[pos] +
/// segment[seg]); outputs it, mask_index (the mask's row sums, i32) and
/// the embedding sum.
pub fn embed_layer_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let ids = ctx.input(node, 0)?;
    let ids_shape = ctx.ty(ids).shape.clone();
    if ids_shape.len() != 2 {
        return Err(ctx.invalid(format!(
            "input_ids must be [batch, sequence], got {}",
            ctx.ty(ids)
        )));
    }
    let (batch, seq) = (ids_shape[0], ids_shape[1]);
    let gather = |ctx: &mut ImportCtx, table: Val, idx: Val, tag: &str| -> Result<Val, OnnxError> {
        ctx.op(Op::Gather { axis: 0 }, &[table, idx], Some(tag))
    };
    let word = ctx.input(node, 2)?;
    let mut sum = gather(ctx, word, ids, "word")?;
    let pos_table = ctx.input(node, 3)?;
    let pos = match ctx.opt_input(node, 8) {
        Some(p) => p,
        None => ramp(ctx, seq, 1, 2, DType::I64, "positions")?,
    };
    let pe = gather(ctx, pos_table, pos, "position")?;
    sum = add(ctx, sum, pe, "word_position")?;
    if let (Some(seg), Some(table)) = (ctx.opt_input(node, 1), ctx.opt_input(node, 4)) {
        let se = gather(ctx, table, seg, "segment")?;
        sum = add(ctx, sum, se, "embedding_sum")?;
    }
    let gamma = ctx.input(node, 5)?;
    let beta = ctx.input(node, 6)?;
    let eps = ctx.attr_f_or(node, "epsilon", 1e-12)?;
    let y = standard_one(
        ctx,
        norm::layer_norm,
        "LayerNormalization",
        &[Some(sum), Some(gamma), Some(beta)],
        vec![float_attr("epsilon", eps), int_attr("axis", -1)],
    )?;
    let mask_index = if wants_output(node, 1) {
        match ctx.opt_input(node, 7) {
            Some(m) => {
                let m = cast_to(ctx, m, DType::I32, "mask_i32")?;
                ctx.op(
                    Op::Reduce {
                        op: kiln_ir::ReduceOp::Sum,
                        axes: [1].into_iter().collect(),
                        keep_dims: false,
                    },
                    &[m],
                    Some("mask_index"),
                )?
            }
            None => build_const(ctx, &[batch], DType::I32, "mask_index", |n| {
                Data::from_i64s(DType::I32, std::iter::repeat_n(0, n))
            })?,
        }
    } else {
        y
    };
    Ok(vec![y, mask_index, sum])
}

/// `Gelu` (erf form).
pub fn gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    one(ctx.op(Op::Unary(UnaryOp::Gelu { tanh: false }), &[x], None)?)
}

/// `BiasGelu`: `Gelu(A + B)` (erf form).
pub fn bias_gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let s = add(ctx, a, b, "biased")?;
    one(ctx.op(Op::Unary(UnaryOp::Gelu { tanh: false }), &[s], None)?)
}

/// `FastGelu`: the tanh approximation of Gelu of `X (+ bias)`.
pub fn fast_gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut x = ctx.input(node, 0)?;
    if let Some(b) = ctx.opt_input(node, 1) {
        x = add(ctx, x, b, "biased")?;
    }
    one(ctx.op(Op::Unary(UnaryOp::Gelu { tanh: true }), &[x], None)?)
}

/// `GemmFastGelu`: `FastGelu(X @ W + bias)`.
pub fn gemm_fast_gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let mut y = ctx.dense_op(Op::MatMul, &[x, w], Some("product"))?;
    if let Some(b) = ctx.opt_input(node, 2) {
        y = add(ctx, y, b, "biased")?;
    }
    one(ctx.op(Op::Unary(UnaryOp::Gelu { tanh: true }), &[y], None)?)
}

/// `QuickGelu`: `x · sigmoid(alpha · x)` (alpha 1.702).
pub fn quick_gelu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let alpha = ctx.attr_f_or(node, "alpha", 1.702)?;
    one(silu(ctx, x, alpha as f64)?)
}

/// `BiasAdd`: `X + bias + skip` (onnxruntime has it on CUDA only).
pub fn bias_add(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let skip = ctx.input(node, 2)?;
    let s = add(ctx, x, b, "biased")?;
    one(add(ctx, s, skip, "sum")?)
}

/// `RotaryEmbedding` (com.microsoft): input (`[B, S, N·H]` or `[B, N, S,
/// H]`), position_ids (`[B, S]`, or one offset: positions `offset + s`),
/// cos_cache, sin_cache; the ONNX op's rotation (`interleaved`,
/// `num_heads`, `rotary_embedding_dim`).
pub fn rotary_embedding(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let mut pos = ctx.input(node, 1)?;
    let cos = ctx.input(node, 2)?;
    let sin = ctx.input(node, 3)?;
    if ctx.attr_i_or(node, "is_packed_batching", 0)? != 0 {
        return Err(ctx.unsupported("is_packed_batching=1 (variable-length packed batches)"));
    }
    if ctx.attr_f_or(node, "scale", 1.0)? != 1.0 {
        return Err(ctx.unsupported("a scale other than 1"));
    }
    let xs = ctx.ty(x).shape.clone();
    let (batch, seq) = match xs.len() {
        3 => (xs[0], xs[1]),
        4 => (xs[0], xs[2]),
        _ => return Err(ctx.invalid(format!("input must be 3-D or 4-D, got {}", ctx.ty(x)))),
    };
    if ctx.ty(pos).num_elements() == 1 && batch * seq != 1 {
        // One offset: every sequence starts at that position.
        let p = cast_to(ctx, pos, DType::I64, "offset_i64")?;
        let p = reshape_to(ctx, p, &[], Some("offset"))?;
        let r = ramp(ctx, seq, 1, 2, DType::I64, "steps")?;
        let r = add(ctx, r, p, "positions")?;
        pos = ctx.op(
            Op::Expand {
                shape: [batch, seq].into_iter().collect(),
            },
            &[r],
            Some("positions_per_batch"),
        )?;
    }
    let attrs = attributes_except(node, &["scale", "is_packed_batching"]);
    let y = standard_one(
        ctx,
        attention::rotary_embedding,
        "RotaryEmbedding",
        &[Some(x), Some(cos), Some(sin), Some(pos)],
        attrs,
    )?;
    one(y)
}
