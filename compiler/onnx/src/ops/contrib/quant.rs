//! The quantized contrib ops: onnxruntime's QOperator format
//! (`QLinearAdd`, `QLinearMul`, `QLinearSigmoid`, `QLinearLeakyRelu`, the
//! `QLinear` pools and `QLinearConcat`, `QGemm`), its dynamic quantization
//! (`DynamicQuantizeMatMul`, `MatMulIntegerToFloat`, `DynamicQuantizeLSTM`)
//! and the quantized transformer ops (`QAttention`,
//! `QEmbedLayerNormalization`).
//!
//! The element-wise and pooling forms are the float op between
//! `DequantizeLinear` and `QuantizeLinear` (onnxruntime computes them in
//! float or from a lookup table built that way); the matrix products are
//! exact i32 products (`MatMulInteger`) rescaled in f32, as onnxruntime's
//! kernels do.

use super::{float_attr, int_attr, standard, standard_one};
use crate::ctx::{ImportCtx, Val};
use crate::ops::build::{cast_to, reshape_to, scalar};
use crate::ops::elementwise::{self as e};
use crate::ops::{layout, one, pool, quant, recurrent};
use crate::OnnxError;
use kiln_ir::{BinaryOp, DType, Op};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `DequantizeLinear(x, scale, zero_point)` (per tensor, or per axis 1).
pub(super) fn dequantize(
    ctx: &mut ImportCtx,
    x: Val,
    scale: Val,
    zero: Option<Val>,
) -> Result<Val, OnnxError> {
    standard_one(
        ctx,
        quant::dequantize_linear,
        "DequantizeLinear",
        &[Some(x), Some(scale), zero],
        vec![],
    )
}

/// `QuantizeLinear(y, scale, zero_point)` to the zero point's type, or to
/// `like` (the quantized input's type) when the zero point is absent, as
/// onnxruntime reads a missing output zero point.
fn quantize(
    ctx: &mut ImportCtx,
    y: Val,
    scale: Val,
    zero: Option<Val>,
    like: DType,
) -> Result<Val, OnnxError> {
    let zero = zero.unwrap_or_else(|| scalar(ctx, like, 0.0, "y_zero_point_default"));
    standard_one(
        ctx,
        quant::quantize_linear,
        "QuantizeLinear",
        &[Some(y), Some(scale), Some(zero)],
        vec![],
    )
}

/// Input `i` of `node` (the quantized tensor) and its scale and zero
/// point at `i + 1`, `i + 2`, dequantized.
fn dequantized_input(ctx: &mut ImportCtx, node: &NodeProto, i: usize) -> Result<Val, OnnxError> {
    let x = ctx.input(node, i)?;
    let s = ctx.input(node, i + 1)?;
    let z = ctx.opt_input(node, i + 2);
    dequantize(ctx, x, s, z)
}

/// `f(dequantized inputs)` requantized by the output scale and zero point
/// at `out` (`out + 1`), of the first input's type.
fn requantized(ctx: &mut ImportCtx, node: &NodeProto, y: Val, out: usize) -> R {
    let like = ctx.ty(ctx.input(node, 0)?).dtype;
    let s = ctx.input(node, out)?;
    let z = ctx.opt_input(node, out + 1);
    one(quantize(ctx, y, s, z, like)?)
}

/// `QLinearAdd` / `QLinearMul`: A, its scale and zero point, B, its scale
/// and zero point, C's scale and zero point; numpy broadcasting.
fn qlinear_binary(ctx: &mut ImportCtx, node: &NodeProto, build: super::Builder, op: &str) -> R {
    let a = dequantized_input(ctx, node, 0)?;
    let b = dequantized_input(ctx, node, 3)?;
    let y = standard_one(ctx, build, op, &[Some(a), Some(b)], vec![])?;
    requantized(ctx, node, y, 6)
}

/// `QLinearAdd`.
pub fn qlinear_add(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    qlinear_binary(ctx, node, e::add, "Add")
}

/// `QLinearMul`.
pub fn qlinear_mul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    qlinear_binary(ctx, node, e::mul, "Mul")
}

