//! Kernel selection (`lower/select.rs`): every convolution and product
//! shape class of common architectures lands on a microkernel on AVX-512,
//! matches the reference evaluator on ragged shapes, and a node that
//! lands on the generic kernel says why each microkernel declined.

mod common;

use common::{check_rand, f32_tensor, Rng};
use kiln_format::DenseKernel;
use kiln_ir::{Conv2d, DType, Graph, Op, ValueType};
use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};

/// A convolution's geometry.
#[derive(Clone, Copy, Debug)]
struct ConvCase {
    x: [usize; 4],
    oc: usize,
    k: [usize; 2],
    strides: [usize; 2],
    pads: [usize; 4],
    dilations: [usize; 2],
    group: usize,
}

impl ConvCase {
    fn new(x: [usize; 4], oc: usize, k: [usize; 2]) -> ConvCase {
        ConvCase {
            x,
            oc,
            k,
            strides: [1, 1],
            pads: [0; 4],
            dilations: [1, 1],
            group: 1,
        }
    }

    fn strides(self, strides: [usize; 2]) -> ConvCase {
        ConvCase { strides, ..self }
    }

    fn pads(self, pads: [usize; 4]) -> ConvCase {
        ConvCase { pads, ..self }
    }

    fn dilations(self, dilations: [usize; 2]) -> ConvCase {
        ConvCase { dilations, ..self }
    }

    fn group(self, group: usize) -> ConvCase {
        ConvCase { group, ..self }
    }

    /// The graph: X an input, weights and bias constants.
    fn graph(&self) -> Graph {
        let mut rng = Rng::new(self.x.iter().sum::<usize>() as u64 * 7 + self.oc as u64);
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, self.x));
        let wshape = [self.oc, self.x[1] / self.group, self.k[0], self.k[1]];
        let w = g.add_const("w", f32_tensor(&mut rng, &wshape));
        let b = g.add_const("b", f32_tensor(&mut rng, &[self.oc]));
        let op = Op::Conv(Conv2d {
            strides: self.strides,
            pads: self.pads,
            dilations: self.dilations,
            group: self.group,
        });
        let y = g.add_node(op, &[x, w, b], "conv").unwrap();
        g.add_output("y", y);
        g
    }
}

/// The dense kernels an AVX-512 build of `g` chose.
fn chosen(g: &Graph) -> Vec<DenseKernel> {
    let opts = CpuOptions {
        target: CpuTarget::X86_64Avx512,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    };
    let mut artifact = compile(g, &opts, ArtifactInfo::default()).expect("compile");
    artifact.profiles.swap_remove(0).dense_kernels
}

fn host_has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Checks `g` against the reference evaluator and that its one dense node
/// runs on microkernel `kernel`.
fn check_kernel(g: &Graph, kernel: &str, what: &str) {
    let kernels = chosen(g);
    assert_eq!(kernels.len(), 1, "{what}: {kernels:?}");
    assert_eq!(kernels[0].kernel, kernel, "{what}: {:?}", kernels[0]);
    if host_has_avx512() {
        check_rand(g, 5, 1e-5);
    }
}

/// One output pixel per image: a fully connected layer (images as rows,
/// channels as columns), not a GEMM whose one column wastes 15 of 16
/// lanes; a padded or grouped one declines to the other GEMMs.
#[test]
fn convolutions_with_one_output_pixel_run_as_fully_connected_layers() {
    let cases = [
        // Squeeze-excite 1x1 on a pooled map, odd channels, 3 images.
        (
            ConvCase::new([3, 37, 1, 1], 21, [1, 1]),
            "fully-connected-gemm",
        ),
        // A classifier written as a 7x7 conv over a 7x7 map, 2 images.
        (
            ConvCase::new([2, 5, 7, 7], 19, [7, 7]),
            "fully-connected-gemm",
        ),
        // Strides do not matter for one output pixel.
        (
            ConvCase::new([1, 8, 3, 3], 17, [3, 3]).strides([2, 2]),
            "fully-connected-gemm",
        ),
        // Padded: the window does not read the input alone.
        (
            ConvCase::new([1, 8, 1, 1], 17, [3, 3]).pads([1, 1, 1, 1]),
            "implicit-gemm",
        ),
    ];
    for (case, kernel) in cases {
        check_kernel(
            &case.graph(),
            &format!("avx512/{kernel}"),
            &format!("{case:?}"),
        );
    }
}

