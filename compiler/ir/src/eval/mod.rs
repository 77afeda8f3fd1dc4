//! Naive reference evaluator: the ground truth for constant folding and for
//! checking that a pass preserved a graph's meaning.
//!
//! Semantics are ONNX's. Arithmetic:
//! - `f32` values are computed in `f32`, except that dot products (MatMul,
//!   Gemm, Conv) and sums (AveragePool, GlobalAveragePool, the Softmax
//!   denominator) accumulate in `f64` and are rounded to `f32` once;
//!   elementwise ops go through the `f64` scalar semantics of
//!   [`UnaryOp::apply`](crate::UnaryOp::apply) and
//!   [`BinaryOp::apply_f64`](crate::BinaryOp::apply_f64) and are rounded once;
//! - `f64` values are computed in `f64`;
//! - `f16` and `bf16` values are widened to `f32`, computed as `f32`, and
//!   rounded back;
//! - integers use wrapping integer semantics; an integer division by zero is
//!   an [`IrError::Eval`] error.
//!
//! Layout ops (Reshape, Transpose, Concat, Gather, Slice, Cast) and Where
//! work for every element type; comparisons compare exactly (floats as f64,
//! integers as i64).

mod conv;
mod elementwise;
mod fused;
mod layout;
mod linalg;
mod logic;
mod norm;
mod pool;
mod reduce;
mod resize;
mod softmax;

use crate::infer::strides_of;
use crate::{infer, DType, Data, Graph, IrError, NodeId, Op, Tensor, ValueType};
use half::{bf16, f16};
use std::collections::{HashMap, HashSet};
use std::ops::{Add, Div, Mul, Sub};

/// Default bound on [`work`] for folding constants: 2^26 scalar operations,
/// about a second of reference evaluation in a debug build.
pub const FOLD_WORK_LIMIT: u64 = 1 << 26;

/// The number of scalar operations [`eval`] performs for `op` with inputs
/// of types `inputs` and output `output`, saturating at `u64::MAX`: the
/// output size times the reduction length for MatMul, Gemm, Conv and
/// pooling, the elements read and written for every other op. Callers that
/// fold constants bound it, so a small model cannot make them compute for
/// hours (a 1 KB model can declare a constant Conv of 2^40 multiply-adds).
pub fn work(op: &Op, inputs: &[&ValueType], output: &ValueType) -> u64 {
    // A fused kernel: its head's work, then one program step per element
    // read or written.
    if let Op::Fused(k) = op {
        let n = k.head().map_or(0, |h| h.inputs.min(inputs.len()));
        let head = k
            .head()
            .map_or(0, |h| work(&h.op.op(), &inputs[..n], output));
        let steps = k.body().instrs().len() as u64;
        let body = work(&Op::Unary(crate::UnaryOp::Relu), &inputs[n..], output);
        return head.saturating_add(body.saturating_mul(steps));
    }
    let elems = |t: &ValueType| (t.shape.iter()).fold(1u64, |acc, &d| acc.saturating_mul(d as u64));
    let out = elems(output);
    if let (Op::Attention { .. }, [q, kt, v, ..]) = (op, inputs) {
        // Both products, plus a few operations per score for the softmax.
        let (k, n, d) = (
            q.shape.last().copied().unwrap_or(1) as u64,
            kt.shape.last().copied().unwrap_or(1) as u64,
            v.shape.last().copied().unwrap_or(1).max(1) as u64,
        );
        let scores = (out / d).saturating_mul(n);
        return scores.saturating_mul(k.saturating_add(d).saturating_add(8));
    }
    let reduction = match op {
        // A[.., M, K] x B[.., K, N]: K per output element.
        Op::MatMul | Op::MatMulInteger => inputs
            .first()
            .and_then(|a| a.shape.last())
            .map(|&k| k as u64),
        // A is M x K (or K x M): K = |A| / M.
        Op::Gemm { .. } => (inputs.first())
            .zip(output.shape.first())
            .map(|(a, &m)| elems(a) / (m as u64).max(1)),
        // W is [O, C/group, kh, kw]: |W| / O per output element.
        Op::Conv(_) | Op::ConvInteger(_) => (inputs.get(1))
            .zip(inputs.get(1).and_then(|w| w.shape.first()))
            .map(|(w, &o)| elems(w) / (o as u64).max(1)),
        Op::MaxPool(p) | Op::AveragePool { pool: p, .. } => {
            Some((p.kernel[0] as u64).saturating_mul(p.kernel[1] as u64))
        }
        _ => None,
    };
    match reduction {
        Some(k) => out.saturating_mul(k.max(1)),
        None => (inputs.iter()).fold(out, |acc, t| acc.saturating_add(elems(t))),
    }
}

