//! Data movement: reshape copies, transpose, concat, slice, gather. These
//! work on any element type by element size. Also NonZero, which lists
//! where the elements are.

use std::ops::Range;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, I16, I32, I64, I8, I8X16};
use cranelift_codegen::ir::{InstBuilder, Type, Value};
use kiln_format::HostFn;
use kiln_ir::{DType, Ints, SliceAxis};

use super::loops::{collapse, for_range, for_range_carry, nest};
use super::{scalar_type, strides, Kb, NodeCx};
use crate::CpuError;

fn int_type(esize: usize) -> Type {
    match esize {
        1 => I8,
        2 => I16,
        4 => I32,
        _ => I64,
    }
}

/// Copies `n` bytes from `src` to `dst` (non-overlapping): 64-byte loop,
/// then 16-byte chunks, then 8/4/2/1-byte pieces.
pub(crate) fn copy_bytes(kb: &mut Kb, dst: Value, src: Value, n: u64) {
    let n = n as i64;
    let big = n / 64 * 64;
    for_range(kb, 0, big, 64, &mut |kb, off| {
        let s = kb.b.ins().iadd(src, off);
        let d = kb.b.ins().iadd(dst, off);
        let v: Vec<Value> = (0..4).map(|k| kb.load(I8X16, s, 16 * k)).collect();
        for (k, v) in v.into_iter().enumerate() {
            kb.store(v, d, 16 * k as i64);
        }
    });
    let mut at = big;
    for (width, ty) in [(16, I8X16), (8, I64), (4, I32), (2, I16), (1, I8)] {
        while n - at >= width {
            let v = kb.load(ty, src, at);
            kb.store(v, dst, at);
            at += width;
        }
    }
}

/// Copies elements of size `esize` over the index space `shape`, reading
/// `src + sum(i_d * src_st[d])` and writing `dst + sum(i_d * dst_st[d])`
/// (strides in bytes, may be negative).
pub(crate) fn copy_strided(
    kb: &mut Kb,
    shape: &[usize],
    dst: Value,
    dst_st: Vec<i64>,
    src: Value,
    src_st: Vec<i64>,
    esize: usize,
) {
    if shape.iter().product::<usize>() == 0 {
        return;
    }
    let (mut dims, mut st) = collapse(shape, &[dst_st, src_st]);
    if dims.is_empty() {
        dims.push(1);
        for s in st.iter_mut() {
            s.push(0);
        }
    }
    let e = esize as i64;
    let n = *dims.last().expect("non-empty");
    let (ds, ss) = (st[0][dims.len() - 1], st[1][dims.len() - 1]);
    if let Some(q) = blocked_axis(&dims, &st, esize) {
        return copy_transposed(kb, &dims, &st, dst, src, q, 0..dims[q]);
    }
    let outer = dims[..dims.len() - 1].to_vec();
    let outer_st: Vec<Vec<i64>> = st.iter().map(|s| s[..s.len() - 1].to_vec()).collect();
    let ty = int_type(esize);
    nest(kb, &outer, &[dst, src], &outer_st, &mut |kb, p| {
        if ds == e && ss == e {
            copy_bytes(kb, p[0], p[1], (n * esize) as u64);
        } else {
            for_range(kb, 0, n as i64, 1, &mut |kb, i| {
                let s = kb.add_scaled(p[1], i, ss);
                let v = kb.load(ty, s, 0);
                let d = kb.add_scaled(p[0], i, ds);
                kb.store(v, d, 0);
            });
        }
    });
}

