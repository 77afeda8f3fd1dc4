//! Direct 2-D convolution and 2-D max/average pooling (NCHW).
//!
//! Convolutions with at least 16 output channels per group run as an
//! implicit GEMM on the tiled GEMM kernel (`linalg.rs`): the im2col matrix
//! is gathered by the tile loader, never stored. The others (depthwise,
//! few channels) and the pools use one thread per output element
//! `(n, c, oy, ox)`. The window loops run
//! over compile-time bounds; a tap's input row (`oy * stride + ky *
//! dilation - pad`) is computed in wrapping `u32`, so a single unsigned
//! compare against the input height rejects both the top/left padding
//! (which wraps to a huge value) and the bottom/right padding. Convolution
//! loops over the group's input channels at run time with the kernel window
//! unrolled when it is small (at most 49 taps), and adds the bias first.
//! fp32 only, like the CPU target.
//!
//! ConvInteger (u8/i8 X and W, exact wrapping i32 out) is the direct
//! kernel with integer taps: one thread per output element walks the same
//! window (padded taps, which hold X's zero point and would add 0, are
//! skipped by the same unsigned compare), loads 8-bit elements with
//! `ld.global.u8`/`s8` (zero- or sign-extended to 32 bits), subtracts the
//! zero points (X's scalar, W's scalar or per output channel) and
//! accumulates with `mad.lo.s32`, like MatMulInteger.

use kiln_ir::{Conv2d, DType, Pool2d};

use super::linalg::{gemm_grid, gemm_kernel, mma_kernel, BSource, Gemm, Im2col, MmaKind};
use super::{coords, global_index, inside, linear_launch, load, mem, ptr, store, Cx, Kernel};
use crate::plan::{Base, Loc};
use crate::ptx::{fimm, Bin, Cmp, KernelBuilder, Opnd, Reg, Space, Ty};
use crate::CudaError;

/// Window taps at most this many are unrolled.
const UNROLL_TAPS: usize = 49;

/// Calls `tap(kb, ky, kx)` for every window position, unrolled when the
/// window is small, as two loops otherwise.
fn for_window(
    kb: &mut KernelBuilder,
    kh: usize,
    kw: usize,
    tap: &dyn Fn(&mut KernelBuilder, Opnd, Opnd),
) {
    if kh * kw <= UNROLL_TAPS {
        for ky in 0..kh {
            for kx in 0..kw {
                tap(kb, Opnd::I(ky as i64), Opnd::I(kx as i64));
            }
        }
    } else {
        kb.for_range(0u32, kh as u32, 1u32, |kb, ky| {
            kb.for_range(0u32, kw as u32, 1u32, |kb, kx| {
                tap(kb, ky.into(), kx.into())
            });
        });
    }
}

/// `base * stride + k * dilation - pad` in wrapping u32 (`k` immediate or
/// register).
fn tap_pos(
    kb: &mut KernelBuilder,
    base: Reg,
    stride: usize,
    k: Opnd,
    dilation: usize,
    pad: usize,
) -> Reg {
    let s = kb.bin(Bin::Mul, base, stride as u32);
    match k {
        Opnd::I(k) => {
            let c = (k as u32)
                .wrapping_mul(dilation as u32)
                .wrapping_sub(pad as u32);
            kb.bin(Bin::Add, s, Opnd::I(c as i64))
        }
        Opnd::R(k) => {
            let t = kb.mad(k, dilation as u32, s);
            kb.bin(Bin::Sub, t, pad as u32)
        }
        _ => unreachable!("integer window position"),
    }
}

/// The output coordinates `(n, c, oy, ox)` of this thread (`None` ones are
/// 0: axes of size 1).
fn out_coords(kb: &mut KernelBuilder, i: Reg, shape: &[usize]) -> [Reg; 4] {
    let cs = coords(kb, i, shape);
    let mut out = [i; 4];
    for (d, c) in cs.into_iter().enumerate() {
        out[d] = match c {
            Some(r) => r,
            None => kb.mov(Ty::U32, 0u32),
        };
    }
    out
}

/// Output channels per group from which a convolution runs as an
/// implicit GEMM (below, e.g. depthwise, most of a 64-row tile would idle
/// and the direct kernel is used).
const GEMM_MIN_CHANNELS: usize = 16;

