//! The operation set of the IR.
//!
//! One enum variant per operation, with typed attributes. The frontend
//! resolves everything ONNX leaves to run time but Kiln knows at compile
//! time (auto_pad, Reshape targets, Slice bounds, Clip limits given as
//! inputs, Shape results), so every attribute here is concrete.

use crate::vocab::{op_family, op_table};
use crate::DType;
use smallvec::SmallVec;

/// A list of small integers (axes, pads, strides).
pub type Ints = SmallVec<[usize; 4]>;

op_family! {
    /// Elementwise operations with one input and one output of the same shape.
    #[derive(Clone, Copy, Debug, PartialEq)]
    #[allow(missing_docs)]
    pub enum UnaryOp {
        Relu => "relu",
        LeakyRelu { alpha: f32 = 0.01 } => "leaky_relu",
        Sigmoid => "sigmoid",
        Tanh => "tanh",
        HardSigmoid { alpha: f32 = 0.2, beta: f32 = 0.5 } => "hard_sigmoid",
        HardSwish => "hard_swish",
        Clip { min: f32 = f32::NEG_INFINITY, max: f32 = f32::INFINITY } => "clip",
        Neg => "neg",
        Abs => "abs",
        Sqrt => "sqrt",
        Exp => "exp",
        Log => "log",
        Reciprocal => "reciprocal",
        Floor => "floor",
        Ceil => "ceil",
        /// Round half to even.
        Round => "round",
        /// -1, 0 or 1 (NaN stays NaN).
        Sign => "sign",
        Erf => "erf",
        /// GELU: `x/2 · (1 + erf(x/√2))`, or its tanh approximation.
        Gelu { tanh: bool = false } => "gelu",
        Elu { alpha: f32 = 1.0 } => "elu",
        Selu { alpha: f32 = 1.673_263_2, gamma: f32 = 1.050_701 } => "selu",
        Celu { alpha: f32 = 1.0 } => "celu",
        Softplus => "softplus",
        Softsign => "softsign",
        /// `x · tanh(softplus(x))`.
        Mish => "mish",
        ThresholdedRelu { alpha: f32 = 1.0 } => "thresholded_relu",
        /// `x - bias` above `lambd`, `x + bias` below `-lambd`, else 0.
        Shrink { bias: f32 = 0.0, lambd: f32 = 0.5 } => "shrink",
        Sin => "sin",
        Cos => "cos",
        Tan => "tan",
        Asin => "asin",
        Acos => "acos",
        Atan => "atan",
        Sinh => "sinh",
        Cosh => "cosh",
        Asinh => "asinh",
        Acosh => "acosh",
        Atanh => "atanh",
    }
}

impl UnaryOp {
    /// Whether the op is defined on integer inputs too (otherwise float only).
    pub fn accepts_int(&self) -> bool {
        matches!(
            self,
            UnaryOp::Relu | UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Clip { .. } | UnaryOp::Sign
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
            UnaryOp::Round => x.round_ties_even(),
            UnaryOp::Sign => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }
            }
            UnaryOp::Erf => erf(x),
            UnaryOp::Gelu { tanh: false } => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
            UnaryOp::Gelu { tanh: true } => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (k * (x + 0.044_715 * x * x * x)).tanh())
            }
            UnaryOp::Elu { alpha } => {
                if x < 0.0 {
                    alpha as f64 * x.exp_m1()
                } else {
                    x
                }
            }
            UnaryOp::Selu { alpha, gamma } => {
                let y = if x <= 0.0 {
                    alpha as f64 * x.exp_m1()
                } else {
                    x
                };
                gamma as f64 * y
            }
            UnaryOp::Celu { alpha } => {
                let a = alpha as f64;
                x.max(0.0) + (a * (x / a).exp_m1()).min(0.0)
            }
            UnaryOp::Softplus => softplus(x),
            UnaryOp::Softsign => x / (1.0 + x.abs()),
            UnaryOp::Mish => x * softplus(x).tanh(),
            UnaryOp::ThresholdedRelu { alpha } => {
                if x > alpha as f64 {
                    x
                } else {
                    0.0
                }
            }
            UnaryOp::Shrink { bias, lambd } => {
                if x < -(lambd as f64) {
                    x + bias as f64
                } else if x > lambd as f64 {
                    x - bias as f64
                } else {
                    0.0
                }
            }
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Tan => x.tan(),
            UnaryOp::Asin => x.asin(),
            UnaryOp::Acos => x.acos(),
            UnaryOp::Atan => x.atan(),
            UnaryOp::Sinh => x.sinh(),
            UnaryOp::Cosh => x.cosh(),
            UnaryOp::Asinh => x.asinh(),
            UnaryOp::Acosh => x.acosh(),
            UnaryOp::Atanh => x.atanh(),
        }
    }
}

