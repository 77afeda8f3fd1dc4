//! Shape profiles: `kiln compile --dim batch=1,7,360` puts one
//! specialization per value into one artifact over one weights section; a
//! run's input shapes pick the profile. Each profile's outputs equal, bit
//! for bit, those of an artifact compiled for that shape alone, and match
//! onnxruntime's reference; shapes no profile has are refused, naming the
//! profiles.

use kiln_driver::npy::{read_tensor, write_tensor};
use kiln_format::Artifact;
use kiln_runtime::{Error, Model, Tensor};
use std::path::{Path, PathBuf};

mod common;

use common::{kiln, repo};

const CNN: &str = "fixtures/models/digits_cnn";

/// The first `rows` rows of a `[N, ...]` f32 tensor.
fn rows(t: &Tensor, rows: u64) -> Tensor {
    let per: u64 = t.shape[1..].iter().product();
    let mut shape = t.shape.clone();
    shape[0] = rows;
    Tensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape,
        data: t.data[..(rows * per * 4) as usize].to_vec(),
    }
}

/// `kiln compile` of the digits CNN with `flags` into `dir/name`, which
/// must succeed; the artifact's path and what the command printed.
fn compile_cnn(dir: &Path, name: &str, flags: &[&str]) -> (PathBuf, String) {
    let out = dir.join(name);
    let model = repo().join(CNN).join("model.onnx");
    let mut args = vec![
        "compile",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let (code, text) = kiln(&args);
    assert_eq!(code, 0, "{text}");
    (out, text)
}

/// The digits CNN compiled with `--dim DIMS`, loaded.
fn compile(dir: &Path, name: &str, dims: &str) -> Model {
    Model::load(compile_cnn(dir, name, &["--dim", dims]).0).unwrap()
}

#[test]
fn each_profile_equals_its_single_shape_artifact_and_onnxruntime() {
    let dir = tempfile::tempdir().unwrap();
    let input = read_tensor("input", &repo().join(CNN).join("inputs/input.npy")).unwrap();
    let reference = read_tensor("logits", &repo().join(CNN).join("outputs/logits.npy")).unwrap();
    let many = compile(dir.path(), "many.kiln", "batch=1,7,360");
    assert_eq!(many.profiles().len(), 3);
    let shapes: Vec<u64> = many
        .profiles()
        .iter()
        .map(|p| p.inputs[0].shape[0])
        .collect();
    assert_eq!(shapes, [1, 7, 360]);
    assert_eq!(
        many.arena_size(),
        many.profiles().iter().map(|p| p.arena_size).max().unwrap()
    );
    let mut session = many.session().unwrap();
    for batch in [360u64, 1, 7] {
        let x = rows(&input, batch);
        let single = compile(
            dir.path(),
            &format!("b{batch}.kiln"),
            &format!("batch={batch}"),
        );
        let want = single.run(&[x.view()]).unwrap();
        // The model's cached arena and a session's, in either order.
        for got in [
            many.run(&[x.view()]).unwrap(),
            session.run(&[x.view()]).unwrap(),
        ] {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.shape, w.shape, "batch {batch}");
                assert_eq!(g.data, w.data, "batch {batch}: {} differs", g.name);
            }
            let logits = got[0].to_f32_vec().unwrap();
            let expected = rows(&reference, batch).to_f32_vec().unwrap();
            let scale = expected.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = (logits.iter().zip(&expected))
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-4 * scale, "batch {batch}: {worst} of {scale}");
        }
    }
    // A shape no profile has: the error names it and lists the profiles.
    let x = rows(&input, 5);
    let err = many.run(&[x.view()]).unwrap_err();
    assert!(matches!(err, Error::NoProfile { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("input: f32[5,1,8,8]") && text.contains("[input: f32[360,1,8,8]]"),
        "{text}"
    );
    assert_eq!(many.profile_for(&[rows(&input, 7).view()]).unwrap(), 1);
}

#[test]
fn the_weights_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let (single, _) = compile_cnn(dir.path(), "one.kiln", &["--dim", "batch=1"]);
    let (many, _) = compile_cnn(dir.path(), "many.kiln", &["--dim", "batch=1..64:9"]);
    let one = Artifact::parse(&std::fs::read(&single).unwrap()).unwrap();
    let all = Artifact::parse(&std::fs::read(&many).unwrap()).unwrap();
    // 1..64:9 is 1, 10, ..., 64: eight profiles.
    assert_eq!(all.profiles.len(), 8);
    assert_eq!(all.weights.len(), one.weights.len());
}

