//! The order kernels run in: a topological order chosen for a small peak
//! of live bytes, since that peak is the arena every target plans.
//!
//! Any topological order computes the same values, but orders differ in how
//! long large values stay live. The order of [`Graph::topo_order`] follows
//! node indices, which rewrites scatter (a `StableDiGraph` reuses the
//! indices of removed nodes): after int8 quantization of PP-OCRv4 det it
//! ran an upsampled 13 MB feature map 25 steps before its consumer, and the
//! arena grew from 30 to 43 MB. As XLA does, [`schedule`] builds several
//! orders and keeps the one with the smallest simulated peak:
//!
//! - the index order of [`Graph::topo_order`] (what the import gave);
//! - a greedy list schedule: among the earliest ready nodes, the one that
//!   frees the most bytes net of what it allocates (ties: index order);
//! - a depth-first post-order from the graph outputs that visits the
//!   operand with the larger subgraph first, so each value is consumed
//!   soon after its last operand is made.
//!
//! The simulation counts every value a target keeps in its arena: graph
//! inputs from the start, kernel outputs from their step to their last
//! read, graph outputs to the end; constants live in the weights, and a
//! Reshape shares its input's buffer. Ties keep the earlier candidate, so a
//! graph no order improves keeps its index order.

use std::collections::{HashMap, HashSet};

use crate::arena::align;
use crate::{Graph, IrError, NodeId, Op};

/// A topological order of `graph` with the smallest simulated peak of live
/// bytes among the candidates above; an error names a node on a cycle.
pub fn schedule(graph: &Graph) -> Result<Vec<NodeId>, IrError> {
    let stable = graph.topo_order()?;
    let model = Liveness::new(graph, &stable);
    let candidates = [
        list_order(graph, &model, &stable),
        post_order(graph, &model, &stable),
    ];
    let mut best = (model.peak(graph, &stable), stable);
    for order in candidates {
        let peak = model.peak(graph, &order);
        if peak < best.0 {
            best = (peak, order);
        }
    }
    Ok(best.1)
}

/// The simulated peak of live bytes of running `graph` in `order` (a
/// topological order of all its nodes).
pub fn peak_live_bytes(graph: &Graph, order: &[NodeId]) -> u64 {
    Liveness::new(graph, order).peak(graph, order)
}

/// Which buffer each node's value occupies and how big it is.
struct Liveness {
    /// The node whose buffer holds each node's value (itself, or for a
    /// Reshape the root of its input); `None` for constants.
    root: HashMap<NodeId, Option<NodeId>>,
    /// Bytes of each buffer (by root node).
    bytes: HashMap<NodeId, u64>,
}

impl Liveness {
    fn new(graph: &Graph, topo: &[NodeId]) -> Liveness {
        let mut root: HashMap<NodeId, Option<NodeId>> = HashMap::new();
        let mut bytes = HashMap::new();
        for &id in topo {
            let node = graph.node(id);
            let r = match node.op {
                Op::Constant(_) => None,
                Op::Reshape { .. } => root[&graph.inputs_of(id)[0]],
                _ => {
                    bytes.insert(id, align(node.ty.size_bytes() as u64));
                    Some(id)
                }
            };
            root.insert(id, r);
        }
        Liveness { root, bytes }
    }

    /// The buffers node `id` reads as a kernel (distinct, constants left
    /// out): none for a Reshape, which shares its input's buffer and whose
    /// users read that buffer themselves.
    fn reads(&self, graph: &Graph, id: NodeId) -> Vec<NodeId> {
        if matches!(graph.node(id).op, Op::Reshape { .. }) {
            return Vec::new();
        }
        let mut reads: Vec<NodeId> = (graph.inputs_of(id).iter())
            .filter_map(|i| self.root[i])
            .collect();
        reads.sort_unstable();
        reads.dedup();
        reads
    }

    /// The bytes node `id` allocates: its buffer, unless it has none of its
    /// own (a constant, a Reshape).
    fn allocates(&self, id: NodeId) -> u64 {
        match self.root[&id] {
            Some(r) if r == id => self.bytes[&id],
            _ => 0,
        }
    }

