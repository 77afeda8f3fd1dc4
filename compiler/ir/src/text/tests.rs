//! Tests of the text format: round trips, parse errors, snapshots.

use super::{parse, print, print_with, PrintOptions};
use crate::op::{Conv2d, Pool2d, SliceAxis};
use crate::{
    BinaryOp, BitwiseOp, CompareOp, DType, Data, Graph, IrError, LogicalOp, NodeId, Op, ReduceOp,
    Tensor, UnaryOp, ValueType,
};
use half::{bf16, f16};
use smallvec::smallvec;
use std::collections::{HashMap, HashSet};

const FULL: PrintOptions = PrintOptions {
    full_constants: true,
};

fn vt(dtype: DType, shape: &[usize]) -> ValueType {
    ValueType::new(dtype, shape)
}

fn f32_const(g: &mut Graph, name: &str, shape: &[usize]) -> NodeId {
    let n: usize = shape.iter().product();
    // Exactly representable, platform-independent values (no libm).
    let data = (0..n).map(|i| (i % 7) as f32 * 0.25 - 0.5).collect();
    g.add_const(name, Tensor::new(shape, Data::F32(data)).unwrap())
}

/// Print order: inputs first, then the rest in topological order.
fn print_order(g: &Graph) -> Vec<NodeId> {
    let inputs: HashSet<NodeId> = g.inputs().iter().copied().collect();
    let mut order = g.inputs().to_vec();
    order.extend(
        g.topo_order()
            .unwrap()
            .into_iter()
            .filter(|id| !inputs.contains(id)),
    );
    order
}

fn same_op(a: &Op, b: &Op) -> bool {
    match (a, b) {
        // Bitwise, so that NaNs compare equal to themselves.
        (Op::Constant(x), Op::Constant(y)) => {
            x.dtype() == y.dtype()
                && x.shape() == y.shape()
                && x.data().to_le_bytes() == y.data().to_le_bytes()
        }
        (Op::Unary(x), Op::Unary(y)) => format!("{x:?}") == format!("{y:?}"),
        _ => a == b,
    }
}

/// Structural equality: same nodes (op, name, type) in print order, same
/// operands, same inputs and named outputs.
fn assert_same_graph(a: &Graph, b: &Graph) {
    let (oa, ob) = (print_order(a), print_order(b));
    assert_eq!(oa.len(), ob.len(), "node count");
    let na: HashMap<NodeId, usize> = oa.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let nb: HashMap<NodeId, usize> = ob.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    for (&x, &y) in oa.iter().zip(&ob) {
        let (nx, ny) = (a.node(x), b.node(y));
        assert!(same_op(&nx.op, &ny.op), "{:?} vs {:?}", nx.op, ny.op);
        assert_eq!(nx.name, ny.name);
        assert_eq!(nx.ty, ny.ty);
        let ia: Vec<usize> = a.inputs_of(x).iter().map(|i| na[i]).collect();
        let ib: Vec<usize> = b.inputs_of(y).iter().map(|i| nb[i]).collect();
        assert_eq!(ia, ib, "operands of {}", nx.name);
    }
    let ins =
        |g: &Graph, n: &HashMap<NodeId, usize>| g.inputs().iter().map(|i| n[i]).collect::<Vec<_>>();
    assert_eq!(ins(a, &na), ins(b, &nb));
    let outs = |g: &Graph, n: &HashMap<NodeId, usize>| {
        g.outputs()
            .iter()
            .map(|(s, i)| (s.clone(), n[i]))
            .collect::<Vec<_>>()
    };
    assert_eq!(outs(a, &na), outs(b, &nb));
}

fn round_trip(g: &Graph) -> String {
    crate::verify::verify(g).unwrap();
    let text = print_with(g, &FULL);
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    crate::verify::verify(&parsed).unwrap();
    assert_eq!(print_with(&parsed, &FULL), text);
    assert_same_graph(g, &parsed);
    text
}

