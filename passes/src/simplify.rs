//! `simplify`: algebraic identities, reshape/transpose chain collapse, no-op
//! casts, common subexpression elimination, and removal of what that leaves
//! dead.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::{BinaryOp, Graph, Ints, IrError, NodeId, Op, Tensor};
use std::collections::HashMap;

/// Local rewrites that never change a value:
///
/// - `x*1`, `1*x`, `x+0`, `0+x`, `x-0`, `x/1`, `x^1` with a constant
///   all-ones or all-zeros operand, when broadcasting leaves `x`'s type
///   unchanged; a float `x^2` becomes `x*x` (the same single rounding);
/// - `reshape(reshape(x))` → one `reshape`; a `reshape` to its input's shape
///   is removed;
/// - `transpose(transpose(x))` → one `transpose` with the composed
///   permutation; an identity permutation is removed;
/// - a `cast` to the input's own type is removed;
/// - common subexpressions: nodes with the same op, attributes and inputs
///   become one; constants of at most `max_cse_const_bytes` bytes with the
///   same type and bit-identical elements become one;
/// - nodes these rewrites leave unused are removed (only those: dead code the
///   pass did not make stays for `dce`).
///
/// The sweep repeats until nothing changes (at most `max_sweeps` times).
pub struct Simplify {
    /// Largest constant deduplicated by value, in bytes.
    pub max_cse_const_bytes: usize,
    /// Upper bound on sweeps over the graph.
    pub max_sweeps: usize,
}

impl Default for Simplify {
    fn default() -> Self {
        Simplify {
            max_cse_const_bytes: 64 << 10,
            max_sweeps: 8,
        }
    }
}

fn fail(source: IrError) -> PassError {
    PassError::Failed {
        pass: "simplify",
        source,
    }
}

/// Whether `t` is a constant whose every element equals `v`.
fn is_splat(t: &Tensor, v: f64) -> bool {
    !t.is_empty() && t.to_f64_vec().iter().all(|&x| x == v)
}

/// What to do with one node.
enum Rewrite {
    /// Every use of the node becomes a use of this existing node.
    Forward(NodeId),
    /// Build `op(inputs)` and forward the node to it.
    Replace(Op, Vec<NodeId>),
}

impl Simplify {
    /// The identity or chain rewrite that applies to `id`, if any.
    fn rewrite(&self, graph: &Graph, id: NodeId) -> Option<Rewrite> {
        let node = graph.node(id);
        let inputs = graph.inputs_of(id);
        match &node.op {
            Op::Binary(b) => {
                let (x, y) = (inputs[0], inputs[1]);
                let same_as = |v: NodeId| graph.node(v).ty == node.ty;
                let splat = |v: NodeId, s: f64| graph.constant(v).is_some_and(|t| is_splat(t, s));
                let keep_lhs = match b {
                    BinaryOp::Mul => splat(y, 1.0),
                    BinaryOp::Add | BinaryOp::Sub => splat(y, 0.0),
                    BinaryOp::Div => splat(y, 1.0),
                    _ => false,
                };
                if keep_lhs && same_as(x) {
                    return Some(Rewrite::Forward(x));
                }
                let keep_rhs = match b {
                    BinaryOp::Mul => splat(x, 1.0),
                    BinaryOp::Add => splat(x, 0.0),
                    _ => false,
                };
                if keep_rhs && same_as(y) {
                    return Some(Rewrite::Forward(y));
                }
                // `x ^ 2` is `x * x`, rounded once either way; a pow costs
                // a libm call per element (ConvNeXt's LayerNorm written
                // out: 2.6 ms per `pow` on 96×56×56, one thread).
                let float = graph.node(x).ty.dtype.is_float();
                if *b == BinaryOp::Pow && float && same_as(x) {
                    if splat(y, 1.0) {
                        return Some(Rewrite::Forward(x));
                    }
                    if splat(y, 2.0) {
                        return Some(Rewrite::Replace(Op::Binary(BinaryOp::Mul), vec![x, x]));
                    }
                }
                None
            }
            Op::Reshape { shape } => {
                let x = inputs[0];
                if graph.node(x).ty == node.ty {
                    return Some(Rewrite::Forward(x));
                }
                if let Op::Reshape { .. } = graph.node(x).op {
                    let inner = graph.inputs_of(x)[0];
                    return Some(Rewrite::Replace(
                        Op::Reshape {
                            shape: shape.clone(),
                        },
                        vec![inner],
                    ));
                }
                None
            }
            Op::Transpose { perm } => {
                if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    return Some(Rewrite::Forward(inputs[0]));
                }
                if let Op::Transpose { perm: inner_perm } = &graph.node(inputs[0]).op {
                    // Output axis i = inner axis perm[i] = x axis inner_perm[perm[i]].
                    let composed: Ints = perm.iter().map(|&p| inner_perm[p]).collect();
                    let x = graph.inputs_of(inputs[0])[0];
                    if composed.iter().enumerate().all(|(i, &p)| i == p) {
                        return Some(Rewrite::Forward(x));
                    }
                    return Some(Rewrite::Replace(Op::Transpose { perm: composed }, vec![x]));
                }
                None
            }
            Op::Cast { to } if graph.node(inputs[0]).ty.dtype == *to => {
                Some(Rewrite::Forward(inputs[0]))
            }
            _ => None,
        }
    }

    /// One sweep in topological order. Returns whether anything changed.
    fn sweep(&self, graph: &mut Graph, stats: &mut PassStats) -> Result<bool, PassError> {
        let mut changed = false;
        // CSE tables: computing nodes by (op name, inputs), constants by
        // (type, bytes). Buckets are compared with `Op`'s `PartialEq`.
        let mut nodes: HashMap<(&'static str, Vec<NodeId>), Vec<NodeId>> = HashMap::new();
        let mut consts: HashMap<(String, Vec<u8>), NodeId> = HashMap::new();
        let mut dead: Vec<NodeId> = Vec::new();
        for id in graph.topo_order().map_err(fail)? {
            if !graph.contains(id) {
                continue;
            }
            let node = graph.node(id);
            match &node.op {
                Op::Input { .. } => continue,
                Op::Constant(t) => {
                    if t.size_bytes() > self.max_cse_const_bytes {
                        continue;
                    }
                    let key = (node.ty.to_string(), t.data().to_le_bytes());
                    match consts.get(&key) {
                        Some(&first) => {
                            graph.replace_all_uses(id, first).map_err(fail)?;
                            dead.push(id);
                            stats.rewritten += 1;
                            changed = true;
                        }
                        None => {
                            consts.insert(key, id);
                        }
                    }
                    continue;
                }
                _ => {}
            }
            let target = match self.rewrite(graph, id) {
                Some(Rewrite::Forward(to)) => Some(to),
                Some(Rewrite::Replace(op, inputs)) => {
                    let name = graph.node(id).name.clone();
                    let new = graph.add_node(op, &inputs, name).map_err(fail)?;
                    stats.added += 1;
                    Some(new)
                }
                None => None,
            };
            if let Some(to) = target {
                graph.replace_all_uses(id, to).map_err(fail)?;
                dead.push(id);
                stats.rewritten += 1;
                changed = true;
                continue;
            }
            // Common subexpression elimination.
            let node = graph.node(id);
            let key = (node.op.name(), graph.inputs_of(id));
            let bucket = nodes.entry(key).or_default();
            match bucket
                .iter()
                .copied()
                .find(|&other| graph.node(other).op == node.op)
            {
                Some(first) => {
                    graph.replace_all_uses(id, first).map_err(fail)?;
                    dead.push(id);
                    stats.rewritten += 1;
                    changed = true;
                }
                None => bucket.push(id),
            }
        }
        stats.removed += remove_dead(graph, dead);
        Ok(changed)
    }
}

