//! `dce`: removes nodes whose values reach no graph output.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::Graph;

/// Dead code elimination. Graph inputs stay even when unused: they are part
/// of the model's interface.
pub struct DeadCodeElimination;

impl Pass for DeadCodeElimination {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        // Reverse topological order removes whole dead chains in one sweep.
        let order = graph.topo_order().map_err(|source| PassError::Failed {
            pass: "dce",
            source,
        })?;
        for id in order.into_iter().rev() {
            if graph.remove_unused(id) {
                stats.removed += 1;
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, Op, UnaryOp, ValueType};

    #[test]
    fn removes_dead_chain_keeps_inputs_and_live_nodes() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4]));
        let unused = g.add_input("unused", ValueType::new(DType::F32, [4]));
        let live = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "live").unwrap();
        let dead1 = g.add_node(Op::Unary(UnaryOp::Exp), &[x], "dead1").unwrap();
        let dead2 = g
            .add_node(Op::Unary(UnaryOp::Neg), &[dead1], "dead2")
            .unwrap();
        g.add_output("y", live);
        let stats = DeadCodeElimination.run(&mut g).unwrap();
        assert_eq!(stats.removed, 2);
        assert!(g.contains(x) && g.contains(unused) && g.contains(live));
        assert!(!g.contains(dead1) && !g.contains(dead2));
    }
}
