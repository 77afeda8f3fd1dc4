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

/// `compile` arguments of a fixture from its meta.json (input shapes, dims,
/// bound inputs) and its inputs as one golden set in `npz`.
fn fixture_args(dir: &Path, npz: &Path) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let mut args = Vec::new();
    let dims_text = |v: &serde_json::Value| {
        let dims: Vec<String> = (v.as_array().unwrap().iter())
            .map(|d| d.as_u64().unwrap().to_string())
            .collect();
        dims.join("x")
    };
    for (name, dims) in meta["input_shapes"].as_object().into_iter().flatten() {
        args.extend([
            "--input-shape".into(),
            format!("{name}={}", dims_text(dims)),
        ]);
    }
    for (name, v) in meta["dims"].as_object().into_iter().flatten() {
        args.extend(["--dim".into(), format!("{name}={v}")]);
    }
    for (name, file) in meta["bind_inputs"].as_object().into_iter().flatten() {
        let path = dir.join(file.as_str().unwrap());
        args.extend(["--bind-input".into(), format!("{name}={}", path.display())]);
    }
    let inputs: Vec<Tensor> = (meta["inputs"].as_array().into_iter().flatten())
        .map(|i| {
            let name = i["name"].as_str().unwrap();
            kiln_driver::npy::read_tensor(name, &dir.join(i["file"].as_str().unwrap())).unwrap()
        })
        .collect();
    write_npz(npz, &inputs).unwrap();
    args.extend(["--golden".into(), npz.display().to_string()]);
    args
}

/// The bar: the self-test of every fixture passes on this machine
/// at every precision with the default tolerances (fitted to what each
/// build departs from the source: a QDQ model's own int8 rounding, a
/// reduced-precision build's error).
#[test]
fn every_fixture_verifies_at_every_precision() {
    let models = common::repo().join("fixtures/models");
    let mut dirs: Vec<PathBuf> = (std::fs::read_dir(&models).unwrap())
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("meta.json").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 100, "found {} fixtures", dirs.len());
    let tmp = tempfile::tempdir().unwrap();
    let precisions: [&[&str]; 6] = [
        &[],
        &["--quantize", "dynamic"],
        &["--quantize", "static", "--calibrate-random", "1"],
        &["--precision", "fp16"],
        &["--precision", "bf16"],
        &["--precision", "mixed"],
    ];
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (dirs, tmp) = (&dirs, tmp.path());
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for dir in dirs.iter().skip(w).step_by(2) {
                        let name = dir.file_name().unwrap().to_string_lossy();
                        let npz = tmp.join(format!("{name}.npz"));
                        let art = tmp.join(format!("{name}.kiln"));
                        let model = dir.join("model.onnx");
                        let mut base: Vec<String> = vec!["compile".into()];
                        base.push(model.display().to_string());
                        base.extend(["-o".into(), art.display().to_string()]);
                        base.extend(fixture_args(dir, &npz));
                        for extra in precisions {
                            let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
                            args.extend_from_slice(extra);
                            let (code, text) = kiln(&args);
                            // Static int8 calibrates one graph: a model
                            // with a path per run-time decision is refused
                            // with the reason.
                            let refused = name.starts_with("control_")
                                && extra.contains(&"static")
                                && code == 2
                                && text.contains("run-time control flow");
                            // The self-test compares whole outputs: one of
                            // data-dependent size is refused with the reason.
                            let refused = refused
                                || (name.starts_with("bounded_")
                                    && code == 2
                                    && text.contains(
                                        "--golden with outputs whose size depends on the data",
                                    ));
                            if refused {
                                continue;
                            }
                            if code != 0 {
                                failures.push(format!("{name} {extra:?}: compile {code}: {text}"));
                                continue;
                            }
                            let (code, text) = kiln(&["verify", art.to_str().unwrap()]);
                            if code != 0 {
                                failures.push(format!("{name} {extra:?}: verify {code}: {text}"));
                            }
                        }
                    }
                    failures
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_quantized_model_and_a_reduced_build_get_tolerances_they_meet() {
    let dir = tempfile::tempdir().unwrap();
    let qdq = common::repo().join("fixtures/models/contrib_cnn_qdq_fused");
    let npz = dir.path().join("x.npz");
    let art = dir.path().join("q.kiln");
    let mut args: Vec<String> = vec![
        "compile".into(),
        qdq.join("model.onnx").display().to_string(),
    ];
    args.extend(["-o".into(), art.display().to_string()]);
    args.extend(fixture_args(&qdq, &npz));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    // An fp32 build of a model quantized elsewhere: the model's own int8
    // rounding sets the tolerance (its u8 values are one step apart from
    // the reference evaluator's at ties).
    let (code, text) = kiln(&argv);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("tolerance 1.5e-1 of each output's scale"),
        "{text}"
    );
    let (code, text) = kiln(&["verify", art.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    // An int8 build departs from the source: a given tolerance it cannot
    // meet stays, with a warning; the default one is fitted, and met.
    let golden = golden_dir(dir.path(), 1, "input", &[4, 64]);
    let strict = compile_mlp(
        dir.path(),
        &golden,
        &["--quantize", "dynamic", "--golden-tolerance", "0"],
    );
    assert_eq!(kiln(&["verify", &strict]).0, 7);
    let text = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=4x64",
        "-o",
        &strict,
        "--golden",
        golden.to_str().unwrap(),
        "--quantize",
        "dynamic",
        "--golden-tolerance",
        "0",
    ])
    .1;
    assert!(text.contains("warning: golden: 'logits'"), "{text}");
    assert!(text.contains("`kiln verify` will fail"), "{text}");
    let fitted = compile_mlp(dir.path(), &golden, &["--quantize", "dynamic"]);
    assert_eq!(kiln(&["verify", &fitted]).0, 0);
}