#[test]
fn grouped_convolutions_run_a_gemm_per_group() {
    let cases = [
        // ShuffleNet: group 3, 1x1, channels per group not a tile multiple.
        (
            ConvCase::new([1, 24, 9, 9], 33, [1, 1]).group(3),
            "pointwise-gemm",
        ),
        // RegNet-style: group 4, 1x1 on 7x7 (136 -> 544 at full size).
        (
            ConvCase::new([1, 20, 7, 7], 36, [1, 1]).group(4),
            "pointwise-gemm",
        ),
        // ResNeXt: 32 groups of 4 channels, 3x3 pad 1 (implicit GEMM).
        (
            ConvCase::new([1, 64, 28, 28], 64, [3, 3])
                .pads([1, 1, 1, 1])
                .group(32),
            "implicit-gemm",
        ),
        // Groups of odd width with stride 2 (im2col per group), 2 images.
        (
            ConvCase::new([2, 15, 11, 13], 10, [3, 3])
                .strides([2, 2])
                .pads([1, 1, 1, 1])
                .group(5),
            "im2col-gemm",
        ),
        // Groups at stride 2 on a wide map (RegNet's strided 3x3): the
        // implicit GEMM over column planes, each group reading its
        // channels' planes, 2 images.
        (
            ConvCase::new([2, 12, 11, 70], 9, [3, 3])
                .strides([2, 2])
                .pads([1, 1, 1, 1])
                .group(3),
            "implicit-gemm",
        ),
        // Two groups on a 1-wide map.
        (
            ConvCase::new([1, 6, 9, 1], 4, [3, 1]).group(2),
            "implicit-gemm",
        ),
    ];
    for (case, kernel) in cases {
        check_kernel(
            &case.graph(),
            &format!("avx512/{kernel}"),
            &format!("{case:?}"),
        );
    }
}

#[test]
fn one_dimensional_convolutions_in_every_layout() {
    // The importer lifts N,C,L to N,C,1,L; exporters also write N,C,L,1
    // with a k x 1 window, which runs along W as the same bytes.
    for k in [3, 5, 11] {
        let pad = k / 2;
        let along_w = ConvCase::new([1, 12, 1, 300], 20, [1, k]).pads([0, pad, 0, pad]);
        check_kernel(&along_w.graph(), "avx512/implicit-gemm", "N,C,1,L");
        let along_h = ConvCase::new([1, 12, 300, 1], 20, [k, 1]).pads([pad, 0, pad, 0]);
        check_kernel(&along_h.graph(), "avx512/implicit-gemm", "N,C,L,1");
    }
    // Strided (one output row: im2col, see `dense::implicit_conv`) and
    // dilated (a WaveNet-like layer), 2 images, along H.
    let strided = ConvCase::new([2, 8, 257, 1], 12, [5, 1])
        .strides([2, 1])
        .pads([2, 0, 2, 0]);
    check_kernel(&strided.graph(), "avx512/im2col-gemm", "strided N,C,L,1");
    let dilated = ConvCase::new([1, 8, 200, 1], 8, [3, 1])
        .dilations([4, 1])
        .pads([4, 0, 4, 0]);
    check_kernel(&dilated.graph(), "avx512/implicit-gemm", "dilated N,C,L,1");
    // One output row shares no weights across rows: the implicit GEMM
    // stays first past 64 channels (im2col goes first on 2-D maps).
    let wide = ConvCase::new([1, 24, 1, 90], 80, [1, 7]).pads([0, 3, 0, 3]);
    check_kernel(
        &wide.graph(),
        "avx512/implicit-gemm",
        "80 channels, N,C,1,L",
    );
}

/// Winograd F(4x4, 3x3) tolerance: its transforms scale values by up to
/// 10 (Bᵀ's 4 and 5, Aᵀ's 8) before they cancel, so f32 rounding is a few
/// times the direct sum's (measured ~1e-6 of the output's scale here).
const WINOGRAD_TOLERANCE: f64 = 2e-5;

