//! Which values keep the positions of a padded axis apart: the proof behind
//! `kiln compile --pad-dim NAME` (a batch, or a sequence with its mask).
//!
//! A run whose inputs are smaller along a dim than any profile may use a
//! larger profile with the inputs padded with zeros along that dim, and the
//! outputs cut back, when the padded positions cannot reach the real ones.
//! [`trace_rows`] follows the dim's axis from the graph inputs through every
//! node, and for each value keeps the axes that carry it, each with a
//! [`Pad`]: what the elements at padded positions along that axis hold
//! (those real along the value's other such axes). An op that works within
//! each position keeps the axis; an op that reads across it is accepted only
//! where the facts make the padded positions add nothing:
//!
//! - a sum along the axis (ReduceSum, a MatMul's or Gemm's K) where one
//!   side is exactly zero at padded positions and the other finite;
//! - a softmax, ReduceMax or attention over the axis where the padded
//!   positions are masked: at most [`MASKED`] (an additive mask of -10000,
//!   -1e9, the dtype's lowest or -inf), so their weight is exp(...) = 0;
//! - a slice or gather of position 0 alone (always real).
//!
//! The inputs' padded positions are zeros, so the facts start exact (an
//! attention mask's 0 becomes `(1 - 0) * -3.4e38` by exact evaluation of
//! each op on the scalars) and are lost only where a position's values meet
//! the model's own data. Values the trace does not know exactly are assumed
//! finite (a padded position is the model's own computation on inputs of
//! zeros), and adding a finite value to a masked one keeps it masked (the
//! assumption the model's own mask makes of its scores). Anything else that
//! reads across the axis (a mean, a normalization over it, a reshape or
//! slice that moves positions, a concatenation along it) is refused, naming
//! the node; so is an op the trace has no rule for.
//!
//! A constant that differs along the axis (position embeddings cut to the
//! length) is reported in [`Traced::positional`]: the caller checks that
//! each profile's is the start of the larger ones', as an embedding indexed
//! by position is.
//!
//! The trace runs on the imported graph (before any pass), whose ops are
//! the ONNX semantics, and on each profile whose dim is larger than 1 (a
//! size-1 axis cannot be told from other size-1 axes).

use std::fmt;

use kiln_ir::{BinaryOp, DType, Data, Graph, NodeId, Op, ReduceOp, Tensor};

/// Where a graph input's or output's padded positions are: the axis, or
/// none.
pub type RowAxis = Option<usize>;

/// The largest value a masked position may hold: softmax gives it weight
/// `exp(-10000 - max) = 0` in f32 as long as the real scores are within
/// about 9900 of one another.
pub const MASKED: f64 = -1e4;

/// What the elements at padded positions along one axis hold.
#[derive(Clone, Debug, PartialEq)]
pub enum Pad {
    /// Exactly this scalar (of the value's dtype): the inputs' zeros and
    /// what ops compute from them alone.
    Exactly(Tensor),
    /// At most this bound (a masked score).
    AtMost(f64),
    /// Finite, otherwise unknown.
    Finite,
    /// Nothing is known: possibly infinite or NaN.
    Unknown,
}

impl Pad {
    /// A zero of `dtype` (finite, for a type without a scalar form).
    fn zero(dtype: DType) -> Pad {
        Tensor::new([], Data::zeros(dtype, 1)).map_or(Pad::Finite, Pad::Exactly)
    }

    fn value(&self) -> Option<f64> {
        match self {
            Pad::Exactly(t) => Some(t.data().get_f64(0)),
            _ => None,
        }
    }

    fn is_zero(&self) -> bool {
        self.value() == Some(0.0)
    }

    fn is_finite(&self) -> bool {
        match self {
            Pad::Finite => true,
            Pad::Exactly(_) => self.value().is_some_and(f64::is_finite),
            Pad::AtMost(_) | Pad::Unknown => false,
        }
    }

    /// An upper bound of the values, where one is known.
    fn bound(&self) -> Option<f64> {
        match self {
            Pad::AtMost(b) => Some(*b),
            _ => self.value(),
        }
    }

    /// Whether a softmax gives these positions weight 0.
    fn masks(&self) -> bool {
        self.bound().is_some_and(|b| b <= MASKED)
    }

    /// The fact of a value computed from this one by an op the trace does
    /// not evaluate.
    fn derived(&self) -> Pad {
        match self.is_finite() {
            true => Pad::Finite,
            false => Pad::Unknown,
        }
    }

    /// What both of two sets of positions hold.
    fn join(&self, other: &Pad) -> Pad {
        match (self, other) {
            (a, b) if a == b => a.clone(),
            (a, b) if a.masks() && b.masks() => {
                Pad::AtMost(a.bound().unwrap_or(MASKED).max(b.bound().unwrap_or(MASKED)))
            }
            (a, b) if a.is_finite() && b.is_finite() => Pad::Finite,
            _ => Pad::Unknown,
        }
    }
}

impl fmt::Display for Pad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pad::Exactly(_) => write!(f, "exactly {}", self.value().unwrap_or(f64::NAN)),
            Pad::AtMost(b) => write!(f, "values at most {b:e}"),
            Pad::Finite => write!(f, "unknown finite values"),
            Pad::Unknown => write!(f, "unknown values"),
        }
    }
}

/// Why an axis cannot be padded: the first node that reads across it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node '{node}' ({op}) {why}")]
pub struct MixesRows {
    /// The node's name (an output's, for an output the table cannot cut).
    pub node: String,
    /// The IR op (its text name).
    pub op: String,
    /// What it does with the padded positions.
    pub why: String,
}

/// A constant that differs along a padded axis: padding reads its rows as
/// indexed by position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Positional {
    /// The constant node.
    pub node: NodeId,
    /// The constant's axis that runs along the padded one.
    pub axis: usize,
}

/// A value inside the graph whose positions along `axis` past some point
/// are padding holding `pad` (a value of data-dependent size computed at
/// its bound, `kiln_ir::Op::WithLength`): traced like a padded input.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// The node whose value starts the trace.
    pub node: NodeId,
    /// Its padded axis.
    pub axis: usize,
    /// What its padded positions hold.
    pub pad: Pad,
}

