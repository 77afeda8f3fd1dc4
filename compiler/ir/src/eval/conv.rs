//! 2-D convolution (ONNX Conv: cross-correlation, NCHW input, OIHW weights,
//! groups, pads `[top, left, bottom, right]`, strides, dilations).

use super::{run_dense, widened, Float, FloatKernel};
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
    /// One output row at a time: every pixel of the row starts at the bias
    /// and takes its terms in (input channel, kernel row, kernel column)
    /// order, as a per-pixel loop would, the padding skipped; the loop
    /// over the row's pixels vectorizes without changing a sum.
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let (x, w, bias) = (widened(inputs[0]), widened(inputs[1]), inputs.get(2));
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
        // Per kernel column, the output pixels whose input column lies
        // inside the row: `0 <= ox * sw + kx * dw - pl < wd`.
        let columns: Vec<(usize, usize)> = (0..kw)
            .map(|kx| {
                let shift = kx * dw;
                let lo = pl.saturating_sub(shift).div_ceil(sw);
                let hi = match (wd + pl).checked_sub(shift + 1) {
                    Some(last) => (last / sw + 1).min(ow),
                    None => 0,
                };
                (lo, hi.max(lo))
            })
            .collect();
        let mut out = vec![T::from_f64(0.0); n * m * oh * ow];
        if out.is_empty() {
            return out;
        }
        // Output channels of a group in blocks, so one pass over an input
        // row feeds the rows of all the block's channels.
        let mut rows = vec![0f64; OC_BLOCK * ow];
        for b in 0..n {
            for g in 0..group {
                let channels = g * m_per_group..(g + 1) * m_per_group;
                for oc0 in channels.clone().step_by(OC_BLOCK) {
                    let block = OC_BLOCK.min(channels.end - oc0);
                    for oy in 0..oh {
                        for (j, row) in rows.chunks_exact_mut(ow).take(block).enumerate() {
                            row.fill(bias.map_or(0.0, |bias| bias[oc0 + j].to_f64()));
                        }
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
                                let x_row = &x[((b * c + cin) * h + iy) * wd..][..wd];
                                for (kx, &(lo, hi)) in columns.iter().enumerate() {
                                    if lo == hi {
                                        continue;
                                    }
                                    let tap =
                                        |j: usize| w[(((oc0 + j) * cg + ic) * kh + ky) * kw + kx];
                                    let first = lo * sw + kx * dw - pl;
                                    if block == OC_BLOCK && sw == 1 {
                                        let xs = &x_row[first..first + (hi - lo)];
                                        let (w0, w1, w2, w3) = (tap(0), tap(1), tap(2), tap(3));
                                        let (r01, r23) = rows.split_at_mut(2 * ow);
                                        let (r0, r1) = r01.split_at_mut(ow);
                                        let (r2, r3) = r23.split_at_mut(ow);
                                        let lanes = xs
                                            .iter()
                                            .zip(&mut r0[lo..hi])
                                            .zip(&mut r1[lo..hi])
                                            .zip(&mut r2[lo..hi])
                                            .zip(&mut r3[lo..hi]);
                                        for ((((&xv, a), b), c), d) in lanes {
                                            *a += xv * w0;
                                            *b += xv * w1;
                                            *c += xv * w2;
                                            *d += xv * w3;
                                        }
                                        continue;
                                    }
                                    for (j, row) in
                                        rows.chunks_exact_mut(ow).take(block).enumerate()
                                    {
                                        let wv = tap(j);
                                        let xs = x_row[first..].iter().step_by(sw);
                                        for (r, &xv) in row[lo..hi].iter_mut().zip(xs) {
                                            *r += xv * wv;
                                        }
                                    }
                                }
                            }
                        }
                        for (j, row) in rows.chunks_exact(ow).take(block).enumerate() {
                            let at = ((b * m + oc0 + j) * oh + oy) * ow;
                            for (o, &v) in out[at..at + ow].iter_mut().zip(row) {
                                *o = T::from_f64(v);
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Output channels computed together by the reference convolution.
const OC_BLOCK: usize = 4;

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
