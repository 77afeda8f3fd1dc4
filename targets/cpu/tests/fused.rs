//! Fused kernels against the reference evaluator, on the AVX-512
//! microkernel path (native, when the host has it) and the Cranelift path
//! (x86-64-v3): every fused node is exactly one kernel.

mod common;

use common::{check_for, f32_tensor, has_zmm_code, has_zmm_fma, rand_tensor, Rng};
use kiln_ir::{
    BinaryOp, Conv2d, DType, DenseHead, DenseOp, ElementwiseProgram, FusedKernel, FusedStore,
    Graph, Instr, NodeId, Op, Reg, Tensor, UnaryOp, ValueType,
};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

/// An operand of a test graph: a graph input or a random constant.
enum Arg {
    Input(Vec<usize>),
    Const(Vec<usize>),
    /// A scalar constant of this value.
    Value(f32),
}

/// How the constants of a test graph are drawn.
type Values = fn(&mut Rng, &[usize]) -> Tensor;

fn add_args(g: &mut Graph, rng: &mut Rng, args: &[Arg], values: Values) -> Vec<NodeId> {
    args.iter()
        .map(|a| {
            let i = g.node_count();
            match a {
                Arg::Input(s) => g.add_input(format!("in{i}"), ValueType::new(DType::F32, s)),
                Arg::Const(s) => g.add_const(format!("c{i}"), values(rng, s)),
                Arg::Value(v) => g.add_const(
                    format!("c{i}"),
                    Tensor::new([], kiln_ir::Data::F32(vec![*v])).unwrap(),
                ),
            }
        })
        .collect()
}

/// Integer-valued f32 values in −4..=4: their products, sums and quarters
/// are exact in f32, so a kernel computes them bit for bit as the
/// evaluator does in any order, and the bytes a u8 store makes of them
/// compare exactly.
fn small_ints(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    let v = (0..n).map(|_| rng.int(-4, 4) as f32).collect();
    Tensor::new(shape, kiln_ir::Data::F32(v)).unwrap()
}

/// One fused node over `head_args` (the head's operands) and `extra`
/// (the program's other operands), as the graph's output.
fn fused_graph(
    head: Option<(DenseOp, Vec<Arg>)>,
    extra: Vec<Arg>,
    instrs: Vec<Instr>,
    seed: u64,
) -> Graph {
    fused_graph_storing(head, extra, instrs, seed, (FusedStore::F32, f32_tensor))
}

/// [`fused_graph`] with the kernel storing `store` and its constants drawn
/// by `values`.
fn fused_graph_storing(
    head: Option<(DenseOp, Vec<Arg>)>,
    extra: Vec<Arg>,
    instrs: Vec<Instr>,
    seed: u64,
    (store, values): (FusedStore, Values),
) -> Graph {
    let mut rng = Rng::new(seed);
    let mut g = Graph::new();
    let (head, mut ins) = match head {
        Some((op, args)) => {
            let ins = add_args(&mut g, &mut rng, &args, values);
            let inputs = ins.len();
            (Some(DenseHead { op, inputs }), ins)
        }
        None => (None, vec![]),
    };
    let program_inputs = extra.len() + usize::from(head.is_some());
    ins.extend(add_args(&mut g, &mut rng, &extra, values));
    let body = ElementwiseProgram::new(program_inputs, instrs).unwrap();
    let k = FusedKernel::new(head, body).unwrap().with_store(store);
    let y = g.add_node(Op::Fused(Box::new(k)), &ins, "fused").unwrap();
    g.add_output("y", y);
    g
}

/// Checks `g` on the native target and on x86-64-v3 against the reference
/// evaluator, and that each artifact has one kernel per compute node.
fn check(g: &Graph, seed: u64) {
    let mut rng = Rng::new(seed ^ 0xabc);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| rand_tensor(&mut rng, DType::F32, &g.node(i).ty.shape))
        .collect();
    check_on(g, &inputs);
}

/// [`check`] with integer-valued inputs ([`small_ints`]).
fn check_exact(g: &Graph, seed: u64) {
    let mut rng = Rng::new(seed ^ 0xabc);
    let inputs: Vec<Tensor> = (g.inputs().iter())
        .map(|&i| small_ints(&mut rng, &g.node(i).ty.shape))
        .collect();
    check_on(g, &inputs);
}

fn check_on(g: &Graph, inputs: &[Tensor]) {
    let compute = g
        .node_ids()
        .filter(|&id| !matches!(g.node(id).op, Op::Input { .. } | Op::Constant(_)))
        .count();
    for target in [CpuTarget::Native, CpuTarget::X86_64V3] {
        let opts = CpuOptions {
            target,
            opt_level: 2,
            threads: 1,
        };
        let artifact = compile(g, &opts, ArtifactInfo::default()).unwrap();
        assert_eq!(artifact.kernels.len(), compute, "{target}: kernels");
        if target == CpuTarget::X86_64V3 && !std::arch::is_x86_feature_detected!("avx2") {
            continue;
        }
        check_for(g, inputs, 1e-5, target);
    }
}

fn conv(pads: usize, group: usize) -> DenseOp {
    DenseOp::Conv(Conv2d {
        strides: [1, 1],
        pads: [pads; 4],
        dilations: [1, 1],
        group,
    })
}

fn r(i: u32) -> Reg {
    Reg(i)
}

