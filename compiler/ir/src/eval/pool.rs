//! Pooling: MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool (NCHW).
//!
//! MaxPool ignores padded positions. AveragePool divides by the number of
//! window positions inside the input (`count_include_pad = false`) or inside
//! the padded input (`true`); with `ceil_mode`, positions past the
//! bottom/right padding are never counted. Sums accumulate in f64.

use super::{run_float, Float, FloatKernel};
use crate::{Data, IrError, Pool2d, Tensor, ValueType};

/// One pooling window over an `h x w` plane.
struct Window {
    /// Offsets (`y * w + x`) of the window positions inside the input.
    taps: Vec<usize>,
    /// Number of window positions inside the padded input.
    padded: usize,
}

/// The windows of every output position, row-major.
fn windows(p: &Pool2d, h: usize, w: usize, oh: usize, ow: usize) -> Vec<Window> {
    let [kh, kw] = p.kernel;
    let [sh, sw] = p.strides;
    let [dh, dw] = p.dilations;
    let [pt, pl, pb, pr] = p.pads;
    let mut out = Vec::with_capacity(oh * ow);
    for oy in 0..oh {
        for ox in 0..ow {
            let mut win = Window {
                taps: Vec::with_capacity(kh * kw),
                padded: 0,
            };
            for ky in 0..kh {
                // Row in padded coordinates (the padded input starts at 0).
                let py = oy * sh + ky * dh;
                for kx in 0..kw {
                    let px = ox * sw + kx * dw;
                    if py < pt + h + pb && px < pl + w + pr {
                        win.padded += 1;
                    }
                    if (pt..pt + h).contains(&py) && (pl..pl + w).contains(&px) {
                        win.taps.push((py - pt) * w + (px - pl));
                    }
                }
            }
            out.push(win);
        }
    }
    out
}

struct PoolKernel {
    windows: Vec<Window>,
    /// `n * c`.
    planes: usize,
    /// `h * w`.
    plane: usize,
    /// `None` for max pooling, else whether pads count in the divisor.
    average: Option<bool>,
}

impl FloatKernel for PoolKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let x = inputs[0];
        let mut out = Vec::with_capacity(self.planes * self.windows.len());
        for p in 0..self.planes {
            let plane = &x[p * self.plane..(p + 1) * self.plane];
            for win in &self.windows {
                let taps = win.taps.iter().map(|&i| plane[i]);
                out.push(match self.average {
                    None => taps.fold(T::NEG_INFINITY, |m, v| if v > m { v } else { m }),
                    Some(include_pad) => {
                        let sum: f64 = taps.map(Float::to_f64).sum();
                        let count = if include_pad {
                            win.padded
                        } else {
                            win.taps.len()
                        };
                        T::from_f64(sum / count as f64)
                    }
                });
            }
        }
        out
    }
}

fn pool(p: &Pool2d, average: Option<bool>, x: &Tensor, out: &ValueType) -> Result<Data, IrError> {
    let s = x.shape();
    let (h, w) = (s[2], s[3]);
    let kernel = PoolKernel {
        windows: windows(p, h, w, out.shape[2], out.shape[3]),
        planes: s[0] * s[1],
        plane: h * w,
        average,
    };
    let name = if average.is_some() {
        "average_pool"
    } else {
        "max_pool"
    };
    run_float(name, &[x], &kernel)
}

/// Max pooling; padded positions are ignored.
pub(super) fn max_pool(p: &Pool2d, x: &Tensor, out: &ValueType) -> Result<Data, IrError> {
    pool(p, None, x, out)
}

/// Average pooling.
pub(super) fn average_pool(
    p: &Pool2d,
    count_include_pad: bool,
    x: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    pool(p, Some(count_include_pad), x, out)
}

struct GlobalKernel {
    max: bool,
    /// Elements per (n, c) plane.
    inner: usize,
}

impl FloatKernel for GlobalKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        inputs[0]
            .chunks_exact(self.inner)
            .map(|plane| {
                if self.max {
                    plane
                        .iter()
                        .fold(T::NEG_INFINITY, |m, &v| if v > m { v } else { m })
                } else {
                    let sum: f64 = plane.iter().map(|v| v.to_f64()).sum();
                    T::from_f64(sum / self.inner as f64)
                }
            })
            .collect()
    }
}

