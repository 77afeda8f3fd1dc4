//! The per-layer accuracy report of a reduced-precision build: the f32
//! graph and the graph after `assign-precision` are both run by the
//! reference evaluator (which computes what the kernels compute: operands
//! rounded where they are stored, f32 accumulation) on the same inputs,
//! and every dense node and graph output is compared by node name.

use super::types::{Decision, Precision};
use kiln_ir::{DType, Graph, IrError, NodeId, Tensor};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Errors of one node (or graph output) over all samples.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerError {
    /// The ONNX node name (or `output:NAME`).
    pub node: String,
    /// IR op name.
    pub op: &'static str,
    /// The precision the node runs in (f32 for outputs and f32 nodes).
    pub precision: Precision,
    /// `||y - ref|| / ||ref||` over every element of every sample.
    pub rel_l2: f64,
    /// Cosine similarity of `y` and `ref` over all samples.
    pub cosine: f64,
    /// Largest `|y - ref|`.
    pub max_abs: f64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq)]
pub struct AccuracyReport {
    /// Number of input samples compared.
    pub samples: usize,
    /// Whether the samples were random (`--calibrate-random`) rather than
    /// real calibration data: errors on random inputs can differ from
    /// errors on real data.
    pub random: bool,
    /// Dense nodes, worst relative error first.
    pub layers: Vec<LayerError>,
    /// The graph outputs, in output order.
    pub outputs: Vec<LayerError>,
}

/// Sums for the relative L2 error and cosine of `y` against a reference.
#[derive(Default)]
pub(crate) struct Acc {
    diff2: f64,
    ref2: f64,
    y2: f64,
    dot: f64,
    max_abs: f64,
}

impl Acc {
    pub(crate) fn add(&mut self, reference: &[f32], y: &[f32]) {
        for (&r, &v) in reference.iter().zip(y) {
            let (r, v) = (r as f64, v as f64);
            self.diff2 += (v - r) * (v - r);
            self.ref2 += r * r;
            self.y2 += v * v;
            self.dot += r * v;
            self.max_abs = self.max_abs.max((v - r).abs());
        }
    }

    pub(crate) fn finish(
        &self,
        node: String,
        op: &'static str,
        precision: Precision,
    ) -> LayerError {
        let rel_l2 = if self.ref2 > 0.0 {
            (self.diff2 / self.ref2).sqrt()
        } else {
            self.diff2.sqrt()
        };
        let cosine = if self.ref2 > 0.0 && self.y2 > 0.0 {
            self.dot / (self.ref2.sqrt() * self.y2.sqrt())
        } else if self.diff2 == 0.0 {
            1.0
        } else {
            0.0
        };
        LayerError {
            node,
            op,
            precision,
            rel_l2,
            cosine,
            max_abs: self.max_abs,
        }
    }
}

/// Dense nodes and embedding lookups of `g` with f32 results, by name.
fn dense_by_name(g: &Graph) -> BTreeMap<String, NodeId> {
    g.node_ids()
        .filter(|&id| {
            let n = g.node(id);
            (super::types::is_precision_layer(&n.op) || super::types::is_embedding_lookup(g, id))
                && n.ty.dtype == DType::F32
        })
        .map(|id| (g.node(id).name.clone(), id))
        .collect()
}

/// The dense layers of `reference` (the f32 graph) with the node that
/// carries each one's name in `lowered` (after `assign-precision`): a
/// dense op, or the f32 node that ends an int8 layer's rewrite (its
/// rescale or bias, `quantize.rs`). Values: (reference node, lowered node).
pub(crate) fn matched_layers(
    reference: &Graph,
    lowered: &Graph,
) -> BTreeMap<String, (NodeId, NodeId)> {
    let ref_dense = dense_by_name(reference);
    let mut low_dense = dense_by_name(lowered);
    for id in lowered.node_ids() {
        let n = lowered.node(id);
        if n.ty.dtype == DType::F32 && ref_dense.contains_key(&n.name) {
            low_dense.entry(n.name.clone()).or_insert(id);
        }
    }
    ref_dense
        .into_iter()
        .filter_map(|(name, r)| Some((name.clone(), (r, *low_dense.get(&name)?))))
        .collect()
}