/// An im2col conv of 20 3×3 filters over 3 channels, then a per-channel
/// bias and relu (the epilogue), its constants drawn by `values`.
fn conv_bias_relu(seed: u64, values: Values) -> Graph {
    fused_graph_storing(
        Some((
            conv(1, 1),
            vec![Arg::Input(vec![1, 3, 9, 10]), Arg::Const(vec![20, 3, 3, 3])],
        )),
        vec![Arg::Const(vec![1, 20, 1, 1])],
        vec![
            Instr::Binary(BinaryOp::Add, r(0), r(1)),
            Instr::Unary(UnaryOp::Relu, r(2)),
        ],
        seed,
        (FusedStore::F32, values),
    )
}

#[test]
fn conv_bias_relu_runs_in_the_store_loop() {
    check(&conv_bias_relu(1, f32_tensor), 1);
}

/// Random f32 constants, a convolution's weights (rank 4, more than one
/// output channel) rounded to f16.
fn f16_weights(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let t = f32_tensor(rng, shape);
    if shape.len() == 4 && shape[0] > 1 {
        t.cast(DType::F16)
    } else {
        t
    }
}

/// [`f16_weights`] in bf16.
fn bf16_weights(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let t = f16_weights(rng, shape);
    if t.dtype() == DType::F16 {
        t.cast(DType::BF16)
    } else {
        t
    }
}

/// A reduced-precision convolution (16-bit weights) heads a fused kernel:
/// bias and relu in its store loop, the weights read as stored (on the
/// native target the artifact's weights take little more than half the
/// f32 build's; x86-64-v3 widens them).
#[test]
fn half_weight_conv_heads_a_fused_kernel() {
    let graph = |values: Values| conv_bias_relu(3, values);
    let weight_bytes = |g: &Graph| {
        let opts = CpuOptions {
            target: CpuTarget::Native,
            opt_level: 2,
            threads: 1,
        };
        let a = compile(g, &opts, ArtifactInfo::default()).unwrap();
        assert!(has_zmm_fma(&a), "not a microkernel");
        a.weights.len()
    };
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let f32_bytes = avx512.then(|| weight_bytes(&graph(f32_tensor)));
    for values in [f16_weights as Values, bf16_weights] {
        let g = graph(values);
        check(&g, 3);
        if let Some(f32_bytes) = f32_bytes {
            let half = weight_bytes(&g);
            assert!(
                half * 10 < f32_bytes * 6,
                "{half} vs {f32_bytes} weight bytes"
            );
        }
    }
}

#[test]
fn conv_with_bias_then_sigmoid_continues_in_place() {
    let g = fused_graph(
        Some((
            conv(1, 1),
            vec![
                Arg::Input(vec![2, 3, 9, 10]),
                Arg::Const(vec![20, 3, 3, 3]),
                Arg::Const(vec![20]),
            ],
        )),
        vec![],
        vec![Instr::Unary(UnaryOp::Sigmoid, r(0))],
        2,
    );
    check(&g, 2);
}

#[test]
fn pointwise_conv_residual_add_relu() {
    // The residual is a full tensor: C contiguous along the columns.
    let g = fused_graph(
        Some((
            conv(0, 1),
            vec![Arg::Input(vec![2, 8, 9, 10]), Arg::Const(vec![20, 8, 1, 1])],
        )),
        vec![Arg::Input(vec![2, 20, 9, 10])],
        vec![
            Instr::Binary(BinaryOp::Add, r(1), r(0)),
            Instr::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }, r(2)),
        ],
        3,
    );
    check(&g, 3);
}

#[test]
fn batched_matmul_bias_then_gelu() {
    // add goes to the epilogue, gelu runs after it in place.
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![2, 7, 33]), Arg::Const(vec![33, 19])],
        )),
        vec![Arg::Const(vec![19])],
        vec![
            Instr::Binary(BinaryOp::Add, r(0), r(1)),
            Instr::Unary(UnaryOp::Gelu { tanh: false }, r(2)),
        ],
        4,
    );
    check(&g, 4);
}

#[test]
fn gemm_with_c_clip_then_row_scale() {
    let g = fused_graph(
        Some((
            DenseOp::Gemm {
                alpha: 0.5,
                beta: 2.0,
                trans_a: false,
                trans_b: true,
            },
            vec![
                Arg::Input(vec![7, 33]),
                Arg::Const(vec![19, 33]),
                Arg::Const(vec![1, 19]),
            ],
        )),
        vec![Arg::Input(vec![7, 1])],
        vec![
            Instr::Unary(
                UnaryOp::Clip {
                    min: -2.0,
                    max: 3.0,
                },
                r(0),
            ),
            Instr::Binary(BinaryOp::Mul, r(2), r(1)),
        ],
        5,
    );
    check(&g, 5);
}

#[test]
fn depthwise_conv_hard_swish() {
    let g = fused_graph(
        Some((
            conv(1, 6),
            vec![
                Arg::Input(vec![1, 6, 11, 13]),
                Arg::Const(vec![6, 1, 3, 3]),
                Arg::Const(vec![6]),
            ],
        )),
        vec![],
        vec![Instr::Unary(UnaryOp::HardSwish, r(0))],
        6,
    );
    check(&g, 6);
    assert!(!has_program_tail(&g));
}

