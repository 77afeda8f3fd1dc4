//! Calibration: what the precision stage measures on sample inputs and
//! the one entry point the driver calls ([`assign`]). It measures the
//! smoothing divisors (`--smooth`) and the static activation ranges
//! (`--quantize static`), runs `assign-precision` (measuring int8 bias
//! corrections on calibration samples), compares the result with the f32
//! graph layer by layer and, with a `max_rel_error`, raises the layers that
//! add the most error to fp32 until the graph outputs meet the bound.

use super::assign::AssignPrecision;
use super::bias_correction::{measure_bias_corrections, BiasCorrections};
use super::measured::Measured;
use super::plan::PrecisionPlan;
use super::policy::Policy;
use super::quantize::Observer;
use super::report::{compare as compare_precision, AccuracyReport, LayerError};
use super::smooth::{channel_axis, smoothing_factors, Smoothing};
use super::types::{is_precision_layer, Decision, Precision};
use crate::manager::PassRecord;
use crate::pass::PassError;
use kiln_ir::{DType, Data, Graph, NodeId, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The sample inputs of a calibration, and where they come from: random
/// samples check that the build runs and give a rough error report, but
/// teach nothing (no bias corrections; the report says they are random).
#[derive(Clone, Copy, Debug)]
pub enum Samples<'a> {
    /// Deterministic random inputs ([`random_samples`]).
    Random(&'a [Vec<Tensor>]),
    /// The user's calibration data (`--calibrate DIR`).
    Calibration(&'a [Vec<Tensor>]),
}

impl<'a> Samples<'a> {
    /// The samples, one tensor per graph input each.
    pub fn tensors(self) -> &'a [Vec<Tensor>] {
        match self {
            Samples::Random(s) | Samples::Calibration(s) => s,
        }
    }

    /// Whether they are random inputs.
    pub fn is_random(self) -> bool {
        matches!(self, Samples::Random(_))
    }
}

/// How int8 layers quantize their activations.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activations {
    /// Ranges computed at run time (`--quantize dynamic`).
    Dynamic,
    /// Ranges observed on the samples at compile time (`--quantize static`).
    Static(Observer),
}

/// Whether static int8 layers' biases are corrected by their mean output
/// error on calibration samples (random samples never correct them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BiasCorrection {
    /// Measure the corrections and apply them.
    Measure,
    /// Leave the biases as they are (`--no-bias-correction`; dynamic
    /// builds, whose artifact should not depend on the samples).
    Off,
}

/// Everything the precision stage needs besides the graph.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// What the user asked for.
    pub policy: &'a Policy,
    /// The sample inputs.
    pub samples: Samples<'a>,
    /// How int8 activations are quantized.
    pub activations: Activations,
    /// `--smooth`: the migration strength α, when int8 activations are
    /// smoothed.
    pub smooth_alpha: Option<f32>,
    /// Whether static int8 biases are corrected.
    pub bias_correction: BiasCorrection,
    /// `--max-rel-error`: the bound the graph outputs must meet.
    pub max_rel_error: Option<f64>,
}

/// The precision stage: measures what the policy needs on the samples,
/// assigns precisions to `graph` and compares it with the f32 graph,
/// falling back to fp32 layer by layer while `max_rel_error` is missed.
pub fn assign(
    graph: &mut Graph,
    request: &Request,
    progress: &dyn Progress,
) -> Result<(PassRecord, PrecisionOutcome), PassError> {
    let samples = request.samples.tensors();
    let mut measured = Measured::default();
    if let Some(alpha) = request.smooth_alpha {
        progress.begin("measuring smoothing", None);
        let smoothing = smoothing_factors(graph, samples, alpha);
        progress.end();
        measured.smoothing = smoothing.map_err(|source| PassError::Failed {
            pass: AssignPrecision::NAME,
            source,
        })?;
    }
    if let Activations::Static(observer) = request.activations {
        measured.activation_ranges = Some(activation_ranges(
            graph,
            samples,
            observer,
            &measured.smoothing,
            progress,
        )?);
    }
    assign_with_fallback(graph, measured, request, progress)
}

