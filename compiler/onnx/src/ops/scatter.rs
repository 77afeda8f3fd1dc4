//! `ScatterND`, `ScatterElements` and the deprecated `Scatter`, decomposed
//! into comparisons and reductions: every update gets a flat target row
//! `pos[u]` in the data viewed as `[M, R]`, `hit[u, m] = (pos[u] == m)`, and
//! then
//! - without reduction, row `m` takes the update of the last `u` that hits
//!   it (a max over `u` of the hitting indices, then a Gather);
//! - with `add`/`mul`/`max`/`min`, the updates masked by `hit` (other
//!   entries the reduction's neutral value) are reduced over `u` and
//!   combined with the data.
//!
//! The masked form holds `U·M·R` elements, so this suits the small scatters
//! of shape bookkeeping and cache updates, not large tensors; larger ones are
//! refused as unsupported.

use super::build::{build_const, gen_const, int_scalar, ramp};
use super::build::{cast_to, reshape_to};
use super::index::{elements_flat_index, strides, wrap_negative};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, Op, ReduceOp, Tensor};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most elements the masked `[U, M, R]` form may hold.
const MASKED_LIMIT: u64 = 1 << 24;

/// Writes `updates` `[U, R]` into rows `pos` `[U]` (i64, in range) of `data`
/// `[M, R]` with `reduction`; the result has shape `out_shape`.
pub(crate) fn scatter_rows(
    ctx: &mut ImportCtx,
    data: Val,
    pos: Val,
    updates: Val,
    reduction: &str,
    out_shape: &[usize],
) -> Result<Val, OnnxError> {
    let ds = ctx.ty(data).shape.clone();
    let dt = ctx.ty(data).dtype;
    let (m, r) = (ds[0], ds[1]);
    let u = ctx.ty(pos).num_elements();
    let cells = (u as u64).saturating_mul(m as u64);
    let masked = cells.saturating_mul(r as u64);
    if cells > MASKED_LIMIT || (reduction != "none" && masked > MASKED_LIMIT) {
        return Err(ctx.unsupported(format!(
            "a scatter of {u} updates into {m} rows of {r} is too large for Kiln's masked form"
        )));
    }
    let pos = reshape_to(ctx, pos, &[u, 1], Some("target_rows"))?;
    let rows = ramp(ctx, m, 1, 2, DType::I64, "rows")?;
    let hit = ctx.op(Op::Compare(CompareOp::Equal), &[pos, rows], Some("hit"))?;
    let updates = cast_to(ctx, updates, dt, "updates_cast")?;
    let y = if reduction == "none" {
        let us = ramp(ctx, u, 0, 2, DType::I64, "update_ids")?;
        let none = int_scalar(ctx, -1, "no_update")?;
        let who = ctx.op(Op::Where, &[hit, us, none], Some("writers"))?;
        let last = ctx.op(
            Op::Reduce {
                op: ReduceOp::Max,
                axes: [0].into_iter().collect(),
                keep_dims: false,
            },
            &[who],
            Some("last_writer"),
        )?;
        let zero = int_scalar(ctx, 0, "zero_id")?;
        let written = ctx.op(
            Op::Compare(CompareOp::GreaterOrEqual),
            &[last, zero],
            Some("written"),
        )?;
        let written = reshape_to(ctx, written, &[m, 1], Some("written_rows"))?;
        let pick = ctx.op(Op::Binary(BinaryOp::Max), &[last, zero], Some("writer"))?;
        let g = ctx.op(
            Op::Gather { axis: 0 },
            &[updates, pick],
            Some("written_values"),
        )?;
        ctx.op(Op::Where, &[written, g, data], Some("scattered"))?
    } else {
        let (red, comb, neutral) = match reduction {
            "add" => (ReduceOp::Sum, BinaryOp::Add, 0.0),
            "mul" => (ReduceOp::Prod, BinaryOp::Mul, 1.0),
            "max" => (ReduceOp::Max, BinaryOp::Max, f64::NEG_INFINITY),
            "min" => (ReduceOp::Min, BinaryOp::Min, f64::INFINITY),
            other => return Err(ctx.bad_attr("reduction", format!("unknown reduction '{other}'"))),
        };
        let neutral = if dt.is_float() {
            Data::from_f64s(dt, std::iter::once(neutral))
        } else {
            let v = match reduction {
                "max" => i64::MIN,
                "min" => i64::MAX,
                _ => neutral as i64,
            };
            // Saturates to the type's own extreme.
            let v = Tensor::new([], Data::I64(vec![v])).expect("scalar");
            kiln_ir::eval::eval(&Op::Cast { to: dt }, &[&v])
                .map_err(|e| ctx.ir_err(e))?
                .data()
                .clone()
        };
        let neutral = gen_const(ctx, Tensor::new([], neutral).expect("scalar"), "neutral")?;
        let hit3 = reshape_to(ctx, hit, &[u, m, 1], Some("hit_cells"))?;
        let upd3 = reshape_to(ctx, updates, &[u, 1, r], Some("update_cells"))?;
        let cells = ctx.op(Op::Where, &[hit3, upd3, neutral], Some("masked_updates"))?;
        let folded = ctx.op(
            Op::Reduce {
                op: red,
                axes: [0].into_iter().collect(),
                keep_dims: false,
            },
            &[cells],
            Some("reduced_updates"),
        )?;
        ctx.op(Op::Binary(comb), &[data, folded], Some("scattered"))?
    };
    reshape_to(ctx, y, out_shape, None)
}

