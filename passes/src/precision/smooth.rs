//! Activation smoothing for int8 layers (`--smooth ALPHA`,
//! `docs/precision.md`).
//!
//! An int8 layer quantizes its activation with one scale per tensor, so a
//! channel whose values span ±0.1 next to one spanning ±20 gets a handful
//! of levels. Smoothing divides each input channel `c` of the activation
//! by `m[c]` and multiplies the weights that read it by `m[c]`, which
//! leaves the product unchanged, `Σ_c x[c] W[c, :] = Σ_c (x[c] / m[c])
//! (m[c] W[c, :])`, and moves range from the activation to the weights,
//! which are quantized per output channel:
//!
//! ```text
//! m[c] = max|x[c]|^α / max|W[c, :]|^(1 − α)
//! ```
//!
//! (Xiao et al., *SmoothQuant*, 2023; α = 1 equalizes the activation's
//! channels, α = 0 the weights'.) The division joins the activation's
//! quantization (`x / (s · m)`, one constant per channel, in the producer's
//! store loop) and the multiplication is folded into the stored weights,
//! so it costs nothing at run time.

use kiln_ir::{Graph, IrError, NodeId, Op};
use std::collections::{BTreeMap, HashMap};

/// Per input channel divisors of int8 layers' activations, by layer (ONNX
/// node) name.
pub type Smoothing = BTreeMap<String, Vec<f32>>;

/// The channel axis of a dense layer's activation (the axis its weights
/// reduce over) and of its output (the axis its bias runs along): a
/// convolution's channels (NCHW), a MatMul/Gemm's last axis.
pub fn channel_axis(op: &Op, rank: usize) -> usize {
    match op {
        Op::Conv(_) => 1,
        _ => rank.saturating_sub(1),
    }
}

/// `max |W|` per input channel of dense node `id`'s constant weights, or
/// `None` when the layer has no int8 form smoothing applies to (a
/// grouped or transposed-A op, a weight computed at run time).
fn weight_channel_max(graph: &Graph, id: NodeId) -> Option<Vec<f32>> {
    let inputs = graph.inputs_of(id);
    let w = graph.constant(*inputs.get(1)?)?;
    let shape = w.shape();
    let values = w.to_f32_vec();
    let column_max = |channels: usize, channel_of: &dyn Fn(usize) -> usize| {
        let mut max = vec![0f32; channels];
        for (i, v) in values.iter().enumerate() {
            let c = channel_of(i);
            max[c] = max[c].max(v.abs());
        }
        max
    };
    match &graph.node(id).op {
        Op::Conv(conv) if conv.group == 1 && shape.len() == 4 => {
            let (c, inner) = (shape[1], shape[2] * shape[3]);
            Some(column_max(c, &|i| (i / inner) % c))
        }
        Op::MatMul if shape.len() == 2 => Some(column_max(shape[0], &|i| i / shape[1])),
        Op::Gemm {
            trans_a: false,
            trans_b,
            ..
        } if shape.len() == 2 => Some(if *trans_b {
            column_max(shape[1], &|i| i % shape[1])
        } else {
            column_max(shape[0], &|i| i / shape[1])
        }),
        _ => None,
    }
}

