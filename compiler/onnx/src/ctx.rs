//! The import context: the graph under construction, the ONNX value table,
//! constant propagation and attribute access for op builders.

use crate::external::ExternalData;
use crate::{OnnxError, UnsupportedOp};
use kiln_ir::{Graph, IrError, NodeId, Op, Tensor, ValueType};
use std::collections::HashMap;
use std::path::Path;
use tract_onnx::pb::attribute_proto::AttributeType;
use tract_onnx::pb::{AttributeProto, NodeProto, TensorProto};

/// Results larger than this are not folded into constants at import.
pub const FOLD_LIMIT_BYTES: usize = 16 << 20;

/// A value during import: a graph node, a known constant, or both (a
/// constant is added to the graph only when a computing node reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Val(usize);

/// A value `DequantizeLinear` produced (f32, per-tensor or per-axis): its
/// quantized input, scale, zero point and axis. A MatMul of two such values
/// (a QDQ model) imports as an integer product of the quantized inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dequantized {
    /// The integer input.
    pub q: Val,
    /// The scale (scalar or one per index along `axis`).
    pub scale: Val,
    /// The zero point, if given.
    pub zero: Option<Val>,
    /// The per-axis axis (as written; may be negative).
    pub axis: i64,
}

struct ValEntry {
    name: String,
    ty: ValueType,
    konst: Option<Tensor>,
    node: Option<NodeId>,
}

/// State shared by the op builders while one model is imported.
pub struct ImportCtx<'a> {
    /// The IR graph being built.
    pub graph: Graph,
    /// The default-domain opset of the model.
    pub opset: i64,
    /// Import options (for size limits).
    pub(crate) opts: &'a crate::ImportOptions,
    /// Where external tensor data is read from, and how much is left.
    external: ExternalData<'a>,
    vals: Vec<ValEntry>,
    names: HashMap<String, Val>,
    /// Display name of the node being built.
    node_name: String,
    /// Op type of the node being built.
    op_type: String,
    /// Bytes of constant data created so far that the file does not hold
    /// (folded results, `ConstantOfShape`, `Expand`, folded BatchNorm
    /// parameters); bounded by `ImportOptions::max_generated_bytes`.
    generated_bytes: u64,
    /// Body nodes imported so far by unrolled control flow (each `Scan` and
    /// `Loop` iteration, each `If` branch); bounded by `ops::control`.
    unrolled_nodes: usize,
    /// The decoded initializers of each subgraph imported so far, keyed by
    /// the subgraph's address in the model (which outlives the import):
    /// every copy of a body shares them.
    subgraph_inits: HashMap<usize, Vec<(String, Val)>>,
    /// Values produced by `DequantizeLinear`, for QDQ pattern imports.
    dequantized: HashMap<Val, Dequantized>,
    /// The condition of `Branches::condition_of`, once the import met it.
    pub(crate) condition: Option<Val>,
    /// Markers of data-dependent size built so far (`Op::WithLength`,
    /// `docs/bounded.md`): while there are none, every static shape is a
    /// run's shape.
    markers: usize,
}

impl<'a> ImportCtx<'a> {
    pub(crate) fn new(
        opset: i64,
        opts: &'a crate::ImportOptions,
        model_dir: Option<&'a Path>,
    ) -> Self {
        ImportCtx {
            graph: Graph::new(),
            opset,
            opts,
            external: ExternalData::new(model_dir),
            vals: Vec::new(),
            names: HashMap::new(),
            node_name: String::new(),
            op_type: String::new(),
            generated_bytes: 0,
            unrolled_nodes: 0,
            subgraph_inits: HashMap::new(),
            dequantized: HashMap::new(),
            condition: None,
            markers: 0,
        }
    }

    /// The way a run-time decision goes on the path this import follows
    /// (`ImportOptions::branches`): `None` when the import follows no path
    /// (both branches of an `If` are imported), else the value `taken`
    /// gives, or [`OnnxError::Undecided`] naming the decision when it
    /// gives none. `cond` is the decision's condition, a one-element
    /// bool computed from run-time values: where it is the condition the
    /// import is for (`Branches::condition_of`), it is kept and the import
    /// stops (with `Undecided`, which `import_model` turns into the
    /// condition program).
    pub(crate) fn decide(
        &mut self,
        key: &str,
        what: impl FnOnce() -> String,
        cond: Val,
    ) -> Result<Option<bool>, OnnxError> {
        let Some(branches) = &self.opts.branches else {
            return Ok(None);
        };
        let undecided = |what: String| OnnxError::Undecided {
            key: key.to_string(),
            what,
        };
        if branches.condition_of.as_deref() == Some(key) {
            // The import stops here: `import_model` makes `cond` the
            // graph's one output.
            self.condition = Some(cond);
            return Err(undecided(what()));
        }
        match branches.taken.get(key) {
            Some(&taken) => Ok(Some(taken)),
            None => Err(undecided(what())),
        }
    }

