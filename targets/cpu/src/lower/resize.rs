//! Resize and Col2Im.
//!
//! Resize reads its interpolation from tables built at compile time by
//! [`kiln_ir::Resize::taps`] (the same tables the reference evaluator uses):
//! for every resized axis and output index, the byte offsets of the input
//! samples and their weights, stored in the weights section. The kernel
//! walks the output; each element is the weighted sum over the product of
//! the taps of the resized axes (one tap per axis for nearest).
//! Nearest upsampling of the two last axes by whole factors (every output
//! index `j` reading `j / s`: the FPN upsampling of detectors) skips the
//! tables: each input row is widened once, with vector shuffles or
//! splats, and the widened row copied to the rows below it.
//!
//! Col2Im zeroes its output, then for every block element `(ky, kx)` (an
//! unrolled compile-time loop) adds the grid positions whose target pixel
//! is inside the image; those ranges are computed at compile time, so the
//! inner loops carry no bounds checks. Blocks that tile the image exactly
//! (a ConvTranspose whose kernel equals its stride) are a permutation:
//! each value is moved once.

use cranelift_codegen::ir::types::{F32, F32X4, I64, I8X16};
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Value};
use kiln_ir::{Col2Im, Resize};

use super::loops::for_range;
use super::{strides, Kb, NodeCx};
use crate::plan::{Base, Loc, Weights};
use crate::CpuError;

/// The taps of one resized axis, laid out in the weights section.
struct AxisTable {
    axis: usize,
    /// Taps per output index (shorter rows are padded with weight 0).
    taps: usize,
    /// `[out_len × taps]` i64 byte offsets into the input.
    offsets: Value,
    /// `[out_len × taps]` f32 weights.
    weights: Value,
}

/// Resize on f32.
pub(crate) fn resize(
    kb: &mut Kb,
    cx: &NodeCx,
    weights: &mut Weights,
    r: &Resize,
) -> Result<(), CpuError> {
    cx.float_input(0, false)?;
    let in_shape = &cx.inputs[0].1.shape;
    let out_shape = &cx.node.ty.shape;
    if out_shape.iter().product::<usize>() == 0 {
        return Ok(());
    }
    if let Some(factors) = whole_factor_upsampling(r, in_shape, out_shape) {
        upsample(kb, cx, factors);
        return Ok(());
    }
    let in_strides = strides(in_shape);
    let out_strides = strides(out_shape);
    let mut tables: Vec<AxisTable> = Vec::new();
    for (axis, &n) in in_shape.iter().enumerate() {
        let Some(taps) = r.resampled_taps(axis, n) else {
            continue;
        };
        let width = taps.iter().map(|t| t.len()).max().unwrap_or(1).max(1);
        let mut offsets: Vec<u8> = Vec::with_capacity(taps.len() * width * 8);
        let mut ws: Vec<u8> = Vec::with_capacity(taps.len() * width * 4);
        for row in &taps {
            for k in 0..width {
                let (i, w) = row.get(k).copied().unwrap_or((0, 0.0));
                offsets.extend_from_slice(&(i as i64 * in_strides[axis] * 4).to_le_bytes());
                ws.extend_from_slice(&w.to_le_bytes());
            }
        }
        let offsets = kb.ptr(Loc {
            base: Base::Weights,
            offset: weights.add(&offsets),
        });
        let weights_ptr = kb.ptr(Loc {
            base: Base::Weights,
            offset: weights.add(&ws),
        });
        tables.push(AxisTable {
            axis,
            taps: width,
            offsets,
            weights: weights_ptr,
        });
    }
    let nearest = tables.iter().all(|t| t.taps == 1);
    let x = kb.ptr(cx.inputs[0].0);
    let y = kb.ptr(cx.out);
    let walk = Walk {
        out_shape,
        in_strides: &in_strides,
        out_strides: &out_strides,
        tables: &tables,
        nearest,
    };
    walk.axis(kb, 0, x, y, &mut Vec::new());
    Ok(())
}