/// Where long compile work reports how far it got: the `kiln` command
/// draws bars on a terminal, a library caller reports nowhere
/// ([`Silent`]). Every method has an empty default.
pub trait Progress {
    /// A stage begins: `total` steps, or `None` for work of unknown length.
    fn begin(&self, _stage: &str, _total: Option<u64>) {}
    /// One more step of the current stage is done; `note` says which.
    fn step(&self, _note: &str) {}
    /// The current stage is done.
    fn end(&self) {}
}

/// Reports nothing.
pub struct Silent;

impl Progress for Silent {}

/// What `assign-precision` decided and what it cost in accuracy.
#[derive(Clone, Debug)]
pub struct PrecisionOutcome {
    /// Every dense node's precision and the reason.
    pub decisions: Vec<Decision>,
    /// Errors against the f32 graph (`None` with `--calibrate-random 0`).
    pub report: Option<AccuracyReport>,
    /// The decisions as a plan file (`--emit-plan`).
    pub plan: PrecisionPlan,
    /// The int8 layers' activation smoothing divisors (`--smooth`).
    pub smoothing: Smoothing,
    /// The int8 layers' bias corrections.
    pub bias_corrections: BiasCorrections,
    /// The static int8 layers' calibrated activation ranges, by node name
    /// (empty for dynamic int8 and the float precisions).
    pub activation_ranges: BTreeMap<String, (f32, f32)>,
}

/// Deterministic calibration inputs for `graph` (SplitMix64 per sample):
/// floats uniform in [-1, 1), integers 1 (a valid token id, mask value and
/// index for every model Kiln has seen), booleans true.
pub fn random_samples(graph: &Graph, count: usize) -> Vec<Vec<Tensor>> {
    (0..count)
        .map(|sample| {
            graph
                .inputs()
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    let ty = &graph.node(id).ty;
                    let n = ty.num_elements();
                    let mut state = (sample as u64 * 1_000_003 + i as u64) ^ 0x9E37_79B9_7F4A_7C15;
                    let mut unit = move || {
                        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                        let mut z = state;
                        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
                    };
                    let data = match ty.dtype {
                        DType::F32 => Data::F32((0..n).map(|_| unit() as f32).collect()),
                        DType::F64 => Data::F64((0..n).map(|_| unit()).collect()),
                        DType::Bool => Data::Bool(vec![true; n]),
                        d => Data::from_i64s(d, std::iter::repeat_n(1, n)),
                    };
                    Tensor::new(&ty.shape, data).expect("element count")
                })
                .collect()
        })
        .collect()
}

/// Runs `assign-precision` on `graph` (the f32 graph after the pipeline)
/// and compares it with the f32 graph on `samples`. With
/// [`BiasCorrection::Measure`] and calibration (not random) samples, the
/// int8 layers' bias corrections are measured on the first assignment and
/// the assignment redone with them ([`measure_bias_corrections`]).
fn assign_once(
    graph: &mut Graph,
    pass: AssignPrecision,
    samples: Samples,
    bias_correction: BiasCorrection,
) -> Result<(PassRecord, PrecisionOutcome), PassError> {
    let (samples, random) = (samples.tensors(), samples.is_random());
    let reference = graph.clone();
    let mut pass = pass;
    let start = std::time::Instant::now();
    let (mut stats, mut decisions) = pass.assign(graph)?;
    let int8: Vec<String> = (decisions.iter())
        .filter(|d| d.precision == Precision::Int8)
        .map(|d| d.node.clone())
        .collect();
    if bias_correction == BiasCorrection::Measure
        && !random
        && !samples.is_empty()
        && !int8.is_empty()
    {
        pass.measured.bias_corrections =
            measure_bias_corrections(&reference, graph, &int8, samples).map_err(|source| {
                PassError::Failed {
                    pass: AssignPrecision::NAME,
                    source,
                }
            })?;
        *graph = reference.clone();
        (stats, decisions) = pass.assign(graph)?;
    }
    let time = start.elapsed();
    kiln_ir::verify::verify(graph).map_err(|source| PassError::Verify {
        pass: AssignPrecision::NAME,
        source,
    })?;
    let report = if samples.is_empty() {
        None
    } else {
        Some(
            compare_precision(&reference, graph, &decisions, samples, random).map_err(
                |source| PassError::Failed {
                    pass: AssignPrecision::NAME,
                    source,
                },
            )?,
        )
    };
    let record = PassRecord {
        name: "assign-precision",
        stats,
        time,
        nodes_after: graph.node_count(),
    };
    let plan = PrecisionPlan::from_decisions(&reference, &decisions, report.as_ref()).map_err(
        |source| PassError::Failed {
            pass: AssignPrecision::NAME,
            source,
        },
    )?;
    Ok((
        record,
        PrecisionOutcome {
            smoothing: (pass.measured.smoothing.into_iter())
                .filter(|(name, _)| int8.contains(name))
                .collect(),
            bias_corrections: pass.measured.bias_corrections,
            activation_ranges: (pass.measured.activation_ranges.into_iter().flatten())
                .filter(|(name, _)| int8.contains(name))
                .collect(),
            decisions,
            report,
            plan,
        },
    ))
}

