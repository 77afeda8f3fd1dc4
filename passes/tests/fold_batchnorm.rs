//! `fold-batchnorm`: snapshots of the rewritten IR plus a differential check
//! (eval before/after on random inputs) for every case.

mod common;

use common::run_pass;
use kiln_passes::FoldBatchNorm;

fn fold(text: &str) -> String {
    run_pass(&FoldBatchNorm, text)
}

#[test]
fn conv_without_bias_gets_scale_and_shift() {
    // The frontend's BatchNormalization: mul by [C,1,1], add of [C,1,1].
    let out = fold(
        "graph(%x: f32[1,2,4,4]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,4,4] = conv(%x, %w)  # onnx: conv
          %a: f32[2,1,1] = const dense<[1.5, -0.5]>
          %m: f32[1,2,4,4] = mul(%c, %a)
          %b: f32[2,1,1] = const dense<[0.1, 0.2]>
          %y: f32[1,2,4,4] = add(%m, %b)
          %r: f32[1,2,4,4] = relu(%y)
          return %r
        }",
    );
    insta::assert_snapshot!("conv_without_bias", out);
}

#[test]
fn conv_with_bias_and_sub_div_and_constant_on_the_left() {
    let out = fold(
        "graph(%x: f32[1,2,3,3]) {
          %w: f32[4,1,2,2] = const dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, -1.0, -2.0, -3.0, -4.0, 0.5, 0.5, 0.5, 0.5]>
          %bias: f32[4] = const dense<[1.0, -1.0, 2.0, -2.0]>
          %c: f32[1,4,2,2] = conv(%x, %w, %bias) {group=2}
          %a: f32[1,4,1,1] = const dense<[2.0, 3.0, 4.0, 5.0]>
          %m: f32[1,4,2,2] = mul(%a, %c)
          %s: f32[] = const dense<[0.5]>
          %d: f32[1,4,2,2] = sub(%m, %s)
          %k: f32[4,1,1] = const dense<[2.0, 4.0, 8.0, 16.0]>
          %e: f32[1,4,2,2] = div(%d, %k)
          return %e
        }",
    );
    insta::assert_snapshot!("conv_with_bias_sub_div", out);
}

#[test]
fn conv_with_other_users_is_left_alone() {
    let text = "graph(%x: f32[1,2,4,4]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,4,4] = conv(%x, %w)
          %a: f32[2,1,1] = const dense<[1.5, -0.5]>
          %m: f32[1,2,4,4] = mul(%c, %a)
          %r: f32[1,2,4,4] = relu(%c)
          %y: f32[1,2,4,4] = add(%m, %r)
          return %y
        }";
    let before = kiln_ir::text::print(&kiln_ir::text::parse(text).unwrap());
    assert_eq!(fold(text), before);
}

#[test]
fn not_per_channel_is_left_alone() {
    // Varies along W, and a constant that broadcasts the output larger.
    let text = "graph(%x: f32[1,2,2,2], %z: f32[2,3]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,2,2] = conv(%x, %w)
          %a: f32[2] = const dense<[1.5, -0.5]>
          %m: f32[1,2,2,2] = mul(%c, %a)
          %b: f32[3,3] = const dense<[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]>
          %g: f32[2,3] = matmul(%z, %b)
          %k: f32[2,2,3] = const dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]>
          %n: f32[2,2,3] = mul(%g, %k)
          return %m, %n
        }";
    let before = kiln_ir::text::print(&kiln_ir::text::parse(text).unwrap());
    assert_eq!(fold(text), before);
}

#[test]
fn gemm_trans_b_with_c() {
    let out = fold(
        "graph(%x: f32[2,3]) {
          %b: f32[2,3] = const dense<[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]>
          %c: f32[2] = const dense<[0.5, -0.5]>
          %g: f32[2,2] = gemm(%x, %b, %c) {alpha=0.5, beta=2.0, trans_b=true}
          %s: f32[1,2] = const dense<[3.0, -2.0]>
          %m: f32[2,2] = mul(%g, %s)
          %t: f32[2] = const dense<[1.0, 10.0]>
          %y: f32[2,2] = add(%t, %m)
          return %y
        }",
    );
    insta::assert_snapshot!("gemm_trans_b_with_c", out);
}

#[test]
fn gemm_without_c_and_with_column_c() {
    let out = fold(
        "graph(%x: f32[2,3]) {
          %b: f32[3,2] = const dense<[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]>
          %g: f32[2,2] = gemm(%x, %b)
          %s: f32[2] = const dense<[3.0, -2.0]>
          %m: f32[2,2] = mul(%g, %s)
          %t: f32[2] = const dense<[1.0, 10.0]>
          %y: f32[2,2] = add(%m, %t)
          %c: f32[2,1] = const dense<[7.0, -7.0]>
          %b2: f32[2,2] = const dense<[1.0, 2.0, 3.0, 4.0]>
          %h: f32[2,2] = gemm(%y, %b2, %c) {trans_a=false}
          %u: f32[2,2] = mul(%h, %s)
          return %u
        }",
    );
    insta::assert_snapshot!("gemm_without_c_and_column_c", out);
}

#[test]
fn matmul_becomes_gemm_and_batched_matmul_scales_only() {
    let out = fold(
        "graph(%x: f32[2,3], %z: f32[2,2,3]) {
          %b: f32[3,2] = const dense<[1.0, 2.0, 3.0, -1.0, 0.5, 0.25]>
          %g: f32[2,2] = matmul(%x, %b)
          %s: f32[2] = const dense<[3.0, -2.0]>
          %m: f32[2,2] = mul(%g, %s)
          %t: f32[2] = const dense<[1.0, 10.0]>
          %y: f32[2,2] = add(%m, %t)
          %h: f32[2,2,2] = matmul(%z, %b)
          %u: f32[2,2,2] = mul(%h, %s)
          %v: f32[2,2,2] = add(%u, %t)
          return %y, %v
        }",
    );
    insta::assert_snapshot!("matmul", out);
}
