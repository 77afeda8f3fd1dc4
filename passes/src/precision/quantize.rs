//! int8 quantization of one dense op, for `assign-precision`'s
//! [`Precision::Int8`](crate::Precision::Int8) (`docs/precision.md`).
//!
//! `Y = X @ W` (MatMul, or Gemm without a transposed A) becomes
//!
//! ```text
//! q      = u8(clip(round(X / s) + z, 0, 255))        activation, per tensor
//! Wq     = i8(round(W / w[j]))                        weights, per column
//! Y      = f32(matmul_integer(q, Wq, z, 0)) * (s * w[j])
//! ```
//!
//! - **Weights**: symmetric per output column, `w[j] = max_k |W[k, j]| /
//!   127`, so their zero point is 0 and the CPU target runs the product on
//!   its VNNI kernel (`vpdpbusd` takes u8 × i8).
//! - **Activations**: per tensor, of one of two [`ActivationType`]s
//!   (`--activation-type`). `uint8` (the default): asymmetric over
//!   `[min(lo, 0), max(hi, 0)]` (0 stays exact), `s = (hi - lo) / 255`,
//!   `z = round(-lo / s)`. `int8`: symmetric, `s = max(|lo|, |hi|) / 127`,
//!   levels −127..127; the kernels take it as u8 with the zero point fixed
//!   at 128 (`q_u8 = q_s8 + 128`, exactly), so it runs on the same VNNI
//!   kernel (`vpdpbusd` multiplies u8 by i8) and the same fused store, as
//!   onnxruntime's x86 kernels shift s8 activations.
//!   The activation is divided by `s`, as ONNX `QuantizeLinear` does: a
//!   multiplication by `1/s` would save the store loop a `vdivps` but moves
//!   values on rounding midpoints by one step, which on PP-OCRv4 rec turned
//!   two more near-tie time steps (156 of 160 argmaxes agreeing with fp32
//!   instead of 158; `tests/tests/precision.rs`).
//!   With a calibrated range ([`ActivationRange::Static`]) `s` and `z` are
//!   constants; without one ([`ActivationRange::Dynamic`]) they are computed
//!   from each run's tensor as ONNX `DynamicQuantizeLinear` does.
//! - Gemm's `alpha` and `beta * C` are applied after the rescale in f32.
//!
//! An ungrouped Conv becomes `conv_integer(q, Wq, z, 0)` the same way, its
//! weights symmetric per output channel, rescaled by `s * w[oc]` per
//! channel, then its bias added in f32.
//!
//! The node that produces `Y` keeps the original node's name, so the
//! accuracy report, the plan file and `--max-rel-error` see the quantized
//! layer as the same layer.

use kiln_ir::{
    BinaryOp, CompareOp, Conv2d, DType, Data, Graph, IrError, NodeId, Op, ReduceOp, Tensor, UnaryOp,
};

/// How an activation's quantization range is known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ActivationRange {
    /// Computed at run time from the tensor (dynamic quantization).
    Dynamic,
    /// Observed on calibration data: the smallest and largest value.
    Static {
        /// Smallest observed value.
        lo: f32,
        /// Largest observed value.
        hi: f32,
    },
}

/// How `--quantize static` turns the observed activation values into a
/// quantization range.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Observer {
    /// The smallest and largest value.
    #[default]
    MinMax,
    /// The `p`-th and `(100 − p)`-th percentiles (`percentile=99.99`):
    /// rare outliers no longer stretch the step size.
    Percentile(f64),
    /// The clipping threshold `T` on `|x|` whose 128-level quantized
    /// histogram is closest (KL divergence) to the observed one, as
    /// TensorRT's entropy calibrator: the range is `[lo, hi]` clipped to
    /// `[−T, T]`.
    Entropy,
}

impl std::fmt::Display for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Observer::MinMax => f.write_str("minmax"),
            Observer::Percentile(p) => write!(f, "percentile={p}"),
            Observer::Entropy => f.write_str("entropy"),
        }
    }
}

impl std::str::FromStr for Observer {
    type Err = String;
    fn from_str(s: &str) -> Result<Observer, String> {
        match s {
            "minmax" => Ok(Observer::MinMax),
            "entropy" => Ok(Observer::Entropy),
            "percentile" => Ok(Observer::Percentile(99.99)),
            _ => match s.strip_prefix("percentile=").map(str::parse::<f64>) {
                Some(Ok(p)) if p > 50.0 && p <= 100.0 => Ok(Observer::Percentile(p)),
                Some(_) => Err(format!("'{s}': the percentile must be in (50, 100]")),
                None => Err(format!(
                    "unknown observer '{s}'; use minmax, percentile[=P] or entropy"
                )),
            },
        }
    }
}