/// `QLinearSigmoid`: X, its scale and zero point, Y's scale and zero point.
pub fn qlinear_sigmoid(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = dequantized_input(ctx, node, 0)?;
    let y = standard_one(ctx, e::sigmoid, "Sigmoid", &[Some(x)], vec![])?;
    requantized(ctx, node, y, 3)
}

/// `QLinearLeakyRelu` (`alpha`, default 0.01).
pub fn qlinear_leaky_relu(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let alpha = ctx.attr_f_or(node, "alpha", 0.01)?;
    let x = dequantized_input(ctx, node, 0)?;
    let y = standard_one(
        ctx,
        e::leaky_relu,
        "LeakyRelu",
        &[Some(x)],
        vec![float_attr("alpha", alpha)],
    )?;
    requantized(ctx, node, y, 3)
}

/// `QLinearSoftmax`: X, X_scale, X_zero_point, Y_scale, Y_zero_point;
/// `axis` read as the Softmax of opset `opset` (an attribute: the opset of
/// the Softmax the quantizer replaced) reads it.
pub fn qlinear_softmax(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let opset = ctx
        .attr_i(node, "opset")?
        .ok_or_else(|| ctx.bad_attr("opset", "is required (the replaced Softmax's opset)"))?;
    let x = dequantized_input(ctx, node, 0)?;
    let attrs = node
        .attribute
        .iter()
        .filter(|a| a.name == "axis")
        .cloned()
        .collect();
    let model_opset = std::mem::replace(&mut ctx.opset, opset);
    let y = standard_one(ctx, e::softmax, "Softmax", &[Some(x)], attrs);
    ctx.opset = model_opset;
    requantized(ctx, node, y?, 3)
}

/// `x` laid out `[N, C, ...]` for a pool, and the permutation that takes
/// the result back, when the contrib pool reads `channels_last` input.
fn channels_first(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
) -> Result<(Val, Option<Vec<usize>>), OnnxError> {
    if ctx.attr_i_or(node, "channels_last", 0)? == 0 {
        return Ok((x, None));
    }
    let rank = ctx.ty(x).shape.len();
    if rank < 3 {
        return Err(ctx.invalid(format!(
            "channels_last input must have rank ≥ 3, got {}",
            ctx.ty(x)
        )));
    }
    // [N, spatial..., C] -> [N, C, spatial...] and back.
    let to_first: Vec<usize> = [0, rank - 1].into_iter().chain(1..rank - 1).collect();
    let to_last: Vec<usize> = [0].into_iter().chain(2..rank).chain([1]).collect();
    let t = ctx.op(
        Op::Transpose {
            perm: to_first.into_iter().collect(),
        },
        &[x],
        Some("channels_first"),
    )?;
    Ok((t, Some(to_last)))
}

/// A pool of the dequantized input in `[N, C, ...]` layout, requantized.
fn qlinear_pool(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    build: super::Builder,
    op: &str,
    keep: &[&str],
) -> R {
    let x = dequantized_input(ctx, node, 0)?;
    let (x, back) = channels_first(ctx, node, x)?;
    let attrs = node
        .attribute
        .iter()
        .filter(|a| keep.contains(&a.name.as_str()))
        .cloned()
        .collect();
    let mut y = standard_one(ctx, build, op, &[Some(x)], attrs)?;
    if let Some(perm) = back {
        y = ctx.op(
            Op::Transpose {
                perm: perm.into_iter().collect(),
            },
            &[y],
            Some("channels_last"),
        )?;
    }
    requantized(ctx, node, y, 3)
}

/// `QLinearAveragePool` (the `AveragePool` attributes, `channels_last`).
pub fn qlinear_average_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    const POOL: &[&str] = &[
        "auto_pad",
        "ceil_mode",
        "count_include_pad",
        "kernel_shape",
        "pads",
        "strides",
        "dilations",
    ];
    qlinear_pool(ctx, node, pool::average_pool, "AveragePool", POOL)
}

