//! Data movement and conversion: Reshape, Transpose, Concat, Gather, Slice,
//! Expand, Cast. These work for every element type.

use super::{eval_err, gather_elems, strided_offsets, Elem};
use crate::infer::strides_of;
use crate::{with_data, DType, Data, IrError, SliceAxis, Tensor, ValueType};

/// The same elements under the output shape (shares the storage).
pub(super) fn reshape(x: &Tensor, out: &ValueType) -> Result<Tensor, IrError> {
    x.reshaped(&out.shape)
        .ok_or_else(|| eval_err("reshape", format!("cannot reshape to {out}")))
}

/// ONNX Cast: float to int truncates toward zero (saturating), anything to
/// bool is `!= 0`.
pub(super) fn cast(x: &Tensor, to: DType) -> Tensor {
    x.cast(to)
}

/// Output axis `i` is input axis `perm[i]`.
pub(super) fn transpose(perm: &[usize], x: &Tensor, out: &ValueType) -> Data {
    let in_strides = strides_of(x.shape());
    let strides: Vec<isize> = perm.iter().map(|&p| in_strides[p] as isize).collect();
    let idx = strided_offsets(&out.shape, 0, &strides);
    with_data!(x.data(), v => gather_elems(v, &idx))
}

/// numpy broadcast to the output shape.
pub(super) fn expand(x: &Tensor, out: &ValueType) -> Data {
    let idx = super::broadcast_offsets(x.shape(), &out.shape);
    with_data!(x.data(), v => gather_elems(v, &idx))
}

/// Output element `i` reads input index `start + i * step` on every axis.
pub(super) fn slice(axes: &[SliceAxis], x: &Tensor, out: &ValueType) -> Data {
    let in_strides = strides_of(x.shape());
    let base: usize = axes.iter().zip(&in_strides).map(|(a, s)| a.start * s).sum();
    let strides: Vec<isize> = axes
        .iter()
        .zip(&in_strides)
        .map(|(a, &s)| a.step as isize * s as isize)
        .collect();
    let idx = strided_offsets(&out.shape, base, &strides);
    with_data!(x.data(), v => gather_elems(v, &idx))
}

/// The coordinates of `x`'s non-zero elements (NaN counts), one column
/// each in row-major order, then zero columns up to the element count.
pub(super) fn non_zero(x: &Tensor) -> Data {
    let (shape, n) = (x.shape(), x.len());
    let strides = strides_of(shape);
    let mut out = vec![0i64; shape.len() * n];
    let hits = (0..n).filter(|&i| x.data().get_f64(i) != 0.0);
    for (column, flat) in hits.enumerate() {
        for (axis, (&dim, &stride)) in shape.iter().zip(&strides).enumerate() {
            out[axis * n + column] = ((flat / stride) % dim) as i64;
        }
    }
    Data::I64(out)
}

/// `NonMaxSuppression`'s selected rows at their bound, then the count
/// (`Op::NonMaxSuppression`).
pub(super) fn non_max_suppression(n: &crate::Nms, inputs: &[&Tensor]) -> Data {
    let [boxes, scores, cap, iou, score] = inputs else {
        unreachable!("inference checked five inputs")
    };
    let (b, s) = (boxes.shape(), scores.shape());
    let nms = n.at(
        [b[0], s[1], b[1]],
        cap.to_i64_vec()[0],
        iou.to_f32_vec()[0],
        score.to_f32_vec()[0],
    );
    let mut out = vec![0i64; (nms.bound() + 1) * 3];
    let mut scratch = vec![0u32; nms.scratch_len()];
    let (rows, count) = out.split_at_mut(nms.bound() * 3);
    let selected = nms.select(
        &boxes.to_f32_vec(),
        &scores.to_f32_vec(),
        &mut scratch,
        rows,
    );
    count.fill(selected as i64);
    Data::I64(out)
}

/// `Unique`'s plan over keys `[outer, n, inner]` (`Op::Unique`).
pub(super) fn unique(sorted: bool, keys: &Tensor) -> Data {
    let s = keys.shape();
    let u = kiln_host::Unique {
        outer: s[0],
        n: s[1],
        inner: s[2],
        sorted,
    };
    let mut out = vec![0i64; u.out_len()];
    let mut scratch = vec![0u32; u.scratch_len()];
    let keys = match keys.data() {
        Data::F64(v) => kiln_host::Keys::Float(v),
        Data::I64(v) => kiln_host::Keys::Int(v),
        _ => unreachable!("inference checked f64 or i64 keys"),
    };
    u.select(keys, &mut scratch, &mut out);
    Data::I64(out)
}

