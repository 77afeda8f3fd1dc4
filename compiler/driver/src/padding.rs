//! `kiln compile --pad-dim NAME`: the proof that padding dim NAME is safe
//! ([`kiln_passes::rows`]) and the artifact's padding table built from it.

use std::collections::BTreeMap;

use kiln_format::PaddableDim;
use kiln_ir::Graph;
use kiln_onnx::{DimSummary, ModelSummary};

use crate::error::DriverError;

/// The padding table of the dims `names`: for each, the axis of every
/// graph input declared with it and, traced through each profile's
/// imported graph (`profiles`: bindings, graph, dim values) where the dim is larger
/// than 1, the axis of every output's rows. Refuses, naming the node and
/// op, a dim whose rows some op combines, and a dim that is on no input,
/// that no profile makes larger than 1, or whose output axes differ
/// between profiles.
pub(crate) fn paddable_dims(
    summary: &ModelSummary,
    names: &[String],
    profiles: &[(String, &Graph, &BTreeMap<String, usize>)],
) -> Result<Vec<PaddableDim>, DriverError> {
    names
        .iter()
        .map(|name| paddable_dim(summary, name, profiles))
        .collect()
}

fn paddable_dim(
    summary: &ModelSummary,
    name: &str,
    profiles: &[(String, &Graph, &BTreeMap<String, usize>)],
) -> Result<PaddableDim, DriverError> {
    let refuse = |message: String| DriverError::Padding {
        dim: name.to_string(),
        message,
    };
    let (_, first, _) = &profiles[0];
    // Each IR graph input's axis of the dim, by the model's declaration.
    let axis_of = |input: &str| -> Option<usize> {
        let declared = summary.inputs.iter().find(|i| i.name == input)?;
        (declared.dims.iter()).position(|d| matches!(d, DimSummary::Symbolic(s) if s == name))
    };
    let input_axes: Vec<Option<usize>> = (first.inputs().iter())
        .map(|&id| axis_of(&first.node(id).name))
        .collect();
    if input_axes.iter().all(Option::is_none) {
        return Err(refuse(format!(
            "no input of the model has a dim named '{name}'"
        )));
    }
    let mut traced: Option<(String, Vec<Option<usize>>)> = None;
    for (label, graph, dims) in profiles {
        if dims.get(name).is_none_or(|&v| v < 2) {
            continue;
        }
        let outputs = kiln_passes::rows::trace_rows(graph, &input_axes)
            .map_err(|e| refuse(format!("{e} (in profile {label})")))?;
        match &traced {
            Some((_, first)) if *first != outputs => {
                return Err(refuse(format!(
                    "the outputs' row axes differ between profiles ({label} and another)"
                )))
            }
            Some(_) => {}
            None => traced = Some((label.clone(), outputs)),
        }
    }
    let Some((_, outputs)) = traced else {
        return Err(refuse(format!(
            "every profile has {name} = 1, where the trace cannot tell its axis from others; give a value above 1"
        )));
    };
    let axes = |v: &[Option<usize>]| v.iter().map(|a| a.map(|a| a as u32)).collect();
    Ok(PaddableDim {
        name: name.to_string(),
        inputs: axes(&input_axes),
        outputs: axes(&outputs),
    })
}