/// `ln(1 + e^x)` without overflow for large `x`.
fn softplus(x: f64) -> f64 {
    if x > 30.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The error function, to double precision (W. J. Cody's rational
/// approximations, as in most libm implementations), so that the reference
/// evaluator is more exact than any target's f32 kernel.
#[allow(clippy::excessive_precision)] // the published coefficients, digit for digit
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let ax = x.abs();
    let r = if ax < 0.468_75 {
        const P: [f64; 5] = [
            3.209_377_589_138_469_4e3,
            3.774_852_376_853_020_2e2,
            1.138_641_541_510_501_6e2,
            3.161_123_743_870_565_6,
            1.857_777_061_846_031_5e-1,
        ];
        const Q: [f64; 5] = [
            2.844_236_833_439_170_6e3,
            1.282_616_526_077_372_3e3,
            2.440_246_379_344_441_7e2,
            2.360_129_095_234_412_1e1,
            1.0,
        ];
        let z = x * x;
        let num = P.iter().rev().fold(0.0, |acc, &c| acc * z + c);
        let den = Q.iter().rev().fold(0.0, |acc, &c| acc * z + c);
        return x * num / den;
    } else if ax < 4.0 {
        const P: [f64; 9] = [
            1.230_339_354_797_997_2e3,
            2.051_078_377_826_071_5e3,
            1.712_047_612_634_070_6e3,
            8.819_522_212_417_691e2,
            2.986_351_381_974_001_3e2,
            6.611_919_063_714_163e1,
            8.883_149_794_388_376,
            5.641_884_969_886_701e-1,
            2.153_115_354_744_038_3e-8,
        ];
        const Q: [f64; 9] = [
            1.230_339_354_803_749_4e3,
            3.439_367_674_143_721_6e3,
            4.362_619_090_143_247e3,
            3.290_799_235_733_459_7e3,
            1.621_389_574_566_690_3e3,
            5.371_811_018_620_098_6e2,
            1.176_939_508_913_125e2,
            1.574_492_611_070_983_5e1,
            1.0,
        ];
        let num = P.iter().rev().fold(0.0, |acc, &c| acc * ax + c);
        let den = Q.iter().rev().fold(0.0, |acc, &c| acc * ax + c);
        1.0 - (-ax * ax).exp() * num / den
    } else if ax < 27.0 {
        const P: [f64; 6] = [
            -6.587_491_615_298_378e-4,
            -1.608_378_514_874_227_5e-2,
            -1.257_817_261_112_292_6e-1,
            -3.603_448_999_498_044_4e-1,
            -3.053_266_349_612_323_4e-1,
            -1.631_538_713_730_709_6e-2,
        ];
        const Q: [f64; 6] = [
            2.335_204_976_268_691_8e-3,
            6.051_834_131_244_132e-2,
            5.279_051_029_514_284e-1,
            1.872_952_849_923_460_4,
            2.568_520_192_289_822,
            1.0,
        ];
        let z = 1.0 / (ax * ax);
        let num = P.iter().rev().fold(0.0, |acc, &c| acc * z + c);
        let den = Q.iter().rev().fold(0.0, |acc, &c| acc * z + c);
        let frac = (1.0 / std::f64::consts::PI.sqrt() + z * num / den) / ax;
        1.0 - (-ax * ax).exp() * frac
    } else {
        1.0
    };
    r.copysign(x)
}

#[cfg(test)]
mod erf_tests {
    #[test]
    fn erf_matches_known_values() {
        // Values from Python's math.erf.
        let cases = [
            (0.1, 0.112_462_916_018_284_9),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
            (5.0, 0.999_999_999_998_462_5),
        ];
        for (x, want) in cases {
            assert!((super::erf(x) - want).abs() < 1e-14, "erf({x})");
            assert!((super::erf(-x) + want).abs() < 1e-14, "erf(-{x})");
        }
        assert_eq!(super::erf(0.0), 0.0);
    }
}

op_family! {
    /// Elementwise operations with two inputs, numpy-style broadcasting.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(missing_docs)]
    pub enum BinaryOp {
        Add => "add",
        Sub => "sub",
        Mul => "mul",
        Div => "div",
        Pow => "pow",
        Max => "max",
        Min => "min",
        /// Integer remainder with the sign of the divisor (ONNX `Mod`, fmod=0).
        Mod => "mod",
        /// Remainder with the sign of the dividend (C `fmod`; ONNX `Mod`, fmod=1).
        Fmod => "fmod",
        /// `a < 0 ? a * b : a` (ONNX `PRelu`, slope `b`).
        PRelu => "prelu",
    }
}

impl BinaryOp {
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
            BinaryOp::Fmod => a % b,
            BinaryOp::Mod => {
                let r = a % b;
                if r != 0.0 && (r < 0.0) != (b < 0.0) {
                    r + b
                } else {
                    r
                }
            }
            BinaryOp::PRelu => {
                if a < 0.0 {
                    a * b
                } else {
                    a
                }
            }
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
            BinaryOp::Fmod => a.checked_rem(b)?,
            BinaryOp::Mod => {
                let r = a.checked_rem(b)?;
                if r != 0 && (r < 0) != (b < 0) {
                    r + b
                } else {
                    r
                }
            }
            BinaryOp::PRelu => {
                if a < 0 {
                    a.wrapping_mul(b)
                } else {
                    a
                }
            }
        })
    }

    /// Scalar unsigned integer semantics, on values zero-extended to u64
    /// (wrapping; a division or remainder by zero is `None`; `Mod` and
    /// `Fmod` agree, and `PRelu` is the identity, nothing being negative).
    pub fn apply_u64(&self, a: u64, b: u64) -> Option<u64> {
        Some(match self {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => a.checked_div(b)?,
            BinaryOp::Pow => a.wrapping_pow(u32::try_from(b).ok()?),
            BinaryOp::Max => a.max(b),
            BinaryOp::Min => a.min(b),
            BinaryOp::Fmod | BinaryOp::Mod => a.checked_rem(b)?,
            BinaryOp::PRelu => a,
        })
    }
}