fn reduction(ctx: &ImportCtx, node: &NodeProto) -> Result<String, OnnxError> {
    Ok(ctx
        .attr_s(node, "reduction")?
        .unwrap_or_else(|| "none".into()))
}

/// `ScatterND` (reduction from opset 16; max/min from 18).
pub fn scatter_nd(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let data = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let updates = ctx.input(node, 2)?;
    let dt = ctx.ty(data).clone();
    let it = ctx.ty(idx).clone();
    let q = it.shape.len();
    if q == 0 {
        return Err(ctx.invalid("indices must have rank ≥ 1"));
    }
    let k = it.shape[q - 1];
    let r = dt.shape.len();
    if k < 1 || k > r {
        return Err(ctx.invalid(format!("index tuples of {k} do not fit data {dt}")));
    }
    let mut want: Vec<usize> = it.shape[..q - 1].to_vec();
    want.extend_from_slice(&dt.shape[k..]);
    if ctx.ty(updates).shape.as_slice() != want.as_slice() {
        return Err(ctx.invalid(format!(
            "updates {} must have shape {want:?}",
            ctx.ty(updates)
        )));
    }
    let red = reduction(ctx, node)?;
    let addressed = &dt.shape[..k];
    let rows: usize = addressed.iter().product();
    let width: usize = dt.shape[k..].iter().product();
    let n_up: usize = it.shape[..q - 1].iter().product();
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
    let pos = ctx.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: [q - 1].into_iter().collect(),
            keep_dims: false,
        },
        &[scaled],
        Some("position"),
    )?;
    let flat = reshape_to(ctx, data, &[rows, width], Some("data_rows"))?;
    let upd = reshape_to(ctx, updates, &[n_up, width], Some("update_rows"))?;
    one(scatter_rows(ctx, flat, pos, upd, &red, &dt.shape)?)
}

/// `ScatterElements` (and the deprecated `Scatter`): element `p` of
/// `updates` goes to `data[p with p[axis] = idx[p]]`.
pub fn scatter_elements(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let data = ctx.input(node, 0)?;
    let idx = ctx.input(node, 1)?;
    let updates = ctx.input(node, 2)?;
    let dt = ctx.ty(data).clone();
    let it = ctx.ty(idx).clone();
    let rank = dt.shape.len();
    if it.shape.len() != rank || rank == 0 || ctx.ty(updates).shape != it.shape {
        return Err(ctx.invalid(format!(
            "indices {it} and updates {} must match in shape and have the rank of data {dt}",
            ctx.ty(updates)
        )));
    }
    let axis = ctx.attr_i_or(node, "axis", 0)?;
    let axis = ctx.axis("axis", axis, rank)?;
    let red = if node.op_type == "Scatter" {
        "none".to_string()
    } else {
        reduction(ctx, node)?
    };
    let pos = elements_flat_index(ctx, &dt, idx, axis)?;
    let count = it.num_elements();
    let flat = reshape_to(ctx, data, &[dt.num_elements(), 1], Some("data_rows"))?;
    let upd = reshape_to(ctx, updates, &[count, 1], Some("update_rows"))?;
    one(scatter_rows(ctx, flat, pos, upd, &red, &dt.shape)?)
}

