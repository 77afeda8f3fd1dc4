//! `recognize`: layer normalization, GELU, hard-swish, softmax and scaled
//! dot-product attention as exporters decompose them, rewritten into the
//! single IR ops (`layer_norm`, `gelu`, `hard_swish`, `softmax`,
//! `attention`) that targets run as one kernel or inside a dense kernel's
//! store loop.

use crate::pass::{Pass, PassError, PassStats};
use kiln_ir::{BinaryOp, DType, Data, Graph, IrError, NodeId, Op, ReduceOp, Tensor, UnaryOp};

/// Rewrites, on f32 values:
///
/// - **LayerNorm** (opset < 17 exports, Keras/TF): `d = x - mean(x)`,
///   `y = d / sqrt(mean(d²) + ε)` (the square as `pow(d, 2)` or `d * d`),
///   then optionally `* γ` and `+ β`, the means over a suffix of the axes
///   with kept dims → `layer_norm(x, γ, β) {axis, epsilon}` (γ a constant
///   of ones when absent). γ and β must have the normalized axes' shape.
/// - **GELU, erf form** (PyTorch, BERT exports): `x * (1 + erf(x / √2)) *
///   0.5` in either association (`(x * t) * 0.5` or `(x * 0.5) * t`), the
///   division as `x * (1/√2)` too, operands of `+`/`*` in either order →
///   `gelu(x) {tanh=false}`;
/// - **GELU, tanh form** (GPT-2): the same with `tanh(√(2/π) · (x +
///   0.044715 · x³))`, the cube as `pow(x, 3)` or `x · x · x` →
///   `gelu(x) {tanh=true}`.
///
/// - **Hard-swish** (Paddle, MobileNetV3 exports): `x * clip(x + 3, 0, 6)
///   / 6`, the division as `* (1/6)` too, or applied to the clip first
///   (`x * (clip(x + 3, 0, 6) / 6)`), operands of `+`/`*` in either order →
///   `hard_swish(x)` (`x · clamp(x/6 + 1/2, 0, 1)`, which the kernels
///   compute without a division).
/// - **Softmax** (TF, hand-written exports): `e = exp(x - max(x))`,
///   `y = e / sum(e)`, max and sum over the same single axis with kept dims
///   → `softmax(x) {axis}`. Without the max subtraction (`exp(x) /
///   sum(exp(x))`, equal in exact arithmetic) too: the kernel subtracts the
///   max anyway, so large inputs give the softmax instead of `inf / inf`.
/// - **Attention** (second sweep, after the softmaxes above exist):
///   `softmax(s · (Q @ Kt) + mask) @ V` over the last axis, the scale as
///   `* s` or `/ (1/s)` with a scalar constant, scale and mask each
///   optional, Q, Kt and V with the same batch dims → `attention(Q, Kt, V,
///   mask) {scale}`. Targets without an attention kernel (CUDA) run the
///   pass without this rule ([`Recognize::without_attention`]).
///
/// Every intermediate value must be used only inside the pattern and not be
/// a graph output; the result keeps the last node's name.
#[derive(Clone, Copy, Debug)]
pub struct Recognize {
    attention: bool,
}

impl Default for Recognize {
    /// Every rule.
    fn default() -> Recognize {
        Recognize { attention: true }
    }
}

impl Recognize {
    /// Every rule but attention (for targets that have no attention kernel).
    pub fn without_attention() -> Recognize {
        Recognize { attention: false }
    }
}

fn fail(source: IrError) -> PassError {
    PassError::Failed {
        pass: "recognize",
        source,
    }
}

/// The value of a one-element float constant.
fn scalar(graph: &Graph, id: NodeId) -> Option<f64> {
    let t = graph.constant(id)?;
    (t.dtype().is_float() && t.shape().iter().product::<usize>() == 1).then(|| t.to_f64_vec()[0])
}

fn close(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() <= 1e-6 * want.abs().max(1.0))
}

/// The users of `id` when it is not a graph output.
fn users(graph: &Graph, id: NodeId) -> Option<Vec<NodeId>> {
    if graph.is_output(id) {
        return None;
    }
    let mut u: Vec<NodeId> = graph.users_of(id).into_iter().map(|(u, _)| u).collect();
    u.dedup();
    Some(u)
}

/// The one user of `id` (not a graph output).
fn sole_user(graph: &Graph, id: NodeId) -> Option<NodeId> {
    match users(graph, id)?.as_slice() {
        [u] => Some(*u),
        _ => None,
    }
}