#[test]
fn depthwise_conv_with_per_channel_affine_in_the_store() {
    // Depth multiplier 2 (per-channel operands indexed by group and
    // multiplier), W stride 2, hard-swish then a per-channel scale and
    // shift; two images.
    let strided = DenseOp::Conv(Conv2d {
        strides: [2, 2],
        pads: [1; 4],
        dilations: [1, 1],
        group: 5,
    });
    let g = fused_graph(
        Some((
            strided,
            vec![
                Arg::Input(vec![2, 5, 17, 40]),
                Arg::Const(vec![10, 1, 3, 3]),
                Arg::Const(vec![10]),
            ],
        )),
        vec![Arg::Const(vec![10, 1, 1]), Arg::Const(vec![1, 10, 1, 1])],
        vec![
            Instr::Unary(UnaryOp::HardSwish, r(0)),
            Instr::Binary(BinaryOp::Mul, r(3), r(1)),
            Instr::Binary(BinaryOp::Add, r(2), r(4)),
        ],
        33,
    );
    check(&g, 33);
    assert!(!has_program_tail(&g));
}

#[test]
fn program_reading_the_head_result_twice_runs_whole_after_the_head() {
    // add(x0, b), relu, then add of x0 again: the raw head result is needed
    // after the epilogue, so the whole program runs over the output.
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![5, 17]), Arg::Const(vec![17, 21])],
        )),
        vec![Arg::Const(vec![1, 21])],
        vec![
            Instr::Binary(BinaryOp::Add, r(0), r(1)),
            Instr::Unary(UnaryOp::Relu, r(2)),
            Instr::Binary(BinaryOp::Sub, r(3), r(0)),
        ],
        7,
    );
    check(&g, 7);
}

#[test]
fn elementwise_programs_vector_and_scalar() {
    // Broadcast operands of several shapes; the vector path.
    let g = fused_graph(
        None,
        vec![
            Arg::Input(vec![2, 3, 13]),
            Arg::Const(vec![3, 1]),
            Arg::Input(vec![13]),
        ],
        vec![
            Instr::Binary(BinaryOp::Sub, r(0), r(1)),
            Instr::Binary(BinaryOp::Mul, r(3), r(3)),
            Instr::Unary(UnaryOp::Exp, r(4)),
            Instr::Binary(BinaryOp::Add, r(5), r(2)),
            Instr::Unary(UnaryOp::Tanh, r(6)),
        ],
        8,
    );
    check(&g, 8);
    // Pow has no vector form: the whole program runs on scalars.
    let g = fused_graph(
        None,
        vec![Arg::Input(vec![4, 9]), Arg::Const(vec![1])],
        vec![
            Instr::Unary(UnaryOp::Abs, r(0)),
            Instr::Binary(BinaryOp::Pow, r(2), r(1)),
            Instr::Unary(UnaryOp::Neg, r(3)),
        ],
        9,
    );
    check(&g, 9);
}

#[test]
fn avx512_head_and_program_tail_are_one_chained_kernel() {
    // conv + sign (no step form) on AVX-512: the microkernel, then the
    // Cranelift tail, entered through the trampoline (push rdi; push rsi;
    // sub rsp, 8; call).
    let g = fused_graph(
        Some((
            conv(1, 1),
            vec![Arg::Input(vec![1, 3, 9, 10]), Arg::Const(vec![20, 3, 3, 3])],
        )),
        vec![],
        vec![Instr::Unary(UnaryOp::Sign, r(0))],
        10,
    );
    let opts = CpuOptions {
        target: CpuTarget::X86_64Avx512,
        opt_level: 2,
        threads: 1,
    };
    let a = compile(&g, &opts, ArtifactInfo::default()).unwrap();
    assert_eq!(a.kernels.len(), 1);
    let k = &a.kernels[0];
    let code = &a.text[k.text_offset as usize..];
    assert_eq!(&code[..7], &[0x57, 0x56, 0x48, 0x83, 0xEC, 0x08, 0xE8]);
}

/// Whether the AVX-512 kernel of `g`'s single fused node runs a Cranelift
/// tail after the microkernel (entered through the chaining trampoline)
/// rather than doing all its work in the store loop. Panics unless the
/// kernel is a microkernel.
fn has_program_tail(g: &Graph) -> bool {
    let opts = CpuOptions {
        target: CpuTarget::X86_64Avx512,
        opt_level: 2,
        threads: 1,
    };
    let a = compile(g, &opts, ArtifactInfo::default()).unwrap();
    assert_eq!(a.kernels.len(), 1);
    assert!(has_zmm_fma(&a), "not a microkernel");
    let code = &a.text[a.kernels[0].text_offset as usize..];
    code[..7] == [0x57, 0x56, 0x48, 0x83, 0xEC, 0x08, 0xE8]
}

#[test]
fn hard_swish_and_per_channel_affine_run_in_the_store_loop() {
    // PP-OCR's block: conv + bias, x * clip(x + 3, 0, 6) / 6, then a
    // per-channel scale and shift; pointwise, 3x3 (implicit GEMM) and
    // im2col (stride 2) heads.
    let body = vec![
        Instr::Binary(BinaryOp::Add, r(0), r(1)),
        Instr::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }, r(5)),
        Instr::Binary(BinaryOp::Mul, r(0), r(6)),
        Instr::Binary(BinaryOp::Div, r(7), r(2)),
        Instr::Binary(BinaryOp::Mul, r(3), r(8)),
        Instr::Binary(BinaryOp::Add, r(9), r(4)),
    ];
    let strided = DenseOp::Conv(Conv2d {
        strides: [2, 2],
        pads: [1; 4],
        dilations: [1, 1],
        group: 1,
    });
    for (i, (op, k)) in [(conv(0, 1), 1), (conv(1, 1), 3), (strided, 3)]
        .into_iter()
        .enumerate()
    {
        let g = fused_graph(
            Some((
                op,
                vec![
                    Arg::Input(vec![2, 8, 9, 21]),
                    Arg::Const(vec![20, 8, k, k]),
                    Arg::Const(vec![20]),
                ],
            )),
            vec![
                Arg::Const(vec![]),
                Arg::Const(vec![1]),
                Arg::Const(vec![20, 1, 1]),
                Arg::Const(vec![1, 20, 1, 1]),
            ],
            body.clone(),
            20 + i as u64,
        );
        check(&g, 20 + i as u64);
        assert!(!has_program_tail(&g), "case {i}");
    }
}

