//! A compilation and an artifact as JSON (`kiln compile --json`, `kiln
//! inspect --json`, the precision report, the Python binding) and the
//! warnings about dense ops that missed the microkernels.

use crate::{DriverError, Target};
use kiln_format::{self as format, Artifact, ArtifactView, Code, TensorSpec};
use kiln_ir::Graph;
use kiln_passes::PrecisionOutcome;
use serde_json::{json, Value};

/// Kernels of an artifact: CPU functions, or the kernels of a CUDA
/// artifact's modules (0 when they do not decode).
pub fn kernel_count(a: &Artifact) -> usize {
    a.code().map_or(0, |c| c.kernel_count())
}

/// Tensor specs (inputs or outputs) as JSON: name, dtype, shape.
pub fn specs_json(specs: &[TensorSpec]) -> Value {
    Value::Array(
        specs
            .iter()
            .map(|s| json!({"name": s.name, "dtype": s.dtype.to_string(), "shape": s.shape}))
            .collect(),
    )
}

/// One layer's error against fp32 as JSON.
pub fn layer_json(l: &kiln_passes::LayerError) -> Value {
    json!({"node": l.node, "op": l.op, "precision": l.precision.name(), "rel_l2": l.rel_l2, "cosine": l.cosine, "max_abs": l.max_abs})
}

/// The precision decisions and accuracy report as JSON (`--json`,
/// `--report`).
pub fn precision_json(p: &PrecisionOutcome) -> Value {
    let decisions: Vec<Value> = p
        .decisions
        .iter()
        .map(|d| {
            let mut v = json!({"node": d.node, "op": d.op, "precision": d.precision.name(), "reason": d.reason.to_string()});
            if let Some(m) = p.smoothing.get(&d.node) {
                let (lo, hi) = min_max(m);
                v["smoothing_divisors"] = json!({"channels": m.len(), "min": lo, "max": hi});
            }
            if let Some(c) = p.bias_corrections.get(&d.node) {
                v["bias_correction_max_abs"] = json!(largest_abs(c));
            }
            v
        })
        .collect();
    let report = p.report.as_ref().map(|r| {
        json!({
            "samples": r.samples,
            "random_inputs": r.random,
            "outputs": r.outputs.iter().map(layer_json).collect::<Vec<_>>(),
            "layers_worst_first": r.layers.iter().map(layer_json).collect::<Vec<_>>(),
        })
    });
    json!({"decisions": decisions, "report": report})
}

/// The smallest and largest value of `v` (∞ and −∞ when empty).
pub fn min_max(v: &[f32]) -> (f32, f32) {
    (v.iter()).fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
        (lo.min(x), hi.max(x))
    })
}

/// The largest magnitude in `v` (0 when empty).
pub fn largest_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// `kiln inspect --json` of an artifact: what every artifact has, then
/// what its code holds (machine code: arch, CPU features, functions,
/// relocations, steps; CUDA: SM, PTX and cubin sizes, kernels with their
/// launch plan and ptxas's registers, launches).
pub fn artifact_json(view: &ArtifactView, code: &Code) -> Value {
    let m = &view.metadata;
    let first = &view.profiles[0];
    let mut v = json!({
        "kind": "artifact",
        "format_version": view.header.version,
        "content_sha256": hex(&view.header.content_hash),
        "compiler": m.compiler_version,
        "target": m.target,
        "options": m.options,
        "source_sha256": hex(&m.source_sha256),
        "inputs": specs_json(&first.inputs),
        "outputs": specs_json(&first.outputs),
        "arena_bytes": view.arena_size(),
        "weights_bytes": view.weights.len(),
        "dense_kernels": dense_kernels_json(&first.dense_kernels),
        "profiles": profiles_json(&view.profiles),
        "padding": padding_json(&view.padding),
        "bounded": bounded_json(first),
        "golden": golden_json(&view.golden),
    });
    match code {
        Code::Machine {
            text,
            kernels,
            relocs,
        } => {
            let kernels: Vec<Value> = (kernels.iter())
                .map(|k| json!({"name": k.name, "text_offset": k.text_offset, "text_len": k.text_len}))
                .collect();
            v["arch"] = json!(format!("{:?}", view.header.arch));
            v["features"] = json!(view.header.features.names());
            v["code_bytes"] = json!(text.len());
            v["relocations"] = json!(relocs.len());
            v["kernels"] = json!(kernels);
            v["schedule_steps"] = json!(first.schedule.len());
        }
        Code::Cuda(code) => {
            let assembled = !code.cubin.is_empty();
            let kernels: Vec<Value> = (code.kernels.iter())
                .map(|k| {
                    json!({
                        "name": k.name, "node": k.node, "grid": k.grid, "block": k.block,
                        "dynamic_shared_bytes": k.shared_bytes,
                        "registers": assembled.then_some(k.registers),
                        "spill_bytes": assembled.then_some(k.spill_bytes),
                        "static_shared_bytes": assembled.then_some(k.static_shared_bytes),
                    })
                })
                .collect();
            v["arch"] = json!("nvptx64");
            v["sm"] = json!(code.sm);
            v["ptx_bytes"] = json!(code.ptx.len());
            v["cubin_bytes"] = json!(code.cubin.len());
            v["kernels"] = json!(kernels);
            v["schedule_steps"] = json!(code.schedule.len());
        }
    }
    v
}

