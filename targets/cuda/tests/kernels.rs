//! Tests of the PTX emitter that need no `ptxas`: structure of every
//! kernel (declared registers, labels, braces), launch plans computed from
//! the shapes, the arena plan, errors, and a snapshot of one small kernel.
//! `tests/tests/cuda_ptxas.rs` assembles the fixtures' modules with ptxas.

use kiln_ir::{
    BinaryOp, CompareOp, Conv2d, DType, Data, Graph, LogicalOp, NodeId, Op, Pool2d, ReduceOp,
    SliceAxis, Tensor, UnaryOp, ValueType,
};
use kiln_target_cuda::{compile, CudaError, CudaProgram, SmArch, STATUS_BYTES, SUPPORTED_SMS};
use smallvec::smallvec;
use std::collections::{HashMap, HashSet};

fn sm80() -> SmArch {
    SmArch::parse("sm80").unwrap()
}

fn vt(d: DType, s: &[usize]) -> ValueType {
    ValueType::new(d, s)
}

fn f32_const(g: &mut Graph, name: &str, shape: &[usize]) -> NodeId {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
    g.add_const(name, Tensor::new(shape, Data::F32(data)).unwrap())
}

/// A graph using every op the CUDA target lowers.
fn every_op_graph() -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[2, 3, 8, 8]));
    let ids = g.add_input("ids", vt(DType::I64, &[4]));
    let add = |g: &mut Graph, op: Op, inputs: &[NodeId], name: &str| {
        g.add_node(op, inputs, name).unwrap()
    };
    let w = f32_const(&mut g, "w", &[4, 3, 3, 3]);
    let b = f32_const(&mut g, "b", &[4]);
    let conv = add(
        &mut g,
        Op::Conv(Conv2d {
            strides: [1, 1],
            pads: [1, 1, 1, 1],
            dilations: [1, 1],
            group: 1,
        }),
        &[x, w, b],
        "conv",
    );
    let pool2 = Pool2d {
        kernel: [2, 2],
        strides: [2, 2],
        pads: [0, 0, 0, 0],
        dilations: [1, 1],
        ceil_mode: false,
    };
    let mp = add(&mut g, Op::MaxPool(pool2.clone()), &[conv], "max_pool");
    let ap = add(
        &mut g,
        Op::AveragePool {
            pool: pool2,
            count_include_pad: true,
        },
        &[mp],
        "avg_pool",
    );
    let gap = add(&mut g, Op::GlobalAveragePool, &[ap], "gap");
    let gmp = add(&mut g, Op::GlobalMaxPool, &[conv], "gmp");
    let sum = add(&mut g, Op::Binary(BinaryOp::Add), &[gap, gmp], "add");
    let flat = add(
        &mut g,
        Op::Reshape {
            shape: smallvec![2, 4],
        },
        &[sum],
        "flatten",
    );
    let fc_w = f32_const(&mut g, "fc_w", &[4, 5]);
    let fc_b = f32_const(&mut g, "fc_b", &[5]);
    let gemm = add(
        &mut g,
        Op::Gemm {
            alpha: 0.5,
            beta: 2.0,
            trans_a: false,
            trans_b: false,
        },
        &[flat, fc_w, fc_b],
        "gemm",
    );
    let mm_w = f32_const(&mut g, "mm_w", &[5, 6]);
    let mm = add(&mut g, Op::MatMul, &[gemm, mm_w], "matmul");
    let sig = add(&mut g, Op::Unary(UnaryOp::Sigmoid), &[mm], "sigmoid");
    let th = add(&mut g, Op::Unary(UnaryOp::Tanh), &[sig], "tanh");
    let pw = add(&mut g, Op::Binary(BinaryOp::Pow), &[th, sig], "pow");
    let sm = add(&mut g, Op::Softmax { axis: 1 }, &[pw], "softmax");
    let tr = add(
        &mut g,
        Op::Transpose {
            perm: smallvec![1, 0],
        },
        &[sm],
        "transpose",
    );
    let red = add(
        &mut g,
        Op::Reduce {
            op: ReduceOp::LogSumExp,
            axes: smallvec![0],
            keep_dims: true,
        },
        &[tr],
        "lse",
    );
    let sl = add(
        &mut g,
        Op::Slice {
            axes: smallvec![
                SliceAxis {
                    start: 5,
                    step: -2,
                    len: 3
                },
                SliceAxis {
                    start: 0,
                    step: 1,
                    len: 2
                }
            ],
        },
        &[tr],
        "slice",
    );
    let cat = add(&mut g, Op::Concat { axis: 0 }, &[sl, tr], "concat");
    let gat = add(&mut g, Op::Gather { axis: 0 }, &[cat, ids], "gather");
    let cmp = add(
        &mut g,
        Op::Compare(CompareOp::Greater),
        &[gat, red],
        "greater",
    );
    let not = add(&mut g, Op::Not, &[cmp], "not");
    let or = add(&mut g, Op::Logical(LogicalOp::Or), &[cmp, not], "or");
    let wh = add(&mut g, Op::Where, &[or, gat, red], "where");
    let cast = add(&mut g, Op::Cast { to: DType::I32 }, &[wh], "cast");
    let ineg = add(&mut g, Op::Unary(UnaryOp::Abs), &[cast], "iabs");
    let idiv = add(&mut g, Op::Binary(BinaryOp::Div), &[ineg, cast], "idiv");
    let isum = add(
        &mut g,
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: smallvec![0, 1],
            keep_dims: false,
        },
        &[idiv],
        "isum",
    );
    g.add_output("y", isum);
    g.add_output("probs", sm);
    g.add_output("x_again", x);
    g
}

