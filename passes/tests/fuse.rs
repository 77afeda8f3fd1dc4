//! `fuse`: snapshots of fused IR, the text round trip of every fused
//! graph, and differential checks (reference evaluation before and after,
//! on hand-written, fixture and randomly generated graphs).

mod common;

use common::{assert_equivalent, run_pass, Rng};
use kiln_ir::text::{print_with, PrintOptions};
use kiln_ir::{BinaryOp, Conv2d, DType, FusedStore, Graph, NodeId, Op, Tensor, UnaryOp, ValueType};
use kiln_passes::{Fuse, Pass, PassManager, PipelineOptions};
use std::path::Path;

/// Runs `fuse` on `text` (with the differential check of [`run_pass`]),
/// checks that the result prints and parses back to the same text, and
/// returns it.
fn fuse(text: &str) -> String {
    let out = run_pass(&Fuse::default(), text);
    let mut g = kiln_ir::text::parse(text).unwrap();
    Fuse::default().run(&mut g).unwrap();
    round_trips(&g);
    out
}

/// Asserts that `g` prints (with every constant) and parses back to the
/// same text.
fn round_trips(g: &Graph) {
    let full = PrintOptions {
        full_constants: true,
    };
    let text = print_with(g, &full);
    let back = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print_with(&back, &full), text);
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.node_ids().filter(|&id| pred(&g.node(id).op)).count()
}

#[test]
fn conv_bias_relu_residual_becomes_one_kernel() {
    let out = fuse(
        "graph(%x: f32[1,2,4,4], %r: f32[1,2,4,4]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,4,4] = conv(%x, %w)  # onnx: conv
          %b: f32[1,2,1,1] = const dense<[0.1, -0.2]>
          %y: f32[1,2,4,4] = add(%c, %b)  # onnx: bias
          %z: f32[1,2,4,4] = relu(%y)  # onnx: relu
          %s: f32[1,2,4,4] = add(%r, %z)  # onnx: residual
          return %s
        }",
    );
    insta::assert_snapshot!("conv_bias_relu_residual", out);
}

#[test]
fn matmul_bias_gelu_and_an_elementwise_chain() {
    let out = fuse(
        "graph(%x: f32[2,3,4], %t: f32[2,3,5]) {
          %w: f32[4,5] = const dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, -1.0, -2.0, -3.0, -4.0, -5.0, 0.5, 0.25, 0.125, 0.0, 1.5]>
          %m: f32[2,3,5] = matmul(%x, %w)  # onnx: mm
          %b: f32[5] = const dense<[0.1, 0.2, 0.3, 0.4, 0.5]>
          %y: f32[2,3,5] = add(%b, %m)  # onnx: bias
          %g: f32[2,3,5] = gelu(%y)  # onnx: gelu
          %e: f32[2,3,5] = exp(%t)  # onnx: exp
          %q: f32[2,3,5] = mul(%e, %e)  # onnx: square
          %k: f32[] = const dense<[6.0]>
          %c: f32[2,3,5] = clip(%q) {min=0.0, max=6.0}  # onnx: clip
          %d: f32[2,3,5] = div(%c, %k)  # onnx: div
          %o: f32[2,3,5] = sub(%g, %d)  # onnx: out
          return %o
        }",
    );
    insta::assert_snapshot!("matmul_bias_gelu_and_chain", out);
}

#[test]
fn values_used_twice_inside_a_chain_fuse() {
    // Conv, then hard-swish (x * clip(x + 3, 0, 6) / 6) and a per-channel
    // affine; MatMul, then erf-form GELU (0.5 * x * (1 + erf(x / √2))).
    let out = fuse(
        "graph(%x: f32[1,2,3,3], %t: f32[4,2]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,3,3] = conv(%x, %w)  # onnx: conv
          %three: f32[] = const dense<[3.0]>
          %six: f32[] = const dense<[6.0]>
          %a: f32[1,2,3,3] = add(%c, %three)  # onnx: add3
          %r: f32[1,2,3,3] = clip(%a) {min=0.0, max=6.0}  # onnx: relu6
          %m: f32[1,2,3,3] = mul(%c, %r)  # onnx: mul
          %d: f32[1,2,3,3] = div(%m, %six)  # onnx: hardswish
          %s: f32[2,1,1] = const dense<[1.5, -0.5]>
          %y: f32[1,2,3,3] = mul(%s, %d)  # onnx: scale
          %v: f32[2,2] = const dense<[1.0, 2.0, -1.0, 0.5]>
          %p: f32[4,2] = matmul(%t, %v)  # onnx: mm
          %sqrt2: f32[] = const dense<[1.4142135]>
          %one: f32[] = const dense<[1.0]>
          %half: f32[] = const dense<[0.5]>
          %q: f32[4,2] = div(%p, %sqrt2)  # onnx: gelu_div
          %e: f32[4,2] = erf(%q)  # onnx: gelu_erf
          %f: f32[4,2] = add(%e, %one)  # onnx: gelu_add
          %g: f32[4,2] = mul(%p, %f)  # onnx: gelu_mul
          %h: f32[4,2] = mul(%g, %half)  # onnx: gelu_half
          return %y, %h
        }",
    );
    insta::assert_snapshot!("values_used_twice_inside_a_chain", out);
}

