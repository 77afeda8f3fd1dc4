//! `kiln compile --verify-reproducible` on every fixture model: a second
//! compilation in a separate process (another working directory and thread
//! count) gives byte-identical artifacts; `kiln inspect` prints the content
//! hash.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `--input-shape` arguments from a fixture's meta.json.
fn shape_args(dir: &Path) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let mut args = Vec::new();
    if let Some(shapes) = meta["input_shapes"].as_object() {
        for (name, dims) in shapes {
            let dims: Vec<String> = dims
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap().to_string())
                .collect();
            args.push("--input-shape".to_string());
            args.push(format!("{name}={}", dims.join("x")));
        }
    }
    args
}

#[test]
fn every_fixture_compiles_reproducibly() {
    let models = repo().join("fixtures/models");
    let mut names: Vec<String> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() > 100, "found {} fixtures", names.len());
    let out = tempfile::tempdir().unwrap();
    let start = std::time::Instant::now();
    // Fixtures in chunks, one `kiln` (plus its child) per fixture, a few at
    // a time.
    let workers = 4;
    let chunks: Vec<Vec<String>> = (0..workers)
        .map(|w| names.iter().skip(w).step_by(workers).cloned().collect())
        .collect();
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let (models, out) = (&models, out.path());
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for name in chunk {
                        let dir = models.join(name);
                        let artifact = out.join(format!("{name}.kiln"));
                        let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
                            .arg("compile")
                            .arg(dir.join("model.onnx"))
                            .arg("-o")
                            .arg(&artifact)
                            .args(shape_args(&dir))
                            .arg("--verify-reproducible")
                            .output()
                            .unwrap();
                        let stdout = String::from_utf8_lossy(&o.stdout);
                        if !o.status.success() || !stdout.contains("reproducible: ") {
                            failures.push(format!(
                                "{name}: {}: {}{}",
                                o.status,
                                stdout,
                                String::from_utf8_lossy(&o.stderr)
                            ));
                        }
                    }
                    failures
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    println!(
        "{} fixtures verified reproducible in {:.1} s",
        names.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn inspect_prints_the_content_hash_compile_reports() {
    let out = tempfile::tempdir().unwrap();
    let artifact = out.path().join("mlp.kiln");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(repo())
        .args([
            "compile",
            "fixtures/models/digits_mlp/model.onnx",
            "--input-shape",
            "input=1x64",
            "--verify-reproducible",
            "--json",
            "-o",
        ])
        .arg(&artifact)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(summary["reproducible"], true);
    let hash = summary["content_sha256"].as_str().unwrap().to_string();
    assert_eq!(hash.len(), 64);

    let bytes = std::fs::read(&artifact).unwrap();
    let header = kiln_format::read_header(&bytes).unwrap();
    let hex: String = header
        .content_hash
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(hex, hash);

    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("inspect")
        .arg(&artifact)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(&format!("content sha256 {hash}")), "{text}");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inspect", "--json"])
        .arg(&artifact)
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["content_sha256"], hash.as_str());
}

#[test]
fn first_difference_names_offset_and_section() {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(repo())
        .args([
            "compile",
            "fixtures/models/digits_mlp/model.onnx",
            "--input-shape",
            "input=1x64",
            "-o",
        ])
        .arg(std::env::temp_dir().join(format!("kiln-fd-{}.kiln", std::process::id())))
        .output()
        .unwrap();
    assert!(o.status.success());
    let path = std::env::temp_dir().join(format!("kiln-fd-{}.kiln", std::process::id()));
    let a = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let header = kiln_format::read_header(&a).unwrap();
    assert_eq!(kiln_driver::first_difference(&a, &a), None);

    let weights = header.section(kiln_format::SectionKind::Weights);
    let mut b = a.clone();
    b[weights.offset as usize + 5] ^= 1;
    let (offset, region) = kiln_driver::first_difference(&a, &b).unwrap();
    assert_eq!(offset, weights.offset + 5);
    assert!(
        region.contains("WEIGHTS") && region.contains("+5"),
        "{region}"
    );

    let mut c = a.clone();
    c[40] ^= 1;
    let (offset, region) = kiln_driver::first_difference(&a, &c).unwrap();
    assert_eq!(offset, 40);
    assert!(region.contains("content hash"), "{region}");

    let profiles = header.section(kiln_format::SectionKind::Profiles);
    let end = (profiles.offset + profiles.length) as usize;
    let (offset, region) = kiln_driver::first_difference(&a, &a[..end - 1]).unwrap();
    assert_eq!(offset as usize, end - 1);
    assert!(region.contains("PROFILES"), "{region}");
}

/// The second build repeats every flag that decides the artifact, not only
/// the shapes: a calibrated static int8 build with smoothing, an fp32
/// pattern and relative paths (the second build runs in another working
/// directory) verifies, and its options are the first build's.
#[test]
fn verify_reproducible_repeats_precision_and_calibration_flags() {
    let dir = tempfile::tempdir().unwrap();
    let mlp = repo().join("fixtures/models/digits_mlp");
    let images = kiln_driver::npy::read_tensor("input", &mlp.join("inputs/input.npy"))
        .unwrap()
        .to_f32_vec()
        .unwrap();
    std::fs::create_dir(dir.path().join("calibration")).unwrap();
    for (i, rows) in images.chunks(8 * 64).take(2).enumerate() {
        let t = kiln_runtime::Tensor::from_f32("input", &[8, 64], rows);
        let path = dir.path().join(format!("calibration/s{i}.npz"));
        kiln_driver::npy::write_npz(&path, &[t]).unwrap();
    }
    std::fs::copy(mlp.join("model.onnx"), dir.path().join("mlp.onnx")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .current_dir(dir.path())
        .args([
            "compile",
            "mlp.onnx",
            "-o",
            "mlp.kiln",
            "--input-shape=input=8x64",
        ])
        .args(["--quantize", "static", "--calibrate", "calibration"])
        .args(["--smooth=0.25", "--observer", "percentile=99.9"])
        .args(["--activation-type", "s8", "-O1", "--threads", "2"])
        .arg("--verify-reproducible")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && stdout.contains("reproducible: "),
        "{}: {stdout}{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let bytes = std::fs::read(dir.path().join("mlp.kiln")).unwrap();
    let options = kiln_format::ArtifactView::parse(&bytes)
        .unwrap()
        .into_artifact()
        .metadata
        .options;
    for part in [
        "opt_level=1",
        "threads=2",
        "precision=int8",
        "quantize=static observer=percentile=99.9",
        "activation_type=int8",
        "smooth=0.25",
    ] {
        assert!(options.contains(part), "{part} not in {options}");
    }
}