/// How int8 layers quantize their activations (`--activation-type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivationType {
    /// Asymmetric u8: the range's 256 levels start at its minimum; best
    /// for one-signed activations (after Relu, Sigmoid).
    #[default]
    Uint8,
    /// Symmetric int8, levels −127..127 around 0: half the resolution on
    /// one-signed data, but no zero point to shift by (what TensorRT and
    /// symmetric-only accelerators take).
    Int8,
}

impl std::fmt::Display for ActivationType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActivationType::Uint8 => "uint8",
            ActivationType::Int8 => "int8",
        })
    }
}

impl std::str::FromStr for ActivationType {
    type Err = String;
    fn from_str(s: &str) -> Result<ActivationType, String> {
        match s {
            "uint8" | "u8" => Ok(ActivationType::Uint8),
            "int8" | "s8" | "i8" => Ok(ActivationType::Int8),
            _ => Err(format!(
                "unknown activation type '{s}'; use uint8 (asymmetric) or int8 (symmetric)"
            )),
        }
    }
}

impl ActivationType {
    /// The u8 levels a quantized activation takes (int8's −127..127
    /// shifted by 128).
    fn levels(self) -> (f32, f32) {
        match self {
            ActivationType::Uint8 => (0.0, 255.0),
            ActivationType::Int8 => (1.0, 255.0),
        }
    }

    /// The scale and (u8) zero point of the range `[lo, hi]`.
    pub fn params(self, lo: f32, hi: f32) -> (f32, u8) {
        match self {
            ActivationType::Uint8 => u8_params(lo, hi),
            ActivationType::Int8 => {
                let max_abs = lo.abs().max(hi.abs());
                let scale = if max_abs > 0.0 && max_abs.is_finite() {
                    max_abs / 127.0
                } else {
                    1.0
                };
                (scale, SYMMETRIC_ZERO)
            }
        }
    }
}

/// The u8 zero point that carries symmetric int8 activations (`q_u8 =
/// q_s8 + 128`).
const SYMMETRIC_ZERO: u8 = 128;

/// Bins of the `|x|` histogram of [`Observer::Entropy`].
const ENTROPY_BINS: usize = 2048;
/// Quantized levels the entropy search compares against (int8's 128
/// magnitudes).
const ENTROPY_LEVELS: usize = 128;

/// The range `observer` makes of the observed `values` (finite ones; an
/// empty or all-NaN set gives `[0, 0]`).
pub fn observe(values: &[f32], observer: Observer) -> (f32, f32) {
    let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return (0.0, 0.0);
    }
    let lo = finite.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    match observer {
        Observer::MinMax => (lo, hi),
        Observer::Percentile(p) => {
            let mut sorted = finite;
            sorted.sort_by(f32::total_cmp);
            let at = |q: f64| {
                let i = (q / 100.0 * (sorted.len() - 1) as f64).round() as usize;
                sorted[i.min(sorted.len() - 1)]
            };
            (at(100.0 - p), at(p))
        }
        Observer::Entropy => {
            let t = entropy_threshold(&finite, lo.abs().max(hi.abs()));
            (lo.max(-t), hi.min(t))
        }
    }
}