/// Why position 0 of a value of data-dependent size cannot be read alone.
const EMPTY_FIRST: &str =
    "reads position 0 alone, which a run of data-dependent length 0 does not have";

/// What [`trace_rows`] proves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traced {
    /// Each graph output's padded axis (none: the output is returned
    /// whole).
    pub outputs: Vec<RowAxis>,
    /// The constants that differ along a padded axis, once each.
    pub positional: Vec<Positional>,
    /// Every node's padded axes, by node index.
    pub axes: Vec<Vec<usize>>,
}

/// The padded axes of every graph output and the positional constants,
/// given the padded axis of each graph input (`inputs[i]` for input `i`;
/// `None`: the input has no such axis), whose padded positions hold zeros,
/// and of each constant that runs along the dim (`constants`: cut by
/// position from one table, which the caller checks), and of each of
/// `sources` (nodes whose value is padded, whatever their inputs).
pub fn trace_rows(
    graph: &Graph,
    inputs: &[RowAxis],
    constants: &[Positional],
    sources: &[Source],
) -> Result<Traced, MixesRows> {
    let order = kiln_ir::schedule(graph).map_err(|e| MixesRows {
        node: String::new(),
        op: String::new(),
        why: format!("cannot be ordered: {e}"),
    })?;
    let mut trace = Trace {
        graph,
        inputs,
        constants,
        sources,
        rows: vec![Vec::new(); graph.node_count()],
        positional: Vec::new(),
    };
    for id in order {
        trace.rows[id.index()] = trace.node(id)?;
    }
    let outputs = (graph.outputs().iter())
        .map(|(name, id)| match trace.rows[id.index()].as_slice() {
            [] => Ok(None),
            [(a, _)] => Ok(Some(*a)),
            [(a, _), (b, _), ..] => Err(MixesRows {
                node: name.clone(),
                op: "output".into(),
                why: format!(
                    "has the padded dim on axes {a} and {b}; a run cuts an output back along one axis"
                ),
            }),
        })
        .collect::<Result<_, _>>()?;
    let mut positional = trace.positional;
    positional.sort_unstable();
    positional.dedup();
    let axes = (trace.rows.iter())
        .map(|r| r.iter().map(|(a, _)| *a).collect())
        .collect();
    Ok(Traced {
        outputs,
        positional,
        axes,
    })
}

/// A value's padded axes (increasing), each with what its padded positions
/// hold.
type Rows = Vec<(usize, Pad)>;

/// How an axis of a product's operand meets the output.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// It is this output axis.
    Out(usize),
    /// The product sums over it.
    Sum(Summed),
}

/// The summed axes of the products the trace knows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Summed {
    /// K of a MatMul or Gemm.
    K,
    /// The keys of an attention (N of Kt, V and the mask).
    Keys,
    /// The head dim of an attention's scores (K of Q and Kt).
    Head,
}

struct Trace<'g> {
    graph: &'g Graph,
    inputs: &'g [RowAxis],
    constants: &'g [Positional],
    sources: &'g [Source],
    rows: Vec<Rows>,
    positional: Vec<Positional>,
}

type Refuse<'a> = &'a dyn Fn(&str) -> MixesRows;

/// Where an op moves its input's padded axis: an output axis, none (the
/// op drops it), or why it reads across it.
type MoveAxis<'a> = dyn Fn(usize, &Pad) -> Result<Option<usize>, String> + 'a;

impl<'g> Trace<'g> {
    /// Whether position 0 of a padded axis is always real: a padded dim's
    /// runs have at least one position; a value of data-dependent size
    /// (a source) may have none.
    fn first_is_real(&self) -> bool {
        self.sources.is_empty()
    }