#[test]
fn cli_tools_pick_the_profile_from_the_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let (art, text) = compile_cnn(dir.path(), "m.kiln", &["--dim", "batch=1,4"]);
    let art_s = art.to_str().unwrap();
    assert!(text.contains("2 profiles (batch=1; batch=4)"), "{text}");
    let (code, text) = kiln(&["inspect", art_s]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("profiles: 2"), "{text}");
    assert!(
        text.contains("#1   input: f32[4,1,8,8] -> logits: f32[4,10]"),
        "{text}"
    );
    // `run` with a file of batch 4 runs profile 1 and writes [4,10].
    let input = read_tensor("input", &repo().join(CNN).join("inputs/input.npy")).unwrap();
    let x = dir.path().join("x.npy");
    write_tensor(&x, &rows(&input, 4)).unwrap();
    let out = dir.path().join("out");
    let (code, text) = kiln(&[
        "run",
        art_s,
        "--input",
        &format!("input={}", x.display()),
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let logits = read_tensor("logits", &out.join("logits.npy")).unwrap();
    assert_eq!(logits.shape, [4, 10]);
    // `bench --random --shape` times one profile; a shape of none is
    // refused with the list.
    let (code, text) = kiln(&[
        "bench",
        art_s,
        "--random",
        "--shape",
        "input=4x1x8x8",
        "--runs",
        "2",
        "--warmup",
        "0",
    ]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = kiln(&[
        "bench",
        art_s,
        "--random",
        "--shape",
        "input=3x1x8x8",
        "--runs",
        "2",
    ]);
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("profile 1: input: f32[4,1,8,8]"), "{text}");
}

#[test]
fn profile_flags_are_checked() {
    let model = repo().join(CNN).join("model.onnx");
    let model = model.to_str().unwrap();
    for (dims, why) in [
        ("batch=4..1", "is empty"),
        ("batch=0,1", "not a positive number"),
        ("batch=1,1", "given twice"),
        ("batch=1..100000", "more than 256 values"),
    ] {
        let (code, text) = kiln(&["compile", model, "--dim", dims, "-o", "/dev/null"]);
        assert_eq!(code, 2, "{dims}: {text}");
        assert!(text.contains(why), "{dims}: {text}");
    }
    // A static int8 build calibrates on samples of one shape.
    let (code, text) = kiln(&[
        "compile",
        model,
        "--dim",
        "batch=1,2",
        "--quantize",
        "static",
        "--calibrate-random",
        "4",
        "-o",
        "/dev/null",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--quantize static builds one profile"),
        "{text}"
    );
}

#[test]
fn padded_runs_equal_exact_runs_on_the_real_rows() {
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--dim", "batch=1,8,32", "--pad-dim", "batch"];
    let (padded, text) = compile_cnn(dir.path(), "padded.kiln", &flags);
    assert!(
        text.contains("runs may pad batch up to the next profile"),
        "{text}"
    );
    let (_, text) = kiln(&["inspect", padded.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(v["padding"][0]["dim"], "batch");
    assert_eq!(v["padding"][0]["output_axes"], serde_json::json!([0, 0]));
    let (_, text) = kiln(&["inspect", padded.to_str().unwrap()]);
    assert!(
        text.contains("paddable dim batch: input input axis 0; outputs cut along output logits axis 0, output probs axis 0"),
        "{text}"
    );
    let padded = Model::load(&padded).unwrap();
    assert_eq!(padded.paddable_dims().len(), 1);
    let input = read_tensor("input", &repo().join(CNN).join("inputs/input.npy")).unwrap();
    let mut session = padded.session_with_threads(2).unwrap();
    for rows_given in [5u64, 2, 31, 8] {
        let x = rows(&input, rows_given);
        let exact = compile(
            dir.path(),
            &format!("e{rows_given}.kiln"),
            &format!("batch={rows_given}"),
        );
        let want = exact.run(&[x.view()]).unwrap();
        let shapes = padded.output_shapes(&[x.view()]).unwrap();
        assert_eq!(shapes, [vec![rows_given, 10], vec![rows_given, 10]]);
        let got = session.run(&[x.view()]).unwrap();
        // Into caller buffers of the run's size, through the model's arena.
        let mut bufs: Vec<Vec<u8>> = want.iter().map(|t| vec![0; t.data.len()]).collect();
        let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        padded.run_into(&[x.view()], &mut outs).unwrap();
        for ((g, w), b) in got.iter().zip(&want).zip(&bufs) {
            assert_eq!(g.shape, w.shape, "{rows_given} rows");
            assert_eq!(&g.data, b, "{rows_given} rows: {}", g.name);
            // Rows are computed alone, so the padded profile's real rows
            // are bit for bit the exact build's.
            assert_eq!(g.data, w.data, "{rows_given} rows: {}", g.name);
        }
    }
    // Larger than every profile: refused, listing them.
    let err = padded.run(&[rows(&input, 33).view()]).unwrap_err();
    assert!(matches!(err, Error::NoProfile { .. }), "{err:?}");
}

/// A model of one input `x` (f32, `dims`: a name is symbolic, a number
/// fixed), the ONNX `nodes` (opset 15) and one output `y`, written to
/// `dir/file`.
fn one_input_model(
    dir: &Path,
    file: &str,
    dims: &[&str],
    nodes: Vec<kiln_onnx::pb::NodeProto>,
) -> std::path::PathBuf {
    use kiln_onnx::pb::{self, tensor_shape_proto::dimension, type_proto};
    use prost::Message;
    let dim = |d: &&str| pb::tensor_shape_proto::Dimension {
        value: Some(match d.parse::<i64>() {
            Ok(v) => dimension::Value::DimValue(v),
            Err(_) => dimension::Value::DimParam(d.to_string()),
        }),
        ..Default::default()
    };
    let x = pb::ValueInfoProto {
        name: "x".into(),
        r#type: Some(pb::TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: 1,
                shape: Some(pb::TensorShapeProto {
                    dim: dims.iter().map(dim).collect(),
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
            version: 15,
        }],
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: nodes,
            input: vec![x],
            output: vec![pb::ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let path = dir.join(file);
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    path
}

/// An ONNX node `op` named `name`, with integer attributes `ints`.
fn onnx_node(
    op: &str,
    name: &str,
    inputs: &[&str],
    output: &str,
    ints: &[(&str, i64)],
) -> kiln_onnx::pb::NodeProto {
    use kiln_onnx::pb;
    pb::NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute: (ints.iter())
            .map(|(n, i)| pb::AttributeProto {
                name: n.to_string(),
                r#type: pb::attribute_proto::AttributeType::Int as i32,
                i: *i,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// `y = Softmax(x, axis=0)` over `x: f32[batch, 4]`: it mixes the rows of
/// the batch.
fn batch_softmax_model(dir: &Path) -> std::path::PathBuf {
    let softmax = onnx_node("Softmax", "across", &["x"], "y", &[("axis", 0)]);
    one_input_model(dir, "batch_softmax.onnx", &["batch", "4"], vec![softmax])
}

#[test]
fn padding_is_refused_where_an_op_mixes_rows() {
    let dir = tempfile::tempdir().unwrap();
    let model = batch_softmax_model(dir.path());
    let out = dir.path().join("m.kiln");
    let args = |extra: &[&'static str]| {
        let mut a = vec![
            "compile".to_string(),
            model.to_str().unwrap().to_string(),
            "-o".into(),
            out.to_str().unwrap().to_string(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let run = |extra: &[&'static str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        kiln(&a)
    };
    // Profiles alone are fine: each is exact.
    let (code, text) = run(&["--dim", "batch=2,4"]);
    assert_eq!(code, 0, "{text}");
    std::fs::remove_file(&out).unwrap();
    let (code, text) = run(&["--dim", "batch=2,4", "--pad-dim", "batch"]);
    assert_eq!(code, 4, "{text}");
    assert!(
        text.contains("--pad-dim batch: node 'across' (softmax) normalizes over the padded axis"),
        "{text}"
    );
    assert!(!out.exists(), "a refused compile leaves no artifact");
    // A dim that is not given values, or that is on no input.
    let (code, text) = run(&["--dim", "batch=2", "--pad-dim", "seq"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--pad-dim seq needs --dim seq=VALUES"),
        "{text}"
    );
}

/// `y = sum(x) / len(x)` with the length read from the shape: the sum of a
/// zero-padded `x` is its real sum, but the length folds to each profile's
/// size, which a padded run would divide by. Refused, naming the constant.
#[test]
fn padding_is_refused_where_a_size_comes_from_the_shape() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = vec![
        onnx_node("Shape", "len", &["x"], "n", &[]),
        onnx_node("Cast", "len_f", &["n"], "nf", &[("to", 1)]),
        onnx_node("ReduceSum", "total", &["x"], "s", &[("keepdims", 1)]),
        onnx_node("Div", "mean", &["s", "nf"], "y", &[]),
    ];
    let model = one_input_model(dir.path(), "mean_by_shape.onnx", &["seq"], nodes);
    let out = dir.path().join("m.kiln");
    let (m, o) = (model.to_str().unwrap(), out.to_str().unwrap());
    let flags = ["--dim", "seq=4,8", "--pad-dim", "seq"];
    let (code, text) = kiln(&[&["compile", m, "-o", o][..], &flags[..]].concat());
    assert_eq!(code, 4, "{text}");
    assert!(
        text.contains("constant 'len_f' holds other values at profile seq=8"),
        "{text}"
    );
    // Without --pad-dim each profile is exact.
    let (code, text) = kiln(&["compile", m, "-o", o, "--dim", "seq=4,8"]);
    assert_eq!(code, 0, "{text}");
}

/// A model whose `If` decides on an input: `kiln compile` lists one line
/// per path, `--json` gives each profile's role, `kiln inspect` says which
/// profile is a variant or a condition program, and `kiln run` names the
/// path it took and writes the outputs of that path's shape.
#[test]
fn run_time_control_flow_is_listed_and_each_run_names_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("if.kiln");
    let fixture = |name: &str| repo().join("fixtures/models").join(name);
    let model = fixture("control_if_runtime_then").join("model.onnx");
    let (code, text) = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("2 variants, 1 condition programs, 0 refused paths"),
        "{text}"
    );
    assert!(
        text.contains("If 'If_1' takes its then branch: false"),
        "{text}"
    );
    let (code, json) = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "-o",
        art.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(code, 0, "{json}");
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let kinds: Vec<&str> = (report["profiles"].as_array().unwrap().iter())
        .map(|p| p["role"]["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["model", "model", "condition"]);
    let (code, text) = kiln(&["inspect", art.to_str().unwrap()]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("(condition program: If 'If_1' takes its then branch)"),
        "{text}"
    );
    for (name, shape, taken) in [
        ("control_if_runtime_then", "f32[2,3]", "true"),
        ("control_if_runtime_else", "f32[4,3]", "false"),
    ] {
        let inputs = fixture(name).join("inputs");
        let out = dir.path().join(name);
        let x = format!("x={}", inputs.join("x.npy").display());
        let sr = format!("sr={}", inputs.join("sr.npy").display());
        let check = fixture(name).join("outputs");
        let (code, text) = kiln(&[
            "run",
            art.to_str().unwrap(),
            "--input",
            &x,
            "--input",
            &sr,
            "--check",
            check.to_str().unwrap(),
            "--output-dir",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{name}: {text}");
        assert!(text.contains(&format!("out: {shape}")), "{name}: {text}");
        let path = format!("variant where If 'If_1' takes its then branch: {taken}");
        assert!(text.contains(&path), "{name}: {text}");
        let written = read_tensor("out", &out.join("out.npy")).unwrap();
        assert_eq!(written.type_string(), shape, "{name}");
    }
}
