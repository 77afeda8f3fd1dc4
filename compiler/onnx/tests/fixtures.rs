//! Imports every fixture model with the input shapes from its meta.json,
//! verifies the IR, checks output shapes and compares the reference
//! evaluator's outputs with onnxruntime's.

use kiln_ir::{Data, Tensor};
use kiln_onnx::{import, ImportOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models")
}

fn read_npy(path: &Path, dtype: &str) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(&bytes[..]).expect("npy header");
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let data = match dtype {
        "float32" => Data::F32(npy.into_vec().unwrap()),
        "float64" => Data::F64(npy.into_vec().unwrap()),
        "int64" => Data::I64(npy.into_vec().unwrap()),
        "int32" => Data::I32(npy.into_vec().unwrap()),
        "int8" => Data::I8(npy.into_vec().unwrap()),
        "uint8" => Data::U8(npy.into_vec().unwrap()),
        "bool" => Data::Bool(npy.into_vec().unwrap()),
        other => panic!("{}: dtype {other} not handled by the test", path.display()),
    };
    Tensor::new(&shape, data).expect("npy element count")
}

fn shape_of(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("shape array")
        .iter()
        .map(|d| d.as_u64().expect("dim") as usize)
        .collect()
}

/// Imports one fixture; returns a failure description or None.
fn check_fixture(dir: &Path) -> Result<(), String> {
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let mut opts = ImportOptions::default();
    if let Some(shapes) = meta.get("input_shapes").and_then(|v| v.as_object()) {
        for (k, v) in shapes {
            opts.input_shapes.insert(k.clone(), shape_of(v));
        }
    }
    let metas = meta["inputs"].as_array().unwrap();
    let g = import_on_path(&dir.join("model.onnx"), &opts, |g| inputs_of(g, metas, dir))?;
    kiln_ir::verify::verify(&g).map_err(|e| format!("verify: {e}"))?;

    let outs = meta["outputs"].as_array().unwrap();
    if outs.len() != g.outputs().len() {
        return Err(format!(
            "{} outputs, meta has {}",
            g.outputs().len(),
            outs.len()
        ));
    }
    for (o, (name, id)) in outs.iter().zip(g.outputs()) {
        if o["name"].as_str().unwrap() != name {
            return Err(format!("output '{name}' should be '{}'", o["name"]));
        }
        let want = shape_of(&o["shape"]);
        let got = g.node(*id).ty.shape.to_vec();
        if want != got {
            return Err(format!(
                "output '{name}' has shape {got:?}, expected {want:?}"
            ));
        }
    }

    let inputs = inputs_of(&g, metas, dir)?;
    let results = kiln_ir::eval::eval_graph(&g, &inputs).map_err(|e| format!("eval: {e}"))?;
    for (o, got) in outs.iter().zip(&results) {
        let want = read_npy(
            &dir.join(o["file"].as_str().unwrap()),
            o["dtype"].as_str().unwrap(),
        );
        if got.dtype() != want.dtype() {
            return Err(format!(
                "output '{}' is {}, expected {}",
                o["name"],
                got.dtype(),
                want.dtype()
            ));
        }
        if got.shape() != want.shape() {
            return Err(format!(
                "output '{}' shape {:?} vs {:?}",
                o["name"],
                got.shape(),
                want.shape()
            ));
        }
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        if g.is_empty() || g.len() != w.len() {
            return Err(format!(
                "output '{}' has {} values, expected {}",
                o["name"],
                g.len(),
                w.len()
            ));
        }
        // Models with int8 layers (`"tolerance": "int8"`, the contrib
        // fixtures onnxruntime quantized) differ by whole quantization
        // steps: 3% of the output's scale, the bar of tests/tests/contrib.rs.
        let atol = if meta["tolerance"].as_str() == Some("int8") {
            3e-2 * w.iter().fold(0f64, |m, x| m.max(x.abs()))
        } else {
            1e-4
        };
        let mut worst = (0.0f64, 0usize);
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let err = (a - b).abs();
            let ok = err <= atol + 1e-4 * b.abs() || (a.is_nan() && b.is_nan());
            if !ok && err > worst.0 {
                worst = (err, i);
            }
        }
        if worst.0 > 0.0 {
            return Err(format!(
                "output '{}' differs: max error {} at {} (got {}, expected {})",
                o["name"], worst.0, worst.1, g[worst.1], w[worst.1]
            ));
        }
    }
    Ok(())
}

/// The fixture's inputs in `g`'s input order, matched by name.
fn inputs_of(g: &kiln_ir::Graph, metas: &[Value], dir: &Path) -> Result<Vec<Tensor>, String> {
    let mut inputs = Vec::new();
    for &id in g.inputs() {
        let name = &g.node(id).name;
        let m = metas
            .iter()
            .find(|m| m["name"].as_str() == Some(name))
            .ok_or_else(|| format!("no meta input for '{name}'"))?;
        inputs.push(read_npy(
            &dir.join(m["file"].as_str().unwrap()),
            m["dtype"].as_str().unwrap(),
        ));
    }
    Ok(inputs)
}

/// The model imported on the path its inputs take through run-time
/// control flow (`ImportOptions::branches`): at each decision the import
/// stops at, the decision's condition program is imported and evaluated
/// on the inputs by the reference evaluator, as the runtime does with
/// compiled ones. A model without run-time decisions imports once.
fn import_on_path(
    model: &Path,
    opts: &ImportOptions,
    inputs: impl Fn(&kiln_ir::Graph) -> Result<Vec<Tensor>, String>,
) -> Result<kiln_ir::Graph, String> {
    let mut branches = kiln_onnx::Branches {
        max_trip_count: 16,
        ..Default::default()
    };
    loop {
        let on = |branches: kiln_onnx::Branches| ImportOptions {
            branches: Some(branches),
            ..opts.clone()
        };
        match import(model, &on(branches.clone())) {
            Err(kiln_onnx::OnnxError::Undecided { key, .. }) => {
                let condition = kiln_onnx::Branches {
                    condition_of: Some(key.clone()),
                    ..branches.clone()
                };
                let g = import(model, &on(condition)).map_err(|e| format!("condition: {e}"))?;
                let out = kiln_ir::eval::eval_graph(&g, &inputs(&g)?)
                    .map_err(|e| format!("condition eval: {e}"))?;
                branches.taken.insert(key, out[0].data().get_f64(0) != 0.0);
            }
            other => return other.map_err(|e| format!("import: {e}")),
        }
    }
}

#[test]
fn all_fixtures_import_and_match_onnxruntime() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures/models")
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        // Outputs of data-dependent size evaluate at their bound here; the
        // runtime cuts them to the run's length, and tests/tests/fixtures.rs
        // compares those with onnxruntime.
        .filter(|p| !p.to_string_lossy().contains("/bounded_"))
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty());
    let mut failures = Vec::new();
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let t = std::time::Instant::now();
        let r = check_fixture(dir);
        eprintln!(
            "{name}: {} ({:.2}s)",
            if r.is_ok() { "ok" } else { "FAILED" },
            t.elapsed().as_secs_f64()
        );
        if let Err(e) = r {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} fixtures failed:\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n")
    );
}
