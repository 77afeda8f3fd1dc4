//! Shape profiles: `kiln compile --dim batch=1,7,360` puts one
//! specialization per value into one artifact over one weights section; a
//! run's input shapes pick the profile. Each profile's outputs equal, bit
//! for bit, those of an artifact compiled for that shape alone, and match
//! onnxruntime's reference; shapes no profile has are refused, naming the
//! profiles.

use kiln_driver::npy::{read_tensor, write_tensor};
use kiln_format::Artifact;
use kiln_runtime::{Error, Model, Tensor};
use std::path::Path;

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

fn compile(dir: &Path, name: &str, dims: &str) -> Model {
    let out = dir.join(name);
    let model = repo().join(CNN).join("model.onnx");
    let (code, text) = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "--dim",
        dims,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    Model::load(&out).unwrap()
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
    let single = dir.path().join("one.kiln");
    let many = dir.path().join("many.kiln");
    let model = repo().join(CNN).join("model.onnx");
    for (out, dims) in [(&single, "batch=1"), (&many, "batch=1..64:9")] {
        let (code, text) = kiln(&[
            "compile",
            model.to_str().unwrap(),
            "--dim",
            dims,
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{text}");
    }
    let one = Artifact::parse(&std::fs::read(&single).unwrap()).unwrap();
    let all = Artifact::parse(&std::fs::read(&many).unwrap()).unwrap();
    // 1..64:9 is 1, 10, ..., 64: eight profiles.
    assert_eq!(all.profiles.len(), 8);
    assert_eq!(all.weights.len(), one.weights.len());
}

#[test]
fn cli_tools_pick_the_profile_from_the_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("m.kiln");
    let art_s = art.to_str().unwrap();
    let model = repo().join(CNN).join("model.onnx");
    let (code, text) = kiln(&[
        "compile",
        model.to_str().unwrap(),
        "--dim",
        "batch=1,4",
        "-o",
        art_s,
    ]);
    assert_eq!(code, 0, "{text}");
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
