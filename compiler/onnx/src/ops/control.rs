//! Control flow, imported inline: Kiln's graphs are static, so a subgraph
//! becomes ordinary IR nodes at the place of the node that holds it.
//!
//! - `If` with a condition known at import imports only the branch taken.
//!   With a condition known only at run time, an import that follows a
//!   path of the compiler's variants (`ImportOptions::branches`, what
//!   `kiln compile` does) imports the branch the path takes; the condition
//!   is a decision of the path (`ImportCtx::decide`), which the driver
//!   enumerates (`kiln_driver`'s `variants.rs`). Without a path, both
//!   branches are imported and each output selected with a `Where` on the
//!   (scalar) condition, which is exact because ONNX branches have no side
//!   effects; both branches must then give outputs of the same static
//!   types.
//! - `Scan` (opset 8 per batch item, 9+) and `Loop` are unrolled: the body
//!   is imported once per iteration with its inputs bound to the current loop-carried values
//!   (and, for `Scan`, the current slices of the scanned inputs; for `Loop`,
//!   the iteration number and condition as constants); per-iteration scan
//!   outputs are stacked with a `Concat`. A `Scan` runs for the static
//!   length of its scanned axis. A `Loop` whose trip count and condition
//!   (the initial one and the one each iteration computes) are known at
//!   import unrolls exactly; where either is known only at run time, "the
//!   loop runs iteration t" is a decision of the path, up to
//!   `Branches::max_trip_count` iterations (without a path it is refused).
//!
//! Subgraphs read outer values by name and may shadow outer names: every
//! name a subgraph defines is bound only while it is imported, the outer
//! binding restored afterwards. Nested control flow imports recursively.
//! Unrolling is bounded: at most [`MAX_ITERATIONS`] iterations per node and
//! [`MAX_UNROLLED_NODES`] body nodes imported over the whole model, checked
//! before a body is imported; constants a body re-creates in each iteration
//! are charged to the generated-constant budget.

use super::build::reshape_to;
use super::build::slice_along;
use crate::ctx::{ImportCtx, Val};
use crate::tensor::dtype_from_onnx;
use crate::OnnxError;
use kiln_ir::{Data, Op, Tensor};
use std::collections::HashSet;
use tract_onnx::pb::{GraphProto, NodeProto};

type R = Result<Vec<Val>, OnnxError>;

/// Most iterations one `Scan` or `Loop` may unroll.
pub const MAX_ITERATIONS: usize = 4096;

/// Most body nodes unrolled control flow may import over a whole model,
/// each body copy counting one more (nested loops multiply): far larger
/// graphs would take the compiler longer than running the loop ever could.
pub const MAX_UNROLLED_NODES: usize = 1 << 20;

// ---- subgraph names, shared with the model-level checks ----

/// The graphs held by a node's attributes (If branches, Loop and Scan
/// bodies), each with the name of its attribute.
pub(crate) fn subgraphs(node: &NodeProto) -> impl Iterator<Item = (&str, &GraphProto)> {
    node.attribute
        .iter()
        .flat_map(|a| (a.g.iter().chain(a.graphs.iter())).map(move |g| (a.name.as_str(), g)))
}

/// The names a subgraph reads from its enclosing scopes: what its nodes
/// (and their own subgraphs) read or its outputs name, less what it
/// defines itself.
pub(crate) fn outer_reads(g: &GraphProto) -> HashSet<&str> {
    let mut defined: HashSet<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    defined.extend(g.initializer.iter().map(|t| t.name.as_str()));
    for n in &g.node {
        defined.extend(n.output.iter().map(|o| o.as_str()));
    }
    let mut reads: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    for n in &g.node {
        reads.extend(node_reads(n));
    }
    reads.retain(|r| !r.is_empty() && !defined.contains(r));
    reads
}

/// Every name a node reads: its inputs and what its subgraphs read from
/// outside them.
pub(crate) fn node_reads(node: &NodeProto) -> Vec<&str> {
    let mut reads: Vec<&str> = node
        .input
        .iter()
        .map(|s| s.as_str())
        .filter(|s| !s.is_empty())
        .collect();
    for (_, g) in subgraphs(node) {
        let mut inner: Vec<&str> = outer_reads(g).into_iter().collect();
        inner.sort_unstable();
        reads.extend(inner);
    }
    reads
}

