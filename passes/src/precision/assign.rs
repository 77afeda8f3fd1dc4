//! `assign-precision`: stores the weights of the dense ops (MatMul, Gemm,
//! Conv) in bf16 or f16 and, for bf16, feeds their activations through a
//! Cast to bf16, so that the targets run them on reduced-precision kernels
//! with f32 accumulation (`docs/precision.md`).
//!
//! The representation is the value types: a dense op with a bf16/f16
//! operand returns f32 ([`kiln_ir::infer::dense_result`]); everything else
//! (Softmax, normalizations, reductions, exp/log/pow, elementwise ops, the
//! graph outputs) keeps computing in f32.

use super::measured::Measured;
use super::policy::{Mode, Policy};
use super::quantize::{
    quantize_conv, quantize_dense, ActivationRange, Calibrated, ConvInt8Form, Int8Form,
};
use super::types::{is_embedding_lookup, is_precision_layer, Decision, Precision, Reason};
use crate::pass::{Pass, PassError, PassStats};
use half::{bf16, f16};
use kiln_ir::{DType, Data, Graph, IrError, NodeId, Op, Tensor};
use std::collections::BTreeMap;

/// The pass. Its decisions are recorded in [`AssignPrecision::decisions`]
/// by [`AssignPrecision::assign`].
#[derive(Clone, Debug, Default)]
pub struct AssignPrecision {
    /// What the user asked for.
    pub policy: Policy,
    /// What was measured for it on calibration samples.
    pub measured: Measured,
}

/// Which operand of a dense op is the constant weight, and which the
/// activation that is cast to bf16 (none for Conv and a transposed A,
/// whose kernels read f32 activations).
fn operands(graph: &Graph, id: NodeId) -> Result<(usize, Option<usize>), &'static str> {
    let node = graph.node(id);
    let inputs = graph.inputs_of(id);
    if node.ty.dtype != DType::F32 || inputs.iter().any(|&i| graph.node(i).ty.dtype != DType::F32) {
        return Err("not an f32 op");
    }
    let is_const = |slot: usize| graph.constant(inputs[slot]).is_some();
    match &node.op {
        Op::MatMul if is_const(1) && !is_const(0) && graph.node(inputs[1]).ty.shape.len() >= 2 => {
            Ok((1, Some(0)))
        }
        Op::Gemm { trans_a: false, .. } if is_const(1) && !is_const(0) => Ok((1, Some(0))),
        Op::Gemm { .. } if is_const(1) && !is_const(0) => Ok((1, None)),
        Op::Conv(c) if c.group == 1 && is_const(1) && !is_const(0) => Ok((1, None)),
        Op::Conv(_) => Err("grouped/depthwise convolution (memory-bound, f32 kernel)"),
        Op::MatMul | Op::Gemm { .. } => Err("no constant weight operand"),
        _ => Err("not a dense op"),
    }
}

impl AssignPrecision {
    /// The pass's name (`--passes`, reports, IR dumps).
    pub const NAME: &'static str = "assign-precision";

