//! Index computations, decomposed into existing IR ops: `Range` and `Size`
//! (folded at import), `ArgMax`/`ArgMin` and `Hardmax` (a max, an equality
//! mask and a min over an index ramp), `OneHot` (an equality with a ramp),
//! `GatherElements`/`GatherND` (flat indices computed from the index tensor,
//! then one `Gather` on the flattened data) and `CumSum` (a product with a
//! triangular 0/1 mask, summed).

use super::build::{build_const, gen_const, int_scalar, ramp};
use super::build::{cast_to, reshape_to, slice_along};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, Ints, Op, ReduceOp, Tensor, ValueType};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// `v` as i64 with negative entries shifted up by `bound` (which broadcasts
/// against `v`), the ONNX convention for indices counted from the end.
pub(crate) fn wrap_negative(
    ctx: &mut ImportCtx,
    v: Val,
    bound: Val,
    tag: &str,
) -> Result<Val, OnnxError> {
    let v = cast_to(ctx, v, DType::I64, &format!("{tag}_i64"))?;
    let zero = int_scalar(ctx, 0, &format!("{tag}_zero"))?;
    let neg = ctx.op(
        Op::Compare(CompareOp::Less),
        &[v, zero],
        Some(&format!("{tag}_negative")),
    )?;
    let up = ctx.op(
        Op::Binary(BinaryOp::Add),
        &[v, bound],
        Some(&format!("{tag}_wrapped")),
    )?;
    ctx.op(Op::Where, &[neg, up, v], Some(&format!("{tag}_index")))
}

/// `Range`: folded when start, limit and delta are constants; a run-time
/// bound would make the output length data-dependent.
pub fn range(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let hint =
        "Range needs constant start, limit and delta (its length would depend on run-time data)";
    let mut args = Vec::with_capacity(3);
    for i in 0..3 {
        let v = ctx.input(node, i)?;
        match ctx.konst(v) {
            Some(t) if t.len() == 1 => args.push(t.clone()),
            Some(t) => {
                return Err(ctx.invalid(format!(
                    "input {i} must be a scalar, got shape {:?}",
                    t.shape().as_slice()
                )))
            }
            None => return Err(ctx.not_constant(v, hint)),
        }
    }
    let dtype = args[0].dtype();
    let (len, data) = if dtype.is_float() {
        let [s, l, d] = [0, 1, 2].map(|i| args[i].to_f64_vec()[0]);
        if d == 0.0 || !d.is_finite() || !s.is_finite() || !l.is_finite() {
            return Err(ctx.invalid(format!("invalid Range({s}, {l}, {d})")));
        }
        let n = ((l - s) / d).ceil().max(0.0);
        if n > (ctx.opts.max_initializer_bytes / dtype.size_bytes() as u64) as f64 {
            return Err(ctx.invalid(format!("Range({s}, {l}, {d}) is too long")));
        }
        let n = n as usize;
        (n, Data::from_f64s(dtype, (0..n).map(|i| s + i as f64 * d)))
    } else {
        let [s, l, d] = [0, 1, 2].map(|i| args[i].to_i64_vec()[0] as i128);
        if d == 0 {
            return Err(ctx.invalid("Range delta is 0"));
        }
        let n = if d > 0 {
            (l - s + d - 1).div_euclid(d)
        } else {
            (s - l - d - 1).div_euclid(-d)
        }
        .max(0);
        if n > (ctx.opts.max_initializer_bytes / dtype.size_bytes() as u64) as i128 {
            return Err(ctx.invalid(format!("Range({s}, {l}, {d}) is too long")));
        }
        let n = n as usize;
        (
            n,
            Data::from_i64s(dtype, (0..n).map(|i| (s + i as i128 * d) as i64)),
        )
    };
    let name = ctx.node_name().to_string();
    let t = Tensor::new([len], data).expect("len elements");
    one(ctx.generated_constant(t, name)?)
}

/// `Size`: the static element count as an i64 scalar.
pub fn size(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    ctx.static_shape_of(x, "Size")?;
    let n = ctx.ty(x).num_elements() as i64;
    let name = ctx.node_name().to_string();
    one(ctx.constant(Tensor::new([], Data::I64(vec![n])).expect("scalar"), name))
}