    fn shape(&self, id: NodeId) -> &'g [usize] {
        &self.graph.node(id).ty.shape[..]
    }

    fn pad(&self, id: NodeId, axis: usize) -> Option<&Pad> {
        (self.rows[id.index()].iter())
            .find(|(a, _)| *a == axis)
            .map(|(_, p)| p)
    }

    /// What input `k` (`arg`) holds where the output is at a padded
    /// position and `arg` is at its own axis `at` (none: it broadcasts
    /// there). An argument that does not carry the axis is read whole; one
    /// whose values differ along it must be a constant (then positional).
    fn fact(
        &mut self,
        arg: NodeId,
        at: Option<usize>,
        k: usize,
        refuse: Refuse,
    ) -> Result<Pad, MixesRows> {
        let Some(at) = at else {
            return Ok(self.summary(arg));
        };
        if let Some(p) = self.pad(arg, at) {
            return Ok(p.clone());
        }
        let n = self.shape(arg)[at];
        if n == 1 {
            return Ok(self.summary(arg));
        }
        match &self.graph.node(arg).op {
            Op::Constant(t) => {
                if !rows_equal(t, at) {
                    self.positional.push(Positional {
                        node: arg,
                        axis: at,
                    });
                }
                Ok(self.summary(arg))
            }
            // A broadcast (a class token expanded to the batch) holds one
            // value along the axis, whatever the positions.
            _ if self.uniform_along(arg, at, 0) => Ok(self.summary(arg)),
            _ => Err(refuse(&format!(
                "pairs the padded positions with input {k}, whose {n} positions along that axis do not come from them"
            ))),
        }
    }

    /// Whether `id`'s slices along `axis` are provably all equal: a
    /// constant's are compared; an Expand of a size-1 axis, a transpose,
    /// and elementwise ops of such values keep it. `depth` bounds the walk.
    fn uniform_along(&self, id: NodeId, axis: usize, depth: usize) -> bool {
        let graph = self.graph;
        let node = graph.node(id);
        let rank = node.ty.shape.len();
        if node.ty.shape[axis] == 1 {
            return true;
        }
        if depth > 32 || self.pad(id, axis).is_some() {
            return false;
        }
        let args = graph.inputs_of(id);
        // Argument `arg`'s axis under output `axis` (none: broadcast).
        let each_arg = |args: &[NodeId]| {
            args.iter().all(|&arg| {
                let r = graph.node(arg).ty.shape.len();
                (axis + r)
                    .checked_sub(rank)
                    .is_none_or(|a| self.uniform_along(arg, a, depth + 1))
            })
        };
        match &node.op {
            Op::Constant(t) => rows_equal(t, axis),
            Op::Transpose { perm } => self.uniform_along(args[0], perm[axis], depth + 1),
            Op::Expand { .. }
            | Op::Unary(_)
            | Op::Cast { .. }
            | Op::Not
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Logical(_)
            | Op::Where => each_arg(&args),
            _ => false,
        }
    }

    /// What a value holds wherever it is read whole: a constant's one
    /// value, or finite values (a computed value is assumed finite).
    fn summary(&self, id: NodeId) -> Pad {
        let Op::Constant(t) = &self.graph.node(id).op else {
            return Pad::Finite;
        };
        let (data, elem) = (t.data(), t.dtype().size_bytes());
        let bytes = data.to_le_bytes();
        let Some(first) = bytes.get(..elem).filter(|_| elem > 0) else {
            return Pad::Finite;
        };
        if bytes.chunks_exact(elem).all(|c| c == first) {
            if let Some(one) =
                Data::from_le_bytes(t.dtype(), first).and_then(|d| Tensor::new([], d))
            {
                return Pad::Exactly(one);
            }
        }
        match (0..data.len()).all(|i| data.get_f64(i).is_finite()) {
            true => Pad::Finite,
            false => Pad::Unknown,
        }
    }

    /// Node `id`'s padded axes from its inputs'.
    fn node(&mut self, id: NodeId) -> Result<Rows, MixesRows> {
        let graph = self.graph;
        let node = graph.node(id);
        let args = graph.inputs_of(id);
        let refuse = |why: &str| MixesRows {
            node: node.name.clone(),
            op: node.op.name().to_string(),
            why: why.to_string(),
        };
        let refuse: Refuse = &refuse;
        let out_rank = node.ty.shape.len();
        let rank = |k: usize| graph.node(args[k]).ty.shape.len();
        // Inputs that must not carry the axis (weights, zero points).
        let only_first = |this: &Self, k: usize| -> Result<(), MixesRows> {
            match (args[k.min(args.len())..].iter()).any(|a| !this.rows[a.index()].is_empty()) {
                true => Err(refuse(
                    "reads the padded positions as weights or parameters",
                )),
                false => Ok(()),
            }
        };
        let first: Rows = args
            .first()
            .map(|a| self.rows[a.index()].clone())
            .unwrap_or_default();
        // Keeps the first input's axes (moved by `to`), their facts
        // derived; `None` from `to` refuses with its message.
        let each = |to: &MoveAxis<'_>| {
            let mut out = Rows::new();
            for (a, p) in &first {
                if let Some(o) = to(*a, p).map_err(|why| refuse(&why))? {
                    out.push((o, p.derived()));
                }
            }
            out.sort_by_key(|(a, _)| *a);
            Ok::<Rows, MixesRows>(out)
        };
        if let Some(source) = self.sources.iter().find(|s| s.node == id) {
            return Ok(vec![(source.axis, source.pad.clone())]);
        }
        Ok(match &node.op {
            Op::Input { index } => match self.inputs.get(*index).copied().flatten() {
                Some(axis) => vec![(axis, Pad::zero(node.ty.dtype))],
                None => Rows::new(),
            },
            Op::Constant(_) => (self.constants.iter())
                .filter(|c| c.node == id)
                .map(|c| (c.axis, self.summary(id)))
                .collect(),
            Op::Unary(_)
            | Op::Cast { .. }
            | Op::Bitcast { .. }
            | Op::Not
            | Op::BitwiseNot
            | Op::Binary(_)
            | Op::Compare(_)
            | Op::Logical(_)
            | Op::Bitwise(_)
            | Op::Where => self.elementwise(&node.op, node.ty.dtype, &args, out_rank, refuse)?,
            Op::MatMul | Op::MatMulInteger => {
                only_first(self, 2)?;
                let (ra, rb) = (rank(0), rank(1));
                let a = (0..ra).map(|i| match (ra, rb) {
                    (1, _) => Role::Sum(Summed::K),
                    _ if i == ra - 1 => Role::Sum(Summed::K),
                    (_, 1) => Role::Out(i),
                    _ if i == ra - 2 => Role::Out(out_rank - 2),
                    _ => Role::Out(i + out_rank - ra),
                });
                let b = (0..rb).map(|j| match (ra, rb) {
                    (_, 1) => Role::Sum(Summed::K),
                    _ if j == rb - 2 => Role::Sum(Summed::K),
                    (1, _) if j == rb - 1 => Role::Out(out_rank - 1),
                    (1, _) => Role::Out(j),
                    _ if j == rb - 1 => Role::Out(out_rank - 1),
                    _ => Role::Out(j + out_rank - rb),
                });
                let integer = matches!(node.op, Op::MatMulInteger);
                let operands = [(args[0], a.collect()), (args[1], b.collect())];
                self.product(&operands, integer, refuse)?
            }
            Op::Gemm {
                trans_a, trans_b, ..
            } => {
                let (k, out) = (Role::Sum(Summed::K), Role::Out);
                let a = if *trans_a {
                    vec![k, out(0)]
                } else {
                    vec![out(0), k]
                };
                let b = if *trans_b {
                    vec![out(1), k]
                } else {
                    vec![k, out(1)]
                };
                let mut operands = vec![(args[0], a), (args[1], b)];
                if let Some(&c) = args.get(2) {
                    let rc = rank(2);
                    operands.push((c, (0..rc).map(|i| out(i + 2 - rc)).collect()));
                }
                self.product(&operands, false, refuse)?
            }
            Op::Attention { .. } => {
                // Q [.., M, K], Kt [.., K, N], V [.., N, D] and the mask
                // (broadcast to [.., M, N]) -> [.., M, D].
                let lead = out_rank - 2;
                let roles = |last2: [Role; 2], r: usize| -> Vec<Role> {
                    (0..r)
                        .map(|i| match i + out_rank - r {
                            o if o >= lead => last2[o - lead],
                            o => Role::Out(o),
                        })
                        .collect()
                };
                let (m, d) = (Role::Out(lead), Role::Out(lead + 1));
                let (head, keys) = (Role::Sum(Summed::Head), Role::Sum(Summed::Keys));
                let mut operands = vec![
                    (args[0], roles([m, head], rank(0))),
                    (args[1], roles([head, keys], rank(1))),
                    (args[2], roles([keys, d], rank(2))),
                ];
                if let Some(&mask) = args.get(3) {
                    operands.push((mask, roles([m, keys], rank(3))));
                }
                self.product(&operands, false, refuse)?
            }
            Op::Conv(_) | Op::ConvInteger(_) | Op::Col2Im(_) => {
                only_first(self, 1)?;
                each(&|a, _| match a {
                    0 => Ok(Some(0)),
                    _ => Err("convolves across the padded axis".into()),
                })?
            }
            Op::MaxPool(_) | Op::AveragePool { .. } | Op::GlobalAveragePool | Op::GlobalMaxPool => {
                each(&|a, _| match a {
                    0 | 1 => Ok(Some(a)),
                    _ => Err("pools across the padded axis".into()),
                })?
            }
            Op::Softmax { axis } => {
                let mut out = Rows::new();
                for (a, p) in &first {
                    if a != axis {
                        out.push((*a, p.derived()));
                    } else if p.masks() {
                        out.push((*a, Pad::zero(node.ty.dtype)));
                    } else {
                        return Err(refuse(&format!(
                            "normalizes over the padded axis, whose padded positions are not masked (they hold {p})"
                        )));
                    }
                }
                out
            }
            Op::LayerNorm { axis, .. } => {
                only_first(self, 1)?;
                each(&|a, _| match a < *axis {
                    true => Ok(Some(a)),
                    false => Err("normalizes over the padded axis".into()),
                })?
            }
            Op::Reduce {
                op,
                axes,
                keep_dims,
            } => each(&|a, p| {
                if !axes.contains(&a) {
                    let before = axes.iter().filter(|&&x| x < a).count();
                    return Ok(Some(if *keep_dims { a } else { a - before }));
                }
                let adds_nothing = match op {
                    ReduceOp::Sum | ReduceOp::SumSquare | ReduceOp::L1 | ReduceOp::L2 => {
                        p.is_zero()
                    }
                    ReduceOp::Max | ReduceOp::LogSumExp => p.masks(),
                    _ => false,
                };
                match adds_nothing {
                    true => Ok(None),
                    false => Err(format!(
                        "reduces over the padded axis, whose padded positions hold {p}: a {} reads them",
                        node.op.name()
                    )),
                }
            })?,
            Op::Reshape { .. } => {
                let from = self.shape(args[0]);
                let to = &node.ty.shape[..];
                let mut out = Rows::new();
                for (a, p) in &first {
                    let before: usize = from[..*a].iter().product();
                    let kept = (0..to.len()).find(|&k| {
                        to[..k].iter().product::<usize>() == before && to[k] == from[*a]
                    });
                    match kept {
                        Some(k) => out.push((k, p.clone())),
                        None => return Err(refuse("reshapes the padded axis into others")),
                    }
                }
                out.sort_by_key(|(a, _)| *a);
                out
            }
            Op::Transpose { perm } => {
                let mut out: Rows = (first.iter())
                    .filter_map(|(a, p)| Some((perm.iter().position(|x| x == a)?, p.clone())))
                    .collect();
                out.sort_by_key(|(a, _)| *a);
                out
            }
            Op::Expand { .. } => (first.iter())
                .map(|(a, p)| (a + out_rank - rank(0), p.clone()))
                .collect(),
            Op::Concat { axis } => {
                let axes = union(&self.rows, &args, out_rank, graph);
                if axes.contains(axis) {
                    return Err(refuse("concatenates along the padded axis"));
                }
                let mut out = Rows::new();
                for a in axes {
                    let mut joined: Option<Pad> = None;
                    for (k, &arg) in args.iter().enumerate() {
                        let p = self.fact(arg, Some(a), k, refuse)?;
                        joined = Some(joined.map_or(p.clone(), |j| j.join(&p)));
                    }
                    out.push((a, joined.unwrap_or(Pad::Unknown)));
                }
                out
            }
            Op::Slice { axes } => {
                let full = self.shape(args[0]);
                let mut out = Rows::new();
                for (a, p) in &first {
                    let s = &axes[*a];
                    if s.start == 0 && s.step == 1 && s.len == full[*a] {
                        out.push((*a, p.clone()));
                    } else if !(s.start == 0 && s.len == 1) {
                        // Position 0 alone is always real; any other
                        // slice moves positions or reads padded ones.
                        return Err(refuse("slices the padded axis"));
                    } else if !self.first_is_real() {
                        return Err(refuse(EMPTY_FIRST));
                    }
                }
                out
            }
            Op::Gather { axis } => {
                let indices = &self.rows[args[1].index()];
                match (first.is_empty(), indices.is_empty()) {
                    (true, true) => Rows::new(),
                    (false, false) => {
                        return Err(refuse("gathers padded positions by padded indices"))
                    }
                    // An embedding: the indices' positions pick rows of
                    // the data (assumed finite).
                    (true, false) => (indices.iter())
                        .map(|(i, _)| (axis + i, Pad::Finite))
                        .collect(),
                    (false, true) => {
                        let n = self.shape(args[0])[*axis] as i64;
                        let first_only = match &graph.node(args[1]).op {
                            Op::Constant(t) => t.to_i64_vec().iter().all(|&i| i == 0 || i == -n),
                            _ => false,
                        };
                        let first_is_real = self.first_is_real();
                        let ri = rank(1);
                        each(&|d, _| match d.cmp(axis) {
                            std::cmp::Ordering::Less => Ok(Some(d)),
                            std::cmp::Ordering::Greater => Ok(Some(d - 1 + ri)),
                            std::cmp::Ordering::Equal if first_only && first_is_real => Ok(None),
                            std::cmp::Ordering::Equal if first_only => Err(EMPTY_FIRST.into()),
                            std::cmp::Ordering::Equal => {
                                Err("gathers positions of the padded axis other than the first"
                                    .into())
                            }
                        })?
                    }
                }
            }
            Op::Resize(_) => {
                let from = self.shape(args[0]);
                each(&|a, _| match from[a] == node.ty.shape[a] {
                    true => Ok(Some(a)),
                    false => Err("resamples the padded axis".into()),
                })?
            }
            Op::Fused(_) => return Err(refuse("is a fused kernel, which the trace does not read")),
            Op::NonZero => {
                each(&|_, _| Err("lists the non-zero elements across the padded axis".into()))?
            }
            Op::Unique { .. } => {
                each(&|_, _| Err("compares the slices across the padded axis".into()))?
            }
            Op::NonMaxSuppression(_) => {
                only_first(self, 1)?;
                each(&|_, _| Err("selects boxes across the padded axis".into()))?
            }
            Op::WithLength { .. } => {
                only_first(self, 1)?;
                each(&|a, _| Ok(Some(a)))?
            }
        })
    }

    /// The padded axes of a broadcasting elementwise op, each with the op
    /// applied to its operands' facts.
    fn elementwise(
        &mut self,
        op: &Op,
        dtype: DType,
        args: &[NodeId],
        out_rank: usize,
        refuse: Refuse,
    ) -> Result<Rows, MixesRows> {
        let mut out = Rows::new();
        for a in union(&self.rows, args, out_rank, self.graph) {
            let mut facts = Vec::with_capacity(args.len());
            for (k, &arg) in args.iter().enumerate() {
                let at = (a + self.shape(arg).len()).checked_sub(out_rank);
                facts.push(self.fact(arg, at, k, refuse)?);
            }
            out.push((a, combine(op, &facts, dtype)));
        }
        Ok(out)
    }

    /// The padded axes of a product whose operands' axes play `roles`:
    /// output axes keep the axis (their facts derived); a summed axis is
    /// accepted where its padded positions add nothing (K: one side zero
    /// and the other finite; the keys: masked by the mask, finite keys and
    /// values). `integer`: a sum of integer products, whose zero is the
    /// zero point, is not accepted.
    fn product(
        &mut self,
        operands: &[(NodeId, Vec<Role>)],
        integer: bool,
        refuse: Refuse,
    ) -> Result<Rows, MixesRows> {
        let mut outs: Vec<usize> = Vec::new();
        let mut sums: Vec<Summed> = Vec::new();
        for (arg, roles) in operands {
            for (a, _) in &self.rows[arg.index()] {
                match roles[*a] {
                    Role::Out(o) => outs.push(o),
                    Role::Sum(s) => sums.push(s),
                }
            }
        }
        outs.sort_unstable();
        outs.dedup();
        // Every operand's fact on the axes that play `role`.
        let facts = |this: &mut Self, role: Role| -> Result<Vec<Pad>, MixesRows> {
            let mut facts = Vec::new();
            for (k, (arg, roles)) in operands.iter().enumerate() {
                if let Some(at) = roles.iter().position(|r| *r == role) {
                    facts.push(this.fact(*arg, Some(at), k, refuse)?);
                }
            }
            Ok(facts)
        };
        for sum in [Summed::K, Summed::Keys, Summed::Head] {
            if !sums.contains(&sum) {
                continue;
            }
            let f = facts(self, Role::Sum(sum))?;
            let adds_nothing = match (sum, f.as_slice()) {
                (Summed::K, [a, b]) if !integer => {
                    (a.is_zero() && b.is_finite()) || (b.is_zero() && a.is_finite())
                }
                (Summed::Keys, [keys, values, mask]) => {
                    keys.is_finite() && values.is_finite() && mask.masks()
                }
                _ => false,
            };
            if !adds_nothing {
                let held = (f.iter().map(ToString::to_string))
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(refuse(&match sum {
                    Summed::K => format!(
                        "sums the product over the padded axis, where neither side is zero at padded positions (they hold {held})"
                    ),
                    Summed::Keys => format!(
                        "attends over padded keys that no mask input masks (keys, values, mask hold {held})"
                    ),
                    Summed::Head => "sums the scores over the padded axis of Q and K".into(),
                }));
            }
        }
        let mut out = Rows::new();
        for o in outs {
            let f = facts(self, Role::Out(o))?;
            let joined =
                (f.iter()).fold(None::<Pad>, |j, p| Some(j.map_or(p.clone(), |j| j.join(p))));
            out.push((o, joined.map_or(Pad::Unknown, |p| p.derived())));
        }
        Ok(out)
    }
}

