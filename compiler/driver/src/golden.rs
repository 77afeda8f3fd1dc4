//! The golden self-test an artifact carries (`kiln compile --golden`): input
//! sets read like calibration samples, the outputs the *source* model gives
//! for them (the reference evaluator, before any pass), and one tolerance
//! per output ([`CompileOptions::golden_tolerance`]). `kiln verify` and
//! `Model::verify` run them on the machine at hand.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use kiln_format::{Golden, GoldenSet, GoldenTensor, Tolerance};
use kiln_ir::Graph;

use crate::compare::{compare_data, to_ir, to_runtime};
use crate::error::DriverError;
use crate::options::{CompileOptions, GoldenInputs};
use crate::samples::{npz_files, read_sample};

/// The golden input sets at `path`: one set for a `.npz` file, one per
/// `.npz` file (in name order) for a directory; each with one array per
/// graph input, of its exact dtype and shape.
pub fn read_sets(path: &Path, graph: &Graph) -> Result<Sets, DriverError> {
    let bad = |path: &Path, message: String| DriverError::Golden {
        path: path.to_path_buf(),
        message,
    };
    let files: Vec<PathBuf> = if path.is_dir() {
        npz_files(path)?
    } else {
        vec![path.to_path_buf()]
    };
    if files.is_empty() {
        return Err(bad(
            path,
            "no .npz files (one per input set, one array per model input)".into(),
        ));
    }
    files
        .iter()
        .map(|file| read_sample(file, graph).map_err(|m| bad(file, m)))
        .collect()
}

/// Input sets, each a value per graph input.
type Sets = Vec<Vec<kiln_ir::Tensor>>;

