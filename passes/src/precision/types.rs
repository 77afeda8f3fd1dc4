//! The precision vocabulary: what a dense op runs in ([`Precision`]), which
//! ops are decided ([`is_precision_layer`], [`is_embedding_lookup`]) and
//! the record of each decision ([`Decision`], [`Reason`]). Every other part
//! of the precision subsystem depends on this module and it on none.

use kiln_ir::{DType, Graph, NodeId, Op};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// The precision a dense op runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Precision {
    /// f32 storage and math.
    Fp32,
    /// bf16 weights and activations, `vdpbf16ps` with f32 accumulation
    /// (Conv: bf16 weights, f32 activations).
    Bf16,
    /// f16 weights (storage), widened in the kernel; f32 activations and
    /// math.
    Fp16,
    /// int8: i8 weights per output column, u8 activations per tensor
    /// (calibrated or computed per run), i32 accumulation, f32 rescale
    /// (`super::quantize`).
    Int8,
}

impl Precision {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Int8 => "int8",
        }
    }

    /// The weight storage type.
    pub fn dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::Bf16 => DType::BF16,
            Precision::Fp16 => DType::F16,
            Precision::Int8 => DType::I8,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, PolicyError> {
        match s {
            "fp32" => Ok(Precision::Fp32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            "int8" => Ok(Precision::Int8),
            other => Err(PolicyError::UnknownPrecision(other.to_string())),
        }
    }
}

/// Why a dense node got its precision (recorded in the report).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The `--precision` mode.
    Mode,
    /// `mixed` keeps the first and last dense layer in f32.
    MixedEdge,
    /// A `--keep-fp32` pattern.
    KeepFp32(String),
    /// A `--force` pattern.
    Force(String),
    /// The `--plan` file.
    Plan,
    /// The op or its operands have no reduced-precision kernel form.
    NotEligible(&'static str),
    /// `--max-rel-error`: raised to fp32 because the graph outputs missed
    /// the bound (the measurement that chose it).
    ErrorFallback(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Mode => f.write_str("precision mode"),
            Reason::MixedEdge => f.write_str("mixed: first/last dense layer stays fp32"),
            Reason::KeepFp32(p) => write!(f, "--keep-fp32 {p}"),
            Reason::Force(p) => write!(f, "--force {p}"),
            Reason::Plan => f.write_str("--plan"),
            Reason::NotEligible(why) => write!(f, "stays fp32: {why}"),
            Reason::ErrorFallback(why) => write!(f, "raised to fp32 by --max-rel-error: {why}"),
        }
    }
}

/// One dense node's decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Node (ONNX) name.
    pub node: String,
    /// IR op name.
    pub op: &'static str,
    /// The precision it runs in.
    pub precision: Precision,
    /// Why.
    pub reason: Reason,
}

/// Whether `assign-precision` decides the precision of `op`: the dense ops
/// (MatMul, Gemm, Conv), whatever their operands.
pub fn is_precision_layer(op: &Op) -> bool {
    matches!(op, Op::MatMul | Op::Gemm { .. } | Op::Conv(_))
}

/// Fewest elements of a constant table whose lookups `assign-precision`
/// stores in the reduced precision (a word-embedding table; smaller tables
/// of a few values are not worth the conversion).
pub const MIN_EMBEDDING_ELEMENTS: usize = 1 << 16;

/// Whether node `id` looks rows up in an embedding table: `Gather` along
/// axis 0 of a constant f32 matrix of at least [`MIN_EMBEDDING_ELEMENTS`]
/// by indices computed at run time. Its table is stored in the mode's
/// precision (int8: symmetric per row) and the rows it gathers are widened
/// to f32.
pub fn is_embedding_lookup(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    let inputs = graph.inputs_of(id);
    matches!(node.op, Op::Gather { axis: 0 })
        && node.ty.dtype == DType::F32
        && inputs.len() == 2
        && graph.constant(inputs[1]).is_none()
        && graph.constant(inputs[0]).is_some_and(|t| {
            t.dtype() == DType::F32 && t.shape().len() == 2 && t.len() >= MIN_EMBEDDING_ELEMENTS
        })
}

/// Bad `--precision`, `--keep-fp32` or `--force` arguments.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PolicyError {
    /// Not one of the precision names.
    #[error(
        "unknown precision '{0}'; use fp32, fp16, bf16, int8 or mixed (mixed only for --precision)"
    )]
    UnknownPrecision(String),
    /// `--force` without `=`.
    #[error("--force takes PRECISION=PATTERN[,PATTERN...], got '{0}'")]
    BadForce(String),
    /// An empty pattern in a list.
    #[error("empty pattern in '{0}'")]
    EmptyPattern(String),
}
