//! `GridSample` decomposed like the ONNX reference, one spatial axis at a
//! time: the grid coordinate is denormalized, rounded (nearest), moved back
//! inside the borders (border/reflection padding), split into taps (1, 2 or
//! 4 per axis) with weights, and every combination of taps is one
//! GatherElements-style gather on the flattened image, weighted and summed.
//! Taps outside the image read 0 with zeros padding, the clamped or
//! reflected pixel otherwise.

use super::build::build_const;
use super::build::slice_along;
use super::build::{cast_to, reshape_to, scalar};
use super::index::gather_along;
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, LogicalOp, Op, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

#[derive(Clone, Copy, PartialEq)]
enum Pad {
    Zeros,
    Border,
    Reflection,
}

/// One tap along one axis: the pixel index (i64), its weight and, with
/// zeros padding, whether it lies inside the image.
struct Tap {
    index: Val,
    weight: Option<Val>,
    valid: Option<Val>,
}

struct Ops<'a> {
    tag: &'a str,
    n: usize,
}

impl Ops<'_> {
    fn name(&mut self, s: &str) -> String {
        self.n += 1;
        format!("{}_{s}{}", self.tag, self.n)
    }
}

fn bin(ctx: &mut ImportCtx, o: &mut Ops, op: BinaryOp, a: Val, b: Val) -> Result<Val, OnnxError> {
    let name = o.name(op.name());
    ctx.op(Op::Binary(op), &[a, b], Some(&name))
}

fn un(ctx: &mut ImportCtx, o: &mut Ops, op: UnaryOp, a: Val) -> Result<Val, OnnxError> {
    let name = o.name(op.name());
    ctx.op(Op::Unary(op), &[a], Some(&name))
}

fn cmp(ctx: &mut ImportCtx, o: &mut Ops, op: CompareOp, a: Val, b: Val) -> Result<Val, OnnxError> {
    let name = o.name(op.name());
    ctx.op(Op::Compare(op), &[a, b], Some(&name))
}

fn sel(ctx: &mut ImportCtx, o: &mut Ops, c: Val, a: Val, b: Val) -> Result<Val, OnnxError> {
    let name = o.name("where");
    ctx.op(Op::Where, &[c, a, b], Some(&name))
}

fn k(ctx: &mut ImportCtx, o: &mut Ops, v: f64) -> Val {
    let name = o.name("const");
    scalar(ctx, DType::F32, v, &name)
}

/// The reference's reflection of `x` into `[lo, hi]` (by the near border,
/// repeatedly), for values outside; values inside are returned as they are.
fn reflect(ctx: &mut ImportCtx, o: &mut Ops, x: Val, lo: f64, hi: f64) -> Result<Val, OnnxError> {
    let rng = hi - lo;
    if rng <= 0.0 {
        // A one-pixel axis with aligned corners: everything maps to it.
        let c = k(ctx, o, lo);
        let z = k(ctx, o, 0.0);
        let zx = bin(ctx, o, BinaryOp::Mul, x, z)?;
        return bin(ctx, o, BinaryOp::Add, zx, c);
    }
    let (lo_v, hi_v, rng_v) = (k(ctx, o, lo), k(ctx, o, hi), k(ctx, o, rng));
    let two = k(ctx, o, 2.0);
    let zero = k(ctx, o, 0.0);
    // Below: dx = lo - x; above: dx = x - hi.
    let below = cmp(ctx, o, CompareOp::Less, x, lo_v)?;
    let above = cmp(ctx, o, CompareOp::Greater, x, hi_v)?;
    let d_lo = bin(ctx, o, BinaryOp::Sub, lo_v, x)?;
    let d_hi = bin(ctx, o, BinaryOp::Sub, x, hi_v)?;
    let dx = sel(ctx, o, below, d_lo, d_hi)?;
    let q = bin(ctx, o, BinaryOp::Div, dx, rng_v)?;
    let nq = un(ctx, o, UnaryOp::Floor, q)?;
    let nr = bin(ctx, o, BinaryOp::Mul, nq, rng_v)?;
    let r = bin(ctx, o, BinaryOp::Sub, dx, nr)?;
    let parity = bin(ctx, o, BinaryOp::Fmod, nq, two)?;
    let even = cmp(ctx, o, CompareOp::Equal, parity, zero)?;
    let lo_r = bin(ctx, o, BinaryOp::Add, lo_v, r)?;
    let hi_r = bin(ctx, o, BinaryOp::Sub, hi_v, r)?;
    // Below: even → lo + r, odd → hi - r; above: even → hi - r, odd → lo + r.
    let from_below = sel(ctx, o, even, lo_r, hi_r)?;
    let from_above = sel(ctx, o, even, hi_r, lo_r)?;
    let outside = sel(ctx, o, below, from_below, from_above)?;
    let out = ctx.op(
        Op::Logical(LogicalOp::Or),
        &[below, above],
        Some(&o.name("outside")),
    )?;
    sel(ctx, o, out, outside, x)
}