/// The names read in a graph: by its nodes (and their subgraphs) or as
/// its outputs.
pub(crate) fn used_names(g: &GraphProto) -> HashSet<&str> {
    let mut used: HashSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    for n in &g.node {
        used.extend(node_reads(n));
    }
    used
}

// ---- importing a body ----

/// A subgraph ready to be imported (possibly many times).
struct Body<'g> {
    graph: &'g GraphProto,
    /// Its initializers, decoded once per model and shared by every copy.
    inits: Vec<(String, Val)>,
    /// Bytes of `Constant` node data one copy of the body creates.
    constant_bytes: u64,
    /// Whether no copy of this subgraph was imported before: the first
    /// copy's constants are the model's own, later copies create theirs.
    first: bool,
}

fn prepare<'g>(ctx: &mut ImportCtx, graph: &'g GraphProto) -> Result<Body<'g>, OnnxError> {
    // The model outlives the import, so a subgraph's address names it; the
    // initializer names are compared as well, for safety.
    let key = std::ptr::from_ref(graph) as usize;
    let cached = ctx.subgraph_inits(key).filter(|inits| {
        inits.len() == graph.initializer.len()
            && inits
                .iter()
                .zip(&graph.initializer)
                .all(|((n, _), t)| *n == t.name)
    });
    let (inits, first) = match cached {
        Some(inits) => (inits.to_vec(), false),
        None => {
            let owner = ctx.node_name().to_string();
            let mut inits = Vec::with_capacity(graph.initializer.len());
            for t in &graph.initializer {
                let tensor = ctx.tensor(t, &t.name)?;
                let v = ctx.constant(tensor, format!("{owner}/{}", t.name));
                inits.push((t.name.clone(), v));
            }
            ctx.set_subgraph_inits(key, inits.clone());
            (inits, true)
        }
    };
    let constant_bytes = graph
        .node
        .iter()
        .filter(|n| n.op_type == "Constant")
        .flat_map(|n| n.attribute.iter().filter_map(|a| a.t.as_ref()))
        .map(|t| {
            let size = dtype_from_onnx(t.data_type).map_or(1, |d| d.size_bytes() as u64);
            t.dims
                .iter()
                .try_fold(size, |acc, &d| acc.checked_mul(d.max(0) as u64))
                .unwrap_or(u64::MAX)
        })
        .fold(0u64, |acc, b| acc.saturating_add(b));
    Ok(Body {
        graph,
        inits,
        constant_bytes,
        first,
    })
}

/// What one imported copy of `g` counts against [`MAX_UNROLLED_NODES`]:
/// its nodes, plus one for the copy itself, so that loops of empty bodies
/// nested in loops are bounded too.
fn copy_cost(g: &GraphProto) -> usize {
    g.node.len().saturating_add(1)
}

/// Refuses, before they are imported, `copies` more copies of `body` for
/// a node that then runs `iterations` in all, beyond the unrolling limits;
/// charges the constants the copies re-create (`first`: one of them is the
/// first copy of this subgraph in the model, whose constants are the
/// model's own).
fn reserve(
    ctx: &mut ImportCtx,
    what: &str,
    iterations: usize,
    copies: usize,
    first: bool,
    body: &Body,
) -> Result<(), OnnxError> {
    if iterations > MAX_ITERATIONS {
        return Err(ctx.unsupported(format!(
            "{what} of {iterations} iterations: Kiln unrolls control flow and stops at {MAX_ITERATIONS} iterations"
        )));
    }
    let nodes = copy_cost(body.graph).saturating_mul(copies);
    if ctx.unrolled_nodes().saturating_add(nodes) > MAX_UNROLLED_NODES {
        return Err(ctx.unsupported(format!(
            "{what} of {iterations} iterations over a body of {} nodes: with the {} body nodes already unrolled, the model would exceed Kiln's limit of {MAX_UNROLLED_NODES} unrolled nodes",
            body.graph.node.len(),
            ctx.unrolled_nodes()
        )));
    }
    let charged = copies.saturating_sub(usize::from(first)) as u64;
    ctx.charge_generated(body.constant_bytes.saturating_mul(charged))
}

