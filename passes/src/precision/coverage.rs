//! Calibration coverage (`kiln compile --quantize static --calibrate DIR
//! --validate DIR2`): does the calibration set cover what production will
//! send? Every held-out sample runs through the f32 graph; each static int8
//! layer's activation (smoothed as it is quantized) is compared with the
//! range calibrated for it: the share of values outside it (clipped by the
//! int8 kernel) and how far outside. The int8 graph runs on the same
//! samples, and each graph output is compared with the f32 one (relative L2,
//! cosine, and argmax agreement along the last axis, the metric of a
//! classifier).

use super::calibrate::PrecisionOutcome;
use super::report::Acc;
use super::smooth::channel_axis;
use super::types::is_precision_layer;
use kiln_ir::{Graph, IrError, NodeId, Tensor};
use std::collections::HashMap;

/// How well one int8 layer's calibrated activation range covered the
/// held-out samples.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerCoverage {
    /// The layer (ONNX node name).
    pub node: String,
    /// Its calibrated activation range.
    pub range: (f32, f32),
    /// Activation values seen (every element of every sample).
    pub values: u64,
    /// Values outside the range.
    pub clipped: u64,
    /// The largest distance of a value beyond the range (0 when none).
    pub max_overshoot: f32,
    /// The held-out samples with clipped values, most clipped first (at
    /// most [`MAX_NAMED_SAMPLES`]), by index.
    pub samples: Vec<usize>,
}

/// Most samples a layer names.
pub const MAX_NAMED_SAMPLES: usize = 5;

impl LayerCoverage {
    /// Clipped values as a share of all values.
    pub fn clipped_share(&self) -> f64 {
        if self.values == 0 {
            0.0
        } else {
            self.clipped as f64 / self.values as f64
        }
    }
}

/// One graph output of the int8 build against the f32 graph on the
/// held-out samples.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputAgreement {
    /// The output.
    pub output: String,
    /// `||int8 - f32|| / ||f32||` over every sample.
    pub rel_l2: f64,
    /// Cosine similarity over every sample.
    pub cosine: f64,
    /// Share of rows (every index but the last axis) whose argmax along the
    /// last axis agrees; `None` for outputs whose last axis has one element.
    pub argmax_agreement: Option<f64>,
}

/// The whole coverage report.
#[derive(Clone, Debug, PartialEq)]
pub struct Coverage {
    /// Held-out samples run.
    pub samples: usize,
    /// Every static int8 layer, the largest clipped share first.
    pub layers: Vec<LayerCoverage>,
    /// The graph outputs, in output order.
    pub outputs: Vec<OutputAgreement>,
}

/// One static int8 layer being measured.
struct Watched<'a> {
    node: String,
    range: (f32, f32),
    /// Its smoothing divisors and their axis, as the activation is
    /// quantized divided by them.
    divisors: Option<(&'a [f32], usize)>,
    values: u64,
    clipped: u64,
    max_overshoot: f32,
    per_sample: Vec<u64>,
}

impl Watched<'_> {
    fn observe(&mut self, t: &Tensor, sample: usize) {
        let (lo, hi) = self.range;
        let inner: usize = match self.divisors {
            Some((_, axis)) => t.shape().iter().skip(axis + 1).product(),
            None => 1,
        };
        let mut clipped = 0u64;
        for (i, mut x) in t.to_f32_vec().into_iter().enumerate() {
            if let Some((m, _)) = self.divisors {
                x /= m[(i / inner) % m.len()];
            }
            let over = (x - hi).max(lo - x);
            if over > 0.0 || x.is_nan() {
                clipped += 1;
                self.max_overshoot = self.max_overshoot.max(over);
            }
            self.values += 1;
        }
        self.clipped += clipped;
        self.per_sample[sample] += clipped;
    }

    fn finish(self) -> LayerCoverage {
        let mut samples: Vec<usize> = (0..self.per_sample.len())
            .filter(|&s| self.per_sample[s] > 0)
            .collect();
        samples.sort_by_key(|&s| std::cmp::Reverse(self.per_sample[s]));
        samples.truncate(MAX_NAMED_SAMPLES);
        LayerCoverage {
            node: self.node,
            range: self.range,
            values: self.values,
            clipped: self.clipped,
            max_overshoot: self.max_overshoot,
            samples,
        }
    }
}