/// The taps of one axis of size `d` at (denormalized, adjusted) coordinates
/// `x`.
fn taps(
    ctx: &mut ImportCtx,
    o: &mut Ops,
    x: Val,
    d: usize,
    mode: &str,
    pad: Pad,
    border: (f64, f64),
) -> Result<Vec<Tap>, OnnxError> {
    // (offset from floor(x), weight) per tap; nearest reads x itself.
    let mut raw: Vec<(Val, Option<Val>)> = Vec::new();
    match mode {
        "nearest" => raw.push((x, None)),
        "linear" | "cubic" => {
            let x0 = un(ctx, o, UnaryOp::Floor, x)?;
            let t = bin(ctx, o, BinaryOp::Sub, x, x0)?;
            let one_ = k(ctx, o, 1.0);
            if mode == "linear" {
                let w0 = bin(ctx, o, BinaryOp::Sub, one_, t)?;
                let x1 = bin(ctx, o, BinaryOp::Add, x0, one_)?;
                raw.push((x0, Some(w0)));
                raw.push((x1, Some(t)));
            } else {
                let a = -0.75f64;
                // Keys' kernel at distances t+1, t, 1-t, 2-t.
                let far = |ctx: &mut ImportCtx, o: &mut Ops, s: Val| -> Result<Val, OnnxError> {
                    // ((a·s - 5a)·s + 8a)·s - 4a
                    let av = k(ctx, o, a);
                    let v = bin(ctx, o, BinaryOp::Mul, av, s)?;
                    let c = k(ctx, o, -5.0 * a);
                    let v = bin(ctx, o, BinaryOp::Add, v, c)?;
                    let v = bin(ctx, o, BinaryOp::Mul, v, s)?;
                    let c = k(ctx, o, 8.0 * a);
                    let v = bin(ctx, o, BinaryOp::Add, v, c)?;
                    let v = bin(ctx, o, BinaryOp::Mul, v, s)?;
                    let c = k(ctx, o, -4.0 * a);
                    bin(ctx, o, BinaryOp::Add, v, c)
                };
                let near = |ctx: &mut ImportCtx, o: &mut Ops, s: Val| -> Result<Val, OnnxError> {
                    // ((a+2)·s - (a+3))·s·s + 1
                    let c2 = k(ctx, o, a + 2.0);
                    let v = bin(ctx, o, BinaryOp::Mul, c2, s)?;
                    let c3 = k(ctx, o, -(a + 3.0));
                    let v = bin(ctx, o, BinaryOp::Add, v, c3)?;
                    let v = bin(ctx, o, BinaryOp::Mul, v, s)?;
                    let v = bin(ctx, o, BinaryOp::Mul, v, s)?;
                    let c1 = k(ctx, o, 1.0);
                    bin(ctx, o, BinaryOp::Add, v, c1)
                };
                let two = k(ctx, o, 2.0);
                let tp1 = bin(ctx, o, BinaryOp::Add, t, one_)?;
                let omt = bin(ctx, o, BinaryOp::Sub, one_, t)?;
                let tmt = bin(ctx, o, BinaryOp::Sub, two, t)?;
                let w = [
                    far(ctx, o, tp1)?,
                    near(ctx, o, t)?,
                    near(ctx, o, omt)?,
                    far(ctx, o, tmt)?,
                ];
                for (i, wi) in w.into_iter().enumerate() {
                    let off = k(ctx, o, i as f64 - 1.0);
                    let xi = bin(ctx, o, BinaryOp::Add, x0, off)?;
                    raw.push((xi, Some(wi)));
                }
            }
        }
        m => return Err(ctx.bad_attr("mode", format!("unknown mode '{m}'"))),
    }
    let hi = k(ctx, o, d as f64 - 1.0);
    let zero = k(ctx, o, 0.0);
    let mut out = Vec::with_capacity(raw.len());
    for (i, w) in raw {
        let (i, valid) = match pad {
            Pad::Zeros => {
                let ge = cmp(ctx, o, CompareOp::GreaterOrEqual, i, zero)?;
                let le = cmp(ctx, o, CompareOp::LessOrEqual, i, hi)?;
                let v = ctx.op(
                    Op::Logical(LogicalOp::And),
                    &[ge, le],
                    Some(&o.name("inside")),
                )?;
                (i, Some(v))
            }
            Pad::Border => (i, None),
            Pad::Reflection if mode == "nearest" => (i, None),
            Pad::Reflection => (reflect(ctx, o, i, border.0, border.1)?, None),
        };
        // Truncate like the reference's int(), then keep the index inside.
        let idx = ctx.op(Op::Cast { to: DType::I64 }, &[i], Some(&o.name("index")))?;
        let idx = ctx.op(
            Op::Unary(UnaryOp::Clip {
                min: 0.0,
                max: d as f32 - 1.0,
            }),
            &[idx],
            Some(&o.name("index_clamped")),
        )?;
        out.push(Tap {
            index: idx,
            weight: w,
            valid,
        });
    }
    Ok(out)
}

