//! Scaled dot-product attention from the GEMM and softmax microkernels, as
//! one kernel: for each head, the scores GEMM (`scale · Q @ Kt + mask`, the
//! mask as the GEMM's `C`) writes an `M × N` block of scratch, the softmax
//! turns its rows into probabilities in place, and the context GEMM
//! multiplies them by V into the output. Each GEMM's body is emitted once
//! and called per head, like the calls of a batched GEMM.

use iced_x86::code_asm::*;

use super::gemm::{Call, GemmSpec};
use super::softmax::SoftmaxSpec;
use super::MicrokernelError;
use super::SAVED;

/// One attention kernel (one task: some of the heads).
#[derive(Clone, Debug)]
pub(crate) struct AttentionSpec {
    /// `scale · Q @ Kt + mask` into the scratch (its calls are unused).
    pub scores: GemmSpec,
    /// The softmax over the scratch's rows, in place.
    pub probs: SoftmaxSpec,
    /// `P @ V` from the scratch into the output (its calls are unused).
    pub context: GemmSpec,
    /// Per head: the scores call, then the context call.
    pub heads: Vec<(Call, Call)>,
}

impl AttentionSpec {
    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        for spec in [&self.scores, &self.context] {
            spec.check_operands()?;
            if spec.b_panel.is_some() || !spec.im2col.is_empty() {
                return Err(MicrokernelError::Layout(
                    "attention GEMMs read their operands in place".into(),
                ));
            }
        }
        let mut a = CodeAssembler::new(64)?;
        let mut scores = a.create_label();
        let mut context = a.create_label();
        let mut probs = a.create_label();
        for r in SAVED {
            a.push(r)?;
        }
        for (s, c) in &self.heads {
            self.scores.emit_call(&mut a, s, scores, &[])?;
            a.call(probs)?;
            self.context.emit_call(&mut a, c, context, &[])?;
        }
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        self.scores.emit_body(&mut a, &mut scores)?;
        self.context.emit_body(&mut a, &mut context)?;
        a.set_label(&mut probs)?;
        self.probs.emit(&mut a)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}