/// `x` itself, once `length` is checked to be a position count along
/// `axis` (a run whose data-dependent size exceeds its bound is an error).
pub(super) fn with_length(axis: usize, x: &Tensor, length: &Tensor) -> Result<Tensor, IrError> {
    let bound = x.shape()[axis];
    match length.to_i64_vec().first() {
        Some(&n) if (0..=bound as i64).contains(&n) => Ok(x.clone()),
        n => Err(eval_err(
            "with_length",
            format!("a data-dependent length of {n:?} along axis {axis}, whose bound is {bound}"),
        )),
    }
}

/// Concatenation along `axis` (inputs share their type, checked by
/// inference).
pub(super) fn concat(axis: usize, inputs: &[&Tensor]) -> Result<Data, IrError> {
    fn typed<T: Elem>(_first: &[T], axis: usize, inputs: &[&Tensor]) -> Result<Data, IrError> {
        let parts = inputs
            .iter()
            .map(|t| T::slice(t.data()))
            .collect::<Option<Vec<&[T]>>>()
            .ok_or_else(|| eval_err("concat", "inputs have different element types"))?;
        let shape = inputs[0].shape();
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for o in 0..outer {
            for (part, t) in parts.iter().zip(inputs) {
                let chunk = t.shape()[axis] * inner;
                out.extend_from_slice(&part[o * chunk..(o + 1) * chunk]);
            }
        }
        Ok(T::wrap(out))
    }
    with_data!(inputs[0].data(), v => typed(v, axis, inputs))
}