/// A graph using every op and every attribute.
fn all_ops_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("image", vt(DType::F32, &[1, 4, 8, 8]));
    let ids = g.add_input("token ids", vt(DType::I64, &[3]));
    let v = g.add_input("v", vt(DType::F32, &[2, 3]));
    let w = f32_const(&mut g, "conv.weight", &[4, 4, 3, 3]);
    let b = f32_const(&mut g, "conv.bias", &[4]);
    let conv = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let c1 = g.add_node(conv, &[x, w, b], "/layer1/conv1").unwrap();
    let w2 = f32_const(&mut g, "conv2.weight", &[4, 2, 3, 3]);
    let conv2 = Op::Conv(Conv2d {
        strides: [2, 1],
        pads: [2, 1, 2, 0],
        dilations: [2, 1],
        group: 2,
    });
    let c2 = g.add_node(conv2, &[c1, w2], "/layer1/conv2").unwrap();
    let mp = g
        .add_node(
            Op::MaxPool(Pool2d {
                kernel: [2, 2],
                strides: [2, 2],
                pads: [0, 0, 1, 1],
                dilations: [1, 1],
                ceil_mode: true,
            }),
            &[c1],
            "max pool",
        )
        .unwrap();
    let ap = g
        .add_node(
            Op::AveragePool {
                pool: Pool2d {
                    kernel: [3, 2],
                    strides: [1, 2],
                    pads: [1, 0, 1, 0],
                    dilations: [1, 2],
                    ceil_mode: false,
                },
                count_include_pad: true,
            },
            &[c1],
            "avg \"pool\"",
        )
        .unwrap();
    let gap = g.add_node(Op::GlobalAveragePool, &[c2], "gap").unwrap();
    let gmp = g.add_node(Op::GlobalMaxPool, &[mp], "gmp").unwrap();
    let ap_gap = g.add_node(Op::GlobalAveragePool, &[ap], "").unwrap();
    let sum = g
        .add_node(Op::Binary(BinaryOp::Add), &[gap, gmp], "sum")
        .unwrap();
    let sum = g
        .add_node(Op::Binary(BinaryOp::Sub), &[sum, ap_gap], "diff")
        .unwrap();
    let flat = g
        .add_node(
            Op::Reshape {
                shape: smallvec![1, 4],
            },
            &[sum],
            "flatten",
        )
        .unwrap();

    let unary = [
        UnaryOp::Relu,
        UnaryOp::LeakyRelu { alpha: 0.01 },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::HardSigmoid {
            alpha: 0.2,
            beta: 0.5,
        },
        UnaryOp::HardSwish,
        UnaryOp::Clip {
            min: f32::NEG_INFINITY,
            max: 6.0,
        },
        UnaryOp::Clip {
            min: -1e-7,
            max: f32::INFINITY,
        },
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Reciprocal,
        UnaryOp::Floor,
        UnaryOp::Ceil,
    ];
    let mut h = flat;
    for (i, u) in unary.into_iter().enumerate() {
        h = g
            .add_node(Op::Unary(u), &[h], format!("unary {i}"))
            .unwrap();
    }
    let binary = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
    ];
    let bias = f32_const(&mut g, "row", &[4]);
    for bop in binary {
        h = g.add_node(Op::Binary(bop), &[h, bias], bop.name()).unwrap();
    }
    let fc_w = f32_const(&mut g, "fc.weight", &[3, 4]);
    let fc_b = f32_const(&mut g, "fc.bias", &[3]);
    let gemm = Op::Gemm {
        alpha: 0.5,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let fc = g.add_node(gemm, &[h, fc_w, fc_b], "/fc/Gemm").unwrap();
    let gemm2 = Op::Gemm {
        alpha: 1.0,
        beta: 0.0,
        trans_a: true,
        trans_b: false,
    };
    let fc_t = g.add_node(gemm2, &[fc, fc], "gemm2").unwrap();
    let sm = g
        .add_node(Op::Softmax { axis: 1 }, &[fc_t], "softmax")
        .unwrap();
    let mm = g.add_node(Op::MatMul, &[v, sm], "matmul").unwrap();
    let tr = g
        .add_node(
            Op::Transpose {
                perm: smallvec![1, 0],
            },
            &[mm],
            "transpose",
        )
        .unwrap();
    let cat = g
        .add_node(Op::Concat { axis: 1 }, &[tr, tr, sm], "concat")
        .unwrap();
    let gat = g
        .add_node(Op::Gather { axis: 1 }, &[cat, ids], "gather")
        .unwrap();
    let sl = g
        .add_node(
            Op::Slice {
                axes: smallvec![
                    SliceAxis {
                        start: 0,
                        step: 1,
                        len: 3
                    },
                    SliceAxis {
                        start: 2,
                        step: -1,
                        len: 2
                    },
                ],
            },
            &[gat],
            "slice",
        )
        .unwrap();
    let mut outs = vec![sl];
    for to in DType::ALL {
        outs.push(
            g.add_node(Op::Cast { to }, &[sl], format!("cast to {to}"))
                .unwrap(),
        );
    }
    let bits = g
        .add_node(Op::Bitcast { to: DType::I32 }, &[sl], "bitcast")
        .unwrap();
    let kt = f32_const(&mut g, "keys", &[3, 4]);
    let values = f32_const(&mut g, "values", &[4, 5]);
    let att = g
        .add_node(Op::Attention { scale: 0.5 }, &[v, kt, values], "attention")
        .unwrap();
    g.add_output("probs", sm);
    g.add_output("sliced", sl);
    g.add_output("cast\tf16", outs[2]);
    g.add_output("image again", x);
    g.add_output("probs", sm);
    g.add_output("bits", bits);
    g.add_output("attended", att);
    g
}

