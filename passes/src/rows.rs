//! Which values keep the rows of a padded axis apart: the proof behind
//! `kiln compile --pad-dim batch`.
//!
//! A run whose inputs are smaller along a dim than any profile may use a
//! larger profile with the inputs padded (zeros) along that dim, and the
//! outputs cut back, only when no op combines rows of that axis: then the
//! real rows of every output are computed from the real rows of the inputs
//! alone, exactly as in a profile of their size. [`trace_rows`] follows the
//! axis from the graph inputs through every node. Each value either has
//! one axis whose rows come from the inputs' rows, or none (it depends on
//! no row: constants, and what is computed from them alone). An op that
//! reads across the axis (a reduction, softmax or normalization over it, a
//! product that sums along it, a reshape or slice that moves rows, a
//! gather that picks rows) is refused, naming the node; so is an op the
//! trace has no rule for.
//!
//! The trace runs on the imported graph (before any pass), whose ops are
//! the ONNX semantics, and on each profile whose dim is larger than 1 (a
//! size-1 axis cannot be told from other size-1 axes).

use kiln_ir::{Graph, NodeId, Op, Tensor};

/// Where a value's rows are.
pub type RowAxis = Option<usize>;

/// Why an axis cannot be padded: the first node that combines its rows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node '{node}' ({op}) {why}")]
pub struct MixesRows {
    /// The node's name.
    pub node: String,
    /// The IR op (its text name).
    pub op: String,
    /// What it does with the rows.
    pub why: String,
}

/// The row axis of every graph output, given the row axis of each graph
/// input (`inputs[i]` for input `i`; `None`: the input has no such axis).
pub fn trace_rows(graph: &Graph, inputs: &[RowAxis]) -> Result<Vec<RowAxis>, MixesRows> {
    let order = kiln_ir::schedule(graph).map_err(|e| MixesRows {
        node: String::new(),
        op: String::new(),
        why: format!("cannot be ordered: {e}"),
    })?;
    let mut rows: Vec<RowAxis> = vec![None; graph.node_count()];
    for id in order {
        rows[id.index()] = node_rows(graph, id, inputs, &rows)?;
    }
    Ok((graph.outputs().iter())
        .map(|(_, id)| rows[id.index()])
        .collect())
}