/// Imports `body` inline under `prefix` with its inputs bound to `args`;
/// returns the values of its outputs. Every name the body defines is bound
/// only while it is imported: the outer bindings are restored afterwards
/// (on error too), so a body may shadow outer names without clobbering them.
fn run_body(ctx: &mut ImportCtx, body: &Body, args: &[Val], prefix: &str) -> R {
    let g = body.graph;
    if args.len() != g.input.len() {
        return Err(ctx.invalid(format!(
            "the subgraph '{}' declares {} inputs, the node binds {}",
            g.name,
            g.input.len(),
            args.len()
        )));
    }
    let mut defined: Vec<&str> = g.input.iter().map(|i| i.name.as_str()).collect();
    defined.extend(body.inits.iter().map(|(n, _)| n.as_str()));
    for n in &g.node {
        defined.extend(
            n.output
                .iter()
                .map(|o| o.as_str())
                .filter(|o| !o.is_empty()),
        );
    }
    let saved: Vec<(&str, Option<Val>)> = defined.iter().map(|&n| (n, ctx.lookup(n))).collect();
    let result = import_nodes(ctx, body, args, prefix);
    for (name, v) in saved.into_iter().rev() {
        match v {
            Some(v) => ctx.bind(name, v),
            None => ctx.unbind(name),
        }
    }
    result
}

fn import_nodes(ctx: &mut ImportCtx, body: &Body, args: &[Val], prefix: &str) -> R {
    let g = body.graph;
    ctx.count_unrolled(copy_cost(g));
    for (name, v) in &body.inits {
        ctx.bind(name, *v);
    }
    for (input, &v) in g.input.iter().zip(args) {
        ctx.bind(&input.name, v);
    }
    let used = used_names(g);
    let is_used = |name: &str| used.contains(name);
    for (i, n) in g.node.iter().enumerate() {
        let name = if n.name.is_empty() {
            format!("{prefix}/{}_{i}", n.op_type)
        } else {
            format!("{prefix}/{}", n.name)
        };
        ctx.set_current(&name, &n.op_type);
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        let build = super::builder_in(&n.domain, &n.op_type).ok_or_else(|| {
            let hint = if default_domain {
                super::missing_op_hint(&n.op_type)
            } else {
                super::unknown_domain_op_hint(&n.domain)
            };
            ctx.unsupported(format!("{hint} (in a subgraph)"))
        })?;
        if default_domain {
            if let Some(hint) = super::precheck(n, ctx.opset, &is_used) {
                return Err(ctx.unsupported(hint));
            }
        }
        let outs = build(ctx, n)?;
        for (k, out) in n.output.iter().enumerate() {
            if out.is_empty() {
                continue;
            }
            match outs.get(k) {
                Some(&v) => ctx.bind(out, v),
                None if !is_used(out) => {}
                None => return Err(ctx.invalid(format!("output {k} ('{out}') cannot be produced"))),
            }
        }
    }
    g.output
        .iter()
        .map(|o| {
            ctx.lookup(&o.name).ok_or_else(|| {
                ctx.invalid(format!(
                    "the subgraph '{}' does not produce its output '{}'",
                    g.name, o.name
                ))
            })
        })
        .collect()
}

/// The graph attribute `name` of `node`.
fn graph_attr<'n>(
    ctx: &ImportCtx,
    node: &'n NodeProto,
    name: &str,
) -> Result<&'n GraphProto, OnnxError> {
    ctx.raw_attr(node, name)
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| ctx.bad_attr(name, "is required (a graph)"))
}

/// Whether a one-element constant is true (non-zero).
fn truth(ctx: &ImportCtx, t: &Tensor, what: &str) -> Result<bool, OnnxError> {
    if t.len() != 1 {
        return Err(ctx.invalid(format!(
            "{what} must hold one element, got shape {:?}",
            t.shape().as_slice()
        )));
    }
    Ok(t.data().get_f64(0) != 0.0)
}

