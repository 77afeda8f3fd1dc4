//! ModelProto → IR: structural checks, the unsupported-op scan, input
//! binding, initializers, and the node walk in topological order.

use crate::ctx::ImportCtx;
use crate::tensor::dtype_or_err;
use crate::{ops, ImportOptions, KeepValues, OnnxError, UnsupportedOp};
use kiln_ir::{DType, Graph, NodeId, Tensor, ValueType};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::Path;
use tract_onnx::pb::tensor_shape_proto::dimension::Value as DimValue;
use tract_onnx::pb::type_proto::Value as TypeValue;
use tract_onnx::pb::{GraphProto, ModelProto, ValueInfoProto};

/// The newest default-domain opset the builders implement (what the `onnx`
/// 1.23 package emits).
pub(crate) const NEWEST_OPSET: i64 = 28;

/// The version a model imports for `domain` (`""` and `ai.onnx` are the
/// default domain). A model without any default-domain import is opset 1.
pub(crate) fn opset_of(model: &ModelProto, domain: &str) -> i64 {
    let norm = |d: &str| if d == "ai.onnx" { "" } else { d }.to_string();
    let want = norm(domain);
    model
        .opset_import
        .iter()
        .find(|o| norm(&o.domain) == want)
        .map(|o| o.version)
        .unwrap_or(if want.is_empty() { 1 } else { 0 })
}

/// The display name of node `i`: its name, or `<op_type>_<i>`.
pub(crate) fn node_display_name(graph: &GraphProto, i: usize) -> String {
    let n = &graph.node[i];
    if n.name.is_empty() {
        format!("{}_{i}", n.op_type)
    } else {
        n.name.clone()
    }
}

/// The names of a graph's inputs or outputs (`what`), which must be
/// unique: the artifact records them by name and the runtime refuses
/// duplicates.
fn unique_names<'g>(
    values: &'g [ValueInfoProto],
    what: &str,
) -> Result<HashSet<&'g str>, OnnxError> {
    let mut names = HashSet::new();
    for v in values {
        if !names.insert(v.name.as_str()) {
            return Err(OnnxError::InvalidModel(format!(
                "graph {what} '{}' is listed more than once",
                v.name
            )));
        }
    }
    Ok(names)
}

