//! Tree ensembles of `ai.onnx.ml`: `TreeEnsemble` (opset 5) and
//! `TreeEnsembleRegressor` (opsets 1 and 3, what scikit-learn, LightGBM
//! and XGBoost converters emit for regressors).
//!
//! Both are read into one [`Forest`]: interior nodes `0..n` and leaves
//! `n..n + leaves` in one index space, a leaf's successors being itself.
//! The ensemble then runs as data, not as branches: the current node of
//! every (sample, tree) pair is an `[N, T]` index tensor, and each of the
//! `depth` levels gathers the node's feature, threshold and mode, compares
//! and picks the true or false successor with a `where`. After `depth`
//! levels every pair sits on a leaf; a `[leaves, targets]` matrix of leaf
//! weights is gathered and reduced over the trees. Every step is an
//! ordinary IR op, so the ensemble compiles for every target.

use super::build::{cast_to, reshape_to, scalar};
use super::one;
use crate::ctx::{ImportCtx, Val};
use crate::OnnxError;
use kiln_ir::{BinaryOp, CompareOp, DType, Data, LogicalOp, Op, ReduceOp, Tensor, UnaryOp};
use tract_onnx::pb::NodeProto;

type R = Result<Vec<Val>, OnnxError>;

/// Most levels a forest may have (a tree deeper than this is almost
/// certainly a malformed file: each level is a handful of kernels).
const MAX_DEPTH: usize = 4096;

/// How a node compares its feature `x` with its split value `v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Branch {
    /// `x <= v`
    Leq,
    /// `x < v`
    Lt,
    /// `x >= v`
    Gte,
    /// `x > v`
    Gt,
    /// `x == v`
    Eq,
    /// `x != v`
    Neq,
    /// `x` is one of the node's members.
    Member,
}

impl Branch {
    fn compare(self) -> Option<(CompareOp, bool)> {
        Some(match self {
            Branch::Leq => (CompareOp::LessOrEqual, false),
            Branch::Lt => (CompareOp::Less, false),
            Branch::Gte => (CompareOp::GreaterOrEqual, false),
            Branch::Gt => (CompareOp::Greater, false),
            Branch::Eq => (CompareOp::Equal, false),
            Branch::Neq => (CompareOp::Equal, true),
            Branch::Member => return None,
        })
    }
}

/// How the trees' values for one target combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Aggregate {
    Average,
    Sum,
    Min,
    Max,
}

/// What is applied to the aggregated scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PostTransform {
    None,
    Softmax,
    Logistic,
}

/// A tree ensemble in one index space (see the module docs).
struct Forest {
    /// Interior nodes (indices `0..interior`).
    interior: usize,
    /// Per interior node: feature, split value, comparison, whether a NaN
    /// feature takes the true branch, set members (`Branch::Member`).
    feature: Vec<usize>,
    split: Vec<f64>,
    branch: Vec<Branch>,
    missing_true: Vec<bool>,
    members: Vec<Vec<f64>>,
    /// Per node and leaf: the successor on true and on false (a leaf's is
    /// itself).
    on_true: Vec<usize>,
    on_false: Vec<usize>,
    /// Each tree's root.
    roots: Vec<usize>,
    /// Per leaf: the `(target, weight)` pairs it adds.
    leaves: Vec<Vec<(usize, f64)>>,
    targets: usize,
}