/// [`copy_strided`] of 4-byte elements (`dims`, byte strides `st`:
/// destination then source, collapsed) where the destination is
/// contiguous along the last dim and the source along dim `q`: blocks of
/// 4 × 4, each four vector loads along `q`, a transpose by shuffles and
/// four vector stores along the last dim, instead of a scalar load and
/// store per element (1.3–5× faster, see `docs/performance.md`). The
/// tails are scalar.
fn copy_transposed(
    kb: &mut Kb,
    dims: &[usize],
    st: &[Vec<i64>],
    dst: Value,
    src: Value,
    q: usize,
    along_q: Range<usize>,
) {
    let last = dims.len() - 1;
    let n = dims[last] as i64;
    // Destination bytes per step along q, source bytes per step along the
    // last dim (the other two strides are 4).
    let (dq, sl) = (st[0][q], st[1][last]);
    let keep = |d: &usize| *d != q && *d != last;
    let outer: Vec<usize> = (0..dims.len()).filter(keep).map(|d| dims[d]).collect();
    let outer_st: Vec<Vec<i64>> = (st.iter())
        .map(|s| (0..dims.len()).filter(keep).map(|d| s[d]).collect())
        .collect();
    let masks = [
        kb.f32_lanes([0, 4, 1, 5]),
        kb.f32_lanes([2, 6, 3, 7]),
        kb.f32_lanes([0, 1, 4, 5]),
        kb.f32_lanes([2, 3, 6, 7]),
    ];
    // One 4 × 4 block: v[l][m] = x[i + m, j + l] read along q, stored
    // transposed as w[m][l] along the last dim.
    let block = |kb: &mut Kb, s: Value, d: Value| {
        let v: Vec<Value> = (0..4).map(|l| kb.load(I8X16, s, l * sl)).collect();
        let t = [
            kb.b.ins().shuffle(v[0], v[1], masks[0]),
            kb.b.ins().shuffle(v[2], v[3], masks[0]),
            kb.b.ins().shuffle(v[0], v[1], masks[1]),
            kb.b.ins().shuffle(v[2], v[3], masks[1]),
        ];
        let w = [
            kb.b.ins().shuffle(t[0], t[1], masks[2]),
            kb.b.ins().shuffle(t[0], t[1], masks[3]),
            kb.b.ins().shuffle(t[2], t[3], masks[2]),
            kb.b.ins().shuffle(t[2], t[3], masks[3]),
        ];
        for (m, w) in w.into_iter().enumerate() {
            kb.store(w, d, m as i64 * dq);
        }
    };
    let scalar = |kb: &mut Kb, d: Value, s: Value| {
        let v = kb.load(I32, s, 0);
        kb.store(v, d, 0);
    };
    // `rows` (4 or 8) positions along q from `i`: the blocks along the
    // last dim, then its tail element by element. Eight rows at a time read
    // half of each source row's cache line per step and fill the eight
    // destination lines over four steps (a 1024 × 1024 transpose 1.06 ms
    // with sixteen, 0.79 ms with eight, 1.34 ms with four; `docs/performance.md`).
    let rows = |kb: &mut Kb, p: &[Value], i: Value, rows: i64| {
        let d_rows = kb.add_scaled(p[0], i, dq);
        let s_cols = kb.add_scaled(p[1], i, 4);
        for_range(kb, 0, n / 4 * 4, 4, &mut |kb, j| {
            let s = kb.add_scaled(s_cols, j, sl);
            let d = kb.add_scaled(d_rows, j, 4);
            for b in 0..rows / 4 {
                let (s, d) = (kb.add_off(s, 16 * b), kb.add_off(d, 4 * b * dq));
                block(kb, s, d);
            }
        });
        for_range(kb, n / 4 * 4, n, 1, &mut |kb, j| {
            let s = kb.add_scaled(s_cols, j, sl);
            let d = kb.add_scaled(d_rows, j, 4);
            for m in 0..rows {
                let (d, s) = (kb.add_off(d, m * dq), kb.add_off(s, m * 4));
                scalar(kb, d, s);
            }
        });
    };
    let (q0, nq) = (along_q.start as i64, along_q.end as i64);
    let nq8 = q0 + (nq - q0) / 8 * 8;
    let nq4 = q0 + (nq - q0) / 4 * 4;
    nest(kb, &outer, &[dst, src], &outer_st, &mut |kb, p| {
        for_range(kb, q0, nq8, 8, &mut |kb, i| rows(kb, p, i, 8));
        for_range(kb, nq8, nq4, 4, &mut |kb, i| rows(kb, p, i, 4));
        for_range(kb, nq4, nq, 1, &mut |kb, i| {
            let d_row = kb.add_scaled(p[0], i, dq);
            let s_col = kb.add_scaled(p[1], i, 4);
            for_range(kb, 0, n, 1, &mut |kb, j| {
                let s = kb.add_scaled(s_col, j, sl);
                let d = kb.add_scaled(d_row, j, 4);
                scalar(kb, d, s);
            });
        });
    });
}

