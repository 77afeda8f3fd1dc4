//! Dense kernels split into tasks (`lower/partition.rs`) and run by a
//! session's worker threads: the split artifact has steps of several tasks,
//! and its outputs, with one thread or three, equal bit for bit those of
//! the unsplit artifact (a task computes its rows exactly as the whole
//! kernel does) and match the reference evaluator.

mod common;

use common::{f32_tensor, Rng};
use kiln_ir::{
    BinaryOp, Col2Im, Conv2d, CoordinateTransform, DType, Data, DenseHead, DenseOp,
    ElementwiseProgram, FusedKernel, FusedStore, Graph, Instr, NearestRounding, Op, Pool2d, Reg,
    Resize, ResizeMode, Tensor, UnaryOp, ValueType,
};
use kiln_runtime::{Model, TensorRef};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

fn artifact(g: &Graph, threads: usize) -> kiln_format::Artifact {
    let opts = CpuOptions {
        target: CpuTarget::Native,
        opt_level: 2,
        threads,
    };
    compile(g, &opts, ArtifactInfo::default()).expect("compile")
}

fn run(model: &Model, g: &Graph, inputs: &[Tensor], threads: usize) -> Vec<Vec<u8>> {
    let names: Vec<String> = g.inputs().iter().map(|&i| g.node(i).name.clone()).collect();
    let shapes: Vec<Vec<u64>> = inputs
        .iter()
        .map(|t| t.shape().iter().map(|&d| d as u64).collect())
        .collect();
    let datas: Vec<Vec<u8>> = inputs.iter().map(|t| t.data().to_le_bytes()).collect();
    let refs: Vec<TensorRef> = (0..inputs.len())
        .map(|i| TensorRef::new(&names[i], inputs[i].dtype(), &shapes[i], &datas[i]))
        .collect();
    let mut session = model.session_with_threads(threads).expect("session");
    assert_eq!(session.threads(), threads);
    // Twice: the second run reuses the parked workers.
    session.run(&refs).expect("run");
    let outs = session.run(&refs).expect("run");
    outs.into_iter().map(|t| t.data).collect()
}

/// Compiles `g` split for 4 threads and unsplit, and compares.
fn check_split(g: &Graph, seed: u64) {
    let mut rng = Rng::new(seed);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&i| f32_tensor(&mut rng, &g.node(i).ty.shape))
        .collect();
    let split = artifact(g, 4);
    let whole = artifact(g, 1);
    let max_tasks = split.profiles[0]
        .schedule
        .iter()
        .map(|s| s.tasks)
        .max()
        .unwrap();
    assert!(
        max_tasks > 1,
        "nothing was split: {:?}",
        split.profiles[0].schedule
    );
    assert!(whole.profiles[0].schedule.iter().all(|s| s.tasks == 1));
    // A split fused head with a program tail adds the tail's step.
    assert!(split.profiles[0].schedule.len() >= whole.profiles[0].schedule.len());
    let split = Model::from_bytes(&split.to_bytes()).unwrap();
    let whole = Model::from_bytes(&whole.to_bytes()).unwrap();
    assert_eq!(split.max_tasks(), max_tasks as usize);
    let reference = run(&whole, g, &inputs, 1);
    assert_eq!(run(&split, g, &inputs, 1), reference, "split, one thread");
    assert_eq!(
        run(&split, g, &inputs, 3),
        reference,
        "split, three threads"
    );
    let expected = kiln_ir::eval::eval_graph(g, &inputs).unwrap();
    for (e, got) in expected.iter().zip(&reference) {
        let got = Tensor::new(e.shape(), Data::from_le_bytes(e.dtype(), got).unwrap())
            .unwrap()
            .to_f64_vec();
        let float = e.dtype().is_float();
        let e = e.to_f64_vec();
        let scale = e.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (x, y) in e.iter().zip(&got) {
            // A quantized (u8) output may round a value within the f32
            // products' error of a half the other way: one step.
            let slack = if float { 1e-5 * scale } else { 1.0 };
            assert!((x - y).abs() <= slack, "expected {x}, got {y}");
        }
    }
}