op_family! {
    /// Elementwise comparisons with broadcasting; the output is `bool`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(missing_docs)]
    pub enum CompareOp {
        Equal => "equal",
        Less => "less",
        Greater => "greater",
        LessOrEqual => "less_or_equal",
        GreaterOrEqual => "greater_or_equal",
    }
}

impl CompareOp {
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

op_family! {
    /// Elementwise boolean operations with broadcasting (`bool` in and out).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(missing_docs)]
    pub enum LogicalOp {
        And => "and",
        Or => "or",
        Xor => "xor",
    }
}

impl LogicalOp {
    /// Scalar semantics.
    pub fn apply(&self, a: bool, b: bool) -> bool {
        match self {
            LogicalOp::And => a && b,
            LogicalOp::Or => a || b,
            LogicalOp::Xor => a != b,
        }
    }
}

op_family! {
    /// Bitwise operations on integers with numpy broadcasting (same type in
    /// and out, every integer type). Shifts follow numpy's `left_shift` /
    /// `right_shift` (the ONNX `BitShift` reference): bits shifted out are
    /// dropped, a right shift of a signed value is arithmetic, and an amount
    /// out of range (negative, or the bit width or more) gives 0, or -1 for a
    /// right shift of a negative value.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(missing_docs)]
    pub enum BitwiseOp {
        And => "bitwise_and",
        Or => "bitwise_or",
        Xor => "bitwise_xor",
        ShiftLeft => "shift_left",
        ShiftRight => "shift_right",
    }
}

impl BitwiseOp {
    /// Whether the op is a shift.
    pub fn is_shift(&self) -> bool {
        matches!(self, BitwiseOp::ShiftLeft | BitwiseOp::ShiftRight)
    }