/// The dim of a collapsed copy (`dims`, byte strides `st`: destination
/// then source) along which [`copy_transposed`] reads the source: the
/// destination contiguous along the last dim and the source along this
/// one, 4-byte elements, both at least 4 long. `None`: a plain
/// [`copy_strided`].
fn blocked_axis(dims: &[usize], st: &[Vec<i64>], esize: usize) -> Option<usize> {
    let last = dims.len().checked_sub(1)?;
    let e = esize as i64;
    if esize != 4 || st[0][last] != e || dims[last] < 4 {
        return None;
    }
    (0..last).find(|&d| st[1][d] == e && st[0][d] != e && dims[d] >= 4)
}

/// A transpose's index space, collapsed: dims and byte strides
/// (destination, then source).
fn transpose_space(cx: &NodeCx, perm: &Ints) -> (Vec<usize>, Vec<Vec<i64>>) {
    let e = esize_of(cx);
    let in_st = bytes_strides(&cx.inputs[0].1.shape, e);
    let src_st: Vec<i64> = perm.iter().map(|&p| in_st[p]).collect();
    let shape = &cx.node.ty.shape;
    collapse(shape, &[bytes_strides(shape, e), src_st])
}

/// A transpose that takes [`copy_transposed`]'s path as `parts` ranges of
/// its source-contiguous dim (in multiples of eight), for tasks that write
/// disjoint rows of the output; `None` when it does not take that path or
/// that dim is too short for `parts`.
pub(crate) fn transpose_parts(cx: &NodeCx, perm: &Ints, parts: usize) -> Option<Vec<Range<usize>>> {
    let (dims, st) = transpose_space(cx, perm);
    let q = blocked_axis(&dims, &st, esize_of(cx))?;
    let eights = dims[q] / 8;
    if eights < parts {
        return None;
    }
    let bound = |t: usize| {
        if t == parts {
            dims[q]
        } else {
            eights * t / parts * 8
        }
    };
    Some((0..parts).map(|t| bound(t)..bound(t + 1)).collect())
}

/// The rows `along` (of [`transpose_parts`]) of a transpose.
pub(crate) fn transpose_part(kb: &mut Kb, cx: &NodeCx, perm: &Ints, along: Range<usize>) {
    let (dims, st) = transpose_space(cx, perm);
    let q = blocked_axis(&dims, &st, esize_of(cx)).expect("transpose_parts chose the path");
    let (src, dst) = (kb.ptr(cx.inputs[0].0), kb.ptr(cx.out));
    copy_transposed(kb, &dims, &st, dst, src, q, along);
}

fn esize_of(cx: &NodeCx) -> usize {
    cx.node.ty.dtype.size_bytes()
}

fn bytes_strides(shape: &[usize], e: usize) -> Vec<i64> {
    strides(shape).into_iter().map(|s| s * e as i64).collect()
}

/// Reshape into its own region: a plain copy.
pub(crate) fn reshape(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let src = kb.ptr(cx.inputs[0].0);
    let dst = kb.ptr(cx.out);
    copy_bytes(kb, dst, src, cx.node.ty.size_bytes() as u64);
    Ok(())
}

/// Axis permutation.
pub(crate) fn transpose(kb: &mut Kb, cx: &NodeCx, perm: &Ints) -> Result<(), CpuError> {
    let (dims, st) = transpose_space(cx, perm);
    let src = kb.ptr(cx.inputs[0].0);
    let dst = kb.ptr(cx.out);
    copy_strided(
        kb,
        &dims,
        dst,
        st[0].clone(),
        src,
        st[1].clone(),
        esize_of(cx),
    );
    Ok(())
}

/// Strided slice (steps may be negative).
pub(crate) fn slice(kb: &mut Kb, cx: &NodeCx, axes: &[SliceAxis]) -> Result<(), CpuError> {
    let e = esize_of(cx);
    let in_st = bytes_strides(&cx.inputs[0].1.shape, e);
    let start: i64 = axes
        .iter()
        .zip(&in_st)
        .map(|(a, s)| a.start as i64 * s)
        .sum();
    let src_st: Vec<i64> = (axes.iter().zip(&in_st))
        .map(|(a, s)| {
            // Along an axis of at most one output element the step is never
            // taken, and may be anything (i64::MAX overflowed the stride);
            // with two or more, |step| < dim keeps the product in range.
            let step = if a.len <= 1 { 0 } else { a.step };
            step * s
        })
        .collect();
    let shape = cx.node.ty.shape.clone();
    let base = kb.ptr(cx.inputs[0].0);
    let src = kb.add_off(base, start);
    let dst = kb.ptr(cx.out);
    copy_strided(kb, &shape, dst, bytes_strides(&shape, e), src, src_st, e);
    Ok(())
}