/// TensorRT's entropy calibration on `|x|`: the threshold (a bin edge from
/// `ENTROPY_LEVELS` bins up) minimizing KL(P || Q), P the histogram clipped
/// at the threshold (the tail folded into its last bin), Q P merged into
/// `ENTROPY_LEVELS` levels and spread back over the non-empty bins.
fn entropy_threshold(values: &[f32], max_abs: f32) -> f32 {
    if max_abs <= 0.0 {
        return 0.0;
    }
    let width = max_abs / ENTROPY_BINS as f32;
    let mut hist = vec![0f64; ENTROPY_BINS];
    for v in values {
        let b = ((v.abs() / width) as usize).min(ENTROPY_BINS - 1);
        hist[b] += 1.0;
    }
    let mut best = (f64::INFINITY, ENTROPY_BINS);
    for edge in ENTROPY_LEVELS..=ENTROPY_BINS {
        let mut p: Vec<f64> = hist[..edge].to_vec();
        p[edge - 1] += hist[edge..].iter().sum::<f64>();
        // Q: P's first `edge` bins merged into LEVELS groups, each group's
        // mass spread evenly over its non-empty bins.
        let mut q = vec![0f64; edge];
        for level in 0..ENTROPY_LEVELS {
            let (start, end) = (
                level * edge / ENTROPY_LEVELS,
                (level + 1) * edge / ENTROPY_LEVELS,
            );
            let mass: f64 = hist[start..end].iter().sum();
            let nonzero = hist[start..end].iter().filter(|&&c| c > 0.0).count();
            if nonzero > 0 {
                for b in start..end {
                    if hist[b] > 0.0 {
                        q[b] = mass / nonzero as f64;
                    }
                }
            }
        }
        let (ps, qs) = (p.iter().sum::<f64>(), q.iter().sum::<f64>());
        if ps == 0.0 || qs == 0.0 {
            continue;
        }
        let kl: f64 = p
            .iter()
            .zip(&q)
            .filter(|(&pi, _)| pi > 0.0)
            .map(|(&pi, &qi)| {
                let (pi, qi) = (pi / ps, (qi / qs).max(1e-12));
                pi * (pi / qi).ln()
            })
            .sum();
        if kl < best.0 {
            best = (kl, edge);
        }
    }
    best.1 as f32 * width
}

/// The u8 scale and zero point of the range `[lo, hi]` widened to hold 0.
pub fn u8_params(lo: f32, hi: f32) -> (f32, u8) {
    let (lo, hi) = (lo.min(0.0), hi.max(0.0));
    let span = hi - lo;
    let scale = if span > 0.0 && span.is_finite() {
        span / 255.0
    } else {
        1.0
    };
    let zero = (-lo / scale).round_ties_even().clamp(0.0, 255.0) as u8;
    (scale, zero)
}

/// `w` (`K × N`, row-major) as i8 per column with its scales: symmetric,
/// `max |w[., j]|` maps to 127; an all-zero column gets scale 1.
pub fn quantize_weights(w: &[f32], k: usize, n: usize) -> (Vec<i8>, Vec<f32>) {
    let mut scales = vec![0f32; n];
    for row in w.chunks(n).take(k) {
        for (s, &v) in scales.iter_mut().zip(row) {
            *s = s.max(v.abs());
        }
    }
    for s in &mut scales {
        *s = if *s > 0.0 && s.is_finite() {
            *s / 127.0
        } else {
            1.0
        };
    }
    let q = w
        .iter()
        .enumerate()
        .map(|(i, &v)| (v / scales[i % n]).round_ties_even().clamp(-127.0, 127.0) as i8)
        .collect();
    (q, scales)
}

/// `w` (`rows × cols`, row-major) as i8 per row with its scales: the
/// per-column quantizer on the rows (an embedding table's rows are what a
/// lookup reads).
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> (Vec<i8>, Vec<f32>) {
    let transposed: Vec<f32> = (0..rows * cols)
        .map(|i| w[(i % rows) * cols + i / rows])
        .collect();
    let (q_t, scales) = quantize_weights(&transposed, cols, rows);
    let q = (0..rows * cols)
        .map(|i| q_t[(i % cols) * rows + i / cols])
        .collect();
    (q, scales)
}

/// A dense op as `alpha * (x @ W) + beta * C` for int8: W as a `K × N`
/// row-major matrix (a transposed Gemm B transposed back).
pub(crate) struct Int8Form {
    pub weights: Vec<f32>,
    pub k: usize,
    pub n: usize,
    pub alpha: f32,
    pub beta: f32,
}

/// Adds nodes to `g` named under one prefix.
struct Builder<'g> {
    g: &'g mut Graph,
    prefix: String,
    added: usize,
}

