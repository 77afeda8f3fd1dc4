//! Reductions over a set of axes.
//!
//! The kept dims are an outer [`nest`]; for each output element the reduced
//! dims (collapsed where contiguous) are loops carrying the accumulator.
//! Floats accumulate in f64 and are rounded once, like the reference
//! evaluator; integers in i64 with wrapping arithmetic. Scalar code: the
//! reduced elements are generally strided.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::types::{F32, F64, I64};
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_format::HostFn;
use kiln_ir::{DType, ReduceOp};

use super::elementwise::{int_range, narrow, widen};
use super::loops::{collapse, for_range_carry, nest};
use super::{scalar_type, strides, Kb, NodeCx};
use crate::microkernel::reduce::{ColumnFoldSpec, Extreme, ExtremeSpec, RowFold, RowFoldSpec};
use crate::plan::Loc;
use crate::CpuError;
use std::ops::Range;

/// The AVX-512 kernels of a reduction, as tasks: a max or min of a whole
/// f32 tensor of at least 64 elements to one value, or a sum-like fold
/// ([`RowFold`]) of f32 over a block of consecutive axes: runs over
/// trailing axes ([`row_folds`]) or columns over middle ones
/// ([`column_folds`]); `None` for any other reduction.
pub(crate) fn lower_avx512(cx: &NodeCx, tasks: usize) -> Option<Vec<Assembled>> {
    let kiln_ir::Op::Reduce { op, axes, .. } = &cx.node.op else {
        return None;
    };
    let (x, ty) = cx.inputs[0];
    if ty.dtype != DType::F32 || axes.is_empty() {
        return None;
    }
    let extreme = match op {
        ReduceOp::Max => Some(Extreme::Max),
        ReduceOp::Min => Some(Extreme::Min),
        _ => None,
    };
    if let Some(extreme) = extreme {
        let len = ty.num_elements();
        let whole = axes.len() == ty.shape.len() || cx.node.ty.num_elements() == 1;
        if !whole || len < 64 {
            return None;
        }
        let spec = ExtremeSpec {
            extreme,
            len,
            x,
            y: cx.out,
        };
        return Some(vec![spec.assemble()]);
    }
    let fold = match op {
        ReduceOp::Sum => RowFold::Sum,
        ReduceOp::Mean => RowFold::Mean,
        ReduceOp::SumSquare => RowFold::SumSquare,
        ReduceOp::L1 => RowFold::L1,
        ReduceOp::L2 => RowFold::L2,
        _ => return None,
    };
    // The reduced axes longer than 1 with no kept one between them: the
    // input is `[outer, len, inner]`, the output `[outer, inner]`.
    let long = |a: usize| ty.shape[a] > 1;
    let first = axes.iter().copied().find(|&a| long(a))?;
    let last = axes.iter().copied().rev().find(|&a| long(a))?;
    if (first..last).any(|a| long(a) && !axes.contains(&a)) {
        return None;
    }
    let outer: usize = ty.shape[..first].iter().product();
    let len: usize = axes.iter().map(|&a| ty.shape[a]).product();
    let inner: usize = ty.shape[last + 1..].iter().product();
    if inner == 1 {
        return row_folds(fold, outer, len, x, cx.out, tasks);
    }
    column_folds(fold, [outer, len, inner], x, cx.out, tasks)
}

/// Fewest results per outer block of a [`ColumnFoldSpec`] kernel: one
/// vector of f64 lanes.
const COLUMN_FOLD_MIN_INNER: usize = 8;

/// `[outer, len, inner]` f32 at `x` folded over `len` into `[outer,
/// inner]` at `y` by [`ColumnFoldSpec`] kernels, split into tasks by outer
/// blocks. `None` when the inner blocks are too narrow for it.
fn column_folds(
    fold: RowFold,
    [outer, len, inner]: [usize; 3],
    x: Loc,
    y: Loc,
    tasks: usize,
) -> Option<Vec<Assembled>> {
    if inner < COLUMN_FOLD_MIN_INNER || outer == 0 {
        return None;
    }
    let task = |part: Range<usize>| {
        ColumnFoldSpec {
            fold,
            outer: part.len(),
            len,
            inner,
            x: x.moved((part.start * len * inner * 4) as i64),
            y: y.moved((part.start * inner * 4) as i64),
        }
        .assemble()
    };
    Some(by_bytes(outer, len * inner * 4, tasks).map(task).collect())
}

