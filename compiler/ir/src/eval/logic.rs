//! Comparisons, boolean ops and Where.

use super::{broadcast_offsets, eval_err};
use crate::{BitwiseOp, CompareOp, Data, IrError, LogicalOp, Tensor, ValueType};

fn bools<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [bool], IrError> {
    match t.data() {
        Data::Bool(v) => Ok(v),
        _ => Err(eval_err(
            op,
            format!("needs a bool input, got {}", t.dtype()),
        )),
    }
}

/// A comparison with broadcasting to `out`'s shape: floats compared exactly
/// as f64 (NaN compares false), integers and bools as i64.
pub(super) fn compare(
    op: CompareOp,
    a: &Tensor,
    b: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let ia = broadcast_offsets(a.shape(), &out.shape);
    let ib = broadcast_offsets(b.shape(), &out.shape);
    let (da, db) = (a.data(), b.data());
    let v = if a.dtype().is_float() {
        ia.iter()
            .zip(&ib)
            .map(|(&i, &j)| op.apply(da.get_f64(i), db.get_f64(j)))
            .collect()
    } else if a.dtype().is_unsigned() {
        ia.iter()
            .zip(&ib)
            .map(|(&i, &j)| op.apply(da.get_u64(i), db.get_u64(j)))
            .collect()
    } else {
        ia.iter()
            .zip(&ib)
            .map(|(&i, &j)| op.apply(da.get_i64(i), db.get_i64(j)))
            .collect()
    };
    Ok(Data::Bool(v))
}

/// A boolean op with broadcasting.
pub(super) fn logical(
    op: LogicalOp,
    a: &Tensor,
    b: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let (va, vb) = (bools(op.name(), a)?, bools(op.name(), b)?);
    let ia = broadcast_offsets(a.shape(), &out.shape);
    let ib = broadcast_offsets(b.shape(), &out.shape);
    Ok(Data::Bool(
        ia.iter()
            .zip(&ib)
            .map(|(&i, &j)| op.apply(va[i], vb[j]))
            .collect(),
    ))
}

/// Boolean negation.
pub(super) fn not(x: &Tensor) -> Result<Data, IrError> {
    Ok(Data::Bool(bools("not", x)?.iter().map(|v| !v).collect()))
}

/// A bitwise op with broadcasting on integers: on the u64 bits of each
/// element (zero-extended for unsigned types, sign-extended for signed
/// ones), truncated back to the type ([`BitwiseOp::apply`]).
pub(super) fn bitwise(
    op: BitwiseOp,
    a: &Tensor,
    b: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let d = a.dtype();
    if !d.is_int() {
        return Err(eval_err(op.name(), format!("unsupported element type {d}")));
    }
    let bits = 8 * d.size_bytes() as u32;
    let ia = broadcast_offsets(a.shape(), &out.shape);
    let ib = broadcast_offsets(b.shape(), &out.shape);
    let (da, db) = (a.data(), b.data());
    let values = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| op.apply(da.get_u64(i), db.get_u64(j), bits, !d.is_unsigned()) as i64);
    Ok(Data::from_i64s(d, values))
}

/// Bitwise complement of an integer tensor.
pub(super) fn bitwise_not(x: &Tensor) -> Result<Data, IrError> {
    if !x.dtype().is_int() {
        return Err(eval_err(
            "bitwise_not",
            format!("unsupported element type {}", x.dtype()),
        ));
    }
    let d = x.data();
    Ok(Data::from_i64s(
        x.dtype(),
        (0..d.len()).map(|i| !d.get_i64(i)),
    ))
}