/// `(sh, sw)` when `r` is nearest upsampling of the last two axes by whole
/// factors (output index `j` reads input index `j / s`) and leaves the
/// other axes as they are.
fn whole_factor_upsampling(
    r: &Resize,
    in_shape: &[usize],
    out_shape: &[usize],
) -> Option<(usize, usize)> {
    let rank = in_shape.len();
    if rank < 2 {
        return None;
    }
    let mut factors = [1usize; 2];
    for (axis, &n) in in_shape.iter().enumerate() {
        let Some(taps) = r.resampled_taps(axis, n) else {
            continue;
        };
        let m = out_shape[axis];
        if axis + 2 < rank || n == 0 || !m.is_multiple_of(n) {
            return None;
        }
        let s = m / n;
        let whole = taps.len() == m
            && (taps.iter().enumerate()).all(|(j, t)| t.as_slice() == [(j / s, 1.0)]);
        if !whole {
            return None;
        }
        factors[axis + 2 - rank] = s;
    }
    Some((factors[0], factors[1]))
}

/// Nearest upsampling by whole factors `(sh, sw)` of the last two axes:
/// per input row, the output row widened (`sw` copies of each value),
/// then copied to the `sh - 1` rows below.
fn upsample(kb: &mut Kb, cx: &NodeCx, (sh, sw): (usize, usize)) {
    let in_shape = &cx.inputs[0].1.shape;
    let rank = in_shape.len();
    let w = in_shape[rank - 1];
    let rows = in_shape[..rank - 1].iter().product::<usize>();
    let out_row = (w * sw * 4) as i64;
    let x = kb.ptr(cx.inputs[0].0);
    let y = kb.ptr(cx.out);
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    let low = kb.f32_lanes([0, 0, 1, 1]);
    let high = kb.f32_lanes([2, 2, 3, 3]);
    // Input row `i` (of all planes, in order) lands at output row `i · sh`.
    for_range(kb, 0, rows as i64, 1, &mut |kb, i| {
        let src = kb.add_scaled(x, i, (w * 4) as i64);
        let dst = kb.add_scaled(y, i, out_row * sh as i64);
        // Values done with vectors: four at a time for sw = 2, one splat
        // per value for a multiple of 4.
        let vector = match sw {
            2 => w / 4 * 4,
            s if s % 4 == 0 => w,
            _ => 0,
        };
        if sw == 2 {
            for_range(kb, 0, (vector * 4) as i64, 16, &mut |kb, off| {
                let s = kb.b.ins().iadd(src, off);
                let d = kb.b.ins().iadd(dst, off);
                let d = kb.b.ins().iadd(d, off);
                let v = kb.load(F32X4, s, 0);
                let v = kb.b.ins().bitcast(I8X16, flags, v);
                for (k, mask) in [low, high].into_iter().enumerate() {
                    let pair = kb.b.ins().shuffle(v, v, mask);
                    let pair = kb.b.ins().bitcast(F32X4, flags, pair);
                    kb.store(pair, d, 16 * k as i64);
                }
            });
        } else if vector > 0 {
            for_range(kb, 0, vector as i64, 1, &mut |kb, j| {
                let at = kb.add_scaled(src, j, 4);
                let v = kb.load(F32, at, 0);
                let v = kb.splat_to(F32X4, v);
                let d = kb.add_scaled(dst, j, (sw * 4) as i64);
                for k in 0..sw / 4 {
                    kb.store(v, d, 16 * k as i64);
                }
            });
        }
        for_range(kb, vector as i64, w as i64, 1, &mut |kb, j| {
            let at = kb.add_scaled(src, j, 4);
            let v = kb.load(F32, at, 0);
            let d = kb.add_scaled(dst, j, (sw * 4) as i64);
            for k in 0..sw {
                kb.store(v, d, 4 * k as i64);
            }
        });
        for r in 1..sh {
            let to = kb.add_off(dst, r as i64 * out_row);
            super::layout::copy_bytes(kb, to, dst, out_row as u64);
        }
    });
}

struct Walk<'a> {
    out_shape: &'a [usize],
    in_strides: &'a [i64],
    out_strides: &'a [i64],
    tables: &'a [AxisTable],
    nearest: bool,
}

