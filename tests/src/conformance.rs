//! One ONNX backend node test case (`node/<case>/model.onnx` with
//! `test_data_set_*/input_*.pb` and `output_*.pb`) compiled, loaded, run
//! and compared with its reference outputs at the ONNX runner's
//! tolerances, on a [`Backend`]: the CPU runtime ([`Cpu`], driven by
//! `tests/tests/conformance.rs`) or a GPU (`gpu_check --conformance`, with
//! the runtime's `cuda` feature).
//!
//! A case whose model has symbolic dims is compiled with them bound from
//! its first data set; one whose ops need a compile-time value computed
//! from graph inputs (a Reshape target, Pad amounts) is compiled per data
//! set with those inputs bound, as `kiln compile --bind-input` does.

use kiln_driver::{compile, CompileOptions, DriverError};
use kiln_onnx::pb::{self, type_proto, ModelProto, TensorProto};
use prost::Message;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The ONNX test runner's default tolerances (`onnx/backend/test/runner`);
/// every node case of onnx 1.23 uses them (no case states its own), except
/// that the runner raises rtol to 2^-6 for bf16 outputs (see [`compare`]).
pub const RTOL: f64 = 1e-3;
pub const ATOL: f64 = 1e-7;

/// Per-case tolerance overrides `(case, rtol, atol)`, where the ONNX suite
/// states one. The node cases of onnx 1.23.2 state none.
const TOLERANCE_OVERRIDES: &[(&str, f64, f64)] = &[];

