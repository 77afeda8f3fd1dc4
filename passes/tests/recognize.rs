//! `recognize`: decomposed LayerNorm and GELU become single ops, with the
//! differential check (reference evaluation before and after); patterns
//! whose values escape stay as they are.

mod common;

use common::run_pass;
use kiln_passes::{Pass, Recognize};

fn count(text: &str, op: &str) -> usize {
    text.matches(&format!("= {op}(")).count()
}

#[test]
fn decomposed_layer_norms_become_one_op() {
    // pow and mul squares; with γ and β, with γ only, with neither.
    for (square, tail, gamma, beta) in [
        (
            "pow(%d, %two)",
            "%g: f32[2,3,8] = mul(%n, %gamma)\n %o: f32[2,3,8] = add(%beta, %g)",
            true,
            true,
        ),
        (
            "mul(%d, %d)",
            "%o: f32[2,3,8] = mul(%gamma, %n)",
            true,
            false,
        ),
        ("mul(%d, %d)", "%o: f32[2,3,8] = neg(%n)", false, false),
    ] {
        let text = format!(
            "graph(%x: f32[2,3,8]) {{
              %two: f32[] = const dense<[2.0]>
              %eps: f32[] = const dense<[1e-5]>
              %gamma: f32[8] = const dense<[1.0, 0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 3.0]>
              %beta: f32[8] = const dense<[0.1, 0.2, 0.3, 0.4, -0.1, -0.2, -0.3, -0.4]>
              %m: f32[2,3,1] = reduce_mean(%x) {{axes=[2], keep_dims=true}}
              %d: f32[2,3,8] = sub(%x, %m)
              %s: f32[2,3,8] = {square}
              %v: f32[2,3,1] = reduce_mean(%s) {{axes=[2], keep_dims=true}}
              %e: f32[2,3,1] = add(%v, %eps)
              %r: f32[2,3,1] = sqrt(%e)
              %n: f32[2,3,8] = div(%d, %r)
              {tail}
              return %o
            }}"
        );
        let out = run_pass(&Recognize::default(), &text);
        assert_eq!(count(&out, "layer_norm"), 1, "{out}");
        assert_eq!(count(&out, "reduce_mean"), 0, "{out}");
        let args = if beta { 3 } else { 2 };
        let ln = out.lines().find(|l| l.contains("layer_norm(")).unwrap();
        assert_eq!(ln.matches('%').count(), 1 + args, "{ln}");
        assert!(ln.contains("axis=2") && ln.contains("epsilon=1e-5"), "{ln}");
        assert_eq!(out.contains("neg("), !gamma, "{out}");
    }
}

#[test]
fn erf_gelus_in_both_associations_become_one_op() {
    for body in [
        // (x * (1 + erf(x / √2))) * 0.5
        "%q: f32[4,6] = div(%x, %root2)
         %e: f32[4,6] = erf(%q)
         %t: f32[4,6] = add(%e, %one)
         %u: f32[4,6] = mul(%x, %t)
         %o: f32[4,6] = mul(%u, %half)",
        // (x * 0.5) * (1 + erf(x * (1/√2)))
        "%q: f32[4,6] = mul(%x, %inv_root2)
         %e: f32[4,6] = erf(%q)
         %t: f32[4,6] = add(%one, %e)
         %h: f32[4,6] = mul(%half, %x)
         %o: f32[4,6] = mul(%h, %t)",
    ] {
        let text = format!(
            "graph(%x: f32[4,6]) {{
              %root2: f32[] = const dense<[1.4142135]>
              %inv_root2: f32[] = const dense<[0.70710677]>
              %one: f32[] = const dense<[1.0]>
              %half: f32[] = const dense<[0.5]>
              {body}
              return %o
            }}"
        );
        let out = run_pass(&Recognize::default(), &text);
        assert!(out.contains("gelu(%0) {tanh=false}"), "{out}");
        assert_eq!(count(&out, "erf"), 0, "{out}");
    }
}