/// The index (i64, kept dims) of the first (or last) extreme of `x` along
/// `axis`: positions equal to the reduced extreme keep their index, others
/// get a value that loses the final min (max) reduction.
pub(crate) fn arg_extreme(
    ctx: &mut ImportCtx,
    x: Val,
    axis: usize,
    max: bool,
    last: bool,
    keep_dims: bool,
    suffix: Option<&str>,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let n = xt.shape[axis];
    if n == 0 {
        return Err(ctx.invalid(format!(
            "cannot take the arg extreme of an empty axis in {xt}"
        )));
    }
    let op = if max { ReduceOp::Max } else { ReduceOp::Min };
    let axes: Ints = [axis].into_iter().collect();
    let m = ctx.op(
        Op::Reduce {
            op,
            axes: axes.clone(),
            keep_dims: true,
        },
        &[x],
        Some("extreme"),
    )?;
    let hit = ctx.op(Op::Compare(CompareOp::Equal), &[x, m], Some("is_extreme"))?;
    let idx = ramp(ctx, n, axis, rank, DType::I64, "positions")?;
    let miss = int_scalar(ctx, if last { -1 } else { n as i64 }, "miss")?;
    let cand = ctx.op(Op::Where, &[hit, idx, miss], Some("candidates"))?;
    let pick = if last { ReduceOp::Max } else { ReduceOp::Min };
    ctx.op(
        Op::Reduce {
            op: pick,
            axes,
            keep_dims,
        },
        &[cand],
        suffix,
    )
}

fn arg(ctx: &mut ImportCtx, node: &NodeProto, max: bool) -> R {
    let x = ctx.input(node, 0)?;
    let rank = ctx.ty(x).shape.len();
    let axis = ctx.attr_i_or(node, "axis", 0)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let keep_dims = ctx.attr_i_or(node, "keepdims", 1)? != 0;
    let last = ctx.opset >= 12 && ctx.attr_i_or(node, "select_last_index", 0)? != 0;
    let dt = ctx.ty(x).dtype;
    if !(dt.is_float() || dt.is_int()) {
        return Err(ctx.unsupported(format!("{} on {dt} is not supported", node.op_type)));
    }
    one(arg_extreme(ctx, x, axis, max, last, keep_dims, None)?)
}

/// `ArgMax` (`select_last_index` from opset 12).
pub fn arg_max(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    arg(ctx, node, true)
}

/// `ArgMin` (`select_last_index` from opset 12).
pub fn arg_min(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    arg(ctx, node, false)
}

/// `Hardmax`: 1 at the first maximum along the axis, 0 elsewhere. Before
/// opset 13 over the input flattened to 2-D at `axis` (default 1).
pub fn hardmax(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let (view, axis) = if ctx.opset >= 13 {
        let axis = ctx.attr_i_or(node, "axis", -1)?;
        (x, ctx.axis("axis", axis, rank)?)
    } else {
        let axis = ctx.attr_i_or(node, "axis", 1)?;
        let a = if axis < 0 { axis + rank as i64 } else { axis };
        if a < 0 || a as usize > rank {
            return Err(ctx.bad_attr(
                "axis",
                format!("axis {axis} is out of range for rank {rank}"),
            ));
        }
        let a = a as usize;
        let outer: usize = xt.shape[..a].iter().product();
        let inner: usize = xt.shape[a..].iter().product();
        (reshape_to(ctx, x, &[outer, inner], Some("flatten"))?, 1)
    };
    let vt = ctx.ty(view).clone();
    let at = arg_extreme(ctx, view, axis, true, false, true, Some("argmax"))?;
    let idx = ramp(
        ctx,
        vt.shape[axis],
        axis,
        vt.shape.len(),
        DType::I64,
        "positions",
    )?;
    let hit = ctx.op(Op::Compare(CompareOp::Equal), &[idx, at], Some("is_max"))?;
    let y = ctx.op(Op::Cast { to: xt.dtype }, &[hit], Some("hard"))?;
    one(reshape_to(ctx, y, &xt.shape, None)?)
}