#[test]
fn three_by_three_stride_one_convs_run_winograd() {
    // Whole 4x4 tiles ("same" padding on 28x28), ragged ones (23x70: a
    // last tile row of 3 output rows, 18 tiles per row, so a second chunk
    // of 2 tiles; odd channel counts; two images), no padding (30x30 to
    // 28x28) and asymmetric padding (top-left 2, bottom-right 0).
    let cases = [
        (
            ConvCase::new([1, 32, 28, 28], 48, [3, 3]).pads([1, 1, 1, 1]),
            "28x28",
        ),
        (
            ConvCase::new([2, 37, 23, 70], 45, [3, 3]).pads([1, 1, 1, 1]),
            "ragged",
        ),
        (ConvCase::new([1, 64, 30, 30], 64, [3, 3]), "unpadded"),
        (
            ConvCase::new([1, 48, 30, 30], 64, [3, 3]).pads([2, 2, 0, 0]),
            "asymmetric",
        ),
    ];
    for (seed, (case, what)) in (60..).zip(cases) {
        let g = case.graph();
        let kernels = chosen(&g);
        assert_eq!(
            kernels[0].kernel, "avx512/winograd",
            "{what}: {:?}",
            kernels[0]
        );
        // Whole images run the input transform as a step of its own.
        let opts = CpuOptions {
            target: CpuTarget::X86_64Avx512,
            opt_level: 2,
            threads: 2,
        };
        let a = compile(&g, &opts, ArtifactInfo::default()).expect("compile");
        let staged = (a.kernels.iter()).any(|k| k.name.starts_with("conv/winograd-in"));
        assert_eq!(staged, what != "banded", "{what}: {:?}", a.kernels);
        if host_has_avx512() {
            check_rand(&g, seed, WINOGRAD_TOLERANCE);
        }
    }
    // The tile model declines where the GEMMs would be too narrow: a 7x7
    // map is 4 tiles, 16 lanes the GEMM fills a quarter of.
    let small = ConvCase::new([1, 256, 7, 7], 256, [3, 3]).pads([1, 1, 1, 1]);
    let kernels = chosen(&small.graph());
    let declined = &kernels[0].declined[0];
    assert_eq!(declined.kernel, "avx512/winograd");
    assert!(declined.reason.contains("4 tiles"), "{declined:?}");
}

