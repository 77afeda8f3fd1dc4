//! MatMul (numpy semantics) and Gemm. Float dot products accumulate in f64.

use super::{broadcast_offsets, eval_err, run_dense, widened, Float, FloatKernel};
use crate::infer::broadcast_shapes;
use crate::{Data, IrError, Tensor, ValueType};

/// The loop structure of a (batched, broadcast) matrix product.
struct MatMulDims {
    m: usize,
    k: usize,
    n: usize,
    /// Per output batch, the batch index read in A.
    ia: Vec<usize>,
    /// Per output batch, the batch index read in B.
    ib: Vec<usize>,
}

impl MatMulDims {
    /// The product, one output row at a time: `row[j]` starts at `zero` and
    /// takes `mul_add(row[j], a[i, kk], b[kk, j])` for kk = 0, 1, .. in
    /// order, so every element sums its terms in the order of its dot
    /// product (the row loop vectorizes across j without changing a sum).
    fn rows<V: Copy>(&self, a: &[V], b: &[V], zero: V, mul_add: impl Fn(V, V, V) -> V) -> Vec<V> {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut out = Vec::with_capacity(self.ia.len() * m * n);
        let mut row = vec![zero; n];
        for (&ba, &bb) in self.ia.iter().zip(&self.ib) {
            let b = &b[bb * k * n..][..k * n];
            for i in 0..m {
                row.fill(zero);
                let a = &a[(ba * m + i) * k..][..k];
                for (&av, b_row) in a.iter().zip(b.chunks_exact(n.max(1))) {
                    for (r, &bv) in row.iter_mut().zip(b_row) {
                        *r = mul_add(*r, av, bv);
                    }
                }
                out.extend_from_slice(&row);
            }
        }
        out
    }
}

impl FloatKernel for MatMulDims {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        // From −0.0, as `Sum` for floats starts.
        let sums = self.rows(&widened(inputs[0]), &widened(inputs[1]), -0.0, |r, a, b| {
            r + a * b
        });
        sums.into_iter().map(T::from_f64).collect()
    }
}

/// numpy `matmul`: 1-D operands are promoted to a row (A) or column (B)
/// matrix, batch dims broadcast. Integers accumulate with wrapping i64
/// arithmetic.
pub(super) fn matmul(a: &Tensor, b: &Tensor, out: &ValueType) -> Result<Data, IrError> {
    let promote = |s: &[usize], row: bool| -> Vec<usize> {
        match (s.len(), row) {
            (1, true) => vec![1, s[0]],
            (1, false) => vec![s[0], 1],
            _ => s.to_vec(),
        }
    };
    let (a2, b2) = (promote(a.shape(), true), promote(b.shape(), false));
    let (ra, rb) = (a2.len(), b2.len());
    let (m, k, n) = (a2[ra - 2], a2[ra - 1], b2[rb - 1]);
    let batch = broadcast_shapes(&a2[..ra - 2], &b2[..rb - 2])
        .ok_or_else(|| eval_err("matmul", "batch dims do not broadcast"))?;
    let dims = MatMulDims {
        m,
        k,
        n,
        ia: broadcast_offsets(&a2[..ra - 2], &batch),
        ib: broadcast_offsets(&b2[..rb - 2], &batch),
    };
    debug_assert_eq!(dims.ia.len() * m * n, out.num_elements());
    if a.dtype().is_float() {
        return run_dense("matmul", &[a, b], out, &dims);
    }
    if !a.dtype().is_int() {
        return Err(eval_err(
            "matmul",
            format!("unsupported element type {}", a.dtype()),
        ));
    }
    let (va, vb) = (a.to_i64_vec(), b.to_i64_vec());
    let values = dims.rows(&va, &vb, 0i64, |r, a, b| r.wrapping_add(a.wrapping_mul(b)));
    Ok(Data::from_i64s(a.dtype(), values.into_iter()))
}

