//! The graph: a petgraph `StableDiGraph` of single-output nodes.

use crate::{infer, IrError, Op, Tensor, ValueType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

/// Identifies a node (and its value) in a [`Graph`]. Stable across removals.
pub type NodeId = NodeIndex<u32>;

/// A node: one operation producing one value.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The operation.
    pub op: Op,
    /// The source name (ONNX node or value name), for diagnostics.
    pub name: String,
    /// The type of the produced value.
    pub ty: ValueType,
}

/// The dataflow graph. Edges run from producer to consumer and carry the
/// consumer's input slot.
///
/// **Invariant:** every node's type is the one inference gives for its op
/// and inputs; [`Graph::add_node`] is the only way to add a computing node,
/// and it runs inference.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    g: StableDiGraph<Node, usize>,
    inputs: Vec<NodeId>,
    outputs: Vec<(String, NodeId)>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a graph input named `name`.
    pub fn add_input(&mut self, name: impl Into<String>, ty: ValueType) -> NodeId {
        let index = self.inputs.len();
        let id = self.g.add_node(Node {
            op: Op::Input { index },
            name: name.into(),
            ty,
        });
        self.inputs.push(id);
        id
    }

    /// Adds a constant.
    pub fn add_const(&mut self, name: impl Into<String>, value: Tensor) -> NodeId {
        let ty = ValueType::new(value.dtype(), value.shape().clone());
        self.g.add_node(Node {
            op: Op::Constant(value),
            name: name.into(),
            ty,
        })
    }

    /// Adds a computing node after inferring its type from its inputs.
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: &[NodeId],
        name: impl Into<String>,
    ) -> Result<NodeId, IrError> {
        let types: Vec<&ValueType> = inputs.iter().map(|&i| &self.g[i].ty).collect();
        let ty = infer::infer(&op, &types)?;
        // Inference checks each dim, not their product: a shape whose
        // byte size does not fit in an `isize` (e.g. a Conv with 2^40 pads)
        // is an error here, so later code may multiply dims freely.
        if ty.checked_size_bytes().is_none() {
            return Err(IrError::ty(
                op.name(),
                format!("output {ty} is too large to address"),
            ));
        }
        let id = self.g.add_node(Node {
            op,
            name: name.into(),
            ty,
        });
        for (slot, &input) in inputs.iter().enumerate() {
            self.g.add_edge(input, id, slot);
        }
        Ok(id)
    }

    /// Marks `node` as the graph output named `name`.
    pub fn add_output(&mut self, name: impl Into<String>, node: NodeId) {
        self.outputs.push((name.into(), node));
    }

    /// The node `id`. Panics if it was removed (a logic error in a pass).
    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    /// Whether `id` names a live node.
    pub fn contains(&self, id: NodeId) -> bool {
        self.g.contains_node(id)
    }

    /// Renames a node (names are diagnostics only).
    pub fn rename(&mut self, id: NodeId, name: impl Into<String>) {
        self.g[id].name = name.into();
    }

    /// The graph inputs, in order.
    pub fn inputs(&self) -> &[NodeId] {
        &self.inputs
    }

    /// The graph outputs, in order, with their names.
    pub fn outputs(&self) -> &[(String, NodeId)] {
        &self.outputs
    }

    /// Whether `id` is a graph output (under any name).
    pub fn is_output(&self, id: NodeId) -> bool {
        self.outputs.iter().any(|(_, o)| *o == id)
    }

    /// Number of live nodes.
    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    /// All live node ids, in index order.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices()
    }

    /// The inputs of `id`, ordered by slot.
    pub fn inputs_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut edges: Vec<(usize, NodeId)> = self
            .g
            .edges_directed(id, Direction::Incoming)
            .map(|e| (*e.weight(), e.source()))
            .collect();
        edges.sort_unstable();
        edges.into_iter().map(|(_, n)| n).collect()
    }

    /// The consumers of `id` with the slot they read it in.
    pub fn users_of(&self, id: NodeId) -> Vec<(NodeId, usize)> {
        let mut users: Vec<(NodeId, usize)> = self
            .g
            .edges_directed(id, Direction::Outgoing)
            .map(|e| (e.target(), *e.weight()))
            .collect();
        users.sort_unstable();
        users
    }

    /// Whether `id` is read by a node or is a graph output.
    pub fn is_used(&self, id: NodeId) -> bool {
        self.g
            .edges_directed(id, Direction::Outgoing)
            .next()
            .is_some()
            || self.outputs.iter().any(|(_, o)| *o == id)
    }

    /// The constant value of `id`, if it is a constant node.
    pub fn constant(&self, id: NodeId) -> Option<&Tensor> {
        match &self.g[id].op {
            Op::Constant(t) => Some(t),
            _ => None,
        }
    }

    /// Redirects every use of `old` (edges and graph outputs) to `new`.
    /// The types must be equal.
    pub fn replace_all_uses(&mut self, old: NodeId, new: NodeId) -> Result<(), IrError> {
        if self.g[old].ty != self.g[new].ty {
            return Err(IrError::Verify {
                node: self.g[old].name.clone(),
                message: format!(
                    "cannot replace a {} value with a {} value",
                    self.g[old].ty, self.g[new].ty
                ),
            });
        }
        for (user, slot) in self.users_of(old) {
            let edge = self
                .g
                .edges_directed(user, Direction::Incoming)
                .find(|e| e.source() == old && *e.weight() == slot)
                .map(|e| e.id())
                .expect("edge listed by users_of");
            self.g.remove_edge(edge);
            self.g.add_edge(new, user, slot);
        }
        for (_, o) in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
        Ok(())
    }

    /// Removes a node that nothing uses. Graph inputs cannot be removed.
    /// Returns whether it removed the node; false also for a node already
    /// removed (a consumer that read one value twice lists it twice).
    pub fn remove_unused(&mut self, id: NodeId) -> bool {
        if !self.g.contains_node(id)
            || self.is_used(id)
            || matches!(self.g[id].op, Op::Input { .. })
        {
            return false;
        }
        self.g.remove_node(id);
        true
    }

    /// Nodes in a topological order (inputs before users, ties broken by
    /// node index so the order is deterministic). Fails on a cycle.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, IrError> {
        petgraph::algo::toposort(&self.g, None)
            .map_err(|c| IrError::Cycle(self.g[c.node_id()].name.clone()))
            .map(|_| self.stable_topo_order())
    }

    /// Kahn's algorithm with a min-heap on node index: deterministic and
    /// close to the import order. Assumes the graph is acyclic.
    fn stable_topo_order(&self) -> Vec<NodeId> {
        use std::cmp::Reverse;
        use std::collections::{BinaryHeap, HashMap};
        let mut pending: HashMap<NodeId, usize> = HashMap::new();
        let mut ready = BinaryHeap::new();
        for id in self.g.node_indices() {
            let n = self.g.edges_directed(id, Direction::Incoming).count();
            if n == 0 {
                ready.push(Reverse(id));
            } else {
                pending.insert(id, n);
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(id)) = ready.pop() {
            order.push(id);
            for e in self.g.edges_directed(id, Direction::Outgoing) {
                let n = pending.get_mut(&e.target()).expect("pending consumer");
                *n -= 1;
                if *n == 0 {
                    ready.push(Reverse(e.target()));
                }
            }
        }
        order
    }

    /// Adds an edge without inference; only for building deliberately broken
    /// graphs in verifier tests.
    #[doc(hidden)]
    pub fn add_edge_unchecked(&mut self, from: NodeId, to: NodeId, slot: usize) {
        self.g.add_edge(from, to, slot);
    }
}

impl Graph {
    /// The slots of the incoming edges of `id` (verifier use).
    pub(crate) fn users_of_slots(&self, id: NodeId) -> Vec<usize> {
        self.g
            .edges_directed(id, Direction::Incoming)
            .map(|e| *e.weight())
            .collect()
    }
}
