//! im2col for the GEMM form of a k×k convolution: one image's
//! `X[Cin, H, W]` becomes `col[Cin*kh*kw, OH*OW]` in arena scratch, row
//! `(ic, th, tw)` holding the tap's input pixel for every output position
//! (zero where the tap falls in the padding). The GEMM then multiplies the
//! packed weights `[OC, Cin*kh*kw]` by `col`.
//!
//! A large image is converted in bands of output rows (`row0`, `rows`):
//! the GEMM of each band then reads a `col` small enough to stay in the
//! core's L2 cache right after im2col wrote it, instead of a matrix of tens
//! of megabytes streamed through memory twice. Bands whose taps all fall
//! inside the image ([`Im2col::band_key`] equal) share one routine, called
//! with the image pointer moved down by the rows between them.
//!
//! Every padding border is resolved at compile time: per tap, the output
//! rows and columns whose input lies inside the image form one range, so a
//! row is "zeros, a copy, zeros" with fixed lengths. Copies with a W stride
//! of 1 are zmm loads/stores with a masked tail; strided ones move scalars.
//! Input channels are a run-time loop, taps and pixels are unrolled.

use iced_x86::code_asm::*;

use super::{imm32, MicrokernelError};

/// Geometry of one convolution's im2col.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Im2col {
    /// Input channels.
    pub cin: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel height and width.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// The first output row of the band this routine converts.
    pub row0: usize,
    /// Output rows in the band (`col` has `rows * ow` columns).
    pub rows: usize,
    /// Output width.
    pub ow: usize,
    /// Strides (H, W).
    pub strides: [usize; 2],
    /// Padding at the top and the left.
    pub pad_tl: [usize; 2],
    /// Dilations (H, W).
    pub dilations: [usize; 2],
}

/// Source cursor, destination cursor, channel counter, row counter,
/// channel base pointers and a scratch GPR for masks and scalar moves.
const SRC: AsmRegister64 = r13;
const DST: AsmRegister64 = rdx;
const CH: AsmRegister64 = rcx;
const ROWS: AsmRegister64 = r12;
const X_CH: AsmRegister64 = r10;
const COL_CH: AsmRegister64 = r11;
const TMP: AsmRegister32 = r14d;

/// The output positions `o` in `0..out` whose input `o * stride + tap *
/// dilation - pad` lies in `0..size`, as a half-open range.
fn valid_range(
    out: usize,
    size: usize,
    stride: usize,
    tap: usize,
    dilation: usize,
    pad: usize,
) -> (usize, usize) {
    let shift = (tap * dilation) as i64 - pad as i64;
    // o * stride + shift >= 0  and  o * stride + shift <= size - 1
    let lo = if shift >= 0 {
        0
    } else {
        ((-shift) as usize).div_ceil(stride)
    };
    let hi_incl = size as i64 - 1 - shift;
    let hi = if hi_incl < 0 {
        0
    } else {
        (hi_incl as usize / stride + 1).min(out)
    };
    (lo.min(out), hi.max(lo.min(out)))
}

impl Im2col {
    /// Bytes of the `col` matrix of one image.
    pub(crate) fn col_bytes(&self) -> u64 {
        (self.cin * self.kh * self.kw * self.rows * self.ow * 4) as u64
    }

    /// Per kernel row, the band's rows (relative to `row0`) whose input
    /// lies inside the image. Two bands with equal keys and equal
    /// geometry otherwise compile to the same routine, the image pointer
    /// moved by `(row0' - row0) * stride * w` pixels.
    pub(crate) fn band_key(&self) -> Vec<(usize, usize)> {
        (0..self.kh).map(|th| self.band_rows(th)).collect()
    }

    /// The band's rows (relative to `row0`) whose input row for kernel row
    /// `th` lies inside the image, as a half-open range.
    fn band_rows(&self, th: usize) -> (usize, usize) {
        let end = self.row0 + self.rows;
        let (lo, hi) = valid_range(
            end,
            self.h,
            self.strides[0],
            th,
            self.dilations[0],
            self.pad_tl[0],
        );
        let lo = lo.max(self.row0);
        let hi = hi.max(lo);
        (lo - self.row0, hi - self.row0)
    }

