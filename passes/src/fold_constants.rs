//! `fold-constants`: evaluates nodes whose inputs are all constants.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::{Graph, Op};

/// Replaces every node whose inputs are all constants by a constant holding
/// its value, computed with the reference evaluator (the IR's ground truth).
///
/// A result larger than `max_bytes` is left unfolded, so folding never
/// inflates the artifact (e.g. by materializing a broadcast of a scalar),
/// unless it is no larger than the constants it consumes alone;
/// once one run has folded `max_total_bytes`, the rest is left to run in
/// the arena, so a graph of many small folds cannot allocate without bound.
pub struct FoldConstants {
    /// Largest folded result, in bytes.
    pub max_bytes: usize,
    /// Most bytes one run of the pass may fold, over the whole graph.
    pub max_total_bytes: usize,
    /// Most scalar operations one fold may cost ([`kiln_ir::eval::work`]);
    /// costlier nodes run in the compiled code instead.
    pub max_work: u64,
}

impl Default for FoldConstants {
    fn default() -> Self {
        FoldConstants {
            max_bytes: 16 << 20,
            max_total_bytes: 1 << 30,
            max_work: kiln_ir::eval::FOLD_WORK_LIMIT,
        }
    }
}

impl Pass for FoldConstants {
    fn name(&self) -> &'static str {
        "fold-constants"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let fail = |source| PassError::Failed {
            pass: "fold-constants",
            source,
        };
        let mut stats = PassStats::default();
        let mut folded_bytes = 0usize;
        for id in graph.topo_order().map_err(fail)? {
            let node = graph.node(id);
            // A reshaped constant shares its data (`Tensor::reshaped`):
            // folding it costs nothing, whatever its size, and lets the
            // targets see constant weights behind a 1-D convolution's
            // lift to 2-D.
            let relabel = matches!(node.op, Op::Reshape { .. });
            let bytes = if relabel { 0 } else { node.ty.size_bytes() };
            // A result no larger than the constants only this node reads
            // (and that fold removes) does not grow the artifact, however
            // large: a weight transposed at import (a ConvTranspose's
            // `[Cout·k·k, Cin]` of 32 MB) folds instead of being transposed
            // on every run.
            let replaced: usize = (graph.inputs_of(id).iter())
                .filter(|&&i| {
                    graph.constant(i).is_some()
                        && graph.users_of(i).len() == 1
                        && !graph.is_output(i)
                })
                .map(|&i| graph.node(i).ty.size_bytes())
                .sum();
            if matches!(node.op, Op::Input { .. } | Op::Constant(_))
                || (bytes > self.max_bytes && bytes > replaced)
                || folded_bytes + bytes > self.max_total_bytes
            {
                continue;
            }
            let inputs = graph.inputs_of(id);
            let Some(values) = inputs
                .iter()
                .map(|&i| graph.constant(i))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            let types: Vec<_> = inputs.iter().map(|&i| &graph.node(i).ty).collect();
            if kiln_ir::eval::work(&node.op, &types, &node.ty) > self.max_work {
                continue;
            }
            let shared = match values.as_slice() {
                [v] if relabel => v.reshaped(&node.ty.shape),
                _ => None,
            };
            let value = match shared {
                Some(v) => v,
                None => kiln_ir::eval::eval(&node.op, &values).map_err(fail)?,
            };
            folded_bytes += bytes;
            let name = node.name.clone();
            let folded = graph.add_const(name, value);
            graph.replace_all_uses(id, folded).map_err(fail)?;
            graph.remove_unused(id);
            stats.rewritten += 1;
            for input in inputs {
                if graph.remove_unused(input) {
                    stats.removed += 1;
                }
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{BinaryOp, DType, Data, Tensor, ValueType};

    #[test]
    fn folds_constant_chain_and_keeps_dynamic_part() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2]));
        let a = g.add_const("a", Tensor::new([2], Data::F32(vec![1.0, 2.0])).unwrap());
        let b = g.add_const("b", Tensor::new([2], Data::F32(vec![10.0, 20.0])).unwrap());
        let ab = g
            .add_node(Op::Binary(BinaryOp::Add), &[a, b], "ab")
            .unwrap();
        let y = g
            .add_node(Op::Binary(BinaryOp::Mul), &[x, ab], "y")
            .unwrap();
        g.add_output("y", y);
        let stats = FoldConstants::default().run(&mut g).unwrap();
        assert_eq!(stats.rewritten, 1);
        let inputs = g.inputs_of(y);
        let folded = g.constant(inputs[1]).expect("folded constant");
        assert_eq!(folded.to_f32_vec(), vec![11.0, 22.0]);
        assert_eq!(g.node_count(), 3);
    }

    #[test]
    fn respects_size_cap() {
        // `a` stays (it is also an output): folding `y` would add 16 bytes.
        let mut g = Graph::new();
        let a = g.add_const("a", Tensor::new([4], Data::F32(vec![1.0; 4])).unwrap());
        let y = g
            .add_node(Op::Unary(kiln_ir::UnaryOp::Neg), &[a], "y")
            .unwrap();
        g.add_output("y", y);
        g.add_output("a", a);
        let stats = FoldConstants {
            max_bytes: 8,
            ..FoldConstants::default()
        }
        .run(&mut g)
        .unwrap();
        assert_eq!(stats.rewritten, 0);
    }

    #[test]
    fn a_result_that_replaces_its_only_constant_folds_past_the_cap() {
        // A transposed weight read by nothing else: same bytes after.
        let mut g = Graph::new();
        let v: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let w = g.add_const("w", Tensor::new([2, 3], Data::F32(v)).unwrap());
        let t = g
            .add_node(
                Op::Transpose {
                    perm: vec![1, 0].into(),
                },
                &[w],
                "t",
            )
            .unwrap();
        g.add_output("t", t);
        let stats = FoldConstants {
            max_bytes: 8,
            ..FoldConstants::default()
        }
        .run(&mut g)
        .unwrap();
        assert_eq!(stats.rewritten, 1);
        let folded = g.constant(g.outputs()[0].1).expect("folded");
        assert_eq!(folded.to_f32_vec(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert_eq!(g.node_count(), 1);
    }

    #[test]
    fn stops_at_total_budget() {
        let mut g = Graph::new();
        let mut v = g.add_const("a", Tensor::new([4], Data::F32(vec![1.0; 4])).unwrap());
        for i in 0..3 {
            v = g
                .add_node(Op::Unary(kiln_ir::UnaryOp::Neg), &[v], format!("n{i}"))
                .unwrap();
        }
        g.add_output("y", v);
        // Each result is 16 bytes: two fit in 40, the third is left to run.
        let stats = FoldConstants {
            max_total_bytes: 40,
            ..FoldConstants::default()
        }
        .run(&mut g)
        .unwrap();
        assert_eq!(stats.rewritten, 2);
        assert!(g.constant(v).is_none(), "the last Neg stays a node");
    }

    #[test]
    fn leaves_costly_folds_to_the_compiled_code() {
        let mut g = Graph::new();
        let a = g.add_const("a", Tensor::new([4, 4], Data::F32(vec![1.0; 16])).unwrap());
        let y = g.add_node(Op::MatMul, &[a, a], "y").unwrap();
        g.add_output("y", y);
        // 16 outputs x 4 multiply-adds = 64 > 63.
        let stats = FoldConstants {
            max_work: 63,
            ..FoldConstants::default()
        }
        .run(&mut g)
        .unwrap();
        assert_eq!(stats.rewritten, 0);
        let stats = FoldConstants::default().run(&mut g).unwrap();
        assert_eq!(stats.rewritten, 1);
    }
}
