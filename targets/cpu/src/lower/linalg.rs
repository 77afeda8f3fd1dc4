//! Matrix products: MatMul (batched, broadcast) and Gemm.
//!
//! One register-blocked loop nest: tiles of up to 4 rows × two 128-bit
//! vectors of columns (8 f32 or 4 f64 columns: two `f32x4`/`f64x2`
//! accumulators per row) accumulated over K in registers, with row and
//! column tails handled by smaller tiles (one vector, then scalar columns).
//! MatMul runs in f32 or f64, Gemm in f32. A B operand whose columns are not contiguous (Gemm `trans_b`
//! on a non-constant B) uses scalar 4-column tiles; a constant B with
//! `trans_b` is transposed at compile time instead.

use cranelift_codegen::ir::types::{F32, F64, I32, I8};
use cranelift_codegen::ir::{InstBuilder, Type, Value};
use kiln_ir::{DType, Data};

use super::elementwise::broadcast_strides;
use super::loops::{collapse, for_range, for_range_carry, nest};
use super::Kb;
use super::NodeCx;
use crate::plan::{Base, Loc, Weights};
use crate::CpuError;

/// Rows per register tile.
const MR: usize = 4;

/// One matrix product `out = alpha * A @ B + beta * C`, addresses in bytes.
#[derive(Clone, Copy)]
pub(crate) struct Gemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A[i, k] at `a + i * a_rs + k * a_ks`.
    pub a: Value,
    pub a_rs: i64,
    pub a_ks: i64,
    /// B[k, j] at `b + k * b_ks + j * b_cs`.
    pub b: Value,
    pub b_ks: i64,
    pub b_cs: i64,
    /// C[i, j] at `c + i * c_rs + j * c_cs` (strides 0 where broadcast).
    pub c: Option<(Value, i64, i64)>,
    pub alpha: f32,
    pub beta: f32,
    /// out[i, j] at `out + i * out_rs + j * elem.bytes()`.
    pub out: Value,
    pub out_rs: i64,
    /// The element type of A, B, C and out: `F32` or `F64`.
    pub elem: Type,
}

/// A column group of a tile: a vector of 4 columns or one column, at a
/// column offset from the tile's first column.
#[derive(Clone, Copy)]
enum Col {
    Vec(usize),
    One(usize),
}

impl Col {
    fn off(self) -> usize {
        match self {
            Col::Vec(o) | Col::One(o) => o,
        }
    }
}

impl Gemm {
    /// `out = A @ B` with A `[m, k]`, B `[k, n]` and out `[m, n]`
    /// row-major and contiguous.
    pub(crate) fn row_major(m: usize, n: usize, k: usize, a: Value, b: Value, out: Value) -> Gemm {
        Gemm::row_major_of(F32, m, n, k, a, b, out)
    }

    /// [`Gemm::row_major`] on `elem` (`F32` or `F64`) elements.
    pub(crate) fn row_major_of(
        elem: Type,
        m: usize,
        n: usize,
        k: usize,
        a: Value,
        b: Value,
        out: Value,
    ) -> Gemm {
        let e = elem.bytes() as usize;
        Gemm {
            m,
            n,
            k,
            a,
            a_rs: (k * e) as i64,
            a_ks: e as i64,
            b,
            b_ks: (n * e) as i64,
            b_cs: e as i64,
            c: None,
            alpha: 1.0,
            beta: 1.0,
            out,
            out_rs: (n * e) as i64,
            elem,
        }
    }

    /// Bytes per element.
    fn bytes(&self) -> i64 {
        self.elem.bytes() as i64
    }

    /// Lanes of a 128-bit vector of elements.
    fn lanes(&self) -> usize {
        16 / self.elem.bytes() as usize
    }

    /// The 128-bit vector type of elements.
    fn vector(&self) -> Type {
        self.elem.by(self.lanes() as u32).expect("a 128-bit vector")
    }
}

/// Emits `g`.
pub(crate) fn emit(kb: &mut Kb, g: &Gemm) {
    if g.m == 0 || g.n == 0 {
        return;
    }
    let full = g.m / MR;
    for_range(kb, 0, (full * MR) as i64, MR as i64, &mut |kb, i0| {
        rows(kb, g, MR, i0)
    });
    if !g.m.is_multiple_of(MR) {
        let i0 = kb.iconst((full * MR) as i64);
        rows(kb, g, g.m % MR, i0);
    }
}

