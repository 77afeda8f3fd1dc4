//! `kiln debug`: where a compiled model first departs from its source, value
//! by value, and which pass made it so.
//!
//! [`compare_values`] compiles the model with every value kept
//! ([`KeepValues`]: kept values are graph outputs, so no pass fuses them
//! away or reuses their memory), runs it, and compares each value with the
//! reference evaluator on the source graph (before any pass) or with
//! values dumped from onnxruntime (`scripts/dump_values.py`). Values are
//! checked in the source graph's topological order, so the first one
//! beyond tolerance is where the error starts.
//!
//! [`bisect_passes`] compiles the model as is (nothing kept, so fusion
//! runs as in the real build) with ever shorter prefixes of the pass
//! pipeline, and names the pass whose addition makes the outputs depart,
//! then confirms that the pipeline without it matches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kiln_ir::{Graph, NodeId, Op};
use kiln_onnx::KeepValues;
use kiln_passes::{AssignPrecision, PassManager, Silent};
use kiln_runtime::{Model, Tensor, TensorSpec};

use crate::compare::{compare, to_ir, to_runtime, Comparison};
use crate::error::DriverError;
use crate::options::CompileOptions;
use crate::pipeline::{compile_imported, Compiled};

/// An ONNX model read once for a debugging session.
pub struct Source {
    bytes: Vec<u8>,
    path: PathBuf,
    model: kiln_onnx::ModelProto,
}

impl Source {
    /// Reads and decodes the model at `path`.
    pub fn read(path: &Path) -> Result<Source, DriverError> {
        let bytes = kiln_onnx::read_model_file(path)?;
        let model = kiln_onnx::decode_model(&bytes)?;
        Ok(Source {
            bytes,
            path: path.to_path_buf(),
            model,
        })
    }

    /// The model imported with `opts`, keeping `keep`.
    fn import(&self, opts: &CompileOptions, keep: &KeepValues) -> Result<Graph, DriverError> {
        let mut import = opts.import.clone();
        import.keep_values = keep.clone();
        let dir = kiln_onnx::model_dir(&self.path);
        Ok(kiln_onnx::import_model(&self.model, dir, &import)?)
    }

    /// The model's inputs as `opts` binds them (for reading or making the
    /// values of a run).
    pub fn inputs(&self, opts: &CompileOptions) -> Result<Vec<TensorSpec>, DriverError> {
        let graph = self.import(opts, &KeepValues::None)?;
        Ok((graph.inputs().iter())
            .map(|&id| {
                let node = graph.node(id);
                TensorSpec {
                    name: node.name.clone(),
                    dtype: node.ty.dtype,
                    shape: node.ty.shape.iter().map(|&d| d as u64).collect(),
                    arena_offset: 0,
                }
            })
            .collect())
    }

    /// Compiles `graph` (imported from this source) and runs it on `inputs`.
    fn compile_and_run(
        &self,
        graph: Graph,
        opts: &CompileOptions,
        inputs: &[Tensor],
    ) -> Result<(Compiled, Vec<Tensor>), DriverError> {
        let compiled =
            compile_imported(&self.bytes, graph, std::time::Duration::ZERO, opts, &Silent)?;
        let model = Model::from_bytes(&compiled.bytes)?;
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let outputs = model.run(&views)?;
        Ok((compiled, outputs))
    }
}

/// What each compiled value is compared with.
#[derive(Clone, Copy, Debug)]
pub enum Reference<'a> {
    /// Kiln's reference evaluator on the source graph, before any pass.
    Evaluator,
    /// Values dumped by `scripts/dump_values.py` (onnxruntime with every
    /// tensor made a graph output): `DIR/values.json` maps each value name
    /// to its `.npy` file in DIR.
    Dumped(&'a Path),
}

/// The reference values of the graph's outputs, by output name.
fn reference_values(
    graph: &Graph,
    inputs: &[Tensor],
    reference: Reference<'_>,
) -> Result<HashMap<String, Tensor>, DriverError> {
    match reference {
        Reference::Evaluator => {
            let values = evaluate(graph, inputs)?;
            Ok((graph.outputs().iter())
                .zip(values)
                .map(|((name, _), t)| (name.clone(), t))
                .collect())
        }
        Reference::Dumped(dir) => read_dumped(dir, graph),
    }
}

