//! Layer normalization: per row of `size` contiguous elements, the mean and
//! the variance (two passes, f32x4 accumulators), then
//! `(x - mean) · inv_std · scale + bias` in a third pass.

use cranelift_codegen::ir::types::{F32, F32X4};
use cranelift_codegen::ir::{InstBuilder, Value};

use super::loops::{for_range, for_range_carry};
use super::pool::reduce;
use super::{Kb, NodeCx};
use crate::microkernel::reduce::LayerNormSpec;
use crate::plan::Loc;
use crate::CpuError;
use kiln_ir::{DType, ValueType};

/// LayerNorm on f32 with scale (and bias) covering the normalized shape.
pub(crate) fn layer_norm(
    kb: &mut Kb,
    cx: &NodeCx,
    axis: usize,
    epsilon: f32,
) -> Result<(), CpuError> {
    cx.float_input(0, false)?;
    let shape = &cx.node.ty.shape;
    let groups: usize = shape[..axis].iter().product();
    let size: usize = shape[axis..].iter().product();
    for (i, (_, ty)) in cx.inputs.iter().enumerate().skip(1) {
        if ty.num_elements() != size {
            return Err(cx.unsupported(format!(
                "input {i} ({ty}) must cover the normalized shape (the frontend expands it)"
            )));
        }
    }
    if groups * size == 0 {
        return Ok(());
    }
    let x = kb.ptr(cx.inputs[0].0);
    let y = kb.ptr(cx.out);
    let scale = kb.ptr(cx.inputs[1].0);
    let bias = cx.inputs.get(2).map(|(loc, _)| *loc);
    let bias = bias.map(|loc| kb.ptr(loc));
    let row_bytes = (size * 4) as i64;
    for_range(kb, 0, groups as i64, 1, &mut |kb, g| {
        let xr = kb.add_scaled(x, g, row_bytes);
        let yr = kb.add_scaled(y, g, row_bytes);
        let n = kb.fconst(F32, size as f64);
        let sum = reduce(kb, xr, size, false);
        let mean = kb.b.ins().fdiv(sum, n);
        let var = squared_deviation_sum(kb, xr, size, mean);
        let var = kb.b.ins().fdiv(var, n);
        let eps = kb.fconst(F32, epsilon as f64);
        let var = kb.b.ins().fadd(var, eps);
        let std = kb.b.ins().sqrt(var);
        let one = kb.fconst(F32, 1.0);
        let inv = kb.b.ins().fdiv(one, std);
        let nv = size / 4;
        let normalize = |kb: &mut Kb, ty, off: Value, mean: Value, inv: Value| {
            let px = kb.b.ins().iadd(xr, off);
            let v = kb.load(ty, px, 0);
            let d = kb.b.ins().fsub(v, mean);
            let d = kb.b.ins().fmul(d, inv);
            let ps = kb.b.ins().iadd(scale, off);
            let s = kb.load(ty, ps, 0);
            let mut r = kb.b.ins().fmul(d, s);
            if let Some(bias) = bias {
                let pb = kb.b.ins().iadd(bias, off);
                let b = kb.load(ty, pb, 0);
                r = kb.b.ins().fadd(r, b);
            }
            let py = kb.b.ins().iadd(yr, off);
            kb.store(r, py, 0);
        };
        if nv > 0 {
            let mv = kb.b.ins().splat(F32X4, mean);
            let iv = kb.b.ins().splat(F32X4, inv);
            for_range(kb, 0, (nv * 16) as i64, 16, &mut |kb, off| {
                normalize(kb, F32X4, off, mv, iv)
            });
        }
        for t in nv * 4..size {
            let off = kb.iconst((t * 4) as i64);
            normalize(kb, F32, off, mean, inv);
        }
    });
    Ok(())
}

/// `Σ (x[i] - mean)²` over `n` contiguous f32 values.
fn squared_deviation_sum(kb: &mut Kb, p: Value, n: usize, mean: Value) -> Value {
    let nv = n / 4;
    let mut acc = kb.fconst(F32, 0.0);
    if nv > 0 {
        let mv = kb.b.ins().splat(F32X4, mean);
        let z = kb.fconst(F32X4, 0.0);
        let v = for_range_carry(kb, 0, (nv * 16) as i64, 16, &[z], &mut |kb, off, c| {
            let q = kb.b.ins().iadd(p, off);
            let x = kb.load(F32X4, q, 0);
            let d = kb.b.ins().fsub(x, mv);
            vec![kb.fmadd(d, d, c[0])]
        })[0];
        for lane in 0..4u8 {
            let s = kb.b.ins().extractlane(v, lane);
            acc = kb.b.ins().fadd(acc, s);
        }
    }
    for t in nv * 4..n {
        let x = kb.load(F32, p, (t * 4) as i64);
        let d = kb.b.ins().fsub(x, mean);
        acc = kb.fmadd(d, d, acc);
    }
    acc
}

/// LayerNorm of f32 rows on the AVX-512 kernel ([`LayerNormSpec`]), the
/// rows split into tasks by the bytes they read; `None` where the
/// Cranelift kernel keeps it (another type, an empty tensor).
pub(crate) fn layer_norm_avx512(
    cx: &NodeCx,
    axis: usize,
    epsilon: f32,
    tasks: usize,
) -> Option<Vec<super::reduce::Assembled>> {
    let shape = &cx.node.ty.shape;
    let rows: usize = shape[..axis].iter().product();
    let size: usize = shape[axis..].iter().product();
    let f32_covering = |(_, ty): &(Loc, &ValueType)| ty.dtype == DType::F32;
    let sizes_ok = cx.inputs[1..]
        .iter()
        .all(|(_, ty)| ty.num_elements() == size);
    if rows * size == 0 || !cx.inputs.iter().all(f32_covering) || !sizes_ok {
        return None;
    }
    let task = |part: std::ops::Range<usize>| {
        let at = (part.start * size * 4) as i64;
        LayerNormSpec {
            rows: part.len(),
            size,
            epsilon,
            x: cx.inputs[0].0.moved(at),
            y: cx.out.moved(at),
            scale: cx.inputs[1].0,
            bias: cx.inputs.get(2).map(|(loc, _)| *loc),
        }
        .assemble()
    };
    Some(
        super::reduce::by_bytes(rows, size * 4, tasks)
            .map(task)
            .collect(),
    )
}