fn constant(g: &mut Graph, rng: &mut Rng, name: &str, shape: &[usize]) -> kiln_ir::NodeId {
    let t = f32_tensor(rng, shape);
    g.add_const(name, t)
}

/// A fused MatMul whose program continues past the store loop (bias, then
/// an absolute value): split, the head's tasks are one step and the program runs
/// over the whole output as the next; the results equal the unsplit
/// chained kernel's bit for bit.
#[test]
fn fused_head_with_a_program_tail_splits_the_head() {
    let mut rng = Rng::new(5);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [256, 384]));
    let w = constant(&mut g, &mut rng, "w", &[384, 256]);
    let b = constant(&mut g, &mut rng, "b", &[256]);
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Binary(BinaryOp::Add, Reg(0), Reg(1)),
            Instr::Unary(UnaryOp::Abs, Reg(2)),
        ],
    )
    .unwrap();
    let head = DenseHead {
        op: DenseOp::MatMul,
        inputs: 2,
    };
    let k = FusedKernel::new(Some(head), body).unwrap();
    let y = g
        .add_node(Op::Fused(Box::new(k)), &[x, w, b], "fused")
        .unwrap();
    g.add_output("y", y);
    let (split, whole) = (artifact(&g, 4), artifact(&g, 1));
    if split.profiles[0].schedule.iter().all(|s| s.tasks == 1) {
        eprintln!("no AVX-512 microkernel on this host: nothing is split");
        return;
    }
    assert_eq!(
        whole.profiles[0].schedule.len(),
        1,
        "{:?}",
        whole.profiles[0].schedule
    );
    assert_eq!(
        split.profiles[0].schedule.len(),
        2,
        "{:?}",
        split.profiles[0].schedule
    );
    // The tail (abs, in place) is split too.
    assert!(
        split.profiles[0].schedule[1].tasks > 1,
        "{:?}",
        split.profiles[0].schedule
    );
    check_split(&g, 15);
}

/// A split fused MatMul that stores u8 with a program tail: the head's
/// tasks write f32 scratch, the tail's tasks (a Cranelift tail for `abs`,
/// an AVX-512 elementwise one for a full-size addend) read it and store
/// the bytes.
#[test]
fn quantizing_head_with_a_program_tail_splits_through_scratch() {
    for full_addend in [false, true] {
        let mut rng = Rng::new(8);
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [256, 384]));
        let w = constant(&mut g, &mut rng, "w", &[384, 256]);
        let scalar = |g: &mut Graph, name: &str, v: f32| {
            g.add_const(name, Tensor::new([], Data::F32(vec![v])).unwrap())
        };
        let (extra, first) = if full_addend {
            let r = g.add_input("r", ValueType::new(DType::F32, [256, 256]));
            // x0 * 0.5 + r: the full-size operand after the first step
            // has no store-loop form.
            let half = scalar(&mut g, "half", 0.5);
            (
                vec![half, r],
                vec![
                    Instr::Binary(BinaryOp::Mul, Reg(0), Reg(1)),
                    Instr::Binary(BinaryOp::Add, Reg(5), Reg(2)),
                ],
            )
        } else {
            let b = constant(&mut g, &mut rng, "b", &[256]);
            let half = scalar(&mut g, "half", 0.5);
            (
                vec![b, half],
                vec![
                    Instr::Binary(BinaryOp::Add, Reg(0), Reg(1)),
                    Instr::Unary(UnaryOp::Abs, Reg(5)),
                ],
            )
        };
        let scale = scalar(&mut g, "inverse_scale", 16.0);
        let zero_point = scalar(&mut g, "zero_point", 100.0);
        let mut instrs = first;
        instrs.extend([
            Instr::Binary(BinaryOp::Mul, Reg(6), Reg(3)),
            Instr::Unary(UnaryOp::Round, Reg(7)),
            Instr::Binary(BinaryOp::Add, Reg(8), Reg(4)),
            Instr::Unary(
                UnaryOp::Clip {
                    min: 0.0,
                    max: 255.0,
                },
                Reg(9),
            ),
        ]);
        let body = ElementwiseProgram::new(5, instrs).unwrap();
        let head = DenseHead {
            op: DenseOp::MatMul,
            inputs: 2,
        };
        let k = FusedKernel::new(Some(head), body)
            .unwrap()
            .with_store(FusedStore::U8);
        let mut ins = vec![x, w];
        ins.extend(extra);
        ins.extend([scale, zero_point]);
        let y = g.add_node(Op::Fused(Box::new(k)), &ins, "fused").unwrap();
        g.add_output("y", y);
        let split = artifact(&g, 4);
        if split.profiles[0].schedule.iter().all(|s| s.tasks == 1) {
            eprintln!("no AVX-512 microkernel on this host: nothing is split");
            return;
        }
        assert_eq!(
            split.profiles[0].schedule.len(),
            2,
            "{:?}",
            split.profiles[0].schedule
        );
        assert!(
            split.profiles[0].schedule[1].tasks > 1,
            "{:?}",
            split.profiles[0].schedule
        );
        check_split(&g, 16);
    }
}

