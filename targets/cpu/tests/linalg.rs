//! MatMul and Gemm against the reference evaluator.

mod common;

use common::{check_rand, check_with, f32_tensor, Rng};
use kiln_ir::{DType, Graph, Op, ValueType};

fn matmul_graph(a: &[usize], b: &[usize]) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("a", ValueType::new(DType::F32, a));
    let y = g.add_input("b", ValueType::new(DType::F32, b));
    let z = g.add_node(Op::MatMul, &[x, y], "mm").unwrap();
    g.add_output("z", z);
    g
}

#[test]
fn matmul_shapes_hitting_tails() {
    let cases: [(&[usize], &[usize]); 10] = [
        (&[1, 1], &[1, 1]),
        (&[3, 5], &[5, 7]),
        (&[4, 8], &[8, 8]),
        (&[9, 13], &[13, 19]),
        (&[5, 2], &[2, 12]),
        (&[7], &[7, 3]),
        (&[6, 7], &[7]),
        (&[11], &[11]),
        (&[17, 33], &[33, 21]),
        (&[2, 64], &[64, 10]),
    ];
    for (i, (a, b)) in cases.into_iter().enumerate() {
        check_rand(&matmul_graph(a, b), i as u64, 1e-5);
    }
}

#[test]
fn batched_matmul_with_broadcast() {
    let cases: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[2, 4, 9]),
        (&[2, 1, 3, 4], &[1, 3, 4, 6]),
        (&[3, 1, 5], &[3, 5, 2]),
    ];
    for (i, (a, b)) in cases.into_iter().enumerate() {
        check_rand(&matmul_graph(a, b), 100 + i as u64, 1e-5);
    }
}

#[test]
fn f64_matmul_and_softmax() {
    // f64 runs on the portable kernels (f64x2 tiles; softmax per column):
    // tails in M, N and K, batch broadcast, softmax over inner and outer
    // axes.
    let cases: [(&[usize], &[usize]); 4] = [
        (&[3, 5], &[5, 7]),
        (&[2, 9, 13], &[13, 3]),
        (&[5], &[5, 2]),
        (&[2, 1, 4, 6], &[3, 6, 5]),
    ];
    for (i, (a, b)) in cases.into_iter().enumerate() {
        let mut g = Graph::new();
        let x = g.add_input("a", ValueType::new(DType::F64, a));
        let y = g.add_input("b", ValueType::new(DType::F64, b));
        let z = g.add_node(Op::MatMul, &[x, y], "mm").unwrap();
        let rank = g.node(z).ty.shape.len();
        let s = g
            .add_node(Op::Softmax { axis: rank - 1 }, &[z], "sm")
            .unwrap();
        let t = g.add_node(Op::Softmax { axis: 0 }, &[z], "sm0").unwrap();
        g.add_output("z", z);
        g.add_output("s", s);
        g.add_output("t", t);
        check_rand(&g, 300 + i as u64, 1e-12);
    }
}

#[allow(clippy::too_many_arguments)]
fn gemm_graph(
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
    c: Option<&[usize]>,
    const_b: bool,
    alpha: f32,
    beta: f32,
    rng: &mut Rng,
) -> Graph {
    let mut g = Graph::new();
    let a_shape = if ta { [k, m] } else { [m, k] };
    let b_shape = if tb { [n, k] } else { [k, n] };
    let a = g.add_input("a", ValueType::new(DType::F32, a_shape));
    let b = if const_b {
        g.add_const("b", f32_tensor(rng, &b_shape))
    } else {
        g.add_input("b", ValueType::new(DType::F32, b_shape))
    };
    let mut ins = vec![a, b];
    if let Some(cs) = c {
        ins.push(g.add_const("c", f32_tensor(rng, cs)));
    }
    let op = Op::Gemm {
        alpha,
        beta,
        trans_a: ta,
        trans_b: tb,
    };
    let y = g.add_node(op, &ins, "gemm").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn gemm_transposes_bias_and_scales() {
    let mut rng = Rng::new(5);
    let mut seed = 0;
    for (m, k, n) in [(1, 4, 10), (5, 7, 9), (8, 16, 13), (3, 1, 4)] {
        for ta in [false, true] {
            for tb in [false, true] {
                for const_b in [false, true] {
                    for c in [
                        None,
                        Some(&[n][..]),
                        Some(&[m, n][..]),
                        Some(&[m, 1][..]),
                        Some(&[1][..]),
                    ] {
                        let g = gemm_graph(m, k, n, ta, tb, c, const_b, 0.75, 1.5, &mut rng);
                        seed += 1;
                        check_rand(&g, seed, 1e-5);
                    }
                }
            }
        }
    }
    let g = gemm_graph(6, 5, 7, false, true, Some(&[7]), true, 1.0, 1.0, &mut rng);
    check_rand(&g, 1, 1e-5);
    let g = gemm_graph(
        6,
        5,
        7,
        false,
        false,
        Some(&[6, 7]),
        false,
        2.0,
        0.0,
        &mut rng,
    );
    check_rand(&g, 2, 1e-5);
}

#[test]
fn matmul_feeding_elementwise() {
    let mut rng = Rng::new(77);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [3, 20]));
    let w = g.add_const("w", f32_tensor(&mut rng, &[20, 30]));
    let y = g.add_node(Op::MatMul, &[x, w], "mm").unwrap();
    let r = g
        .add_node(Op::Unary(kiln_ir::UnaryOp::Relu), &[y], "relu")
        .unwrap();
    g.add_output("r", r);
    check_with(&g, &[f32_tensor(&mut rng, &[3, 20])], 1e-5);
}