    /// Readers of each buffer (see [`Liveness::reads`]); graph outputs are
    /// never freed.
    fn readers(&self, graph: &Graph) -> HashMap<NodeId, usize> {
        let mut readers: HashMap<NodeId, usize> = HashMap::new();
        for id in graph.node_ids() {
            for r in self.reads(graph, id) {
                *readers.entry(r).or_default() += 1;
            }
        }
        for (_, id) in graph.outputs() {
            if let Some(r) = self.root[id] {
                // Never counted down to zero.
                let n = readers.entry(r).or_default();
                *n = n.saturating_add(usize::MAX / 2);
            }
        }
        readers
    }

    fn peak(&self, graph: &Graph, order: &[NodeId]) -> u64 {
        let mut readers = self.readers(graph);
        let (mut live, mut peak) = (0u64, 0u64);
        for &id in order {
            live = live.saturating_add(self.allocates(id));
            peak = peak.max(live);
            for r in self.reads(graph, id) {
                let n = readers.get_mut(&r).expect("counted reader");
                *n -= 1;
                if *n == 0 {
                    live = live.saturating_sub(self.bytes[&r]);
                }
            }
        }
        peak
    }
}

/// Ready nodes the list schedule weighs at each step: the earliest in the
/// index order. A bound, so that very wide graphs (thousands of parallel
/// branches) schedule in linear time rather than quadratic.
const LIST_WINDOW: usize = 64;

/// Greedy list scheduling: repeatedly runs, among the [`LIST_WINDOW`]
/// earliest ready nodes, the one with the largest `bytes freed − bytes
/// allocated`, ties by position in `stable`.
fn list_order(graph: &Graph, model: &Liveness, stable: &[NodeId]) -> Vec<NodeId> {
    let position: HashMap<NodeId, usize> =
        stable.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    // Computed once: the gains below look at them at every step.
    let reads: HashMap<NodeId, Vec<NodeId>> = (stable.iter())
        .map(|&id| (id, model.reads(graph, id)))
        .collect();
    let mut readers = model.readers(graph);
    let mut pending: HashMap<NodeId, usize> = HashMap::new();
    // Ready nodes by position in the index order.
    let mut ready: std::collections::BTreeSet<(usize, NodeId)> = Default::default();
    let mut order = Vec::with_capacity(stable.len());
    // Graph inputs and constants first: they hold no step.
    let mut sources = Vec::new();
    for &id in stable {
        let n = graph.inputs_of(id).len();
        if n == 0 {
            sources.push(id);
        } else {
            pending.insert(id, n);
        }
    }
    let mut release = |id: NodeId, ready: &mut std::collections::BTreeSet<(usize, NodeId)>| {
        for (user, _) in graph.users_of(id) {
            let n = pending.get_mut(&user).expect("pending user");
            *n -= 1;
            if *n == 0 {
                ready.insert((position[&user], user));
            }
        }
    };
    for id in sources {
        order.push(id);
        release(id, &mut ready);
    }
    while !ready.is_empty() {
        let gain = |id: NodeId| -> i128 {
            let freed = (reads[&id].iter())
                .filter(|r| readers[r] == 1)
                .fold(0u64, |s, r| s.saturating_add(model.bytes[r]));
            i128::from(freed) - i128::from(model.allocates(id))
        };
        // The first of the largest gains: earlier positions win ties.
        let mut best: Option<(i128, (usize, NodeId))> = None;
        for &entry in ready.iter().take(LIST_WINDOW) {
            let g = gain(entry.1);
            if best.is_none_or(|(b, _)| g > b) {
                best = Some((g, entry));
            }
        }
        let (_, entry) = best.expect("a ready node");
        ready.remove(&entry);
        let id = entry.1;
        order.push(id);
        for r in &reads[&id] {
            *readers.get_mut(r).expect("counted reader") -= 1;
        }
        release(id, &mut ready);
    }
    order
}