/// Global max (`max = true`) or average pooling over all spatial dims.
pub(super) fn global_pool(max: bool, x: &Tensor) -> Result<Data, IrError> {
    let inner: usize = x.shape()[2..].iter().product();
    if inner == 0 {
        // No spatial positions: the output is empty too unless n * c > 0,
        // where ONNX leaves the value undefined; use NaN / -inf like numpy.
        let planes = x.shape()[0] * x.shape()[1];
        let v = if max { f64::NEG_INFINITY } else { f64::NAN };
        return Ok(Data::from_f64s(x.dtype(), std::iter::repeat_n(v, planes)));
    }
    let name = if max {
        "global_max_pool"
    } else {
        "global_average_pool"
    };
    run_float(name, &[x], &GlobalKernel { max, inner })
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{Op, Pool2d};

    fn window(kernel: usize, stride: usize, pads: [usize; 4], ceil_mode: bool) -> Pool2d {
        Pool2d {
            kernel: [kernel; 2],
            strides: [stride; 2],
            pads,
            dilations: [1, 1],
            ceil_mode,
        }
    }

    fn avg(pool: Pool2d, count_include_pad: bool) -> Op {
        Op::AveragePool {
            pool,
            count_include_pad,
        }
    }

    #[test]
    fn max_pool_ignores_pads() {
        // x = -(0..9) on 3x3; all values are <= 0, so a zero pad would win.
        let x = f32s(
            &[1, 1, 3, 3],
            &(0..9).map(|i| -(i as f32)).collect::<Vec<_>>(),
        );
        let y = eval(&Op::MaxPool(window(3, 1, [1; 4], false)), &[&x]).unwrap();
        assert_close(
            &y,
            &[1, 1, 3, 3],
            &[0., 0., -1., 0., 0., -1., -3., -3., -4.],
        );
    }

    #[test]
    fn max_pool_stride_2_two_channels() {
        let x = iota(&[1, 2, 2, 4]);
        let y = eval(&Op::MaxPool(window(2, 2, [0; 4], false)), &[&x]).unwrap();
        assert_close(&y, &[1, 2, 1, 2], &[5., 7., 13., 15.]);
    }

    #[test]
    fn average_pool_count_include_pad_both_ways() {
        let x = f32s(&[1, 1, 2, 2], &[1., 2., 3., 4.]);
        let p = window(2, 1, [1; 4], false);
        let y = eval(&avg(p.clone(), true), &[&x]).unwrap();
        #[rustfmt::skip]
        let included = [0.25, 0.75, 0.5, 1.0, 2.5, 1.5, 0.75, 1.75, 1.0];
        assert_close(&y, &[1, 1, 3, 3], &included);
        let y = eval(&avg(p, false), &[&x]).unwrap();
        assert_close(&y, &[1, 1, 3, 3], &[1., 1.5, 2., 2., 2.5, 3., 3., 3.5, 4.]);
    }

    #[test]
    fn ceil_mode_without_pads() {
        // x[r,c] = 3r + c on 3x3; 2x2 windows, stride 2, ceil mode: the
        // last row/column windows hang off the input and count only what
        // they cover, with or without count_include_pad.
        let x = iota(&[1, 1, 3, 3]);
        for include in [false, true] {
            let y = eval(&avg(window(2, 2, [0; 4], true), include), &[&x]).unwrap();
            assert_close(&y, &[1, 1, 2, 2], &[2., 3.5, 6.5, 8.]);
        }
    }

    #[test]
    fn ceil_mode_with_top_left_pads() {
        // x[r,c] = 4r + c on 4x4; 2x2 windows, stride 2, pads top/left 1,
        // ceil mode. Per axis the windows cover rows {pad,0}, {1,2}, {3,past}.
        let x = iota(&[1, 1, 4, 4]);
        let p = window(2, 2, [1, 1, 0, 0], true);
        let y = eval(&avg(p.clone(), true), &[&x]).unwrap();
        #[rustfmt::skip]
        let included = [0., 0.75, 1.5, 3., 7.5, 9., 6., 13.5, 15.];
        assert_close(&y, &[1, 1, 3, 3], &included);
        let y = eval(&avg(p.clone(), false), &[&x]).unwrap();
        #[rustfmt::skip]
        let excluded = [0., 1.5, 3., 6., 7.5, 9., 12., 13.5, 15.];
        assert_close(&y, &[1, 1, 3, 3], &excluded);
        let y = eval(&Op::MaxPool(p), &[&x]).unwrap();
        assert_close(
            &y,
            &[1, 1, 3, 3],
            &[0., 2., 3., 8., 10., 11., 12., 14., 15.],
        );
    }

    #[test]
    fn max_pool_dilation() {
        // x[r,c] = 4r + c on 4x4; 2x2 kernel, dilation 2 reads (r, r+2) x (c, c+2).
        let x = iota(&[1, 1, 4, 4]);
        let mut p = window(2, 1, [0; 4], false);
        p.dilations = [2, 2];
        let y = eval(&Op::MaxPool(p), &[&x]).unwrap();
        assert_close(&y, &[1, 1, 2, 2], &[10., 11., 14., 15.]);
    }

    #[test]
    fn global_pools() {
        let x = f32s(&[1, 2, 2, 2], &[1., 2., 3., 4., 10., 20., 30., 40.]);
        let y = eval(&Op::GlobalAveragePool, &[&x]).unwrap();
        assert_close(&y, &[1, 2, 1, 1], &[2.5, 25.]);
        let y = eval(&Op::GlobalMaxPool, &[&x]).unwrap();
        assert_close(&y, &[1, 2, 1, 1], &[4., 40.]);
        // Rank 3 input.
        let x = f32s(&[1, 1, 3], &[-1., -5., -2.]);
        let y = eval(&Op::GlobalMaxPool, &[&x]).unwrap();
        assert_close(&y, &[1, 1, 1], &[-1.]);
    }
}
