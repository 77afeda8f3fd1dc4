//! The FMA peak loop: the most fp32 FMA work one core can issue, assembled
//! with the same assembler as the GEMM kernels so both run the same
//! instructions.
//!
//! The loop keeps [`CHAINS`] independent accumulator chains busy
//! (`vfmadd231ps` on zmm, register operands only): enough to cover the FMA
//! latency on every pipe, with no memory traffic. Dividing a GEMM's
//! achieved FLOP/s by this loop's gives the kernel's fraction of peak.

use iced_x86::code_asm::*;

use super::MicrokernelError;

/// Independent accumulators per iteration.
pub const CHAINS: usize = 24;

/// Floating-point operations per loop iteration (an FMA is two per lane).
pub const FLOPS_PER_ITERATION: u64 = (CHAINS * 16 * 2) as u64;

/// Machine code of `extern "C" fn(iterations: u64)` (System V x86-64) that
/// runs `iterations` (≥ 1) iterations of [`CHAINS`] zmm FMAs.
pub fn fma_loop() -> Result<Vec<u8>, MicrokernelError> {
    const ZMM: [AsmRegisterZmm; 26] = [
        zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13,
        zmm14, zmm15, zmm16, zmm17, zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25,
    ];
    let (x, y) = (ZMM[CHAINS], ZMM[CHAINS + 1]);
    let mut a = CodeAssembler::new(64)?;
    for r in ZMM {
        a.vpxord(r, r, r)?;
    }
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    for acc in &ZMM[..CHAINS] {
        a.vfmadd231ps(*acc, x, y)?;
    }
    a.dec(rdi)?;
    a.jnz(top)?;
    a.vzeroupper()?;
    a.ret()?;
    Ok(a.assemble(0)?)
}
