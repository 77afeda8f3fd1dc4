//! Targets, determinism and errors.

mod common;

use kiln_format::{Arch, Artifact, CpuFeatures, HostFn, RelocKind, RelocTarget};
use kiln_ir::{Conv2d, DType, Graph, Op, UnaryOp, ValueType};
use kiln_target_cpu::{compile, ArtifactInfo, CpuError, CpuOptions, CpuTarget};

fn sample_graph() -> Graph {
    let mut rng = common::Rng::new(1);
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [1, 2, 6, 6]));
    let w = g.add_const("w", common::f32_tensor(&mut rng, &[3, 2, 3, 3]));
    let c = Op::Conv(Conv2d {
        strides: [1, 1],
        pads: [1, 1, 1, 1],
        dilations: [1, 1],
        group: 1,
    });
    let y = g.add_node(c, &[x, w], "conv").unwrap();
    let y = g.add_node(Op::Unary(UnaryOp::Abs), &[y], "abs").unwrap();
    let y = g
        .add_node(Op::Softmax { axis: 1 }, &[y], "softmax")
        .unwrap();
    g.add_output("y", y);
    g
}

fn opts(target: CpuTarget) -> CpuOptions {
    CpuOptions {
        target,
        opt_level: 2,
        threads: kiln_target_cpu::DEFAULT_THREADS,
    }
}

#[test]
fn cross_compiles_for_aarch64() {
    let a = compile(
        &sample_graph(),
        &opts(CpuTarget::Aarch64),
        ArtifactInfo::default(),
    )
    .unwrap();
    let parsed = Artifact::parse(&a.to_bytes()).unwrap();
    assert_eq!(parsed.arch, Arch::Aarch64);
    assert_eq!(parsed.features, CpuFeatures::NEON);
    assert_eq!(parsed.kernels.len(), 3);
    assert_eq!(parsed.metadata.target, "aarch64");
    // log calls the host through absolute addresses.
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::F32, [5]));
    let y = g.add_node(Op::Unary(UnaryOp::Log), &[x], "log").unwrap();
    g.add_output("y", y);
    let a = compile(&g, &opts(CpuTarget::Aarch64), ArtifactInfo::default()).unwrap();
    let parsed = Artifact::parse(&a.to_bytes()).unwrap();
    assert!(!parsed.relocs.is_empty());
    assert!(parsed
        .relocs
        .iter()
        .all(|r| r.kind == RelocKind::Abs64 && r.target == RelocTarget::Host(HostFn::Logf)));
}

#[test]
fn x86_targets_record_their_features() {
    for (t, avx512) in [
        (CpuTarget::X86_64V3, false),
        (CpuTarget::X86_64Avx512, true),
    ] {
        let a = compile(&sample_graph(), &opts(t), ArtifactInfo::default()).unwrap();
        let parsed = Artifact::parse(&a.to_bytes()).unwrap();
        assert_eq!(parsed.arch, Arch::X86_64);
        assert!(parsed
            .features
            .contains(CpuFeatures::AVX2 | CpuFeatures::FMA));
        assert_eq!(parsed.features.contains(CpuFeatures::AVX512F), avx512);
        assert_eq!(parsed.metadata.target, t.to_string());
    }
}

#[test]
fn same_graph_gives_identical_bytes() {
    for t in [CpuTarget::Native, CpuTarget::Aarch64, CpuTarget::X86_64V3] {
        let info = ArtifactInfo {
            compiler_version: "test".into(),
            options: "-O2".into(),
            source_sha256: [7; 32],
        };
        let a = compile(&sample_graph(), &opts(t), info.clone())
            .unwrap()
            .to_bytes();
        let b = compile(&sample_graph(), &opts(t), info).unwrap().to_bytes();
        assert_eq!(a, b);
    }
}

