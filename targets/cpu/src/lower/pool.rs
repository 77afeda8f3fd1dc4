//! Pooling: MaxPool, AveragePool (windows with static bounds) and the
//! global pools.
//!
//! Sliding windows are split at compile time into *segments*: runs of
//! consecutive output positions whose set of in-bounds window taps (and
//! count of taps inside the padded input) is the same. Each segment is a
//! loop whose body unrolls exactly its valid taps, so no bounds checks run.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F32X4, I8X16};
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Value};
use kiln_ir::Pool2d;

use super::loops::{for_range, for_range_carry};
use super::Kb;
use super::NodeCx;
use crate::CpuError;

/// A run of output positions `start..start + len` along one axis sharing
/// the same valid taps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Seg {
    /// First output position.
    pub start: usize,
    /// Number of positions.
    pub len: usize,
    /// Kernel taps that read inside the input.
    pub taps: Vec<usize>,
    /// Number of taps inside the padded input (`[-pad_begin, input + pad_end)`).
    pub padded: usize,
}

/// Most taps one window may have: every segment's loop body unrolls its
/// taps, so code size grows with `kh × kw` (real models stay under 64).
pub(crate) const MAX_WINDOW_TAPS: usize = 4096;

/// Most `output positions × kernel taps` along one axis: the work
/// [`window_segments`] does at compile time.
pub(crate) const MAX_AXIS_WORK: usize = 1 << 24;

/// Most window taps a pooling kernel unrolls in all: each pair of row and
/// column segments unrolls its taps once per emitted pixel body, and
/// Cranelift compiled the 171,136 of the fuzzed pool that set this bound in
/// 22.8 s, about 7,500 a second. A 13×13 pool over a 19×19 map (YOLOv3's
/// SPP) unrolls 21,082.
pub(crate) const MAX_UNROLLED_TAPS: usize = 1 << 15;

/// Largest stride, dilation or pad the lowering accepts: byte offsets are
/// products of these with row sizes and must fit in an `i64`.
pub(crate) const MAX_WINDOW_STEP: usize = 1 << 20;

/// The geometry of a sliding window (Conv or pooling).
pub(crate) struct Window {
    pub kernel: [usize; 2],
    pub out: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: [usize; 4],
}

/// Refuses windows whose lowering would take unbounded compile time or code
/// size (a small model can declare a 2^20 × 2^20 kernel), or whose byte
/// offsets would overflow (a stride of 2^62).
pub(crate) fn check_window(cx: &NodeCx, win: &Window) -> Result<(), CpuError> {
    let mut steps = (win.strides.iter().chain(&win.dilations).chain(&win.pads)).copied();
    if let Some(step) = steps.find(|&s| s > MAX_WINDOW_STEP) {
        return Err(cx.unsupported(format!(
            "stride, dilation or pad {step} exceeds the CPU target's limit of {MAX_WINDOW_STEP}"
        )));
    }
    let (kernel, out) = (win.kernel, win.out);
    let taps = kernel[0].saturating_mul(kernel[1]);
    if taps > MAX_WINDOW_TAPS {
        return Err(cx.unsupported(format!(
            "a {}x{} window has {taps} taps; the CPU target unrolls windows of at most {MAX_WINDOW_TAPS}",
            kernel[0], kernel[1]
        )));
    }
    for (axis, (&k, &o)) in kernel.iter().zip(&out).enumerate() {
        if k.saturating_mul(o) > MAX_AXIS_WORK {
            return Err(cx.unsupported(format!(
                "{o} output positions x {k} taps along axis {axis} exceed the CPU target's limit of {MAX_AXIS_WORK}"
            )));
        }
    }
    Ok(())
}

/// Splits the output positions of one window axis into [`Seg`]s.
pub(crate) fn window_segments(
    out: usize,
    input: usize,
    kernel: usize,
    stride: usize,
    pad_begin: usize,
    pad_end: usize,
    dilation: usize,
) -> Vec<Seg> {
    let mut segs: Vec<Seg> = Vec::new();
    for o in 0..out {
        let base = (o * stride) as i64 - pad_begin as i64;
        let pos = |t: usize| base + (t * dilation) as i64;
        let taps: Vec<usize> = (0..kernel)
            .filter(|&t| pos(t) >= 0 && pos(t) < input as i64)
            .collect();
        let padded = (0..kernel)
            .filter(|&t| pos(t) >= -(pad_begin as i64) && pos(t) < (input + pad_end) as i64)
            .count();
        match segs.last_mut() {
            Some(s) if s.taps == taps && s.padded == padded => s.len += 1,
            _ => segs.push(Seg {
                start: o,
                len: 1,
                taps,
                padded,
            }),
        }
    }
    segs
}

/// Max or average pooling.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Maximum.
    Max,
    /// Mean; `true` counts padded positions in the divisor.
    Avg(bool),
}

