//! `kiln compile --pad-dim NAME`: the proof that padding dim NAME is safe
//! ([`kiln_passes::rows`]) and the artifact's padding table built from it.

use std::collections::{BTreeMap, HashMap};

use kiln_format::PaddableDim;
use kiln_ir::{Graph, NodeId, Op};
use kiln_onnx::{DimSummary, ModelSummary};
use kiln_passes::rows::{is_prefix, Positional, Traced as Proof};

use crate::error::DriverError;

/// What a refused trace suggests.
const PADDING_HINT: &str = "padded positions must not reach real ones (docs/profiles.md, Padding): a batch pads where its rows stay apart, a sequence where its attention mask is a run-time input that masks the padded keys; otherwise compile one profile per size";

/// One profile's imported graph: its label, graph and dim values.
pub(crate) type Traced<'g> = (String, &'g Graph, &'g BTreeMap<String, usize>);

/// Imports the model as profile `p` with dim `name` set to `value`: the
/// graph that shows what changes with the dim when no other profile
/// differs from `p` in that dim alone.
pub(crate) type Probe<'a> = dyn FnMut(usize, &str, usize) -> Result<Graph, DriverError> + 'a;

/// The padding table of the dims `names`: for each, the axis of every
/// graph input declared with it and, traced through each profile's
/// imported graph where the dim is larger than 1, the axis of every
/// output. Refuses, naming the node and op, a dim whose padded positions
/// some op reads, and a dim that is on no input, that no profile makes
/// larger than 1, or whose output axes differ between profiles. What
/// changes with the dim is read by comparing each profile with another
/// size of it (the nearest profile, or a `probe` import): every node
/// whose size changes must carry padded positions along exactly those
/// axes, a constant that changes must be one table cut by position, and a
/// constant whose values change with the dim (a size read from the shape)
/// is refused.
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
    for (p, (label, graph, dims)) in profiles.iter().enumerate() {
        let Some(&own) = dims.get(name).filter(|&&v| v >= 2) else {
            continue;
        };
        let at = match label.is_empty() {
            true => String::new(),
            false => format!(" (in profile {label})"),
        };
        let traced_error =
            |e: kiln_passes::rows::MixesRows| refuse(format!("{e}{at}; hint: {PADDING_HINT}"));
        // Where the sizes cannot be read (an input bound at one size), the
        // op that reads the padded positions is the better refusal: the
        // trace without positional constants accepts no less than with
        // them, and names it.
        let op_first = |refusal: DriverError| {
            kiln_passes::rows::trace_rows(graph, &input_axes, &[], &[]).map_err(traced_error)?;
            Err(refusal)
        };
        // The graph the dim's sizes are read from: the profile nearest in
        // the dim whose other dims are equal, else an import at own - 1.
        let others_equal = |d: &BTreeMap<String, usize>| {
            (d.iter().filter(|(k, _)| *k != name)).eq(dims.iter().filter(|(k, _)| *k != name))
        };
        let nearest = (profiles.iter())
            .filter_map(|(l, g, d)| Some((l, *g, *d.get(name)?, d)))
            .filter(|(_, _, v, d)| *v != own && others_equal(d))
            .min_by_key(|(_, _, v, _)| v.abs_diff(own));
        let probed: Graph;
        let (other, other_graph, other_value) = match nearest {
            Some((l, g, v, _)) => (format!("profile {l}"), g, v),
            None => match probe(p, name, own - 1) {
                Ok(g) => {
                    probed = g;
                    (format!("{name}={}", own - 1), &probed, own - 1)
                }
                Err(e) => {
                    return op_first(refuse(format!(
                        "importing the model at {name}={} to see what changes with the dim: {e}",
                        own - 1
                    )))
                }
            },
        };
        let sizes = match Sizes::read(graph, other_graph, own, other_value, &other) {
            Ok(sizes) => sizes,
            Err(e) => return op_first(refuse(format!("{e}{at}"))),
        };
        let proof = kiln_passes::rows::trace_rows(graph, &input_axes, &sizes.along, &[])
            .map_err(traced_error)?;
        sizes
            .check(graph, &proof)
            .map_err(|e| refuse(format!("{e}{at}; hint: {PADDING_HINT}")))?;
        match &traced {
            Some(first) if *first != proof.outputs => {
                return Err(refuse(format!(
                    "the outputs' padded axes differ between profiles ({label} and another)"
                )))
            }
            Some(_) => {}
            None => traced = Some(proof.outputs),
        }
    }
    let Some(outputs) = traced else {
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

/// What changes with the dim in one profile's graph, read by comparing it
/// with the same model imported at another size of the dim (`other`):
/// nodes match by name and occurrence.
struct Sizes<'g> {
    /// The constants that run along the dim, each cut by position from one
    /// table (checked), with the axis: the trace's positional constants.
    along: Vec<Positional>,
    /// Each node's axes whose size differs at the other length (none: no
    /// counterpart), and the counterpart.
    changed: Vec<Option<(Vec<usize>, NodeId)>>,
    other: &'g Graph,
    own: usize,
    other_value: usize,
    label: String,
}

