//! Scaled dot-product attention (`Op::Attention`) as one kernel: for each
//! head, the scores `scale · Q @ Kt + mask` go to an `M × N` scratch, are
//! turned into probabilities row by row in place, and `P @ V` goes to the
//! output. The scores of one head stay in cache between the three steps
//! and no `[..., M, N]` tensor is ever written to the arena.
//!
//! The Cranelift kernel below runs on every target; on AVX-512 targets
//! [`lower_avx512`] assembles the same schedule from the GEMM and softmax
//! microkernels, with the heads split over threads.

use cranelift_codegen::ir::InstBuilder;

use super::dense::Machine;
use super::elementwise::broadcast_strides;
use super::linalg::{emit, Gemm};
use super::loops::{collapse, for_range, nest};
use super::partition::MIN_TASK_FLOPS;
use super::{softmax, Kb, NodeCx};
use crate::microkernel::attention::AttentionSpec;
use crate::microkernel::gemm::{
    ALayout, Activation, BLayout, Blocking, CLayout, Call, Elem, GemmSpec, MAX_MR,
};
use crate::microkernel::softmax::SoftmaxSpec;
use crate::plan::Scratch;
use crate::CpuError;

/// The sizes of one attention node: `batch` heads of `Q[M, K] @ Kt[K, N]`
/// then `P[M, N] @ V[N, D]`; the mask's strides in elements along the
/// batch dims, the rows and the columns of the scores (0 where it
/// broadcasts).
pub(crate) struct Shape {
    pub batch: Vec<usize>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub d: usize,
    pub mask: Option<(Vec<i64>, i64, i64)>,
}

impl Shape {
    pub(crate) fn of(cx: &NodeCx) -> Result<Shape, CpuError> {
        for i in 0..cx.inputs.len() {
            cx.float_input(i, false)?;
        }
        let (q, kt, v) = (
            &cx.inputs[0].1.shape,
            &cx.inputs[1].1.shape,
            &cx.inputs[2].1.shape,
        );
        let r = q.len();
        let batch = q[..r - 2].to_vec();
        let (m, k, n, d) = (q[r - 2], q[r - 1], kt[r - 1], v[r - 1]);
        let mask = cx.inputs.get(3).map(|(_, ty)| {
            let mut scores = batch.clone();
            scores.extend([m, n]);
            let st = broadcast_strides(&ty.shape, &scores);
            (st[..r - 2].to_vec(), st[r - 2], st[r - 1])
        });
        Ok(Shape {
            batch,
            m,
            k,
            n,
            d,
            mask,
        })
    }

    /// Bytes of one head's scores.
    pub(crate) fn scores_bytes(&self) -> u64 {
        (self.m * self.n * 4) as u64
    }
}

/// The Cranelift kernel (see the module docs).
pub(crate) fn attention(
    kb: &mut Kb,
    cx: &NodeCx,
    scale: f32,
    scratch: &mut Scratch,
) -> Result<(), CpuError> {
    let sh = Shape::of(cx)?;
    let (m, k, n, d) = (sh.m, sh.k, sh.n, sh.d);
    if m * d == 0 || sh.batch.contains(&0) {
        return Ok(());
    }
    let scores = scratch.reserve(&[sh.scores_bytes()])[0];
    let head = super::strides(&sh.batch);
    let bytes = |by: usize| -> Vec<i64> { head.iter().map(|s| s * by as i64 * 4).collect() };
    let mut strides = vec![bytes(m * d), bytes(m * k), bytes(k * n), bytes(n * d)];
    let mut bases = vec![
        kb.ptr(cx.out),
        kb.ptr(cx.inputs[0].0),
        kb.ptr(cx.inputs[1].0),
        kb.ptr(cx.inputs[2].0),
    ];
    if let (Some((st, _, _)), Some((loc, _))) = (&sh.mask, cx.inputs.get(3)) {
        strides.push(st.iter().map(|s| s * 4).collect());
        bases.push(kb.ptr(*loc));
    }
    let (dims, strides) = collapse(&sh.batch, &strides);
    let s = kb.ptr(scores);
    let row = (n * 4) as i64;
    nest(kb, &dims, &bases, &strides, &mut |kb, p| {
        let scores = Gemm {
            c: sh.mask.as_ref().map(|&(_, r, c)| (p[4], r * 4, c * 4)),
            alpha: scale,
            ..Gemm::row_major(m, n, k, p[1], p[2], s)
        };
        emit(kb, &scores);
        if n > 0 {
            for_range(kb, 0, m as i64 * row, row, &mut |kb, off| {
                let r = kb.b.ins().iadd(s, off);
                softmax::row(kb, r, r, n);
            });
        }
        emit(kb, &Gemm::row_major(m, d, n, s, p[3], p[0]));
    });
    Ok(())
}