    /// Emits the routine (ends with `ret`): reads the image at r8, writes
    /// `col` at r9. Clobbers rax, rcx, rdx, r10–r14, zmm0, zmm1 and k2.
    pub(crate) fn emit(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        let p = self.rows * self.ow;
        let row_bytes = (p * 4) as i64;
        let [sh, sw] = self.strides;
        let [pt, pl] = self.pad_tl;
        let [dil_h, dil_w] = self.dilations;
        a.vpxord(zmm0, zmm0, zmm0)?;
        a.mov(X_CH, r8)?;
        a.mov(COL_CH, r9)?;
        a.mov(CH, self.cin as u64)?;
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        for th in 0..self.kh {
            let (oh_lo, oh_hi) = self.band_rows(th);
            for tw in 0..self.kw {
                let (ow_lo, ow_hi) = valid_range(self.ow, self.w, sw, tw, dil_w, pl);
                let t = (th * self.kw + tw) as i64;
                a.lea(DST, qword_ptr(COL_CH + imm32(t * row_bytes, "col row")?))?;
                if oh_lo >= oh_hi || ow_lo >= ow_hi {
                    self.zeros(a, 0, p)?;
                    continue;
                }
                self.zeros(a, 0, oh_lo * self.ow)?;
                a.add(DST, imm32((oh_lo * self.ow * 4) as i64, "col offset")?)?;
                let ih0 = ((self.row0 + oh_lo) * sh + th * dil_h) as i64 - pt as i64;
                let iw0 = (ow_lo * sw + tw * dil_w) as i64 - pl as i64;
                a.lea(
                    SRC,
                    qword_ptr(X_CH + imm32((ih0 * self.w as i64 + iw0) * 4, "input offset")?),
                )?;
                let mut rows = a.create_label();
                a.mov(ROWS, (oh_hi - oh_lo) as u64)?;
                a.set_label(&mut rows)?;
                self.zeros(a, 0, ow_lo)?;
                self.copy(a, ow_lo, ow_hi - ow_lo, sw)?;
                self.zeros(a, ow_hi, self.ow - ow_hi)?;
                a.add(SRC, imm32((sh * self.w * 4) as i64, "input row stride")?)?;
                a.add(DST, imm32((self.ow * 4) as i64, "col row stride")?)?;
                a.dec(ROWS)?;
                a.jnz(rows)?;
                self.zeros(a, 0, (self.rows - oh_hi) * self.ow)?;
            }
        }
        a.add(X_CH, imm32((self.h * self.w * 4) as i64, "channel stride")?)?;
        a.add(
            COL_CH,
            imm32((self.kh * self.kw) as i64 * row_bytes, "col channel stride")?,
        )?;
        a.dec(CH)?;
        a.jnz(top)?;
        a.ret()?;
        Ok(())
    }

    /// `len` zeros at DST + `at` floats.
    fn zeros(&self, a: &mut CodeAssembler, at: usize, len: usize) -> Result<(), MicrokernelError> {
        let mut o = 0;
        while o < len {
            let lanes = (len - o).min(16);
            let disp = imm32(((at + o) * 4) as i64, "zero fill")?;
            if lanes == 16 {
                a.vmovups(zmmword_ptr(DST + disp), zmm0)?;
            } else {
                a.mov(TMP, (1u32 << lanes) - 1)?;
                a.kmovw(k2, TMP)?;
                a.vmovups(zmmword_ptr(DST + disp).k2(), zmm0)?;
            }
            o += lanes;
        }
        Ok(())
    }

    /// `len` floats from SRC (every `stride`-th) to DST + `at` floats.
    fn copy(
        &self,
        a: &mut CodeAssembler,
        at: usize,
        len: usize,
        stride: usize,
    ) -> Result<(), MicrokernelError> {
        if stride != 1 {
            for q in 0..len {
                let src = imm32((q * stride * 4) as i64, "strided copy")?;
                let dst = imm32(((at + q) * 4) as i64, "strided copy")?;
                a.mov(TMP, dword_ptr(SRC + src))?;
                a.mov(dword_ptr(DST + dst), TMP)?;
            }
            return Ok(());
        }
        let mut o = 0;
        while o < len {
            let lanes = (len - o).min(16);
            let src = imm32((o * 4) as i64, "copy")?;
            let dst = imm32(((at + o) * 4) as i64, "copy")?;
            if lanes == 16 {
                a.vmovups(zmm1, zmmword_ptr(SRC + src))?;
                a.vmovups(zmmword_ptr(DST + dst), zmm1)?;
            } else {
                a.mov(TMP, (1u32 << lanes) - 1)?;
                a.kmovw(k2, TMP)?;
                a.vmovups(zmm1.k2().z(), zmmword_ptr(SRC + src))?;
                a.vmovups(zmmword_ptr(DST + dst).k2(), zmm1)?;
            }
            o += lanes;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::valid_range;

    #[test]
    fn valid_ranges_match_a_scan() {
        for out in 1..8 {
            for size in 1..9 {
                for stride in 1..4 {
                    for tap in 0..4 {
                        for dil in 1..3 {
                            for pad in 0..4 {
                                let (lo, hi) = valid_range(out, size, stride, tap, dil, pad);
                                for o in 0..out {
                                    let i = (o * stride + tap * dil) as i64 - pad as i64;
                                    let inside = i >= 0 && i < size as i64;
                                    assert_eq!(
                                        inside,
                                        o >= lo && o < hi,
                                        "{out} {size} {stride} {tap} {dil} {pad} o={o}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
