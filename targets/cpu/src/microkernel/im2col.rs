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
//! of 1 are zmm loads/stores with a masked tail; with a W stride of 2, two
//! masked loads and a `vpermt2ps` of the even lanes per 16 columns; with
//! larger strides a masked gather.
//! Input channels are a run-time loop, taps and pixels are unrolled.
//!
//! For the int8 convolution ([`Im2col::quads`]) the image is u8 and `col`
//! holds *quads*: k runs over `(th, tw, channel)` with the channels padded
//! to a multiple of 4, and each 4-byte element of a `col` row packs the four
//! channels of one quad at one output position, the dword `vpdpbusd` reads
//! per column. A quad is built from four zero-extended byte vectors
//! (`vpmovzxbd`, or `vpmovzxwd` masked to the low bytes for a W stride of
//! 2) shifted into place; taps in the padding hold the activation's zero
//! point in every byte, so that after the zero-point correction they add
//! nothing. Rows are padded to whole 16-column vectors (the GEMM loads B
//! unmasked).

use iced_x86::code_asm::*;

use super::Vector;
use super::{imm32, load_address, MicrokernelError};
use crate::plan::Loc;

mod ymm;

/// Emits the copy of `len` pixels of one `col` row at element `at`, the
/// first from input column `iw0` (SRC points at it).
type CopyPixels<'a> =
    dyn FnMut(&mut CodeAssembler, usize, usize, i64) -> Result<(), MicrokernelError> + 'a;

/// Geometry of one convolution's im2col.
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// `Some(zero)`: a u8 image converted to quads (see the module docs),
    /// the padding filled with the byte at `zero` (the activation's zero
    /// point); `None`: f32.
    pub quads: Option<Loc>,
    /// The registers of the copies (ymm: f32 only, see [`ymm`]).
    pub vector: Vector,
}

/// A kernel that only builds im2col matrices, the first step of a
/// convolution whose GEMM tasks then share them (see
/// `partition::stage_im2col`): each job runs one of `routines` on the
/// image at `src`, writing `col`.
#[derive(Clone, Debug)]
pub(crate) struct Im2colKernel {
    /// The distinct routines the jobs run.
    pub routines: Vec<Im2col>,
    /// In order: the image (moved to the job's first channel), where its
    /// rows of `col` start, and the routine.
    pub jobs: Vec<(Loc, Loc, usize)>,
}

impl Im2colKernel {
    /// Assembles the kernel (kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let mut a = CodeAssembler::new(64)?;
        let mut labels: Vec<CodeLabel> = self.routines.iter().map(|_| a.create_label()).collect();
        // The routines clobber r12–r14, which the caller keeps.
        for r in super::SAVED {
            a.push(r)?;
        }
        for &(src, col, routine) in &self.jobs {
            load_address(&mut a, r8, src)?;
            load_address(&mut a, r9, col)?;
            a.call(labels[routine])?;
        }
        for r in super::SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        for (routine, label) in self.routines.iter().zip(&mut labels) {
            a.set_label(label)?;
            routine.emit(&mut a)?;
        }
        Ok(a.assemble(0)?)
    }
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