/// When `id` is `op(a, b)`, its inputs.
fn binary(graph: &Graph, id: NodeId, op: BinaryOp) -> Option<(NodeId, NodeId)> {
    (graph.node(id).op == Op::Binary(op)).then(|| {
        let i = graph.inputs_of(id);
        (i[0], i[1])
    })
}

/// When `id` is a commutative `op` of `known` and something else, the other
/// operand.
fn other_operand(graph: &Graph, id: NodeId, op: BinaryOp, known: NodeId) -> Option<NodeId> {
    let (a, b) = binary(graph, id, op)?;
    match (a == known, b == known) {
        (true, false) => Some(b),
        (false, true) => Some(a),
        _ => None,
    }
}

/// A mean over a suffix of the axes, with kept dims: the first axis.
fn suffix_mean(graph: &Graph, id: NodeId, rank: usize) -> Option<usize> {
    let Op::Reduce {
        op: ReduceOp::Mean,
        axes,
        keep_dims: true,
    } = &graph.node(id).op
    else {
        return None;
    };
    let first = *axes.first()?;
    (axes.iter().copied().eq(first..rank)).then_some(first)
}

/// Whether `id` has the shape of the normalized axes `shape`.
fn normalized_shape(graph: &Graph, id: NodeId, shape: &[usize]) -> bool {
    graph.node(id).ty.shape[..] == *shape
}

/// A matched pattern: the new op and its inputs, the node it replaces and
/// the nodes it removes.
struct Match {
    op: Op,
    inputs: Vec<NodeId>,
    /// γ when it must be created (ones over the normalized shape).
    ones: Option<Vec<usize>>,
    last: NodeId,
    members: Vec<NodeId>,
}

fn layer_norm(graph: &Graph, mean: NodeId) -> Option<Match> {
    let x = *graph.inputs_of(mean).first()?;
    let xty = &graph.node(x).ty;
    if xty.dtype != DType::F32 || graph.node(mean).ty.dtype != DType::F32 {
        return None;
    }
    let rank = xty.shape.len();
    let axis = suffix_mean(graph, mean, rank)?;
    let d = sole_user(graph, mean)?;
    if binary(graph, d, BinaryOp::Sub)? != (x, mean) {
        return None;
    }
    let du = users(graph, d)?;
    let [a, b] = du.as_slice() else { return None };
    let is_square = |p: NodeId| {
        binary(graph, p, BinaryOp::Mul) == Some((d, d))
            || binary(graph, p, BinaryOp::Pow)
                .is_some_and(|(l, r)| l == d && close(scalar(graph, r), 2.0))
    };
    let (square, div) = if is_square(*a) { (*a, *b) } else { (*b, *a) };
    if !is_square(square) {
        return None;
    }
    let var = sole_user(graph, square)?;
    if suffix_mean(graph, var, rank)? != axis {
        return None;
    }
    let add = sole_user(graph, var)?;
    let eps = scalar(graph, other_operand(graph, add, BinaryOp::Add, var)?)?;
    let sqrt = sole_user(graph, add)?;
    if graph.node(sqrt).op != Op::Unary(UnaryOp::Sqrt) || sole_user(graph, sqrt)? != div {
        return None;
    }
    if binary(graph, div, BinaryOp::Div)? != (d, sqrt) {
        return None;
    }
    let mut members = vec![mean, d, square, var, add, sqrt, div];
    let normalized = xty.shape[axis..].to_vec();
    let mut last = div;
    let mut gamma = None;
    let mut beta = None;
    if let Some(u) = sole_user(graph, last) {
        if let Some(g) = other_operand(graph, u, BinaryOp::Mul, last) {
            if normalized_shape(graph, g, &normalized) && graph.node(g).ty.dtype == DType::F32 {
                gamma = Some(g);
                members.push(u);
                last = u;
            }
        }
    }
    if let (Some(_), Some(u)) = (gamma, sole_user(graph, last)) {
        if let Some(b) = other_operand(graph, u, BinaryOp::Add, last) {
            if normalized_shape(graph, b, &normalized) && graph.node(b).ty.dtype == DType::F32 {
                beta = Some(b);
                members.push(u);
                last = u;
            }
        }
    }
    // Without γ the op needs ones over the normalized axes, made here: a
    // normalization over more than MAX_ONES values (a hostile shape; no
    // real model has one) keeps its decomposed form.
    let ones_len = normalized.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    if gamma.is_none() && ones_len.is_none_or(|n| n > MAX_ONES) {
        return None;
    }
    let mut inputs = vec![x];
    inputs.extend(gamma);
    inputs.extend(beta);
    Some(Match {
        op: Op::LayerNorm {
            axis,
            epsilon: eps as f32,
        },
        inputs,
        ones: gamma.is_none().then_some(normalized),
        last,
        members,
    })
}