/// Evaluates one op on constant inputs; the output type equals
/// [`infer::infer`] of the op on the input types.
///
/// `Op::Constant` (with no inputs) evaluates to its tensor; `Op::Input` has
/// no value outside [`eval_graph`] and is an error.
pub fn eval(op: &Op, inputs: &[&Tensor]) -> Result<Tensor, IrError> {
    let name = op.name();
    match op {
        Op::Input { .. } => {
            return Err(eval_err(
                name,
                "a graph input has no value outside eval_graph",
            ))
        }
        Op::Constant(t) if inputs.is_empty() => return Ok(t.clone()),
        Op::Constant(_) => return Err(eval_err(name, "a constant takes no inputs")),
        _ => {}
    }
    let types: Vec<ValueType> = inputs
        .iter()
        .map(|t| ValueType::new(t.dtype(), t.shape()))
        .collect();
    let type_refs: Vec<&ValueType> = types.iter().collect();
    let out = infer::infer(op, &type_refs)?;
    let data = match op {
        Op::Input { .. } | Op::Constant(_) => unreachable!("handled above"),
        Op::Reshape { .. } => return layout::reshape(inputs[0], &out),
        Op::Cast { to } => return Ok(layout::cast(inputs[0], *to)),
        Op::Bitcast { to } => {
            let bytes = inputs[0].data().to_le_bytes();
            Data::from_le_bytes(*to, &bytes)
                .ok_or_else(|| eval_err(name, "the bytes do not hold whole elements"))?
        }
        Op::Unary(u) => elementwise::unary(*u, inputs[0])?,
        Op::Binary(b) => elementwise::binary(*b, inputs[0], inputs[1], &out)?,
        Op::MatMul => linalg::matmul(inputs[0], inputs[1], &out)?,
        Op::MatMulInteger => linalg::matmul_integer(inputs, &out)?,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => linalg::gemm(*alpha, *beta, *trans_a, *trans_b, inputs, &out)?,
        Op::Conv(c) => conv::conv(c, inputs, &out)?,
        Op::ConvInteger(c) => conv::conv_integer(c, inputs, &out)?,
        Op::MaxPool(p) => pool::max_pool(p, inputs[0], &out)?,
        Op::AveragePool {
            pool,
            count_include_pad,
        } => pool::average_pool(pool, *count_include_pad, inputs[0], &out)?,
        Op::GlobalAveragePool => pool::global_pool(false, inputs[0])?,
        Op::GlobalMaxPool => pool::global_pool(true, inputs[0])?,
        Op::Softmax { axis } => softmax::softmax(*axis, inputs[0])?,
        Op::Attention { scale } => return softmax::attention(*scale, inputs),
        Op::Transpose { perm } => layout::transpose(perm, inputs[0], &out),
        Op::Concat { axis } => layout::concat(*axis, inputs)?,
        Op::Gather { axis } => layout::gather(*axis, inputs[0], inputs[1])?,
        Op::Slice { axes } => layout::slice(axes, inputs[0], &out),
        Op::Compare(c) => logic::compare(*c, inputs[0], inputs[1], &out)?,
        Op::Logical(l) => logic::logical(*l, inputs[0], inputs[1], &out)?,
        Op::Not => logic::not(inputs[0])?,
        Op::Bitwise(op) => logic::bitwise(*op, inputs[0], inputs[1], &out)?,
        Op::BitwiseNot => logic::bitwise_not(inputs[0])?,
        Op::Where => logic::where_(inputs[0], inputs[1], inputs[2], &out)?,
        Op::Reduce { op, axes, .. } => reduce::reduce(*op, axes, inputs[0], &out)?,
        Op::Expand { .. } => layout::expand(inputs[0], &out),
        Op::LayerNorm { axis, epsilon } => norm::layer_norm(*axis, *epsilon, inputs)?,
        Op::Resize(r) => resize::resize(r, inputs[0])?,
        Op::Col2Im(c) => resize::col2im(c, inputs[0])?,
        Op::Fused(k) => return fused::fused(k, inputs),
        Op::NonZero => layout::non_zero(inputs[0]),
        Op::NonMaxSuppression(n) => layout::non_max_suppression(n, inputs),
        Op::Unique { sorted } => layout::unique(*sorted, inputs[0]),
        Op::WithLength { axis } => return layout::with_length(*axis, inputs[0], inputs[1]),
    };
    // Data movement treats a narrow type's codes as bytes (`Data::U8`);
    // the inferred type says what they are.
    let data = match data {
        Data::U8(codes) if out.dtype.is_narrow() => Data::Narrow(out.dtype, codes),
        data => data,
    };
    if data.dtype() != out.dtype {
        return Err(eval_err(
            name,
            format!("internal: produced {} for a {} value", data.dtype(), out),
        ));
    }
    let n = data.len();
    Tensor::new(&out.shape, data).ok_or_else(|| {
        eval_err(
            name,
            format!("internal: produced {n} elements for a {out} value"),
        )
    })
}