impl Builder<'_> {
    /// A node computing `op` on `inputs`; a constant when every input is
    /// one (a static activation scale times the weight scales), so no run
    /// recomputes what the compiler knows.
    fn node(&mut self, op: Op, inputs: &[NodeId], what: &str) -> Result<NodeId, IrError> {
        self.added += 1;
        let name = format!("{}/{what}", self.prefix);
        let constants: Option<Vec<&Tensor>> = inputs.iter().map(|&i| self.g.constant(i)).collect();
        if let Some(values) = constants {
            let value = kiln_ir::eval::eval(&op, &values)?;
            return Ok(self.g.add_const(name, value));
        }
        self.g.add_node(op, inputs, name)
    }

    fn constant(&mut self, shape: &[usize], data: Data, what: &str) -> NodeId {
        self.added += 1;
        let t = Tensor::new(shape, data).expect("constant of matching size");
        self.g.add_const(format!("{}/{what}", self.prefix), t)
    }

    fn scalar(&mut self, v: f32, what: &str) -> NodeId {
        self.constant(&[], Data::F32(vec![v]), what)
    }

    fn binary(
        &mut self,
        op: BinaryOp,
        a: NodeId,
        b: NodeId,
        what: &str,
    ) -> Result<NodeId, IrError> {
        self.node(Op::Binary(op), &[a, b], what)
    }

    fn unary(&mut self, op: UnaryOp, a: NodeId, what: &str) -> Result<NodeId, IrError> {
        self.node(Op::Unary(op), &[a], what)
    }

    /// The end of an int8 layer: the i32 product `acc` (its cast named
    /// `float`) times `scale · w_scales`, plus `addend` (a bias, `beta ·
    /// C`), named as the layer (the prefix); node `id` replaced by it.
    /// Returns the number of nodes added.
    fn dequantize_into(
        mut self,
        id: NodeId,
        (acc, float): (NodeId, &str),
        (scale, w_scales): (NodeId, NodeId),
        addend: Option<NodeId>,
    ) -> Result<usize, IrError> {
        let acc = self.node(Op::Cast { to: DType::F32 }, &[acc], float)?;
        let rescale = self.binary(BinaryOp::Mul, scale, w_scales, "rescale")?;
        let name = self.prefix.clone();
        let y = match addend {
            None => (self.g).add_node(Op::Binary(BinaryOp::Mul), &[acc, rescale], name)?,
            Some(c) => {
                let y = self.binary(BinaryOp::Mul, acc, rescale, "dequantized")?;
                (self.g).add_node(Op::Binary(BinaryOp::Add), &[y, c], name)?
            }
        };
        self.g.replace_all_uses(id, y)?;
        self.g.remove_unused(id);
        Ok(self.added + 1)
    }
}