/// Where a case's artifact is compiled for and run.
pub trait Backend {
    /// A loaded artifact.
    type Loaded;
    /// The compile options every case starts from (the target).
    fn options(&self) -> CompileOptions;
    fn load(&self, artifact: &[u8]) -> Result<Self::Loaded, String>;
    fn run(
        &self,
        model: &mut Self::Loaded,
        inputs: &[kiln_runtime::TensorRef<'_>],
    ) -> Result<Vec<kiln_runtime::Tensor>, String>;
}

/// The native target and the CPU runtime.
pub struct Cpu;

impl Backend for Cpu {
    type Loaded = kiln_runtime::Model;
    fn options(&self) -> CompileOptions {
        CompileOptions::default()
    }
    fn load(&self, artifact: &[u8]) -> Result<kiln_runtime::Model, String> {
        kiln_runtime::Model::from_bytes(artifact).map_err(|e| e.to_string())
    }
    fn run(
        &self,
        model: &mut kiln_runtime::Model,
        inputs: &[kiln_runtime::TensorRef<'_>],
    ) -> Result<Vec<kiln_runtime::Tensor>, String> {
        model.run(inputs).map_err(|e| e.to_string())
    }
}

pub fn outcome(kind: &str, detail: impl Into<String>) -> Value {
    json!({ "outcome": kind, "detail": detail.into() })
}

/// The variant name of a `Debug`-printed enum value (`Unsupported([..])` →
/// `Unsupported`).
fn variant<T: std::fmt::Debug>(v: &T) -> String {
    format!("{v:?}")
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

fn error_kind(e: &DriverError) -> String {
    match e {
        DriverError::Onnx(o) => format!("onnx::{}", variant(o)),
        DriverError::Pass(p) => format!("passes::{}", variant(p)),
        DriverError::Cpu(c) => format!("cpu::{}", variant(c)),
        DriverError::Cuda(c) => format!("cuda::{}", variant(c)),
        DriverError::Io { .. } => "io".to_string(),
        DriverError::ArenaTooLarge { .. } => "arena_too_large".to_string(),
        DriverError::Calibration { .. } => "calibration".to_string(),
        DriverError::Golden { .. } => "golden".to_string(),
        DriverError::Reference { .. } => "reference".to_string(),
        DriverError::Run(r) => format!("runtime::{}", variant(r)),
        DriverError::Usage(_) => "usage".to_string(),
        DriverError::InProfile { source, .. } => error_kind(source),
        DriverError::Padding { .. } => "padding".to_string(),
        DriverError::Bounded { .. } => "bounded".to_string(),
    }
}

fn read_proto(path: &Path) -> Result<TensorProto, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    TensorProto::decode(bytes.as_slice()).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads the `prefix_*.pb` tensors of a data set, in index order.
fn read_tensors(set: &Path, prefix: &str) -> Result<Vec<(String, kiln_ir::Tensor)>, String> {
    let mut out = Vec::new();
    for i in 0.. {
        let path = set.join(format!("{prefix}_{i}.pb"));
        if !path.exists() {
            break;
        }
        let proto = read_proto(&path)?;
        let t = kiln_onnx::tensor_from_proto(
            &proto,
            &proto.name,
            &kiln_onnx::ExternalData::new(None),
            u64::MAX,
        )
        .map_err(|e| format!("{prefix}_{i}.pb: {e}"))?;
        out.push((proto.name.clone(), t));
    }
    Ok(out)
}

fn to_runtime(name: &str, t: &kiln_ir::Tensor) -> kiln_runtime::Tensor {
    kiln_runtime::Tensor {
        name: name.to_string(),
        dtype: t.dtype(),
        shape: t.shape().iter().map(|&d| d as u64).collect(),
        data: t.data().to_le_bytes(),
    }
}

/// The graph inputs that are not initializers.
fn graph_inputs(model: &ModelProto) -> Vec<&pb::ValueInfoProto> {
    let Some(g) = &model.graph else {
        return Vec::new();
    };
    let inits: BTreeSet<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
    g.input
        .iter()
        .filter(|i| !inits.contains(i.name.as_str()))
        .collect()
}

fn has_symbolic_dims(v: &pb::ValueInfoProto) -> bool {
    use pb::tensor_shape_proto::dimension::Value as D;
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => match &t.shape {
            None => true,
            // A dim of 0 (an empty tensor) is bound too: the frontend reads
            // `dim_value: 0` as unknown.
            Some(s) => s
                .dim
                .iter()
                .any(|d| !matches!(d.value, Some(D::DimValue(v)) if v > 0)),
        },
        _ => false,
    }
}

fn tolerances(case: &str) -> (f64, f64) {
    TOLERANCE_OVERRIDES
        .iter()
        .find(|(c, _, _)| *c == case)
        .map(|&(_, r, a)| (r, a))
        .unwrap_or((RTOL, ATOL))
}

/// Compares one output with its reference like `np.testing.assert_allclose`
/// (plus exact dtype): `None` when it matches, else what differs and the
/// error magnitude.
fn compare(
    actual: &kiln_ir::Tensor,
    reference: &kiln_ir::Tensor,
    rtol: f64,
    atol: f64,
) -> Option<Value> {
    if actual.dtype() != reference.dtype() || actual.shape() != reference.shape() {
        return Some(json!({
            "mismatch": format!(
                "got {}{:?}, reference is {}{:?}",
                actual.dtype(), &actual.shape()[..], reference.dtype(), &reference.shape()[..]
            )
        }));
    }
    let (a, r) = (actual.data(), reference.data());
    let dtype = actual.dtype();
    let float = dtype.is_float() || kiln_ir::narrow::is_narrow_float(dtype);
    // The ONNX runner's rule for bf16 outputs: two bf16 units in the last
    // place (`onnx/backend/test/runner/__init__.py`).
    let rtol = if actual.dtype() == kiln_ir::DType::BF16 {
        rtol.max(2f64.powi(-6))
    } else {
        rtol
    };
    let (mut bad, mut first) = (0usize, None);
    let (mut max_abs, mut worst) = (0f64, 0f64);
    for i in 0..r.len() {
        let ok = if float {
            let (x, y) = (a.get_f64(i), r.get_f64(i));
            if y.is_nan() || x.is_nan() {
                x.is_nan() && y.is_nan()
            } else if y.is_infinite() || x.is_infinite() {
                x == y
            } else {
                let d = (x - y).abs();
                max_abs = max_abs.max(d);
                let bound = atol + rtol * y.abs();
                worst = worst.max(d / bound);
                d <= bound
            }
        } else {
            let (x, y) = (a.get_i64(i), r.get_i64(i));
            if x != y {
                max_abs = max_abs.max((x as f64 - y as f64).abs());
            }
            x == y
        };
        if !ok {
            bad += 1;
            if first.is_none() {
                first = Some(json!({"index": i, "got": a.get_f64(i), "expected": r.get_f64(i)}));
            }
        }
    }
    (bad > 0).then(|| {
        json!({
            "mismatched": bad, "of": r.len(), "max_abs_err": max_abs,
            "worst_tolerance_ratio": worst, "first": first,
        })
    })
}

/// Compiles and runs one case on `backend` against every data set: the
/// JSON outcome `{"outcome": pass|unsupported|fail, "detail": ...}` (with
/// `error_kind` for unsupported cases and `max_abs_err` for wrong answers).
pub fn run_case<B: Backend>(dir: &Path, backend: &B) -> Value {
    let case = dir.file_name().unwrap().to_string_lossy().into_owned();
    let model_path = dir.join("model.onnx");
    let model = match kiln_onnx::load_model(&model_path) {
        Ok(m) => m,
        Err(e) => return outcome("fail", format!("the test model does not load: {e}")),
    };
    let inputs_pb = graph_inputs(&model);
    let outputs_pb = model
        .graph
        .as_ref()
        .map(|g| g.output.as_slice())
        .unwrap_or(&[]);
    let non_tensor = inputs_pb
        .iter()
        .copied()
        .chain(outputs_pb)
        .filter(|v| {
            !matches!(
                v.r#type.as_ref().and_then(|t| t.value.as_ref()),
                Some(type_proto::Value::TensorType(_))
            )
        })
        .map(|v| v.name.clone())
        .collect::<Vec<_>>();

    let set = dir.join("test_data_set_0");
    let mut opts = backend.options();
    // Bind symbolic dims from the data (only where the model has them).
    if non_tensor.is_empty() && inputs_pb.iter().any(|v| has_symbolic_dims(v)) {
        for (i, v) in inputs_pb.iter().enumerate() {
            if has_symbolic_dims(v) {
                if let Ok(p) = read_proto(&set.join(format!("input_{i}.pb"))) {
                    opts.import
                        .input_shapes
                        .insert(v.name.clone(), p.dims.iter().map(|&d| d as usize).collect());
                }
            }
        }
    }

    let compiled = compile(&model_path, &opts);
    if !non_tensor.is_empty() {
        return match compiled {
            Err(e) => json!({
                "outcome": "unsupported", "error_kind": error_kind(&e),
                "detail": format!("non-tensor inputs/outputs {non_tensor:?}; compile: {e}"),
            }),
            Ok(_) => outcome(
                "fail",
                format!("compiled although inputs/outputs {non_tensor:?} are not tensors"),
            ),
        };
    }
    let mut data_sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
                })
                .collect()
        })
        .unwrap_or_default();
    data_sets.sort();
    if data_sets.is_empty() {
        return outcome("fail", "the case has no test_data_set_*");
    }
    let unsupported = |e: &DriverError, bound: &BTreeSet<String>| {
        let detail = if bound.is_empty() {
            e.to_string()
        } else {
            format!("with {bound:?} bound at compile time: {e}")
        };
        json!({ "outcome": "unsupported", "error_kind": error_kind(e), "detail": detail })
    };
    let tolerance = tolerances(&case);

    // An op that needs a compile-time value computed from graph inputs (a
    // Reshape target, Pad amounts, TopK's k) compiles once those inputs are
    // bound, as `kiln compile --bind-input` does: the model is then compiled
    // per data set with that set's values.
    let mut bound = match &compiled {
        Err(e) => match bindable_inputs(e) {
            Some(names) => names,
            None => return unsupported(e, &BTreeSet::new()),
        },
        Ok(_) => BTreeSet::new(),
    };
    if bound.is_empty() {
        let compiled = compiled.expect("an error returned above");
        let mut model_rt = match backend.load(&compiled.bytes) {
            Ok(m) => m,
            Err(e) => return outcome("fail", format!("runtime load: {e}")),
        };
        for set in &data_sets {
            if let Err(failure) =
                check_data_set(backend, &mut model_rt, set, &inputs_pb, &bound, tolerance)
            {
                return failure;
            }
        }
        return outcome("pass", "");
    }
    for set in &data_sets {
        let set_name = set.file_name().unwrap().to_string_lossy().into_owned();
        let inputs = match named_inputs(set, &inputs_pb) {
            Ok(i) => i,
            Err(e) => return outcome("fail", format!("{set_name}: reading the data: {e}")),
        };
        let mut model_rt = loop {
            opts.import.input_values = inputs
                .iter()
                .filter(|(name, _)| bound.contains(name))
                .map(|(name, t)| (name.clone(), t.clone()))
                .collect();
            match compile(&model_path, &opts) {
                Ok(c) => match backend.load(&c.bytes) {
                    Ok(m) => break m,
                    Err(e) => return outcome("fail", format!("runtime load: {e}")),
                },
                Err(e) => match bindable_inputs(&e) {
                    Some(more) if !more.is_subset(&bound) => bound.extend(more),
                    _ => return unsupported(&e, &bound),
                },
            }
        };
        if let Err(failure) =
            check_data_set(backend, &mut model_rt, set, &inputs_pb, &bound, tolerance)
        {
            return failure;
        }
    }
    outcome(
        "pass",
        format!(
            "{BOUND_MARK}{}",
            bound.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
}

/// How the detail of a case that passes with inputs bound at compile time
/// starts.
pub const BOUND_MARK: &str = "inputs bound at compile time: ";

/// The graph inputs that, bound at compile time, would let the compile
/// proceed: `Some` when every op the error names needs only that.
fn bindable_inputs(e: &DriverError) -> Option<BTreeSet<String>> {
    match e {
        DriverError::Onnx(kiln_onnx::OnnxError::Unsupported(ops))
            if ops.iter().all(|op| !op.bindable_inputs.is_empty()) =>
        {
            Some(
                ops.iter()
                    .flat_map(|op| op.bindable_inputs.iter().cloned())
                    .collect(),
            )
        }
        _ => None,
    }
}

/// A data set's inputs, named (a `.pb` without a name takes the graph
/// input's at its position).
fn named_inputs(
    set: &Path,
    inputs_pb: &[&pb::ValueInfoProto],
) -> Result<Vec<(String, kiln_ir::Tensor)>, String> {
    Ok(read_tensors(set, "input")?
        .into_iter()
        .enumerate()
        .map(|(i, (name, t))| {
            let name = if name.is_empty() {
                inputs_pb.get(i).map(|v| v.name.clone()).unwrap_or_default()
            } else {
                name
            };
            (name, t)
        })
        .collect())
}

/// Runs one data set (the inputs in `bound` are compiled in) and compares
/// the outputs with its references; `Err` is the case's failing outcome.
fn check_data_set<B: Backend>(
    backend: &B,
    model_rt: &mut B::Loaded,
    set: &Path,
    inputs_pb: &[&pb::ValueInfoProto],
    bound: &BTreeSet<String>,
    (rtol, atol): (f64, f64),
) -> Result<(), Value> {
    let set_name = set.file_name().unwrap().to_string_lossy().into_owned();
    let (inputs, refs) = match (named_inputs(set, inputs_pb), read_tensors(set, "output")) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => {
            return Err(outcome(
                "fail",
                format!("{set_name}: reading the data: {e}"),
            ))
        }
    };
    let inputs: Vec<kiln_runtime::Tensor> = inputs
        .iter()
        .filter(|(name, _)| !bound.contains(name))
        .map(|(name, t)| to_runtime(name, t))
        .collect();
    let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
    let outputs = match backend.run(model_rt, &views) {
        Ok(o) => o,
        Err(e) => return Err(outcome("fail", format!("{set_name}: run: {e}"))),
    };
    if outputs.len() != refs.len() {
        return Err(outcome(
            "fail",
            format!(
                "{set_name}: {} outputs, the reference has {}",
                outputs.len(),
                refs.len()
            ),
        ));
    }
    let mut errors = Vec::new();
    for (i, (o, (rname, r))) in outputs.iter().zip(&refs).enumerate() {
        let Some(data) = kiln_ir::Data::from_le_bytes(o.dtype, &o.data) else {
            errors
                .push(json!({"output": o.name, "mismatch": "output bytes do not match its dtype"}));
            continue;
        };
        let shape: Vec<usize> = o.shape.iter().map(|&d| d as usize).collect();
        let Some(actual) = kiln_ir::Tensor::new(&shape, data) else {
            errors.push(
                json!({"output": o.name, "mismatch": "output size does not match its shape"}),
            );
            continue;
        };
        if let Some(mut d) = compare(&actual, r, rtol, atol) {
            d["output"] = json!(if rname.is_empty() {
                format!("#{i}")
            } else {
                rname.clone()
            });
            errors.push(d);
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let max_abs = errors
        .iter()
        .filter_map(|e| e["max_abs_err"].as_f64())
        .fold(0f64, f64::max);
    Err(json!({
        "outcome": "fail",
        "detail": format!("{set_name}: wrong answer: {}", Value::Array(errors.clone())),
        "max_abs_err": max_abs,
        "errors": errors,
    }))
}