impl Forest {
    /// The most interior nodes on a path from a root to a leaf; an
    /// error for a cycle or a successor out of range.
    fn depth(&self, ctx: &ImportCtx) -> Result<usize, OnnxError> {
        let total = self.interior + self.leaves.len();
        // 0: unvisited, 1: on the current path, 2: done (depth known).
        let mut state = vec![0u8; total];
        let mut depth = vec![0usize; total];
        for &root in &self.roots {
            let mut stack = vec![(root, false)];
            while let Some((node, expanded)) = stack.pop() {
                if node >= self.interior {
                    state[node] = 2;
                    continue;
                }
                let children = [self.on_true[node], self.on_false[node]];
                if expanded {
                    depth[node] = 1 + children.iter().map(|&c| depth[c]).max().unwrap_or(0);
                    state[node] = 2;
                    continue;
                }
                match state[node] {
                    2 => continue,
                    1 => return Err(ctx.invalid(format!("node {node} is its own descendant"))),
                    _ => {}
                }
                state[node] = 1;
                stack.push((node, true));
                for c in children {
                    if c >= total {
                        return Err(ctx.invalid(format!(
                            "node {node} branches to {c}, past the {total} nodes and leaves"
                        )));
                    }
                    if state[c] == 1 {
                        return Err(ctx.invalid(format!("node {c} is its own descendant")));
                    }
                    if state[c] == 0 {
                        stack.push((c, false));
                    }
                }
            }
        }
        let d = self.roots.iter().map(|&r| depth[r]).max().unwrap_or(0);
        if d > MAX_DEPTH {
            return Err(ctx.invalid(format!("a tree is {d} levels deep (at most {MAX_DEPTH})")));
        }
        Ok(d)
    }
}

/// A constant of X's element type `dt` (charged by [`reserve_tables`]).
fn float_const(
    ctx: &mut ImportCtx,
    dt: DType,
    shape: &[usize],
    v: Vec<f64>,
    name: &str,
) -> Result<Val, OnnxError> {
    let t = Tensor::new(shape, Data::from_f64s(dt, v.into_iter())).expect("sized");
    Ok(ctx.constant(t, name))
}

/// An i64 constant (charged by [`reserve_tables`]).
fn index_const(
    ctx: &mut ImportCtx,
    shape: &[usize],
    v: Vec<i64>,
    name: &str,
) -> Result<Val, OnnxError> {
    let t = Tensor::new(shape, Data::I64(v)).expect("sized");
    Ok(ctx.constant(t, name))
}

/// Charges the constants [`evaluate`] builds against the import's
/// generated-constant budget before any is allocated: a malformed file
/// can ask for a member table of `nodes × widest set` or a leaf matrix of
/// `leaves × n_targets` far beyond its own size (and X's rows are a
/// shape, not data the file holds).
fn reserve_tables(
    ctx: &mut ImportCtx,
    rows: usize,
    total: usize,
    member_width: usize,
    leaves: usize,
    targets: usize,
) -> Result<(), OnnxError> {
    let bytes = [
        (total, 6),
        (total, member_width),
        (leaves, targets),
        (rows, 1),
    ]
    .into_iter()
    .try_fold(0usize, |sum, (a, b)| {
        a.checked_mul(b)?.checked_mul(8)?.checked_add(sum)
    });
    match bytes {
        Some(b) => ctx.charge_generated(b as u64),
        None => Err(ctx.invalid(format!(
            "{total} nodes with sets of up to {member_width} members and {leaves} leaves of {targets} targets overflow the address space"
        ))),
    }
}