/// Gather along `axis`: the output is `x.shape[..axis] ++ indices.shape ++
/// x.shape[axis+1..]`. Negative indices count from the end; an index out of
/// range is an error.
pub(super) fn gather(axis: usize, x: &Tensor, indices: &Tensor) -> Result<Data, IrError> {
    let shape = x.shape();
    let dim = shape[axis];
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    let picks = indices
        .to_i64_vec()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + dim as i64 } else { i };
            if (0..dim as i64).contains(&j) {
                Ok(j as usize)
            } else {
                Err(eval_err(
                    "gather",
                    format!("index {i} out of range for axis {axis} of size {dim}"),
                ))
            }
        })
        .collect::<Result<Vec<usize>, IrError>>()?;
    let mut idx = Vec::with_capacity(outer * picks.len() * inner);
    for o in 0..outer {
        for &p in &picks {
            let start = (o * dim + p) * inner;
            idx.extend(start..start + inner);
        }
    }
    Ok(with_data!(x.data(), v => gather_elems(v, &idx)))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{DType, Data, Ints, IrError, Op, SliceAxis, Tensor};

    #[test]
    fn reshape_keeps_elements() {
        let x = iota(&[2, 3]);
        let y = eval(
            &Op::Reshape {
                shape: Ints::from_slice(&[3, 1, 2]),
            },
            &[&x],
        )
        .unwrap();
        assert_close(&y, &[3, 1, 2], &[0., 1., 2., 3., 4., 5.]);
    }

    #[test]
    fn transpose_2d_and_3d() {
        let x = iota(&[2, 3]);
        let y = eval(
            &Op::Transpose {
                perm: Ints::from_slice(&[1, 0]),
            },
            &[&x],
        )
        .unwrap();
        assert_close(&y, &[3, 2], &[0., 3., 1., 4., 2., 5.]);
        // x[a,b,c] = 4a + 2b + c on [2,2,2]; perm [2,0,1]: y[c,a,b] = x[a,b,c].
        let x = Tensor::new([2, 2, 2], Data::I32((0..8).collect())).unwrap();
        let y = eval(
            &Op::Transpose {
                perm: Ints::from_slice(&[2, 0, 1]),
            },
            &[&x],
        )
        .unwrap();
        assert_eq!(y.shape().as_slice(), &[2, 2, 2]);
        assert_eq!(y.data(), &Data::I32(vec![0, 2, 4, 6, 1, 3, 5, 7]));
    }

    #[test]
    fn concat_axis_0_and_1() {
        let a = iota(&[2, 2]);
        let b = f32s(&[2, 1], &[10., 11.]);
        let y = eval(&Op::Concat { axis: 1 }, &[&a, &b]).unwrap();
        assert_close(&y, &[2, 3], &[0., 1., 10., 2., 3., 11.]);
        let c = f32s(&[1, 2], &[7., 8.]);
        let y = eval(&Op::Concat { axis: 0 }, &[&a, &c, &a]).unwrap();
        assert_close(&y, &[5, 2], &[0., 1., 2., 3., 7., 8., 0., 1., 2., 3.]);
        let s = i64s(&[2], &[1, 2]);
        let t = i64s(&[1], &[-1]);
        let y = eval(&Op::Concat { axis: 0 }, &[&s, &t]).unwrap();
        assert_eq!(y.to_i64_vec(), vec![1, 2, -1]);
    }

    #[test]
    fn non_zero_then_zero_columns_and_with_length_checks_the_length() {
        let x = f32s(&[2, 3], &[0., 5., 0., f32::NAN, 0., -0.]);
        let y = eval(&Op::NonZero, &[&x]).unwrap();
        assert_eq!(y.shape().as_slice(), &[2, 6]);
        // Hits at (0,1) and (1,0); the other columns are zeros.
        assert_eq!(y.to_i64_vec(), vec![0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]);
        let marked = Op::WithLength { axis: 1 };
        for (length, ok) in [(0, true), (2, true), (6, true), (7, false), (-1, false)] {
            let n = Tensor::new([], Data::I64(vec![length])).unwrap();
            assert_eq!(eval(&marked, &[&y, &n]).is_ok(), ok, "length {length}");
        }
        // The length must be an i64 scalar.
        let n = i64s(&[1], &[2]);
        assert!(eval(&marked, &[&y, &n]).is_err());
    }

    #[test]
    fn gather_with_negative_index() {
        // x[r,c] = 3r + c on [3,3].
        let x = iota(&[3, 3]);
        let idx = i64s(&[2], &[2, -3]);
        let y = eval(&Op::Gather { axis: 0 }, &[&x, &idx]).unwrap();
        assert_close(&y, &[2, 3], &[6., 7., 8., 0., 1., 2.]);
        let idx = Tensor::new([2, 1], Data::I32(vec![-1, 1])).unwrap();
        let y = eval(&Op::Gather { axis: 1 }, &[&x, &idx]).unwrap();
        assert_close(&y, &[3, 2, 1], &[2., 1., 5., 4., 8., 7.]);
        // A scalar index drops the axis.
        let idx = i64s(&[], &[1]);
        let y = eval(&Op::Gather { axis: 0 }, &[&x, &idx]).unwrap();
        assert_close(&y, &[3], &[3., 4., 5.]);
    }

    #[test]
    fn gather_out_of_range_is_an_error() {
        let x = iota(&[3]);
        for bad in [3, -4] {
            let idx = i64s(&[1], &[bad]);
            let e = eval(&Op::Gather { axis: 0 }, &[&x, &idx]).unwrap_err();
            assert!(matches!(e, IrError::Eval { op: "gather", .. }), "{e:?}");
        }
    }

    #[test]
    fn slice_with_negative_step() {
        // x[r,c] = 4r + c on [3,4]: rows 2, 0 (step -2), columns 1..3.
        let x = iota(&[3, 4]);
        let axes = [
            SliceAxis {
                start: 2,
                step: -2,
                len: 2,
            },
            SliceAxis {
                start: 1,
                step: 1,
                len: 2,
            },
        ];
        let y = eval(
            &Op::Slice {
                axes: axes.into_iter().collect(),
            },
            &[&x],
        )
        .unwrap();
        assert_close(&y, &[2, 2], &[9., 10., 1., 2.]);
        // Full reversal of a bool vector.
        let b = Tensor::new([3], Data::Bool(vec![true, false, false])).unwrap();
        let axes = [SliceAxis {
            start: 2,
            step: -1,
            len: 3,
        }];
        let y = eval(
            &Op::Slice {
                axes: axes.into_iter().collect(),
            },
            &[&b],
        )
        .unwrap();
        assert_eq!(y.data(), &Data::Bool(vec![false, false, true]));
    }

    #[test]
    fn cast_truncates_floats_and_maps_ints_to_bool() {
        let x = f32s(&[4], &[1.9, -1.9, 0.5, -0.0]);
        let y = eval(&Op::Cast { to: DType::I32 }, &[&x]).unwrap();
        assert_eq!(y.data(), &Data::I32(vec![1, -1, 0, 0]));
        let x = i64s(&[3], &[0, 5, -2]);
        let y = eval(&Op::Cast { to: DType::Bool }, &[&x]).unwrap();
        assert_eq!(y.data(), &Data::Bool(vec![false, true, true]));
        let y = eval(&Op::Cast { to: DType::F32 }, &[&x]).unwrap();
        assert_eq!(y.data(), &Data::F32(vec![0., 5., -2.]));
    }
}
