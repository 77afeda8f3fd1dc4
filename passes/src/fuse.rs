//! `fuse`: producer–consumer fusion into [`Op::Fused`] kernels.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::{
    DType, DenseHead, DenseOp, ElementwiseProgram, FusedKernel, FusedStore, Graph, Instr, IrError,
    NodeId, Op, Reg,
};
use std::collections::HashSet;

/// Merges chains of f32 elementwise nodes, optionally headed by a MatMul,
/// Gemm or Conv, into one [`Op::Fused`] node each, so a target computes
/// the chain in one kernel without writing the intermediate tensors:
///
/// - a chain starts at a dense op (MatMul, Gemm, Conv; f32 result, its
///   operands f32 or the bf16/f16 ones of a reduced-precision layer) or
///   at an elementwise op (Unary, Binary), all f32, or at an integer product
///   (`matmul_integer`, `conv_integer`) whose only user is a cast to f32
///   (the head then includes the cast: int8 layers rescale in the store
///   loop);
/// - it grows through f32 Unary or Binary users of its members whose
///   output has the root's shape (operands from outside become extra
///   kernel inputs; they broadcast to the output, never enlarge it), and
///   keeps the longest prefix in which every value but the last is used
///   only inside the chain and is not a graph output (see [`grow`]), so a
///   value used twice inside (hard-swish, GELU) fuses;
/// - a chain whose result's only user is a cast to u8 takes the cast in
///   (the kernel stores [`FusedStore::U8`]): every int8 activation
///   quantization ends in one, so the producer writes bytes, not the f32
///   values a separate cast would re-read;
/// - a dense chain needs at least one elementwise step, an elementwise
///   chain at least two nodes.
///
/// An extra operand never depends on the root, so the rewrite cannot
/// create a cycle. The fused node's name joins the members' names with
/// `+`.
#[derive(Clone, Copy, Debug)]
pub struct Fuse {
    dense_heads: bool,
}

impl Default for Fuse {
    /// Every rule, dense heads included.
    fn default() -> Fuse {
        Fuse { dense_heads: true }
    }
}

impl Fuse {
    /// Only elementwise chains, never a dense head (for targets that lower
    /// headless fused kernels only: CUDA).
    pub fn elementwise_only() -> Fuse {
        Fuse { dense_heads: false }
    }
}

fn fail(source: IrError) -> PassError {
    PassError::Failed {
        pass: "fuse",
        source,
    }
}

fn is_f32_elementwise(graph: &Graph, id: NodeId) -> bool {
    let node = graph.node(id);
    matches!(node.op, Op::Unary(_) | Op::Binary(_))
        && node.ty.dtype == DType::F32
        && graph
            .inputs_of(id)
            .iter()
            .all(|&i| graph.node(i).ty.dtype == DType::F32)
}

/// A chain being built: the members, the kernel inputs and the program.
struct Chain {
    members: Vec<NodeId>,
    /// Kernel inputs (head inputs first).
    inputs: Vec<NodeId>,
    head: Option<DenseHead>,
    /// The node whose value is the head's result (program register 0): the
    /// head itself, or the cast to f32 after an integer head.
    head_value: Option<NodeId>,
    /// Program inputs: `None` for the head's result, else a kernel input.
    program_inputs: Vec<Option<NodeId>>,
    instrs: Vec<(Instr, NodeId)>,
    /// What the kernel stores: u8 when the chain ends in a cast to u8.
    store: FusedStore,
}

impl Chain {
    /// The register holding value `id` of the chain (a member's result or a
    /// program input), adding `id` as a new program input when it is
    /// neither.
    fn reg(&mut self, id: NodeId) -> Reg {
        if self.head_value == Some(id) {
            return Reg(0);
        }
        let n_in = self.program_inputs.len();
        if let Some(j) = self.instrs.iter().position(|(_, m)| *m == id) {
            return Reg((n_in + j) as u32);
        }
        if let Some(i) = self.program_inputs.iter().position(|p| *p == Some(id)) {
            return Reg(i as u32);
        }
        // New program inputs go before the instructions: shift their
        // registers.
        for (ins, _) in &mut self.instrs {
            let bump = |r: &mut Reg| {
                if r.index() >= n_in {
                    r.0 += 1;
                }
            };
            match ins {
                Instr::Unary(_, a) => bump(a),
                Instr::Binary(_, a, b) => {
                    bump(a);
                    bump(b);
                }
            }
        }
        self.program_inputs.push(Some(id));
        self.inputs.push(id);
        Reg(n_in as u32)
    }

