//! Signal processing: `DFT` and `STFT` as products with constant cosine
//! and sine matrices, and the window generators (`HannWindow`,
//! `HammingWindow`, `BlackmanWindow`), whose size must be known at import.
//!
//! A DFT of length `n` along an axis is `x @ W` with `W[j, k] =
//! e^{∓2πi·jk/n}` split into real matrices: the transform runs on the dense
//! kernels (O(n²) per signal, exact to f32 rounding), which for the frame
//! lengths of audio front ends (a few hundred to a few thousand samples)
//! is what the compiled code does best. f16/bf16 signals are transformed
//! in f32 and rounded once.

use super::build::slice_along;
use super::build::{build_const, gen_const};
use super::build::{cast_to, reshape_to};
use super::movement::pad_axis;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::tensor::dtype_or_err;
use crate::OnnxError;
use kiln_ir::{BinaryOp, DType, Data, Op, Tensor};
use std::f64::consts::PI;
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// What a transform computes along its axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `X[k] = Σ x[j] e^{-2πi jk/n}`, for `k < bins`.
    Forward { bins: usize },
    /// `x[j] = (1/n) Σ X[k] e^{2πi jk/n}`, complex in and out.
    Inverse,
    /// The real signal of length `n` whose one-sided spectrum (`n/2 + 1`
    /// bins, the rest Hermitian) is the input (numpy's `irfft`).
    InverseOneSided,
}

/// The shape `[inputs, outputs]` of a transform's matrices.
fn matrix_shape(kind: Kind, n: usize) -> (usize, usize) {
    match kind {
        Kind::Forward { bins } => (n, bins),
        Kind::Inverse => (n, n),
        Kind::InverseOneSided => (n / 2 + 1, n),
    }
}

/// Entry `(j, k)` of the four real matrices of a transform of length `n`:
/// the output's real part is `re @ A + im @ B`, its imaginary part
/// `re @ C + im @ D` (none for [`Kind::InverseOneSided`]).
fn matrix_entries(kind: Kind, n: usize, j: usize, k: usize) -> [f64; 4] {
    // jk mod n keeps the angle small, so cos/sin stay exact.
    let angle = 2.0 * PI * ((j * k) % n.max(1)) as f64 / n as f64;
    let (s, c) = angle.sin_cos();
    let middle = 2 * j == n;
    let n = n as f64;
    match kind {
        Kind::Forward { .. } => [c, s, -s, c],
        Kind::Inverse => [c / n, -s / n, s / n, c / n],
        Kind::InverseOneSided => {
            // Bins 1..n/2 stand for themselves and their mirror images;
            // bin 0 and (n even) bin n/2 only for themselves, their
            // imaginary parts ignored.
            let w = if j == 0 || middle { 1.0 } else { 2.0 };
            [w * c / n, -w * s / n, 0.0, 0.0]
        }
    }
}