/// `GridSample` (opset 16 names modes bilinear/bicubic, 20+ linear/cubic
/// and N-D).
pub fn grid_sample(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let grid = ctx.input(node, 1)?;
    let xt = ctx.ty(x).clone();
    let gt = ctx.ty(grid).clone();
    let nd = xt.shape.len().saturating_sub(2);
    if nd == 0 || xt.dtype != DType::F32 || gt.shape.len() != nd + 2 || gt.shape[nd + 1] != nd {
        return Err(ctx.invalid(format!(
            "X {xt} and grid {gt} do not form an f32 [N, C, D..] image and an [N, D.., {nd}] grid"
        )));
    }
    if gt.shape[0] != xt.shape[0] {
        return Err(ctx.invalid("X and grid differ in batch size"));
    }
    let mode = ctx.attr_s(node, "mode")?.unwrap_or_else(|| {
        if ctx.opset < 20 {
            "bilinear".into()
        } else {
            "linear".into()
        }
    });
    let mode = match mode.as_str() {
        "bilinear" => "linear".to_string(),
        "bicubic" => "cubic".to_string(),
        m => m.to_string(),
    };
    let pad = match ctx
        .attr_s(node, "padding_mode")?
        .unwrap_or_else(|| "zeros".into())
        .as_str()
    {
        "zeros" => Pad::Zeros,
        "border" => Pad::Border,
        "reflection" => Pad::Reflection,
        p => return Err(ctx.bad_attr("padding_mode", format!("unknown padding mode '{p}'"))),
    };
    let align = ctx.attr_i_or(node, "align_corners", 0)? != 0;
    let (n, c) = (xt.shape[0], xt.shape[1]);
    let dims: Vec<usize> = xt.shape[2..].to_vec();
    let out_sp: Vec<usize> = gt.shape[1..=nd].to_vec();
    let p: usize = out_sp.iter().product();
    let grid = cast_to(ctx, grid, DType::F32, "grid_f32")?;
    let mut o = Ops { tag: "gs", n: 0 };
    let mut axes_taps = Vec::with_capacity(nd);
    for (ax, &d) in dims.iter().enumerate() {
        // The grid's last axis lists coordinates fastest-axis first.
        let g = slice_along(
            ctx,
            grid,
            nd + 1,
            nd - 1 - ax,
            1,
            1,
            &format!("grid_axis{ax}"),
        )?;
        let g = reshape_to(ctx, g, &[n, p], Some(&format!("grid_axis{ax}_flat")))?;
        let df = d as f64;
        let one_ = k(ctx, &mut o, 1.0);
        let g1 = bin(ctx, &mut o, BinaryOp::Add, g, one_)?;
        let mut xv = if align {
            let s = k(ctx, &mut o, (df - 1.0) / 2.0);
            bin(ctx, &mut o, BinaryOp::Mul, g1, s)?
        } else {
            let s = k(ctx, &mut o, df);
            let v = bin(ctx, &mut o, BinaryOp::Mul, g1, s)?;
            let m1 = k(ctx, &mut o, 1.0);
            let v = bin(ctx, &mut o, BinaryOp::Sub, v, m1)?;
            let h = k(ctx, &mut o, 0.5);
            bin(ctx, &mut o, BinaryOp::Mul, v, h)?
        };
        if mode == "nearest" {
            xv = un(ctx, &mut o, UnaryOp::Round, xv)?;
        }
        let border = if align {
            (0.0, df - 1.0)
        } else {
            (-0.5, df - 0.5)
        };
        match pad {
            Pad::Zeros => {}
            Pad::Border => {
                let lo = k(ctx, &mut o, border.0);
                let hi = k(ctx, &mut o, border.1);
                let b = cmp(ctx, &mut o, CompareOp::Less, xv, lo)?;
                let a = cmp(ctx, &mut o, CompareOp::Greater, xv, hi)?;
                let out = ctx.op(
                    Op::Logical(LogicalOp::Or),
                    &[b, a],
                    Some(&o.name("outside")),
                )?;
                let cl = un(
                    ctx,
                    &mut o,
                    UnaryOp::Clip {
                        min: 0.0,
                        max: d as f32 - 1.0,
                    },
                    xv,
                )?;
                xv = sel(ctx, &mut o, out, cl, xv)?;
            }
            Pad::Reflection => {
                xv = reflect(ctx, &mut o, xv, border.0, border.1)?;
            }
        }
        axes_taps.push(taps(ctx, &mut o, xv, d, &mode, pad, border)?);
    }
    // Every combination of one tap per axis.
    let strides: Vec<usize> = (0..nd).map(|a| dims[a + 1..].iter().product()).collect();
    let s: usize = dims.iter().product();
    let flat_x = reshape_to(ctx, x, &[n, c, s], Some("image_flat"))?;
    let combos: usize = axes_taps.iter().map(|t| t.len()).product();
    let mut total: Option<Val> = None;
    for combo in 0..combos {
        let mut rest = combo;
        let mut flat: Option<Val> = None;
        let mut weight: Option<Val> = None;
        let mut valid: Option<Val> = None;
        for ax in (0..nd).rev() {
            let t = &axes_taps[ax][rest % axes_taps[ax].len()];
            rest /= axes_taps[ax].len();
            let st = super::build::int_scalar(ctx, strides[ax] as i64, &o.name("stride"))?;
            let part = ctx.op(
                Op::Binary(BinaryOp::Mul),
                &[t.index, st],
                Some(&o.name("offset")),
            )?;
            flat = Some(match flat {
                None => part,
                Some(f) => ctx.op(Op::Binary(BinaryOp::Add), &[f, part], Some(&o.name("flat")))?,
            });
            if let Some(w) = t.weight {
                weight = Some(match weight {
                    None => w,
                    Some(p) => bin(ctx, &mut o, BinaryOp::Mul, p, w)?,
                });
            }
            if let Some(v) = t.valid {
                valid = Some(match valid {
                    None => v,
                    Some(p) => {
                        ctx.op(Op::Logical(LogicalOp::And), &[p, v], Some(&o.name("valid")))?
                    }
                });
            }
        }
        let flat = flat.expect("nd ≥ 1");
        let fi = reshape_to(ctx, flat, &[n, 1, p], Some(&o.name("tap_index")))?;
        let fi = ctx.op(
            Op::Expand {
                shape: [n, c, p].into_iter().collect(),
            },
            &[fi],
            Some(&o.name("tap_index_channels")),
        )?;
        let name = o.name("tap");
        let mut v = gather_along(ctx, flat_x, fi, 2, Some(&name))?;
        if let Some(ok) = valid {
            let ok = reshape_to(ctx, ok, &[n, 1, p], Some(&o.name("valid_view")))?;
            let z = k(ctx, &mut o, 0.0);
            v = sel(ctx, &mut o, ok, v, z)?;
        }
        if let Some(w) = weight {
            let w = reshape_to(ctx, w, &[n, 1, p], Some(&o.name("weight_view")))?;
            v = bin(ctx, &mut o, BinaryOp::Mul, v, w)?;
        }
        total = Some(match total {
            None => v,
            Some(t) => bin(ctx, &mut o, BinaryOp::Add, t, v)?,
        });
    }
    let mut out = vec![n, c];
    out.extend(out_sp);
    one(reshape_to(
        ctx,
        total.expect("at least one tap"),
        &out,
        None,
    )?)
}