/// The `[N, targets]` scores of `forest` on `x` (`[N, F]`, float type
/// `dt`); targets no tree reaches get `unreached` under Min/Max.
fn evaluate(
    ctx: &mut ImportCtx,
    x: Val,
    forest: &Forest,
    aggregate: Aggregate,
    unreached: f64,
) -> Result<Val, OnnxError> {
    let xt = ctx.ty(x).clone();
    let dt = xt.dtype;
    let (rows, features) = match xt.shape.as_slice() {
        &[n, f] => (n, f),
        _ => return Err(ctx.invalid(format!("X must be [N, features], got {xt}"))),
    };
    if let Some(&f) = forest.feature.iter().find(|&&f| f >= features) {
        return Err(ctx.invalid(format!("a node reads feature {f} of X {xt}")));
    }
    let depth = forest.depth(ctx)?;
    let trees = forest.roots.len();
    let total = forest.interior + forest.leaves.len();
    let pad = |v: &[usize]| -> Vec<i64> { v.iter().map(|&i| i as i64).collect() };
    let feature = {
        let mut f = pad(&forest.feature);
        f.resize(total, 0);
        index_const(ctx, &[total], f, "feature")?
    };
    let split = {
        let mut s = forest.split.clone();
        s.resize(total, 0.0);
        float_const(ctx, dt, &[total], s, "split")?
    };
    let on_true = index_const(ctx, &[total], pad(&forest.on_true), "true_successor")?;
    let on_false = index_const(ctx, &[total], pad(&forest.on_false), "false_successor")?;
    let mut kinds: Vec<Branch> = forest.branch.clone();
    kinds.sort();
    kinds.dedup();
    let branch = if kinds.len() > 1 {
        let mut b: Vec<i64> = forest.branch.iter().map(|&b| b as i64).collect();
        b.resize(total, 0);
        Some(index_const(ctx, &[total], b, "branch")?)
    } else {
        None
    };
    let missing = if forest.missing_true.iter().any(|&m| m) {
        let mut m = forest.missing_true.clone();
        m.resize(total, false);
        let t = Tensor::new([total], Data::Bool(m)).expect("sized");
        Some(ctx.generated_constant(t, "missing_tracks_true")?)
    } else {
        None
    };
    let width = forest
        .members
        .iter()
        .map(Vec::len)
        .max()
        .unwrap_or(0)
        .max(1);
    let member_width = if kinds.contains(&Branch::Member) {
        width
    } else {
        0
    };
    reserve_tables(
        ctx,
        rows,
        total,
        member_width,
        forest.leaves.len(),
        forest.targets,
    )?;
    let members = if member_width > 0 {
        let mut table = vec![f64::NAN; total * width];
        for (i, m) in forest.members.iter().enumerate() {
            table[i * width..i * width + m.len()].copy_from_slice(m);
        }
        Some(float_const(ctx, dt, &[total, width], table, "members")?)
    } else {
        None
    };
    let x_flat = reshape_to(ctx, x, &[xt.num_elements()], Some("x_flat"))?;
    let starts = (0..rows).map(|n| (n * features) as i64).collect();
    let row_start = index_const(ctx, &[rows, 1], starts, "row_start")?;
    // Every row starts at the roots: one row of them, broadcast.
    let roots = index_const(ctx, &[1, trees], pad(&forest.roots), "roots")?;
    let mut at = ctx.op(
        Op::Expand {
            shape: [rows, trees].into_iter().collect(),
        },
        &[roots],
        Some("start"),
    )?;
    let gather = |ctx: &mut ImportCtx, table: Val, at: Val, tag: &str| {
        ctx.op(Op::Gather { axis: 0 }, &[table, at], Some(tag))
    };
    let member_zero = members.map(|_| scalar(ctx, DType::F32, 0.0, "member_zero"));
    for level in 0..depth {
        let tag = |s: &str| format!("level{level}_{s}");
        let f = gather(ctx, feature, at, &tag("feature"))?;
        // X[n, f[n, t]] as a flat gather: row n starts at n · features.
        let flat = ctx.op(
            Op::Binary(BinaryOp::Add),
            &[row_start, f],
            Some(&tag("x_index")),
        )?;
        let xv = ctx.op(Op::Gather { axis: 0 }, &[x_flat, flat], Some(&tag("x")))?;
        let v = gather(ctx, split, at, &tag("split"))?;
        let b = match branch {
            Some(table) => Some(gather(ctx, table, at, &tag("branch"))?),
            None => None,
        };
        let mut decision: Option<Val> = None;
        for &kind in &kinds {
            let taken = match kind.compare() {
                Some((op, negate)) => {
                    let c = ctx.op(Op::Compare(op), &[xv, v], Some(&tag("compare")))?;
                    if negate {
                        ctx.op(Op::Not, &[c], Some(&tag("not_equal")))?
                    } else {
                        c
                    }
                }
                None => {
                    let table = members.expect("member table");
                    let m = gather(ctx, table, at, &tag("members"))?;
                    let x3 = reshape_to(ctx, xv, &[rows, trees, 1], Some(&tag("x_column")))?;
                    let hit = ctx.op(
                        Op::Compare(CompareOp::Equal),
                        &[x3, m],
                        Some(&tag("member_hit")),
                    )?;
                    let hit = cast_to(ctx, hit, DType::F32, &tag("member_hit_f32"))?;
                    let any = ctx.op(
                        Op::Reduce {
                            op: ReduceOp::Max,
                            axes: [2].into_iter().collect(),
                            keep_dims: false,
                        },
                        &[hit],
                        Some(&tag("member_any")),
                    )?;
                    let zero = member_zero.expect("made with the member table");
                    ctx.op(
                        Op::Compare(CompareOp::Greater),
                        &[any, zero],
                        Some(&tag("member")),
                    )?
                }
            };
            decision = Some(match (decision, b) {
                (None, _) => taken,
                (Some(prev), Some(b)) => {
                    let k = index_const(ctx, &[], vec![kind as i64], &tag("branch_kind"))?;
                    let is = ctx.op(
                        Op::Compare(CompareOp::Equal),
                        &[b, k],
                        Some(&tag("is_kind")),
                    )?;
                    ctx.op(Op::Where, &[is, taken, prev], Some(&tag("by_kind")))?
                }
                (Some(_), None) => unreachable!("one kind without a table"),
            });
        }
        let mut decision = decision.expect("a forest with interior nodes has a branch kind");
        if let Some(table) = missing {
            let same = ctx.op(
                Op::Compare(CompareOp::Equal),
                &[xv, xv],
                Some(&tag("x_is_number")),
            )?;
            let nan = ctx.op(Op::Not, &[same], Some(&tag("x_is_nan")))?;
            let tracks = gather(ctx, table, at, &tag("missing_tracks_true"))?;
            let to_true = ctx.op(
                Op::Logical(LogicalOp::And),
                &[nan, tracks],
                Some(&tag("missing")),
            )?;
            decision = ctx.op(
                Op::Logical(LogicalOp::Or),
                &[decision, to_true],
                Some(&tag("decision")),
            )?;
        }
        let t = gather(ctx, on_true, at, &tag("true"))?;
        let f = gather(ctx, on_false, at, &tag("false"))?;
        at = ctx.op(Op::Where, &[decision, t, f], Some(&tag("next")))?;
    }
    // Every (sample, tree) is on a leaf: its row of the leaf matrix.
    let fill = match aggregate {
        Aggregate::Sum | Aggregate::Average => 0.0,
        Aggregate::Min => f64::INFINITY,
        Aggregate::Max => f64::NEG_INFINITY,
    };
    let targets = forest.targets;
    let mut matrix = vec![fill; forest.leaves.len() * targets];
    for (leaf, adds) in forest.leaves.iter().enumerate() {
        for &(target, weight) in adds {
            let cell = &mut matrix[leaf * targets + target];
            *cell = match aggregate {
                Aggregate::Sum | Aggregate::Average => *cell + weight,
                Aggregate::Min => cell.min(weight),
                Aggregate::Max => cell.max(weight),
            };
        }
    }
    let matrix = float_const(
        ctx,
        dt,
        &[forest.leaves.len(), targets],
        matrix,
        "leaf_weights",
    )?;
    let first_leaf = index_const(ctx, &[], vec![forest.interior as i64], "first_leaf")?;
    let leaf = ctx.op(Op::Binary(BinaryOp::Sub), &[at, first_leaf], Some("leaf"))?;
    let values = gather(ctx, matrix, leaf, "leaf_values")?;
    let reduce = match aggregate {
        Aggregate::Sum | Aggregate::Average => ReduceOp::Sum,
        Aggregate::Min => ReduceOp::Min,
        Aggregate::Max => ReduceOp::Max,
    };
    let mut y = ctx.op(
        Op::Reduce {
            op: reduce,
            axes: [1].into_iter().collect(),
            keep_dims: false,
        },
        &[values],
        Some("aggregated"),
    )?;
    match aggregate {
        Aggregate::Average => {
            let n = scalar(ctx, dt, trees as f64, "trees");
            y = ctx.op(Op::Binary(BinaryOp::Div), &[y, n], Some("average"))?;
        }
        Aggregate::Min | Aggregate::Max => {
            // A target no tree reached keeps the fill.
            let f = scalar(ctx, dt, fill, "unreached_fill");
            let none = ctx.op(Op::Compare(CompareOp::Equal), &[y, f], Some("unreached"))?;
            let u = scalar(ctx, dt, unreached, "unreached_value");
            y = ctx.op(Op::Where, &[none, u, y], Some("reached"))?;
        }
        Aggregate::Sum => {}
    }
    Ok(y)
}