/// `assign-precision` with the error-driven fallback: without
/// `max_rel_error` one assignment; with it, while the worst graph output
/// misses the bound, the reduced-precision layer with the largest error in
/// the last report is raised to fp32 (recorded as
/// [`Reason::ErrorFallback`]) and the assignment redone on the f32 graph.
/// Ends when the bound is met or every layer is fp32.
fn assign_with_fallback(
    graph: &mut Graph,
    mut measured: Measured,
    request: &Request,
    progress: &dyn Progress,
) -> Result<(PassRecord, PrecisionOutcome), PassError> {
    let samples = request.samples.tensors();
    progress.begin(
        &format!("assigning precision on {} samples", samples.len()),
        None,
    );
    loop {
        let mut candidate = graph.clone();
        let pass = AssignPrecision {
            policy: request.policy.clone(),
            measured: measured.clone(),
        };
        let (record, outcome) = assign_once(
            &mut candidate,
            pass,
            request.samples,
            request.bias_correction,
        )?;
        let raise = match (request.max_rel_error, &outcome.report) {
            (Some(bound), Some(report)) => {
                let worst = report.outputs.iter().map(|o| o.rel_l2).fold(0.0, f64::max);
                let introduced = introduced_errors(graph, report);
                let layer = introduced
                    .iter()
                    .filter(|(l, _)| {
                        l.precision != Precision::Fp32 && !measured.fallback.contains_key(&l.node)
                    })
                    .max_by(|a, b| a.1.total_cmp(&b.1));
                match layer {
                    Some((l, added)) if worst > bound => Some((
                        l.node.clone(),
                        format!(
                            "it added the most error ({added:.3e}; {:.3e} at its output) while the graph output error was {worst:.3e} > {bound:e}",
                            l.rel_l2
                        ),
                    )),
                    _ => None,
                }
            }
            _ => None,
        };
        match raise {
            Some((node, why)) => {
                progress.step(&format!(
                    "{} layer(s) raised to fp32, last {node}",
                    measured.fallback.len() + 1
                ));
                measured.fallback.insert(node, why);
            }
            None => {
                progress.end();
                *graph = candidate;
                return Ok((record, outcome));
            }
        }
    }
}

