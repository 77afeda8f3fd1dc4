//! The AVX2 (`x86_64-v3`) softmax: the zmm kernel's three passes per row
//! (max, `exp(x − max)` stored and summed, division) 8 lanes at a time.
//!
//! AVX2 has 16 vector registers and no mask registers, so the `exp`
//! constants are read from a table of broadcast values placed in the code
//! (jumped over), the ragged end of a row is loaded and stored with
//! `vmaskmovps` under ymm15 (its lanes off are −∞ for the max and 0 for the
//! sum), and the `2^n` factor is an exponent add: `t` is clamped to the
//! normal range first, so `p · 2^n` (p in [0.7, 1.5), n in [−126, 0]) is
//! exact.

use iced_x86::code_asm::*;

use super::{chunks, SoftmaxSpec, CMP_GE_OQ, EXP_LOWEST, OFF, ROWS, X_ROW, Y_ROW};
use crate::lower::math::{EXP_POLY, LN2_HI, LN2_LO};
use crate::microkernel::ymm::{edge_mask, BYTES, LANES, MASK};
use crate::microkernel::{imm32, load_address, MicrokernelError};

/// The constants' slots in the table, 8 copies of each.
const LOG2E: usize = 0;
const NEG_LN2_HI: usize = 1;
const NEG_LN2_LO: usize = 2;
const ONE: usize = 3;
const LOWEST: usize = 4;
const NEG_INF: usize = 5;
const POLY: usize = 6;