/// Elementwise kernels (binary with operands broadcast along and across
/// the split axis, constant or not, unary, a headless fused program,
/// layer norm) split
/// along their first non-unit axis.
#[test]
fn elementwise_kernels_split_along_their_first_non_unit_axis() {
    let mut rng = Rng::new(6);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 96, 512]));
    let bias = constant(&mut g, &mut rng, "bias", &[512]);
    let rows = g.add_input("rows", ValueType::new(DType::F32, [96, 1]));
    // A constant that varies along the split axis (a per-channel scale):
    // each part reads its own rows of it.
    let per_row = constant(&mut g, &mut rng, "per_row", &[96, 1]);
    let x = g
        .add_node(Op::Binary(BinaryOp::Mul), &[x, per_row], "scale_rows")
        .unwrap();
    let a = g
        .add_node(Op::Binary(BinaryOp::Add), &[x, bias], "add")
        .unwrap();
    let m = g
        .add_node(Op::Binary(BinaryOp::Mul), &[a, rows], "mul")
        .unwrap();
    let t = g.add_node(Op::Unary(UnaryOp::Tanh), &[m], "tanh").unwrap();
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Binary(BinaryOp::Sub, Reg(0), Reg(1)),
            Instr::Unary(UnaryOp::Abs, Reg(2)),
        ],
    )
    .unwrap();
    let k = FusedKernel::new(None, body).unwrap();
    let f = g
        .add_node(Op::Fused(Box::new(k)), &[t, x], "fused")
        .unwrap();
    let scale = constant(&mut g, &mut rng, "scale", &[512]);
    let ln = Op::LayerNorm {
        axis: 2,
        epsilon: 1e-5,
    };
    let y = g.add_node(ln, &[f, scale], "ln").unwrap();
    g.add_output("y", y);
    let split = artifact(&g, 4);
    assert!(
        split.profiles[0]
            .schedule
            .iter()
            .filter(|s| s.tasks > 1)
            .count()
            >= 5,
        "{:?}",
        split.profiles[0].schedule
    );
    check_split(&g, 16);
}

#[test]
fn matmul_split_by_rows_with_packed_b() {
    let mut rng = Rng::new(1);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [250, 512]));
    let w = constant(&mut g, &mut rng, "w", &[512, 200]);
    let y = g.add_node(Op::MatMul, &[x, w], "mm").unwrap();
    g.add_output("y", y);
    check_split(&g, 11);
}

