//! Direct 2-D convolution (NCHW input, OIHW weights, optional bias).
//!
//! Output rows and columns are split at compile time into segments with a
//! fixed set of valid kernel taps (see [`window_segments`]), so the inner
//! code has no bounds checks: within a segment every `(kh, kw)` tap is
//! unrolled. A register tile covers up to 4 output channels × 8 output
//! pixels (two `f32x4` per channel when `stride_w == 1`, otherwise 4 scalar
//! pixels), accumulated over the group's input channels in registers and
//! initialised with the bias. Groups (including depthwise) are an outer
//! loop.
//!
//! ConvInteger (u8/i8 X and W, exact wrapping i32 out) is the portable
//! scalar path ([`conv_integer`]): one i32 accumulator per output
//! `(n, oc, oy, ox)` over the group's input channels, with the same
//! segments, so taps in the padding (which holds X's zero point and would
//! add 0) are skipped at compile time and no load leaves the input. 8-bit
//! loads are sign- or zero-extended, the zero points (X's scalar, W's
//! scalar or per output channel) subtracted, and products added in
//! wrapping i32, like `MatMulInteger`'s portable loop.

use cranelift_codegen::ir::types::{F32, F32X4, I32};
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::{Conv2d, DType};

use super::linalg::load_byte;
use super::loops::{for_range, for_range_carry, nest};
use super::pool::{window_segments, Seg};
use super::{Kb, NodeCx};
use crate::CpuError;

/// Output channels per register tile.
const OCB: usize = 4;

/// Pixel group of a tile: 4 consecutive pixels (vector) or one pixel, at a
/// pixel offset from the tile's first pixel.
#[derive(Clone, Copy)]
enum Pix {
    Vec(usize),
    One(usize),
}

impl Pix {
    fn off(self) -> usize {
        match self {
            Pix::Vec(o) | Pix::One(o) => o,
        }
    }
}

/// Shapes and strides shared by every tile of one convolution.
struct Geo {
    cg: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    sw: usize,
    dh: usize,
    dw: usize,
    pt: usize,
    pl: usize,
    bias: bool,
}

/// The CPU target's limits on a convolution window (shared by the Cranelift
/// path and the AVX-512 microkernels).
pub(crate) fn check_conv_window(cx: &NodeCx, c: &Conv2d) -> Result<(), CpuError> {
    let wty = cx.inputs[1].1;
    super::pool::check_window(
        cx,
        &super::pool::Window {
            kernel: [wty.shape[2], wty.shape[3]],
            out: [cx.node.ty.shape[2], cx.node.ty.shape[3]],
            strides: c.strides,
            dilations: c.dilations,
            pads: c.pads,
        },
    )
}