    /// Records that `out` is `DequantizeLinear` of `d`.
    pub(crate) fn note_dequantized(&mut self, out: Val, d: Dequantized) {
        self.dequantized.insert(out, d);
    }

    /// How `v` was dequantized, when `DequantizeLinear` produced it.
    pub(crate) fn dequantized(&self, v: Val) -> Option<Dequantized> {
        self.dequantized.get(&v).copied()
    }

    pub(crate) fn set_current(&mut self, node_name: &str, op_type: &str) {
        self.node_name = node_name.to_string();
        self.op_type = op_type.to_string();
    }

    /// Display name of the node being built (the ONNX name, or
    /// `<op_type>_<index>`).
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Op type of the node being built.
    pub fn op_type(&self) -> &str {
        &self.op_type
    }

    fn push(
        &mut self,
        name: String,
        ty: ValueType,
        konst: Option<Tensor>,
        node: Option<NodeId>,
    ) -> Val {
        self.vals.push(ValEntry {
            name,
            ty,
            konst,
            node,
        });
        Val(self.vals.len() - 1)
    }

    /// Registers a graph input node under its ONNX name.
    pub(crate) fn bind_input(&mut self, name: &str, id: NodeId) {
        let ty = self.graph.node(id).ty.clone();
        let v = self.push(name.to_string(), ty, None, Some(id));
        self.names.insert(name.to_string(), v);
    }

    /// A constant value (added to the graph only when used by a node).
    pub fn constant(&mut self, t: Tensor, name: impl Into<String>) -> Val {
        let ty = ValueType::new(t.dtype(), t.shape().clone());
        self.push(name.into(), ty, Some(t), None)
    }

    /// A constant the current node creates (rather than reads from the
    /// file): its bytes count against `ImportOptions::max_generated_bytes`,
    /// so a small model cannot make the import allocate without bound.
    /// Errors with [`OnnxError::TooLarge`] naming the node when the budget
    /// would be exceeded.
    pub fn generated_constant(
        &mut self,
        t: Tensor,
        name: impl Into<String>,
    ) -> Result<Val, OnnxError> {
        self.charge_generated(t.size_bytes() as u64)?;
        Ok(self.constant(t, name))
    }

    /// Reserves `bytes` of the generated-constant budget for the current
    /// node before it allocates them.
    pub fn charge_generated(&mut self, bytes: u64) -> Result<(), OnnxError> {
        let limit = self.opts.max_generated_bytes;
        match self.generated_bytes.checked_add(bytes) {
            Some(total) if total <= limit => {
                self.generated_bytes = total;
                Ok(())
            }
            _ => Err(OnnxError::TooLarge {
                tensor: self.node_name.clone(),
                declared_bytes: bytes,
                reason: format!(
                    "{} ({}) would create it at import, and with the {} bytes of constants already created the model would exceed the limit of {limit} generated bytes (ImportOptions::max_generated_bytes)",
                    self.node_name, self.op_type, self.generated_bytes
                ),
            }),
        }
    }

    /// Whether `bytes` more generated constant data fit in the budget.
    fn generated_fits(&self, bytes: u64) -> bool {
        (self.generated_bytes.checked_add(bytes))
            .is_some_and(|t| t <= self.opts.max_generated_bytes)
    }

    /// Binds an ONNX value name to `v`.
    pub(crate) fn bind(&mut self, name: &str, v: Val) {
        self.names.insert(name.to_string(), v);
    }