/// The padded axes of `args` in the coordinates of an output of rank
/// `out_rank` (right-aligned broadcasting), increasing.
fn union(rows: &[Rows], args: &[NodeId], out_rank: usize, graph: &Graph) -> Vec<usize> {
    let mut axes: Vec<usize> = (args.iter())
        .flat_map(|arg| {
            let rank = graph.node(*arg).ty.shape.len();
            rows[arg.index()]
                .iter()
                .map(move |(a, _)| a + out_rank - rank)
        })
        .collect();
    axes.sort_unstable();
    axes.dedup();
    axes
}

/// The fact of an elementwise op's output from its operands' facts at the
/// same positions: exact operands are evaluated; otherwise the rules that
/// keep a zero (a product with a finite value) or a mask (adding a finite
/// value, scaling by a positive constant), and finite or unknown.
fn combine(op: &Op, facts: &[Pad], dtype: DType) -> Pad {
    let exact: Option<Vec<&Tensor>> = (facts.iter())
        .map(|f| match f {
            Pad::Exactly(t) => Some(t),
            _ => None,
        })
        .collect();
    if let Some(scalars) = exact {
        return kiln_ir::eval::eval(op, &scalars).map_or(Pad::Unknown, Pad::Exactly);
    }
    let positive = |p: &Pad| p.value().filter(|v| v.is_finite() && *v > 0.0);
    let bound = |p: &Pad| p.bound().unwrap_or(MASKED);
    match (op, facts) {
        (Op::Where, [cond, x, y]) => match cond.value() {
            Some(c) if c != 0.0 => x.clone(),
            Some(_) => y.clone(),
            None => x.join(y),
        },
        (Op::Binary(BinaryOp::Mul), [z, o] | [o, z]) if z.is_zero() && o.is_finite() => {
            Pad::zero(dtype)
        }
        (Op::Binary(BinaryOp::Mul), [m, c] | [c, m]) if m.masks() && positive(c).is_some() => {
            Pad::AtMost(bound(m) * positive(c).unwrap_or(1.0))
        }
        (Op::Binary(BinaryOp::Div), [m, c]) if m.masks() && positive(c).is_some() => {
            Pad::AtMost(bound(m) / positive(c).unwrap_or(1.0))
        }
        (Op::Binary(BinaryOp::Div | BinaryOp::Mod | BinaryOp::Fmod), [_, d]) if d.is_zero() => {
            Pad::Unknown
        }
        (Op::Binary(BinaryOp::Add), [a, b]) if a.masks() && b.masks() => {
            Pad::AtMost(bound(a).max(bound(b)))
        }
        (Op::Binary(BinaryOp::Add), [m, o] | [o, m]) if m.masks() && o.is_finite() => {
            Pad::AtMost(bound(m))
        }
        (Op::Binary(BinaryOp::Sub), [m, o]) if m.masks() && o.is_finite() => Pad::AtMost(bound(m)),
        (Op::Cast { to }, [m]) if to.is_float() && m.masks() => Pad::AtMost(bound(m)),
        _ => match facts.iter().all(Pad::is_finite) {
            true => Pad::Finite,
            false => Pad::Unknown,
        },
    }
}

