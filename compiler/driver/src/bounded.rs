//! Values whose size depends on data (`docs/bounded.md`): NonZero, the
//! positions Compress keeps, TopK of a run-time k. The importer computes
//! each at its bound and marks it with `with_length` (the value and its
//! run's length). Here each marker is traced to the graph outputs through
//! the ops that keep its positions apart (`kiln_passes::rows`, as for a
//! padded dim); every output it reaches gets the length as a hidden graph
//! output after the model's, and the markers are removed before any pass.
//! The artifact then records, per such output, the axis and where its
//! length lives ([`kiln_format::BoundedOutput`]), and a run cuts the
//! output to it.

use kiln_format::{BoundedOutput, Profile};
use kiln_ir::{Data, Graph, NodeId, Op, Tensor};
use kiln_passes::rows::{trace_rows, Pad, Source};

use crate::DriverError;

/// A graph output of data-dependent length along `axis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bounded {
    /// The output's index among the model's outputs.
    pub output: usize,
    /// The axis.
    pub axis: usize,
}

/// What a marker's padding positions hold: NonZero's are zeros (so a sum
/// over them, or a gather by them, is exact); anything else is unknown.
fn padding_of(graph: &Graph, data: NodeId) -> Pad {
    match graph.node(data).op {
        Op::NonZero => Pad::Exactly(Tensor::new([], Data::I64(vec![0])).expect("scalar")),
        _ => Pad::Unknown,
    }
}

/// Traces every `with_length` marker of `graph` to its outputs, appends
/// each reached output's length as a hidden output (named
/// `OUTPUT#length`, in output order) and removes the markers. Returns the
/// reached outputs in order (the `k`-th one's length is hidden output
/// `k`); an error names the op that reads past a length.
pub(crate) fn resolve(graph: &mut Graph) -> Result<Vec<Bounded>, DriverError> {
    let markers: Vec<(NodeId, usize)> = (graph.node_ids())
        .filter_map(|id| match graph.node(id).op {
            Op::WithLength { axis } => Some((id, axis)),
            _ => None,
        })
        .collect();
    if markers.is_empty() {
        return Ok(Vec::new());
    }
    let no_padded_inputs = vec![None; graph.inputs().len()];
    // Per model output: its axis, its length node and the marker.
    let mut reached: Vec<Option<(usize, NodeId, NodeId)>> = vec![None; graph.outputs().len()];
    for &(marker, axis) in &markers {
        let [data, length] = graph.inputs_of(marker)[..] else {
            unreachable!("with_length takes two inputs")
        };
        let source = Source {
            node: marker,
            axis,
            pad: padding_of(graph, data),
        };
        let traced = trace_rows(graph, &no_padded_inputs, &[], &[source]).map_err(|e| {
            DriverError::Bounded {
                value: graph.node(marker).name.clone(),
                reason: e.to_string(),
            }
        })?;
        for (i, axis) in traced.outputs.iter().enumerate() {
            let Some(axis) = *axis else { continue };
            if let Some((_, _, other)) = reached[i] {
                return Err(DriverError::Bounded {
                    value: graph.node(marker).name.clone(),
                    reason: format!(
                        "'{}' (output) also has the data-dependent length of '{}'; a run cuts an output along one length",
                        graph.outputs()[i].0,
                        graph.node(other).name
                    ),
                });
            }
            reached[i] = Some((axis, length, marker));
        }
    }
    for &(marker, _) in &markers {
        let data = graph.inputs_of(marker)[0];
        // A marker has its data's type (inference), so this cannot fail.
        (graph.replace_all_uses(marker, data)).map_err(|source| {
            kiln_passes::PassError::Failed {
                pass: "bounded",
                source,
            }
        })?;
        graph.remove_unused(marker);
    }
    let names: Vec<String> = graph.outputs().iter().map(|(n, _)| n.clone()).collect();
    let mut bounded = Vec::new();
    for (output, r) in reached.into_iter().enumerate() {
        if let Some((axis, length, _)) = r {
            graph.add_output(format!("{}#length", names[output]), length);
            bounded.push(Bounded { output, axis });
        }
    }
    Ok(bounded)
}

/// Moves `profile`'s hidden length outputs (the last `bounded.len()`)
/// into its bounded-output table.
pub(crate) fn attach(profile: &mut Profile, bounded: &[Bounded]) {
    let visible = profile.outputs.len() - bounded.len();
    profile.bounded = (bounded.iter().enumerate())
        .map(|(k, b)| BoundedOutput {
            output: b.output as u32,
            axis: b.axis as u32,
            length_offset: profile.outputs[visible + k].arena_offset,
        })
        .collect();
    profile.outputs.truncate(visible);
}
