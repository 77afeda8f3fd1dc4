//! Every fixture model's CUDA kernels, executed by the PTX interpreter of
//! `targets/cuda/tests/interp` (no GPU), against the IR reference
//! evaluator on the fixture's committed inputs.

#[path = "../../targets/cuda/tests/interp/mod.rs"]
mod interp;

use kiln_ir::{DType, Data, Tensor};

/// An input of a fixture: the `.npy` payload is the last bytes of the file
/// (C order, little-endian), after a header we need not parse.
fn fixture_input(dir: &std::path::Path, io: &serde_json::Value) -> Tensor {
    let d = match io["dtype"].as_str().unwrap() {
        "float32" => DType::F32,
        "float64" => DType::F64,
        "int64" => DType::I64,
        "int32" => DType::I32,
        "bool" => DType::Bool,
        "uint8" => DType::U8,
        "int8" => DType::I8,
        other => panic!("fixture dtype {other}"),
    };
    let shape: Vec<usize> = io["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let bytes = std::fs::read(dir.join(io["file"].as_str().unwrap())).unwrap();
    let n = shape.iter().product::<usize>() * d.size_bytes();
    let data = Data::from_le_bytes(d, &bytes[bytes.len() - n..]).unwrap();
    Tensor::new(&shape, data).unwrap()
}

#[test]
fn fixture_models_match_the_reference_evaluator() {
    let root = kiln_tests::repo_root().join("fixtures/models");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() > 100, "expected the fixtures");
    for dir in dirs {
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
        let mut opts = kiln_onnx::ImportOptions::default();
        if let Some(shapes) = meta["input_shapes"].as_object() {
            for (k, v) in shapes {
                let dims = v
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize);
                opts.input_shapes.insert(k.clone(), dims.collect());
            }
        }
        let g = kiln_onnx::import(&dir.join("model.onnx"), &opts).unwrap();
        let inputs: Vec<Tensor> = meta["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|io| fixture_input(&dir, io))
            .collect();
        let start = std::time::Instant::now();
        interp::check_against_reference(&g, &inputs);
        eprintln!("{}: {:.2} s", dir.display(), start.elapsed().as_secs_f64());
    }
}
