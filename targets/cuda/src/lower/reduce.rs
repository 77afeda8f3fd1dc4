//! Reductions, global pools and softmax: one block per output row.
//!
//! A block of 32–256 threads (the reduced length rounded up to a power of
//! two) owns one output element: each thread folds a strided share of the
//! reduced elements, warps combine their partials with `shfl.sync.down`,
//! and warp 0 combines the warp results from shared memory and publishes
//! the total through shared memory to the whole block. Softmax is one such
//! block per row: a max reduction, a sum of `exp(x - max)`, then the row is
//! written. Float sums accumulate in the element type (the reference
//! evaluator uses f64; the tree order keeps the f32 error small).

use kiln_ir::{DType, ReduceOp};

use super::math;
use super::{coords, load, offset, ptr, store, strides, Cx, Kernel};
use crate::ptx::{fimm, Bin, Cmp, KernelBuilder, MemTy, Opnd, Reg, Space, Special, Ty};
use crate::{CudaError, Launch};

/// How partial values combine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Combine {
    Add,
    Mul,
    /// Max; NaN propagates when `nan` is set.
    Max {
        nan: bool,
    },
    /// Min; NaN propagates when `nan` is set.
    Min {
        nan: bool,
    },
}

impl Combine {
    fn identity(self, t: Ty) -> Opnd {
        let v = match self {
            Combine::Add => 0.0,
            Combine::Mul => 1.0,
            Combine::Max { .. } => f64::NEG_INFINITY,
            Combine::Min { .. } => f64::INFINITY,
        };
        if t.is_float() {
            fimm(t, v)
        } else {
            let unsigned = t == Ty::U64;
            Opnd::I(match self {
                Combine::Add => 0,
                Combine::Mul => 1,
                Combine::Max { .. } if unsigned => 0,
                // u64::MAX's bits.
                Combine::Min { .. } if unsigned => -1,
                Combine::Max { .. } => i64::MIN,
                Combine::Min { .. } => i64::MAX,
            })
        }
    }

    fn apply(self, kb: &mut KernelBuilder, a: Reg, b: Reg) -> Reg {
        let (bin, nan) = match self {
            Combine::Add => (Bin::Add, false),
            Combine::Mul => (Bin::Mul, false),
            Combine::Max { nan } => (Bin::Max, nan),
            Combine::Min { nan } => (Bin::Min, nan),
        };
        let r = kb.bin(bin, a, b);
        if nan && a.ty().is_float() {
            let p = kb.is_nan(a, b);
            kb.selp(a.ty(), p, fimm(a.ty(), f64::NAN), r)
        } else {
            r
        }
    }
}

/// Threads per block for rows of `len` elements.
fn block_threads(len: usize) -> u32 {
    len.next_power_of_two().clamp(32, 256) as u32
}

/// Dynamic shared memory of [`block_reduce`]: one 8-byte slot per warp and
/// one for the result.
fn reduce_smem(threads: u32) -> u32 {
    (threads / 32 + 1) * 8
}

/// A block of `threads` threads per output element, `rows` blocks.
fn row_launch(rows: usize, threads: u32) -> Launch {
    Launch {
        grid: [rows as u32, 1, 1],
        block: [threads, 1, 1],
        shared_bytes: reduce_smem(threads),
    }
}

/// The block-wide combination of every thread's `v`, returned to every
/// thread.
fn block_reduce(kb: &mut KernelBuilder, v: Reg, threads: u32, c: Combine) -> Reg {
    let t = v.ty();
    let mut acc = v;
    for delta in [16, 8, 4, 2, 1] {
        let other = kb.shfl_down(acc, delta);
        acc = c.apply(kb, acc, other);
    }
    let tid = kb.special(Special::TidX);
    let lane = kb.bin(Bin::And, tid, 31u32);
    let warp = kb.bin(Bin::Shr, tid, 5u32);
    let smem = kb.smem_base();
    let mem = MemTy(t.suffix());
    let lane0 = kb.setp(Cmp::Eq, lane, 0u32);
    kb.when(lane0, |kb| {
        let a = kb.addr(smem, warp, 8);
        kb.st(Space::Shared, mem, a, 0, acc);
    });
    kb.barrier();
    let warps = threads / 32;
    let first = kb.setp(Cmp::Eq, warp, 0u32);
    kb.when(first, |kb| {
        let w = kb.mov(t, c.identity(t));
        let has = kb.setp(Cmp::Lt, lane, warps);
        kb.when(has, |kb| {
            let a = kb.addr(smem, lane, 8);
            let x = kb.ld(Space::Shared, mem, t, a, 0);
            kb.assign(w, x);
        });
        let mut acc = w;
        for delta in [16, 8, 4, 2, 1] {
            let other = kb.shfl_down(acc, delta);
            acc = c.apply(kb, acc, other);
        }
        let lane0 = kb.setp(Cmp::Eq, lane, 0u32);
        kb.when(lane0, |kb| {
            kb.st(Space::Shared, mem, smem, (warps * 8) as i64, acc);
        });
    });
    kb.barrier();
    kb.ld(Space::Shared, mem, t, smem, (warps * 8) as i64)
}