/// Conv on f32.
pub(crate) fn conv(kb: &mut Kb, cx: &NodeCx, c: &Conv2d) -> Result<(), CpuError> {
    for i in 0..cx.inputs.len() {
        cx.float_input(i, false)?;
    }
    let (xloc, xty) = cx.inputs[0];
    let (wloc, wty) = cx.inputs[1];
    let (n, cin, h, w) = (xty.shape[0], xty.shape[1], xty.shape[2], xty.shape[3]);
    let (o, cg, kh, kw) = (wty.shape[0], wty.shape[1], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    let groups = c.group;
    let og = o / groups;
    let g = Geo {
        cg,
        h,
        w,
        kh,
        kw,
        oh,
        ow,
        sw: c.strides[1],
        dh: c.dilations[0],
        dw: c.dilations[1],
        pt: c.pads[0],
        pl: c.pads[1],
        bias: cx.inputs.len() > 2,
    };
    if n * o * oh * ow == 0 {
        return Ok(());
    }
    check_conv_window(cx, c)?;
    let sh = c.strides[0];
    let segs_h = window_segments(oh, h, kh, sh, c.pads[0], c.pads[2], c.dilations[0]);
    let segs_w = window_segments(ow, w, kw, g.sw, c.pads[1], c.pads[3], c.dilations[1]);
    let x = kb.ptr(xloc);
    let wp = kb.ptr(wloc);
    let bp = match cx.inputs.get(2) {
        Some(&(bloc, _)) => kb.ptr(bloc),
        None => wp,
    };
    let y = kb.ptr(cx.out);
    let plane = (h * w * 4) as i64;
    let oplane = (oh * ow * 4) as i64;
    let wsize = (cg * kh * kw * 4) as i64;
    nest(
        kb,
        &[n, groups],
        &[x, wp, bp, y],
        &[
            vec![cin as i64 * plane, cg as i64 * plane],
            vec![0, og as i64 * wsize],
            vec![0, (og * 4) as i64],
            vec![o as i64 * oplane, og as i64 * oplane],
        ],
        &mut |kb, p| {
            let (xg, wg, bg, yg) = (p[0], p[1], p[2], p[3]);
            let rows = |kb: &mut Kb, ocb: usize, oc0: Value| {
                let wo = kb.add_scaled(wg, oc0, wsize);
                let bo = kb.add_scaled(bg, oc0, 4);
                let yo = kb.add_scaled(yg, oc0, oplane);
                for seg_h in &segs_h {
                    let s = seg_h.start as i64;
                    for_range(kb, s, s + seg_h.len as i64, 1, &mut |kb, o_h| {
                        let x_oh = kb.add_scaled(xg, o_h, sh as i64 * (w * 4) as i64);
                        let y_row = kb.add_scaled(yo, o_h, (ow * 4) as i64);
                        for seg_w in &segs_w {
                            row_segment(kb, &g, ocb, wo, bo, x_oh, y_row, seg_h, seg_w);
                        }
                    });
                }
            };
            let ocb = OCB.min(og);
            let full = og / ocb;
            for_range(kb, 0, (full * ocb) as i64, ocb as i64, &mut |kb, oc0| {
                rows(kb, ocb, oc0)
            });
            if !og.is_multiple_of(ocb) {
                let oc0 = kb.iconst((full * ocb) as i64);
                rows(kb, og % ocb, oc0);
            }
        },
    );
    Ok(())
}

/// All tiles of one output row segment.
#[allow(clippy::too_many_arguments)]
fn row_segment(
    kb: &mut Kb,
    g: &Geo,
    ocb: usize,
    wo: Value,
    bo: Value,
    x_oh: Value,
    y_row: Value,
    seg_h: &Seg,
    seg_w: &Seg,
) {
    let (s0, len) = (seg_w.start, seg_w.len);
    let (block, groups): (usize, Vec<Pix>) = if g.sw == 1 {
        (8, vec![Pix::Vec(0), Pix::Vec(4)])
    } else {
        (4, (0..4).map(Pix::One).collect())
    };
    let nb = len / block;
    let t = Tile {
        g,
        ocb,
        wo,
        bo,
        x_oh,
        y_row,
        taps_h: &seg_h.taps,
        taps_w: &seg_w.taps,
    };
    for_range(
        kb,
        s0 as i64,
        (s0 + nb * block) as i64,
        block as i64,
        &mut |kb, o_w| t.emit(kb, o_w, &groups),
    );
    let rem = len % block;
    if rem > 0 {
        let mut tail = Vec::new();
        let mut at = 0;
        if g.sw == 1 && rem >= 4 {
            tail.push(Pix::Vec(0));
            at = 4;
        }
        tail.extend((at..rem).map(Pix::One));
        let o_w = kb.iconst((s0 + nb * block) as i64);
        t.emit(kb, o_w, &tail);
    }
}

struct Tile<'a> {
    g: &'a Geo,
    ocb: usize,
    wo: Value,
    bo: Value,
    x_oh: Value,
    y_row: Value,
    taps_h: &'a [usize],
    taps_w: &'a [usize],
}

