//! The golden self-test end to end: `kiln compile --golden` stores input
//! sets and the source model's outputs, `kiln verify` checks them on this
//! machine (exit 0, or 7 naming the output), `kiln inspect` shows them, and
//! golden data that does not fit the model is refused at compile time.

use kiln_driver::npy::write_npz;
use kiln_format::{Artifact, SectionKind};
use kiln_runtime::Tensor;
use kiln_test_kit::Rng;
use std::path::{Path, PathBuf};

mod common;

use common::kiln;
const MLP: &str = "fixtures/models/digits_mlp/model.onnx";

/// `sets` .npz files of one random `input: f32[4,64]` each, in `dir`.
fn golden_dir(dir: &Path, sets: usize, name: &str, shape: &[u64]) -> PathBuf {
    let golden = dir.join("golden");
    std::fs::create_dir_all(&golden).unwrap();
    let mut rng = Rng::new(31);
    let n: u64 = shape.iter().product();
    for i in 0..sets {
        let values: Vec<f32> = (0..n).map(|_| rng.f64(0.0, 16.0) as f32).collect();
        let t = Tensor::from_f32(name, shape, &values);
        write_npz(&golden.join(format!("set{i}.npz")), &[t]).unwrap();
    }
    golden
}

/// Compiles the digits MLP (`input=4x64`) with `--golden golden` and
/// `extra`; returns the artifact's path.
fn compile_mlp(dir: &Path, golden: &Path, extra: &[&str]) -> String {
    let art = dir.join("mlp.kiln").to_str().unwrap().to_owned();
    let mut args = vec!["compile", MLP, "--input-shape", "input=4x64", "-o", &art];
    args.extend(["--golden", golden.to_str().unwrap()]);
    args.extend_from_slice(extra);
    let (code, text) = kiln(&args);
    assert_eq!(code, 0, "{text}");
    art
}

#[test]
fn the_self_test_passes_here_and_fails_by_output_name_on_changed_weights() {
    let dir = tempfile::tempdir().unwrap();
    let golden = golden_dir(dir.path(), 2, "input", &[4, 64]);
    let art = compile_mlp(dir.path(), &golden, &[]);

    let (code, text) = kiln(&["verify", &art]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("set 1 logits: ok"), "{text}");
    assert!(
        text.contains("verified: 4 golden output(s) of 2 set(s)"),
        "{text}"
    );
    let (code, text) = kiln(&["verify", &art, "--json"]);
    assert_eq!(code, 0, "{text}");
    let report: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["sets"], 2);
    assert_eq!(report["checks"].as_array().unwrap().len(), 4);
    assert_eq!(report["checks"][0]["tolerance"], 1e-4);

    // The weights changed after the build, the checksums recomputed (no
    // signature): the artifact loads, and its self-test names the outputs.
    let mut a = Artifact::parse(&std::fs::read(&art).unwrap()).unwrap();
    for w in a.weights.chunks_exact_mut(4).take(64) {
        let v = f32::from_le_bytes(w.try_into().unwrap());
        w.copy_from_slice(&(v * 1.5 + 0.25).to_le_bytes());
    }
    let tampered = dir.path().join("tampered.kiln");
    std::fs::write(&tampered, a.to_bytes()).unwrap();
    let (code, text) = kiln(&["verify", tampered.to_str().unwrap()]);
    assert_eq!(code, 7, "{text}");
    assert!(text.contains("set 0 logits: FAILED"), "{text}");
    assert!(
        text.contains("golden outputs beyond tolerance on this machine: 'logits' (set 0)"),
        "{text}"
    );
}

/// A kernel that does nothing (`xor eax, eax; ret` at the entry of the
/// first): the outputs are wrong, and the self-test says so.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_wrong_kernel_fails_the_self_test() {
    let dir = tempfile::tempdir().unwrap();
    let golden = golden_dir(dir.path(), 1, "input", &[4, 64]);
    let art = compile_mlp(dir.path(), &golden, &[]);
    let mut a = Artifact::parse(&std::fs::read(&art).unwrap()).unwrap();
    let entry = a.kernels[0].text_offset as usize;
    a.text[entry..entry + 3].copy_from_slice(&[0x31, 0xc0, 0xc3]);
    let broken = dir.path().join("broken.kiln");
    std::fs::write(&broken, a.to_bytes()).unwrap();
    let (code, text) = kiln(&["verify", broken.to_str().unwrap()]);
    assert_eq!(code, 7, "{text}");
    assert!(text.contains("FAILED"), "{text}");
}