#[test]
fn decomposed_hard_swishes_become_one_op() {
    for body in [
        // (x * clip(x + 3, 0, 6)) / 6, as Paddle exports it
        "%a: f32[4,6] = add(%x, %three)
         %c: f32[4,6] = clip(%a) {min=0.0, max=6.0}
         %m: f32[4,6] = mul(%x, %c)
         %o: f32[4,6] = div(%m, %six)",
        // x * (clip(3 + x, 0, 6) * (1/6))
        "%a: f32[4,6] = add(%three, %x)
         %c: f32[4,6] = clip(%a) {min=0.0, max=6.0}
         %d: f32[4,6] = mul(%c, %sixth)
         %o: f32[4,6] = mul(%d, %x)",
    ] {
        let text = format!(
            "graph(%x: f32[4,6]) {{
              %three: f32[] = const dense<[3.0]>
              %six: f32[] = const dense<[6.0]>
              %sixth: f32[] = const dense<[0.16666667]>
              {body}
              return %o
            }}"
        );
        let out = run_pass(&Recognize::default(), &text);
        assert!(out.contains("hard_swish(%0)"), "{out}");
        assert_eq!(count(&out, "clip"), 0, "{out}");
    }
    // Not a hard-swish: clip to 0..5, or the clipped value escapes.
    for text in [
        "graph(%x: f32[4]) {
          %three: f32[] = const dense<[3.0]>
          %six: f32[] = const dense<[6.0]>
          %a: f32[4] = add(%x, %three)
          %c: f32[4] = clip(%a) {min=0.0, max=5.0}
          %m: f32[4] = mul(%x, %c)
          %o: f32[4] = div(%m, %six)
          return %o
        }",
        "graph(%x: f32[4]) {
          %three: f32[] = const dense<[3.0]>
          %six: f32[] = const dense<[6.0]>
          %a: f32[4] = add(%x, %three)
          %c: f32[4] = clip(%a) {min=0.0, max=6.0}
          %m: f32[4] = mul(%x, %c)
          %o: f32[4] = div(%m, %six)
          return %o, %c
        }",
    ] {
        let out = run_pass(&Recognize::default(), text);
        assert!(!out.contains("hard_swish"), "{out}");
    }
}

#[test]
fn tanh_gelus_with_either_cube_become_one_op() {
    for cube in [
        "%c: f32[4,6] = pow(%x, %three)",
        "%xx: f32[4,6] = mul(%x, %x)
         %c: f32[4,6] = mul(%xx, %x)",
    ] {
        let text = format!(
            "graph(%x: f32[4,6]) {{
              %three: f32[] = const dense<[3.0]>
              %k: f32[] = const dense<[0.044715]>
              %s: f32[] = const dense<[0.7978846]>
              %one: f32[] = const dense<[1.0]>
              %half: f32[] = const dense<[0.5]>
              {cube}
              %m: f32[4,6] = mul(%k, %c)
              %i: f32[4,6] = add(%x, %m)
              %a: f32[4,6] = mul(%i, %s)
              %t: f32[4,6] = tanh(%a)
              %p: f32[4,6] = add(%t, %one)
              %h: f32[4,6] = mul(%x, %half)
              %o: f32[4,6] = mul(%h, %p)
              return %o
            }}"
        );
        let out = run_pass(&Recognize::default(), &text);
        assert!(out.contains("gelu(%0) {tanh=true}"), "{out}");
        assert_eq!(count(&out, "tanh"), 0, "{out}");
    }
}

#[test]
fn patterns_whose_values_escape_stay() {
    // The centred value is also an output; 1 + erf is used twice.
    let text = "graph(%x: f32[2,8]) {
          %eps: f32[] = const dense<[1e-5]>
          %m: f32[2,1] = reduce_mean(%x) {axes=[1], keep_dims=true}
          %d: f32[2,8] = sub(%x, %m)
          %s: f32[2,8] = mul(%d, %d)
          %v: f32[2,1] = reduce_mean(%s) {axes=[1], keep_dims=true}
          %e: f32[2,1] = add(%v, %eps)
          %r: f32[2,1] = sqrt(%e)
          %n: f32[2,8] = div(%d, %r)
          %root2: f32[] = const dense<[1.4142135]>
          %one: f32[] = const dense<[1.0]>
          %half: f32[] = const dense<[0.5]>
          %q: f32[2,8] = div(%x, %root2)
          %f: f32[2,8] = erf(%q)
          %t: f32[2,8] = add(%f, %one)
          %u: f32[2,8] = mul(%x, %t)
          %o: f32[2,8] = mul(%u, %half)
          %w: f32[2,8] = add(%t, %o)
          return %n, %d, %w
        }";
    let mut g = kiln_ir::text::parse(text).unwrap();
    let stats = Recognize::default().run(&mut g).unwrap();
    assert!(!stats.changed(), "{}", kiln_ir::text::print(&g));
}

