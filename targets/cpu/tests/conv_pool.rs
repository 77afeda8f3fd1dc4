//! Conv, pools and softmax against the reference evaluator.

mod common;

use common::{check_rand, f32_tensor, Rng};
use kiln_ir::{Col2Im, Conv2d, DType, Graph, Op, Pool2d, ValueType};

#[allow(clippy::too_many_arguments)]
fn conv_graph(
    x: [usize; 4],
    oc: usize,
    k: [usize; 2],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
    bias: bool,
) -> Graph {
    let mut rng = Rng::new(x.iter().sum::<usize>() as u64 * 31 + oc as u64);
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let w = g.add_const("w", f32_tensor(&mut rng, &[oc, x[1] / group, k[0], k[1]]));
    let mut ins = vec![xi, w];
    if bias {
        ins.push(g.add_const("b", f32_tensor(&mut rng, &[oc])));
    }
    let op = Op::Conv(Conv2d {
        strides,
        pads,
        dilations,
        group,
    });
    let y = g.add_node(op, &ins, "conv").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn conv_variants() {
    let cases = [
        // plain 3x3, pad 1
        conv_graph(
            [1, 3, 8, 8],
            4,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        // odd width, tails in oc and ow
        conv_graph(
            [2, 2, 7, 13],
            5,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            false,
        ),
        // stride 2, asymmetric pads
        conv_graph(
            [1, 3, 9, 11],
            6,
            [3, 3],
            [2, 2],
            [0, 1, 2, 1],
            [1, 1],
            1,
            true,
        ),
        // dilation 2
        conv_graph(
            [1, 2, 10, 12],
            3,
            [3, 3],
            [1, 1],
            [2, 2, 2, 2],
            [2, 2],
            1,
            true,
        ),
        // groups
        conv_graph(
            [1, 4, 6, 6],
            6,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            2,
            true,
        ),
        // depthwise
        conv_graph(
            [1, 8, 9, 9],
            8,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            8,
            true,
        ),
        // depthwise stride 2 with multiplier 2
        conv_graph(
            [1, 3, 10, 10],
            6,
            [5, 5],
            [2, 2],
            [2, 2, 2, 2],
            [1, 1],
            3,
            false,
        ),
        // 1x1
        conv_graph(
            [1, 16, 5, 5],
            9,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            true,
        ),
        // non-square kernel, stride (1, 3), big pads
        conv_graph(
            [1, 2, 6, 17],
            3,
            [2, 4],
            [1, 3],
            [3, 2, 1, 4],
            [1, 1],
            1,
            true,
        ),
        // kernel larger than padded region parts, dilation 3 x 1
        conv_graph(
            [2, 1, 12, 5],
            2,
            [3, 2],
            [2, 1],
            [0, 0, 0, 0],
            [3, 1],
            1,
            true,
        ),
        // wide rows: vector loop over many blocks
        conv_graph(
            [1, 2, 5, 40],
            4,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
    ];
    for (i, g) in cases.iter().enumerate() {
        check_rand(g, 200 + i as u64, 1e-5);
    }
}

fn pool_graph(op: Op, x: [usize; 4]) -> Graph {
    let mut g = Graph::new();
    let xi = g.add_input("x", ValueType::new(DType::F32, x));
    let y = g.add_node(op, &[xi], "pool").unwrap();
    g.add_output("y", y);
    g
}

fn window(k: [usize; 2], s: [usize; 2], pads: [usize; 4], d: [usize; 2], ceil: bool) -> Pool2d {
    Pool2d {
        kernel: k,
        strides: s,
        pads,
        dilations: d,
        ceil_mode: ceil,
    }
}

#[test]
fn pools_with_pads_strides_and_ceil_mode() {
    let windows = [
        window([2, 2], [2, 2], [0, 0, 0, 0], [1, 1], false),
        window([3, 3], [2, 2], [1, 1, 1, 1], [1, 1], false),
        window([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], false),
        window([2, 2], [2, 2], [0, 0, 0, 0], [1, 1], true),
        window([3, 3], [2, 2], [1, 1, 0, 0], [1, 1], true),
        window([2, 3], [1, 2], [1, 0, 1, 2], [2, 1], false),
        window([3, 2], [3, 1], [0, 1, 2, 1], [1, 2], true),
        // Stride 2 along the row, four pixels at a time, with dilation.
        window([3, 3], [2, 2], [1, 1, 1, 1], [1, 2], false),
        window([1, 2], [1, 2], [0, 1, 0, 0], [1, 1], true),
    ];
    let mut seed = 300;
    for p in windows {
        for x in [[1, 2, 7, 9], [2, 3, 8, 13], [1, 2, 5, 41]] {
            for op in [
                Op::MaxPool(p.clone()),
                Op::AveragePool {
                    pool: p.clone(),
                    count_include_pad: false,
                },
                Op::AveragePool {
                    pool: p.clone(),
                    count_include_pad: true,
                },
            ] {
                seed += 1;
                check_rand(&pool_graph(op, x), seed, 1e-6);
            }
        }
    }
}

/// A NaN inside a max window is skipped, as in the reference evaluator
/// (`v > max ? v : max`), on the four-pixel (stride 1 and 2) and the
/// one-pixel paths alike; a window of only NaNs gives -inf.
#[test]
fn max_pool_skips_nan_taps_like_the_reference() {
    let shape = [1, 1, 6, 13];
    let values: Vec<f32> = (0..78)
        .map(|i| {
            if i % 5 == 2 || (26..39).contains(&i) {
                f32::NAN
            } else {
                (i as f32 * 0.37).sin()
            }
        })
        .collect();
    let x = kiln_ir::Tensor::new(shape, kiln_ir::Data::F32(values)).unwrap();
    for p in [
        window([2, 2], [2, 2], [0, 0, 0, 0], [1, 1], false),
        window([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], false),
        window([1, 3], [1, 3], [0, 0, 0, 0], [1, 1], false),
        window([1, 1], [1, 2], [0, 0, 0, 0], [1, 1], false),
    ] {
        common::check_with(
            &pool_graph(Op::MaxPool(p), shape),
            std::slice::from_ref(&x),
            0.0,
        );
    }
}

#[test]
fn global_pools() {
    for x in [[1, 3, 5, 5], [2, 4, 1, 1], [1, 2, 7, 3]] {
        check_rand(&pool_graph(Op::GlobalAveragePool, x), 1, 1e-6);
        check_rand(&pool_graph(Op::GlobalMaxPool, x), 2, 0.0);
    }
}

fn softmax_graph(shape: &[usize], axis: usize) -> Graph {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, shape));
    let y = g.add_node(Op::Softmax { axis }, &[x], "softmax").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn softmax_on_every_axis() {
    let mut seed = 400;
    for shape in [&[3, 5, 7][..], &[2, 9], &[4, 4, 8], &[13], &[2, 3, 1, 6]] {
        for axis in 0..shape.len() {
            seed += 1;
            check_rand(&softmax_graph(shape, axis), seed, 0.0);
        }
    }
}

#[test]
fn softmax_rows_of_every_length_and_range() {
    // Innermost-axis softmax (the AVX-512 kernel on such hosts, and the
    // AVX2 kernel): full and masked 16-lane (8-lane) chunks, one to many rows, values spread wide enough
    // to underflow exp, masked-out entries (-inf, -1e30) as attention
    // masks write them, and rows split over threads.
    let mut rng = Rng::new(77);
    for (rows, len) in [
        (1, 1),
        (3, 15),
        (2, 16),
        (5, 17),
        (7, 128),
        (2, 1000),
        (640, 256),
    ] {
        let g = softmax_graph(&[rows, len], 1);
        let v: Vec<f32> = (0..rows * len)
            .map(|i| match i % 23 {
                0 => f32::NEG_INFINITY,
                1 => -1e30,
                _ => rng.f64(-60.0, 60.0) as f32,
            })
            .collect();
        let x = kiln_ir::Tensor::new([rows, len], kiln_ir::Data::F32(v)).unwrap();
        common::check_with(&g, std::slice::from_ref(&x), 0.0);
        // The AVX2 kernel: 8-lane chunks and a vmaskmovps tail.
        if std::arch::is_x86_feature_detected!("avx2") {
            common::check_for(&g, &[x], 0.0, kiln_target_cpu::CpuTarget::X86_64V3);
        }
    }
}

#[test]
fn softmax_flushes_probabilities_below_the_normal_range_to_zero() {
    // Producing a subnormal costs a microcode assist per instruction, and
    // the masked columns of an attention row are most of the row: both
    // softmax kernels (AVX-512 on such hosts, AVX2 on x86-64-v3)
    // write 0 where `e^(x - max)` leaves the normal range, which is within
    // 2e-38 of the reference.
    let (rows, len) = (4, 40);
    let g = softmax_graph(&[rows, len], 1);
    let v: Vec<f32> = (0..rows * len)
        .map(|i| match i % len {
            0 => 1.5,
            j => 1.5 - 78.0 - j as f32 * 0.8 - (i / len) as f32 * 0.1,
        })
        .collect();
    let x = kiln_ir::Tensor::new([rows, len], kiln_ir::Data::F32(v)).unwrap();
    for target in [
        kiln_target_cpu::CpuTarget::Native,
        kiln_target_cpu::CpuTarget::X86_64V3,
    ] {
        common::check_for(&g, std::slice::from_ref(&x), 0.0, target);
        let got = common::compile_run_for(&g, std::slice::from_ref(&x), target).unwrap();
        let probs = got[0].to_f64_vec();
        assert!(
            probs.iter().all(|&p| p == 0.0 || (p as f32).is_normal()),
            "{target:?}: a subnormal probability in {probs:?}"
        );
        assert!(probs.iter().filter(|&&p| p == 0.0).count() > rows * 10);
    }
}

#[test]
fn small_cnn_end_to_end() {
    use kiln_ir::{Ints, UnaryOp};
    let mut rng = Rng::new(1234);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 3, 12, 12]));
    let w1 = g.add_const("w1", f32_tensor(&mut rng, &[8, 3, 3, 3]));
    let b1 = g.add_const("b1", f32_tensor(&mut rng, &[8]));
    let c1 = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(c1, &[x, w1, b1], "conv1").unwrap();
    let y = g.add_node(Op::Unary(UnaryOp::Relu), &[y], "relu1").unwrap();
    let y = g
        .add_node(
            Op::MaxPool(window([2, 2], [2, 2], [0; 4], [1, 1], false)),
            &[y],
            "pool1",
        )
        .unwrap();
    let y = g.add_node(Op::GlobalAveragePool, &[y], "gap").unwrap();
    let y = g
        .add_node(
            Op::Reshape {
                shape: Ints::from_slice(&[1, 8]),
            },
            &[y],
            "flatten",
        )
        .unwrap();
    let w2 = g.add_const("w2", f32_tensor(&mut rng, &[10, 8]));
    let b2 = g.add_const("b2", f32_tensor(&mut rng, &[10]));
    let gemm = Op::Gemm {
        alpha: 1.0,
        beta: 1.0,
        trans_a: false,
        trans_b: true,
    };
    let y = g.add_node(gemm, &[y, w2, b2], "fc").unwrap();
    let y = g.add_node(Op::Softmax { axis: 1 }, &[y], "prob").unwrap();
    g.add_output("prob", y);
    check_rand(&g, 99, 1e-5);
}