impl Tile<'_> {
    fn emit(&self, kb: &mut Kb, o_w: Value, pix: &[Pix]) {
        let g = self.g;
        let any_vec = pix.iter().any(|p| matches!(p, Pix::Vec(_)));
        let mut init = Vec::with_capacity(self.ocb * pix.len());
        let zero = kb.b.ins().f32const(0.0);
        for o in 0..self.ocb {
            let s = if g.bias {
                kb.load(F32, self.bo, (o * 4) as i64)
            } else {
                zero
            };
            let v = if any_vec {
                Some(kb.b.ins().splat(F32X4, s))
            } else {
                None
            };
            for p in pix {
                init.push(match p {
                    Pix::Vec(_) => v.expect("vector group"),
                    Pix::One(_) => s,
                });
            }
        }
        let w4 = (g.w * 4) as i64;
        let x_px = kb.add_scaled(self.x_oh, o_w, (g.sw * 4) as i64);
        let ksize = (g.kh * g.kw) as i64;
        let acc = for_range_carry(kb, 0, g.cg as i64, 1, &init, &mut |kb, ic, acc| {
            let xc = kb.add_scaled(x_px, ic, (g.h * g.w * 4) as i64);
            let wc = kb.add_scaled(self.wo, ic, ksize * 4);
            let mut acc = acc.to_vec();
            for &th in self.taps_h {
                let row = (th * g.dh) as i64 * w4 - g.pt as i64 * w4;
                for &tw in self.taps_w {
                    let col = ((tw * g.dw) as i64 - g.pl as i64) * 4;
                    let xs: Vec<Value> = pix
                        .iter()
                        .map(|p| {
                            let at = row + col + (p.off() * g.sw * 4) as i64;
                            match p {
                                Pix::Vec(_) => kb.load(F32X4, xc, at),
                                Pix::One(_) => kb.load(F32, xc, at),
                            }
                        })
                        .collect();
                    for o in 0..self.ocb {
                        let woff = ((o as i64 * g.cg as i64) * ksize + (th * g.kw + tw) as i64) * 4;
                        let ws = kb.load(F32, wc, woff);
                        let wv = if any_vec {
                            Some(kb.b.ins().splat(F32X4, ws))
                        } else {
                            None
                        };
                        for (pi, p) in pix.iter().enumerate() {
                            let wgt = match p {
                                Pix::Vec(_) => wv.expect("vector group"),
                                Pix::One(_) => ws,
                            };
                            let k = o * pix.len() + pi;
                            acc[k] = kb.fmadd(wgt, xs[pi], acc[k]);
                        }
                    }
                }
            }
            acc
        });
        let oplane = (g.oh * g.ow * 4) as i64;
        let y_px = kb.add_scaled(self.y_row, o_w, 4);
        for o in 0..self.ocb {
            for (pi, p) in pix.iter().enumerate() {
                kb.store(
                    acc[o * pix.len() + pi],
                    y_px,
                    o as i64 * oplane + (p.off() * 4) as i64,
                );
            }
        }
    }
}