/// Constants of every element type, including awkward values.
fn constants_graph() -> Graph {
    let mut g = Graph::new();
    let consts = [
        Tensor::new(
            [2, 4],
            Data::F32(vec![
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                f32::from_bits(0x7fc0_0001),
                f32::from_bits(0xffc0_0000),
                f32::from_bits(1),
            ]),
        ),
        Tensor::new([3], Data::F32(vec![0.1, 1e-7, 3.4028235e38])),
        Tensor::new(
            [4],
            Data::F16(vec![
                f16::from_f32(0.1),
                f16::NAN,
                f16::from_bits(0x7e01),
                f16::from_bits(1),
            ]),
        ),
        Tensor::new(
            [4],
            Data::BF16(vec![
                bf16::from_f32(0.1),
                bf16::NAN,
                bf16::NEG_INFINITY,
                bf16::from_bits(0xffc1),
            ]),
        ),
        Tensor::new(
            [4],
            Data::F64(vec![
                0.1,
                f64::NAN,
                f64::from_bits(0x7ff8_0000_0000_0001),
                1e300,
            ]),
        ),
        Tensor::new([3], Data::I8(vec![i8::MIN, 0, i8::MAX])),
        Tensor::new([2], Data::U8(vec![0, 255])),
        Tensor::new([2], Data::I16(vec![i16::MIN, i16::MAX])),
        Tensor::new([2], Data::I32(vec![i32::MIN, i32::MAX])),
        Tensor::new([1, 2], Data::I64(vec![i64::MIN, i64::MAX])),
        Tensor::new([2, 1], Data::Bool(vec![true, false])),
        Tensor::new([], Data::F32(vec![2.5])),
        Tensor::new([0], Data::F32(vec![])),
        Tensor::new([17], Data::I32((0..17).collect())),
        Tensor::new([2], Data::U16(vec![0, u16::MAX])),
        Tensor::new([2], Data::U32(vec![1, u32::MAX])),
        Tensor::new([3], Data::U64(vec![0, 1 << 63, u64::MAX])),
    ];
    let names = [
        "f32 specials",
        "",
        " leading space",
        "trailing space ",
        "new\nline",
        "\"quoted\"",
        "back\\slash",
        "# hash",
        "ünïcödé/path:0",
        "tab\there",
        "bell\u{7}",
        "scalar",
        "empty",
        "seventeen",
        "u16",
        "u32",
        "u64",
    ];
    for (i, (t, name)) in consts.into_iter().zip(names).enumerate() {
        let id = g.add_const(name, t.unwrap());
        g.add_output(format!("out{i} \"{name}\""), id);
    }
    g
}

#[test]
fn round_trip_all_ops() {
    let text = round_trip(&all_ops_graph());
    // Every op name appears.
    for name in [
        "relu(",
        "leaky_relu(",
        "sigmoid(",
        "tanh(",
        "hard_sigmoid(",
        "hard_swish(",
        "clip(",
        "neg(",
        "abs(",
        "sqrt(",
        "exp(",
        "log(",
        "reciprocal(",
        "floor(",
        "ceil(",
        "add(",
        "sub(",
        "mul(",
        "div(",
        "pow(",
        "max(",
        "min(",
        "matmul(",
        "gemm(",
        "conv(",
        "max_pool(",
        "average_pool(",
        "global_average_pool(",
        "global_max_pool(",
        "softmax(",
        "reshape(",
        "transpose(",
        "concat(",
        "gather(",
        "slice(",
        "cast(",
        "bitcast(",
        "attention(",
        "const dense<",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    assert!(text.contains("{axes=[0:1:3, 2:-1:2]}"), "{text}");
    assert!(text.contains("clip(%"), "{text}");
    assert!(text.contains("{min=-inf, max=6.0}"), "{text}");
    assert!(text.contains("{min=-1e-7, max=inf}"), "{text}");
}

#[test]
fn round_trip_constants() {
    let text = round_trip(&constants_graph());
    assert!(text.contains("nan:0x7fc00001"), "{text}");
    assert!(text.contains("nan:0xffc00000"), "{text}");
    assert!(text.contains("nan:0x7e01"), "{text}");
    assert!(text.contains("nan:0x7ff8000000000001"), "{text}");
    assert!(text.contains("= const dense<[]>"), "{text}");
    assert!(
        text.contains("u64[3] = const dense<[0, 9223372036854775808, 18446744073709551615]>"),
        "{text}"
    );
}

#[test]
fn round_trip_after_removals_is_index_independent() {
    // Holes in the petgraph indices do not show in the numbering.
    let mut g = Graph::new();
    let dead = g.add_const("dead", Tensor::scalar_f32(1.0));
    let x = g.add_input("x", vt(DType::F32, &[2]));
    let dead2 = g.add_node(Op::Unary(UnaryOp::Neg), &[x], "dead2").unwrap();
    let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "y").unwrap();
    g.add_output("y", y);
    assert!(g.remove_unused(dead));
    assert!(g.remove_unused(dead2));
    let text = round_trip(&g);
    assert_eq!(
        text,
        "graph(%0: f32[2] \"x\") {\n  %1: f32[2] = relu(%0)  # onnx: y\n  return %1 \"y\"\n}\n"
    );
}

#[test]
fn empty_graph() {
    let g = Graph::new();
    assert_eq!(round_trip(&g), "graph() {\n  return\n}\n");
}