impl Walk<'_> {
    /// Loops over output axis `d`; `taps` collects, per resized axis above,
    /// the (offset, weight) values of the current output index.
    fn axis(&self, kb: &mut Kb, d: usize, x: Value, y: Value, taps: &mut Vec<Vec<(Value, Value)>>) {
        if d == self.out_shape.len() {
            self.element(kb, x, y, taps);
            return;
        }
        let table = self.tables.iter().find(|t| t.axis == d);
        for_range(kb, 0, self.out_shape[d] as i64, 1, &mut |kb, j| {
            let yj = kb.add_scaled(y, j, self.out_strides[d] * 4);
            match table {
                None => {
                    let xj = kb.add_scaled(x, j, self.in_strides[d] * 4);
                    self.axis(kb, d + 1, xj, yj, taps);
                }
                Some(t) => {
                    let po = kb.add_scaled(t.offsets, j, (t.taps * 8) as i64);
                    let pw = kb.add_scaled(t.weights, j, (t.taps * 4) as i64);
                    let row: Vec<(Value, Value)> = (0..t.taps)
                        .map(|k| {
                            let off = kb.load(I64, po, (k * 8) as i64);
                            let w = kb.load(F32, pw, (k * 4) as i64);
                            (off, w)
                        })
                        .collect();
                    taps.push(row);
                    self.axis(kb, d + 1, x, yj, taps);
                    taps.pop();
                }
            }
        });
    }

    /// One output element: the weighted sum over every combination of taps.
    fn element(&self, kb: &mut Kb, x: Value, y: Value, taps: &[Vec<(Value, Value)>]) {
        let mut combos: Vec<(Value, Option<Value>)> = vec![(x, None)];
        for row in taps {
            let mut next = Vec::with_capacity(combos.len() * row.len());
            for &(p, w) in &combos {
                for &(off, tw) in row {
                    let q = kb.b.ins().iadd(p, off);
                    let w = if self.nearest {
                        None
                    } else {
                        Some(match w {
                            None => tw,
                            Some(w) => kb.b.ins().fmul(w, tw),
                        })
                    };
                    next.push((q, w));
                }
            }
            combos = next;
        }
        let mut acc: Option<Value> = None;
        for (p, w) in combos {
            let v = kb.load(F32, p, 0);
            acc = Some(match (acc, w) {
                (None, None) => v,
                (None, Some(w)) => kb.b.ins().fmul(v, w),
                (Some(a), Some(w)) => kb.fmadd(v, w, a),
                (Some(a), None) => kb.b.ins().fadd(a, v),
            });
        }
        let r = acc.expect("at least one combination");
        kb.store(r, y, 0);
    }
}

/// Col2Im on f32.
pub(crate) fn col2im(kb: &mut Kb, cx: &NodeCx, c: &Col2Im) -> Result<(), CpuError> {
    cx.float_input(0, false)?;
    let out = &cx.node.ty.shape;
    let (batch, channels) = (out[0], out[1]);
    let [oh, ow] = c.image;
    let [gh, gw] = c.grid;
    let [kh, kw] = c.block;
    let y = kb.ptr(cx.out);
    let x = kb.ptr(cx.inputs[0].0);
    if c.tiles_exactly() {
        col2im_tiled(kb, c, x, y, batch * channels);
        return Ok(());
    }
    zero_f32(kb, y, batch * channels * oh * ow);
    // Grid positions whose pixel `i·s + k·d - p` falls in [0, len).
    let range = |len: usize, s: usize, kd: usize, p: usize| -> (usize, usize) {
        let lo = p.saturating_sub(kd).div_ceil(s);
        let hi = (len + p).saturating_sub(kd).div_ceil(s);
        (lo, hi)
    };
    let plane_in = (kh * kw * gh * gw * 4) as i64;
    let plane_out = (oh * ow * 4) as i64;
    for_range(kb, 0, (batch * channels) as i64, 1, &mut |kb, bc| {
        let xb = kb.add_scaled(x, bc, plane_in);
        let yb = kb.add_scaled(y, bc, plane_out);
        for ky in 0..kh {
            let kdy = ky * c.dilations[0];
            let (y_lo, y_hi) = range(oh, c.strides[0], kdy, c.pads[0]);
            let y_hi = y_hi.min(gh);
            for kx in 0..kw {
                let kdx = kx * c.dilations[1];
                let (x_lo, x_hi) = range(ow, c.strides[1], kdx, c.pads[1]);
                let x_hi = x_hi.min(gw);
                if y_lo >= y_hi || x_lo >= x_hi {
                    continue;
                }
                let row = ((ky * kw + kx) * gh * gw * 4) as i64;
                for_range(kb, y_lo as i64, y_hi as i64, 1, &mut |kb, iy| {
                    // Output row (iy·sy + ky·dy - pad_top), in bytes.
                    let src = kb.add_scaled(xb, iy, (gw * 4) as i64);
                    let src = kb.add_off(src, row);
                    let dst = kb.add_scaled(yb, iy, (c.strides[0] * ow * 4) as i64);
                    let dst = kb.add_off(dst, ((kdy as i64 - c.pads[0] as i64) * ow as i64) * 4);
                    for_range(kb, x_lo as i64, x_hi as i64, 1, &mut |kb, ix| {
                        let s = kb.add_scaled(src, ix, 4);
                        let d = kb.add_scaled(dst, ix, (c.strides[1] * 4) as i64);
                        let d = kb.add_off(d, (kdx as i64 - c.pads[1] as i64) * 4);
                        let v = kb.load(F32, s, 0);
                        let o = kb.load(F32, d, 0);
                        let sum = kb.b.ins().fadd(o, v);
                        kb.store(sum, d, 0);
                    });
                });
            }
        }
    });
    Ok(())
}