    /// Scalar semantics on `bits`-wide values extended to 64 bits (sign-
    /// extended when `signed`, else zero-extended); the caller truncates
    /// the result to the type. A negative amount, extended, is at least
    /// 2^63 as a u64, so one unsigned test finds every amount out of range.
    pub fn apply(&self, a: u64, b: u64, bits: u32, signed: bool) -> u64 {
        let in_range = b < bits as u64;
        match self {
            BitwiseOp::And => a & b,
            BitwiseOp::Or => a | b,
            BitwiseOp::Xor => a ^ b,
            BitwiseOp::ShiftLeft if in_range => a << b,
            BitwiseOp::ShiftRight if in_range && signed => ((a as i64) >> b) as u64,
            BitwiseOp::ShiftRight if in_range => a >> b,
            BitwiseOp::ShiftRight if signed => ((a as i64) >> 63) as u64,
            BitwiseOp::ShiftLeft | BitwiseOp::ShiftRight => 0,
        }
    }
}

op_family! {
    /// Reductions over a set of axes (their attributes, `axes` and
    /// `keep_dims`, are [`Op::Reduce`]'s).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[allow(missing_docs)]
    pub enum ReduceOp {
        Sum => "reduce_sum",
        Mean => "reduce_mean",
        Max => "reduce_max",
        Min => "reduce_min",
        Prod => "reduce_prod",
        L1 => "reduce_l1",
        L2 => "reduce_l2",
        LogSum => "reduce_log_sum",
        LogSumExp => "reduce_log_sum_exp",
        SumSquare => "reduce_sum_square",
    }
}

impl ReduceOp {
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

/// How [`Op::Resize`] interpolates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ResizeMode {
    /// The nearest input sample, ties broken by the rounding rule.
    Nearest(NearestRounding),
    /// Linear along each resized axis (bilinear on two axes).
    Linear,
    /// Cubic convolution with coefficient `a` (ONNX's default is -0.75),
    /// optionally ignoring samples outside the input and renormalizing the
    /// weights.
    Cubic {
        /// The cubic coefficient.
        a: f32,
        /// Whether taps outside the input get weight 0 (weights renormalized).
        exclude_outside: bool,
    },
}

/// How a nearest-neighbour [`Op::Resize`] rounds a fractional source
/// coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum NearestRounding {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

impl NearestRounding {
    /// Every rounding rule.
    pub const ALL: [NearestRounding; 4] = [
        NearestRounding::RoundPreferFloor,
        NearestRounding::RoundPreferCeil,
        NearestRounding::Floor,
        NearestRounding::Ceil,
    ];

    /// The ONNX (and text-format) name.
    pub fn name(&self) -> &'static str {
        match self {
            NearestRounding::RoundPreferFloor => "round_prefer_floor",
            NearestRounding::RoundPreferCeil => "round_prefer_ceil",
            NearestRounding::Floor => "floor",
            NearestRounding::Ceil => "ceil",
        }
    }
}

/// How [`Op::Resize`] maps an output coordinate to an input coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum CoordinateTransform {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    /// TensorFlow's crop-and-resize: the output spans the region of
    /// interest [`Resize::roi`] of each axis, corners aligned; outputs
    /// whose source lies outside the input read the edge here (the ONNX
    /// frontend replaces them by the extrapolation value).
    TfCropAndResize,
}

impl CoordinateTransform {
    /// Every transform.
    pub const ALL: [CoordinateTransform; 6] = [
        CoordinateTransform::HalfPixel,
        CoordinateTransform::HalfPixelSymmetric,
        CoordinateTransform::PytorchHalfPixel,
        CoordinateTransform::AlignCorners,
        CoordinateTransform::Asymmetric,
        CoordinateTransform::TfCropAndResize,
    ];

    /// The ONNX (and text-format) name.
    pub fn name(&self) -> &'static str {
        match self {
            CoordinateTransform::HalfPixel => "half_pixel",
            CoordinateTransform::HalfPixelSymmetric => "half_pixel_symmetric",
            CoordinateTransform::PytorchHalfPixel => "pytorch_half_pixel",
            CoordinateTransform::AlignCorners => "align_corners",
            CoordinateTransform::Asymmetric => "asymmetric",
            CoordinateTransform::TfCropAndResize => "tf_crop_and_resize",
        }
    }
}

/// Attributes of [`Op::Resize`]: the output shape and, per axis, the scale
/// the coordinate transform uses (given, or output/input size).
#[derive(Clone, Debug, PartialEq)]
pub struct Resize {
    /// The output shape.
    pub shape: Ints,
    /// Per-axis scale (output/input) as the coordinate transform uses it.
    pub scales: SmallVec<[f32; 4]>,
    /// Interpolation.
    pub mode: ResizeMode,
    /// Coordinate transform.
    pub coord: CoordinateTransform,
    /// When downsampling with Linear or Cubic, widen the filter by the
    /// inverse scale (ONNX `antialias=1`): every input sample under the
    /// stretched kernel contributes, weights normalized to sum 1.
    pub antialias: bool,
    /// Per axis, the region of interest `[start, end]` (fractions of the
    /// input) of [`CoordinateTransform::TfCropAndResize`]; empty for the
    /// other transforms (type inference checks both).
    pub roi: SmallVec<[[f32; 2]; 4]>,
}