/// The activation `x` quantized to u8 per tensor as `ty` says: `(q,
/// scale, zero point as u8)` nodes. With `smoothing` (a constant of
/// per-channel divisors `m`, shaped to broadcast along the channel axis)
/// it quantizes `x / m`, whose range `range` is then.
fn quantize_activation(
    b: &mut Builder,
    x: NodeId,
    (range, ty): (ActivationRange, ActivationType),
    smoothing: Option<NodeId>,
) -> Result<(NodeId, NodeId, NodeId), IrError> {
    let (min, max) = ty.levels();
    let saturate = UnaryOp::Clip { min, max };
    // A dynamic range is measured on the smoothed activation.
    let x = match (smoothing, range) {
        (Some(m), ActivationRange::Dynamic) => b.binary(BinaryOp::Div, x, m, "x_smoothed")?,
        _ => x,
    };
    let (scale, zero_f, zero_u8) = match range {
        ActivationRange::Static { lo, hi } => {
            let (s, z) = ty.params(lo, hi);
            (
                b.scalar(s, "x_scale"),
                b.scalar(f32::from(z), "x_zero_point_float"),
                b.constant(&[], Data::U8(vec![z]), "x_zero_point"),
            )
        }
        ActivationRange::Dynamic if ty == ActivationType::Int8 => {
            let hi = reduce_all(b, ReduceOp::Max, x, "x_max")?;
            let lo = reduce_all(b, ReduceOp::Min, x, "x_min")?;
            let lo = b.unary(UnaryOp::Neg, lo, "x_min_negated")?;
            let max_abs = b.binary(BinaryOp::Max, hi, lo, "x_max_abs")?;
            let zero = b.scalar(0.0, "zero");
            let flat = b.node(Op::Compare(CompareOp::Equal), &[max_abs, zero], "x_flat")?;
            let unit = b.scalar(127.0, "unit_range");
            let max_abs = b.node(Op::Where, &[flat, unit, max_abs], "x_max_abs_nonzero")?;
            let levels = b.scalar(127.0, "levels");
            let s = b.binary(BinaryOp::Div, max_abs, levels, "x_scale")?;
            (
                s,
                b.scalar(f32::from(SYMMETRIC_ZERO), "x_zero_point_float"),
                b.constant(&[], Data::U8(vec![SYMMETRIC_ZERO]), "x_zero_point"),
            )
        }
        ActivationRange::Dynamic => {
            let zero = b.scalar(0.0, "zero");
            let hi = reduce_all(b, ReduceOp::Max, x, "x_max")?;
            let hi = b.binary(BinaryOp::Max, hi, zero, "x_max0")?;
            let lo = reduce_all(b, ReduceOp::Min, x, "x_min")?;
            let lo = b.binary(BinaryOp::Min, lo, zero, "x_min0")?;
            let span = b.binary(BinaryOp::Sub, hi, lo, "x_span")?;
            let flat = b.node(Op::Compare(CompareOp::Equal), &[hi, lo], "x_flat")?;
            let levels = b.scalar(255.0, "levels");
            let unit = b.scalar(1.0, "unit_span");
            let span = b.node(Op::Where, &[flat, unit, span], "x_span_nonzero")?;
            let s = b.binary(BinaryOp::Div, span, levels, "x_scale")?;
            let shift = b.binary(BinaryOp::Div, lo, s, "x_min_scaled")?;
            let z = b.binary(BinaryOp::Sub, zero, shift, "x_zero_point_exact")?;
            let z = b.unary(UnaryOp::Round, z, "x_zero_point_rounded")?;
            let z = b.unary(saturate, z, "x_zero_point_float")?;
            let zu = b.node(Op::Cast { to: DType::U8 }, &[z], "x_zero_point")?;
            (s, z, zu)
        }
    };
    // A static scale and the divisors fold into one constant per channel.
    let divisor = match smoothing {
        None => scale,
        Some(m) if matches!(range, ActivationRange::Static { .. }) => {
            b.binary(BinaryOp::Mul, scale, m, "x_scale_smoothed")?
        }
        Some(_) => scale,
    };
    let q = b.binary(BinaryOp::Div, x, divisor, "x_scaled")?;
    let q = b.unary(UnaryOp::Round, q, "x_rounded")?;
    let q = b.binary(BinaryOp::Add, q, zero_f, "x_shifted")?;
    let q = b.unary(saturate, q, "x_saturated")?;
    let q = b.node(Op::Cast { to: DType::U8 }, &[q], "x_quantized")?;
    Ok((q, scale, zero_u8))
}

/// `op` over every axis of `x`: a dynamic scale's observed max or min.
fn reduce_all(b: &mut Builder, op: ReduceOp, x: NodeId, name: &str) -> Result<NodeId, IrError> {
    let rank = b.g.node(x).ty.shape.len();
    let all = Op::Reduce {
        op,
        axes: (0..rank).collect(),
        keep_dims: false,
    };
    b.node(all, &[x], name)
}

/// What calibration measured for one int8 layer beyond its activation
/// range.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Calibrated<'a> {
    /// Per input channel divisors of the activation, multiplied into the
    /// weights ([`crate::smoothing_factors`]).
    pub smoothing: Option<&'a [f32]>,
    /// Per output channel additions to the bias
    /// ([`crate::measure_bias_corrections`]).
    pub bias_correction: Option<&'a [f32]>,
}

