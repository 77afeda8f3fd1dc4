//! Comparisons, boolean ops and Where.

use super::{broadcast_offsets, eval_err};
use crate::{CompareOp, Data, IrError, LogicalOp, Tensor, ValueType};

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
    use crate::{CompareOp, Data, LogicalOp, Op, Tensor};

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
