//! `kiln debug` end to end: every kept value compared with the reference
//! evaluator or with dumped values (the first one beyond tolerance named
//! with its node), `--bisect-passes` naming a pass broken on purpose
//! (`KILN_BREAK_PASS`, debug builds only: `kiln_passes::fault`), and
//! `kiln compile --keep-values` recorded and changing no output value.

use kiln_driver::npy;
use std::path::Path;

mod common;

use common::{kiln, kiln_with_env};

const CNN: &str = "fixtures/models/digits_cnn/model.onnx";
const BATCH: [&str; 2] = ["--dim", "batch=4"];

fn debug_cnn(env: &[(&str, &str)], extra: &[&str]) -> (i32, String) {
    let mut args = vec!["debug", CNN, "--random"];
    args.extend(BATCH);
    args.extend_from_slice(extra);
    kiln_with_env(env, &args)
}

#[test]
fn every_value_of_a_correct_build_is_within_tolerance() {
    let (code, text) = debug_cnn(&[], &["--verbose"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("compared 9 of 9 values"), "{text}");
    assert!(text.contains("relu1: ok"), "{text}");
    assert!(text.contains("every value is within tolerance"), "{text}");
    let (code, text) = debug_cnn(&[], &["--bisect-passes"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("nothing to bisect"), "{text}");
}

#[test]
fn the_bisection_names_the_pass_broken_on_purpose() {
    // Two different passes, so the answer is not a fixed one.
    for pass in ["fold-batchnorm", "fuse"] {
        let (code, text) = debug_cnn(&[("KILN_BREAK_PASS", pass)], &["--bisect-passes"]);
        assert_eq!(code, 7, "{text}");
        assert!(
            text.contains(&format!("pass '{pass}' makes the outputs depart")),
            "{text}"
        );
        assert!(
            text.contains("the whole pipeline without it matches"),
            "{text}"
        );
        let (code, text) = debug_cnn(&[("KILN_BREAK_PASS", pass)], &["--bisect-passes", "--json"]);
        assert_eq!(code, 7, "{text}");
        let line = text.lines().next().unwrap();
        let report: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(report["culprit"]["pass"], pass, "{text}");
        assert_eq!(report["culprit"]["removal_matches"], true, "{text}");
    }
}

#[test]
fn the_value_comparison_names_the_first_value_off_and_its_node() {
    // `fuse` scales the largest weights it sees: with every value kept,
    // the BatchNorm is not folded and the largest are the classifier's.
    let env = [("KILN_BREAK_PASS", "fuse")];
    let (code, text) = debug_cnn(&env, &[]);
    assert_eq!(code, 7, "{text}");
    assert!(
        text.contains("first value beyond tolerance: logits: FAILED"),
        "{text}"
    );
    assert!(text.contains("computed by node 'fc' (gemm)"), "{text}");
    assert!(text.contains("reads flat: ok"), "{text}");
    let (code, text) = debug_cnn(&env, &["--json"]);
    assert_eq!(code, 7, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(report["first_failure"], "logits");
    assert_eq!(report["failed"], 2, "logits and the probabilities after it");
    assert_eq!(report["values"][0]["value"], "conv1", "source order");
}

/// Runs `artifact` on `--random` inputs; the outputs by file name.
fn run_outputs(artifact: &str, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let out = dir.to_str().unwrap();
    let (code, text) = kiln(&["run", artifact, "--random", "--output-dir", out]);
    assert_eq!(code, 0, "{text}");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

fn compile_cnn(out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["compile", CNN, "-o", out.to_str().unwrap()];
    args.extend(BATCH);
    args.extend_from_slice(extra);
    kiln(&args)
}

#[test]
fn kept_values_are_recorded_and_change_no_output_value() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.kiln");
    let kept = dir.path().join("kept.kiln");
    assert_eq!(compile_cnn(&plain, &[]).0, 0);
    let (code, text) = compile_cnn(&kept, &["--keep-values", "relu*"]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = kiln(&["inspect", kept.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("keep_values=relu*"), "{text}");
    assert!(text.contains("output relu1: f32[4,8,8,8]"), "{text}");
    assert!(text.contains("output relu2: f32[4,16,4,4]"), "{text}");
    assert!(!text.contains("output conv1"), "{text}");

    let base = run_outputs(plain.to_str().unwrap(), &dir.path().join("a"));
    let with = run_outputs(kept.to_str().unwrap(), &dir.path().join("b"));
    // The ReLUs are the fused convolutions' last op: keeping them stops no
    // rewrite, and the model's outputs are the same bits.
    for (name, bytes) in &base {
        let other = with.iter().find(|(n, _)| n == name).expect("same outputs");
        assert_eq!(bytes, &other.1, "{name}");
    }
    assert_eq!(with.len(), base.len() + 2);

    // Every value kept: the BatchNorm's value is one, so it is no longer
    // folded into the convolution's weights, and the outputs round
    // differently, within f32 rounding of the plain build's.
    let all = dir.path().join("all.kiln");
    assert_eq!(compile_cnn(&all, &["--keep-values", "all"]).0, 0);
    let every = run_outputs(all.to_str().unwrap(), &dir.path().join("c"));
    for (name, _) in &base {
        let read = |d: &str| {
            let path = dir.path().join(d).join(name);
            npy::read_tensor(name, &path).unwrap()
        };
        let check = kiln_driver::compare::compare(&read("c"), &read("a"));
        assert!(check.passes(1e-6), "{name}: {check:?}");
    }
    assert_eq!(every.len(), 9);
}

#[test]
fn a_keep_values_pattern_naming_nothing_is_refused_without_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.kiln");
    let (code, text) = compile_cnn(&out, &["--keep-values", "no_such_value*"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--keep-values no_such_value* names no computed value"),
        "{text}"
    );
    assert!(
        text.contains("'conv1'"),
        "the hint lists value names: {text}"
    );
    assert!(!out.exists());
}

#[test]
fn dumped_reference_values_are_compared_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // The true values of conv1 and relu1, as a correct build computes them.
    let art = dir.path().join("kept.kiln");
    let (code, text) = compile_cnn(&art, &["--keep-values", "conv1,relu1"]);
    assert_eq!(code, 0, "{text}");
    let values = dir.path().join("values");
    let outputs = run_outputs(art.to_str().unwrap(), &values);
    assert!(outputs.iter().any(|(n, _)| n == "relu1.npy"));
    // relu1's reference is off by 1 in one element.
    let relu1 = values.join("relu1.npy");
    let mut t = npy::read_tensor("relu1", &relu1).unwrap();
    let mut v = t.to_vec::<f32>().unwrap();
    v[5] += 1.0;
    t.data = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    npy::write_tensor(&relu1, &t).unwrap();
    let index = r#"{"values": {"conv1": "conv1.npy", "relu1": "relu1.npy"}}"#;
    std::fs::write(values.join("values.json"), index).unwrap();

    let dir_arg = values.to_str().unwrap();
    let (code, text) = debug_cnn(&[], &["--reference", dir_arg, "--verbose"]);
    assert_eq!(code, 7, "{text}");
    assert!(text.contains("compared 2 of 9 values"), "{text}");
    assert!(text.contains("conv1: ok"), "{text}");
    assert!(text.contains("pool1: no reference"), "{text}");
    assert!(
        text.contains("first value beyond tolerance: relu1: FAILED"),
        "{text}"
    );
    // relu1 reads the BatchNorm's value, which has no reference here.
    assert!(text.contains("reads bn1\n"), "{text}");

    // A file outside the directory is refused.
    std::fs::write(
        values.join("values.json"),
        r#"{"values": {"conv1": "../conv1.npy"}}"#,
    )
    .unwrap();
    let (code, text) = debug_cnn(&[], &["--reference", dir_arg]);
    assert_eq!(code, 6, "{text}");
    assert!(text.contains("must be a name inside"), "{text}");
}