/// Replaces dense node `id` (`alpha * (x @ W)`, `form`) by its int8 form;
/// returns the number of nodes added. `c` (`beta * C` as a node) and the
/// bias correction (one value per column) are added after the rescale.
pub(crate) fn quantize_dense(
    g: &mut Graph,
    id: NodeId,
    x: NodeId,
    form: &Int8Form,
    c: Option<NodeId>,
    activation: (ActivationRange, ActivationType),
    calibrated: Calibrated,
) -> Result<usize, IrError> {
    let (k, n, alpha) = (form.k, form.n, form.alpha);
    let name = g.node(id).name.clone();
    let mut b = Builder {
        g,
        prefix: name.clone(),
        added: 0,
    };
    // Row k of W reads channel k of x.
    let smoothing = calibrated.smoothing.filter(|m| m.len() == k);
    let m = smoothing.map(|m| b.constant(&[k], Data::F32(m.to_vec()), "smoothing"));
    let (q, scale, zero_u8) = quantize_activation(&mut b, x, activation, m)?;
    let smoothed: Vec<f32>;
    let w = match smoothing {
        None => &form.weights,
        Some(m) => {
            smoothed = (form.weights.iter().enumerate())
                .map(|(i, w)| w * m[i / n])
                .collect();
            &smoothed
        }
    };
    let (wq, w_scales) = quantize_weights(w, k, n);
    let wq = b.constant(&[k, n], Data::I8(wq), "w_quantized");
    let w_zero = b.constant(&[], Data::I8(vec![0]), "w_zero_point");
    let acc = b.node(Op::MatMulInteger, &[q, wq, zero_u8, w_zero], "int8_matmul")?;
    let w_scales: Vec<f32> = w_scales.iter().map(|s| s * alpha).collect();
    let w_scales = b.constant(&[n], Data::F32(w_scales), "w_scale");
    let addend = match calibrated.bias_correction.filter(|corr| corr.len() == n) {
        None => c,
        Some(corr) => {
            let corr = b.constant(&[n], Data::F32(corr.to_vec()), "bias_correction");
            match c {
                None => Some(corr),
                // A constant C folds with the correction into one bias.
                Some(c) => Some(b.binary(BinaryOp::Add, c, corr, "corrected_c")?),
            }
        }
    };
    b.dequantize_into(id, (acc, "int8_matmul_float"), (scale, w_scales), addend)
}

/// An ungrouped convolution for int8: its attributes, weights `[OC, C,
/// kh, kw]` and constant bias.
pub(crate) struct ConvInt8Form {
    pub conv: Conv2d,
    pub weights: Vec<f32>,
    pub shape: [usize; 4],
    pub bias: Option<Vec<f32>>,
}

