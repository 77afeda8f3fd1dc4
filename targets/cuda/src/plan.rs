//! Device memory plan: one arena for every non-constant value, one weights
//! blob for the constants, and the schedule of kernels.
//!
//! The arena opens with a 64-byte status block (word 0 is set to 1 by a
//! Gather that meets an out-of-range index; the runtime clears it before a
//! run and reads it after). Values follow, placed by liveness over the
//! schedule and packed with [`kiln_ir::arena::pack`], the packer the CPU
//! target uses. A Reshape aliases its input's buffer unless one of the two
//! is a graph output; graph outputs that are inputs, constants or repeats
//! of another output get a copy kernel.
//!
//! **Epilogue fusion.** A chain of f32 unary ops (Relu, Clip, Sigmoid, ...)
//! whose every link is the single user of the one before, and not a graph
//! output, is folded into the kernel that produces the chain's input: that
//! kernel applies the ops before its stores, the chain's nodes get no
//! kernel and share the producer's buffer (Conv → Relu, Add → Clip).

use std::collections::HashMap;

use kiln_ir::arena::{self, Interval};
use kiln_ir::{Graph, NodeId, Op};

use crate::CudaError;

/// Bytes reserved at the start of the arena for the status word.
pub const STATUS_BYTES: u64 = arena::ALIGN;

/// Which base pointer an address is relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Base {
    Arena,
    Weights,
}

/// A tensor's place: a byte offset from a base pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub base: Base,
    pub offset: u64,
}

/// One kernel launch of the schedule.
#[derive(Clone, Debug)]
pub(crate) enum Job {
    /// The kernel computing a node.
    Node(NodeId),
    /// A copy of graph output `name` from `src`'s value into `dst`.
    Copy { name: String, src: NodeId, dst: Loc },
}

/// The plan.
pub(crate) struct Plan {
    pub locs: HashMap<NodeId, Loc>,
    pub weights: Vec<u8>,
    pub arena_size: u64,
    pub jobs: Vec<Job>,
    /// Arena offset of every graph output, in order.
    pub output_offsets: Vec<u64>,
    /// Producer → the unary nodes fused into its kernel, in order.
    pub epilogues: HashMap<NodeId, Vec<NodeId>>,
}