    /// Appends elementwise node `id` (a Unary or Binary) as an instruction.
    fn push(&mut self, graph: &Graph, id: NodeId) {
        let args = graph.inputs_of(id);
        // Adding an input renumbers the instructions: add them all first.
        for &a in &args {
            self.reg(a);
        }
        let regs: Vec<Reg> = args.iter().map(|&a| self.reg(a)).collect();
        let instr = match graph.node(id).op {
            Op::Unary(u) => Instr::Unary(u, regs[0]),
            Op::Binary(b) => Instr::Binary(b, regs[0], regs[1]),
            _ => unreachable!("checked by is_f32_elementwise"),
        };
        self.instrs.push((instr, id));
        self.members.push(id);
    }
}

/// Most members of one chain (bounds the work of growing it).
const MAX_MEMBERS: usize = 64;

/// The members of the chain rooted at `root`, root first, in an order
/// where every member's inputs come before it: grown one f32 elementwise
/// user of a member at a time (of the root's shape, not taken, reading
/// only members and values that do not depend on the root), then cut back
/// to the longest prefix whose values, but the last, are used only by
/// members and are not graph outputs. So a value used twice inside the
/// chain (hard-swish's `x * relu6(x + 3)`, GELU's `x * erf(x / √2)`)
/// does not stop it, and no value escapes the kernel but its result.
fn grow(graph: &Graph, root: NodeId, taken: &HashSet<NodeId>) -> Vec<NodeId> {
    let shape = &graph.node(root).ty.shape;
    let mut members = vec![root];
    let mut inside: HashSet<NodeId> = HashSet::from([root]);
    let mut best = 1;
    // Everything that depends on the root, computed when first needed.
    let mut downstream: Option<HashSet<NodeId>> = None;
    while members.len() < MAX_MEMBERS && !graph.is_output(*members.last().expect("a root")) {
        let mut next = None;
        'search: for &m in &members {
            for (user, _) in graph.users_of(m) {
                if inside.contains(&user)
                    || taken.contains(&user)
                    || !is_f32_elementwise(graph, user)
                    || graph.node(user).ty.shape != *shape
                {
                    continue;
                }
                let deps = downstream.get_or_insert_with(|| descendants(graph, root));
                let ready = graph
                    .inputs_of(user)
                    .iter()
                    .all(|i| inside.contains(i) || !deps.contains(i));
                if ready {
                    next = Some(user);
                    break 'search;
                }
            }
        }
        let Some(user) = next else {
            break;
        };
        members.push(user);
        inside.insert(user);
        let closed = members[..members.len() - 1].iter().all(|&m| {
            !graph.is_output(m) && graph.users_of(m).iter().all(|(u, _)| inside.contains(u))
        });
        if closed {
            best = members.len();
        }
    }
    members.truncate(best);
    members
}

/// The nodes that depend on `root` (its users, theirs, and so on).
fn descendants(graph: &Graph, root: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(n) = stack.pop() {
        for (u, _) in graph.users_of(n) {
            if seen.insert(u) {
                stack.push(u);
            }
        }
    }
    seen
}

/// The cast to f32 that is the only user of integer product `root` (not a
/// graph output), if there is one.
fn integer_head_cast(graph: &Graph, root: NodeId) -> Option<NodeId> {
    match graph.users_of(root).as_slice() {
        [(cast, _)]
            if !graph.is_output(root) && graph.node(*cast).op == (Op::Cast { to: DType::F32 }) =>
        {
            Some(*cast)
        }
        _ => None,
    }
}