/// Replaces Conv node `id` by its int8 form (`conv_integer` of the u8
/// activation by i8 weights per output channel, rescaled per channel,
/// plus the bias and its correction); returns the number of nodes added.
pub(crate) fn quantize_conv(
    g: &mut Graph,
    id: NodeId,
    x: NodeId,
    form: &ConvInt8Form,
    activation: (ActivationRange, ActivationType),
    calibrated: Calibrated,
) -> Result<usize, IrError> {
    let [oc, channels, kh, kw] = form.shape;
    let k = channels * kh * kw;
    let name = g.node(id).name.clone();
    let mut b = Builder {
        g,
        prefix: name.clone(),
        added: 0,
    };
    let smoothing = calibrated.smoothing.filter(|m| m.len() == channels);
    let m = smoothing.map(|m| b.constant(&[channels, 1, 1], Data::F32(m.to_vec()), "smoothing"));
    let (q, scale, zero_u8) = quantize_activation(&mut b, x, activation, m)?;
    // W[oc, c, ..] reads channel c of x.
    let weight = |i: usize| match smoothing {
        None => form.weights[i],
        Some(m) => form.weights[i] * m[(i / (kh * kw)) % channels],
    };
    // Per output channel = per row of the `[OC, K]` weight matrix.
    let weights: Vec<f32> = (0..oc * k).map(weight).collect();
    let (wq, w_scales) = quantize_rows(&weights, oc, k);
    let wq = b.constant(&form.shape, Data::I8(wq), "w_quantized");
    let w_zero = b.constant(&[], Data::I8(vec![0]), "w_zero_point");
    let acc = b.node(
        Op::ConvInteger(form.conv.clone()),
        &[q, wq, zero_u8, w_zero],
        "int8_conv",
    )?;
    let w_scales = b.constant(&[oc, 1, 1], Data::F32(w_scales), "w_scale");
    let correction = calibrated.bias_correction.filter(|corr| corr.len() == oc);
    let bias = match (form.bias.as_ref(), correction) {
        (None, None) => None,
        (Some(bias), None) => Some(bias.clone()),
        (None, Some(corr)) => Some(corr.to_vec()),
        (Some(bias), Some(corr)) => Some(bias.iter().zip(corr).map(|(b, c)| b + c).collect()),
    };
    let bias = bias.map(|bias| b.constant(&[oc, 1, 1], Data::F32(bias), "bias"));
    b.dequantize_into(id, (acc, "int8_conv_float"), (scale, w_scales), bias)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_params_keep_zero_exact() {
        let (s, z) = u8_params(-1.0, 3.0);
        assert!((s - 4.0 / 255.0).abs() < 1e-7);
        assert_eq!(z, 64);
        // A positive range is widened to 0; a flat one gets scale 1.
        assert_eq!(u8_params(2.0, 5.1).1, 0);
        assert_eq!(u8_params(0.0, 0.0), (1.0, 0));
    }

    #[test]
    fn symmetric_activations_center_on_128() {
        let (s, z) = ActivationType::Int8.params(-1.0, 3.0);
        assert!((s - 3.0 / 127.0).abs() < 1e-7);
        assert_eq!(z, 128);
        assert_eq!(ActivationType::Int8.params(0.0, 0.0), (1.0, 128));
        assert_eq!("int8".parse(), Ok(ActivationType::Int8));
        assert_eq!("uint8".parse(), Ok(ActivationType::Uint8));
        assert!("fp8".parse::<ActivationType>().is_err());
    }

    /// `x @ W` quantized with each activation type and range, evaluated:
    /// symmetric int8 puts x's levels at multiples of `max |x| / 127`
    /// (the static and the dynamic range agree here), the result within a
    /// few steps of the float product.
    #[test]
    fn int8_matmul_follows_the_float_product_with_each_activation_type() {
        let x: Vec<f32> = (0..8).map(|i| (i as f32 - 2.5) * 0.37).collect();
        let w: Vec<f32> = (0..12).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.21).collect();
        let exact: Vec<f32> = (0..6)
            .map(|i| (0..4).map(|k| x[i / 3 * 4 + k] * w[k * 3 + i % 3]).sum())
            .collect();
        let (lo, hi) = x
            .iter()
            .fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
        for ty in [ActivationType::Uint8, ActivationType::Int8] {
            for range in [ActivationRange::Static { lo, hi }, ActivationRange::Dynamic] {
                let mut g = Graph::new();
                let input = g.add_input("x", kiln_ir::ValueType::new(DType::F32, [2, 4]));
                let wc = g.add_const("w", Tensor::new([4, 3], Data::F32(w.clone())).unwrap());
                let mm = g.add_node(Op::MatMul, &[input, wc], "mm").unwrap();
                g.add_output("y", mm);
                let form = Int8Form {
                    weights: w.clone(),
                    k: 4,
                    n: 3,
                    alpha: 1.0,
                    beta: 0.0,
                };
                quantize_dense(
                    &mut g,
                    mm,
                    input,
                    &form,
                    None,
                    (range, ty),
                    Calibrated::default(),
                )
                .unwrap();
                let x_t = Tensor::new([2, 4], Data::F32(x.clone())).unwrap();
                let y = kiln_ir::eval::eval_graph(&g, &[x_t]).unwrap()[0].to_f32_vec();
                let (step, _) = ty.params(lo, hi);
                for (got, want) in y.iter().zip(&exact) {
                    assert!(
                        (got - want).abs() < 4.0 * step,
                        "{ty} {range:?}: {y:?} vs {exact:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn observers_clip_outliers() {
        // 10,000 values in [-1, 1] and one outlier at 100.
        let mut v: Vec<f32> = (0..10_000).map(|i| (i as f32 / 5_000.0) - 1.0).collect();
        v.push(100.0);
        assert_eq!(observe(&v, Observer::MinMax), (-1.0, 100.0));
        let (lo, hi) = observe(&v, Observer::Percentile(99.9));
        assert!(
            (-1.0..-0.99).contains(&lo) && (0.99..=1.0).contains(&hi),
            "{lo} {hi}"
        );
        let (lo, hi) = observe(&v, Observer::Entropy);
        assert!(lo >= -1.0 && hi < 10.0, "{lo} {hi}");
        assert_eq!(observe(&[f32::NAN], Observer::Entropy), (0.0, 0.0));
        assert_eq!(
            "percentile=99.9".parse::<Observer>(),
            Ok(Observer::Percentile(99.9))
        );
        assert!("percentile=20".parse::<Observer>().is_err());
        assert!("kl".parse::<Observer>().is_err());
    }

    #[test]
    fn weights_are_symmetric_per_column() {
        // K = 2, N = 2: columns (1, -0.5) and (0, 0).
        let (q, s) = quantize_weights(&[1.0, 0.0, -0.5, 0.0], 2, 2);
        assert_eq!(s, [1.0 / 127.0, 1.0]);
        assert_eq!(q, [127, 0, -64, 0]);
    }
}