/// `OneHot`: `depth` and `values` must be constants; indices may be run-time
/// (negative ones count from `depth`, out-of-range ones give an all-off row).
pub fn one_hot(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let idx = ctx.input(node, 0)?;
    let depth = ctx.const_input(node, 1)?;
    let values = ctx.input(node, 2)?;
    if depth.len() != 1 {
        return Err(ctx.invalid("depth must hold one value"));
    }
    let depth = depth.to_f64_vec()[0];
    if !(depth >= 1.0 && depth <= (1u64 << 31) as f64) {
        return Err(ctx.invalid(format!("invalid depth {depth}")));
    }
    let depth = depth as usize;
    if ctx.ty(values).num_elements() != 2 {
        return Err(ctx.invalid("values must hold [off, on]"));
    }
    let it = ctx.ty(idx).clone();
    let rank = it.shape.len() + 1;
    let axis = ctx.attr_i_or(node, "axis", -1)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let bound = int_scalar(ctx, depth as i64, "depth")?;
    let i = wrap_negative(ctx, idx, bound, "indices")?;
    let mut shape: Vec<usize> = it.shape.to_vec();
    shape.insert(axis, 1);
    let i = reshape_to(ctx, i, &shape, Some("indices_axis"))?;
    let pos = ramp(ctx, depth, axis, rank, DType::I64, "positions")?;
    let hit = ctx.op(Op::Compare(CompareOp::Equal), &[i, pos], Some("hot"))?;
    let values = reshape_to(ctx, values, &[2], Some("values_flat"))?;
    let pick = |ctx: &mut ImportCtx, k: usize, tag: &str| -> Result<Val, OnnxError> {
        let s = kiln_ir::SliceAxis {
            start: k,
            step: 1,
            len: 1,
        };
        let v = ctx.op(
            Op::Slice {
                axes: [s].into_iter().collect(),
            },
            &[values],
            Some(tag),
        )?;
        reshape_to(ctx, v, &[], Some(&format!("{tag}_scalar")))
    };
    let off = pick(ctx, 0, "off")?;
    let on = pick(ctx, 1, "on")?;
    one(ctx.op(Op::Where, &[hit, on, off], None)?)
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `GatherElements`: `out[p] = data[p with p[axis] = idx[p]]`, as a Gather
/// on the flattened data at `idx[p]·stride[axis] + Σ_{k≠axis} p[k]·stride[k]`
/// (the second term a constant of the index shape).
pub fn gather_elements(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let data = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let axis = ctx.attr_i_or(node, "axis", 0)?;
    let axis = ctx.axis("axis", axis, ctx.ty(data).shape.len())?;
    one(gather_along(ctx, data, idx, axis, None)?)
}

/// The GatherElements decomposition for `data`, `idx` and a resolved `axis`.
pub(crate) fn gather_along(
    ctx: &mut ImportCtx,
    data: Val,
    idx: Val,
    axis: usize,
    suffix: Option<&str>,
) -> Result<Val, OnnxError> {
    let dt = ctx.ty(data).clone();
    let it = ctx.ty(idx).clone();
    let rank = dt.shape.len();
    if it.shape.len() != rank || rank == 0 {
        return Err(ctx.invalid(format!("indices {it} must have the rank of data {dt}")));
    }
    let flat_idx = elements_flat_index(ctx, &dt, idx, axis)?;
    let flat = reshape_to(ctx, data, &[dt.num_elements()], Some("flat"))?;
    ctx.op(Op::Gather { axis: 0 }, &[flat, flat_idx], suffix)
}

/// The flat position in data of type `dt` of every element of the
/// GatherElements / ScatterElements index tensor `idx` (of data's rank)
/// along `axis`: `idx·stride[axis]` (negative indices wrapped) plus the
/// element's own offset in the other dims, a constant of the index shape.
pub(crate) fn elements_flat_index(
    ctx: &mut ImportCtx,
    dt: &ValueType,
    idx: Val,
    axis: usize,
) -> Result<Val, OnnxError> {
    let it = ctx.ty(idx).clone();
    let rank = dt.shape.len();
    if let Some(k) = (0..rank).find(|&k| k != axis && it.shape[k] > dt.shape[k]) {
        return Err(ctx.invalid(format!("indices {it} exceed data {dt} along axis {k}")));
    }
    let ds = strides(&dt.shape);
    let is = strides(&it.shape);
    let count = it.num_elements();
    ctx.charge_generated(count as u64 * 8)?;
    let base: Vec<i64> = (0..count)
        .map(|f| {
            (0..rank)
                .filter(|&k| k != axis)
                .map(|k| ((f / is[k]) % it.shape[k] * ds[k]) as i64)
                .sum()
        })
        .collect();
    let base = gen_const(
        ctx,
        Tensor::new(&it.shape, Data::I64(base)).expect("count"),
        "base",
    )?;
    let bound = int_scalar(ctx, dt.shape[axis] as i64, "axis_len")?;
    let i = wrap_negative(ctx, idx, bound, "indices")?;
    let stride = int_scalar(ctx, ds[axis] as i64, "stride")?;
    let off = ctx.op(Op::Binary(BinaryOp::Mul), &[i, stride], Some("offset"))?;
    ctx.op(Op::Binary(BinaryOp::Add), &[off, base], Some("flat_index"))
}

/// `GatherND` (`batch_dims` from opset 12): the last index axis (length K)
/// addresses the K dims after the batch dims; the flat position
/// `Σ idx[..,k]·stride[k]` (plus the batch offset) feeds one Gather on data
/// reshaped to `[batch·prod(dims[b..b+K]), rest..]`.
pub fn gather_nd(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let data = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let dt = ctx.ty(data).clone();
    let it = ctx.ty(idx).clone();
    let b = ctx.attr_i_or(node, "batch_dims", 0)?;
    let (r, q) = (dt.shape.len(), it.shape.len());
    if b < 0 || b as usize >= r.min(q) {
        return Err(ctx.bad_attr(
            "batch_dims",
            format!("{b} is out of range for {dt} and {it}"),
        ));
    }
    let b = b as usize;
    let k = it.shape[q - 1];
    if k < 1 || b + k > r {
        return Err(ctx.invalid(format!(
            "the last index dim {k} does not fit data {dt} after {b} batch dims"
        )));
    }
    if dt.shape[..b] != it.shape[..b] {
        return Err(ctx.invalid(format!("batch dims of {dt} and {it} differ")));
    }
    let addressed = &dt.shape[b..b + k];
    let block: usize = addressed.iter().product();
    let batch: usize = dt.shape[..b].iter().product();
    let rest = &dt.shape[b + k..];
    // Per-component bounds and strides, broadcast along the last index axis.
    let mut kshape = vec![1; q];
    kshape[q - 1] = k;
    let dims = Tensor::new(
        &kshape,
        Data::I64(addressed.iter().map(|&d| d as i64).collect()),
    )
    .expect("k");
    let dims = gen_const(ctx, dims, "dims")?;
    let st = Tensor::new(
        &kshape,
        Data::I64(strides(addressed).iter().map(|&s| s as i64).collect()),
    )
    .expect("k");
    let st = gen_const(ctx, st, "strides")?;
    let i = wrap_negative(ctx, idx, dims, "indices")?;
    let scaled = ctx.op(Op::Binary(BinaryOp::Mul), &[i, st], Some("scaled"))?;
    let mut pos = ctx.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: [q - 1].into_iter().collect(),
            keep_dims: false,
        },
        &[scaled],
        Some("position"),
    )?;
    let out_lead = &it.shape[..q - 1];
    if b > 0 {
        let inner: usize = out_lead[b..].iter().product();
        let n: usize = out_lead.iter().product();
        ctx.charge_generated(n as u64 * 8)?;
        let off: Vec<i64> = (0..n)
            .map(|f| ((f / inner.max(1)) * block) as i64)
            .collect();
        let off = gen_const(
            ctx,
            Tensor::new(out_lead, Data::I64(off)).expect("n"),
            "batch_offset",
        )?;
        pos = ctx.op(
            Op::Binary(BinaryOp::Add),
            &[pos, off],
            Some("batch_position"),
        )?;
    }
    let mut flat_shape = vec![batch * block];
    flat_shape.extend_from_slice(rest);
    let flat = reshape_to(ctx, data, &flat_shape, Some("flat"))?;
    one(ctx.op(Op::Gather { axis: 0 }, &[flat, pos], None)?)
}