fn gelu(graph: &Graph, scaled: NodeId) -> Option<Match> {
    let x = *graph.inputs_of(scaled).first()?;
    if graph.node(x).ty.dtype != DType::F32 || graph.node(scaled).ty != graph.node(x).ty {
        return None;
    }
    let by_root2 = match binary(graph, scaled, BinaryOp::Div) {
        Some((l, r)) => l == x && close(scalar(graph, r), std::f64::consts::SQRT_2),
        None => binary(graph, scaled, BinaryOp::Mul).is_some_and(|(l, r)| {
            l == x && close(scalar(graph, r), std::f64::consts::FRAC_1_SQRT_2)
        }),
    };
    if !by_root2 {
        return None;
    }
    let erf = sole_user(graph, scaled)?;
    if graph.node(erf).op != Op::Unary(UnaryOp::Erf) {
        return None;
    }
    gelu_tail(graph, x, erf, vec![scaled, erf], false)
}

/// The tanh form `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))`,
/// rooted at the cube (`pow(x, 3)` or `x · x · x`).
fn gelu_tanh(graph: &Graph, cube: NodeId) -> Option<Match> {
    let x = *graph.inputs_of(cube).first()?;
    if graph.node(x).ty.dtype != DType::F32 || graph.node(cube).ty != graph.node(x).ty {
        return None;
    }
    let mut members = vec![];
    let cube = match binary(graph, cube, BinaryOp::Pow) {
        Some((l, r)) if l == x && close(scalar(graph, r), 3.0) => cube,
        Some(_) => return None,
        None => {
            // (x · x) · x
            if binary(graph, cube, BinaryOp::Mul)? != (x, x) {
                return None;
            }
            members.push(cube);
            let c = sole_user(graph, cube)?;
            if other_operand(graph, c, BinaryOp::Mul, cube)? != x {
                return None;
            }
            c
        }
    };
    members.push(cube);
    let coeff = |id: NodeId, of: NodeId, want: f64| {
        other_operand(graph, id, BinaryOp::Mul, of).is_some_and(|c| close(scalar(graph, c), want))
    };
    let scaled_cube = sole_user(graph, cube)?;
    if !coeff(scaled_cube, cube, 0.044715) {
        return None;
    }
    let inner = sole_user(graph, scaled_cube)?;
    if other_operand(graph, inner, BinaryOp::Add, scaled_cube)? != x {
        return None;
    }
    let arg = sole_user(graph, inner)?;
    if !coeff(arg, inner, (2.0 / std::f64::consts::PI).sqrt()) {
        return None;
    }
    let tanh = sole_user(graph, arg)?;
    if graph.node(tanh).op != Op::Unary(UnaryOp::Tanh) {
        return None;
    }
    members.extend([scaled_cube, inner, arg, tanh]);
    gelu_tail(graph, x, tanh, members, true)
}

/// The common end of both GELU forms after `f` (the erf or the tanh):
/// `(x · (1 + f)) · 0.5` or `(x · 0.5) · (1 + f)`; `members` are the nodes
/// matched so far.
fn gelu_tail(
    graph: &Graph,
    x: NodeId,
    f: NodeId,
    mut members: Vec<NodeId>,
    tanh: bool,
) -> Option<Match> {
    let plus = sole_user(graph, f)?;
    if !close(
        scalar(graph, other_operand(graph, plus, BinaryOp::Add, f)?),
        1.0,
    ) {
        return None;
    }
    let times = sole_user(graph, plus)?;
    let factor = other_operand(graph, times, BinaryOp::Mul, plus)?;
    let half = |id: NodeId, of: NodeId| {
        other_operand(graph, id, BinaryOp::Mul, of).is_some_and(|c| close(scalar(graph, c), 0.5))
            || binary(graph, id, BinaryOp::Div)
                .is_some_and(|(l, r)| l == of && close(scalar(graph, r), 2.0))
    };
    let last = if factor == x {
        // (x * (1 + f)) * 0.5
        let out = sole_user(graph, times)?;
        if !half(out, times) {
            return None;
        }
        members.extend([plus, times, out]);
        out
    } else if half(factor, x) && sole_user(graph, factor) == Some(times) {
        // (x * 0.5) * (1 + f)
        members.extend([plus, factor, times]);
        times
    } else {
        return None;
    };
    Some(Match {
        op: Op::Unary(UnaryOp::Gelu { tanh }),
        inputs: vec![x],
        ones: None,
        last,
        members,
    })
}