/// `TensorScatter` (opset 24, a KV-cache update): `update` written into
/// `past_cache` along `axis` from position `write_indices[b]` of each
/// batch entry (0 without the input), wrapping around in `circular` mode;
/// in `linear` mode a position past the end writes nothing. The cache is
/// viewed as rows `[prefix · max_seq, rest]` and each update row's target
/// is computed, then [`scatter_rows`] writes them.
pub fn tensor_scatter(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let cache = ctx.input(node, 0)?;
    let update = ctx.input(node, 1)?;
    let write = ctx.opt_input(node, 2);
    let ct = ctx.ty(cache).clone();
    let ut = ctx.ty(update).clone();
    let rank = ct.shape.len();
    let axis = ctx.axis("axis", ctx.attr_i_or(node, "axis", -2)?, rank)?;
    let circular = match ctx.attr_s(node, "mode")?.as_deref() {
        None | Some("linear") => false,
        Some("circular") => true,
        Some(m) => return Err(ctx.bad_attr("mode", format!("'{m}' is not linear or circular"))),
    };
    let fits = ut.dtype == ct.dtype
        && ut.shape.len() == rank
        && axis > 0
        && (0..rank).all(|d| {
            if d == axis {
                ut.shape[d] <= ct.shape[d]
            } else {
                ut.shape[d] == ct.shape[d]
            }
        });
    if !fits {
        return Err(ctx.invalid(format!(
            "update {ut} does not fit past_cache {ct} along axis {axis} (batch first)"
        )));
    }
    let prefix: usize = ct.shape[..axis].iter().product();
    let rest: usize = ct.shape[axis + 1..].iter().product();
    let (max_seq, seq) = (ct.shape[axis], ut.shape[axis]);
    let batch = ct.shape[0];
    // Each prefix row's batch entry, then its write position.
    let per_batch = prefix / batch.max(1);
    let batch_of = build_const(ctx, &[prefix, 1], DType::I64, "batch_of_row", |n| {
        Data::I64((0..n).map(|p| (p / per_batch.max(1)) as i64).collect())
    })?;
    let start = match write {
        Some(w) => {
            let w = cast_to(ctx, w, DType::I64, "write_indices_i64")?;
            let w = reshape_to(ctx, w, &[batch], Some("write_indices_flat"))?;
            ctx.op(Op::Gather { axis: 0 }, &[w, batch_of], Some("row_start"))?
        }
        None => int_scalar(ctx, 0, "row_start")?,
    };
    let steps = ramp(ctx, seq, 1, 2, DType::I64, "steps")?;
    let mut pos = ctx.op(
        Op::Binary(BinaryOp::Add),
        &[start, steps],
        Some("positions"),
    )?;
    let len = int_scalar(ctx, max_seq as i64, "max_sequence_length")?;
    let zero = int_scalar(ctx, 0, "zero")?;
    if circular {
        pos = ctx.op(Op::Binary(BinaryOp::Mod), &[pos, len], Some("wrapped"))?;
    }
    let inside = {
        let low = ctx.op(
            Op::Compare(CompareOp::GreaterOrEqual),
            &[pos, zero],
            Some("from_start"),
        )?;
        let high = ctx.op(
            Op::Compare(CompareOp::Less),
            &[pos, len],
            Some("before_end"),
        )?;
        ctx.op(
            Op::Logical(kiln_ir::LogicalOp::And),
            &[low, high],
            Some("inside"),
        )?
    };
    let rows = ramp(ctx, prefix, 0, 2, DType::I64, "prefix_rows")?;
    let base = ctx.op(Op::Binary(BinaryOp::Mul), &[rows, len], Some("row_base"))?;
    let flat = ctx.op(Op::Binary(BinaryOp::Add), &[base, pos], Some("flat_rows"))?;
    let nowhere = int_scalar(ctx, -1, "nowhere")?;
    let flat = ctx.op(Op::Where, &[inside, flat, nowhere], Some("targets"))?;
    let flat = reshape_to(ctx, flat, &[prefix * seq], Some("targets_flat"))?;
    let data = reshape_to(ctx, cache, &[prefix * max_seq, rest], Some("cache_rows"))?;
    let updates = reshape_to(ctx, update, &[prefix * seq, rest], Some("update_rows"))?;
    one(scatter_rows(ctx, data, flat, updates, "none", &ct.shape)?)
}
