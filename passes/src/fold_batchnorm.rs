//! `fold-batchnorm`: per-channel scale and shift by constants (the form the
//! frontend gives BatchNormalization) folded into a preceding Conv, Gemm or
//! MatMul.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::{BinaryOp, DType, Data, Graph, IrError, NodeId, Op, Tensor};

/// Folds a chain of `mul`/`add`/`sub`/`div` by per-channel constants that
/// follows a linear op into that op's weights and bias:
///
/// - `conv` (output `[N,C,H,W]`, constant weights and bias): constants that
///   broadcast as `[C,1,1]`, `[1,C,1,1]` (or a scalar); the weights of output
///   channel `c` are scaled, the bias (created when absent) is scaled and
///   shifted;
/// - `gemm` with constant B (output `[M,N]`): per-column constants (`[N]`,
///   `[1,N]`, a scalar); the columns of `op(B)` are scaled (rows of B when
///   `trans_b`), C becomes `s*beta*C + t` with `beta = 1` (created when
///   absent);
/// - `matmul` with a constant 2-D B: per-last-dim constants scale B's
///   columns; a shift turns a 2-D matmul into a `gemm` with C, and ends the
///   chain for a batched one.
///
/// `mul` and `add` fold with the constant on either side, `sub` and `div`
/// only with the constant on the right. Every value in the chain except the
/// last must have no other user and not be a graph output (that covers "the
/// conv's output has no other users"), and no step may broadcast to a larger
/// shape. The chain's scale `s` and shift `t` and the folded weights are
/// computed in f64 and rounded to the element type once. Float types only.
pub struct FoldBatchNorm;

fn fail(source: IrError) -> PassError {
    PassError::Failed {
        pass: "fold-batchnorm",
        source,
    }
}

/// Which linear op heads the chain, and how its output's channels are laid
/// out.
#[derive(Clone, Copy, PartialEq)]
enum Head {
    /// Channels on axis 1 of a rank-4 output.
    Conv,
    /// Channels on the last axis.
    Gemm,
    /// Channels on the last axis; a shift only folds when 2-D.
    MatMul { two_d: bool },
}

/// The per-channel values of constant `c` for an output of `shape` whose
/// channels lie on `axis`, or `None` when `c` varies along another axis or
/// would broadcast the output.
fn per_channel(c: &Tensor, shape: &[usize], axis: usize) -> Option<Vec<f64>> {
    let rank = shape.len();
    let cs = c.shape();
    if cs.len() > rank {
        return None;
    }
    let pad = rank - cs.len();
    let n = shape[axis];
    let mut along = 1;
    for (i, &d) in cs.iter().enumerate() {
        let out_axis = pad + i;
        if out_axis == axis {
            if d != n && d != 1 {
                return None;
            }
            along = d;
        } else if d != 1 {
            return None;
        }
    }
    let v = c.to_f64_vec();
    Some(
        (0..n)
            .map(|i| if along == 1 { v[0] } else { v[i] })
            .collect(),
    )
}

/// One scalar update of a chain's scale or shift by a constant element.
type Step = fn(f64, f64) -> f64;

/// A folded chain: `y = head(...) * scale + shift`, ending at `last`.
struct Chain {
    last: NodeId,
    scale: Vec<f64>,
    shift: Vec<f64>,
    scaled: bool,
    shifted: bool,
    /// Nodes of the chain, head excluded (for removal).
    steps: Vec<NodeId>,
}

fn collect_chain(graph: &Graph, head: NodeId, kind: Head, axis: usize) -> Option<Chain> {
    let ty = graph.node(head).ty.clone();
    let n = ty.shape[axis];
    let mut chain = Chain {
        last: head,
        scale: vec![1.0; n],
        shift: vec![0.0; n],
        scaled: false,
        shifted: false,
        steps: vec![],
    };
    loop {
        let cur = chain.last;
        let users = graph.users_of(cur);
        if users.len() != 1 || graph.is_output(cur) {
            break;
        }
        let (user, slot) = users[0];
        let unode = graph.node(user);
        let Op::Binary(b) = unode.op else { break };
        if unode.ty != ty {
            break;
        }
        let inputs = graph.inputs_of(user);
        if inputs[0] == inputs[1] {
            break;
        }
        let other = inputs[1 - slot];
        let Some(c) = graph.constant(other) else {
            break;
        };
        let Some(v) = per_channel(c, &ty.shape, axis) else {
            break;
        };
        let is_shift = matches!(b, BinaryOp::Add | BinaryOp::Sub);
        if is_shift && kind == (Head::MatMul { two_d: false }) {
            break;
        }
        // y*v: scale and shift by v; y/v: by 1/v; y+v, y-v: shift only.
        let (mul, add): (Option<Step>, Option<Step>) = match (b, slot) {
            (BinaryOp::Mul, _) => (Some(|a, c| a * c), None),
            (BinaryOp::Div, 0) => (Some(|a, c| a / c), None),
            (BinaryOp::Add, _) => (None, Some(|a, c| a + c)),
            (BinaryOp::Sub, 0) => (None, Some(|a, c| a - c)),
            _ => break,
        };
        if let Some(f) = mul {
            for ((sc, sh), &c) in chain.scale.iter_mut().zip(&mut chain.shift).zip(&v) {
                *sc = f(*sc, c);
                *sh = f(*sh, c);
            }
            chain.scaled = true;
        }
        if let Some(f) = add {
            for (sh, &c) in chain.shift.iter_mut().zip(&v) {
                *sh = f(*sh, c);
            }
            chain.shifted = true;
        }
        chain.steps.push(user);
        chain.last = user;
    }
    (!chain.steps.is_empty()).then_some(chain)
}