#[test]
fn large_images_convert_in_bands_of_output_rows() {
    // im2col matrices of several MB: converted and multiplied in bands of
    // output rows (top and bottom bands with padding, interior ones
    // sharing a routine), split over threads by band.
    let cases = [
        // 3x3 pad 1: K = 144, 70 rows of 40 KB → bands of 14 rows.
        conv_graph(
            [1, 16, 70, 70],
            32,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            1,
            true,
        ),
        // Stride 2, dilation 2, asymmetric pads, two images, no bias.
        conv_graph(
            [2, 24, 131, 120],
            12,
            [3, 3],
            [2, 2],
            [2, 1, 3, 2],
            [2, 2],
            1,
            false,
        ),
        // 5x5 with pads deeper than one band's worth of taps.
        conv_graph(
            [1, 32, 64, 48],
            8,
            [5, 5],
            [1, 1],
            [2, 2, 2, 2],
            [1, 1],
            1,
            true,
        ),
    ];
    for g in &cases {
        check_rand(g, 23, 1e-5);
    }
}

#[test]
fn depthwise_convolutions_with_w_stride_two() {
    // W stride 2 (two loads per vector, even lanes kept): borders on both
    // sides, widths below, at and across vector multiples, a depth
    // multiplier of 2, dilation, and 5x5 taps reaching two pixels out.
    let cases = [
        ([1, 8, 9, 7], 8, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        ([1, 4, 12, 32], 8, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
        ([2, 3, 11, 67], 3, [5, 5], [2, 2], [2, 2, 2, 2], [1, 1]),
        ([1, 5, 20, 45], 5, [3, 3], [1, 2], [0, 2, 1, 0], [2, 2]),
        ([1, 16, 40, 184], 16, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1]),
    ];
    for (x, oc, k, strides, pads, dilations) in cases {
        let g = conv_graph(x, oc, k, strides, pads, dilations, x[1], true);
        check_rand(&g, 31, 1e-5);
    }
}

/// A tensor of `dtype` (u8 or i8) covering its whole range.
fn byte_tensor(rng: &mut Rng, dtype: DType, shape: &[usize]) -> kiln_ir::Tensor {
    let n: usize = shape.iter().product();
    let (lo, hi) = if dtype == DType::U8 {
        (0, 255)
    } else {
        (-128, 127)
    };
    let v = (0..n).map(|_| rng.int(lo, hi));
    kiln_ir::Tensor::new(shape, kiln_ir::Data::from_i64s(dtype, v)).unwrap()
}

/// One ConvInteger case.
struct IntConv {
    x: (DType, [usize; 4]),
    w: DType,
    oc: usize,
    k: [usize; 2],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
    /// W's zero point per output channel (else a scalar).
    per_channel: bool,
    /// W and the zero points as constants (else graph inputs).
    constants: bool,
}

#[test]
fn conv_integer_matches_the_reference_evaluator() {
    let case = |x, w, oc, k, strides, pads, dilations, group, per_channel, constants| IntConv {
        x,
        w,
        oc,
        k,
        strides,
        pads,
        dilations,
        group,
        per_channel,
        constants,
    };
    let cases = [
        // u8 x i8, stride 2, asymmetric pads, group 2, per-channel W zero
        // point, batch 2.
        case(
            (DType::U8, [2, 4, 9, 11]),
            DType::I8,
            6,
            [3, 3],
            [2, 2],
            [1, 1, 2, 1],
            [1, 1],
            2,
            true,
            true,
        ),
        // i8 x u8, dilation 2, pads 2, scalar W zero point, batch 2,
        // everything a graph input.
        case(
            (DType::I8, [2, 3, 10, 12]),
            DType::U8,
            4,
            [3, 3],
            [1, 1],
            [2, 2, 2, 2],
            [2, 2],
            1,
            false,
            false,
        ),
        // i8 x i8 depthwise with a multiplier of 2, stride (1, 2), dilation
        // (2, 1), per-channel zero points as inputs.
        case(
            (DType::I8, [1, 3, 8, 13]),
            DType::I8,
            6,
            [3, 2],
            [1, 2],
            [0, 1, 2, 1],
            [2, 1],
            3,
            true,
            false,
        ),
        // u8 x u8 1x1, no padding, scalar zero point.
        case(
            (DType::U8, [2, 5, 4, 6]),
            DType::U8,
            3,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            1,
            false,
            true,
        ),
        // Pads wider than the kernel: border outputs whose whole window is
        // padding (0), group 2, stride 2, dilation 2.
        case(
            (DType::U8, [1, 4, 5, 6]),
            DType::I8,
            4,
            [2, 2],
            [2, 2],
            [3, 4, 3, 4],
            [2, 2],
            2,
            true,
            true,
        ),
    ];
    for (ci, c) in cases.iter().enumerate() {
        let mut rng = Rng::new(500 + ci as u64);
        let (xd, xs) = c.x;
        let ws = [c.oc, xs[1] / c.group, c.k[0], c.k[1]];
        let wz_shape: &[usize] = if c.per_channel { &[c.oc] } else { &[] };
        let x = byte_tensor(&mut rng, xd, &xs);
        let w = byte_tensor(&mut rng, c.w, &ws);
        // A nonzero X zero point, whatever the draw.
        let xz = kiln_ir::Tensor::new(
            [0usize; 0],
            kiln_ir::Data::from_i64s(xd, [if xd == DType::U8 { 131 } else { -7 }].into_iter()),
        )
        .unwrap();
        let wz = byte_tensor(&mut rng, c.w, wz_shape);
        let mut g = Graph::new();
        let xi = g.add_input("x", ValueType::new(xd, xs));
        let mut inputs = vec![x];
        let (wi, xzi, wzi) = if c.constants {
            (
                g.add_const("w", w),
                g.add_const("x_zero", xz),
                g.add_const("w_zero", wz),
            )
        } else {
            let wi = g.add_input("w", ValueType::new(c.w, ws));
            let xzi = g.add_input("x_zero", ValueType::new(xd, [0usize; 0]));
            let wzi = g.add_input("w_zero", ValueType::new(c.w, wz_shape));
            inputs.extend([w, xz, wz]);
            (wi, xzi, wzi)
        };
        let op = Op::ConvInteger(Conv2d {
            strides: c.strides,
            pads: c.pads,
            dilations: c.dilations,
            group: c.group,
        });
        let y = g.add_node(op, &[xi, wi, xzi, wzi], "conv").unwrap();
        g.add_output("y", y);
        common::check(&g, &inputs);
    }
}

fn col2im_graph(channels: usize, grid: [usize; 2], c: Col2Im) -> Graph {
    let mut g = Graph::new();
    let rows = channels * c.block[0] * c.block[1];
    let x = g.add_input(
        "cols",
        ValueType::new(DType::F32, [1, rows, grid[0] * grid[1]]),
    );
    let y = g.add_node(Op::Col2Im(c), &[x], "col2im").unwrap();
    g.add_output("y", y);
    g
}

#[test]
fn col2im_overlapping_and_exactly_tiling_blocks() {
    let col2im = |grid: [usize; 2], block: [usize; 2], strides: [usize; 2], pads: [usize; 2]| {
        let image = [0, 1].map(|a| (grid[a] - 1) * strides[a] + block[a] - 2 * pads[a]);
        Col2Im {
            grid,
            image,
            block,
            strides,
            dilations: [1, 1],
            pads,
        }
    };
    let cases = [
        // Overlapping 3x3 blocks at stride 2 with padding: accumulated.
        (3, col2im([5, 7], [3, 3], [2, 2], [1, 1])),
        // Kernel = stride: a permutation; 2-wide blocks interleave four
        // pixels at a time, with a scalar tail (gw = 11).
        (4, col2im([6, 11], [2, 2], [2, 2], [0, 0])),
        (2, col2im([3, 8], [3, 3], [3, 3], [0, 0])),
        (3, col2im([4, 5], [1, 2], [1, 2], [0, 0])),
        // Large enough to be split over threads by channels.
        (48, col2im([24, 30], [2, 2], [2, 2], [0, 0])),
    ];
    for (i, (channels, c)) in cases.into_iter().enumerate() {
        assert_eq!(c.tiles_exactly(), i > 0, "{c:?}");
        check_rand(&col2im_graph(channels, c.grid, c), 40 + i as u64, 1e-6);
    }
}

/// ConvInteger with a u8 X and constant weights signed after their zero
/// point (i8 with 0, u8 with 128) runs on the VNNI quad-im2col kernel:
/// every stride path of the quad routine (1 and 2 vectorized, 3 scalar),
/// padding filled with X's zero point (constant, a graph input, or 0),
/// input channels not a multiple of 4, batches, and images large enough to
/// be converted in bands. Integer results must match exactly.
#[test]
fn conv_integer_on_the_vnni_kernel() {
    struct Case {
        x: [usize; 4],
        oc: usize,
        k: [usize; 2],
        strides: [usize; 2],
        pads: [usize; 4],
        dilations: [usize; 2],
        w: DType,
        /// X's zero point: a constant, or a graph input when `None`.
        x_zero: Option<u8>,
    }
    let case = |x, oc, k, strides, pads, dilations, w, x_zero| Case {
        x,
        oc,
        k,
        strides,
        pads,
        dilations,
        w,
        x_zero,
    };
    let cases = [
        case(
            [2, 5, 9, 37],
            7,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            DType::I8,
            Some(131),
        ),
        case(
            [1, 8, 12, 33],
            20,
            [3, 3],
            [2, 2],
            [1, 1, 1, 1],
            [1, 1],
            DType::I8,
            None,
        ),
        case(
            [1, 3, 10, 40],
            16,
            [3, 3],
            [2, 2],
            [0, 0, 1, 1],
            [1, 1],
            DType::I8,
            Some(0),
        ),
        case(
            [1, 13, 7, 19],
            5,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            DType::U8,
            Some(77),
        ),
        case(
            [2, 6, 11, 14],
            9,
            [3, 2],
            [3, 3],
            [2, 1, 0, 2],
            [2, 1],
            DType::I8,
            None,
        ),
        case(
            [1, 4, 6, 6],
            3,
            [5, 5],
            [1, 1],
            [4, 4, 4, 4],
            [1, 1],
            DType::I8,
            Some(255),
        ),
        // One band, one call, enough work for four tasks: split by output
        // channels, each task building its own quad im2col.
        case(
            [1, 64, 20, 20],
            64,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            DType::I8,
            None,
        ),
        // Col matrix above the band size: converted in bands of rows.
        case(
            [1, 32, 64, 72],
            24,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            DType::I8,
            Some(9),
        ),
    ];
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw");
    for (ci, c) in cases.iter().enumerate() {
        let mut rng = Rng::new(900 + ci as u64);
        let ws = [c.oc, c.x[1], c.k[0], c.k[1]];
        let x = byte_tensor(&mut rng, DType::U8, &c.x);
        let w = byte_tensor(&mut rng, c.w, &ws);
        let w_zero = if c.w == DType::U8 { 128 } else { 0 };
        let w_zero = kiln_ir::Tensor::new(
            [0usize; 0],
            kiln_ir::Data::from_i64s(c.w, [w_zero].into_iter()),
        )
        .unwrap();
        let mut inputs = vec![x];
        if c.x_zero.is_none() {
            inputs.push(kiln_ir::Tensor::new([0usize; 0], kiln_ir::Data::U8(vec![141])).unwrap());
        }
        let (scale, bias) = (
            f32_tensor(&mut rng, &[c.oc, 1, 1]),
            f32_tensor(&mut rng, &[c.oc, 1, 1]),
        );
        // The product alone (i32 out), or as the head of a fused int8
        // layer: `relu(f32(conv) * scale + bias)` per channel, on the VNNI
        // kernel's store loop and on the Cranelift path.
        let graph = |fused: bool| {
            let mut g = Graph::new();
            let xi = g.add_input("x", ValueType::new(DType::U8, c.x));
            let xz = match c.x_zero {
                Some(z) => g.add_const(
                    "x_zero",
                    kiln_ir::Tensor::new([0usize; 0], kiln_ir::Data::U8(vec![z])).unwrap(),
                ),
                None => g.add_input("x_zero", ValueType::new(DType::U8, [0usize; 0])),
            };
            let wi = g.add_const("w", w.clone());
            let wz = g.add_const("w_zero", w_zero.clone());
            let conv = Conv2d {
                strides: c.strides,
                pads: c.pads,
                dilations: c.dilations,
                group: 1,
            };
            let mut ins = vec![xi, wi, xz, wz];
            let y = if fused {
                ins.push(g.add_const("scale", scale.clone()));
                ins.push(g.add_const("bias", bias.clone()));
                let r = kiln_ir::Reg;
                let program = kiln_ir::ElementwiseProgram::new(
                    3,
                    vec![
                        kiln_ir::Instr::Binary(kiln_ir::BinaryOp::Mul, r(0), r(1)),
                        kiln_ir::Instr::Binary(kiln_ir::BinaryOp::Add, r(3), r(2)),
                        kiln_ir::Instr::Unary(kiln_ir::UnaryOp::Relu, r(4)),
                    ],
                )
                .unwrap();
                let head = kiln_ir::DenseHead {
                    op: kiln_ir::DenseOp::ConvInteger(conv),
                    inputs: 4,
                };
                let kernel = kiln_ir::FusedKernel::new(Some(head), program).unwrap();
                g.add_node(Op::Fused(Box::new(kernel)), &ins, "int8_layer")
                    .unwrap()
            } else {
                g.add_node(Op::ConvInteger(conv), &ins, "conv").unwrap()
            };
            g.add_output("y", y);
            g
        };
        let opts = kiln_target_cpu::CpuOptions {
            target: kiln_target_cpu::CpuTarget::Native,
            opt_level: 2,
            threads: 1,
        };
        let vnni_bw = kiln_format::CpuFeatures::AVX512VNNI | kiln_format::CpuFeatures::AVX512BW;
        for fused in [false, true] {
            let g = graph(fused);
            for target in [
                kiln_target_cpu::CpuTarget::Native,
                kiln_target_cpu::CpuTarget::X86_64V3,
            ] {
                common::check_for(&g, &inputs, 1e-6, target);
            }
            let native = kiln_target_cpu::compile(&g, &opts, Default::default()).unwrap();
            assert_eq!(
                common::has_zmm_code(&native),
                vnni,
                "case {ci}: the VNNI kernel"
            );
            assert_eq!(
                native.features.contains(vnni_bw),
                vnni,
                "case {ci} (fused: {fused}): the artifact requires VNNI"
            );
            if ci == 6 && vnni {
                let four = kiln_target_cpu::CpuOptions { threads: 4, ..opts };
                let split = kiln_target_cpu::compile(&g, &four, Default::default()).unwrap();
                let tasks = split.profiles[0]
                    .schedule
                    .iter()
                    .map(|s| s.tasks)
                    .max()
                    .unwrap();
                assert_eq!(tasks, 4, "one band split by output channels");
            }
        }
    }
}

#[test]
fn antialiased_resize_reads_the_wide_tap_tables() {
    // Downsampling by 0.3 and 0.5 with the filter widened (linear: 6 and 4
    // taps, cubic: 13 and 8), mixed with an upsampled axis where antialias
    // changes nothing.
    use kiln_ir::{CoordinateTransform, Resize, ResizeMode};
    let mut seed = 500;
    for mode in [
        ResizeMode::Linear,
        ResizeMode::Cubic {
            a: -0.75,
            exclude_outside: false,
        },
        ResizeMode::Cubic {
            a: -0.5,
            exclude_outside: true,
        },
    ] {
        for (scales, shape) in [
            ([1.0, 1.0, 0.3, 0.5], [1, 2, 5, 11]),
            ([1.0, 1.0, 1.5, 0.3], [1, 2, 25, 6]),
        ] {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(DType::F32, [1, 2, 17, 23]));
            let op = Op::Resize(Resize {
                shape: shape.into_iter().collect(),
                scales: scales.into_iter().collect(),
                mode,
                coord: CoordinateTransform::HalfPixel,
                antialias: true,
                roi: Default::default(),
            });
            let y = g.add_node(op, &[x], "resize").unwrap();
            g.add_output("y", y);
            seed += 1;
            check_rand(&g, seed, 1e-6);
        }
    }
}