#[test]
fn matmul_with_wider_weights_split_by_columns() {
    // A transformer FFN (128 tokens x 384 -> 1536): the weights are the
    // larger operand, so each task packs and reads only its columns.
    let mut rng = Rng::new(3);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [128, 384]));
    let w = constant(&mut g, &mut rng, "w", &[384, 1536]);
    let b = constant(&mut g, &mut rng, "b", &[1536]);
    let y = g.add_node(Op::MatMul, &[x, w], "mm").unwrap();
    let y = g
        .add_node(Op::Binary(BinaryOp::Add), &[y, b], "bias")
        .unwrap();
    g.add_output("y", y);
    check_split(&g, 21);
}

#[test]
fn matrix_vector_product_split_by_its_weight_bytes() {
    // One row against 1280 x 1000 weights (a classifier): 2.6 MFLOP,
    // below the FLOPs a task is worth, but 5 MB of weights to stream,
    // which two cores read at once.
    let mut rng = Rng::new(8);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 1280]));
    let w = constant(&mut g, &mut rng, "w", &[1280, 1000]);
    let y = g.add_node(Op::MatMul, &[x, w], "mm").unwrap();
    g.add_output("y", y);
    check_split(&g, 22);
}

#[test]
fn transposes_that_move_the_innermost_axis_split_by_source_rows() {
    // YOLO's head layout (the source-contiguous dim is 13 · 11 = 143: 17
    // groups of eight shared by four tasks, the last with the tail) and an
    // NCHW → NHWC conversion.
    for (i, (shape, perm)) in [
        (vec![1, 3, 85, 13, 11], vec![0, 1, 3, 4, 2]),
        (vec![1, 24, 40, 40], vec![0, 2, 3, 1]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, shape.clone()));
        let perm = kiln_ir::Ints::from_slice(&perm);
        let y = g.add_node(Op::Transpose { perm }, &[x], "t").unwrap();
        g.add_output("y", y);
        check_split(&g, 30 + i as u64);
    }
}

#[test]
fn matmul_split_by_rows_with_packed_a() {
    let mut rng = Rng::new(2);
    let mut g = Graph::new();
    let w = constant(&mut g, &mut rng, "w", &[300, 256]);
    let x = g.add_input("x", ValueType::new(DType::F32, [256, 160]));
    let y = g.add_node(Op::MatMul, &[w, x], "mm").unwrap();
    g.add_output("y", y);
    check_split(&g, 12);
}

#[test]
fn batched_matmul_split_by_calls() {
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [12, 128, 64]));
    let b = g.add_input("b", ValueType::new(DType::F32, [12, 64, 128]));
    let y = g.add_node(Op::MatMul, &[a, b], "bmm").unwrap();
    g.add_output("y", y);
    check_split(&g, 13);
}

#[test]
fn gemm_with_bias_rows_follow_the_split() {
    let mut rng = Rng::new(3);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [200, 384]));
    let w = constant(&mut g, &mut rng, "w", &[256, 384]);
    let c = g.add_input("c", ValueType::new(DType::F32, [200, 256]));
    let op = Op::Gemm {
        alpha: 0.5,
        beta: 2.0,
        trans_a: false,
        trans_b: true,
    };
    let y = g.add_node(op, &[x, w, c], "gemm").unwrap();
    g.add_output("y", y);
    check_split(&g, 14);
}

/// A stride-1 conv with bias of input `x` and weights `w`, padded by
/// `pad` on every side.
fn conv_graph(rng: &mut Rng, x: [usize; 4], w: [usize; 4], pad: usize) -> Graph {
    let conv = Conv2d {
        strides: [1, 1],
        pads: [pad; 4],
        dilations: [1, 1],
        group: 1,
    };
    conv_graph_of(rng, x, w, conv)
}