/// `QLinearGlobalAveragePool` (`channels_last`).
pub fn qlinear_global_average_pool(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    qlinear_pool(
        ctx,
        node,
        pool::global_average_pool,
        "GlobalAveragePool",
        &[],
    )
}

/// `QLinearConcat`: Y's scale and zero point, then (X, scale, zero point)
/// per input; `axis`.
pub fn qlinear_concat(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let n = node.input.len();
    if n < 5 || !(n - 2).is_multiple_of(3) {
        return Err(ctx.invalid(format!(
            "QLinearConcat takes Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got {n} inputs"
        )));
    }
    let axis = ctx
        .attr_i(node, "axis")?
        .ok_or_else(|| ctx.bad_attr("axis", "is required"))?;
    let mut parts = Vec::with_capacity((n - 2) / 3);
    for i in (2..n).step_by(3) {
        parts.push(Some(dequantized_input(ctx, node, i)?));
    }
    let like = ctx.ty(ctx.input(node, 2)?).dtype;
    let y = standard_one(
        ctx,
        layout::concat,
        "Concat",
        &parts,
        vec![int_attr("axis", axis)],
    )?;
    let s = ctx.input(node, 0)?;
    let z = ctx.opt_input(node, 1);
    one(quantize(ctx, y, s, z, like)?)
}

/// `MatMulInteger(a, b, a_zp, b_zp)`: the exact i32 product.
fn integer_matmul(
    ctx: &mut ImportCtx,
    a: Val,
    b: Val,
    [a_zero, b_zero]: [Option<Val>; 2],
) -> Result<Val, OnnxError> {
    standard_one(
        ctx,
        quant::matmul_integer,
        "MatMulInteger",
        &[Some(a), Some(b), a_zero, b_zero],
        vec![],
    )
}

