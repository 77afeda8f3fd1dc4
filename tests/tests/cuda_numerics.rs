//! Every fixture model's CUDA kernels, executed by the PTX interpreter of
//! `kiln_test_kit::ptx_interp` (no GPU), against the IR reference
//! evaluator on the fixture's committed inputs.

use kiln_test_kit::ptx_interp as interp;

use kiln_ir::{DType, Data, Tensor};

/// An input of a fixture: the `.npy` payload is the last bytes of the file
/// (C order, little-endian), after a header we need not parse.
fn fixture_input(dir: &std::path::Path, io: &serde_json::Value) -> Tensor {
    let d = match io["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "int64" => DType::I64,
        "int32" => DType::I32,
        "bool" => DType::Bool,
        "uint8" => DType::U8,
        "int8" => DType::I8,
        other => panic!("fixture dtype {other}"),
    };
    let shape: Vec<usize> = io["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let bytes = std::fs::read(dir.join(io["file"].as_str().unwrap())).unwrap();
    let n = shape.iter().product::<usize>() * d.size_bytes();
    let data = Data::from_le_bytes(d, &bytes[bytes.len() - n..]).unwrap();
    Tensor::new(&shape, data).unwrap()
}

/// Every input of the fixture in `dir` described by `meta`.
fn fixture_inputs(dir: &std::path::Path, meta: &serde_json::Value) -> Vec<Tensor> {
    meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|io| fixture_input(dir, io))
        .collect()
}

#[test]
fn fixture_models_match_the_reference_evaluator() {
    let root = kiln_tests::repo_root().join("fixtures/models");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        // Run-time control flow makes one profile per path, which the
        // CUDA target refuses (one profile per artifact), and outputs of
        // data-dependent size have no CUDA lowering (docs/bounded.md).
        .filter(|p| !p.to_string_lossy().contains("/control_"))
        .filter(|p| !p.to_string_lossy().contains("/bounded_"))
        .collect();
    dirs.sort();
    assert!(dirs.len() > 100, "expected the fixtures");
    for dir in dirs {
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let mut opts = kiln_onnx::ImportOptions::default();
        if let Some(shapes) = meta["input_shapes"].as_object() {
            for (k, v) in shapes {
                let dims = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize);
                opts.input_shapes.insert(k.clone(), dims.collect());
            }
        }
        let g = kiln_onnx::import(&dir.join("model.onnx"), &opts).unwrap();
        let inputs = fixture_inputs(&dir, &meta);
        let start = std::time::Instant::now();
        // Fixtures with int8 layers (`"tolerance": "int8"`): a requantized
        // value may land one step away when a float sum's last bits differ.
        let rel = if meta["tolerance"].as_str() == Some("int8") {
            3e-2
        } else {
            1e-4
        };
        let sm80 = kiln_target_cuda::SmArch::parse("sm80").unwrap();
        interp::check_against_reference_within(sm80, &g, &inputs, rel);
        eprintln!("{}: {:.2} s", dir.display(), start.elapsed().as_secs_f64());
    }
}

