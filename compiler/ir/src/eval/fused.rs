//! Fused kernels: the head through [`super::eval`] of its op (an integer
//! head's result then cast to f32), then each
//! instruction through [`super::eval`] of its unary or binary op, so a fused
//! kernel evaluates exactly as the nodes it replaced; a u8 store is the
//! evaluator's cast of the result.

use crate::fused::FusedKernel;
use crate::{IrError, Tensor};

pub(super) fn fused(k: &FusedKernel, inputs: &[&Tensor]) -> Result<Tensor, IrError> {
    let mut regs: Vec<Tensor> = Vec::new();
    let extra = match k.head() {
        Some(h) => {
            let mut r = super::eval(&h.op.op(), &inputs[..h.inputs])?;
            if h.op.is_integer() {
                r = super::eval(
                    &crate::Op::Cast {
                        to: crate::DType::F32,
                    },
                    &[&r],
                )?;
            }
            regs.push(r);
            h.inputs
        }
        None => 0,
    };
    regs.extend(inputs[extra..].iter().map(|&t| t.clone()));
    for instr in k.body().instrs() {
        let args: Vec<&Tensor> = instr.operands().map(|r| &regs[r.index()]).collect();
        let v = super::eval(&instr.op(), &args)?;
        regs.push(v);
    }
    let result = regs.swap_remove(k.body().result().index());
    match k.store() {
        crate::FusedStore::F32 => Ok(result),
        store => super::eval(&crate::Op::Cast { to: store.dtype() }, &[&result]),
    }
}