/// Checks that every value read is produced and that the nodes form a DAG;
/// returns the node indices in a topological order (the given order when
/// the model is sorted, as ONNX requires).
fn check_structure(graph: &GraphProto, names: &[String]) -> Result<Vec<usize>, OnnxError> {
    let mut available: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    // An input may share its name with an initializer (its default, IR
    // < 4), never with another input.
    available.extend(unique_names(&graph.input, "input")?);
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if available.contains(o.as_str()) || producer.insert(o, i).is_some() {
                return Err(OnnxError::InvalidModel(format!(
                    "value '{o}' is produced more than once (node '{}')",
                    names[i]
                )));
            }
        }
    }
    // What a node reads includes what its subgraphs (If branches, Loop and
    // Scan bodies) read from the graph by name.
    let reads: Vec<Vec<&str>> = graph.node.iter().map(ops::control::node_reads).collect();
    for (i, r) in reads.iter().enumerate() {
        for &x in r {
            if !available.contains(x) && !producer.contains_key(x) {
                return Err(OnnxError::MissingInput {
                    node: names[i].clone(),
                    input: x.to_string(),
                });
            }
        }
    }
    unique_names(&graph.output, "output")?;
    for o in &graph.output {
        if !available.contains(o.name.as_str()) && !producer.contains_key(o.name.as_str()) {
            return Err(OnnxError::MissingInput {
                node: "graph output".into(),
                input: o.name.clone(),
            });
        }
    }
    // Kahn's algorithm, smallest index first: the given order when valid.
    let deps: Vec<Vec<usize>> = reads
        .iter()
        .map(|r| {
            let mut d: Vec<usize> = r
                .iter()
                .filter(|&&x| !available.contains(x))
                .filter_map(|&x| producer.get(x).copied())
                .collect();
            d.sort_unstable();
            d.dedup();
            d
        })
        .collect();
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); graph.node.len()];
    let mut pending: Vec<usize> = vec![0; graph.node.len()];
    for (i, d) in deps.iter().enumerate() {
        pending[i] = d.len();
        for &p in d {
            users[p].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..graph.node.len())
        .filter(|&i| pending[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(graph.node.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &u in &users[i] {
            pending[u] -= 1;
            if pending[u] == 0 {
                ready.push(Reverse(u));
            }
        }
    }
    if order.len() < graph.node.len() {
        // Walk unfinished dependencies until a node repeats: it is on a cycle.
        let mut seen = vec![false; graph.node.len()];
        let mut i = (0..graph.node.len())
            .find(|&i| pending[i] > 0)
            .expect("unfinished node");
        while !seen[i] {
            seen[i] = true;
            i = *deps[i]
                .iter()
                .find(|&&d| pending[d] > 0)
                .expect("unfinished dependency");
        }
        return Err(OnnxError::Cycle(names[i].clone()));
    }
    Ok(order)
}

/// Finds every node Kiln cannot import, in subgraphs too.
fn scan_unsupported(
    model: &ModelProto,
    graph: &GraphProto,
    names: &[String],
) -> Vec<UnsupportedOp> {
    let mut out = Vec::new();
    scan_graph(model, graph, names, &mut out);
    out
}

/// [`scan_unsupported`] for one graph whose nodes display as `names`; the
/// nodes of a subgraph display under the name of the node that holds it.
fn scan_graph(
    model: &ModelProto,
    graph: &GraphProto,
    names: &[String],
    out: &mut Vec<UnsupportedOp>,
) {
    let used = ops::control::used_names(graph);
    let is_used = |name: &str| used.contains(name);
    let default_opset = opset_of(model, "");
    for (i, n) in graph.node.iter().enumerate() {
        for (attr, g) in ops::control::subgraphs(n) {
            let inner: Vec<String> = (0..g.node.len())
                .map(|k| format!("{}/{attr}/{}", names[i], node_display_name(g, k)))
                .collect();
            scan_graph(model, g, &inner, out);
        }
        let default_domain = n.domain.is_empty() || n.domain == "ai.onnx";
        let domain = if default_domain {
            "ai.onnx".to_string()
        } else {
            n.domain.clone()
        };
        let opset = opset_of(model, &domain);
        let hint = match ops::builder_in(&n.domain, &n.op_type) {
            Some(_) if default_domain => ops::precheck(n, default_opset, &is_used),
            Some(_) => None,
            None if !default_domain => Some(ops::unknown_domain_op_hint(&domain)),
            None => Some(ops::missing_op_hint(&n.op_type)),
        };
        if let Some(hint) = hint {
            out.push(UnsupportedOp {
                op_type: n.op_type.clone(),
                node_name: names[i].clone(),
                domain,
                opset,
                hint,
                bindable_inputs: Vec::new(),
            });
        }
    }
}

/// The declared dims of a graph input: `Some(d)` known, `None` with an
/// optional `dim_param` name otherwise; `None` overall when no shape is
/// declared.
type DeclaredDims = Option<Vec<Result<usize, Option<String>>>>;

fn declared_type(input: &ValueInfoProto) -> Result<(i32, DeclaredDims), OnnxError> {
    let tensor = match input.r#type.as_ref().map(|t| t.value.as_ref()) {
        Some(Some(TypeValue::TensorType(t))) => t,
        // A type whose kind the protobuf schema does not know: sequence,
        // map or optional values.
        Some(None) => {
            return Err(OnnxError::UnsupportedDType {
                value: input.name.clone(),
                dtype: "a non-tensor type (sequence, map or optional)".into(),
            })
        }
        None => {
            return Err(OnnxError::InvalidModel(format!(
                "graph input '{}' has no tensor type",
                input.name
            )))
        }
    };
    let dims = tensor.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(DimValue::DimValue(v)) if *v > 0 => Ok(*v as usize),
                Some(DimValue::DimParam(p)) if !p.is_empty() => Err(Some(p.clone())),
                _ => Err(None),
            })
            .collect()
    });
    Ok((tensor.elem_type, dims))
}