/// Col2Im whose blocks tile the image exactly (see
/// [`Col2Im::tiles_exactly`]): every pixel is one block element, so the
/// kernel moves each value once, with no zero fill and no accumulation.
/// Output rows of a block row `ky` interleave the `kw` block columns; for
/// `kw = 2` that is done four pixels at a time with two shuffles.
fn col2im_tiled(kb: &mut Kb, c: &Col2Im, x: Value, y: Value, planes: usize) {
    let [oh, ow] = c.image;
    let [gh, gw] = c.grid;
    let [kh, kw] = c.block;
    let plane_in = (kh * kw * gh * gw * 4) as i64;
    let plane_out = (oh * ow * 4) as i64;
    let block_row = (gh * gw * 4) as i64;
    // Pixels of a grid row done four at a time by the pair interleave.
    let vector = if kw == 2 { gw / 4 * 4 } else { 0 };
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    let low = kb.f32_lanes([0, 4, 1, 5]);
    let high = kb.f32_lanes([2, 6, 3, 7]);
    for_range(kb, 0, planes as i64, 1, &mut |kb, bc| {
        let xb = kb.add_scaled(x, bc, plane_in);
        let yb = kb.add_scaled(y, bc, plane_out);
        for ky in 0..kh {
            for_range(kb, 0, gh as i64, 1, &mut |kb, iy| {
                let src = kb.add_scaled(xb, iy, (gw * 4) as i64);
                let src = kb.add_off(src, (ky * kw) as i64 * block_row);
                let dst = kb.add_scaled(yb, iy, (kh * ow * 4) as i64);
                let dst = kb.add_off(dst, (ky * ow * 4) as i64);
                for_range(kb, 0, vector as i64 * 4, 16, &mut |kb, off| {
                    let s = kb.b.ins().iadd(src, off);
                    let d = kb.b.ins().iadd(dst, off);
                    let d = kb.b.ins().iadd(d, off);
                    let a = kb.load(F32X4, s, 0);
                    let b = kb.load(F32X4, s, block_row);
                    let a = kb.b.ins().bitcast(I8X16, flags, a);
                    let b = kb.b.ins().bitcast(I8X16, flags, b);
                    for (k, mask) in [low, high].into_iter().enumerate() {
                        let v = kb.b.ins().shuffle(a, b, mask);
                        let v = kb.b.ins().bitcast(F32X4, flags, v);
                        kb.store(v, d, 16 * k as i64);
                    }
                });
                for kx in 0..kw {
                    let from = if kw == 2 { vector } else { 0 };
                    for_range(kb, from as i64, gw as i64, 1, &mut |kb, ix| {
                        let s = kb.add_scaled(src, ix, 4);
                        let d = kb.add_scaled(dst, ix, (kw * 4) as i64);
                        let v = kb.load(F32, s, kx as i64 * block_row);
                        kb.store(v, d, kx as i64 * 4);
                    });
                }
            });
        }
    });
}

/// Stores `n` f32 zeros at `p`.
fn zero_f32(kb: &mut Kb, p: Value, n: usize) {
    let z4 = kb.fconst(F32X4, 0.0);
    let nv = n / 4;
    for_range(kb, 0, (nv * 16) as i64, 16, &mut |kb, off| {
        let q = kb.b.ins().iadd(p, off);
        kb.store(z4, q, 0);
    });
    let z = kb.fconst(F32, 0.0);
    for t in nv * 4..n {
        kb.store(z, p, (t * 4) as i64);
    }
}