/// The transform `kind` of length `n` of `x` (real/imaginary pairs in the
/// last dim, of size 1 for a real signal) along `axis`: the input padded
/// with zeros or truncated to the transform's input length, the output's
/// transformed axis of the transform's output length and its last dim 2
/// (1 for [`Kind::InverseOneSided`]).
fn transform(
    ctx: &mut ImportCtx,
    x: Val,
    axis: usize,
    n: usize,
    kind: Kind,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let parts = xt.shape[rank - 1];
    if !(parts == 1 || parts == 2) || axis + 1 >= rank {
        return Err(ctx.invalid(format!(
            "the signal {xt} needs a last dim of 1 (real) or 2 (complex) and the axis ({axis}) before it"
        )));
    }
    if n == 0 {
        return Err(ctx.invalid("the transform length must be positive"));
    }
    let io = xt.dtype;
    let dt = if kiln_ir::infer::is_half(io) {
        DType::F32
    } else {
        io
    };
    let x = cast_to(ctx, x, dt, "wide")?;
    // [..., L, ..., parts] → per part [others..., L] (the axis last).
    let kept: Vec<usize> = (0..rank - 1).filter(|&d| d != axis).collect();
    let mut perm = kept.clone();
    perm.push(axis);
    let mut flat_shape: Vec<usize> = kept.iter().map(|&d| xt.shape[d]).collect();
    let len = xt.shape[axis];
    let (rows, cols) = matrix_shape(kind, n);
    let mut planes = Vec::with_capacity(2);
    for p in 0..parts {
        let s = slice_along(ctx, x, rank - 1, p, 1, 1, &format!("part{p}"))?;
        let s = reshape_to(
            ctx,
            s,
            &xt.shape[..rank - 1],
            Some(&format!("part{p}_flat")),
        )?;
        let s = permuted(ctx, s, &perm, &format!("part{p}_axis_last"))?;
        let fit = rows as i64 - len as i64;
        let s = if fit == 0 {
            s
        } else {
            let zero = Tensor::new(vec![1; rank - 1], Data::zeros(dt, 1)).expect("one");
            let zero = gen_const(ctx, zero, &format!("part{p}_zero"))?;
            pad_axis(ctx, s, rank - 2, (0, fit), "constant", zero)?
        };
        planes.push(s);
    }
    flat_shape.push(cols);
    // The matrices are charged to the generated-constant budget before
    // they are built: `n` comes from the model.
    let product = |ctx: &mut ImportCtx, plane: Val, which: usize, tag: &str| {
        let w = build_const(ctx, &[rows, cols], dt, tag, |count| {
            Data::from_f64s(
                dt,
                (0..count).map(|i| matrix_entries(kind, n, i / cols, i % cols)[which]),
            )
        })?;
        ctx.dense_op(Op::MatMul, &[plane, w], Some(&format!("{tag}_product")))
    };
    let combine =
        |ctx: &mut ImportCtx, [wr, wi]: [usize; 2], tag: &str| -> Result<Val, OnnxError> {
            let re = product(ctx, planes[0], wr, &format!("{tag}_re"))?;
            match planes.get(1) {
                Some(&im) => {
                    let im = product(ctx, im, wi, &format!("{tag}_im"))?;
                    ctx.op(Op::Binary(BinaryOp::Add), &[re, im], Some(tag))
                }
                None => Ok(re),
            }
        };
    let mut outs = vec![combine(ctx, [0, 1], "real")?];
    if kind != Kind::InverseOneSided {
        outs.push(combine(ctx, [2, 3], "imag")?);
    }
    let mut with_part = flat_shape.clone();
    with_part.push(1);
    let outs: Vec<Val> = (outs.into_iter().enumerate())
        .map(|(i, v)| reshape_to(ctx, v, &with_part, Some(&format!("out{i}"))))
        .collect::<Result<_, _>>()?;
    let y = if outs.len() == 1 {
        outs[0]
    } else {
        ctx.op(Op::Concat { axis: rank - 1 }, &outs, Some("pairs"))?
    };
    // [others..., cols, parts] → the transformed axis back in place.
    let back: Vec<usize> = (0..rank)
        .map(|t| match t {
            t if t == axis => rank - 2,
            t if t == rank - 1 => rank - 1,
            t if t < axis => t,
            t => t - 1,
        })
        .collect();
    let y = permuted(ctx, y, &back, "axis_back")?;
    cast_to(ctx, y, io, "narrow")
}

/// `v` transposed by `perm` (named `tag`), or `v` itself when `perm` is
/// the identity.
fn permuted(ctx: &mut ImportCtx, v: Val, perm: &[usize], tag: &str) -> Result<Val, OnnxError> {
    if perm.iter().copied().eq(0..perm.len()) {
        return Ok(v);
    }
    ctx.op(
        Op::Transpose {
            perm: perm.iter().copied().collect(),
        },
        &[v],
        Some(tag),
    )
}

/// A positive scalar constant input (`what` names it in errors).
fn positive_scalar(
    ctx: &ImportCtx,
    node: &NodeProto,
    i: usize,
    what: &str,
) -> Result<Option<usize>, OnnxError> {
    let Some(t) = ctx.opt_const_input(node, i)? else {
        return Ok(None);
    };
    match t.to_i64_vec()[..] {
        [v] if v > 0 => Ok(Some(v as usize)),
        _ => Err(ctx.invalid(format!("{what} must be one positive integer"))),
    }
}