/// `x * clip(x + 3, 0, 6) / 6` (see [`Recognize`]), rooted at the `+ 3`.
fn hard_swish(graph: &Graph, plus: NodeId) -> Option<Match> {
    let (a, b) = binary(graph, plus, BinaryOp::Add)?;
    let x = match (close(scalar(graph, a), 3.0), close(scalar(graph, b), 3.0)) {
        (false, true) => a,
        (true, false) => b,
        _ => return None,
    };
    if graph.node(x).ty.dtype != DType::F32 || graph.node(plus).ty != graph.node(x).ty {
        return None;
    }
    let relu6 = sole_user(graph, plus)?;
    if graph.node(relu6).op != Op::Unary(UnaryOp::Clip { min: 0.0, max: 6.0 }) {
        return None;
    }
    let sixth = |id: NodeId, of: NodeId| {
        binary(graph, id, BinaryOp::Div)
            .is_some_and(|(l, r)| l == of && close(scalar(graph, r), 6.0))
            || other_operand(graph, id, BinaryOp::Mul, of)
                .is_some_and(|c| close(scalar(graph, c), 1.0 / 6.0))
    };
    let next = sole_user(graph, relu6)?;
    let (members, last) = if other_operand(graph, next, BinaryOp::Mul, relu6) == Some(x) {
        // (x * relu6) / 6
        let out = sole_user(graph, next)?;
        if !sixth(out, next) {
            return None;
        }
        (vec![plus, relu6, next, out], out)
    } else if sixth(next, relu6) {
        // x * (relu6 / 6)
        let out = sole_user(graph, next)?;
        if other_operand(graph, out, BinaryOp::Mul, next) != Some(x) {
            return None;
        }
        (vec![plus, relu6, next, out], out)
    } else {
        return None;
    };
    // The shape must not grow through a broadcast constant.
    if graph.node(last).ty != graph.node(x).ty {
        return None;
    }
    Some(Match {
        op: Op::Unary(UnaryOp::HardSwish),
        inputs: vec![x],
        ones: None,
        last,
        members,
    })
}

/// A reduction `op` over exactly one axis with kept dims: the axis.
fn single_axis_reduce(graph: &Graph, id: NodeId, op: ReduceOp) -> Option<usize> {
    match &graph.node(id).op {
        Op::Reduce {
            op: o,
            axes,
            keep_dims: true,
        } if *o == op && axes.len() == 1 => Some(axes[0]),
        _ => None,
    }
}

/// `e / sum(e)` with `e = exp(x - max(x))` or `e = exp(x)`, rooted at the
/// exp.
fn softmax(graph: &Graph, e: NodeId) -> Option<Match> {
    if graph.node(e).op != Op::Unary(UnaryOp::Exp) || graph.node(e).ty.dtype != DType::F32 {
        return None;
    }
    let t = *graph.inputs_of(e).first()?;
    let eu = users(graph, e)?;
    let [a, b] = eu.as_slice() else { return None };
    let (sum, y) = if single_axis_reduce(graph, *a, ReduceOp::Sum).is_some() {
        (*a, *b)
    } else {
        (*b, *a)
    };
    let axis = single_axis_reduce(graph, sum, ReduceOp::Sum)?;
    if graph.inputs_of(sum).first() != Some(&e)
        || sole_user(graph, sum) != Some(y)
        || binary(graph, y, BinaryOp::Div)? != (e, sum)
        || graph.node(y).ty != graph.node(t).ty
    {
        return None;
    }
    // The max subtraction joins when it is over the same axis (otherwise
    // the softmax is of the difference).
    let mut members = vec![];
    let shifted = binary(graph, t, BinaryOp::Sub).filter(|&(x, max)| {
        single_axis_reduce(graph, max, ReduceOp::Max) == Some(axis)
            && graph.inputs_of(max).first() == Some(&x)
            && sole_user(graph, max) == Some(t)
            && sole_user(graph, t) == Some(e)
    });
    let x = match shifted {
        Some((x, max)) => {
            members.extend([max, t]);
            x
        }
        None => t,
    };
    members.extend([e, sum, y]);
    Some(Match {
        op: Op::Softmax { axis },
        inputs: vec![x],
        ones: None,
        last: y,
        members,
    })
}

