//! Rewrites the graph into what the CPU kernels run: 16-bit floats
//! (bf16, f16) only where a kernel reads them directly.
//!
//! - Reduced-precision dense ops (a bf16/f16 operand, f32 result: see
//!   `docs/precision.md`) on targets without kernels for them. The AVX-512
//!   microkernels read bf16 and f16 operands directly (also as the head of
//!   a fused kernel); the bf16 dot product
//!   (`vdpbf16ps`, both operands bf16) also needs AVX512-BF16. Elsewhere
//!   (`x86_64-v3`, `aarch64`, AVX-512 without BF16) each 16-bit operand is
//!   widened to f32 first: constants at compile time, activations with a
//!   Cast. Widening is exact, so the result is the one the graph defines;
//!   only the weight storage and speed differ.
//! - Gather (an embedding table stored in 16 bits) moves 16-bit rows as
//!   they are.
//! - Every other op on 16-bit floats (an ONNX model in f16 or bf16) runs in
//!   f32 between casts: operands widened, the op computed in f32, the
//!   result rounded back once. For +, −, ×, ÷ and √ that is the correctly
//!   rounded 16-bit result (f32 has more than twice the 11 (f16) or 8
//!   (bf16) significand bits plus two); for data movement it is exact. Only
//!   the casts between f32 and bf16/f16 are kernels of their own.

use std::borrow::Cow;

use kiln_ir::{infer::is_half, DType, Graph, Op, Tensor};

use crate::isa::Target;
use crate::CpuError;

/// Whether the node is a dense op whose kernel reads bf16 pairs on both
/// operands (MatMul/Gemm with bf16 A and B).
pub(crate) fn is_bf16_dot(graph: &Graph, id: kiln_ir::NodeId) -> bool {
    let node = graph.node(id);
    let ins = graph.inputs_of(id);
    matches!(node.op, Op::MatMul | Op::Gemm { .. })
        && ins.len() >= 2
        && ins[..2]
            .iter()
            .all(|&i| graph.node(i).ty.dtype == DType::BF16)
}

/// `graph`, with every op on 16-bit floats the target cannot run directly
/// rewritten to f32 (see the module docs).
pub(crate) fn legalize<'g>(graph: &'g Graph, target: &Target) -> Result<Cow<'g, Graph>, CpuError> {
    let todo: Vec<_> = graph
        .topo_order()?
        .into_iter()
        .filter(|&id| touches_half(graph, id) && !runs_half(graph, id, target))
        .collect();
    if todo.is_empty() {
        return Ok(Cow::Borrowed(graph));
    }
    let mut g = graph.clone();
    for id in todo {
        let inputs: Vec<_> = g.inputs_of(id);
        let inputs = inputs
            .into_iter()
            .map(|x| widen(&mut g, x))
            .collect::<Result<Vec<_>, _>>()?;
        let node = g.node(id);
        let (op, name, dtype) = (node.op.clone(), node.name.clone(), node.ty.dtype);
        let mut new = match op {
            // A cast from another type (f64, an integer) goes through f32.
            Op::Cast { to } if is_half(to) => {
                g.add_node(Op::Cast { to: DType::F32 }, &inputs, format!("{name}/f32"))?
            }
            op => g.add_node(op, &inputs, format!("{name}/f32"))?,
        };
        if g.node(new).ty.dtype == dtype {
            g.rename(new, name);
        } else {
            new = g.add_node(Op::Cast { to: dtype }, &[new], name)?;
        }
        g.replace_all_uses(id, new)?;
        g.remove_unused(id);
    }
    remove_dead(&mut g)?;
    Ok(Cow::Owned(g))
}

/// Whether the node reads or produces a 16-bit float.
fn touches_half(g: &Graph, id: kiln_ir::NodeId) -> bool {
    is_half(g.node(id).ty.dtype) || g.inputs_of(id).iter().any(|&i| is_half(g.node(i).ty.dtype))
}

/// Whether a CPU kernel runs the node on its 16-bit operands as they are.
fn runs_half(g: &Graph, id: kiln_ir::NodeId, target: &Target) -> bool {
    let node = g.node(id);
    match node.op {
        Op::Input { .. } | Op::Constant(_) => true,
        Op::MatMul | Op::Gemm { .. } | Op::Conv(_) | Op::Fused(_) => {
            target.avx512 && crate::lower::dense::takes_half_operands(g, id, target.bf16)
        }
        Op::Cast { to } => {
            let from = g.node(g.inputs_of(id)[0]).ty.dtype;
            from == to || (from == DType::F32 && is_half(to)) || (is_half(from) && to == DType::F32)
        }
        // Moves elements by their bytes: a 16-bit embedding table stays
        // 16-bit in the artifact.
        Op::Gather { .. } => true,
        _ => false,
    }
}

/// `x` as f32: a 16-bit constant widened at compile time, a 16-bit value
/// through a Cast, anything else as it is.
fn widen(g: &mut Graph, x: kiln_ir::NodeId) -> Result<kiln_ir::NodeId, CpuError> {
    if !is_half(g.node(x).ty.dtype) {
        return Ok(x);
    }
    let name = format!("{}/f32", g.node(x).name);
    Ok(match g.constant(x) {
        Some(t) => {
            let wide = Tensor::new(t.shape(), kiln_ir::Data::F32(t.to_f32_vec()))
                .expect("same element count");
            g.add_const(name, wide)
        }
        None => g.add_node(Op::Cast { to: DType::F32 }, &[x], name)?,
    })
}

/// Removes the weights and casts nothing reads any more.
fn remove_dead(g: &mut Graph) -> Result<(), CpuError> {
    for id in g.topo_order()?.into_iter().rev() {
        if !matches!(g.node(id).op, Op::Input { .. }) {
            g.remove_unused(id);
        }
    }
    Ok(())
}
