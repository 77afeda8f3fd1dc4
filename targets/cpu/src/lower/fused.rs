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
use kiln_ir::{BinaryOp, DenseOp, ElementwiseProgram, FusedKernel, Instr, Node, Op};

use super::elementwise::{binary_float, broadcast_strides, map, unary_float, MapIn};
use super::{conv, linalg, Kb, NodeCx};
use crate::plan::Weights;
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
    if op.is_integer() {
        ty.dtype = kiln_ir::DType::I32;
    }
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

/// Runs `program` over the output of `cx` in place: program input 0 is the
/// output itself (`head` its type as the head wrote it: i32 for an integer
/// head, converted as it is read), input `i ≥ 1` kernel input
/// `first_extra + i - 1`.
pub(crate) fn program_in_place(
    kb: &mut Kb,
    cx: &NodeCx,
    program: &ElementwiseProgram,
    first_extra: usize,
    head: kiln_ir::DType,
) {
    let shape = cx.node.ty.shape.clone();
    let out = kb.ptr(cx.out);
    let mut ins = vec![MapIn {
        ptr: out,
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
    // vectorizes only when every type matches) and converted.
    let ints: Vec<bool> = ins.iter().map(|i| i.dtype == kiln_ir::DType::I32).collect();
    map(
        kb,
        &shape,
        (out, cx.node.ty.dtype),
        &ins,
        vector,
        &|kb, v| {
            let v: Vec<Value> = (v.iter().zip(&ints))
                .map(|(&x, &int)| {
                    if int {
                        kb.b.ins().fcvt_from_sint(F32, x)
                    } else {
                        x
                    }
                })
                .collect();
            eval_program(kb, program, &v)
        },
    );
}

/// The Cranelift kernel of a fused node: the head (if any) into the
/// output, then the program.
pub(crate) fn fused(
    kb: &mut Kb,
    cx: &NodeCx,
    weights: &mut Weights,
    k: &FusedKernel,
) -> Result<(), CpuError> {
    if cx.node.ty.dtype != kiln_ir::DType::F32 {
        return Err(cx.dtype_err(cx.node.ty.dtype));
    }
    match k.head() {
        Some(h) => {
            let node = head_node(cx, &h.op);
            let hcx = head_cx(cx, &node, h.inputs);
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
            program_in_place(kb, cx, k.body(), h.inputs, node.ty.dtype);
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