/// The row axis of node `id`'s value from its inputs' (`rows`).
fn node_rows(
    graph: &Graph,
    id: NodeId,
    graph_inputs: &[RowAxis],
    rows: &[RowAxis],
) -> Result<RowAxis, MixesRows> {
    let node = graph.node(id);
    let args = graph.inputs_of(id);
    let of = |k: usize| args.get(k).and_then(|a| rows[a.index()]);
    let rank_of = |k: usize| graph.node(args[k]).ty.shape.len();
    let out_rank = node.ty.shape.len();
    let mixes = |why: &str| MixesRows {
        node: node.name.clone(),
        op: node.op.name().to_string(),
        why: why.to_string(),
    };
    // Inputs that must not carry rows (weights, zero points, scales).
    let only_first = |k: usize| -> Result<(), MixesRows> {
        match (k..args.len()).any(|j| of(j).is_some()) {
            true => Err(mixes("reads the padded rows as weights or parameters")),
            false => Ok(()),
        }
    };
    Ok(match &node.op {
        Op::Input { index } => graph_inputs.get(*index).copied().flatten(),
        Op::Constant(_) => None,
        Op::Unary(_) | Op::Cast { .. } | Op::Bitcast { .. } | Op::Not | Op::BitwiseNot => of(0),
        Op::Binary(_) | Op::Compare(_) | Op::Logical(_) | Op::Bitwise(_) | Op::Where => {
            broadcast(graph, &args, rows, out_rank, &mixes)?
        }
        Op::MatMul | Op::MatMulInteger => {
            only_first(2)?;
            let (ra, rb) = (rank_of(0), rank_of(1));
            let from_a = match of(0) {
                None => None,
                Some(a) if ra == 1 || a == ra - 1 => {
                    return Err(mixes("sums the product over the padded axis of A"))
                }
                Some(a) => Some(a + out_rank - ra),
            };
            let from_b = match of(1) {
                None => None,
                Some(b) if rb == 1 || b == rb - 2 => {
                    return Err(mixes("sums the product over the padded axis of B"))
                }
                Some(b) => Some(b + out_rank - rb),
            };
            agree(from_a, from_b, &mixes)?
        }
        Op::Gemm {
            trans_a, trans_b, ..
        } => {
            let from_a = match (of(0), trans_a) {
                (None, _) => None,
                (Some(0), false) | (Some(1), true) => Some(0),
                _ => return Err(mixes("sums the product over the padded axis of A")),
            };
            let from_b = match (of(1), trans_b) {
                (None, _) => None,
                (Some(1), false) | (Some(0), true) => Some(1),
                _ => return Err(mixes("sums the product over the padded axis of B")),
            };
            let product = agree(from_a, from_b, &mixes)?;
            let out = match args.len() > 2 {
                true => agree(product, elementwise_arg(graph, &args, rows, 2, 2), &mixes)?,
                false => product,
            };
            if let Some(axis) = out {
                same_along_rows(graph, &args[2..], rows, axis, 2, &mixes)?;
            }
            out
        }
        Op::Conv(_) | Op::ConvInteger(_) | Op::Col2Im(_) => {
            only_first(1)?;
            match of(0) {
                None | Some(0) => of(0),
                Some(_) => return Err(mixes("convolves across the padded axis")),
            }
        }
        Op::MaxPool(_) | Op::AveragePool { .. } | Op::GlobalAveragePool | Op::GlobalMaxPool => {
            match of(0) {
                None | Some(0) | Some(1) => of(0),
                Some(_) => return Err(mixes("pools across the padded axis")),
            }
        }
        Op::Softmax { axis } => match of(0) {
            Some(a) if a == *axis => return Err(mixes("normalizes over the padded axis")),
            r => r,
        },
        Op::LayerNorm { axis, .. } => {
            only_first(1)?;
            match of(0) {
                Some(a) if a >= *axis => return Err(mixes("normalizes over the padded axis")),
                r => r,
            }
        }
        Op::Reduce {
            axes, keep_dims, ..
        } => match of(0) {
            None => None,
            Some(a) if axes.contains(&a) => return Err(mixes("reduces over the padded axis")),
            Some(a) if *keep_dims => Some(a),
            Some(a) => Some(a - axes.iter().filter(|&&x| x < a).count()),
        },
        Op::Reshape { .. } => match of(0) {
            None => None,
            Some(a) => {
                let from = &graph.node(args[0]).ty.shape;
                let to = &node.ty.shape;
                let before: usize = from[..a].iter().product();
                let kept = (0..to.len())
                    .find(|&k| to[..k].iter().product::<usize>() == before && to[k] == from[a]);
                match kept {
                    Some(k) => Some(k),
                    None => return Err(mixes("reshapes the padded axis into others")),
                }
            }
        },
        Op::Transpose { perm } => match of(0) {
            None => None,
            Some(a) => perm.iter().position(|&p| p == a),
        },
        Op::Expand { .. } => of(0).map(|a| a + out_rank - rank_of(0)),
        Op::Concat { axis } => {
            let mut out = None;
            for k in 0..args.len() {
                let r = elementwise_arg(graph, &args, rows, k, out_rank);
                if r == Some(*axis) {
                    return Err(mixes("concatenates along the padded axis"));
                }
                out = agree(out, r, &mixes)?;
            }
            if let Some(axis) = out {
                same_along_rows(graph, &args, rows, axis, out_rank, &mixes)?;
            }
            out
        }
        Op::Slice { axes } => match of(0) {
            Some(a) => {
                let full = graph.node(args[0]).ty.shape[a];
                let s = &axes[a];
                match s.start == 0 && s.step == 1 && s.len == full {
                    true => Some(a),
                    false => return Err(mixes("slices the padded axis")),
                }
            }
            None => None,
        },
        Op::Gather { axis } => match (of(0), of(1)) {
            (None, None) => None,
            (Some(d), None) if d == *axis => return Err(mixes("gathers rows of the padded axis")),
            (Some(d), None) if d < *axis => Some(d),
            (Some(d), None) => Some(d - 1 + rank_of(1)),
            (None, Some(i)) => Some(axis + i),
            (Some(_), Some(_)) => return Err(mixes("gathers padded rows by padded indices")),
        },
        Op::Resize(_) => match of(0) {
            None => None,
            Some(a) => match graph.node(args[0]).ty.shape[a] == node.ty.shape[a] {
                true => Some(a),
                false => return Err(mixes("resamples the padded axis")),
            },
        },
        Op::Attention { .. } => {
            // Q [.., M, K], Kt [.., K, N], V [.., N, D], mask [.., M, N]
            // -> [.., M, D]: rows may be batch dims, M (Q, mask) or D (V).
            let lead = out_rank - 2;
            let q = match of(0) {
                Some(a) if a == lead + 1 => {
                    return Err(mixes("sums the scores over the padded axis of Q"))
                }
                r => r,
            };
            let kt = match of(1) {
                Some(a) if a >= lead => {
                    return Err(mixes("attends over the padded axis of the keys"))
                }
                r => r,
            };
            let v = match of(2) {
                Some(a) if a == lead => {
                    return Err(mixes("attends over the padded axis of the values"))
                }
                r => r,
            };
            let mask = match args.len() > 3 {
                true => match elementwise_arg(graph, &args, rows, 3, out_rank) {
                    Some(a) if a == lead + 1 => {
                        return Err(mixes("masks along the padded key axis"))
                    }
                    r => r,
                },
                false => None,
            };
            let out = agree(q, kt, &mixes)?;
            let out = agree(out, v, &mixes)?;
            let out = agree(out, mask, &mixes)?;
            // Arguments without rows must be the same along the row axis:
            // the mask always has it (M or a batch dim); K and V only when
            // it is a batch dim.
            if let Some(axis) = out {
                let checked = if axis < lead {
                    &args[1..]
                } else {
                    &args[3.min(args.len())..]
                };
                same_along_rows(graph, checked, rows, axis, out_rank, &mixes)?;
            }
            out
        }
        Op::Fused(_) => return Err(mixes("is a fused kernel, which the trace does not read")),
    })
}

