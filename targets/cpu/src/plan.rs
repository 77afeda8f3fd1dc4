//! Memory plan: where every value lives (weights blob or arena) and which
//! kernels run, in order.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use kiln_ir::{Graph, NodeId, Op};
use kiln_runtime::format::{DType as FDType, TensorSpec};

use crate::CpuError;

/// Alignment of every arena region and weights entry.
pub(crate) const ALIGN: u64 = 64;

/// Which pointer an address is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Base {
    /// The arena (first kernel argument).
    Arena,
    /// The weights (second kernel argument).
    Weights,
}

/// The place of a tensor: a byte offset from a base pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    /// Base pointer.
    pub base: Base,
    /// Byte offset.
    pub offset: u64,
}

/// One kernel to generate.
#[derive(Clone, Debug)]
pub(crate) enum Job {
    /// The kernel computing a node's value.
    Node(NodeId),
    /// A plain copy of `bytes` bytes (an output that is an input, a constant
    /// or shared with another output).
    Copy {
        /// Name for diagnostics (`output:<name>`).
        name: String,
        /// Source.
        src: Loc,
        /// Destination (arena).
        dst: Loc,
        /// Length in bytes.
        bytes: u64,
    },
}

impl Job {
    /// The kernel's name (node name, or `output:<name>` for copies).
    pub(crate) fn name(&self, graph: &Graph) -> String {
        match self {
            Job::Node(id) => graph.node(*id).name.clone(),
            Job::Copy { name, .. } => name.clone(),
        }
    }
}

/// The weights blob under construction: 64-byte aligned entries, identical
/// entries stored once.
#[derive(Default)]
pub(crate) struct Weights {
    bytes: Vec<u8>,
    index: HashMap<u64, Vec<(u64, usize)>>,
}

impl Weights {
    /// Appends `data` (or finds an identical earlier entry) and returns its
    /// offset.
    pub(crate) fn add(&mut self, data: &[u8]) -> u64 {
        let mut h = DefaultHasher::new();
        data.hash(&mut h);
        let key = h.finish();
        if let Some(entries) = self.index.get(&key) {
            for &(off, len) in entries {
                if len == data.len() && &self.bytes[off as usize..off as usize + len] == data {
                    return off;
                }
            }
        }
        let off = align(self.bytes.len() as u64);
        self.bytes.resize(off as usize, 0);
        self.bytes.extend_from_slice(data);
        self.index.entry(key).or_default().push((off, data.len()));
        off
    }

    /// The finished blob.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// The memory plan of a graph.
pub(crate) struct Plan {
    /// Location of every node's value.
    pub locs: HashMap<NodeId, Loc>,
    /// The weights blob.
    pub weights: Weights,
    /// Arena size in bytes.
    pub arena_size: u64,
    /// Graph inputs, in order.
    pub inputs: Vec<TensorSpec>,
    /// Graph outputs, in order.
    pub outputs: Vec<TensorSpec>,
    /// Kernels, in execution order.
    pub jobs: Vec<Job>,
}

pub(crate) fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// The artifact's dtype for an IR dtype.
pub(crate) fn format_dtype(d: kiln_ir::DType) -> FDType {
    use kiln_ir::DType as D;
    match d {
        D::F32 => FDType::F32,
        D::F16 => FDType::F16,
        D::BF16 => FDType::BF16,
        D::F64 => FDType::F64,
        D::I8 => FDType::I8,
        D::U8 => FDType::U8,
        D::I16 => FDType::I16,
        D::I32 => FDType::I32,
        D::I64 => FDType::I64,
        D::Bool => FDType::Bool,
    }
}

/// Plans memory for `graph`, whose nodes are given in topological `order`.
pub(crate) fn plan(graph: &Graph, order: &[NodeId]) -> Result<Plan, CpuError> {
    let is_output = |id: NodeId| graph.outputs().iter().any(|(_, o)| *o == id);
    let mut arena = 0u64;
    let mut alloc = |bytes: u64| {
        let off = align(arena);
        arena = off + bytes;
        Loc {
            base: Base::Arena,
            offset: off,
        }
    };
    let mut weights = Weights::default();
    let mut locs = HashMap::new();
    let mut jobs = Vec::new();
    for &id in order {
        let node = graph.node(id);
        let bytes = node.ty.size_bytes() as u64;
        let loc = match &node.op {
            Op::Input { .. } => alloc(bytes),
            Op::Constant(t) => Loc {
                base: Base::Weights,
                offset: weights.add(&t.data().to_le_bytes()),
            },
            Op::Reshape { .. } => {
                let input = graph.inputs_of(id)[0];
                if !is_output(id) && !is_output(input) {
                    locs[&input]
                } else {
                    jobs.push(Job::Node(id));
                    alloc(bytes)
                }
            }
            _ => {
                jobs.push(Job::Node(id));
                alloc(bytes)
            }
        };
        locs.insert(id, loc);
    }
    let spec = |name: &str, id: NodeId, loc: Loc| {
        let ty = &graph.node(id).ty;
        TensorSpec {
            name: name.to_owned(),
            dtype: format_dtype(ty.dtype),
            shape: ty.shape.iter().map(|&d| d as u64).collect(),
            arena_offset: loc.offset,
        }
    };
    let inputs = graph
        .inputs()
        .iter()
        .map(|&id| spec(&graph.node(id).name, id, locs[&id]))
        .collect();
    let mut outputs = Vec::new();
    let mut seen: Vec<NodeId> = Vec::new();
    for (name, id) in graph.outputs() {
        let node = graph.node(*id);
        let src = locs[id];
        let needs_copy = matches!(node.op, Op::Input { .. } | Op::Constant(_))
            || seen.contains(id)
            || src.base != Base::Arena;
        seen.push(*id);
        let loc = if needs_copy {
            let bytes = node.ty.size_bytes() as u64;
            let dst = alloc(bytes);
            jobs.push(Job::Copy {
                name: format!("output:{name}"),
                src,
                dst,
                bytes,
            });
            dst
        } else {
            src
        };
        outputs.push(spec(name, *id, loc));
    }
    let arena_size = align(arena).max(ALIGN);
    Ok(Plan {
        locs,
        weights,
        arena_size,
        inputs,
        outputs,
        jobs,
    })
}