/// Convolution `conv` with bias of input `x` and weights `w`.
fn conv_graph_of(rng: &mut Rng, x: [usize; 4], w: [usize; 4], conv: Conv2d) -> Graph {
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let wi = constant(&mut g, rng, "w", &w);
    let b = constant(&mut g, rng, "b", &[w[0]]);
    let y = g.add_node(Op::Conv(conv), &[xi, wi, b], "conv").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn pointwise_conv_split_by_output_channels() {
    let mut rng = Rng::new(4);
    let g = conv_graph(&mut rng, [1, 192, 20, 20], [256, 192, 1, 1], 0);
    check_split(&g, 15);
}

#[test]
fn implicit_gemm_conv_split_at_band_boundaries() {
    // 3x3 stride 1 over 48 channels of 60x60: bands of output rows share
    // one padded copy of their input rows, so the tasks split between
    // bands (15 rows each, one band per task), never inside one.
    let mut rng = Rng::new(5);
    let g = conv_graph(&mut rng, [1, 48, 60, 60], [16, 48, 3, 3], 1);
    check_split(&g, 16);
    // 29 rows (a prime) of 48 columns (whole vectors: one GEMM per row)
    // cut into four bands of 8, 8, 8 and 5 rows: the last band's copy
    // reaches past the image, and only its 5 rows run.
    let g = conv_graph(&mut rng, [1, 32, 29, 48], [32, 32, 3, 3], 1);
    check_split(&g, 17);
}

#[test]
fn row_merged_implicit_gemm_conv_split() {
    // Rows of 40 and 28 columns do not fill whole vectors: one GEMM per
    // band of rows over shifted column planes. 29 rows (a prime) make one
    // band, split by output channels; 28 rows make bands of 14 (two per
    // image of two), split by bands; a dilated 3x3 and a 1x7 window.
    let mut rng = Rng::new(9);
    let cases = [
        ([1, 32, 29, 40], [32, 32, 3, 3], [1, 1], [1, 1, 1, 1]),
        ([2, 24, 28, 28], [40, 24, 3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 32, 30, 30], [48, 32, 3, 3], [2, 2], [2, 2, 2, 2]),
        ([1, 64, 17, 17], [64, 64, 1, 7], [1, 1], [0, 3, 0, 3]),
    ];
    for (seed, (x, w, dilations, pads)) in (30..).zip(cases) {
        let conv = Conv2d {
            strides: [1, 1],
            pads,
            dilations,
            group: 1,
        };
        check_split(&conv_graph_of(&mut rng, x, w, conv), seed);
    }
}

#[test]
fn im2col_conv_of_few_calls_builds_its_matrices_once() {
    // 100 output channels over 3x5 windows on rows of 16 (whole vectors,
    // so no row-merged implicit GEMM; not 3x3, which Winograd takes) go
    // through im2col; one image
    // (one GEMM call) or two, split for four threads: a first step of
    // tasks fills the matrices by runs of input channels (37 does not
    // divide among them; with two images a run crosses from one image's
    // matrix into the next), then the GEMM tasks share them.
    let mut rng = Rng::new(7);
    for (batch, seed) in [(1, 18), (2, 19)] {
        let conv = Conv2d {
            strides: [1, 1],
            pads: [1, 2, 1, 2],
            dilations: [1, 1],
            group: 1,
        };
        let g = conv_graph_of(&mut rng, [batch, 37, 16, 16], [100, 37, 3, 5], conv);
        let split = artifact(&g, 4);
        let im2col: Vec<&str> = (split.kernels.iter())
            .map(|k| k.name.as_str())
            .filter(|n| n.starts_with("conv/im2col"))
            .collect();
        assert!(im2col.len() > 1, "batch {batch}: {:?}", split.kernels);
        assert!(split.profiles[0].schedule.len() >= 2);
        check_split(&g, seed);
    }
}

#[test]
fn im2col_conv_of_a_prime_height_in_one_wide_band() {
    // 3x3 stride 2 over 208 channels of 35x35: a 2.9 MB im2col matrix of
    // 17 output rows, which no band size between 1 and 17 divides. Bands
    // of one 17-pixel row would fill half their vectors, so the whole
    // image is one band, shared by the GEMM's row tasks.
    let mut rng = Rng::new(8);
    let conv = Conv2d {
        strides: [2, 2],
        pads: [0; 4],
        dilations: [1, 1],
        group: 1,
    };
    let g = conv_graph_of(&mut rng, [1, 208, 35, 35], [16, 208, 3, 3], conv);
    check_split(&g, 21);
}

/// A graph of one pool `op` over an f32 input of `shape`.
fn pool_graph(shape: [usize; 4], op: Op) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, shape));
    let y = g.add_node(op, &[x], "pool").unwrap();
    g.add_output("y", y);
    g
}