/// `CumSum` and `CumProd` along one axis: `y_j` reduces the `x_i` selected
/// by a constant 0/1 mask `M[i, j]` (chosen by `exclusive` and `reverse`);
/// unselected terms are the neutral element (0 for the sum, 1 for the
/// product), so the reduction over `i` is exact. The masked terms hold `n²`
/// times the other dims, which suits the short axes of position-id
/// computations, not long scans. A run-time axis computes the scan along
/// every axis and selects the one the value names.
fn scan(ctx: &mut ImportCtx, node: &NodeProto, product: bool) -> R {
    let x = ctx.input(node, 0)?;
    let axis_v = ctx.input(node, 1)?;
    if ctx.ty(axis_v).num_elements() != 1 {
        return Err(ctx.invalid("axis must be a scalar"));
    }
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    if rank == 0 {
        return Err(ctx.invalid("the input must have rank ≥ 1"));
    }
    if !(xt.dtype.is_float() || xt.dtype.is_int()) {
        return Err(ctx.unsupported(format!("{} on {} is not supported", node.op_type, xt.dtype)));
    }
    match ctx.konst(axis_v) {
        Some(t) => {
            let axis = ctx.axis("axis", t.to_i64_vec()[0], rank)?;
            one(scan_along(ctx, node, x, axis, product, None)?)
        }
        None => {
            let a = reshape_to(ctx, axis_v, &[], Some("axis_scalar"))?;
            let a = cast_to(ctx, a, DType::I64, "axis_i64")?;
            let mut y = scan_along(ctx, node, x, 0, product, Some("along0"))?;
            for k in 1..rank {
                let yk = scan_along(ctx, node, x, k, product, Some(&format!("along{k}")))?;
                let pos = int_scalar(ctx, k as i64, &format!("axis{k}"))?;
                let neg = int_scalar(ctx, k as i64 - rank as i64, &format!("axis{k}_neg"))?;
                let p = ctx.op(
                    Op::Compare(CompareOp::Equal),
                    &[a, pos],
                    Some(&format!("is_axis{k}")),
                )?;
                let q = ctx.op(
                    Op::Compare(CompareOp::Equal),
                    &[a, neg],
                    Some(&format!("is_axis{k}_neg")),
                )?;
                let hit = ctx.op(
                    Op::Logical(kiln_ir::LogicalOp::Or),
                    &[p, q],
                    Some(&format!("picks_axis{k}")),
                )?;
                y = ctx.op(Op::Where, &[hit, yk, y], Some(&format!("select{k}")))?;
            }
            one(y)
        }
    }
}