#[test]
fn elided_constants() {
    let g = all_ops_graph();
    let text = print(&g);
    assert!(text.contains("const elided<144 x f32, fnv1a=0x"), "{text}");
    // Small constants stay dense.
    assert!(text.contains("%4: f32[4] = const dense<["), "{text}");
    let line = text.lines().position(|l| l.contains("elided<")).unwrap() + 1;
    match parse(&text) {
        Err(IrError::Parse { line: l, message }) => {
            assert_eq!(l, line);
            assert!(message.contains("without full constants"), "{message}");
            assert!(message.contains("full_constants: true"), "{message}");
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn fnv1a_known_values() {
    // FNV-1a 64 test vectors: "" and "a".
    assert_eq!(
        super::print::fnv1a(&Data::U8(vec![])),
        0xcbf2_9ce4_8422_2325
    );
    assert_eq!(
        super::print::fnv1a(&Data::U8(vec![b'a'])),
        0xaf63_dc4c_8601_ec8c
    );
}

#[test]
fn hand_written_ir_with_defaults() {
    let text = r#"
# A hand-written graph: named values, default attributes, comments.
graph(%x: f32[1,3,8,8], %w: f32[2,3,3,3] "weights") {
  %y: f32[1,2,6,6] = conv(%x, %w)            # onnx: conv
  %p: f32[1,2,3,3] = max_pool(%y) {kernel=[2,2], strides=[2,2]}
  %q: f32[1,2,3,3] = leaky_relu(%p)
  %r: f32[1,2,3,3] = clip(%q) {max=6}        # an ordinary comment
  %s: f32[1,18] = reshape(%r) {shape=[1,18]}
  %t: f32[1,1] = gemm(%s, %s) {trans_b=true, beta=0.0}
  return %r, %t "t"
}
"#;
    let g = parse(text).unwrap();
    let printed = print(&g);
    insta::assert_snapshot!("hand_written", printed);
    assert_eq!(g.outputs()[0].0, "r");
    assert_eq!(g.node(g.inputs()[0]).name, "x");
    assert_eq!(g.node(g.inputs()[1]).name, "weights");
    let p = parse(&printed).unwrap();
    assert_same_graph(&g, &p);
}

fn parse_err(text: &str) -> (usize, String) {
    match parse(text) {
        Err(IrError::Parse { line, message }) => (line, message),
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn parse_errors() {
    let header = "graph(%0: f32[2,3] \"x\") {\n";
    let cases: &[(&str, usize, &str)] = &[
        ("  %1: f32[2,3] = frobnicate(%0)\n  return %1\n}\n", 2, "unknown op `frobnicate`"),
        ("  %1: f32[2,3] = relu(%7)\n  return %1\n}\n", 2, "undefined value %7"),
        ("  %1: f32[2,3] = relu(%0)\n  return %9\n}\n", 3, "undefined value %9"),
        ("  %1: f32[2,4] = relu(%0)\n  return %1\n}\n", 2, "declared f32[2,4] but relu gives f32[2,3]"),
        ("  %1: f32[3,2] = transpose(%0) {perm=[1,0]}\n  %2: f32[2,3] = add(%0, %1)\n  return %2\n}\n", 3, "do not broadcast"),
        ("  %1: f32[2,3] = softmax(%0) {axis=1, bogus=2}\n  return %1\n}\n", 2, "unknown attribute `bogus` for softmax (its attributes: axis)"),
        ("  %1: f32[2,3] = softmax(%0) {axis=true}\n  return %1\n}\n", 2, "attribute `axis` of softmax must be a non-negative integer"),
        ("  %1: f32[2,3] = softmax(%0)\n  return %1\n}\n", 2, "softmax needs attribute `axis`"),
        ("  %1: f32[2,3] = relu(%0) {alpha=1.0}\n  return %1\n}\n", 2, "relu has no attributes"),
        ("  %1: f32[2,3] = softmax(%0) {axis=1,\n axis=1}\n  return %1\n}\n", 3, "given twice"),
        ("  %1: f32[3,2] = transpose(%0) {perm=[1,0,2]}\n  return %1\n}\n", 2, "not a permutation"),
        ("  %1: f32[2,3] = slice(%0) {axes=[0,1]}\n  return %1\n}\n", 2, "start:step:len"),
        ("  %1: f32[2,3] = cast(%0) {to=f128}\n  return %1\n}\n", 2, "unknown element type `f128`"),
        ("  %1: f32[2,3] = conv(%0) {strides=[1,1,1]}\n  return %1\n}\n", 2, "must have 2 elements"),
        ("  %1: f32[2] = const dense<[1.0]>\n  return %1\n}\n", 2, "declared f32[2] (2 elements) but its constant has 1"),
        ("  %1: i8[1] = const dense<[300]>\n  return %1\n}\n", 2, "`300` is not a valid i8 element"),
        ("  %1: f32[40] = const elided<40 x f32, fnv1a=0x0123456789abcdef>\n  return %1\n}\n", 2, "without full constants"),
        ("  %0: f32[2,3] = relu(%0)\n  return %0\n}\n", 2, "already defined on line 1"),
        ("  %1: f32[2,3] = input()\n  return %1\n}\n", 2, "declared in the `graph(...)` header"),
        ("  %1: f32[2,3] = relu(%0)  # onnx: \"unterminated\n  return %1\n}\n", 2, "unterminated string"),
        ("  %1: f32[2,3] = relu(%0)\n}\n", 3, "expected a node line"),
        ("  %1: f32[2,3] = relu(%0)\n  return %1\n", 3, "expected `}`"),
        ("  %1: f32[2,3] = relu(%0)\n  return %1\n}\n}\n", 5, "end of input"),
        ("  %1: q8[2,3] = relu(%0)\n  return %1\n}\n", 2, "unknown element type `q8`"),
        ("  %1: f32[2,3] = relu(%0) $\n  return %1\n}\n", 2, "unexpected character '$'"),
    ];
    for (body, line, needle) in cases {
        let text = format!("{header}{body}");
        let (l, message) = parse_err(&text);
        assert!(
            message.contains(needle),
            "{text}\n-> {message}\n(wanted {needle:?})"
        );
        assert_eq!(l, *line, "{text}\n-> line {l}: {message}");
    }
    // Errors display with their line.
    let e = parse("graph() {\n  return %x\n}\n").unwrap_err();
    assert_eq!(e.to_string(), "IR text line 2: use of undefined value %x");
}

#[test]
fn snapshot_mlp() {
    let mut g = Graph::new();
    let x = g.add_input("input", vt(DType::F32, &[1, 64]));
    let w1 = f32_const(&mut g, "fc1.weight", &[64, 32]);
    let b1 = g.add_const(
        "fc1.bias",
        Tensor::new([4], Data::F32(vec![0.5, -1.0, 0.0, 2.25])).unwrap(),
    );
    let h = g.add_node(Op::MatMul, &[x, w1], "/fc1/MatMul").unwrap();
    let w2 = f32_const(&mut g, "fc2.weight", &[32, 4]);
    let h = g.add_node(Op::Unary(UnaryOp::Relu), &[h], "/relu").unwrap();
    let h = g.add_node(Op::MatMul, &[h, w2], "/fc2/MatMul").unwrap();
    let h = g
        .add_node(Op::Binary(BinaryOp::Add), &[h, b1], "/fc2/Add")
        .unwrap();
    let p = g
        .add_node(Op::Softmax { axis: 1 }, &[h], "/softmax")
        .unwrap();
    g.add_output("probs", p);
    insta::assert_snapshot!("mlp", print(&g));
}

#[test]
fn snapshot_conv_block() {
    let mut g = Graph::new();
    let x = g.add_input("image", vt(DType::F32, &[1, 3, 16, 16]));
    let ids = g.add_input("ids", vt(DType::I64, &[2]));
    let w = f32_const(&mut g, "conv.weight", &[8, 3, 3, 3]);
    let b = f32_const(&mut g, "conv.bias", &[8]);
    let conv = Op::Conv(Conv2d {
        strides: [2, 2],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let c = g.add_node(conv, &[x, w, b], "/layer1/conv1").unwrap();
    let c = g
        .add_node(
            Op::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }),
            &[c],
            "/layer1/relu6",
        )
        .unwrap();
    let p = g
        .add_node(
            Op::AveragePool {
                pool: Pool2d {
                    kernel: [2, 2],
                    strides: [2, 2],
                    pads: [0, 0, 0, 0],
                    dilations: [1, 1],
                    ceil_mode: false,
                },
                count_include_pad: false,
            },
            &[c],
            "/pool",
        )
        .unwrap();
    let gp = g.add_node(Op::GlobalMaxPool, &[p], "/gmp").unwrap();
    let f = g
        .add_node(
            Op::Reshape {
                shape: smallvec![1, 8],
            },
            &[gp],
            "/flatten",
        )
        .unwrap();
    let sel = g
        .add_node(Op::Gather { axis: 1 }, &[f, ids], "/select \"two\"")
        .unwrap();
    let h = g.add_node(Op::Cast { to: DType::F16 }, &[sel], "").unwrap();
    g.add_output("features", f);
    g.add_output("half", h);
    let text = print(&g);
    insta::assert_snapshot!("conv_block", text);
    // The elided weights keep this dump from parsing; the full one parses.
    assert!(parse(&text).is_err());
    round_trip(&g);
}

#[test]
fn snapshot_constants() {
    insta::assert_snapshot!("constants", print(&constants_graph()));
}

/// Comparisons, boolean ops, Where, reductions and the later elementwise ops.
fn logic_and_reduce_graph() -> Graph {
    let mut g = Graph::new();
    let a = g.add_input("a", vt(DType::F32, &[2, 3]));
    let b = g.add_input("b", vt(DType::F32, &[3]));
    let mut bools = Vec::new();
    for op in [
        CompareOp::Equal,
        CompareOp::Less,
        CompareOp::Greater,
        CompareOp::LessOrEqual,
        CompareOp::GreaterOrEqual,
    ] {
        bools.push(g.add_node(Op::Compare(op), &[a, b], op.name()).unwrap());
    }
    let mut acc = bools[0];
    for (i, op) in [LogicalOp::And, LogicalOp::Or, LogicalOp::Xor]
        .into_iter()
        .enumerate()
    {
        acc = g
            .add_node(Op::Logical(op), &[acc, bools[i + 1]], "")
            .unwrap();
    }
    let not = g.add_node(Op::Not, &[acc], "not").unwrap();
    let w = g.add_node(Op::Where, &[not, a, b], "where").unwrap();
    g.add_output("w", w);
    for (i, op) in ReduceOp::ALL.into_iter().enumerate() {
        let axes = if i % 2 == 0 {
            smallvec![1]
        } else {
            smallvec![0, 1]
        };
        let r = g
            .add_node(
                Op::Reduce {
                    op,
                    axes,
                    keep_dims: i % 3 == 0,
                },
                &[w],
                op.name(),
            )
            .unwrap();
        g.add_output(op.name(), r);
    }
    g
}

#[test]
fn round_trip_bitwise_ops() {
    let mut g = Graph::new();
    let a = g.add_input("a", vt(DType::U32, &[2, 3]));
    let b = g.add_input("b", vt(DType::U32, &[3]));
    let mut acc = a;
    for op in [
        BitwiseOp::And,
        BitwiseOp::Or,
        BitwiseOp::Xor,
        BitwiseOp::ShiftLeft,
        BitwiseOp::ShiftRight,
    ] {
        acc = g.add_node(Op::Bitwise(op), &[acc, b], op.name()).unwrap();
    }
    let n = g.add_node(Op::BitwiseNot, &[acc], "not").unwrap();
    g.add_output("n", n);
    let text = round_trip(&g);
    for name in [
        "bitwise_and(",
        "bitwise_or(",
        "bitwise_xor(",
        "shift_left(",
        "shift_right(",
        "bitwise_not(",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    // Bitwise ops are for integers only.
    let mut g = Graph::new();
    let i = g.add_input("i", vt(DType::I32, &[2]));
    let f = g.add_input("f", vt(DType::F32, &[2]));
    let shift = Op::Bitwise(BitwiseOp::ShiftLeft);
    assert!(g.add_node(shift.clone(), &[i, i], "s").is_ok());
    assert!(g.add_node(shift, &[f, f], "s").is_err());
    assert!(g
        .add_node(Op::Bitwise(BitwiseOp::And), &[i, i], "a")
        .is_ok());
    assert!(g
        .add_node(Op::Bitwise(BitwiseOp::And), &[f, f], "a")
        .is_err());
    assert!(g.add_node(Op::BitwiseNot, &[f], "n").is_err());
}

/// The ops of data-dependent size (docs/bounded.md) print and parse with
/// their attributes, and their inputs are checked.
#[test]
fn round_trip_data_dependent_ops() {
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[3, 4]));
    let nz = g.add_node(Op::NonZero, &[x], "nz").unwrap();
    let scalar = |g: &mut Graph, name: &str, t: Tensor| g.add_const(name, t);
    let count = scalar(
        &mut g,
        "count",
        Tensor::new([], Data::I64(vec![2])).unwrap(),
    );
    let marked = g
        .add_node(Op::WithLength { axis: 1 }, &[nz, count], "marked")
        .unwrap();
    g.add_output("marked", marked);
    let boxes = g.add_input("boxes", vt(DType::F32, &[1, 5, 4]));
    let scores = g.add_input("scores", vt(DType::F32, &[1, 2, 5]));
    let cap = scalar(&mut g, "cap", Tensor::new([], Data::I64(vec![3])).unwrap());
    let iou = scalar(
        &mut g,
        "iou",
        Tensor::new([], Data::F32(vec![0.5])).unwrap(),
    );
    let score = scalar(
        &mut g,
        "score",
        Tensor::new([], Data::F32(vec![0.1])).unwrap(),
    );
    let nms = Op::NonMaxSuppression(crate::Nms {
        center_point_box: true,
        cap: 3,
        has_score_threshold: true,
    });
    let selected = g
        .add_node(nms, &[boxes, scores, cap, iou, score], "nms")
        .unwrap();
    // 1 batch x 2 classes x min(5, 3) rows, then the count row.
    assert_eq!(g.node(selected).ty.shape.as_slice(), &[7, 3]);
    g.add_output("selected", selected);
    let keys = g.add_input("keys", vt(DType::I64, &[1, 6, 2]));
    let plan = g
        .add_node(Op::Unique { sorted: false }, &[keys], "unique")
        .unwrap();
    assert_eq!(g.node(plan).ty.shape.as_slice(), &[19]);
    g.add_output("plan", plan);
    let text = round_trip(&g);
    for needle in [
        "non_zero(",
        "with_length(",
        "axis=1",
        "non_max_suppression(",
        "cap=3",
        "has_score_threshold=true",
        "unique(",
        "sorted=false",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    // A length must be an i64 scalar; keys f64 or i64 of rank 3.
    assert!(g
        .add_node(Op::WithLength { axis: 1 }, &[nz, iou], "bad")
        .is_err());
    assert!(g
        .add_node(Op::Unique { sorted: true }, &[x], "bad")
        .is_err());
}

#[test]
fn round_trip_logic_and_reduce_ops() {
    let text = round_trip(&logic_and_reduce_graph());
    for name in [
        "equal(",
        "less(",
        "greater(",
        "less_or_equal(",
        "greater_or_equal(",
        "and(",
        "or(",
        "xor(",
        "not(",
        "where(",
        "reduce_sum(",
        "reduce_mean(",
        "reduce_max(",
        "reduce_min(",
        "reduce_prod(",
        "reduce_l1(",
        "reduce_l2(",
        "reduce_log_sum(",
        "reduce_log_sum_exp(",
        "reduce_sum_square(",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    assert!(
        text.contains("bool[2,3] = and(") && text.contains("f32[2,3] = where("),
        "{text}"
    );
    assert!(
        text.contains("f32[2,1] = reduce_sum(%") && text.contains("{axes=[1], keep_dims=true}"),
        "{text}"
    );
    let g = parse("graph(%x: f32[2,3]) {\n  %y: f32[2] = reduce_max(%x) {axes=[1], keep_dims=false}\n  return %y\n}\n").unwrap();
    assert_eq!(g.node_count(), 2);
}

/// Fused kernels of every head kind, with instruction attributes.
fn fused_graph() -> Graph {
    use crate::fused::{DenseHead, DenseOp, ElementwiseProgram, FusedKernel, Instr, Reg};
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[1, 2, 4, 4]));
    let m = g.add_input("m", vt(DType::F32, &[3, 4]));
    let w = f32_const(&mut g, "w", &[3, 2, 3, 3]);
    let b = f32_const(&mut g, "b", &[3]);
    let s = f32_const(&mut g, "s", &[1, 3, 1, 1]);
    let conv = DenseHead {
        op: DenseOp::Conv(Conv2d {
            strides: [1, 1],
            pads: [1, 1, 1, 1],
            dilations: [1, 1],
            group: 1,
        }),
        inputs: 3,
    };
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Binary(BinaryOp::Mul, Reg(1), Reg(0)),
            Instr::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }, Reg(2)),
            Instr::Unary(UnaryOp::LeakyRelu { alpha: 0.25 }, Reg(3)),
        ],
    )
    .unwrap();
    let k = FusedKernel::new(Some(conv), body).unwrap();
    let c = g
        .add_node(Op::Fused(Box::new(k)), &[x, w, b, s], "conv+mul+clip")
        .unwrap();
    let wm = f32_const(&mut g, "wm", &[5, 4]);
    let gemm = DenseHead {
        op: DenseOp::Gemm {
            alpha: 0.5,
            beta: 1.0,
            trans_a: false,
            trans_b: true,
        },
        inputs: 2,
    };
    let body = ElementwiseProgram::new(1, vec![Instr::Unary(UnaryOp::Gelu { tanh: true }, Reg(0))])
        .unwrap();
    let k = FusedKernel::new(Some(gemm), body).unwrap();
    let y = g
        .add_node(Op::Fused(Box::new(k)), &[m, wm], "fc+gelu")
        .unwrap();
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Binary(BinaryOp::Sub, Reg(0), Reg(1)),
            Instr::Binary(BinaryOp::Mul, Reg(2), Reg(2)),
        ],
    )
    .unwrap();
    let k = FusedKernel::new(None, body).unwrap();
    let z = g.add_node(Op::Fused(Box::new(k)), &[c, x], "").unwrap_err();
    assert!(z.to_string().contains("do not broadcast"), "{z}");
    let k = FusedKernel::new(
        None,
        ElementwiseProgram::new(
            2,
            vec![
                Instr::Binary(BinaryOp::Sub, Reg(0), Reg(1)),
                Instr::Unary(UnaryOp::Exp, Reg(2)),
            ],
        )
        .unwrap(),
    )
    .unwrap();
    let e = g
        .add_node(Op::Fused(Box::new(k)), &[c, s], "sub+exp")
        .unwrap();
    g.add_output("c", e);
    g.add_output("y", y);
    g
}