/// The golden self-test: per set its inputs' and outputs' types, and the
/// tolerance per output; `null` when the artifact has none.
pub fn golden_json(g: &format::Golden<'_>) -> Value {
    if g.is_empty() {
        return Value::Null;
    }
    let types = |ts: &[format::GoldenTensor<'_>]| -> Value {
        ts.iter()
            .map(|t| json!({"name": t.name, "type": t.type_string()}))
            .collect()
    };
    let sets: Vec<Value> = (g.sets.iter())
        .map(|s| json!({"inputs": types(&s.inputs), "outputs": types(&s.outputs)}))
        .collect();
    let tolerances: serde_json::Map<String, Value> = (g.tolerances.iter())
        .map(|t| (t.output.clone(), json!(t.max_rel_error)))
        .collect();
    json!({"sets": sets, "tolerances": tolerances})
}

/// `x` in scientific notation with at most 4 significant digits and no
/// trailing zeros: `1e-4`, `1.5e-1`, `1.241e0`.
fn short_e(x: f64) -> String {
    let text = format!("{x:.3e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) if mantissa.contains('.') => {
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e{exponent}")
        }
        _ => text,
    }
}

/// The golden tolerances fitted to the build, for `--json`.
pub fn golden_fits_json(fits: &[crate::golden::ToleranceFit]) -> Value {
    let fits: Vec<Value> = (fits.iter())
        .map(|f| json!({"output": f.output, "measured": f.measured, "before": f.before, "after": f.after}))
        .collect();
    json!(fits)
}

/// One line per fitted golden tolerance, for people: raised to the
/// build's departure from the source, or (a given tolerance) a warning
/// that `kiln verify` will fail.
pub fn golden_fit_lines(fits: &[crate::golden::ToleranceFit]) -> Vec<String> {
    (fits.iter())
        .map(|f| {
            let how = format!(
                "the build departs from the source model by {:.3e} of the output's scale on these sets (the reference evaluator on the optimized graph)",
                f.measured
            );
            if f.after > f.before {
                let weak = match f.after >= 1.0 {
                    true => "; at that tolerance this output can hardly show a fault: give sets away from its decision boundaries, or check an fp32 build",
                    false => "",
                };
                format!(
                    "golden: the tolerance of '{}' is {}, not {}: {how}{weak}",
                    f.output,
                    short_e(f.after),
                    short_e(f.before)
                )
            } else {
                format!(
                    "warning: golden: '{}': {how}, beyond --golden-tolerance {}; `kiln verify` will fail",
                    f.output,
                    short_e(f.before)
                )
            }
        })
        .collect()
}

/// One line for people: how many golden sets and their tolerances, or
/// `None` when the artifact has none.
pub fn golden_summary(g: &format::Golden<'_>) -> Option<String> {
    if g.is_empty() {
        return None;
    }
    let mut tolerances: Vec<f64> = g.tolerances.iter().map(|t| t.max_rel_error).collect();
    tolerances.dedup();
    let tolerance = match tolerances.as_slice() {
        [t] => format!("tolerance {} of each output's scale", short_e(*t)),
        _ => (g.tolerances.iter())
            .map(|t| format!("{} {}", t.output, short_e(t.max_rel_error)))
            .collect::<Vec<_>>()
            .join(", "),
    };
    Some(format!(
        "golden self-test: {} input set(s), {tolerance} (run it with `kiln verify`)",
        g.sets.len()
    ))
}

