//! Every fixture model, compiled for the native target and run through the
//! runtime, matches its onnxruntime reference outputs.

use kiln_tests::{argmax_rows, check_fixture, run_artifact, Fixture};

/// fp32 bar of the foundation issue: max abs error relative to the output's
/// scale.
const FP32_TOLERANCE: f64 = 1e-4;

fn check_all(names: &[String]) {
    let mut failures = Vec::new();
    println!("{:<40} {:>12} {:>12}", "fixture", "max abs err", "rel err");
    for name in names {
        let fixture = Fixture::load(name);
        match check_fixture(&fixture) {
            Ok(comparisons) => {
                for c in comparisons {
                    println!(
                        "{:<40} {:>12.3e} {:>12.3e}",
                        format!("{name}:{}", c.name),
                        c.max_abs_error,
                        c.rel_error
                    );
                    if !c.passes(FP32_TOLERANCE) {
                        failures.push(format!("{name}: output '{}': {c:?}", c.name));
                    }
                }
            }
            Err(e) => failures.push(e),
        }
    }
    kiln_tests::assert_no_failures(&failures);
}

#[test]
fn op_fixtures_match_onnxruntime() {
    let names: Vec<String> = Fixture::names_with_prefix("op_");
    assert!(
        names.len() > 100,
        "expected the op fixtures, found {}",
        names.len()
    );
    check_all(&names);
}

/// The tf2onnx-style NHWC convnet, whose Transposes the `layout` pass
/// moves to the graph's boundaries (`docs/passes.md`).
#[test]
fn nhwc_convnet_matches_onnxruntime() {
    check_all(&["nhwc_convnet".to_string()]);
}

/// scikit-learn forests as `TreeEnsembleRegressor` (`ops/tree.rs`): a
/// random forest (AVERAGE, two targets) and gradient boosting (SUM plus a
/// base value), on held-out rows of the diabetes set.
#[test]
fn tree_ensembles_match_onnxruntime() {
    let names: Vec<String> = Fixture::names_with_prefix("tree_");
    assert_eq!(names.len(), 2, "{names:?}");
    check_all(&names);
}

#[test]
fn ppocr_cls_matches_onnxruntime() {
    check_all(&["ppocr_cls".to_string()]);
}

fn check_accuracy(name: &str) {
    check_all(&[name.to_string()]);
    let fixture = Fixture::load(name);
    let acc = &fixture.meta["accuracy"];
    let images = kiln_driver::npy::read_tensor(
        acc["input"].as_str().unwrap(),
        &fixture.dir.join(acc["images"].as_str().unwrap()),
    )
    .unwrap();
    let labels =
        kiln_driver::npy::read_tensor("labels", &fixture.dir.join(acc["labels"].as_str().unwrap()))
            .unwrap();
    let labels = labels.to_i64_vec().expect("i64 labels");
    let mut opts = fixture.compile_options();
    opts.import.input_shapes.insert(
        images.name.clone(),
        images.shape.iter().map(|&d| d as usize).collect(),
    );
    let bytes = fixture.compile_with(&opts).unwrap();
    let outputs = run_artifact(&bytes, &[images]).unwrap();
    let scores = outputs
        .iter()
        .find(|t| t.name == acc["output"].as_str().unwrap())
        .expect("scored output");
    let predicted = argmax_rows(scores);
    let correct = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| **p as i64 == **l)
        .count();
    let kiln_accuracy = correct as f64 / labels.len() as f64;
    let ort_accuracy = acc["ort_accuracy"].as_f64().unwrap();
    println!(
        "{name}: Kiln accuracy {kiln_accuracy:.4} ({correct}/{}), onnxruntime {ort_accuracy:.4}",
        labels.len()
    );
    // meta.json rounds the accuracy; within half a sample means the same count.
    let half_sample = 0.5 / labels.len() as f64;
    assert!(
        (kiln_accuracy - ort_accuracy).abs() < half_sample,
        "{name}: Kiln {kiln_accuracy} vs onnxruntime {ort_accuracy}"
    );
}

#[test]
fn digits_mlp_matches_onnxruntime_and_accuracy() {
    check_accuracy("digits_mlp");
}

#[test]
fn digits_cnn_matches_onnxruntime_and_accuracy() {
    check_accuracy("digits_cnn");
}

#[test]
fn same_input_and_options_give_identical_artifacts() {
    for name in ["digits_cnn", "ppocr_cls", "op_conv_groups2"] {
        let fixture = Fixture::load(name);
        let opts = fixture.compile_options();
        let a = fixture.compile_with(&opts).unwrap();
        let b = fixture.compile_with(&opts).unwrap();
        assert!(a == b, "{name}: two compilations differ");
    }
}

#[test]
fn aarch64_cross_compile_produces_a_valid_artifact() {
    for name in ["digits_cnn", "ppocr_cls"] {
        let fixture = Fixture::load(name);
        let mut opts = fixture.compile_options();
        opts.target = "aarch64".parse().unwrap();
        let bytes = fixture.compile_with(&opts).unwrap();
        let artifact =
            kiln_runtime::format::Artifact::parse(&bytes).expect("aarch64 artifact parses");
        assert_eq!(artifact.arch, kiln_runtime::format::Arch::Aarch64);
        assert!(!artifact.kernels.is_empty());
        #[cfg(target_arch = "x86_64")]
        {
            let Err(err) = kiln_runtime::Model::from_bytes(&bytes) else {
                panic!("an aarch64 artifact must not load on x86-64");
            };
            assert!(
                err.to_string().contains("aarch64")
                    || err.to_string().to_lowercase().contains("arch"),
                "{err}"
            );
        }
    }
}