/// `softmax(s · (Q @ Kt) + mask) @ V`, rooted at `Q @ Kt`.
fn attention(graph: &Graph, scores: NodeId) -> Option<Match> {
    if graph.node(scores).op != Op::MatMul {
        return None;
    }
    let (q, kt) = match graph.inputs_of(scores)[..] {
        [q, kt] => (q, kt),
        _ => return None,
    };
    let rank = graph.node(scores).ty.shape.len();
    // Same rank and batch dims as the scores, all f32 (no broadcasting).
    let fits = |id: NodeId| {
        let ty = &graph.node(id).ty;
        ty.dtype == DType::F32
            && rank >= 2
            && ty.shape.len() == rank
            && ty.shape[..rank - 2] == graph.node(scores).ty.shape[..rank - 2]
    };
    if !(fits(q) && fits(kt) && fits(scores)) {
        return None;
    }
    let mut members = vec![scores];
    let mut at = scores;
    let mut next = sole_user(graph, at)?;
    let mut scale = 1.0;
    let by_mul = other_operand(graph, next, BinaryOp::Mul, at).and_then(|c| scalar(graph, c));
    let by_div = binary(graph, next, BinaryOp::Div)
        .filter(|&(l, _)| l == at)
        .and_then(|(_, r)| scalar(graph, r))
        .filter(|&d| d != 0.0)
        .map(|d| 1.0 / d);
    if let Some(s) = by_mul.or(by_div) {
        scale = s;
        members.push(next);
        at = next;
        next = sole_user(graph, at)?;
    }
    let mut mask = None;
    if let Some(m) = other_operand(graph, next, BinaryOp::Add, at) {
        if graph.node(m).ty.dtype == DType::F32 && graph.node(next).ty == graph.node(at).ty {
            mask = Some(m);
            members.push(next);
            at = next;
            next = sole_user(graph, at)?;
        }
    }
    if graph.node(next).op != (Op::Softmax { axis: rank - 1 }) {
        return None;
    }
    members.push(next);
    let out = sole_user(graph, next)?;
    let v = match graph.inputs_of(out)[..] {
        [p, v] if p == next && v != next => v,
        _ => return None,
    };
    if graph.node(out).op != Op::MatMul || !fits(v) {
        return None;
    }
    members.push(out);
    let mut inputs = vec![q, kt, v];
    inputs.extend(mask);
    Some(Match {
        op: Op::Attention {
            scale: scale as f32,
        },
        inputs,
        ones: None,
        last: out,
        members,
    })
}

/// Most values of a γ of ones that [`layer_norm`] creates (64 MB of f32).
const MAX_ONES: usize = 16 << 20;

/// Replaces `m.last` by the matched op and removes the members.
fn rewrite(graph: &mut Graph, m: Match, stats: &mut PassStats) -> Result<(), PassError> {
    let mut inputs = m.inputs;
    if let Some(shape) = m.ones {
        let name = format!("{}/scale", graph.node(m.last).name);
        let n: usize = shape.iter().product();
        let ones = Tensor::new(&shape, Data::F32(vec![1.0; n]))
            .expect("as many values as the shape holds");
        inputs.push(graph.add_const(name, ones));
        stats.added += 1;
    }
    let name = graph.node(m.last).name.clone();
    let new = graph.add_node(m.op, &inputs, name).map_err(fail)?;
    graph.replace_all_uses(m.last, new).map_err(fail)?;
    for &n in m.members.iter().rev() {
        graph.remove_unused(n);
    }
    stats.removed += m.members.len();
    stats.added += 1;
    stats.rewritten += 1;
    Ok(())
}

impl Pass for Recognize {
    fn name(&self) -> &'static str {
        "recognize"
    }

    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError> {
        let mut stats = PassStats::default();
        let order = graph.topo_order().map_err(fail)?;
        for root in order {
            if !graph.contains(root) {
                continue;
            }
            let found = layer_norm(graph, root)
                .or_else(|| gelu(graph, root))
                .or_else(|| gelu_tanh(graph, root))
                .or_else(|| hard_swish(graph, root))
                .or_else(|| softmax(graph, root));
            if let Some(m) = found {
                rewrite(graph, m, &mut stats)?;
            }
        }
        if self.attention {
            for root in graph.topo_order().map_err(fail)? {
                if !graph.contains(root) {
                    continue;
                }
                if let Some(m) = attention(graph, root) {
                    rewrite(graph, m, &mut stats)?;
                }
            }
        }
        Ok(stats)
    }
}