/// Structural checks of one kernel's text: balanced braces, every register
/// used is declared, every branch target is defined exactly once.
fn lint_kernel(name: &str, text: &str) {
    assert_eq!(
        text.matches('{').count(),
        text.matches('}').count(),
        "{name}: braces"
    );
    let mut declared: HashMap<&str, u32> = HashMap::new();
    for line in text.lines().filter(|l| l.trim_start().starts_with(".reg")) {
        // `.reg .f32 %f<12>;`
        let decl = line.split_whitespace().nth(2).unwrap();
        let (prefix, count) = decl.trim_end_matches(">;").split_once('<').unwrap();
        declared.insert(prefix, count.parse().unwrap());
    }
    for tok in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '%')) {
        let Some(rest) = tok.strip_prefix('%') else {
            continue;
        };
        let digits = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic());
        let prefix = &tok[..tok.len() - digits.len()];
        if digits.is_empty() || !["%p", "%r", "%rd", "%f", "%fd"].contains(&prefix) {
            continue; // %tid, %ctaid, ...
        }
        let n: u32 = digits.parse().unwrap();
        let limit = declared.get(prefix).copied().unwrap_or(0);
        assert!(n < limit, "{name}: {tok} used, {prefix}<{limit}> declared");
    }
    let mut defined = HashSet::new();
    for line in text.lines().filter(|l| l.starts_with("$L")) {
        assert!(
            defined.insert(line.trim_end_matches(':')),
            "{name}: {line} twice"
        );
    }
    for line in text.lines().filter(|l| l.contains(" bra")) {
        let target = line
            .trim()
            .trim_end_matches(';')
            .rsplit(' ')
            .next()
            .unwrap();
        assert!(
            defined.contains(target),
            "{name}: branch to undefined {target}"
        );
    }
}

/// Splits a module into its kernels' texts, checked against the recorded
/// line ranges.
fn kernel_texts(p: &CudaProgram) -> Vec<String> {
    let lines: Vec<&str> = p.ptx.lines().collect();
    p.kernels
        .iter()
        .map(|k| {
            let text = lines[k.lines.0 - 1..k.lines.1].join("\n");
            assert!(
                text.starts_with(&format!(".visible .entry {}(", k.name)),
                "{} starts at its recorded line",
                k.name
            );
            text
        })
        .collect()
}