/// Stacks per-iteration values along a new axis `axis` (negative counts
/// from the end of the stacked rank).
fn stack(
    ctx: &mut ImportCtx,
    values: Vec<Val>,
    axis: i64,
    attr: &str,
    suffix: &str,
) -> Result<Val, OnnxError> {
    let Some(&first) = values.first() else {
        return Err(ctx.unsupported(format!(
            "{suffix}: a scan output of zero iterations (an empty tensor) is not supported"
        )));
    };
    let r = ctx.ty(first).shape.len() + 1;
    let a = ctx.axis(attr, axis, r)?;
    let mut lifted = Vec::with_capacity(values.len());
    for (t, v) in values.into_iter().enumerate() {
        let mut shape = ctx.ty(v).shape.to_vec();
        shape.insert(a, 1);
        lifted.push(reshape_to(
            ctx,
            v,
            &shape,
            Some(&format!("{suffix}_step{t}")),
        )?);
    }
    if lifted.len() == 1 {
        return Ok(lifted[0]);
    }
    ctx.op(Op::Concat { axis: a }, &lifted, Some(suffix))
}

/// Imports the one-input, one-output graph attribute `name` of `node`
/// inline with its input bound to `arg` (FlexAttention's `score_mod` and
/// `prob_mod`); outer-scope names resolve as in `If` branches. `None`
/// when the node has no such attribute.
pub(crate) fn inline_modifier(
    ctx: &mut ImportCtx,
    node: &NodeProto,
    name: &str,
    arg: Val,
) -> Result<Option<Val>, OnnxError> {
    let Some(g) = ctx.raw_attr(node, name).and_then(|a| a.g.as_ref()) else {
        return Ok(None);
    };
    if g.input.len() != 1 || g.output.len() != 1 {
        return Err(ctx.bad_attr(
            name,
            format!(
                "must take one input and give one output, has {} and {}",
                g.input.len(),
                g.output.len()
            ),
        ));
    }
    let body = prepare(ctx, g)?;
    reserve(ctx, name, 1, 1, body.first, &body)?;
    let prefix = format!("{}/{name}", ctx.node_name());
    let out = run_body(ctx, &body, &[arg], &prefix)?;
    Ok(Some(out[0]))
}

// ---- If ----

/// `If`: the taken branch inline when the condition is known at import,
/// else both branches and a `Where` per output.
pub fn if_(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let name = ctx.node_name().to_string();
    let then_g = graph_attr(ctx, node, "then_branch")?;
    let else_g = graph_attr(ctx, node, "else_branch")?;
    for (g, attr) in [(then_g, "then_branch"), (else_g, "else_branch")] {
        if !g.input.is_empty() {
            return Err(ctx.bad_attr(
                attr,
                format!("a branch takes no inputs, it declares {}", g.input.len()),
            ));
        }
    }
    let n_out = node.output.len();
    let cond = ctx.input(node, 0)?;
    let branch = |ctx: &mut ImportCtx, g: &GraphProto, tag: &str| -> R {
        let body = prepare(ctx, g)?;
        reserve(ctx, "an If branch", 1, 1, body.first, &body)?;
        let outs = run_body(ctx, &body, &[], &format!("{name}/{tag}"))?;
        ctx.set_current(&name, "If");
        if outs.len() < n_out {
            return Err(ctx.invalid(format!(
                "the {tag} branch gives {} outputs for the node's {n_out}",
                outs.len()
            )));
        }
        Ok(outs)
    };
    if let Some(t) = ctx.konst(cond) {
        let taken = truth(ctx, t, "the condition")?;
        return if taken {
            branch(ctx, then_g, "then")
        } else {
            branch(ctx, else_g, "else")
        };
    }
    let cond_ty = ctx.ty(cond).clone();
    if cond_ty.shape.iter().product::<usize>() != 1 {
        return Err(ctx.invalid(format!(
            "the condition must hold one element, got {cond_ty}"
        )));
    }
    // On a path of the compiler's variants, only the branch the path takes.
    let what = || format!("If '{name}' takes its then branch");
    if let Some(taken) = ctx.decide(&name, what, cond)? {
        return match taken {
            true => branch(ctx, then_g, "then"),
            false => branch(ctx, else_g, "else"),
        };
    }
    // Both branches are imported; one the run never takes may not even
    // type-check with these shapes (exporters guard shape-specific code
    // with Ifs): say which inputs, bound at compile time, fold the choice.
    let mut imported = Vec::with_capacity(2);
    for (g, tag) in [(then_g, "then"), (else_g, "else")] {
        match branch(ctx, g, tag) {
            Ok(v) => imported.push(v),
            Err(e) => {
                ctx.set_current(&name, "If");
                return Err(ctx.not_constant(
                    cond,
                    format!(
                        "If '{name}' has a condition known only at run time, so Kiln imports both branches, and its {tag} branch does not import: {e}"
                    ),
                ));
            }
        }
    }
    let (then_v, else_v) = (&imported[0], &imported[1]);
    let c = reshape_to(ctx, cond, &[], Some("cond"))?;
    let mut outs = Vec::with_capacity(n_out);
    for k in 0..n_out {
        let (a, b) = (then_v[k], else_v[k]);
        if a == b {
            outs.push(a);
            continue;
        }
        let (ta, tb) = (ctx.ty(a).clone(), ctx.ty(b).clone());
        if ta != tb {
            return Err(ctx.unsupported(format!(
                "If '{name}' has a condition known only at run time and its branches give output {k} ('{}') as {ta} (then) and {tb} (else): Kiln imports both branches and selects with Where, which needs the same static shape and type",
                node.output[k]
            )));
        }
        let suffix = format!("select{k}");
        outs.push(ctx.op(Op::Where, &[c, a, b], (k > 0).then_some(suffix.as_str()))?);
    }
    Ok(outs)
}

