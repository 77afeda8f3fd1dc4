//! The graph verifier: checks the invariants every pass must preserve.

use crate::{infer, Graph, IrError, Op};

/// Checks that the graph is acyclic, that every node's inputs fill its
/// slots 0..n without gaps, that every stored type is what inference gives,
/// that graph inputs are numbered in order and that outputs are live nodes.
pub fn verify(g: &Graph) -> Result<(), IrError> {
    g.topo_order()?;
    for (i, &id) in g.inputs().iter().enumerate() {
        if !g.contains(id) || g.node(id).op != (Op::Input { index: i }) {
            return Err(IrError::Verify {
                node: format!("input #{i}"),
                message: "graph input list does not match its Input nodes".into(),
            });
        }
    }
    for id in g.node_ids() {
        let node = g.node(id);
        let fail = |message: String| IrError::Verify {
            node: node.name.clone(),
            message,
        };
        let mut slots: Vec<usize> = g.users_of_slots(id);
        slots.sort_unstable();
        if slots.iter().enumerate().any(|(i, &s)| i != s) {
            return Err(fail(format!(
                "input slots {slots:?} are not 0..{}",
                slots.len()
            )));
        }
        match &node.op {
            Op::Input { .. } => {}
            Op::Constant(t) => {
                if t.dtype() != node.ty.dtype || t.shape() != &node.ty.shape {
                    return Err(fail(format!(
                        "constant does not match its type {}",
                        node.ty
                    )));
                }
            }
            op => {
                let inputs = g.inputs_of(id);
                let types: Vec<_> = inputs.iter().map(|&i| &g.node(i).ty).collect();
                let ty = infer::infer(op, &types).map_err(|e| fail(e.to_string()))?;
                if ty != node.ty {
                    return Err(fail(format!(
                        "stored type {} but inference gives {ty}",
                        node.ty
                    )));
                }
            }
        }
    }
    for (name, id) in g.outputs() {
        if !g.contains(*id) {
            return Err(IrError::Verify {
                node: name.clone(),
                message: "graph output refers to a removed node".into(),
            });
        }
    }
    Ok(())
}
