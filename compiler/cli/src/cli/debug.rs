//! `kiln debug`: the first value of a compiled model beyond tolerance of its
//! source model (every value kept and compared with the reference evaluator
//! or onnxruntime's values), or with `--bisect-passes` the pass that makes
//! the outputs depart ([`kiln_driver::debug`]).

use super::inputs::{gather_inputs, InputArgs};
use super::options::{compile_options, ModelArgs};
use super::run::check_line;
use super::{exit, Failure};
use clap::Args;
use kiln_driver::debug::{self, Bisection, Culprit, Reference, Source, Trial, ValueReport};
use kiln_driver::Target;
use kiln_onnx::KeepValues;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub(super) struct DebugArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Target (as `kiln compile`); its code must run on this machine.
    #[arg(long, default_value = "native", value_parser = clap::value_parser!(Target))]
    target: Target,
    #[command(flatten)]
    model_args: ModelArgs,
    #[command(flatten)]
    inputs: InputArgs,
    /// Static int8 builds: the calibration samples (as `kiln compile`).
    #[arg(long, value_name = "DIR")]
    calibrate: Option<PathBuf>,
    /// The values to compare: `all`, or comma-separated ONNX tensor-name
    /// globs.
    #[arg(long, value_name = "all|GLOB", default_value = "all", value_parser = clap::value_parser!(KeepValues))]
    keep_values: KeepValues,
    /// Compare with onnxruntime's values dumped in DIR by
    /// `scripts/dump_values.py` (DIR/values.json names each value's .npy)
    /// instead of Kiln's reference evaluator on the source graph.
    #[arg(long, value_name = "DIR", conflicts_with = "bisect_passes")]
    reference: Option<PathBuf>,
    /// The largest error relative to each value's scale. Default by the
    /// build's least precise computation, as `compile --golden` (the
    /// precision asked for, or the model's own: a quantized model's is
    /// int8): fp32 1e-4, fp16 1e-2, bf16 5e-2, int8 0.15.
    #[arg(long, value_name = "T")]
    tolerance: Option<f64>,
    /// Instead of comparing values: find the pass whose addition to the
    /// pipeline makes the outputs depart from the source model's (compiles
    /// with prefixes of the pipeline, as --passes does).
    #[arg(long)]
    bisect_passes: bool,
    /// List every value compared, not only the first beyond tolerance.
    #[arg(long)]
    verbose: bool,
    /// Print a machine-readable report.
    #[arg(long)]
    json: bool,
}

/// What a debugging session found.
enum Found {
    /// Every kept value against its reference (and what the reference was).
    Values(Box<ValueReport>, String),
    /// The pass bisection.
    Bisection(Bisection),
}

/// Compiles, runs and compares as `a` asks; with `progress`, prints each
/// bisection trial as it ends.
fn investigate(a: &DebugArgs, progress: bool) -> Result<Found, Failure> {
    let mut opts = compile_options(&a.model_args, a.target)?;
    opts.calibrate = a.calibrate.clone();
    let tolerance = a.tolerance;
    if let Some(t) = tolerance.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(Failure::new(
            exit::USAGE,
            format!("--tolerance {t} must be a finite number of at least 0"),
        ));
    }
    let source = Source::read(&a.model)?;
    let inputs = gather_inputs(&[&source.inputs(&opts)?], &a.inputs)?;
    if a.bisect_passes {
        let bisection = debug::bisect_passes(&source, &opts, &inputs, tolerance, |t, tol| {
            if progress {
                println!("  {}", trial_line(t, tol));
            }
        })?;
        return Ok(Found::Bisection(bisection));
    }
    opts.import.keep_values = a.keep_values.clone();
    let reference = match &a.reference {
        Some(dir) => Reference::Dumped(dir),
        None => Reference::Evaluator,
    };
    let report = debug::compare_values(&source, &opts, &inputs, reference, tolerance)?;
    let against = match &a.reference {
        Some(dir) => format!("the values in {}", dir.display()),
        None => "the reference evaluator on the source graph".to_string(),
    };
    Ok(Found::Values(Box::new(report), against))
}

pub(super) fn cmd_debug(a: DebugArgs) -> Result<(), Failure> {
    let found = investigate(&a, !a.json)?;
    if a.json {
        println!("{}", found_json(&found, &a));
    }
    match &found {
        Found::Values(report, against) => report_values(report, against, &a),
        Found::Bisection(bisection) => report_bisection(bisection, a.json),
    }
}

/// `kiln debug ARGS --json` as a library call (the Python binding's
/// `kiln.debug`): the report, whether or not something departs (its
/// `first_failure` or `culprit` says); errors as the command's.
pub fn debug_report<I, S>(args: I) -> Result<Value, Failure>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let super::Command::Debug(mut a) = super::parse_subcommand("debug", args)? else {
        unreachable!("the words start with `debug`");
    };
    a.json = true;
    Ok(found_json(&investigate(&a, false)?, &a))
}

fn found_json(found: &Found, a: &DebugArgs) -> Value {
    match found {
        Found::Values(report, _) => values_json(report, a),
        Found::Bisection(bisection) => bisection_json(bisection),
    }
}

/// One trial of a bisection, for people.
fn trial_line(t: &Trial, tolerance: f64) -> String {
    let passes = match t.passes.is_empty() {
        true => "(no passes)".to_string(),
        false => t.passes.join(","),
    };
    match &t.outcome {
        Ok(worst) => format!("{passes}: worst output {}", check_line(worst, tolerance)),
        Err(e) => format!("{passes}: build failed ({e})"),
    }
}