// ---- Loop ----

/// A `Loop`'s trip count `M` or condition: known at import, or a value
/// computed at run time (a one-element tensor).
#[derive(Clone, Copy)]
enum Known<T> {
    Now(T),
    RunTime(Val),
}

/// `Loop`: unrolled. A trip count `M` and a condition (initial and per
/// iteration) known at import unroll exactly; either known only at run
/// time makes "iteration t runs" a decision of the compiler's variants
/// (one per trip count, up to `Branches::max_trip_count`), or is refused
/// where the import follows no path.
pub fn loop_(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let name = ctx.node_name().to_string();
    let body_g = graph_attr(ctx, node, "body")?;
    let variants = ctx.opts.branches.is_some();
    let trip = match ctx.opt_input(node, 0) {
        None => None,
        Some(v) => Some(match ctx.konst(v) {
            Some(t) if t.len() == 1 => Known::Now(usize::try_from(t.data().get_i64(0)).unwrap_or(0)),
            Some(t) => {
                return Err(ctx.invalid(format!(
                    "the trip count M must hold one element, got shape {:?}",
                    t.shape().as_slice()
                )))
            }
            None if variants => Known::RunTime(one_element(ctx, v, "the trip count M")?),
            None => {
                return Err(ctx.not_constant(v, format!(
                    "Loop '{name}' has a trip count (input M) known only at run time: Kiln unrolls loops and needs it at compile time"
                )))
            }
        }),
    };
    let has_cond = ctx.opt_input(node, 1).is_some();
    let mut cond = match ctx.opt_input(node, 1) {
        None => Known::Now(true),
        Some(v) => match ctx.konst(v) {
            Some(t) => Known::Now(truth(ctx, t, "the condition")?),
            None if variants => Known::RunTime(one_element(ctx, v, "the condition")?),
            None => {
                return Err(ctx.not_constant(v, format!(
                    "Loop '{name}' has a condition (input cond) known only at run time: Kiln unrolls loops and needs it at compile time"
                )))
            }
        },
    };
    if trip.is_none() && !has_cond {
        return Err(ctx.unsupported(format!(
            "Loop '{name}' has neither a trip count nor a condition (it would never end)"
        )));
    }
    let mut states: Vec<Val> = (2..node.input.len())
        .map(|i| ctx.input(node, i))
        .collect::<Result<_, _>>()?;
    let n = states.len();
    if body_g.input.len() != n + 2 || body_g.output.len() < n + 1 {
        return Err(ctx.invalid(format!(
            "the body has {} inputs and {} outputs for {n} loop-carried values (it needs {} inputs and at least {} outputs)",
            body_g.input.len(),
            body_g.output.len(),
            n + 2,
            n + 1
        )));
    }
    let k_out = body_g.output.len() - 1 - n;
    let body = prepare(ctx, body_g)?;
    let for_loop = match trip {
        // A for loop: its length is known before anything is imported.
        Some(Known::Now(m)) if !has_cond => Some(m),
        _ => None,
    };
    if let Some(m) = for_loop {
        reserve(ctx, "a Loop", m, m, body.first, &body)?;
    }
    let mut per_step: Vec<Vec<Val>> = vec![Vec::new(); k_out];
    let mut t = 0usize;
    while iteration_runs(ctx, &name, t, trip, cond)? {
        if for_loop.is_none() {
            // A while loop, or a run-time trip count: checked one
            // iteration at a time.
            reserve(ctx, "a Loop", t + 1, 1, body.first && t == 0, &body)?;
        }
        let prefix = format!("{name}/iter{t}");
        ctx.set_current(&prefix, "Loop");
        let iter_num = ctx.generated_constant(
            Tensor::new([], Data::I64(vec![t as i64])).expect("scalar"),
            format!("{prefix}/iteration_num"),
        )?;
        let cond_in = ctx.generated_constant(
            Tensor::new([], Data::Bool(vec![true])).expect("scalar"),
            format!("{prefix}/cond"),
        )?;
        let mut args = vec![iter_num, cond_in];
        args.extend(&states);
        let outs = run_body(ctx, &body, &args, &prefix)?;
        ctx.set_current(&name, "Loop");
        if has_cond {
            cond = match ctx.konst(outs[0]) {
                Some(c) => Known::Now(truth(ctx, c, "the condition the body computes")?),
                None if variants => Known::RunTime(one_element(ctx, outs[0], "the condition the body computes")?),
                None => {
                    return Err(ctx.not_constant(outs[0], format!(
                        "Loop '{name}' computes its condition from values known only at run time (iteration {t}): Kiln unrolls loops and needs it at compile time"
                    )))
                }
            };
        }
        states.copy_from_slice(&outs[1..=n]);
        for (k, steps) in per_step.iter_mut().enumerate() {
            steps.push(outs[1 + n + k]);
        }
        t += 1;
    }
    let mut results = states;
    for (k, steps) in per_step.into_iter().enumerate() {
        results.push(stack(ctx, steps, 0, "body", &format!("scan{k}"))?);
    }
    Ok(results)
}