/// Concatenation along `axis`.
pub(crate) fn concat(kb: &mut Kb, cx: &NodeCx, axis: usize) -> Result<(), CpuError> {
    concat_inputs(kb, cx, axis, 0..cx.inputs.len())
}

/// The part of a concatenation along `axis` that copies the inputs in
/// `range` (a task of a concatenation split over threads).
pub(crate) fn concat_inputs(
    kb: &mut Kb,
    cx: &NodeCx,
    axis: usize,
    range: std::ops::Range<usize>,
) -> Result<(), CpuError> {
    let e = esize_of(cx);
    let out_st = bytes_strides(&cx.node.ty.shape, e);
    let out = kb.ptr(cx.out);
    let mut at = 0i64;
    for (i, &(loc, ty)) in cx.inputs.iter().enumerate() {
        if !range.contains(&i) {
            at += ty.shape[axis] as i64;
            continue;
        }
        let src = kb.ptr(loc);
        let dst = kb.add_off(out, at * out_st[axis]);
        copy_strided(
            kb,
            &ty.shape,
            dst,
            out_st.clone(),
            src,
            bytes_strides(&ty.shape, e),
            e,
        );
        at += ty.shape[axis] as i64;
    }
    Ok(())
}

/// Gather along `axis`; an index outside `[-dim, dim)` makes the kernel
/// return 1.
/// `NonZero`: the coordinates of the non-zero elements, one column each in
/// row-major order, then zero columns (`kiln_ir::Op::NonZero`). Every
/// element writes its coordinates times its flag (1: non-zero) to the next
/// free column, which only a hit moves on: a zero element writes zeros that
/// the next hit overwrites or that stay as the padding. No branch.
pub(crate) fn non_zero(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let (xloc, xty) = cx.inputs[0];
    let n = xty.num_elements() as i64;
    let ty = scalar_type(xty.dtype).ok_or_else(|| cx.dtype_err(xty.dtype))?;
    if n == 0 {
        return Ok(());
    }
    let (x, out) = (kb.ptr(xloc), kb.ptr(cx.out));
    let shape = &xty.shape;
    let zero = kb.iconst(0);
    for_range(kb, 0, shape.len() as i64 * n, 1, &mut |kb, i| {
        let p = kb.add_scaled(out, i, 8);
        kb.store(zero, p, 0);
    });
    let element_strides = strides(shape);
    let esize = xty.dtype.size_bytes() as i64;
    for_range_carry(kb, 0, n, 1, &[zero], &mut |kb, i, carried| {
        let p = kb.add_scaled(x, i, esize);
        let v = kb.load(ty, p, 0);
        let hit = if ty.is_float() {
            let z = kb.fconst(ty, 0.0);
            kb.b.ins().fcmp(FloatCC::NotEqual, v, z)
        } else {
            kb.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0)
        };
        let flag = kb.b.ins().uextend(I64, hit);
        let column = kb.add_scaled(out, carried[0], 8);
        for (axis, (&dim, &stride)) in shape.iter().zip(&element_strides).enumerate() {
            let mut coord = match stride {
                1 => i,
                s => kb.b.ins().udiv_imm_u(i, s),
            };
            if axis > 0 {
                coord = kb.b.ins().urem_imm_u(coord, dim as i64);
            }
            let v = kb.b.ins().imul(coord, flag);
            kb.store(v, column, axis as i64 * n * 8);
        }
        vec![kb.b.ins().iadd(carried[0], flag)]
    });
    Ok(())
}