    /// Removes the binding of an ONNX name (a subgraph's own name going out
    /// of scope).
    pub(crate) fn unbind(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// Body nodes imported so far by unrolled control flow.
    pub(crate) fn unrolled_nodes(&self) -> usize {
        self.unrolled_nodes
    }

    /// Records `n` more body nodes imported by unrolled control flow.
    pub(crate) fn count_unrolled(&mut self, n: usize) {
        self.unrolled_nodes = self.unrolled_nodes.saturating_add(n);
    }

    /// The initializers of the subgraph at `key`, if it was imported before.
    pub(crate) fn subgraph_inits(&self, key: usize) -> Option<&[(String, Val)]> {
        self.subgraph_inits.get(&key).map(|v| v.as_slice())
    }

    /// Records the initializers of the subgraph at `key`.
    pub(crate) fn set_subgraph_inits(&mut self, key: usize, inits: Vec<(String, Val)>) {
        self.subgraph_inits.insert(key, inits);
    }

    /// The value bound to an ONNX name.
    pub(crate) fn lookup(&self, name: &str) -> Option<Val> {
        self.names.get(name).copied()
    }

    /// The static type of a value.
    pub fn ty(&self, v: Val) -> &ValueType {
        &self.vals[v.0].ty
    }

    /// The constant value of `v`, if it is known at import.
    pub fn konst(&self, v: Val) -> Option<&Tensor> {
        self.vals[v.0].konst.as_ref()
    }

    /// The data-dependent value (`docs/bounded.md`) that `v` is computed
    /// from, if any: `v`'s static shape may then hold a bound where a run
    /// has fewer positions, so a Shape or Size of it would be wrong.
    pub(crate) fn bounded_source(&mut self, v: Val) -> Option<String> {
        if self.markers == 0 || self.konst(v).is_some() {
            return None;
        }
        let mut stack = vec![self.node_of(v)];
        let mut seen = std::collections::HashSet::new();
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let node = self.graph.node(id);
            if matches!(node.op, Op::WithLength { .. }) {
                return Some(node.name.clone());
            }
            stack.extend(self.graph.inputs_of(id));
        }
        None
    }

    /// Refuses to read `v`'s static shape as its run's shape when `v` has a
    /// data-dependent size (`what`: the op reading it).
    pub(crate) fn static_shape_of(&mut self, v: Val, what: &str) -> Result<(), OnnxError> {
        match self.bounded_source(v) {
            None => Ok(()),
            Some(source) => Err(self.unsupported(format!(
                "{what} of a value whose size depends on the data (computed from '{source}' at its bound): Kiln cuts such values only at the outputs, so its shape here would be the bound, not the run's size (docs/bounded.md)"
            ))),
        }
    }

    /// The graph node of `v`, adding a constant node on first use.
    pub fn node_of(&mut self, v: Val) -> NodeId {
        let e = &mut self.vals[v.0];
        if let Some(id) = e.node {
            return id;
        }
        let t = e.konst.clone().expect("a value is a node or a constant");
        let id = self.graph.add_const(e.name.clone(), t);
        self.vals[v.0].node = Some(id);
        id
    }

    /// A MatMul, Gemm or Conv with ONNX result typing: Kiln's dense ops on
    /// bf16/f16 operands return f32 (f32 accumulation), so an ONNX model in
    /// f16 or bf16 gets a Cast back to its own type after them.
    pub fn dense_op(
        &mut self,
        op: Op,
        inputs: &[Val],
        suffix: Option<&str>,
    ) -> Result<Val, OnnxError> {
        let d = self.ty(inputs[0]).dtype;
        let y = self.op(op, inputs, suffix)?;
        if self.ty(y).dtype == d {
            return Ok(y);
        }
        let name = match suffix {
            Some(s) => format!("{s}/cast"),
            None => "cast".to_string(),
        };
        self.op(Op::Cast { to: d }, &[y], Some(&name))
    }