fn rows(kb: &mut Kb, g: &Gemm, mr: usize, i0: Value) {
    let vec_b = g.b_cs == g.bytes();
    let lanes = g.lanes();
    let (block, groups): (usize, Vec<Col>) = if vec_b {
        (2 * lanes, vec![Col::Vec(0), Col::Vec(lanes)])
    } else {
        (4, (0..4).map(Col::One).collect())
    };
    let nb = g.n / block;
    for_range(kb, 0, (nb * block) as i64, block as i64, &mut |kb, j0| {
        tile(kb, g, mr, i0, j0, &groups)
    });
    let rem = g.n % block;
    if rem > 0 {
        let mut tail = Vec::new();
        let mut at = 0;
        if vec_b && rem >= lanes {
            tail.push(Col::Vec(0));
            at = lanes;
        }
        tail.extend((at..rem).map(Col::One));
        let j0 = kb.iconst((nb * block) as i64);
        tile(kb, g, mr, i0, j0, &tail);
    }
}

fn tile(kb: &mut Kb, g: &Gemm, mr: usize, i0: Value, j0: Value, cols: &[Col]) {
    let any_vec = cols.iter().any(|c| matches!(c, Col::Vec(_)));
    let (elem, vector, bytes) = (g.elem, g.vector(), g.bytes());
    let a_row = kb.add_scaled(g.a, i0, g.a_rs);
    let b_col = kb.add_scaled(g.b, j0, g.b_cs);
    let zero_s = kb.fconst(elem, 0.0);
    let zero_v = if any_vec {
        Some(kb.b.ins().splat(vector, zero_s))
    } else {
        None
    };
    let mut init = Vec::with_capacity(mr * cols.len());
    for _ in 0..mr {
        for c in cols {
            init.push(match c {
                Col::Vec(_) => zero_v.expect("vector group"),
                Col::One(_) => zero_s,
            });
        }
    }
    let acc = for_range_carry(kb, 0, g.k as i64, 1, &init, &mut |kb, kk, acc| {
        let a_k = kb.add_scaled(a_row, kk, g.a_ks);
        let b_k = kb.add_scaled(b_col, kk, g.b_ks);
        let bv: Vec<Value> = cols
            .iter()
            .map(|c| match c {
                Col::Vec(o) => kb.load(vector, b_k, *o as i64 * g.b_cs),
                Col::One(o) => kb.load(elem, b_k, *o as i64 * g.b_cs),
            })
            .collect();
        let mut out = Vec::with_capacity(acc.len());
        for r in 0..mr {
            let a_s = kb.load(elem, a_k, r as i64 * g.a_rs);
            let a_v = if any_vec {
                Some(kb.b.ins().splat(vector, a_s))
            } else {
                None
            };
            for (ci, c) in cols.iter().enumerate() {
                let a = match c {
                    Col::Vec(_) => a_v.expect("vector group"),
                    Col::One(_) => a_s,
                };
                out.push(kb.fmadd(a, bv[ci], acc[r * cols.len() + ci]));
            }
        }
        out
    });
    let out_row = kb.add_scaled(g.out, i0, g.out_rs);
    let out_p = kb.add_scaled(out_row, j0, bytes);
    let c_p = g.c.map(|(c, rs, cs)| {
        let row = kb.add_scaled(c, i0, rs);
        (kb.add_scaled(row, j0, cs), rs, cs)
    });
    for r in 0..mr {
        for (ci, col) in cols.iter().enumerate() {
            let is_vec = matches!(col, Col::Vec(_));
            let ty = if is_vec { vector } else { elem };
            let mut v = acc[r * cols.len() + ci];
            if g.alpha != 1.0 {
                let a = kb.fconst(ty, g.alpha as f64);
                v = kb.b.ins().fmul(v, a);
            }
            if let Some((c, rs, cs)) = c_p {
                let at = r as i64 * rs + col.off() as i64 * cs;
                let cv = if is_vec && cs == 0 {
                    let s = kb.load(elem, c, at);
                    kb.b.ins().splat(vector, s)
                } else if is_vec && cs != bytes {
                    let mut lanes = kb.load(elem, c, at);
                    lanes = kb.b.ins().splat(vector, lanes);
                    for l in 1..g.lanes() as u8 {
                        let s = kb.load(elem, c, at + l as i64 * cs);
                        lanes = kb.b.ins().insertlane(lanes, s, l);
                    }
                    lanes
                } else {
                    kb.load(ty, c, at)
                };
                v = if g.beta == 1.0 {
                    kb.b.ins().fadd(v, cv)
                } else {
                    let beta = kb.fconst(ty, g.beta as f64);
                    kb.fmadd(cv, beta, v)
                };
            }
            kb.store(v, out_p, r as i64 * g.out_rs + col.off() as i64 * bytes);
        }
    }
}