fn post_transform(ctx: &mut ImportCtx, y: Val, post: PostTransform) -> Result<Val, OnnxError> {
    match post {
        PostTransform::None => Ok(y),
        PostTransform::Logistic => ctx.op(Op::Unary(UnaryOp::Sigmoid), &[y], None),
        PostTransform::Softmax => ctx.op(Op::Softmax { axis: 1 }, &[y], None),
    }
}

/// The ints attribute `name` (required) as indices below `bound`.
fn indices(
    ctx: &ImportCtx,
    node: &NodeProto,
    name: &str,
    bound: Option<usize>,
) -> Result<Vec<usize>, OnnxError> {
    let v = ctx
        .attr_ints(node, name)?
        .ok_or_else(|| ctx.bad_attr(name, "is required"))?;
    v.iter()
        .map(|&i| match usize::try_from(i) {
            Ok(u) if bound.is_none_or(|b| u < b) => Ok(u),
            _ => Err(ctx.bad_attr(name, format!("index {i} is out of range"))),
        })
        .collect()
}

/// A float list given as `name` (floats) or `name_as_tensor` (a tensor).
fn floats(ctx: &ImportCtx, node: &NodeProto, name: &str) -> Result<Option<Vec<f64>>, OnnxError> {
    if let Some(t) = ctx.attr_t(node, &format!("{name}_as_tensor"))? {
        let t = ctx.tensor(t, name)?;
        return Ok(Some((0..t.len()).map(|i| t.data().get_f64(i)).collect()));
    }
    Ok(ctx
        .attr_floats(node, name)?
        .map(|v| v.into_iter().map(f64::from).collect()))
}

