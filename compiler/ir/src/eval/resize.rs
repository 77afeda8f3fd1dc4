//! Resize (interpolation per axis) and Col2Im (scatter-add of blocks).

use super::{run_float, Float, FloatKernel};
use crate::op::{Col2Im, Resize, ResizeTaps};
use crate::{Data, IrError, Tensor};

struct ResizeKernel {
    in_shape: Vec<usize>,
    out_shape: Vec<usize>,
    /// Per axis, the taps of every output index (`None`: the identity).
    taps: Vec<Option<Vec<ResizeTaps>>>,
}

impl FloatKernel for ResizeKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        // Resampling is separable: resize one axis at a time, in f64.
        let mut shape = self.in_shape.clone();
        let mut values: Vec<f64> = super::widened(inputs[0]);
        for (axis, taps) in self.taps.iter().enumerate() {
            let Some(taps) = taps else { continue };
            let outer: usize = shape[..axis].iter().product();
            let inner: usize = shape[axis + 1..].iter().product();
            let (n_in, n_out) = (shape[axis], self.out_shape[axis]);
            let mut next = vec![0.0; outer * n_out * inner];
            for o in 0..outer {
                for (j, row) in taps.iter().enumerate() {
                    let dst = (o * n_out + j) * inner;
                    for &(src, w) in row {
                        let src = (o * n_in + src) * inner;
                        for i in 0..inner {
                            next[dst + i] += w as f64 * values[src + i];
                        }
                    }
                }
            }
            shape[axis] = n_out;
            values = next;
        }
        values.into_iter().map(T::from_f64).collect()
    }
}

/// Resamples every axis with the taps of [`Resize::taps`].
pub(super) fn resize(r: &Resize, x: &Tensor) -> Result<Data, IrError> {
    let in_shape = x.shape().to_vec();
    let taps = in_shape
        .iter()
        .enumerate()
        .map(|(axis, &n)| r.resampled_taps(axis, n))
        .collect();
    let kernel = ResizeKernel {
        in_shape,
        out_shape: r.shape.to_vec(),
        taps,
    };
    run_float("resize", &[x], &kernel)
}

struct Col2ImKernel {
    batch: usize,
    channels: usize,
    c: Col2Im,
}

impl FloatKernel for Col2ImKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let x = inputs[0];
        let c = &self.c;
        let [gh, gw] = c.grid;
        let [oh, ow] = c.image;
        let [kh, kw] = c.block;
        let mut out = vec![0.0f64; self.batch * self.channels * oh * ow];
        for n in 0..self.batch {
            for ch in 0..self.channels {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let row = ((n * self.channels + ch) * kh + ky) * kw + kx;
                        for iy in 0..gh {
                            let y =
                                (iy * c.strides[0] + ky * c.dilations[0]) as i64 - c.pads[0] as i64;
                            if !(0..oh as i64).contains(&y) {
                                continue;
                            }
                            for ix in 0..gw {
                                let xx = (ix * c.strides[1] + kx * c.dilations[1]) as i64
                                    - c.pads[1] as i64;
                                if !(0..ow as i64).contains(&xx) {
                                    continue;
                                }
                                let dst =
                                    ((n * self.channels + ch) * oh + y as usize) * ow + xx as usize;
                                out[dst] += x[row * gh * gw + iy * gw + ix].to_f64();
                            }
                        }
                    }
                }
            }
        }
        out.into_iter().map(T::from_f64).collect()
    }
}

/// Adds every block element into its output pixel (f64 accumulation).
pub(super) fn col2im(c: &Col2Im, x: &Tensor) -> Result<Data, IrError> {
    let s = x.shape();
    let kernel = Col2ImKernel {
        batch: s[0],
        channels: s[1] / (c.block[0] * c.block[1]),
        c: c.clone(),
    };
    run_float("col2im", &[x], &kernel)
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::op::{Col2Im, CoordinateTransform, NearestRounding, Resize, ResizeMode};
    use crate::Op;
    use smallvec::smallvec;

    fn resize(mode: ResizeMode, coord: CoordinateTransform, out: usize, scale: f32) -> Op {
        Op::Resize(Resize {
            shape: smallvec![1, out],
            scales: smallvec![1.0, scale],
            mode,
            coord,
            antialias: false,
            roi: Default::default(),
        })
    }

    #[test]
    fn nearest_upsample_repeats() {
        let x = f32s(&[1, 2], &[1.0, 2.0]);
        let op = resize(
            ResizeMode::Nearest(NearestRounding::RoundPreferFloor),
            CoordinateTransform::Asymmetric,
            4,
            2.0,
        );
        let y = eval(&op, &[&x]).unwrap();
        assert_close(&y, &[1, 4], &[1.0, 1.0, 2.0, 2.0]);
    }

    #[test]
    fn linear_half_pixel_matches_onnx() {
        // onnx backend test resize_upsample_scales_linear, first row:
        // [1, 2] -> [1, 1.25, 1.75, 2].
        let x = f32s(&[1, 2], &[1.0, 2.0]);
        let op = resize(ResizeMode::Linear, CoordinateTransform::HalfPixel, 4, 2.0);
        let y = eval(&op, &[&x]).unwrap();
        assert_close(&y, &[1, 4], &[1.0, 1.25, 1.75, 2.0]);
    }

    #[test]
    fn linear_align_corners() {
        let x = f32s(&[1, 2], &[1.0, 2.0]);
        let op = resize(
            ResizeMode::Linear,
            CoordinateTransform::AlignCorners,
            3,
            1.5,
        );
        let y = eval(&op, &[&x]).unwrap();
        assert_close(&y, &[1, 3], &[1.0, 1.5, 2.0]);
    }

    #[test]
    fn col2im_overlapping_blocks_add() {
        // One channel, 1x2 blocks on a 1x2 grid with stride 1: the middle
        // pixel receives two contributions.
        let x = f32s(&[1, 2, 2], &[1.0, 2.0, 10.0, 20.0]);
        let op = Op::Col2Im(Col2Im {
            grid: [1, 2],
            image: [1, 3],
            block: [1, 2],
            strides: [1, 1],
            dilations: [1, 1],
            pads: [0, 0],
        });
        let y = eval(&op, &[&x]).unwrap();
        assert_close(&y, &[1, 1, 1, 3], &[1.0, 12.0, 20.0]);
    }
}
