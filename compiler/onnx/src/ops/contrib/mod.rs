//! onnxruntime's `com.microsoft` contrib ops: the ones its quantizer, its
//! transformer optimizer and its graph optimizer write into the models
//! teams deploy, each imported onto the IR with the semantics of
//! onnxruntime's CPU kernels (`docs/ContribOperators.md` of onnxruntime).
//!
//! Most are compositions of standard ops: a contrib node becomes one or
//! more default-domain nodes built by the standard builders
//! ([`standard`]), so `QLinearAdd` is `QuantizeLinear(Add(DequantizeLinear
//! (a), DequantizeLinear(b)))` and picks up the QDQ patterns the int8
//! kernels take, `FusedConv` is `Conv` plus its activation, and the
//! attention family shares one core ([`transformer::attend`]) that builds
//! `softmax(scale · Q Kᵀ + bias) V` in the form the `recognize` pass fuses
//! into one `attention` kernel.
//!
//! The quantized ops keep onnxruntime's arithmetic, not just its intent:
//! `DynamicQuantizeMatMul`, `QAttention` and `DynamicQuantizeLSTM` quantize
//! their activations to u8 at run time as its kernels do (the LSTM its
//! input once and its hidden state at every step) and multiply exactly by
//! the 8-bit weights, so they match onnxruntime to float rounding rather
//! than to the int8 tolerance (`tests/tests/contrib.rs`).

mod fused;
mod quant;
mod transformer;

use super::Builder;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use tract_onnx::pb::attribute_proto::AttributeType;
use tract_onnx::pb::{AttributeProto, NodeProto};

/// The contrib ops Kiln imports, by op type (sorted): the registry's
/// table, from which `docs/operators.md` lists them.
pub const OPS: &[(&str, Builder)] = &[
    ("Attention", transformer::attention),
    ("BiasAdd", transformer::bias_add),
    ("BiasGelu", transformer::bias_gelu),
    // The QDQ pair of `UseQDQContribOps` quantization: the ONNX ops'
    // semantics (with 16-bit and 4-bit types) in onnxruntime's domain.
    ("DequantizeLinear", crate::ops::quant::dequantize_linear),
    ("DynamicQuantizeLSTM", quant::dynamic_quantize_lstm),
    ("DynamicQuantizeMatMul", quant::dynamic_quantize_matmul),
    ("EmbedLayerNormalization", transformer::embed_layer_norm),
    ("FastGelu", transformer::fast_gelu),
    ("FusedConv", fused::fused_conv),
    ("FusedGemm", fused::fused_gemm),
    ("FusedMatMul", fused::fused_matmul),
    ("Gelu", transformer::gelu),
    ("GemmFastGelu", transformer::gemm_fast_gelu),
    ("MatMulIntegerToFloat", quant::matmul_integer_to_float),
    ("MatMulNBits", quant::matmul_nbits),
    ("MultiHeadAttention", transformer::multi_head_attention),
    ("QAttention", quant::qattention),
    ("QEmbedLayerNormalization", quant::qembed_layer_norm),
    ("QGemm", quant::qgemm),
    ("QLinearAdd", quant::qlinear_add),
    ("QLinearAveragePool", quant::qlinear_average_pool),
    ("QLinearConcat", quant::qlinear_concat),
    (
        "QLinearGlobalAveragePool",
        quant::qlinear_global_average_pool,
    ),
    ("QLinearLeakyRelu", quant::qlinear_leaky_relu),
    ("QLinearMul", quant::qlinear_mul),
    ("QLinearSigmoid", quant::qlinear_sigmoid),
    ("QLinearSoftmax", quant::qlinear_softmax),
    ("QuantizeLinear", crate::ops::quant::quantize_linear),
    ("QuickGelu", transformer::quick_gelu),
    ("RotaryEmbedding", transformer::rotary_embedding),
    ("SkipLayerNormalization", transformer::skip_layer_norm),
    (
        "SkipSimplifiedLayerNormalization",
        transformer::skip_simplified_layer_norm,
    ),
];

/// The builder of contrib op `op_type`.
pub fn builder(op_type: &str) -> Option<Builder> {
    OPS.iter().find(|(n, _)| *n == op_type).map(|(_, b)| *b)
}

/// Runs the default-domain builder `build` as if the model held an
/// `op_type` node with `inputs` (`None`: an absent optional input) and
/// `attributes`, producing `outputs` outputs. The inputs are bound to names
/// no ONNX model can hold (they contain a NUL) for the call; errors keep
/// naming the contrib node being imported.
pub(crate) fn standard(
    ctx: &mut ImportCtx,
    build: Builder,
    op_type: &str,
    inputs: &[Option<Val>],
    attributes: Vec<AttributeProto>,
    outputs: usize,
) -> Result<Vec<Val>, OnnxError> {
    let prefix = format!("{}\0{op_type}", ctx.node_name());
    let names: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Some(v) => {
                let name = format!("{prefix}/in{i}");
                ctx.bind(&name, *v);
                name
            }
            None => String::new(),
        })
        .collect();
    let node = NodeProto {
        name: ctx.node_name().to_string(),
        op_type: op_type.to_string(),
        input: names.clone(),
        output: (0..outputs).map(|i| format!("{prefix}/out{i}")).collect(),
        attribute: attributes,
        ..Default::default()
    };
    let result = build(ctx, &node);
    for n in names.iter().filter(|n| !n.is_empty()) {
        ctx.unbind(n);
    }
    result
}

/// [`standard`] for a one-output op.
pub(crate) fn standard_one(
    ctx: &mut ImportCtx,
    build: Builder,
    op_type: &str,
    inputs: &[Option<Val>],
    attributes: Vec<AttributeProto>,
) -> Result<Val, OnnxError> {
    let out = standard(ctx, build, op_type, inputs, attributes, 1)?;
    Ok(out[0])
}

/// An INT attribute.
pub(crate) fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        r#type: AttributeType::Int as i32,
        i,
        ..Default::default()
    }
}

/// A FLOAT attribute.
pub(crate) fn float_attr(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.to_string(),
        r#type: AttributeType::Float as i32,
        f,
        ..Default::default()
    }
}

/// The attributes of `node` except those named in `drop` (a contrib op's
/// own attributes, before the rest go to the standard op it extends).
pub(crate) fn attributes_except(node: &NodeProto, drop: &[&str]) -> Vec<AttributeProto> {
    node.attribute
        .iter()
        .filter(|a| !drop.contains(&a.name.as_str()))
        .cloned()
        .collect()
}

/// Whether output `i` of `node` is named (wanted by the model).
pub(crate) fn wants_output(node: &NodeProto, i: usize) -> bool {
    node.output.get(i).is_some_and(|n| !n.is_empty())
}