#[test]
fn opt_level_zero_also_runs() {
    let g = sample_graph();
    let a = compile(
        &g,
        &CpuOptions {
            target: CpuTarget::Native,
            opt_level: 0,
            threads: 1,
        },
        ArtifactInfo::default(),
    )
    .unwrap();
    let m = kiln_runtime::Model::from_bytes(&a.to_bytes()).unwrap();
    let x = vec![0.5f32; 72];
    let out = m
        .run(&[kiln_runtime::TensorRef::from_slice("x", &[1, 2, 6, 6], &x)])
        .unwrap();
    assert_eq!(out[0].shape, [1, 3, 6, 6]);
}

#[test]
fn unsupported_dtypes_are_named() {
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::I32, [4, 4]));
    let y = g.add_node(Op::MatMul, &[x, x], "i32_matmul").unwrap();
    g.add_output("y", y);
    let err = compile(&g, &opts(CpuTarget::Native), ArtifactInfo::default()).unwrap_err();
    assert!(
        matches!(err, CpuError::UnsupportedDType { ref node, dtype: DType::I32, .. } if node == "i32_matmul"),
        "{err:?}"
    );
    assert!(err.to_string().contains("i32_matmul"), "{err}");
    assert!(err.to_string().contains("i32"), "{err}");
}

#[test]
fn targets_parse_and_print() {
    for name in ["native", "x86_64-v3", "x86_64-avx512", "aarch64"] {
        assert_eq!(name.parse::<CpuTarget>().unwrap().to_string(), name);
    }
    assert!(matches!(
        "riscv".parse::<CpuTarget>(),
        Err(CpuError::UnknownTarget(_))
    ));
}

#[test]
fn metadata_describes_inputs_and_outputs() {
    let a = compile(
        &sample_graph(),
        &opts(CpuTarget::Native),
        ArtifactInfo::default(),
    )
    .unwrap();
    let m = &a.profiles[0];
    assert_eq!(m.inputs[0].name, "x");
    assert_eq!(m.inputs[0].shape, [1, 2, 6, 6]);
    assert_eq!(m.outputs[0].name, "y");
    assert_eq!(m.outputs[0].shape, [1, 3, 6, 6]);
    assert_eq!(m.inputs[0].arena_offset % 64, 0);
    assert_eq!(m.outputs[0].arena_offset % 64, 0);
    assert!(m.arena_size >= m.outputs[0].arena_offset + 108 * 4);
    // The Cranelift kernels read the constant as it is; AVX-512
    // microkernels read a packed copy stored after it.
    let v3 = compile(
        &sample_graph(),
        &opts(CpuTarget::X86_64V3),
        ArtifactInfo::default(),
    )
    .unwrap();
    assert_eq!(v3.weights.len(), 54 * 4);
    assert!(a.weights.len() >= 54 * 4);
}

#[test]
fn every_x86_level_runs_the_same_on_this_host() {
    if Arch::host() != Some(Arch::X86_64) {
        return;
    }
    let host = CpuFeatures::detect_host();
    let g = sample_graph();
    let x: Vec<f32> = (0..72).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut results = Vec::new();
    for t in [
        CpuTarget::Native,
        CpuTarget::X86_64V3,
        CpuTarget::X86_64Avx512,
    ] {
        let a = compile(&g, &opts(t), ArtifactInfo::default()).unwrap();
        if !host.contains(a.features) {
            continue;
        }
        let m = kiln_runtime::Model::from_bytes(&a.to_bytes()).unwrap();
        let out = m
            .run(&[kiln_runtime::TensorRef::from_slice("x", &[1, 2, 6, 6], &x)])
            .unwrap();
        results.push(out[0].to_f32_vec().unwrap());
    }
    let reference = kiln_ir::eval::eval_graph(
        &g,
        &[kiln_ir::Tensor::new([1, 2, 6, 6], kiln_ir::Data::F32(x.clone())).unwrap()],
    )
    .unwrap()[0]
        .to_f32_vec();
    assert!(!results.is_empty());
    for r in &results {
        for (a, b) in r.iter().zip(&reference) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-3), "{a} vs {b}");
        }
    }
}