/// `MatMulInteger`: `(A - a_zero) @ (B - b_zero)` in wrapping i32 (every
/// product of two centred 8-bit values fits; sums of more than 2^17 of them
/// wrap as the ONNX reference's int32 accumulation does).
pub(super) fn matmul_integer(inputs: &[&Tensor], out: &ValueType) -> Result<Data, IrError> {
    let a = inputs[0].to_i64_vec();
    let b = inputs[1].to_i64_vec();
    let az = inputs[2].to_i64_vec()[0];
    let bz = inputs[3].to_i64_vec();
    let a_centred: Vec<i64> = a.iter().map(|v| v - az).collect();
    let b_shape = inputs[1].shape();
    let n = if b_shape.len() > 1 {
        b_shape[b_shape.len() - 1]
    } else {
        1
    };
    let b_centred: Vec<i64> = (b.iter().enumerate())
        .map(|(i, v)| v - bz[if bz.len() == 1 { 0 } else { i % n }])
        .collect();
    let wrap = |d: Vec<i64>, t: &Tensor| {
        Tensor::new(t.shape(), Data::I64(d))
            .ok_or_else(|| eval_err("matmul_integer", "operand size does not match its shape"))
    };
    let a = wrap(a_centred, inputs[0])?;
    let b = wrap(b_centred, inputs[1])?;
    let wide = ValueType::new(crate::DType::I64, out.shape.clone());
    let Data::I64(v) = matmul(&a, &b, &wide)? else {
        unreachable!("an i64 product is i64")
    };
    Ok(Data::I32(v.into_iter().map(|x| x as i32).collect()))
}

struct GemmKernel {
    alpha: f64,
    beta: f64,
    trans_a: bool,
    trans_b: bool,
    m: usize,
    k: usize,
    n: usize,
    /// For every output element, the element of C it adds (if C is given).
    ic: Option<Vec<usize>>,
}

impl FloatKernel for GemmKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let (m, k, n) = (self.m, self.k, self.n);
        // A as `m × k` and B as `k × n` row-major in f64, then one output
        // row at a time (each element sums its terms in k order, as a dot
        // product).
        let a: Vec<f64> = match self.trans_a {
            false => widened(inputs[0]),
            true => (0..m * k)
                .map(|e| inputs[0][(e % k) * m + e / k].to_f64())
                .collect(),
        };
        let b: Vec<f64> = match self.trans_b {
            false => widened(inputs[1]),
            true => (0..k * n)
                .map(|e| inputs[1][(e % n) * k + e / n].to_f64())
                .collect(),
        };
        let dims = MatMulDims {
            m,
            k,
            n,
            ia: vec![0],
            ib: vec![0],
        };
        let products = dims.rows(&a, &b, 0.0, |r, a, b| r + a * b);
        (products.into_iter().enumerate())
            .map(|(e, acc)| {
                let mut y = self.alpha * acc;
                if let (Some(ic), Some(c)) = (&self.ic, inputs.get(2)) {
                    y += self.beta * c[ic[e]].to_f64();
                }
                T::from_f64(y)
            })
            .collect()
    }
}