/// Binds the dims of one graph input from the options.
fn bind_shape(
    name: &str,
    declared: &DeclaredDims,
    opts: &ImportOptions,
) -> Result<Vec<usize>, OnnxError> {
    if let Some(given) = opts.input_shapes.get(name) {
        if let Some(dims) = declared {
            if dims.len() != given.len() {
                return Err(OnnxError::InputShape {
                    input: name.into(),
                    message: format!(
                        "the model declares rank {}, the option gives {:?}",
                        dims.len(),
                        given
                    ),
                });
            }
            for (i, (d, &g)) in dims.iter().zip(given).enumerate() {
                if let Ok(d) = d {
                    if *d != g {
                        return Err(OnnxError::InputShape {
                            input: name.into(),
                            message: format!(
                                "dim {i} is {d} in the model but {g} in the option {given:?}"
                            ),
                        });
                    }
                }
            }
        }
        return Ok(given.clone());
    }
    let Some(dims) = declared else {
        return Err(OnnxError::InputShape {
            input: name.into(),
            message: format!("the model declares no shape; give one with --input-shape {name}=..."),
        });
    };
    let unbound = unbound_dims(name, dims, opts);
    if !unbound.is_empty() {
        return Err(OnnxError::UnboundDim(unbound));
    }
    Ok(dims
        .iter()
        .map(|d| match d {
            Ok(v) => *v,
            Err(Some(p)) => opts.dims[p],
            Err(None) => unreachable!("an unnamed dim is unbound"),
        })
        .collect())
}

/// The dims of graph input `name` (declared `dims`, no whole shape given)
/// that no `--dim` binds.
fn unbound_dims(
    name: &str,
    dims: &[Result<usize, Option<String>>],
    opts: &ImportOptions,
) -> Vec<crate::error::UnboundDim> {
    let suggested: Vec<usize> = dims
        .iter()
        .map(|d| match d {
            Ok(v) => *v,
            Err(Some(p)) => {
                (opts.dims.get(p).copied()).unwrap_or_else(|| crate::error::suggested_dim(p))
            }
            Err(None) => 1,
        })
        .collect();
    (dims.iter().enumerate())
        .filter_map(|(i, d)| match d {
            Err(Some(p)) if opts.dims.contains_key(p) => None,
            Err(p) => Some(crate::error::UnboundDim {
                input: name.into(),
                dim_index: i,
                dim_name: p.clone(),
                suggested_shape: suggested.clone(),
            }),
            Ok(_) => None,
        })
        .collect()
}

/// Checks a value bound to graph input `name` against its declaration:
/// same element type, same rank, and equal sizes where the model gives
/// them.
fn check_bound_value(
    name: &str,
    dtype: DType,
    declared: &DeclaredDims,
    value: &Tensor,
) -> Result<(), OnnxError> {
    let bad = |message: String| OnnxError::InputValue {
        input: name.into(),
        message,
    };
    if value.dtype() != dtype {
        return Err(bad(format!(
            "the model declares element type {dtype}, the value is {}",
            value.dtype()
        )));
    }
    let Some(dims) = declared else {
        return Ok(());
    };
    let given = value.shape().as_slice();
    let fits = dims.len() == given.len()
        && dims
            .iter()
            .zip(given)
            .all(|(d, &g)| d.as_ref().map_or(true, |&d| d == g));
    if !fits {
        let declared: Vec<String> = dims
            .iter()
            .map(|d| match d {
                Ok(v) => v.to_string(),
                Err(Some(p)) => p.clone(),
                Err(None) => "?".into(),
            })
            .collect();
        return Err(bad(format!(
            "the model declares shape [{}], the value has {given:?}",
            declared.join(", ")
        )));
    }
    Ok(())
}

