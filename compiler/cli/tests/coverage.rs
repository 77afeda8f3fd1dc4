//! Calibration coverage end to end (`kiln compile --quantize static
//! --calibrate DIR --validate DIR2`): a calibration set that misses what
//! the held-out set sends is reported per int8 layer, with a warning naming
//! the layer and the samples; a set that covers it is not; the JSON, text
//! and HTML reports carry the table.

use kiln_driver::npy::{read_tensor, write_npz};
use kiln_runtime::Tensor;
use std::path::{Path, PathBuf};
use std::process::Command;

const DIGITS: &str = "fixtures/models/digits_cnn";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `kiln`; returns (exit code, stdout, stderr).
fn kiln(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("kiln runs");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Four samples of 8 digits each (`input: f32[8,1,8,8]`), from image
/// `first` on, scaled by `scale`, in a new directory `dir/name`.
fn samples(dir: &Path, name: &str, first: usize, scale: f32) -> PathBuf {
    let images = read_tensor("input", &repo().join(DIGITS).join("inputs/input.npy")).unwrap();
    let images = images.to_f32_vec().unwrap();
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for s in 0..4 {
        let start = (first + 8 * s) * 64;
        let v: Vec<f32> = images[start..start + 8 * 64]
            .iter()
            .map(|x| x * scale)
            .collect();
        let t = Tensor::from_f32("input", &[8, 1, 8, 8], &v);
        write_npz(&out.join(format!("s{s}.npz")), &[t]).unwrap();
    }
    out
}

fn compile(dir: &Path, calibrate: &Path, validate: &Path, extra: &[&str]) -> (i32, String, String) {
    let model = format!("{DIGITS}/model.onnx");
    let art = dir.join("int8.kiln");
    let mut args = vec![
        "compile",
        &model,
        "--dim",
        "batch=8",
        "--quantize",
        "static",
        "-o",
        art.to_str().unwrap(),
        "--calibrate",
        calibrate.to_str().unwrap(),
        "--validate",
        validate.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    kiln(&args)
}

#[test]
fn a_narrow_calibration_set_is_reported_by_layer_and_sample() {
    let dir = tempfile::tempdir().unwrap();
    let held_out = samples(dir.path(), "held-out", 200, 1.0);
    // Calibrated on dim images: the held-out digits overshoot every range.
    let narrow = samples(dir.path(), "narrow", 0, 0.05);
    let html = dir.path().join("report.html");
    let (code, out, err) = compile(
        dir.path(),
        &narrow,
        &held_out,
        &["--json", "--report", html.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &report["coverage"];
    assert_eq!(c["samples"], 4);
    let first = &c["layers"][0];
    assert!(first["clipped_share"].as_f64().unwrap() > 0.1, "{c}");
    assert!(first["max_overshoot"].as_f64().unwrap() > 0.0, "{c}");
    assert_eq!(first["warning"], true);
    assert!(!first["samples"].as_array().unwrap().is_empty(), "{c}");
    let node = first["node"].as_str().unwrap();
    assert!(
        err.contains(&format!("warning: int8 layer '{node}': ")) && err.contains("s0.npz"),
        "{err}"
    );
    assert!(err.contains("add such inputs to --calibrate"), "{err}");
    assert!(c["outputs"][0]["argmax_agreement"].is_number(), "{c}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<h2>Calibration coverage</h2>"),
        "the HTML table"
    );

    // Calibrated on other digits of the same kind: covered, no warning at
    // a 5% threshold, and the int8 build agrees with fp32.
    let wide = samples(dir.path(), "wide", 64, 1.0);
    let (code, out, err) = compile(dir.path(), &wide, &held_out, &["--coverage-warn", "5"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning: int8 layer"), "{err}");
    assert!(
        out.contains("calibration coverage on 4 held-out sample(s)"),
        "{out}"
    );
    assert!(out.contains("argmax agreement"), "{out}");
}

#[test]
fn validate_needs_a_calibrated_static_build() {
    let dir = tempfile::tempdir().unwrap();
    let held_out = samples(dir.path(), "held-out", 0, 1.0);
    let model = format!("{DIGITS}/model.onnx");
    let art = dir.path().join("a.kiln");
    let (code, _, err) = kiln(&[
        "compile",
        &model,
        "--dim",
        "batch=8",
        "--quantize",
        "dynamic",
        "-o",
        art.to_str().unwrap(),
        "--validate",
        held_out.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--validate needs a static int8 build"),
        "{err}"
    );
    assert!(!art.exists());
}