/// `cond ? x : y` with three-way broadcasting; works for every element type.
pub(super) fn where_(
    cond: &Tensor,
    x: &Tensor,
    y: &Tensor,
    out: &ValueType,
) -> Result<Data, IrError> {
    let c = bools("where", cond)?;
    let ic = broadcast_offsets(cond.shape(), &out.shape);
    let ix = broadcast_offsets(x.shape(), &out.shape);
    let iy = broadcast_offsets(y.shape(), &out.shape);
    // Pick from the concatenation of x and y, so that one typed gather
    // serves every element type.
    let nx = x.len();
    let idx: Vec<usize> = (0..ic.len())
        .map(|k| if c[ic[k]] { ix[k] } else { nx + iy[k] })
        .collect();
    let both = super::layout::concat(0, &[&flat(x)?, &flat(y)?])?;
    Ok(match both {
        Data::F32(v) => super::gather_elems(&v, &idx),
        Data::F16(v) => super::gather_elems(&v, &idx),
        Data::BF16(v) => super::gather_elems(&v, &idx),
        Data::F64(v) => super::gather_elems(&v, &idx),
        Data::I8(v) => super::gather_elems(&v, &idx),
        Data::U8(v) => super::gather_elems(&v, &idx),
        Data::I16(v) => super::gather_elems(&v, &idx),
        Data::I32(v) => super::gather_elems(&v, &idx),
        Data::I64(v) => super::gather_elems(&v, &idx),
        Data::Bool(v) => super::gather_elems(&v, &idx),
        Data::U16(v) => super::gather_elems(&v, &idx),
        Data::U32(v) => super::gather_elems(&v, &idx),
        Data::U64(v) => super::gather_elems(&v, &idx),
        // Codes as bytes; `eval` gives them their type back.
        Data::Narrow(_, v) => super::gather_elems(&v, &idx),
    })
}

fn flat(t: &Tensor) -> Result<Tensor, IrError> {
    t.reshaped([t.len()])
        .ok_or_else(|| eval_err("where", "internal: flatten failed"))
}

#[cfg(test)]
mod tests {
    use super::super::eval;
    use super::super::test_util::*;
    use crate::{BitwiseOp, CompareOp, Data, LogicalOp, Op, Tensor};

    fn bools(shape: &[usize], v: &[bool]) -> Tensor {
        Tensor::new(shape, Data::Bool(v.to_vec())).unwrap()
    }

    #[test]
    fn comparisons_broadcast_and_nan_is_false() {
        let a = f32s(&[2, 2], &[1.0, 2.0, f32::NAN, 4.0]);
        let b = f32s(&[2], &[2.0, 2.0]);
        let cases = [
            (CompareOp::Equal, [false, true, false, false]),
            (CompareOp::Less, [true, false, false, false]),
            (CompareOp::Greater, [false, false, false, true]),
            (CompareOp::LessOrEqual, [true, true, false, false]),
            (CompareOp::GreaterOrEqual, [false, true, false, true]),
        ];
        for (op, expected) in cases {
            let y = eval(&Op::Compare(op), &[&a, &b]).unwrap();
            assert_eq!(y.data(), &Data::Bool(expected.to_vec()), "{op:?}");
        }
        let i = i64s(&[3], &[-1, 5, i64::MAX]);
        let j = i64s(&[], &[5]);
        let y = eval(&Op::Compare(CompareOp::Less), &[&i, &j]).unwrap();
        assert_eq!(y.data(), &Data::Bool(vec![true, false, false]));
        let u = Tensor::new([2], Data::U64(vec![u64::MAX, 3])).unwrap();
        let v = Tensor::new([], Data::U64(vec![5])).unwrap();
        let y = eval(&Op::Compare(CompareOp::Greater), &[&u, &v]).unwrap();
        assert_eq!(y.data(), &Data::Bool(vec![true, false]));
    }

