//! The epilogue program: elementwise steps run on every output vector in a
//! store loop (a GEMM's, a depthwise convolution's, an elementwise kernel's),
//! its register allocation ([`allocate_slots`]) and its code
//! ([`run_epilogue`]).

use iced_x86::code_asm::*;

use super::{base_register, imm32, MicrokernelError};
use crate::plan::Loc;

/// An operand of an [`EpilogueStep`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// A value of the epilogue program: slot 0 is the output element after
    /// alpha, C and the activation; step results are slots after it.
    Slot(usize),
    /// One f32 broadcast over the output (a constant, a scalar input).
    Scalar(Loc),
    /// One f32 per output row, at `loc + 4 * row`, broadcast along it (a
    /// per-channel scale of a convolution).
    PerRow(Loc),
    /// One f32 per output element, at `loc` plus the element's byte
    /// offset: a full-size operand of an elementwise kernel
    /// (`microkernel::elementwise`; a GEMM or depthwise store loop has no
    /// element offset to read one with).
    Full(Loc),
    /// One f32 per column of an elementwise kernel's rows or of a GEMM's
    /// output, at `loc` plus the element's byte offset within its row (a
    /// bias or an int8 rescale along the last axis).
    PerColumn(Loc),
}

/// Arithmetic of an [`EpilogueStep`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpilogueOp {
    Add,
    Sub,
    Mul,
    Div,
    /// `max(a, b)` as `vmaxps` (b when either is NaN): only where that is
    /// the rule of the op it implements (Relu and Clip against a constant
    /// b, LeakyRelu's `max(x, αx)`, Erf's clamp with x as b).
    Max,
    /// `min(a, b)` as `vminps`, under the same condition.
    Min,
    /// `a` rounded to the nearest integer, ties to even (`vrndscaleps`
    /// with immediate 0: ONNX Round); `b` is `a` and unused.
    RoundEven,
    /// `a · 2^floor(b)` (`vscalefps`): the `2^n` factor of `exp`, with
    /// `b` an integer already.
    Scale,
}

/// One instruction of an epilogue program: `slot[dst] = op(a, b)`, on
/// every output vector in the store loop, after the activation. `dst` is
/// the next slot; `a` and `b` read earlier slots or memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct EpilogueStep {
    pub op: EpilogueOp,
    pub a: Operand,
    pub b: Operand,
}

/// Where each slot of an epilogue program lives: an index into the free
/// registers of a tile (0: the accumulator itself), per step the register
/// of its result. `None` when more than `free` registers would be live.
pub(crate) fn allocate_slots(steps: &[EpilogueStep], free: usize) -> Option<Vec<usize>> {
    let slots = steps.len() + 1;
    let mut last_use = vec![0usize; slots];
    for (i, st) in steps.iter().enumerate() {
        for o in [st.a, st.b] {
            if let Operand::Slot(k) = o {
                last_use[k] = i + 1;
            }
        }
    }
    // The result is stored after the last step.
    last_use[slots - 1] = steps.len() + 1;
    let mut home = vec![0usize; slots];
    let mut busy = vec![false; free];
    busy[0] = true;
    for (i, st) in steps.iter().enumerate() {
        let step = i + 1;
        // A memory first operand is loaded into the result register
        // first, so that register may not be the second operand's.
        let keep = match (st.a, st.b) {
            (Operand::Slot(_), _) => None,
            (_, Operand::Slot(k)) => Some(home[k]),
            _ => None,
        };
        for o in [st.a, st.b] {
            if let Operand::Slot(k) = o {
                if last_use[k] == step {
                    busy[home[k]] = false;
                }
            }
        }
        let r = (0..free).find(|&r| !busy[r] && Some(r) != keep)?;
        busy[r] = true;
        home[step] = r;
        if last_use[step] <= step {
            busy[r] = false;
        }
    }
    Some(home)
}

/// Where the elements of [`Operand::Full`] operands are: the register
/// holding the current vector's byte offset, and whether only the lanes of
/// `k1` are inside the tensor (a tail: loads are masked, and arithmetic on
/// a memory operand is masked so the lanes outside never fault).
#[derive(Clone, Copy)]
pub(crate) struct FullAccess {
    pub offset: AsmRegister64,
    /// The vector's byte offset within its row ([`Operand::PerColumn`]).
    pub column: AsmRegister64,
    pub masked: bool,
}