/// `DFT` (opsets 17 and 20: the axis an attribute, then an input).
pub fn dft(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let rank = ctx.ty(x).shape.len();
    let inverse = ctx.attr_i_or(node, "inverse", 0)? != 0;
    let onesided = ctx.attr_i_or(node, "onesided", 0)? != 0;
    let axis = if ctx.opset >= 20 {
        match ctx.opt_const_input(node, 2)? {
            Some(t) => t.to_i64_vec().first().copied().unwrap_or(-2),
            None => -2,
        }
    } else {
        ctx.attr_i_or(node, "axis", 1)?
    };
    let axis = ctx.axis("axis", axis, rank)?;
    if axis + 1 >= rank {
        return Err(ctx.bad_attr("axis", "the last dim holds real/imaginary parts"));
    }
    let len = ctx.ty(x).shape[axis];
    let n = match positive_scalar(ctx, node, 1, "dft_length")? {
        Some(n) => n,
        None if inverse && onesided => 2 * len.saturating_sub(1),
        None => len,
    };
    let kind = match (inverse, onesided) {
        (false, false) => Kind::Forward { bins: n },
        (false, true) => Kind::Forward { bins: n / 2 + 1 },
        (true, false) => Kind::Inverse,
        (true, true) => Kind::InverseOneSided,
    };
    one(transform(ctx, x, axis, n, kind)?)
}

/// `STFT` (opset 17): frames of `frame_length` samples every `frame_step`,
/// each multiplied by the window and transformed (one-sided by default).
pub fn stft(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    if xt.shape.len() != 3 {
        return Err(ctx.invalid(format!(
            "the signal must be [batch, length, 1 or 2], got {xt}"
        )));
    }
    let step = positive_scalar(ctx, node, 1, "frame_step")?
        .ok_or_else(|| ctx.not_constant(x, "STFT needs a constant frame_step"))?;
    let window = ctx.opt_input(node, 2);
    let window_len = window.map(|w| ctx.ty(w).num_elements());
    let frame = match positive_scalar(ctx, node, 3, "frame_length")? {
        Some(f) => f,
        None => window_len.unwrap_or(xt.shape[1]),
    };
    let width = window_len.unwrap_or(frame);
    let onesided = ctx.attr_i_or(node, "onesided", 1)? != 0;
    let len = xt.shape[1];
    if frame > len || width == 0 {
        return Err(ctx.invalid(format!(
            "frames of {frame} samples do not fit a signal of {len}"
        )));
    }
    let frames = 1 + (len - frame) / step;
    // Samples past the end of the signal read zeros.
    let reach = (frames - 1) * step + width;
    let zero = Tensor::new([1, 1, 1], Data::zeros(xt.dtype, 1)).expect("one");
    let zero = gen_const(ctx, zero, "zero")?;
    let x = pad_axis(
        ctx,
        x,
        1,
        (0, reach.saturating_sub(len) as i64),
        "constant",
        zero,
    )?;
    let index = build_const(ctx, &[frames, width], DType::I64, "frame_index", |count| {
        Data::I64(
            (0..count)
                .map(|i| ((i / width) * step + i % width) as i64)
                .collect(),
        )
    })?;
    let mut framed = ctx.op(Op::Gather { axis: 1 }, &[x, index], Some("frames"))?;
    if let Some(w) = window {
        let w = cast_to(ctx, w, xt.dtype, "window_cast")?;
        let w = reshape_to(ctx, w, &[1, 1, width, 1], Some("window_view"))?;
        framed = ctx.op(Op::Binary(BinaryOp::Mul), &[framed, w], Some("windowed"))?;
    }
    let bins = if onesided { frame / 2 + 1 } else { frame };
    one(transform(ctx, framed, 2, frame, Kind::Forward { bins })?)
}

/// `HannWindow`, `HammingWindow` and `BlackmanWindow` (opset 17): `size`
/// values of `a0 − a1·cos(2πn/N) + a2·cos(4πn/N)` with `N = size`
/// (`periodic`, the default) or `size − 1`.
fn window(ctx: &mut ImportCtx, node: &NodeProto, [a0, a1, a2]: [f64; 3]) -> R {
    let size = ctx.const_input(node, 0)?.to_i64_vec();
    let size = match size[..] {
        [s] if s >= 0 => s as usize,
        _ => return Err(ctx.invalid("size must be one non-negative integer")),
    };
    let name = ctx.node_name().to_string();
    let dtype = dtype_or_err(
        ctx.attr_i_or(node, "output_datatype", 1)? as i32,
        &format!("{name}.output_datatype"),
    )?;
    let periodic = ctx.attr_i_or(node, "periodic", 1)? != 0;
    let span = if periodic {
        size
    } else {
        size.saturating_sub(1)
    } as f64;
    let value = move |i: usize| {
        let t = 2.0 * PI * i as f64 / span;
        a0 - a1 * t.cos() + a2 * (2.0 * t).cos()
    };
    one(build_const(ctx, &[size], dtype, "window", |n| {
        if dtype.is_float() {
            Data::from_f64s(dtype, (0..n).map(value))
        } else {
            Data::from_i64s(dtype, (0..n).map(|i| value(i) as i64))
        }
    })?)
}