fn scan_along(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    x: Val,
    axis: usize,
    product: bool,
    suffix: Option<&str>,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let exclusive = ctx.attr_i_or(node, "exclusive", 0)? != 0;
    let reverse = ctx.attr_i_or(node, "reverse", 0)? != 0;
    let n = xt.shape[axis];
    let other: usize = xt.num_elements() / n.max(1);
    let work = (n as u64)
        .saturating_mul(n as u64)
        .saturating_mul(other as u64);
    if work > 1 << 24 {
        return Err(ctx.unsupported(format!(
            "{} over an axis of {n} (with {other} other elements) is too large for Kiln's masked form",
            node.op_type
        )));
    }
    let tag = |s: &str| match suffix {
        Some(p) => format!("{p}_{s}"),
        None => s.to_string(),
    };
    // x as [.., n, 1, ..] against M as [n, n, 1..]: the reduction runs over axis.
    let mut xs: Vec<usize> = xt.shape.to_vec();
    xs.insert(axis + 1, 1);
    let xv = reshape_to(ctx, x, &xs, Some(&tag("rows")))?;
    let mask: Vec<bool> = (0..n * n)
        .map(|f| {
            let (i, j) = (f / n, f % n);
            match (reverse, exclusive) {
                (false, false) => i <= j,
                (false, true) => i < j,
                (true, false) => i >= j,
                (true, true) => i > j,
            }
        })
        .collect();
    let mut ms = vec![n, n];
    ms.resize(rank + 1 - axis, 1);
    ctx.charge_generated((n * n) as u64)?;
    let mask = gen_const(
        ctx,
        Tensor::new(&ms, Data::Bool(mask)).expect("n*n"),
        &tag("mask"),
    )?;
    let neutral = gen_const(
        ctx,
        Tensor::new(
            [],
            Data::from_i64s(xt.dtype, std::iter::once(i64::from(product))),
        )
        .expect("scalar"),
        &tag("neutral"),
    )?;
    let terms = ctx.op(Op::Where, &[mask, xv, neutral], Some(&tag("terms")))?;
    ctx.op(
        Op::Reduce {
            op: if product {
                ReduceOp::Prod
            } else {
                ReduceOp::Sum
            },
            axes: [axis].into_iter().collect(),
            keep_dims: false,
        },
        &[terms],
        suffix,
    )
}

/// `CumSum`.
pub fn cumsum(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    scan(ctx, node, false)
}

/// `CumProd` (opset 26).
pub fn cumprod(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    scan(ctx, node, true)
}

/// Most elements of the pairwise comparison table TopK builds.
const TOPK_PAIR_LIMIT: u64 = 1 << 24;