/// The golden input sets `opts.golden` names, and the path to blame for
/// errors: the files of `--golden`, or the first calibration samples.
fn read_inputs(
    graph: &Graph,
    opts: &CompileOptions,
) -> Result<Option<(PathBuf, Sets)>, DriverError> {
    match &opts.golden {
        None => Ok(None),
        Some(GoldenInputs::Path(path)) => Ok(Some((path.clone(), read_sets(path, graph)?))),
        Some(GoldenInputs::Calibration { sets }) => {
            let dir = (opts.calibrate.clone()).ok_or_else(|| {
                DriverError::Usage("--golden-from-calibration needs --calibrate DIR".into())
            })?;
            let files = npz_files(&dir)?;
            let chosen = (files.iter().take(*sets))
                .map(|file| {
                    read_sample(file, graph).map_err(|message| DriverError::Calibration {
                        path: file.clone(),
                        message,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some((dir, chosen)))
        }
    }
}

/// Whether the golden input sets of `opts` fit `graph`'s inputs (the
/// profile they go with, in an artifact of several).
pub(crate) fn fits(graph: &Graph, opts: &CompileOptions) -> bool {
    read_inputs(graph, opts).is_ok()
}

/// Whether the golden input sets of `opts` take, through the model's
/// run-time control flow, the path `guards` describe: each guard's
/// condition program (`graphs[guard.condition]`, before any pass) run by
/// the reference evaluator on every set. Sets that go both ways at one
/// decision are an error: the self-test's expected outputs come from one
/// path's graph.
pub(crate) fn takes_path(
    guards: &[kiln_format::Guard],
    graphs: &[Graph],
    opts: &CompileOptions,
) -> Result<bool, DriverError> {
    for guard in guards {
        let condition = &graphs[guard.condition as usize];
        let Some((path, sets)) = read_inputs(condition, opts)? else {
            return Ok(true);
        };
        let mut values = Vec::with_capacity(sets.len());
        for set in &sets {
            let out =
                kiln_ir::eval::eval_graph(condition, set).map_err(|e| DriverError::Golden {
                    path: path.clone(),
                    message: format!("evaluating a run-time condition: {e}"),
                })?;
            values.push(out[0].data().get_f64(0) != 0.0);
        }
        if values.iter().any(|&v| v != values[0]) {
            return Err(DriverError::Golden {
                path,
                message: format!(
                    "the input sets take different paths of the model's run-time control flow (condition {values:?}); the self-test compares with one path's outputs: give sets that take one path"
                ),
            });
        }
        if values.first() != Some(&guard.holds) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Why the golden input sets of `opts` do not fit `graph`, for messages.
pub(crate) fn fits_error(graph: &Graph, opts: &CompileOptions) -> String {
    read_inputs(graph, opts)
        .err()
        .map_or_else(String::new, |e| e.to_string())
}

/// Where the golden sets of `opts` come from, for people: `None` without a
/// self-test.
pub fn describe(opts: &CompileOptions) -> Option<String> {
    match &opts.golden {
        None => None,
        Some(GoldenInputs::Path(path)) => Some(format!("the input sets of {}", path.display())),
        Some(GoldenInputs::Calibration { sets }) => Some(format!(
            "the first {sets} calibration sample(s) of {} (in name order)",
            opts.calibrate
                .as_deref()
                .unwrap_or(Path::new("?"))
                .display()
        )),
    }
}

/// The GOLDEN section for `graph` (the imported source graph) and the
/// input sets of `opts.golden`; empty without one.
pub fn build(graph: &Graph, opts: &CompileOptions) -> Result<Golden<'static>, DriverError> {
    let Some((path, sets)) = read_inputs(graph, opts)? else {
        return Ok(Golden::default());
    };
    let tolerance = opts.golden_tolerance(graph);
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(DriverError::Usage(format!(
            "--golden-tolerance {tolerance} must be a finite number of at least 0"
        )));
    }
    let inputs: Vec<&str> = graph
        .inputs()
        .iter()
        .map(|&i| graph.node(i).name.as_str())
        .collect();
    let outputs: Vec<&str> = graph.outputs().iter().map(|(n, _)| n.as_str()).collect();
    let mut golden = Golden {
        sets: Vec::with_capacity(sets.len()),
        tolerances: (outputs.iter())
            .map(|o| Tolerance {
                output: (*o).to_owned(),
                max_rel_error: tolerance,
            })
            .collect(),
    };
    for (i, set) in sets.iter().enumerate() {
        let expected = kiln_ir::eval::eval_graph(graph, set).map_err(|e| DriverError::Golden {
            path: path.clone(),
            message: format!("set {i}: the reference evaluator failed: {e}"),
        })?;
        golden.sets.push(GoldenSet {
            inputs: tensors(&inputs, set),
            outputs: tensors(&outputs, &expected),
        });
    }
    Ok(golden)
}

/// How far the compiled build's own computation lies from the source
/// model on the golden sets, for one output whose tolerance it changed or
/// exceeds.
#[derive(Clone, Debug, PartialEq)]
pub struct ToleranceFit {
    /// The output.
    pub output: String,
    /// The largest error, relative to the output's scale, of the optimized
    /// graph (the reference evaluator on the IR that code generation
    /// receives) against the golden outputs, over the sets.
    pub measured: f64,
    /// The tolerance before the fit: by the build's precision, or given.
    pub before: f64,
    /// The tolerance stored.
    pub after: f64,
}

/// Margin over the build's measured departure from the source: the
/// kernels round differently from the reference evaluator (int8 ties, f16
/// conversions, sums in another order).
const FIT_MARGIN: f64 = 1.25;

/// Fits the self-test's tolerances to the build. Reduced precision departs
/// from the source model by what it is (a detection map's pixel at its
/// threshold moves by most of the scale in int8), so a tolerance from the
/// precision's table alone would fail `kiln verify` on a correct artifact.
/// The optimized `graph` runs through the reference evaluator on every
/// golden set; an output whose departure times [`FIT_MARGIN`] exceeds its
/// tolerance gets that as its tolerance, unless the tolerance was given
/// (`--golden-tolerance`), which stays (the fit is then a warning that
/// `verify` will fail). Returns the outputs it concerned.
pub fn fit_tolerances(
    golden: &mut Golden<'static>,
    graph: &Graph,
    given: bool,
) -> Result<Vec<ToleranceFit>, DriverError> {
    let mut measured = vec![0f64; golden.tolerances.len()];
    for (i, set) in golden.sets.iter().enumerate() {
        let bad = |message: String| DriverError::Golden {
            path: PathBuf::from(format!("(golden set {i})")),
            message,
        };
        let inputs = (graph.inputs().iter())
            .map(|&id| {
                let name = &graph.node(id).name;
                (set.inputs.iter())
                    .find(|t| &t.name == name)
                    .and_then(|t| to_ir(t.dtype, &t.shape, &t.data))
                    .ok_or_else(|| bad(format!("no value for input '{name}'")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let got = kiln_ir::eval::eval_graph(graph, &inputs).map_err(|e| {
            bad(format!(
                "the reference evaluator failed on the optimized graph: {e}"
            ))
        })?;
        for ((name, _), value) in graph.outputs().iter().zip(&got) {
            let Some(k) = golden.tolerances.iter().position(|t| &t.output == name) else {
                continue;
            };
            let Some(want) = set.outputs.iter().find(|t| &t.name == name) else {
                continue;
            };
            let got = to_runtime(name, value);
            let c = compare_data(
                name,
                (got.dtype, &got.shape, &got.data),
                (want.dtype, &want.shape, &want.data),
            );
            let error = match c.mismatch {
                Some(_) => f64::INFINITY,
                None => c.rel_error,
            };
            measured[k] = measured[k].max(error);
        }
    }
    let mut fits = Vec::new();
    for (t, m) in golden.tolerances.iter_mut().zip(measured) {
        let needed = m * FIT_MARGIN;
        if needed <= t.max_rel_error {
            continue;
        }
        let before = t.max_rel_error;
        if !given && needed.is_finite() {
            t.max_rel_error = needed;
        }
        fits.push(ToleranceFit {
            output: t.output.clone(),
            measured: m,
            before,
            after: t.max_rel_error,
        });
    }
    Ok(fits)
}

fn tensors(names: &[&str], values: &[kiln_ir::Tensor]) -> Vec<GoldenTensor<'static>> {
    (names.iter().zip(values))
        .map(|(name, t)| GoldenTensor {
            name: (*name).to_owned(),
            dtype: t.dtype(),
            shape: t.shape().iter().map(|&d| d as u64).collect(),
            data: Cow::Owned(t.data().to_le_bytes()),
        })
        .collect()
}
