//! The AVX-512 GEMM microkernels (MatMul, Gemm, pointwise Conv) against the
//! reference evaluator, over shapes that are not multiples of any tile
//! (M, N, K ragged; K = 1; N = 1; M = 1), with packed and strided operands.
//!
//! `common::compile_run` compiles for the native target, which on an
//! AVX-512 host selects the microkernels; [`native_uses_microkernels_here`]
//! checks that this is so, so these tests cannot silently test Cranelift.

mod common;

use common::{check_for, check_rand, f32_tensor, has_zmm_fma, Rng};
use kiln_format::Artifact;
use kiln_ir::{Conv2d, DType, Graph, Op, ValueType};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

/// Ragged sizes around the tile edges (16-lane vectors, rows up to 14).
const SIZES: [usize; 8] = [1, 2, 13, 15, 17, 31, 33, 70];

fn matmul_graph(a: &[usize], b: &[usize], const_a: bool, const_b: bool, rng: &mut Rng) -> Graph {
    let mut g = Graph::new();
    let x = if const_a {
        g.add_const("a", f32_tensor(rng, a))
    } else {
        g.add_input("a", ValueType::new(DType::F32, a))
    };
    let y = if const_b {
        g.add_const("b", f32_tensor(rng, b))
    } else {
        g.add_input("b", ValueType::new(DType::F32, b))
    };
    let z = g.add_node(Op::MatMul, &[x, y], "mm").unwrap();
    g.add_output("z", z);
    g
}

fn compile_for(g: &Graph, target: CpuTarget) -> Artifact {
    let opts = CpuOptions {
        target,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    compile(g, &opts, ArtifactInfo::default()).unwrap()
}

#[test]
fn avx512_target_emits_zmm_gemm_and_v3_does_not() {
    let mut rng = Rng::new(1);
    let g = matmul_graph(&[5, 33], &[33, 17], false, true, &mut rng);
    assert!(has_zmm_fma(&compile_for(&g, CpuTarget::X86_64Avx512)));
    let v3 = compile_for(&g, CpuTarget::X86_64V3);
    assert!(!has_zmm_fma(&v3));
    assert_eq!(v3.profiles[0].dense_kernels[0].kernel, "avx2/gemm");
}

/// `g` compiled for `x86_64-v3` has every dense node on an AVX2 GEMM
/// (one of `kernels`), and on a host that runs it matches the reference.
fn check_avx2(g: &Graph, kernels: &[&str], seed: u64) {
    let v3 = compile_for(g, CpuTarget::X86_64V3);
    for k in &v3.profiles[0].dense_kernels {
        assert!(kernels.contains(&k.kernel.as_str()), "{k:?}");
    }
    if !kiln_test_kit::host_runs_x86_64_v3() {
        return;
    }
    let mut rng = Rng::new(seed);
    let inputs: Vec<_> = (g.inputs().iter())
        .map(|&i| f32_tensor(&mut rng, &g.node(i).ty.shape))
        .collect();
    check_for(g, &inputs, 2e-5, CpuTarget::X86_64V3);
}

/// The AVX2 GEMM (8-lane ymm tiles, edges under a `vmaskmovps` mask):
/// ragged shapes around the 8-column vectors, packed and strided
/// operands, batched and row-folded products, Gemm's transposes, scales
/// and C layouts, a strided B copied through a panel, a reduction long
/// enough to run in K chunks, and 1x1 / fully connected convolutions.
#[test]
fn avx2_gemms_match_the_reference() {
    let mut rng = Rng::new(40);
    let mut seed = 4000;
    let mut next = || {
        seed += 1;
        seed
    };
    for m in [1, 2, 7, 13] {
        for n in [1, 7, 8, 9, 23, 33, 70] {
            for (k, ca, cb) in [(1, false, true), (5, false, false), (19, true, false)] {
                let g = matmul_graph(&[m, k], &[k, n], ca, cb, &mut rng);
                check_avx2(&g, &["avx2/gemm"], next());
            }
        }
    }
    for (a, b, ca, cb) in [
        (&[3, 7, 20][..], &[20, 19][..], false, true),
        (&[2, 3, 5, 9], &[3, 9, 17], false, true),
        (&[3, 15, 5], &[3, 5, 2], false, false),
        (&[17], &[17, 40], false, true),
        (&[100, 37], &[37, 50], false, false),
        (&[37, 1500], &[1500, 45], false, true),
        (&[64, 700], &[700, 300], false, true),
    ] {
        check_avx2(
            &matmul_graph(a, b, ca, cb, &mut rng),
            &["avx2/gemm"],
            next(),
        );
    }
    let shape = (9, 13, 21);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        for c in [None, Some(&[21][..]), Some(&[9, 1][..]), Some(&[9, 21][..])] {
            // A run-time B with trans_b has no contiguous columns (no
            // microkernel reads it).
            for (ca, cb) in [(false, true), (true, false)]
                .into_iter()
                .filter(|&(_, cb)| cb || !tb)
            {
                let g = gemm_graph(shape, ta, tb, c, ca, cb, 0.5, -1.5, &mut rng);
                check_avx2(&g, &["avx2/gemm"], next());
            }
        }
    }
    for (x, oc) in [
        ([1, 16, 6, 6], 24),
        ([2, 5, 3, 11], 9),
        ([1, 40, 14, 14], 130),
    ] {
        for bias in [false, true] {
            let g = pointwise_graph(x, oc, bias, &mut rng);
            check_avx2(&g, &["avx2/pointwise-gemm"], next());
        }
    }
    let g = conv_graph(
        [3, 20, 4, 4],
        33,
        [4, 4],
        [1, 1],
        [0; 4],
        [1, 1],
        true,
        &mut rng,
    );
    check_avx2(&g, &["avx2/fully-connected-gemm"], next());
}