/// `GlobalAveragePool` of f32 as [`RowFold::Mean`] over each `(n, c)`
/// plane; `None` for another op or type.
pub(crate) fn global_average_avx512(cx: &NodeCx, tasks: usize) -> Option<Vec<Assembled>> {
    let (x, ty) = cx.inputs[0];
    if !matches!(cx.node.op, kiln_ir::Op::GlobalAveragePool) || ty.dtype != DType::F32 {
        return None;
    }
    let len: usize = ty.shape[2..].iter().product();
    row_folds(
        RowFold::Mean,
        ty.shape[0] * ty.shape[1],
        len,
        x,
        cx.out,
        tasks,
    )
}

/// Fewest elements per run worth the row-fold kernel: shorter runs spend
/// their time on the per-run finish, which the Cranelift loop does as well.
const ROW_FOLD_MIN_LEN: usize = 16;

/// `rows` runs of `len` f32 at `x` folded to `rows` f32 at `y` by
/// [`RowFoldSpec`] kernels: the runs split into tasks by the bytes they
/// read ([`partition::tasks_worth`](super::partition::tasks_worth)).
/// `None` when the runs are too short for it.
fn row_folds(
    fold: RowFold,
    rows: usize,
    len: usize,
    x: Loc,
    y: Loc,
    tasks: usize,
) -> Option<Vec<Assembled>> {
    if rows == 0 || len < ROW_FOLD_MIN_LEN {
        return None;
    }
    let task = |part: Range<usize>| {
        RowFoldSpec {
            fold,
            rows: part.len(),
            len,
            x: x.moved((part.start * len * 4) as i64),
            y: y.moved((part.start * 4) as i64),
        }
        .assemble()
    };
    Some(by_bytes(rows, len * 4, tasks).map(task).collect())
}

/// `0..items` split into the tasks that items of `item_bytes` read are
/// worth ([`partition::tasks_worth`](super::partition::tasks_worth)).
pub(crate) fn by_bytes(
    items: usize,
    item_bytes: usize,
    tasks: usize,
) -> impl Iterator<Item = Range<usize>> {
    let parts = super::partition::tasks_worth(tasks, 0, items * item_bytes);
    super::partition::even_ranges(items, parts).into_iter()
}

/// A task's code, or why the microkernel could not make it.
pub(crate) type Assembled = Result<Vec<u8>, crate::microkernel::MicrokernelError>;

/// Folds `step` over every element of the reduced index space at `ptr`.
fn fold(
    kb: &mut Kb,
    dims: &[usize],
    st: &[i64],
    ptr: Value,
    init: Value,
    step: &dyn Fn(&mut Kb, Value, Value) -> Value,
) -> Value {
    match dims.split_first() {
        None => step(kb, ptr, init),
        Some((&n, rest)) => {
            let s = st[0];
            for_range_carry(kb, 0, n as i64, 1, &[init], &mut |kb, i, c| {
                let p = kb.add_scaled(ptr, i, s);
                vec![fold(kb, rest, &st[1..], p, c[0], step)]
            })[0]
        }
    }
}

