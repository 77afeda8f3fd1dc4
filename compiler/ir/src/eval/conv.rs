//! 2-D convolution (ONNX Conv: cross-correlation, NCHW input, OIHW weights,
//! groups, pads `[top, left, bottom, right]`, strides, dilations).

use super::{run_dense, Float, FloatKernel};
use crate::{Conv2d, Data, IrError, Tensor, ValueType};

struct ConvKernel<'a> {
    attrs: &'a Conv2d,
    /// X shape `[n, c, h, w]`.
    x: [usize; 4],
    /// W shape `[m, c / group, kh, kw]`.
    w: [usize; 4],
    /// Output spatial size.
    out_hw: [usize; 2],
}

impl FloatKernel for ConvKernel<'_> {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let (x, w, bias) = (inputs[0], inputs[1], inputs.get(2));
        let [n, c, h, wd] = self.x;
        let [m, cg, kh, kw] = self.w;
        let [oh, ow] = self.out_hw;
        let Conv2d {
            strides: [sh, sw],
            pads: [pt, pl, _, _],
            dilations: [dh, dw],
            group,
        } = *self.attrs;
        let m_per_group = m / group;
        let mut out = Vec::with_capacity(n * m * oh * ow);
        for b in 0..n {
            for oc in 0..m {
                let g = oc / m_per_group;
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = bias.map_or(0.0, |bias| bias[oc].to_f64());
                        for ic in 0..cg {
                            let cin = g * cg + ic;
                            for ky in 0..kh {
                                // Input row, skipping the zero padding.
                                let Some(iy) = (oy * sh + ky * dh).checked_sub(pt) else {
                                    continue;
                                };
                                if iy >= h {
                                    continue;
                                }
                                for kx in 0..kw {
                                    let Some(ix) = (ox * sw + kx * dw).checked_sub(pl) else {
                                        continue;
                                    };
                                    if ix >= wd {
                                        continue;
                                    }
                                    let xv = x[((b * c + cin) * h + iy) * wd + ix];
                                    let wv = w[((oc * cg + ic) * kh + ky) * kw + kx];
                                    acc += xv.to_f64() * wv.to_f64();
                                }
                            }
                        }
                        out.push(T::from_f64(acc));
                    }
                }
            }
        }
        out
    }
}

/// Convolution of X by W plus the optional bias B; dot products accumulate
/// in f64.
pub(super) fn conv(attrs: &Conv2d, inputs: &[&Tensor], out: &ValueType) -> Result<Data, IrError> {
    let dims = |t: &Tensor| -> [usize; 4] {
        let s = t.shape();
        [s[0], s[1], s[2], s[3]]
    };
    let kernel = ConvKernel {
        attrs,
        x: dims(inputs[0]),
        w: dims(inputs[1]),
        out_hw: [out.shape[2], out.shape[3]],
    };
    run_dense("conv", inputs, out, &kernel)
}