/// `NonMaxSuppression`: one call of the runtime's `kiln_host::Nms`
/// (`HostFn::NonMaxSuppression`; the selection is a sort, which the
/// runtime does in place) with the boxes, scores, output and a scratch of
/// candidate indices in the arena. The host writes the rows, the zero
/// rows and the count row (`kiln_ir::Op::NonMaxSuppression`).
pub(crate) fn non_max_suppression(
    kb: &mut Kb,
    cx: &NodeCx,
    scratch: &mut crate::plan::Scratch,
    n: &kiln_ir::Nms,
) -> Result<(), CpuError> {
    let (bloc, bty) = cx.inputs[0];
    let (sloc, sty) = cx.inputs[1];
    let nms = n.at([bty.shape[0], sty.shape[1], bty.shape[1]], 0, 0.0, 0.0);
    let order = scratch.reserve(&[nms.scratch_len() as u64 * 4])[0];
    // The run's cap and thresholds: scalars in the arena or the weights.
    let mut scalar = |k: usize, ty| {
        let p = kb.ptr(cx.inputs[k].0);
        kb.load(ty, p, 0)
    };
    let (max_per_class, iou, score) = (scalar(2, I64), scalar(3, F32), scalar(4, F32));
    let args = [
        kb.ptr(bloc),
        kb.ptr(sloc),
        kb.ptr(cx.out),
        kb.ptr(order),
        kb.iconst(nms.batches as i64),
        kb.iconst(nms.classes as i64),
        kb.iconst(nms.boxes as i64),
        kb.iconst(nms.cap as i64),
        kb.iconst(i64::from(nms.center_point_box)),
        kb.iconst(i64::from(n.has_score_threshold)),
        max_per_class,
        iou,
        score,
    ];
    kb.call_host_returning(HostFn::NonMaxSuppression, &args, None);
    Ok(())
}

/// `Unique`'s plan: one call of the runtime's `kiln_host::Unique`
/// (`HostFn::Unique`, an in-place sort) over the keys, with a scratch in
/// the arena (`kiln_ir::Op::Unique`).
pub(crate) fn unique(
    kb: &mut Kb,
    cx: &NodeCx,
    scratch: &mut crate::plan::Scratch,
    sorted: bool,
) -> Result<(), CpuError> {
    let (kloc, kty) = cx.inputs[0];
    let s = &kty.shape;
    let u = kiln_host::Unique {
        outer: s[0],
        n: s[1],
        inner: s[2],
        sorted,
    };
    let order = scratch.reserve(&[u.scratch_len() as u64 * 4])[0];
    let args = [
        kb.ptr(kloc),
        kb.iconst(i64::from(kty.dtype == DType::F64)),
        kb.iconst(u.outer as i64),
        kb.iconst(u.n as i64),
        kb.iconst(u.inner as i64),
        kb.iconst(i64::from(sorted)),
        kb.ptr(order),
        kb.ptr(cx.out),
    ];
    kb.call_host_returning(HostFn::Unique, &args, None);
    Ok(())
}

pub(crate) fn gather(kb: &mut Kb, cx: &NodeCx, axis: usize) -> Result<(), CpuError> {
    let e = esize_of(cx);
    let (xloc, xty) = cx.inputs[0];
    let (iloc, ity) = cx.inputs[1];
    let outer: usize = xty.shape[..axis].iter().product();
    let dim = xty.shape[axis] as i64;
    let inner = xty.shape[axis + 1..].iter().product::<usize>() * e;
    let nidx = ity.num_elements();
    if nidx == 0 || outer == 0 {
        return Ok(());
    }
    let x = kb.ptr(xloc);
    let idx = kb.ptr(iloc);
    let out = kb.ptr(cx.out);
    let isize = ity.dtype.size_bytes() as i64;
    let ity_c = if ity.dtype == DType::I32 { I32 } else { I64 };
    let fail = kb.fail_block();
    for_range(kb, 0, nidx as i64, 1, &mut |kb, t| {
        let p = kb.add_scaled(idx, t, isize);
        let raw = kb.load(ity_c, p, 0);
        let raw = if ity_c == I32 {
            kb.b.ins().sextend(I64, raw)
        } else {
            raw
        };
        let adj = kb.b.ins().iadd_imm_s(raw, dim);
        let neg = kb.b.ins().icmp_imm_s(IntCC::SignedLessThan, raw, 0);
        let v = kb.b.ins().select(neg, adj, raw);
        let oob =
            kb.b.ins()
                .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, v, dim);
        let ok = kb.b.create_block();
        kb.b.ins().brif(oob, fail, &[], ok, &[]);
        kb.b.switch_to_block(ok);
        let src = kb.add_scaled(x, v, inner as i64);
        let dst = kb.add_scaled(out, t, inner as i64);
        nest(
            kb,
            &[outer],
            &[dst, src],
            &[vec![(nidx * inner) as i64], vec![dim * inner as i64]],
            &mut |kb, p| copy_bytes(kb, p[0], p[1], inner as u64),
        );
    });
    Ok(())
}