/// `AffineGrid` (opset 20): GridSample's grid for the affine transforms
/// θ (`[N, 2, 3]` or `[N, 3, 4]`) and the constant output `size`
/// (`[N, C, H, W]` or `[N, C, D, H, W]`): every output pixel's normalized
/// coordinates `(x, y[, z], 1)` (pixel centres, or the corners with
/// `align_corners`) times θᵀ, as one constant base grid and a batched
/// MatMul, like the ONNX reference.
pub fn affine_grid(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let theta = ctx.input(node, 0)?;
    let size = ctx.const_input(node, 1)?.to_i64_vec();
    let align_corners = ctx.attr_i_or(node, "align_corners", 0)? != 0;
    let tt = ctx.ty(theta).clone();
    let spatial = match size.len() {
        4 => 2,
        5 => 3,
        n => {
            return Err(ctx.invalid(format!(
                "size has {n} values; it must be [N, C, H, W] or [N, C, D, H, W]"
            )))
        }
    };
    let dims = size[2..]
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| ctx.invalid(format!("size {size:?} has a dimension below 1")))?;
    let batch = size[0];
    if !tt.dtype.is_float() || tt.shape.as_slice() != [batch as usize, spatial, spatial + 1] {
        return Err(ctx.invalid(format!(
            "theta is {tt}; size {size:?} needs a float [{batch}, {spatial}, {}]",
            spatial + 1
        )));
    }
    // Normalized coordinates along an axis of n pixels.
    let coords = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| match (align_corners, n) {
                (true, 1) => -1.0,
                (true, _) => -1.0 + 2.0 * i as f64 / (n - 1) as f64,
                (false, _) => -1.0 + (2 * i + 1) as f64 / n as f64,
            })
            .collect()
    };
    let axes: Vec<Vec<f64>> = dims.iter().map(|&n| coords(n)).collect();
    // One row per output pixel (row-major over D, H, W): x (along W)
    // first, then y, then z, then 1. Its size comes from the model, so it
    // is built within the generated-constant budget.
    let pixels = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| ctx.invalid(format!("size {size:?} overflows")))?;
    let dtype = tt.dtype;
    let base = build_const(ctx, &[pixels, spatial + 1], dtype, "base_grid", |_| {
        let mut base = Vec::with_capacity(pixels * (spatial + 1));
        for p in 0..pixels {
            let mut rest = p;
            let mut index = vec![0; spatial];
            for d in (0..spatial).rev() {
                index[d] = rest % dims[d];
                rest /= dims[d];
            }
            base.extend((0..spatial).rev().map(|d| axes[d][index[d]]));
            base.push(1.0);
        }
        kiln_ir::Data::from_f64s(dtype, base.into_iter())
    })?;
    let theta_t = ctx.op(
        Op::Transpose {
            perm: [0, 2, 1].into_iter().collect(),
        },
        &[theta],
        Some("theta_t"),
    )?;
    let grid = ctx.op(Op::MatMul, &[base, theta_t], Some("grid"))?;
    let mut shape = vec![batch as usize];
    shape.extend(&dims);
    shape.push(spatial);
    one(reshape_to(ctx, grid, &shape, None)?)
}