/// `ConvInteger`: the convolution of the centred operands in f64 (exact:
/// every term is below 2^16 and sums stay far below 2^53), then wrapped to
/// i32.
pub(super) fn conv_integer(
    attrs: &Conv2d,
    inputs: &[&Tensor],
    out: &ValueType,
) -> Result<Data, IrError> {
    let (x, w) = (inputs[0], inputs[1]);
    let xz = inputs[2].to_i64_vec()[0];
    let wz = inputs[3].to_i64_vec();
    let per_oc = w.shape().iter().product::<usize>() / w.shape()[0].max(1);
    let xc = Data::F64(x.to_i64_vec().iter().map(|&v| (v - xz) as f64).collect());
    let wc = Data::F64(
        (w.to_i64_vec().iter().enumerate())
            .map(|(i, &v)| (v - wz[if wz.len() == 1 { 0 } else { i / per_oc }]) as f64)
            .collect(),
    );
    let sized = |t: &Tensor, d: Data| {
        Tensor::new(t.shape(), d)
            .ok_or_else(|| super::eval_err("conv_integer", "operand size does not match its shape"))
    };
    let (xc, wc) = (sized(x, xc)?, sized(w, wc)?);
    let wide = ValueType::new(crate::DType::F64, out.shape.clone());
    let Data::F64(v) = conv(attrs, &[&xc, &wc], &wide)? else {
        unreachable!("an f64 convolution is f64")
    };
    Ok(Data::I32(v.into_iter().map(|x| x as i64 as i32).collect()))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{Conv2d, Op};

    fn conv(strides: [usize; 2], pads: [usize; 4], dilations: [usize; 2], group: usize) -> Op {
        Op::Conv(Conv2d {
            strides,
            pads,
            dilations,
            group,
        })
    }

    #[test]
    fn conv_1x1_with_bias() {
        let x = f32s(&[1, 2, 2, 2], &[1., 2., 3., 4., 10., 20., 30., 40.]);
        let w = f32s(&[3, 2, 1, 1], &[1., 0., 0., 1., 1., -1.]);
        let b = f32s(&[3], &[0., 0., 5.]);
        let y = eval(&conv([1, 1], [0; 4], [1, 1], 1), &[&x, &w, &b]).unwrap();
        #[rustfmt::skip]
        let expected = [1., 2., 3., 4., 10., 20., 30., 40., -4., -13., -22., -31.];
        assert_close(&y, &[1, 3, 2, 2], &expected);
    }

    #[test]
    fn conv_3x3_pad_1_on_ones_counts_neighbours() {
        let x = f32s(&[1, 1, 3, 3], &[1.0; 9]);
        let w = f32s(&[1, 1, 3, 3], &[1.0; 9]);
        let y = eval(&conv([1, 1], [1; 4], [1, 1], 1), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 1, 3, 3], &[4., 6., 4., 6., 9., 6., 4., 6., 4.]);
    }

    #[test]
    fn conv_asymmetric_pads() {
        // 1x3 ones input, 1x2 ones kernel, pad left 1 only: [1, 2, 2].
        let x = f32s(&[1, 1, 1, 3], &[1.0; 3]);
        let w = f32s(&[1, 1, 1, 2], &[1.0; 2]);
        let y = eval(&conv([1, 1], [0, 1, 0, 0], [1, 1], 1), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 1, 1, 3], &[1., 2., 2.]);
    }

    #[test]
    fn depthwise_conv() {
        let x = f32s(&[1, 2, 2, 2], &[1., 2., 3., 4., 10., 20., 30., 40.]);
        let w = f32s(&[2, 1, 2, 2], &[1., 1., 1., 1., 1., 0., 0., -1.]);
        let y = eval(&conv([1, 1], [0; 4], [1, 1], 2), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 2, 1, 1], &[10., -30.]);
    }

    #[test]
    fn grouped_conv_reads_its_own_channels() {
        // 4 input channels holding 1, 2, 3, 4; group 2; oc0 = ch0 + ch1,
        // oc1 = ch2 - ch3.
        let x = f32s(&[1, 4, 1, 1], &[1., 2., 3., 4.]);
        let w = f32s(&[2, 2, 1, 1], &[1., 1., 1., -1.]);
        let y = eval(&conv([1, 1], [0; 4], [1, 1], 2), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 2, 1, 1], &[3., -1.]);
    }

    #[test]
    fn conv_stride_2() {
        let x = iota(&[1, 1, 4, 4]);
        let w = f32s(&[1, 1, 2, 2], &[1.0; 4]);
        let y = eval(&conv([2, 2], [0; 4], [1, 1], 1), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 1, 2, 2], &[10., 18., 42., 50.]);
    }

    #[test]
    fn conv_dilation_2() {
        // x[i,j] = 5i + j; a 2x2 ones kernel with dilation 2 sums
        // x[i,j] + x[i,j+2] + x[i+2,j] + x[i+2,j+2] = 4 x[i,j] + 24.
        let x = iota(&[1, 1, 5, 5]);
        let w = f32s(&[1, 1, 2, 2], &[1.0; 4]);
        let y = eval(&conv([1, 1], [0; 4], [2, 2], 1), &[&x, &w]).unwrap();
        assert_close(
            &y,
            &[1, 1, 3, 3],
            &[24., 28., 32., 44., 48., 52., 64., 68., 72.],
        );
        // A 3x3 ones kernel with dilation 2 on the same input reads rows
        // and columns 0, 2, 4: 3 * (0 + 10 + 20) + 3 * (0 + 2 + 4) = 108.
        let w = f32s(&[1, 1, 3, 3], &[1.0; 9]);
        let y = eval(&conv([1, 1], [0; 4], [2, 2], 1), &[&x, &w]).unwrap();
        assert_close(&y, &[1, 1, 1, 1], &[108.]);
    }

    #[test]
    fn conv_batch_of_two() {
        let x = f32s(&[2, 1, 1, 1], &[3., -2.]);
        let w = f32s(&[1, 1, 1, 1], &[2.]);
        let b = f32s(&[1], &[1.]);
        let y = eval(&conv([1, 1], [0; 4], [1, 1], 1), &[&x, &w, &b]).unwrap();
        assert_close(&y, &[2, 1, 1, 1], &[7., -3.]);
    }
}