/// Whether `t`'s slices along `axis` are all equal.
fn rows_equal(t: &Tensor, axis: usize) -> bool {
    let shape = t.shape();
    let bytes = t.data().to_le_bytes();
    let elem = t.dtype().size_bytes();
    let inner: usize = shape[axis + 1..].iter().product::<usize>() * elem;
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    (0..outer).all(|o| {
        let block = &bytes[o * n * inner..(o + 1) * n * inner];
        (1..n).all(|r| block[r * inner..(r + 1) * inner] == block[..inner])
    })
}

/// Whether `small`'s slices along `axis` are the first ones of `large`'s
/// (the other dims equal): both cut from one table indexed by position.
pub fn is_prefix(small: &Tensor, large: &Tensor, axis: usize) -> bool {
    let (s, l) = (small.shape(), large.shape());
    if small.dtype() != large.dtype()
        || s.len() != l.len()
        || axis >= s.len()
        || s[axis] > l[axis]
        || (0..s.len()).any(|i| i != axis && s[i] != l[i])
    {
        return false;
    }
    let elem = small.dtype().size_bytes();
    let inner: usize = s[axis + 1..].iter().product::<usize>() * elem;
    let outer: usize = s[..axis].iter().product();
    let (sb, lb) = (small.data().to_le_bytes(), large.data().to_le_bytes());
    let (sn, ln) = (s[axis] * inner, l[axis] * inner);
    (0..outer).all(|o| sb[o * sn..(o + 1) * sn] == lb[o * ln..o * ln + sn])
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{BinaryOp, DType, Data, ReduceOp, UnaryOp, ValueType};

    /// `x: f32[4, 3]` (padded along axis 0) into a graph; `build` adds the
    /// rest and returns the output.
    fn traced(build: impl FnOnce(&mut Graph, NodeId) -> NodeId) -> Result<Traced, MixesRows> {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
        let y = build(&mut g, x);
        g.add_output("y", y);
        trace_rows(&g, &[Some(0)], &[], &[])
    }

    fn outputs(t: Result<Traced, MixesRows>) -> Result<Vec<RowAxis>, MixesRows> {
        t.map(|t| t.outputs)
    }

    fn constant(g: &mut Graph, shape: &[usize], v: Vec<f32>) -> NodeId {
        g.add_const("w", Tensor::new(shape, Data::F32(v)).unwrap())
    }

    fn node(g: &mut Graph, op: Op, args: &[NodeId], name: &str) -> NodeId {
        g.add_node(op, args, name).unwrap()
    }

    fn transpose(perm: &[usize]) -> Op {
        Op::Transpose {
            perm: perm.to_vec().into(),
        }
    }

    #[test]
    fn per_row_ops_keep_the_axis_and_follow_transposes() {
        let out = traced(|g, x| {
            let w = constant(g, &[3, 5], vec![0.5; 15]);
            let m = node(g, Op::MatMul, &[x, w], "fc");
            let r = node(g, Op::Unary(UnaryOp::Relu), &[m], "relu");
            let s = node(g, Op::Softmax { axis: 1 }, &[r], "sm");
            node(g, transpose(&[1, 0]), &[s], "t")
        });
        assert_eq!(outputs(out), Ok(vec![Some(1)]));
    }

    #[test]
    fn ops_that_read_the_padded_positions_are_refused_by_node() {
        // The padding is zeros: a mean divides by the padded length.
        let mean = traced(|g, x| {
            let op = Op::Reduce {
                op: ReduceOp::Mean,
                axes: vec![0].into(),
                keep_dims: true,
            };
            node(g, op, &[x], "mean")
        });
        let e = mean.unwrap_err();
        assert_eq!(e.node, "mean");
        assert!(e.why.contains("reduce_mean"), "{e}");
        // exp(0) = 1 at the padded rows: their sum is not 0.
        let sum_exp = traced(|g, x| {
            let e = node(g, Op::Unary(UnaryOp::Exp), &[x], "exp");
            let op = Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![0].into(),
                keep_dims: false,
            };
            node(g, op, &[e], "total")
        });
        assert_eq!(sum_exp.unwrap_err().node, "total");
        // Zeros are not masked: a softmax over them gives them weight.
        let softmax = traced(|g, x| node(g, Op::Softmax { axis: 0 }, &[x], "sm0"));
        assert!(softmax.unwrap_err().why.contains("not masked"));
        // exp(x)ᵀ @ exp(x) sums ones over the padded rows.
        let gram = traced(|g, x| {
            let e = node(g, Op::Unary(UnaryOp::Exp), &[x], "exp");
            let t = node(g, transpose(&[1, 0]), &[e], "t");
            node(g, Op::MatMul, &[t, e], "gram")
        });
        assert_eq!(gram.unwrap_err().node, "gram");
        // [4, 3] -> [2, 6] moves rows into columns.
        let reshape = traced(|g, x| {
            let op = Op::Reshape {
                shape: vec![2, 6].into(),
            };
            node(g, op, &[x], "fold")
        });
        assert_eq!(reshape.unwrap_err().node, "fold");
    }

    #[test]
    fn sums_of_zero_padded_values_are_accepted() {
        // xᵀ @ x and a sum over the rows: the padded rows add zeros.
        let gram = traced(|g, x| {
            let t = node(g, transpose(&[1, 0]), &[x], "t");
            let m = node(g, Op::MatMul, &[t, x], "gram");
            let op = Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![0].into(),
                keep_dims: false,
            };
            let s = node(g, op, &[x], "total");
            node(g, Op::Binary(BinaryOp::Add), &[m, s], "both")
        });
        assert_eq!(outputs(gram), Ok(vec![None]));
    }

    #[test]
    fn constants_that_differ_along_the_rows_are_positional() {
        let differ = traced(|g, x| {
            let c = constant(g, &[4, 3], (0..12).map(|v| v as f32).collect());
            node(g, Op::Binary(BinaryOp::Add), &[x, c], "add")
        })
        .unwrap();
        assert_eq!(differ.outputs, vec![Some(0)]);
        assert_eq!(differ.positional.len(), 1);
        assert_eq!(differ.positional[0].axis, 0);
        let equal = traced(|g, x| {
            let c = constant(g, &[4, 3], [1.0, 2.0, 3.0].repeat(4));
            node(g, Op::Binary(BinaryOp::Add), &[x, c], "add")
        })
        .unwrap();
        assert_eq!((equal.outputs, equal.positional), (vec![Some(0)], vec![]));
        // A computed value of its own rows is not from the padded ones.
        let computed = traced(|g, x| {
            let c = constant(g, &[4, 3], (0..12).map(|v| v as f32).collect());
            let e = node(g, Op::Unary(UnaryOp::Exp), &[c], "other");
            node(g, Op::Binary(BinaryOp::Add), &[x, e], "add")
        });
        assert_eq!(computed.unwrap_err().node, "add");
    }

    #[test]
    fn a_class_token_broadcast_to_the_batch_joins_it() {
        // ViT: concat(expand(cls [1, 1, 3] -> [4, 1, 3]), x [4, 5, 3]).
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 5, 3]));
        let cls = constant(&mut g, &[1, 1, 3], vec![1.0, 2.0, 3.0]);
        let op = Op::Expand {
            shape: vec![4, 1, 3].into(),
        };
        let tokens = node(&mut g, op, &[cls], "expand");
        let joined = node(&mut g, Op::Concat { axis: 1 }, &[tokens, x], "concat");
        g.add_output("y", joined);
        assert_eq!(
            outputs(trace_rows(&g, &[Some(0)], &[], &[])),
            Ok(vec![Some(0)])
        );
    }

    #[test]
    fn gathered_rows_follow_the_indices() {
        // An embedding lookup: table [10, 3] gathered by x-shaped indices.
        let mut g = Graph::new();
        let ids = g.add_input("ids", ValueType::new(DType::I64, [4, 7]));
        let table = constant(&mut g, &[10, 3], vec![0.0; 30]);
        let e = node(&mut g, Op::Gather { axis: 0 }, &[table, ids], "embed");
        g.add_output("e", e);
        assert_eq!(
            outputs(trace_rows(&g, &[Some(0)], &[], &[])),
            Ok(vec![Some(0)])
        );
        // Gathering position 2 may read padding; position 0 is real.
        for (index, refused) in [(2, true), (0, false)] {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
            let i = g.add_const("i", Tensor::new([1], Data::I64(vec![index])).unwrap());
            let p = node(&mut g, Op::Gather { axis: 0 }, &[x, i], "pick");
            g.add_output("p", p);
            let traced = trace_rows(&g, &[Some(0)], &[], &[]);
            assert_eq!(traced.is_err(), refused, "{traced:?}");
        }
    }

    /// A value of data-dependent size (a source inside the graph) is
    /// traced like a padded input, except that its position 0 may not
    /// exist: reading it alone is refused, and a sum over zero padding is
    /// exact.
    #[test]
    fn sources_inside_the_graph_may_be_empty() {
        let zero = || Pad::Exactly(Tensor::new([], Data::F32(vec![0.0])).unwrap());
        for (op, index, refused) in [
            (Op::Unary(UnaryOp::Relu), None, false),
            (Op::Gather { axis: 0 }, Some(0), true),
            (
                Op::Reduce {
                    op: ReduceOp::Sum,
                    axes: [0].into_iter().collect(),
                    keep_dims: false,
                },
                None,
                false,
            ),
            (
                Op::Reduce {
                    op: ReduceOp::Mean,
                    axes: [0].into_iter().collect(),
                    keep_dims: false,
                },
                None,
                true,
            ),
        ] {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
            let r = node(&mut g, Op::Unary(UnaryOp::Relu), &[x], "source");
            let mut args = vec![r];
            if let Some(i) = index {
                args.push(g.add_const("i", Tensor::new([1], Data::I64(vec![i])).unwrap()));
            }
            let y = node(&mut g, op.clone(), &args, "y");
            g.add_output("y", y);
            let source = Source {
                node: r,
                axis: 0,
                pad: zero(),
            };
            let traced = trace_rows(&g, &[None], &[], &[source]);
            assert_eq!(traced.is_err(), refused, "{op:?}: {traced:?}");
            if let Err(e) = traced {
                assert!(e.node == "y", "{e}");
            }
        }
    }

    /// A one-head encoder layer over `x: f32[1, 6, 8]` padded along the
    /// sequence (axis 1) with `mask: i64[1, 6]`: scores `x @ xᵀ / 2`, the
    /// additive mask `(1 - mask) * -3.4e38` when `masked`, softmax over
    /// the keys, `@ x`; outputs the tokens and their mean over the mask
    /// (`sum(t * mask) / sum(mask)`, or `reduce_mean` when `mean`).
    fn encoder(masked: bool, mean: bool, scores_out: bool) -> Result<Traced, MixesRows> {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [1, 6, 8]));
        let mask = g.add_input("mask", ValueType::new(DType::I64, [1, 6]));
        let xt = node(&mut g, transpose(&[0, 2, 1]), &[x], "xt");
        let qk = node(&mut g, Op::MatMul, &[x, xt], "qk");
        let two = g.add_const("two", Tensor::scalar_f32(2.0));
        let mut scores = node(&mut g, Op::Binary(BinaryOp::Div), &[qk, two], "scaled");
        let reshape = |shape: &[usize]| Op::Reshape {
            shape: shape.to_vec().into(),
        };
        let m3 = node(&mut g, reshape(&[1, 1, 6]), &[mask], "m3");
        let mf = node(&mut g, Op::Cast { to: DType::F32 }, &[m3], "mf");
        if masked {
            let one = g.add_const("one", Tensor::scalar_f32(1.0));
            let low = g.add_const("low", Tensor::scalar_f32(f32::MIN));
            let inv = node(&mut g, Op::Binary(BinaryOp::Sub), &[one, mf], "inv");
            let bias = node(&mut g, Op::Binary(BinaryOp::Mul), &[inv, low], "bias");
            scores = node(&mut g, Op::Binary(BinaryOp::Add), &[scores, bias], "masked");
        }
        let p = node(&mut g, Op::Softmax { axis: 2 }, &[scores], "softmax");
        let t = node(&mut g, Op::MatMul, &[p, x], "av");
        let m31 = node(&mut g, reshape(&[1, 6, 1]), &[mask], "m31");
        let m31 = node(&mut g, Op::Cast { to: DType::F32 }, &[m31], "m31f");
        let kept = node(&mut g, Op::Binary(BinaryOp::Mul), &[t, m31], "kept");
        let reduce = |op| Op::Reduce {
            op,
            axes: vec![1].into(),
            keep_dims: false,
        };
        let pooled = if mean {
            node(&mut g, reduce(ReduceOp::Mean), &[kept], "pool")
        } else {
            let sum = node(&mut g, reduce(ReduceOp::Sum), &[kept], "sum");
            let count = node(&mut g, reduce(ReduceOp::Sum), &[m31], "count");
            node(&mut g, Op::Binary(BinaryOp::Div), &[sum, count], "pool")
        };
        g.add_output("tokens", t);
        g.add_output("pooled", pooled);
        if scores_out {
            g.add_output("scores", scores);
        }
        trace_rows(&g, &[Some(1), Some(1)], &[], &[])
    }

    #[test]
    fn a_masked_sequence_pads_and_pools() {
        let proof = encoder(true, false, false).unwrap();
        assert_eq!(proof.outputs, vec![Some(1), None]);
        assert!(proof.positional.is_empty());
    }

    #[test]
    fn a_sequence_without_its_mask_or_with_a_mean_is_refused() {
        let e = encoder(false, false, false).unwrap_err();
        assert_eq!(e.node, "softmax");
        assert!(e.why.contains("not masked"), "{e}");
        assert_eq!(encoder(true, true, false).unwrap_err().node, "pool");
        // The scores have the sequence on two axes: no cut returns them.
        let e = encoder(true, false, true).unwrap_err();
        assert_eq!((e.node.as_str(), e.op.as_str()), ("scores", "output"));
    }

    #[test]
    fn the_first_position_alone_is_real() {
        // x: [2, 5, 3] padded along axis 1, sliced at `start` for one
        // position along it.
        let slice_at = |start: usize| {
            let mut g = Graph::new();
            let x = g.add_input("x", ValueType::new(DType::F32, [2, 5, 3]));
            let axes = [(0, 2), (start, 1), (0, 3)].map(|(start, len)| kiln_ir::SliceAxis {
                start,
                step: 1,
                len,
            });
            let op = Op::Slice {
                axes: axes.into_iter().collect(),
            };
            let token = node(&mut g, op, &[x], "token");
            g.add_output("token", token);
            trace_rows(&g, &[Some(1)], &[], &[])
        };
        // BERT's pooler reads token 0: always a real position.
        assert_eq!(outputs(slice_at(0)), Ok(vec![None]));
        // The last position depends on the real length.
        assert_eq!(slice_at(4).unwrap_err().node, "token");
    }

    #[test]
    fn prefixes_are_checked_along_the_axis() {
        let t = |rows: usize, f: &dyn Fn(usize) -> f32| {
            let v = (0..rows * 2).map(|i| f(i / 2) + (i % 2) as f32).collect();
            Tensor::new([rows, 2], Data::F32(v)).unwrap()
        };
        let table = |r: usize| r as f32 * 10.0;
        assert!(is_prefix(&t(3, &table), &t(5, &table), 0));
        // Normalized by the length: not one table.
        let (short, long) = (t(3, &|r| r as f32 / 3.0), t(5, &|r| r as f32 / 5.0));
        assert!(!is_prefix(&short, &long, 0));
        assert!(!is_prefix(&t(5, &table), &t(3, &table), 0));
    }
}