/// `MatMulInteger(a, b, a_zp, b_zp)` as f32, times `scale` (broadcasting
/// against the product: a scalar or one per column), plus `bias`.
fn scaled_integer_product(
    ctx: &mut ImportCtx,
    a: Val,
    b: Val,
    zeros: [Option<Val>; 2],
    scale: Val,
    bias: Option<Val>,
) -> Result<Val, OnnxError> {
    let p = integer_matmul(ctx, a, b, zeros)?;
    let p = ctx.op(Op::Cast { to: DType::F32 }, &[p], Some("product_float"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[p, scale], Some("rescaled"))?;
    match bias {
        Some(b) => ctx.op(Op::Binary(BinaryOp::Add), &[y, b], Some("biased")),
        None => Ok(y),
    }
}

/// `MatMulIntegerToFloat`: A, B, a_scale, b_scale, a_zero_point,
/// b_zero_point, bias → `(A - a_zp) @ (B - b_zp) · a_scale · b_scale +
/// bias` in f32.
pub fn matmul_integer_to_float(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let s = quant::scale_product(ctx, ctx.input(node, 2)?, ctx.input(node, 3)?, "scale")?;
    let zeros = [ctx.opt_input(node, 4), ctx.opt_input(node, 5)];
    let bias = ctx.opt_input(node, 6);
    one(scaled_integer_product(ctx, a, b, zeros, s, bias)?)
}

/// `DynamicQuantizeMatMul`: A (f32) quantized to u8 as
/// `DynamicQuantizeLinear` does, times B (u8/i8) with b_scale and
/// b_zero_point, plus bias, in f32.
pub fn dynamic_quantize_matmul(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let b = ctx.input(node, 1)?;
    let b_scale = ctx.input(node, 2)?;
    let b_zero = ctx.opt_input(node, 3);
    let y = quant::dynamic_quantized_matmul(ctx, a, b, b_scale, b_zero, "")?;
    match ctx.opt_input(node, 4) {
        Some(bias) => one(ctx.op(Op::Binary(BinaryOp::Add), &[y, bias], Some("biased"))?),
        None => one(y),
    }
}

/// `QGemm`: A, a_scale, a_zero_point, B, b_scale, b_zero_point, C (an i32
/// bias in units of `a_scale · b_scale`), y_scale, y_zero_point;
/// `alpha`, `transA`, `transB`. `Y = alpha · a_scale · b_scale · ((A -
/// a_zp) @ (B - b_zp) + C)`, requantized when y_scale is given, f32
/// otherwise.
pub fn qgemm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let alpha = ctx.attr_f_or(node, "alpha", 1.0)?;
    let mut a = ctx.input(node, 0)?;
    let mut b = ctx.input(node, 3)?;
    let a_zero = ctx.opt_input(node, 2);
    let mut b_zero = ctx.opt_input(node, 5);
    let c = ctx.opt_input(node, 6);
    for (flag, v, tag) in [
        ("transA", &mut a, "a_transposed"),
        ("transB", &mut b, "b_transposed"),
    ] {
        if ctx.attr_i_or(node, flag, 0)? != 0 {
            if ctx.ty(*v).shape.len() != 2 {
                return Err(ctx.invalid(format!("{flag} needs a matrix, got {}", ctx.ty(*v))));
            }
            *v = ctx.op(
                Op::Transpose {
                    perm: [1, 0].into_iter().collect(),
                },
                &[*v],
                Some(tag),
            )?;
        }
    }
    if let Some(z) = b_zero {
        // A per-column zero point of a transposed B still runs along N.
        if ctx.ty(z).shape.len() > 1 {
            b_zero = Some(reshape_to(
                ctx,
                z,
                &[ctx.ty(z).num_elements()],
                Some("b_zero_point_flat"),
            )?);
        }
    }
    let a_scale = ctx.input(node, 1)?;
    let b_scale = ctx.input(node, 4)?;
    let b_scale = if ctx.ty(b_scale).shape.len() > 1 {
        reshape_to(
            ctx,
            b_scale,
            &[ctx.ty(b_scale).num_elements()],
            Some("b_scale_flat"),
        )?
    } else {
        b_scale
    };
    let s = quant::scale_product(ctx, a_scale, b_scale, "scale")?;
    let s = if alpha == 1.0 {
        s
    } else {
        let al = scalar(ctx, DType::F32, alpha as f64, "alpha");
        ctx.op(Op::Binary(BinaryOp::Mul), &[s, al], Some("scale_alpha"))?
    };
    let p = integer_matmul(ctx, a, b, [a_zero, b_zero])?;
    let p = match c {
        Some(c) => {
            if ctx.ty(c).dtype != DType::I32 {
                return Err(ctx.invalid(format!("C must be an i32 bias, got {}", ctx.ty(c))));
            }
            ctx.op(Op::Binary(BinaryOp::Add), &[p, c], Some("biased"))?
        }
        None => p,
    };
    let p = ctx.op(Op::Cast { to: DType::F32 }, &[p], Some("product_float"))?;
    let y = ctx.op(Op::Binary(BinaryOp::Mul), &[p, s], Some("rescaled"))?;
    match ctx.opt_input(node, 7) {
        Some(ys) => {
            let like = ctx.ty(ctx.input(node, 0)?).dtype;
            let yz = ctx.opt_input(node, 8);
            one(quantize(ctx, y, ys, yz, like)?)
        }
        None => one(y),
    }
}

/// `DynamicQuantizeLSTM`: the ONNX LSTM (inputs X, W, R, B,
/// sequence_lens, initial_h, initial_c, P; same attributes) with W `[D,
/// input, 4H]` and R `[D, H, 4H]` quantized (W_scale, W_zero_point,
/// R_scale, R_zero_point at 8-11, each `[D]` or `[D, 4H]`). As in
/// onnxruntime, the input sequence (once) and the hidden state (at every
/// step) are quantized to u8 at run time and multiplied exactly by the
/// 8-bit weights ([`recurrent::QuantizedWeights`]).
pub fn dynamic_quantize_lstm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let matrix = |ctx: &ImportCtx, at: usize, scale_at: usize| -> Result<_, OnnxError> {
        Ok(recurrent::QuantizedMatrix {
            q: ctx.input(node, at)?,
            scale: ctx.input(node, scale_at)?,
            zero: ctx.opt_input(node, scale_at + 1),
        })
    };
    let weights = recurrent::QuantizedWeights {
        w: matrix(ctx, 1, 8)?,
        r: matrix(ctx, 2, 10)?,
    };
    recurrent::lstm_with_quantized_weights(ctx, node, weights)
}