/// Attributes of [`Op::Col2Im`]: input `[N, C·kh·kw, gh·gw]` holds, for
/// every position `(iy, ix)` of a `gh × gw` grid, one `kh × kw` block per
/// channel; block element `(ky, kx)` adds into output pixel
/// `(iy·sy - pad_top + ky·dy, ix·sx - pad_left + kx·dx)` of `[N, C, oh, ow]`
/// (dropped when outside). ConvTranspose is a MatMul followed by this op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Col2Im {
    /// The block grid `[gh, gw]`.
    pub grid: [usize; 2],
    /// The output image `[oh, ow]`.
    pub image: [usize; 2],
    /// The block `[kh, kw]`.
    pub block: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Padding before, `[top, left]` (padding after only drops pixels).
    pub pads: [usize; 2],
}

impl Col2Im {
    /// Whether every output pixel is exactly one block element: blocks
    /// as large as the strides, undilated, unpadded, and the grid covering
    /// the image (a ConvTranspose whose kernel equals its stride).
    pub fn tiles_exactly(&self) -> bool {
        self.block == self.strides
            && self.dilations == [1, 1]
            && self.pads == [0, 0]
            && (0..2).all(|a| self.grid[a] * self.strides[a] == self.image[a])
    }
}

/// One output position of a resized axis: the input indices it reads and
/// their weights (which sum to 1).
pub type ResizeTaps = SmallVec<[(usize, f32); 4]>;

impl Resize {
    /// The taps of `axis` as [`Resize::taps`] gives them, or `None` when
    /// the axis is not resampled (same length, every output index reading
    /// its own input index), so that kernels can skip it.
    pub fn resampled_taps(&self, axis: usize, in_len: usize) -> Option<Vec<ResizeTaps>> {
        let taps = self.taps(axis, in_len);
        let identity = in_len == self.shape[axis]
            && taps
                .iter()
                .enumerate()
                .all(|(j, t)| t.iter().all(|&(i, w)| i == j || w == 0.0));
        (!identity).then_some(taps)
    }

    /// For `tf_crop_and_resize`, per output index along `axis`, whether its
    /// source lies outside the input (the extrapolated outputs); all false
    /// for the other transforms.
    pub fn outside_roi(&self, axis: usize, in_len: usize) -> Vec<bool> {
        let out_len = self.shape[axis];
        let scale = self.scales[axis] as f64;
        (0..out_len)
            .map(|o| {
                self.coord == CoordinateTransform::TfCropAndResize && {
                    let x = self.source_coordinate(axis, o, in_len, out_len, scale);
                    x < 0.0 || x > in_len as f64 - 1.0
                }
            })
            .collect()
    }

    /// For each output index along `axis` (input length `in_len`), the input
    /// indices and weights that make it. Out-of-range taps are clamped to the
    /// edge (or dropped with `exclude_outside`), as in the ONNX reference.
    /// Targets and the reference evaluator share these tables, so they agree
    /// on every rounding decision.
    pub fn taps(&self, axis: usize, in_len: usize) -> Vec<ResizeTaps> {
        let out_len = self.shape[axis];
        let scale = self.scales[axis] as f64;
        let clamp = |i: i64| i.clamp(0, in_len as i64 - 1) as usize;
        (0..out_len)
            .map(|o| {
                let x = self.source_coordinate(axis, o, in_len, out_len, scale);
                let f = x.floor();
                let base = f as i64;
                let frac = x - f;
                let mut taps = ResizeTaps::new();
                let widened = self.antialias && scale < 1.0;
                match self.mode {
                    ResizeMode::Linear | ResizeMode::Cubic { .. } if widened => {
                        self.antialias_taps(x, in_len, scale, &mut taps);
                    }
                    ResizeMode::Nearest(rounding) => {
                        let up = frac != 0.0
                            && match rounding {
                                NearestRounding::RoundPreferFloor => frac > 0.5,
                                NearestRounding::RoundPreferCeil => frac >= 0.5,
                                NearestRounding::Floor => false,
                                NearestRounding::Ceil => true,
                            };
                        taps.push((clamp(base + i64::from(up)), 1.0));
                    }
                    ResizeMode::Linear => {
                        taps.push((clamp(base), (1.0 - frac) as f32));
                        taps.push((clamp(base + 1), frac as f32));
                    }
                    ResizeMode::Cubic { a, exclude_outside } => {
                        let a = a as f64;
                        let near = |d: f64| ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0;
                        let far = |d: f64| ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a;
                        let w = [
                            far(frac + 1.0),
                            near(frac),
                            near(1.0 - frac),
                            far(2.0 - frac),
                        ];
                        let idx = [base - 1, base, base + 1, base + 2];
                        let inside = |i: i64| (0..in_len as i64).contains(&i);
                        let total: f64 = if exclude_outside {
                            (0..4).filter(|&k| inside(idx[k])).map(|k| w[k]).sum()
                        } else {
                            1.0
                        };
                        for k in 0..4 {
                            if exclude_outside && !inside(idx[k]) {
                                continue;
                            }
                            taps.push((clamp(idx[k]), (w[k] / total) as f32));
                        }
                    }
                }
                taps
            })
            .collect()
    }