/// Global pools over planes large enough to be worth a worker, split by
/// channel (batch 1) and by batch: each task pools its own planes. (An
/// f32 average pool runs on the row-fold kernel where AVX-512 is, which
/// splits by the bytes it reads, 128 KB a task at least: the batched
/// case reads 460 KB.)
#[test]
fn global_pools_split_by_channels_and_by_batch() {
    for (shape, op) in [
        ([1, 96, 56, 56], Op::GlobalAveragePool),
        ([1, 40, 28, 30], Op::GlobalMaxPool),
        ([3, 24, 40, 40], Op::GlobalAveragePool),
    ] {
        check_split(&pool_graph(shape, op), 18);
    }
}

/// Sliding-window pools split by channel (batch 1) and by batch: each
/// task pools its own planes, borders and ceil mode included.
#[test]
fn pools_split_by_channels_and_by_batch() {
    let window = |kernel, strides, pads, ceil_mode| Pool2d {
        kernel,
        strides,
        pads,
        dilations: [1, 1],
        ceil_mode,
    };
    for (shape, op) in [
        (
            [1, 64, 75, 75],
            Op::MaxPool(window([3, 3], [2, 2], [0, 0, 0, 0], false)),
        ),
        (
            [4, 24, 33, 31],
            Op::AveragePool {
                pool: window([3, 3], [1, 1], [1, 1, 1, 1], false),
                count_include_pad: false,
            },
        ),
        (
            [1, 37, 40, 40],
            Op::MaxPool(window([2, 2], [2, 2], [0, 0, 1, 1], true)),
        ),
    ] {
        check_split(&pool_graph(shape, op), 20);
    }
}

#[test]
fn col2im_split_by_channels() {
    // ConvTranspose's scatter (2x2 blocks at stride 2): each task moves
    // the blocks of its channels.
    let mut g = Graph::new();
    let x = g.add_input("cols", ValueType::new(DType::F32, [1, 96 * 4, 40 * 36]));
    let c = Col2Im {
        grid: [40, 36],
        image: [80, 72],
        block: [2, 2],
        strides: [2, 2],
        dilations: [1, 1],
        pads: [0, 0],
    };
    let y = g.add_node(Op::Col2Im(c), &[x], "col2im").unwrap();
    g.add_output("y", y);
    check_split(&g, 17);
}

#[test]
fn few_output_channels_split_by_columns() {
    // A pointwise conv to 12 channels (one row tile) over 150x150 pixels,
    // with a bias, and a MatMul of 4 rows: both wide and short, so the
    // tasks take column tiles.
    let mut rng = Rng::new(6);
    let g = conv_graph(&mut rng, [1, 96, 150, 150], [12, 96, 1, 1], 0);
    check_split(&g, 18);
    let mut g = Graph::new();
    let a = constant(&mut g, &mut rng, "a", &[4, 64]);
    let x = g.add_input("x", ValueType::new(DType::F32, [64, 100_000]));
    let y = g.add_node(Op::MatMul, &[a, x], "mm").unwrap();
    g.add_output("y", y);
    check_split(&g, 19);
}

