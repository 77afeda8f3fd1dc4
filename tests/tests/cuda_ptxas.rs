//! Offline PTX validation: every fixture model, compiled for every
//! supported SM, assembles with NVIDIA's `ptxas` (from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12`, installed by `scripts/ptxas.sh`; no GPU).
//!
//! A module ptxas rejects fails the test with the kernel and source node of
//! every error line. The register and spill figures of `ptxas -v` are
//! collected per kernel and written to `target/cuda-ptxas-report.tsv`.

use kiln_target_cuda::ptxas::assemble;
use kiln_target_cuda::{CudaError, SmArch, SUPPORTED_SMS};
use kiln_tests::{real_models_root, repo_root, Fixture, REAL_MODELS};
use std::path::PathBuf;
use std::process::Command;

/// The ptxas binary: `KILN_PTXAS`, or the one `scripts/ptxas.sh` installs.
fn ptxas() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/ptxas.sh"))
        .output()
        .expect("run scripts/ptxas.sh");
    assert!(
        out.status.success(),
        "scripts/ptxas.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).expect("utf-8 path").trim())
}

#[test]
fn every_fixture_kernel_assembles_for_every_sm() {
    let ptxas = ptxas();
    let mut failures = Vec::new();
    let mut report = String::from("model\tsm\tkernels\tmax_registers\tspill_bytes\n");
    let mut assembled = 0usize;
    let names = Fixture::all_names();
    assert!(
        names.len() > 100,
        "expected the fixtures, found {}",
        names.len()
    );
    // Run-time control flow makes one profile per path, which the CUDA
    // target refuses (one profile per artifact); outputs of data-dependent
    // size have no CUDA lowering (docs/bounded.md).
    for name in (names.iter()).filter(|n| !n.starts_with("control_") && !n.starts_with("bounded_"))
    {
        let fixture = Fixture::load(name);
        // The pipeline for CUDA targets (`fuse` without dense heads).
        let mut opts = fixture.compile_options();
        opts.target = kiln_driver::target::Target::Cuda(SUPPORTED_SMS[0]);
        let graph = match kiln_driver::optimize(&fixture.model_path(), &opts) {
            Ok(o) => o.graph,
            Err(e) => {
                failures.push(format!("{name}: import: {e}"));
                continue;
            }
        };
        // The contrib-op models (`fixtures/make_contrib.py`) lower to the
        // ops the other fixtures cover on every SM: the first SM checks
        // their op combinations and keeps CI's time in bounds.
        let sms = if name.starts_with("contrib_") {
            &SUPPORTED_SMS[..1]
        } else {
            &SUPPORTED_SMS[..]
        };
        for &sm in sms {
            let program = match kiln_target_cuda::compile(&graph, sm) {
                Ok(p) => p,
                Err(e) => {
                    failures.push(format!("{name} sm_{}: compile: {e}", sm.sm));
                    continue;
                }
            };
            match assemble(&ptxas, &program) {
                Ok(a) => {
                    assert!(!a.cubin.is_empty(), "{name} sm_{}: empty cubin", sm.sm);
                    assembled += a.kernels.len();
                    report.push_str(&format!(
                        "{name}\tsm_{}\t{}\t{}\t{}\n",
                        sm.sm,
                        a.kernels.len(),
                        a.kernels.iter().map(|k| k.registers).max().unwrap_or(0),
                        a.kernels.iter().map(|k| k.spill_bytes).sum::<u32>()
                    ));
                }
                Err(e) => failures.push(format!("{name} sm_{}: {e}", sm.sm)),
            }
        }
    }
    let report_path = repo_root().join("target/cuda-ptxas-report.tsv");
    let _ = std::fs::write(&report_path, &report);
    println!(
        "{assembled} kernels assembled; report in {}",
        report_path.display()
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The dense fixtures built with `--precision bf16`, `fp16` and `int8`
/// assemble for every SM: 16-bit loads and stores everywhere, `mma.sync`
/// (bf16 x bf16, int8 x int8) from sm_80.
#[test]
fn reduced_precision_kernels_assemble_for_every_sm() {
    use kiln_passes::{Mode, Policy};
    let ptxas = ptxas();
    let mut failures = Vec::new();
    let mut mma = 0;
    for name in [
        "digits_mlp",
        "digits_cnn",
        "ppocr_cls",
        "op_gemm_trans_alpha_beta",
        "op_matmul_bcast_batch",
    ] {
        let fixture = Fixture::load(name);
        for mode in [Mode::Bf16, Mode::Fp16, Mode::Int8] {
            let mut opts = fixture.compile_options();
            opts.target = kiln_driver::target::Target::Cuda(SUPPORTED_SMS[0]);
            opts.precision = Policy {
                mode,
                ..Policy::default()
            };
            opts.calibrate_random = 0;
            let graph = kiln_driver::optimize(&fixture.model_path(), &opts)
                .unwrap_or_else(|e| panic!("{name} {mode:?}: {e}"))
                .graph;
            for sm in SUPPORTED_SMS {
                let program = kiln_target_cuda::compile(&graph, sm)
                    .unwrap_or_else(|e| panic!("{name} {mode:?} sm_{}: {e}", sm.sm));
                mma += program.ptx.matches("mma.sync").count();
                if let Err(e) = assemble(&ptxas, &program) {
                    failures.push(format!("{name} {mode:?} sm_{}: {e}", sm.sm));
                }
            }
        }
    }
    assert!(mma > 0, "no mma.sync emitted");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The real models (PP-OCRv4 det/rec, MiniLM) compile for the oldest and
/// the newest supported SM and every kernel assembles; no GPU is needed.
#[test]
fn real_model_kernels_assemble() {
    let Some(root) = real_models_root() else {
        return;
    };
    let ptxas = ptxas();
    let mut failures = Vec::new();
    let sms = [SUPPORTED_SMS[0], SUPPORTED_SMS[SUPPORTED_SMS.len() - 1]];
    for name in REAL_MODELS {
        let fixture = Fixture::load_dir(&root.join(name));
        // The pipeline for CUDA targets (`fuse` without dense heads).
        let mut opts = fixture.compile_options();
        opts.target = kiln_driver::target::Target::Cuda(sms[0]);
        let graph = kiln_driver::optimize(&fixture.model_path(), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .graph;
        for sm in sms {
            match kiln_target_cuda::compile(&graph, sm) {
                Ok(program) => match assemble(&ptxas, &program) {
                    Ok(a) => println!(
                        "{name} sm_{}: {} kernels assembled, max {} registers, {} spill bytes",
                        sm.sm,
                        a.kernels.len(),
                        a.kernels.iter().map(|k| k.registers).max().unwrap_or(0),
                        a.kernels.iter().map(|k| k.spill_bytes).sum::<u32>()
                    ),
                    Err(e) => failures.push(format!("{name} sm_{}: {e}", sm.sm)),
                },
                Err(e) => failures.push(format!("{name} sm_{}: compile: {e}", sm.sm)),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_rejected_kernel_is_reported_with_its_node() {
    // A deliberately broken module (an undefined register in the first
    // kernel) must fail and name that kernel and its node: the check above
    // can fail.
    let ptxas = ptxas();
    let fixture = Fixture::load("op_relu");
    let graph = kiln_driver::optimize(&fixture.model_path(), &fixture.compile_options())
        .expect("import")
        .graph;
    let sm = SmArch::parse("sm80").expect("sm80");
    let mut program = kiln_target_cuda::compile(&graph, sm).expect("compile");
    let first = program.kernels[0].clone();
    let ret = program
        .ptx
        .find("\tret;")
        .expect("the first kernel returns");
    program
        .ptx
        .insert_str(ret, "\tadd.u32 %undefined_reg, 1, 2;\n");
    match assemble(&ptxas, &program) {
        Err(CudaError::PtxasRejected { kernel, node, log }) => {
            assert_eq!(kernel, first.name);
            assert_eq!(node, first.node);
            assert!(log.contains("undefined_reg"), "{log}");
        }
        other => panic!("ptxas must reject it: {other:?}"),
    }
}

#[test]
fn integer_convolution_kernels_assemble_for_every_sm() {
    // No fixture reaches ConvInteger (the ONNX importer does not map it
    // yet): a hand-built graph covers both window shapes of its kernel,
    // unrolled (3x3, u8 x i8, per-channel W zero point, groups) and
    // run-time loops (7x8, i8 x u8, scalar zero points as graph inputs).
    use kiln_ir::{Conv2d, DType, Data, Graph, Op, Tensor, ValueType};
    let bytes = |d: DType, shape: &[usize]| {
        let n: usize = shape.iter().product();
        Tensor::new(
            shape,
            Data::from_i64s(d, (0..n as i64).map(|i| i * 37 % 256 - 128)),
        )
        .unwrap()
    };
    let mut g = Graph::new();
    let x = g.add_input("x", ValueType::new(DType::U8, [2, 4, 9, 11]));
    let w = g.add_const("w", bytes(DType::I8, &[6, 2, 3, 3]));
    let xz = g.add_const("x_zero", bytes(DType::U8, &[]));
    let wz = g.add_const("w_zero", bytes(DType::I8, &[6]));
    let small = Op::ConvInteger(Conv2d {
        strides: [2, 2],
        pads: [1, 1, 2, 1],
        dilations: [1, 1],
        group: 2,
    });
    let y = g.add_node(small, &[x, w, xz, wz], "conv_small").unwrap();
    g.add_output("y", y);
    let x2 = g.add_input("x2", ValueType::new(DType::I8, [1, 2, 9, 10]));
    let w2 = g.add_input("w2", ValueType::new(DType::U8, [3, 2, 7, 8]));
    let xz2 = g.add_input("x2_zero", ValueType::new(DType::I8, [0usize; 0]));
    let wz2 = g.add_input("w2_zero", ValueType::new(DType::U8, [0usize; 0]));
    let large = Op::ConvInteger(Conv2d {
        strides: [1, 2],
        pads: [3, 4, 3, 3],
        dilations: [1, 1],
        group: 1,
    });
    let y2 = g
        .add_node(large, &[x2, w2, xz2, wz2], "conv_large")
        .unwrap();
    g.add_output("y2", y2);
    let ptxas = ptxas();
    for sm in SUPPORTED_SMS {
        let program = kiln_target_cuda::compile(&g, sm).expect("compile");
        let ops: Vec<&str> = program.kernels.iter().map(|k| k.op).collect();
        assert_eq!(ops, ["conv_integer", "conv_integer"], "sm_{}", sm.sm);
        if let Err(e) = assemble(&ptxas, &program) {
            panic!("sm_{}: {e}", sm.sm);
        }
    }
}