    /// The precision of every dense node by the policy, in topological
    /// order.
    pub fn decide(&self, graph: &Graph) -> Result<Vec<(NodeId, Decision)>, PassError> {
        let failed = |source| PassError::Failed {
            pass: Self::NAME,
            source,
        };
        let planned = match &self.policy.plan {
            Some(plan) => Some(plan.resolve(graph)?),
            None => None,
        };
        // Dense ops and embedding lookups, in order.
        let dense: Vec<NodeId> = graph
            .topo_order()
            .map_err(failed)?
            .into_iter()
            .filter(|&id| is_precision_layer(&graph.node(id).op) || is_embedding_lookup(graph, id))
            .collect();
        let eligible: Vec<NodeId> = dense
            .iter()
            .copied()
            .filter(|&id| operands(graph, id).is_ok())
            .collect();
        let base = match self.policy.mode {
            Mode::Fp32 | Mode::Mixed => Precision::Fp32,
            Mode::Bf16 => Precision::Bf16,
            Mode::Fp16 => Precision::Fp16,
            Mode::Int8 => Precision::Int8,
        };
        let mut out = Vec::new();
        for id in dense {
            let node = graph.node(id);
            let mut decision = Decision {
                node: node.name.clone(),
                op: node.op.name(),
                precision: base,
                reason: Reason::Mode,
            };
            if self.policy.mode == Mode::Mixed {
                let edge = eligible.first() == Some(&id) || eligible.last() == Some(&id);
                if edge {
                    decision.reason = Reason::MixedEdge;
                } else {
                    decision.precision = Precision::Bf16;
                }
            }
            for (p, pats) in &self.policy.force {
                if let Some(pat) = pats.iter().find(|p| p.matches(&node.op, &node.name)) {
                    decision.precision = *p;
                    decision.reason = Reason::Force(format!("{p}={pat}"));
                }
            }
            if let Some(pat) =
                (self.policy.keep_fp32.iter()).find(|p| p.matches(&node.op, &node.name))
            {
                decision.precision = Precision::Fp32;
                decision.reason = Reason::KeepFp32(pat.to_string());
            }
            if let Some(p) = planned.as_ref().and_then(|m| m.get(&id)) {
                decision.precision = *p;
                decision.reason = Reason::Plan;
            }
            if let Some(why) = self.measured.fallback.get(&node.name) {
                decision.precision = Precision::Fp32;
                decision.reason = Reason::ErrorFallback(why.clone());
            }
            let eligible = if is_embedding_lookup(graph, id) {
                Ok(())
            } else {
                operands(graph, id).and_then(|slots| {
                    if decision.precision == Precision::Int8 {
                        int8_form(graph, id, slots).map(|_| ())
                    } else {
                        Ok(())
                    }
                })
            };
            if let Err(why) = eligible {
                if decision.precision != Precision::Fp32 {
                    decision.precision = Precision::Fp32;
                    decision.reason = Reason::NotEligible(why);
                }
            }
            out.push((id, decision));
        }
        Ok(out)
    }