/// Imports a decoded model; see [`crate::import_model`].
pub(crate) fn import_model(
    model: &ModelProto,
    model_dir: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Graph, OnnxError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::InvalidModel("the model has no graph".into()))?;
    if graph.output.is_empty() {
        return Err(OnnxError::InvalidModel("the graph has no outputs".into()));
    }
    match opset_of(model, "") {
        v if v < 1 => {
            return Err(OnnxError::InvalidModel(format!(
                "opset {v} of the default domain is not a valid version"
            )))
        }
        v if v > NEWEST_OPSET => {
            return Err(OnnxError::UnsupportedOpset {
                version: v,
                newest: NEWEST_OPSET,
            })
        }
        _ => {}
    }
    let names: Vec<String> = (0..graph.node.len())
        .map(|i| node_display_name(graph, i))
        .collect();
    let order = check_structure(graph, &names)?;
    let unsupported = scan_unsupported(model, graph, &names);
    if !unsupported.is_empty() {
        return Err(OnnxError::Unsupported(unsupported));
    }
    if !graph.sparse_initializer.is_empty() {
        return Err(OnnxError::InvalidModel(
            "sparse initializers are not supported".into(),
        ));
    }

    let init_names: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let inputs: Vec<&ValueInfoProto> = graph
        .input
        .iter()
        .filter(|i| !init_names.contains(i.name.as_str()))
        .collect();
    // Options naming no graph input: the message lists the inputs.
    let unknown = |names: Vec<&String>| {
        names
            .into_iter()
            .find(|n| !inputs.iter().any(|i| &i.name == *n))
            .map(|n| {
                let list: Vec<&str> = inputs.iter().map(|i| i.name.as_str()).collect();
                let message = format!(
                    "the model has no input of that name (inputs: {})",
                    list.join(", ")
                );
                (n.clone(), message)
            })
    };
    if let Some((input, message)) = unknown(opts.input_shapes.keys().collect()) {
        return Err(OnnxError::InputShape { input, message });
    }
    if let Some((input, message)) = unknown(opts.input_values.keys().collect()) {
        return Err(OnnxError::InputValue { input, message });
    }

    let used = ops::control::used_names(graph);

    // Every unbound dim of every input at once, so one message gives the
    // whole `--dim` line.
    let mut unbound = Vec::new();
    for input in inputs.iter().filter(|i| {
        !opts.input_values.contains_key(&i.name) && !opts.input_shapes.contains_key(&i.name)
    }) {
        if let (_, Some(dims)) = declared_type(input)? {
            unbound.extend(unbound_dims(&input.name, &dims, opts));
        }
    }
    if !unbound.is_empty() {
        return Err(OnnxError::UnboundDim(unbound));
    }

    let mut ctx = ImportCtx::new(opset_of(model, ""), opts, model_dir);
    for input in &inputs {
        let (code, declared) = declared_type(input)?;
        let dtype = dtype_or_err(code, &input.name)?;
        if let Some(value) = opts.input_values.get(&input.name) {
            check_bound_value(&input.name, dtype, &declared, value)?;
            let v = ctx.constant(value.clone(), input.name.clone());
            ctx.bind(&input.name, v);
            continue;
        }
        let shape = bind_shape(&input.name, &declared, opts)?;
        let fits = shape
            .iter()
            .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .is_some_and(|b| b <= isize::MAX as usize);
        if !fits {
            return Err(OnnxError::InputShape {
                input: input.name.clone(),
                message: format!("shape {shape:?} is too large to address"),
            });
        }
        let id = ctx
            .graph
            .add_input(input.name.clone(), ValueType::new(dtype, shape));
        ctx.bind_input(&input.name, id);
    }
    for t in &graph.initializer {
        let tensor = ctx.tensor(t, &t.name)?;
        let v = ctx.constant(tensor, t.name.clone());
        ctx.bind(&t.name, v);
    }

    for &i in &order {
        let node = &graph.node[i];
        ctx.set_current(&names[i], &node.op_type);
        let build = ops::builder_in(&node.domain, &node.op_type).expect("checked by the scan");
        let outs = match build(&mut ctx, node) {
            // A condition program ends where its condition is computed.
            Err(OnnxError::Undecided { .. }) if ctx.condition.is_some() => break,
            outs => outs?,
        };
        for (k, name) in node.output.iter().enumerate() {
            if name.is_empty() {
                continue;
            }
            match outs.get(k) {
                Some(&v) => ctx.bind(name, v),
                // An unused secondary output (BatchNormalization statistics,
                // MaxPool indices, Dropout mask) need not exist.
                None if !used.contains(name.as_str()) => {}
                None => {
                    return Err(ctx.invalid(format!("output {k} ('{name}') cannot be produced")));
                }
            }
        }
    }

    if let Some(key) = opts.branches.as_ref().and_then(|b| b.condition_of.as_ref()) {
        // A condition program: the decision's condition is its only output.
        let Some(cond) = ctx.condition else {
            return Err(OnnxError::InvalidModel(format!(
                "the path given never meets the decision '{key}'"
            )));
        };
        ctx.set_current(key, "condition");
        let cond = ops::build::reshape_to(&mut ctx, cond, &[1], Some("condition"))?;
        let cond = ops::build::cast_to(&mut ctx, cond, kiln_ir::DType::Bool, "condition_bool")?;
        let id = ctx.node_of(cond);
        ctx.graph.add_output(crate::CONDITION_OUTPUT, id);
        return Ok(ctx.graph);
    }
    for o in &graph.output {
        let v = ctx.lookup(&o.name).ok_or_else(|| OnnxError::MissingInput {
            node: "graph output".into(),
            input: o.name.clone(),
        })?;
        let id = ctx.node_of(v);
        ctx.graph.add_output(o.name.clone(), id);
    }
    keep_values(&mut ctx, graph, &order)?;
    Ok(ctx.graph)
}