/// The loop structure of a numpy-semantics batched MatMul whose operand
/// and output elements take `a_size`, `b_size` and `out_size` bytes.
struct Batched {
    m: usize,
    k: usize,
    n: usize,
    /// Collapsed batch dims and, per dim, the byte strides of the output,
    /// A and B.
    dims: Vec<usize>,
    strides: Vec<Vec<i64>>,
}

/// The numpy MatMul view of operand shapes `a @ b`: 1-D operands promoted
/// to a row (A) or column (B) matrix, the matrix dims and the broadcast
/// batch dims.
pub(crate) struct MatMulShape {
    /// A's shape, promoted to at least 2-D.
    pub a: Vec<usize>,
    /// B's shape, promoted to at least 2-D.
    pub b: Vec<usize>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// The output's batch dims.
    pub batch: Vec<usize>,
}

impl MatMulShape {
    /// `None` when the batch dims do not broadcast.
    pub(crate) fn of(a: &[usize], b: &[usize]) -> Option<MatMulShape> {
        let a: Vec<usize> = if a.len() == 1 {
            vec![1, a[0]]
        } else {
            a.to_vec()
        };
        let b: Vec<usize> = if b.len() == 1 {
            vec![b[0], 1]
        } else {
            b.to_vec()
        };
        let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
        let n = b[b.len() - 1];
        let batch = kiln_ir::infer::broadcast_shapes(&a[..a.len() - 2], &b[..b.len() - 2])?;
        Some(MatMulShape {
            m,
            k,
            n,
            batch: batch.to_vec(),
            a,
            b,
        })
    }

    /// A's batch dims.
    pub(crate) fn a_batch(&self) -> &[usize] {
        &self.a[..self.a.len() - 2]
    }

    /// B's batch dims.
    pub(crate) fn b_batch(&self) -> &[usize] {
        &self.b[..self.b.len() - 2]
    }
}

impl Batched {
    fn new(
        cx: &NodeCx,
        a_size: usize,
        b_size: usize,
        out_size: usize,
    ) -> Result<Batched, CpuError> {
        let shape = MatMulShape::of(&cx.inputs[0].1.shape, &cx.inputs[1].1.shape)
            .ok_or_else(|| cx.unsupported("batch dims do not broadcast"))?;
        let (m, k, n) = (shape.m, shape.k, shape.n);
        let (a_batch, b_batch, batch) = (shape.a_batch(), shape.b_batch(), &shape.batch);
        let scaled =
            |st: Vec<i64>, by: usize| -> Vec<i64> { st.iter().map(|s| s * by as i64).collect() };
        let out_st = scaled(super::strides(batch), m * n * out_size);
        let a_st = scaled(broadcast_strides(a_batch, batch), m * k * a_size);
        let b_st = scaled(broadcast_strides(b_batch, batch), k * n * b_size);
        let (dims, strides) = collapse(batch, &[out_st, a_st, b_st]);
        Ok(Batched {
            m,
            k,
            n,
            dims,
            strides,
        })
    }
}

/// numpy-semantics MatMul on f32 or f64.
pub(crate) fn matmul(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let elem = match cx.float_input(0, true)? {
        DType::F64 => F64,
        _ => F32,
    };
    let e = elem.bytes() as usize;
    let Batched {
        m,
        k,
        n,
        dims,
        strides,
    } = Batched::new(cx, e, e, e)?;
    let a = kb.ptr(cx.inputs[0].0);
    let b = kb.ptr(cx.inputs[1].0);
    let out = kb.ptr(cx.out);
    nest(kb, &dims, &[out, a, b], &strides, &mut |kb, p| {
        emit(kb, &Gemm::row_major_of(elem, m, n, k, p[1], p[2], p[0]))
    });
    Ok(())
}

/// The 8-bit element at `p + off` as an `i32`: sign-extended when
/// `signed` (i8), zero-extended otherwise (u8).
pub(crate) fn load_byte(kb: &mut Kb, p: Value, off: i64, signed: bool) -> Value {
    let v = kb.load(I8, p, off);
    if signed {
        kb.b.ins().sextend(I32, v)
    } else {
        kb.b.ins().uextend(I32, v)
    }
}