/// `ConvInteger` as scalar i32 loops: the portable path (any target).
/// `y[n, oc, oy, ox] = sum (x - x_zero) * (w - w_zero[oc])` over the
/// group's input channels and the window taps inside the input, in
/// wrapping i32. Taps in the padding are never read: the padding holds
/// X's zero point, so they would add 0. As in [`conv`], output rows and
/// columns are split into [`Seg`]s with a fixed set of valid taps, which
/// are unrolled without bounds checks.
pub(crate) fn conv_integer(kb: &mut Kb, cx: &NodeCx, c: &Conv2d) -> Result<(), CpuError> {
    for &(_, ty) in &cx.inputs {
        if !matches!(ty.dtype, DType::U8 | DType::I8) {
            return Err(cx.dtype_err(ty.dtype));
        }
    }
    let (xloc, xty) = cx.inputs[0];
    let (wloc, wty) = cx.inputs[1];
    let (n, cin, h, w) = (xty.shape[0], xty.shape[1], xty.shape[2], xty.shape[3]);
    let (o, cg, kh, kw) = (wty.shape[0], wty.shape[1], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    if n * o * oh * ow == 0 {
        return Ok(());
    }
    check_conv_window(cx, c)?;
    let groups = c.group;
    let og = o / groups;
    let [sh, sw] = c.strides;
    let [dh, dw] = c.dilations;
    let [pt, pl, pb, pr] = c.pads;
    let segs_h = window_segments(oh, h, kh, sh, pt, pb, dh);
    let segs_w = window_segments(ow, w, kw, sw, pl, pr, dw);
    let x_signed = xty.dtype == DType::I8;
    let w_signed = wty.dtype == DType::I8;
    let xz_p = kb.ptr(cx.inputs[2].0);
    let x_zero = load_byte(kb, xz_p, 0, x_signed);
    // W's zero point: one per output channel, or a scalar (step 0).
    let wz_step = i64::from(cx.inputs[3].1.num_elements() > 1);
    let x = kb.ptr(xloc);
    let wp = kb.ptr(wloc);
    let wz = kb.ptr(cx.inputs[3].0);
    let y = kb.ptr(cx.out);
    // Element sizes: 1 byte in X and W, 4 in Y.
    let (w_row, plane, ksize) = (w as i64, (h * w) as i64, (kh * kw) as i64);
    let oplane = (oh * ow * 4) as i64;
    nest(
        kb,
        &[n, groups],
        &[x, wp, wz, y],
        &[
            vec![cin as i64 * plane, cg as i64 * plane],
            vec![0, (og * cg) as i64 * ksize],
            vec![0, og as i64 * wz_step],
            vec![o as i64 * oplane, og as i64 * oplane],
        ],
        &mut |kb, p| {
            let (xg, wg, wzg, yg) = (p[0], p[1], p[2], p[3]);
            for_range(kb, 0, og as i64, 1, &mut |kb, oc| {
                let wo = kb.add_scaled(wg, oc, cg as i64 * ksize);
                let wzp = kb.add_scaled(wzg, oc, wz_step);
                let w_zero = load_byte(kb, wzp, 0, w_signed);
                let yo = kb.add_scaled(yg, oc, oplane);
                for seg_h in &segs_h {
                    let s = seg_h.start as i64;
                    for_range(kb, s, s + seg_h.len as i64, 1, &mut |kb, o_h| {
                        let x_oh = kb.add_scaled(xg, o_h, sh as i64 * w_row);
                        let y_row = kb.add_scaled(yo, o_h, (ow * 4) as i64);
                        for seg_w in &segs_w {
                            // Byte offsets of the valid taps from the
                            // window's origin in X, and their W indices.
                            let taps: Vec<(i64, i64)> = (seg_h.taps.iter())
                                .flat_map(|&th| {
                                    seg_w.taps.iter().map(move |&tw| {
                                        let row = (th * dh) as i64 - pt as i64;
                                        let col = (tw * dw) as i64 - pl as i64;
                                        (row * w_row + col, (th * kw + tw) as i64)
                                    })
                                })
                                .collect();
                            let dot = IntDot {
                                taps: &taps,
                                cg,
                                plane,
                                ksize,
                                x_zero,
                                x_signed,
                                w_signed,
                            };
                            let s = seg_w.start as i64;
                            for_range(kb, s, s + seg_w.len as i64, 1, &mut |kb, o_w| {
                                let x_px = kb.add_scaled(x_oh, o_w, sw as i64);
                                let sum = dot.emit(kb, x_px, wo, w_zero);
                                let at = kb.add_scaled(y_row, o_w, 4);
                                kb.store(sum, at, 0);
                            });
                        }
                    });
                }
            });
        },
    );
    Ok(())
}

/// One output of [`conv_integer`]: the sum over the group's input channels
/// and the valid taps of its segment.
struct IntDot<'a> {
    /// Per valid tap: its byte offset in X from the window's origin, and
    /// its index in the output channel's W plane.
    taps: &'a [(i64, i64)],
    cg: usize,
    /// Bytes per X plane and per W plane (`h * w`, `kh * kw`).
    plane: i64,
    ksize: i64,
    x_zero: Value,
    x_signed: bool,
    w_signed: bool,
}

impl IntDot<'_> {
    /// The i32 sum for the window at `x_px` (the window's origin in the
    /// group's first input plane) with the output channel's weights at
    /// `wo` and zero point `w_zero`.
    fn emit(&self, kb: &mut Kb, x_px: Value, wo: Value, w_zero: Value) -> Value {
        let zero = kb.b.ins().iconst(I32, 0);
        if self.taps.is_empty() {
            // The whole window lies in the padding.
            return zero;
        }
        let acc = for_range_carry(kb, 0, self.cg as i64, 1, &[zero], &mut |kb, ic, acc| {
            let xc = kb.add_scaled(x_px, ic, self.plane);
            let wc = kb.add_scaled(wo, ic, self.ksize);
            let mut acc = acc[0];
            for &(xo, wi) in self.taps {
                let xv = load_byte(kb, xc, xo, self.x_signed);
                let wv = load_byte(kb, wc, wi, self.w_signed);
                let xd = kb.b.ins().isub(xv, self.x_zero);
                let wd = kb.b.ins().isub(wv, w_zero);
                let prod = kb.b.ins().imul(xd, wd);
                acc = kb.b.ins().iadd(acc, prod);
            }
            vec![acc]
        });
        acc[0]
    }
}
