//! Graphviz rendering of a graph, for people (`kiln inspect --format dot`).
//!
//! One box per computing node, labelled with the op, its attributes and
//! its value type, filled by element type so that a mixed-precision graph
//! shows where each precision runs (f32 white, bf16 green, f16 blue, int8
//! and uint8 orange, other types grey). Constants are not drawn as nodes
//! (a real model has hundreds): each consumer lists the constants it reads
//! as `name: type` lines instead. Graph inputs and outputs are ellipses.
//! Node order follows [`Graph::topo_order`], so the output is deterministic.

use super::print::attributes;
use crate::{DType, Graph, NodeId, Op};
use std::collections::HashMap;
use std::fmt::Write;

/// Fill colour of a node computing values of `d`.
fn fill(d: DType) -> &'static str {
    match d {
        DType::F32 => "white",
        DType::BF16 => "palegreen",
        DType::F16 => "lightblue",
        DType::I8 | DType::U8 => "orange",
        _ => "lightgrey",
    }
}

/// Escapes `s` for a double-quoted DOT label.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Long attribute lists (e.g. Reshape shapes of big models) are cut.
fn short(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        s.to_string()
    } else {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut}...")
    }
}

/// The graph as a Graphviz `digraph`.
pub(super) fn render(g: &Graph) -> String {
    let order = g.topo_order().unwrap_or_else(|_| g.node_ids().collect());
    let ids: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = String::from(
        "digraph kiln {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", fontname=\"monospace\", fontsize=10];\n  edge [fontname=\"monospace\", fontsize=9];\n",
    );
    for &id in &order {
        let node = g.node(id);
        let n = ids[&id];
        match &node.op {
            Op::Constant(_) => continue,
            Op::Input { .. } => {
                let _ = writeln!(
                    out,
                    "  n{n} [shape=ellipse, fillcolor=\"{}\", label=\"input {}\\n{}\"];",
                    fill(node.ty.dtype),
                    escape(&node.name),
                    node.ty
                );
            }
            op => {
                let mut label = op.name().to_string();
                for a in attributes(op) {
                    let _ = write!(label, "\n{}", short(&a));
                }
                for input in g.inputs_of(id) {
                    let producer = g.node(input);
                    if matches!(producer.op, Op::Constant(_)) {
                        let _ = write!(label, "\n{}: {}", short(&producer.name), producer.ty);
                    }
                }
                let _ = write!(label, "\n= {}", node.ty);
                let _ = writeln!(
                    out,
                    "  n{n} [fillcolor=\"{}\", label=\"{}\", tooltip=\"{}\"];",
                    fill(node.ty.dtype),
                    escape(&label),
                    escape(&node.name)
                );
            }
        }
    }
    for &id in &order {
        if matches!(g.node(id).op, Op::Constant(_)) {
            continue;
        }
        for input in g.inputs_of(id) {
            if matches!(g.node(input).op, Op::Constant(_)) {
                continue;
            }
            let _ = writeln!(out, "  n{} -> n{};", ids[&input], ids[&id]);
        }
    }
    for (i, (name, id)) in g.outputs().iter().enumerate() {
        let _ = writeln!(
            out,
            "  out{i} [shape=ellipse, fillcolor=\"{}\", label=\"output {}\\n{}\"];",
            fill(g.node(*id).ty.dtype),
            escape(name),
            g.node(*id).ty
        );
        if matches!(g.node(*id).op, Op::Constant(_)) {
            continue;
        }
        let _ = writeln!(out, "  n{} -> out{i};", ids[id]);
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use crate::{text, DType, Data, Graph, Op, Tensor, UnaryOp, ValueType};

    #[test]
    fn renders_nodes_edges_constants_and_precision_colours() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
        let w = g.add_const(
            "fc.weight",
            Tensor::new([3, 4], Data::F32(vec![0.5; 12])).unwrap(),
        );
        let y = g.add_node(Op::MatMul, &[x, w], "/fc/MatMul").unwrap();
        let r = g
            .add_node(Op::Unary(UnaryOp::Relu), &[y], "relu\"1")
            .unwrap();
        let h = g
            .add_node(Op::Cast { to: DType::BF16 }, &[r], "to_bf16")
            .unwrap();
        g.add_output("y", h);
        let dot = text::dot(&g);
        assert!(dot.starts_with("digraph kiln {"), "{dot}");
        // The constant is listed in its consumer's label, not drawn.
        assert!(dot.contains("fc.weight: f32[3,4]"), "{dot}");
        assert_eq!(dot.matches("->").count(), 4, "{dot}");
        assert!(dot.contains("tooltip=\"relu\\\"1\""), "{dot}");
        assert!(
            dot.contains("fillcolor=\"palegreen\", label=\"cast"),
            "{dot}"
        );
        assert!(dot.trim_end().ends_with('}'));
    }
}