/// Emits `program` on one output vector of row `row` past the row whose
/// byte offset into per-row operands is in `index` (slot `k` in
/// `regs[home[k]]`, slot 0 being the vector); returns the result register.
/// `full` says where [`Operand::Full`] operands are read (`None`: the
/// program has none).
pub(crate) fn run_epilogue(
    a: &mut CodeAssembler,
    program: &[EpilogueStep],
    home: &[usize],
    regs: &[AsmRegisterZmm],
    (index, row): (AsmRegister64, usize),
    full: Option<FullAccess>,
) -> Result<AsmRegisterZmm, MicrokernelError> {
    // An operand's address: its base register, the index register it is
    // offset by (the row offset, the element offset or none), the
    // displacement and whether it is one value per element.
    type Address = (AsmRegister64, Option<AsmRegister64>, i32, bool);
    let address = |o: Operand| -> Result<Option<Address>, MicrokernelError> {
        let (loc, by, per_element) = match o {
            Operand::Slot(_) => return Ok(None),
            Operand::Scalar(loc) => (loc, None, false),
            Operand::PerRow(loc) => (loc, Some(index), false),
            Operand::Full(loc) | Operand::PerColumn(loc) => match full {
                Some(f) if matches!(o, Operand::Full(_)) => (loc, Some(f.offset), true),
                Some(f) => (loc, Some(f.column), true),
                None => {
                    return Err(MicrokernelError::Layout(
                        "a full-size operand outside an elementwise kernel".into(),
                    ))
                }
            },
        };
        let base = base_register(loc);
        let row_off = if matches!(o, Operand::PerRow(_)) {
            4 * row as i64
        } else {
            0
        };
        let disp = imm32(loc.offset as i64 + row_off, "epilogue operand")?;
        Ok(Some((base, by, disp, per_element)))
    };
    let masked = full.is_some_and(|f| f.masked);
    for (i, st) in program.iter().enumerate() {
        let dst = regs[home[i + 1]];
        let first = match st.a {
            Operand::Slot(k) => regs[home[k]],
            o => {
                let (base, by, disp, per_element) = address(o)?.expect("a memory operand");
                match (per_element, by) {
                    (true, Some(r)) if masked => {
                        a.vmovups(dst.k1().z(), zmmword_ptr(base + r + disp))?
                    }
                    (true, Some(r)) => a.vmovups(dst, zmmword_ptr(base + r + disp))?,
                    (_, Some(r)) => a.vbroadcastss(dst, dword_ptr(base + r + disp))?,
                    (_, None) => a.vbroadcastss(dst, dword_ptr(base + disp))?,
                }
                dst
            }
        };
        // Masked when a full-size memory operand may reach past the tensor.
        let out = if masked { dst.k1().z() } else { dst };
        if st.op == EpilogueOp::RoundEven {
            a.vrndscaleps(out, first, 0)?;
            continue;
        }
        let second = match st.b {
            Operand::Slot(k) => {
                let second = regs[home[k]];
                match st.op {
                    EpilogueOp::Add => a.vaddps(out, first, second)?,
                    EpilogueOp::Sub => a.vsubps(out, first, second)?,
                    EpilogueOp::Mul => a.vmulps(out, first, second)?,
                    EpilogueOp::Div => a.vdivps(out, first, second)?,
                    EpilogueOp::Max => a.vmaxps(out, first, second)?,
                    EpilogueOp::Min => a.vminps(out, first, second)?,
                    EpilogueOp::Scale => a.vscalefps(out, first, second)?,
                    EpilogueOp::RoundEven => unreachable!("handled above"),
                }
                continue;
            }
            o => address(o)?.expect("a non-slot operand is in memory"),
        };
        let m = match second {
            (base, Some(r), disp, true) => zmmword_ptr(base + r + disp),
            (base, Some(r), disp, false) => dword_bcst(base + r + disp),
            (base, None, disp, _) => dword_bcst(base + disp),
        };
        match st.op {
            EpilogueOp::Add => a.vaddps(out, first, m)?,
            EpilogueOp::Sub => a.vsubps(out, first, m)?,
            EpilogueOp::Mul => a.vmulps(out, first, m)?,
            EpilogueOp::Div => a.vdivps(out, first, m)?,
            EpilogueOp::Max => a.vmaxps(out, first, m)?,
            EpilogueOp::Min => a.vminps(out, first, m)?,
            EpilogueOp::Scale => a.vscalefps(out, first, m)?,
            EpilogueOp::RoundEven => unreachable!("handled above"),
        }
    }
    Ok(regs[home[program.len()]])
}