#[test]
fn resize_split_by_channels_and_concat_by_inputs() {
    // FPN-style: a 2x nearest upsample (channels kept, so split by them)
    // and a bilinear one, concatenated with a third map (each task copies
    // its own inputs).
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 32, 40, 40]));
    let z = g.add_input("z", ValueType::new(DType::F32, [1, 16, 80, 80]));
    let up = |mode| {
        Op::Resize(Resize {
            shape: [1, 32, 80, 80].into_iter().collect(),
            scales: [1.0, 1.0, 2.0, 2.0].into_iter().collect(),
            mode,
            coord: CoordinateTransform::Asymmetric,
            antialias: false,
            roi: Default::default(),
        })
    };
    let a = g
        .add_node(up(ResizeMode::Nearest(NearestRounding::Floor)), &[x], "up")
        .unwrap();
    let b = g
        .add_node(up(ResizeMode::Linear), &[x], "up_linear")
        .unwrap();
    let y = g
        .add_node(Op::Concat { axis: 1 }, &[a, b, z], "concat")
        .unwrap();
    g.add_output("y", y);
    let split = artifact(&g, 4);
    assert!(
        split.profiles[0].schedule.iter().all(|s| s.tasks > 1),
        "{:?}",
        split.profiles[0].schedule
    );
    check_split(&g, 20);
}

/// `conv` (of `head_inputs` operands) fused with hard-swish and a scale:
/// the fused node's last input.
fn hard_swish_scaled(conv: Conv2d, head_inputs: usize) -> Op {
    let body = ElementwiseProgram::new(
        2,
        vec![
            Instr::Unary(UnaryOp::HardSwish, Reg(0)),
            Instr::Binary(BinaryOp::Mul, Reg(2), Reg(1)),
        ],
    )
    .unwrap();
    let head = DenseHead {
        op: DenseOp::Conv(conv),
        inputs: head_inputs,
    };
    Op::Fused(Box::new(FusedKernel::new(Some(head), body).unwrap()))
}

#[test]
fn store_loop_epilogue_with_per_channel_operands_split_by_rows() {
    // Pointwise conv to 512 channels over 12x12 pixels (split by output
    // rows = channels; 144 pixels fill their vectors, so they are not
    // rows), then hard-swish and a per-channel scale in the store loop:
    // each task reads the scales of its own channels.
    let mut rng = Rng::new(7);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 384, 12, 12]));
    let w = constant(&mut g, &mut rng, "w", &[512, 384, 1, 1]);
    let scale = constant(&mut g, &mut rng, "scale", &[512, 1, 1]);
    let conv = Conv2d {
        strides: [1, 1],
        pads: [0; 4],
        dilations: [1, 1],
        group: 1,
    };
    let y = g
        .add_node(hard_swish_scaled(conv, 2), &[x, w, scale], "fused")
        .unwrap();
    g.add_output("y", y);
    let split = artifact(&g, 4);
    assert_eq!(
        split.profiles[0].schedule.len(),
        1,
        "no tail step: {:?}",
        split.profiles[0].schedule
    );
    check_split(&g, 22);
}

/// `conv` of an input `x` by weights `w` with a bias, hard-swish and a
/// per-channel scale fused in its store.
fn scaled_depthwise(rng: &mut Rng, x: [usize; 4], w: [usize; 4], conv: Conv2d) -> Graph {
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let wc = constant(&mut g, rng, "w", &w);
    let b = constant(&mut g, rng, "b", &[w[0]]);
    let scale = constant(&mut g, rng, "scale", &[w[0], 1, 1]);
    let y = g
        .add_node(hard_swish_scaled(conv, 3), &[xi, wc, b, scale], "dw_fused")
        .unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn depthwise_conv_split_by_groups() {
    // 96 channels, depth multiplier 2, W stride 2: the groups are shared
    // out over the tasks with their weights, biases and output channels.
    let mut rng = Rng::new(6);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [2, 96, 96, 130]));
    let w = constant(&mut g, &mut rng, "w", &[192, 1, 3, 3]);
    let b = constant(&mut g, &mut rng, "b", &[192]);
    let conv = Conv2d {
        strides: [1, 2],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 96,
    };
    let y = g
        .add_node(Op::Conv(conv.clone()), &[x, w, b], "dw")
        .unwrap();
    g.add_output("y", y);
    check_split(&g, 16);
    // The same conv fused with hard-swish and a per-channel scale in its
    // store: each task reads the scales of its own channels.
    let g = scaled_depthwise(&mut rng, [2, 96, 96, 130], [192, 1, 3, 3], conv);
    let split = artifact(&g, 4);
    assert_eq!(
        split.profiles[0].schedule.len(),
        1,
        "no tail step: {:?}",
        split.profiles[0].schedule
    );
    check_split(&g, 17);
}

