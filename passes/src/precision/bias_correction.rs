//! Empirical bias correction of int8 layers (`docs/precision.md`).
//!
//! Rounding weights to int8 and activations to u8 shifts the mean of a
//! layer's output channel by `E[x] · ΔW` plus the mean of the activation
//! rounding carried through `W`; over a deep network these shifts add up
//! (a layer reads the shifted output of the one before). The correction
//! measures, on the calibration samples, each int8 layer's mean output per
//! channel in the f32 graph and in the quantized graph, and adds the
//! difference to the layer's bias (Nagel et al., *Data-Free Quantization
//! Through Weight Equalization and Bias Correction*, 2019, in the empirical
//! form AIMET and OpenVINO's `FastBiasCorrection` use).
//!
//! The layers are corrected in order: the quantized graph runs on every
//! sample at once ([`kiln_ir::eval::eval_graph_batch`]) and each int8
//! layer's output is corrected before the next layer reads it, so a layer's
//! correction is measured on inputs that already carry the corrections
//! upstream, in one evaluation.

use super::report::matched_layers;
use super::smooth::channel_axis;
use kiln_ir::{Data, Graph, IrError, NodeId, Tensor};
use std::collections::{BTreeMap, HashMap};

/// Per-output-channel additions to int8 layers' biases, by layer (ONNX
/// node) name.
pub type BiasCorrections = BTreeMap<String, Vec<f32>>;

/// Sums of `values` (shape `shape`) per index along `axis`, added to `sums`.
fn add_channel_sums(values: &[f32], shape: &[usize], axis: usize, sums: &mut [f64]) {
    let channels = shape.get(axis).copied().unwrap_or(1);
    let inner: usize = shape.iter().skip(axis + 1).product();
    for (i, &v) in values.iter().enumerate() {
        sums[(i / inner) % channels] += f64::from(v);
    }
}

