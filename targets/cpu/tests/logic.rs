//! Comparison, boolean and Where kernels against the reference evaluator.

mod common;

use common::{check, check_rand, rand_tensor, Rng};
use kiln_ir::{BitwiseOp, CompareOp, DType, Data, Graph, LogicalOp, Op, Tensor, ValueType};

/// Every comparison of the IR.
const COMPARE: [CompareOp; 5] = CompareOp::ALL;

fn binary_graph(op: Op, dtype: DType, a: &[usize], b: &[usize]) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("a", ValueType::new(dtype, a));
    let y = g.add_input("b", ValueType::new(dtype, b));
    let z = g.add_node(op, &[x, y], "op").unwrap();
    g.add_output("z", z);
    g
}

/// Small integers (so that equal values are common) in `dtype`.
fn small(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|_| rng.int(-2, 2) as f64);
    let mut data = Data::from_f64s(dtype, v);
    if let Data::F32(v) = &mut data {
        // A NaN compares false with everything.
        if let Some(x) = v.get_mut(1) {
            *x = f32::NAN;
        }
    }
    Tensor::new(shape, data).unwrap()
}

#[test]
fn comparisons_all_types_and_broadcasts() {
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[7], &[7]),
        (&[3, 5], &[5]),
        (&[2, 1, 4], &[3, 1]),
        (&[], &[6]),
    ];
    for (k, op) in COMPARE.into_iter().enumerate() {
        for dtype in [
            DType::F32,
            DType::F64,
            DType::I8,
            DType::U8,
            DType::I32,
            DType::I64,
        ] {
            for (a, b) in shapes {
                let g = binary_graph(Op::Compare(op), dtype, a, b);
                let mut rng = Rng::new(k as u64);
                let inputs = [small(&mut rng, dtype, a), small(&mut rng, dtype, b)];
                check(&g, &inputs);
            }
        }
    }
    // Bool equality.
    let g = binary_graph(Op::Compare(CompareOp::Equal), DType::Bool, &[4, 3], &[3]);
    check_rand(&g, 3, 0.0);
}

/// Unsigned comparisons see values near the type's maximum (the bits of
/// small negative numbers) as large, not negative.
#[test]
fn unsigned_comparisons_near_the_maximum() {
    for (k, op) in COMPARE.into_iter().enumerate() {
        for dtype in [DType::U8, DType::U16, DType::U32, DType::U64] {
            for (a, b) in [(&[9][..], &[9][..]), (&[3, 5], &[5]), (&[], &[6])] {
                let g = binary_graph(Op::Compare(op), dtype, a, b);
                let mut rng = Rng::new(k as u64);
                let mut t = |shape: &[usize]| {
                    let n: usize = shape.iter().product();
                    let v = Data::from_i64s(dtype, (0..n).map(|_| rng.int(-2, 2)));
                    Tensor::new(shape, v).unwrap()
                };
                let inputs = [t(a), t(b)];
                check(&g, &inputs);
            }
        }
    }
    // Checked by hand too: u64::MAX > 1, u32::MAX > 1.
    let g = binary_graph(Op::Compare(CompareOp::Greater), DType::U64, &[2], &[2]);
    let a = Tensor::new([2], Data::U64(vec![u64::MAX, 1 << 63])).unwrap();
    let b = Tensor::new([2], Data::U64(vec![1, 1])).unwrap();
    let out = common::compile_run(&g, &[a, b]).unwrap();
    assert_eq!(out[0].data(), &Data::Bool(vec![true, true]));
}

const INTS: [DType; 8] = [
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
];

/// Random values near 0 and near the ends of each type (the bits of
/// -20..=20), broadcast several ways.
#[test]
fn bitwise_and_or_xor_not_all_integer_types() {
    let shapes: [(&[usize], &[usize]); 4] = [
        (&[9], &[9]),
        (&[3, 5], &[5]),
        (&[2, 1, 4], &[3, 1]),
        (&[], &[6]),
    ];
    for (k, op) in [BitwiseOp::And, BitwiseOp::Or, BitwiseOp::Xor]
        .into_iter()
        .enumerate()
    {
        for d in INTS {
            for (a, b) in shapes {
                check_rand(&binary_graph(Op::Bitwise(op), d, a, b), k as u64, 0.0);
            }
        }
    }
    for d in INTS {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(d, [11]));
        let y = g.add_node(Op::BitwiseNot, &[x], "not").unwrap();
        g.add_output("y", y);
        check_rand(&g, 4, 0.0);
    }
}

