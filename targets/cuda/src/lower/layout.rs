//! Layout kernels: copy (output copies and Reshapes that cannot alias),
//! Transpose, Slice, Concat and Gather.
//!
//! One thread per output element: the thread computes the source element
//! from its output coordinates (shapes and strides are immediates) and
//! copies it. Gather reads its index, wraps negative indices once and, for
//! an index still out of range, sets the arena's status word (the runtime
//! turns it into an error) and writes nothing.

use kiln_ir::SliceAxis;

use super::{coords, global_index, linear_launch, load, offset, ptr, store, strides, Cx, Kernel};
use crate::ptx::{Bin, Cmp, KernelBuilder, MemTy, Opnd, Reg, Space, Ty};
use crate::CudaError;

/// A kernel copying `src(i)` of input 0 to output element `i`.
fn gather_elements(
    cx: &Cx,
    src: impl FnOnce(&mut KernelBuilder, Reg) -> Reg,
) -> Result<Kernel, CudaError> {
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let j = src(&mut kb, i);
    let (loc, ty) = cx.inputs[0];
    let base = ptr(&mut kb, loc);
    let v = load(&mut kb, base, j, ty.dtype);
    let v = cx.epilogue(&mut kb, v);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, cx.out_ty.dtype, v);
    Ok(cx.finish(kb, linear_launch(n)))
}

/// Element-for-element copy (same element count and type).
pub(crate) fn copy(cx: &Cx) -> Result<Kernel, CudaError> {
    gather_elements(cx, |_, i| i)
}

/// Element-for-element copy of the bits into another type of the same
/// size (`bitcast`): loaded and stored as the input type.
pub(crate) fn copy_bits(cx: &Cx) -> Result<Kernel, CudaError> {
    let n = cx.out_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let (loc, ty) = cx.inputs[0];
    let base = ptr(&mut kb, loc);
    let v = load(&mut kb, base, i, ty.dtype);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, ty.dtype, v);
    Ok(cx.finish(kb, linear_launch(n)))
}

pub(crate) fn transpose(cx: &Cx, perm: &[usize]) -> Result<Kernel, CudaError> {
    let in_strides = strides(&cx.inputs[0].1.shape);
    let st: Vec<i64> = perm.iter().map(|&p| in_strides[p]).collect();
    let shape = cx.out_ty.shape.clone();
    gather_elements(cx, move |kb, i| {
        let c = coords(kb, i, &shape);
        offset(kb, &c, &st, 0)
    })
}

pub(crate) fn slice(cx: &Cx, axes: &[SliceAxis]) -> Result<Kernel, CudaError> {
    let in_strides = strides(&cx.inputs[0].1.shape);
    let base: i64 = axes
        .iter()
        .zip(&in_strides)
        .map(|(a, &s)| a.start as i64 * s)
        .sum();
    let st: Vec<i64> = axes
        .iter()
        .zip(&in_strides)
        .map(|(a, &s)| a.step * s)
        .collect();
    let shape = cx.out_ty.shape.clone();
    gather_elements(cx, move |kb, i| {
        let c = coords(kb, i, &shape);
        offset(kb, &c, &st, base)
    })
}

/// Splits output index `i` along `axis` into (outer, coordinate, inner).
fn split(kb: &mut KernelBuilder, i: Reg, shape: &[usize], axis: usize) -> (Reg, Reg, Reg) {
    let inner: usize = shape[axis + 1..].iter().product();
    let len = shape[axis];
    let r = kb.bin(Bin::Rem, i, inner as u32);
    let q = kb.bin(Bin::Div, i, inner as u32);
    let c = kb.bin(Bin::Rem, q, len as u32);
    let outer = kb.bin(Bin::Div, q, len as u32);
    (outer, c, r)
}

pub(crate) fn concat(cx: &Cx, axis: usize) -> Result<Kernel, CudaError> {
    let n = cx.out_ty.num_elements();
    let shape = cx.out_ty.shape.clone();
    let inner: usize = shape[axis + 1..].iter().product();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    let (outer, c, r) = split(&mut kb, i, &shape, axis);
    let out = ptr(&mut kb, cx.out);
    let done = kb.label();
    let mut start = 0usize;
    for &(loc, ty) in &cx.inputs {
        let len = ty.shape[axis];
        if len == 0 {
            continue;
        }
        let end = start + len;
        let next = kb.label();
        let past = kb.setp(Cmp::Ge, c, end as u32);
        kb.bra_if(past, false, next);
        // Element (outer, c - start, r) of this input.
        let local = kb.bin(Bin::Sub, c, start as u32);
        let row = kb.mad(outer, len as u32, local);
        let j = kb.mad(row, inner as u32, r);
        let base = ptr(&mut kb, loc);
        let v = load(&mut kb, base, j, ty.dtype);
        let v = cx.epilogue(&mut kb, v);
        store(&mut kb, out, i, cx.out_ty.dtype, v);
        kb.bra(done);
        kb.place(next);
        start = end;
    }
    kb.place(done);
    Ok(cx.finish(kb, linear_launch(n)))
}

pub(crate) fn gather(cx: &Cx, axis: usize) -> Result<Kernel, CudaError> {
    let (data_loc, data_ty) = cx.inputs[0];
    let (idx_loc, idx_ty) = cx.inputs[1];
    if !matches!(idx_ty.dtype, kiln_ir::DType::I32 | kiln_ir::DType::I64) {
        return Err(cx.dtype_err(idx_ty.dtype));
    }
    let n = cx.out_ty.num_elements();
    let dim = data_ty.shape[axis];
    let inner: usize = data_ty.shape[axis + 1..].iter().product();
    let count = idx_ty.num_elements();
    let mut kb = cx.builder([super::BLOCK, 1, 1]);
    let i = global_index(&mut kb, n);
    // Output index = (outer, index position, inner).
    let r = kb.bin(Bin::Rem, i, inner as u32);
    let q = kb.bin(Bin::Div, i, inner as u32);
    let pos = kb.bin(Bin::Rem, q, count as u32);
    let outer = kb.bin(Bin::Div, q, count as u32);
    let ib = ptr(&mut kb, idx_loc);
    let raw = load(&mut kb, ib, pos, idx_ty.dtype);
    let neg = kb.setp(Cmp::Lt, raw, Opnd::I(0));
    let wrapped = kb.bin(Bin::Add, raw, Opnd::I(dim as i64));
    let k = kb.selp(Ty::S64, neg, wrapped, raw);
    let below = kb.setp(Cmp::Lt, k, Opnd::I(0));
    let above = kb.setp(Cmp::Ge, k, Opnd::I(dim as i64));
    let bad = kb.pred_op("or", below, above);
    let ok = kb.label();
    kb.bra_if(bad, true, ok);
    let arena = kb.arena();
    kb.st(Space::Global, MemTy("u32"), arena, 0, Opnd::I(1));
    kb.inst("ret", &[]);
    kb.place(ok);
    let k32 = kb.cvt(Ty::U32, "", k);
    let row = kb.mad(outer, dim as u32, k32);
    let j = kb.mad(row, inner as u32, r);
    let db = ptr(&mut kb, data_loc);
    let v = load(&mut kb, db, j, data_ty.dtype);
    let v = cx.epilogue(&mut kb, v);
    let out = ptr(&mut kb, cx.out);
    store(&mut kb, out, i, cx.out_ty.dtype, v);
    Ok(cx.finish(kb, linear_launch(n)))
}
