//! The `kiln` command end to end: success paths, and every kind of bad
//! input giving a clear message and its documented exit code.

use kiln_driver::npy::{read_tensor, read_tensor_as, write_tensor};
use kiln_format::{Artifact, CpuFeatures};
use kiln_runtime::Tensor;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kiln(args: &[&str]) -> Outcome {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("kiln runs");
    Outcome {
        code: out.status.code().expect("exit code, not a signal"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `kiln compile` of the digits MLP with `args` is a usage error (exit
/// code 2) whose message contains `needle`.
fn expect_mlp_usage_error(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("m.kiln");
    let mut all = vec!["compile", MLP, "--input-shape", "input=8x64", "-o"];
    all.push(art.to_str().unwrap());
    all.extend_from_slice(args);
    expect_failure(&all, 2, &[needle]);
}

fn expect_failure(args: &[&str], code: i32, needles: &[&str]) {
    let o = kiln(args);
    assert_eq!(o.code, code, "kiln {args:?}: stderr: {}", o.stderr);
    assert!(
        o.stderr.starts_with("error: "),
        "kiln {args:?}: {}",
        o.stderr
    );
    for n in needles {
        assert!(
            o.stderr.contains(n),
            "kiln {args:?}: expected '{n}' in: {}",
            o.stderr
        );
    }
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
}

const MLP: &str = "fixtures/models/digits_mlp/model.onnx";

/// Compiles the digits MLP with batch 1 into `dir`.
fn compile_mlp(dir: &Path) -> PathBuf {
    let out = dir.join("mlp.kiln");
    let o = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=1x64",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

fn mlp_input(dir: &Path) -> PathBuf {
    let path = dir.join("x.npy");
    let values: Vec<f32> = (0..64).map(|i| (i % 17) as f32 / 16.0).collect();
    write_tensor(&path, &Tensor::from_f32("input", &[1, 64], &values)).unwrap();
    path
}

#[test]
fn bad_onnx_files_give_clear_errors() {
    let cases: &[(&str, i32, &[&str])] = &[
        ("truncated.onnx", 3, &["truncated.onnx"]),
        ("not_onnx.onnx", 3, &["not_onnx.onnx"]),
        ("cycle.onnx", 3, &["cycle"]),
        ("missing_initializer.onnx", 3, &["bias", "add_bias"]),
        ("dangling_input.onnx", 3, &["nowhere", "mul_nowhere"]),
        (
            "unsupported_op.onnx",
            4,
            &["Bernoulli", "my_bernoulli", "ai.onnx", "13"],
        ),
        ("unbound_dim.onnx", 4, &["'x'", "batch", "--input-shape"]),
        (
            "wrong_attribute_type.onnx",
            3,
            &["axis", "softmax_bad_axis"],
        ),
        ("shape_mismatch.onnx", 3, &["matmul_bad"]),
        (
            "bounded_mean.onnx",
            4,
            &["'where_nonzero'", "depends on the data", "'mean_of_coords'"],
        ),
        (
            "bounded_shape.onnx",
            4,
            &[
                "Shape of a value whose size depends on the data",
                "shape_of_where",
            ],
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.kiln");
    for (file, code, needles) in cases {
        let path = format!("fixtures/bad/{file}");
        expect_failure(
            &["compile", &path, "-o", out.to_str().unwrap()],
            *code,
            needles,
        );
        assert!(!out.exists(), "{file}: no artifact may be written on error");
    }
}

#[test]
fn missing_model_file_is_an_io_error() {
    expect_failure(
        &[
            "compile",
            "fixtures/does_not_exist.onnx",
            "-o",
            "/tmp/x.kiln",
        ],
        8,
        &["does_not_exist.onnx"],
    );
}

#[test]
fn bad_artifacts_are_rejected_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let good = compile_mlp(dir.path());
    let bytes = std::fs::read(&good).unwrap();
    let input = mlp_input(dir.path());
    let input_arg = format!("input={}", input.display());
    let check = |name: &str, data: Vec<u8>, needles: &[&str]| {
        let path = dir.path().join(name);
        std::fs::write(&path, data).unwrap();
        expect_failure(
            &["run", path.to_str().unwrap(), "--input", &input_arg],
            5,
            needles,
        );
    };

    check("truncated.kiln", bytes[..bytes.len() / 2].to_vec(), &[]);
    let mut flipped = bytes.clone();
    // The last byte of SCHEDULE (the file ends with GOLDEN, empty here).
    let schedule = kiln_format::read_header(&bytes).unwrap().sections[5].clone();
    let last = (schedule.offset + schedule.length - 1) as usize;
    flipped[last] ^= 0x01;
    check("flipped.kiln", flipped, &["checksum"]);
    let mut magic = bytes.clone();
    magic[0] = b'X';
    check("magic.kiln", magic, &["not a Kiln artifact"]);
    let mut version = bytes.clone();
    version[8..12].copy_from_slice(&999u32.to_le_bytes());
    check("version.kiln", version, &["999"]);

    let mut artifact = Artifact::parse(&bytes).unwrap();
    let absent = if cfg!(target_arch = "x86_64") {
        CpuFeatures::NEON
    } else {
        CpuFeatures::AVX512F
    };
    artifact.features |= absent;
    check("features.kiln", artifact.to_bytes(), &["feature"]);

    // An arena no machine can reserve cannot run here: a bad artifact
    // (exit 5), not bad input.
    let mut artifact = Artifact::parse(&bytes).unwrap();
    artifact.profiles[0].arena_size = 1 << 62;
    check("arena.kiln", artifact.to_bytes(), &["arena"]);
}

/// A FIFO where an artifact, its signature or a model should be is
/// refused at once, never waited on.
#[test]
fn fifos_are_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.kiln");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let fifo = fifo.to_str().unwrap();
    expect_failure(&["run", fifo, "--random"], 8, &["FIFO"]);
    expect_failure(&["inspect", fifo], 8, &["FIFO"]);
    expect_failure(&["compile", fifo, "-o", "/tmp/never.kiln"], 8, &["FIFO"]);
    // A signature file that is a FIFO.
    let good = compile_mlp(dir.path());
    let sig = dir.path().join("mlp.kiln.sig");
    let made = Command::new("mkfifo").arg(&sig).status().unwrap();
    assert!(made.success());
    let key = dir.path().join("k.pem");
    let o = kiln(&["keygen", key.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let public = format!("{}.pub", key.display());
    expect_failure(
        &[
            "run",
            good.to_str().unwrap(),
            "--random",
            "--public-key",
            &public,
        ],
        5,
        &["FIFO"],
    );
}

#[test]
fn run_input_errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let art = compile_mlp(dir.path());
    let art = art.to_str().unwrap();
    let good = mlp_input(dir.path());

    expect_failure(&["run", art], 6, &["missing input 'input'", "f32[1,64]"]);
    expect_failure(
        &["run", art, "--input", &format!("inputs={}", good.display())],
        6,
        &["'inputs'", "input"],
    );
    let wrong_shape = dir.path().join("shape.npy");
    write_tensor(
        &wrong_shape,
        &Tensor::from_f32("input", &[2, 64], &[0.0; 128]),
    )
    .unwrap();
    expect_failure(
        &[
            "run",
            art,
            "--input",
            &format!("input={}", wrong_shape.display()),
        ],
        6,
        &["f32[1,64]", "f32[2,64]"],
    );
    let wrong_dtype = dir.path().join("dtype.npy");
    write_tensor(&wrong_dtype, &Tensor::from_i64("input", &[1, 64], &[0; 64])).unwrap();
    expect_failure(
        &[
            "run",
            art,
            "--input",
            &format!("input={}", wrong_dtype.display()),
        ],
        6,
        &["dtype.npy", "holds i64", "'input' is f32", "np.float32"],
    );
    let garbage = dir.path().join("garbage.npy");
    std::fs::write(&garbage, b"not numpy").unwrap();
    expect_failure(
        &[
            "run",
            art,
            "--input",
            &format!("input={}", garbage.display()),
        ],
        6,
        &["garbage.npy"],
    );
}

#[test]
fn run_writes_outputs_and_checks_against_references() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("cls.kiln");
    let m = "fixtures/models/ppocr_cls";
    let o = kiln(&[
        "compile",
        &format!("{m}/model.onnx"),
        "--input-shape",
        "x=1x3x48x192",
        "-o",
        art.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let outdir = dir.path().join("out");
    let o = kiln(&[
        "run",
        art.to_str().unwrap(),
        "--input",
        &format!("x={m}/inputs/x.npy"),
        "--output-dir",
        outdir.to_str().unwrap(),
        "--check",
        &format!("{m}/outputs"),
    ]);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .contains("check save_infer_model/scale_0.tmp_1: ok"),
        "{}",
        o.stdout
    );
    // The output name has a '/', which becomes '_' in the file name.
    let written = read_tensor("y", &outdir.join("save_infer_model_scale_0.tmp_1.npy")).unwrap();
    assert_eq!(written.shape, vec![1, 2]);

    // A wrong reference makes --check fail with exit code 7.
    let wrong = dir.path().join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    write_tensor(
        &wrong.join("save_infer_model_scale_0.tmp_1.npy"),
        &Tensor::from_f32("y", &[1, 2], &[0.5, 0.5]),
    )
    .unwrap();
    let o = kiln(&[
        "run",
        art.to_str().unwrap(),
        "--input",
        &format!("x={m}/inputs/x.npy"),
        "--check",
        wrong.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 7, "{}", o.stderr);
}

#[test]
fn json_outputs_parse() {
    let dir = tempfile::tempdir().unwrap();
    let art = compile_mlp(dir.path());
    let art = art.to_str().unwrap();
    let o = kiln(&["inspect", art, "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["kind"], "artifact");
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!([1, 64]));
    assert!(v["content_sha256"].as_str().unwrap().len() == 64);

    let o = kiln(&[
        "bench", art, "--random", "--runs", "5", "--warmup", "1", "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(v["p50_ms"].as_f64().unwrap() > 0.0);

    let o = kiln(&["inspect", MLP, "--input-shape", "input=1x64", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["kind"], "onnx");
    assert!(v["ir"].as_str().unwrap().contains("gemm"));
}

#[test]
fn compile_json_reports_fuse_stats() {
    let dir = tempfile::tempdir().unwrap();
    let o = kiln(&[
        "compile",
        "fixtures/models/digits_cnn/model.onnx",
        "--dim",
        "batch=1",
        "-o",
        dir.path().join("c.kiln").to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let passes = v["passes"].as_array().unwrap();
    let fuse = passes.iter().find(|p| p["name"] == "fuse").unwrap();
    // conv1+relu1 and conv2+relu2.
    assert_eq!(fuse["fused_nodes"], 4);
    assert_eq!(fuse["fused_kernels"], 2);
    assert_eq!(fuse["summary"], "fused 4 nodes into 2 kernels");
    // One kernel per compute node of the final IR: 13 nodes are 1 input,
    // 6 constants, fused, max_pool, fused, reshape (an alias of its input,
    // no kernel), gemm and softmax.
    let last = passes.last().unwrap();
    assert_eq!(last["name"], "dce");
    let nodes = last["nodes_after"].as_u64().unwrap();
    assert_eq!((nodes, v["kernels"].as_u64().unwrap()), (13, 5));
    // The memory plan: values planned within their sum and at least their
    // peak; the artifact's arena holds them (plus kernel scratch).
    let memory = &v["memory"];
    let bytes = |k: &str| memory[k].as_u64().unwrap();
    assert!(
        bytes("peak_live_bytes") <= bytes("planned_bytes"),
        "{memory}"
    );
    assert!(
        bytes("planned_bytes") < bytes("sum_of_values_bytes"),
        "{memory}"
    );
    assert!(bytes("planned_bytes") <= v["arena_bytes"].as_u64().unwrap());
}

#[test]
fn dump_ir_writes_numbered_files() {
    let dir = tempfile::tempdir().unwrap();
    let dumps = dir.path().join("ir");
    let o = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=1x64",
        "-o",
        dir.path().join("m.kiln").to_str().unwrap(),
        "--dump-ir",
        "all",
        "--dump-dir",
        dumps.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut names: Vec<String> = std::fs::read_dir(&dumps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "00-import.kir",
            "01-fold-constants.kir",
            "02-simplify.kir",
            "03-recognize.kir",
            "04-layout.kir",
            "05-fold-batchnorm.kir",
            "06-flush-subnormals.kir",
            "07-fuse.kir",
            "08-dce.kir"
        ]
    );
    let text = std::fs::read_to_string(dumps.join("08-dce.kir")).unwrap();
    // A dump without full constants parses back unless it elides weights.
    if let Err(e) = kiln_ir::text::parse(&text) {
        assert!(e.to_string().contains("elided"), "{e}");
    }
}

#[test]
fn time_passes_lists_import_every_pass_and_codegen() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.kiln");
    let o = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=1x64",
        "-o",
        out.to_str().unwrap(),
        "--time-passes",
        "--passes",
        "fold-constants,dce",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let phases: Vec<&str> = o
        .stderr
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert_eq!(
        phases,
        ["import", "fold-constants", "dce", "codegen", "total"],
        "{}",
        o.stderr
    );
}

#[test]
fn inspect_renders_the_optimized_graph_for_graphviz() {
    let o = kiln(&[
        "inspect",
        MLP,
        "--input-shape",
        "input=1x64",
        "--format",
        "dot",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.starts_with("digraph kiln {"), "{}", o.stdout);
    assert!(o.stdout.contains("gemm"), "{}", o.stdout);
    assert!(o.stdout.trim_end().ends_with('}'));
    let dir = tempfile::tempdir().unwrap();
    let artifact = compile_mlp(dir.path());
    expect_failure(
        &["inspect", artifact.to_str().unwrap(), "--format", "dot"],
        2,
        &["--format dot", "not an artifact"],
    );
}

#[test]
fn closed_stdout_ends_quietly() {
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let art = compile_mlp(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inspect", art.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before kiln prints, like `kiln inspect | head -0`.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn compile_check_lists_every_blocker_without_compiling() {
    // Unsupported op: listed with op and node, exit 4, nothing written.
    let o = kiln(&["compile", "--check", "fixtures/bad/unsupported_op.onnx"]);
    assert_eq!(o.code, 4, "stderr: {}", o.stderr);
    assert!(
        o.stdout.contains("Bernoulli") && o.stdout.contains("my_bernoulli"),
        "{}",
        o.stdout
    );
    // Unbound dim: named with the flag that binds it.
    let o = kiln(&["compile", "--check", "fixtures/bad/unbound_dim.onnx"]);
    assert_eq!(o.code, 4, "stderr: {}", o.stderr);
    assert!(
        o.stdout.contains("'x'") && o.stdout.contains("batch"),
        "{}",
        o.stdout
    );
    // A model that compiles: exit 0; with --json, machine-readable.
    let o = kiln(&[
        "compile",
        "--check",
        "--json",
        "fixtures/models/ppocr_cls/model.onnx",
        "--input-shape",
        "x=1x3x48x192",
    ]);
    assert_eq!(o.code, 0, "stderr: {}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["ok"], true);
    assert_eq!(v["unsupported"].as_array().map(Vec::len), Some(0));
}

/// `y = Reshape(x, s)` with `x: f32[2,3]` and the target `s: i64[2]` a
/// graph input.
fn reshape_by_input_model(dir: &Path) -> PathBuf {
    use kiln_onnx::pb::{self, tensor_shape_proto::dimension, type_proto};
    use prost::Message;
    let input = |name: &str, elem: i32, dims: &[i64]| pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| pb::tensor_shape_proto::Dimension {
                            value: Some(dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = pb::ModelProto {
        ir_version: 8,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: vec![pb::NodeProto {
                op_type: "Reshape".into(),
                name: "rs".into(),
                input: vec!["x".into(), "s".into()],
                output: vec!["y".into()],
                ..Default::default()
            }],
            input: vec![input("x", 1, &[2, 3]), input("s", 7, &[2])],
            output: vec![pb::ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.join("reshape.onnx");
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

#[test]
fn bind_input_fixes_a_shape_input_at_compile_time() {
    let dir = tempfile::tempdir().unwrap();
    let model = reshape_by_input_model(dir.path());
    let model = model.to_str().unwrap();
    let art = dir.path().join("r.kiln");
    let art = art.to_str().unwrap();

    // Unbound, the error says which input to bind and how.
    expect_failure(
        &["compile", model, "-o", art],
        4,
        &[
            "'rs'",
            "input 1 must be a compile-time constant",
            "--bind-input s=FILE.npy",
        ],
    );

    let target = dir.path().join("s.npy");
    write_tensor(&target, &Tensor::from_i64("s", &[2], &[3, 2])).unwrap();
    let o = kiln(&[
        "compile",
        model,
        "-o",
        art,
        "--bind-input",
        &format!("s={}", target.display()),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);

    // The artifact takes only `x`; the output has the bound shape and
    // x's values in order.
    let x = dir.path().join("x.npy");
    let values: Vec<f32> = (0..6).map(|i| i as f32).collect();
    write_tensor(&x, &Tensor::from_f32("x", &[2, 3], &values)).unwrap();
    let out = dir.path().join("out");
    let o = kiln(&[
        "run",
        art,
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let y = read_tensor("y", &out.join("y.npy")).unwrap();
    assert_eq!(y.shape, vec![3, 2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), values);

    // A value of the wrong type is a usage error naming the input.
    let wrong = dir.path().join("wrong.npy");
    write_tensor(&wrong, &Tensor::from_f32("s", &[2], &[3.0, 2.0])).unwrap();
    expect_failure(
        &[
            "compile",
            model,
            "-o",
            art,
            "--bind-input",
            &format!("s={}", wrong.display()),
        ],
        2,
        &["'s'", "i64", "f32"],
    );
}

#[test]
fn precision_report_is_json_or_a_self_contained_html_page() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("m.kiln");
    let html = dir.path().join("report.html");
    let json_path = dir.path().join("report.json");
    for report in [&html, &json_path] {
        let o = kiln(&[
            "compile",
            MLP,
            "--input-shape",
            "input=8x64",
            "--precision",
            "mixed",
            "--report",
            report.to_str().unwrap(),
            "-o",
            art.to_str().unwrap(),
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.trim_end().ends_with("</html>"));
    // One plotted point per dense layer, coloured by precision, and the
    // layer table in network order with mixed's reasons.
    assert_eq!(page.matches("<circle").count(), 3, "{page}");
    for needle in [
        "<svg",
        "fc0 (fp32)",
        "fc1 (bf16)",
        "fc2 (fp32)",
        "first/last dense layer",
    ] {
        assert!(page.contains(needle), "'{needle}' missing");
    }
    assert!(!page.contains("<script"), "the page must not need scripts");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(v["decisions"].as_array().map(Vec::len), Some(3));
}

#[test]
fn quantize_builds_int8_layers_and_refuses_bad_combinations() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("m.kiln");
    let plan = dir.path().join("plan.json");
    let o = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=8x64",
        "--quantize",
        "dynamic",
        "--emit-plan",
        plan.to_str().unwrap(),
        "--json",
        "-o",
        art.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let decisions = v["precision"]["decisions"].as_array().unwrap();
    assert!(
        decisions.iter().all(|d| d["precision"] == "int8"),
        "{decisions:?}"
    );
    // The plan names int8 and applies back.
    let text = std::fs::read_to_string(&plan).unwrap();
    assert!(text.contains("\"int8\""), "{text}");
    let o = kiln(&[
        "compile",
        MLP,
        "--input-shape",
        "input=8x64",
        "--plan",
        plan.to_str().unwrap(),
        "--activation-type",
        "int8",
        "-o",
        art.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = kiln(&["inspect", art.to_str().unwrap()]);
    assert!(o.stdout.contains("activation_type=int8"), "{}", o.stdout);
    for (args, needle) in [
        (
            &["--quantize", "fancy"][..],
            "invalid value 'fancy' for '--quantize",
        ),
        (
            &["--quantize", "dynamic", "--activation-type", "fp8"][..],
            "invalid value 'fp8' for '--activation-type",
        ),
        (
            &["--precision", "bf16", "--activation-type", "int8"][..],
            "--activation-type applies to int8 layers",
        ),
        (
            &["--quantize", "dynamic", "--precision", "bf16"][..],
            "--quantize sets the precision",
        ),
    ] {
        expect_mlp_usage_error(args, needle);
    }
}

/// A calibrated static build smooths every int8 layer's activation (α
/// 0.5) and corrects its biases (printed, in the JSON per layer) unless
/// told not to, and the options `kiln inspect` prints say so; `--smooth`
/// without int8 layers or samples, or outside [0, 1], is a usage error.
#[test]
fn calibrated_static_builds_smooth_and_correct_biases_unless_told_not_to() {
    let dir = tempfile::tempdir().unwrap();
    let images = read_tensor(
        "input",
        &repo().join(MLP).with_file_name("inputs/input.npy"),
    )
    .unwrap()
    .to_f32_vec()
    .unwrap();
    let calibration = dir.path().join("calibration");
    std::fs::create_dir(&calibration).unwrap();
    for (i, rows) in images.chunks(8 * 64).take(3).enumerate() {
        let t = Tensor::from_f32("input", &[8, 64], rows);
        kiln_driver::npy::write_npz(&calibration.join(format!("s{i}.npz")), &[t]).unwrap();
    }
    let art = dir.path().join("m.kiln");
    let compile = |extra: &[&str]| {
        let mut args = vec![
            "compile",
            MLP,
            "--input-shape",
            "input=8x64",
            "--quantize",
            "static",
            "--calibrate",
            calibration.to_str().unwrap(),
            "-o",
            art.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        kiln(&args)
    };
    let o = compile(&[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for line in ["bias correction: 3 int8 layers", "smoothing: 3 int8 layers"] {
        assert!(o.stdout.contains(line), "{}", o.stdout);
    }
    let o = kiln(&["inspect", art.to_str().unwrap()]);
    assert!(o.stdout.contains("smooth=0.5"), "{}", o.stdout);
    let o = compile(&["--smooth", "0.25", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    for d in v["precision"]["decisions"].as_array().unwrap() {
        assert_eq!(d["precision"], "int8", "{d}");
        assert_eq!(
            d["smoothing_divisors"]["channels"].as_u64().map(|c| c > 0),
            Some(true),
            "{d}"
        );
        assert!(d["bias_correction_max_abs"].as_f64().unwrap() > 0.0, "{d}");
    }
    let o = kiln(&["inspect", art.to_str().unwrap()]);
    assert!(o.stdout.contains("smooth=0.25"), "{}", o.stdout);
    let o = compile(&["--no-bias-correction", "--smooth", "off"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains("bias correction"), "{}", o.stdout);
    assert!(!o.stdout.contains("smoothing"), "{}", o.stdout);
    let o = kiln(&["inspect", art.to_str().unwrap()]);
    assert!(
        o.stdout.contains("bias_correction=off smooth=off"),
        "{}",
        o.stdout
    );
    for (args, needle) in [
        (&["--smooth", "1.5"][..], "'1.5' is neither off nor"),
        (
            &["--precision", "bf16", "--smooth", "0.5"][..],
            "--smooth needs int8 layers",
        ),
        (
            &[
                "--quantize",
                "dynamic",
                "--calibrate-random",
                "0",
                "--smooth",
                "0.5",
            ][..],
            "--smooth needs int8 layers",
        ),
    ] {
        expect_mlp_usage_error(args, needle);
    }
}

/// `kiln inspect` of a CUDA artifact adds each kernel's dynamic and static
/// shared memory without overflowing `u32`.
#[test]
fn inspect_adds_shared_memory_sizes_without_overflow() {
    use kiln_format::{CudaCode, CudaKernel, Metadata, Profile};
    let code = CudaCode {
        sm: 80,
        ptx: ".version 7.0\n".into(),
        cubin: Vec::new(),
        kernels: vec![CudaKernel {
            name: "k0".into(),
            node: "n0".into(),
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: u32::MAX,
            registers: 1,
            spill_bytes: 0,
            static_shared_bytes: u32::MAX,
        }],
        schedule: vec![0],
    };
    let metadata = Metadata {
        compiler_version: "kiln-test".into(),
        target: "cuda-sm80".into(),
        options: String::new(),
        source_sha256: [0; 32],
    };
    let profile = Profile {
        inputs: Vec::new(),
        outputs: Vec::new(),
        arena_size: 16,
        dense_kernels: Vec::new(),
        schedule: Vec::new(),
        role: kiln_format::Role::SHAPES,
        bounded: Vec::new(),
    };
    let artifact = code.into_artifact(metadata, profile, Vec::new());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cuda.kiln");
    std::fs::write(&path, artifact.to_bytes()).unwrap();
    let o = kiln(&["inspect", path.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains(&(2 * u64::from(u32::MAX)).to_string()),
        "{}",
        o.stdout
    );
}

/// An ONNX model `y = Cast(x, to)` with `x` of ONNX element type `from`
/// and shape `[4]`.
fn cast_model(dir: &Path, from: i32, to: i32) -> PathBuf {
    use kiln_onnx::pb::{self, tensor_shape_proto::dimension, type_proto};
    use prost::Message;
    let value = |name: &str, elem: i32| pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: elem,
                shape: Some(pb::TensorShapeProto {
                    dim: vec![pb::tensor_shape_proto::Dimension {
                        value: Some(dimension::Value::DimValue(4)),
                        ..Default::default()
                    }],
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let model = pb::ModelProto {
        ir_version: 9,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 19,
        }],
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: vec![pb::NodeProto {
                op_type: "Cast".into(),
                name: "cast".into(),
                input: vec!["x".into()],
                output: vec!["y".into()],
                attribute: vec![pb::AttributeProto {
                    name: "to".into(),
                    r#type: pb::attribute_proto::AttributeType::Int as i32,
                    i: to as i64,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            input: vec![value("x", from)],
            output: vec![value("y", to)],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.join(format!("cast_{from}_{to}.onnx"));
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

/// Compiles `model` into `dir` and runs it on the `.npy` file `x`, writing
/// its output to `dir/out`.
fn compile_and_run(dir: &Path, model: &Path, x: &Path) -> Outcome {
    let art = dir.join("cast.kiln");
    let o = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    kiln(&[
        "run",
        art.to_str().unwrap(),
        "--input",
        &format!("x={}", x.display()),
        "--output-dir",
        dir.join("out").to_str().unwrap(),
    ])
}

/// `bytes` as `[4]` of `dtype`, named `x`.
fn raw_tensor(dtype: kiln_runtime::DType, bytes: Vec<u8>) -> Tensor {
    Tensor {
        name: "x".into(),
        dtype,
        shape: vec![4],
        data: bytes,
    }
}

#[test]
fn half_precision_inputs_and_outputs_cross_the_cli() {
    use kiln_runtime::DType;
    const FLOAT: i32 = 1;
    const FLOAT16: i32 = 10;
    const BFLOAT16: i32 = 16;
    // Values every type here holds exactly.
    let values = [0.5f32, -1.25, 3.0, 96.0];
    let f16_bits: Vec<u8> = (values.iter())
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let bf16_bits: Vec<u8> = (values.iter())
        .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
        .collect();
    let f32_out = |dir: &Path| {
        let y = read_tensor_as("y", &dir.join("out/y.npy"), DType::F32).unwrap();
        y.to_f32_vec().unwrap()
    };

    // float16 as numpy's `<f2`.
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    write_tensor(&x, &raw_tensor(DType::F16, f16_bits.clone())).unwrap();
    assert!(String::from_utf8_lossy(&std::fs::read(&x).unwrap()).contains("'<f2'"));
    let o = compile_and_run(dir.path(), &cast_model(dir.path(), FLOAT16, FLOAT), &x);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(f32_out(dir.path()), values);

    // bfloat16 as the raw `V2` elements numpy saves for ml_dtypes.bfloat16,
    // and as its bits in `<u2`.
    let bits_u16: Vec<u16> = (bf16_bits.chunks(2))
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    for file in [
        raw_tensor(DType::BF16, bf16_bits.clone()),
        Tensor::from_slice("x", &[4], &bits_u16),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let x = dir.path().join("x.npy");
        write_tensor(&x, &file).unwrap();
        let model = cast_model(dir.path(), BFLOAT16, FLOAT);
        let o = compile_and_run(dir.path(), &model, &x);
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert_eq!(f32_out(dir.path()), values);
    }

    // A bfloat16 output is written as `|V2`, its bits unchanged.
    let dir = tempfile::tempdir().unwrap();
    let x = dir.path().join("x.npy");
    write_tensor(&x, &Tensor::from_f32("x", &[4], &values)).unwrap();
    let o = compile_and_run(dir.path(), &cast_model(dir.path(), FLOAT, BFLOAT16), &x);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let y = dir.path().join("out/y.npy");
    assert!(String::from_utf8_lossy(&std::fs::read(&y).unwrap()).contains("V2'"));
    let back = read_tensor_as("y", &y, DType::BF16).unwrap();
    assert_eq!((back.dtype, back.data), (DType::BF16, bf16_bits));

    // A file of another type names both types.
    let o = compile_and_run(dir.path(), &cast_model(dir.path(), FLOAT16, FLOAT), &x);
    assert_eq!(o.code, 6, "{}", o.stderr);
    for needle in ["x.npy", "holds f32", "'x' is f16", "float16"] {
        assert!(o.stderr.contains(needle), "{needle}: {}", o.stderr);
    }
}

#[test]
fn an_output_that_cannot_be_written_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let art = compile_mlp(dir.path());
    let x = mlp_input(dir.path());
    // The output's file name is taken by a directory: the rename fails.
    let out = dir.path().join("out");
    std::fs::create_dir_all(out.join("logits.npy")).unwrap();
    let o = kiln(&[
        "run",
        art.to_str().unwrap(),
        "--input",
        &format!("input={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(o.stderr.contains("logits.npy"), "{}", o.stderr);
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["logits.npy"], "only the directory that was there");
    assert!(out.join("logits.npy").is_dir());
}

/// Progress bars are for a person at a terminal: a calibrated build whose
/// stderr is a pipe (as here, and in every build pipeline) writes none,
/// with or without `--json`.
#[test]
fn no_progress_bars_into_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("m.kiln");
    for json in [false, true] {
        let mut args = vec!["compile", MLP, "--input-shape", "input=8x64", "-o"];
        args.push(art.to_str().unwrap());
        args.extend(["--quantize", "static", "--calibrate-random", "2"]);
        if json {
            args.push("--json");
        }
        let o = kiln(&args);
        assert_eq!(o.code, 0, "{}", o.stderr);
        for stage in [
            "importing",
            "optimizing",
            "observing",
            "generating code",
            "\u{1b}[",
        ] {
            assert!(!o.stderr.contains(stage), "{stage:?} in {:?}", o.stderr);
        }
    }
}

/// Every enumerated flag's values are listed by `--help`, from the same
/// parser that accepts them.
#[test]
fn help_lists_the_values_of_enumerated_flags() {
    let o = kiln(&["compile", "--help"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for listed in [
        "[possible values: fp32, bf16, fp16, int8, mixed]",
        "- static:",
        "- dynamic:",
        "- uint8: asymmetric per tensor",
    ] {
        assert!(o.stdout.contains(listed), "{listed} not in:\n{}", o.stdout);
    }
}