/// `TopK` (k an attribute before opset 10, an input from 10;
/// `largest`/`sorted` from 11), by ranks: element `i`'s rank counts the
/// elements that beat it (greater, or equal at a smaller index, so ties
/// keep index order), and output position `r` selects the element of rank
/// `r`. The comparison table has `n²` entries per slice, so long axes are
/// refused. A run-time k ranks every position and marks the outputs with
/// k as their run's length (`docs/bounded.md`).
pub fn top_k(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let mut run_time_k = None;
    let k = if ctx.opset < 10 {
        ctx.attr_i(node, "k")?
            .ok_or_else(|| ctx.bad_attr("k", "is required"))?
    } else {
        let k = ctx.input(node, 1)?;
        match ctx.konst(k) {
            Some(t) if t.len() == 1 => t.to_i64_vec()[0],
            Some(_) => return Err(ctx.invalid("K must hold one value")),
            None if ctx.ty(k).num_elements() != 1 => {
                return Err(ctx.invalid("K must hold one value"))
            }
            // A run-time k: every position ranked, the first k real.
            None => {
                let axis = ctx.attr_i_or(node, "axis", -1)?;
                let axis = ctx.axis("axis", axis, rank)?;
                run_time_k = Some((k, axis));
                xt.shape[axis] as i64
            }
        }
    };
    let axis = ctx.attr_i_or(node, "axis", -1)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let largest = ctx.opset < 11 || ctx.attr_i_or(node, "largest", 1)? != 0;
    let n = xt.shape[axis];
    if k < 0 || k as usize > n {
        return Err(ctx.invalid(format!("k = {k} is out of range for an axis of {n}")));
    }
    let k = k as usize;
    if !(xt.dtype.is_float() || xt.dtype.is_int()) {
        return Err(ctx.unsupported(format!("TopK on {}", xt.dtype)));
    }
    let other = (xt.num_elements() / n.max(1)) as u64;
    if (n as u64).saturating_mul(n as u64).saturating_mul(other) > TOPK_PAIR_LIMIT {
        return Err(ctx.unsupported(format!(
            "TopK over an axis of {n} (with {other} other elements) is too large for Kiln's pairwise-rank form"
        )));
    }
    let mut si: Vec<usize> = xt.shape.to_vec();
    si.insert(axis + 1, 1);
    let mut sj: Vec<usize> = xt.shape.to_vec();
    sj.insert(axis, 1);
    let xi = reshape_to(ctx, x, &si, Some("x_rows"))?;
    let xj = reshape_to(ctx, x, &sj, Some("x_cols"))?;
    let cmp = if largest {
        CompareOp::Greater
    } else {
        CompareOp::Less
    };
    let better = ctx.op(Op::Compare(cmp), &[xj, xi], Some("better"))?;
    let same = ctx.op(Op::Compare(CompareOp::Equal), &[xj, xi], Some("same"))?;
    let mut ms = vec![n, n];
    ms.resize(rank + 1 - axis, 1);
    ctx.charge_generated((n * n) as u64)?;
    let before: Vec<bool> = (0..n * n).map(|f| f % n < f / n).collect();
    let before = gen_const(
        ctx,
        Tensor::new(&ms, Data::Bool(before)).expect("n*n"),
        "earlier",
    )?;
    let tie = ctx.op(
        Op::Logical(kiln_ir::LogicalOp::And),
        &[same, before],
        Some("earlier_tie"),
    )?;
    let beats = ctx.op(
        Op::Logical(kiln_ir::LogicalOp::Or),
        &[better, tie],
        Some("beats"),
    )?;
    let beats = ctx.op(Op::Cast { to: DType::I64 }, &[beats], Some("beats_count"))?;
    let ranks = ctx.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: [axis + 1].into_iter().collect(),
            keep_dims: false,
        },
        &[beats],
        Some("ranks"),
    )?;
    let ranks = reshape_to(ctx, ranks, &sj, Some("rank_cols"))?;
    let wanted = ramp(ctx, k, axis, rank + 1, DType::I64, "output_ranks")?;
    let sel = ctx.op(
        Op::Compare(CompareOp::Equal),
        &[ranks, wanted],
        Some("selected"),
    )?;
    let pick = |ctx: &mut ImportCtx, v: Val, tag: &str| {
        let dt = ctx.ty(v).dtype;
        let zero = gen_const(
            ctx,
            Tensor::new([], Data::zeros(dt, 1)).expect("scalar"),
            &format!("{tag}_zero"),
        )?;
        let m = ctx.op(Op::Where, &[sel, v, zero], Some(&format!("{tag}_masked")))?;
        ctx.op(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: [axis + 1].into_iter().collect(),
                keep_dims: false,
            },
            &[m],
            Some(tag),
        )
    };
    let values = pick(ctx, xj, "values")?;
    let positions = ramp(ctx, n, axis + 1, rank + 1, DType::I64, "positions")?;
    let indices = pick(ctx, positions, "indices")?;
    match run_time_k {
        None => Ok(vec![values, indices]),
        Some((k, axis)) => Ok(vec![
            bounded_by(ctx, values, axis, k, "top_values")?,
            bounded_by(ctx, indices, axis, k, "top_indices")?,
        ]),
    }
}

/// `NonZero`: a constant input folds here; a run-time one lists the
/// coordinates at their bound (one column per element) with the count of
/// non-zero elements as the run's length (`docs/bounded.md`).
pub fn non_zero(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let Some(t) = ctx.konst(x).cloned() else {
        if ctx.ty(x).shape.is_empty() {
            return Err(ctx.unsupported("NonZero of a run-time scalar"));
        }
        return one(bounded_non_zero(ctx, x, None)?);
    };
    let shape = t.shape().to_vec();
    let st = strides(&shape);
    let hits: Vec<usize> = (0..t.len())
        .filter(|&i| t.data().get_f64(i) != 0.0)
        .collect();
    let r = shape.len();
    ctx.charge_generated((r * hits.len() * 8) as u64)?;
    let mut out = vec![0i64; r * hits.len()];
    for (j, &f) in hits.iter().enumerate() {
        for k in 0..r {
            out[k * hits.len() + j] = ((f / st[k]) % shape[k]) as i64;
        }
    }
    let name = ctx.node_name().to_string();
    let t = Tensor::new([r, hits.len()], Data::I64(out)).expect("r*n");
    one(ctx.generated_constant(t, name)?)
}

/// The coordinates of `x`'s non-zero elements (`i64 [rank, n]` at the
/// bound `n`, the element count), marked with their count as the
/// data-dependent length of axis 1.
fn bounded_non_zero(ctx: &mut ImportCtx, x: Val, suffix: Option<&str>) -> Result<Val, OnnxError> {
    let tag = suffix.map_or(String::new(), |s| format!("{s}_"));
    let coordinates = ctx.op(Op::NonZero, &[x], Some(&format!("{tag}coordinates")))?;
    let flags = cast_to(ctx, x, DType::Bool, &format!("{tag}non_zero"))?;
    let flags = cast_to(ctx, flags, DType::I64, &format!("{tag}non_zero_i64"))?;
    let count = ctx.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: (0..ctx.ty(x).shape.len()).collect(),
            keep_dims: false,
        },
        &[flags],
        Some(&format!("{tag}count")),
    )?;
    ctx.op(Op::WithLength { axis: 1 }, &[coordinates, count], suffix)
}

