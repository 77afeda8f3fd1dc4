//! `kiln compile --target cuda-*`, `kiln inspect` of CUDA artifacts,
//! `--dump-ptx`, and the errors around them (unsupported SM, running a
//! CUDA artifact on the CPU runtime).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs kiln with `KILN_PTXAS` set to `ptxas` (or with no ptxas at all).
fn kiln(args: &[&str], ptxas: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).current_dir(repo());
    match ptxas {
        Some(p) => cmd.env("KILN_PTXAS", p),
        None => cmd.env("KILN_PTXAS", "").env("PATH", "/usr/bin:/bin"),
    };
    let out = cmd.output().expect("kiln runs");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const MODEL: &str = "fixtures/models/digits_cnn/model.onnx";

#[test]
fn cuda_artifact_without_ptxas_holds_ptx_and_every_kernel_is_dumped() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let ptx_dir = dir.path().join("ptx");
    let (code, _, err) = kiln(
        &[
            "compile",
            MODEL,
            "--dim",
            "batch=2",
            "--target",
            "cuda-sm86",
            "-o",
            out.to_str().unwrap(),
            "--dump-ptx",
            ptx_dir.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("no ptxas found"), "{err}");
    let (code, stdout, err) = kiln(&["inspect", out.to_str().unwrap(), "--json"], None);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["arch"], "nvptx64");
    assert_eq!(v["sm"], 86);
    assert_eq!(v["target"], "cuda-sm86");
    assert_eq!(v["cubin_bytes"], 0);
    let kernels = v["kernels"].as_array().unwrap();
    // conv+relu, pool, conv+relu (implicit GEMM), gemm, softmax.
    assert!(kernels.iter().all(|k| k["registers"].is_null()));
    let nodes: Vec<&str> = kernels
        .iter()
        .map(|k| k["node"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes,
        ["conv1+relu1", "pool1", "conv2+relu2", "fc", "softmax"],
        "{v}"
    );
    assert_eq!(kernels[2]["block"], serde_json::json!([16, 16, 1]));
    let mut files: Vec<String> = std::fs::read_dir(&ptx_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files.len(), 5, "{files:?}");
    for f in &files {
        let text = std::fs::read_to_string(ptx_dir.join(f)).unwrap();
        assert!(
            text.contains(".target sm_86") && text.matches(".entry").count() == 1,
            "{f}"
        );
    }
}

#[test]
fn cuda_artifact_with_ptxas_records_registers() {
    let ptxas = Command::new("bash")
        .arg(repo().join("scripts/ptxas.sh"))
        .output()
        .expect("scripts/ptxas.sh");
    assert!(
        ptxas.status.success(),
        "{}",
        String::from_utf8_lossy(&ptxas.stderr)
    );
    let ptxas = String::from_utf8(ptxas.stdout).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let args = [
        "compile",
        MODEL,
        "--dim",
        "batch=2",
        "--target",
        "cuda-sm80",
    ];
    let (code, _, err) = kiln(
        &[&args[..], &["-o", out.to_str().unwrap()]].concat(),
        Some(ptxas.trim()),
    );
    assert_eq!(code, 0, "{err}");
    let (_, stdout, _) = kiln(&["inspect", out.to_str().unwrap(), "--json"], None);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert!(v["cubin_bytes"].as_u64().unwrap() > 0, "{v}");
    for k in v["kernels"].as_array().unwrap() {
        assert!(k["registers"].as_u64().unwrap() > 0, "{k}");
    }
    let (_, text, _) = kiln(&["inspect", out.to_str().unwrap()], None);
    assert!(
        text.contains("CUDA sm_80") && text.contains("regs"),
        "{text}"
    );
}

#[test]
fn unsupported_sm_lists_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let (code, _, err) = kiln(
        &[
            "compile",
            MODEL,
            "--dim",
            "batch=1",
            "--target",
            "cuda-sm61",
            "-o",
            out.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("sm61") && err.contains("sm70, sm75, sm80, sm86, sm89, sm90"),
        "{err}"
    );
}

#[test]
fn the_cpu_runtime_refuses_a_cuda_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let out = out.to_str().unwrap();
    let (code, _, err) = kiln(
        &[
            "compile",
            MODEL,
            "--dim",
            "batch=1",
            "--target",
            "cuda-sm80",
            "-o",
            out,
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = kiln(&["run", out, "--random"], None);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("CUDA artifact (sm_80)") && err.contains("`cuda` feature"),
        "{err}"
    );
}

#[test]
fn dump_ptx_needs_a_cuda_target() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let (code, _, err) = kiln(
        &[
            "compile",
            MODEL,
            "--dim",
            "batch=1",
            "-o",
            out.to_str().unwrap(),
            "--dump-ptx",
            "x",
        ],
        None,
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--dump-ptx needs a CUDA target"), "{err}");
}