    /// Runs the pass and returns its decisions.
    pub fn assign(&self, graph: &mut Graph) -> Result<(PassStats, Vec<Decision>), PassError> {
        let failed = |source| PassError::Failed {
            pass: Self::NAME,
            source,
        };
        let mut stats = PassStats::default();
        if self.policy.is_identity() {
            return Ok((stats, Vec::new()));
        }
        let decisions = self.decide(graph)?;
        // One converted copy per (weight, precision) and one Cast per
        // activation: two dense ops reading one value share them.
        let mut weights: BTreeMap<(NodeId, DType), NodeId> = BTreeMap::new();
        let mut casts: BTreeMap<(NodeId, DType), NodeId> = BTreeMap::new();
        let mut old_weights = Vec::new();
        for (id, d) in &decisions {
            if d.precision == Precision::Fp32 {
                continue;
            }
            if is_embedding_lookup(graph, *id) {
                old_weights.push(graph.inputs_of(*id)[0]);
                stats.added += store_table(graph, *id, d.precision).map_err(failed)?;
                stats.rewritten += 1;
                continue;
            }
            let (w_slot, act_slot) = operands(graph, *id).expect("decide checked");
            if d.precision == Precision::Int8 {
                let inputs = graph.inputs_of(*id);
                let range = match self
                    .measured
                    .activation_ranges
                    .as_ref()
                    .and_then(|r| r.get(&d.node))
                {
                    Some(&(lo, hi)) => ActivationRange::Static { lo, hi },
                    None => ActivationRange::Dynamic,
                };
                let activation = (range, self.policy.activation_type);
                let calibrated = Calibrated {
                    smoothing: self.measured.smoothing.get(&d.node).map(Vec::as_slice),
                    bias_correction: (self.measured.bias_corrections.get(&d.node))
                        .map(Vec::as_slice),
                };
                let form = int8_form(graph, *id, (w_slot, act_slot)).expect("decide checked");
                let added = match form {
                    Int8Rewrite::Dense(form) => {
                        let c = match (inputs.get(2), form.beta) {
                            (None, _) => None,
                            (Some(&c), 1.0) => Some(c),
                            (Some(&c), beta) => {
                                let name = format!("{}/beta", d.node);
                                let t = Tensor::new([], Data::F32(vec![beta])).expect("scalar");
                                let b = graph.add_const(name.clone(), t);
                                let scaled = graph
                                    .add_node(
                                        Op::Binary(kiln_ir::BinaryOp::Mul),
                                        &[c, b],
                                        format!("{name}_c"),
                                    )
                                    .map_err(failed)?;
                                stats.added += 2;
                                Some(scaled)
                            }
                        };
                        quantize_dense(graph, *id, inputs[0], &form, c, activation, calibrated)
                    }
                    Int8Rewrite::Conv(form) => {
                        quantize_conv(graph, *id, inputs[0], &form, activation, calibrated)
                    }
                };
                stats.added += added.map_err(failed)?;
                stats.rewritten += 1;
                old_weights.extend(inputs[1..].iter().copied());
                continue;
            }
            let dtype = d.precision.dtype();
            let mut inputs = graph.inputs_of(*id);
            let w = inputs[w_slot];
            inputs[w_slot] = match weights.get(&(w, dtype)) {
                Some(&c) => c,
                None => {
                    let t = graph.constant(w).expect("checked constant");
                    let converted = convert(t, dtype);
                    let name = format!("{}/{}", graph.node(w).name, dtype);
                    let c = graph.add_const(name, converted);
                    weights.insert((w, dtype), c);
                    old_weights.push(w);
                    stats.added += 1;
                    c
                }
            };
            if let (Some(slot), Precision::Bf16) = (act_slot, d.precision) {
                let x = inputs[slot];
                inputs[slot] = match casts.get(&(x, dtype)) {
                    Some(&c) => c,
                    None => {
                        let name = format!("{}/to_{}", graph.node(x).name, dtype);
                        let c = graph
                            .add_node(Op::Cast { to: dtype }, &[x], name)
                            .map_err(failed)?;
                        casts.insert((x, dtype), c);
                        stats.added += 1;
                        c
                    }
                };
            }
            let node = graph.node(*id);
            let (op, name) = (node.op.clone(), node.name.clone());
            let new = graph.add_node(op, &inputs, name).map_err(failed)?;
            graph.replace_all_uses(*id, new).map_err(failed)?;
            graph.remove_unused(*id);
            stats.rewritten += 1;
        }
        for w in old_weights {
            if graph.remove_unused(w) {
                stats.removed += 1;
            }
        }
        Ok((stats, decisions.into_iter().map(|(_, d)| d).collect()))
    }
}

