//! `fuse`: producer–consumer fusion into [`Op::Fused`] kernels.

use crate::{Pass, PassError, PassStats};
use kiln_ir::{
    DType, DenseHead, DenseOp, ElementwiseProgram, FusedKernel, Graph, Instr, IrError, NodeId, Op,
    Reg,
};
use std::collections::HashSet;

/// Merges chains of f32 elementwise nodes, optionally headed by a MatMul,
/// Gemm or Conv, into one [`Op::Fused`] node each, so a target computes
/// the chain in one kernel without writing the intermediate tensors:
///
/// - a chain starts at a dense op (MatMul, Gemm, Conv) or at an
///   elementwise op (Unary, Binary), all f32;
/// - it grows through the single consumer of its last value while that
///   value is not a graph output and the consumer is an f32 Unary or Binary
///   whose output has the same shape (the other operand of a Binary becomes
///   an extra kernel input; it broadcasts to the output, never enlarges it);
/// - a dense chain needs at least one elementwise step, an elementwise
///   chain at least two nodes.
///
/// Every member but the last has exactly one user, the next member, so an
/// extra operand can never depend on a member: the rewrite cannot create a
/// cycle. The fused node's name joins the members' names with `+`.
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
    /// Program inputs: `None` for the head's result, else a kernel input.
    program_inputs: Vec<Option<NodeId>>,
    instrs: Vec<(Instr, NodeId)>,
}

impl Chain {
    /// The register holding value `id` of the chain (a member's result or a
    /// program input), adding `id` as a new program input when it is
    /// neither.
    fn reg(&mut self, id: NodeId) -> Reg {
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

/// The chain rooted at `root`, grown as far as the rules allow.
fn build_chain(
    graph: &Graph,
    root: NodeId,
    taken: &HashSet<NodeId>,
    dense_heads: bool,
) -> Option<Chain> {
    let node = graph.node(root);
    if node.ty.dtype != DType::F32 {
        return None;
    }
    let mut chain = Chain {
        members: vec![],
        inputs: vec![],
        head: None,
        program_inputs: vec![],
        instrs: vec![],
    };
    if let Some(op) = DenseOp::from_op(&node.op).filter(|_| dense_heads) {
        let inputs = graph.inputs_of(root);
        if inputs.iter().any(|&i| graph.node(i).ty.dtype != DType::F32) {
            return None;
        }
        chain.head = Some(DenseHead {
            op,
            inputs: inputs.len(),
        });
        chain.inputs = inputs;
        chain.members.push(root);
        chain.program_inputs.push(None);
    } else if is_f32_elementwise(graph, root) {
        chain.push(graph, root);
    } else {
        return None;
    }
    let mut last = root;
    loop {
        let users = graph.users_of(last);
        if users.is_empty() || graph.outputs().iter().any(|(_, o)| *o == last) {
            break;
        }
        let user = users[0].0;
        // One consumer node (possibly reading the value in both slots).
        if users.iter().any(|(u, _)| *u != user) || taken.contains(&user) {
            break;
        }
        if !is_f32_elementwise(graph, user) || graph.node(user).ty.shape != node.ty.shape {
            break;
        }
        if chain.head.is_some() && chain.instrs.is_empty() {
            // The head's result is register 0, referenced by the consumer.
            let args = graph.inputs_of(user);
            for &a in args.iter().filter(|&&a| a != root) {
                chain.reg(a);
            }
            let regs: Vec<Reg> = args
                .iter()
                .map(|&a| if a == root { Reg(0) } else { chain.reg(a) })
                .collect();
            let instr = match graph.node(user).op {
                Op::Unary(u) => Instr::Unary(u, regs[0]),
                Op::Binary(b) => Instr::Binary(b, regs[0], regs[1]),
                _ => unreachable!("checked by is_f32_elementwise"),
            };
            chain.instrs.push((instr, user));
            chain.members.push(user);
        } else {
            chain.push(graph, user);
        }
        last = user;
    }
    let enough = if chain.head.is_some() {
        !chain.instrs.is_empty()
    } else {
        chain.instrs.len() >= 2
    };
    enough.then_some(chain)
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
            let kernel = FusedKernel::new(chain.head.clone(), program).map_err(fail)?;
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