#[test]
fn a_value_used_outside_the_chain_ends_it() {
    // %c feeds the chain twice and also %out2: the conv cannot be the
    // head (its value must be written), the chain after it fuses alone.
    let text = "graph(%x: f32[1,2,3,3]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,3,3] = conv(%x, %w)
          %three: f32[] = const dense<[3.0]>
          %a: f32[1,2,3,3] = add(%c, %three)
          %r: f32[1,2,3,3] = relu(%a)
          %m: f32[1,2,3,3] = mul(%c, %r)
          %n: f32[1,2,3,3] = neg(%c)
          return %m, %n
        }";
    let before = kiln_ir::text::parse(text).unwrap();
    let mut after = before.clone();
    let stats = Fuse::default().run(&mut after).unwrap();
    kiln_ir::verify::verify(&after).unwrap();
    assert_equivalent(&before, &after, 1e-6);
    assert_eq!((stats.fused_nodes, stats.fused_kernels), (3, 1));
    assert_eq!(count(&after, |op| matches!(op, Op::Conv(_))), 1);
}

#[test]
fn shared_values_outputs_and_broadcasting_stop_a_chain() {
    // %a has two users, %b is a graph output, and %d enlarges its operand.
    let text = "graph(%x: f32[4], %y: f32[3,4]) {
          %a: f32[4] = exp(%x)
          %b: f32[4] = relu(%a)
          %c: f32[4] = neg(%a)
          %d: f32[3,4] = add(%c, %y)
          %e: f32[3,4] = sigmoid(%d)
          return %b, %e
        }";
    let before = kiln_ir::text::parse(text).unwrap();
    let mut after = before.clone();
    let stats = Fuse::default().run(&mut after).unwrap();
    kiln_ir::verify::verify(&after).unwrap();
    assert_equivalent(&before, &after, 1e-6);
    // Only add+sigmoid fuse.
    assert_eq!((stats.fused_nodes, stats.fused_kernels), (2, 1));
    assert_eq!(count(&after, |op| matches!(op, Op::Fused(_))), 1);
    assert_eq!(after.node_count(), before.node_count() - 1);
}

#[test]
fn the_cast_ending_an_activation_quantization_joins_its_producer() {
    // The conv's chain stores u8 (one kernel, the cast inside); the second
    // quantization's rounded value has another user, so its chain ends
    // before the cast, which stays a node of its own.
    let out = fuse(
        "graph(%x: f32[1,2,3,3]) {
          %w: f32[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,3,3] = conv(%x, %w)  # onnx: conv
          %s: f32[] = const dense<[0.05]>
          %z: f32[] = const dense<[128.0]>
          %q: f32[1,2,3,3] = div(%c, %s)  # onnx: x_scaled
          %r: f32[1,2,3,3] = round(%q)  # onnx: x_rounded
          %h: f32[1,2,3,3] = add(%r, %z)  # onnx: x_shifted
          %k: f32[1,2,3,3] = clip(%h) {min=0.0, max=255.0}  # onnx: x_saturated
          %u: u8[1,2,3,3] = cast(%k) {to=u8}  # onnx: x_quantized
          %e: f32[1,2,3,3] = exp(%x)  # onnx: exp
          %d: f32[1,2,3,3] = div(%e, %s)  # onnx: scaled2
          %v: f32[1,2,3,3] = round(%d)  # onnx: rounded2
          %u2: u8[1,2,3,3] = cast(%v) {to=u8}  # onnx: quantized2
          return %u, %u2, %v
        }",
    );
    insta::assert_snapshot!("quantize_cast_joins_producer", out);
    let mut g = kiln_ir::text::parse(&out).unwrap();
    let mut stores: Vec<FusedStore> = (g.node_ids())
        .filter_map(|id| match &g.node(id).op {
            Op::Fused(k) => Some(k.store()),
            _ => None,
        })
        .collect();
    stores.sort_by_key(|s| s.dtype().size_bytes());
    assert_eq!(stores, [FusedStore::U8, FusedStore::F32]);
    assert_eq!(count(&g, |op| matches!(op, Op::Cast { .. })), 1);
    // Nothing left to fuse: the pass is idempotent.
    assert!(!Fuse::default().run(&mut g).unwrap().changed());
}

