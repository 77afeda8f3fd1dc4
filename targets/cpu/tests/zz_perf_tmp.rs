mod common;
use kiln_ir::{DType, Data, Graph, Op, Tensor, UnaryOp, ValueType};

#[test]
fn accuracy() {
    for (op, lo, hi, f) in [
        (UnaryOp::Exp, -87.0f64, 88.0f64, f64::exp as fn(f64) -> f64),
        (UnaryOp::Tanh, -9.0, 9.0, f64::tanh),
        (UnaryOp::Sigmoid, -20.0, 20.0, |x: f64| 1.0 / (1.0 + (-x).exp())),
    ] {
        let n = 200001;
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [n]));
        let y = g.add_node(Op::Unary(op), &[x], "u").unwrap();
        g.add_output("y", y);
        let v: Vec<f32> = (0..n).map(|i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32).collect();
        let out = common::compile_run(&g, &[Tensor::new([n], Data::F32(v.clone())).unwrap()]).unwrap();
        let got = out[0].to_f32_vec();
        let mut worst = 0.0f64;
        for (x, y) in v.iter().zip(&got) {
            let e = f(*x as f64);
            let ulp = (e as f32).abs() * f32::EPSILON; // approx ulp
            let err = ((*y as f64) - e).abs() / ulp as f64;
            if err > worst { worst = err; }
        }
        println!("{op:?}: max error {worst:.2} ulp");
    }
}