/// Headless fused programs on the AVX-512 elementwise kernel, split by
/// rows (channels of one image, each task reading its own per-channel
/// values; rows of a bias along the last axis) and, for a single row, by
/// 16-element-aligned column ranges.
#[test]
fn elementwise_microkernels_split_by_rows_and_by_columns() {
    for (shape, per) in [
        (vec![1, 96, 24, 24], vec![96, 1, 1]),
        (vec![128, 1536], vec![1536]),
        (vec![70_001], vec![1]),
    ] {
        let mut rng = Rng::new(9);
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, shape.clone()));
        let y = g.add_input("y", ValueType::new(DType::F32, shape.clone()));
        let c = constant(&mut g, &mut rng, "per", &per);
        let body = ElementwiseProgram::new(
            3,
            vec![
                Instr::Binary(BinaryOp::Mul, Reg(0), Reg(2)),
                Instr::Binary(BinaryOp::Add, Reg(3), Reg(1)),
                Instr::Unary(UnaryOp::HardSwish, Reg(4)),
            ],
        )
        .unwrap();
        let k = FusedKernel::new(None, body).unwrap();
        let f = g
            .add_node(Op::Fused(Box::new(k)), &[x, y, c], "fused")
            .unwrap();
        g.add_output("out", f);
        check_split(&g, 17);
    }
}

#[test]
fn blocked_depthwise_conv_split_by_channel_blocks() {
    // ConvNeXt's 7×7 window on a 7×7 map runs on 16-channel blocks: the
    // tasks take whole blocks (the last with the partial one: 456
    // channels), each with its own scratch plane, weights and per-channel
    // scales.
    let mut rng = Rng::new(7);
    let conv = Conv2d {
        strides: [1, 1],
        pads: [3; 4],
        dilations: [1, 1],
        group: 456,
    };
    let g = scaled_depthwise(&mut rng, [4, 456, 7, 7], [456, 1, 7, 7], conv);
    let split = artifact(&g, 4);
    assert_eq!(
        split.profiles[0].dense_kernels[0].kernel,
        "avx512/depthwise-c16"
    );
    check_split(&g, 18);
}

/// A global average pool and a ReduceSum over the last axis split by runs,
/// a ReduceMean over a middle axis by outer blocks (each task folds whole
/// runs or blocks, so every split gives the same bytes).
#[test]
fn row_folds_split_by_runs() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 256, 32, 32]));
    let pooled = g.add_node(Op::GlobalAveragePool, &[x], "gap").unwrap();
    g.add_output("pooled", pooled);
    let t = g.add_input("t", ValueType::new(DType::F32, [2, 64, 2048]));
    let sums = Op::Reduce {
        op: kiln_ir::ReduceOp::Sum,
        axes: [2].into_iter().collect(),
        keep_dims: false,
    };
    let sums = g.add_node(sums, &[t], "sums").unwrap();
    g.add_output("sums", sums);
    // A sequence's mean over its tokens: split by batch entries.
    let tokens = g.add_input("tokens", ValueType::new(DType::F32, [4, 128, 768]));
    let mean = Op::Reduce {
        op: kiln_ir::ReduceOp::Mean,
        axes: [1].into_iter().collect(),
        keep_dims: false,
    };
    let mean = g.add_node(mean, &[tokens], "mean").unwrap();
    g.add_output("mean", mean);
    check_split(&g, 17);
}