#[test]
fn decomposed_softmaxes_become_one_op() {
    for body in [
        // exp(x - max(x)) / sum(...)
        "%m: f32[2,5,1] = reduce_max(%x) {axes=[2], keep_dims=true}
         %d: f32[2,5,7] = sub(%x, %m)
         %e: f32[2,5,7] = exp(%d)
         %s: f32[2,5,1] = reduce_sum(%e) {axes=[2], keep_dims=true}
         %o: f32[2,5,7] = div(%e, %s)",
        // exp(x) / sum(exp(x)), over a middle axis
        "%e: f32[2,5,7] = exp(%x)
         %s: f32[2,1,7] = reduce_sum(%e) {axes=[1], keep_dims=true}
         %o: f32[2,5,7] = div(%e, %s)",
    ] {
        let text = format!(
            "graph(%x: f32[2,5,7]) {{
              {body}
              return %o
            }}"
        );
        let out = run_pass(&Recognize::default(), &text);
        assert_eq!(count(&out, "softmax"), 1, "{out}");
        assert_eq!(count(&out, "exp"), 0, "{out}");
    }
    // Max and sum over different axes: not a softmax.
    let text = "graph(%x: f32[2,5,7]) {
          %m: f32[2,1,7] = reduce_max(%x) {axes=[1], keep_dims=true}
          %d: f32[2,5,7] = sub(%x, %m)
          %e: f32[2,5,7] = exp(%d)
          %s: f32[2,5,1] = reduce_sum(%e) {axes=[2], keep_dims=true}
          %o: f32[2,5,7] = div(%e, %s)
          return %o
        }";
    let out = run_pass(&Recognize::default(), text);
    assert_eq!(count(&out, "softmax"), 1, "{out}");
    assert_eq!(count(&out, "reduce_max"), 1, "the max stays: {out}");
}

/// Q @ Kt, then `scaling` (lines ending in `%z`), softmax over `axis`,
/// then @ V.
fn attention_graph(scaling: &str, axis: usize) -> String {
    format!(
        "graph(%q: f32[2,3,6,4], %kt: f32[2,3,4,9], %v: f32[2,3,9,5], %mask: f32[2,1,1,9]) {{
          %c: f32[] = const dense<[2.0]>
          %s: f32[2,3,6,9] = matmul(%q, %kt)
          {scaling}
          %p: f32[2,3,6,9] = softmax(%z) {{axis={axis}}}
          %o: f32[2,3,6,5] = matmul(%p, %v)
          return %o
        }}"
    )
}

#[test]
fn scaled_dot_product_attention_becomes_one_op() {
    for (scaling, scale, masked) in [
        (
            "%w: f32[2,3,6,9] = div(%s, %c)\n %z: f32[2,3,6,9] = add(%w, %mask)",
            "0.5",
            true,
        ),
        ("%z: f32[2,3,6,9] = mul(%c, %s)", "2.0", false),
        ("%z: f32[2,3,6,9] = add(%mask, %s)", "1.0", true),
        ("%z: f32[2,3,6,9] = neg(%s)", "", false),
    ] {
        let text = attention_graph(scaling, 3);
        let out = run_pass(&Recognize::default(), &text);
        if scale.is_empty() {
            // The negation is neither a scale nor a mask.
            assert_eq!(count(&out, "attention"), 0, "{out}");
            continue;
        }
        let line = out
            .lines()
            .find(|l| l.contains("attention("))
            .unwrap_or_else(|| panic!("{out}"));
        assert!(line.contains(&format!("scale={scale}")), "{line}");
        assert_eq!(
            line.matches('%').count(),
            1 + 3 + usize::from(masked),
            "{line}"
        );
        assert_eq!(count(&out, "matmul") + count(&out, "softmax"), 0, "{out}");
        let none = run_pass(&Recognize::without_attention(), &text);
        assert_eq!(count(&none, "attention"), 0, "{none}");
    }
    // A softmax over another axis is not attention.
    let out = run_pass(
        &Recognize::default(),
        &attention_graph("%z: f32[2,3,6,9] = add(%s, %mask)", 2),
    );
    assert_eq!(count(&out, "attention"), 0, "{out}");
}