/// `QAttention`: input (u8), weight (u8/i8 `[hidden, 3·hidden]`), bias,
/// input_scale, weight_scale, mask_index, input_zero_point,
/// weight_zero_point, past: the exact integer QKV product rescaled by
/// `input_scale · weight_scale`, then [`super::transformer::attention_on`]
/// as `Attention`.
pub fn qattention(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let bias = ctx.input(node, 2)?;
    let s = quant::scale_product(ctx, ctx.input(node, 3)?, ctx.input(node, 4)?, "scale")?;
    let zeros = [ctx.opt_input(node, 6), ctx.opt_input(node, 7)];
    let qkv = scaled_integer_product(ctx, x, w, zeros, s, Some(bias))?;
    let mask = ctx.opt_input(node, 5);
    let past = ctx.opt_input(node, 8);
    super::transformer::attention_on(ctx, node, qkv, mask, past, None)
}

/// `QEmbedLayerNormalization`: `EmbedLayerNormalization` whose tables,
/// gamma and beta are quantized. Inputs: input_ids, segment_ids, the
/// word, position and segment tables, gamma, beta (u8), mask, then their
/// five scales and five zero points.
pub fn qembed_layer_norm(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut params: Vec<Option<Val>> = Vec::with_capacity(8);
    params.push(Some(ctx.input(node, 0)?));
    params.push(ctx.opt_input(node, 1));
    for (k, i) in (2..7).enumerate() {
        let q = ctx.opt_input(node, i);
        params.push(match q {
            Some(q) => {
                let s = ctx.input(node, 8 + k)?;
                let z = ctx.opt_input(node, 13 + k);
                Some(dequantize(ctx, q, s, z)?)
            }
            None => None,
        });
    }
    params.push(ctx.opt_input(node, 7));
    standard(
        ctx,
        super::transformer::embed_layer_norm,
        "EmbedLayerNormalization",
        &params,
        node.attribute.clone(),
        node.output.len(),
    )
}

/// The `bits`-bit value at position `i` of bytes packed from the low bits
/// up (`MatMulNBits` weights and zero points).
fn unpacked(bytes: &[u8], i: usize, bits: usize) -> Option<u8> {
    let byte = *bytes.get(i * bits / 8)?;
    let mask = ((1u16 << bits) - 1) as u8;
    Some((byte >> ((i * bits) % 8)) & mask)
}