    #[test]
    fn bitwise_ops_and_shifts_past_the_width() {
        let a = Tensor::new([4], Data::U8(vec![0b1010_1010, 255, 1, 128])).unwrap();
        let b = Tensor::new([4], Data::U8(vec![0b0110_0110, 1, 7, 8])).unwrap();
        let op = |o| Op::Bitwise(o);
        let y = eval(&op(BitwiseOp::And), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![0b0010_0010, 1, 1, 0]));
        let y = eval(&op(BitwiseOp::Or), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![0b1110_1110, 255, 7, 136]));
        let y = eval(&op(BitwiseOp::Xor), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![0b1100_1100, 254, 6, 136]));
        // 170 << 102 is past the width: 0, as numpy gives.
        let y = eval(&op(BitwiseOp::ShiftLeft), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![0, 254, 128, 0]));
        let y = eval(&op(BitwiseOp::ShiftRight), &[&a, &b]).unwrap();
        assert_eq!(y.data(), &Data::U8(vec![0, 127, 0, 0]));
        let x = Tensor::new([2], Data::U64(vec![u64::MAX, 1])).unwrap();
        let s = Tensor::new([2], Data::U64(vec![63, 64])).unwrap();
        let y = eval(&op(BitwiseOp::ShiftRight), &[&x, &s]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![1, 0]));
        let y = eval(&op(BitwiseOp::ShiftLeft), &[&x, &s]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![1 << 63, 0]));
        let i = Tensor::new([2], Data::I16(vec![-1, 0x1234])).unwrap();
        let j = Tensor::new([], Data::I16(vec![0x00ff])).unwrap();
        let y = eval(&op(BitwiseOp::And), &[&i, &j]).unwrap();
        assert_eq!(y.data(), &Data::I16(vec![0xff, 0x34]));
        let y = eval(&Op::BitwiseNot, &[&i]).unwrap();
        assert_eq!(y.data(), &Data::I16(vec![0, !0x1234]));
        let y = eval(&Op::BitwiseNot, &[&x]).unwrap();
        assert_eq!(y.data(), &Data::U64(vec![0, u64::MAX - 1]));
        // Signed: arithmetic right shifts, and out-of-range amounts
        // (negative or >= 8) give 0, or -1 shifting a negative value right.
        let x = Tensor::new([5], Data::I8(vec![-8, 4, -1, -64, 64])).unwrap();
        let s = Tensor::new([5], Data::I8(vec![1, 9, -1, 1, 1])).unwrap();
        let y = eval(&op(BitwiseOp::ShiftRight), &[&x, &s]).unwrap();
        assert_eq!(y.data(), &Data::I8(vec![-4, 0, -1, -32, 32]));
        let y = eval(&op(BitwiseOp::ShiftLeft), &[&x, &s]).unwrap();
        assert_eq!(y.data(), &Data::I8(vec![-16, 0, 0, -128, -128]));
    }

    #[test]
    fn logical_ops_not_and_where() {
        let a = bools(&[4], &[false, false, true, true]);
        let b = bools(&[4], &[false, true, false, true]);
        let and = eval(&Op::Logical(LogicalOp::And), &[&a, &b]).unwrap();
        assert_eq!(and.data(), &Data::Bool(vec![false, false, false, true]));
        let or = eval(&Op::Logical(LogicalOp::Or), &[&a, &b]).unwrap();
        assert_eq!(or.data(), &Data::Bool(vec![false, true, true, true]));
        let xor = eval(&Op::Logical(LogicalOp::Xor), &[&a, &b]).unwrap();
        assert_eq!(xor.data(), &Data::Bool(vec![false, true, true, false]));
        let not = eval(&Op::Not, &[&a]).unwrap();
        assert_eq!(not.data(), &Data::Bool(vec![true, true, false, false]));
        assert!(eval(&Op::Not, &[&f32s(&[1], &[1.0])]).is_err());
        // where: cond [2,1], x [2] , y scalar -> [2,2]
        let c = bools(&[2, 1], &[true, false]);
        let x = i64s(&[2], &[1, 2]);
        let y = i64s(&[], &[9]);
        let w = eval(&Op::Where, &[&c, &x, &y]).unwrap();
        assert_eq!(w.shape().as_slice(), &[2, 2]);
        assert_eq!(w.to_i64_vec(), vec![1, 2, 9, 9]);
    }
}
