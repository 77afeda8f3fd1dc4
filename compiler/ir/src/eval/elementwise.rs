//! Unary and broadcasting binary elementwise ops.

use super::{broadcast_offsets, eval_err, run_float, Float, FloatKernel};
use crate::{BinaryOp, Data, IrError, Tensor, UnaryOp, ValueType};

/// A unary op: floats through [`UnaryOp::apply`], integers with integer
/// semantics (wrapping negation and absolute value).
pub(super) fn unary(op: UnaryOp, x: &Tensor) -> Result<Data, IrError> {
    if x.dtype().is_float() {
        return run_float(op.name(), &[x], &UnaryKernel(op));
    }
    let apply: fn(i64, UnaryOp) -> i64 = |v, op| match op {
        UnaryOp::Relu => v.max(0),
        UnaryOp::Neg => v.wrapping_neg(),
        UnaryOp::Abs => v.wrapping_abs(),
        UnaryOp::Sign => v.signum(),
        UnaryOp::Clip { min, max } => {
            let (lo, hi) = ((min as f64).ceil(), (max as f64).floor());
            let v = if (v as f64) < lo { lo as i64 } else { v };
            if (v as f64) > hi {
                hi as i64
            } else {
                v
            }
        }
        _ => unreachable!("rejected by inference"),
    };
    if !op.accepts_int() || !x.dtype().is_int() {
        return Err(eval_err(
            op.name(),
            format!("unsupported element type {}", x.dtype()),
        ));
    }
    if x.dtype().is_unsigned() {
        let d = x.data();
        let values = (0..x.len()).map(|i| {
            let v = d.get_u64(i);
            let v = match op {
                UnaryOp::Relu | UnaryOp::Abs => v,
                UnaryOp::Neg => v.wrapping_neg(),
                UnaryOp::Sign => (v != 0) as u64,
                UnaryOp::Clip { min, max } => {
                    // Bounds rounded inward, saturated to 0..=u64::MAX
                    // (`as u64`), then an exact integer clamp.
                    let lo = (min as f64).ceil() as u64;
                    let hi = (max as f64).floor() as u64;
                    v.max(lo).min(hi)
                }
                _ => unreachable!("rejected by accepts_int"),
            };
            v as i64
        });
        return Ok(Data::from_i64s(x.dtype(), values));
    }
    let v = x.to_i64_vec();
    Ok(Data::from_i64s(
        x.dtype(),
        v.into_iter().map(|v| apply(v, op)),
    ))
}

struct UnaryKernel(UnaryOp);

impl FloatKernel for UnaryKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        inputs[0]
            .iter()
            .map(|&x| T::from_f64(self.0.apply(x.to_f64())))
            .collect()
    }
}

/// A binary op with numpy broadcasting to `out`'s shape: floats through
/// [`BinaryOp::apply_f64`], integers through [`BinaryOp::apply_i64`] (an
/// integer division by zero is an error).
pub(super) fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let ia = broadcast_offsets(a.shape(), &out.shape);
    let ib = broadcast_offsets(b.shape(), &out.shape);
    if a.dtype().is_float() {
        return run_float(op.name(), &[a, b], &BinaryKernel { op, ia, ib });
    }
    if !a.dtype().is_int() {
        return Err(eval_err(
            op.name(),
            format!("unsupported element type {}", a.dtype()),
        ));
    }
    if a.dtype().is_unsigned() {
        let (da, db) = (a.data(), b.data());
        let values = ia
            .iter()
            .zip(&ib)
            .map(|(&i, &j)| {
                let (x, y) = (da.get_u64(i), db.get_u64(j));
                op.apply_u64(x, y).map(|v| v as i64).ok_or_else(|| {
                    let why = match op {
                        BinaryOp::Pow => format!("integer power with exponent {y}"),
                        _ => "integer division by zero".to_string(),
                    };
                    eval_err(op.name(), why)
                })
            })
            .collect::<Result<Vec<i64>, IrError>>()?;
        return Ok(Data::from_i64s(a.dtype(), values.into_iter()));
    }
    let (va, vb) = (a.to_i64_vec(), b.to_i64_vec());
    let values = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| {
            let (x, y) = (va[i], vb[j]);
            op.apply_i64(x, y).ok_or_else(|| {
                let why = match op {
                    BinaryOp::Div if y == 0 => "integer division by zero".to_string(),
                    BinaryOp::Div => format!("integer division overflow: {x} / {y}"),
                    BinaryOp::Pow => format!("integer power with exponent {y}"),
                    _ => format!("integer {} failed on {x} and {y}", op.name()),
                };
                eval_err(op.name(), why)
            })
        })
        .collect::<Result<Vec<i64>, IrError>>()?;
    Ok(Data::from_i64s(a.dtype(), values.into_iter()))
}

