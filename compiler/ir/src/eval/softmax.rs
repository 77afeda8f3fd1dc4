//! Softmax along one axis: `exp(x - max) / Σ exp(x - max)`.

use super::{run_float, Float, FloatKernel};
use crate::{BinaryOp, Data, IrError, Op, Tensor};

struct SoftmaxKernel {
    /// Product of the dims before the axis.
    outer: usize,
    /// The axis length.
    dim: usize,
    /// Product of the dims after the axis.
    inner: usize,
}

impl FloatKernel for SoftmaxKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let x = inputs[0];
        let (dim, inner) = (self.dim, self.inner);
        let mut out = x.to_vec();
        for o in 0..self.outer {
            for i in 0..inner {
                let at = |d: usize| o * dim * inner + d * inner + i;
                let max = (0..dim).fold(
                    T::NEG_INFINITY,
                    |m, d| if x[at(d)] > m { x[at(d)] } else { m },
                );
                let mut sum = 0f64;
                for d in 0..dim {
                    let e = (x[at(d)] - max).exp();
                    out[at(d)] = e;
                    sum += e.to_f64();
                }
                let sum = T::from_f64(sum);
                for d in 0..dim {
                    out[at(d)] = out[at(d)] / sum;
                }
            }
        }
        out
    }
}

/// Softmax along `axis`; the exponentials are computed in the element's
/// arithmetic type, their sum accumulates in f64.
pub(super) fn softmax(axis: usize, x: &Tensor) -> Result<Data, IrError> {
    let s = x.shape();
    let kernel = SoftmaxKernel {
        outer: s[..axis].iter().product(),
        dim: s[axis],
        inner: s[axis + 1..].iter().product(),
    };
    run_float("softmax", &[x], &kernel)
}

/// `softmax(scale · (q @ kt) + mask) @ v` (see [`Op::Attention`]),
/// composed of the reference kernels of its parts.
pub(super) fn attention(scale: f32, inputs: &[&Tensor]) -> Result<Tensor, IrError> {
    let mut scores = super::eval(&Op::MatMul, &[inputs[0], inputs[1]])?;
    if scale != 1.0 {
        let s = Tensor::scalar_f32(scale);
        scores = super::eval(&Op::Binary(BinaryOp::Mul), &[&scores, &s])?;
    }
    if let Some(mask) = inputs.get(3) {
        scores = super::eval(&Op::Binary(BinaryOp::Add), &[&scores, mask])?;
    }
    let axis = scores.shape().len() - 1;
    let probs = super::eval(&Op::Softmax { axis }, &[&scores])?;
    super::eval(&Op::MatMul, &[&probs, inputs[2]])
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{Data, Op, Tensor};

    #[test]
    fn two_element_case() {
        // softmax([0, ln 3]) = [1/4, 3/4].
        let x = f32s(&[2], &[0.0, 3f32.ln()]);
        let y = eval(&Op::Softmax { axis: 0 }, &[&x]).unwrap();
        assert_close(&y, &[2], &[0.25, 0.75]);
    }

    #[test]
    fn rows_sum_to_one_and_large_values_do_not_overflow() {
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 1000.0, 1000.0, 1000.0]);
        let y = eval(&Op::Softmax { axis: 1 }, &[&x]).unwrap();
        let v = y.to_f64_vec();
        for row in v.chunks(3) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-6, "{v:?}");
        }
        let third = 1.0 / 3.0;
        assert_close(
            &y,
            &[2, 3],
            &[0.09003057, 0.24472847, 0.66524096, third, third, third],
        );
    }

    #[test]
    fn softmax_along_a_middle_axis() {
        // [1,2,2] along axis 1: each column [a, b] -> [1/(1+e^(b-a)), ...].
        let x = f32s(&[1, 2, 2], &[0.0, 5.0, 0.0, 5.0]);
        let y = eval(&Op::Softmax { axis: 1 }, &[&x]).unwrap();
        assert_close(&y, &[1, 2, 2], &[0.5, 0.5, 0.5, 0.5]);
        let x = Tensor::new([2, 1], Data::F64(vec![2.0, 2.0 + 2f64.ln()])).unwrap();
        let y = eval(&Op::Softmax { axis: 0 }, &[&x]).unwrap();
        assert_eq!(y.dtype(), crate::DType::F64);
        assert_close(&y, &[2, 1], &[1.0 / 3.0, 2.0 / 3.0]);
    }
}