/// A one-element run-time value reshaped to `[]`.
fn one_element(ctx: &mut ImportCtx, v: Val, what: &str) -> Result<Val, OnnxError> {
    let ty = ctx.ty(v).clone();
    if ty.shape.iter().product::<usize>() != 1 {
        return Err(ctx.invalid(format!("{what} must hold one element, got {ty}")));
    }
    reshape_to(ctx, v, &[], Some("scalar"))
}

/// Whether iteration `t` of Loop `name` runs: known at import, or a
/// decision of the path the import follows (`(t < M) and cond`), which
/// past `Branches::max_trip_count` iterations is refused.
fn iteration_runs(
    ctx: &mut ImportCtx,
    name: &str,
    t: usize,
    trip: Option<Known<usize>>,
    cond: Known<bool>,
) -> Result<bool, OnnxError> {
    let mut parts = Vec::new();
    match trip {
        Some(Known::Now(m)) if t >= m => return Ok(false),
        Some(Known::RunTime(m)) => {
            let m = super::build::cast_to(ctx, m, kiln_ir::DType::I64, &format!("iter{t}/m"))?;
            let index = super::build::int_scalar(ctx, t as i64, &format!("iter{t}/index"))?;
            let below = ctx.op(
                Op::Compare(kiln_ir::CompareOp::Less),
                &[index, m],
                Some(&format!("iter{t}/below_m")),
            )?;
            parts.push(below);
        }
        _ => {}
    }
    match cond {
        Known::Now(false) => return Ok(false),
        Known::Now(true) => {}
        Known::RunTime(c) => parts.push(super::build::cast_to(
            ctx,
            c,
            kiln_ir::DType::Bool,
            &format!("iter{t}/cond"),
        )?),
    }
    let Some(&first) = parts.first() else {
        return Ok(true);
    };
    let runs = match parts.get(1) {
        Some(&second) => ctx.op(
            Op::Logical(kiln_ir::LogicalOp::And),
            &[first, second],
            Some(&format!("iter{t}/runs")),
        )?,
        None => first,
    };
    let key = format!("{name}#iter{t}");
    let what = || format!("Loop '{name}' runs iteration {t}");
    // Run-time parts exist only where the import follows a path.
    let Some(runs) = ctx.decide(&key, what, runs)? else {
        return Err(ctx.invalid("a run-time loop condition outside a path"));
    };
    let max = ctx.opts.branches.as_ref().map_or(0, |b| b.max_trip_count);
    if runs && t >= max {
        return Err(ctx.unsupported(format!(
            "Loop '{name}' runs more than {max} iterations on this path: Kiln compiles one variant per trip count up to --max-trip-count {max}"
        )));
    }
    Ok(runs)
}

