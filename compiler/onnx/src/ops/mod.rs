//! The op registry: ONNX op type → builder, plus the static checks that let
//! the frontend report every unsupported op of a model at once.
//!
//! A builder turns one ONNX node into IR values through [`ImportCtx::op`]
//! (which folds constants) and returns one value per ONNX output it
//! produces; opset differences are a `match` inside the builder.

use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use tract_onnx::pb::NodeProto;

pub mod attention;
pub mod build;
pub mod constant;
pub mod contrib;
pub mod control;
pub mod conv;
pub mod detection;
pub mod einsum;
pub mod elementwise;
pub mod index;
pub mod layout;
pub mod linalg;
pub mod logic;
pub mod loss;
pub mod ml;
pub mod movement;
pub mod norm;
pub mod pool;
pub mod quant;
pub mod recurrent;
pub mod reduce;
pub mod resize;
pub mod sample;
pub mod scatter;
pub mod signal;
pub mod text;
pub mod training;
pub mod tree;
pub mod window;

/// Builds the IR for one ONNX node; returns the values of its leading outputs.
pub type Builder = fn(&mut ImportCtx, &NodeProto) -> Result<Vec<Val>, OnnxError>;

/// The ops Kiln implements in a non-default `domain` (for error hints).
pub fn domain_ops(domain: &str) -> Vec<&'static str> {
    let names: &[&str] = match domain {
        "ai.onnx.preview" => &["FlexAttention"],
        "ai.onnx.ml" => &[
            "Binarizer",
            "ArrayFeatureExtractor",
            "TreeEnsemble",
            "TreeEnsembleRegressor",
        ],
        "ai.onnx.preview.training" => &["Adagrad", "Momentum", "Adam"],
        "com.microsoft" => return contrib::OPS.iter().map(|(n, _)| *n).collect(),
        _ => &[],
    };
    names.to_vec()
}

/// Why an op of non-default `domain` that Kiln lacks is unsupported: the
/// ops it has in that domain, if any.
pub fn unknown_domain_op_hint(domain: &str) -> String {
    match domain_ops(domain).as_slice() {
        [] => format!("ops of domain '{domain}' are not supported"),
        known => format!(
            "of domain '{domain}', Kiln implements only {}",
            known.join(", ")
        ),
    }
}

/// The builder for `op_type` of `domain` (`""` or `ai.onnx`: the default
/// domain), if Kiln supports it.
pub fn builder_in(domain: &str, op_type: &str) -> Option<Builder> {
    match domain {
        "" | "ai.onnx" => builder(op_type),
        "ai.onnx.preview" => match op_type {
            "FlexAttention" => Some(attention::flex_attention),
            _ => None,
        },
        "ai.onnx.ml" => match op_type {
            "Binarizer" => Some(ml::binarizer),
            "ArrayFeatureExtractor" => Some(ml::array_feature_extractor),
            "TreeEnsemble" => Some(tree::tree_ensemble),
            "TreeEnsembleRegressor" => Some(tree::tree_ensemble_regressor),
            _ => None,
        },
        "ai.onnx.preview.training" => match op_type {
            "Adagrad" => Some(training::adagrad),
            "Momentum" => Some(training::momentum),
            "Adam" => Some(training::adam),
            _ => None,
        },
        "com.microsoft" => contrib::builder(op_type),
        _ => None,
    }
}