/// `values` with its first `k` positions along `axis` real: the outputs
/// of a TopK of run-time `k` (an `i64` of one element), computed for
/// every position.
fn bounded_by(
    ctx: &mut ImportCtx,
    values: Val,
    axis: usize,
    k: Val,
    tag: &str,
) -> Result<Val, OnnxError> {
    let k = cast_to(ctx, k, DType::I64, &format!("{tag}_k_i64"))?;
    let k = reshape_to(ctx, k, &[], Some(&format!("{tag}_k")))?;
    ctx.op(Op::WithLength { axis }, &[values, k], Some(tag))
}

/// `Unique` (`kiln_host::Unique` is the algorithm): the unique elements
/// (or slices along `axis`), ascending when `sorted`, else by first
/// occurrence, with each one's first index, each element's unique slot
/// and each one's count. A constant input folds here; a run-time one
/// computes the plan at run time (`kiln_ir::Op::Unique`) and its outputs
/// at their bound, marked with the unique count (`docs/bounded.md`): Y is
/// the input gathered at the first indices.
pub fn unique(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let xt = ctx.ty(x).clone();
    let sorted = ctx.attr_i_or(node, "sorted", 1)? != 0;
    let shape = xt.shape.to_vec();
    // Slices along `axis` as (outer, n, inner) blocks; flattened without it.
    let (axis, outer, n, inner) = match ctx.attr_i(node, "axis")? {
        Some(a) => {
            let axis = ctx.axis("axis", a, shape.len())?;
            let outer: usize = shape[..axis].iter().product();
            let inner: usize = shape[axis + 1..].iter().product();
            (Some(axis), outer, shape[axis], inner)
        }
        None => (None, 1, xt.num_elements(), 1),
    };
    let u = kiln_host::Unique {
        outer,
        n,
        inner,
        sorted,
    };
    let key_type = match xt.dtype {
        d if d.is_float() => DType::F64,
        DType::U64 => return Err(ctx.unsupported("Unique of u64 (its keys are compared as i64)")),
        d if d.is_int() || d == DType::Bool => DType::I64,
        d => return Err(ctx.unsupported(format!("Unique of {d}"))),
    };
    // The data the slices gather from: flattened without an axis.
    let data = match axis {
        Some(_) => x,
        None => reshape_to(ctx, x, &[n], Some("flat"))?,
    };
    let gather_axis = axis.unwrap_or(0);
    let Some(t) = ctx.konst(x).cloned() else {
        let blocks = reshape_to(ctx, x, &[outer, n, inner], Some("blocks"))?;
        let keys = cast_to(ctx, blocks, key_type, "keys")?;
        let plan = ctx.op(Op::Unique { sorted }, &[keys], Some("plan"))?;
        let part = |ctx: &mut ImportCtx, k: usize, len: usize, tag: &str| {
            slice_along(ctx, plan, 0, k * n, 1, len, tag)
        };
        let count = part(ctx, 3, 1, "count_slot")?;
        let count = reshape_to(ctx, count, &[], Some("count"))?;
        let firsts = part(ctx, 0, n, "first_slots")?;
        let firsts = ctx.op(
            Op::WithLength { axis: 0 },
            &[firsts, count],
            Some("indices"),
        )?;
        let inverse = part(ctx, 1, n, "inverse_indices")?;
        let counts = part(ctx, 2, n, "count_slots")?;
        let counts = ctx.op(Op::WithLength { axis: 0 }, &[counts, count], Some("counts"))?;
        let y = ctx.op(Op::Gather { axis: gather_axis }, &[data, firsts], Some("Y"))?;
        return Ok(vec![y, firsts, inverse, counts]);
    };
    let keys = t.cast(key_type);
    let keys = match keys.data() {
        Data::F64(v) => kiln_host::Keys::Float(v),
        Data::I64(v) => kiln_host::Keys::Int(v),
        _ => unreachable!("cast to f64 or i64"),
    };
    ctx.charge_generated((u.out_len() * 8) as u64)?;
    let mut plan = vec![0i64; u.out_len()];
    let mut scratch = vec![0u32; u.scratch_len()];
    let m = u.select(keys, &mut scratch, &mut plan);
    let part = |k: usize, len: usize| plan[k * n..k * n + len].to_vec();
    let mut outs = vec![];
    for (tag, v) in [
        ("indices", part(0, m)),
        ("inverse_indices", part(1, n)),
        ("counts", part(2, m)),
    ] {
        let len = v.len();
        let t = Tensor::new([len], Data::I64(v)).expect("len");
        outs.push(gen_const(ctx, t, tag)?);
    }
    // Y: each unique slice's first occurrence.
    let y = ctx.op(
        Op::Gather { axis: gather_axis },
        &[data, outs[0]],
        Some("Y"),
    )?;
    outs.insert(0, y);
    Ok(outs)
}