#[test]
fn matmul_epilogues_with_memory_operands_first_and_unary_ops() {
    // Row scalars and constants as first operands (sub, div), leaky relu,
    // hard sigmoid, hard swish, neg; on batched MatMul rows.
    let body = vec![
        Instr::Binary(BinaryOp::Sub, r(1), r(0)),
        Instr::Unary(UnaryOp::LeakyRelu { alpha: 0.1 }, r(3)),
        Instr::Binary(BinaryOp::Div, r(2), r(4)),
        Instr::Unary(
            UnaryOp::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            r(5),
        ),
        Instr::Unary(UnaryOp::HardSwish, r(6)),
        Instr::Unary(UnaryOp::Neg, r(7)),
        Instr::Binary(BinaryOp::Add, r(8), r(0)),
    ];
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![3, 37, 24]), Arg::Const(vec![24, 50])],
        )),
        vec![Arg::Const(vec![37, 1]), Arg::Const(vec![1, 1, 1])],
        body,
        30,
    );
    check(&g, 30);
    assert!(!has_program_tail(&g));
}

#[test]
fn erf_gelu_runs_in_the_store_loop() {
    // MatMul + bias, then 0.5 * x * (1 + erf(x / √2)) as BERT exports it,
    // inputs spanning erf's clamp at ±4.
    let body = vec![
        Instr::Binary(BinaryOp::Add, r(0), r(1)),
        Instr::Binary(BinaryOp::Div, r(5), r(2)),
        Instr::Unary(UnaryOp::Erf, r(6)),
        Instr::Binary(BinaryOp::Add, r(7), r(3)),
        Instr::Binary(BinaryOp::Mul, r(5), r(8)),
        Instr::Binary(BinaryOp::Mul, r(9), r(4)),
    ];
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![40, 64]), Arg::Const(vec![64, 72])],
        )),
        vec![
            Arg::Const(vec![72]),
            Arg::Const(vec![]),
            Arg::Const(vec![]),
            Arg::Const(vec![]),
        ],
        body,
        32,
    );
    check(&g, 32);
    assert!(!has_program_tail(&g));
    // The same as the single op `recognize` makes of it.
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![40, 64]), Arg::Const(vec![64, 72])],
        )),
        vec![Arg::Const(vec![72])],
        vec![
            Instr::Binary(BinaryOp::Add, r(0), r(1)),
            Instr::Unary(UnaryOp::Gelu { tanh: false }, r(2)),
        ],
        34,
    );
    check(&g, 34);
    assert!(!has_program_tail(&g));
}

#[test]
fn per_column_operands_run_in_the_store_loop() {
    // A scale along the last axis (an int8 rescale's shape) then a bias
    // and Relu: every column tile, the masked last vector (50 and 300
    // columns), a batched product and one split by columns over threads
    // (4 rows) read their columns of the operands.
    for (a, n) in [
        (vec![37, 24], 50),
        (vec![3, 20, 24], 300),
        (vec![200, 24], 300),
        (vec![4, 512], 2050),
    ] {
        let k = *a.last().unwrap();
        let g = fused_graph(
            Some((
                DenseOp::MatMul,
                vec![Arg::Input(a.clone()), Arg::Const(vec![k, n])],
            )),
            vec![Arg::Const(vec![n]), Arg::Const(vec![1, n])],
            vec![
                Instr::Binary(BinaryOp::Mul, r(0), r(1)),
                Instr::Binary(BinaryOp::Sub, r(3), r(2)),
                Instr::Unary(UnaryOp::Relu, r(4)),
            ],
            31,
        );
        check(&g, 31);
        assert!(!has_program_tail(&g), "{a:?} x {n}");
    }
}

/// A convolution with one output pixel per image (a squeeze-excite 1×1 on
/// a pooled map, a classifier conv whose window covers its input) runs as
/// a fully connected GEMM, channels as columns: its per-channel operands
/// (bias in the head, a per-channel scale in the program, a per-image
/// shift) and hard-sigmoid still run in the store loop, on odd channel
/// counts, 1 and 3 images.
#[test]
fn fully_connected_convolutions_keep_per_channel_epilogues() {
    for (x, w) in [
        (vec![1, 37, 1, 1], vec![21, 37, 1, 1]),
        (vec![3, 40, 1, 1], vec![130, 40, 1, 1]),
        (vec![3, 5, 7, 7], vec![19, 5, 7, 7]),
    ] {
        let (n, oc) = (x[0], w[0]);
        let g = fused_graph(
            Some((
                conv(0, 1),
                vec![
                    Arg::Input(x.clone()),
                    Arg::Const(w.clone()),
                    Arg::Const(vec![oc]),
                ],
            )),
            vec![Arg::Const(vec![1, oc, 1, 1]), Arg::Const(vec![n, 1, 1, 1])],
            vec![
                Instr::Binary(BinaryOp::Mul, r(0), r(1)),
                Instr::Binary(BinaryOp::Add, r(3), r(2)),
                Instr::Unary(
                    UnaryOp::HardSigmoid {
                        alpha: 0.2,
                        beta: 0.5,
                    },
                    r(4),
                ),
            ],
            41,
        );
        check(&g, 41);
        assert!(!has_program_tail(&g), "{x:?} * {w:?}");
    }
}