/// `MatMulNBits`: A `[..., K]` times B^T, where B holds N rows of K values
/// quantized to `bits` (2, 4 or 8) bits in blocks of `block_size` along K
/// (`[N, blocks, block_size·bits/8]` u8, low bits first), with scales
/// `[N, blocks]`, zero points packed the same way per block (default
/// `2^(bits-1)`) or given unpacked in the scales' type, and a bias `[N]`.
/// The weights are constants in every model onnxruntime's
/// `MatMulNBitsQuantizer` writes: they are dequantized at import into the
/// f32 `[K, N]` operand of an ordinary MatMul (weight-only quantization
/// saves memory in onnxruntime; Kiln stores the f32 matrix).
pub fn matmul_nbits(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let a = ctx.input(node, 0)?;
    let required = |ctx: &ImportCtx, name: &str| -> Result<usize, OnnxError> {
        match ctx.attr_i(node, name)? {
            Some(v) if v > 0 => Ok(v as usize),
            Some(v) => Err(ctx.bad_attr(name, format!("must be positive, got {v}"))),
            None => Err(ctx.bad_attr(name, "is required")),
        }
    };
    let (k, n, block) = (
        required(ctx, "K")?,
        required(ctx, "N")?,
        required(ctx, "block_size")?,
    );
    let bits = ctx.attr_i_or(node, "bits", 4)?;
    if !matches!(bits, 2 | 4 | 8) {
        return Err(ctx.unsupported(format!("MatMulNBits with {bits}-bit weights (2, 4 and 8)")));
    }
    let bits = bits as usize;
    if ctx.attr_i_or(node, "weight_prepacked", 0)? != 0 {
        return Err(
            ctx.unsupported("prepacked MatMulNBits weights (an onnxruntime-internal layout)")
        );
    }
    if ctx.opt_input(node, 4).is_some() {
        return Err(ctx.unsupported("g_idx (act-order column permutation)"));
    }
    let b = ctx.const_input(node, 1)?;
    // K, N and block_size are attributes: every size below is checked
    // against B's actual shape before it sizes anything.
    let blocks = k.div_ceil(block);
    let blob = match block.checked_mul(bits) {
        Some(b) if b.is_multiple_of(8) => b / 8,
        Some(_) => {
            return Err(ctx.bad_attr(
                "block_size",
                format!("{block} values of {bits} bits are not whole bytes"),
            ))
        }
        None => return Err(ctx.bad_attr("block_size", format!("{block} is too large"))),
    };
    let scales = ctx.const_input(node, 2)?;
    let zeros = ctx.opt_const_input(node, 3)?;
    let kiln_ir::Data::U8(qb) = b.data() else {
        return Err(ctx.invalid(format!("B must be u8, got {}", b.dtype())));
    };
    if b.shape().as_slice() != [n, blocks, blob] {
        return Err(ctx.invalid(format!(
            "B is {:?}, expected [N, blocks, blob] = [{n}, {blocks}, {blob}]",
            b.shape().as_slice()
        )));
    }
    // B holds n·blocks·blob bytes, so these products fit.
    if scales.len() != n * blocks {
        return Err(ctx.invalid(format!(
            "scales has {} values, expected N·blocks = {}",
            scales.len(),
            n * blocks
        )));
    }
    let scale = scales.to_f64_vec();
    let default_zero = (1u32 << (bits - 1)) as f64;
    let zero = |row: usize, blk: usize| -> Option<f64> {
        match &zeros {
            None => Some(default_zero),
            Some(z) => match z.data() {
                kiln_ir::Data::U8(zb) => {
                    let stride = (blocks * bits).div_ceil(8);
                    unpacked(zb.get(row * stride..)?, blk, bits).map(f64::from)
                }
                _ => (row * blocks + blk < z.len()).then(|| z.data().get_f64(row * blocks + blk)),
            },
        }
    };
    let bytes = k
        .checked_mul(n)
        .and_then(|e| e.checked_mul(4))
        .ok_or_else(|| ctx.bad_attr("K", format!("K·N = {k}·{n} f32 weights overflow")))?;
    ctx.charge_generated(bytes as u64)?;
    let mut w = vec![0f32; k * n];
    for row in 0..n {
        for blk in 0..blocks {
            let s = scale[row * blocks + blk];
            let z = zero(row, blk).ok_or_else(|| {
                ctx.invalid(format!(
                    "zero_points are too short for N = {n} rows of {blocks} blocks"
                ))
            })?;
            let bytes = &qb[(row * blocks + blk) * blob..(row * blocks + blk + 1) * blob];
            for i in 0..block.min(k - blk * block) {
                let q = unpacked(bytes, i, bits).expect("i < block fits the blob") as f64;
                w[(blk * block + i) * n + row] = ((q - z) * s) as f32;
            }
        }
    }
    let t = kiln_ir::Tensor::new([k, n], kiln_ir::Data::F32(w)).expect("k·n values");
    let name = format!("{}/weights_dequantized", ctx.node_name());
    let wv = ctx.constant(t, name);
    let dt = ctx.ty(a).dtype;
    let wv = cast_to(ctx, wv, dt, "weights_cast")?;
    let y = ctx.dense_op(Op::MatMul, &[a, wv], Some("product"))?;
    match ctx.opt_input(node, 5) {
        Some(bias) => one(ctx.op(Op::Binary(BinaryOp::Add), &[y, bias], Some("biased"))?),
        None => one(y),
    }
}
