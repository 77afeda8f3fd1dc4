//! `fold-constants`: evaluates nodes whose inputs are all constants.

use crate::{Pass, PassError, PassStats};
use kiln_ir::{Graph, Op};

/// Replaces every node whose inputs are all constants by a constant holding
/// its value, computed with the reference evaluator (the IR's ground truth).
///
/// A result larger than `max_bytes` is left unfolded, so folding never
/// inflates the artifact (e.g. by materializing a broadcast of a scalar).
pub struct FoldConstants {
    /// Largest folded result, in bytes.
    pub max_bytes: usize,
}

impl Default for FoldConstants {
    fn default() -> Self {
        FoldConstants {
            max_bytes: 16 << 20,
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
        for id in graph.topo_order().map_err(fail)? {
            let node = graph.node(id);
            if matches!(node.op, Op::Input { .. } | Op::Constant(_))
                || node.ty.size_bytes() > self.max_bytes
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
            let value = kiln_ir::eval::eval(&node.op, &values).map_err(fail)?;
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
        let mut g = Graph::new();
        let a = g.add_const("a", Tensor::new([4], Data::F32(vec![1.0; 4])).unwrap());
        let y = g
            .add_node(Op::Unary(kiln_ir::UnaryOp::Neg), &[a], "y")
            .unwrap();
        g.add_output("y", y);
        let stats = FoldConstants { max_bytes: 8 }.run(&mut g).unwrap();
        assert_eq!(stats.rewritten, 0);
    }
}
