//! The model zoo (`fixtures/make_zoo.py --size small`, committed as
//! `fixtures/models/zoo_*`): small random-weight versions of common
//! architectures, each compiled for the native target, run through the
//! runtime and compared with its onnxruntime reference outputs.

use kiln_tests::{check_fixture, Fixture};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

/// The fp32 bar of `fixtures.rs`: max abs error relative to the output's
/// scale.
const FP32_TOLERANCE: f64 = 1e-4;

/// The architectures of `make_zoo.py` (its `ZOO` table); each is the
/// fixture `zoo_<name>`.
const ZOO: [&str; 19] = [
    "audio1d",
    "bert",
    "convnext",
    "densenet",
    "efficientnet",
    "gru",
    "inception",
    "lstm",
    "mobilenetv2",
    "mobilenetv3",
    "regnetx",
    "resnet18",
    "resnet50",
    "resnext50",
    "shufflenetv2",
    "unet",
    "vgg",
    "vit",
    "yolo",
];

#[test]
fn zoo_models_match_onnxruntime() {
    let names: Vec<String> = Fixture::all_names()
        .into_iter()
        .filter(|n| n.starts_with("zoo_"))
        .collect();
    let mut expected: Vec<String> = ZOO.iter().map(|n| format!("zoo_{n}")).collect();
    expected.sort();
    assert_eq!(
        names, expected,
        "the zoo_* fixtures are not the zoo of fixtures/make_zoo.py; \
         regenerate them with `python fixtures/make_zoo.py --size small`"
    );
    let mut failures = Vec::new();
    println!(
        "{:<40} {:>12} {:>12} {:>8}",
        "model:output", "max abs err", "rel err", "secs"
    );
    for name in &names {
        let fixture = Fixture::load(name);
        let start = Instant::now();
        // One model's panic is one failure in the list, not the end of the
        // test.
        let result = match catch_unwind(AssertUnwindSafe(|| check_fixture(&fixture))) {
            Ok(result) => result,
            Err(payload) => {
                let msg = (payload.downcast_ref::<String>().cloned())
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(format!("{name}: panicked: {msg}"))
            }
        };
        let secs = start.elapsed().as_secs_f64();
        match result {
            Ok(comparisons) => {
                for c in comparisons {
                    println!(
                        "{:<40} {:>12.3e} {:>12.3e} {:>8.2}",
                        format!("{name}:{}", c.name),
                        c.max_abs_error,
                        c.rel_error,
                        secs
                    );
                    if !c.passes(FP32_TOLERANCE) {
                        failures.push(format!("{name}: output '{}': {c:?}", c.name));
                    }
                }
            }
            Err(e) => {
                println!("{name:<40} {:>12} {:>12} {secs:>8.2}", "FAILED", "-");
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s) in {} zoo models (tolerance {FP32_TOLERANCE:e} of the output's scale):\n{}",
        failures.len(),
        names.len(),
        failures.join("\n")
    );
}

/// Weights are stored once: a constant that kernels read only in their
/// packed form is not also stored as it was, so every zoo model's weights
/// section is about the size of its constants (packing pads panels to the
/// kernels' widths, which costs most on these small random models with
/// few channels).
#[test]
fn zoo_weights_are_stored_once() {
    let mut report = Vec::new();
    for name in ZOO {
        let fixture = Fixture::load(&format!("zoo_{name}"));
        let compiled = kiln_driver::compile(&fixture.model_path(), &fixture.compile_options())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let g = &compiled.graph;
        let constants: usize = (g.node_ids())
            .filter(|&id| matches!(g.node(id).op, kiln_ir::Op::Constant(_)))
            .map(|id| g.node(id).ty.size_bytes())
            .sum();
        let stored = compiled.artifact.weights.len();
        let ratio = stored as f64 / constants as f64;
        println!(
            "{name:<14} constants {constants:>9} B, weights section {stored:>9} B ({ratio:.3}x)"
        );
        report.push((name, ratio));
    }
    let over: Vec<_> = report.iter().filter(|(_, r)| *r > 1.25).collect();
    assert!(over.is_empty(), "weights stored more than once? {over:?}");
}