pub(crate) fn conv(cx: &Cx, c: &Conv2d) -> Result<Kernel, CudaError> {
    super::linalg::check_dense(cx)?;
    let xs = &cx.inputs[0].1.shape;
    let ws = &cx.inputs[1].1.shape;
    if xs.len() != 4 {
        return Err(cx.unsupported(format!("{}-D input (only 2-D convolution)", xs.len())));
    }
    // The GEMM grid's z (images × groups) and y (row tiles) are limited to
    // 65535 blocks; past that the direct kernel's 1-D grid still fits.
    let per_group = ws[0] / c.group;
    if per_group >= GEMM_MIN_CHANNELS && xs[0] * c.group <= 65535 && per_group.div_ceil(64) <= 65535
    {
        return implicit_gemm(cx, c);
    }
    direct(cx, c)
}

/// The GEMM geometry of a convolution per (image, group):
/// `out[g*M + i, oy*OW + ox] = sum_k W[g*M + i, k] * im2col(x)[k, (oy, ox)]`
/// with M output channels per group, K = Cg*KH*KW; C (the bias) per row.
fn conv_gemm(cx: &Cx, c: &Conv2d, pad: Option<Loc>) -> Gemm {
    let xs = &cx.inputs[0].1.shape;
    let ws = &cx.inputs[1].1.shape;
    let os = &cx.out_ty.shape;
    let (n, cin, h, w) = (xs[0], xs[1], xs[2], xs[3]);
    let (cout, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let m = cout / c.group;
    let k = cg * kh * kw;
    Gemm {
        m,
        n: os[2] * os[3],
        k,
        a_rs: k as i64,
        a_ks: 1,
        b: BSource::Im2col(Im2col {
            h,
            w,
            kh,
            kw,
            ow: os[3],
            strides: c.strides,
            dilations: c.dilations,
            pads: [c.pads[0], c.pads[1]],
            pad,
        }),
        batch: vec![n, c.group],
        a_batch: vec![0, (m * k) as i64],
        b_batch: vec![(cin * h * w) as i64, (cg * h * w) as i64],
        c: Some((1, 0)),
        c_batch: vec![0, m as i64],
        alpha: 1.0,
        beta: 1.0,
    }
}

/// `cx` with the convolution's operands in GEMM order: A = weights,
/// B = input, then `third` (the bias, or ConvInteger's X zero point).
fn gemm_cx<'g>(cx: &Cx<'g>, third: Option<(Loc, &'g kiln_ir::ValueType)>) -> Cx<'g> {
    let mut inputs = vec![cx.inputs[1], cx.inputs[0]];
    inputs.extend(third);
    Cx {
        kernel: cx.kernel.clone(),
        name: cx.name.clone(),
        op: cx.op,
        inputs,
        out: cx.out,
        out_ty: cx.out_ty,
        epilogue: cx.epilogue.clone(),
        tables: cx.tables,
        sm: cx.sm,
    }
}

/// Convolution as an implicit GEMM ([`conv_gemm`]): the im2col matrix is
/// read on the fly by the tile loader (`linalg::BSource::Im2col`), so the
/// kernel gets the GEMM's shared-memory tiling and register blocking.
fn implicit_gemm(cx: &Cx, c: &Conv2d) -> Result<Kernel, CudaError> {
    let mut g = conv_gemm(cx, c, None);
    if cx.inputs.get(2).is_none() {
        g.c = None;
    }
    gemm_kernel(&gemm_cx(cx, cx.inputs.get(2).copied()), &g)
}

/// ConvInteger on int8 tensor cores (sm_80+): constant weights with zero
/// point 0 (quantized weights) and at least [`GEMM_MIN_CHANNELS`] output
/// channels per group. `conv(X − zx, W) = conv(X, W) − zx · rowsum(W)`
/// when the padding holds zx (the loader reads it there), with the
/// weights' row sums computed here into the weights. `None`: the direct
/// kernel.
fn conv_integer_mma(cx: &Cx, c: &Conv2d) -> Option<Kernel> {
    let (w_loc, w_ty) = cx.inputs[1];
    let (zw_loc, zw_ty) = cx.inputs[3];
    let per_group = w_ty.shape[0] / c.group;
    if cx.sm < 80
        || w_loc.base != Base::Weights
        || zw_loc.base != Base::Weights
        || per_group < GEMM_MIN_CHANNELS
    {
        return None;
    }
    let rows = w_ty.shape[0];
    let k = w_ty.num_elements() / rows.max(1);
    let rowsums: Vec<u8> = {
        let w = cx.tables.borrow();
        if w[zw_loc.offset as usize..][..zw_ty.num_elements()]
            .iter()
            .any(|&z| z != 0)
        {
            return None;
        }
        let bytes = &w[w_loc.offset as usize..][..rows * k];
        let value = |byte: u8| match w_ty.dtype {
            DType::I8 => byte as i8 as i32,
            _ => byte as i32,
        };
        bytes
            .chunks(k.max(1))
            .flat_map(|row| {
                row.iter()
                    .map(|&b| value(b))
                    .fold(0i32, i32::wrapping_add)
                    .to_le_bytes()
            })
            .collect()
    };
    let g = conv_gemm(cx, c, Some(cx.inputs[2].0));
    let grid = gemm_grid(&g)?;
    let kind = MmaKind::Int8 {
        a: w_ty.dtype,
        b: cx.inputs[0].1.dtype,
        zero: cx.inputs[2].1.dtype,
        sums: cx.table(&rowsums),
    };
    Some(mma_kernel(&gemm_cx(cx, Some(cx.inputs[2])), &g, kind, grid))
}

/// Direct convolution: one thread per output element.
fn direct(cx: &Cx, c: &Conv2d) -> Result<Kernel, CudaError> {
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let o = out_coords(&mut kb, i, &cx.out_ty.shape);
    let x_ptr = ptr(&mut kb, cx.inputs[0].0);
    let w_ptr = ptr(&mut kb, cx.inputs[1].0);
    let acc = match cx.inputs.get(2) {
        Some(&(loc, _)) => {
            let b = ptr(&mut kb, loc);
            let v = load(&mut kb, b, o[1], cx.inputs[2].1.dtype);
            kb.mov(Ty::F32, v)
        }
        None => kb.mov(Ty::F32, fimm(Ty::F32, 0.0)),
    };
    direct_taps(&mut kb, cx, c, o, &|kb, xi, wi| {
        let xv = load(kb, x_ptr, xi, cx.inputs[0].1.dtype);
        let wv = load(kb, w_ptr, wi, cx.inputs[1].1.dtype);
        kb.mad_into(acc, xv, wv, acc);
    });
    let out = ptr(&mut kb, cx.out);
    let acc = cx.epilogue(&mut kb, acc);
    store(&mut kb, out, i, cx.out_ty.dtype, acc);
    Ok(cx.finish(kb, linear_launch(n)))
}

/// The window walk of a direct convolution for the output `(n, oc, oy,
/// ox)` of this thread: calls `tap(kb, xi, wi)` with the element indices
/// into X and W of every tap inside the input, over the group's input
/// channels (a run-time loop) and the window ([`for_window`]). Taps in the
/// padding are skipped (see the module docs), so nothing outside X is
/// read.
fn direct_taps(
    kb: &mut KernelBuilder,
    cx: &Cx,
    c: &Conv2d,
    [on, oc, oy, ox]: [Reg; 4],
    tap: &dyn Fn(&mut KernelBuilder, Reg, Reg),
) {
    let xs = &cx.inputs[0].1.shape;
    let ws = &cx.inputs[1].1.shape;
    let (cin, h, w) = (xs[1], xs[2], xs[3]);
    let (cout, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
    let out_per_group = cout / c.group;
    // First input channel of this output channel's group.
    let g = kb.bin(Bin::Div, oc, out_per_group as u32);
    let c0 = kb.bin(Bin::Mul, g, cg as u32);
    let n_base = kb.bin(Bin::Mul, on, cin as u32);
    let c_base = kb.bin(Bin::Add, n_base, c0);
    // Weights of this output channel start at oc * cg * kh * kw.
    let w_base = kb.bin(Bin::Mul, oc, (cg * kh * kw) as u32);
    kb.for_range(0u32, cg as u32, 1u32, |kb, ic| {
        let plane = kb.bin(Bin::Add, c_base, ic);
        let x_plane = kb.bin(Bin::Mul, plane, (h * w) as u32);
        let w_chan = kb.mad(ic, (kh * kw) as u32, w_base);
        for_window(kb, kh, kw, &|kb, ky, kx| {
            let iy = tap_pos(kb, oy, c.strides[0], ky, c.dilations[0], c.pads[0]);
            let ix = tap_pos(kb, ox, c.strides[1], kx, c.dilations[1], c.pads[1]);
            let ok = inside(kb, (iy, h), (ix, w));
            kb.when(ok, |kb| {
                let row = kb.mad(iy, w as u32, x_plane);
                let xi = kb.bin(Bin::Add, row, ix);
                let wi = match (ky, kx) {
                    (Opnd::I(ky), Opnd::I(kx)) => {
                        kb.bin(Bin::Add, w_chan, Opnd::I(ky * kw as i64 + kx))
                    }
                    (Opnd::R(ky), Opnd::R(kx)) => {
                        let t = kb.mad(ky, kw as u32, w_chan);
                        kb.bin(Bin::Add, t, kx)
                    }
                    _ => unreachable!("both immediate or both registers"),
                };
                tap(kb, xi, wi);
            });
        });
    });
}

/// Largest window coordinate (`(out - 1) * stride + (k - 1) * dilation`,
/// and a pad) the wrapping-`u32` tap positions of [`tap_pos`] take exactly.
const MAX_WINDOW_POS: u64 = i32::MAX as u64;

/// Refuses a window whose tap positions would leave the range in which
/// [`tap_pos`]'s wrapping `u32` arithmetic is exact (a stride or pad near
/// 2^32 would alias in-bounds rows).
fn check_window_range(cx: &Cx, c: &Conv2d) -> Result<(), CudaError> {
    let ws = &cx.inputs[1].1.shape;
    let os = &cx.out_ty.shape;
    for axis in 0..2 {
        let last = |n: usize, step: usize| (n.max(1) as u64 - 1).checked_mul(step as u64);
        let far = last(os[2 + axis], c.strides[axis])
            .zip(last(ws[2 + axis], c.dilations[axis]))
            .and_then(|(a, b)| a.checked_add(b));
        let pad = c.pads[axis] as u64;
        if far.is_none_or(|f| f > MAX_WINDOW_POS) || pad > MAX_WINDOW_POS {
            return Err(cx.unsupported(format!(
                "window positions along axis {axis} exceed the CUDA target's 32-bit index range"
            )));
        }
    }
    Ok(())
}

/// `ConvInteger`: `out = conv(X - x_zero, W - w_zero)` in wrapping i32,
/// X and W u8 or i8 (independently), X's zero point a scalar, W's a scalar
/// or one per output channel. One thread per output element walks the
/// direct convolution's window ([`direct_taps`]) with 8-bit loads
/// (`ld.global.u8`/`s8`, zero- or sign-extended to 32 bits) and
/// `mad.lo.s32`; taps in the padding (which holds X's zero point) add 0
/// and are skipped.
pub(crate) fn conv_integer(cx: &Cx, c: &Conv2d) -> Result<Kernel, CudaError> {
    for &(_, ty) in &cx.inputs {
        if !matches!(ty.dtype, DType::U8 | DType::I8) {
            return Err(cx.dtype_err(ty.dtype));
        }
    }
    let xs = &cx.inputs[0].1.shape;
    if xs.len() != 4 {
        return Err(cx.unsupported(format!("{}-D input (only 2-D convolution)", xs.len())));
    }
    check_window_range(cx, c)?;
    if let Some(kernel) = conv_integer_mma(cx, c) {
        return Ok(kernel);
    }
    let (dx, dw) = (cx.inputs[0].1.dtype, cx.inputs[1].1.dtype);
    let per_channel = cx.inputs[3].1.num_elements() > 1;
    let byte = |kb: &mut KernelBuilder, d: DType, addr: Reg| {
        kb.ld(Space::Global, mem(d), Ty::S32, addr, 0)
    };
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let o = out_coords(&mut kb, i, &cx.out_ty.shape);
    let x_ptr = ptr(&mut kb, cx.inputs[0].0);
    let w_ptr = ptr(&mut kb, cx.inputs[1].0);
    let x_zero_ptr = ptr(&mut kb, cx.inputs[2].0);
    let x_zero = byte(&mut kb, dx, x_zero_ptr);
    let w_zero_ptr = ptr(&mut kb, cx.inputs[3].0);
    let w_zero_addr = if per_channel {
        kb.addr(w_zero_ptr, o[1], 1)
    } else {
        w_zero_ptr
    };
    let w_zero = byte(&mut kb, dw, w_zero_addr);
    let acc = kb.mov(Ty::S32, 0u32);
    direct_taps(&mut kb, cx, c, o, &|kb, xi, wi| {
        let xa = kb.addr(x_ptr, xi, 1);
        let wa = kb.addr(w_ptr, wi, 1);
        let xv = byte(kb, dx, xa);
        let wv = byte(kb, dw, wa);
        let xc = kb.bin(Bin::Sub, xv, x_zero);
        let wc = kb.bin(Bin::Sub, wv, w_zero);
        kb.mad_into(acc, xc, wc, acc);
    });
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, DType::I32, acc);
    Ok(cx.finish(kb, linear_launch(n)))
}

/// Max pooling (`average = None`; padded positions never win) or average
/// pooling (`Some(count_include_pad)`).
pub(crate) fn pool(cx: &Cx, p: &Pool2d, average: Option<bool>) -> Result<Kernel, CudaError> {
    let (loc, ty) = cx.inputs[0];
    if ty.dtype != DType::F32 {
        return Err(cx.dtype_err(ty.dtype));
    }
    if ty.shape.len() != 4 {
        return Err(cx.unsupported(format!("{}-D input (only 2-D pooling)", ty.shape.len())));
    }
    let (h, w) = (ty.shape[2], ty.shape[3]);
    let [kh, kw] = p.kernel;
    let [pt, pl, pb, pr] = p.pads;
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let [on, oc, oy, ox] = out_coords(&mut kb, i, &cx.out_ty.shape);
    let x_ptr = ptr(&mut kb, loc);
    let plane = kb.mad(on, ty.shape[1] as u32, oc);
    let x_plane = kb.bin(Bin::Mul, plane, (h * w) as u32);
    let init = if average.is_some() {
        0.0
    } else {
        f64::NEG_INFINITY
    };
    let acc = kb.mov(Ty::F32, fimm(Ty::F32, init));
    // Taps inside the input, and inside the padded input.
    let taps = kb.mov(Ty::U32, 0u32);
    let padded = kb.mov(Ty::U32, 0u32);
    for_window(&mut kb, kh, kw, &|kb, ky, kx| {
        let iy = tap_pos(kb, oy, p.strides[0], ky, p.dilations[0], p.pads[0]);
        let ix = tap_pos(kb, ox, p.strides[1], kx, p.dilations[1], p.pads[1]);
        if average == Some(true) {
            // Padded coordinates are iy + pt, ix + pl.
            let py = kb.bin(Bin::Add, iy, pt as u32);
            let px = kb.bin(Bin::Add, ix, pl as u32);
            let within = inside(kb, (py, pt + h + pb), (px, pl + w + pr));
            kb.when(within, |kb| kb.bin_into(padded, Bin::Add, padded, 1u32));
        }
        let ok = inside(kb, (iy, h), (ix, w));
        kb.when(ok, |kb| {
            let row = kb.mad(iy, w as u32, x_plane);
            let xi = kb.bin(Bin::Add, row, ix);
            let v = load(kb, x_ptr, xi, DType::F32);
            match average {
                None => {
                    // `v > acc` is false for NaN: NaN never wins, like the
                    // reference.
                    let gt = kb.setp(Cmp::Gt, v, acc);
                    let m = kb.selp(Ty::F32, gt, v, acc);
                    kb.assign(acc, m);
                }
                Some(_) => {
                    kb.bin_into(acc, Bin::Add, acc, v);
                    kb.bin_into(taps, Bin::Add, taps, 1u32);
                }
            }
        });
    });
    let result = match average {
        None => acc,
        Some(include_pad) => {
            let count = if include_pad { padded } else { taps };
            let cf = kb.cvt(Ty::F32, "rn", count);
            kb.bin(Bin::Div, acc, cf)
        }
    };
    let out = ptr(&mut kb, cx.out);
    let result = cx.epilogue(&mut kb, result);
    store(&mut kb, out, i, DType::F32, result);
    Ok(cx.finish(kb, linear_launch(n)))
}