impl Plan {
    /// The unary ops fused into `id`'s kernel.
    pub(crate) fn epilogue_ops(&self, graph: &Graph, id: NodeId) -> Vec<kiln_ir::UnaryOp> {
        self.epilogues
            .get(&id)
            .map(|chain| {
                chain
                    .iter()
                    .filter_map(|&u| match graph.node(u).op {
                        Op::Unary(op) => Some(op),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `id`'s name, joined with the names of the nodes fused into it
    /// (`conv1+relu1`).
    pub(crate) fn fused_names(&self, graph: &Graph, id: NodeId) -> String {
        let mut name = graph.node(id).name.clone();
        for &u in self.epilogues.get(&id).into_iter().flatten() {
            name.push('+');
            name.push_str(&graph.node(u).name);
        }
        name
    }
}

/// The unary chains to fuse: producer → chain. See the module docs.
fn epilogue_chains(graph: &Graph, order: &[NodeId]) -> HashMap<NodeId, Vec<NodeId>> {
    let f32_unary = |id: NodeId| {
        matches!(graph.node(id).op, Op::Unary(_)) && graph.node(id).ty.dtype == kiln_ir::DType::F32
    };
    let mut chains = HashMap::new();
    let mut absorbed = std::collections::HashSet::new();
    for &p in order {
        let node = graph.node(p);
        if absorbed.contains(&p)
            || node.ty.dtype != kiln_ir::DType::F32
            || matches!(
                node.op,
                Op::Input { .. } | Op::Constant(_) | Op::Reshape { .. }
            )
        {
            continue;
        }
        let mut chain = Vec::new();
        let mut cur = p;
        loop {
            let users = graph.users_of(cur);
            match users.as_slice() {
                [(u, _)] if !graph.is_output(cur) && f32_unary(*u) => {
                    chain.push(*u);
                    absorbed.insert(*u);
                    cur = *u;
                }
                _ => break,
            }
        }
        if !chain.is_empty() {
            chains.insert(p, chain);
        }
    }
    chains
}

struct Val {
    bytes: u64,
    def: u32,
    last: u32,
}

/// Plans memory for `graph` given its topological `order`.
pub(crate) fn plan(graph: &Graph, order: &[NodeId]) -> Result<Plan, CudaError> {
    let epilogues = epilogue_chains(graph, order);
    let fused_into: HashMap<NodeId, NodeId> = epilogues
        .iter()
        .flat_map(|(&p, chain)| chain.iter().map(move |&u| (u, p)))
        .collect();
    let mut weights: Vec<u8> = Vec::new();
    let mut locs = HashMap::new();
    let mut vals: Vec<Val> = Vec::new();
    let mut val_of: HashMap<NodeId, usize> = HashMap::new();
    let mut jobs: Vec<(Job, Option<usize>)> = Vec::new();
    let steps = |n: usize| {
        u32::try_from(n).map_err(|_| CudaError::TooLarge {
            node: String::new(),
            message: "the schedule has more than 2^32 kernels".into(),
        })
    };
    for &id in order {
        let node = graph.node(id);
        let bytes = node.ty.size_bytes() as u64;
        if let Some(p) = fused_into.get(&id) {
            // Computed by the producer's kernel, in the producer's buffer.
            let v = val_of[p];
            val_of.insert(id, v);
            continue;
        }
        match &node.op {
            Op::Input { .. } => {
                vals.push(Val {
                    bytes,
                    def: 0,
                    last: 0,
                });
                val_of.insert(id, vals.len() - 1);
            }
            Op::Constant(t) => {
                let off = arena::align(weights.len() as u64);
                weights.resize(off as usize, 0);
                weights.extend_from_slice(&t.data().to_le_bytes());
                locs.insert(
                    id,
                    Loc {
                        base: Base::Weights,
                        offset: off,
                    },
                );
            }
            Op::Reshape { .. }
                if !graph.is_output(id) && !graph.is_output(graph.inputs_of(id)[0]) =>
            {
                let input = graph.inputs_of(id)[0];
                match val_of.get(&input) {
                    Some(&v) => {
                        val_of.insert(id, v);
                    }
                    None => {
                        let loc = locs[&input];
                        locs.insert(id, loc);
                    }
                }
            }
            _ => {
                let step = steps(jobs.len() + 1)?;
                vals.push(Val {
                    bytes,
                    def: step,
                    last: step,
                });
                val_of.insert(id, vals.len() - 1);
                jobs.push((Job::Node(id), None));
            }
        }
    }
    let mut out_vals = Vec::new();
    let mut seen: Vec<NodeId> = Vec::new();
    for (name, id) in graph.outputs() {
        let needs_copy = matches!(graph.node(*id).op, Op::Input { .. })
            || seen.contains(id)
            || !val_of.contains_key(id);
        seen.push(*id);
        if needs_copy {
            let step = steps(jobs.len() + 1)?;
            vals.push(Val {
                bytes: graph.node(*id).ty.size_bytes() as u64,
                def: step,
                last: step,
            });
            let v = vals.len() - 1;
            jobs.push((
                Job::Copy {
                    name: name.clone(),
                    src: *id,
                    dst: Loc {
                        base: Base::Arena,
                        offset: 0,
                    },
                },
                Some(v),
            ));
            out_vals.push(v);
        } else {
            out_vals.push(val_of[id]);
        }
    }
    let end = steps(jobs.len() + 1)?;
    for (k, (job, _)) in jobs.iter().enumerate() {
        let reads = match job {
            Job::Node(id) => graph.inputs_of(*id),
            Job::Copy { src, .. } => vec![*src],
        };
        for r in reads {
            if let Some(&v) = val_of.get(&r) {
                vals[v].last = vals[v].last.max(k as u32 + 1);
            }
        }
    }
    for &v in &out_vals {
        vals[v].last = end;
    }
    let intervals: Vec<Interval> = vals
        .iter()
        .map(|v| Interval {
            bytes: v.bytes,
            start: v.def,
            end: v.last,
        })
        .collect();
    let (offsets, size) = arena::pack(&intervals);
    let at = |v: usize| Loc {
        base: Base::Arena,
        offset: STATUS_BYTES + offsets[v],
    };
    for (&id, &v) in &val_of {
        locs.insert(id, at(v));
    }
    let jobs = jobs
        .into_iter()
        .map(|(job, v)| match (job, v) {
            (Job::Copy { name, src, .. }, Some(v)) => Job::Copy {
                name,
                src,
                dst: at(v),
            },
            (job, _) => job,
        })
        .collect();
    Ok(Plan {
        locs,
        weights,
        arena_size: STATUS_BYTES + size,
        jobs,
        output_offsets: out_vals.iter().map(|&v| at(v).offset).collect(),
        epilogues,
    })
}