#[test]
fn programs_the_store_loop_cannot_hold_keep_a_tail() {
    // A sign has no step form: it stays a Cranelift tail.
    let g = fused_graph(
        Some((
            DenseOp::MatMul,
            vec![Arg::Input(vec![37, 24]), Arg::Const(vec![24, 50])],
        )),
        vec![],
        vec![
            Instr::Unary(UnaryOp::Relu, r(0)),
            Instr::Unary(UnaryOp::Sign, r(1)),
        ],
        31,
    );
    check(&g, 31);
    assert!(has_program_tail(&g));
}

/// Headless chains whose operands are full-size, one value per channel
/// (of a single image), one per index of the last axis or one value run as the AVX-512 elementwise kernel:
/// rows with full vectors and a masked tail, split over tasks, matching the
/// reference; a chain with an op that has no step form (`exp`) keeps its
/// Cranelift kernel.
#[test]
fn headless_chains_run_as_avx512_elementwise_kernels() {
    let program = vec![
        Instr::Binary(BinaryOp::Mul, r(0), r(1)),
        Instr::Binary(BinaryOp::Add, r(4), r(2)),
        Instr::Unary(UnaryOp::HardSwish, r(5)),
        Instr::Binary(BinaryOp::Sub, r(6), r(3)),
        Instr::Unary(UnaryOp::Gelu { tanh: false }, r(7)),
    ];
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    for (i, (shape, per)) in [
        (vec![1, 5, 7, 9], vec![1, 5, 1, 1]),
        // Per channel over a batch: the operand's rows wrap every 5 rows
        // (split into parts that start inside a period, too).
        (vec![3, 5, 7, 9], vec![5, 1, 1]),
        (vec![3, 5, 64, 65], vec![5, 1, 1]),
        (vec![1, 3, 16], vec![3, 1]),
        (vec![3, 40], vec![1]),
        (vec![2, 7, 33], vec![33]),
        (vec![70_001], vec![1]),
    ]
    .into_iter()
    .enumerate()
    {
        let g = fused_graph(
            None,
            vec![
                Arg::Input(shape.clone()),
                Arg::Input(shape.clone()),
                Arg::Const(per),
                Arg::Const(vec![1]),
            ],
            program.clone(),
            40 + i as u64,
        );
        check(&g, 40 + i as u64);
        for threads in [1, 4] {
            let opts = |target| CpuOptions {
                target,
                opt_level: 2,
                threads,
            };
            let native = compile(&g, &opts(CpuTarget::Native), ArtifactInfo::default()).unwrap();
            assert_eq!(
                has_zmm_code(&native),
                avx512,
                "{shape:?}: the elementwise microkernel"
            );
            let v3 = compile(&g, &opts(CpuTarget::X86_64V3), ArtifactInfo::default()).unwrap();
            assert!(!has_zmm_code(&v3), "{shape:?}: Cranelift code only");
        }
    }
    // Split over four threads: the same bits as one kernel.
    let g = fused_graph(
        None,
        vec![
            Arg::Input(vec![1, 8, 64, 65]),
            Arg::Input(vec![1, 8, 64, 65]),
            Arg::Const(vec![8, 1, 1]),
            Arg::Const(vec![1]),
        ],
        program.clone(),
        50,
    );
    check(&g, 50);
    // The requantization chain of dynamic int8 (scale, round half to even,
    // shift, clamp), with a scale of 1 on values at .5 ties.
    let g = fused_graph(
        None,
        vec![
            Arg::Input(vec![3, 37]),
            Arg::Input(vec![1]),
            Arg::Const(vec![1]),
        ],
        vec![
            Instr::Binary(BinaryOp::Div, r(0), r(1)),
            Instr::Unary(UnaryOp::Round, r(3)),
            Instr::Binary(BinaryOp::Add, r(4), r(2)),
            Instr::Unary(
                UnaryOp::Clip {
                    min: 0.0,
                    max: 255.0,
                },
                r(5),
            ),
        ],
        52,
    );
    let ties: Vec<f32> = (0..3 * 37).map(|i| i as f32 * 0.5 - 20.0).collect();
    check_for(
        &g,
        &[
            Tensor::new([3, 37], kiln_ir::Data::F32(ties)).unwrap(),
            Tensor::new([1], kiln_ir::Data::F32(vec![1.0])).unwrap(),
        ],
        0.0,
        CpuTarget::Native,
    );
    check(&g, 52);
    let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
    assert_eq!(has_zmm_code(&native), avx512, "round has a step form");
    // Sign has no step form.
    let g = fused_graph(
        None,
        vec![Arg::Input(vec![4, 33]), Arg::Const(vec![1])],
        vec![
            Instr::Binary(BinaryOp::Mul, r(0), r(1)),
            Instr::Unary(UnaryOp::Sign, r(2)),
        ],
        51,
    );
    check(&g, 51);
    let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
    assert!(!has_zmm_code(&native), "sign keeps the Cranelift kernel");
}