    /// The taps of source coordinate `x` for an antialiased downsample by
    /// `scale` < 1, as the ONNX reference computes them: the kernel (the
    /// triangle, or the cubic with coefficient `a`) evaluated at
    /// `scale · (i − x)` for the input indices `i` within its stretched
    /// support (`2 / scale` or `4 / scale` of them, `x`'s integer part
    /// counted below it when `x` is whole), normalized to sum 1; indices
    /// past the edge read the edge (or are dropped with `exclude_outside`,
    /// the rest renormalized).
    fn antialias_taps(&self, x: f64, in_len: usize, scale: f64, taps: &mut ResizeTaps) {
        let (reach, kernel): (f64, Box<dyn Fn(f64) -> f64>) = match self.mode {
            ResizeMode::Cubic { a, .. } => {
                let a = a as f64;
                (
                    2.0,
                    Box::new(move |d: f64| {
                        let d = d.abs();
                        if d <= 1.0 {
                            ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
                        } else if d < 2.0 {
                            ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
                        } else {
                            0.0
                        }
                    }),
                )
            }
            _ => (1.0, Box::new(|d: f64| (1.0 - d.abs()).clamp(0.0, 1.0))),
        };
        let exclude_outside = matches!(
            self.mode,
            ResizeMode::Cubic {
                exclude_outside: true,
                ..
            }
        );
        // The reference's ratio is in (0, 1]: a whole x counts as the
        // index below plus 1.
        let below = if x.fract() == 0.0 { x - 1.0 } else { x.floor() };
        let ratio = x - below;
        let start = (-reach / scale).floor() as i64 + 1;
        let end = 2 - start;
        let inside = |i: i64| (0..in_len as i64).contains(&i);
        let weights: Vec<(i64, f64)> = (start..end)
            .map(|k| (below as i64 + k, kernel(scale * (k as f64 - ratio))))
            .filter(|&(i, _)| !exclude_outside || inside(i))
            .collect();
        let total: f64 = weights.iter().map(|&(_, w)| w).sum();
        for (i, w) in weights {
            taps.push((i.clamp(0, in_len as i64 - 1) as usize, (w / total) as f32));
        }
    }

    /// The source coordinate of output index `o` along `axis`; for
    /// `tf_crop_and_resize` it may lie outside `[0, in_len − 1]` (see
    /// [`Resize::outside_roi`]).
    pub fn source_coordinate(
        &self,
        axis: usize,
        o: usize,
        in_len: usize,
        out_len: usize,
        scale: f64,
    ) -> f64 {
        let o = o as f64;
        match self.coord {
            // As the ONNX reference: over the unrounded resized length.
            CoordinateTransform::TfCropAndResize => {
                let [start, end] = self.roi.get(axis).copied().unwrap_or([0.0, 1.0]);
                let (start, end) = (start as f64, end as f64);
                let last = in_len as f64 - 1.0;
                let resized = scale * in_len as f64;
                let span = if resized == 1.0 {
                    (end - start) * last / 2.0
                } else {
                    o * (end - start) * last / (resized - 1.0)
                };
                span + start * last
            }
            CoordinateTransform::HalfPixel => (o + 0.5) / scale - 0.5,
            CoordinateTransform::HalfPixelSymmetric => {
                let adjustment = out_len as f64 / (scale * in_len as f64);
                let offset = in_len as f64 / 2.0 * (1.0 - adjustment);
                offset + (o + 0.5) / scale - 0.5
            }
            CoordinateTransform::PytorchHalfPixel => {
                if out_len > 1 {
                    (o + 0.5) / scale - 0.5
                } else {
                    0.0
                }
            }
            // The ONNX reference divides by the unrounded resized length
            // (`scale * in_len`), which differs from `out_len` when a
            // scale does not land on a whole size.
            CoordinateTransform::AlignCorners => {
                let resized = scale * in_len as f64;
                if out_len > 1 && resized != 1.0 {
                    o * (in_len as f64 - 1.0) / (resized - 1.0)
                } else {
                    0.0
                }
            }
            CoordinateTransform::Asymmetric => o / scale,
        }
    }
}