/// The microkernel of attention node `cx` as up to `machine.tasks` tasks
/// (the heads split between them, each task with scores scratch of its
/// own), or `None` when it does not apply.
pub(crate) fn lower_microkernel(
    cx: &NodeCx,
    scale: f32,
    scratch: &mut Scratch,
    Machine { vector, tasks }: Machine,
) -> Option<Vec<Result<Vec<u8>, crate::microkernel::MicrokernelError>>> {
    let sh = Shape::of(cx).ok()?;
    let (m, k, n, d) = (sh.m, sh.k, sh.n, sh.d);
    let heads: usize = sh.batch.iter().product();
    if m * n * d * heads == 0 {
        return None;
    }
    let flops = 2 * heads * m * n * (k + d);
    let tasks = tasks.min(flops / MIN_TASK_FLOPS).clamp(1, heads);
    let parts = scratch.reserve(&vec![sh.scores_bytes(); tasks]);
    let gemm =
        |m: usize, n: usize, k: usize, a_row: usize, b_row: usize, out_row: usize| GemmSpec {
            m,
            n,
            k,
            elem: Elem::F32,
            blocking: Blocking::choose_for(vector, m, n, MAX_MR),
            a: ALayout::Strided {
                row: (a_row * 4) as i64,
                col: 4,
            },
            b: BLayout::Strided {
                row: (b_row * 4) as i64,
            },
            out_row: (out_row * 4) as i64,
            alpha: 1.0,
            c: None,
            act: Activation::None,
            calls: vec![],
            im2col: vec![],
            b_panel: None,
            im2col_into_a: false,
            u8_zero: None,
            row_sums: None,
            to_f32: false,
            store: crate::microkernel::Store::F32,
            epilogue: vec![],
        };
    let mut scores = gemm(m, n, k, k, n, n);
    scores.alpha = scale;
    scores.c = sh.mask.as_ref().map(|&(_, row, col)| CLayout {
        row: row * 4,
        per_column: col != 0,
        beta: 1.0,
    });
    let context = gemm(m, d, n, n, d, d);
    // Element offsets of head h (row-major over the batch dims).
    let head_strides = super::strides(&sh.batch);
    let offset = |h: usize, strides: &[i64]| -> i64 {
        let mut rest = h;
        let mut off = 0i64;
        for (i, &dim) in sh.batch.iter().enumerate().rev() {
            off += (rest % dim) as i64 * strides[i];
            rest /= dim;
        }
        off * 4
    };
    let unit = |by: usize| -> Vec<i64> { head_strides.iter().map(|s| s * by as i64).collect() };
    let (q_st, kt_st, v_st, out_st) = (unit(m * k), unit(k * n), unit(n * d), unit(m * d));
    let (q, kt, v) = (cx.inputs[0].0, cx.inputs[1].0, cx.inputs[2].0);
    let codes = (0..tasks)
        .map(|t| {
            let s = parts[t];
            let calls = (heads * t / tasks..heads * (t + 1) / tasks)
                .map(|h| {
                    let mask = (sh.mask.as_ref().zip(cx.inputs.get(3)))
                        .map(|((st, _, _), (loc, _))| loc.moved(offset(h, st)));
                    let score = Call {
                        a: q.moved(offset(h, &q_st)),
                        b: kt.moved(offset(h, &kt_st)),
                        out: s,
                        c: mask,
                        src: None,
                    };
                    let ctx = Call {
                        a: s,
                        b: v.moved(offset(h, &v_st)),
                        out: cx.out.moved(offset(h, &out_st)),
                        c: None,
                        src: None,
                    };
                    (score, ctx)
                })
                .collect();
            AttentionSpec {
                scores: scores.clone(),
                probs: SoftmaxSpec {
                    rows: m,
                    len: n,
                    x: s,
                    y: s,
                    vector,
                },
                context: context.clone(),
                heads: calls,
            }
            .assemble()
        })
        .collect();
    Some(codes)
}