impl SoftmaxSpec {
    /// The ymm softmax inline (no `ret`): clobbers rax, rcx, rdx, r8, r9 and
    /// ymm0–ymm6, ymm15. `x == y` works in place.
    pub(super) fn emit_ymm(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        // One label per constant (a label operand takes no displacement).
        let fixed = [
            std::f32::consts::LOG2_E,
            -LN2_HI as f32,
            -LN2_LO as f32,
            1.0,
            EXP_LOWEST,
            f32::NEG_INFINITY,
        ];
        let values: Vec<f32> = fixed
            .into_iter()
            .chain(EXP_POLY.map(|c| c as f32))
            .collect();
        let mut labels: Vec<CodeLabel> = values.iter().map(|_| a.create_label()).collect();
        let mut start = a.create_label();
        a.jmp(start)?;
        for (v, label) in values.iter().zip(&mut labels) {
            a.set_label(label)?;
            let bytes: Vec<u8> = (0..LANES).flat_map(|_| v.to_le_bytes()).collect();
            a.db(&bytes)?;
        }
        a.set_label(&mut start)?;
        let k = |slot: usize| ymmword_ptr(labels[slot]);

        let (full, tail) = (self.len / LANES, self.len % LANES);
        if tail > 0 {
            edge_mask(a, tail)?;
        }
        let row_bytes = imm32((self.len * 4) as i64, "softmax row")?;
        let tail_at = imm32(full as i64 * BYTES, "softmax tail")?;
        load_address(a, X_ROW, self.x)?;
        load_address(a, Y_ROW, self.y)?;
        a.mov(ROWS, self.rows as u64)?;
        let mut row = a.create_label();
        a.set_label(&mut row)?;

        // Max, broadcast to ymm0; the lanes past the row are −∞.
        a.vmovups(ymm0, k(NEG_INF))?;
        chunks(a, (full, BYTES as i32), |a| {
            a.vmaxps(ymm0, ymm0, ymmword_ptr(X_ROW + OFF))?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmaskmovps(ymm2, MASK, ymmword_ptr(X_ROW + tail_at))?;
            a.vblendvps(ymm2, ymm0, ymm2, MASK)?;
            a.vmaxps(ymm0, ymm0, ymm2)?;
        }
        horizontal(a, |a, x, y| a.vmaxps(x, x, y))?;

        // exp(x − max) stored, summed in ymm1 and broadcast.
        a.vxorps(ymm1, ymm1, ymm1)?;
        chunks(a, (full, BYTES as i32), |a| {
            a.vsubps(ymm2, ymm0, ymmword_ptr(X_ROW + OFF))?;
            exp_of_negated(a, &k)?;
            a.vmovups(ymmword_ptr(Y_ROW + OFF), ymm3)?;
            a.vaddps(ymm1, ymm1, ymm3)?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmaskmovps(ymm2, MASK, ymmword_ptr(X_ROW + tail_at))?;
            a.vsubps(ymm2, ymm0, ymm2)?;
            exp_of_negated(a, &k)?;
            a.vandps(ymm3, ymm3, MASK)?;
            a.vmaskmovps(ymmword_ptr(Y_ROW + tail_at), MASK, ymm3)?;
            a.vaddps(ymm1, ymm1, ymm3)?;
        }
        a.vmovaps(ymm0, ymm1)?;
        horizontal(a, |a, x, y| a.vaddps(x, x, y))?;

        // Divide by the sum.
        chunks(a, (full, BYTES as i32), |a| {
            a.vmovups(ymm3, ymmword_ptr(Y_ROW + OFF))?;
            a.vdivps(ymm3, ymm3, ymm0)?;
            a.vmovups(ymmword_ptr(Y_ROW + OFF), ymm3)?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmaskmovps(ymm3, MASK, ymmword_ptr(Y_ROW + tail_at))?;
            a.vdivps(ymm3, ymm3, ymm0)?;
            a.vmaskmovps(ymmword_ptr(Y_ROW + tail_at), MASK, ymm3)?;
        }

        a.add(X_ROW, row_bytes)?;
        a.add(Y_ROW, row_bytes)?;
        a.dec(ROWS)?;
        a.jnz(row)?;
        Ok(())
    }
}

/// Reduces the 8 lanes of ymm0 with `op` and broadcasts the result to
/// every lane of ymm0. Clobbers ymm2.
fn horizontal(
    a: &mut CodeAssembler,
    op: impl Fn(&mut CodeAssembler, AsmRegisterXmm, AsmRegisterXmm) -> Result<(), IcedError>,
) -> Result<(), MicrokernelError> {
    a.vextractf128(xmm2, ymm0, 1)?;
    op(a, xmm0, xmm2)?;
    a.vpermilps(xmm2, xmm0, 0x4e)?;
    op(a, xmm0, xmm2)?;
    a.vpermilps(xmm2, xmm0, 0xb1)?;
    op(a, xmm0, xmm2)?;
    a.vbroadcastss(ymm0, xmm0)?;
    Ok(())
}

/// ymm3 = exp(−ymm2) (ymm2 holds `max − x`), 0 where `t = −ymm2` is below
/// [`EXP_LOWEST`]. Clobbers ymm2, ymm4–ymm6.
fn exp_of_negated(
    a: &mut CodeAssembler,
    k: &dyn Fn(usize) -> AsmMemoryOperand,
) -> Result<(), MicrokernelError> {
    // t = −(max − x); ymm5 = the lanes with t ≥ lowest; t = max(t, lowest).
    a.vxorps(ymm4, ymm4, ymm4)?;
    a.vsubps(ymm2, ymm4, ymm2)?;
    a.vcmpps(ymm5, ymm2, k(LOWEST), CMP_GE_OQ)?;
    a.vmaxps(ymm2, ymm2, k(LOWEST))?;
    // n = round(t · log2 e)
    a.vmulps(ymm4, ymm2, k(LOG2E))?;
    a.vroundps(ymm4, ymm4, 0)?;
    // r = t − n·ln 2
    a.vfmadd231ps(ymm2, ymm4, k(NEG_LN2_HI))?;
    a.vfmadd231ps(ymm2, ymm4, k(NEG_LN2_LO))?;
    // p = 1 + r + r²·P(r)
    a.vmovups(ymm3, k(POLY))?;
    for c in 1..EXP_POLY.len() {
        a.vfmadd213ps(ymm3, ymm2, k(POLY + c))?;
    }
    a.vmulps(ymm6, ymm2, ymm2)?;
    a.vaddps(ymm2, ymm2, k(ONE))?;
    a.vfmadd213ps(ymm3, ymm6, ymm2)?;
    // e = p · 2^n (an exponent add), 0 in the lanes below lowest.
    a.vcvtps2dq(ymm4, ymm4)?;
    a.vpslld(ymm4, ymm4, 23)?;
    a.vpaddd(ymm3, ymm3, ymm4)?;
    a.vandps(ymm3, ymm3, ymm5)?;
    Ok(())
}