/// `NonMaxSuppression`'s attributes (`kiln_host::Nms` is the algorithm);
/// the cap and thresholds are its inputs 2 to 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nms {
    /// Boxes as `[x_center, y_center, width, height]` (else two opposite
    /// corners `[y1, x1, y2, x2]`).
    pub center_point_box: bool,
    /// The most boxes any run selects per batch and class (the planned
    /// bound): the model's cap where it is a constant, else every box.
    pub cap: usize,
    /// Whether input 4 is a score threshold (else every box is a
    /// candidate).
    pub has_score_threshold: bool,
}

impl Nms {
    /// The algorithm at the sizes of boxes `[batches, boxes, 4]` and
    /// scores `[batches, classes, boxes]` and a run's cap and thresholds.
    pub fn at(
        &self,
        [batches, classes, boxes]: [usize; 3],
        max_per_class: i64,
        iou_threshold: f32,
        score_threshold: f32,
    ) -> kiln_host::Nms {
        kiln_host::Nms {
            batches,
            classes,
            boxes,
            cap: self.cap,
            max_per_class,
            center_point_box: self.center_point_box,
            iou_threshold,
            score_threshold: self.has_score_threshold.then_some(score_threshold),
        }
    }
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
    /// Integer matrix product `(A - a_zero) @ (B - b_zero)` with numpy
    /// semantics, accumulated exactly in i32 (ONNX `MatMulInteger`):
    /// inputs A and B (`u8` or `i8`, each with its own type), A's zero
    /// point (a scalar of A's type) and B's (a scalar or one per column of
    /// B, of B's type); `i32` out.
    MatMulInteger,
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
    /// Integer 2-D convolution `conv(X - x_zero, W - w_zero)`, exact in
    /// i32 (ONNX `ConvInteger`): inputs X and W (`u8` or `i8`, each with
    /// its own type), X's zero point (a scalar of X's type; padding holds
    /// it, so padded positions add 0) and W's (a scalar or one per output
    /// channel, of W's type); `i32` out.
    ConvInteger(Conv2d),
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
    /// Scaled dot-product attention, `softmax(scale · (Q @ Kt) + mask) @ V`
    /// with the softmax over the last axis: inputs Q `[..., M, K]`, Kt
    /// `[..., K, N]` (the keys already transposed), V `[..., N, D]` (all
    /// with the same batch dims) and optionally an additive mask that
    /// broadcasts to `[..., M, N]`; output `[..., M, D]`. All f32. The
    /// `recognize` pass builds it from the decomposed form; a target runs
    /// it as one kernel that keeps the `M × N` scores of one head in
    /// scratch.
    Attention {
        /// The factor of the scores.
        scale: f32,
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
    /// The same bytes read as another element type of the same size
    /// (ONNX `BitCast`); never to `bool` from another type, whose bytes
    /// could be other than 0 and 1.
    Bitcast {
        /// Target type.
        to: DType,
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
    /// Elementwise bitwise op on integers with broadcasting; two inputs of
    /// one integer type, same type out.
    Bitwise(BitwiseOp),
    /// Elementwise bitwise complement of an integer input.
    BitwiseNot,
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
    /// numpy broadcast of the input to `shape` (the input broadcasts to it
    /// exactly).
    Expand {
        /// The output shape.
        shape: Ints,
    },
    /// Layer normalization over the axes from `axis` on: inputs X, Scale and
    /// an optional Bias (both broadcast to the normalized axes).
    LayerNorm {
        /// The first normalized axis (non-negative).
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
    },
    /// Resampling of every axis to a new size.
    Resize(Resize),
    /// Scatter-add of image blocks back into an image.
    Col2Im(Col2Im),
    /// A fused kernel: optional dense head, then an elementwise program
    /// (built by the `fuse` pass).
    Fused(Box<crate::fused::FusedKernel>),
    /// The coordinates of the input's non-zero elements (ONNX `NonZero`),
    /// at their bound: `i64 [rank, n]` for an input of `n` elements, one
    /// column per non-zero element in row-major order, then columns of
    /// zeros. How many columns are real is data: the importer wraps it in
    /// a [`Op::WithLength`] of the count.
    NonZero,
    /// The first input, of which only the first `length` positions along
    /// `axis` are real (`length`: the second input, an `i64` scalar
    /// computed at run time, at most the axis's size). It marks a value
    /// whose size depends on data, computed at its bound (`NonZero`,
    /// `TopK` of a run-time k): the driver traces it to the outputs, which
    /// a run cuts to the length, and removes the marker before any pass
    /// (`docs/bounded.md`).
    WithLength {
        /// The axis of data-dependent length (non-negative).
        axis: usize,
    },
    /// ONNX `NonMaxSuppression` of boxes `f32 [B, N, 4]`, scores
    /// `f32 [B, C, N]` and the scalars `max_output_boxes_per_class` (i64),
    /// `iou_threshold` and `score_threshold` (f32), at its bound:
    /// `i64 [bound + 1, 3]`, the selected
    /// `(batch, class, box)` rows, zero rows up to the bound
    /// (`B·C·min(N, cap)`), then one row holding the count three
    /// times. The importer slices the rows and marks them with the count
    /// ([`Op::WithLength`]); one kernel computes both.
    NonMaxSuppression(Nms),
    /// ONNX `Unique`'s plan over the slices of keys `[outer, n, inner]`
    /// (f64 or i64; `kiln_host::Unique`): `i64 [3n + 1]`, each unique
    /// slice's first index (zeros past the unique count), each slice's
    /// unique slot, each unique slice's count (zeros past), then the
    /// count. The importer gathers Y by the first indices and marks the
    /// parts with the count.
    Unique {
        /// Ascending order (else first occurrence).
        sorted: bool,
    },
}

impl Op {
    /// Whether the op computes an integer product: `matmul_integer`,
    /// `conv_integer`, or a fused kernel headed by one (an int8 layer).
    pub fn is_integer_product(&self) -> bool {
        match self {
            Op::MatMulInteger | Op::ConvInteger(_) => true,
            Op::Fused(k) => k.head().is_some_and(|h| h.op.is_integer()),
            _ => false,
        }
    }

    /// The number of inputs the op takes, as an inclusive range.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input { .. } | Op::Constant(_) => (0, 0),
            Op::Binary(_)
            | Op::MatMul
            | Op::Gather { .. }
            | Op::Compare(_)
            | Op::Logical(_)
            | Op::Bitwise(_)
            | Op::WithLength { .. } => (2, 2),
            Op::NonMaxSuppression(_) => (5, 5),
            Op::Where => (3, 3),
            Op::Attention { .. } => (3, 4),
            Op::MatMulInteger | Op::ConvInteger(_) => (4, 4),
            Op::Gemm { .. } | Op::Conv(_) | Op::LayerNorm { .. } => (2, 3),
            Op::Concat { .. } => (1, usize::MAX),
            Op::Fused(k) => (k.num_inputs(), k.num_inputs()),
            _ => (1, 1),
        }
    }
}

