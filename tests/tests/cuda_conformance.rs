//! The CUDA target on the ONNX node conformance cases the CPU target
//! passes (`tests/conformance/passing.txt`): each case with static shapes is
//! compiled for sm_80, its module assembled with ptxas, and its kernels
//! executed by the PTX interpreter (`targets/cuda/tests/interp`) on
//! pseudo-random inputs and compared with the IR reference evaluator.
//!
//! Every case must compile: since u64 and f64 Exp/Log/Softmax got their
//! lowerings (2026-12-04) none is refused, and a typed "no CUDA lowering"
//! error now fails the test too (the CUDA target lowers every op and type
//! the CPU target passes here). Cases whose random inputs the reference
//! refuses (e.g. Gather indices out of range, an unsigned division by
//! zero) are only assembled.

use kiln_test_kit::ptx_interp as interp;

use kiln_driver::{optimize, CompileOptions};
use kiln_ir::{DType, Data, Tensor};
use kiln_target_cuda::{CudaError, SmArch};
use kiln_tests::repo_root;
use std::path::PathBuf;
use std::process::Command;

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_ONNX_TESTS_DIR") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("target/onnx-node-tests"),
    }
}

/// Pseudo-random values in [-2, 2) (integers in [-10, 10], bools, any
/// code of a narrow type).
fn random(d: DType, shape: &[usize], seed: u64) -> Option<Tensor> {
    let n: usize = shape.iter().product();
    let mut rng = kiln_test_kit::Rng::new(seed);
    let v: Vec<f64> = (0..n).map(|_| rng.f64(-2.0, 2.0)).collect();
    let data = match d {
        DType::Bool => Data::Bool(v.iter().map(|&x| x > 0.0).collect()),
        d if d.is_int() => Data::from_i64s(d, v.iter().map(|&x| (x * 5.0) as i64)),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Data::from_f64s(d, v.into_iter()),
        // Every code of a narrow type, NaNs and infinities included.
        d if d.is_narrow() => {
            let mask = (1u32 << kiln_ir::narrow::code_bits(d).expect("narrow")) - 1;
            let codes = v.iter().map(|&x| (((x + 2.0) * 64.0) as u32 & mask) as u8);
            Data::Narrow(d, codes.collect())
        }
        _ => return None,
    };
    Tensor::new(shape, data)
}

#[test]
fn passing_conformance_cases_assemble_and_match_the_reference() {
    let dir = data_dir().join("node");
    if !dir.exists() {
        let status = Command::new("bash")
            .arg(repo_root().join("scripts/conformance-data.sh"))
            .status()
            .expect("run scripts/conformance-data.sh");
        assert!(status.success(), "scripts/conformance-data.sh failed");
    }
    let ptxas = Command::new("bash")
        .arg(repo_root().join("scripts/ptxas.sh"))
        .output()
        .expect("run scripts/ptxas.sh");
    assert!(ptxas.status.success(), "scripts/ptxas.sh failed");
    let ptxas = PathBuf::from(String::from_utf8(ptxas.stdout).unwrap().trim());
    let list = std::fs::read_to_string(repo_root().join("tests/conformance/passing.txt"))
        .expect("passing.txt");
    let sm = SmArch::parse("sm80").unwrap();
    let (mut compared, mut assembled_only, mut symbolic) = (0, 0, 0);
    let mut refused = Vec::new();
    let mut failures = Vec::new();
    for case in list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let model = dir.join(case).join("model.onnx");
        // Cases with symbolic dims need shapes from their data files; the
        // CPU conformance runner covers those.
        let opts = CompileOptions {
            target: kiln_driver::target::Target::Cuda(
                kiln_target_cuda::SmArch::parse("sm80").expect("sm80"),
            ),
            ..CompileOptions::default()
        };
        let graph = match optimize(&model, &opts) {
            Ok(o) => o.graph,
            Err(_) => {
                symbolic += 1;
                continue;
            }
        };
        let program = match kiln_target_cuda::compile(&graph, sm) {
            Ok(p) => p,
            // Ops and types without a CUDA lowering are refused with an
            // error naming the node, which is the required behaviour.
            Err(e @ (CudaError::UnsupportedDType { .. } | CudaError::UnsupportedOp { .. })) => {
                refused.push(format!("{case}: {e}"));
                continue;
            }
            Err(e) => {
                failures.push(format!("{case}: compile: {e}"));
                continue;
            }
        };
        if let Err(e) = kiln_target_cuda::ptxas::assemble(&ptxas, &program) {
            failures.push(format!("{case}: {e}"));
            continue;
        }
        let inputs: Option<Vec<Tensor>> = graph
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let ty = &graph.node(id).ty;
                random(ty.dtype, &ty.shape, i as u64 + 1)
            })
            .collect();
        let Some(inputs) = inputs else {
            assembled_only += 1;
            continue;
        };
        if kiln_ir::eval::eval_graph(&graph, &inputs).is_err() {
            assembled_only += 1;
            continue;
        }
        let result = std::panic::catch_unwind(|| interp::check_against_reference(&graph, &inputs));
        match result {
            Ok(()) => compared += 1,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{case}: {msg}"));
            }
        }
    }
    println!(
        "conformance on sm_80: {compared} compared with the reference, {assembled_only} assembled only, \
         {} refused (no CUDA lowering for the op or type), {symbolic} skipped (symbolic dims)",
        refused.len()
    );
    for r in &refused {
        println!("  refused: {r}");
    }
    assert!(compared > 200, "only {compared} cases compared");
    assert!(
        refused.is_empty(),
        "{} case(s) the CPU target passes have no CUDA lowering:\n{}",
        refused.len(),
        refused.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