/// One axis of RoiAlign's sampling: per ROI and sample (`[R, S]`), the two
/// bilinear taps as one-hot rows over the axis's `size` pixels, weighted
/// (`[R, S, size]`, low tap then high tap); a sample outside `[-1, size]`
/// has weight 0, as in the reference.
struct RoiAxis {
    low: Val,
    high: Val,
}

/// The taps of the samples `coord` (`[R, S]`, f32) along an axis of `size`
/// pixels, with the reference's clamping (below 0 to 0, at or past the
/// last pixel to it).
fn roi_axis(
    ctx: &mut ImportCtx,
    o: &mut Ops,
    coord: Val,
    size: usize,
) -> Result<RoiAxis, OnnxError> {
    use BinaryOp::{Add, Mul, Sub};
    let (lo, hi) = (k(ctx, o, -1.0), k(ctx, o, size as f64));
    let above = cmp(ctx, o, CompareOp::GreaterOrEqual, coord, lo)?;
    let below = cmp(ctx, o, CompareOp::LessOrEqual, coord, hi)?;
    let name = o.name("valid");
    let valid = ctx.op(Op::Logical(LogicalOp::And), &[above, below], Some(&name))?;
    let zero = k(ctx, o, 0.0);
    let x = bin(ctx, o, BinaryOp::Max, coord, zero)?;
    let floor = un(ctx, o, UnaryOp::Floor, x)?;
    let last = k(ctx, o, (size - 1) as f64);
    let edge = cmp(ctx, o, CompareOp::GreaterOrEqual, floor, last)?;
    let low = sel(ctx, o, edge, last, floor)?;
    let x = sel(ctx, o, edge, low, x)?;
    let one = k(ctx, o, 1.0);
    let next = bin(ctx, o, Add, low, one)?;
    let high = sel(ctx, o, edge, last, next)?;
    let l = bin(ctx, o, Sub, x, low)?;
    let h = bin(ctx, o, Sub, one, l)?;
    let l = sel(ctx, o, valid, l, zero)?;
    let h = sel(ctx, o, valid, h, zero)?;
    // One-hot rows: [R, S, 1] against the pixel ramp [1, 1, size].
    let shape = ctx.ty(coord).shape.clone();
    let pixels = super::build::ramp(ctx, size, 2, 3, DType::F32, &o.name("pixels"))?;
    let mut row = |ctx: &mut ImportCtx, tap: Val, weight: Val| -> Result<Val, OnnxError> {
        let tap = reshape_to(ctx, tap, &[shape[0], shape[1], 1], Some(&o.name("tap")))?;
        let weight = reshape_to(
            ctx,
            weight,
            &[shape[0], shape[1], 1],
            Some(&o.name("weight")),
        )?;
        let hit = cmp(ctx, o, CompareOp::Equal, tap, pixels)?;
        let hit = cast_to(ctx, hit, DType::F32, &o.name("hit"))?;
        bin(ctx, o, Mul, hit, weight)
    };
    Ok(RoiAxis {
        low: row(ctx, low, h)?,
        high: row(ctx, high, l)?,
    })
}

