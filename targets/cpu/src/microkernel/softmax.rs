//! AVX-512 (and AVX2, see [`ymm`]) softmax over contiguous rows (the axis innermost, as in every
//! attention block): per row a max pass, an `exp(x - max)` pass that stores
//! and sums, and a division pass, 16 lanes at a time with a masked tail.
//!
//! `exp` is inline: `n = round(t · log2 e)`, `r = t - n·ln 2` in two parts,
//! `e^r` by the same minimax polynomial as the Cranelift kernels
//! (`lower::math::exp`), and `vscalefps` for the `2^n` factor. Where
//! `e^t` is below the normal f32 range the result is 0: a subnormal there
//! would change no probability that matters, but producing one costs a
//! microcode assist of about a hundred cycles per instruction, and the
//! masked positions of an attention block (`t` near -10⁴ or -3·10³⁸) are
//! most of a padded row (MiniLM with 24 of 128 tokens: 1.17 ms per
//! attention kernel with subnormals, 0.27 ms without). Constants live in
//! zmm16–zmm27 for the whole kernel. The division is `vdivps`, so results
//! round as the reference evaluator's `e / sum` does.

use iced_x86::code_asm::*;

use super::Vector;
use super::{imm32, load_address, MicrokernelError};
use crate::lower::math::{EXP_NORMAL_LOWEST, EXP_POLY, LN2_HI, LN2_LO};
use crate::plan::Loc;

mod ymm;

/// One softmax kernel: `rows` rows of `len` contiguous f32 values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SoftmaxSpec {
    /// Rows (the product of the dims before the axis).
    pub rows: usize,
    /// Row length (the axis).
    pub len: usize,
    /// The input's first row.
    pub x: Loc,
    /// The output's first row.
    pub y: Loc,
    /// The registers (ymm: see [`ymm`]).
    pub vector: Vector,
}

/// Row cursors, the row counter and the chunk cursor/counter.
const X_ROW: AsmRegister64 = r8;
const Y_ROW: AsmRegister64 = r9;
const ROWS: AsmRegister64 = rcx;
const OFF: AsmRegister64 = rax;
const CHUNKS: AsmRegister64 = rdx;

/// Below this `e^t` is under the normal f32 range; the kernel makes it 0.
const EXP_LOWEST: f32 = EXP_NORMAL_LOWEST;

const LOG2E: AsmRegisterZmm = zmm16;
const NEG_LN2_HI: AsmRegisterZmm = zmm17;
const NEG_LN2_LO: AsmRegisterZmm = zmm18;
const ONE: AsmRegisterZmm = zmm19;
const LOWEST: AsmRegisterZmm = zmm20;
const NEG_INF: AsmRegisterZmm = zmm21;
const POLY: [AsmRegisterZmm; 6] = [zmm22, zmm23, zmm24, zmm25, zmm26, zmm27];
/// `vcmpps` predicate `>=`, false where either operand is NaN.
const CMP_GE_OQ: i32 = 0x1d;

impl SoftmaxSpec {
    /// The kernel as up to `tasks` independent kernels over contiguous
    /// groups of rows.
    pub(crate) fn split(self, tasks: usize) -> Vec<SoftmaxSpec> {
        let tasks = tasks.clamp(1, self.rows.max(1));
        (0..tasks)
            .map(|t| {
                let (first, end) = (self.rows * t / tasks, self.rows * (t + 1) / tasks);
                let shift = (first * self.len * 4) as u64;
                SoftmaxSpec {
                    rows: end - first,
                    len: self.len,
                    x: Loc {
                        offset: self.x.offset + shift,
                        ..self.x
                    },
                    y: Loc {
                        offset: self.y.offset + shift,
                        ..self.y
                    },
                    vector: self.vector,
                }
            })
            .collect()
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let mut a = CodeAssembler::new(64)?;
        if self.rows > 0 && self.len > 0 {
            self.emit(&mut a)?;
            a.vzeroupper()?;
        }
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }

    /// The softmax inline (no `ret`): it clobbers rax, rcx, rdx, r8, r9,
    /// k1, zmm0–zmm3 and zmm16–zmm27 (ymm: see [`SoftmaxSpec::emit_ymm`]).
    /// `x == y` works in place.
    pub(crate) fn emit(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        if self.rows > 0 && self.len > 0 && self.vector == Vector::Ymm {
            return self.emit_ymm(a);
        }
        if self.rows > 0 && self.len > 0 {
            self.constants(a)?;
            self.body(a)?;
        }
        Ok(())
    }

    fn constants(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        let consts = [
            (LOG2E, std::f32::consts::LOG2_E),
            (NEG_LN2_HI, -LN2_HI as f32),
            (NEG_LN2_LO, -LN2_LO as f32),
            (ONE, 1.0),
            (LOWEST, EXP_LOWEST),
            (NEG_INF, f32::NEG_INFINITY),
        ];
        let poly = POLY.iter().copied().zip(EXP_POLY.map(|c| c as f32));
        for (reg, v) in consts.into_iter().chain(poly) {
            a.mov(eax, v.to_bits())?;
            a.vpbroadcastd(reg, eax)?;
        }
        let tail = self.len % 16;
        if tail > 0 {
            a.mov(eax, (1u32 << tail) - 1)?;
            a.kmovw(k1, eax)?;
        }
        Ok(())
    }

