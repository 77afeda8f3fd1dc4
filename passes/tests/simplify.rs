//! `simplify`: snapshots of the rewritten IR plus a differential check
//! (eval before/after on random inputs) for every case.

mod common;

use common::run_pass;
use kiln_passes::Simplify;

fn simplify(text: &str) -> String {
    run_pass(&Simplify::default(), text)
}

#[test]
fn algebraic_identities() {
    let out = simplify(
        "graph(%x: f32[2,3]) {
          %one: f32[1,3] = const dense<[1.0, 1.0, 1.0]>
          %zero: f32[] = const dense<[0.0]>
          %a: f32[2,3] = mul(%x, %one)
          %b: f32[2,3] = add(%zero, %a)
          %c: f32[2,3] = sub(%b, %zero)
          %d: f32[2,3] = div(%c, %one)
          %e: f32[2,3] = mul(%one, %d)
          %f: f32[2,3] = relu(%e)
          return %f
        }",
    );
    insta::assert_snapshot!("algebraic_identities", out);
}

#[test]
fn identity_that_broadcasts_stays() {
    let out = simplify(
        "graph(%x: f32[3]) {
          %one: f32[2,3] = const dense<[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]>
          %zero: f32[] = const dense<[0.0]>
          %a: f32[2,3] = mul(%x, %one)
          %b: f32[2,3] = sub(%zero, %a)
          return %b
        }",
    );
    insta::assert_snapshot!("identity_that_broadcasts_stays", out);
}

#[test]
fn reshape_chains() {
    let out = simplify(
        "graph(%x: f32[2,3,4]) {
          %a: f32[6,4] = reshape(%x) {shape=[6,4]}
          %b: f32[24] = reshape(%a) {shape=[24]}
          %c: f32[4,6] = reshape(%b) {shape=[4,6]}
          %d: f32[2,3,4] = reshape(%c) {shape=[2,3,4]}
          %e: f32[2,3,4] = relu(%d)
          %f: f32[2,3,4] = reshape(%e) {shape=[2,3,4]}
          return %f, %c
        }",
    );
    insta::assert_snapshot!("reshape_chains", out);
}

#[test]
fn transpose_chains() {
    let out = simplify(
        "graph(%x: f32[2,3,4]) {
          %a: f32[3,4,2] = transpose(%x) {perm=[1,2,0]}
          %b: f32[2,3,4] = transpose(%a) {perm=[2,0,1]}
          %c: f32[2,3,4] = relu(%b)
          %d: f32[4,2,3] = transpose(%c) {perm=[2,0,1]}
          %e: f32[2,4,3] = transpose(%d) {perm=[1,0,2]}
          %f: f32[2,4,3] = transpose(%e) {perm=[0,1,2]}
          return %f
        }",
    );
    insta::assert_snapshot!("transpose_chains", out);
}

#[test]
fn no_op_casts() {
    let out = simplify(
        "graph(%x: f32[4], %i: i64[4]) {
          %a: f32[4] = cast(%x) {to=f32}
          %b: i64[4] = cast(%i) {to=i64}
          %c: f32[4] = cast(%b) {to=f32}
          %d: f32[4] = add(%a, %c)
          return %d
        }",
    );
    insta::assert_snapshot!("no_op_casts", out);
}

#[test]
fn common_subexpressions() {
    let out = simplify(
        "graph(%x: f32[2,3]) {
          %k1: f32[3] = const dense<[0.5, 1.5, 2.5]>
          %k2: f32[3] = const dense<[0.5, 1.5, 2.5]>
          %k3: f32[3] = const dense<[0.5, 1.5, 3.5]>
          %a: f32[2,3] = mul(%x, %k1)
          %b: f32[2,3] = mul(%x, %k2)
          %c: f32[2,3] = mul(%x, %k3)
          %ra: f32[2,3] = clip(%a) {min=0.0, max=6.0}
          %rb: f32[2,3] = clip(%b) {min=0.0, max=6.0}
          %rc: f32[2,3] = clip(%b) {min=0.0, max=5.0}
          %s: f32[2,3] = add(%ra, %rb)
          %t: f32[2,3] = add(%s, %rc)
          %u: f32[2,3] = add(%t, %c)
          return %u, %ra \"first\", %rb \"second\"
        }",
    );
    insta::assert_snapshot!("common_subexpressions", out);
}

#[test]
fn keeps_dead_code_it_did_not_make() {
    let out = simplify(
        "graph(%x: f32[2]) {
          %dead: f32[2] = exp(%x)
          %y: f32[2] = relu(%x)
          return %y
        }",
    );
    assert!(out.contains("exp(%0)"), "{out}");
}

#[test]
fn docs_example() {
    // The example in docs/passes.md.
    let out = simplify(
        "graph(%x: f32[2,3,4]) {
          %1: f32[1] = const dense<[1.0]>
          %2: f32[2,3,4] = mul(%x, %1)
          %3: f32[3,4,2] = transpose(%2) {perm=[1,2,0]}
          %4: f32[2,3,4] = transpose(%3) {perm=[2,0,1]}
          %5: f32[24] = reshape(%4) {shape=[24]}
          %6: f32[4,6] = reshape(%5) {shape=[4,6]}
          %7: f32[4,6] = relu(%6)
          %8: f32[4,6] = relu(%6)
          %9: f32[4,6] = add(%7, %8)
          return %9
        }",
    );
    insta::assert_snapshot!("docs_example", out);
}