/// Each measured layer with the error it adds: its relative L2 error
/// minus the largest error among the nearest dense layers it reads from
/// (errors accumulate along the network, so the layer nearest the output
/// would otherwise always look worst).
fn introduced_errors<'r>(graph: &Graph, report: &'r AccuracyReport) -> Vec<(&'r LayerError, f64)> {
    let dense = |id: NodeId| is_precision_layer(&graph.node(id).op);
    let by_name: HashMap<&str, NodeId> = graph
        .node_ids()
        .filter(|&id| dense(id))
        .map(|id| (graph.node(id).name.as_str(), id))
        .collect();
    let error_of: HashMap<NodeId, f64> = report
        .layers
        .iter()
        .filter_map(|l| Some((*by_name.get(l.node.as_str())?, l.rel_l2)))
        .collect();
    report
        .layers
        .iter()
        .map(|l| {
            let Some(&start) = by_name.get(l.node.as_str()) else {
                return (l, l.rel_l2);
            };
            let mut upstream = 0.0f64;
            let mut seen = HashSet::new();
            let mut stack = graph.inputs_of(start);
            while let Some(id) = stack.pop() {
                if !seen.insert(id) {
                    continue;
                }
                match error_of.get(&id) {
                    Some(&e) => upstream = upstream.max(e),
                    None => stack.extend(graph.inputs_of(id)),
                }
            }
            (l, l.rel_l2 - upstream)
        })
        .collect()
}

/// Most values of one activation kept for an observer: a larger tensor is
/// sampled with a stride (every sample contributes its share).
const MAX_OBSERVED_VALUES: usize = 1 << 22;

/// The activation ranges of `--quantize static`: every MatMul/Gemm's left
/// operand and every Conv's input observed over `samples` and reduced to a
/// range by `observer`, by node name. An activation smoothed for its
/// layers (`smoothing`, see [`smoothing_factors`]) is observed divided by
/// their divisors, as it is quantized.
pub fn activation_ranges(
    graph: &Graph,
    samples: &[Vec<Tensor>],
    observer: Observer,
    smoothing: &Smoothing,
    progress: &dyn Progress,
) -> Result<BTreeMap<String, (f32, f32)>, PassError> {
    // Every value read as an activation, with the dense nodes reading it
    // and its divisors (shared by its readers) along their channel axis.
    type Divisors<'s> = Option<(&'s [f32], usize)>;
    let mut readers: HashMap<NodeId, (Vec<String>, Divisors)> = HashMap::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        if is_precision_layer(&node.op) {
            let x = graph.inputs_of(id)[0];
            let rank = graph.node(x).ty.shape.len();
            let divisors =
                (smoothing.get(&node.name)).map(|m| (m.as_slice(), channel_axis(&node.op, rank)));
            let entry = readers.entry(x).or_default();
            entry.0.push(node.name.clone());
            entry.1 = entry.1.or(divisors);
        }
    }
    let mut observed: HashMap<NodeId, Vec<f32>> = HashMap::new();
    let per_sample = MAX_OBSERVED_VALUES / samples.len().max(1);
    let mut observe = |id: NodeId, t: &Tensor| {
        let Some((_, divisors)) = readers.get(&id) else {
            return;
        };
        let mut v = t.to_f32_vec();
        if let Some((m, axis)) = divisors {
            let inner: usize = t.shape().iter().skip(axis + 1).product();
            for (i, x) in v.iter_mut().enumerate() {
                *x /= m[(i / inner) % m.len()];
            }
        }
        let stride = v.len().div_ceil(per_sample.max(1)).max(1);
        let kept = observed.entry(id).or_default();
        kept.extend(v.iter().step_by(stride));
        // The extremes always count, whatever the stride skipped.
        let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        kept.extend([lo, hi]);
    };
    progress.begin("observing activations", Some(samples.len() as u64));
    for (i, sample) in samples.iter().enumerate() {
        for (&id, t) in graph.inputs().iter().zip(sample) {
            observe(id, t);
        }
        kiln_ir::eval::eval_graph_with(graph, sample, &mut observe).map_err(|source| {
            PassError::Failed {
                pass: AssignPrecision::NAME,
                source,
            }
        })?;
        progress.step(&format!("sample {}", i + 1));
    }
    progress.end();
    let mut ranges = BTreeMap::new();
    for (id, (names, _)) in readers {
        if let Some(values) = observed.get(&id) {
            let range = super::quantize::observe(values, observer);
            for name in names {
                ranges.insert(name, range);
            }
        }
    }
    Ok(ranges)
}
