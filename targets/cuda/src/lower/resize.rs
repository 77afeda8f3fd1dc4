//! Resize and Col2Im: one thread per output element.
//!
//! Resize reads its interpolation from tables built at compile time by
//! [`kiln_ir::Resize::taps`] (the tables the reference evaluator and the
//! CPU target use, so all three agree on every rounding decision): for each
//! resized axis and output index, `width` pairs of (input element offset
//! as `u32`, weight as `f32`), appended to the weights blob. A thread loads
//! its taps per resized axis and sums the product of the taps (one term
//! for nearest, 2^k for linear, 4^k for cubic over k resized axes), the
//! loop over tap combinations unrolled at compile time.
//!
//! Col2Im gathers instead of scattering (no atomics): output pixel
//! `(y, x)` receives block element `(ky, kx)` of grid position
//! `((y + pad_top - ky·dy) / sy, (x + pad_left - kx·dx) / sx)` when that
//! division is exact and in the grid. The `kh × kw` block positions are
//! unrolled; invalid ones read element 0 and add 0.

use kiln_ir::{Col2Im, DType, Resize};

use super::{coords, global_index, linear_launch, load, offset, ptr, store, strides, Cx, Kernel};
use crate::ptx::{Bin, Cmp, KernelBuilder, MemTy, Opnd, Reg, Space, Ty};
use crate::CudaError;

/// The taps of one resized axis in the weights blob.
struct AxisTable {
    axis: usize,
    /// Taps per output index (shorter rows padded with weight 0).
    width: usize,
    loc: crate::plan::Loc,
}

pub(crate) fn resize(cx: &Cx, r: &Resize) -> Result<Kernel, CudaError> {
    let (xloc, xty) = cx.inputs[0];
    if xty.dtype != DType::F32 {
        return Err(cx.dtype_err(xty.dtype));
    }
    let in_shape = &xty.shape;
    let out_shape = &cx.out_ty.shape;
    let in_strides = strides(in_shape);
    let mut tables = Vec::new();
    for (axis, &len) in in_shape.iter().enumerate() {
        let Some(taps) = r.resampled_taps(axis, len) else {
            continue;
        };
        let width = taps.iter().map(|t| t.len()).max().unwrap_or(1).max(1);
        let mut bytes = Vec::with_capacity(taps.len() * width * 8);
        for row in &taps {
            for k in 0..width {
                let (i, w) = row.get(k).copied().unwrap_or((0, 0.0));
                let element = i as u64 * in_strides[axis] as u64;
                // Below 2^31: every CUDA tensor is (checked in `lower_job`).
                bytes.extend_from_slice(&(element as u32).to_le_bytes());
                bytes.extend_from_slice(&w.to_le_bytes());
            }
        }
        tables.push(AxisTable {
            axis,
            width,
            loc: cx.table(&bytes),
        });
    }
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let c = coords(&mut kb, i, out_shape);
    // Axes that are not resized read the input at the output coordinate.
    let kept: Vec<i64> = (0..in_shape.len())
        .map(|d| {
            if tables.iter().any(|t| t.axis == d) {
                0
            } else {
                in_strides[d]
            }
        })
        .collect();
    let base = offset(&mut kb, &c, &kept, 0);
    let mut axis_taps: Vec<Vec<(Reg, Reg)>> = Vec::new();
    for t in &tables {
        let tab = ptr(&mut kb, t.loc);
        let coord = match c[t.axis] {
            Some(r) => r,
            None => kb.mov(Ty::U32, Opnd::I(0)),
        };
        let row = kb.addr(tab, coord, (t.width * 8) as u32);
        let taps = (0..t.width)
            .map(|k| {
                let off = kb.ld(Space::Global, MemTy("u32"), Ty::U32, row, (k * 8) as i64);
                let w = kb.ld(
                    Space::Global,
                    MemTy("f32"),
                    Ty::F32,
                    row,
                    (k * 8 + 4) as i64,
                );
                (off, w)
            })
            .collect();
        axis_taps.push(taps);
    }
    let x = ptr(&mut kb, xloc);
    let combos: usize = tables.iter().map(|t| t.width).product();
    let mut acc: Option<Reg> = None;
    for combo in 0..combos {
        let mut rest = combo;
        let mut off = base;
        let mut weight: Option<Reg> = None;
        for taps in &axis_taps {
            let (o, w) = taps[rest % taps.len()];
            rest /= taps.len();
            off = kb.bin(Bin::Add, off, o);
            weight = Some(match weight {
                None => w,
                Some(p) => kb.bin(Bin::Mul, p, w),
            });
        }
        let v = load(&mut kb, x, off, DType::F32);
        acc = Some(match (acc, weight) {
            (_, None) => v,
            (None, Some(w)) => kb.bin(Bin::Mul, v, w),
            (Some(a), Some(w)) => kb.mad(v, w, a),
        });
    }
    let y = acc.expect("at least one tap combination");
    let y = cx.epilogue(&mut kb, y);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, DType::F32, y);
    Ok(cx.finish(kb, linear_launch(n)))
}