#[test]
fn whole_factor_nearest_upsampling_widens_rows_and_copies_them() {
    // Factors 2 (shuffles, W not a multiple of 4: a scalar tail), 4 and 8
    // (splats), 3 (scalar), 1 (a plain row copy), along H, W or both, on
    // rank 4 and rank 2; then transforms that are not `j / s` (half pixel,
    // round-prefer-ceil) take the tables.
    use kiln_ir::{CoordinateTransform, NearestRounding, Resize, ResizeMode};
    let mut seed = 600;
    let cases: Vec<(Vec<usize>, [usize; 2], CoordinateTransform, NearestRounding)> = vec![
        (
            vec![1, 3, 5, 7],
            [2, 2],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![2, 2, 3, 9],
            [4, 4],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![1, 2, 4, 5],
            [8, 8],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![1, 2, 4, 5],
            [3, 1],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![1, 2, 4, 6],
            [1, 3],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![6, 10],
            [2, 4],
            CoordinateTransform::Asymmetric,
            NearestRounding::Floor,
        ),
        (
            vec![1, 2, 4, 5],
            [2, 2],
            CoordinateTransform::HalfPixel,
            NearestRounding::RoundPreferFloor,
        ),
        (
            vec![1, 2, 4, 5],
            [2, 2],
            CoordinateTransform::Asymmetric,
            NearestRounding::RoundPreferCeil,
        ),
    ];
    for (shape, [sh, sw], coord, rounding) in cases {
        let rank = shape.len();
        let mut out = shape.clone();
        out[rank - 2] *= sh;
        out[rank - 1] *= sw;
        let mut scales = vec![1.0f32; rank];
        scales[rank - 2] = sh as f32;
        scales[rank - 1] = sw as f32;
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, shape.as_slice()));
        let op = Op::Resize(Resize {
            shape: out.into_iter().collect(),
            scales: scales.into_iter().collect(),
            mode: ResizeMode::Nearest(rounding),
            coord,
            antialias: false,
            roi: Default::default(),
        });
        let y = g.add_node(op, &[x], "resize").unwrap();
        g.add_output("y", y);
        seed += 1;
        check_rand(&g, seed, 0.0);
    }
}

#[test]
fn pools_that_would_unroll_too_much_are_refused_by_name() {
    // A 255×3 max pool padded by 127 over a 255×5 input: every output row
    // sees a different set of rows, 171,136 unrolled taps in all (this
    // took Cranelift 23 s before the limit; the fuzzer found it).
    let g = pool_graph(
        Op::MaxPool(window([255, 3], [2, 2], [127, 1, 127, 1], [1, 1], false)),
        [1, 1, 255, 5],
    );
    let opts = kiln_target_cpu::CpuOptions {
        target: kiln_target_cpu::CpuTarget::Native,
        opt_level: 2,
        threads: 1,
    };
    let err = kiln_target_cpu::compile(&g, &opts, kiln_target_cpu::ArtifactInfo::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'pool'") && err.contains("unrolls 171136 taps"),
        "{err}"
    );
}