/// The reference evaluator's outputs of `graph` on the named `inputs`.
fn evaluate(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, DriverError> {
    let bad = |message: String| DriverError::Reference {
        path: PathBuf::from("(reference evaluator)"),
        message,
    };
    let mut ordered = Vec::with_capacity(graph.inputs().len());
    for &id in graph.inputs() {
        let name = &graph.node(id).name;
        let t = (inputs.iter().find(|t| &t.name == name))
            .ok_or_else(|| bad(format!("no value for input '{name}'")))?;
        ordered.push(
            to_ir(t.dtype, &t.shape, &t.data)
                .ok_or_else(|| bad(format!("input '{name}' is malformed")))?,
        );
    }
    let values = kiln_ir::eval::eval_graph(graph, &ordered).map_err(|e| bad(e.to_string()))?;
    Ok((graph.outputs().iter())
        .zip(values)
        .map(|((name, _), t)| to_runtime(name, &t))
        .collect())
}

/// The values of `dir/values.json` that name outputs of `graph`, each read
/// as its output's type.
fn read_dumped(dir: &Path, graph: &Graph) -> Result<HashMap<String, Tensor>, DriverError> {
    let index_path = dir.join("values.json");
    let bad = |message: String| DriverError::Reference {
        path: index_path.clone(),
        message,
    };
    let text = std::fs::read_to_string(&index_path).map_err(|source| DriverError::Io {
        path: index_path.clone(),
        source,
    })?;
    let index: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let files = (index.get("values").and_then(|v| v.as_object()))
        .ok_or_else(|| bad("expected {\"values\": {\"VALUE NAME\": \"FILE.npy\", ...}}".into()))?;
    let mut values = HashMap::new();
    for (name, id) in graph.outputs() {
        let Some(file) = files.get(name) else {
            continue;
        };
        let file = (file.as_str())
            .filter(|f| Path::new(f).file_name() == Some(std::ffi::OsStr::new(f)))
            .ok_or_else(|| {
                bad(format!(
                    "'{name}': the file must be a name inside {}",
                    dir.display()
                ))
            })?;
        let dtype = graph.node(*id).ty.dtype;
        let t = crate::npy::read_tensor_as(name, &dir.join(file), dtype).map_err(|e| {
            DriverError::Reference {
                path: dir.join(file),
                message: e.to_string(),
            }
        })?;
        values.insert(name.clone(), t);
    }
    Ok(values)
}

/// One value of the compiled model against its reference.
#[derive(Clone, Debug)]
pub struct ValueCheck {
    /// The value's ONNX tensor name.
    pub value: String,
    /// The source-graph node that computes it (the ONNX node's name).
    pub node: String,
    /// Its IR op.
    pub op: String,
    /// What the node reads: kept values by name, graph inputs and
    /// constants marked as such.
    pub sources: Vec<String>,
    /// The comparison; `None` when the reference has no value of this name.
    pub comparison: Option<Comparison>,
    /// Whether the value is one of the model's own outputs.
    pub model_output: bool,
}

impl ValueCheck {
    /// Whether the value is within `tolerance` (`None`: no reference).
    pub fn passes(&self, tolerance: f64) -> Option<bool> {
        self.comparison.as_ref().map(|c| c.passes(tolerance))
    }
}

/// Every kept value of a compiled model against its reference, in the
/// source graph's topological order.
pub struct ValueReport {
    /// The checks.
    pub checks: Vec<ValueCheck>,
    /// The tolerance: the largest error relative to each value's scale.
    pub tolerance: f64,
    /// The compilation that was run.
    pub compiled: Compiled,
}

impl ValueReport {
    /// The first value beyond tolerance: where the error starts.
    pub fn first_failure(&self) -> Option<&ValueCheck> {
        self.failures().next()
    }

    /// Every value beyond tolerance, in order.
    pub fn failures(&self) -> impl Iterator<Item = &ValueCheck> {
        (self.checks.iter()).filter(|c| c.passes(self.tolerance) == Some(false))
    }

    /// How many values had a reference.
    pub fn compared(&self) -> usize {
        (self.checks.iter())
            .filter(|c| c.comparison.is_some())
            .count()
    }
}

/// Compiles `source` with `opts`, keeping every value (or those
/// `opts.import.keep_values` names), runs it on `inputs` and compares each
/// kept value with `reference`, within `tolerance` of its scale (`None`:
/// [`CompileOptions::golden_tolerance`]).
pub fn compare_values(
    source: &Source,
    opts: &CompileOptions,
    inputs: &[Tensor],
    reference: Reference<'_>,
    tolerance: Option<f64>,
) -> Result<ValueReport, DriverError> {
    let mut opts = opts.clone();
    if opts.import.keep_values == KeepValues::None {
        opts.import.keep_values = KeepValues::All;
    }
    let graph = source.import(&opts, &opts.import.keep_values)?;
    let tolerance = tolerance.unwrap_or_else(|| opts.golden_tolerance(&graph));
    let expected = reference_values(&graph, inputs, reference)?;
    let order = graph.topo_order().map_err(|e| DriverError::Reference {
        path: source.path.clone(),
        message: e.to_string(),
    })?;
    let order: HashMap<NodeId, usize> = (order.into_iter())
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect();
    let model_outputs = source.model.graph.as_ref().map_or(0, |g| g.output.len());
    let outputs = graph.outputs().to_vec();
    let mut checks: Vec<(usize, ValueCheck)> = Vec::with_capacity(outputs.len());
    let (compiled, actual) = source.compile_and_run(graph.clone(), &opts, inputs)?;
    for (i, ((name, id), value)) in outputs.iter().zip(&actual).enumerate() {
        let node = graph.node(*id);
        checks.push((
            order[id],
            ValueCheck {
                value: name.clone(),
                node: node.name.clone(),
                op: node.op.name().to_string(),
                sources: sources(&graph, *id),
                comparison: expected.get(name).map(|r| compare(value, r)),
                model_output: i < model_outputs,
            },
        ));
    }
    checks.sort_by_key(|(position, _)| *position);
    Ok(ValueReport {
        checks: checks.into_iter().map(|(_, c)| c).collect(),
        tolerance,
        compiled,
    })
}

/// What node `id` reads, for people: each input's value name when it is a
/// graph output, else its node's name, marked when it is an input or a
/// constant.
fn sources(graph: &Graph, id: NodeId) -> Vec<String> {
    let output_name: HashMap<NodeId, &str> = (graph.outputs().iter())
        .map(|(name, id)| (*id, name.as_str()))
        .collect();
    (graph.inputs_of(id).into_iter())
        .map(|input| {
            let node = graph.node(input);
            match (&node.op, output_name.get(&input)) {
                (Op::Input { .. }, _) => format!("{} (graph input)", node.name),
                (Op::Constant(_), _) => format!("{} (constant)", node.name),
                (_, Some(name)) => (*name).to_owned(),
                (op, None) => format!("{} ({}, not kept)", node.name, op.name()),
            }
        })
        .collect()
}

/// One compilation of a bisection: a pipeline and how its outputs compared.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The passes run (`assign-precision` when the build's precision was
    /// assigned).
    pub passes: Vec<String>,
    /// The worst model output against the reference (largest error relative
    /// to its scale), or why the build failed.
    pub outcome: Result<Comparison, String>,
    /// Whether every output was within tolerance.
    pub matched: bool,
}