/// `HannWindow`.
pub fn hann_window(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    window(ctx, node, [0.5, 0.5, 0.0])
}

/// `HammingWindow` (α = 25/46).
pub fn hamming_window(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    window(ctx, node, [25.0 / 46.0, 21.0 / 46.0, 0.0])
}

/// `BlackmanWindow`.
pub fn blackman_window(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    window(ctx, node, [0.42, 0.5, 0.08])
}

/// `MelWeightMatrix` (opset 17): the `[dft_length/2 + 1, num_mel_bins]`
/// triangular filter bank mapping a onesided spectrum to mel bands, with
/// every input known at import (they fix the output's shape), computed as
/// the ONNX reference does: `num_mel_bins + 2` points evenly spaced in mel
/// (`2595·log10(1 + f/700)`) between the edge frequencies, each mapped to
/// the spectrogram bin `⌊(dft_length + 1)·f / sample_rate⌋`, and one
/// triangle per band rising from its left point to its centre and falling
/// to its right one.
pub fn mel_weight_matrix(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let scalar = |ctx: &mut ImportCtx, i: usize, what: &str| -> Result<f64, OnnxError> {
        match ctx.const_input(node, i)?.to_f64_vec()[..] {
            [v] if v.is_finite() => Ok(v),
            _ => Err(ctx.invalid(format!("{what} must be one finite number"))),
        }
    };
    let mels = scalar(ctx, 0, "num_mel_bins")?;
    let dft_length = scalar(ctx, 1, "dft_length")?;
    let sample_rate = scalar(ctx, 2, "sample_rate")?;
    let (lower, upper) = (
        scalar(ctx, 3, "lower_edge_hertz")?,
        scalar(ctx, 4, "upper_edge_hertz")?,
    );
    if mels < 1.0 || dft_length < 1.0 || sample_rate <= 0.0 || mels > 1e6 || dft_length > 1e8 {
        return Err(ctx.invalid(format!(
            "num_mel_bins {mels}, dft_length {dft_length} and sample_rate {sample_rate} must be positive (and bounded)"
        )));
    }
    let (mels, dft_length) = (mels as usize, dft_length as usize);
    let bins = dft_length / 2 + 1;
    let name = ctx.node_name().to_string();
    let dtype = dtype_or_err(
        ctx.attr_i_or(node, "output_datatype", 1)? as i32,
        &format!("{name}.output_datatype"),
    )?;
    let to_mel = |f: f64| 2595.0 * (f / 700.0).ln_1p() / std::f64::consts::LN_10;
    let (low, high) = (to_mel(lower), to_mel(upper));
    let step = (high - low) / (mels + 2) as f64;
    let points: Vec<i64> = (0..mels + 2)
        .map(|i| {
            let mel = i as f64 * step + low;
            let f = 700.0 * (mel / 2595.0 * std::f64::consts::LN_10).exp_m1();
            (((dft_length + 1) as f64 * f) / sample_rate).floor() as i64
        })
        .collect();
    if points.iter().any(|&p| p < 0 || p as usize > bins) {
        return Err(ctx.invalid(format!(
            "the edge frequencies {lower}..{upper} Hz map outside the {bins} spectrogram bins"
        )));
    }
    // Built after build_const charged its size against the import budget.
    one(build_const(
        ctx,
        &[bins, mels],
        dtype,
        "mel_weights",
        |_| {
            let mut w = vec![0f64; bins * mels];
            for i in 0..mels {
                let (left, centre, right) = (points[i], points[i + 1], points[i + 2]);
                let mut set = |j: i64, v: f64| {
                    if let Some(cell) = usize::try_from(j)
                        .ok()
                        .filter(|&j| j < bins)
                        .map(|j| &mut w[j * mels + i])
                    {
                        *cell = v;
                    }
                };
                if centre == left {
                    set(centre, 1.0);
                } else {
                    for j in left..=centre {
                        set(j, (j - left) as f64 / (centre - left) as f64);
                    }
                }
                if right > centre {
                    for j in centre..right {
                        set(j, (right - j) as f64 / (right - centre) as f64);
                    }
                }
            }
            if dtype.is_float() {
                Data::from_f64s(dtype, w.into_iter())
            } else {
                Data::from_i64s(dtype, w.into_iter().map(|v| v as i64))
            }
        },
    )?)
}