/// The column of each lane of a strided copy (`i · stride`), loaded from
/// the routine's lane table.
const STRIDED_LANES: AsmRegisterZmm = zmm2;

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
        (self.col_rows() * self.row_bytes()) as u64
    }

    /// Bytes of one image element: f32, or u8 for quads.
    pub(crate) fn elem_bytes(&self) -> usize {
        match self.quads {
            None => 4,
            Some(_) => 1,
        }
    }

    /// Rows of `col`: one per `(channel, th, tw)` in f32, one per `(th, tw,
    /// quad of channels)` for quads.
    pub(crate) fn col_rows(&self) -> usize {
        match self.quads {
            None => self.cin * self.kh * self.kw,
            Some(_) => self.cin.div_ceil(4) * self.kh * self.kw,
        }
    }

    /// Bytes between rows of `col` (quad rows padded to whole vectors).
    pub(crate) fn row_bytes(&self) -> usize {
        let p = self.rows * self.ow;
        match self.quads {
            None => p * 4,
            Some(_) => p.div_ceil(16) * 64,
        }
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
    /// `col` at r9. Clobbers rax, rcx, rdx, r10–r14, zmm0–zmm5 and k2.
    pub(crate) fn emit(&self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        if let Some(zero) = self.quads {
            return self.emit_quads(a, zero);
        }
        let row_bytes = self.row_bytes() as i64;
        let sw = self.strides[1];
        let mut lane_table = a.create_label();
        match self.vector {
            Vector::Zmm => {
                if sw != 1 {
                    a.vmovdqu32(STRIDED_LANES, zmmword_ptr(lane_table))?;
                }
                a.vpxord(zmm0, zmm0, zmm0)?;
            }
            Vector::Ymm => ymm::start(a, sw != 1, lane_table)?,
        }
        a.mov(X_CH, r8)?;
        a.mov(COL_CH, r9)?;
        a.mov(CH, self.cin as u64)?;
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        self.taps(a, row_bytes, &mut |a, at, len, _| self.copy(a, at, len, sw))?;
        a.add(X_CH, imm32((self.h * self.w * 4) as i64, "channel stride")?)?;
        a.add(
            COL_CH,
            imm32((self.kh * self.kw) as i64 * row_bytes, "col channel stride")?,
        )?;
        a.dec(CH)?;
        a.jnz(top)?;
        a.ret()?;
        if sw != 1 {
            // Lane i reads input column i·stride: the gather's indices, and
            // for stride 2 the `vpermt2ps` picking the even lanes of two
            // vectors.
            a.set_label(&mut lane_table)?;
            let idx: Vec<u8> = (0..16u32)
                .flat_map(|i| (i * sw as u32).to_le_bytes())
                .collect();
            a.db(&idx)?;
        }
        Ok(())
    }

    /// [`Im2col::emit`] for quads: the loop over whole quads of channels,
    /// then the last partial quad. Also clobbers zmm2–zmm5.
    fn emit_quads(&self, a: &mut CodeAssembler, zero: Loc) -> Result<(), MicrokernelError> {
        load_address(a, rax, zero)?;
        a.movzx(TMP, byte_ptr(rax))?;
        a.imul_3(TMP, TMP, 0x0101_0101)?;
        a.vpbroadcastd(zmm0, TMP)?;
        a.mov(TMP, 0xffu32)?;
        a.vpbroadcastd(zmm5, TMP)?;
        a.mov(X_CH, r8)?;
        a.mov(COL_CH, r9)?;
        let plane = (self.h * self.w) as i64;
        let full = self.cin / 4;
        if full > 0 {
            let mut top = a.create_label();
            a.mov(CH, full as u64)?;
            a.set_label(&mut top)?;
            self.quad_taps(a, 4)?;
            a.add(X_CH, imm32(4 * plane, "channel quad stride")?)?;
            a.add(COL_CH, imm32(self.row_bytes() as i64, "col quad stride")?)?;
            a.dec(CH)?;
            a.jnz(top)?;
        }
        if !self.cin.is_multiple_of(4) {
            self.quad_taps(a, self.cin % 4)?;
        }
        a.ret()?;
        Ok(())
    }

    /// Every tap's row of the quad of `channels` channels at X_CH, into the
    /// rows at COL_CH (tap `t` at row `t * quads`).
    fn quad_taps(&self, a: &mut CodeAssembler, channels: usize) -> Result<(), MicrokernelError> {
        let tap_rows = (self.cin.div_ceil(4) * self.row_bytes()) as i64;
        self.taps(a, tap_rows, &mut |a, at, len, iw0| {
            self.compose(a, at, len, iw0, channels)
        })
    }

    /// The band's rows of every tap of one channel (or quad) at X_CH, tap
    /// `t` at COL_CH + `t * tap_bytes`: per output row the fill left of the
    /// pixels inside the image, `copy(at, len, iw0)` of those (input
    /// column `iw0` first, SRC at it), the fill right of them; rows whose
    /// input row is in the padding are filled whole.
    fn taps(
        &self,
        a: &mut CodeAssembler,
        tap_bytes: i64,
        copy: &mut CopyPixels,
    ) -> Result<(), MicrokernelError> {
        let elem = self.elem_bytes() as i64;
        let p = self.rows * self.ow;
        let [sh, sw] = self.strides;
        let [pt, pl] = self.pad_tl;
        let [dil_h, dil_w] = self.dilations;
        for th in 0..self.kh {
            let (oh_lo, oh_hi) = self.band_rows(th);
            for tw in 0..self.kw {
                let (ow_lo, ow_hi) = valid_range(self.ow, self.w, sw, tw, dil_w, pl);
                let t = (th * self.kw + tw) as i64;
                a.lea(DST, qword_ptr(COL_CH + imm32(t * tap_bytes, "col row")?))?;
                if oh_lo >= oh_hi || ow_lo >= ow_hi {
                    self.zeros(a, 0, p)?;
                    continue;
                }
                self.zeros(a, 0, oh_lo * self.ow)?;
                a.add(DST, imm32((oh_lo * self.ow * 4) as i64, "col offset")?)?;
                let ih0 = ((self.row0 + oh_lo) * sh + th * dil_h) as i64 - pt as i64;
                let iw0 = (ow_lo * sw + tw * dil_w) as i64 - pl as i64;
                let src = (ih0 * self.w as i64 + iw0) * elem;
                a.lea(SRC, qword_ptr(X_CH + imm32(src, "input offset")?))?;
                let mut rows = a.create_label();
                a.mov(ROWS, (oh_hi - oh_lo) as u64)?;
                a.set_label(&mut rows)?;
                self.zeros(a, 0, ow_lo)?;
                copy(a, ow_lo, ow_hi - ow_lo, iw0)?;
                self.zeros(a, ow_hi, self.ow - ow_hi)?;
                a.add(
                    SRC,
                    imm32(sh as i64 * self.w as i64 * elem, "input row stride")?,
                )?;
                a.add(DST, imm32((self.ow * 4) as i64, "col row stride")?)?;
                a.dec(ROWS)?;
                a.jnz(rows)?;
                self.zeros(a, 0, (self.rows - oh_hi) * self.ow)?;
            }
        }
        Ok(())
    }

    /// `len` quads of `channels` channels (the rest of each dword zero)
    /// from SRC (input column `iw0`, every W-stride-th byte) to DST + `at`
    /// elements.
    fn compose(
        &self,
        a: &mut CodeAssembler,
        at: usize,
        len: usize,
        iw0: i64,
        channels: usize,
    ) -> Result<(), MicrokernelError> {
        let stride = self.strides[1];
        let plane = (self.h * self.w) as i64;
        let mut o = 0;
        while o < len {
            let lanes = (len - o).min(16);
            // A W stride of 2 reads words: the odd byte of the last one may
            // lie past the image's last row, so that pixel is moved alone.
            let last_col = iw0 + 2 * (o + lanes - 1) as i64;
            let vector = match stride {
                1 => lanes,
                2 if last_col + 1 < self.w as i64 => lanes,
                2 => lanes - 1,
                _ => 0,
            };
            if vector > 0 {
                if vector < 16 {
                    a.mov(TMP, (1u32 << vector) - 1)?;
                    a.kmovw(k2, TMP)?;
                }
                let regs = [zmm1, zmm2, zmm3, zmm4];
                for (c, &reg) in regs.iter().enumerate().take(channels) {
                    let disp = imm32(c as i64 * plane + (o * stride) as i64, "quad load")?;
                    let dst = if vector < 16 { reg.k2().z() } else { reg };
                    if stride == 1 {
                        a.vpmovzxbd(dst, xmmword_ptr(SRC + disp))?;
                    } else {
                        a.vpmovzxwd(dst, ymmword_ptr(SRC + disp))?;
                        a.vpandd(reg, reg, zmm5)?;
                    }
                    if c > 0 {
                        a.vpslld(reg, reg, 8 * c as u32)?;
                        a.vpord(zmm1, zmm1, reg)?;
                    }
                }
                let disp = imm32(((at + o) * 4) as i64, "quad store")?;
                if vector < 16 {
                    a.vmovdqu32(zmmword_ptr(DST + disp).k2(), zmm1)?;
                } else {
                    a.vmovdqu32(zmmword_ptr(DST + disp), zmm1)?;
                }
            }
            for q in o + vector..o + lanes {
                for c in 0..channels {
                    let disp = imm32(c as i64 * plane + (q * stride) as i64, "quad byte")?;
                    if c == 0 {
                        a.movzx(TMP, byte_ptr(SRC + disp))?;
                    } else {
                        a.movzx(eax, byte_ptr(SRC + disp))?;
                        a.shl(eax, 8 * c as u32)?;
                        a.or(TMP, eax)?;
                    }
                }
                a.mov(
                    dword_ptr(DST + imm32(((at + q) * 4) as i64, "quad store")?),
                    TMP,
                )?;
            }
            o += lanes;
        }
        Ok(())
    }

    /// `len` copies of zmm0's element (0.0, or the zero-point quad) at DST
    /// + `at` elements.
    fn zeros(&self, a: &mut CodeAssembler, at: usize, len: usize) -> Result<(), MicrokernelError> {
        if self.vector == Vector::Ymm {
            return ymm::zeros(a, at, len);
        }
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
        if self.vector == Vector::Ymm {
            return ymm::copy(a, at, len, stride);
        }
        if stride != 1 {
            // 16 output columns at a time: for stride 2 two loads of the 32
            // input columns they span (masked to the last one read) and a
            // `vpermt2ps` of the even lanes; otherwise a masked gather. No
            // lane outside the image is read.
            let mut o = 0;
            while o < len {
                let lanes = (len - o).min(16);
                let src = (o * stride * 4) as i64;
                let dst = imm32(((at + o) * 4) as i64, "strided copy")?;
                let mask = |a: &mut CodeAssembler, n: usize| -> Result<(), MicrokernelError> {
                    a.mov(TMP, ((1u64 << n) - 1) as u32)?;
                    a.kmovw(k2, TMP)?;
                    Ok(())
                };
                if stride == 2 {
                    let span = 2 * (lanes - 1) + 1;
                    let (lo, hi) = (span.min(16), span.saturating_sub(16));
                    mask(a, lo)?;
                    a.vmovups(
                        zmm1.k2().z(),
                        zmmword_ptr(SRC + imm32(src, "strided copy")?),
                    )?;
                    if hi > 0 {
                        mask(a, hi)?;
                        let upper = imm32(src + 64, "strided copy")?;
                        a.vmovups(zmm3.k2().z(), zmmword_ptr(SRC + upper))?;
                    } else {
                        a.vpxord(zmm3, zmm3, zmm3)?;
                    }
                    a.vpermt2ps(zmm1, STRIDED_LANES, zmm3)?;
                } else {
                    mask(a, lanes)?;
                    a.vpxord(zmm1, zmm1, zmm1)?;
                    let at = SRC + STRIDED_LANES * 4 + imm32(src, "strided copy")?;
                    a.vgatherdps(zmm1.k2(), zmmword_ptr(at))?;
                }
                if lanes == 16 {
                    a.vmovups(zmmword_ptr(DST + dst), zmm1)?;
                } else {
                    mask(a, lanes)?;
                    a.vmovups(zmmword_ptr(DST + dst).k2(), zmm1)?;
                }
                o += lanes;
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