#[test]
fn every_kernel_of_every_op_is_well_formed_for_every_sm() {
    let g = every_op_graph();
    for sm in SUPPORTED_SMS {
        let p = compile(&g, sm).unwrap();
        assert!(p.ptx.contains(&format!(
            ".version {}.{}\n.target sm_{}\n.address_size 64",
            sm.ptx_isa.0, sm.ptx_isa.1, sm.sm
        )));
        // Every computing node has a kernel (the reshape aliases, the
        // sigmoid is fused into the matmul that is its only input), plus
        // the copy of the output that is a graph input.
        let ops: Vec<&str> = p.kernels.iter().map(|k| k.op).collect();
        assert_eq!(ops.len(), 25, "{ops:?}");
        assert!(p.kernels.iter().any(|k| k.node == "matmul+sigmoid"));
        assert!(!ops.contains(&"reshape"));
        assert_eq!(ops.last(), Some(&"copy"));
        for (k, text) in p.kernels.iter().zip(kernel_texts(&p)) {
            lint_kernel(&k.name, &text);
            let [x, y, z] = k.launch.block;
            assert!(
                x * y * z <= 1024 && x * y * z % 32 == 0,
                "{}: {:?}",
                k.name,
                k.launch
            );
            assert!(
                text.contains(&format!(".maxntid {x}, {y}, {z}")),
                "{}",
                k.name
            );
            assert!(k.launch.grid.iter().all(|&d| d >= 1), "{}", k.name);
            assert!(k.launch.shared_bytes <= 48 * 1024, "{}", k.name);
        }
    }
}

#[test]
fn launch_plans_follow_the_shapes() {
    let g = every_op_graph();
    let p = compile(&g, sm80()).unwrap();
    let by_node: HashMap<&str, _> = p
        .kernels
        .iter()
        .map(|k| (k.node.as_str(), k.launch))
        .collect();
    // conv: 2*4*8*8 = 512 outputs, one thread each, 256 a block.
    assert_eq!(by_node["conv"].grid, [2, 1, 1]);
    assert_eq!(by_node["conv"].block, [256, 1, 1]);
    // gmp: one block per (n, c) plane of 64 elements: 64 threads.
    assert_eq!(by_node["gmp"].grid, [8, 1, 1]);
    assert_eq!(by_node["gmp"].block, [64, 1, 1]);
    // Two warps' partials and the result, 8 bytes each.
    assert_eq!(by_node["gmp"].shared_bytes, 24);
    // softmax over rows of 6: 2 rows, one warp each.
    assert_eq!(by_node["softmax"].grid, [2, 1, 1]);
    assert_eq!(by_node["softmax"].block, [32, 1, 1]);
    // gemm [2,4]x[4,5]: one 64x64 tile, 16x16 threads, two 16x64 f32 slices.
    assert_eq!(by_node["gemm"].grid, [1, 1, 1]);
    assert_eq!(by_node["gemm"].block, [16, 16, 1]);
    assert_eq!(by_node["gemm"].shared_bytes, 2 * 16 * 64 * 4);
}

#[test]
fn batched_matmul_launches_one_grid_layer_per_batch() {
    let mut g = Graph::new();
    let a = g.add_input("a", vt(DType::F32, &[3, 1, 130, 20]));
    let b = g.add_input("b", vt(DType::F32, &[4, 20, 70]));
    let y = g.add_node(Op::MatMul, &[a, b], "bmm").unwrap();
    g.add_output("y", y);
    let p = compile(&g, sm80()).unwrap();
    assert_eq!(p.kernels[0].launch.grid, [2, 3, 12]);
}

#[test]
fn arena_holds_status_word_inputs_and_outputs_apart() {
    let g = every_op_graph();
    let p = compile(&g, sm80()).unwrap();
    let ios: Vec<_> = p.inputs.iter().chain(&p.outputs).collect();
    for (i, a) in ios.iter().enumerate() {
        let bytes = |s: &kiln_target_cuda::IoSpec| {
            s.shape.iter().product::<usize>() as u64 * s.dtype.size_bytes() as u64
        };
        assert!(
            a.arena_offset >= STATUS_BYTES,
            "{} overlaps the status word",
            a.name
        );
        assert!(
            a.arena_offset + bytes(a) <= p.arena_size,
            "{} past the arena",
            a.name
        );
        assert_eq!(a.arena_offset % 64, 0);
        // Inputs and outputs are all live at the end or the start; outputs
        // never share bytes with each other.
        for b in &ios[..i] {
            if p.outputs.iter().any(|o| o.name == a.name)
                && p.outputs.iter().any(|o| o.name == b.name)
            {
                let disjoint = a.arena_offset + bytes(a) <= b.arena_offset
                    || b.arena_offset + bytes(b) <= a.arena_offset;
                assert!(disjoint, "outputs {} and {} overlap", a.name, b.name);
            }
        }
    }
    assert_eq!(p.outputs[2].dtype, DType::F32);
    assert_eq!(p.outputs[2].shape, vec![2, 3, 8, 8]);
}