/// Two row axes of one output: equal, or one of them absent.
fn agree(a: RowAxis, b: RowAxis, mixes: &dyn Fn(&str) -> MixesRows) -> Result<RowAxis, MixesRows> {
    match (a, b) {
        (Some(x), Some(y)) if x != y => Err(mixes(
            "combines the padded rows of one input with another axis of the other",
        )),
        (Some(x), _) | (_, Some(x)) => Ok(Some(x)),
        (None, None) => Ok(None),
    }
}

/// The row axis of a broadcasting op's output.
fn broadcast(
    graph: &Graph,
    args: &[NodeId],
    rows: &[RowAxis],
    out_rank: usize,
    mixes: &dyn Fn(&str) -> MixesRows,
) -> Result<RowAxis, MixesRows> {
    let mut out = None;
    for k in 0..args.len() {
        out = agree(out, elementwise_arg(graph, args, rows, k, out_rank), mixes)?;
    }
    if let Some(axis) = out {
        same_along_rows(graph, args, rows, axis, out_rank, mixes)?;
    }
    Ok(out)
}

/// Errors unless every argument without rows is the same along the
/// output's row axis `axis`: broadcast there (size 1 or absent), or a
/// constant whose rows are equal. Anything else would pair each row with a
/// value that does not come from the rows, and padding would change which.
fn same_along_rows(
    graph: &Graph,
    args: &[NodeId],
    rows: &[RowAxis],
    axis: usize,
    out_rank: usize,
    mixes: &dyn Fn(&str) -> MixesRows,
) -> Result<(), MixesRows> {
    for (k, &arg) in args.iter().enumerate() {
        if rows[arg.index()].is_some() {
            continue;
        }
        let shape = &graph.node(arg).ty.shape;
        let Some(at) = (axis + shape.len()).checked_sub(out_rank) else {
            continue;
        };
        if shape[at] > 1 && !constant_rows_equal(graph, arg, at) {
            return Err(mixes(&format!(
                "pairs the padded rows with input {k}, whose {} rows along that axis do not come from them",
                shape[at]
            )));
        }
    }
    Ok(())
}

/// Argument `k`'s row axis in the coordinates of an output of rank
/// `out_rank` (right-aligned broadcasting).
fn elementwise_arg(
    graph: &Graph,
    args: &[NodeId],
    rows: &[RowAxis],
    k: usize,
    out_rank: usize,
) -> RowAxis {
    let arg = args[k];
    let rank = graph.node(arg).ty.shape.len();
    rows[arg.index()].map(|a| a + out_rank - rank)
}