/// Run-time control flow (`compiler/driver/src/variants.rs`): an `If` on
/// an input whose branches give different shapes, and `Loop`s whose trip
/// count is an input or whose condition the body computes from data. One
/// fixture per path, all of a model the same: each artifact holds every
/// path, and the run takes the one its inputs choose.
#[test]
fn run_time_control_flow_matches_onnxruntime() {
    let names: Vec<String> = Fixture::names_with_prefix("control_");
    assert_eq!(names.len(), 6, "{names:?}");
    check_all(&names);
}

/// Outputs whose size depends on the data (`docs/bounded.md`): NonZero,
/// Compress, TopK, Unique and NonMaxSuppression on run-time inputs, a
/// detector-style score filter and a detector's tail with NMS inside,
/// one fixture per data set (lengths 0 to the bound), each artifact
/// planned at the bound and cut by the run to onnxruntime's shapes.
#[test]
fn data_dependent_shapes_match_onnxruntime() {
    let names: Vec<String> = Fixture::names_with_prefix("bounded_");
    assert_eq!(names.len(), 16, "{names:?}");
    check_all(&names);
    // Without the passes too: the markers are resolved before any pass.
    let mut failures = Vec::new();
    for name in &names {
        let fixture = Fixture::load(name);
        let mut opts = fixture.compile_options();
        opts.opt_level = 0;
        let outputs =
            (fixture.compile_with(&opts)).and_then(|bytes| run_artifact(&bytes, &fixture.inputs()));
        match outputs {
            Ok(outputs) => {
                for (o, r) in outputs.iter().zip(&fixture.reference_outputs()) {
                    let c = kiln_driver::compare::compare(o, r);
                    if !c.passes(FP32_TOLERANCE) {
                        failures.push(format!("{name} -O0: output '{}': {c:?}", c.name));
                    }
                }
            }
            Err(e) => failures.push(format!("{name} -O0: {e}")),
        }
    }
    kiln_tests::assert_no_failures(&failures);
}

/// A run whose data-dependent length passes its bound (a TopK's k larger
/// than its axis) is a typed error naming the output, and the same
/// artifact then runs a k within the bound.
#[test]
fn a_length_past_its_bound_is_a_typed_error() {
    let fixture = Fixture::load("bounded_topk_k4");
    let bytes = fixture.compile_with(&fixture.compile_options()).unwrap();
    let model = kiln_runtime::Model::from_bytes(&bytes).unwrap();
    let mut inputs = fixture.inputs();
    let k = inputs.iter().position(|t| t.name == "k").unwrap();
    for (value, runs) in [(10i64, false), (-1, false), (9, true)] {
        inputs[k].data = value.to_le_bytes().to_vec();
        let views: Vec<_> = inputs.iter().map(kiln_runtime::Tensor::view).collect();
        match model.run(&views) {
            Ok(outputs) if runs => assert_eq!(outputs[0].shape, vec![3, value as u64]),
            Err(e @ kiln_runtime::Error::LengthOutOfBound { .. }) if !runs => {
                let message = e.to_string();
                assert!(
                    message.contains("'scaled'") && message.contains("0..=9"),
                    "{message}"
                );
            }
            other => panic!("k = {value}: {other:?}"),
        }
    }
}

/// A loop whose trip count passes `--max-trip-count` is refused at run
/// time with a typed error naming the loop and the flag; below it, the
/// same artifact runs.
#[test]
fn a_loop_past_its_max_trip_count_is_refused() {
    let fixture = Fixture::load("control_loop_trip_count_3");
    let mut opts = fixture.compile_options();
    opts.max_trip_count = 4;
    let bytes = fixture.compile_with(&opts).unwrap();
    let model = kiln_runtime::Model::from_bytes(&bytes).unwrap();
    let mut inputs = fixture.inputs();
    let trips = |n: i64| kiln_runtime::Tensor {
        name: "M".into(),
        dtype: kiln_runtime::DType::I64,
        shape: Vec::new(),
        data: n.to_le_bytes().to_vec(),
    };
    for (n, runs) in [(4, true), (5, false), (0, false)] {
        let m = inputs.iter().position(|t| t.name == "M").unwrap();
        inputs[m] = trips(n);
        let views: Vec<_> = inputs.iter().map(kiln_runtime::Tensor::view).collect();
        match model.run(&views) {
            Ok(outputs) if runs => {
                let scans = outputs.iter().find(|t| t.name == "scans").unwrap();
                assert_eq!(scans.shape, vec![n as u64, 3]);
            }
            Err(e @ kiln_runtime::Error::VariantRefused { .. }) if !runs => {
                let message = e.to_string();
                let why = match n {
                    0 => "zero iterations",
                    _ => "--max-trip-count 4",
                };
                assert!(message.contains(why), "{message}");
            }
            other => panic!("M={n}: {other:?}"),
        }
    }
}