#[test]
fn transcendental_steps_run_over_their_whole_range() {
    // Headless exp, sigmoid (det's output map), tanh and tanh-form GELU (a
    // recurrent cell's gates, GPT-2's MLP) on inputs from -122 to 121
    // (both clamps of exp, tanh's at ±7.9), zeros, infinities and NaN,
    // against the reference, on the AVX-512 kernel and the Cranelift one.
    let avx512 = std::arch::is_x86_feature_detected!("avx512f");
    let mut values: Vec<f32> = (0..4 * 61).map(|i| i as f32 - 122.0).collect();
    values.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        88.7,
        88.9,
        -87.1,
    ]);
    values.extend((0..30).map(|i| (i as f32 - 15.0) * 0.137));
    values.extend((0..200).map(|i| (i as f32 - 100.0) * 0.0813));
    values.extend([1e-30, -1e-7, 7.9, -7.91, 20.0]);
    let n = values.len();
    let x = Tensor::new([n], kiln_ir::Data::F32(values)).unwrap();
    let ops = [
        UnaryOp::Exp,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Gelu { tanh: true },
    ];
    for (i, op) in ops.into_iter().enumerate() {
        let g = fused_graph(
            None,
            vec![Arg::Input(vec![n]), Arg::Const(vec![1])],
            vec![
                Instr::Unary(op, r(0)),
                Instr::Binary(BinaryOp::Add, r(2), r(1)),
            ],
            60 + i as u64,
        );
        for target in [CpuTarget::Native, CpuTarget::X86_64V3] {
            check_for(&g, std::slice::from_ref(&x), 1e-6, target);
        }
        let native = compile(&g, &CpuOptions::default(), ArtifactInfo::default()).unwrap();
        assert_eq!(has_zmm_code(&native), avx512, "{op:?} has a step form");
    }
    // SiLU after a conv (PP-OCRv4 rec's `x · sigmoid(x)`) in the store loop.
    let g = fused_graph(
        Some((
            conv(1, 1),
            vec![
                Arg::Input(vec![1, 16, 5, 40]),
                Arg::Const(vec![24, 16, 3, 3]),
                Arg::Const(vec![24]),
            ],
        )),
        vec![],
        vec![
            Instr::Unary(UnaryOp::Sigmoid, r(0)),
            Instr::Binary(BinaryOp::Mul, r(0), r(1)),
        ],
        55,
    );
    check(&g, 55);
    assert!(!has_program_tail(&g));
    // An RNN cell's tanh(x·W + b) and a tanh-GELU MLP in the store loop.
    for (i, op) in [UnaryOp::Tanh, UnaryOp::Gelu { tanh: true }]
        .into_iter()
        .enumerate()
    {
        let g = fused_graph(
            Some((
                DenseOp::MatMul,
                vec![Arg::Input(vec![5, 48]), Arg::Const(vec![48, 70])],
            )),
            vec![Arg::Const(vec![70])],
            vec![
                Instr::Binary(BinaryOp::Add, r(0), r(1)),
                Instr::Unary(op, r(2)),
            ],
            56 + i as u64,
        );
        check(&g, 56 + i as u64);
        assert!(!has_program_tail(&g), "{op:?} in the store loop");
    }
}

/// The end of an int8 activation quantization after `at`: `/ 4`, round,
/// `+ 128`, clip to the u8 range (the kernel then stores u8), reading the
/// two constants at registers `quarter` and `zero_point`.
fn quantize_u8(at: u32, quarter: u32, zero_point: u32) -> Vec<Instr> {
    vec![
        Instr::Binary(BinaryOp::Mul, r(at), r(quarter)),
        Instr::Unary(UnaryOp::Round, r(at + 1)),
        Instr::Binary(BinaryOp::Add, r(at + 2), r(zero_point)),
        Instr::Unary(
            UnaryOp::Clip {
                min: 0.0,
                max: 255.0,
            },
            r(at + 3),
        ),
    ]
}

/// A graph whose single fused node stores u8: `head` over `head_args`,
/// then `before`, then [`quantize_u8`] of its last value. The program's
/// inputs: the head's result (when there is a head), `extra`, then the
/// quarter and the zero point; constants are small integers.
fn quantized_graph(
    head: Option<(DenseOp, Vec<Arg>)>,
    mut extra: Vec<Arg>,
    mut before: Vec<Instr>,
    seed: u64,
) -> Graph {
    let inputs = (usize::from(head.is_some()) + extra.len()) as u32;
    extra.extend([Arg::Value(0.25), Arg::Value(128.0)]);
    let last = inputs + 2 + before.len() as u32 - 1;
    before.extend(quantize_u8(last, inputs, inputs + 1));
    fused_graph_storing(head, extra, before, seed, (FusedStore::U8, small_ints))
}

