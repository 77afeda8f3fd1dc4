//! `layout` on a tf2onnx-style NHWC block: snapshots of the text IR after
//! the pass, and the reference evaluator's outputs before and after.

mod common;

use kiln_passes::{Layout, Pass};

fn run(text: &str) -> String {
    let before = kiln_ir::text::parse(text).unwrap();
    let mut after = before.clone();
    Layout.run(&mut after).unwrap();
    kiln_ir::verify::verify(&after).unwrap();
    let inputs = common::random_inputs(&before, 3);
    let want = kiln_ir::eval::eval_graph(&before, &inputs).unwrap();
    let got = kiln_ir::eval::eval_graph(&after, &inputs).unwrap();
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        common::assert_close(&format!("output {k}"), g, w, 0.0);
    }
    kiln_ir::text::print(&after)
}

#[test]
fn nhwc_block_with_bias_relu_and_residual() {
    // NHWC input; every conv wrapped in transposes; bias add, relu, a
    // per-channel scale and a residual add in NHWC between them.
    insta::assert_snapshot!(run("graph(%x: f32[1,6,5,2]) {
          %xt: f32[1,2,6,5] = transpose(%x) {perm=[0,3,1,2]}
          %w1: f32[4,2,1,1] = const dense<[1.0, -1.0, 0.5, 2.0, -0.25, 1.5, 0.75, -0.5]>
          %c1: f32[1,4,6,5] = conv(%xt, %w1) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1}
          %c1t: f32[1,6,5,4] = transpose(%c1) {perm=[0,2,3,1]}
          %b1: f32[4] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %a1: f32[1,6,5,4] = add(%c1t, %b1)
          %r1: f32[1,6,5,4] = relu(%a1)
          %r1t: f32[1,4,6,5] = transpose(%r1) {perm=[0,3,1,2]}
          %w2: f32[4,4,1,1] = const dense<[1.0, 2.0, 3.0, -1.0, 0.5, 0.25, -2.0, 1.0, 0.0, 1.0, -1.0, 0.5, 2.0, -0.5, 0.25, 1.5]>
          %c2: f32[1,4,6,5] = conv(%r1t, %w2) {strides=[1,1], pads=[0,0,0,0], dilations=[1,1], group=1}
          %c2t: f32[1,6,5,4] = transpose(%c2) {perm=[0,2,3,1]}
          %s2: f32[1,1,1,4] = const dense<[2.0, 0.5, -1.0, 3.0]>
          %m2: f32[1,6,5,4] = mul(%c2t, %s2)
          %res: f32[1,6,5,4] = add(%m2, %r1)
          %y: f32[1,6,5,4] = sigmoid(%res)
          return %y
        }"));
}