/// `alpha * op(A) @ op(B) + beta * C`, C unidirectionally broadcast.
pub(super) fn gemm(
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
    inputs: &[&Tensor],
    out: &ValueType,
) -> Result<Data, IrError> {
    let a = inputs[0];
    let (m, n) = (out.shape[0], out.shape[1]);
    let k = if trans_a { a.shape()[0] } else { a.shape()[1] };
    let kernel = GemmKernel {
        alpha: alpha as f64,
        beta: beta as f64,
        trans_a,
        trans_b,
        m,
        k,
        n,
        ic: inputs
            .get(2)
            .map(|c| broadcast_offsets(c.shape(), &out.shape)),
    };
    run_dense("gemm", inputs, out, &kernel)
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{Data, Op, Tensor};

    fn gemm_op(alpha: f32, beta: f32, trans_a: bool, trans_b: bool) -> Op {
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        }
    }

    #[test]
    fn matmul_2x2() {
        let a = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32s(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
        let y = eval(&Op::MatMul, &[&a, &b]).unwrap();
        assert_close(&y, &[2, 2], &[19.0, 22.0, 43.0, 50.0]);
    }

    #[test]
    fn matmul_batched_broadcast() {
        // A: [2,1,1,2], A[i] = [[i+1, 1]]; B: [3,2,1], B[j] = [[j],[10]].
        // out[i,j] = (i+1)*j + 10, shape [2,3,1,1].
        let a = f32s(&[2, 1, 1, 2], &[1.0, 1.0, 2.0, 1.0]);
        let b = f32s(&[3, 2, 1], &[0.0, 10.0, 1.0, 10.0, 2.0, 10.0]);
        let y = eval(&Op::MatMul, &[&a, &b]).unwrap();
        assert_close(&y, &[2, 3, 1, 1], &[10.0, 11.0, 12.0, 10.0, 12.0, 14.0]);
    }

    #[test]
    fn matmul_one_dimensional_operands() {
        let v = f32s(&[3], &[1.0, 2.0, 3.0]);
        let m32 = f32s(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let m23 = f32s(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        // [3] @ [3,2] -> [2]
        let y = eval(&Op::MatMul, &[&v, &m32]).unwrap();
        assert_close(&y, &[2], &[4.0, 5.0]);
        // [2,3] @ [3] -> [2]
        let y = eval(&Op::MatMul, &[&m23, &v]).unwrap();
        assert_close(&y, &[2], &[4.0, 5.0]);
        // [3] @ [3] -> []
        let y = eval(&Op::MatMul, &[&v, &v]).unwrap();
        assert_close(&y, &[], &[14.0]);
        // [2,2,3] @ [3] -> [2,2]
        let batch = f32s(
            &[2, 2, 3],
            &[1., 0., 0., 0., 1., 0., 0., 0., 1., 1., 1., 1.],
        );
        let y = eval(&Op::MatMul, &[&batch, &v]).unwrap();
        assert_close(&y, &[2, 2], &[1.0, 2.0, 3.0, 6.0]);
    }

    #[test]
    fn matmul_integers() {
        let a = Tensor::new([1, 2], Data::I32(vec![2, -3])).unwrap();
        let b = Tensor::new([2, 2], Data::I32(vec![4, 5, 6, 7])).unwrap();
        let y = eval(&Op::MatMul, &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::I32(vec![-10, -11]));
    }

    #[test]
    fn gemm_transposes_alpha_beta_and_broadcast_c() {
        // op(A) = [[1,2,3],[4,5,6]] stored transposed as [3,2];
        // op(B) = [[1,0],[0,1],[1,1]] stored transposed as [2,3].
        // op(A) @ op(B) = [[4,5],[10,11]].
        let a = f32s(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
        let b = f32s(&[2, 3], &[1.0, 0.0, 1.0, 0.0, 1.0, 1.0]);
        let y = eval(&gemm_op(1.0, 1.0, true, true), &[&a, &b]).unwrap();
        assert_close(&y, &[2, 2], &[4.0, 5.0, 10.0, 11.0]);
        // alpha 2, C = [10, 20] broadcast along rows, beta 0.5.
        let c = f32s(&[2], &[10.0, 20.0]);
        let y = eval(&gemm_op(2.0, 0.5, true, true), &[&a, &b, &c]).unwrap();
        assert_close(&y, &[2, 2], &[13.0, 20.0, 25.0, 32.0]);
        // C = [[1],[2]] broadcast along columns.
        let c = f32s(&[2, 1], &[1.0, 2.0]);
        let y = eval(&gemm_op(2.0, 1.0, true, true), &[&a, &b, &c]).unwrap();
        assert_close(&y, &[2, 2], &[9.0, 11.0, 22.0, 24.0]);
        // Scalar C, no transposes: A' = [[1,2,3],[4,5,6]], B' = [[1,0],[0,1],[1,1]].
        let at = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let bt = f32s(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        let c = f32s(&[], &[-1.0]);
        let y = eval(&gemm_op(1.0, 3.0, false, false), &[&at, &bt, &c]).unwrap();
        assert_close(&y, &[2, 2], &[1.0, 2.0, 7.0, 8.0]);
    }

    #[test]
    fn gemm_rejects_integers() {
        let a = Tensor::new([1, 1], Data::I32(vec![1])).unwrap();
        assert!(eval(&gemm_op(1.0, 1.0, false, false), &[&a, &a]).is_err());
    }
}
