//! Reduced-precision dense ops (a bf16/f16 operand, f32 result: see
//! `docs/precision.md`) on targets without kernels for them.
//!
//! The AVX-512 microkernels read bf16 and f16 operands directly; the bf16
//! dot product (`vdpbf16ps`, both operands bf16) also needs AVX512-BF16.
//! Elsewhere (`x86_64-v3`, `aarch64`, AVX-512 without BF16) each 16-bit
//! operand is widened to f32 first: constants at compile time, activations
//! with a Cast. Widening is exact, so the result is the one the graph
//! defines; only the weight storage and speed differ.

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

/// `graph`, with every reduced-precision dense op the target cannot run
/// directly rewritten to read f32 operands.
pub(crate) fn legalize<'g>(graph: &'g Graph, target: &Target) -> Result<Cow<'g, Graph>, CpuError> {
    let needs = |g: &Graph, id| {
        let node = g.node(id);
        let dense = matches!(node.op, Op::MatMul | Op::Gemm { .. } | Op::Conv(_));
        let half_in = g.inputs_of(id).iter().any(|&i| is_half(g.node(i).ty.dtype));
        dense
            && half_in
            && node.ty.dtype == DType::F32
            && (!target.avx512 || (is_bf16_dot(g, id) && !target.bf16))
    };
    let todo: Vec<_> = graph
        .topo_order()?
        .into_iter()
        .filter(|&id| needs(graph, id))
        .collect();
    if todo.is_empty() {
        return Ok(Cow::Borrowed(graph));
    }
    let mut g = graph.clone();
    for id in todo {
        let mut inputs = g.inputs_of(id);
        for x in inputs.iter_mut() {
            if !is_half(g.node(*x).ty.dtype) {
                continue;
            }
            let name = format!("{}/f32", g.node(*x).name);
            *x = match g.constant(*x) {
                Some(t) => {
                    let wide = Tensor::new(t.shape(), kiln_ir::Data::F32(t.to_f32_vec()))
                        .expect("same element count");
                    g.add_const(name, wide)
                }
                None => g.add_node(Op::Cast { to: DType::F32 }, &[*x], name)?,
            };
        }
        let node = g.node(id);
        let (op, name) = (node.op.clone(), node.name.clone());
        let new = g.add_node(op, &inputs, name)?;
        g.replace_all_uses(id, new)?;
        g.remove_unused(id);
    }
    // Weights and casts nothing reads any more.
    for id in g.topo_order()?.into_iter().rev() {
        if !matches!(g.node(id).op, Op::Input { .. }) {
            g.remove_unused(id);
        }
    }
    Ok(Cow::Owned(g))
}