/// Measures the corrections of `layers` (int8 layers of `quantized`, the
/// graph `assign-precision` made from `reference`) on `samples`: per
/// channel, the f32 graph's mean output minus the quantized graph's, the
/// layers corrected in evaluation order. Only dense layers have a bias to
/// correct (an int8 embedding table is skipped), and so do layers whose
/// name `quantized` does not carry.
pub fn measure_bias_corrections(
    reference: &Graph,
    quantized: &Graph,
    layers: &[String],
    samples: &[Vec<Tensor>],
) -> Result<BiasCorrections, IrError> {
    let matched = matched_layers(reference, quantized);
    // (reference node, quantized node, channel axis, channel count).
    let wanted: BTreeMap<&String, (NodeId, NodeId, usize, usize)> = layers
        .iter()
        .filter_map(|name| {
            let &(r, q) = matched.get(name)?;
            if !super::types::is_precision_layer(&reference.node(r).op) {
                return None;
            }
            let shape = &reference.node(r).ty.shape;
            let axis = channel_axis(&reference.node(r).op, shape.len());
            (quantized.node(q).ty.shape == *shape)
                .then_some((name, (r, q, axis, *shape.get(axis)?)))
        })
        .collect();
    if wanted.is_empty() || samples.is_empty() {
        return Ok(BiasCorrections::new());
    }
    let mut reference_sums: HashMap<NodeId, Vec<f64>> = HashMap::new();
    let by_reference: HashMap<NodeId, (usize, usize)> = wanted
        .values()
        .map(|&(r, _, axis, channels)| (r, (axis, channels)))
        .collect();
    for sample in samples {
        kiln_ir::eval::eval_graph_with(reference, sample, |id, t| {
            if let Some(&(axis, channels)) = by_reference.get(&id) {
                let sums = reference_sums
                    .entry(id)
                    .or_insert_with(|| vec![0.0; channels]);
                add_channel_sums(&t.to_f32_vec(), t.shape(), axis, sums);
            }
        })?;
    }
    let by_quantized: HashMap<NodeId, (&String, NodeId, usize, usize)> = wanted
        .iter()
        .map(|(&name, &(r, q, axis, channels))| (q, (name, r, axis, channels)))
        .collect();
    let mut corrections = BiasCorrections::new();
    kiln_ir::eval::eval_graph_batch(quantized, samples, |id, values| {
        let Some(&(name, r, axis, channels)) = by_quantized.get(&id) else {
            return;
        };
        let Some(reference) = reference_sums.get(&r) else {
            return;
        };
        let mut sums = vec![0f64; channels];
        let mut data: Vec<Vec<f32>> = values.iter().map(Tensor::to_f32_vec).collect();
        for (v, t) in data.iter().zip(values.iter()) {
            add_channel_sums(v, t.shape(), axis, &mut sums);
        }
        // Every channel has the same number of elements.
        let count = data.iter().map(Vec::len).sum::<usize>() as f64 / channels as f64;
        let correction: Vec<f32> = (reference.iter().zip(&sums))
            .map(|(r, q)| ((r - q) / count) as f32)
            .collect();
        for (v, t) in data.iter_mut().zip(values.iter_mut()) {
            let inner: usize = t.shape().iter().skip(axis + 1).product();
            for (i, x) in v.iter_mut().enumerate() {
                *x += correction[(i / inner) % channels];
            }
            *t = Tensor::new(t.shape(), Data::F32(std::mem::take(v)))
                .expect("same shape, same length");
        }
        corrections.insert(name.clone(), correction);
    })?;
    Ok(corrections)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AssignPrecision, Measured, Mode, Policy};
    use kiln_ir::{DType, Op, UnaryOp, ValueType};

    /// x [4, 3] -> fc1 [3, 4] -> relu -> fc2 [4, 2].
    fn mlp() -> Graph {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
        let w1 = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        let w1 = g.add_const("w1", Tensor::new([3, 4], Data::F32(w1)).unwrap());
        let w2 = (0..8).map(|i| (i as f32 * 0.71).cos()).collect();
        let w2 = g.add_const("w2", Tensor::new([4, 2], Data::F32(w2)).unwrap());
        let h = g.add_node(Op::MatMul, &[x, w1], "fc1").unwrap();
        let r = g.add_node(Op::Unary(UnaryOp::Relu), &[h], "relu").unwrap();
        let y = g.add_node(Op::MatMul, &[r, w2], "fc2").unwrap();
        g.add_output("y", y);
        g
    }

    /// Per layer, the largest |mean over samples and rows| of the
    /// quantized graph's output minus the f32 graph's, per column.
    fn mean_errors(reference: &Graph, quantized: &Graph, samples: &[Vec<Tensor>]) -> Vec<f64> {
        let layers = matched_layers(reference, quantized);
        let mut sums: BTreeMap<(&str, bool), Vec<f64>> = BTreeMap::new();
        for sample in samples {
            for (graph, is_ref) in [(reference, true), (quantized, false)] {
                kiln_ir::eval::eval_graph_with(graph, sample, |id, t| {
                    for (name, &(r, q)) in &layers {
                        if id == if is_ref { r } else { q } {
                            let s = sums.entry((name, is_ref)).or_insert(vec![0.0; 4]);
                            add_channel_sums(&t.to_f32_vec(), t.shape(), 1, s);
                        }
                    }
                })
                .unwrap();
            }
        }
        ["fc1", "fc2"]
            .iter()
            .map(|name| {
                let (r, q) = (&sums[&(*name, true)], &sums[&(*name, false)]);
                (r.iter().zip(q))
                    .map(|(r, q)| ((q - r) / (4 * samples.len()) as f64).abs())
                    .fold(0.0, f64::max)
            })
            .collect()
    }

    /// Coarse static ranges (activations quantized to a few levels) shift
    /// both layers' means; the corrections, measured layer by layer,
    /// cancel them on the samples: fc2's is measured on fc1's corrected
    /// output, so it too is exact in the corrected graph.
    #[test]
    fn corrections_cancel_each_layers_mean_error_in_order() {
        let reference = mlp();
        let samples: Vec<Vec<Tensor>> = (0..3)
            .map(|s| {
                let v = (0..12)
                    .map(|i| ((i * 7 + s * 5) % 11) as f32 / 11.0)
                    .collect();
                vec![Tensor::new([4, 3], Data::F32(v)).unwrap()]
            })
            .collect();
        let policy = Policy {
            mode: Mode::Int8,
            ..Policy::default()
        };
        let mut measured = Measured {
            activation_ranges: Some(BTreeMap::from([
                ("fc1".to_string(), (-60.0, 60.0)),
                ("fc2".to_string(), (-60.0, 60.0)),
            ])),
            ..Measured::default()
        };
        let assign = |measured: &Measured| {
            let mut g = reference.clone();
            (AssignPrecision {
                policy: policy.clone(),
                measured: measured.clone(),
            })
            .assign(&mut g)
            .unwrap();
            g
        };
        let plain = assign(&measured);
        let before = mean_errors(&reference, &plain, &samples);
        assert!(before.iter().all(|&e| e > 1e-2), "{before:?}");
        let layers = ["fc1".to_string(), "fc2".to_string()];
        measured.bias_corrections =
            measure_bias_corrections(&reference, &plain, &layers, &samples).unwrap();
        assert_eq!(measured.bias_corrections.len(), 2);
        assert_eq!(measured.bias_corrections["fc2"].len(), 2);
        let corrected = assign(&measured);
        let after = mean_errors(&reference, &corrected, &samples);
        assert!(
            after.iter().all(|&e| e < 1e-5),
            "{after:?} (before {before:?})"
        );
    }
}