/// The dense ops of a reduced-precision layer (f16 weights; bf16 weights
/// and activation) head their chains like f32 ones: their kernels read the
/// 16-bit operands as stored and return f32.
#[test]
fn reduced_precision_dense_ops_head_their_chains() {
    let text = "graph(%x: f32[1,2,4,4], %v: f32[3,2]) {
          %w: f16[2,2,1,1] = const dense<[0.5, -1.0, 2.0, 0.25]>
          %c: f32[1,2,4,4] = conv(%x, %w)
          %b: f32[1,2,1,1] = const dense<[0.1, -0.2]>
          %y: f32[1,2,4,4] = add(%c, %b)
          %z: f32[1,2,4,4] = relu(%y)
          %vb: bf16[3,2] = cast(%v) {to=bf16}
          %m: bf16[2,2] = const dense<[1.0, 0.5, -0.25, 2.0]>
          %p: f32[3,2] = matmul(%vb, %m)
          %g: f32[3,2] = gelu(%p)
          return %z, %g
        }";
    let out = run_pass(&Fuse::default(), text);
    let g = kiln_ir::text::parse(&out).unwrap();
    round_trips(&g);
    let heads = |g: &Graph| count(g, |op| matches!(op, Op::Fused(k) if k.head().is_some()));
    assert_eq!(heads(&g), 2, "{out}");
    assert_eq!(
        count(&g, |op| matches!(op, Op::Conv(_) | Op::MatMul)),
        0,
        "{out}"
    );
}

#[test]
fn a_single_elementwise_op_and_non_f32_chains_stay() {
    let text = "graph(%x: f32[4], %i: i32[4]) {
          %a: f32[4] = relu(%x)
          %b: i32[4] = neg(%i)
          %c: i32[4] = abs(%b)
          return %a, %c
        }";
    let mut g = kiln_ir::text::parse(text).unwrap();
    let stats = Fuse::default().run(&mut g).unwrap();
    assert!(!stats.changed());
}

fn fixture(name: &str) -> Graph {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/models")
        .join(name);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let mut opts = kiln_onnx::ImportOptions::default();
    if let Some(shapes) = meta["input_shapes"].as_object() {
        for (name, dims) in shapes {
            let dims = (dims.as_array().unwrap().iter())
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            opts.input_shapes.insert(name.clone(), dims);
        }
    }
    kiln_onnx::import(&dir.join("model.onnx"), &opts).unwrap()
}

#[test]
fn digits_cnn_after_o2() {
    let before = fixture("digits_cnn");
    let mut after = before.clone();
    let report = PassManager::for_level(2)
        .unwrap()
        .run(&mut after, &PipelineOptions { verify_each: true })
        .unwrap();
    let fuse = report.passes.iter().find(|p| p.name == "fuse").unwrap();
    assert_eq!(fuse.stats.summary(), "fused 4 nodes into 2 kernels");
    assert_equivalent(&before, &after, 1e-5);
    round_trips(&after);
    insta::assert_snapshot!("digits_cnn_o2", kiln_ir::text::print(&after));
}

/// A random f32 tensor with values in [-2, 2).
fn random_tensor(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|_| rng.f64(-2.0, 2.0) as f32).collect();
    Tensor::new(shape, kiln_ir::Data::F32(v)).unwrap()
}

const UNARY: [UnaryOp; 10] = [
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::HardSwish,
    UnaryOp::Clip {
        min: -1.0,
        max: 1.5,
    },
    UnaryOp::Gelu { tanh: false },
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::LeakyRelu { alpha: 0.1 },
];