struct BinaryKernel {
    op: BinaryOp,
    ia: Vec<usize>,
    ib: Vec<usize>,
}

impl FloatKernel for BinaryKernel {
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T> {
        let (a, b) = (inputs[0], inputs[1]);
        self.ia
            .iter()
            .zip(&self.ib)
            .map(|(&i, &j)| T::from_f64(self.op.apply_f64(a[i].to_f64(), b[j].to_f64())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{BinaryOp, DType, Data, IrError, Op, Tensor, UnaryOp};

    #[test]
    fn broadcasting_add_2x1x3_plus_4x1() {
        // a[i,0,k] = 10*i + k, b[j,0] = 100*j; out[i,j,k] = a[i,0,k] + b[j,0].
        let a = f32s(&[2, 1, 3], &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
        let b = f32s(&[4, 1], &[0.0, 100.0, 200.0, 300.0]);
        let y = eval(&Op::Binary(BinaryOp::Add), &[&a, &b]).unwrap();
        let mut expected = Vec::new();
        for i in 0..2 {
            for j in 0..4 {
                for k in 0..3 {
                    expected.push((10 * i + k + 100 * j) as f64);
                }
            }
        }
        assert_close(&y, &[2, 4, 3], &expected);
        assert_eq!(&expected[..6], &[0.0, 1.0, 2.0, 100.0, 101.0, 102.0]);
    }

    #[test]
    fn binary_float_ops_with_scalar() {
        let a = f32s(&[3], &[1.0, 4.0, 9.0]);
        let s = f32s(&[], &[2.0]);
        let cases = [
            (BinaryOp::Sub, [-1.0, 2.0, 7.0]),
            (BinaryOp::Div, [0.5, 2.0, 4.5]),
            (BinaryOp::Pow, [1.0, 16.0, 81.0]),
            (BinaryOp::Max, [2.0, 4.0, 9.0]),
            (BinaryOp::Min, [1.0, 2.0, 2.0]),
        ];
        for (op, expected) in cases {
            let y = eval(&Op::Binary(op), &[&a, &s]).unwrap();
            assert_close(&y, &[3], &expected);
        }
    }

    #[test]
    fn integer_division_truncates_and_by_zero_is_an_error() {
        let a = i64s(&[4], &[7, -7, 6, 0]);
        let b = i64s(&[4], &[2, 2, -4, 5]);
        let y = eval(&Op::Binary(BinaryOp::Div), &[&a, &b]).unwrap();
        assert_eq!(y.to_i64_vec(), vec![3, -3, -1, 0]);
        let z = i64s(&[4], &[1, 1, 0, 1]);
        let e = eval(&Op::Binary(BinaryOp::Div), &[&a, &z]).unwrap_err();
        match e {
            IrError::Eval { op, message } => {
                assert_eq!(op, "div");
                assert!(message.contains("division by zero"), "{message}");
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn narrow_integers_wrap() {
        let a = Tensor::new([2], Data::I8(vec![100, -128])).unwrap();
        let b = Tensor::new([2], Data::I8(vec![100, 1])).unwrap();
        let y = eval(&Op::Binary(BinaryOp::Add), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::I8(vec![-56, -127]));
        let u = Tensor::new([2], Data::U8(vec![3, 200])).unwrap();
        let v = Tensor::new([1], Data::U8(vec![5])).unwrap();
        let y = eval(&Op::Binary(BinaryOp::Sub), &[&u, &v]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![254, 195]));
    }

    #[test]
    fn unsigned_integers_have_unsigned_semantics() {
        let a = Tensor::new([3], Data::U64(vec![u64::MAX, 1 << 63, 7])).unwrap();
        let b = Tensor::new([3], Data::U64(vec![2, 3, 0])).unwrap();
        let two = Tensor::new([], Data::U64(vec![2])).unwrap();
        let y = eval(&Op::Binary(BinaryOp::Div), &[&a, &two]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![u64::MAX / 2, 1 << 62, 3]));
        let y = eval(&Op::Binary(BinaryOp::Max), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![u64::MAX, 1 << 63, 7]));
        let y = eval(&Op::Binary(BinaryOp::Mod), &[&a, &two]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![1, 0, 1]));
        assert!(eval(&Op::Binary(BinaryOp::Div), &[&a, &b]).is_err());
        let u = Tensor::new([3], Data::U32(vec![u32::MAX, 0, 5])).unwrap();
        let y = eval(&Op::Unary(UnaryOp::Neg), &[&u]).unwrap();
        assert_eq!(y.data(), &Data::U32(vec![1, 0, u32::MAX - 4]));
        let y = eval(&Op::Unary(UnaryOp::Abs), &[&a]).unwrap();
        assert_eq!(y.data(), a.data());
        let y = eval(&Op::Unary(UnaryOp::Sign), &[&a]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![1, 1, 1]));
        let clip = UnaryOp::Clip {
            min: 6.5,
            max: -1.0,
        };
        let y = eval(&Op::Unary(clip), &[&u]).unwrap();
        assert_eq!(y.data(), &Data::U32(vec![0, 0, 0]));
        let y = eval(&Op::Cast { to: DType::F64 }, &[&a]).unwrap();
        assert_eq!(y.to_f64_vec(), vec![u64::MAX as f64, 2f64.powi(63), 7.0]);
        let f = Tensor::new([3], Data::F64(vec![-3.0, 1e30, 65535.9])).unwrap();
        let y = eval(&Op::Cast { to: DType::U16 }, &[&f]).unwrap();
        assert_eq!(y.data(), &Data::U16(vec![0, u16::MAX, u16::MAX]));
        let y = eval(&Op::Cast { to: DType::U64 }, &[&f]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![0, u64::MAX, 65535]));
    }

    #[test]
    fn unary_float_ops() {
        let x = f32s(&[4], &[-2.0, -0.5, 0.0, 3.0]);
        let cases: [(UnaryOp, [f64; 4]); 6] = [
            (UnaryOp::Relu, [0.0, 0.0, 0.0, 3.0]),
            (UnaryOp::LeakyRelu { alpha: 0.1 }, [-0.2, -0.05, 0.0, 3.0]),
            (
                UnaryOp::Clip {
                    min: -1.0,
                    max: 1.0,
                },
                [-1.0, -0.5, 0.0, 1.0],
            ),
            (
                UnaryOp::HardSwish,
                [-1.0 / 3.0, -0.5 * (2.5 / 6.0), 0.0, 3.0],
            ),
            (UnaryOp::Abs, [2.0, 0.5, 0.0, 3.0]),
            (UnaryOp::Floor, [-2.0, -1.0, 0.0, 3.0]),
        ];
        for (op, expected) in cases {
            let y = eval(&Op::Unary(op), &[&x]).unwrap();
            assert_eq!(y.dtype(), DType::F32);
            assert_close(&y, &[4], &expected);
        }
        let y = eval(&Op::Unary(UnaryOp::Sigmoid), &[&f32s(&[1], &[0.0])]).unwrap();
        assert_close(&y, &[1], &[0.5]);
    }

    #[test]
    fn unary_integer_ops() {
        let x = Tensor::new([4], Data::I32(vec![-5, -1, 2, 9])).unwrap();
        let relu = eval(&Op::Unary(UnaryOp::Relu), &[&x]).unwrap();
        assert_eq!(relu.data(), &Data::I32(vec![0, 0, 2, 9]));
        let neg = eval(&Op::Unary(UnaryOp::Neg), &[&x]).unwrap();
        assert_eq!(neg.data(), &Data::I32(vec![5, 1, -2, -9]));
        let clip = eval(
            &Op::Unary(UnaryOp::Clip {
                min: -2.0,
                max: 3.0,
            }),
            &[&x],
        )
        .unwrap();
        assert_eq!(clip.data(), &Data::I32(vec![-2, -1, 2, 3]));
        assert!(eval(&Op::Unary(UnaryOp::Exp), &[&x]).is_err());
    }
}