/// Folds `f(x_j)` over the `len` elements `j` of this block's row, in
/// strides of the block size, then reduces across the block.
#[allow(clippy::too_many_arguments)]
fn fold_row(
    kb: &mut KernelBuilder,
    threads: u32,
    len: usize,
    t: Ty,
    c: Combine,
    element: &dyn Fn(&mut KernelBuilder, Reg) -> Reg,
    f: &dyn Fn(&mut KernelBuilder, Reg) -> Reg,
) -> Reg {
    let acc = kb.mov(t, c.identity(t));
    let tid = kb.special(Special::TidX);
    kb.for_range(tid, len as u32, threads, |kb, j| {
        let x = element(kb, j);
        let y = f(kb, x);
        let r = c.apply(kb, acc, y);
        kb.assign(acc, r);
    });
    block_reduce(kb, acc, threads, c)
}

/// `Reduce { op, axes }`.
pub(crate) fn reduce(cx: &Cx, op: ReduceOp, axes: &[usize]) -> Result<Kernel, CudaError> {
    let (loc, ty) = cx.inputs[0];
    let d = ty.dtype;
    let t = cx.input_cty(0, op.accepts_int())?;
    if d == DType::Bool {
        return Err(cx.dtype_err(d));
    }
    let shape = &ty.shape;
    let st = strides(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let kept_st: Vec<i64> = kept.iter().map(|&a| st[a]).collect();
    let red_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let red_st: Vec<i64> = axes.iter().map(|&a| st[a]).collect();
    let len: usize = red_shape.iter().product();
    let rows = cx.out_ty.num_elements();
    let threads = block_threads(len);
    let mut kb = cx.builder([threads, 1, 1]);
    let row = kb.special(Special::CtaidX);
    let kc = coords(&mut kb, row, &kept_shape);
    let row_base = offset(&mut kb, &kc, &kept_st, 0);
    let base = ptr(&mut kb, loc);
    let element = move |kb: &mut KernelBuilder, j: Reg| {
        let rc = coords(kb, j, &red_shape);
        let o = offset(kb, &rc, &red_st, 0);
        let idx = kb.bin(Bin::Add, o, row_base);
        load(kb, base, idx, d)
    };
    let id = |_: &mut KernelBuilder, x: Reg| x;
    let square = |kb: &mut KernelBuilder, x: Reg| kb.bin(Bin::Mul, x, x);
    let abs = |kb: &mut KernelBuilder, x: Reg| kb.un("abs", x);
    let nan = true;
    let result = match op {
        ReduceOp::Sum => fold_row(&mut kb, threads, len, t, Combine::Add, &element, &id),
        ReduceOp::Mean => {
            let s = fold_row(&mut kb, threads, len, t, Combine::Add, &element, &id);
            kb.bin(Bin::Div, s, fimm(t, len as f64))
        }
        ReduceOp::Max => fold_row(
            &mut kb,
            threads,
            len,
            t,
            Combine::Max { nan },
            &element,
            &id,
        ),
        ReduceOp::Min => fold_row(
            &mut kb,
            threads,
            len,
            t,
            Combine::Min { nan },
            &element,
            &id,
        ),
        ReduceOp::Prod => fold_row(&mut kb, threads, len, t, Combine::Mul, &element, &id),
        ReduceOp::L1 => fold_row(&mut kb, threads, len, t, Combine::Add, &element, &abs),
        ReduceOp::L2 => {
            let s = fold_row(&mut kb, threads, len, t, Combine::Add, &element, &square);
            kb.un("sqrt.rn", s)
        }
        ReduceOp::SumSquare => fold_row(&mut kb, threads, len, t, Combine::Add, &element, &square),
        ReduceOp::LogSum => {
            let s = fold_row(&mut kb, threads, len, t, Combine::Add, &element, &id);
            math::log(&mut kb, s)
        }
        ReduceOp::LogSumExp => {
            let m = fold_row(
                &mut kb,
                threads,
                len,
                t,
                Combine::Max { nan },
                &element,
                &id,
            );
            // With an infinite maximum (or none) the naive form is exact.
            let mag = kb.un("abs", m);
            let inf = kb.setp(Cmp::Eq, mag, fimm(t, f64::INFINITY));
            let shift = kb.selp(t, inf, fimm(t, 0.0), m);
            let exp_shifted = move |kb: &mut KernelBuilder, x: Reg| {
                let y = kb.bin(Bin::Sub, x, shift);
                math::exp(kb, y)
            };
            let s = fold_row(
                &mut kb,
                threads,
                len,
                t,
                Combine::Add,
                &element,
                &exp_shifted,
            );
            let l = math::log(&mut kb, s);
            kb.bin(Bin::Add, l, shift)
        }
    };
    write_row_result(&mut kb, cx, row, result);
    Ok(cx.finish(kb, row_launch(rows, threads)))
}

/// Thread 0 stores the block's result at output element `row`.
fn write_row_result(kb: &mut KernelBuilder, cx: &Cx, row: Reg, v: Reg) {
    let tid = kb.special(Special::TidX);
    let t0 = kb.setp(Cmp::Eq, tid, 0u32);
    let out = ptr(kb, cx.out);
    let d = cx.out_ty.dtype;
    let v = cx.epilogue(kb, v);
    kb.when(t0, |kb| store(kb, out, row, d, v));
}

/// GlobalAveragePool / GlobalMaxPool: one block per (n, c) plane. The max
/// ignores NaN like the reference (`v > m` never holds for NaN).
pub(crate) fn global_pool(cx: &Cx, max: bool) -> Result<Kernel, CudaError> {
    let (loc, ty) = cx.inputs[0];
    if ty.dtype != DType::F32 {
        return Err(cx.dtype_err(ty.dtype));
    }
    let t = Ty::F32;
    let plane: usize = ty.shape[2..].iter().product();
    let rows = cx.out_ty.num_elements();
    let threads = block_threads(plane);
    let mut kb = cx.builder([threads, 1, 1]);
    let row = kb.special(Special::CtaidX);
    let row_base = kb.bin(Bin::Mul, row, plane as u32);
    let base = ptr(&mut kb, loc);
    let element = move |kb: &mut KernelBuilder, j: Reg| {
        let idx = kb.bin(Bin::Add, j, row_base);
        load(kb, base, idx, DType::F32)
    };
    let id = |_: &mut KernelBuilder, x: Reg| x;
    let result = if max {
        fold_row(
            &mut kb,
            threads,
            plane,
            t,
            Combine::Max { nan: false },
            &element,
            &id,
        )
    } else {
        let s = fold_row(&mut kb, threads, plane, t, Combine::Add, &element, &id);
        kb.bin(Bin::Div, s, fimm(t, plane as f64))
    };
    write_row_result(&mut kb, cx, row, result);
    Ok(cx.finish(kb, row_launch(rows, threads)))
}

/// Refuses any of `dtypes` that is not f32 or a 16-bit float (loaded
/// widened to f32, stored rounded): the kernels compute in f32.
fn f32_compute(cx: &Cx, dtypes: &[DType]) -> Result<(), CudaError> {
    match dtypes
        .iter()
        .find(|d| !matches!(d, DType::F32 | DType::F16 | DType::BF16))
    {
        Some(&d) => Err(cx.dtype_err(d)),
        None => Ok(()),
    }
}

/// The type a softmax row is computed in: f64 for f64 tensors (with the
/// software `exp`), else f32 (f16 and bf16 widened).
fn softmax_compute(cx: &Cx, dtype: DType, out_dtype: DType) -> Result<Ty, CudaError> {
    if dtype == DType::F64 && out_dtype == DType::F64 {
        return Ok(Ty::F64);
    }
    f32_compute(cx, &[dtype, out_dtype])?;
    Ok(Ty::F32)
}

/// Softmax along `axis`: one block per row of `shape[axis]` elements
/// (stride = the product of the later dims).
pub(crate) fn softmax(cx: &Cx, axis: usize) -> Result<Kernel, CudaError> {
    let (loc, ty) = cx.inputs[0];
    let (dtype, out_dtype) = (ty.dtype, cx.out_ty.dtype);
    let t = softmax_compute(cx, dtype, out_dtype)?;
    let shape = &ty.shape;
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let rows = ty.num_elements() / len.max(1);
    let threads = block_threads(len);
    let mut kb = cx.builder([threads, 1, 1]);
    let row = kb.special(Special::CtaidX);
    // Row r = (outer, i) starts at outer * len * inner + i.
    let within = kb.bin(Bin::Rem, row, inner as u32);
    let outer = kb.bin(Bin::Div, row, inner as u32);
    let row_base = kb.mad(outer, (len * inner) as u32, within);
    let base = ptr(&mut kb, loc);
    let out = ptr(&mut kb, cx.out);
    let index = move |kb: &mut KernelBuilder, j: Reg| kb.mad(j, inner as u32, row_base);
    let element = move |kb: &mut KernelBuilder, j: Reg| {
        let idx = index(kb, j);
        load(kb, base, idx, dtype)
    };
    let id = |_: &mut KernelBuilder, x: Reg| x;
    let m = fold_row(
        &mut kb,
        threads,
        len,
        t,
        Combine::Max { nan: true },
        &element,
        &id,
    );
    let exp_shifted = move |kb: &mut KernelBuilder, x: Reg| {
        let y = kb.bin(Bin::Sub, x, m);
        math::exp(kb, y)
    };
    let s = fold_row(
        &mut kb,
        threads,
        len,
        t,
        Combine::Add,
        &element,
        &exp_shifted,
    );
    let tid = kb.special(Special::TidX);
    kb.for_range(tid, len as u32, threads, |kb, j| {
        let x = element(kb, j);
        let e = exp_shifted(kb, x);
        let y = kb.bin(Bin::Div, e, s);
        let y = cx.epilogue(kb, y);
        let idx = index(kb, j);
        store(kb, out, idx, out_dtype, y);
    });
    Ok(cx.finish(kb, row_launch(rows, threads)))
}

/// Layer normalization, one block per normalized group (the axes from
/// `axis` on, contiguous): a sum for the mean, a sum of squared deviations
/// for the (biased) variance, then `(x - mean) / sqrt(var + eps) * scale
/// + bias` written with scale and bias read at their broadcast positions.
pub(crate) fn layer_norm(cx: &Cx, axis: usize, epsilon: f32) -> Result<Kernel, CudaError> {
    let (loc, ty) = cx.inputs[0];
    let (dtype, out_dtype) = (ty.dtype, cx.out_ty.dtype);
    let dtypes: Vec<DType> = cx.inputs.iter().map(|(_, t)| t.dtype).collect();
    f32_compute(cx, &dtypes)?;
    f32_compute(cx, &[out_dtype])?;
    let shape = &ty.shape;
    let normalized = &shape[axis..];
    let len: usize = normalized.iter().product();
    let rows = ty.num_elements() / len.max(1);
    let threads = block_threads(len);
    let mut kb = cx.builder([threads, 1, 1]);
    let row = kb.special(Special::CtaidX);
    let row_base = kb.bin(Bin::Mul, row, len as u32);
    let base = ptr(&mut kb, loc);
    let out = ptr(&mut kb, cx.out);
    let element = move |kb: &mut KernelBuilder, j: Reg| {
        let idx = kb.bin(Bin::Add, row_base, j);
        load(kb, base, idx, dtype)
    };
    let id = |_: &mut KernelBuilder, x: Reg| x;
    let t = Ty::F32;
    let sum = fold_row(&mut kb, threads, len, t, Combine::Add, &element, &id);
    let mean = kb.bin(Bin::Mul, sum, Opnd::F32(1.0 / len as f32));
    let squared = move |kb: &mut KernelBuilder, x: Reg| {
        let d = kb.bin(Bin::Sub, x, mean);
        kb.bin(Bin::Mul, d, d)
    };
    let ss = fold_row(&mut kb, threads, len, t, Combine::Add, &element, &squared);
    let var = kb.mad(ss, Opnd::F32(1.0 / len as f32), Opnd::F32(epsilon));
    let sd = kb.un("sqrt.rn", var);
    let inv = kb.un("rcp.rn", sd);
    let params: Vec<(Reg, Vec<i64>, bool, DType)> = cx.inputs[1..]
        .iter()
        .map(|&(ploc, pty)| {
            let p = ptr(&mut kb, ploc);
            let dense = pty.num_elements() == len;
            let st = super::broadcast_strides(&pty.shape, normalized);
            (p, st, dense, pty.dtype)
        })
        .collect();
    let tid = kb.special(Special::TidX);
    kb.for_range(tid, len as u32, threads, |kb, j| {
        let x = element(kb, j);
        let d = kb.bin(Bin::Sub, x, mean);
        let mut y = kb.bin(Bin::Mul, d, inv);
        let cs = if params.iter().all(|p| p.2) {
            Vec::new()
        } else {
            coords(kb, j, normalized)
        };
        for (k, (p, st, dense, d)) in params.iter().enumerate() {
            let at = if *dense { j } else { offset(kb, &cs, st, 0) };
            let v = load(kb, *p, at, *d);
            y = if k == 0 {
                kb.bin(Bin::Mul, y, v)
            } else {
                kb.bin(Bin::Add, y, v)
            };
        }
        let y = cx.epilogue(kb, y);
        let idx = kb.bin(Bin::Add, row_base, j);
        store(kb, out, idx, out_dtype, y);
    });
    Ok(cx.finish(kb, row_launch(rows, threads)))
}