#[test]
fn round_trip_fused() {
    let text = round_trip(&fused_graph());
    assert!(
        text.contains(
            "fused(%0, %2, %3, %4) {head=conv, head_inputs=3, strides=[1,1], pads=[1,1,1,1], \
         dilations=[1,1], group=1, body=\"mul(x1, x0), clip(t0) {min=0.0, max=6.0}, \
         leaky_relu(t1) {alpha=0.25}\"}"
        ),
        "{text}"
    );
}

#[test]
fn fused_evaluates_as_its_ops() {
    use crate::fused::{ElementwiseProgram, FusedKernel, Instr, Reg};
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[2, 3]));
    let b = f32_const(&mut g, "b", &[3]);
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Binary(BinaryOp::Add, Reg(0), Reg(1)),
            Instr::Unary(UnaryOp::Sigmoid, Reg(2)),
        ],
    )
    .unwrap();
    let k = FusedKernel::new(None, body).unwrap();
    assert_eq!(k.label(), "fused[add+sigmoid]");
    let y = g.add_node(Op::Fused(Box::new(k)), &[x, b], "y").unwrap();
    g.add_output("y", y);
    let xv = Tensor::new([2, 3], Data::F32(vec![-1.0, 0.0, 1.0, 2.0, 3.0, -4.0])).unwrap();
    let got = crate::eval::eval_graph(&g, std::slice::from_ref(&xv)).unwrap();
    let bt = g.constant(b).unwrap().clone();
    let t = crate::eval::eval(&Op::Binary(BinaryOp::Add), &[&xv, &bt]).unwrap();
    let want = crate::eval::eval(&Op::Unary(UnaryOp::Sigmoid), &[&t]).unwrap();
    assert_eq!(got[0], want);
}