/// `RoiAlign` (opsets 10 and 16; `sampling_ratio` > 0): per ROI, its box
/// (scaled, shifted by half a pixel in `half_pixel` mode, at least 1×1
/// otherwise) split into `output_height × output_width` bins of
/// `sampling_ratio²` bilinear samples. The sampling is separable: along
/// each axis the samples' two taps are weighted one-hot rows `A`
/// (`roi_axis`), so the samples of image `batch_indices[r]` are
/// `A_y · X · A_xᵀ` (two batched MatMuls); `avg` takes their mean per bin,
/// `max` (as the reference) the largest of the four weighted corners of
/// each sample, then the largest sample per bin.
pub fn roi_align(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    use BinaryOp::{Add, Div, Mul, Sub};
    let x = ctx.input(node, 0)?;
    let rois = ctx.input(node, 1)?;
    let batch_indices = ctx.input(node, 2)?;
    let xt = ctx.ty(x).clone();
    let rt = ctx.ty(rois).clone();
    if xt.shape.len() != 4 || !xt.dtype.is_float() {
        return Err(ctx.invalid(format!("X is {xt}; it must be a float [N, C, H, W]")));
    }
    if rt.shape.len() != 2 || rt.shape[1] != 4 || !rt.dtype.is_float() {
        return Err(ctx.invalid(format!("rois is {rt}; it must be a float [num_rois, 4]")));
    }
    let rois_n = rt.shape[0];
    if ctx.ty(batch_indices).shape.as_slice() != [rois_n] {
        return Err(ctx.invalid(format!("batch_indices must be [{rois_n}]")));
    }
    let (c, h, w) = (xt.shape[1], xt.shape[2], xt.shape[3]);
    let positive = |ctx: &ImportCtx, name: &str| -> Result<usize, OnnxError> {
        let v = ctx.attr_i_or(node, name, 1)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| ctx.bad_attr(name, format!("must be positive, got {v}")))
    };
    let (oh, ow) = (
        positive(ctx, "output_height")?,
        positive(ctx, "output_width")?,
    );
    let sr = ctx.attr_i_or(node, "sampling_ratio", 0)?;
    let sr = match usize::try_from(sr) {
        Ok(0) => {
            return Err(ctx.unsupported(
                "RoiAlign with sampling_ratio=0 (its sample count depends on the ROI sizes at run time); set sampling_ratio",
            ))
        }
        Ok(v) => v,
        Err(_) => return Err(ctx.bad_attr("sampling_ratio", "must be ≥ 0")),
    };
    // Samples per ROI along each axis.
    let (sh, sw) = match (oh.checked_mul(sr), ow.checked_mul(sr)) {
        (Some(sh), Some(sw)) => (sh, sw),
        _ => {
            return Err(ctx.bad_attr(
                "sampling_ratio",
                format!("{sr} samples per bin over {oh}×{ow} bins overflow"),
            ))
        }
    };
    let scale = ctx.attr_f_or(node, "spatial_scale", 1.0)? as f64;
    // Opset 16 added the mode, defaulting to half_pixel; opset 10 behaves
    // like output_half_pixel.
    let default_mode = if ctx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel = match ctx
        .attr_s(node, "coordinate_transformation_mode")?
        .as_deref()
        .unwrap_or(default_mode)
    {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => {
            return Err(ctx.bad_attr(
                "coordinate_transformation_mode",
                format!("unknown mode '{m}'"),
            ))
        }
    };
    let max_mode = match ctx.attr_s(node, "mode")?.as_deref().unwrap_or("avg") {
        "avg" => false,
        "max" => true,
        m => return Err(ctx.bad_attr("mode", format!("unknown mode '{m}'"))),
    };
    let o = &mut Ops { tag: "roi", n: 0 };
    let rois = cast_to(ctx, rois, DType::F32, "rois_f32")?;
    let column = |ctx: &mut ImportCtx, o: &mut Ops, i: usize| -> Result<Val, OnnxError> {
        let v = slice_along(ctx, rois, 1, i, 1, 1, &o.name("column"))?;
        let s = k(ctx, o, scale);
        let v = bin(ctx, o, Mul, v, s)?;
        let shift = k(ctx, o, if half_pixel { 0.5 } else { 0.0 });
        bin(ctx, o, Sub, v, shift)
    };
    let (x1, y1, x2, y2) = (
        column(ctx, o, 0)?,
        column(ctx, o, 1)?,
        column(ctx, o, 2)?,
        column(ctx, o, 3)?,
    );
    // Sample coordinates `start + bin · (p + (i + 0.5) / sr)`, `[R, bins·sr]`.
    let samples = |ctx: &mut ImportCtx,
                   o: &mut Ops,
                   start: Val,
                   end: Val,
                   (bins, n): (usize, usize)|
     -> Result<Val, OnnxError> {
        let mut extent = bin(ctx, o, Sub, end, start)?;
        if !half_pixel {
            let one = k(ctx, o, 1.0);
            extent = bin(ctx, o, BinaryOp::Max, extent, one)?;
        }
        let count = k(ctx, o, bins as f64);
        let step = bin(ctx, o, Div, extent, count)?;
        let offsets = build_const(ctx, &[1, n], DType::F32, &o.name("offsets"), |_| {
            kiln_ir::Data::F32(
                (0..n)
                    .map(|s| ((s / sr) as f64 + ((s % sr) as f64 + 0.5) / sr as f64) as f32)
                    .collect(),
            )
        })?;
        let along = bin(ctx, o, Mul, step, offsets)?;
        bin(ctx, o, Add, start, along)
    };
    let ys = samples(ctx, o, y1, y2, (oh, sh))?;
    let xs = samples(ctx, o, x1, x2, (ow, sw))?;
    let ay = roi_axis(ctx, o, ys, h)?;
    let ax = roi_axis(ctx, o, xs, w)?;
    // Each ROI's image, in f32.
    let xf = cast_to(ctx, x, DType::F32, "x_f32")?;
    let idx = cast_to(ctx, batch_indices, DType::I64, "batch_indices_i64")?;
    let images = ctx.op(Op::Gather { axis: 0 }, &[xf, idx], Some("roi_images"))?;
    let product =
        |ctx: &mut ImportCtx, o: &mut Ops, a_y: Val, a_x: Val| -> Result<Val, OnnxError> {
            let a_y = reshape_to(ctx, a_y, &[rois_n, 1, sh, h], Some(&o.name("rows")))?;
            let a_x = ctx.op(
                Op::Transpose {
                    perm: [0, 2, 1].into_iter().collect(),
                },
                &[a_x],
                Some(&o.name("columns_t")),
            )?;
            let a_x = reshape_to(ctx, a_x, &[rois_n, 1, w, sw], Some(&o.name("columns")))?;
            let name = o.name("sampled_rows");
            let t = ctx.op(Op::MatMul, &[a_y, images], Some(&name))?;
            let name = o.name("samples");
            ctx.op(Op::MatMul, &[t, a_x], Some(&name))
        };
    let (reduce, values) = if max_mode {
        let mut best: Option<Val> = None;
        for a_y in [ay.low, ay.high] {
            for a_x in [ax.low, ax.high] {
                let corner = product(ctx, o, a_y, a_x)?;
                best = Some(match best {
                    None => corner,
                    Some(b) => bin(ctx, o, BinaryOp::Max, b, corner)?,
                });
            }
        }
        (kiln_ir::ReduceOp::Max, best.expect("four corners"))
    } else {
        let a_y = bin(ctx, o, Add, ay.low, ay.high)?;
        let a_x = bin(ctx, o, Add, ax.low, ax.high)?;
        (kiln_ir::ReduceOp::Mean, product(ctx, o, a_y, a_x)?)
    };
    let values = reshape_to(ctx, values, &[rois_n, c, oh, sr, ow, sr], Some("bins"))?;
    let pooled = ctx.op(
        Op::Reduce {
            op: reduce,
            axes: [3, 5].into_iter().collect(),
            keep_dims: false,
        },
        &[values],
        Some("pooled"),
    )?;
    one(cast_to(ctx, pooled, xt.dtype, "y")?)
}

