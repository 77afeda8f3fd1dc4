//! The operation set of the IR.
//!
//! One enum variant per operation, with typed attributes. The frontend
//! resolves everything ONNX leaves to run time but Kiln knows at compile
//! time (auto_pad, Reshape targets, Slice bounds, Clip limits given as
//! inputs, Shape results), so every attribute here is concrete.

use crate::DType;
use smallvec::SmallVec;

/// A list of small integers (axes, pads, strides).
pub type Ints = SmallVec<[usize; 4]>;

/// Elementwise operations with one input and one output of the same shape.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Relu,
    LeakyRelu { alpha: f32 },
    Sigmoid,
    Tanh,
    HardSigmoid { alpha: f32, beta: f32 },
    HardSwish,
    Clip { min: f32, max: f32 },
    Neg,
    Abs,
    Sqrt,
    Exp,
    Log,
    Reciprocal,
    Floor,
    Ceil,
}

impl UnaryOp {
    /// Text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            UnaryOp::Relu => "relu",
            UnaryOp::LeakyRelu { .. } => "leaky_relu",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Tanh => "tanh",
            UnaryOp::HardSigmoid { .. } => "hard_sigmoid",
            UnaryOp::HardSwish => "hard_swish",
            UnaryOp::Clip { .. } => "clip",
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Reciprocal => "reciprocal",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
        }
    }

    /// Whether the op is defined on integer inputs too (otherwise float only).
    pub fn accepts_int(&self) -> bool {
        matches!(
            self,
            UnaryOp::Relu | UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Clip { .. }
        )
    }

    /// Scalar semantics in f64, shared by the reference evaluator and by
    /// targets that need a scalar fallback.
    pub fn apply(&self, x: f64) -> f64 {
        match *self {
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::LeakyRelu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x
                } else {
                    x
                }
            }
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::HardSigmoid { alpha, beta } => {
                (alpha as f64 * x + beta as f64).clamp(0.0, 1.0)
            }
            UnaryOp::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            UnaryOp::Clip { min, max } => x.max(min as f64).min(max as f64),
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
        }
    }
}

/// Elementwise operations with two inputs, numpy-style broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

impl BinaryOp {
    /// Text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
        }
    }

    /// Scalar float semantics.
    pub fn apply_f64(&self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Pow => a.powf(b),
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
        }
    }

    /// Scalar integer semantics (wrapping; division truncates, and a division
    /// by zero is `None`).
    pub fn apply_i64(&self, a: i64, b: i64) -> Option<i64> {
        Some(match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => a.checked_div(b)?,
            BinaryOp::Pow => a.wrapping_pow(u32::try_from(b).ok()?),
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
        })
    }
}

/// Elementwise comparisons with broadcasting; the output is `bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CompareOp {
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
}

impl CompareOp {
    /// Text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            CompareOp::Equal => "equal",
            CompareOp::Less => "less",
            CompareOp::Greater => "greater",
            CompareOp::LessOrEqual => "less_or_equal",
            CompareOp::GreaterOrEqual => "greater_or_equal",
        }
    }

    /// Scalar semantics on any ordered values (IEEE for floats: every
    /// comparison with NaN is false).
    pub fn apply<T: PartialOrd>(&self, a: T, b: T) -> bool {
        match self {
            CompareOp::Equal => a == b,
            CompareOp::Less => a < b,
            CompareOp::Greater => a > b,
            CompareOp::LessOrEqual => a <= b,
            CompareOp::GreaterOrEqual => a >= b,
        }
    }
}

/// Elementwise boolean operations with broadcasting (`bool` in and out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum LogicalOp {
    And,
    Or,
    Xor,
}

impl LogicalOp {
    /// Text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            LogicalOp::And => "and",
            LogicalOp::Or => "or",
            LogicalOp::Xor => "xor",
        }
    }

    /// Scalar semantics.
    pub fn apply(&self, a: bool, b: bool) -> bool {
        match self {
            LogicalOp::And => a && b,
            LogicalOp::Or => a || b,
            LogicalOp::Xor => a != b,
        }
    }
}

/// Reductions over a set of axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl ReduceOp {
    /// Text-format name.
    pub fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
            ReduceOp::Min => "reduce_min",
            ReduceOp::Prod => "reduce_prod",
            ReduceOp::L1 => "reduce_l1",
            ReduceOp::L2 => "reduce_l2",
            ReduceOp::LogSum => "reduce_log_sum",
            ReduceOp::LogSumExp => "reduce_log_sum_exp",
            ReduceOp::SumSquare => "reduce_sum_square",
        }
    }

    /// Every reduction, in text-format order.
    pub const ALL: [ReduceOp; 10] = [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::L1,
        ReduceOp::L2,
        ReduceOp::LogSum,
        ReduceOp::LogSumExp,
        ReduceOp::SumSquare,
    ];

    /// Whether the op is defined on integer inputs too (otherwise float only).
    pub fn accepts_int(&self) -> bool {
        matches!(
            self,
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod
        )
    }
}

/// 2-D convolution attributes (NCHW input, OIHW weights).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Padding `[top, left, bottom, right]`, already resolved from `auto_pad`.
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Number of groups; input and output channels are divisible by it.
    pub group: usize,
}

