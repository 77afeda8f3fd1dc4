//! Helpers shared by the pass tests: random graph inputs and the
//! differential check (evaluate before and after, compare).
#![allow(dead_code)]

use kiln_ir::{DType, Data, Graph, Tensor};

pub use kiln_test_kit::Rng;

/// Random values for every graph input: floats uniform in [-1, 1), integers
/// in {0, 1} (valid as gather indices), bools random.
pub fn random_inputs(graph: &Graph, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng::new(seed);
    graph
        .inputs()
        .iter()
        .map(|&id| {
            let ty = &graph.node(id).ty;
            let n = ty.num_elements();
            let data = if ty.dtype.is_float() {
                Data::from_f64s(ty.dtype, (0..n).map(|_| rng.unit()))
            } else if ty.dtype == DType::Bool {
                Data::Bool((0..n).map(|_| rng.next_u64() & 1 == 1).collect())
            } else {
                Data::from_i64s(ty.dtype, (0..n).map(|_| (rng.next_u64() & 1) as i64))
            };
            Tensor::new(&ty.shape, data).unwrap()
        })
        .collect()
}

/// Asserts that `got` matches `want` elementwise within a relative
/// tolerance of `rel`: `|a - b| <= rel * (|b| + max|want|)`, so values near
/// zero that come from cancellation are judged against the tensor's scale.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rel: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        if a.is_nan() && b.is_nan() || a == b {
            continue;
        }
        assert!(
            (a - b).abs() <= rel * (b.abs() + scale),
            "{what}: element {i}: got {a}, want {b} (scale {scale})"
        );
    }
}

/// Evaluates `before` and `after` on the same random inputs (several seeds)
/// and compares every output.
pub fn assert_equivalent(before: &Graph, after: &Graph, rel: f64) {
    for seed in 1..=3 {
        let inputs = random_inputs(before, seed);
        let want = kiln_ir::eval::eval_graph(before, &inputs).expect("eval before");
        let got = kiln_ir::eval::eval_graph(after, &inputs).expect("eval after");
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(&format!("output {k} (seed {seed})"), g, w, rel);
        }
    }
}

/// Parses `text`, runs `pass`, verifies, checks equivalence with the
/// original on random inputs, and returns the printed result.
pub fn run_pass(pass: &dyn kiln_passes::Pass, text: &str) -> String {
    let before = kiln_ir::text::parse(text).expect("parse");
    let mut after = before.clone();
    pass.run(&mut after).expect("pass");
    kiln_ir::verify::verify(&after).expect("verify");
    assert_equivalent(&before, &after, 1e-5);
    kiln_ir::text::print(&after)
}