/// The kernel chosen for each dense node, with the candidates that
/// declined before it and why.
pub fn dense_kernels_json(kernels: &[format::DenseKernel]) -> Value {
    let rows: Vec<Value> = kernels
        .iter()
        .map(|k| {
            let declined: Vec<Value> = (k.declined.iter())
                .map(|d| json!({"kernel": d.kernel, "reason": d.reason}))
                .collect();
            json!({
                "node": k.node,
                "op": k.op,
                "kernel": k.kernel,
                "flops": k.flops,
                "generic": k.is_generic(),
                "declined": declined,
            })
        })
        .collect();
    json!(rows)
}

/// The outputs of `profile` whose size depends on the data (NonZero,
/// Compress, TopK of a run-time k): name, axis and bound.
pub fn bounded_json(profile: &format::Profile) -> Value {
    let list: Vec<Value> = (profile.bounded.iter())
        .filter_map(|b| {
            let spec = profile.outputs.get(b.output as usize)?;
            let bound = spec.shape.get(b.axis as usize)?;
            Some(json!({"output": spec.name, "axis": b.axis, "bound": bound}))
        })
        .collect();
    json!(list)
}

/// The dims runs may pad (`--pad-dim`): name, and the axis of each input
/// and output (null where it has none).
pub fn padding_json(padding: &[format::PaddableDim]) -> Value {
    let list: Vec<Value> = (padding.iter())
        .map(|d| json!({"dim": d.name, "input_axes": d.inputs, "output_axes": d.outputs}))
        .collect();
    json!(list)
}

/// Each profile's input and output shapes, arena and step count.
fn profiles_json(profiles: &[format::Profile]) -> Value {
    let list: Vec<Value> = (profiles.iter())
        .map(|p| {
            json!({
                "inputs": specs_json(&p.inputs),
                "outputs": specs_json(&p.outputs),
                "arena_bytes": p.arena_size,
                "schedule_steps": p.schedule.len(),
                "role": role_json(&p.role),
            })
        })
        .collect();
    json!(list)
}

/// A profile's role: `{"kind": "model", "guards": [...]}`, `refused`
/// with its reason, or `condition` with what it computes.
pub fn role_json(role: &format::Role) -> Value {
    let guards = |guards: &[format::Guard]| -> Value {
        (guards.iter())
            .map(|g| json!({"condition": g.condition, "holds": g.holds}))
            .collect()
    };
    match role {
        format::Role::Model { guards: g } => json!({"kind": "model", "guards": guards(g)}),
        format::Role::Refused { guards: g, reason } => {
            json!({"kind": "refused", "guards": guards(g), "reason": reason})
        }
        format::Role::Condition { what } => json!({"kind": "condition", "what": what}),
    }
}

/// A profile's role in words, for listings: empty for a profile its
/// shapes alone select.
pub fn describe_role(role: &format::Role, profiles: &[format::Profile]) -> String {
    let path = |guards: &[format::Guard]| {
        format::describe_conditions(profiles, guards.iter().map(|g| (g.condition, g.holds)))
    };
    match role {
        format::Role::Model { guards } if guards.is_empty() => String::new(),
        format::Role::Model { guards } => format!("variant where {}", path(guards)),
        format::Role::Refused { guards, reason } => {
            format!("refused path where {}: {reason}", path(guards))
        }
        format::Role::Condition { what } => format!("condition program: {what}"),
    }
}

/// Dense ops of at least this many FLOPs on the generic kernel get a
/// warning from `kiln compile`.
pub const GENERIC_WARN_FLOPS: u64 = 1_000_000;

/// One line per dense node of at least [`GENERIC_WARN_FLOPS`] that an
/// x86-64 build runs on the generic kernel: the node, its cost and why
/// each microkernel declined.
pub fn generic_dense_warnings(artifact: &Artifact) -> Vec<String> {
    if artifact.arch != format::Arch::X86_64 {
        return Vec::new();
    }
    let several = artifact.profiles.len() > 1;
    (artifact.profiles.iter().enumerate())
        .flat_map(|(p, profile)| {
            (profile.dense_kernels.iter())
                .filter(|k| k.is_generic() && k.flops >= GENERIC_WARN_FLOPS)
                .map(move |k| {
                    let why: Vec<String> = (k.declined.iter())
                        .map(|d| format!("{}: {}", d.kernel, d.reason))
                        .collect();
                    let which = match several {
                        true => format!(" in profile {p}"),
                        false => String::new(),
                    };
                    format!(
                        "warning: node '{}'{which} ({}, {:.1} MFLOP) runs on the generic kernel, not a microkernel: {}",
                        k.node,
                        k.op,
                        k.flops as f64 / 1e6,
                        why.join("; ")
                    )
                })
        })
        .collect()
}