#[test]
fn small_maps_with_many_channels_run_pixels_as_rows() {
    // 49 pixels fill 77% of four vectors, 96 channels all of six: the
    // transposed GEMM (pixels as rows, channels along the vectors, then a
    // transpose), A the im2col matrix; its long K runs in chunks.
    let c7 = ConvCase::new([1, 160, 7, 7], 96, [3, 3]).pads([1, 1, 1, 1]);
    check_kernel(&c7.graph(), TRANSPOSED, "3x3 on 7x7");
    let s2 = ConvCase::new([1, 128, 14, 14], 48, [3, 3])
        .strides([2, 2])
        .pads([1, 1, 1, 1]);
    check_kernel(&s2.graph(), TRANSPOSED, "3x3 stride 2 on 14x14");
    // A 1x1 reads its input in place as A; 130 channels end in a masked
    // vector; two images.
    let pointwise = ConvCase::new([2, 200, 7, 7], 130, [1, 1]);
    check_kernel(&pointwise.graph(), TRANSPOSED, "1x1 on 7x7");
    let strided = ConvCase::new([1, 96, 13, 13], 72, [1, 1]).strides([2, 2]);
    check_kernel(&strided.graph(), TRANSPOSED, "1x1 stride 2 on 13x13");
    // Groups of 16 channels (RegNet's last stage): a GEMM per group into
    // its columns of the rows.
    let grouped = ConvCase::new([1, 80, 7, 7], 80, [3, 3])
        .pads([1, 1, 1, 1])
        .group(5);
    check_kernel(&grouped.graph(), TRANSPOSED, "groups of 16 on 7x7");
    // Dilation 2 on an odd 9x9 map: 81 pixels fill 84% of six vectors.
    let dilated = ConvCase::new([1, 64, 9, 9], 96, [3, 3])
        .pads([2, 2, 2, 2])
        .dilations([2, 2]);
    check_kernel(&dilated.graph(), TRANSPOSED, "dilated 3x3 on 9x9");
    // 14 columns fill 88% of a vector, and 50 channels 78% of four: the
    // implicit GEMM, one tile wide (a 5x3 window: Winograd takes 3x3).
    let c14 = ConvCase::new([1, 96, 14, 14], 50, [5, 3]).pads([2, 1, 2, 1]);
    check_kernel(&c14.graph(), "avx512/implicit-gemm", "3x3 on 14x14");
    // Past 64 output channels the weights re-read per output row cost more
    // than im2col's copies: im2col first, its K in chunks that sweep every
    // column tile (196 columns: three full tiles and a masked one); 65
    // channels fill 81% of five vectors.
    let wide = ConvCase::new([1, 160, 14, 14], 65, [5, 3]).pads([2, 1, 2, 1]);
    check_kernel(&wide.graph(), "avx512/im2col-gemm", "65 channels on 14x14");
    // The same on AVX2: eight-lane vectors, so 49 pixels fill 88% of
    // theirs; 7 images of 9 pixels fill 56%.
    let v3 = |case: ConvCase, what: &str| {
        let opts = CpuOptions {
            target: CpuTarget::X86_64V3,
            opt_level: 2,
            threads: 2,
        };
        let g = case.graph();
        let a = compile(&g, &opts, ArtifactInfo::default()).expect("compile");
        let k = &a.profiles[0].dense_kernels[0];
        assert_eq!(k.kernel, "avx2/transposed-gemm", "{what}: {k:?}");
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut rng = Rng::new(9);
            let inputs = [common::rand_tensor(&mut rng, DType::F32, &case.x)];
            common::check_for(&g, &inputs, 1e-5, CpuTarget::X86_64V3);
        }
    };
    v3(
        ConvCase::new([7, 40, 3, 3], 64, [3, 3]).pads([1, 1, 1, 1]),
        "3x3 on 3x3",
    );
    v3(ConvCase::new([1, 200, 7, 7], 130, [1, 1]), "1x1 on 7x7");
}

/// The transposed GEMM's name.
const TRANSPOSED: &str = "avx512/transposed-gemm";

#[test]
fn asymmetric_strided_and_stem_windows() {
    let cases = [
        // Inception's 1x7 / 7x1 on 17x17: rows of 17 fill 53% of two
        // vectors, so the implicit GEMM merges the rows of the map into
        // one GEMM (shifted column planes); so it does on 40 columns.
        (
            ConvCase::new([1, 16, 17, 17], 24, [1, 7]).pads([0, 3, 0, 3]),
            "implicit-gemm",
        ),
        (
            ConvCase::new([1, 16, 17, 17], 24, [7, 1]).pads([3, 0, 3, 0]),
            "implicit-gemm",
        ),
        (
            ConvCase::new([1, 16, 9, 40], 24, [7, 1]).pads([3, 0, 3, 0]),
            "implicit-gemm",
        ),
        // Strided 1x1 downsampling.
        (
            ConvCase::new([1, 32, 15, 15], 48, [1, 1]).strides([2, 2]),
            "im2col-gemm",
        ),
        // A 7x7 stride-2 stem: the implicit GEMM over the input's even
        // and odd column planes (im2col would write each pixel 49 times).
        (
            ConvCase::new([1, 3, 45, 45], 16, [7, 7])
                .strides([2, 2])
                .pads([3, 3, 3, 3]),
            "implicit-gemm",
        ),
        // A 3x3 at stride 2 over two images with odd sizes, a 3x3 at W
        // stride 3 (three planes) and a dilated one at W stride 2
        // (dilation 2: every tap in the even plane).
        (
            ConvCase::new([2, 5, 19, 63], 12, [3, 3])
                .strides([2, 2])
                .pads([1, 1, 1, 1]),
            "implicit-gemm",
        ),
        (
            ConvCase::new([1, 8, 50, 100], 16, [3, 3])
                .strides([3, 3])
                .pads([1, 1, 1, 1]),
            "implicit-gemm",
        ),
        (
            ConvCase::new([1, 8, 30, 70], 16, [3, 3])
                .strides([1, 2])
                .dilations([2, 2])
                .pads([2, 2, 2, 2]),
            "implicit-gemm",
        ),
        // Dilated 3x3 (DeepLab).
        (
            ConvCase::new([1, 16, 21, 40], 16, [3, 3])
                .dilations([2, 2])
                .pads([2, 2, 2, 2]),
            "implicit-gemm",
        ),
    ];
    for (case, kernel) in cases {
        check_kernel(
            &case.graph(),
            &format!("avx512/{kernel}"),
            &format!("{case:?}"),
        );
    }
}

