//! The AVX2 (`x86_64-v3`) copies of an f32 im2col: the same rows, taps and
//! padding ranges as the zmm routine, moved 8 floats at a time in ymm
//! registers. AVX2 has no mask registers, so the last few floats of a row
//! (fewer than 8) move one by one with `vmovss`, and a W stride above 1
//! reads 8 columns with one `vgatherdps` (indices `i * stride` from the
//! routine's lane table). Nothing outside the image is read.

use iced_x86::code_asm::*;

use super::{DST, SRC};
use crate::microkernel::ymm::LANES as WIDTH;
use crate::microkernel::{imm32, MicrokernelError};

/// The column of each lane of a strided copy (`i * stride`).
const LANES: AsmRegisterYmm = ymm2;

/// The gather's mask, set to all lanes before each gather (which clears it).
const GATHER_MASK: AsmRegisterYmm = ymm3;

/// The routine's start: [`LANES`] from the lane table when the copies are
/// strided, and ymm0 = 0 for the fills.
pub(super) fn start(
    a: &mut CodeAssembler,
    strided: bool,
    lane_table: CodeLabel,
) -> Result<(), MicrokernelError> {
    if strided {
        a.vmovdqu(LANES, ymmword_ptr(lane_table))?;
    }
    a.vxorps(ymm0, ymm0, ymm0)?;
    Ok(())
}

/// `len` zeros at DST + `at` floats.
pub(super) fn zeros(a: &mut CodeAssembler, at: usize, len: usize) -> Result<(), MicrokernelError> {
    for o in (0..len).step_by(WIDTH) {
        let disp = imm32(((at + o) * 4) as i64, "zero fill")?;
        if len - o >= WIDTH {
            a.vmovups(ymmword_ptr(DST + disp), ymm0)?;
        } else {
            for e in 0..len - o {
                a.vmovss(dword_ptr(DST + disp + 4 * e as i32), xmm0)?;
            }
        }
    }
    Ok(())
}

/// `len` floats from SRC (every `stride`-th) to DST + `at` floats.
pub(super) fn copy(
    a: &mut CodeAssembler,
    at: usize,
    len: usize,
    stride: usize,
) -> Result<(), MicrokernelError> {
    for o in (0..len).step_by(WIDTH) {
        let src = (o * stride * 4) as i64;
        let dst = imm32(((at + o) * 4) as i64, "copy")?;
        if len - o >= WIDTH {
            let from = imm32(src, "copy")?;
            if stride == 1 {
                a.vmovups(ymm1, ymmword_ptr(SRC + from))?;
            } else {
                a.vpcmpeqd(GATHER_MASK, GATHER_MASK, GATHER_MASK)?;
                a.vgatherdps_3(ymm1, ymmword_ptr(SRC + LANES * 4 + from), GATHER_MASK)?;
            }
            a.vmovups(ymmword_ptr(DST + dst), ymm1)?;
            continue;
        }
        for e in 0..len - o {
            let from = imm32(src + (e * stride * 4) as i64, "copy")?;
            a.vmovss(xmm1, dword_ptr(SRC + from))?;
            a.vmovss(dword_ptr(DST + dst + 4 * e as i32), xmm1)?;
        }
    }
    Ok(())
}