/// The fixtures with dense ops (the models and the single-op MatMul, Gemm
/// and Conv fixtures) built with `--precision bf16`, `fp16` and `int8`
/// (dynamic, and static calibrated on the fixture's input) for CUDA: the optimized graph (16-bit weights, bf16 activations into
/// MatMul/Gemm; int8 weights with activations quantized at run time)
/// compiled for sm_80, where bf16 x bf16 and int8 x constant int8 products
/// run on `mma.sync` and the rest on the SIMT kernels, and interpreted
/// against the reference evaluator of that same graph.
#[test]
fn reduced_precision_fixtures_match_the_reference_evaluator() {
    use kiln_passes::{Mode, Policy};
    let (mut mma_kernels, mut int8_mma, mut checked) = (0, 0, 0);
    for name in kiln_tests::Fixture::all_names() {
        let dense = name.starts_with("digits_")
            || ["op_gemm", "op_matmul", "op_conv"]
                .iter()
                .any(|p| name.starts_with(p));
        if !dense {
            continue;
        }
        let fixture = kiln_tests::Fixture::load(&name);
        let dir = kiln_tests::repo_root().join("fixtures/models").join(&name);
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let inputs = fixture_inputs(&dir, &meta);
        // A calibrated static int8 build: smoothed activations (one
        // divisor per channel in the quantization) and corrected biases.
        let calibration = tempfile::tempdir().unwrap();
        kiln_driver::npy::write_npz(&calibration.path().join("inputs.npz"), &fixture.inputs())
            .unwrap();
        for (mode, calibrated) in [
            (Mode::Bf16, false),
            (Mode::Fp16, false),
            (Mode::Int8, false),
            (Mode::Int8, true),
        ] {
            let mut opts = fixture.compile_options();
            opts.target =
                kiln_driver::target::Target::Cuda(kiln_target_cuda::SmArch::parse("sm80").unwrap());
            opts.precision = Policy {
                mode,
                ..Policy::default()
            };
            opts.calibrate_random = 0;
            if calibrated {
                opts.static_activations = true;
                opts.calibrate = Some(calibration.path().to_path_buf());
            }
            let g = kiln_driver::optimize(&fixture.model_path(), &opts)
                .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"))
                .graph;
            let reduced = g.node_ids().any(|id| {
                let d = g.node(id).ty.dtype;
                kiln_ir::infer::is_half(d) || d == DType::I8
            });
            if !reduced {
                // Not eligible (e.g. depthwise convolutions stay f32).
                continue;
            }
            checked += 1;
            let program =
                kiln_target_cuda::compile(&g, opts.target.cuda().unwrap()).expect("compile");
            mma_kernels += program
                .ptx
                .split(".entry")
                .filter(|k| k.contains("mma.sync"))
                .count();
            int8_mma += program.ptx.matches("m16n8k32").count();
            interp::check_against_reference(&g, &inputs);
        }
    }
    assert!(
        checked > 30,
        "only {checked} reduced-precision builds checked"
    );
    assert!(mma_kernels > 0, "no kernel ran on mma.sync");
    assert!(int8_mma > 0, "no int8 kernel ran on mma.sync");
}

/// Deterministic bytes covering the whole u8/i8 range (sign extension of
/// both operands and zero points matters).
fn bytes_tensor(d: DType, shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut rng = kiln_test_kit::Rng::new(seed);
    let v = (0..n).map(|_| rng.int(-128, 127));
    Tensor::new(shape, Data::from_i64s(d, v)).unwrap()
}