    fn body(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        let (full, tail) = (self.len / 16, self.len % 16);
        let row_bytes = imm32((self.len * 4) as i64, "softmax row")?;
        let tail_at = imm32((full * 64) as i64, "softmax tail")?;
        load_address(a, X_ROW, self.x)?;
        load_address(a, Y_ROW, self.y)?;
        a.mov(ROWS, self.rows as u64)?;
        let mut row = a.create_label();
        a.set_label(&mut row)?;

        // Max, broadcast to zmm0.
        a.vmovaps(zmm0, NEG_INF)?;
        chunks(a, (full, 64), |a| {
            a.vmaxps(zmm0, zmm0, zmmword_ptr(X_ROW + OFF))?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmaxps(zmm0.k1(), zmm0, zmmword_ptr(X_ROW + tail_at))?;
        }
        horizontal(a, |a, x, y| a.vmaxps(x, x, y))?;

        // exp(x - max) stored, summed in zmm1 and broadcast.
        a.vxorps(zmm1, zmm1, zmm1)?;
        chunks(a, (full, 64), |a| {
            a.vsubps(zmm2, zmm0, zmmword_ptr(X_ROW + OFF))?;
            exp_of_negated(a)?;
            a.vmovups(zmmword_ptr(Y_ROW + OFF), zmm3)?;
            a.vaddps(zmm1, zmm1, zmm3)?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmovups(zmm2.k1().z(), zmmword_ptr(X_ROW + tail_at))?;
            a.vsubps(zmm2, zmm0, zmm2)?;
            exp_of_negated(a)?;
            a.vmovups(zmmword_ptr(Y_ROW + tail_at).k1(), zmm3)?;
            a.vaddps(zmm1.k1(), zmm1, zmm3)?;
        }
        a.vmovaps(zmm0, zmm1)?;
        horizontal(a, |a, x, y| a.vaddps(x, x, y))?;

        // Divide by the sum.
        chunks(a, (full, 64), |a| {
            a.vmovups(zmm3, zmmword_ptr(Y_ROW + OFF))?;
            a.vdivps(zmm3, zmm3, zmm0)?;
            a.vmovups(zmmword_ptr(Y_ROW + OFF), zmm3)?;
            Ok(())
        })?;
        if tail > 0 {
            a.vmovups(zmm3.k1().z(), zmmword_ptr(Y_ROW + tail_at))?;
            a.vdivps(zmm3, zmm3, zmm0)?;
            a.vmovups(zmmword_ptr(Y_ROW + tail_at).k1(), zmm3)?;
        }

        a.add(X_ROW, row_bytes)?;
        a.add(Y_ROW, row_bytes)?;
        a.dec(ROWS)?;
        a.jnz(row)?;
        Ok(())
    }
}

/// Runs `step` for each of `count` chunks of `bytes` (one register) with
/// `OFF` at the chunk's byte offset (a run-time loop; nothing when `count`
/// is 0).
fn chunks(
    a: &mut CodeAssembler,
    (count, bytes): (usize, i32),
    mut step: impl FnMut(&mut CodeAssembler) -> Result<(), MicrokernelError>,
) -> Result<(), MicrokernelError> {
    if count == 0 {
        return Ok(());
    }
    a.xor(OFF, OFF)?;
    a.mov(CHUNKS, count as u64)?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    step(a)?;
    a.add(OFF, bytes)?;
    a.dec(CHUNKS)?;
    a.jnz(top)?;
    Ok(())
}

/// Reduces the 16 lanes of zmm0 with `op` (x ← op(x, y)) and broadcasts
/// the result to every lane of zmm0. Clobbers zmm2–zmm4.
pub(crate) fn horizontal(
    a: &mut CodeAssembler,
    op: impl Fn(&mut CodeAssembler, AsmRegisterXmm, AsmRegisterXmm) -> Result<(), IcedError>,
) -> Result<(), MicrokernelError> {
    a.vextractf32x4(xmm2, zmm0, 1)?;
    a.vextractf32x4(xmm3, zmm0, 2)?;
    a.vextractf32x4(xmm4, zmm0, 3)?;
    op(a, xmm0, xmm2)?;
    op(a, xmm3, xmm4)?;
    op(a, xmm0, xmm3)?;
    a.vpermilps(xmm2, xmm0, 0x4e)?;
    op(a, xmm0, xmm2)?;
    a.vpermilps(xmm2, xmm0, 0xb1)?;
    op(a, xmm0, xmm2)?;
    a.vbroadcastss(zmm0, xmm0)?;
    Ok(())
}

/// zmm3 = exp(-zmm2) (zmm2 holds `max - x`, so `t = -zmm2 <= 0`), 0 where
/// `t` is below [`EXP_LOWEST`]. Clobbers zmm2, zmm4, zmm5 and k2.
fn exp_of_negated(a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
    // t = -(max - x); k2 = the lanes with t >= lowest; t = max(t, lowest),
    // so that no lane's 2^n leaves the normal range.
    a.vxorps(zmm4, zmm4, zmm4)?;
    a.vsubps(zmm2, zmm4, zmm2)?;
    a.vcmpps(k2, zmm2, LOWEST, CMP_GE_OQ)?;
    a.vmaxps(zmm2, zmm2, LOWEST)?;
    // n = round(t · log2 e)
    a.vmulps(zmm4, zmm2, LOG2E)?;
    a.vrndscaleps(zmm4, zmm4, 0)?;
    // r = t - n·ln 2
    a.vfmadd231ps(zmm2, zmm4, NEG_LN2_HI)?;
    a.vfmadd231ps(zmm2, zmm4, NEG_LN2_LO)?;
    // p = 1 + r + r²·P(r)
    a.vmovaps(zmm3, POLY[0])?;
    for c in &POLY[1..] {
        a.vfmadd213ps(zmm3, zmm2, *c)?;
    }
    a.vmulps(zmm5, zmm2, zmm2)?;
    a.vaddps(zmm2, zmm2, ONE)?;
    a.vfmadd213ps(zmm3, zmm5, zmm2)?;
    // e = p · 2^n, 0 in the lanes below lowest
    a.vscalefps(zmm3.k2().z(), zmm3, zmm4)?;
    Ok(())
}
