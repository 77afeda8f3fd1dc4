//! What the AVX2 (`x86_64-v3`) microkernels share: the ymm register file,
//! the edge mask AVX2 keeps in a vector register (it has no mask
//! registers), masked loads and stores through `vmaskmovps`, and the
//! epilogue program ([`super::epilogue`]) on ymm registers.
//!
//! Conventions: ymm15 is [`MASK`]; a kernel's last ragged vector is loaded
//! and stored under it, so no lane outside a tensor is read or written.
//! Memory operands of the program are loaded into a temporary first (VEX
//! arithmetic has no embedded broadcast).

use iced_x86::code_asm::*;

use super::epilogue::{EpilogueOp, EpilogueStep, FullAccess, Operand};
use super::{base_register, imm32, MicrokernelError};

/// The ymm registers.
pub(crate) const YMM: [AsmRegisterYmm; 16] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14,
    ymm15,
];

/// Their low halves, for `vmovd`.
const XMM: [AsmRegisterXmm; 16] = [
    xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14,
    xmm15,
];

/// The lanes of a ragged last vector, for `vmaskmovps`.
pub(crate) const MASK: AsmRegisterYmm = ymm15;

/// f32 lanes per ymm register.
pub(crate) const LANES: usize = 8;

/// Bytes of one ymm register.
pub(crate) const BYTES: i64 = 32;

/// [`MASK`] = the first `lanes` lanes set (all when 0), built on the stack
/// (the kernels have no constant pool).
pub(crate) fn edge_mask(a: &mut CodeAssembler, lanes: usize) -> Result<(), MicrokernelError> {
    let lanes = if lanes == 0 { LANES } else { lanes };
    a.sub(rsp, BYTES as i32)?;
    for lane in 0..LANES {
        let bits = if lane < lanes { -1 } else { 0 };
        a.mov(dword_ptr(rsp + 4 * lane as i32), bits)?;
    }
    a.vmovdqu(MASK, ymmword_ptr(rsp))?;
    a.add(rsp, BYTES as i32)?;
    Ok(())
}

/// Loads `x` from `at`, under [`MASK`] when `masked` (lanes off are 0).
pub(crate) fn load(
    a: &mut CodeAssembler,
    x: AsmRegisterYmm,
    at: AsmMemoryOperand,
    masked: bool,
) -> Result<(), MicrokernelError> {
    if masked {
        a.vmaskmovps(x, MASK, ymmword_ptr(at))?;
    } else {
        a.vmovups(x, ymmword_ptr(at))?;
    }
    Ok(())
}

/// Stores `x` at `at`, under [`MASK`] when `masked`.
pub(crate) fn store(
    a: &mut CodeAssembler,
    at: AsmMemoryOperand,
    x: AsmRegisterYmm,
    masked: bool,
) -> Result<(), MicrokernelError> {
    if masked {
        a.vmaskmovps(ymmword_ptr(at), MASK, x)?;
    } else {
        a.vmovups(ymmword_ptr(at), x)?;
    }
    Ok(())
}

/// `YMM[reg]` = `v` in every lane, through the general register `gpr`.
pub(crate) fn splat(
    a: &mut CodeAssembler,
    reg: usize,
    v: f32,
    gpr: AsmRegister32,
) -> Result<(), MicrokernelError> {
    a.mov(gpr, v.to_bits())?;
    a.vmovd(XMM[reg], gpr)?;
    a.vbroadcastss(YMM[reg], XMM[reg])?;
    Ok(())
}