/// Runs `reference` (the f32 graph the build was calibrated on) and
/// `lowered` (after `assign-precision`, `outcome` its decisions and
/// calibrated ranges) on the held-out `samples`.
pub fn coverage(
    reference: &Graph,
    lowered: &Graph,
    outcome: &PrecisionOutcome,
    samples: &[Vec<Tensor>],
) -> Result<Coverage, IrError> {
    // Each watched activation by the value it reads.
    let mut watched: Vec<(NodeId, Watched)> = Vec::new();
    for id in reference.node_ids() {
        let node = reference.node(id);
        let Some(&range) = outcome.activation_ranges.get(&node.name) else {
            continue;
        };
        if !is_precision_layer(&node.op) {
            continue;
        }
        let x = reference.inputs_of(id)[0];
        let rank = reference.node(x).ty.shape.len();
        let divisors = (outcome.smoothing.get(&node.name))
            .map(|m| (m.as_slice(), channel_axis(&node.op, rank)));
        watched.push((
            x,
            Watched {
                node: node.name.clone(),
                range,
                divisors,
                values: 0,
                clipped: 0,
                max_overshoot: 0.0,
                per_sample: vec![0; samples.len()],
            },
        ));
    }
    let mut by_value: HashMap<NodeId, Vec<usize>> = HashMap::new();
    for (i, (x, _)) in watched.iter().enumerate() {
        by_value.entry(*x).or_default().push(i);
    }
    let outputs = reference.outputs();
    let mut accs: Vec<Acc> = outputs.iter().map(|_| Acc::default()).collect();
    let mut agree: Vec<(u64, u64)> = vec![(0, 0); outputs.len()];
    for (s, sample) in samples.iter().enumerate() {
        let mut observe = |id: NodeId, t: &Tensor| {
            for &i in by_value.get(&id).into_iter().flatten() {
                watched[i].1.observe(t, s);
            }
        };
        for (&id, t) in reference.inputs().iter().zip(sample) {
            observe(id, t);
        }
        let f32_out = kiln_ir::eval::eval_graph_with(reference, sample, &mut observe)?;
        let int8_out = kiln_ir::eval::eval_graph(lowered, sample)?;
        for (k, (r, y)) in f32_out.iter().zip(&int8_out).enumerate() {
            let (r, y) = (r.to_f32_vec(), y.to_f32_vec());
            accs[k].add(&r, &y);
            let last = f32_out[k].shape().last().copied().unwrap_or(1);
            if last > 1 {
                for (rr, yr) in r.chunks(last).zip(y.chunks(last)) {
                    agree[k].0 += u64::from(argmax(rr) == argmax(yr));
                    agree[k].1 += 1;
                }
            }
        }
    }
    let mut layers: Vec<LayerCoverage> = watched.into_iter().map(|(_, w)| w.finish()).collect();
    layers.sort_by(|a, b| {
        (b.clipped_share().total_cmp(&a.clipped_share())).then(a.node.cmp(&b.node))
    });
    let outputs = (outputs.iter().zip(&accs).zip(&agree))
        .map(|(((name, _), acc), &(same, rows))| {
            let e = acc.finish(name.clone(), "", super::types::Precision::Fp32);
            OutputAgreement {
                output: name.clone(),
                rel_l2: e.rel_l2,
                cosine: e.cosine,
                argmax_agreement: (rows > 0).then(|| same as f64 / rows as f64),
            }
        })
        .collect();
    Ok(Coverage {
        samples: samples.len(),
        layers,
        outputs,
    })
}

/// The index of the largest value (the first of equals; NaN never wins).
fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_equals_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), 1);
    }

    #[test]
    fn clipping_is_counted_after_the_smoothing_divisors() {
        let mut w = Watched {
            node: "mm".into(),
            range: (-1.0, 1.0),
            divisors: Some((&[1.0, 4.0], 1)),
            values: 0,
            clipped: 0,
            max_overshoot: 0.0,
            per_sample: vec![0; 2],
        };
        // Channel 1 is divided by 4: 3.0 becomes 0.75, inside.
        let t = Tensor::new([2, 2], kiln_ir::Data::F32(vec![0.5, 3.0, 2.5, -0.5])).unwrap();
        w.observe(&t, 1);
        let c = w.finish();
        assert_eq!((c.values, c.clipped), (4, 1));
        assert_eq!(c.max_overshoot, 1.5);
        assert_eq!(c.samples, [1]);
        assert_eq!(c.clipped_share(), 0.25);
    }
}