/// `Reduce { op, axes }`.
pub(crate) fn reduce(
    kb: &mut Kb,
    cx: &NodeCx,
    op: ReduceOp,
    axes: &[usize],
) -> Result<(), CpuError> {
    let (loc, ty) = cx.inputs[0];
    let d = ty.dtype;
    let float = matches!(d, DType::F32 | DType::F64);
    if !(float || d.is_int() && op.accepts_int()) {
        return Err(cx.dtype_err(d));
    }
    let sty = scalar_type(d).expect("checked");
    let es = d.size_bytes() as i64;
    let shape = &ty.shape;
    let in_st: Vec<i64> = strides(shape).iter().map(|s| s * es).collect();
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let out_st: Vec<i64> = strides(&kept_shape).iter().map(|s| s * es).collect();
    let kept_in: Vec<i64> = kept.iter().map(|&a| in_st[a]).collect();
    let (kdims, kst) = collapse(&kept_shape, &[out_st, kept_in]);
    let red_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let red_in: Vec<i64> = axes.iter().map(|&a| in_st[a]).collect();
    let (rdims, rst) = collapse(&red_shape, &[red_in]);
    let rst = rst.into_iter().next().unwrap_or_default();
    let count: usize = red_shape.iter().product();
    if kept_shape.iter().product::<usize>() == 0 {
        return Ok(());
    }
    let bases = [kb.ptr(cx.out), kb.ptr(loc)];
    // f32 max/min over a contiguous innermost run: exact in f32, so
    // vectors may replace the f64 scalar fold.
    let vector_minmax = sty == F32
        && matches!(op, ReduceOp::Max | ReduceOp::Min)
        && rst.last() == Some(&4)
        && rdims.last().is_some_and(|&n| n >= MINMAX_BLOCK);
    nest(kb, &kdims, &bases, &kst, &mut |kb, ptrs| {
        if vector_minmax {
            let r = reduce_minmax_f32(kb, op == ReduceOp::Max, &rdims, &rst, ptrs[1]);
            kb.store(r, ptrs[0], 0);
            return;
        }
        let r = if float {
            reduce_float(kb, op, sty, &rdims, &rst, ptrs[1], count)
        } else {
            reduce_int(kb, op, d, &rdims, &rst, ptrs[1])
        };
        kb.store(r, ptrs[0], 0);
    });
    Ok(())
}

/// f32 elements per iteration of [`reduce_minmax_f32`]: four independent
/// `f32x4` accumulators.
const MINMAX_BLOCK: usize = 16;

/// Max (or min) of f32 elements whose innermost reduced dim is contiguous:
/// per innermost run, four vector accumulators over whole blocks, a scalar
/// tail, then the lanes; NaNs propagate as in the scalar fold (Cranelift's
/// `fmax`/`fmin` return NaN when either operand is NaN).
fn reduce_minmax_f32(kb: &mut Kb, max: bool, dims: &[usize], st: &[i64], ptr: Value) -> Value {
    use cranelift_codegen::ir::types::F32X4;
    let (inner, outer) = dims.split_last().expect("a reduced dim");
    let inner = *inner;
    let combine = move |kb: &mut Kb, a: Value, b: Value| {
        if max {
            kb.b.ins().fmax(a, b)
        } else {
            kb.b.ins().fmin(a, b)
        }
    };
    let init = kb.fconst(
        F32,
        if max {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        },
    );
    fold(
        kb,
        outer,
        &st[..st.len() - 1],
        ptr,
        init,
        &move |kb, row, acc| {
            let start = kb.b.ins().splat(F32X4, acc);
            let blocks = inner / MINMAX_BLOCK;
            let accs = for_range_carry(kb, 0, blocks as i64, 1, &[start; 4], &mut |kb, b, accs| {
                let p = kb.add_scaled(row, b, (MINMAX_BLOCK * 4) as i64);
                (0..4)
                    .map(|q| {
                        let v = kb.load(F32X4, p, 16 * q as i64);
                        combine(kb, accs[q], v)
                    })
                    .collect()
            });
            let a = combine(kb, accs[0], accs[1]);
            let b = combine(kb, accs[2], accs[3]);
            let v = combine(kb, a, b);
            let mut r = kb.b.ins().extractlane(v, 0);
            for lane in 1..4u8 {
                let x = kb.b.ins().extractlane(v, lane);
                r = combine(kb, r, x);
            }
            let tail = (blocks * MINMAX_BLOCK) as i64;
            for_range_carry(kb, tail, inner as i64, 1, &[r], &mut |kb, i, c| {
                let p = kb.add_scaled(row, i, 4);
                let x = kb.load(F32, p, 0);
                vec![combine(kb, c[0], x)]
            })[0]
        },
    )
}

fn load_f64(kb: &mut Kb, sty: cranelift_codegen::ir::Type, p: Value) -> Value {
    let x = kb.load(sty, p, 0);
    if sty == F32 {
        kb.b.ins().fpromote(F64, x)
    } else {
        x
    }
}

