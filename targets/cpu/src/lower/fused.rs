//! Fused kernels ([`Op::Fused`]): one function per fused node.
//!
//! Without a head, the program runs inside [`map`]: every register lives in
//! a Cranelift value (an `f32x4` in the vector loop, an `f32` in the tail),
//! so no intermediate tensor is written. With a head, the dense op writes
//! the output first (its Cranelift kernel, or on AVX-512 its microkernel
//! with as much of the program as the store loop takes: a bias or residual
//! add and Relu/Clip), then the rest of the program runs in place over the
//! output in the same kernel.

use cranelift_codegen::ir::types::{F32, F32X4};
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_ir::{
    BinaryOp, DType, DenseOp, ElementwiseProgram, FusedKernel, FusedStore, Instr, Node, Op,
};

use super::elementwise::{binary_float, broadcast_strides, cast_value, map, unary_float, MapIn};
use super::{conv, linalg, Kb, NodeCx};
use crate::plan::{Loc, Scratch, Weights};
use crate::CpuError;

/// Whether every instruction of `p` has a vector form (Pow, Mod and Fmod
/// are scalar only, as in the unfused binary kernel).
pub(crate) fn vectorizable(p: &ElementwiseProgram) -> bool {
    p.instrs().iter().all(|i| {
        !matches!(
            i,
            Instr::Binary(BinaryOp::Pow | BinaryOp::Mod | BinaryOp::Fmod, _, _)
        )
    })
}

/// Evaluates `p` on the values of its inputs (scalars or vectors).
pub(crate) fn eval_program(kb: &mut Kb, p: &ElementwiseProgram, inputs: &[Value]) -> Value {
    let mut regs: Vec<Value> = inputs.to_vec();
    for instr in p.instrs() {
        let v = match *instr {
            Instr::Unary(u, a) => unary_float(kb, u, regs[a.index()]),
            Instr::Binary(b, x, y) => binary_float(kb, b, regs[x.index()], regs[y.index()]),
        };
        regs.push(v);
    }
    regs[p.result().index()]
}

/// The node the head computes: the head op with the fused node's shape,
/// f32 (i32 for an integer head, which the program reads converted).
pub(crate) fn head_node(cx: &NodeCx, op: &DenseOp) -> Node {
    let mut ty = cx.node.ty.clone();
    ty.dtype = if op.is_integer() {
        kiln_ir::DType::I32
    } else {
        kiln_ir::DType::F32
    };
    Node {
        op: op.op(),
        name: cx.node.name.clone(),
        ty,
    }
}

/// The context of the head alone: its node and its inputs.
pub(crate) fn head_cx<'g>(cx: &NodeCx<'g>, node: &'g Node, inputs: usize) -> NodeCx<'g> {
    NodeCx {
        graph: cx.graph,
        node,
        input_ids: cx.input_ids[..inputs].to_vec(),
        inputs: cx.inputs[..inputs].to_vec(),
        out: cx.out,
    }
}

/// Runs `program` over the head's result into the output of `cx`:
/// program input 0 is the head's result at `src` (the output itself, in
/// place, unless the kernel stores u8; `head` its type as the head wrote
/// it: i32 for an integer head, converted as it is read), input `i ≥ 1`
/// kernel input `first_extra + i - 1`.
pub(crate) fn program_over(
    kb: &mut Kb,
    cx: &NodeCx,
    program: &ElementwiseProgram,
    first_extra: usize,
    (src, head): (Loc, DType),
) {
    let shape = cx.node.ty.shape.clone();
    let out = kb.ptr(cx.out);
    let src = kb.ptr(src);
    let mut ins = vec![MapIn {
        ptr: src,
        dtype: head,
        strides: broadcast_strides(&shape, &shape),
    }];
    for k in first_extra..first_extra + program.inputs() - 1 {
        ins.push(super::elementwise::out_and_input(kb, cx, k));
    }
    run(kb, cx, program, (out, ins));
}

fn run(kb: &mut Kb, cx: &NodeCx, program: &ElementwiseProgram, (out, ins): (Value, Vec<MapIn>)) {
    let shape = cx.node.ty.shape.clone();
    let vector = vectorizable(program).then_some(F32X4);
    // i32 inputs (an integer head's result) are read as scalars (`map`
    // vectorizes only when every type matches) and converted; so is a u8
    // result stored.
    let ints: Vec<bool> = ins.iter().map(|i| i.dtype == DType::I32).collect();
    let store = cx.node.ty.dtype;
    map(kb, &shape, (out, store), &ins, vector, &|kb, v| {
        let v: Vec<Value> = (v.iter().zip(&ints))
            .map(|(&x, &int)| {
                if int {
                    kb.b.ins().fcvt_from_sint(F32, x)
                } else {
                    x
                }
            })
            .collect();
        let result = eval_program(kb, program, &v);
        if store == DType::F32 {
            result
        } else {
            cast_value(kb, result, DType::F32, store)
        }
    });
}

/// The Cranelift kernel of a fused node: the head (if any) into the
/// output (into scratch when the kernel stores u8), then the program.
pub(crate) fn fused(
    kb: &mut Kb,
    cx: &NodeCx,
    (weights, scratch): (&mut Weights, &mut Scratch),
    k: &FusedKernel,
) -> Result<(), CpuError> {
    if cx.node.ty.dtype != k.store().dtype() {
        return Err(cx.dtype_err(cx.node.ty.dtype));
    }
    match k.head() {
        Some(h) => {
            let node = head_node(cx, &h.op);
            let mut hcx = head_cx(cx, &node, h.inputs);
            if k.store() != FusedStore::F32 {
                let bytes = node.ty.num_elements() * node.ty.dtype.size_bytes();
                hcx.out = scratch.reserve(&[bytes as u64])[0];
            }
            match &node.op {
                Op::MatMul => linalg::matmul(kb, &hcx)?,
                Op::Gemm {
                    alpha,
                    beta,
                    trans_a,
                    trans_b,
                } => linalg::gemm(kb, &hcx, weights, *alpha, *beta, *trans_a, *trans_b)?,
                Op::Conv(c) => conv::conv(kb, &hcx, c)?,
                Op::MatMulInteger => linalg::matmul_integer(kb, &hcx)?,
                Op::ConvInteger(c) => conv::conv_integer(kb, &hcx, c)?,
                _ => unreachable!("DenseOp::op gives a dense op"),
            }
            program_over(kb, cx, k.body(), h.inputs, (hcx.out, node.ty.dtype));
        }
        None => {
            let out = kb.ptr(cx.out);
            let ins: Vec<MapIn> = (0..cx.inputs.len())
                .map(|i| super::elementwise::out_and_input(kb, cx, i))
                .collect();
            run(kb, cx, k.body(), (out, ins));
        }
    }
    Ok(())
}