/// The name of a constant derived from node `name` (`conv/folded_bias`).
fn derived(name: &str, what: &str) -> String {
    if name.is_empty() {
        what.to_string()
    } else {
        format!("{name}/{what}")
    }
}

fn tensor(shape: &[usize], dtype: DType, values: Vec<f64>) -> Tensor {
    Tensor::new(shape, Data::from_f64s(dtype, values.into_iter())).expect("element count")
}

/// Index into a tensor of shape `from` broadcast to `to` (numpy rules), for
/// the flat output index `flat`.
fn broadcast_index(from: &[usize], to: &[usize], flat: usize) -> usize {
    let pad = to.len() - from.len();
    let mut rem = flat;
    let mut idx = 0;
    let mut stride = 1;
    for axis in (0..to.len()).rev() {
        let coord = rem % to[axis];
        rem /= to[axis];
        if axis >= pad {
            let d = from[axis - pad];
            if d != 1 {
                idx += coord * stride;
            }
            stride *= d;
        }
    }
    idx
}

impl FoldBatchNorm {
    /// Tries to fold the chain after `id`; returns the stats of the rewrite.
    fn fold(&self, graph: &mut Graph, id: NodeId) -> Result<Option<PassStats>, PassError> {
        let node = graph.node(id);
        if !node.ty.dtype.is_float() {
            return Ok(None);
        }
        let dtype = node.ty.dtype;
        let out_shape = node.ty.shape.clone();
        let inputs = graph.inputs_of(id);
        let (kind, axis) = match &node.op {
            Op::Conv(_) if out_shape.len() == 4 => (Head::Conv, 1),
            Op::Gemm { .. } if out_shape.len() == 2 => (Head::Gemm, 1),
            Op::MatMul
                if !out_shape.is_empty()
                    && graph.node(inputs[1]).ty.shape.len() == 2
                    && graph.constant(inputs[1]).is_some() =>
            {
                let two_d = graph.node(inputs[0]).ty.shape.len() == 2;
                (Head::MatMul { two_d }, out_shape.len() - 1)
            }
            _ => return Ok(None),
        };
        // Weights (and bias) must be constants.
        if inputs[1..].iter().any(|&i| graph.constant(i).is_none()) {
            return Ok(None);
        }
        let Some(chain) = collect_chain(graph, id, kind, axis) else {
            return Ok(None);
        };
        let op = graph.node(id).op.clone();
        let name = graph.node(id).name.clone();
        let w = graph.constant(inputs[1]).expect("checked").clone();
        let bias = inputs
            .get(2)
            .map(|&b| graph.constant(b).expect("checked").clone());
        let (s, t) = (&chain.scale, &chain.shift);
        let mut stats = PassStats::default();
        let mut new_inputs = vec![inputs[0]];
        let mut new_op = op.clone();
        match kind {
            Head::Conv => {
                // W [O, C/g, kh, kw]: scale every weight of output channel o.
                let wv = w.to_f64_vec();
                let per = wv.len() / s.len();
                if chain.scaled {
                    let folded = wv
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| x * s[i / per])
                        .collect();
                    new_inputs.push(graph.add_const(
                        derived(&name, "folded_weight"),
                        tensor(w.shape(), dtype, folded),
                    ));
                    stats.added += 1;
                } else {
                    new_inputs.push(inputs[1]);
                }
                let b: Vec<f64> = match &bias {
                    Some(b) => b.to_f64_vec(),
                    None => vec![0.0; s.len()],
                };
                let folded = (0..s.len()).map(|o| b[o] * s[o] + t[o]).collect();
                new_inputs.push(graph.add_const(
                    derived(&name, "folded_bias"),
                    tensor(&[s.len()], dtype, folded),
                ));
                stats.added += 1;
            }
            Head::Gemm => {
                let Op::Gemm {
                    alpha,
                    beta,
                    trans_a,
                    trans_b,
                } = op
                else {
                    unreachable!("gemm head")
                };
                new_inputs.push(scale_columns(
                    graph,
                    &w,
                    trans_b,
                    s,
                    chain.scaled,
                    inputs[1],
                    &name,
                    &mut stats,
                ));
                let n = s.len();
                let m = out_shape[0];
                match &bias {
                    None if !chain.shifted => {}
                    None => {
                        new_inputs.push(
                            graph.add_const(
                                derived(&name, "folded_c"),
                                tensor(&[n], dtype, t.clone()),
                            ),
                        );
                        stats.added += 1;
                    }
                    Some(c) => {
                        // C' = s * beta * C + t, broadcast to C's shape joined
                        // with the per-column vector [N].
                        let cs: Vec<usize> = c.shape().to_vec();
                        let to: Vec<usize> = match cs.len() {
                            2 if cs[0] == m && m != 1 => vec![m, n],
                            2 => vec![1, n],
                            _ => vec![n],
                        };
                        let cv = c.to_f64_vec();
                        let total: usize = to.iter().product();
                        let folded = (0..total)
                            .map(|i| {
                                let col = i % n;
                                let ci = broadcast_index(&cs, &to, i);
                                s[col] * beta as f64 * cv[ci] + t[col]
                            })
                            .collect();
                        new_inputs.push(
                            graph.add_const(derived(&name, "folded_c"), tensor(&to, dtype, folded)),
                        );
                        stats.added += 1;
                    }
                }
                new_op = Op::Gemm {
                    alpha,
                    beta: if new_inputs.len() == 3 { 1.0 } else { beta },
                    trans_a,
                    trans_b,
                };
            }
            Head::MatMul { .. } => {
                new_inputs.push(scale_columns(
                    graph,
                    &w,
                    false,
                    s,
                    chain.scaled,
                    inputs[1],
                    &name,
                    &mut stats,
                ));
                if chain.shifted {
                    new_inputs.push(graph.add_const(
                        derived(&name, "folded_c"),
                        tensor(&[s.len()], dtype, t.clone()),
                    ));
                    stats.added += 1;
                    new_op = Op::Gemm {
                        alpha: 1.0,
                        beta: 1.0,
                        trans_a: false,
                        trans_b: false,
                    };
                }
            }
        }
        let new = graph.add_node(new_op, &new_inputs, name).map_err(fail)?;
        stats.added += 1;
        graph.replace_all_uses(chain.last, new).map_err(fail)?;
        stats.rewritten += chain.steps.len() + 1;
        // Remove the chain from its end, then the head and dead constants.
        let mut dead: Vec<NodeId> = chain.steps.iter().rev().copied().collect();
        dead.push(id);
        stats.removed += crate::simplify::remove_dead(graph, dead);
        Ok(Some(stats))
    }
}