/// MaxPool / AveragePool on NCHW f32.
pub(crate) fn pool(kb: &mut Kb, cx: &NodeCx, p: &Pool2d, kind: Kind) -> Result<(), CpuError> {
    cx.float_input(0, false)?;
    let (xloc, xty) = cx.inputs[0];
    let (h, w) = (xty.shape[2], xty.shape[3]);
    let planes = xty.shape[0] * xty.shape[1];
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    let [sh, sw] = p.strides;
    let [dh, dw] = p.dilations;
    let [pt, pl, _, _] = p.pads;
    check_window(
        cx,
        &Window {
            kernel: p.kernel,
            out: [oh, ow],
            strides: p.strides,
            dilations: p.dilations,
            pads: p.pads,
        },
    )?;
    // Windows past the end padding (ceil_mode) count as padding too, but
    // not in the divisor: the padded bound is pad_end.
    let segs_h = window_segments(oh, h, p.kernel[0], sh, pt, p.pads[2], dh);
    let segs_w = window_segments(ow, w, p.kernel[1], sw, pl, p.pads[3], dw);
    // Four output pixels at a time where a row's taps for them are four
    // consecutive floats (stride 1) or the even ones of seven (stride 2,
    // the downsampling pools of most CNNs); other strides go pixel by
    // pixel.
    let lanes = if sw <= 2 { 4 } else { 1 };
    // Pixel bodies per column segment: a loop of `lanes` pixels, then the
    // remaining pixels one by one.
    let bodies = |s: &Seg| usize::from(s.len >= lanes) + s.len % lanes;
    let unrolled = (segs_h.iter())
        .flat_map(|h| segs_w.iter().map(move |w| (h, w)))
        .fold(0usize, |n, (h, w)| {
            n.saturating_add(h.taps.len() * w.taps.len() * bodies(w))
        });
    if unrolled > MAX_UNROLLED_TAPS {
        return Err(cx.unsupported(format!(
            "a {}x{} window over a {h}x{w} input unrolls {unrolled} taps at its borders; the CPU target unrolls at most {MAX_UNROLLED_TAPS}",
            p.kernel[0], p.kernel[1]
        )));
    }
    let x = kb.ptr(xloc);
    let y = kb.ptr(cx.out);
    let w4 = (w * 4) as i64;
    for_range(kb, 0, planes as i64, 1, &mut |kb, plane| {
        let xp = kb.add_scaled(x, plane, (h * w * 4) as i64);
        let yp = kb.add_scaled(y, plane, (oh * ow * 4) as i64);
        for sh_seg in &segs_h {
            let start = sh_seg.start as i64;
            for_range(kb, start, start + sh_seg.len as i64, 1, &mut |kb, o_h| {
                let x_oh = kb.add_scaled(xp, o_h, sh as i64 * w4);
                let y_row = kb.add_scaled(yp, o_h, (ow * 4) as i64);
                for sw_seg in &segs_w {
                    let taps: Vec<i64> = sh_seg
                        .taps
                        .iter()
                        .flat_map(|&th| {
                            sw_seg.taps.iter().map(move |&tw| {
                                (th * dh) as i64 * w4 - pt as i64 * w4
                                    + ((tw * dw) as i64 - pl as i64) * 4
                            })
                        })
                        .collect();
                    let divisor = match kind {
                        Kind::Max => 1,
                        Kind::Avg(true) => sh_seg.padded * sw_seg.padded,
                        Kind::Avg(false) => taps.len(),
                    };
                    let pix = PoolPix {
                        kind,
                        taps: &taps,
                        divisor,
                        sw,
                    };
                    let (s0, len) = (sw_seg.start, sw_seg.len);
                    let nv = len / lanes;
                    for_range(
                        kb,
                        s0 as i64,
                        (s0 + nv * lanes) as i64,
                        lanes as i64,
                        &mut |kb, o_w| pix.emit(kb, x_oh, y_row, o_w, lanes == 4),
                    );
                    for t in s0 + nv * lanes..s0 + len {
                        let o_w = kb.iconst(t as i64);
                        pix.emit(kb, x_oh, y_row, o_w, false);
                    }
                }
            });
        }
    });
    Ok(())
}

struct PoolPix<'a> {
    kind: Kind,
    /// Byte offsets of the valid taps relative to the window origin row
    /// pointer plus `o_w * sw * 4`.
    taps: &'a [i64],
    divisor: usize,
    sw: usize,
}

impl PoolPix<'_> {
    /// One output pixel (or four consecutive ones when `vector`, `sw == 1`).
    fn emit(&self, kb: &mut Kb, x_oh: Value, y_row: Value, o_w: Value, vector: bool) {
        let ty = if vector { F32X4 } else { F32 };
        let px = kb.add_scaled(x_oh, o_w, (self.sw * 4) as i64);
        let mut acc = match self.kind {
            Kind::Max => kb.fconst(ty, f64::NEG_INFINITY),
            Kind::Avg(_) => kb.fconst(ty, 0.0),
        };
        for &t in self.taps {
            let v = if vector && self.sw == 2 {
                even_lanes(kb, px, t)
            } else {
                kb.load(ty, px, t)
            };
            acc = match self.kind {
                Kind::Max => max_skipping_nan(kb, acc, v, vector),
                Kind::Avg(_) => kb.b.ins().fadd(acc, v),
            };
        }
        if matches!(self.kind, Kind::Avg(_)) && self.divisor > 0 {
            let d = kb.fconst(ty, self.divisor as f64);
            acc = kb.b.ins().fdiv(acc, d);
        }
        let py = kb.add_scaled(y_row, o_w, 4);
        kb.store(acc, py, 0);
    }
}