/// `nodes_missing_value_tracks_true` (absent: false for each of the `n`
/// nodes).
fn missing_tracks_true(
    ctx: &ImportCtx,
    node: &NodeProto,
    n: usize,
) -> Result<Vec<bool>, OnnxError> {
    Ok(
        match ctx.attr_ints(node, "nodes_missing_value_tracks_true")? {
            Some(v) => v.iter().map(|&m| m != 0).collect(),
            None => vec![false; n],
        },
    )
}

/// A tensor attribute's values as f64 (required).
fn tensor_values(ctx: &ImportCtx, node: &NodeProto, name: &str) -> Result<Vec<f64>, OnnxError> {
    let t = ctx
        .attr_t(node, name)?
        .ok_or_else(|| ctx.bad_attr(name, "is required"))?;
    let t = ctx.tensor(t, name)?;
    Ok((0..t.len()).map(|i| t.data().get_f64(i)).collect())
}

fn same_len(ctx: &ImportCtx, what: &str, lens: &[(&str, usize)]) -> Result<(), OnnxError> {
    let n = lens[0].1;
    if let Some((name, len)) = lens.iter().find(|(_, l)| *l != n) {
        return Err(ctx.invalid(format!(
            "{what}: {name} has {len} entries, {} has {n}",
            lens[0].0
        )));
    }
    Ok(())
}