    /// Applies an IR op to `inputs`: evaluated at import when every input is
    /// a constant, the result is at most [`FOLD_LIMIT_BYTES`] and fits in
    /// the generated-constant budget, and evaluating it costs at most
    /// [`kiln_ir::eval::FOLD_WORK_LIMIT`] operations; otherwise added to the
    /// graph. `suffix` distinguishes helper nodes of one ONNX
    /// node (`None` for the node's main result).
    pub fn op(&mut self, op: Op, inputs: &[Val], suffix: Option<&str>) -> Result<Val, OnnxError> {
        if matches!(op, Op::WithLength { .. }) {
            self.markers += 1;
        }
        let name = match suffix {
            Some(s) => format!("{}/{s}", self.node_name),
            None => self.node_name.clone(),
        };
        let types: Vec<&ValueType> = inputs.iter().map(|&v| self.ty(v)).collect();
        let ty = kiln_ir::infer::infer(&op, &types).map_err(|e| self.ir_err(e))?;
        let all_const = inputs.iter().all(|&v| self.konst(v).is_some());
        let bytes = ty
            .shape
            .iter()
            .try_fold(ty.dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
        let foldable = bytes
            .is_some_and(|b| b <= FOLD_LIMIT_BYTES && self.generated_fits(b as u64))
            && kiln_ir::eval::work(&op, &types, &ty) <= kiln_ir::eval::FOLD_WORK_LIMIT;
        if all_const && foldable {
            let tensors: Vec<&Tensor> = inputs
                .iter()
                .map(|&v| self.konst(v).expect("checked"))
                .collect();
            // An op the evaluator cannot run is simply left in the graph.
            if let Ok(t) = kiln_ir::eval::eval(&op, &tensors) {
                if t.dtype() == ty.dtype && t.shape() == &ty.shape {
                    return self.generated_constant(t, name);
                }
            }
        }
        let ids: Vec<NodeId> = inputs.iter().map(|&v| self.node_of(v)).collect();
        let id = self
            .graph
            .add_node(op, &ids, name)
            .map_err(|e| self.ir_err(e))?;
        let ty = self.graph.node(id).ty.clone();
        let n = self.graph.node(id).name.clone();
        Ok(self.push(n, ty, None, Some(id)))
    }

    /// Wraps an IR error with the current node.
    pub fn ir_err(&self, source: IrError) -> OnnxError {
        OnnxError::Node {
            node: self.node_name.clone(),
            op_type: self.op_type.clone(),
            source,
        }
    }

    /// An `Unsupported` error for the current node.
    pub fn unsupported(&self, hint: impl Into<String>) -> OnnxError {
        self.unsupported_unless_bound(hint, Vec::new())
    }

    fn unsupported_unless_bound(
        &self,
        hint: impl Into<String>,
        bindable_inputs: Vec<String>,
    ) -> OnnxError {
        OnnxError::Unsupported(vec![UnsupportedOp {
            op_type: self.op_type.clone(),
            node_name: self.node_name.clone(),
            domain: "ai.onnx".into(),
            opset: self.opset,
            hint: hint.into(),
            bindable_inputs,
        }])
    }

    /// The error for an op that needs `v` at compile time when it is not
    /// known: `hint` says what is needed, and the error lists the graph
    /// inputs `v` is computed from, so the user (or a test runner) can fix
    /// their values with `--bind-input`.
    pub fn not_constant(&self, v: Val, hint: impl Into<String>) -> OnnxError {
        let mut roots = Vec::new();
        if let Some(start) = self.vals[v.0].node {
            let mut seen = std::collections::HashSet::new();
            let mut stack = vec![start];
            while let Some(id) = stack.pop() {
                if !seen.insert(id) {
                    continue;
                }
                let node = self.graph.node(id);
                if matches!(node.op, Op::Input { .. }) {
                    roots.push(node.name.clone());
                }
                stack.extend(self.graph.inputs_of(id));
            }
        }
        // Graph input order, so the message and the runner are stable.
        let order: Vec<&str> = self
            .graph
            .inputs()
            .iter()
            .map(|&id| self.graph.node(id).name.as_str())
            .collect();
        roots.sort_by_key(|r| order.iter().position(|o| o == r));
        self.unsupported_unless_bound(hint, roots)
    }

    /// An `InvalidNode` error for the current node.
    pub fn invalid(&self, message: impl Into<String>) -> OnnxError {
        OnnxError::InvalidNode {
            node: self.node_name.clone(),
            op_type: self.op_type.clone(),
            message: message.into(),
        }
    }

    /// An `InvalidAttribute` error for the current node.
    pub fn bad_attr(&self, attribute: &str, message: impl Into<String>) -> OnnxError {
        OnnxError::InvalidAttribute {
            node: self.node_name.clone(),
            attribute: attribute.to_string(),
            message: message.into(),
        }
    }

    // ---- inputs ----

    /// Optional input `i` (absent or named "" gives `None`).
    pub fn opt_input(&self, node: &NodeProto, i: usize) -> Option<Val> {
        match node.input.get(i) {
            Some(name) if !name.is_empty() => self.lookup(name),
            _ => None,
        }
    }

    /// Required input `i`.
    pub fn input(&self, node: &NodeProto, i: usize) -> Result<Val, OnnxError> {
        self.opt_input(node, i)
            .ok_or_else(|| self.invalid(format!("required input {i} is missing")))
    }

    /// All present inputs, in order.
    pub fn inputs(&self, node: &NodeProto) -> Vec<Val> {
        (0..node.input.len())
            .filter_map(|i| self.opt_input(node, i))
            .collect()
    }

    /// Optional input `i` that must be known at compile time.
    pub fn opt_const_input(&self, node: &NodeProto, i: usize) -> Result<Option<Tensor>, OnnxError> {
        match self.opt_input(node, i) {
            None => Ok(None),
            Some(v) => match self.konst(v) {
                Some(t) => Ok(Some(t.clone())),
                None => {
                    Err(self.not_constant(v, format!("input {i} must be a compile-time constant")))
                }
            },
        }
    }

    /// Required input `i` that must be known at compile time.
    pub fn const_input(&self, node: &NodeProto, i: usize) -> Result<Tensor, OnnxError> {
        self.input(node, i)?;
        Ok(self.opt_const_input(node, i)?.expect("present"))
    }

    // ---- attributes ----

    fn attr<'n>(&self, node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
        node.attribute.iter().find(|a| a.name == name)
    }