#[test]
fn fused_parse_errors() {
    let header = "graph(%0: f32[2,3] \"x\", %1: f32[3,3] \"w\") {\n";
    let cases: &[(&str, &str)] = &[
        ("  %2: f32[2,3] = fused(%0)\n  return %2\n}\n", "fused needs attribute `body`"),
        ("  %2: f32[2,3] = fused(%0) {body=\"frob(x0)\"}\n  return %2\n}\n", "unknown op `frob`"),
        ("  %2: f32[2,3] = fused(%0) {body=\"relu(t3)\"}\n  return %2\n}\n", "reads register"),
        ("  %2: f32[2,3] = fused(%0) {body=\"relu(y0)\"}\n  return %2\n}\n", "bad register `y0`"),
        ("  %2: f32[2,3] = fused(%0) {body=\"add(x0)\"}\n  return %2\n}\n", "add takes 2 registers, got 1"),
        ("  %2: f32[2,3] = fused(%0) {body=\"reshape(x0) {shape=[6]}\"}\n  return %2\n}\n", "not an elementwise float op"),
        ("  %2: f32[2,3] = fused(%0, %1) {head=softmax, head_inputs=2, axis=1, body=\"relu(x0)\"}\n  return %2\n}\n", "matmul, gemm or conv"),
        ("  %2: f32[2,3] = fused(%0, %1) {head=matmul, body=\"relu(x0)\"}\n  return %2\n}\n", "needs attribute `head_inputs`"),
        ("  %2: f32[2,3] = fused(%0, %1) {head=matmul, head_inputs=2, group=1, body=\"relu(x0)\"}\n  return %2\n}\n", "matmul has no attributes, got `group`"),
        ("  %2: f32[2,3] = fused(%0, %1) {body=\"relu(x0)\"}\n  return %2\n}\n", "takes 1..=1 inputs, got 2"),
        ("  %2: f32[2,3] = fused(%0) {body=7}\n  return %2\n}\n", "attribute `body` of fused must be a string"),
    ];
    for (body, needle) in cases {
        let text = format!("{header}{body}");
        let (l, message) = parse_err(&text);
        assert!(
            message.contains(needle),
            "{text}\n-> {message}\n(wanted {needle:?})"
        );
        assert_eq!(l, 2, "{text}\n-> line {l}: {message}");
    }
}