/// Removes the given nodes if unused, then whatever their removal leaves
/// unused, transitively. Returns how many nodes were removed.
pub(crate) fn remove_dead(graph: &mut Graph, mut work: Vec<NodeId>) -> usize {
    let mut removed = 0;
    while let Some(id) = work.pop() {
        if !graph.contains(id) {
            continue;
        }
        let inputs = graph.inputs_of(id);
        if graph.remove_unused(id) {
            removed += 1;
            work.extend(inputs);
        }
    }
    removed
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for _ in 0..self.max_sweeps.max(1) {
            if !self.sweep(graph, &mut stats)? {
                break;
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> String {
        let mut g = kiln_ir::text::parse(text).unwrap();
        Simplify::default().run(&mut g).unwrap();
        kiln_ir::verify::verify(&g).unwrap();
        kiln_ir::text::print(&g)
    }

    #[test]
    fn broadcasting_identity_is_kept() {
        // x*1 where the ones broadcast x to a larger shape is not a no-op.
        let out = run("graph(%x: f32[3]) {
              %one: f32[2,3] = const dense<[1.0, 1.0, 1.0, 1.0, 1.0, 1.0]>
              %y: f32[2,3] = mul(%x, %one)
              return %y
            }");
        assert!(out.contains("mul("), "{out}");
    }

    #[test]
    fn squares_are_products_and_first_powers_vanish() {
        let out = run("graph(%x: f32[3]) {
              %two: f32[] = const dense<[2.0]>
              %one: f32[1] = const dense<[1.0]>
              %a: f32[3] = pow(%x, %two)
              %b: f32[3] = pow(%a, %one)
              return %b
            }");
        assert!(out.contains("mul(%0, %0)"), "{out}");
        assert!(!out.contains("pow("), "{out}");
        // A square that broadcasts x to a larger shape stays a pow.
        let out = run("graph(%x: f32[3]) {
              %two: f32[2,3] = const dense<[2.0, 2.0, 2.0, 2.0, 2.0, 2.0]>
              %y: f32[2,3] = pow(%x, %two)
              return %y
            }");
        assert!(out.contains("pow("), "{out}");
    }

    #[test]
    fn sub_from_zero_is_kept() {
        let out = run("graph(%x: f32[3]) {
              %z: f32[] = const dense<[0.0]>
              %y: f32[3] = sub(%z, %x)
              return %y
            }");
        assert!(out.contains("sub("), "{out}");
    }
}