/// `v > acc ? v : acc`, lane by lane: a NaN tap is skipped, as in the
/// reference evaluator (`compiler/ir/src/eval/pool.rs`). Written as the
/// compare-and-select that x86-64 lowers to one `maxps`/`maxss`
/// (`max(v, acc)` returns `acc` when either is NaN); Cranelift's `fmax`
/// propagates NaN and takes six instructions.
fn max_skipping_nan(kb: &mut Kb, acc: Value, v: Value, vector: bool) -> Value {
    let greater = kb.b.ins().fcmp(FloatCC::LessThan, acc, v);
    if vector {
        let flags = MemFlagsData::new().with_endianness(Endianness::Little);
        let mask = kb.b.ins().bitcast(F32X4, flags, greater);
        kb.b.ins().bitselect(mask, v, acc)
    } else {
        kb.b.ins().select(greater, v, acc)
    }
}

/// The floats at `p + off` + 0, 2, 4 and 6 elements: two loads of four
/// (elements 0..4 and 3..7, so nothing past element 6 is read) and one
/// `shufps` taking lanes 0 and 2 of the first and 1 and 3 of the second.
fn even_lanes(kb: &mut Kb, p: Value, off: i64) -> Value {
    let low = kb.load(I8X16, p, off);
    let high = kb.load(I8X16, p, off + 12);
    let lanes = [0u8, 2, 5, 7];
    let bytes: Vec<u8> = (lanes.iter())
        .flat_map(|&l| (0..4).map(move |b| l * 4 + b))
        .collect();
    let mask = kb.b.func.dfg.immediates.push(ConstantData::from(bytes));
    let v = kb.b.ins().shuffle(low, high, mask);
    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
    kb.b.ins().bitcast(F32X4, flags, v)
}

/// GlobalAveragePool / GlobalMaxPool: one reduction per (n, c) plane.
pub(crate) fn global(kb: &mut Kb, cx: &NodeCx, max: bool) -> Result<(), CpuError> {
    cx.float_input(0, false)?;
    let (xloc, xty) = cx.inputs[0];
    let planes = xty.shape[0] * xty.shape[1];
    let size: usize = xty.shape[2..].iter().product();
    let x = kb.ptr(xloc);
    let y = kb.ptr(cx.out);
    for_range(kb, 0, planes as i64, 1, &mut |kb, plane| {
        let xp = kb.add_scaled(x, plane, (size * 4) as i64);
        let r = reduce(kb, xp, size, max);
        let r = if max {
            r
        } else {
            let d = kb.fconst(F32, size as f64);
            kb.b.ins().fdiv(r, d)
        };
        let py = kb.add_scaled(y, plane, 4);
        kb.store(r, py, 0);
    });
    Ok(())
}

/// Sum or max of `n` contiguous f32 at `p`.
pub(crate) fn reduce(kb: &mut Kb, p: Value, n: usize, max: bool) -> Value {
    let init = if max { f64::NEG_INFINITY } else { 0.0 };
    let combine = |kb: &mut Kb, a: Value, b: Value| {
        if max {
            kb.b.ins().fmax(a, b)
        } else {
            kb.b.ins().fadd(a, b)
        }
    };
    let nv = n / 4;
    let mut acc = kb.fconst(F32, init);
    if nv > 0 {
        let v0 = kb.fconst(F32X4, init);
        let v = for_range_carry(kb, 0, (nv * 16) as i64, 16, &[v0], &mut |kb, off, c| {
            let q = kb.b.ins().iadd(p, off);
            let x = kb.load(F32X4, q, 0);
            vec![combine(kb, c[0], x)]
        })[0];
        for lane in 0..4u8 {
            let s = kb.b.ins().extractlane(v, lane);
            acc = combine(kb, acc, s);
        }
    }
    for t in nv * 4..n {
        let s = kb.load(F32, p, (t * 4) as i64);
        acc = combine(kb, acc, s);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::window_segments;

    #[test]
    fn segments_split_at_borders() {
        // 3-tap window, pad 1, stride 1 over 5 inputs: left border, interior, right border.
        let s = window_segments(5, 5, 3, 1, 1, 1, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(
            (s[0].start, s[0].len, s[0].taps.clone()),
            (0, 1, vec![1, 2])
        );
        assert_eq!(
            (s[1].start, s[1].len, s[1].taps.clone()),
            (1, 3, vec![0, 1, 2])
        );
        assert_eq!(
            (s[2].start, s[2].len, s[2].taps.clone()),
            (4, 1, vec![0, 1])
        );
        assert!(s.iter().all(|s| s.padded == 3));
    }
}