/// Runs `reference` (the f32 graph) and `lowered` (after
/// `assign-precision`, with `decisions`) on every sample and compares them.
pub fn compare(
    reference: &Graph,
    lowered: &Graph,
    decisions: &[Decision],
    samples: &[Vec<Tensor>],
    random: bool,
) -> Result<AccuracyReport, IrError> {
    let layers = matched_layers(reference, lowered);
    let mut accs: BTreeMap<String, Acc> = BTreeMap::new();
    let mut out_accs: Vec<Acc> = reference.outputs().iter().map(|_| Acc::default()).collect();
    let wanted: HashSet<NodeId> = layers.values().map(|&(r, _)| r).collect();
    let by_low: HashMap<NodeId, (&String, NodeId)> = layers
        .iter()
        .map(|(name, &(r, l))| (l, (name, r)))
        .collect();
    for inputs in samples {
        let mut ref_vals: HashMap<NodeId, Vec<f32>> = HashMap::new();
        let ref_out = kiln_ir::eval::eval_graph_with(reference, inputs, |id, t| {
            if wanted.contains(&id) {
                ref_vals.insert(id, t.to_f32_vec());
            }
        })?;
        let low_out = kiln_ir::eval::eval_graph_with(lowered, inputs, |id, t| {
            if let Some(&(name, r)) = by_low.get(&id) {
                if let Some(r) = ref_vals.get(&r) {
                    accs.entry(name.clone())
                        .or_default()
                        .add(r, &t.to_f32_vec());
                }
            }
        })?;
        for ((acc, r), y) in out_accs.iter_mut().zip(&ref_out).zip(&low_out) {
            acc.add(&r.to_f32_vec(), &y.to_f32_vec());
        }
    }
    let precision_of = |name: &str| {
        decisions
            .iter()
            .find(|d| d.node == name)
            .map_or(Precision::Fp32, |d| d.precision)
    };
    let mut layers: Vec<LayerError> = accs
        .iter()
        .map(|(name, acc)| {
            let op = reference.node(layers[name].0).op.name();
            acc.finish(name.clone(), op, precision_of(name))
        })
        .collect();
    layers.sort_by(|a, b| b.rel_l2.total_cmp(&a.rel_l2).then(a.node.cmp(&b.node)));
    let outputs = reference
        .outputs()
        .iter()
        .zip(&out_accs)
        .map(|((name, id), acc)| {
            acc.finish(
                format!("output:{name}"),
                reference.node(*id).op.name(),
                Precision::Fp32,
            )
        })
        .collect();
    Ok(AccuracyReport {
        samples: samples.len(),
        random,
        layers,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AssignPrecision, Mode, Policy};
    use kiln_ir::{Data, Op, UnaryOp, ValueType};

    #[test]
    fn report_ranks_layers_and_measures_outputs() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 8]));
        let w1: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) / 7.0)
            .collect();
        let w1 = g.add_const("w1", Tensor::new([8, 8], Data::F32(w1)).unwrap());
        let w2: Vec<f32> = (0..16)
            .map(|i| ((i * 11 % 13) as f32 - 6.0) / 3.0)
            .collect();
        let w2 = g.add_const("w2", Tensor::new([8, 2], Data::F32(w2)).unwrap());
        let h = g.add_node(Op::MatMul, &[x, w1], "fc1").unwrap();
        let r = g.add_node(Op::Unary(UnaryOp::Tanh), &[h], "act").unwrap();
        let y = g.add_node(Op::MatMul, &[r, w2], "fc2").unwrap();
        g.add_output("y", y);
        let mut low = g.clone();
        let pass = AssignPrecision {
            policy: Policy {
                mode: Mode::Bf16,
                ..Policy::default()
            },
            ..Default::default()
        };
        let (_, decisions) = pass.assign(&mut low).unwrap();
        let xs: Vec<f32> = (0..32)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let sample = vec![Tensor::new([4, 8], Data::F32(xs)).unwrap()];
        let rep = compare(&g, &low, &decisions, &[sample], true).unwrap();
        assert_eq!(rep.layers.len(), 2);
        assert!(rep.layers[0].rel_l2 >= rep.layers[1].rel_l2);
        for l in rep.layers.iter().chain(&rep.outputs) {
            assert!(l.rel_l2 > 0.0 && l.rel_l2 < 2e-2, "{l:?}");
            assert!(l.cosine > 0.999, "{l:?}");
        }
        assert_eq!(rep.outputs[0].node, "output:y");
        // Comparing a graph with itself gives zero error.
        let same = compare(&g, &g, &[], &[rep_sample()], false).unwrap();
        assert!(same
            .layers
            .iter()
            .all(|l| l.rel_l2 == 0.0 && (l.cosine - 1.0).abs() < 1e-12));
    }

    fn rep_sample() -> Vec<Tensor> {
        vec![Tensor::new([4, 8], Data::F32(vec![0.5; 32])).unwrap()]
    }
}