/// k×k convolutions on AVX2: the im2col copies (8 floats per ymm move,
/// single floats at row ends, a gather for W strides above 1) and the
/// implicit GEMM's padded band copy, over padding, strides, dilations,
/// groups and channel counts on both sides of the implicit/im2col order
/// (130 channels on 7×7 run pixels as rows: the transposed GEMM).
#[test]
fn avx2_kxk_convolutions_match_the_reference() {
    let mut rng = Rng::new(41);
    let mut seed = 4100;
    let gemms = [
        "avx2/implicit-gemm",
        "avx2/im2col-gemm",
        "avx2/transposed-gemm",
    ];
    for (x, oc, k, s, p, d) in [
        ([1, 3, 9, 9], 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        ([2, 4, 11, 21], 70, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        ([1, 5, 13, 17], 16, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1]),
        ([1, 3, 23, 29], 9, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1]),
        ([1, 6, 12, 12], 10, [3, 3], [1, 1], [2, 2, 2, 2], [2, 2]),
        ([1, 4, 8, 30], 12, [1, 7], [1, 1], [0, 3, 0, 3], [1, 1]),
        ([1, 4, 30, 8], 12, [7, 1], [1, 1], [3, 0, 3, 0], [1, 1]),
        ([1, 130, 7, 7], 130, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        ([1, 8, 10, 40], 16, [3, 3], [1, 3], [0, 1, 0, 1], [1, 1]),
    ] {
        for bias in [false, true] {
            seed += 1;
            check_avx2(&conv_graph(x, oc, k, s, p, d, bias, &mut rng), &gemms, seed);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn native_uses_microkernels_here() {
    let mut rng = Rng::new(2);
    let g = matmul_graph(&[5, 33], &[33, 17], false, true, &mut rng);
    let host_avx512 = std::arch::is_x86_feature_detected!("avx512f");
    assert_eq!(
        has_zmm_fma(&compile_for(&g, CpuTarget::Native)),
        host_avx512
    );
}

#[test]
fn matmul_ragged_shapes_packed_b() {
    let mut rng = Rng::new(3);
    let mut seed = 0;
    for m in SIZES {
        for k in [1, 3, 17] {
            for n in SIZES {
                let g = matmul_graph(&[m, k], &[k, n], false, true, &mut rng);
                seed += 1;
                check_rand(&g, seed, 1e-5);
            }
        }
    }
}

#[test]
fn matmul_ragged_shapes_packed_a_and_dynamic() {
    let mut rng = Rng::new(4);
    let mut seed = 100;
    for (m, k, n) in [
        (1, 1, 1),
        (13, 5, 1),
        (15, 9, 33),
        (29, 31, 70),
        (2, 64, 17),
        (70, 2, 129),
    ] {
        for (ca, cb) in [(true, false), (false, false)] {
            let g = matmul_graph(&[m, k], &[k, n], ca, cb, &mut rng);
            seed += 1;
            check_rand(&g, seed, 1e-5);
        }
    }
}

#[test]
fn batched_matmul_with_packed_operands() {
    let mut rng = Rng::new(5);
    let cases: [(&[usize], &[usize], bool, bool); 6] = [
        (&[3, 7, 20], &[20, 19], false, true),
        (&[2, 3, 5, 9], &[3, 9, 17], false, true),
        (&[4, 9], &[2, 9, 33], true, false),
        (&[2, 1, 3, 4], &[1, 3, 4, 6], false, false),
        (&[3, 15, 5], &[3, 5, 2], false, false),
        (&[17], &[17, 40], false, true),
    ];
    for (i, (a, b, ca, cb)) in cases.into_iter().enumerate() {
        check_rand(&matmul_graph(a, b, ca, cb, &mut rng), 200 + i as u64, 1e-5);
    }
}

#[test]
fn batched_rows_over_shared_weights_fold_into_one_product() {
    // Every batch entry multiplies the same B: one GEMM over all rows
    // (an LSTM's input projection over its steps is the first case).
    let mut rng = Rng::new(9);
    let cases: [(&[usize], &[usize], bool, bool); 5] = [
        (&[100, 1, 80], &[80, 64], false, true),
        (&[2, 3, 5, 9], &[9, 17], false, true),
        (&[4, 6, 10], &[1, 10, 7], false, true),
        (&[5, 3, 12], &[12, 20], true, false),
        (&[3, 2, 33], &[33, 18], false, false),
    ];
    for (i, (a, b, ca, cb)) in cases.into_iter().enumerate() {
        check_rand(&matmul_graph(a, b, ca, cb, &mut rng), 250 + i as u64, 1e-5);
    }
}

#[test]
fn long_reduction_stays_accurate() {
    let mut rng = Rng::new(6);
    let g = matmul_graph(&[37, 515], &[515, 45], false, true, &mut rng);
    check_rand(&g, 300, 2e-5);
}

#[allow(clippy::too_many_arguments)]
fn gemm_graph(
    (m, k, n): (usize, usize, usize),
    ta: bool,
    tb: bool,
    c: Option<&[usize]>,
    const_a: bool,
    const_b: bool,
    alpha: f32,
    beta: f32,
    rng: &mut Rng,
) -> Graph {
    let mut g = Graph::new();
    let a_shape = if ta { [k, m] } else { [m, k] };
    let b_shape = if tb { [n, k] } else { [k, n] };
    let a = if const_a {
        g.add_const("a", f32_tensor(rng, &a_shape))
    } else {
        g.add_input("a", ValueType::new(DType::F32, a_shape))
    };
    let b = if const_b {
        g.add_const("b", f32_tensor(rng, &b_shape))
    } else {
        g.add_input("b", ValueType::new(DType::F32, b_shape))
    };
    let mut ins = vec![a, b];
    if let Some(cs) = c {
        ins.push(g.add_const("c", f32_tensor(rng, cs)));
    }
    let op = Op::Gemm {
        alpha,
        beta,
        trans_a: ta,
        trans_b: tb,
    };
    let y = g.add_node(op, &ins, "gemm").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn gemm_transposes_bias_scales_and_packing() {
    let mut rng = Rng::new(7);
    let mut seed = 400;
    for shape in [
        (1, 1, 1),
        (15, 1, 33),
        (14, 19, 16),
        (31, 8, 1),
        (3, 40, 70),
    ] {
        let (m, _, n) = shape;
        for ta in [false, true] {
            for tb in [false, true] {
                for (ca, cb) in [(false, true), (true, false), (false, false)] {
                    for c in [None, Some(&[n][..]), Some(&[m, n][..]), Some(&[m, 1][..])] {
                        for (alpha, beta) in [(1.0, 1.0), (0.5, -2.0)] {
                            let g = gemm_graph(shape, ta, tb, c, ca, cb, alpha, beta, &mut rng);
                            seed += 1;
                            check_rand(&g, seed, 1e-5);
                        }
                    }
                }
            }
        }
    }
    let g = gemm_graph(
        (9, 4, 5),
        false,
        false,
        Some(&[1]),
        false,
        true,
        1.0,
        0.25,
        &mut rng,
    );
    check_rand(&g, 1, 1e-5);
}

fn pointwise_graph(x: [usize; 4], oc: usize, bias: bool, rng: &mut Rng) -> Graph {
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let w = g.add_const("w", f32_tensor(rng, &[oc, x[1], 1, 1]));
    let mut ins = vec![xi, w];
    if bias {
        ins.push(g.add_const("b", f32_tensor(rng, &[oc])));
    }
    let op = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [0; 4],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(op, &ins, "conv").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn pointwise_conv_as_gemm() {
    let mut rng = Rng::new(8);
    let mut seed = 600;
    for x in [
        [1, 1, 1, 1],
        [2, 3, 5, 7],
        [1, 16, 12, 48],
        [3, 33, 3, 3],
        [1, 8, 1, 1],
    ] {
        for oc in [1, 15, 16, 40] {
            for bias in [false, true] {
                seed += 1;
                check_rand(&pointwise_graph(x, oc, bias, &mut rng), seed, 1e-5);
            }
        }
    }
}

#[test]
fn pointwise_conv_is_a_microkernel_on_avx512() {
    let mut rng = Rng::new(9);
    let g = pointwise_graph([1, 16, 6, 6], 24, true, &mut rng);
    assert!(has_zmm_fma(&compile_for(&g, CpuTarget::X86_64Avx512)));
}

#[allow(clippy::too_many_arguments)]
fn conv_graph(
    x: [usize; 4],
    oc: usize,
    k: [usize; 2],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    bias: bool,
    rng: &mut Rng,
) -> Graph {
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let w = g.add_const("w", f32_tensor(rng, &[oc, x[1], k[0], k[1]]));
    let mut ins = vec![xi, w];
    if bias {
        ins.push(g.add_const("b", f32_tensor(rng, &[oc])));
    }
    let op = Op::Conv(Conv2d {
        strides,
        pads,
        dilations,
        group: 1,
    });
    let y = g.add_node(op, &ins, "conv").unwrap();
    g.add_output("y", y);
    g
}

/// Input shape, output channels, kernel, strides, pads, dilations.
type ConvCase = (
    [usize; 4],
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 4],
    [usize; 2],
);

#[test]
fn kxk_conv_through_im2col() {
    let mut rng = Rng::new(10);
    let mut seed = 800;
    let cases: [ConvCase; 10] = [
        ([1, 1, 8, 8], 8, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        ([2, 8, 4, 4], 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
        ([1, 3, 12, 20], 8, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        ([1, 5, 9, 37], 17, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1]),
        ([1, 4, 7, 9], 6, [3, 2], [2, 1], [0, 1, 2, 0], [1, 1]),
        ([1, 2, 9, 9], 3, [3, 3], [1, 1], [2, 2, 2, 2], [2, 2]),
        ([1, 6, 6, 6], 5, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1]),
        ([1, 6, 5, 5], 4, [1, 1], [1, 1], [1, 1, 1, 1], [1, 1]),
        ([1, 2, 3, 3], 2, [5, 5], [1, 1], [3, 3, 3, 3], [1, 1]),
        ([3, 1, 2, 40], 20, [1, 3], [1, 3], [0, 4, 0, 4], [1, 1]),
    ];
    for (x, oc, k, s, p, d) in cases {
        for bias in [false, true] {
            seed += 1;
            check_rand(&conv_graph(x, oc, k, s, p, d, bias, &mut rng), seed, 1e-5);
        }
    }
}

#[test]
fn kxk_conv_is_a_microkernel_on_avx512() {
    let mut rng = Rng::new(11);
    let g = conv_graph(
        [1, 3, 10, 10],
        8,
        [3, 3],
        [2, 2],
        [1; 4],
        [1, 1],
        true,
        &mut rng,
    );
    let a = compile_for(&g, CpuTarget::X86_64Avx512);
    assert!(has_zmm_fma(&a));
    // The im2col matrix (27 x 25 floats) lives in scratch above the plan.
    let planned = kiln_target_cpu::memory_plan(&g).unwrap().arena_size;
    assert!(
        a.profiles[0].arena_size >= planned + 27 * 25 * 4,
        "{} vs {planned}",
        a.profiles[0].arena_size
    );
}

#[test]
fn stride_one_conv_reads_a_padded_copy_in_place() {
    // W stride 1: an implicit GEMM over a padded copy of the input
    // (8 x 22 x 26 floats), not an im2col matrix (72 x 480 floats).
    let mut rng = Rng::new(12);
    let g = conv_graph(
        [1, 8, 20, 24],
        16,
        [3, 3],
        [1, 1],
        [1; 4],
        [1, 1],
        true,
        &mut rng,
    );
    check_rand(&g, 801, 1e-5);
    let a = compile_for(&g, CpuTarget::X86_64Avx512);
    assert!(has_zmm_fma(&a));
    let planned = kiln_target_cpu::memory_plan(&g).unwrap().arena_size;
    let scratch = a.profiles[0].arena_size - planned;
    assert!(
        (8 * 22 * 26 * 4..72 * 480 * 4).contains(&scratch),
        "scratch {scratch}"
    );
}

/// Input shape, depth multiplier, kernel, strides, pads, dilations.
type DepthwiseCase = (
    [usize; 4],
    usize,
    [usize; 2],
    [usize; 2],
    [usize; 4],
    [usize; 2],
);

fn depthwise_graph(case: DepthwiseCase, bias: bool, rng: &mut Rng) -> Graph {
    let (x, mult, k, strides, pads, dilations) = case;
    let oc = x[1] * mult;
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let w = g.add_const("w", f32_tensor(rng, &[oc, 1, k[0], k[1]]));
    let mut ins = vec![xi, w];
    if bias {
        ins.push(g.add_const("b", f32_tensor(rng, &[oc])));
    }
    let op = Op::Conv(Conv2d {
        strides,
        pads,
        dilations,
        group: x[1],
    });
    let y = g.add_node(op, &ins, "dw").unwrap();
    g.add_output("y", y);
    g
}

/// Depthwise shapes at W stride 1: padding, dilations, H strides, depth
/// multipliers, maps narrower and wider than a vector of either width.
const DEPTHWISE_CASES: [DepthwiseCase; 13] = [
    // Rows of 7 and 8 vectors: blocks of two output rows.
    ([1, 3, 9, 100], 1, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
    ([1, 2, 10, 120], 1, [7, 7], [1, 1], [3, 3, 3, 3], [1, 1]),
    ([1, 9, 7, 7], 1, [7, 7], [1, 1], [3, 3, 3, 3], [1, 1]),
    ([1, 3, 14, 47], 1, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1]),
    ([1, 8, 24, 96], 1, [3, 3], [2, 1], [1, 1, 1, 1], [1, 1]),
    ([1, 5, 3, 37], 1, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1]),
    ([2, 3, 7, 150], 1, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
    ([1, 4, 6, 5], 2, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
    ([1, 3, 9, 20], 1, [3, 3], [2, 1], [0, 2, 1, 0], [2, 2]),
    ([1, 2, 4, 17], 1, [1, 7], [1, 1], [0, 3, 0, 3], [1, 1]),
    ([1, 2, 2, 3], 1, [5, 5], [1, 1], [3, 4, 3, 4], [1, 1]),
    ([1, 6, 5, 33], 1, [2, 4], [3, 1], [0, 0, 0, 0], [1, 1]),
    ([1, 2, 5, 16], 3, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),
];

#[test]
fn depthwise_conv_with_masked_borders() {
    let mut rng = Rng::new(12);
    let mut seed = 900;
    // Maps of one and two 16-pixel vectors split their taps over four and
    // two accumulators (ConvNeXt's 7×7 window on 7×7), three do not.
    for case in DEPTHWISE_CASES {
        for bias in [false, true] {
            seed += 1;
            check_rand(&depthwise_graph(case, bias, &mut rng), seed, 1e-5);
        }
    }
}

/// The AVX2 depthwise kernel (8-pixel vectors, border and tail lanes under
/// masks from its table) on the same shapes, wider rows than its six
/// accumulators cover, and W stride 2.
#[test]
fn avx2_depthwise_convolutions_match_the_reference() {
    let mut rng = Rng::new(42);
    let mut seed = 4200;
    let wide = ([1, 3, 4, 75], 1, [3, 5], [1, 1], [1, 2, 1, 2], [1, 1]);
    // W stride 2: the even columns of two 8-column loads.
    let strided: [DepthwiseCase; 5] = [
        ([1, 4, 14, 14], 1, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        ([1, 3, 9, 33], 2, [5, 5], [2, 2], [2, 2, 2, 2], [1, 1]),
        ([1, 2, 7, 7], 1, [3, 3], [1, 2], [1, 1, 1, 1], [1, 1]),
        ([1, 3, 12, 40], 1, [3, 3], [2, 2], [0, 1, 1, 0], [2, 2]),
        ([1, 2, 5, 113], 1, [3, 3], [1, 2], [1, 1, 1, 1], [1, 1]),
    ];
    for case in DEPTHWISE_CASES.into_iter().chain([wide]).chain(strided) {
        for bias in [false, true] {
            seed += 1;
            check_avx2(
                &depthwise_graph(case, bias, &mut rng),
                &["avx2/depthwise"],
                seed,
            );
        }
    }
}

#[test]
fn depthwise_conv_is_a_microkernel_on_avx512() {
    let mut rng = Rng::new(13);
    let case = ([1, 8, 6, 40], 1, [3, 3], [1, 1], [1; 4], [1, 1]);
    let g = depthwise_graph(case, true, &mut rng);
    assert!(has_zmm_fma(&compile_for(&g, CpuTarget::X86_64Avx512)));
    // The AVX2 form has no zmm register.
    assert!(!has_zmm_fma(&compile_for(&g, CpuTarget::X86_64V3)));
}

/// A strided B read by many row tiles is copied into a scratch panel per
/// column tile: tall outputs with B a graph input, a constant A, and an
/// im2col conv with many output channels (panel and im2col matrix share
/// the scratch region).
#[test]
fn tall_outputs_stream_b_through_a_scratch_panel() {
    let mut rng = Rng::new(14);
    let mut seed = 1000;
    for (m, k, n, ca) in [
        (100, 37, 50, false),
        (120, 9, 33, true),
        (64, 1, 17, true),
        (90, 20, 1, false),
    ] {
        seed += 1;
        check_rand(
            &matmul_graph(&[m, k], &[k, n], ca, false, &mut rng),
            seed,
            1e-5,
        );
    }
    let g = conv_graph(
        [2, 5, 9, 11],
        72,
        [3, 3],
        [1, 1],
        [1; 4],
        [1, 1],
        true,
        &mut rng,
    );
    check_rand(&g, 1100, 1e-5);
    let g = pointwise_graph([1, 30, 7, 13], 90, true, &mut rng);
    check_rand(&g, 1101, 1e-5);
}