/// Rewrites embedding lookup `id` to read its table in `precision`: a
/// 16-bit table gathered and widened to f32, or an int8 table (symmetric
/// per row) whose gathered rows are widened and multiplied by their
/// gathered scales. The f32 result keeps the node's name. Returns the
/// number of nodes added.
fn store_table(graph: &mut Graph, id: NodeId, precision: Precision) -> Result<usize, IrError> {
    let inputs = graph.inputs_of(id);
    let (table, indices) = (inputs[0], inputs[1]);
    let t = graph
        .constant(table)
        .expect("an embedding table is a constant");
    let (rows, cols) = (t.shape()[0], t.shape()[1]);
    let name = graph.node(id).name.clone();
    let gather = Op::Gather { axis: 0 };
    let y = if precision == Precision::Int8 {
        let values = t.to_f32_vec();
        let (q, scales) = super::quantize::quantize_rows(&values, rows, cols);
        let q = Tensor::new([rows, cols], Data::I8(q)).expect("element count");
        let scales = Tensor::new([rows, 1], Data::F32(scales)).expect("element count");
        let q = graph.add_const(format!("{name}/table_int8"), q);
        let scales = graph.add_const(format!("{name}/table_scale"), scales);
        let rows_q = graph.add_node(gather.clone(), &[q, indices], format!("{name}/rows_int8"))?;
        let rows_f = graph.add_node(
            Op::Cast { to: DType::F32 },
            &[rows_q],
            format!("{name}/rows_float"),
        )?;
        let s = graph.add_node(gather, &[scales, indices], format!("{name}/row_scales"))?;
        graph.add_node(Op::Binary(kiln_ir::BinaryOp::Mul), &[rows_f, s], name)?
    } else {
        let dtype = precision.dtype();
        let converted = convert(t, dtype);
        let c = graph.add_const(format!("{name}/table_{dtype}"), converted);
        let rows_h = graph.add_node(gather, &[c, indices], format!("{name}/rows_{dtype}"))?;
        graph.add_node(Op::Cast { to: DType::F32 }, &[rows_h], name)?
    };
    graph.replace_all_uses(id, y)?;
    graph.remove_unused(id);
    Ok(if precision == Precision::Int8 { 6 } else { 3 })
}

/// How a dense node is rewritten for int8.
enum Int8Rewrite {
    /// MatMul or Gemm: `alpha * (x @ W) + beta * C`.
    Dense(Int8Form),
    /// An ungrouped Conv with a constant bias.
    Conv(ConvInt8Form),
}

/// The int8 form of dense node `id` with operand slots `slots` (see
/// [`operands`]), or why it has none: MatMul with a 2-D weight and Gemm
/// without a transposed A (the activation must be the left operand,
/// quantized per tensor), and ungrouped Conv with a constant bias.
fn int8_form(
    graph: &Graph,
    id: NodeId,
    slots: (usize, Option<usize>),
) -> Result<Int8Rewrite, &'static str> {
    let inputs = graph.inputs_of(id);
    if let Op::Conv(c) = &graph.node(id).op {
        let w = graph.constant(inputs[1]).expect("operands checked");
        let s = w.shape();
        let bias = match inputs.get(2) {
            None => None,
            Some(&b) => Some(
                graph
                    .constant(b)
                    .ok_or("int8 takes a Conv whose bias is a constant")?
                    .to_f32_vec(),
            ),
        };
        return Ok(Int8Rewrite::Conv(ConvInt8Form {
            conv: c.clone(),
            weights: w.to_f32_vec(),
            shape: [s[0], s[1], s[2], s[3]],
            bias,
        }));
    }
    if slots != (1, Some(0)) {
        return Err("int8 needs the activation as the left operand of a MatMul or Gemm");
    }
    let w = graph.constant(inputs[1]).expect("operands checked");
    let shape = w.shape();
    let values = w.to_f32_vec();
    match graph.node(id).op {
        Op::MatMul if shape.len() == 2 && graph.node(inputs[0]).ty.shape.len() >= 2 => {
            Ok(Int8Rewrite::Dense(Int8Form {
                weights: values,
                k: shape[0],
                n: shape[1],
                alpha: 1.0,
                beta: 1.0,
            }))
        }
        Op::Gemm {
            alpha,
            beta,
            trans_b,
            ..
        } => {
            let (k, n) = if trans_b {
                (shape[1], shape[0])
            } else {
                (shape[0], shape[1])
            };
            let weights = if trans_b {
                (0..k * n).map(|i| values[(i % n) * k + i / n]).collect()
            } else {
                values
            };
            Ok(Int8Rewrite::Dense(Int8Form {
                weights,
                k,
                n,
                alpha,
                beta,
            }))
        }
        _ => Err("int8 takes MatMul with a 2-D weight and a matrix activation, Gemm and Conv"),
    }
}

