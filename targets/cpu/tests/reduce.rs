//! Reduction kernels against the reference evaluator.

mod common;

use common::{check, check_rand, Rng};
use kiln_ir::{DType, Data, Graph, Op, ReduceOp, Tensor, ValueType};

fn reduce_graph(op: ReduceOp, dtype: DType, shape: &[usize], axes: &[usize], keep: bool) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(dtype, shape));
    let y = g
        .add_node(
            Op::Reduce {
                op,
                axes: axes.iter().copied().collect(),
                keep_dims: keep,
            },
            &[x],
            "reduce",
        )
        .unwrap();
    g.add_output("y", y);
    g
}

const CASES: [(&[usize], &[usize]); 7] = [
    (&[7], &[0]),
    (&[3, 5], &[1]),
    (&[3, 5], &[0]),
    (&[2, 3, 4], &[0, 2]),
    (&[2, 3, 4], &[1, 2]),
    (&[2, 3, 4], &[0, 1, 2]),
    (&[2, 3, 4], &[]),
];

#[test]
fn float_reductions() {
    for (k, op) in ReduceOp::ALL.into_iter().enumerate() {
        for dtype in [DType::F32, DType::F64] {
            for (shape, axes) in CASES {
                for keep in [false, true] {
                    let g = reduce_graph(op, dtype, shape, axes, keep);
                    let mut rng = Rng::new(k as u64);
                    let n: usize = shape.iter().product();
                    // Positive inputs keep LogSum defined.
                    let v = (0..n).map(|_| rng.f64(0.1, 2.0));
                    let x = Tensor::new(shape, Data::from_f64s(dtype, v)).unwrap();
                    check(&g, &[x]);
                }
            }
        }
    }
}

#[test]
fn integer_reductions() {
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
        for dtype in [
            DType::I32,
            DType::I64,
            DType::U8,
            DType::I8,
            DType::U16,
            DType::U32,
            DType::U64,
        ] {
            for (shape, axes) in CASES {
                let g = reduce_graph(op, dtype, shape, axes, true);
                check_rand(&g, 5, 0.0);
            }
        }
    }
}

#[test]
fn empty_reductions_give_the_identity() {
    for op in [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Prod,
        ReduceOp::LogSumExp,
    ] {
        let g = reduce_graph(op, DType::F32, &[0, 3], &[0], true);
        check(&g, &[Tensor::new([0, 3], Data::F32(vec![])).unwrap()]);
    }
}