#[test]
fn round_trip_resize_with_antialias_and_roi() {
    use crate::{CoordinateTransform, Resize, ResizeMode};
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[1, 2, 8, 8]));
    let small = Op::Resize(Resize {
        shape: smallvec![1, 2, 3, 5],
        scales: smallvec![1.0, 1.0, 0.375, 0.625],
        mode: ResizeMode::Linear,
        coord: CoordinateTransform::HalfPixel,
        antialias: true,
        roi: smallvec![],
    });
    let crop = Op::Resize(Resize {
        shape: smallvec![1, 2, 3, 3],
        scales: smallvec![1.0, 1.0, 0.375, 0.375],
        mode: ResizeMode::Linear,
        coord: CoordinateTransform::TfCropAndResize,
        antialias: false,
        roi: smallvec![[0.0, 1.0], [0.0, 1.0], [0.4, 0.6], [0.25, 1.5]],
    });
    let a = g.add_node(small, &[x], "small").unwrap();
    let b = g.add_node(crop, &[x], "crop").unwrap();
    g.add_output("a", a);
    g.add_output("b", b);
    let text = round_trip(&g);
    assert!(text.contains("antialias=true"), "{text}");
    assert!(
        text.contains("roi=[0.0,1.0,0.0,1.0,0.4,0.6,0.25,1.5]"),
        "{text}"
    );
}