/// The builder for a default-domain op type, if Kiln supports it.
pub fn builder(op_type: &str) -> Option<Builder> {
    use elementwise as e;
    Some(match op_type {
        "Add" => e::add,
        "Sub" => e::sub,
        "Mul" => e::mul,
        "Div" => e::div,
        "Pow" => e::pow,
        "Max" => e::max,
        "Min" => e::min,
        "Sum" => e::sum,
        "Mean" => e::mean,
        "Relu" => e::relu,
        "LeakyRelu" => e::leaky_relu,
        "Sigmoid" => e::sigmoid,
        "Tanh" => e::tanh,
        "HardSigmoid" => e::hard_sigmoid,
        "HardSwish" => e::hard_swish,
        "Neg" => e::neg,
        "Abs" => e::abs,
        "Sqrt" => e::sqrt,
        "Exp" => e::exp,
        "Log" => e::log,
        "Reciprocal" => e::reciprocal,
        "Floor" => e::floor,
        "Ceil" => e::ceil,
        "Clip" => e::clip,
        "Round" => e::round,
        "Sign" => e::sign,
        "Erf" => e::erf,
        "Gelu" => e::gelu,
        "Elu" => e::elu,
        "Selu" => e::selu,
        "Celu" => e::celu,
        "Softplus" => e::softplus,
        "Softsign" => e::softsign,
        "Mish" => e::mish,
        "ThresholdedRelu" => e::thresholded_relu,
        "Shrink" => e::shrink,
        "Sin" => e::sin,
        "Cos" => e::cos,
        "Tan" => e::tan,
        "Asin" => e::asin,
        "Acos" => e::acos,
        "Atan" => e::atan,
        "Sinh" => e::sinh,
        "Cosh" => e::cosh,
        "Asinh" => e::asinh,
        "Acosh" => e::acosh,
        "Atanh" => e::atanh,
        "Mod" => e::modulo,
        "PRelu" => e::prelu,
        "LayerNormalization" => norm::layer_norm,
        "RMSNormalization" => norm::rms_norm,
        "NegativeLogLikelihoodLoss" => loss::nll_loss,
        "SoftmaxCrossEntropyLoss" => loss::softmax_cross_entropy_loss,
        "Attention" => attention::attention,
        "LinearAttention" => attention::linear_attention,
        "RotaryEmbedding" => attention::rotary_embedding,
        "LpNormalization" => norm::lp_norm,
        "QuantizeLinear" => quant::quantize_linear,
        "DequantizeLinear" => quant::dequantize_linear,
        "DynamicQuantizeLinear" => quant::dynamic_quantize_linear,
        "MatMulInteger" => quant::matmul_integer,
        "QLinearMatMul" => quant::qlinear_matmul,
        "ConvInteger" => quant::conv_integer,
        "QLinearConv" => quant::qlinear_conv,
        "Resize" => resize::resize,
        "Upsample" => resize::upsample,
        "ConvTranspose" => conv::conv_transpose,
        "Col2Im" => conv::col2im,
        "Softmax" => e::softmax,
        "Gemm" => linalg::gemm,
        "MatMul" => linalg::matmul,
        "Conv" => conv::conv,
        "MaxPool" => pool::max_pool,
        "MaxUnpool" => pool::max_unpool,
        "AveragePool" => pool::average_pool,
        "GlobalAveragePool" => pool::global_average_pool,
        "GlobalMaxPool" => pool::global_max_pool,
        "BatchNormalization" => norm::batch_norm,
        "Flatten" => layout::flatten,
        "Reshape" => layout::reshape,
        "Transpose" => layout::transpose,
        "Concat" => layout::concat,
        "Identity" => layout::identity,
        "Dropout" => layout::dropout,
        "Gather" => layout::gather,
        "Slice" => layout::slice,
        "Squeeze" => layout::squeeze,
        "Unsqueeze" => layout::unsqueeze,
        "Cast" => layout::cast,
        "BitCast" => layout::bitcast,
        "CastLike" => layout::cast_like,
        "Equal" => logic::equal,
        "Less" => logic::less,
        "Greater" => logic::greater,
        "LessOrEqual" => logic::less_or_equal,
        "GreaterOrEqual" => logic::greater_or_equal,
        "And" => logic::and,
        "Or" => logic::or,
        "Xor" => logic::xor,
        "Not" => logic::not,
        "BitShift" => logic::bit_shift,
        "BitwiseAnd" => logic::bitwise_and,
        "BitwiseOr" => logic::bitwise_or,
        "BitwiseXor" => logic::bitwise_xor,
        "BitwiseNot" => logic::bitwise_not,
        "Where" => logic::where_,
        "ReduceSum" => reduce::reduce_sum,
        "ReduceMean" => reduce::reduce_mean,
        "ReduceMax" => reduce::reduce_max,
        "ReduceMin" => reduce::reduce_min,
        "ReduceProd" => reduce::reduce_prod,
        "ReduceL1" => reduce::reduce_l1,
        "ReduceL2" => reduce::reduce_l2,
        "ReduceLogSum" => reduce::reduce_log_sum,
        "ReduceLogSumExp" => reduce::reduce_log_sum_exp,
        "ReduceSumSquare" => reduce::reduce_sum_square,
        "Expand" => layout::expand,
        "Constant" => constant::constant,
        "Shape" => constant::shape,
        "ConstantOfShape" => constant::constant_of_shape,
        "LogSoftmax" => e::log_softmax,
        "InstanceNormalization" => norm::instance_norm,
        "GroupNormalization" => norm::group_norm,
        "Split" => movement::split,
        "Tile" => movement::tile,
        "Pad" => movement::pad,
        "CenterCropPad" => movement::center_crop_pad,
        "DFT" => signal::dft,
        "STFT" => signal::stft,
        "HannWindow" => signal::hann_window,
        "MelWeightMatrix" => signal::mel_weight_matrix,
        "HammingWindow" => signal::hamming_window,
        "BlackmanWindow" => signal::blackman_window,
        "DepthToSpace" => movement::depth_to_space,
        "SpaceToDepth" => movement::space_to_depth,
        "Trilu" => movement::trilu,
        "Range" => index::range,
        "Size" => index::size,
        "ArgMax" => index::arg_max,
        "OptionalHasElement" => layout::optional_has_element,
        "OptionalGetElement" => layout::optional_get_element,
        "TfIdfVectorizer" => text::tfidf_vectorizer,
        "Det" => linalg::det,
        "ArgMin" => index::arg_min,
        "Hardmax" => index::hardmax,
        "OneHot" => index::one_hot,
        "GatherElements" => index::gather_elements,
        "ReverseSequence" => index::reverse_sequence,
        "Compress" => index::compress,
        "GatherND" => index::gather_nd,
        "CumSum" => index::cumsum,
        "CumProd" => index::cumprod,
        "Einsum" => einsum::einsum,
        "TopK" => index::top_k,
        "NonZero" => index::non_zero,
        "Unique" => index::unique,
        "NonMaxSuppression" => detection::non_max_suppression,
        "If" => control::if_,
        "Loop" => control::loop_,
        "Scan" => control::scan,
        "GridSample" => sample::grid_sample,
        "RoiAlign" => sample::roi_align,
        "DeformConv" => sample::deform_conv,
        "AffineGrid" => sample::affine_grid,
        // onnxruntime registers its RMS norm in the default domain; the
        // transformer optimizer writes it for T5/LLaMA-style models.
        "SimplifiedLayerNormalization" => norm::rms_norm,
        "RNN" => recurrent::rnn,
        "GRU" => recurrent::gru,
        "LSTM" => recurrent::lstm,
        "IsNaN" => e::is_nan,
        "IsInf" => e::is_inf,
        "Swish" => e::swish,
        "SwiGLU" => e::swiglu,
        "CausalConvWithState" => conv::causal_conv_with_state,
        "EyeLike" => constant::eye_like,
        "LpPool" => pool::lp_pool,
        "LRN" => norm::lrn,
        "MeanVarianceNormalization" => norm::mean_variance_norm,
        "ScatterND" => scatter::scatter_nd,
        "TensorScatter" => scatter::tensor_scatter,
        "ScatterElements" => scatter::scatter_elements,
        "Scatter" => scatter::scatter_elements,
        _ => return None,
    })
}