// ---- Scan ----

/// `Scan`: opset 9+, and opset 8 (a batch axis in front, `directions`,
/// `sequence_lens` absent or the full length) as one scan per batch item.
pub fn scan(ctx: &mut ImportCtx, node: &NodeProto) -> R {
    let scan_name = ctx.node_name().to_string();
    let body_g = graph_attr(ctx, node, "body")?;
    let m = ctx
        .attr_i(node, "num_scan_inputs")?
        .ok_or_else(|| ctx.bad_attr("num_scan_inputs", "is required"))?;
    // Opset 8 has a batch axis in front of every state and scan input and
    // takes `sequence_lens` (optional) first.
    let batched = ctx.opset < 9;
    let first = usize::from(batched);
    let inputs: Vec<Val> = (first..node.input.len())
        .map(|i| ctx.input(node, i))
        .collect::<Result<_, _>>()?;
    if m < 1 || m as usize > inputs.len() {
        return Err(ctx.bad_attr(
            "num_scan_inputs",
            format!("{m} does not fit {} inputs", inputs.len()),
        ));
    }
    let m = m as usize;
    let n_state = inputs.len() - m;
    if body_g.input.len() != inputs.len() || body_g.output.len() < n_state {
        return Err(ctx.invalid(format!(
            "the body has {} inputs and {} outputs for {} states and {m} scan inputs",
            body_g.input.len(),
            body_g.output.len(),
            n_state
        )));
    }
    let k_out = body_g.output.len() - n_state;
    let list = |ctx: &ImportCtx, name: &str, n: usize| -> Result<Vec<i64>, OnnxError> {
        let v = ctx.attr_ints(node, name)?.unwrap_or_else(|| vec![0; n]);
        if v.len() != n {
            return Err(ctx.bad_attr(name, format!("{} values for {n}", v.len())));
        }
        Ok(v)
    };
    let scan = if batched {
        Scan {
            in_axes: vec![1; m],
            in_dirs: list(ctx, "directions", m)?,
            out_axes: vec![0; k_out],
            out_dirs: vec![0; k_out],
        }
    } else {
        Scan {
            in_axes: list(ctx, "scan_input_axes", m)?,
            in_dirs: list(ctx, "scan_input_directions", m)?,
            out_axes: list(ctx, "scan_output_axes", k_out)?,
            out_dirs: list(ctx, "scan_output_directions", k_out)?,
        }
    };
    let mut steps = None;
    let mut axes = Vec::with_capacity(m);
    for j in 0..m {
        let v = inputs[n_state + j];
        let r = ctx.ty(v).shape.len();
        let a = ctx.axis("scan_input_axes", scan.in_axes[j], r)?;
        let t = ctx.ty(v).shape[a];
        if *steps.get_or_insert(t) != t {
            return Err(ctx.invalid("scan inputs differ in length"));
        }
        axes.push(a);
    }
    let steps = steps.expect("m ≥ 1");
    let body = prepare(ctx, body_g)?;
    if !batched {
        reserve(ctx, "a Scan", steps, steps, body.first, &body)?;
        return scan_steps(
            ctx, &body, &scan, &inputs, n_state, &axes, steps, &scan_name,
        );
    }
    // Opset 8: the scan of each batch item, stacked.
    if let Some(lens) = ctx.opt_input(node, 0) {
        let full = ctx
            .konst(lens)
            .is_some_and(|t| (0..t.len()).all(|i| t.data().get_i64(i) == steps as i64));
        if !full {
            return Err(ctx.unsupported(
                "Scan (opset 8) with sequence_lens shorter than the scan inputs or known only at run time",
            ));
        }
    }
    let batch = ctx.ty(inputs[0]).shape.first().copied().unwrap_or(0);
    if inputs
        .iter()
        .any(|&v| ctx.ty(v).shape.first() != Some(&batch))
    {
        return Err(ctx.invalid("states and scan inputs must share the batch axis"));
    }
    reserve(
        ctx,
        "a Scan",
        steps * batch,
        steps * batch,
        body.first,
        &body,
    )?;
    let item_axes: Vec<usize> = axes.iter().map(|a| a - 1).collect();
    let mut per_item: Vec<Vec<Val>> = vec![Vec::with_capacity(batch); inputs.len() - m + k_out];
    for b in 0..batch {
        let mut items = Vec::with_capacity(inputs.len());
        for (i, &v) in inputs.iter().enumerate() {
            let s = slice_along(ctx, v, 0, b, 1, 1, &format!("batch{b}_in{i}"))?;
            let shape = ctx.ty(s).shape[1..].to_vec();
            items.push(reshape_to(
                ctx,
                s,
                &shape,
                Some(&format!("batch{b}_item{i}")),
            )?);
        }
        let prefix = format!("{scan_name}/batch{b}");
        let outs = scan_steps(
            ctx,
            &body,
            &scan_items(&scan),
            &items,
            n_state,
            &item_axes,
            steps,
            &prefix,
        )?;
        ctx.set_current(&scan_name, "Scan");
        for (k, o) in outs.into_iter().enumerate() {
            per_item[k].push(o);
        }
    }
    per_item
        .into_iter()
        .enumerate()
        .map(|(k, items)| stack(ctx, items, 0, "batch", &format!("batch_out{k}")))
        .collect()
}