/// The family tables name, print and parse every family op: written
/// without attributes, an op parses to its table defaults, prints the
/// attributes the table lists and parses back from the print.
#[test]
fn every_family_op_parses_from_its_name_and_round_trips() {
    let header = "graph(%0: f32[2,3] \"x\", %1: f32[2,3] \"y\") {\n";
    let family_ops = UnaryOp::ALL
        .map(Op::Unary)
        .into_iter()
        .chain(BinaryOp::ALL.map(Op::Binary))
        .chain(CompareOp::ALL.map(Op::Compare));
    for op in family_ops {
        let args = if op.arity().0 == 1 { "%0" } else { "%0, %1" };
        let out = if matches!(op, Op::Compare(_)) {
            "bool"
        } else {
            "f32"
        };
        let text = format!(
            "{header}  %2: {out}[2,3] = {}({args})\n  return %2 \"z\"\n}}\n",
            op.name()
        );
        let g = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let parsed = &g.node(g.outputs()[0].1).op;
        assert!(same_op(parsed, &op), "{} parses to {parsed:?}", op.name());
        let printed: Vec<String> = super::op_attributes(&op)
            .into_iter()
            .map(|a| a.split('=').next().unwrap().to_string())
            .collect();
        assert_eq!(printed, op.attribute_names(), "{}", op.name());
        round_trip(&g);
    }
}

/// Every name of the vocabulary but `input` (declared in the header) is
/// an op the parser knows.
#[test]
fn the_parser_knows_every_op_of_the_vocabulary() {
    let header = "graph(%0: f32[2,3] \"x\") {\n";
    for (name, _) in Op::vocabulary() {
        let text = format!("{header}  %1: f32[2,3] = {name}(%0)\n  return %1\n}}\n");
        let message = parse(&text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            message.contains("unknown op") || message.contains("graph inputs are declared"),
            name == "input",
            "{name}: {message}"
        );
    }
}