/// Runs a whole graph on the given graph inputs (in graph input order) and
/// returns its outputs in graph output order.
///
/// Each input must have the type of its `Input` node. Only the nodes the
/// outputs depend on are evaluated, and intermediate values are dropped as
/// soon as their last user has run.
pub fn eval_graph(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, IrError> {
    eval_graph_with(graph, inputs, |_, _| {})
}

/// [`eval_graph`] that also shows every computed value (not constants or
/// inputs) to `visit` as soon as it exists, in evaluation order: the
/// precision report compares them node by node.
pub fn eval_graph_with(
    graph: &Graph,
    inputs: &[Tensor],
    mut visit: impl FnMut(NodeId, &Tensor),
) -> Result<Vec<Tensor>, IrError> {
    let mut outputs = eval_graph_batch(graph, &[inputs], |id, values| visit(id, &values[0]))?;
    Ok(outputs.pop().expect("one sample in, one out"))
}

/// Runs a whole graph on several samples at once, node by node: every
/// computed value (not constants or inputs) of all samples is shown to
/// `visit`, which may change it before any user of the node runs (the
/// bias correction of int8 layers measures a layer's error over all
/// calibration samples and corrects it before the next layer reads it).
/// Returns each sample's outputs in graph output order.
///
/// Constants are read in place from the graph, and values are dropped as
/// soon as their last user has run, so memory is the samples times the
/// graph's live values, not the whole graph.
pub fn eval_graph_batch<S: AsRef<[Tensor]>>(
    graph: &Graph,
    samples: &[S],
    mut visit: impl FnMut(NodeId, &mut [Tensor]),
) -> Result<Vec<Vec<Tensor>>, IrError> {
    for inputs in samples {
        check_inputs(graph, inputs.as_ref())?;
    }
    // Only nodes the outputs depend on run, so a dead node cannot fail.
    let mut live: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|(_, id)| *id).collect();
    while let Some(id) = stack.pop() {
        if live.insert(id) {
            stack.extend(graph.inputs_of(id));
        }
    }
    let order: Vec<NodeId> = graph
        .topo_order()?
        .into_iter()
        .filter(|id| live.contains(id))
        .collect();
    // Remaining uses of each value (live edges plus graph outputs), so that
    // intermediates can be freed early.
    let mut uses: HashMap<NodeId, usize> = HashMap::new();
    for &id in &order {
        for input in graph.inputs_of(id) {
            *uses.entry(input).or_default() += 1;
        }
    }
    for (_, id) in graph.outputs() {
        *uses.entry(*id).or_default() += 1;
    }
    // One value per sample, by node; constants stay in the graph.
    let mut values: HashMap<NodeId, Vec<Tensor>> = HashMap::new();
    for id in order {
        let node = graph.node(id);
        let at_node = |e: IrError| annotate(e, &node.name);
        let mut computed = match &node.op {
            Op::Constant(_) => continue,
            Op::Input { index } => samples
                .iter()
                .map(|inputs| {
                    inputs.as_ref().get(*index).cloned().ok_or_else(|| {
                        eval_err("input", format!("no value for graph input #{index}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            op => {
                let args = graph.inputs_of(id);
                let computed = (0..samples.len())
                    .map(|sample| {
                        let arg_values = args
                            .iter()
                            .map(|a| match graph.constant(*a) {
                                Some(t) => Some(t),
                                None => values.get(a).map(|v| &v[sample]),
                            })
                            .collect::<Option<Vec<&Tensor>>>()
                            .ok_or_else(|| at_node(eval_err(op.name(), "an input has no value")))?;
                        eval(op, &arg_values).map_err(at_node)
                    })
                    .collect::<Result<Vec<Tensor>, IrError>>()?;
                for a in args {
                    let left = uses.get_mut(&a).expect("counted above");
                    *left -= 1;
                    if *left == 0 {
                        values.remove(&a);
                    }
                }
                computed
            }
        };
        for value in &computed {
            if value.dtype() != node.ty.dtype || value.shape() != &node.ty.shape {
                return Err(at_node(eval_err(
                    node.op.name(),
                    format!(
                        "value is {}{:?} but the node's type is {}",
                        value.dtype(),
                        value.shape().as_slice(),
                        node.ty
                    ),
                )));
            }
        }
        if !matches!(node.op, Op::Input { .. }) {
            visit(id, &mut computed);
        }
        if uses.get(&id).copied().unwrap_or(0) > 0 {
            values.insert(id, computed);
        }
    }
    (0..samples.len())
        .map(|sample| {
            graph
                .outputs()
                .iter()
                .map(|(name, id)| match graph.constant(*id) {
                    Some(t) => Ok(t.clone()),
                    None => values
                        .get(id)
                        .map(|v| v[sample].clone())
                        .ok_or_else(|| eval_err("output", format!("output '{name}' has no value"))),
                })
                .collect()
        })
        .collect()
}

/// Checks one sample's values against the graph's inputs.
fn check_inputs(graph: &Graph, inputs: &[Tensor]) -> Result<(), IrError> {
    if inputs.len() != graph.inputs().len() {
        return Err(eval_err(
            "input",
            format!(
                "the graph has {} inputs, got {} values",
                graph.inputs().len(),
                inputs.len()
            ),
        ));
    }
    for (&id, t) in graph.inputs().iter().zip(inputs) {
        let node = graph.node(id);
        if t.dtype() != node.ty.dtype || t.shape() != &node.ty.shape {
            return Err(eval_err(
                "input",
                format!(
                    "input '{}' is {} but got a {}{:?} value",
                    node.name,
                    node.ty,
                    t.dtype(),
                    t.shape().as_slice()
                ),
            ));
        }
    }
    Ok(())
}

/// An [`IrError::Eval`] error.
pub(crate) fn eval_err(op: &'static str, message: impl Into<String>) -> IrError {
    IrError::Eval {
        op,
        message: message.into(),
    }
}

/// Prefixes an error's message with the node it happened at.
fn annotate(e: IrError, node: &str) -> IrError {
    match e {
        IrError::Eval { op, message } => IrError::Eval {
            op,
            message: format!("node '{node}': {message}"),
        },
        IrError::Type { op, message } => IrError::Type {
            op,
            message: format!("node '{node}': {message}"),
        },
        e => e,
    }
}

/// Flat source offsets for every element of a row-major output of shape
/// `shape`: element `idx` reads offset `base + Σ idx[i] * strides[i]`.
///
/// The one index helper behind broadcasting, transposes and slices.
pub(crate) fn strided_offsets(shape: &[usize], base: usize, strides: &[isize]) -> Vec<usize> {
    debug_assert_eq!(shape.len(), strides.len());
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some((&inner, outer)) = shape.split_last() else {
        out.push(base);
        return out;
    };
    let step = strides[outer.len()];
    let mut idx = vec![0usize; outer.len()];
    let mut off = base as isize;
    loop {
        // A run along the last axis, then the odometer over the others.
        out.extend((0..inner as isize).map(|j| (off + j * step) as usize));
        let mut axis = outer.len();
        loop {
            if axis == 0 {
                return out;
            }
            axis -= 1;
            idx[axis] += 1;
            off += strides[axis];
            if idx[axis] < outer[axis] {
                break;
            }
            off -= strides[axis] * outer[axis] as isize;
            idx[axis] = 0;
        }
    }
}

/// numpy broadcasting: for every element of a row-major tensor of shape
/// `to`, the flat index of the element of a tensor of shape `from` it reads.
/// `from` must broadcast to `to` (as checked by inference).
pub(crate) fn broadcast_offsets(from: &[usize], to: &[usize]) -> Vec<usize> {
    debug_assert!(from.len() <= to.len());
    let lead = to.len() - from.len();
    let from_strides = strides_of(from);
    let strides: Vec<isize> = (0..to.len())
        .map(|i| {
            if i < lead || from[i - lead] == 1 {
                0
            } else {
                debug_assert_eq!(from[i - lead], to[i]);
                from_strides[i - lead] as isize
            }
        })
        .collect();
    strided_offsets(to, 0, &strides)
}

/// An element type of [`Data`], for code generic over all of them.
pub(crate) trait Elem: Copy {
    /// The elements of `d` if it holds this type.
    fn slice(d: &Data) -> Option<&[Self]>;
    /// Wraps a vector in the matching [`Data`] variant.
    fn wrap(v: Vec<Self>) -> Data;
}

macro_rules! impl_elem {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl Elem for $t {
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn wrap(v: Vec<Self>) -> Data {
                Data::$variant(v)
            }
        })*
    };
}

impl_elem!(
    f32 => F32, f16 => F16, bf16 => BF16, f64 => F64, i8 => I8,
    i16 => I16, i32 => I32, i64 => I64, bool => Bool,
    u16 => U16, u32 => U32, u64 => U64,
);

/// Bytes, and the codes of the narrow types, which data movement (Concat,
/// Where, ...) moves as bytes: results come back as `Data::U8` and
/// [`eval`] retypes them to the inferred narrow type.
impl Elem for u8 {
    fn slice(d: &Data) -> Option<&[Self]> {
        match d {
            Data::U8(v) | Data::Narrow(_, v) => Some(v),
            _ => None,
        }
    }
    fn wrap(v: Vec<Self>) -> Data {
        Data::U8(v)
    }
}

/// Copies `v[idx[i]]` for every `i`.
pub(crate) fn gather_elems<T: Elem>(v: &[T], idx: &[usize]) -> Data {
    T::wrap(idx.iter().map(|&i| v[i]).collect())
}

/// The arithmetic types float kernels run in (`f32` and `f64`).
pub(crate) trait Float:
    Elem
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// Rounds from f64.
    fn from_f64(x: f64) -> Self;
    /// Widens to f64.
    fn to_f64(self) -> f64;
    /// `e^self`.
    fn exp(self) -> Self;
}

impl Float for f32 {
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
}

impl Float for f64 {
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
}

/// A float computation written once for `f32` and `f64`.
/// `t` widened to f64, element by element (exactly).
pub(crate) fn widened<T: Float>(t: &[T]) -> Vec<f64> {
    t.iter().map(|v| v.to_f64()).collect()
}

pub(crate) trait FloatKernel {
    /// Computes the output elements from the input elements (all inputs of
    /// one type).
    fn run<T: Float>(&self, inputs: &[&[T]]) -> Vec<T>;
}

/// Runs `kernel` on float inputs that all have the same element type: `f32`
/// and `f64` natively, `f16` and `bf16` widened to `f32` and rounded back.
pub(crate) fn run_float(
    op: &'static str,
    inputs: &[&Tensor],
    kernel: &impl FloatKernel,
) -> Result<Data, IrError> {
    fn slices<'a, T: Elem>(
        op: &'static str,
        inputs: &[&'a Tensor],
    ) -> Result<Vec<&'a [T]>, IrError> {
        inputs
            .iter()
            .map(|t| T::slice(t.data()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| eval_err(op, "inputs have different element types"))
    }
    let dtype = inputs[0].dtype();
    if inputs.iter().any(|t| t.dtype() != dtype) {
        return Err(eval_err(op, "inputs have different element types"));
    }
    let widened = || -> Vec<Vec<f32>> { inputs.iter().map(|t| t.to_f32_vec()).collect() };
    Ok(match dtype {
        DType::F32 => Data::F32(kernel.run(&slices::<f32>(op, inputs)?)),
        DType::F64 => Data::F64(kernel.run(&slices::<f64>(op, inputs)?)),
        DType::F16 => {
            let w = widened();
            let s: Vec<&[f32]> = w.iter().map(Vec::as_slice).collect();
            Data::F16(kernel.run(&s).into_iter().map(f16::from_f32).collect())
        }
        DType::BF16 => {
            let w = widened();
            let s: Vec<&[f32]> = w.iter().map(Vec::as_slice).collect();
            Data::BF16(kernel.run(&s).into_iter().map(bf16::from_f32).collect())
        }
        other => return Err(eval_err(op, format!("needs a float input, got {other}"))),
    })
}

/// Runs a dense op (MatMul, Gemm, Conv). A reduced-precision one (a bf16
/// or f16 operand, f32 result: see [`infer::dense_result`]) computes what
/// the kernels compute: every operand widened exactly from its stored type,
/// products accumulated at least in f32, the sum returned as f32; the
/// rounding to bf16/f16 happened where the operand was stored.
pub(crate) fn run_dense(
    op: &'static str,
    inputs: &[&Tensor],
    out: &ValueType,
    kernel: &impl FloatKernel,
) -> Result<Data, IrError> {
    if out.dtype == DType::F32 && inputs.iter().any(|t| infer::is_half(t.dtype())) {
        let w: Vec<Vec<f32>> = inputs.iter().map(|t| t.to_f32_vec()).collect();
        let s: Vec<&[f32]> = w.iter().map(Vec::as_slice).collect();
        return Ok(Data::F32(kernel.run(&s)));
    }
    run_float(op, inputs, kernel)
}

#[cfg(test)]
pub(crate) mod test_util {
    use crate::{Data, Tensor};

    /// An f32 tensor.
    pub fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(shape, Data::F32(v.to_vec())).expect("element count")
    }

    /// An i64 tensor.
    pub fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::new(shape, Data::I64(v.to_vec())).expect("element count")
    }

    /// `n` f32 values 0, 1, 2, ...
    pub fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        f32s(shape, &(0..n).map(|i| i as f32).collect::<Vec<_>>())
    }

    /// Asserts elementwise closeness (absolute tolerance 1e-5).
    #[track_caller]
    pub fn assert_close(t: &Tensor, shape: &[usize], expected: &[f64]) {
        assert_eq!(t.shape().as_slice(), shape, "shape");
        let got = t.to_f64_vec();
        assert_eq!(got.len(), expected.len(), "element count");
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(
                (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                "element {i}: got {g}, expected {e}; all: {got:?}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::*;
    use super::*;
    use crate::{BinaryOp, UnaryOp};

    #[test]
    fn strided_offsets_walks_row_major() {
        assert_eq!(strided_offsets(&[2, 3], 0, &[3, 1]), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(strided_offsets(&[3, 2], 0, &[1, 3]), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(strided_offsets(&[3], 4, &[-2]), vec![4, 2, 0]);
        assert_eq!(strided_offsets(&[], 7, &[]), vec![7]);
        assert!(strided_offsets(&[2, 0], 0, &[0, 1]).is_empty());
    }

    #[test]
    fn broadcast_offsets_repeat_size_one_and_missing_dims() {
        // [2,1] -> [2,3]: each row repeats its single element.
        assert_eq!(broadcast_offsets(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        // [3] -> [2,3]: the vector repeats for each row.
        assert_eq!(broadcast_offsets(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_offsets(&[], &[2]), vec![0, 0]);
    }

    #[test]
    fn eval_rejects_bad_inputs_through_inference() {
        let a = f32s(&[2], &[1.0, 2.0]);
        let b = f32s(&[3], &[1.0, 2.0, 3.0]);
        let e = eval(&Op::Binary(BinaryOp::Add), &[&a, &b]).unwrap_err();
        assert!(matches!(e, IrError::Type { op: "add", .. }), "{e:?}");
        let e = eval(&Op::Input { index: 0 }, &[]).unwrap_err();
        assert!(matches!(e, IrError::Eval { .. }), "{e:?}");
        assert_eq!(eval(&Op::Constant(a.clone()), &[]).unwrap(), a);
    }

    #[test]
    fn eval_graph_three_nodes() {
        // y = relu(x + c) * x  with x = [-2, 1, 3], c = [1, 1, -5]
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [3]));
        let c = g.add_const("c", f32s(&[3], &[1.0, 1.0, -5.0]));
        let s = g.add_node(Op::Binary(BinaryOp::Add), &[x, c], "s").unwrap();
        let r = g.add_node(Op::Unary(UnaryOp::Relu), &[s], "r").unwrap();
        let y = g.add_node(Op::Binary(BinaryOp::Mul), &[r, x], "y").unwrap();
        g.add_output("y", y);
        g.add_output("s", s);
        let out = eval_graph(&g, &[f32s(&[3], &[-2.0, 1.0, 3.0])]).unwrap();
        assert_eq!(out.len(), 2);
        assert_close(&out[0], &[3], &[0.0, 2.0, 0.0]);
        assert_close(&out[1], &[3], &[-1.0, 2.0, -2.0]);
    }

    #[test]
    fn eval_graph_checks_inputs() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [3]));
        let y = g.add_node(Op::Unary(UnaryOp::Neg), &[x], "y").unwrap();
        g.add_output("y", y);
        let wrong_shape = eval_graph(&g, &[f32s(&[2], &[1.0, 2.0])]).unwrap_err();
        assert!(
            matches!(wrong_shape, IrError::Eval { .. }),
            "{wrong_shape:?}"
        );
        let wrong_type = eval_graph(&g, &[i64s(&[3], &[1, 2, 3])]).unwrap_err();
        assert!(matches!(wrong_type, IrError::Eval { .. }), "{wrong_type:?}");
        assert!(eval_graph(&g, &[]).is_err());
    }

    #[test]
    fn eval_graph_skips_dead_nodes() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::I64, [1]));
        let z = g.add_const("zero", i64s(&[1], &[0]));
        let _dead = g
            .add_node(Op::Binary(BinaryOp::Div), &[x, z], "dead")
            .unwrap();
        let y = g.add_node(Op::Binary(BinaryOp::Add), &[x, x], "y").unwrap();
        g.add_output("y", y);
        g.add_output("x", x);
        let out = eval_graph(&g, &[i64s(&[1], &[21])]).unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![42]);
        assert_eq!(out[1].to_i64_vec(), vec![21]);
    }

    /// Samples run together: each gets what it gets alone, and a value
    /// the visitor changes is what the node's users read.
    #[test]
    fn eval_graph_batch_runs_samples_together_and_lets_the_visitor_edit() {
        // y = (x + c) * x, outputs y and a constant.
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::F32, [2]));
        let c = g.add_const("c", f32s(&[2], &[1.0, -1.0]));
        let s = g.add_node(Op::Binary(BinaryOp::Add), &[x, c], "s").unwrap();
        let y = g.add_node(Op::Binary(BinaryOp::Mul), &[s, x], "y").unwrap();
        g.add_output("y", y);
        g.add_output("c", c);
        let samples = [vec![f32s(&[2], &[1.0, 2.0])], vec![f32s(&[2], &[3.0, 4.0])]];
        let mut seen = Vec::new();
        let out = eval_graph_batch(&g, &samples, |id, values| {
            seen.push((id, values.len()));
            if id == s {
                // s + 10 in every sample.
                for v in values.iter_mut() {
                    let shifted: Vec<f32> = v.to_f32_vec().iter().map(|a| a + 10.0).collect();
                    *v = f32s(&[2], &shifted);
                }
            }
        })
        .unwrap();
        assert_eq!(seen, [(s, 2), (y, 2)]);
        assert_close(&out[0][0], &[2], &[12.0, 22.0]);
        assert_close(&out[1][0], &[2], &[42.0, 52.0]);
        assert_close(&out[1][1], &[2], &[1.0, -1.0]);
        // Unedited, a sample gets what eval_graph gives it alone.
        let together = eval_graph_batch(&g, &samples, |_, _| {}).unwrap();
        for (sample, out) in samples.iter().zip(&together) {
            assert_eq!(&eval_graph(&g, sample).unwrap(), out);
        }
        let bad = [vec![f32s(&[2], &[1.0, 2.0])], vec![f32s(&[3], &[1.0; 3])]];
        assert!(eval_graph_batch(&g, &bad, |_, _| {}).is_err());
    }

    #[test]
    fn eval_graph_reports_the_failing_node() {
        let mut g = Graph::new();
        let x = g.add_input("x", ValueType::new(DType::I64, [2]));
        let z = g.add_const("zero", i64s(&[1], &[0]));
        let y = g
            .add_node(Op::Binary(BinaryOp::Div), &[x, z], "the_div")
            .unwrap();
        g.add_output("y", y);
        match eval_graph(&g, &[i64s(&[2], &[4, 6])]).unwrap_err() {
            IrError::Eval { op, message } => {
                assert_eq!(op, "div");
                assert!(message.contains("the_div"), "{message}");
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn f16_and_bf16_round_trip_through_f32() {
        let x = Tensor::new(
            [2],
            Data::F16(vec![f16::from_f32(1.5), f16::from_f32(-2.0)]),
        )
        .unwrap();
        let y = eval(&Op::Binary(BinaryOp::Mul), &[&x, &x]).unwrap();
        assert_eq!(y.dtype(), DType::F16);
        assert_close(&y, &[2], &[2.25, 4.0]);
        let x = Tensor::new([1], Data::BF16(vec![bf16::from_f32(3.0)])).unwrap();
        let y = eval(&Op::Unary(UnaryOp::Sqrt), &[&x]).unwrap();
        assert_eq!(y.dtype(), DType::BF16);
        assert_eq!(y.data(), &Data::BF16(vec![bf16::from_f32(3f32.sqrt())]));
    }
}