/// A Scan's axes and directions (inputs, then outputs).
struct Scan {
    in_axes: Vec<i64>,
    in_dirs: Vec<i64>,
    out_axes: Vec<i64>,
    out_dirs: Vec<i64>,
}

/// An opset-8 Scan's axes for one batch item: its inputs scan their
/// first axis (the sequence, once the batch axis is gone) and its outputs
/// stack along it.
fn scan_items(scan: &Scan) -> Scan {
    Scan {
        in_axes: vec![0; scan.in_axes.len()],
        in_dirs: scan.in_dirs.clone(),
        out_axes: scan.out_axes.clone(),
        out_dirs: scan.out_dirs.clone(),
    }
}

/// The Scan loop unrolled over `steps`: the body on the states and each
/// scan input's slice (`axes`, read backwards where its direction says),
/// then the final states and every scan output stacked.
#[allow(clippy::too_many_arguments)]
fn scan_steps(
    ctx: &mut ImportCtx,
    body: &Body,
    scan: &Scan,
    inputs: &[Val],
    n_state: usize,
    axes: &[usize],
    steps: usize,
    scan_name: &str,
) -> R {
    let m = inputs.len() - n_state;
    let k_out = scan.out_axes.len();
    let mut states: Vec<Val> = inputs[..n_state].to_vec();
    let mut per_step: Vec<Vec<Val>> = vec![Vec::with_capacity(steps); k_out];
    for t in 0..steps {
        let prefix = format!("{scan_name}/iter{t}");
        ctx.set_current(&prefix, "Scan");
        let mut args = states.clone();
        for j in 0..m {
            let v = inputs[n_state + j];
            let at = if scan.in_dirs[j] != 0 {
                steps - 1 - t
            } else {
                t
            };
            let s = slice_along(ctx, v, axes[j], at, 1, 1, &format!("in{j}"))?;
            let mut shape = ctx.ty(s).shape.to_vec();
            shape.remove(axes[j]);
            args.push(reshape_to(ctx, s, &shape, Some(&format!("in{j}_item")))?);
        }
        let outs = run_body(ctx, body, &args, &prefix)?;
        ctx.set_current(scan_name, "Scan");
        states.copy_from_slice(&outs[..n_state]);
        for (k, o) in per_step.iter_mut().enumerate() {
            o.push(outs[n_state + k]);
        }
    }
    ctx.set_current(scan_name, "Scan");
    let mut results = states;
    for (k, mut outs) in per_step.into_iter().enumerate() {
        if scan.out_dirs[k] != 0 {
            outs.reverse();
        }
        results.push(stack(
            ctx,
            outs,
            scan.out_axes[k],
            "scan_output_axes",
            &format!("out{k}"),
        )?);
    }
    Ok(results)
}