    /// The attribute `name`, checked to have protobuf type `want` (an
    /// attribute with type UNDEFINED, as some old exporters write, is
    /// accepted and read by content).
    fn typed_attr<'n>(
        &self,
        node: &'n NodeProto,
        name: &str,
        want: AttributeType,
    ) -> Result<Option<&'n AttributeProto>, OnnxError> {
        let Some(a) = self.attr(node, name) else {
            return Ok(None);
        };
        if a.r#type == want as i32 || a.r#type == AttributeType::Undefined as i32 {
            return Ok(Some(a));
        }
        Err(OnnxError::AttributeType {
            node: self.node_name.clone(),
            attribute: name.to_string(),
            expected: want.as_str_name().to_string(),
            found: AttributeType::try_from(a.r#type)
                .map(|t| t.as_str_name().to_string())
                .unwrap_or_else(|_| format!("type code {}", a.r#type)),
        })
    }

    /// Whether the node has attribute `name`.
    pub fn has_attr(&self, node: &NodeProto, name: &str) -> bool {
        self.attr(node, name).is_some()
    }

    /// An INT attribute.
    pub fn attr_i(&self, node: &NodeProto, name: &str) -> Result<Option<i64>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::Int)?
            .map(|a| a.i))
    }

    /// An INT attribute with a default.
    pub fn attr_i_or(&self, node: &NodeProto, name: &str, default: i64) -> Result<i64, OnnxError> {
        Ok(self.attr_i(node, name)?.unwrap_or(default))
    }

    /// A FLOAT attribute.
    pub fn attr_f(&self, node: &NodeProto, name: &str) -> Result<Option<f32>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::Float)?
            .map(|a| a.f))
    }

    /// A FLOAT attribute with a default.
    pub fn attr_f_or(&self, node: &NodeProto, name: &str, default: f32) -> Result<f32, OnnxError> {
        Ok(self.attr_f(node, name)?.unwrap_or(default))
    }

    /// An INTS attribute.
    pub fn attr_ints(&self, node: &NodeProto, name: &str) -> Result<Option<Vec<i64>>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::Ints)?
            .map(|a| a.ints.clone()))
    }

    /// A FLOATS attribute.
    pub fn attr_floats(&self, node: &NodeProto, name: &str) -> Result<Option<Vec<f32>>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::Floats)?
            .map(|a| a.floats.clone()))
    }

    /// A STRING attribute (lossy UTF-8).
    pub fn attr_s(&self, node: &NodeProto, name: &str) -> Result<Option<String>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::String)?
            .map(|a| String::from_utf8_lossy(&a.s).into_owned()))
    }

    /// A TENSOR attribute.
    pub fn attr_t<'n>(
        &self,
        node: &'n NodeProto,
        name: &str,
    ) -> Result<Option<&'n TensorProto>, OnnxError> {
        Ok(self
            .typed_attr(node, name, AttributeType::Tensor)?
            .and_then(|a| a.t.as_ref()))
    }

    /// The raw attribute (for ops whose attribute type changed across opsets).
    pub fn raw_attr<'n>(&self, node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
        self.attr(node, name)
    }

    /// Resolves a possibly negative axis against `rank`.
    pub fn axis(&self, attribute: &str, axis: i64, rank: usize) -> Result<usize, OnnxError> {
        let r = rank as i64;
        let a = if axis < 0 { axis + r } else { axis };
        if a < 0 || a >= r {
            return Err(self.bad_attr(
                attribute,
                format!("axis {axis} is out of range for rank {rank}"),
            ));
        }
        Ok(a as usize)
    }

    /// Decodes a tensor attribute or constant with the model's size limit.
    pub fn tensor(&self, t: &TensorProto, name: &str) -> Result<Tensor, OnnxError> {
        crate::tensor::tensor_from_proto(t, name, &self.external, self.opts.max_initializer_bytes)
    }
}