#[test]
fn long_reductions_run_in_k_chunks() {
    // K of several thousand, ragged M and N: chunked accumulation through
    // the output, the masked last column tile included, and chunks that
    // sweep several row and column tiles each.
    let mut rng = Rng::new(41);
    for (m, k, n) in [
        (13, 3001, 37),
        (7, 4608, 49),
        (1, 2500, 200),
        (40, 2000, 300),
    ] {
        let mut g = Graph::new();
        let a = g.add_input("a", ValueType::new(DType::F32, [m, k]));
        let b = g.add_const("b", f32_tensor(&mut rng, &[k, n]));
        let y = g.add_node(Op::MatMul, &[a, b], "mm").unwrap();
        g.add_output("y", y);
        check_kernel(&g, "avx512/gemm", &format!("{m}x{k}x{n}"));
    }
}

#[test]
fn the_generic_kernel_says_why_each_microkernel_declined() {
    // Weights computed at run time: no GEMM convolution packs them.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 8, 10, 32]));
    let w = g.add_input("w", ValueType::new(DType::F32, [8, 8, 3, 3]));
    let op = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(op, &[x, w], "dynamic_weights").unwrap();
    g.add_output("y", y);
    let kernels = chosen(&g);
    assert_eq!(kernels.len(), 1);
    let k = &kernels[0];
    assert_eq!(k.kernel, "generic/cranelift");
    assert!(k.is_generic());
    assert_eq!(
        (k.node.as_str(), k.op.as_str()),
        ("dynamic_weights", "conv")
    );
    assert_eq!(k.flops, 2 * 8 * 320 * 8 * 9);
    let tried: Vec<&str> = k.declined.iter().map(|d| d.kernel.as_str()).collect();
    assert_eq!(
        tried,
        [
            "avx512/winograd",
            TRANSPOSED,
            "avx512/fully-connected-gemm",
            "avx512/pointwise-gemm",
            "avx512/implicit-gemm",
            "avx512/im2col-gemm"
        ]
    );
    assert!(
        (k.declined[4..].iter().chain(&k.declined[..1]))
            .all(|d| d.reason == "the weights are not a constant"),
        "{:?}",
        k.declined
    );
    if host_has_avx512() {
        check_rand(&g, 3, 1e-5);
    }
    // An AVX2 build serves the 3x3 convolution with a GEMM and a depthwise
    // one (W stride 1 or 2) with the ymm depthwise kernel; at W stride 3
    // that kernel says why it declines before a GEMM serves it.
    let opts = CpuOptions {
        target: CpuTarget::X86_64V3,
        opt_level: 2,
        threads: 1,
    };
    let v3 = |case: ConvCase| {
        let a = compile(&case.graph(), &opts, ArtifactInfo::default()).expect("compile");
        a.profiles[0].dense_kernels[0].clone()
    };
    let k = v3(ConvCase::new([1, 4, 6, 6], 4, [3, 3]));
    assert!(k.kernel.starts_with("avx2/"), "{k:?}");
    let k = v3(ConvCase::new([1, 4, 6, 6], 4, [3, 3]).group(4));
    assert_eq!(k.kernel, "avx2/depthwise", "{k:?}");
    let k = v3(ConvCase::new([1, 4, 6, 6], 4, [3, 3])
        .group(4)
        .strides([2, 2]));
    assert_eq!(k.kernel, "avx2/depthwise", "{k:?}");
    let k = v3(ConvCase::new([1, 4, 9, 9], 4, [3, 3])
        .group(4)
        .strides([3, 3]));
    // (After the 16-channel blocks, which are AVX-512 only.)
    assert_eq!(k.declined[0].kernel, "avx512/depthwise-c16");
    assert!(k.declined[0].reason.contains("AVX-512 only"), "{k:?}");
    assert_eq!(k.declined[1].kernel, "avx2/depthwise");
    assert!(k.declined[1].reason.contains("W stride 3"), "{k:?}");
    assert!(k.kernel.starts_with("avx2/"), "{k:?}");
}