/// For each block offset `k` along one image axis: whether output
/// coordinate `p` (already shifted by the padding) takes block element `k`,
/// and from which grid position.
fn block_taps(
    kb: &mut KernelBuilder,
    p: Reg,
    block: usize,
    dilation: usize,
    stride: usize,
    grid: usize,
) -> Vec<(Reg, Reg)> {
    (0..block)
        .map(|k| {
            let o = (k * dilation) as u32;
            let reaches = kb.setp(Cmp::Ge, p, o);
            let t = kb.bin(Bin::Sub, p, o);
            let g = kb.bin(Bin::Div, t, stride as u32);
            let in_grid = kb.setp(Cmp::Lt, g, grid as u32);
            let mut ok = kb.pred_op("and", reaches, in_grid);
            if stride > 1 {
                let r = kb.bin(Bin::Rem, t, stride as u32);
                let exact = kb.setp(Cmp::Eq, r, Opnd::I(0));
                ok = kb.pred_op("and", ok, exact);
            }
            (ok, g)
        })
        .collect()
}

pub(crate) fn col2im(cx: &Cx, c: &Col2Im) -> Result<Kernel, CudaError> {
    let (xloc, xty) = cx.inputs[0];
    if xty.dtype != DType::F32 {
        return Err(cx.dtype_err(xty.dtype));
    }
    let [kh, kw] = c.block;
    let [gh, gw] = c.grid;
    let [oh, ow] = c.image;
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let px = kb.bin(Bin::Rem, i, ow as u32);
    let rest = kb.bin(Bin::Div, i, ow as u32);
    let py = kb.bin(Bin::Rem, rest, oh as u32);
    // Image n, channel ch: its blocks are input rows (n·C + ch)·kh·kw + ...
    let plane = kb.bin(Bin::Div, rest, oh as u32);
    let row0 = kb.bin(Bin::Mul, plane, (kh * kw) as u32);
    let sy = kb.bin(Bin::Add, py, c.pads[0] as u32);
    let sx = kb.bin(Bin::Add, px, c.pads[1] as u32);
    let ys = block_taps(&mut kb, sy, kh, c.dilations[0], c.strides[0], gh);
    let xs = block_taps(&mut kb, sx, kw, c.dilations[1], c.strides[1], gw);
    let x = ptr(&mut kb, xloc);
    let mut acc = kb.mov(Ty::F32, Opnd::F32(0.0));
    for (ky, &(vy, gy)) in ys.iter().enumerate() {
        for (kx, &(vx, gx)) in xs.iter().enumerate() {
            let valid = kb.pred_op("and", vy, vx);
            let row = kb.bin(Bin::Add, row0, (ky * kw + kx) as u32);
            let cell = kb.mad(gy, gw as u32, gx);
            let idx = kb.mad(row, (gh * gw) as u32, cell);
            let idx = kb.selp(Ty::U32, valid, idx, Opnd::I(0));
            let v = load(&mut kb, x, idx, DType::F32);
            let v = kb.selp(Ty::F32, valid, v, Opnd::F32(0.0));
            acc = kb.bin(Bin::Add, acc, v);
        }
    }
    let y = cx.epilogue(&mut kb, acc);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, DType::F32, y);
    Ok(cx.finish(kb, linear_launch(n)))
}