#[test]
fn quantizing_kernels_store_u8_from_every_store_loop() {
    let relu = || Instr::Unary(UnaryOp::Relu, r(0));
    type Case = (
        &'static str,
        Option<(DenseOp, Vec<Arg>)>,
        Vec<Arg>,
        Vec<Instr>,
    );
    let cases: Vec<Case> = vec![
        (
            "elementwise",
            None,
            vec![Arg::Input(vec![2, 5, 37]), Arg::Const(vec![5, 1])],
            vec![Instr::Binary(BinaryOp::Mul, r(0), r(1))],
        ),
        (
            "pointwise conv",
            Some((
                conv(0, 1),
                vec![Arg::Input(vec![1, 8, 7, 9]), Arg::Const(vec![20, 8, 1, 1])],
            )),
            vec![Arg::Const(vec![20, 1, 1])],
            vec![Instr::Binary(BinaryOp::Add, r(0), r(1))],
        ),
        (
            "im2col conv, two images",
            Some((
                conv(1, 1),
                vec![Arg::Input(vec![2, 3, 9, 10]), Arg::Const(vec![20, 3, 3, 3])],
            )),
            vec![],
            vec![relu()],
        ),
        (
            "depthwise conv",
            Some((
                conv(1, 6),
                vec![Arg::Input(vec![1, 6, 9, 21]), Arg::Const(vec![6, 1, 3, 3])],
            )),
            vec![],
            vec![relu()],
        ),
        (
            "matmul",
            Some((
                DenseOp::MatMul,
                vec![Arg::Input(vec![3, 19, 24]), Arg::Const(vec![24, 40])],
            )),
            vec![],
            vec![relu()],
        ),
    ];
    for (i, (what, head, extra, before)) in cases.into_iter().enumerate() {
        let headed = head.is_some();
        let g = quantized_graph(head, extra, before, 40 + i as u64);
        assert_eq!(g.node(g.outputs()[0].1).ty.dtype, DType::U8, "{what}");
        check_exact(&g, 40 + i as u64);
        if headed && has_zmm_code_for(&g) {
            assert!(!has_program_tail(&g), "{what}: the store loop stores u8");
        }
    }
}

#[test]
fn quantizing_kernels_with_a_program_tail_stage_f32_in_scratch() {
    // Sign has no store-loop form, a full-size residual after the head's
    // first step none either: the head writes f32 scratch, the tail (a
    // Cranelift function, an AVX-512 elementwise kernel) reads it and
    // stores u8.
    let cases: Vec<(&str, Vec<Arg>, Vec<Instr>)> = vec![
        (
            "sign",
            vec![Arg::Value(200.0)],
            vec![
                Instr::Unary(UnaryOp::Sign, r(0)),
                Instr::Binary(BinaryOp::Mul, r(4), r(1)),
            ],
        ),
        (
            "residual",
            vec![Arg::Const(vec![]), Arg::Input(vec![1, 20, 9, 10])],
            vec![
                Instr::Binary(BinaryOp::Mul, r(0), r(1)),
                Instr::Binary(BinaryOp::Add, r(5), r(2)),
            ],
        ),
    ];
    for (i, (what, extra, before)) in cases.into_iter().enumerate() {
        let head = Some((
            conv(1, 1),
            vec![Arg::Input(vec![1, 3, 9, 10]), Arg::Const(vec![20, 3, 3, 3])],
        ));
        let g = quantized_graph(head, extra, before, 50 + i as u64);
        check_exact(&g, 50 + i as u64);
        if has_zmm_code_for(&g) {
            assert!(has_program_tail(&g), "{what}: a tail after the store loop");
        }
    }
}

/// Whether the host runs AVX-512 kernels (the microkernel path).
fn has_zmm_code_for(g: &Graph) -> bool {
    let _ = g;
    std::arch::is_x86_feature_detected!("avx512f")
}

/// A 7×7 depthwise convolution on a 7×7 map runs on 16-channel blocks;
/// its store applies hard-swish and a per-channel scale and shift as
/// vectors of the block's channels (20 channels: a full block and a
/// partial one, under a mask).
#[test]
fn blocked_depthwise_conv_applies_per_channel_operands_per_lane() {
    let g = fused_graph(
        Some((
            conv(3, 20),
            vec![
                Arg::Input(vec![2, 20, 7, 7]),
                Arg::Const(vec![20, 1, 7, 7]),
                Arg::Const(vec![20]),
            ],
        )),
        vec![Arg::Const(vec![20, 1, 1]), Arg::Const(vec![1, 20, 1, 1])],
        vec![
            Instr::Unary(UnaryOp::HardSwish, r(0)),
            Instr::Binary(BinaryOp::Mul, r(3), r(1)),
            Instr::Binary(BinaryOp::Add, r(2), r(4)),
        ],
        35,
    );
    check(&g, 35);
    assert!(!has_program_tail(&g));
    let opts = CpuOptions {
        target: CpuTarget::X86_64Avx512,
        opt_level: 2,
        threads: 1,
    };
    let a = compile(&g, &opts, ArtifactInfo::default()).unwrap();
    assert_eq!(
        a.profiles[0].dense_kernels[0].kernel,
        "avx512/depthwise-c16"
    );
}