/// `TreeEnsemble` (ai.onnx.ml opset 5). The output is `[N, n_targets]`
/// in X's type. Set members are listed in the order of the member nodes,
/// each set ended by a NaN.
pub fn tree_ensemble(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let dt = ctx.ty(x).dtype;
    if !dt.is_float() {
        return Err(ctx.invalid(format!("X must be float, got {}", ctx.ty(x))));
    }
    let modes = tensor_values(ctx, node, "nodes_modes")?;
    let interior = modes.len();
    let leaf_weights = tensor_values(ctx, node, "leaf_weights")?;
    let leaf_count = leaf_weights.len();
    let targets = ctx
        .attr_i(node, "n_targets")?
        .ok_or_else(|| ctx.bad_attr("n_targets", "is required"))?;
    let targets = usize::try_from(targets)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| ctx.bad_attr("n_targets", format!("must be positive, got {targets}")))?;
    let leaf_targets = indices(ctx, node, "leaf_targetids", Some(targets))?;
    let feature = indices(ctx, node, "nodes_featureids", None)?;
    let split = match ctx.attr_t(node, "nodes_splits")? {
        Some(_) => tensor_values(ctx, node, "nodes_splits")?,
        None => return Err(ctx.bad_attr("nodes_splits", "is required")),
    };
    let true_ids = indices(ctx, node, "nodes_truenodeids", None)?;
    let false_ids = indices(ctx, node, "nodes_falsenodeids", None)?;
    let true_leafs = indices(ctx, node, "nodes_trueleafs", Some(2))?;
    let false_leafs = indices(ctx, node, "nodes_falseleafs", Some(2))?;
    let roots = indices(ctx, node, "tree_roots", Some(interior))?;
    let missing = missing_tracks_true(ctx, node, interior)?;
    same_len(
        ctx,
        "nodes",
        &[
            ("nodes_modes", interior),
            ("nodes_featureids", feature.len()),
            ("nodes_splits", split.len()),
            ("nodes_truenodeids", true_ids.len()),
            ("nodes_falsenodeids", false_ids.len()),
            ("nodes_trueleafs", true_leafs.len()),
            ("nodes_falseleafs", false_leafs.len()),
            ("nodes_missing_value_tracks_true", missing.len()),
        ],
    )?;
    same_len(
        ctx,
        "leaves",
        &[
            ("leaf_weights", leaf_count),
            ("leaf_targetids", leaf_targets.len()),
        ],
    )?;
    let branch: Vec<Branch> = modes
        .iter()
        .map(|&m| match m as i64 {
            0 => Ok(Branch::Leq),
            1 => Ok(Branch::Lt),
            2 => Ok(Branch::Gte),
            3 => Ok(Branch::Gt),
            4 => Ok(Branch::Eq),
            5 => Ok(Branch::Neq),
            6 => Ok(Branch::Member),
            other => Err(ctx.bad_attr("nodes_modes", format!("unknown mode {other}"))),
        })
        .collect::<Result<_, _>>()?;
    let mut members = vec![Vec::new(); interior];
    let member_nodes: Vec<usize> = (0..interior)
        .filter(|&i| branch[i] == Branch::Member)
        .collect();
    if !member_nodes.is_empty() {
        let values = match ctx.attr_t(node, "membership_values")? {
            Some(_) => tensor_values(ctx, node, "membership_values")?,
            None => {
                return Err(ctx.bad_attr("membership_values", "is required by BRANCH_MEMBER nodes"))
            }
        };
        let sets: Vec<&[f64]> = values.split(|v| v.is_nan()).collect();
        // The list ends with a NaN, so splitting leaves one empty tail.
        if sets.len() != member_nodes.len() + 1 || !sets[member_nodes.len()].is_empty() {
            return Err(ctx.bad_attr(
                "membership_values",
                format!(
                    "holds {} NaN-ended sets for {} member nodes",
                    sets.len() - 1,
                    member_nodes.len()
                ),
            ));
        }
        for (&n, set) in member_nodes.iter().zip(sets) {
            members[n] = set.to_vec();
        }
    }
    let successor = |id: usize, leaf: usize| if leaf == 1 { interior + id } else { id };
    let total = interior + leaf_count;
    let mut on_true: Vec<usize> = (0..interior)
        .map(|i| successor(true_ids[i], true_leafs[i]))
        .collect();
    let mut on_false: Vec<usize> = (0..interior)
        .map(|i| successor(false_ids[i], false_leafs[i]))
        .collect();
    on_true.extend(interior..total);
    on_false.extend(interior..total);
    let aggregate = match ctx.attr_i_or(node, "aggregate_function", 1)? {
        0 => Aggregate::Average,
        1 => Aggregate::Sum,
        2 => Aggregate::Min,
        3 => Aggregate::Max,
        other => {
            return Err(ctx.bad_attr("aggregate_function", format!("unknown function {other}")))
        }
    };
    let post = match ctx.attr_i_or(node, "post_transform", 0)? {
        0 => PostTransform::None,
        1 => PostTransform::Softmax,
        2 => PostTransform::Logistic,
        other => {
            return Err(ctx.unsupported(format!(
                "post_transform {other} (SOFTMAX_ZERO or PROBIT); NONE, SOFTMAX and LOGISTIC are supported"
            )))
        }
    };
    let forest = Forest {
        interior,
        feature,
        split,
        branch,
        missing_true: missing,
        members,
        on_true,
        on_false,
        roots,
        leaves: leaf_targets
            .iter()
            .zip(&leaf_weights)
            .map(|(&t, &w)| vec![(t, w)])
            .collect(),
        targets,
    };
    // As the reference: a target no tree reaches is the type's extreme.
    let largest = match dt {
        DType::F64 => f64::MAX,
        DType::F16 => f64::from(half::f16::MAX),
        DType::BF16 => f64::from(half::bf16::MAX),
        _ => f64::from(f32::MAX),
    };
    let unreached = if aggregate == Aggregate::Min {
        largest
    } else {
        -largest
    };
    let y = evaluate(ctx, x, &forest, aggregate, unreached)?;
    one(post_transform(ctx, y, post)?)
}