/// [`super::epilogue::run_epilogue`] on ymm registers: slot `k` in
/// `regs[home[k]]`, memory operands and the `2^n` of [`EpilogueOp::Scale`]
/// built in `temps` (two registers no slot uses). Returns the result
/// register.
pub(crate) fn run_epilogue(
    a: &mut CodeAssembler,
    program: &[EpilogueStep],
    (home, regs): (&[usize], &[AsmRegisterYmm]),
    (index, row): (AsmRegister64, usize),
    full: Option<FullAccess>,
    temps: [AsmRegisterYmm; 2],
) -> Result<AsmRegisterYmm, MicrokernelError> {
    let masked = full.is_some_and(|f| f.masked);
    // `dst` = operand `o` (a memory operand: loaded or broadcast).
    let fetch = |a: &mut CodeAssembler, o: Operand, dst| -> Result<(), MicrokernelError> {
        let (loc, by, per_element) = match (o, full) {
            (Operand::Slot(_), _) => unreachable!("slots are registers"),
            (Operand::Scalar(loc), _) => (loc, None, false),
            (Operand::PerRow(loc), _) => (loc, Some(index), false),
            (Operand::Full(loc), Some(f)) => (loc, Some(f.offset), true),
            (Operand::PerColumn(loc), Some(f)) => (loc, Some(f.column), true),
            (Operand::Full(_) | Operand::PerColumn(_), None) => {
                return Err(MicrokernelError::Layout(
                    "a full-size operand outside an elementwise kernel".into(),
                ))
            }
        };
        let row_bytes = if matches!(o, Operand::PerRow(_)) {
            4 * row as i64
        } else {
            0
        };
        let disp = imm32(loc.offset as i64 + row_bytes, "epilogue operand")?;
        let at = match by {
            Some(r) => base_register(loc) + r + disp,
            None => base_register(loc) + disp,
        };
        if per_element {
            load(a, dst, at, masked)
        } else {
            a.vbroadcastss(dst, dword_ptr(at))?;
            Ok(())
        }
    };
    for (i, st) in program.iter().enumerate() {
        let dst = regs[home[i + 1]];
        let first = match st.a {
            Operand::Slot(k) => regs[home[k]],
            o => {
                fetch(a, o, dst)?;
                dst
            }
        };
        if st.op == EpilogueOp::RoundEven {
            // Immediate 0: round to nearest, ties to even.
            a.vroundps(dst, first, 0)?;
            continue;
        }
        let second = match st.b {
            Operand::Slot(k) => regs[home[k]],
            o => {
                fetch(a, o, temps[0])?;
                temps[0]
            }
        };
        match st.op {
            EpilogueOp::Add => a.vaddps(dst, first, second)?,
            EpilogueOp::Sub => a.vsubps(dst, first, second)?,
            EpilogueOp::Mul => a.vmulps(dst, first, second)?,
            EpilogueOp::Div => a.vdivps(dst, first, second)?,
            EpilogueOp::Max => a.vmaxps(dst, first, second)?,
            EpilogueOp::Min => a.vminps(dst, first, second)?,
            EpilogueOp::Scale => scale(a, dst, first, second, temps)?,
            EpilogueOp::RoundEven => unreachable!("handled above"),
        }
    }
    Ok(regs[home[program.len()]])
}

/// `dst = x · 2^n` for an integer-valued `n` (AVX2 has no `vscalefps`):
/// `n = n₁ + n₂` with `n₁ = ⌊n/2⌋`, `x · 2^n₁` by adding `n₁` to x's
/// exponent (exact: the `exp` program's x lies in [0.7, 1.5) and n in
/// [−126, 128]), then a multiply by the float `2^n₂`, which rounds to +inf
/// or to a subnormal as `vscalefps` would. `dst` may be `x` or `n`; the
/// temporaries may be neither.
fn scale(
    a: &mut CodeAssembler,
    dst: AsmRegisterYmm,
    x: AsmRegisterYmm,
    n: AsmRegisterYmm,
    [t0, t1]: [AsmRegisterYmm; 2],
) -> Result<(), MicrokernelError> {
    a.vcvtps2dq(t0, n)?;
    a.vpsrad(t1, t0, 1)?;
    a.vpsubd(t0, t0, t1)?;
    a.vpslld(t1, t1, 23)?;
    a.vpaddd(dst, x, t1)?;
    // The exponent bias 127, without a constant in memory.
    a.vpcmpeqd(t1, t1, t1)?;
    a.vpsrld(t1, t1, 25)?;
    a.vpaddd(t0, t0, t1)?;
    a.vpslld(t0, t0, 23)?;
    a.vmulps(dst, dst, t0)?;
    Ok(())
}
