//! Layer normalization: statistics over the trailing axes from `axis` on.

use super::{broadcast_offsets, run_float, Float, FloatKernel};
use crate::{Data, IrError, Tensor};

struct LayerNormKernel {
    /// Number of normalized groups (product of the dims before the axis).
    groups: usize,
    /// Elements per group.
    size: usize,
    epsilon: f64,
    /// For each element of a group, the scale and bias element it reads.
    scale_at: Vec<usize>,
    bias_at: Option<Vec<usize>>,
}

impl FloatKernel for LayerNormKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let (x, scale) = (inputs[0], inputs[1]);
        let mut out = Vec::with_capacity(x.len());
        for g in 0..self.groups {
            let row = &x[g * self.size..(g + 1) * self.size];
            let n = self.size as f64;
            let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() / n;
            let var = row.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / n;
            let inv = 1.0 / (var + self.epsilon).sqrt();
            for (i, v) in row.iter().enumerate() {
                let mut y = (v.to_f64() - mean) * inv * scale[self.scale_at[i]].to_f64();
                if let Some(bias_at) = &self.bias_at {
                    y += inputs[2][bias_at[i]].to_f64();
                }
                out.push(T::from_f64(y));
            }
        }
        out
    }
}

/// `(x - mean) / sqrt(var + epsilon) * scale + bias` over the axes from
/// `axis` on; mean and (biased) variance accumulate in f64.
pub(super) fn layer_norm(axis: usize, epsilon: f32, inputs: &[&Tensor]) -> Result<Data, IrError> {
    let shape = inputs[0].shape();
    let normalized = &shape[axis..];
    let kernel = LayerNormKernel {
        groups: shape[..axis].iter().product(),
        size: normalized.iter().product(),
        epsilon: epsilon as f64,
        scale_at: broadcast_offsets(inputs[1].shape(), normalized),
        bias_at: inputs
            .get(2)
            .map(|b| broadcast_offsets(b.shape(), normalized)),
    };
    run_float("layer_norm", inputs, &kernel)
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::Op;

    #[test]
    fn normalizes_each_row() {
        let x = f32s(&[2, 2], &[1.0, 3.0, 10.0, 10.0]);
        let scale = f32s(&[2], &[1.0, 2.0]);
        let bias = f32s(&[2], &[0.5, 0.0]);
        let op = Op::LayerNorm {
            axis: 1,
            epsilon: 0.0,
        };
        let y = eval(&op, &[&x, &scale, &bias]).unwrap();
        // Row 0: mean 2, std 1 -> [-1, 1] * [1, 2] + [0.5, 0].
        // Row 1: zero variance with epsilon 0 gives NaN (0/0), as ONNX would.
        let v = y.to_f64_vec();
        assert_eq!(&v[..2], &[-0.5, 2.0]);
        assert!(v[2].is_nan() && v[3].is_nan());
    }
}
