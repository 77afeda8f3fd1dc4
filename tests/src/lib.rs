//! Shared helpers for Kiln's end-to-end tests: fixture discovery, compiling
//! a fixture, running it through the runtime and comparing with the
//! committed onnxruntime references.
//!
//! Fixtures live in `fixtures/models/<name>/` (see `fixtures/README.md`).
//! [`fuzz`] holds the bodies of the fuzz targets.

// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

pub mod conformance;
pub mod fuzz;

use kiln_driver::compare::{compare, Comparison};
use kiln_driver::{compile, CompileOptions};
use kiln_runtime::{Model, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The repository root: `KILN_REPO_ROOT` when set (a prebuilt `gpu_check`
/// run from another checkout), else the directory this crate was built in.
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("KILN_REPO_ROOT").filter(|r| !r.is_empty()) {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// One fixture directory with its `meta.json`.
pub struct Fixture {
    /// Fixture name (directory name).
    pub name: String,
    /// Directory.
    pub dir: PathBuf,
    /// Parsed `meta.json`.
    pub meta: Value,
}

impl Fixture {
    /// Loads the fixture `name`.
    pub fn load(name: &str) -> Fixture {
        Fixture::load_dir(&repo_root().join("fixtures/models").join(name))
    }

    /// Loads the fixture in `dir` (named after the directory).
    pub fn load_dir(dir: &Path) -> Fixture {
        let dir = dir.to_path_buf();
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = name.as_str();
        let text = std::fs::read_to_string(dir.join("meta.json"))
            .unwrap_or_else(|e| panic!("{name}: meta.json: {e}"));
        Fixture {
            name: name.to_string(),
            meta: serde_json::from_str(&text).expect("meta.json parses"),
            dir,
        }
    }

    /// Every fixture name, sorted.
    pub fn all_names() -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(repo_root().join("fixtures/models"))
            .expect("fixtures/models exists")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    }

    /// The names of the fixtures whose names start with `prefix`, sorted.
    pub fn names_with_prefix(prefix: &str) -> Vec<String> {
        Fixture::all_names()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect()
    }

    /// Compile options binding the fixture's input shapes.
    pub fn compile_options(&self) -> CompileOptions {
        let mut opts = CompileOptions::default();
        if let Some(shapes) = self.meta["input_shapes"].as_object() {
            for (name, dims) in shapes {
                let dims = dims
                    .as_array()
                    .expect("dims array")
                    .iter()
                    .map(|d| d.as_u64().expect("dim") as usize)
                    .collect();
                opts.import.input_shapes.insert(name.clone(), dims);
            }
        }
        if let Some(dims) = self.meta["dims"].as_object() {
            for (name, v) in dims {
                let v = v.as_u64().expect("dim value") as usize;
                opts.import.dims.insert(name.clone(), v);
            }
        }
        // Inputs fixed at compile time (`kiln compile --bind-input`).
        if let Some(bound) = self.meta["bind_inputs"].as_object() {
            for (name, file) in bound {
                let path = self.dir.join(file.as_str().expect("file"));
                let value = kiln_driver::npy::read_ir_tensor(&path)
                    .unwrap_or_else(|e| panic!("{}: {e}", self.name));
                opts.import.input_values.insert(name.clone(), value);
            }
        }
        opts
    }

    /// The model path.
    pub fn model_path(&self) -> PathBuf {
        self.dir.join("model.onnx")
    }

    /// Compiles the fixture with `opts`, returning the artifact bytes.
    pub fn compile_with(&self, opts: &CompileOptions) -> Result<Vec<u8>, String> {
        compile(&self.model_path(), opts)
            .map(|c| c.bytes)
            .map_err(|e| format!("{}: compile: {e}", self.name))
    }

    fn tensors(&self, key: &str) -> Vec<Tensor> {
        self.meta[key]
            .as_array()
            .expect("io list")
            .iter()
            .map(|io| {
                let name = io["name"].as_str().expect("name");
                let file = io["file"].as_str().expect("file");
                kiln_driver::npy::read_tensor(name, &self.dir.join(file))
                    .unwrap_or_else(|e| panic!("{}: {e}", self.name))
            })
            .collect()
    }

    /// The reference inputs.
    pub fn inputs(&self) -> Vec<Tensor> {
        self.tensors("inputs")
    }

    /// The onnxruntime reference outputs.
    pub fn reference_outputs(&self) -> Vec<Tensor> {
        self.tensors("outputs")
    }
}

/// The real pretrained models fetched by `fixtures/make_real.py`.
pub const REAL_MODELS: [&str; 6] = [
    "ppocrv4_det",
    "ppocrv4_rec",
    "minilm_l3",
    "minilm_l3_sentences",
    "silero_vad",
    "silero_vad_8k",
];

/// Real models quantized by onnxruntime (`fixtures/make_real.py`),
/// compared with their own int8 tolerance rather than the fp32 one.
pub const QUANTIZED_REAL_MODELS: [&str; 3] = ["minilm_l3_int8", "minilm_l3_qdq", "ppocrv4_rec_qdq"];

/// Where the real models live (`KILN_REAL_MODELS`, else
/// `target/real-models`), or `None` when they were not fetched. Missing
/// models fail the calling test when `KILN_REQUIRE_REAL_MODELS=1` (set by
/// `scripts/test.sh`).
pub fn real_models_root() -> Option<PathBuf> {
    let root: PathBuf = std::env::var_os("KILN_REAL_MODELS")
        .map(Into::into)
        .unwrap_or_else(|| repo_root().join("target/real-models"));
    let missing: Vec<&str> = (REAL_MODELS.iter().chain(&QUANTIZED_REAL_MODELS))
        .copied()
        .filter(|m| !root.join(m).join("meta.json").exists())
        .collect();
    if missing.is_empty() {
        return Some(root);
    }
    assert!(
        std::env::var("KILN_REQUIRE_REAL_MODELS").as_deref() != Ok("1"),
        "real models {missing:?} missing under {}; run `python fixtures/make_real.py {}`",
        root.display(),
        root.display()
    );
    eprintln!("skipping: real models {missing:?} not fetched (fixtures/make_real.py)");
    None
}

/// Fails the calling test listing every failure, when there are any.
pub fn assert_no_failures(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Where `docs/operators.md`'s contrib-op section begins: the conformance
/// run writes what comes before it, `tests/tests/contrib.rs` the rest.
pub const CONTRIB_SECTION_MARK: &str = "<!-- contrib ops: generated by tests/tests/contrib.rs -->";

/// Rewrites `path` with `head` and whatever followed `mark` in it (the
/// mark kept).
pub fn write_before_section(path: &Path, mark: &str, head: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let tail = old.find(mark).map_or("", |i| &old[i..]);
    let text = if tail.is_empty() {
        head.to_string()
    } else {
        format!("{}\n\n{tail}", head.trim_end())
    };
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Rewrites `path` with what preceded `mark` in it, then `mark` and `section`.
pub fn write_section(path: &Path, mark: &str, section: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let head = old.find(mark).map_or(old.as_str(), |i| &old[..i]);
    let text = format!("{}\n\n{mark}\n\n{}\n", head.trim_end(), section.trim_end());
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// Loads artifact bytes and runs them on `inputs`.
pub fn run_artifact(bytes: &[u8], inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let model = Model::from_bytes(bytes).map_err(|e| format!("load: {e}"))?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    model.run(&views).map_err(|e| format!("run: {e}"))
}

/// Compiles a fixture for the native target, runs it on its reference
/// inputs, and compares every output with the onnxruntime reference.
pub fn check_fixture(fixture: &Fixture) -> Result<Vec<Comparison>, String> {
    let bytes = fixture.compile_with(&fixture.compile_options())?;
    let outputs =
        run_artifact(&bytes, &fixture.inputs()).map_err(|e| format!("{}: {e}", fixture.name))?;
    let references = fixture.reference_outputs();
    if outputs.len() != references.len() {
        return Err(format!(
            "{}: {} outputs, reference has {}",
            fixture.name,
            outputs.len(),
            references.len()
        ));
    }
    Ok(outputs
        .iter()
        .zip(&references)
        .map(|(o, r)| compare(o, r))
        .collect())
}

/// Index of the largest value in each row of a `[rows, classes]` tensor.
pub fn argmax_rows(t: &Tensor) -> Vec<usize> {
    let classes = *t.shape.last().expect("rank >= 1") as usize;
    let values = t.to_f32_vec().expect("f32 output");
    values
        .chunks(classes)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                    if v > best.1 {
                        (i, v)
                    } else {
                        best
                    }
                })
                .0
        })
        .collect()
}
