//! Reductions over a set of axes.
//!
//! Floats are accumulated in f64 and rounded once (f16/bf16 as well);
//! integers in i64 with wrapping arithmetic. Max and Min propagate NaN.
//! An empty reduction gives the identity of the op: 0 for sums and norms,
//! 1 for Prod, -inf / +inf for Max / Min (the type's minimum / maximum for
//! integers), NaN for Mean and -inf for LogSum and LogSumExp.

use super::eval_err;
use crate::infer::strides_of;
use crate::{Data, IrError, ReduceOp, Tensor, ValueType};

/// For every output element, the flat input indices it reduces over.
fn groups(shape: &[usize], axes: &[usize]) -> Vec<Vec<usize>> {
    let strides = strides_of(shape);
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
    let out_n: usize = kept.iter().map(|&d| shape[d]).product();
    let mut out = vec![Vec::new(); out_n];
    let n: usize = shape.iter().product();
    for flat in 0..n {
        // Output index of input element `flat`: its kept coordinates, row-major.
        let mut o = 0;
        for &d in &kept {
            o = o * shape[d] + (flat / strides[d]) % shape[d];
        }
        out[o].push(flat);
    }
    out
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// Float reduction of `v` (already widened to f64).
pub(crate) fn reduce_f64(op: ReduceOp, v: &[f64]) -> f64 {
    let sum = |f: &dyn Fn(f64) -> f64| v.iter().map(|&x| f(x)).sum::<f64>();
    match op {
        ReduceOp::Sum => sum(&|x| x),
        ReduceOp::Mean => sum(&|x| x) / v.len() as f64,
        ReduceOp::Max => v.iter().fold(f64::NEG_INFINITY, |a, &x| max_nan(a, x)),
        ReduceOp::Min => v.iter().fold(f64::INFINITY, |a, &x| min_nan(a, x)),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::L1 => sum(&f64::abs),
        ReduceOp::L2 => sum(&|x| x * x).sqrt(),
        ReduceOp::LogSum => sum(&|x| x).ln(),
        ReduceOp::LogSumExp => {
            let m = v.iter().fold(f64::NEG_INFINITY, |a, &x| max_nan(a, x));
            if m.is_infinite() {
                // Empty, all -inf, or an +inf present: the naive form is exact.
                sum(&f64::exp).ln()
            } else {
                m + sum(&|x| (x - m).exp()).ln()
            }
        }
        ReduceOp::SumSquare => sum(&|x| x * x),
    }
}

/// Reduces `x` over `axes` to a value of type `out`.
pub(super) fn reduce(
    op: ReduceOp,
    axes: &[usize],
    x: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let groups = groups(x.shape(), axes);
    let d = x.data();
    if x.dtype().is_float() {
        let values = groups.iter().map(|g| {
            let v: Vec<f64> = g.iter().map(|&i| d.get_f64(i)).collect();
            reduce_f64(op, &v)
        });
        return Ok(Data::from_f64s(out.dtype, values));
    }
    if !x.dtype().is_int() || !op.accepts_int() {
        return Err(eval_err(
            op.name(),
            format!("unsupported element type {}", x.dtype()),
        ));
    }
    if x.dtype().is_unsigned() {
        let hi = uint_max(x.dtype());
        let values = groups.iter().map(|g| {
            let it = g.iter().map(|&i| d.get_u64(i));
            let v = match op {
                ReduceOp::Sum => it.fold(0u64, u64::wrapping_add),
                ReduceOp::Prod => it.fold(1u64, u64::wrapping_mul),
                ReduceOp::Max => it.fold(0, u64::max),
                ReduceOp::Min => it.fold(hi, u64::min),
                _ => unreachable!("checked by accepts_int"),
            };
            v as i64
        });
        return Ok(Data::from_i64s(out.dtype, values));
    }
    let (lo, hi) = int_range(x.dtype());
    let values = groups.iter().map(|g| {
        let it = g.iter().map(|&i| d.get_i64(i));
        match op {
            ReduceOp::Sum => it.fold(0i64, i64::wrapping_add),
            ReduceOp::Prod => it.fold(1i64, i64::wrapping_mul),
            ReduceOp::Max => it.fold(lo, i64::max),
            ReduceOp::Min => it.fold(hi, i64::min),
            _ => unreachable!("checked by accepts_int"),
        }
    });
    Ok(Data::from_i64s(out.dtype, values))
}

/// The largest value of an unsigned integer type.
fn uint_max(d: crate::DType) -> u64 {
    use crate::DType;
    match d {
        DType::U8 => u8::MAX as u64,
        DType::U16 => u16::MAX as u64,
        DType::U32 => u32::MAX as u64,
        _ => u64::MAX,
    }
}

/// The value range of a signed integer type (u8 too).
pub(crate) fn int_range(d: crate::DType) -> (i64, i64) {
    use crate::DType;
    match d {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        _ => (i64::MIN, i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{Data, Op, ReduceOp, Tensor};

    fn reduce(op: ReduceOp, axes: &[usize], keep_dims: bool) -> Op {
        Op::Reduce {
            op,
            axes: axes.iter().copied().collect(),
            keep_dims,
        }
    }

    #[test]
    fn reductions_over_axes_by_hand() {
        // x = [[1, 2, 3], [4, 5, 6]]
        let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let y = eval(&reduce(ReduceOp::Sum, &[0], false), &[&x]).unwrap();
        assert_close(&y, &[3], &[5.0, 7.0, 9.0]);
        let y = eval(&reduce(ReduceOp::Mean, &[1], true), &[&x]).unwrap();
        assert_close(&y, &[2, 1], &[2.0, 5.0]);
        let y = eval(&reduce(ReduceOp::Max, &[0, 1], false), &[&x]).unwrap();
        assert_close(&y, &[], &[6.0]);
        let y = eval(&reduce(ReduceOp::Min, &[1], false), &[&x]).unwrap();
        assert_close(&y, &[2], &[1.0, 4.0]);
        let y = eval(&reduce(ReduceOp::Prod, &[1], false), &[&x]).unwrap();
        assert_close(&y, &[2], &[6.0, 120.0]);
        let y = eval(&reduce(ReduceOp::L1, &[0], false), &[&x]).unwrap();
        assert_close(&y, &[3], &[5.0, 7.0, 9.0]);
        let y = eval(&reduce(ReduceOp::L2, &[1], false), &[&x]).unwrap();
        assert_close(&y, &[2], &[14f64.sqrt(), 77f64.sqrt()]);
        let y = eval(&reduce(ReduceOp::SumSquare, &[1], false), &[&x]).unwrap();
        assert_close(&y, &[2], &[14.0, 77.0]);
        let y = eval(&reduce(ReduceOp::LogSum, &[1], false), &[&x]).unwrap();
        assert_close(&y, &[2], &[6f64.ln(), 15f64.ln()]);
        let y = eval(&reduce(ReduceOp::LogSumExp, &[0], false), &[&x]).unwrap();
        let lse = |a: f64, b: f64| (a.exp() + b.exp()).ln();
        assert_close(&y, &[3], &[lse(1.0, 4.0), lse(2.0, 5.0), lse(3.0, 6.0)]);
        // Empty axes: the identity.
        let y = eval(&reduce(ReduceOp::Sum, &[], false), &[&x]).unwrap();
        assert_eq!(y, x);
    }

    #[test]
    fn integer_and_nan_reductions() {
        let x = Tensor::new([2, 2], Data::I32(vec![3, -7, 5, 2])).unwrap();
        let y = eval(&reduce(ReduceOp::Max, &[1], false), &[&x]).unwrap();
        assert_eq!(y.data(), &Data::I32(vec![3, 5]));
        let y = eval(&reduce(ReduceOp::Sum, &[0], true), &[&x]).unwrap();
        assert_eq!(y.data(), &Data::I32(vec![8, -5]));
        assert!(eval(&reduce(ReduceOp::Mean, &[0], true), &[&x]).is_err());
        let u = Tensor::new([2, 2], Data::U64(vec![u64::MAX, 1, 2, 3])).unwrap();
        let y = eval(&reduce(ReduceOp::Max, &[1], false), &[&u]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![u64::MAX, 3]));
        let y = eval(&reduce(ReduceOp::Min, &[0], false), &[&u]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![2, 1]));
        let e = Tensor::new([0], Data::U32(vec![])).unwrap();
        let y = eval(&reduce(ReduceOp::Min, &[0], false), &[&e]).unwrap();
        assert_eq!(y.data(), &Data::U32(vec![u32::MAX]));
        let n = f32s(&[3], &[1.0, f32::NAN, 2.0]);
        let y = eval(&reduce(ReduceOp::Max, &[0], false), &[&n]).unwrap();
        assert!(y.to_f64_vec()[0].is_nan());
        let e = f32s(&[0, 2], &[]);
        let y = eval(&reduce(ReduceOp::Sum, &[0], false), &[&e]).unwrap();
        assert_close(&y, &[2], &[0.0, 0.0]);
    }
}