/// Shifts by 0, 1, width - 1, width, width + 1 and far past it, of values
/// near 0 and near the maximum.
#[test]
fn shifts_by_zero_width_minus_one_and_past_the_width() {
    for d in INTS {
        let w = 8 * d.size_bytes() as i64;
        let amounts = [0, 1, w - 1, w, w + 1, 100, -1];
        let values = [0, 1, -1, -2, 0x55, i64::MIN, 3];
        let n = amounts.len();
        for op in [BitwiseOp::ShiftLeft, BitwiseOp::ShiftRight] {
            // Every value with every amount: [n, 1] against [n].
            let g = binary_graph(Op::Bitwise(op), d, &[n, 1], &[n]);
            let x = Tensor::new([n, 1], Data::from_i64s(d, values.into_iter())).unwrap();
            let s = Tensor::new([n], Data::from_i64s(d, amounts.into_iter())).unwrap();
            check(&g, &[x, s]);
        }
    }
    // By hand: u32::MAX >> 31 = 1, 1 << 31, and 0 past the width.
    let g = binary_graph(Op::Bitwise(BitwiseOp::ShiftRight), DType::U32, &[3], &[3]);
    let x = Tensor::new([3], Data::U32(vec![u32::MAX, u32::MAX, 7])).unwrap();
    let s = Tensor::new([3], Data::U32(vec![31, 32, 0])).unwrap();
    let out = common::compile_run(&g, &[x, s]).unwrap();
    assert_eq!(out[0].data(), &Data::U32(vec![1, 0, 7]));
    let g = binary_graph(Op::Bitwise(BitwiseOp::ShiftLeft), DType::U16, &[3], &[3]);
    let x = Tensor::new([3], Data::U16(vec![1, 1, 0xffff])).unwrap();
    let s = Tensor::new([3], Data::U16(vec![15, 16, 4])).unwrap();
    let out = common::compile_run(&g, &[x, s]).unwrap();
    assert_eq!(out[0].data(), &Data::U16(vec![0x8000, 0, 0xfff0]));
    // Signed: arithmetic, and -1 for a negative value shifted out of range.
    let g = binary_graph(Op::Bitwise(BitwiseOp::ShiftRight), DType::I32, &[4], &[4]);
    let x = Tensor::new([4], Data::I32(vec![-8, -8, 4, i32::MIN])).unwrap();
    let s = Tensor::new([4], Data::I32(vec![1, 32, -1, 31])).unwrap();
    let out = common::compile_run(&g, &[x, s]).unwrap();
    assert_eq!(out[0].data(), &Data::I32(vec![-4, -1, 0, -1]));
}

#[test]
fn logical_ops_and_not() {
    for (k, op) in [LogicalOp::And, LogicalOp::Or, LogicalOp::Xor]
        .into_iter()
        .enumerate()
    {
        for (a, b) in [(&[9][..], &[9][..]), (&[2, 3, 4], &[3, 1]), (&[5], &[])] {
            let g = binary_graph(Op::Logical(op), DType::Bool, a, b);
            check_rand(&g, k as u64, 0.0);
        }
    }
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::Bool, [3, 5]));
    let y = g.add_node(Op::Not, &[x], "not").unwrap();
    g.add_output("y", y);
    check_rand(&g, 7, 0.0);
}

#[test]
fn where_broadcasts_three_ways() {
    let cases: [(&[usize], &[usize], &[usize]); 4] = [
        (&[8], &[8], &[8]),
        (&[2, 1, 3], &[4, 1], &[3]),
        (&[], &[5], &[2, 5]),
        (&[3, 1], &[], &[1, 6]),
    ];
    for dtype in [
        DType::F32,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ] {
        for (k, (c, x, y)) in cases.into_iter().enumerate() {
            let mut g = Graph::new();
            let ci = g.add_input("c", ValueType::new(DType::Bool, c));
            let xi = g.add_input("x", ValueType::new(dtype, x));
            let yi = g.add_input("y", ValueType::new(dtype, y));
            let w = g.add_node(Op::Where, &[ci, xi, yi], "where").unwrap();
            g.add_output("w", w);
            let mut rng = Rng::new(k as u64);
            let inputs = [
                rand_tensor(&mut rng, DType::Bool, c),
                rand_tensor(&mut rng, dtype, x),
                rand_tensor(&mut rng, dtype, y),
            ];
            check(&g, &inputs);
        }
    }
}