#[test]
fn large_outputs_run_in_bands_of_rows() {
    // Outputs of over 1 MB per product are cut into bands of whole row
    // tiles (`dense::in_row_bands`): batched with both operands at run
    // time (attention scores), and a Gemm with a per-column C and
    // transposed B.
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [2, 1500, 24]));
    let b = g.add_input("b", ValueType::new(DType::F32, [2, 24, 300]));
    let y = g.add_node(Op::MatMul, &[a, b], "scores").unwrap();
    g.add_output("y", y);
    check_kernel(&g, "avx512/gemm", "batched 1500x24x300");
    let mut rng = Rng::new(9);
    let mut g = Graph::new();
    let a = g.add_input("a", ValueType::new(DType::F32, [1200, 40]));
    let w = g.add_const("w", f32_tensor(&mut rng, &[260, 40]));
    let c = g.add_const("c", f32_tensor(&mut rng, &[260]));
    let op = Op::Gemm {
        alpha: 0.5,
        beta: 2.0,
        trans_a: false,
        trans_b: true,
    };
    let y = g.add_node(op, &[a, w, c], "gemm").unwrap();
    g.add_output("y", y);
    check_kernel(&g, "avx512/gemm", "gemm 1200x40x260");
}

/// Depthwise convolutions of large windows on narrow maps (ConvNeXt's 7×7
/// on 7×7, MobileNetV3's 5×5 on 7×7) run on 16-channel blocks: channel
/// counts with a partial last block, several images, strides, dilations;
/// a small window on the same map, and a wide map, keep the row kernel.
#[test]
fn depthwise_convolutions_of_narrow_maps_run_on_channel_blocks() {
    let dw = |x: [usize; 4], k: usize, pad: usize| {
        ConvCase::new(x, x[1], [k, k]).pads([pad; 4]).group(x[1])
    };
    let blocked = [
        dw([1, 40, 7, 7], 7, 3),
        dw([2, 768, 7, 7], 7, 3),
        dw([1, 33, 7, 7], 5, 2),
        dw([1, 16, 4, 6], 7, 3),
        dw([1, 24, 13, 13], 7, 3).strides([2, 2]),
        dw([1, 20, 8, 8], 7, 6).dilations([2, 2]),
        dw([1, 7, 9, 5], 7, 3).pads([1, 3, 5, 3]),
        // Since the copies in and out go through 16x16 transposes (not a
        // gather and a scatter per pixel), a 3x3 window on 7x7 and a 5x5
        // at stride 2 pay too.
        dw([1, 40, 7, 7], 3, 1),
        dw([1, 24, 13, 13], 5, 2).strides([2, 2]),
        // An input at least 16 wide is copied row by row (27 columns: a
        // vector and a masked 11).
        dw([1, 40, 28, 27], 5, 2).strides([2, 2]),
    ];
    for (i, case) in blocked.iter().enumerate() {
        check_kernel(
            &case.graph(),
            "avx512/depthwise-c16",
            &format!("blocked {i}: {case:?}"),
        );
    }
    // A 3x3 window at stride 2 from 28x28 (the row kernel's blocks of rows
    // share each load and permute; ShuffleNetV2's), a wide map, a tall one
    // (its scratch plane past L2).
    let row = [
        dw([1, 16, 28, 28], 3, 1).strides([2, 2]),
        dw([1, 40, 7, 30], 7, 3),
        dw([1, 16, 400, 7], 7, 3),
    ];
    for (i, case) in row.iter().enumerate() {
        check_kernel(
            &case.graph(),
            "avx512/depthwise",
            &format!("row {i}: {case:?}"),
        );
    }
}