/// Why an op type Kiln does not implement is unsupported.
pub fn missing_op_hint(op_type: &str) -> String {
    format!("Kiln does not implement {op_type} yet")
}

/// Checks a supported node for features only visible in its attributes and
/// output uses (training modes, used secondary outputs...). `used` says
/// whether a value name is read by a node or is a graph output. Returns a
/// hint when the node cannot be imported.
pub fn precheck(node: &NodeProto, opset: i64, used: &dyn Fn(&str) -> bool) -> Option<String> {
    let used_output = |i: usize| node.output.get(i).is_some_and(|n| !n.is_empty() && used(n));
    let attr_i = |name: &str| node.attribute.iter().find(|a| a.name == name).map(|a| a.i);
    let has_attr = |name: &str| node.attribute.iter().any(|a| a.name == name);
    match node.op_type.as_str() {
        "Dropout" if used_output(1) && opset < 10 => {
            Some("the 'mask' output of Dropout is not supported (inference only)".into())
        }
        "BatchNormalization" => {
            if opset >= 14 && attr_i("training_mode") == Some(1) {
                // Y and the running statistics (batch_norm_training).
                None
            } else if (1..5).any(used_output) {
                Some("the running-statistics outputs of BatchNormalization (training mode) are not supported".into())
            } else {
                None
            }
        }
        "Constant" if has_attr("sparse_value") => {
            Some("sparse Constant values are not supported".into())
        }
        "Constant" if has_attr("value_string") || has_attr("value_strings") => {
            Some("string constants are not supported".into())
        }
        _ => None,
    }
}

/// The single result of a one-output builder.
pub(crate) fn one(v: Val) -> Result<Vec<Val>, OnnxError> {
    Ok(vec![v])
}