/// MatMulInteger on the CUDA target: mixed u8/i8 operands, scalar and
/// per-column B zero points (as graph inputs in the arena or constants in
/// the weights), batch broadcast on either side and 1-D promotion, exact
/// against the reference evaluator.
#[test]
fn matmul_integer_matches_the_reference_evaluator() {
    use kiln_ir::{Graph, Op, ValueType};
    struct Case {
        a: (DType, &'static [usize]),
        b: (DType, &'static [usize]),
        /// B's zero point: per column (else a scalar).
        per_column: bool,
        /// Zero points as constants (else graph inputs).
        constant_zeros: bool,
    }
    let cases = [
        // u8 x i8, batch broadcast on both sides, per-column B zero point.
        Case {
            a: (DType::U8, &[2, 1, 5, 37]),
            b: (DType::I8, &[3, 37, 6]),
            per_column: true,
            constant_zeros: false,
        },
        // i8 x u8, B unbatched (broadcast), per-column constant zero point.
        Case {
            a: (DType::I8, &[3, 4, 19]),
            b: (DType::U8, &[19, 7]),
            per_column: true,
            constant_zeros: true,
        },
        // i8 x u8 batched with a scalar B zero point.
        Case {
            a: (DType::I8, &[2, 3, 17]),
            b: (DType::U8, &[2, 17, 9]),
            per_column: false,
            constant_zeros: false,
        },
        // u8 x u8, 1-D A promoted to a row; i8 x i8, 1-D B.
        Case {
            a: (DType::U8, &[11]),
            b: (DType::U8, &[2, 11, 4]),
            per_column: false,
            constant_zeros: true,
        },
        Case {
            a: (DType::I8, &[2, 3, 13]),
            b: (DType::I8, &[13]),
            per_column: false,
            constant_zeros: false,
        },
    ];
    for (ci, case) in cases.iter().enumerate() {
        let seed = 10 * ci as u64;
        let n = if case.b.1.len() > 1 {
            case.b.1[case.b.1.len() - 1]
        } else {
            1
        };
        let a_zero = bytes_tensor(case.a.0, &[], seed + 3);
        let b_zero_shape: &[usize] = if case.per_column { &[n] } else { &[] };
        let b_zero = bytes_tensor(case.b.0, b_zero_shape, seed + 4);
        let mut g = Graph::new();
        let a = g.add_input("a", ValueType::new(case.a.0, case.a.1));
        let b = g.add_input("b", ValueType::new(case.b.0, case.b.1));
        let mut inputs = vec![
            bytes_tensor(case.a.0, case.a.1, seed + 1),
            bytes_tensor(case.b.0, case.b.1, seed + 2),
        ];
        let (az, bz) = if case.constant_zeros {
            (g.add_const("a_zero", a_zero), g.add_const("b_zero", b_zero))
        } else {
            let az = g.add_input("a_zero", ValueType::new(case.a.0, [0usize; 0]));
            let bz = g.add_input("b_zero", ValueType::new(case.b.0, b_zero_shape));
            inputs.extend([a_zero, b_zero]);
            (az, bz)
        };
        let y = g
            .add_node(Op::MatMulInteger, &[a, b, az, bz], "product")
            .unwrap();
        g.add_output("y", y);
        interp::check_against_reference(&g, &inputs);
    }
}

/// ConvInteger on the CUDA target: mixed u8/i8 operands, padding (with
/// windows wholly in it), strides, dilations, groups (and depthwise),
/// per-channel and scalar W zero points (graph inputs or constants), a
/// nonzero X zero point, batch 2, and a window too large to unroll, exact
/// against the reference evaluator.
#[test]
fn conv_integer_matches_the_reference_evaluator() {
    use kiln_ir::{Conv2d, Graph, Op, ValueType};
    struct Case {
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
    let cases = [
        // u8 x i8, stride 2, asymmetric pads, group 2, per-channel W zero
        // point, batch 2.
        Case {
            x: (DType::U8, [2, 4, 9, 11]),
            w: DType::I8,
            oc: 6,
            k: [3, 3],
            strides: [2, 2],
            pads: [1, 1, 2, 1],
            dilations: [1, 1],
            group: 2,
            per_channel: true,
            constants: true,
        },
        // i8 x u8, dilation 2, pads 2, scalar W zero point, batch 2, all
        // graph inputs.
        Case {
            x: (DType::I8, [2, 3, 10, 12]),
            w: DType::U8,
            oc: 4,
            k: [3, 3],
            strides: [1, 1],
            pads: [2, 2, 2, 2],
            dilations: [2, 2],
            group: 1,
            per_channel: false,
            constants: false,
        },
        // i8 x i8 depthwise (multiplier 2), stride (1, 2), dilation (2, 1),
        // per-channel zero points as graph inputs.
        Case {
            x: (DType::I8, [1, 3, 8, 13]),
            w: DType::I8,
            oc: 6,
            k: [3, 2],
            strides: [1, 2],
            pads: [0, 1, 2, 1],
            dilations: [2, 1],
            group: 3,
            per_channel: true,
            constants: false,
        },
        // Pads wider than the kernel: border windows wholly in the padding.
        Case {
            x: (DType::U8, [1, 4, 5, 6]),
            w: DType::I8,
            oc: 4,
            k: [2, 2],
            strides: [2, 2],
            pads: [3, 4, 3, 4],
            dilations: [2, 2],
            group: 2,
            per_channel: true,
            constants: true,
        },
        // A 7x8 window (56 taps: run-time window loops), u8 x u8.
        Case {
            x: (DType::U8, [1, 2, 9, 10]),
            w: DType::U8,
            oc: 3,
            k: [7, 8],
            strides: [1, 1],
            pads: [3, 4, 3, 3],
            dilations: [1, 1],
            group: 1,
            per_channel: false,
            constants: true,
        },
    ];
    for (ci, c) in cases.iter().enumerate() {
        let seed = 100 + 10 * ci as u64;
        let (xd, xs) = c.x;
        let ws = [c.oc, xs[1] / c.group, c.k[0], c.k[1]];
        let wz_shape: &[usize] = if c.per_channel { &[c.oc] } else { &[] };
        let x = bytes_tensor(xd, &xs, seed + 1);
        let w = bytes_tensor(c.w, &ws, seed + 2);
        // A nonzero X zero point, whatever the draw.
        let xz_value = if xd == DType::U8 { 131 } else { -7 };
        let xz = Tensor::new([0usize; 0], Data::from_i64s(xd, [xz_value].into_iter())).unwrap();
        let wz = bytes_tensor(c.w, wz_shape, seed + 4);
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
        interp::check_against_reference(&g, &inputs);
    }
}