/// What a bisection found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Culprit {
    /// The whole pipeline's outputs are within tolerance.
    NoMismatch,
    /// The outputs depart with no pass at all: code generation (a kernel)
    /// or the import, not a pass (`kiln debug` without `--bisect-passes`
    /// finds the first value beyond tolerance).
    NoPass,
    /// Adding this pass to the pipeline's prefix made the outputs depart.
    Pass {
        /// The pass.
        name: String,
        /// Whether the whole pipeline without it matches.
        removal_matches: bool,
    },
}

/// The result of [`bisect_passes`].
#[derive(Clone, Debug)]
pub struct Bisection {
    /// The pipeline bisected, in order.
    pub pipeline: Vec<String>,
    /// Every compilation, in the order run.
    pub trials: Vec<Trial>,
    /// What was found.
    pub culprit: Culprit,
    /// The tolerance: the largest error relative to each output's scale.
    pub tolerance: f64,
}

/// Finds the pass whose addition makes the model's outputs on `inputs`
/// depart from the reference evaluator's on the source graph: compiles
/// with prefixes of the pipeline (`--passes`, or the `-O` level's, with
/// `assign-precision` where a reduced-precision build runs it), bisecting
/// between the empty prefix and the whole pipeline, then confirms that the
/// whole pipeline without that pass matches. Outputs match within
/// `tolerance` of their scale (`None`: [`CompileOptions::golden_tolerance`]).
/// `progress` hears of each trial.
pub fn bisect_passes(
    source: &Source,
    opts: &CompileOptions,
    inputs: &[Tensor],
    tolerance: Option<f64>,
    mut progress: impl FnMut(&Trial, f64),
) -> Result<Bisection, DriverError> {
    let plain = KeepValues::None;
    let graph = source.import(opts, &plain)?;
    let tolerance = tolerance.unwrap_or_else(|| opts.golden_tolerance(&graph));
    let expected = reference_values(&graph, inputs, Reference::Evaluator)?;
    let mut pipeline: Vec<String> = match &opts.passes {
        Some(names) => names.clone(),
        None => (PassManager::for_level(opts.opt_level)?.names().into_iter())
            .map(String::from)
            .collect(),
    };
    if !opts.precision.is_identity() {
        let at = (pipeline.iter().position(|p| p == "fuse")).unwrap_or(pipeline.len());
        pipeline.insert(at, AssignPrecision::NAME.to_string());
    }
    let mut trials = Vec::new();
    let mut trial = |passes: Vec<String>| -> Result<bool, DriverError> {
        let mut o = opts.clone();
        o.import.keep_values = plain.clone();
        // A prefix without `assign-precision` is the fp32 build, without
        // the options only a reduced precision takes.
        if !passes.iter().any(|p| p == AssignPrecision::NAME) {
            o.precision = Default::default();
            o.static_activations = false;
            o.observer = Default::default();
            o.golden = None;
        }
        o.passes = Some(
            (passes.iter())
                .filter(|p| *p != AssignPrecision::NAME)
                .cloned()
                .collect(),
        );
        let outcome = match source.compile_and_run(graph.clone(), &o, inputs) {
            Ok((_, actual)) => Ok(worst(&actual, &expected, tolerance)),
            // A pass the rest of the pipeline needs cannot be left out:
            // that trial fails, and the bisection goes on.
            Err(e @ (DriverError::Cpu(_) | DriverError::Cuda(_) | DriverError::Pass(_))) => {
                Err(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let matched = matches!(&outcome, Ok((_, true)));
        let t = Trial {
            passes,
            outcome: outcome.map(|(c, _)| c),
            matched,
        };
        progress(&t, tolerance);
        trials.push(t);
        Ok(matched)
    };
    let culprit = if trial(pipeline.clone())? {
        Culprit::NoMismatch
    } else if !trial(Vec::new())? {
        Culprit::NoPass
    } else {
        // The prefix of `good` passes matches and that of `bad` does not.
        let (mut good, mut bad) = (0, pipeline.len());
        while bad - good > 1 {
            let mid = (good + bad) / 2;
            match trial(pipeline[..mid].to_vec())? {
                true => good = mid,
                false => bad = mid,
            }
        }
        let name = pipeline[bad - 1].clone();
        let without: Vec<String> = (pipeline.iter())
            .enumerate()
            .filter(|(i, _)| *i != bad - 1)
            .map(|(_, p)| p.clone())
            .collect();
        let removal_matches = trial(without)?;
        Culprit::Pass {
            name,
            removal_matches,
        }
    };
    Ok(Bisection {
        pipeline,
        trials,
        culprit,
        tolerance,
    })
}

/// The output farthest from its reference (relative to its scale; a type
/// or shape mismatch is the worst), and whether every output is within
/// `tolerance`.
fn worst(
    actual: &[Tensor],
    expected: &HashMap<String, Tensor>,
    tolerance: f64,
) -> (Comparison, bool) {
    let checks: Vec<Comparison> = (actual.iter())
        .filter_map(|t| expected.get(&t.name).map(|r| compare(t, r)))
        .collect();
    let all_pass = checks.iter().all(|c| c.passes(tolerance));
    let rank = |c: &Comparison| match c.mismatch {
        Some(_) => f64::INFINITY,
        None if c.rel_error.is_nan() => f64::INFINITY,
        None => c.rel_error,
    };
    let worst = (checks.into_iter()).max_by(|a, b| rank(a).total_cmp(&rank(b)));
    let none = || Comparison {
        name: "(no output has a reference)".into(),
        max_abs_error: 0.0,
        scale: 0.0,
        rel_error: 0.0,
        mismatch: None,
    };
    (worst.unwrap_or_else(none), all_pass)
}