#[test]
fn the_golden_section_is_shown_checksummed_and_sized_by_precision() {
    let dir = tempfile::tempdir().unwrap();
    let golden = golden_dir(dir.path(), 1, "input", &[4, 64]);
    for (flags, tolerance) in [
        (&[][..], "1e-4"),
        (&["--precision", "bf16"][..], "5e-2"),
        (&["--quantize", "dynamic"][..], "1.5e-1"),
        (&["--golden-tolerance", "0.003"][..], "3e-3"),
    ] {
        let art = compile_mlp(dir.path(), &golden, flags);
        let (code, text) = kiln(&["inspect", &art]);
        assert_eq!(code, 0, "{text}");
        assert!(
            text.contains(&format!(
                "golden self-test: 1 input set(s), tolerance {tolerance} of each output's scale"
            )),
            "{flags:?}: {text}"
        );
        let (code, text) = kiln(&["verify", &art]);
        assert_eq!(code, 0, "{flags:?}: {text}");
    }
    let art = compile_mlp(dir.path(), &golden, &[]);
    let (code, text) = kiln(&["inspect", &art, "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["golden"]["sets"][0]["inputs"][0]["type"], "f32[4,64]");
    assert_eq!(v["golden"]["tolerances"]["probs"], 1e-4);
    // A changed golden byte breaks its section's checksum.
    let mut bytes = std::fs::read(&art).unwrap();
    let s = kiln_format::read_header(&bytes)
        .unwrap()
        .section(SectionKind::Golden)
        .clone();
    bytes[(s.offset + s.length / 2) as usize] ^= 1;
    let bad = dir.path().join("bad.kiln");
    std::fs::write(&bad, &bytes).unwrap();
    let (code, text) = kiln(&["verify", bad.to_str().unwrap()]);
    assert_eq!(code, 5, "{text}");
    assert!(
        text.contains("checksum mismatch in section GOLDEN"),
        "{text}"
    );
}

#[test]
fn golden_inputs_that_do_not_fit_the_model_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("never.kiln");
    let compile = |golden: &Path, shape: &str| {
        kiln(&[
            "compile",
            MLP,
            "--input-shape",
            shape,
            "-o",
            art.to_str().unwrap(),
            "--golden",
            golden.to_str().unwrap(),
        ])
    };
    let wrong_name = golden_dir(&dir.path().join("a"), 1, "pixels", &[4, 64]);
    let (code, text) = compile(&wrong_name, "input=4x64");
    assert_eq!(code, 6, "{text}");
    assert!(
        text.contains("array 'pixels' is not a model input (inputs: input)"),
        "{text}"
    );
    let wrong_shape = golden_dir(&dir.path().join("b"), 1, "input", &[2, 64]);
    let (code, text) = compile(&wrong_shape, "input=4x64");
    assert_eq!(code, 6, "{text}");
    assert!(
        text.contains("array 'input' is f32[2,64], the model input is f32[4,64]"),
        "{text}"
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, text) = compile(&empty, "input=4x64");
    assert_eq!(code, 6, "{text}");
    assert!(text.contains("no .npz files"), "{text}");
    assert!(!art.exists(), "a failed compile leaves no output");

    let (code, text) = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=4x64",
        "-o",
        art.to_str().unwrap(),
        "--golden-tolerance",
        "0.1",
    ]);
    assert_eq!(code, 2, "--golden-tolerance needs --golden: {text}");
    let plain = dir.path().join("plain.kiln");
    let (code, text) = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=4x64",
        "-o",
        plain.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = kiln(&["verify", plain.to_str().unwrap()]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("has no golden self-test"), "{text}");
}

#[test]
fn calibration_samples_may_serve_as_the_golden_sets() {
    let dir = tempfile::tempdir().unwrap();
    let samples = golden_dir(dir.path(), 3, "input", &[4, 64]);
    let samples = samples.to_str().unwrap();
    let art = dir.path().join("cal.kiln");
    let art = art.to_str().unwrap();
    let (code, text) = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=4x64",
        "-o",
        art,
        "--quantize",
        "static",
        "--calibrate",
        samples,
        "--golden-from-calibration",
        "2",
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("golden self-test: 2 input set(s)"), "{text}");
    assert!(
        text.contains("its inputs: the first 2 calibration sample(s) of"),
        "{text}"
    );
    let (code, text) = kiln(&["verify", art]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("set 1 logits: ok"), "{text}");
    // Not without calibration samples, nor together with --golden.
    let (code, text) = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=4x64",
        "-o",
        art,
        "--golden-from-calibration",
        "2",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--golden-from-calibration needs calibration samples"),
        "{text}"
    );
    let (code, text) = kiln(&[
        "compile",
        MLP,
        "-o",
        art,
        "--golden",
        samples,
        "--golden-from-calibration",
        "2",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("cannot be used with"), "{text}");
}