/// A Winograd convolution (AVX-512) with a fused program: a leading Relu
/// or Clip in the output transform, the rest of the program as a step
/// after it; 16-bit weights are transformed as f32. Against the reference
/// evaluator.
#[test]
fn winograd_conv_runs_its_program_after_the_output_transform() {
    let head = || {
        Some((
            conv(1, 1),
            vec![
                Arg::Input(vec![2, 48, 26, 26]),
                Arg::Const(vec![40, 48, 3, 3]),
                Arg::Const(vec![40]),
            ],
        ))
    };
    let residual = || vec![Arg::Input(vec![2, 40, 26, 26])];
    let relu = || vec![Instr::Unary(UnaryOp::Relu, r(0))];
    let [p0, p1, p2] = head_programs(head, residual, 21);
    let graphs = [
        p0,
        p1,
        p2,
        fused_graph_storing(head(), vec![], relu(), 24, (FusedStore::F32, f16_weights)),
        fused_graph_storing(head(), vec![], relu(), 25, (FusedStore::F32, bf16_weights)),
        // A large map of few channels runs in bands of tile rows.
        fused_graph(
            Some((
                conv(1, 1),
                vec![
                    Arg::Input(vec![1, 32, 96, 96]),
                    Arg::Const(vec![32, 32, 3, 3]),
                    Arg::Const(vec![32]),
                ],
            )),
            vec![Arg::Input(vec![1, 32, 96, 96])],
            vec![
                Instr::Binary(BinaryOp::Add, r(1), r(0)),
                Instr::Unary(UnaryOp::Relu, r(2)),
            ],
            26,
        ),
    ];
    for (i, g) in graphs.iter().enumerate() {
        let opts = CpuOptions {
            target: CpuTarget::X86_64Avx512,
            opt_level: 2,
            threads: 2,
        };
        let a = compile(g, &opts, ArtifactInfo::default()).unwrap();
        let kernel = &a.profiles[0].dense_kernels[0].kernel;
        assert_eq!(kernel, "avx512/winograd", "program {i}");
        if std::arch::is_x86_feature_detected!("avx512f") {
            let mut rng = Rng::new(50 + i as u64);
            let inputs: Vec<Tensor> = (g.inputs().iter())
                .map(|&id| rand_tensor(&mut rng, DType::F32, &g.node(id).ty.shape))
                .collect();
            // Tolerances relative to each output's scale: the convolution's
            // values reach ~200 (inputs and weights in ±3), program 2's
            // sigmoid output 1, so its 5e-4 is ~2e-6 of the convolution's.
            let tolerance = [2e-5, 2e-5, 5e-4, 2e-5, 2e-5, 2e-5][i];
            check_for(g, &inputs, tolerance, CpuTarget::X86_64Avx512);
        }
    }
}

/// `head` with three programs after it (seeds `seed..`): a Relu (the
/// store loop's), a residual add then a Relu (a tail), and a Clip then a
/// product with the residual and a Sigmoid (a Clip taken, the rest a
/// tail).
fn head_programs(
    head: impl Fn() -> Option<(DenseOp, Vec<Arg>)>,
    residual: impl Fn() -> Vec<Arg>,
    seed: u64,
) -> [Graph; 3] {
    [
        fused_graph(
            head(),
            vec![],
            vec![Instr::Unary(UnaryOp::Relu, r(0))],
            seed,
        ),
        fused_graph(
            head(),
            residual(),
            vec![
                Instr::Binary(BinaryOp::Add, r(1), r(0)),
                Instr::Unary(UnaryOp::Relu, r(2)),
            ],
            seed + 1,
        ),
        fused_graph(
            head(),
            residual(),
            vec![
                Instr::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }, r(0)),
                Instr::Binary(BinaryOp::Mul, r(2), r(1)),
                Instr::Unary(UnaryOp::Sigmoid, r(3)),
            ],
            seed + 2,
        ),
    ]
}

/// A convolution whose pixels run as rows (49 pixels, 80 channels: the
/// transposed GEMM, then a transpose) keeps its fused program: a leading
/// Relu in the store loop with the bias, the rest (a residual add, a
/// product and a sigmoid) over the output after the transpose. On AVX-512
/// and AVX2, against the reference evaluator; 16-bit weights (B widened
/// as it is loaded) on AVX-512 only, as every AVX2 GEMM reads f32.
#[test]
fn pixel_rows_conv_runs_its_program_after_the_transpose() {
    let head = || {
        Some((
            conv(1, 1),
            vec![
                Arg::Input(vec![2, 64, 7, 7]),
                Arg::Const(vec![80, 64, 3, 3]),
                Arg::Const(vec![80]),
            ],
        ))
    };
    let residual = || vec![Arg::Input(vec![2, 80, 7, 7])];
    let graphs = head_programs(head, residual, 11);
    let relu = || vec![Instr::Unary(UnaryOp::Relu, r(0))];
    let half = [f16_weights as Values, bf16_weights]
        .map(|values| fused_graph_storing(head(), vec![], relu(), 14, (FusedStore::F32, values)));
    for (i, g) in graphs.iter().chain(&half).enumerate() {
        let mut rng = Rng::new(40 + i as u64);
        let inputs: Vec<Tensor> = (g.inputs().iter())
            .map(|&id| rand_tensor(&mut rng, DType::F32, &g.node(id).ty.shape))
            .collect();
        let targets = [
            (CpuTarget::X86_64Avx512, "avx512", "avx512f"),
            (CpuTarget::X86_64V3, "avx2", "avx2"),
        ];
        for (target, isa, feature) in targets.into_iter().take(2 - i / graphs.len()) {
            let opts = CpuOptions {
                target,
                opt_level: 2,
                threads: 2,
            };
            let a = compile(g, &opts, ArtifactInfo::default()).unwrap();
            let kernel = &a.profiles[0].dense_kernels[0].kernel;
            assert_eq!(*kernel, format!("{isa}/transposed-gemm"), "program {i}");
            let runs = match feature {
                "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
                _ => std::arch::is_x86_feature_detected!("avx2"),
            };
            if runs {
                check_for(g, &inputs, 1e-5, target);
            }
        }
    }
}