op_table! {
    families {
        Unary.0: UnaryOp [],
        Binary.0: BinaryOp [],
        Compare.0: CompareOp [],
        Logical.0: LogicalOp [],
        Bitwise.0: BitwiseOp [],
        Reduce.op: ReduceOp [axes, keep_dims],
    }
    ops {
        Input => "input" [index],
        Constant => "const" [],
        MatMul => "matmul" [],
        MatMulInteger => "matmul_integer" [],
        Gemm => "gemm" [alpha, beta, trans_a, trans_b],
        Conv => "conv" [strides, pads, dilations, group],
        ConvInteger => "conv_integer" [strides, pads, dilations, group],
        MaxPool => "max_pool" [kernel, strides, pads, dilations, ceil_mode],
        AveragePool => "average_pool" [kernel, strides, pads, dilations, ceil_mode, count_include_pad],
        GlobalAveragePool => "global_average_pool" [],
        GlobalMaxPool => "global_max_pool" [],
        Softmax => "softmax" [axis],
        Attention => "attention" [scale],
        Reshape => "reshape" [shape],
        Transpose => "transpose" [perm],
        Concat => "concat" [axis],
        Gather => "gather" [axis],
        Slice => "slice" [axes],
        Cast => "cast" [to],
        Bitcast => "bitcast" [to],
        Not => "not" [],
        BitwiseNot => "bitwise_not" [],
        Where => "where" [],
        Expand => "expand" [shape],
        LayerNorm => "layer_norm" [axis, epsilon],
        Resize => "resize" [shape, scales, coord, mode, nearest, cubic_a, exclude_outside],
        Col2Im => "col2im" [grid, image, block, strides, dilations, pads],
        NonZero => "non_zero" [],
        WithLength => "with_length" [axis],
        NonMaxSuppression => "non_max_suppression" [center_point_box, cap, has_score_threshold],
        Unique => "unique" [sorted],
        Fused => "fused" [head, head_inputs, store, body, alpha, beta, trans_a, trans_b, strides, pads, dilations, group],
    }
}