/// 2-D pooling window attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool2d {
    /// Window size `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Stride along H and W.
    pub strides: [usize; 2],
    /// Padding `[top, left, bottom, right]`; with `ceil_mode` the last
    /// windows may extend past the bottom/right padding.
    pub pads: [usize; 4],
    /// Dilation along H and W.
    pub dilations: [usize; 2],
    /// Output size rounds up instead of down.
    pub ceil_mode: bool,
}

/// One axis of a [`Op::Slice`]: output index `i` reads input index
/// `start + i * step` for `i < len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceAxis {
    /// First input index read.
    pub start: usize,
    /// Step between input indices (non-zero, may be negative).
    pub step: i64,
    /// Number of output elements along this axis.
    pub len: usize,
}

/// An IR operation. Every node produces exactly one value.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Graph input number `index` (position in the graph's input list).
    Input {
        /// Position among graph inputs.
        index: usize,
    },
    /// A constant tensor (initializer or folded value).
    Constant(crate::Tensor),
    /// Elementwise unary op.
    Unary(UnaryOp),
    /// Elementwise binary op with broadcasting.
    Binary(BinaryOp),
    /// Matrix product with numpy semantics (batched, broadcast).
    MatMul,
    /// `alpha * op(A) @ op(B) + beta * C`; 2 or 3 inputs, C unidirectionally
    /// broadcast to the output.
    Gemm {
        /// Scale of the product.
        alpha: f32,
        /// Scale of C.
        beta: f32,
        /// Transpose A.
        trans_a: bool,
        /// Transpose B.
        trans_b: bool,
    },
    /// 2-D convolution: inputs X, W and an optional bias B.
    Conv(Conv2d),
    /// 2-D max pooling.
    MaxPool(Pool2d),
    /// 2-D average pooling.
    AveragePool {
        /// Window.
        pool: Pool2d,
        /// Whether padded positions count in the divisor.
        count_include_pad: bool,
    },
    /// Mean over all spatial positions, keeping dims (N, C, 1, ...).
    GlobalAveragePool,
    /// Maximum over all spatial positions, keeping dims (N, C, 1, ...).
    GlobalMaxPool,
    /// Softmax along one axis.
    Softmax {
        /// The reduced axis (non-negative).
        axis: usize,
    },
    /// Same elements, new shape.
    Reshape {
        /// Output shape.
        shape: Ints,
    },
    /// Axis permutation: output axis `i` is input axis `perm[i]`.
    Transpose {
        /// The permutation.
        perm: Ints,
    },
    /// Concatenation along `axis`.
    Concat {
        /// The axis (non-negative).
        axis: usize,
    },
    /// Gather along `axis` with an index tensor (second input, i32/i64;
    /// negative indices count from the end).
    Gather {
        /// The axis (non-negative).
        axis: usize,
    },
    /// Strided slice; one entry per input axis.
    Slice {
        /// Per-axis start, step and length.
        axes: SmallVec<[SliceAxis; 4]>,
    },
    /// Element type conversion.
    Cast {
        /// Target type.
        to: DType,
    },
    /// Elementwise comparison with broadcasting; two inputs of one element
    /// type, `bool` output.
    Compare(CompareOp),
    /// Elementwise boolean op with broadcasting on `bool` inputs.
    Logical(LogicalOp),
    /// Elementwise boolean negation.
    Not,
    /// `cond ? x : y` elementwise; inputs cond (`bool`), X and Y (one element
    /// type), all three broadcast together.
    Where,
    /// Reduction over `axes` (strictly increasing, possibly empty: then the
    /// op is the identity); reduced axes are kept as size 1 with
    /// `keep_dims`, removed otherwise.
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// The reduced axes, strictly increasing.
        axes: Ints,
        /// Keep reduced axes as size 1.
        keep_dims: bool,
    },
}

impl Op {
    /// Text-format name of the op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Constant(_) => "const",
            Op::Unary(u) => u.name(),
            Op::Binary(b) => b.name(),
            Op::MatMul => "matmul",
            Op::Gemm { .. } => "gemm",
            Op::Conv(_) => "conv",
            Op::MaxPool(_) => "max_pool",
            Op::AveragePool { .. } => "average_pool",
            Op::GlobalAveragePool => "global_average_pool",
            Op::GlobalMaxPool => "global_max_pool",
            Op::Softmax { .. } => "softmax",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Concat { .. } => "concat",
            Op::Gather { .. } => "gather",
            Op::Slice { .. } => "slice",
            Op::Cast { .. } => "cast",
            Op::Compare(c) => c.name(),
            Op::Logical(l) => l.name(),
            Op::Not => "not",
            Op::Where => "where",
            Op::Reduce { op, .. } => op.name(),
        }
    }

    /// The number of inputs the op takes, as an inclusive range.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input { .. } | Op::Constant(_) => (0, 0),
            Op::Binary(_) | Op::MatMul | Op::Gather { .. } | Op::Compare(_) | Op::Logical(_) => {
                (2, 2)
            }
            Op::Where => (3, 3),
            Op::Gemm { .. } | Op::Conv(_) => (2, 3),
            Op::Concat { .. } => (1, usize::MAX),
            _ => (1, 1),
        }
    }
}