fn reduce_float(
    kb: &mut Kb,
    op: ReduceOp,
    sty: cranelift_codegen::ir::Type,
    dims: &[usize],
    st: &[i64],
    ptr: Value,
    count: usize,
) -> Value {
    let init = match op {
        ReduceOp::Max | ReduceOp::LogSumExp => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
        ReduceOp::Prod => 1.0,
        _ => 0.0,
    };
    let init = kb.fconst(F64, init);
    let max_step = move |kb: &mut Kb, p: Value, acc: Value| {
        let x = load_f64(kb, sty, p);
        kb.b.ins().fmax(acc, x)
    };
    let r = match op {
        ReduceOp::Max | ReduceOp::LogSumExp => fold(kb, dims, st, ptr, init, &max_step),
        _ => fold(kb, dims, st, ptr, init, &move |kb, p, acc| {
            let x = load_f64(kb, sty, p);
            match op {
                ReduceOp::Min => kb.b.ins().fmin(acc, x),
                ReduceOp::Prod => kb.b.ins().fmul(acc, x),
                ReduceOp::L1 => {
                    let a = kb.b.ins().fabs(x);
                    kb.b.ins().fadd(acc, a)
                }
                ReduceOp::L2 | ReduceOp::SumSquare => kb.fmadd(x, x, acc),
                _ => kb.b.ins().fadd(acc, x),
            }
        }),
    };
    let r = match op {
        ReduceOp::Mean => {
            let n = kb.fconst(F64, count as f64);
            kb.b.ins().fdiv(r, n)
        }
        ReduceOp::L2 => kb.b.ins().sqrt(r),
        ReduceOp::LogSum => kb.call_host(HostFn::Log, &[r]),
        ReduceOp::LogSumExp => {
            // m + ln(Σ exp(x - m)) with m the maximum when it is finite,
            // else 0 (then the naive form is exact, as in the evaluator).
            let a = kb.b.ins().fabs(r);
            let inf = kb.fconst(F64, f64::INFINITY);
            let finite = kb.b.ins().fcmp(FloatCC::LessThan, a, inf);
            let zero = kb.fconst(F64, 0.0);
            let m = kb.b.ins().select(finite, r, zero);
            let s0 = kb.fconst(F64, 0.0);
            let s = fold(kb, dims, st, ptr, s0, &move |kb, p, acc| {
                let x = load_f64(kb, sty, p);
                let t = kb.b.ins().fsub(x, m);
                let e = kb.call_host(HostFn::Exp, &[t]);
                kb.b.ins().fadd(acc, e)
            });
            let l = kb.call_host(HostFn::Log, &[s]);
            kb.b.ins().fadd(m, l)
        }
        _ => r,
    };
    if sty == F32 {
        kb.b.ins().fdemote(F32, r)
    } else {
        r
    }
}

fn reduce_int(
    kb: &mut Kb,
    op: ReduceOp,
    d: DType,
    dims: &[usize],
    st: &[i64],
    ptr: Value,
) -> Value {
    let (lo, hi) = int_range(d);
    let init = match op {
        ReduceOp::Max => lo,
        ReduceOp::Min => hi,
        ReduceOp::Prod => 1,
        _ => 0,
    };
    let init = kb.b.ins().iconst(I64, init);
    let sty = scalar_type(d).expect("integer");
    let r = fold(kb, dims, st, ptr, init, &move |kb, p, acc| {
        let x = kb.load(sty, p, 0);
        let x = widen(kb, x, d);
        match op {
            // Unsigned values are zero-extended: u8..u32 are non-negative
            // in i64, u64 compares as unsigned.
            ReduceOp::Max if d.is_unsigned() => kb.b.ins().umax(acc, x),
            ReduceOp::Min if d.is_unsigned() => kb.b.ins().umin(acc, x),
            ReduceOp::Max => kb.b.ins().smax(acc, x),
            ReduceOp::Min => kb.b.ins().smin(acc, x),
            ReduceOp::Prod => kb.b.ins().imul(acc, x),
            _ => kb.b.ins().iadd(acc, x),
        }
    });
    narrow(kb, r, d)
}