/// Whether `id` is a constant whose slices along `axis` are all equal.
fn constant_rows_equal(graph: &Graph, id: NodeId, axis: usize) -> bool {
    let Op::Constant(t) = &graph.node(id).op else {
        return false;
    };
    rows_equal(t, axis)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{BinaryOp, DType, Data, ReduceOp, UnaryOp, ValueType};

    /// `x: f32[4, 3]` (rows on axis 0) into a graph; `build` adds the rest
    /// and returns the output.
    fn traced(build: impl FnOnce(&mut Graph, NodeId) -> NodeId) -> Result<Vec<RowAxis>, MixesRows> {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
        let y = build(&mut g, x);
        g.add_output("y", y);
        trace_rows(&g, &[Some(0)])
    }

    fn constant(g: &mut Graph, shape: &[usize], v: Vec<f32>) -> NodeId {
        g.add_const("w", Tensor::new(shape, Data::F32(v)).unwrap())
    }

    #[test]
    fn per_row_ops_keep_the_axis_and_follow_transposes() {
        let out = traced(|g, x| {
            let w = constant(g, &[3, 5], vec![0.5; 15]);
            let m = g.add_node(Op::MatMul, &[x, w], "fc").unwrap();
            let r = g.add_node(Op::Unary(UnaryOp::Relu), &[m], "relu").unwrap();
            let s = g.add_node(Op::Softmax { axis: 1 }, &[r], "sm").unwrap();
            g.add_node(
                Op::Transpose {
                    perm: vec![1, 0].into(),
                },
                &[s],
                "t",
            )
            .unwrap()
        });
        assert_eq!(out, Ok(vec![Some(1)]));
    }

    #[test]
    fn ops_across_the_rows_are_refused_by_node() {
        let reduce = traced(|g, x| {
            let op = Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![0].into(),
                keep_dims: true,
            };
            g.add_node(op, &[x], "total").unwrap()
        });
        let e = reduce.unwrap_err();
        assert_eq!(
            (e.node.as_str(), e.why.as_str()),
            ("total", "reduces over the padded axis")
        );
        let softmax = traced(|g, x| g.add_node(Op::Softmax { axis: 0 }, &[x], "sm0").unwrap());
        assert_eq!(softmax.unwrap_err().node, "sm0");
        // xᵀ @ x sums over the rows.
        let gram = traced(|g, x| {
            let t = g
                .add_node(
                    Op::Transpose {
                        perm: vec![1, 0].into(),
                    },
                    &[x],
                    "t",
                )
                .unwrap();
            g.add_node(Op::MatMul, &[t, x], "gram").unwrap()
        });
        assert_eq!(gram.unwrap_err().node, "gram");
        // [4, 3] -> [2, 6] moves rows into columns.
        let reshape = traced(|g, x| {
            let op = Op::Reshape {
                shape: vec![2, 6].into(),
            };
            g.add_node(op, &[x], "fold").unwrap()
        });
        assert_eq!(reshape.unwrap_err().node, "fold");
    }

    #[test]
    fn a_value_of_its_own_rows_is_refused_unless_they_are_equal() {
        // x + c with c: [4, 3] whose rows differ: each row meets another c.
        let differ = traced(|g, x| {
            let c = constant(g, &[4, 3], (0..12).map(|v| v as f32).collect());
            g.add_node(Op::Binary(BinaryOp::Add), &[x, c], "add")
                .unwrap()
        });
        assert_eq!(differ.unwrap_err().node, "add");
        let equal = traced(|g, x| {
            let c = constant(g, &[4, 3], [1.0, 2.0, 3.0].repeat(4));
            g.add_node(Op::Binary(BinaryOp::Add), &[x, c], "add")
                .unwrap()
        });
        assert_eq!(equal, Ok(vec![Some(0)]));
    }

    #[test]
    fn gathered_rows_follow_the_indices() {
        // An embedding lookup: table [10, 3] gathered by x-shaped indices.
        let mut g = Graph::new();
        let ids = g.add_input("ids", ValueType::new(DType::I64, [4, 7]));
        let table = constant(&mut g, &[10, 3], vec![0.0; 30]);
        let e = g
            .add_node(Op::Gather { axis: 0 }, &[table, ids], "embed")
            .unwrap();
        g.add_output("e", e);
        assert_eq!(trace_rows(&g, &[Some(0)]), Ok(vec![Some(0)]));
        // Gathering rows of the padded axis picks among them.
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [4, 3]));
        let i = g.add_const("i", Tensor::new([1], Data::I64(vec![2])).unwrap());
        let p = g.add_node(Op::Gather { axis: 0 }, &[x, i], "pick").unwrap();
        g.add_output("p", p);
        assert_eq!(trace_rows(&g, &[Some(0)]).unwrap_err().node, "pick");
    }
}