/// `DeformConv` (opset 19, 2-D): a convolution whose every tap samples the
/// input at its regular position plus a learned offset, bilinearly with
/// zeros outside the image (the ONNX reference's GridSample with
/// `align_corners=1` on pixel coordinates), optionally times a mask.
///
/// Per offset group `g`, tap `t = (i, j)` and output pixel `p = (y, x)`,
/// the sample position is `(y·sh − pad_top + i·dh + Δy, x·sw − pad_left +
/// j·dw + Δx)` (`[N, G, K, P]`). Its four bilinear corners are rows of the
/// input viewed as `[N·G·H·W, C/G]` (one Gather per corner, indices
/// `(n·G + g)·H·W + iy·W + ix`, so the channels share each index), weighted
/// by the corner's weight, validity and the mask and summed into the
/// sampled columns `[N, C, K, P]`; the convolution is then one batched
/// MatMul per group of those columns with the weights `[oC/grp, C/grp·K]`,
/// plus the bias.
pub fn deform_conv(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    use BinaryOp::{Add, Mul};
    let x = ctx.input(node, 0)?;
    let w = ctx.input(node, 1)?;
    let offset = ctx.input(node, 2)?;
    let bias = ctx.opt_input(node, 3);
    let mask = ctx.opt_input(node, 4);
    let (xt, wt, ot) = (ctx.ty(x).clone(), ctx.ty(w).clone(), ctx.ty(offset).clone());
    if xt.shape.len() != 4 || wt.shape.len() != 4 || ot.shape.len() != 4 || !xt.dtype.is_float() {
        return Err(ctx.unsupported(format!(
            "DeformConv of X {xt}, W {wt}, offset {ot}: only 2-D float convolutions"
        )));
    }
    let c = super::window::conv_attrs(ctx, node, &xt.shape, &wt.shape)?;
    let (n, ch, h, wd) = (xt.shape[0], xt.shape[1], xt.shape[2], xt.shape[3]);
    let (oc, cg, kh, kw) = (wt.shape[0], wt.shape[1], wt.shape[2], wt.shape[3]);
    let groups = c.group;
    if ch != cg * groups || oc % groups != 0 {
        return Err(ctx.invalid(format!(
            "X {xt} and W {wt} do not form a convolution in {groups} groups"
        )));
    }
    let og = ctx.attr_i_or(node, "offset_group", 1)?;
    let og = usize::try_from(og)
        .ok()
        .filter(|&g| g > 0 && ch % g == 0)
        .ok_or_else(|| {
            ctx.bad_attr(
                "offset_group",
                format!("must be positive and divide the {ch} channels, got {og}"),
            )
        })?;
    // W's element count fits, so its kernel area does too.
    let taps = kh * kw;
    let out_len = |size: usize, k: usize, d: usize, pads: usize, s: usize| {
        let extent = k.checked_sub(1)?.checked_mul(d)?.checked_add(1)?;
        size.checked_add(pads)?
            .checked_sub(extent)
            .map(|v| v / s + 1)
    };
    let (oh, ow) = (ot.shape[2], ot.shape[3]);
    let expected = (
        out_len(h, kh, c.dilations[0], c.pads[0] + c.pads[2], c.strides[0]),
        out_len(wd, kw, c.dilations[1], c.pads[1] + c.pads[3], c.strides[1]),
    );
    let offsets = og.checked_mul(2 * taps);
    if ot.shape[0] != n || offsets != Some(ot.shape[1]) || expected != (Some(oh), Some(ow)) {
        return Err(ctx.invalid(format!(
            "offset {ot} must be [{n}, offset_group·2·kH·kW ({offsets:?}), out_h, out_w] with the output size the window gives ({expected:?})"
        )));
    }
    let p = oh * ow;
    if let Some(m) = mask {
        let mt = ctx.ty(m).clone();
        if mt.shape.as_slice() != [n, og * taps, oh, ow] {
            return Err(ctx.invalid(format!(
                "mask {mt} must be [{n}, {}, {oh}, {ow}]",
                og * taps
            )));
        }
    }
    let o = &mut Ops { tag: "dcn", n: 0 };
    let xf = cast_to(ctx, x, DType::F32, "x_f32")?;
    let wf = cast_to(ctx, w, DType::F32, "w_f32")?;
    let off = cast_to(ctx, offset, DType::F32, "offset_f32")?;
    let off = reshape_to(ctx, off, &[n, og, taps, 2, p], Some("offset_taps"))?;
    // Regular sample positions per (tap, pixel) along one axis.
    let base = |ctx: &mut ImportCtx, o: &mut Ops, axis: usize| -> Result<Val, OnnxError> {
        let (s, d, pad) = (c.strides[axis], c.dilations[axis], c.pads[axis] as f64);
        build_const(ctx, &[1, 1, taps, p], DType::F32, &o.name("base"), |len| {
            kiln_ir::Data::F32(
                (0..len)
                    .map(|e| {
                        let (t, q) = (e / p, e % p);
                        let (k, out) = if axis == 0 {
                            (t / kw, q / ow)
                        } else {
                            (t % kw, q % ow)
                        };
                        ((out * s + k * d) as f64 - pad) as f32
                    })
                    .collect(),
            )
        })
    };
    let mut axis_taps = Vec::with_capacity(2);
    for (axis, size) in [(0, h), (1, wd)] {
        let delta = slice_along(ctx, off, 3, axis, 1, 1, &o.name("delta"))?;
        let delta = reshape_to(ctx, delta, &[n, og, taps, p], Some(&o.name("delta_view")))?;
        let b = base(ctx, o, axis)?;
        let pos = bin(ctx, o, Add, delta, b)?;
        let border = (0.0, size as f64 - 1.0);
        axis_taps.push(self::taps(ctx, o, pos, size, "linear", Pad::Zeros, border)?);
    }
    let mask = match mask {
        Some(m) => {
            let m = cast_to(ctx, m, DType::F32, "mask_f32")?;
            Some(reshape_to(ctx, m, &[n, og, taps, p], Some("mask_view"))?)
        }
        None => None,
    };
    // The input as rows of one pixel of one offset group: [N·G·H·W, C/G].
    let cog = ch / og;
    let rows = reshape_to(ctx, xf, &[n, og, cog, h * wd], Some("x_groups"))?;
    let rows = ctx.op(
        Op::Transpose {
            perm: [0, 1, 3, 2].into_iter().collect(),
        },
        &[rows],
        Some("x_pixels"),
    )?;
    let rows = reshape_to(ctx, rows, &[n * og * h * wd, cog], Some("x_rows"))?;
    let plane = build_const(ctx, &[n, og, 1, 1], DType::I64, &o.name("plane"), |len| {
        kiln_ir::Data::I64((0..len).map(|e| (e * h * wd) as i64).collect())
    })?;
    let width = super::build::int_scalar(ctx, wd as i64, &o.name("width"))?;
    let mut columns: Option<Val> = None;
    for ty in &axis_taps[0] {
        for tx in &axis_taps[1] {
            let at = bin(ctx, o, Mul, ty.index, width)?;
            let at = bin(ctx, o, Add, at, tx.index)?;
            let at = bin(ctx, o, Add, at, plane)?;
            let name = o.name("corner");
            // [N, G, K, P, C/G]
            let v = ctx.op(Op::Gather { axis: 0 }, &[rows, at], Some(&name))?;
            let weight = match (ty.weight, tx.weight) {
                (Some(a), Some(b)) => bin(ctx, o, Mul, a, b)?,
                _ => unreachable!("linear taps have weights"),
            };
            let valid = match (ty.valid, tx.valid) {
                (Some(a), Some(b)) => {
                    ctx.op(Op::Logical(LogicalOp::And), &[a, b], Some(&o.name("valid")))?
                }
                _ => unreachable!("zeros padding gives validity"),
            };
            let zero = k(ctx, o, 0.0);
            let mut weight = sel(ctx, o, valid, weight, zero)?;
            if let Some(m) = mask {
                weight = bin(ctx, o, Mul, weight, m)?;
            }
            let weight = reshape_to(ctx, weight, &[n, og, taps, p, 1], Some(&o.name("weight")))?;
            let v = bin(ctx, o, Mul, v, weight)?;
            columns = Some(match columns {
                None => v,
                Some(sum) => bin(ctx, o, Add, sum, v)?,
            });
        }
    }
    let columns = columns.expect("four corners");
    // [N, G, K, P, C/G] → [N, C, K, P] → [N, grp, C/grp·K, P].
    let columns = ctx.op(
        Op::Transpose {
            perm: [0, 1, 4, 2, 3].into_iter().collect(),
        },
        &[columns],
        Some("columns_channels"),
    )?;
    let columns = reshape_to(ctx, columns, &[n, groups, cg * taps, p], Some("columns"))?;
    let weights = reshape_to(ctx, wf, &[groups, oc / groups, cg * taps], Some("w_rows"))?;
    let y = ctx.op(Op::MatMul, &[weights, columns], Some("conv"))?;
    let mut y = reshape_to(ctx, y, &[n, oc, oh, ow], Some("y_f32"))?;
    if let Some(b) = bias {
        let b = cast_to(ctx, b, DType::F32, "bias_f32")?;
        let b = reshape_to(ctx, b, &[1, oc, 1, 1], Some("bias_view"))?;
        y = bin(ctx, o, Add, y, b)?;
    }
    one(cast_to(ctx, y, xt.dtype, "y")?)
}