/// `ReverseSequence`: along `time_axis`, the first `sequence_lens[b]`
/// elements of batch `b` reversed, the rest as they are. The lengths may
/// be run-time values: the source index of each element is computed
/// (`len − 1 − t` where `t < len`, else `t`) and gathered.
pub fn reverse_sequence(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let lens = ctx.input(node, 1)?;
    let xt = ctx.ty(x).clone();
    let rank = xt.shape.len();
    let batch_axis = ctx.attr_i_or(node, "batch_axis", 1)?;
    let time_axis = ctx.attr_i_or(node, "time_axis", 0)?;
    let (b, t) = (
        ctx.axis("batch_axis", batch_axis, rank)?,
        ctx.axis("time_axis", time_axis, rank)?,
    );
    if rank < 2 || b == t || !matches!(b, 0 | 1) || !matches!(t, 0 | 1) {
        return Err(ctx.invalid(format!(
            "batch_axis and time_axis must be 0 and 1 in either order, got {b} and {t} (rank {rank})"
        )));
    }
    if ctx.ty(lens).shape[..] != [xt.shape[b]] {
        return Err(ctx.invalid(format!(
            "sequence_lens must be [{}], got {}",
            xt.shape[b],
            ctx.ty(lens)
        )));
    }
    let along = |axis: usize, n: usize| {
        let mut s = vec![1; rank];
        s[axis] = n;
        s
    };
    let steps = xt.shape[t];
    let time = build_const(ctx, &along(t, steps), DType::I64, "time", |n| {
        Data::I64((0..n as i64).collect())
    })?;
    let lens = cast_to(ctx, lens, DType::I64, "lens_i64")?;
    let lens = reshape_to(ctx, lens, &along(b, xt.shape[b]), Some("lens_view"))?;
    let one_ = gen_const(
        ctx,
        Tensor::new([], Data::I64(vec![1])).expect("scalar"),
        "one",
    )?;
    let last = ctx.op(Op::Binary(BinaryOp::Sub), &[lens, one_], Some("last"))?;
    let mirrored = ctx.op(Op::Binary(BinaryOp::Sub), &[last, time], Some("mirrored"))?;
    let inside = ctx.op(Op::Compare(CompareOp::Less), &[time, lens], Some("inside"))?;
    let source = ctx.op(Op::Where, &[inside, mirrored, time], Some("source"))?;
    let source = ctx.op(
        Op::Expand {
            shape: xt.shape.iter().copied().collect(),
        },
        &[source],
        Some("source_full"),
    )?;
    one(gather_along(ctx, x, source, t, None)?)
}

/// `Compress`: the slices along `axis` (of the flattened input without
/// one) whose condition is true. The output's length depends on the
/// condition's values, so the condition must be known at compile time.
pub fn compress(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let mut x = ctx.input(node, 0)?;
    let cond = ctx.input(node, 1)?;
    let axis = match ctx.attr_i(node, "axis")? {
        Some(a) => ctx.axis("axis", a, ctx.ty(x).shape.len())?,
        None => {
            let n = ctx.ty(x).num_elements();
            x = reshape_to(ctx, x, &[n], Some("flat"))?;
            0
        }
    };
    let len = ctx.ty(x).shape[axis];
    let Some(c) = ctx.konst(cond).cloned() else {
        // A run-time condition: the positions of its true values, as many
        // as the run finds, pick the slices.
        let ct = ctx.ty(cond).clone();
        if ct.shape.len() != 1 || ct.shape[0] > len {
            return Err(ctx.invalid(format!(
                "condition is {ct} for an axis of {len}; it must be 1-D and at most that long"
            )));
        }
        let positions = bounded_non_zero(ctx, cond, Some("kept"))?;
        let positions = reshape_to(ctx, positions, &[ct.shape[0]], Some("kept_positions"))?;
        return one(ctx.op(Op::Gather { axis }, &[x, positions], None)?);
    };
    let keep: Vec<i64> = (c.to_i64_vec().iter().enumerate())
        .filter(|&(i, &v)| v != 0 && i < len)
        .map(|(i, _)| i as i64)
        .collect();
    if c.len() > len {
        return Err(ctx.invalid(format!(
            "condition has {} values for an axis of {len}",
            c.len()
        )));
    }
    let n = keep.len();
    let index = gen_const(ctx, Tensor::new([n], Data::I64(keep)).expect("n"), "kept")?;
    one(ctx.op(Op::Gather { axis }, &[x, index], None)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn strides_are_row_major() {
        assert_eq!(super::strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(super::strides(&[5]), vec![1]);
        assert!(super::strides(&[]).is_empty());
    }
}