/// The chain rooted at `root`, grown as far as the rules allow.
fn build_chain(
    graph: &Graph,
    root: NodeId,
    taken: &HashSet<NodeId>,
    dense_heads: bool,
) -> Option<Chain> {
    let node = graph.node(root);
    let mut chain = Chain {
        members: vec![],
        inputs: vec![],
        head: None,
        head_value: None,
        program_inputs: vec![],
        instrs: vec![],
        store: FusedStore::F32,
    };
    let integer = DenseOp::from_op(&node.op).filter(|op| dense_heads && op.is_integer());
    if let Some(op) = integer {
        let cast = integer_head_cast(graph, root)?;
        chain.head = Some(DenseHead {
            op,
            inputs: graph.inputs_of(root).len(),
        });
        chain.inputs = graph.inputs_of(root);
        chain.members.extend([root, cast]);
        chain.head_value = Some(cast);
        chain.program_inputs.push(None);
        for &m in &grow(graph, cast, taken)[1..] {
            chain.push(graph, m);
        }
        if chain.instrs.is_empty() {
            return None;
        }
        narrow_store(graph, &mut chain);
        return Some(chain);
    }
    if node.ty.dtype != DType::F32 {
        return None;
    }
    if let Some(op) = DenseOp::from_op(&node.op).filter(|_| dense_heads) {
        let inputs = graph.inputs_of(root);
        // f32 operands, or the bf16/f16 ones of a reduced-precision layer
        // (the kernel reads them as they are stored).
        let float = |d: DType| matches!(d, DType::F32 | DType::BF16 | DType::F16);
        if inputs.iter().any(|&i| !float(graph.node(i).ty.dtype)) {
            return None;
        }
        chain.head = Some(DenseHead {
            op,
            inputs: inputs.len(),
        });
        chain.inputs = inputs;
        chain.members.push(root);
        chain.head_value = Some(root);
        chain.program_inputs.push(None);
    } else if is_f32_elementwise(graph, root) {
        chain.push(graph, root);
    } else {
        return None;
    }
    for &m in &grow(graph, root, taken)[1..] {
        chain.push(graph, m);
    }
    if chain.instrs.is_empty() {
        return None;
    }
    narrow_store(graph, &mut chain);
    let nodes = chain.instrs.len() + usize::from(chain.store != FusedStore::F32);
    let enough = chain.head.is_some() || nodes >= 2;
    enough.then_some(chain)
}

/// Takes the cast to u8 that is the only user of the chain's result (not
/// a graph output) into the chain.
fn narrow_store(graph: &Graph, chain: &mut Chain) {
    let last = *chain.members.last().expect("a chain has members");
    if graph.is_output(last) {
        return;
    }
    if let [(cast, _)] = graph.users_of(last).as_slice() {
        if graph.node(*cast).op == (Op::Cast { to: DType::U8 }) {
            chain.members.push(*cast);
            chain.store = FusedStore::U8;
        }
    }
}

impl Pass for Fuse {
    fn name(&self) -> &'static str {
        "fuse"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let order = graph.topo_order().map_err(fail)?;
        let mut taken: HashSet<NodeId> = HashSet::new();
        for root in order {
            if taken.contains(&root) || !graph.contains(root) {
                continue;
            }
            let Some(chain) = build_chain(graph, root, &taken, self.dense_heads) else {
                continue;
            };
            let instrs: Vec<Instr> = chain.instrs.iter().map(|(i, _)| *i).collect();
            let program =
                ElementwiseProgram::new(chain.program_inputs.len(), instrs).map_err(fail)?;
            let kernel = FusedKernel::new(chain.head.clone(), program)
                .map_err(fail)?
                .with_store(chain.store);
            let names: Vec<&str> = chain
                .members
                .iter()
                .map(|&m| graph.node(m).name.as_str())
                .filter(|n| !n.is_empty())
                .collect();
            let name = names.join("+");
            let last = *chain.members.last().expect("a chain has members");
            let fused = graph
                .add_node(Op::Fused(Box::new(kernel)), &chain.inputs, name)
                .map_err(fail)?;
            graph.replace_all_uses(last, fused).map_err(fail)?;
            for &m in chain.members.iter().rev() {
                graph.remove_unused(m);
            }
            taken.extend(chain.members.iter().copied());
            taken.insert(fused);
            stats.removed += chain.members.len();
            stats.added += 1;
            stats.fused_nodes += chain.members.len();
            stats.fused_kernels += 1;
        }
        Ok(stats)
    }
}