#[test]
fn compilation_is_deterministic() {
    let a = compile(&every_op_graph(), sm80()).unwrap();
    let b = compile(&every_op_graph(), sm80()).unwrap();
    assert_eq!(a.ptx, b.ptx);
    assert_eq!(a.weights, b.weights);
}

/// f64 Exp, Log, Sigmoid, Tanh and Pow have software lowerings; the other
/// f64 transcendental ops are refused, naming the node, rather than
/// computed in f32.
#[test]
fn f64_erf_is_refused_rather_than_computed_in_f32() {
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F64, &[4]));
    let y = g.add_node(Op::Unary(UnaryOp::Erf), &[x], "e").unwrap();
    let z = g.add_node(Op::Unary(UnaryOp::Neg), &[x], "n").unwrap();
    g.add_output("y", y);
    g.add_output("z", z);
    let msg = compile(&g, sm80()).unwrap_err().to_string();
    assert!(msg.contains("node 'e'") && msg.contains("f64"), "{msg}");
}

#[test]
fn conv_integer_windows_past_32_bit_positions_are_refused() {
    // A 2^32 top pad and H stride give a 2-row output whose first row lies
    // wholly in the padding; truncated to u32 both would be 0 and that row
    // would read X's first row. Refused rather than miscomputed.
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::U8, &[1, 1, 4, 4]));
    let w = g.add_input("w", vt(DType::I8, &[1, 1, 1, 1]));
    let xz = g.add_input("x_zero", vt(DType::U8, &[]));
    let wz = g.add_input("w_zero", vt(DType::I8, &[]));
    let op = Op::ConvInteger(Conv2d {
        strides: [1 << 32, 1],
        pads: [1 << 32, 0, 0, 0],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(op, &[x, w, xz, wz], "far_conv").unwrap();
    assert_eq!(g.node(y).ty.shape.as_slice(), [1, 1, 2, 4]);
    g.add_output("y", y);
    let e = compile(&g, sm80()).unwrap_err();
    assert!(matches!(e, CudaError::UnsupportedOp { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("far_conv") && msg.contains("32-bit"), "{msg}");
}

#[test]
fn fused_max_relu_kernel_snapshot() {
    let mut g = Graph::new();
    let x = g.add_input("x", vt(DType::F32, &[2, 3]));
    let b = g.add_input("b", vt(DType::F32, &[3]));
    let y = g
        .add_node(Op::Binary(BinaryOp::Max), &[x, b], "max")
        .unwrap();
    let z = g.add_node(Op::Unary(UnaryOp::Relu), &[y], "relu").unwrap();
    g.add_output("z", z);
    let p = compile(&g, SmArch::parse("sm70").unwrap()).unwrap();
    insta::assert_snapshot!(p.ptx);
}

#[test]
fn wide_convolutions_run_as_implicit_gemm_and_depthwise_ones_directly() {
    let conv = |cout: usize, group: usize| {
        let mut g = Graph::new();
        let x = g.add_input("x", vt(DType::F32, &[2, 32, 10, 12]));
        let w = f32_const(&mut g, "w", &[cout, 32 / group, 3, 3]);
        let c = Conv2d {
            strides: [1, 1],
            pads: [1, 1, 1, 1],
            dilations: [1, 1],
            group,
        };
        let y = g.add_node(Op::Conv(c), &[x, w], "conv").unwrap();
        g.add_output("y", y);
        compile(&g, sm80()).unwrap().kernels[0].launch
    };
    // 64 channels: (10*12/64 -> 2 column tiles, 1 row tile, 2 images).
    let wide = conv(64, 1);
    assert_eq!((wide.grid, wide.block), ([2, 1, 2], [16, 16, 1]));
    // Depthwise: one thread per output element.
    let depthwise = conv(32, 32);
    assert_eq!((depthwise.grid, depthwise.block), ([30, 1, 1], [256, 1, 1]));
}
