//! Softmax along any axis: max, `exp(x - max)` with its sum, then division.
//!
//! On AVX-512 and AVX2 targets a softmax over the innermost axis is the
//! [`microkernel::softmax`](crate::microkernel::softmax) kernel, split by
//! rows over threads like the GEMMs; everything else is the Cranelift
//! kernel below.
//!
//! When the axis is innermost each row is contiguous and every pass runs on
//! `f32x4` with a scalar tail (f64 rows: scalar). Otherwise neighbouring
//! positions of the inner dims form the vector lanes (four f32 or two f64)
//! and the passes walk the axis with the axis stride (scalar for the
//! positions left over).

use cranelift_codegen::ir::types::{F32, F32X4, F64};
use cranelift_codegen::ir::{InstBuilder, Type, Value};

use kiln_ir::{DType, Op};

use super::dense::Machine;
use super::loops::{for_range, for_range_carry};
use super::pool::reduce;
use super::{math, Kb, NodeCx};
use crate::microkernel::softmax::SoftmaxSpec;
use crate::CpuError;

/// The microkernel of softmax node `cx` as up to `machine.tasks` tasks,
/// or `None` when it does not apply (not f32, the axis not innermost).
pub(crate) fn lower_microkernel(
    cx: &NodeCx,
    Machine { vector, tasks }: Machine,
) -> Option<Vec<Result<Vec<u8>, crate::microkernel::MicrokernelError>>> {
    let Op::Softmax { axis } = cx.node.op else {
        return None;
    };
    let shape = &cx.node.ty.shape;
    if cx.inputs[0].1.dtype != DType::F32 || axis + 1 != shape.len() {
        return None;
    }
    let len = shape[axis];
    let rows: usize = shape[..axis].iter().product();
    // About twenty operations an element; a task is worth its wake-up
    // from MIN_TASK_FLOPS on, as for the GEMMs.
    let work = rows * len * 20;
    let tasks = tasks.min(work / super::partition::MIN_TASK_FLOPS).max(1);
    let spec = SoftmaxSpec {
        rows,
        len,
        x: cx.inputs[0].0,
        y: cx.out,
        vector,
    };
    Some(
        spec.split(tasks)
            .iter()
            .map(|part| part.assemble())
            .collect(),
    )
}

/// Softmax on f32 or f64.
pub(crate) fn softmax(kb: &mut Kb, cx: &NodeCx, axis: usize) -> Result<(), CpuError> {
    let elem = match cx.float_input(0, true)? {
        DType::F64 => F64,
        _ => F32,
    };
    let e = elem.bytes() as usize;
    let lanes = 16 / e;
    let vector = elem.by(lanes as u32).expect("a 128-bit vector");
    let shape = &cx.node.ty.shape;
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    if outer * len * inner == 0 {
        return Ok(());
    }
    let x = kb.ptr(cx.inputs[0].0);
    let y = kb.ptr(cx.out);
    let block = (len * inner * e) as i64;
    for_range(kb, 0, outer as i64, 1, &mut |kb, o| {
        let xo = kb.add_scaled(x, o, block);
        let yo = kb.add_scaled(y, o, block);
        if inner == 1 && elem == F32 {
            row(kb, xo, yo, len);
        } else {
            let stride = (inner * e) as i64;
            let nv = inner / lanes;
            for_range(kb, 0, (nv * 16) as i64, 16, &mut |kb, off| {
                let px = kb.b.ins().iadd(xo, off);
                let py = kb.b.ins().iadd(yo, off);
                column(kb, px, py, len, stride, vector);
            });
            for c in nv * lanes..inner {
                let px = kb.add_off(xo, (c * e) as i64);
                let py = kb.add_off(yo, (c * e) as i64);
                column(kb, px, py, len, stride, elem);
            }
        }
    });
    Ok(())
}

/// Softmax of `len` contiguous values (`px == py` works in place).
pub(crate) fn row(kb: &mut Kb, px: Value, py: Value, len: usize) {
    let m = reduce(kb, px, len, true);
    let nv = len / 4;
    let mut sum = kb.fconst(F32, 0.0);
    if nv > 0 {
        let mv = kb.b.ins().splat(F32X4, m);
        let z = kb.fconst(F32X4, 0.0);
        let s = exp_shifted_sum(kb, F32X4, px, py, mv, z, (nv * 16) as i64, 16);
        for lane in 0..4u8 {
            let l = kb.b.ins().extractlane(s, lane);
            sum = kb.b.ins().fadd(sum, l);
        }
    }
    for t in nv * 4..len {
        let v = kb.load(F32, px, (t * 4) as i64);
        let d = kb.b.ins().fsub(v, m);
        let e = math::exp_or_zero(kb, d);
        kb.store(e, py, (t * 4) as i64);
        sum = kb.b.ins().fadd(sum, e);
    }
    if nv > 0 {
        let sv = kb.b.ins().splat(F32X4, sum);
        for_range(kb, 0, (nv * 16) as i64, 16, &mut |kb, off| {
            let b = kb.b.ins().iadd(py, off);
            let v = kb.load(F32X4, b, 0);
            let q = kb.b.ins().fdiv(v, sv);
            kb.store(q, b, 0);
        });
    }
    for t in nv * 4..len {
        let v = kb.load(F32, py, (t * 4) as i64);
        let q = kb.b.ins().fdiv(v, sum);
        kb.store(q, py, (t * 4) as i64);
    }
}

/// Softmax of `len` values `stride` bytes apart, on `ty` lanes at once.
fn column(kb: &mut Kb, px: Value, py: Value, len: usize, stride: i64, ty: Type) {
    let n = len as i64 * stride;
    let init = kb.fconst(ty, f64::NEG_INFINITY);
    let m = for_range_carry(kb, 0, n, stride, &[init], &mut |kb, off, c| {
        let a = kb.b.ins().iadd(px, off);
        let v = kb.load(ty, a, 0);
        vec![kb.b.ins().fmax(c[0], v)]
    })[0];
    let z = kb.fconst(ty, 0.0);
    let s = exp_shifted_sum(kb, ty, px, py, m, z, n, stride);
    for_range(kb, 0, n, stride, &mut |kb, off| {
        let b = kb.b.ins().iadd(py, off);
        let v = kb.load(ty, b, 0);
        let q = kb.b.ins().fdiv(v, s);
        kb.store(q, b, 0);
    });
}

/// Writes `exp(x - shift)` to `py` for the `ty`-sized elements at byte
/// offsets `0, step, .. < end` of `px`, and returns their sum added to
/// `init` (per lane for vector types): the middle pass of both softmax
/// layouts.
#[allow(clippy::too_many_arguments)]
fn exp_shifted_sum(
    kb: &mut Kb,
    ty: Type,
    px: Value,
    py: Value,
    shift: Value,
    init: Value,
    end: i64,
    step: i64,
) -> Value {
    for_range_carry(kb, 0, end, step, &[init], &mut |kb, off, c| {
        let a = kb.b.ins().iadd(px, off);
        let v = kb.load(ty, a, 0);
        let d = kb.b.ins().fsub(v, shift);
        let e = math::exp_or_zero(kb, d);
        let b = kb.b.ins().iadd(py, off);
        kb.store(e, b, 0);
        vec![kb.b.ins().fadd(c[0], e)]
    })[0]
}