/// `MatMulInteger` as scalar i32 loops: the portable path (any target, a
/// non-constant B, zero points the AVX-512 VNNI kernel does not take).
pub(crate) fn matmul_integer(kb: &mut Kb, cx: &NodeCx) -> Result<(), CpuError> {
    let Batched {
        m,
        k,
        n,
        dims,
        strides,
    } = Batched::new(cx, 1, 1, 4)?;
    let signed = |i: usize| cx.inputs[i].1.dtype == DType::I8;
    let (a_signed, b_signed) = (signed(0), signed(1));
    let a_zero_p = kb.ptr(cx.inputs[2].0);
    let u8_zero = load_byte(kb, a_zero_p, 0, a_signed);
    let b_zero = kb.ptr(cx.inputs[3].0);
    let b_zero_step = i64::from(cx.inputs[3].1.num_elements() > 1);
    let a = kb.ptr(cx.inputs[0].0);
    let b = kb.ptr(cx.inputs[1].0);
    let out = kb.ptr(cx.out);
    nest(kb, &dims, &[out, a, b], &strides, &mut |kb, p| {
        let (out, a, b) = (p[0], p[1], p[2]);
        for_range(kb, 0, m as i64, 1, &mut |kb, i| {
            let a_row = kb.add_scaled(a, i, k as i64);
            let out_row = kb.add_scaled(out, i, (n * 4) as i64);
            for_range(kb, 0, n as i64, 1, &mut |kb, j| {
                let zp = kb.add_scaled(b_zero, j, b_zero_step);
                let bz = load_byte(kb, zp, 0, b_signed);
                let b_col = kb.add_scaled(b, j, 1);
                let zero = kb.b.ins().iconst(I32, 0);
                let sum = for_range_carry(kb, 0, k as i64, 1, &[zero], &mut |kb, kk, acc| {
                    let ap = kb.add_scaled(a_row, kk, 1);
                    let bp = kb.add_scaled(b_col, kk, n as i64);
                    let av = load_byte(kb, ap, 0, a_signed);
                    let bv = load_byte(kb, bp, 0, b_signed);
                    let ac = kb.b.ins().isub(av, u8_zero);
                    let bc = kb.b.ins().isub(bv, bz);
                    let prod = kb.b.ins().imul(ac, bc);
                    vec![kb.b.ins().iadd(acc[0], prod)]
                });
                let at = kb.add_scaled(out_row, j, 4);
                kb.store(sum[0], at, 0);
            });
        });
    });
    Ok(())
}

/// ONNX Gemm on f32: `alpha * op(A) @ op(B) + beta * C`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    kb: &mut Kb,
    cx: &NodeCx,
    weights: &mut Weights,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Result<(), CpuError> {
    for i in 0..cx.inputs.len() {
        cx.float_input(i, false)?;
    }
    let (aloc, aty) = cx.inputs[0];
    let (mut bloc, bty) = cx.inputs[1];
    let (m, k) = if trans_a {
        (aty.shape[1], aty.shape[0])
    } else {
        (aty.shape[0], aty.shape[1])
    };
    let n = cx.node.ty.shape[1];
    let (a_rs, a_ks) = if trans_a {
        (4, (m * 4) as i64)
    } else {
        ((k * 4) as i64, 4)
    };
    let (mut b_ks, mut b_cs) = if trans_b {
        (4, (k * 4) as i64)
    } else {
        ((n * 4) as i64, 4)
    };
    if trans_b {
        // A constant B is stored transposed ([N, K]); pack it as [K, N].
        if let Some(Data::F32(v)) = cx.graph.constant(cx.input_ids[1]).map(|t| t.data()) {
            let mut packed = Vec::with_capacity(k * n * 4);
            for kk in 0..k {
                for j in 0..n {
                    packed.extend_from_slice(&v[j * k + kk].to_le_bytes());
                }
            }
            bloc = Loc {
                base: Base::Weights,
                offset: weights.add(&packed),
            };
            b_ks = (n * 4) as i64;
            b_cs = 4;
        }
    }
    let _ = bty;
    let a = kb.ptr(aloc);
    let b = kb.ptr(bloc);
    let c = if beta != 0.0 {
        cx.inputs.get(2).map(|&(cloc, cty)| {
            let st = broadcast_strides(&cty.shape, &[m, n]);
            let p = kb.ptr(cloc);
            (p, st[0] * 4, st[1] * 4)
        })
    } else {
        None
    };
    let out = kb.ptr(cx.out);
    emit(
        kb,
        &Gemm {
            m,
            n,
            k,
            a,
            a_rs,
            a_ks,
            b,
            b_ks,
            b_cs,
            c,
            alpha,
            beta,
            out,
            out_rs: (n * 4) as i64,
            elem: F32,
        },
    );
    Ok(())
}