/// `t` rounded to nearest-even in `dtype` (bf16 or f16).
fn convert(t: &Tensor, dtype: DType) -> Tensor {
    let v = t.to_f32_vec();
    let data = match dtype {
        DType::BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
        DType::F16 => Data::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
        _ => Data::F32(v),
    };
    Tensor::new(t.shape(), data).expect("same element count")
}

impl Pass for AssignPrecision {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        self.assign(graph).map(|(s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Pattern;
    use kiln_ir::{UnaryOp, ValueType};

    fn mlp() -> (Graph, NodeId, NodeId) {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
        let w1 = (0..12).map(|i| i as f32 * 0.1 + 0.01).collect();
        let w1 = g.add_const("w1", Tensor::new([3, 4], Data::F32(w1)).unwrap());
        let w2 = (0..8).map(|i| 1.0 / (i as f32 + 3.0)).collect();
        let w2 = g.add_const("w2", Tensor::new([4, 2], Data::F32(w2)).unwrap());
        let h = g.add_node(Op::MatMul, &[x, w1], "/fc1/MatMul").unwrap();
        let r = g.add_node(Op::Unary(UnaryOp::Relu), &[h], "/relu").unwrap();
        let y = g.add_node(Op::MatMul, &[r, w2], "/fc2/MatMul").unwrap();
        g.add_output("y", y);
        (g, x, y)
    }

    fn pass(mode: Mode) -> AssignPrecision {
        AssignPrecision {
            policy: Policy {
                mode,
                ..Policy::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn fp32_leaves_the_graph_untouched() {
        let (mut g, _, _) = mlp();
        let before = kiln_ir::text::print(&g);
        let (stats, d) = pass(Mode::Fp32).assign(&mut g).unwrap();
        assert!(!stats.changed() && d.is_empty());
        assert_eq!(kiln_ir::text::print(&g), before);
    }

    #[test]
    fn bf16_stores_weights_casts_activations_and_keeps_f32_results() {
        let (mut g, _, _) = mlp();
        let (_, d) = pass(Mode::Bf16).assign(&mut g).unwrap();
        assert!(d.iter().all(|d| d.precision == Precision::Bf16));
        kiln_ir::verify::verify(&g).unwrap();
        let text = kiln_ir::text::print(&g);
        assert_eq!(text.matches("cast(").count(), 2, "{text}");
        assert_eq!(text.matches(": bf16[3,4] = const").count(), 1, "{text}");
        assert!(!text.contains(": f32[3,4] = const"), "{text}");
        let (_, y) = g.outputs()[0].clone();
        assert_eq!(g.node(y).ty.dtype, DType::F32);
    }

    #[test]
    fn mixed_keeps_first_and_last_dense_layers_and_overrides_apply() {
        let (mut g, _, _) = mlp();
        let d = pass(Mode::Mixed).decide(&g).unwrap();
        assert!(d.iter().all(|(_, d)| d.precision == Precision::Fp32));
        let p = AssignPrecision {
            policy: Policy {
                mode: Mode::Bf16,
                keep_fp32: Pattern::list("/fc2/*").unwrap(),
                force: vec![Policy::parse_force("fp16=/fc1/MatMul").unwrap()],
                ..Policy::default()
            },
            ..Default::default()
        };
        let (_, d) = p.assign(&mut g).unwrap();
        assert_eq!(d[0].precision, Precision::Fp16);
        assert_eq!(d[1].precision, Precision::Fp32);
        assert_eq!(d[1].reason, Reason::KeepFp32("/fc2/*".into()));
        kiln_ir::verify::verify(&g).unwrap();
    }

    #[test]
    fn eval_matches_bf16_rounded_operands() {
        let (g0, _, _) = mlp();
        let mut g = g0.clone();
        pass(Mode::Bf16).assign(&mut g).unwrap();
        let x = Tensor::new([2, 3], Data::F32(vec![0.3, -1.7, 2.9, 0.11, 5.3, -0.77])).unwrap();
        let y0 = kiln_ir::eval::eval_graph(&g0, std::slice::from_ref(&x)).unwrap();
        let y = kiln_ir::eval::eval_graph(&g, &[x]).unwrap();
        let (a, b) = (y0[0].to_f32_vec(), y[0].to_f32_vec());
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() <= 2e-2 * (1.0 + p.abs()), "{a:?} vs {b:?}");
        }
        assert_ne!(a, b, "bf16 rounding must be visible");
    }

    /// ids [2, 3] -> Gather of a `rows × 64` table -> MatMul [64, 4].
    fn embedding(rows: usize) -> (Graph, Tensor) {
        let mut g = Graph::new();
        let ids = g.add_input("ids", ValueType::new(DType::I64, [2, 3]));
        let table = (0..rows * 64).map(|i| (i as f32 * 0.013).sin()).collect();
        let table = g.add_const("table", Tensor::new([rows, 64], Data::F32(table)).unwrap());
        let e = g
            .add_node(Op::Gather { axis: 0 }, &[table, ids], "/embeddings/Gather")
            .unwrap();
        let w = (0..256).map(|i| (i as f32 * 0.7).cos()).collect();
        let w = g.add_const("w", Tensor::new([64, 4], Data::F32(w)).unwrap());
        let y = g.add_node(Op::MatMul, &[e, w], "/fc/MatMul").unwrap();
        g.add_output("y", y);
        let ids = Tensor::new([2, 3], Data::I64(vec![0, 5, 1023, 17, 5, 600])).unwrap();
        (g, ids)
    }

    /// An embedding table is stored in the build's precision (int8:
    /// symmetric per row) and its rows widened after the lookup, within
    /// the precision's rounding of the f32 lookup; a small table, and one
    /// `--keep-fp32 Gather` names, stay f32.
    #[test]
    fn embedding_tables_are_stored_in_the_builds_precision() {
        let stored = |g: &Graph, dtype: DType| {
            g.node_ids()
                .filter_map(|id| g.constant(id))
                .any(|t| t.dtype() == dtype && t.len() == 1024 * 64)
        };
        let (g, ids) = embedding(1024);
        assert!(is_embedding_lookup(
            &g,
            g.node_ids()
                .find(|&id| g.node(id).name == "/embeddings/Gather")
                .unwrap()
        ));
        let exact =
            kiln_ir::eval::eval_graph(&g, std::slice::from_ref(&ids)).unwrap()[0].to_f32_vec();
        for (mode, dtype, tolerance) in [
            (Mode::Bf16, DType::BF16, 5e-2),
            (Mode::Fp16, DType::F16, 5e-3),
            (Mode::Int8, DType::I8, 5e-2),
        ] {
            let mut q = g.clone();
            let (_, d) = pass(mode).assign(&mut q).unwrap();
            kiln_ir::verify::verify(&q).unwrap();
            let table = d.iter().find(|d| d.op == "gather").expect("a decision");
            assert_eq!(table.precision.dtype(), dtype, "{mode:?}");
            assert!(stored(&q, dtype) && !stored(&q, DType::F32), "{mode:?}");
            let y =
                kiln_ir::eval::eval_graph(&q, std::slice::from_ref(&ids)).unwrap()[0].to_f32_vec();
            let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in y.iter().zip(&exact) {
                assert!(
                    (a - b).abs() <= tolerance * scale,
                    "{mode:?}: {y:?} vs {exact:?}"
                );
            }
        }
        let (small, _) = embedding(100);
        let mut q = small.clone();
        let (_, d) = pass(Mode::Fp16).assign(&mut q).unwrap();
        assert!(d.iter().all(|d| d.op != "gather"));
        let mut q = g.clone();
        let keep = AssignPrecision {
            policy: Policy {
                mode: Mode::Int8,
                keep_fp32: Pattern::list("Gather").unwrap(),
                ..Policy::default()
            },
            ..Default::default()
        };
        keep.assign(&mut q).unwrap();
        assert!(stored(&q, DType::F32) && !stored(&q, DType::I8));
    }
}