/// B with the columns of `op(B)` scaled by `s` (rows of B when `trans_b`),
/// as a new constant; B itself when the chain does not scale.
#[allow(clippy::too_many_arguments)]
fn scale_columns(
    graph: &mut Graph,
    b: &Tensor,
    trans_b: bool,
    s: &[f64],
    scaled: bool,
    b_node: NodeId,
    name: &str,
    stats: &mut PassStats,
) -> NodeId {
    if !scaled {
        return b_node;
    }
    let cols = b.shape()[1];
    let folded = b
        .to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let j = if trans_b { i / cols } else { i % cols };
            x * s[j]
        })
        .collect();
    stats.added += 1;
    graph.add_const(
        derived(name, "folded_weight"),
        tensor(b.shape(), b.dtype(), folded),
    )
}

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold-batchnorm"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        for id in graph.topo_order().map_err(fail)? {
            if !graph.contains(id) {
                continue;
            }
            if let Some(s) = self.fold(graph, id)? {
                stats += s;
            }
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_channel_shapes() {
        let c = Tensor::new([3, 1, 1], Data::F32(vec![1.0, 2.0, 3.0])).unwrap();
        assert_eq!(per_channel(&c, &[1, 3, 4, 4], 1), Some(vec![1.0, 2.0, 3.0]));
        let c = Tensor::new([3], Data::F32(vec![1.0, 2.0, 3.0])).unwrap();
        assert_eq!(per_channel(&c, &[1, 3, 4, 4], 1), None);
        assert_eq!(per_channel(&c, &[2, 3], 1), Some(vec![1.0, 2.0, 3.0]));
        let c = Tensor::scalar_f32(2.0);
        assert_eq!(per_channel(&c, &[2, 3], 1), Some(vec![2.0; 3]));
        let c = Tensor::new([2, 1], Data::F32(vec![1.0, 2.0])).unwrap();
        assert_eq!(per_channel(&c, &[2, 3], 1), None);
    }

    #[test]
    fn broadcast_index_rules() {
        // [M,1] into [M,N]: column ignored.
        assert_eq!(broadcast_index(&[2, 1], &[2, 3], 4), 1);
        // [N] into [1,N].
        assert_eq!(broadcast_index(&[3], &[1, 3], 2), 2);
        // [] into [N].
        assert_eq!(broadcast_index(&[], &[3], 2), 0);
    }
}