/// Lowercase hex of `bytes` (digests in reports).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// CPU targets: the arena plan of `graph`'s values as JSON (`plan-memory`'s
/// view: planned bytes against their sum; the artifact's arena also holds
/// the kernels' scratch), planned again only for this report. `None` for
/// CUDA targets.
pub fn memory_json(target: Target, graph: &Graph) -> Result<Option<Value>, DriverError> {
    let m = match target {
        Target::Cpu(_) => kiln_target_cpu::plan_stats(graph)?,
        Target::Cuda(_) => return Ok(None),
    };
    Ok(Some(json!({
        "planned_bytes": m.arena_bytes,
        "peak_live_bytes": m.peak_live_bytes,
        "sum_of_values_bytes": m.total_bytes,
        "values": m.values,
        "buffers": m.buffers,
        "in_place": m.in_place,
        "aliases": m.aliases,
    })))
}

/// The file name of held-out sample `i` (its index when unknown).
pub(crate) fn sample_name(v: &crate::Validated, i: usize) -> String {
    (v.files.get(i))
        .and_then(|f| f.file_name())
        .map_or_else(|| format!("#{i}"), |n| n.to_string_lossy().into_owned())
}

/// Calibration coverage (`--validate`) as JSON: per static int8 layer its
/// range, clipped share, largest overshoot, the samples that clipped and
/// whether it is over `warn`; per output its agreement with fp32.
pub fn coverage_json(v: &crate::Validated, warn: f64) -> Value {
    let layers: Vec<Value> = (v.coverage.layers.iter())
        .map(|l| {
            let samples: Vec<String> = l.samples.iter().map(|&i| sample_name(v, i)).collect();
            json!({
                "node": l.node, "range": [l.range.0, l.range.1], "values": l.values,
                "clipped": l.clipped, "clipped_share": l.clipped_share(),
                "max_overshoot": l.max_overshoot, "samples": samples,
                "warning": l.clipped_share() > warn,
            })
        })
        .collect();
    let outputs: Vec<Value> = (v.coverage.outputs.iter())
        .map(|o| json!({"output": o.output, "rel_l2": o.rel_l2, "cosine": o.cosine, "argmax_agreement": o.argmax_agreement}))
        .collect();
    json!({"samples": v.coverage.samples, "warn_share": warn, "layers": layers, "outputs": outputs})
}

/// One warning line per static int8 layer whose clipped share on the
/// held-out samples is over `warn`, naming it and the samples that caused
/// it.
pub fn coverage_warnings(v: &crate::Validated, warn: f64) -> Vec<String> {
    (v.coverage.layers.iter())
        .filter(|l| l.clipped_share() > warn)
        .map(|l| {
            let samples: Vec<String> = l.samples.iter().map(|&i| sample_name(v, i)).collect();
            format!(
                "warning: int8 layer '{}': {:.3}% of its activation values on the held-out samples fall outside the calibrated range [{:.4}, {:.4}] and are clipped (largest overshoot {:.4}; samples {}): add such inputs to --calibrate",
                l.node,
                100.0 * l.clipped_share(),
                l.range.0,
                l.range.1,
                l.max_overshoot,
                samples.join(", ")
            )
        })
        .collect()
}

/// One line per graph output: the int8 build against fp32 on the held-out
/// samples.
pub fn coverage_summary(v: &crate::Validated) -> Vec<String> {
    let mut lines = vec![format!(
        "calibration coverage on {} held-out sample(s): {} int8 layer(s) measured",
        v.coverage.samples,
        v.coverage.layers.len()
    )];
    for o in &v.coverage.outputs {
        let argmax = o.argmax_agreement.map_or(String::new(), |a| {
            format!(", argmax agreement {:.2}%", 100.0 * a)
        });
        lines.push(format!(
            "  output {}: rel L2 {:.3e}, cosine {:.6}{argmax} (int8 against fp32)",
            o.output, o.rel_l2, o.cosine
        ));
    }
    lines
}