fn bisection_json(b: &Bisection) -> Value {
    let trials: Vec<Value> = (b.trials.iter())
        .map(|t| {
            let outcome = match &t.outcome {
                Ok(c) => {
                    json!({"worst_output": c.name, "rel_error": c.rel_error, "mismatch": c.mismatch})
                }
                Err(e) => json!({"error": e}),
            };
            json!({"passes": t.passes, "matched": t.matched, "outcome": outcome})
        })
        .collect();
    let culprit = match &b.culprit {
        Culprit::NoMismatch => json!(null),
        Culprit::NoPass => json!({"pass": null}),
        Culprit::Pass {
            name,
            removal_matches,
        } => json!({"pass": name, "removal_matches": removal_matches}),
    };
    json!({"pipeline": b.pipeline, "tolerance": b.tolerance, "trials": trials, "culprit": culprit})
}

fn report_bisection(b: &Bisection, json: bool) -> Result<(), Failure> {
    let message = match &b.culprit {
        Culprit::NoMismatch => {
            if !json {
                println!(
                    "the outputs match the source model with every pass ({}); nothing to bisect",
                    b.pipeline.join(",")
                );
            }
            return Ok(());
        }
        Culprit::NoPass => "the outputs depart from the source model even with no pass: the error is in code generation or a kernel; `kiln debug` without --bisect-passes names the first value beyond tolerance".to_string(),
        Culprit::Pass { name, removal_matches: true } => format!(
            "pass '{name}' makes the outputs depart from the source model: the pipeline's prefix up to it departs, the one before it matches, and the whole pipeline without it matches (--passes {})",
            without(&b.pipeline, name)
        ),
        Culprit::Pass { name, removal_matches: false } => format!(
            "pass '{name}' is the first whose addition makes the outputs depart, but the whole pipeline without it still departs: another pass departs too (bisect again with --passes {})",
            without(&b.pipeline, name)
        ),
    };
    Err(Failure::new(exit::CHECK_FAILED, message))
}

/// The pipeline without `pass`, as `--passes` takes it.
fn without(pipeline: &[String], pass: &str) -> String {
    let rest: Vec<&str> = (pipeline.iter())
        .map(String::as_str)
        .filter(|p| *p != pass)
        .collect();
    rest.join(",")
}

/// A value's verdict.
fn status(c: &debug::ValueCheck, tolerance: f64) -> &'static str {
    match c.passes(tolerance) {
        Some(true) => "ok",
        Some(false) => "FAILED",
        None => "no reference",
    }
}

fn values_json(r: &ValueReport, a: &DebugArgs) -> Value {
    let values: Vec<Value> = (r.checks.iter())
        .map(|c| {
            let m = c.comparison.as_ref();
            json!({
                "value": c.value, "node": c.node, "op": c.op, "sources": c.sources,
                "model_output": c.model_output, "status": status(c, r.tolerance),
                "max_abs_error": m.map(|m| m.max_abs_error), "scale": m.map(|m| m.scale),
                "rel_error": m.map(|m| m.rel_error), "mismatch": m.and_then(|m| m.mismatch.clone()),
            })
        })
        .collect();
    let first = r.first_failure().map(|c| c.value.clone());
    json!({"model": a.model.display().to_string(), "options": r.compiled.artifact.metadata.options, "tolerance": r.tolerance, "compared": r.compared(), "failed": r.failures().count(), "first_failure": first, "values": values})
}

fn report_values(r: &ValueReport, against: &str, a: &DebugArgs) -> Result<(), Failure> {
    let failed = r.failures().count();
    if !a.json {
        println!(
            "compared {} of {} values with {against} (tolerance {:.1e} of each value's scale; build: {})",
            r.compared(),
            r.checks.len(),
            r.tolerance,
            r.compiled.artifact.metadata.options
        );
        if a.verbose {
            for c in &r.checks {
                match &c.comparison {
                    Some(m) => println!("  {}  [{} {}]", check_line(m, r.tolerance), c.op, c.node),
                    None => println!("  {}: no reference  [{} {}]", c.value, c.op, c.node),
                }
            }
        }
    }
    let Some(first) = r.first_failure() else {
        if !a.json {
            println!("every value is within tolerance");
        }
        return Ok(());
    };
    if !a.json {
        let m = first
            .comparison
            .as_ref()
            .expect("a failure has a comparison");
        println!(
            "first value beyond tolerance: {}",
            check_line(m, r.tolerance)
        );
        println!("  computed by node '{}' ({})", first.node, first.op);
        for s in &first.sources {
            let state = (r.checks.iter())
                .find(|c| &c.value == s)
                .and_then(|c| c.comparison.as_ref())
                .map(|m| format!(": ok, {:.3e} of its scale", m.rel_error))
                .unwrap_or_default();
            println!("  reads {s}{state}");
        }
        if failed > 1 {
            println!("  and {} later values are beyond tolerance", failed - 1);
        }
    }
    Err(Failure::new(
        exit::CHECK_FAILED,
        format!(
            "{failed} of {} values beyond tolerance; the first is '{}' (node '{}', {})",
            r.compared(),
            first.value,
            first.node,
            first.op
        ),
    ))
}
