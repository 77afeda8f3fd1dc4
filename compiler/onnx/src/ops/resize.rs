//! `Resize` (opsets 10–19) and the legacy `Upsample`, onto the IR's
//! resize op.

use super::build::accumulate;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{CoordinateTransform, NearestRounding, Op, Resize, ResizeMode};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most output positions along one axis of a `tf_crop_and_resize` (its
/// extrapolation mask has one flag per position).
const MAX_CROP_AXIS: usize = 1 << 24;

/// `Resize` (opsets 10–19). Scales or sizes must be known at compile time
/// (and the roi of `tf_crop_and_resize`). Antialiasing (opset 18) widens
/// the Linear and Cubic filters when downsampling (`Resize::taps`).
pub fn resize(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let in_shape = ctx.ty(x).shape.clone();
    let rank = in_shape.len();
    if ctx.opset < 11 {
        let scales = ctx.const_input(node, 1)?.to_f64_vec();
        let mode = ctx
            .attr_s(node, "mode")?
            .unwrap_or_else(|| "nearest".into());
        return resample_legacy(ctx, x, &scales, &mode);
    }
    let coord = match ctx
        .attr_s(node, "coordinate_transformation_mode")?
        .as_deref()
        .unwrap_or("half_pixel")
    {
        "half_pixel" => CoordinateTransform::HalfPixel,
        "half_pixel_symmetric" => CoordinateTransform::HalfPixelSymmetric,
        "pytorch_half_pixel" => CoordinateTransform::PytorchHalfPixel,
        "align_corners" => CoordinateTransform::AlignCorners,
        "asymmetric" => CoordinateTransform::Asymmetric,
        "tf_crop_and_resize" => CoordinateTransform::TfCropAndResize,
        other => {
            return Err(ctx.bad_attr(
                "coordinate_transformation_mode",
                format!("unknown value '{other}'"),
            ))
        }
    };
    let mode = match ctx.attr_s(node, "mode")?.as_deref().unwrap_or("nearest") {
        "nearest" => ResizeMode::Nearest(
            match ctx
                .attr_s(node, "nearest_mode")?
                .as_deref()
                .unwrap_or("round_prefer_floor")
            {
                "round_prefer_floor" => NearestRounding::RoundPreferFloor,
                "round_prefer_ceil" => NearestRounding::RoundPreferCeil,
                "floor" => NearestRounding::Floor,
                "ceil" => NearestRounding::Ceil,
                other => {
                    return Err(ctx.bad_attr("nearest_mode", format!("unknown value '{other}'")))
                }
            },
        ),
        "linear" => ResizeMode::Linear,
        "cubic" => ResizeMode::Cubic {
            a: ctx.attr_f_or(node, "cubic_coeff_a", -0.75)?,
            exclude_outside: ctx.attr_i_or(node, "exclude_outside", 0)? != 0,
        },
        other => return Err(ctx.bad_attr("mode", format!("unknown value '{other}'"))),
    };
    let antialias = ctx.attr_i_or(node, "antialias", 0)? != 0;
    if antialias && matches!(mode, ResizeMode::Nearest(_)) {
        return Err(ctx.bad_attr("antialias", "applies to the linear and cubic modes only"));
    }
    // The axes the scales/sizes address (opset 18), all by default.
    let axes: Vec<usize> = match ctx.attr_ints(node, "axes")? {
        None => (0..rank).collect(),
        Some(a) => a
            .iter()
            .map(|&v| ctx.axis("axes", v, rank))
            .collect::<Result<_, _>>()?,
    };
    let scales_in = ctx.opt_const_input(node, 2)?.filter(|t| !t.is_empty());
    let sizes_in = ctx.opt_const_input(node, 3)?.filter(|t| !t.is_empty());
    let mut scales: Vec<f64> = vec![1.0; rank];
    let mut shape: Vec<usize> = in_shape.to_vec();
    match (scales_in, sizes_in) {
        (Some(s), None) => {
            let s = s.to_f64_vec();
            if s.len() != axes.len() || s.iter().any(|&v| !(v.is_finite() && v > 0.0)) {
                return Err(ctx.bad_attr(
                    "scales",
                    format!("{s:?} must be {} positive values", axes.len()),
                ));
            }
            for (&a, &v) in axes.iter().zip(&s) {
                // Scales are float32 in the model; the coordinate math uses them as given.
                scales[a] = v as f32 as f64;
                shape[a] = (in_shape[a] as f64 * scales[a]).floor() as usize;
            }
        }
        (None, Some(z)) => {
            let z = z.to_i64_vec();
            if z.len() != axes.len() || z.iter().any(|&v| v <= 0) {
                return Err(ctx.bad_attr(
                    "sizes",
                    format!("{z:?} must be {} positive sizes", axes.len()),
                ));
            }
            let policy = ctx
                .attr_s(node, "keep_aspect_ratio_policy")?
                .unwrap_or_else(|| "stretch".into());
            let ratio = |a: usize, v: i64| v as f64 / in_shape[a] as f64;
            let kept = match policy.as_str() {
                "stretch" => None,
                "not_larger" => Some(
                    axes.iter()
                        .zip(&z)
                        .map(|(&a, &v)| ratio(a, v))
                        .fold(f64::INFINITY, f64::min),
                ),
                "not_smaller" => Some(
                    axes.iter()
                        .zip(&z)
                        .map(|(&a, &v)| ratio(a, v))
                        .fold(0.0, f64::max),
                ),
                other => {
                    return Err(ctx.bad_attr(
                        "keep_aspect_ratio_policy",
                        format!("unknown value '{other}'"),
                    ))
                }
            };
            for (&a, &v) in axes.iter().zip(&z) {
                match kept {
                    None => {
                        shape[a] = v as usize;
                        scales[a] = ratio(a, v) as f32 as f64;
                    }
                    Some(r) => {
                        scales[a] = r as f32 as f64;
                        shape[a] = (r * in_shape[a] as f64).round() as usize;
                    }
                }
            }
        }
        _ => {
            return Err(
                ctx.invalid("Resize needs exactly one of scales and sizes, known at compile time")
            )
        }
    }
    if shape.contains(&0) {
        return Err(ctx.invalid(format!("the output shape {shape:?} has an empty axis")));
    }
    // tf_crop_and_resize: the region of interest, `[starts.., ends..]` over
    // the addressed axes (others keep [0, 1]).
    let mut roi: Vec<[f32; 2]> = Vec::new();
    if coord == CoordinateTransform::TfCropAndResize {
        let given = ctx
            .opt_const_input(node, 1)?
            .map(|t| t.to_f64_vec())
            .unwrap_or_default();
        if given.len() != 2 * axes.len() {
            return Err(ctx.invalid(format!(
                "tf_crop_and_resize needs a constant roi of {} values, got {}",
                2 * axes.len(),
                given.len()
            )));
        }
        roi = (0..rank).map(|_| [0.0, 1.0]).collect();
        for (i, &a) in axes.iter().enumerate() {
            roi[a] = [given[i] as f32, given[axes.len() + i] as f32];
        }
    }
    let resize = Resize {
        shape: shape.iter().copied().collect(),
        scales: scales.into_iter().map(|s| s as f32).collect(),
        mode,
        coord,
        antialias,
        roi: roi.into_iter().collect(),
    };
    // Outputs whose source is outside the input take extrapolation_value:
    // a constant mask per axis, or'ed, and a where. The masks are built
    // here, one flag per output index, so their length is checked first
    // (a hostile model may ask for 2^40 outputs along an axis).
    let crop = resize.coord == CoordinateTransform::TfCropAndResize;
    if let Some(&len) = (resize.shape.iter()).find(|&&d| crop && d > MAX_CROP_AXIS) {
        return Err(ctx.invalid(format!(
            "tf_crop_and_resize to an axis of {len} positions (Kiln builds a mask per axis of at most {MAX_CROP_AXIS})"
        )));
    }
    // Only tf_crop_and_resize extrapolates.
    let outside: Vec<Vec<bool>> = match crop {
        true => (0..rank)
            .map(|a| resize.outside_roi(a, in_shape[a]))
            .collect(),
        false => Vec::new(),
    };
    if outside.iter().all(|o| o.iter().all(|&b| !b)) {
        return one(ctx.op(Op::Resize(resize), &[x], None)?);
    }
    let y = ctx.op(Op::Resize(resize), &[x], Some("cropped"))?;
    let mut mask: Option<Val> = None;
    for (a, flags) in outside.iter().enumerate() {
        if flags.iter().all(|&b| !b) {
            continue;
        }
        let mut dims = vec![1; rank];
        dims[a] = flags.len();
        let t = kiln_ir::Tensor::new(dims, kiln_ir::Data::Bool(flags.clone())).expect("flags");
        let m = super::build::gen_const(ctx, t, &format!("outside{a}"))?;
        mask = Some(accumulate(
            ctx,
            mask,
            Op::Logical(kiln_ir::LogicalOp::Or),
            m,
            &format!("outside_to{a}"),
        )?);
    }
    let dtype = ctx.ty(y).dtype;
    let value = ctx.attr_f_or(node, "extrapolation_value", 0.0)? as f64;
    let value = super::build::scalar(ctx, dtype, value, "extrapolation_value");
    one(ctx.op(
        Op::Where,
        &[mask.expect("an axis is outside"), value, y],
        None,
    )?)
}

/// `Upsample` (opsets 7–9; deprecated in 10).
pub fn upsample(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let scales: Vec<f64> = if ctx.opset >= 9 {
        ctx.const_input(node, 1)?.to_f64_vec()
    } else {
        ctx.attr_floats(node, "scales")?
            .ok_or_else(|| ctx.bad_attr("scales", "is required"))?
            .iter()
            .map(|&s| s as f64)
            .collect()
    };
    let mode = ctx
        .attr_s(node, "mode")?
        .unwrap_or_else(|| "nearest".into());
    resample_legacy(ctx, x, &scales, &mode)
}

/// Upsample and opset-10 Resize: asymmetric coordinates; nearest rounds
/// down when enlarging and up when shrinking (onnxruntime's behaviour).
fn resample_legacy(ctx: &mut ImportCtx, x: Val, scales: &[f64], mode: &str) -> R {
    let in_shape = ctx.ty(x).shape.clone();
    if scales.len() != in_shape.len() || scales.iter().any(|&s| !(s.is_finite() && s > 0.0)) {
        return Err(ctx.bad_attr(
            "scales",
            format!("{scales:?} must be {} positive values", in_shape.len()),
        ));
    }
    let mode = match mode {
        "nearest" => {
            let rounding = if scales.iter().all(|&s| s >= 1.0) {
                NearestRounding::Floor
            } else if scales.iter().all(|&s| s <= 1.0) {
                NearestRounding::Ceil
            } else {
                return Err(ctx
                    .unsupported("nearest resampling that enlarges some axes and shrinks others"));
            };
            ResizeMode::Nearest(rounding)
        }
        "linear" | "bilinear" => ResizeMode::Linear,
        other => return Err(ctx.bad_attr("mode", format!("unknown value '{other}'"))),
    };
    let scales: Vec<f32> = scales.iter().map(|&s| s as f32).collect();
    let shape: Vec<usize> = in_shape
        .iter()
        .zip(&scales)
        .map(|(&n, &s)| (n as f64 * s as f64).floor() as usize)
        .collect();
    if shape.contains(&0) {
        return Err(ctx.invalid(format!("the output shape {shape:?} has an empty axis")));
    }
    one(ctx.op(
        Op::Resize(Resize {
            shape: shape.into_iter().collect(),
            scales: scales.into_iter().collect(),
            mode,
            coord: CoordinateTransform::Asymmetric,
            antialias: false,
            roi: Default::default(),
        }),
        &[x],
        None,
    )?)
}
