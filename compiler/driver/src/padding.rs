//! `kiln compile --pad-dim NAME`: the proof that padding dim NAME is safe
//! ([`kiln_passes::rows`]) and the artifact's padding table built from it.

use std::collections::BTreeMap;

use kiln_format::PaddableDim;
use kiln_ir::{Graph, Op};
use kiln_onnx::{DimSummary, ModelSummary};
use kiln_passes::rows::{is_prefix, Positional};

use crate::error::DriverError;

/// What a refused trace suggests.
const PADDING_HINT: &str = "padded positions must not reach real ones (docs/profiles.md, Padding): a batch pads where its rows stay apart, a sequence where its attention mask is a run-time input that masks the padded keys; otherwise compile one profile per size";

/// One profile's imported graph: its label, graph and dim values.
pub(crate) type Traced<'g> = (String, &'g Graph, &'g BTreeMap<String, usize>);

/// Imports the model as profile `p` with dim `name` set to `value`: the
/// graph that checks positional constants at a length no profile has.
pub(crate) type Probe<'a> = dyn FnMut(usize, &str, usize) -> Result<Graph, DriverError> + 'a;

/// The padding table of the dims `names`: for each, the axis of every
/// graph input declared with it and, traced through each profile's
/// imported graph where the dim is larger than 1, the axis of every
/// output. Refuses, naming the node and op, a dim whose padded positions
/// some op reads, and a dim that is on no input, that no profile makes
/// larger than 1, whose output axes differ between profiles, or whose
/// positional constants are not cut from one table (checked against the
/// other profiles and a `probe` import at a length no profile has).
pub(crate) fn paddable_dims(
    summary: &ModelSummary,
    names: &[String],
    profiles: &[Traced<'_>],
    probe: &mut Probe<'_>,
) -> Result<Vec<PaddableDim>, DriverError> {
    names
        .iter()
        .map(|name| paddable_dim(summary, name, profiles, probe))
        .collect()
}

fn paddable_dim(
    summary: &ModelSummary,
    name: &str,
    profiles: &[Traced<'_>],
    probe: &mut Probe<'_>,
) -> Result<PaddableDim, DriverError> {
    let refuse = |message: String| DriverError::Padding {
        dim: name.to_string(),
        message,
    };
    let (_, first, _) = &profiles[0];
    // Each IR graph input's axis of the dim, by the model's declaration.
    let mut input_axes: Vec<Option<usize>> = Vec::new();
    for &id in first.inputs() {
        let input = &first.node(id).name;
        let declared = summary.inputs.iter().find(|i| &i.name == input);
        let axes: Vec<usize> = (declared.iter().flat_map(|i| i.dims.iter().enumerate()))
            .filter(|(_, d)| matches!(d, DimSummary::Symbolic(s) if s == name))
            .map(|(a, _)| a)
            .collect();
        if let [a, b, ..] = axes[..] {
            return Err(refuse(format!(
                "input '{input}' has it on axes {a} and {b}; a run pads one axis per input"
            )));
        }
        input_axes.push(axes.first().copied());
    }
    if input_axes.iter().all(Option::is_none) {
        return Err(refuse(format!(
            "no input of the model has a dim named '{name}'"
        )));
    }
    let mut traced: Option<Vec<Option<usize>>> = None;
    let mut positional: Vec<(usize, Positional)> = Vec::new();
    for (p, (label, graph, dims)) in profiles.iter().enumerate() {
        if dims.get(name).is_none_or(|&v| v < 2) {
            continue;
        }
        let proof = kiln_passes::rows::trace_rows(graph, &input_axes).map_err(|e| {
            let at = match label.is_empty() {
                true => String::new(),
                false => format!(" (in profile {label})"),
            };
            refuse(format!("{e}{at}; hint: {PADDING_HINT}"))
        })?;
        match &traced {
            Some(first) if *first != proof.outputs => {
                return Err(refuse(format!(
                    "the outputs' padded axes differ between profiles ({label} and another)"
                )))
            }
            Some(_) => {}
            None => traced = Some(proof.outputs),
        }
        positional.extend(proof.positional.into_iter().map(|c| (p, c)));
    }
    let Some(outputs) = traced else {
        return Err(refuse(format!(
            "every profile has {name} = 1, where the trace cannot tell its axis from others; give a value above 1"
        )));
    };
    check_positional(name, profiles, &positional, probe).map_err(refuse)?;
    let axes = |v: &[Option<usize>]| v.iter().map(|a| a.map(|a| a as u32)).collect();
    Ok(PaddableDim {
        name: name.to_string(),
        inputs: axes(&input_axes),
        outputs: axes(&outputs),
    })
}

/// Errors unless every constant that differs along dim `name` (in
/// profile `p`, for each `(p, constant)`) is the start of the same
/// constant at every larger length and has the same constant at every
/// smaller length as its start: the profiles whose other dims equal `p`'s,
/// and a probe import at the largest length below the largest profile
/// that no profile has. Then a padded run sees, at its real positions,
/// the values a run of its real length would.
fn check_positional(
    name: &str,
    profiles: &[Traced<'_>],
    positional: &[(usize, Positional)],
    probe: &mut Probe<'_>,
) -> Result<(), String> {
    let values: Vec<usize> = (profiles.iter())
        .filter_map(|(_, _, dims)| dims.get(name).copied())
        .collect();
    let largest = values.iter().copied().max().unwrap_or(0);
    let probe_value = (1..largest).rev().find(|v| !values.contains(v));
    let mut probes: Vec<(BTreeMap<String, usize>, Graph)> = Vec::new();
    for &(p, Positional { node, axis }) in positional {
        let (label, graph, dims) = &profiles[p];
        let Op::Constant(table) = &graph.node(node).op else {
            continue;
        };
        let constant = &graph.node(node).name;
        let others_equal = |d: &BTreeMap<String, usize>| {
            (d.iter().filter(|(k, _)| *k != name)).eq(dims.iter().filter(|(k, _)| *k != name))
        };
        let mut against: Vec<(String, &Graph, usize)> = (profiles.iter())
            .filter(|(_, _, d)| d.get(name) != dims.get(name) && others_equal(d))
            .map(|(l, g, d)| {
                (
                    format!("profile {l}"),
                    *g,
                    d.get(name).copied().unwrap_or(0),
                )
            })
            .collect();
        if let Some(v) = probe_value {
            let mut key = (*dims).clone();
            key.insert(name.to_string(), v);
            if !probes.iter().any(|(k, _)| *k == key) {
                let g = probe(p, name, v).map_err(|e| {
                    format!("importing the model at {name}={v} to check constant '{constant}': {e}")
                })?;
                probes.push((key.clone(), g));
            }
            let g = &probes
                .iter()
                .find(|(k, _)| *k == key)
                .expect("probe just added")
                .1;
            against.push((format!("{name}={v} (imported to check)"), g, v));
        }
        let own = dims.get(name).copied().unwrap_or(0);
        for (other, g, v) in against {
            let same_name = (g.node_ids()).filter_map(|id| match &g.node(id).op {
                Op::Constant(t) if g.node(id).name == *constant => Some(t),
                _ => None,
            });
            let fits = |t: &kiln_ir::Tensor| match v < own {
                true => is_prefix(t, table, axis),
                false => is_prefix(table, t, axis),
            };
            if !same_name.into_iter().any(fits) {
                let here = format!("profile {label}");
                let (short, long) = match v < own {
                    true => (other.as_str(), here.as_str()),
                    false => (here.as_str(), other.as_str()),
                };
                return Err(format!(
                    "constant '{constant}' differs along the padded axis {axis} but is not cut by position from one table: at {short} it is not the start of what it is at {long}, so a padded run would not read what a run of its real length reads"
                ));
            }
        }
    }
    Ok(())
}