/// Adds the values `--keep-values` names as graph outputs after the
/// model's own, in node order: each computed value once (inputs, constants
/// and values already output are left out).
fn keep_values(
    ctx: &mut ImportCtx<'_>,
    graph: &GraphProto,
    order: &[usize],
) -> Result<(), OnnxError> {
    let opts = ctx.opts;
    let keep = &opts.keep_values;
    if *keep == KeepValues::None {
        return Ok(());
    }
    let mut output: HashSet<NodeId> = ctx.graph.outputs().iter().map(|(_, id)| *id).collect();
    let mut computed = Vec::new();
    for &i in order {
        for name in &graph.node[i].output {
            let Some(v) = ctx.lookup(name).filter(|&v| ctx.konst(v).is_none()) else {
                continue;
            };
            let id = ctx.node_of(v);
            if matches!(ctx.graph.node(id).op, kiln_ir::Op::Input { .. }) {
                continue;
            }
            computed.push(name.as_str());
            if keep.keeps(name) && output.insert(id) {
                ctx.graph.add_output(name.clone(), id);
            }
        }
    }
    if let KeepValues::Matching(patterns) = keep {
        if !patterns
            .iter()
            .any(|p| computed.iter().any(|name| p.matches(name)))
        {
            let examples: Vec<String> = computed.iter().take(3).map(|n| format!("'{n}'")).collect();
            return Err(OnnxError::KeepValues {
                patterns: keep.to_string(),
                examples: match examples.is_empty() {
                    true => "(none: every value folds)".into(),
                    false => examples.join(", "),
                },
            });
        }
    }
    Ok(())
}

/// What stands between a model and a compile, found without importing it:
/// see [`crate::preflight`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preflight {
    /// Every op Kiln cannot import.
    pub unsupported: Vec<UnsupportedOp>,
    /// Every graph-input dim that is symbolic or unknown and not bound by
    /// the options: `(input, dim index, dim_param name)`.
    pub unbound_dims: Vec<(String, usize, Option<String>)>,
}

impl Preflight {
    /// Whether nothing blocks the compile.
    pub fn is_clear(&self) -> bool {
        self.unsupported.is_empty() && self.unbound_dims.is_empty()
    }
}

pub(crate) fn preflight(model: &ModelProto, opts: &ImportOptions) -> Result<Preflight, OnnxError> {
    let graph = model
        .graph
        .as_ref()
        .ok_or_else(|| OnnxError::InvalidModel("the model has no graph".into()))?;
    let names: Vec<String> = (0..graph.node.len())
        .map(|i| node_display_name(graph, i))
        .collect();
    let mut report = Preflight {
        unsupported: scan_unsupported(model, graph, &names),
        ..Preflight::default()
    };
    let init_names: HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    for input in graph
        .input
        .iter()
        .filter(|i| !init_names.contains(i.name.as_str()))
    {
        if opts.input_shapes.contains_key(&input.name) {
            continue;
        }
        let (_, declared) = declared_type(input)?;
        for (i, d) in declared.into_iter().flatten().enumerate() {
            match d {
                Err(Some(p)) if opts.dims.contains_key(&p) => {}
                Err(p) => report.unbound_dims.push((input.name.clone(), i, p)),
                Ok(_) => {}
            }
        }
    }
    Ok(report)
}