/// Depth-first post-order from the graph outputs (then any node no output
/// reaches); each node's operands are visited largest subgraph first.
fn post_order(graph: &Graph, model: &Liveness, topo: &[NodeId]) -> Vec<NodeId> {
    // Bytes of every node's ancestry, shared ancestors counted once per path
    // (as XLA's cumulative size): a cheap proxy for the memory a subgraph
    // holds while it runs.
    let mut cumulative: HashMap<NodeId, u64> = HashMap::new();
    for &id in topo {
        // Saturating: shared ancestry doubles along every diamond.
        let above = (graph.inputs_of(id).iter()).fold(0u64, |s, i| s.saturating_add(cumulative[i]));
        cumulative.insert(id, model.allocates(id).saturating_add(above));
    }
    let mut done: HashSet<NodeId> = HashSet::new();
    let mut order = Vec::with_capacity(topo.len());
    let roots: Vec<NodeId> = (graph.outputs().iter().map(|(_, id)| *id))
        .chain(topo.iter().rev().copied())
        .collect();
    for root in roots {
        // Iterative DFS: (node, operands expanded).
        let mut stack = vec![(root, false)];
        while let Some((id, expanded)) = stack.pop() {
            if done.contains(&id) {
                continue;
            }
            if expanded {
                done.insert(id);
                order.push(id);
                continue;
            }
            stack.push((id, true));
            let mut operands = graph.inputs_of(id);
            operands.sort_by_key(|i| (cumulative[i], *i));
            operands.dedup();
            // The stack pops the largest last pushed, so push smallest first.
            stack.extend(
                (operands.into_iter())
                    .filter(|i| !done.contains(i))
                    .map(|i| (i, false)),
            );
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, ReduceOp, UnaryOp, ValueType};

    /// Two branches that each blow `x` up 64 times and reduce it back,
    /// built breadth-first, so the index order holds both large values at
    /// once (as a rewritten graph's scattered indices can).
    fn two_expansions() -> Graph {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [1, 256]));
        let expand = || Op::Expand {
            shape: [64, 256].into_iter().collect(),
        };
        let big_a = g.add_node(expand(), &[x], "big_a").unwrap();
        let big_b = g.add_node(expand(), &[x], "big_b").unwrap();
        let sum = || Op::Reduce {
            op: ReduceOp::Sum,
            axes: [0].into_iter().collect(),
            keep_dims: false,
        };
        let a = g.add_node(sum(), &[big_a], "a").unwrap();
        let b = g.add_node(sum(), &[big_b], "b").unwrap();
        let neg = g.add_node(Op::Unary(UnaryOp::Neg), &[b], "neg").unwrap();
        let y = g
            .add_node(Op::Binary(crate::BinaryOp::Add), &[a, neg], "y")
            .unwrap();
        g.add_output("y", y);
        g
    }

    fn names(g: &Graph, order: &[NodeId]) -> Vec<String> {
        order.iter().map(|&id| g.node(id).name.clone()).collect()
    }

    #[test]
    fn each_large_value_dies_before_the_next_is_made() {
        let g = two_expansions();
        let stable = g.topo_order().unwrap();
        assert_eq!(
            names(&g, &stable),
            ["x", "big_a", "big_b", "a", "b", "neg", "y"]
        );
        let big = 64 * 256 * 4;
        assert!(peak_live_bytes(&g, &stable) >= 2 * big);
        let order = schedule(&g).unwrap();
        let peak = peak_live_bytes(&g, &order);
        assert!(peak < 2 * big, "{peak}: {:?}", names(&g, &order));
        // A topological order of every node.
        assert_eq!(order.len(), g.node_ids().count());
        let at: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
        for &id in &order {
            assert!(g.inputs_of(id).iter().all(|i| at[i] < at[&id]));
        }
        // Deterministic.
        assert_eq!(schedule(&g).unwrap(), order);
    }

    #[test]
    fn a_graph_no_order_improves_keeps_its_index_order() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 100]));
        let mut v = x;
        for i in 0..5 {
            v = g
                .add_node(Op::Unary(UnaryOp::Relu), &[v], format!("relu{i}"))
                .unwrap();
        }
        g.add_output("y", v);
        assert_eq!(schedule(&g).unwrap(), g.topo_order().unwrap());
    }

    #[test]
    fn reshapes_share_their_input_buffer() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 100]));
        let r = g
            .add_node(
                Op::Reshape {
                    shape: [400].into_iter().collect(),
                },
                &[x],
                "flat",
            )
            .unwrap();
        let y = g.add_node(Op::Unary(UnaryOp::Neg), &[r], "y").unwrap();
        g.add_output("y", y);
        let order = g.topo_order().unwrap();
        // x (1,600 bytes) and y: the reshape adds nothing.
        assert_eq!(peak_live_bytes(&g, &order), 2 * 1600);
    }
}