impl<'g> Sizes<'g> {
    fn read(
        graph: &Graph,
        other: &'g Graph,
        own: usize,
        other_value: usize,
        label: &str,
    ) -> Result<Sizes<'g>, String> {
        let mut by_name: HashMap<&str, Vec<NodeId>> = HashMap::new();
        for id in other.node_ids() {
            by_name.entry(&other.node(id).name).or_default().push(id);
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut sizes = Sizes {
            along: Vec::new(),
            changed: vec![None; graph.node_count()],
            other,
            own,
            other_value,
            label: label.to_string(),
        };
        for id in graph.node_ids() {
            let node = graph.node(id);
            let occurrence = seen.entry(&node.name).or_default();
            let k = *occurrence;
            *occurrence += 1;
            let Some(&there) = by_name.get(node.name.as_str()).and_then(|v| v.get(k)) else {
                continue;
            };
            let (here_shape, there_shape) = (&node.ty.shape, &other.node(there).ty.shape);
            if here_shape.len() != there_shape.len() {
                return Err(format!(
                    "node '{}' ({}) has rank {} here and {} at {label}: its shape depends on the dim in a way a padded run cannot follow",
                    node.name,
                    node.op.name(),
                    here_shape.len(),
                    there_shape.len()
                ));
            }
            let changed: Vec<usize> = (0..here_shape.len())
                .filter(|&a| here_shape[a] != there_shape[a])
                .collect();
            if let (Op::Constant(here), Op::Constant(there_t)) = (&node.op, &other.node(there).op) {
                match changed[..] {
                    [] if here.data() != there_t.data() => {
                        return Err(format!(
                            "constant '{}' holds other values at {label}: it depends on the dim's size (a size read from the shape?), which a padded run would take from its profile, not from its real length",
                            node.name
                        ))
                    }
                    [] => {}
                    [axis] => {
                        sizes.check_table(&node.name, here, there_t, axis)?;
                        sizes.along.push(Positional { node: id, axis });
                    }
                    _ => {
                        return Err(format!(
                            "constant '{}' changes with the dim along axes {changed:?}; a padded run pads one",
                            node.name
                        ))
                    }
                }
            }
            sizes.changed[id.index()] = Some((changed, there));
        }
        Ok(sizes)
    }

    /// Errors unless `here` (at this profile's length) and `there` (at the
    /// other) are cut from one table along `axis`.
    fn check_table(
        &self,
        name: &str,
        here: &kiln_ir::Tensor,
        there: &kiln_ir::Tensor,
        axis: usize,
    ) -> Result<(), String> {
        let (short, long) = match self.other_value < self.own {
            true => (there, here),
            false => (here, there),
        };
        match is_prefix(short, long, axis) {
            true => Ok(()),
            false => Err(format!(
                "constant '{name}' changes with the dim along axis {axis} but is not cut by position from one table: at the shorter of this profile and {} it is not the start of what it is at the longer, so a padded run would not read what a run of its real length reads",
                self.label
            )),
        }
    }

    /// Errors unless every node's padded axes in `proof` are exactly the
    /// axes whose size changes with the dim, and every positional constant
    /// the trace found is cut from one table.
    fn check(&self, graph: &Graph, proof: &Proof) -> Result<(), String> {
        for id in graph.node_ids() {
            let Some((changed, _)) = &self.changed[id.index()] else {
                continue;
            };
            let node = graph.node(id);
            let followed = &proof.axes[id.index()];
            if let Some(a) = changed.iter().find(|a| !followed.contains(a)) {
                return Err(format!(
                    "node '{}' ({}) changes size with the dim along axis {a}, where the trace follows no padded positions (a size taken from the shape, as an Expand or Reshape to it?)",
                    node.name,
                    node.op.name()
                ));
            }
            if let Some(a) = followed.iter().find(|a| !changed.contains(a)) {
                return Err(format!(
                    "node '{}' ({}): the trace follows padded positions along axis {a}, whose size does not change with the dim",
                    node.name,
                    node.op.name()
                ));
            }
        }
        for c in &proof.positional {
            let name = &graph.node(c.node).name;
            let there = self.changed[c.node.index()].as_ref().map(|(_, t)| *t);
            match (&graph.node(c.node).op, there.map(|t| &self.other.node(t).op)) {
                (Op::Constant(here), Some(Op::Constant(there))) => {
                    self.check_table(name, here, there, c.axis)?
                }
                _ => {
                    return Err(format!(
                        "constant '{name}' differs along the padded axis and has no counterpart at {} to check that it is cut by position from one table",
                        self.label
                    ))
                }
            }
        }
        Ok(())
    }
}