/// `TreeEnsembleRegressor` (ai.onnx.ml opsets 1 and 3): nodes named by
/// `(tree id, node id)`, a `LEAF` mode for leaves, each leaf adding
/// weights to any targets; `base_values` added after aggregating; the
/// output is `[N, n_targets]` f32. A target no tree reaches scores 0 under
/// MIN/MAX (plus its base value), as onnxruntime does.
pub fn tree_ensemble_regressor(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let x = ctx.input(node, 0)?;
    let x = cast_to(ctx, x, DType::F32, "x_f32")?;
    let tree_ids = ctx
        .attr_ints(node, "nodes_treeids")?
        .ok_or_else(|| ctx.bad_attr("nodes_treeids", "is required"))?;
    let node_ids = ctx
        .attr_ints(node, "nodes_nodeids")?
        .ok_or_else(|| ctx.bad_attr("nodes_nodeids", "is required"))?;
    let n = tree_ids.len();
    let feature = indices(ctx, node, "nodes_featureids", None)?;
    let modes: Vec<String> = match ctx.raw_attr(node, "nodes_modes") {
        Some(a) => a
            .strings
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
        None => return Err(ctx.bad_attr("nodes_modes", "is required")),
    };
    let values = floats(ctx, node, "nodes_values")?.unwrap_or_else(|| vec![0.0; n]);
    let true_ids = ctx
        .attr_ints(node, "nodes_truenodeids")?
        .unwrap_or_default();
    let false_ids = ctx
        .attr_ints(node, "nodes_falsenodeids")?
        .unwrap_or_default();
    let missing = missing_tracks_true(ctx, node, n)?;
    same_len(
        ctx,
        "nodes",
        &[
            ("nodes_treeids", n),
            ("nodes_nodeids", node_ids.len()),
            ("nodes_featureids", feature.len()),
            ("nodes_modes", modes.len()),
            ("nodes_values", values.len()),
            ("nodes_truenodeids", true_ids.len()),
            ("nodes_falsenodeids", false_ids.len()),
            ("nodes_missing_value_tracks_true", missing.len()),
        ],
    )?;
    // Interior nodes first, then leaves, each in file order.
    let mut slot = std::collections::BTreeMap::new();
    let is_leaf: Vec<bool> = modes.iter().map(|m| m == "LEAF").collect();
    let interior = is_leaf.iter().filter(|&&l| !l).count();
    let (mut next_interior, mut next_leaf) = (0, interior);
    for i in 0..n {
        let s = if is_leaf[i] {
            next_leaf += 1;
            next_leaf - 1
        } else {
            next_interior += 1;
            next_interior - 1
        };
        if slot.insert((tree_ids[i], node_ids[i]), s).is_some() {
            return Err(ctx.invalid(format!(
                "node ({}, {}) is listed twice",
                tree_ids[i], node_ids[i]
            )));
        }
    }
    let lookup = |tree: i64, id: i64| {
        slot.get(&(tree, id))
            .copied()
            .ok_or_else(|| ctx.invalid(format!("tree {tree} has no node {id}")))
    };
    let total = n;
    let (mut branch, mut split, mut feat, mut miss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut on_true, mut on_false) = (vec![0; total], vec![0; total]);
    for i in 0..n {
        let s = slot[&(tree_ids[i], node_ids[i])];
        if is_leaf[i] {
            on_true[s] = s;
            on_false[s] = s;
            continue;
        }
        branch.push(match modes[i].as_str() {
            "BRANCH_LEQ" => Branch::Leq,
            "BRANCH_LT" => Branch::Lt,
            "BRANCH_GTE" => Branch::Gte,
            "BRANCH_GT" => Branch::Gt,
            "BRANCH_EQ" => Branch::Eq,
            "BRANCH_NEQ" => Branch::Neq,
            other => return Err(ctx.bad_attr("nodes_modes", format!("unknown mode '{other}'"))),
        });
        split.push(values[i]);
        feat.push(feature[i]);
        miss.push(missing[i]);
        on_true[s] = lookup(tree_ids[i], true_ids[i])?;
        on_false[s] = lookup(tree_ids[i], false_ids[i])?;
    }
    let targets = ctx.attr_i_or(node, "n_targets", 1)?;
    let targets = usize::try_from(targets)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| ctx.bad_attr("n_targets", format!("must be positive, got {targets}")))?;
    let t_trees = ctx.attr_ints(node, "target_treeids")?.unwrap_or_default();
    let t_nodes = ctx.attr_ints(node, "target_nodeids")?.unwrap_or_default();
    let t_ids = indices(ctx, node, "target_ids", Some(targets)).or_else(|e| {
        if t_trees.is_empty() {
            Ok(Vec::new())
        } else {
            Err(e)
        }
    })?;
    let t_weights = floats(ctx, node, "target_weights")?.unwrap_or_default();
    same_len(
        ctx,
        "targets",
        &[
            ("target_treeids", t_trees.len()),
            ("target_nodeids", t_nodes.len()),
            ("target_ids", t_ids.len()),
            ("target_weights", t_weights.len()),
        ],
    )?;
    let mut leaves = vec![Vec::new(); n - interior];
    for k in 0..t_trees.len() {
        let s = lookup(t_trees[k], t_nodes[k])?;
        if s < interior {
            return Err(ctx.invalid(format!(
                "target entry {k} names node ({}, {}), which is not a leaf",
                t_trees[k], t_nodes[k]
            )));
        }
        leaves[s - interior].push((t_ids[k], t_weights[k]));
    }
    // Each tree's root: its node that no other node of the tree names.
    let mut named = vec![false; total];
    for s in 0..interior {
        named[on_true[s]] = true;
        named[on_false[s]] = true;
    }
    let mut roots = Vec::new();
    let mut seen_trees = std::collections::BTreeSet::new();
    for i in 0..n {
        let s = slot[&(tree_ids[i], node_ids[i])];
        if !named[s] && seen_trees.insert(tree_ids[i]) {
            roots.push(s);
        }
    }
    let aggregate = match ctx
        .attr_s(node, "aggregate_function")?
        .as_deref()
        .unwrap_or("SUM")
    {
        "AVERAGE" => Aggregate::Average,
        "SUM" => Aggregate::Sum,
        "MIN" => Aggregate::Min,
        "MAX" => Aggregate::Max,
        other => {
            return Err(ctx.bad_attr("aggregate_function", format!("unknown function '{other}'")))
        }
    };
    let post = match ctx
        .attr_s(node, "post_transform")?
        .as_deref()
        .unwrap_or("NONE")
    {
        "NONE" => PostTransform::None,
        "SOFTMAX" => PostTransform::Softmax,
        "LOGISTIC" => PostTransform::Logistic,
        other => {
            return Err(ctx.unsupported(format!(
                "post_transform '{other}'; NONE, SOFTMAX and LOGISTIC are supported"
            )))
        }
    };
    let base = floats(ctx, node, "base_values")?;
    let forest = Forest {
        interior,
        feature: feat,
        split,
        branch,
        missing_true: miss,
        members: vec![Vec::new(); interior],
        on_true,
        on_false,
        roots,
        leaves,
        targets,
    };
    let mut y = evaluate(ctx, x, &forest, aggregate, 0.0)?;
    if let Some(base) = base.filter(|b| !b.is_empty()) {
        if base.len() != targets {
            return Err(ctx.bad_attr(
                "base_values",
                format!("has {} values for {targets} targets", base.len()),
            ));
        }
        let b = float_const(ctx, DType::F32, &[targets], base, "base_values")?;
        y = ctx.op(Op::Binary(BinaryOp::Add), &[y, b], Some("with_base"))?;
    }
    one(post_transform(ctx, y, post)?)
}