/// The smoothing divisors of every dense layer of `graph` (the f32 graph
/// `assign-precision` starts from) with constant weights, from the largest
/// `|x|` per channel of its activation on `samples` and migration strength
/// `alpha` in `[0, 1]`. Layers reading one activation share its divisors
/// (their weights' channel maxima combined), so the activation is
/// quantized once for all of them. A channel that is zero in the samples
/// or in the weights keeps divisor 1.
pub fn smoothing_factors(
    graph: &Graph,
    samples: &[Vec<kiln_ir::Tensor>],
    alpha: f32,
) -> Result<Smoothing, IrError> {
    // Activation value -> (readers, their weights' channel maxima, the
    // channel axis).
    let mut readers: HashMap<NodeId, (Vec<String>, Vec<f32>, usize)> = HashMap::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        if !super::types::is_precision_layer(&node.op) {
            continue;
        }
        let Some(w_max) = weight_channel_max(graph, id) else {
            continue;
        };
        let x = graph.inputs_of(id)[0];
        let x_shape = &graph.node(x).ty.shape;
        let axis = channel_axis(&node.op, x_shape.len());
        if x_shape.get(axis) != Some(&w_max.len()) {
            continue;
        }
        let entry = readers
            .entry(x)
            .or_insert_with(|| (Vec::new(), vec![0.0; w_max.len()], axis));
        entry.0.push(node.name.clone());
        for (m, w) in entry.1.iter_mut().zip(&w_max) {
            *m = m.max(*w);
        }
    }
    // The largest |x| per channel, by activation value.
    let mut x_max: HashMap<NodeId, Vec<f32>> = HashMap::new();
    let mut observe = |id: NodeId, t: &kiln_ir::Tensor| {
        let Some((_, w_max, axis)) = readers.get(&id) else {
            return;
        };
        let (axis, channels) = (*axis, w_max.len());
        let inner: usize = t.shape().iter().skip(axis + 1).product();
        let max = x_max.entry(id).or_insert_with(|| vec![0.0; channels]);
        for (i, v) in t.to_f32_vec().iter().enumerate() {
            if v.is_finite() {
                let c = (i / inner) % channels;
                max[c] = max[c].max(v.abs());
            }
        }
    };
    for sample in samples {
        for (&id, t) in graph.inputs().iter().zip(sample) {
            observe(id, t);
        }
        kiln_ir::eval::eval_graph_with(graph, sample, &mut observe)?;
    }
    let mut smoothing = Smoothing::new();
    for (x, (names, w_max, _)) in readers {
        let Some(a_max) = x_max.get(&x) else {
            continue;
        };
        let m: Vec<f32> = (a_max.iter().zip(&w_max))
            .map(|(&a, &w)| {
                let m = a.powf(alpha) / w.powf(1.0 - alpha);
                if a > 0.0 && w > 0.0 && m.is_normal() {
                    m
                } else {
                    1.0
                }
            })
            .collect();
        for name in names {
            smoothing.insert(name, m.clone());
        }
    }
    Ok(smoothing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, Data, Tensor, ValueType};

    /// Two readers of one activation share its divisors; α = 1 divides by
    /// the channel's largest |x|, α = 0.5 by its geometric balance with the
    /// weights' largest |W|.
    #[test]
    fn divisors_balance_activation_and_weight_channels() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2, 2]));
        let w1 = g.add_const(
            "w1",
            Tensor::new([2, 1], Data::F32(vec![1.0, 4.0])).unwrap(),
        );
        let w2 = g.add_const(
            "w2",
            Tensor::new([2, 1], Data::F32(vec![2.0, 1.0])).unwrap(),
        );
        let a = g.add_node(Op::MatMul, &[x, w1], "a").unwrap();
        let b = g.add_node(Op::MatMul, &[x, w2], "b").unwrap();
        g.add_output("a", a);
        g.add_output("b", b);
        // Channel 0 spans 8, channel 1 spans 0.5.
        let sample = vec![Tensor::new([2, 2], Data::F32(vec![8.0, 0.5, -3.0, 0.25])).unwrap()];
        let s = smoothing_factors(&g, std::slice::from_ref(&sample), 0.5).unwrap();
        // Weight channel maxima over both readers: 2 and 4.
        let want = [(8f32 / 2.0).sqrt(), (0.5f32 / 4.0).sqrt()];
        for name in ["a", "b"] {
            for (got, want) in s[name].iter().zip(want) {
                assert!((got - want).abs() < 1e-6, "{name}: {:?}", s[name]);
            }
        }
        let s = smoothing_factors(&g, &[sample], 1.0).unwrap();
        assert_eq!(s["a"], [8.0, 0.5]);
    }

    /// One channel spanning ±20 beside three spanning ±0.05 that the
    /// weights weigh heavily: per tensor, the small channels get a level
    /// or two; smoothed (α = 0.5) the same int8 product is over ten times
    /// closer to the f32 one, with a static range and with a dynamic one.
    #[test]
    fn smoothing_gives_small_channels_their_levels() {
        use crate::{AssignPrecision, Measured, Mode, Policy};
        let (rows, k, n) = (16, 4, 2);
        let x: Vec<f32> = (0..rows * k)
            .map(|i| {
                let wave = ((i * 7 % 13) as f32 / 6.0 - 1.0).clamp(-1.0, 1.0);
                if i % k == 0 {
                    20.0 * wave
                } else {
                    0.05 * wave
                }
            })
            .collect();
        let w: Vec<f32> = (0..k * n)
            .map(|i| {
                if i / n == 0 {
                    0.01
                } else {
                    3.0 - (i % 3) as f32
                }
            })
            .collect();
        let mut g = Graph::new();
        let input = g.add_input("x", ValueType::new(DType::F32, [rows, k]));
        let wc = g.add_const("w", Tensor::new([k, n], Data::F32(w)).unwrap());
        let mm = g.add_node(Op::MatMul, &[input, wc], "mm").unwrap();
        g.add_output("y", mm);
        let sample = vec![Tensor::new([rows, k], Data::F32(x.clone())).unwrap()];
        let exact = kiln_ir::eval::eval_graph(&g, &sample).unwrap()[0].to_f32_vec();
        let error = |smoothing: Smoothing, dynamic: bool| {
            // The static range of the activation as it is quantized.
            let m = smoothing.get("mm").cloned().unwrap_or(vec![1.0; k]);
            let scaled: Vec<f32> = x.iter().enumerate().map(|(i, v)| v / m[i % k]).collect();
            let lo = scaled.iter().copied().fold(0f32, f32::min);
            let hi = scaled.iter().copied().fold(0f32, f32::max);
            let mut q = g.clone();
            let policy = Policy {
                mode: Mode::Int8,
                ..Policy::default()
            };
            let measured = Measured {
                activation_ranges: (!dynamic)
                    .then(|| BTreeMap::from([("mm".to_string(), (lo, hi))])),
                smoothing,
                ..Measured::default()
            };
            AssignPrecision { policy, measured }.assign(&mut q).unwrap();
            let y = kiln_ir::eval::eval_graph(&q, &sample).unwrap()[0].to_f32_vec();
            let diff: f32 = y.iter().zip(&exact).map(|(a, b)| (a - b) * (a - b)).sum();
            (diff / exact.iter().map(|b| b * b).sum::<f32>()).sqrt()
        };
        let factors = smoothing_factors(&g, std::slice::from_ref(&sample), 0.5).unwrap();
        for dynamic in [false, true] {
            let plain = error(Smoothing::new(), dynamic);
            let smoothed = error(factors.clone(), dynamic);
            assert!(
                smoothed * 10.0 < plain && smoothed < 0.01,
                "dynamic {dynamic}: rel L2 {smoothed} smoothed vs {plain} per tensor"
            );
        }
    }
}