const BINARY: [BinaryOp; 5] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Max,
    BinaryOp::Min,
];

/// A shape that broadcasts to `shape` without enlarging it: some dims set
/// to 1, some leading dims dropped.
fn sub_shape(rng: &mut Rng, shape: &[usize]) -> Vec<usize> {
    let drop = rng.below(shape.len() + 1);
    shape[drop..]
        .iter()
        .map(|&d| if rng.below(2) == 0 { 1 } else { d })
        .collect()
}

/// A random graph: an optional dense head, then a random elementwise
/// chain with constant or input operands, side users and outputs.
fn random_graph(rng: &mut Rng) -> Graph {
    let mut g = Graph::new();
    let (mut cur, shape): (NodeId, Vec<usize>) = match rng.below(4) {
        0 => {
            let x = g.add_input("x", ValueType::new(DType::F32, [2, 3, 5, 4]));
            let w = g.add_const("w", random_tensor(rng, &[4, 3, 3, 3]));
            let mut ins = vec![x, w];
            if rng.below(2) == 0 {
                ins.push(g.add_const("b", random_tensor(rng, &[4])));
            }
            let conv = Conv2d {
                strides: [1, 1],
                pads: [1, 1, 1, 1],
                dilations: [1, 1],
                group: 1,
            };
            (
                g.add_node(Op::Conv(conv), &ins, "conv").unwrap(),
                vec![2, 4, 5, 4],
            )
        }
        1 => {
            let x = g.add_input("x", ValueType::new(DType::F32, [2, 3, 6]));
            let w = g.add_const("w", random_tensor(rng, &[6, 5]));
            (
                g.add_node(Op::MatMul, &[x, w], "mm").unwrap(),
                vec![2, 3, 5],
            )
        }
        2 => {
            let x = g.add_input("x", ValueType::new(DType::F32, [3, 6]));
            let w = g.add_const("w", random_tensor(rng, &[5, 6]));
            let c = g.add_const("c", random_tensor(rng, &[5]));
            let op = Op::Gemm {
                alpha: 0.5,
                beta: 2.0,
                trans_a: false,
                trans_b: true,
            };
            (g.add_node(op, &[x, w, c], "gemm").unwrap(), vec![3, 5])
        }
        _ => {
            let x = g.add_input("x", ValueType::new(DType::F32, [2, 3, 4]));
            (x, vec![2, 3, 4])
        }
    };
    let mut extra_inputs = 0;
    for step in 0..2 + rng.below(6) {
        let name = format!("n{step}");
        cur = if rng.below(2) == 0 {
            let u = UNARY[rng.below(UNARY.len())];
            g.add_node(Op::Unary(u), &[cur], name).unwrap()
        } else {
            let b = BINARY[rng.below(BINARY.len())];
            let s = sub_shape(rng, &shape);
            let other = match rng.below(3) {
                0 => cur,
                1 => g.add_const(format!("k{step}"), random_tensor(rng, &s)),
                _ => {
                    extra_inputs += 1;
                    g.add_input(format!("in{extra_inputs}"), ValueType::new(DType::F32, s))
                }
            };
            let args = if rng.below(2) == 0 {
                [cur, other]
            } else {
                [other, cur]
            };
            g.add_node(Op::Binary(b), &args, name).unwrap()
        };
        match rng.below(8) {
            0 => g.add_output(format!("side{step}"), cur),
            1 => {
                let s = g.add_node(Op::Unary(UnaryOp::Neg), &[cur], format!("s{step}"));
                g.add_output(format!("user{step}"), s.unwrap());
            }
            _ => {}
        }
    }
    g.add_output("y", cur);
    g
}

#[test]
fn random_graphs_evaluate_the_same_after_fusion() {
    let mut rng = Rng::new(0x5eed);
    let mut fused = 0;
    for case in 0..200 {
        let before = random_graph(&mut rng);
        let mut after = before.clone();
        let stats = Fuse::default().run(&mut after).unwrap();
        fused += stats.fused_kernels;
        kiln_ir::verify::verify(&after).unwrap_or_else(|e| panic!("case {case}: {e}"));
        // Fused kernels evaluate op by op as the nodes they replace, so
        // the results are bit-identical.
        assert_equivalent(&before, &after, 0.0);
        round_trips(&after);
    }
    assert!(fused > 150, "only {fused} kernels fused in 200 graphs");
}
