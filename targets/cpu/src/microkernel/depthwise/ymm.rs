//! The AVX2 (`x86_64-v3`) row of the depthwise kernel: 8 output pixels per
//! ymm vector, each tap's weight broadcast into a register once for all
//! vectors (VEX FMAs take no broadcast operand). A vector whose window
//! crosses the left or right border, and the last partial vector, load
//! and store under `vmaskmovps` with [`MASK`] read from a table of lane
//! ranges placed after the code ([`Masks`]), so padding reads nothing and
//! nothing past the row is written. At W stride 2 a vector's input is two
//! loads of 8 columns, the even ones gathered by `vshufps` and `vpermpd`
//! (AVX2 has no two-source lane permutation), with half as many vectors
//! at once.

use iced_x86::code_asm::*;

use super::{DepthwiseSpec, RowSegment, B_G, CHAINS, CHANNEL, DST, SRC, W_G};
use crate::microkernel::epilogue::allocate_slots;
use crate::microkernel::ymm::{self, LANES, MASK, YMM};
use crate::microkernel::{imm32, MicrokernelError};

/// Most 8-pixel vectors accumulated together: accumulators in ymm0–ymm5,
/// their input vectors in ymm6–ymm11 (at W stride 2, half as many: the
/// odd halves of the inputs in ymm9–ymm11).
const MAX_TILES: usize = 6;

/// The tap's weight, broadcast.
const WEIGHT: AsmRegisterYmm = ymm12;

/// The epilogue's temporaries.
const TEMPS: [AsmRegisterYmm; 2] = [ymm13, ymm14];

/// The registers free for the epilogue at the store: the input vectors
/// and the weight.
pub(super) const STORE_FREE: std::ops::Range<usize> = MAX_TILES..13;

/// Lane masks (lanes `lo..hi` set), each with a label, placed after the
/// kernel's code by [`Masks::emit`].
#[derive(Default)]
pub(super) struct Masks {
    entries: Vec<((usize, usize), CodeLabel)>,
}

impl Masks {
    /// [`MASK`] = lanes `lo..hi` set.
    fn load(
        &mut self,
        a: &mut CodeAssembler,
        lanes: (usize, usize),
    ) -> Result<(), MicrokernelError> {
        let label = match self.entries.iter().find(|(r, _)| *r == lanes) {
            Some(&(_, label)) => label,
            None => {
                let label = a.create_label();
                self.entries.push((lanes, label));
                label
            }
        };
        // One label per mask: a label operand takes no displacement.
        a.vmovups(MASK, ymmword_ptr(label))?;
        Ok(())
    }

    /// The masks used, after the code.
    pub(super) fn emit(self, a: &mut CodeAssembler) -> Result<(), MicrokernelError> {
        for ((lo, hi), mut label) in self.entries {
            a.set_label(&mut label)?;
            let lanes: Vec<u8> = (0..LANES)
                .flat_map(|i| {
                    i32::from((lo..hi).contains(&i))
                        .wrapping_neg()
                        .to_le_bytes()
                })
                .collect();
            a.db(&lanes)?;
        }
        Ok(())
    }
}

impl DepthwiseSpec {
    /// One output row of output channel `j` of the group at SRC/DST
    /// (weights at W_G + `w_off`, bias at B_G + 4j), in ymm vectors.
    pub(super) fn ymm_row(
        &self,
        a: &mut CodeAssembler,
        seg: &RowSegment,
        j: usize,
        w_off: i64,
        masks: &mut Masks,
    ) -> Result<(), MicrokernelError> {
        let b_off = 4 * j as i64;
        let free: Vec<AsmRegisterYmm> = STORE_FREE.map(|i| YMM[i]).collect();
        let home = allocate_slots(&self.epilogue, 1 + free.len()).ok_or_else(|| {
            MicrokernelError::Layout("the depthwise epilogue does not fit".into())
        })?;
        let dil_w = self.dilations[1];
        let pl = self.pad_tl[1];
        let sw = self.stride_w;
        let vectors = self.ow.div_ceil(LANES);
        let mut v0 = 0;
        while v0 < vectors {
            let n = (vectors - v0).min(MAX_TILES / sw);
            // As the zmm row: one or two vectors rotate their taps over
            // several accumulators (n · chains ≤ 4 ≤ MAX_TILES).
            let chains = (CHAINS / n).max(1);
            let acc = |t: usize, c: usize| YMM[t + n * c];
            let xr = |t: usize| YMM[MAX_TILES + t];
            let odd_half = |t: usize| YMM[MAX_TILES + MAX_TILES / 2 + t];
            for t in 0..n {
                for c in 0..chains {
                    if c == 0 && self.bias.is_some() {
                        a.vbroadcastss(acc(t, c), dword_ptr(B_G + imm32(b_off, "bias")?))?;
                    } else {
                        a.vxorps(acc(t, c), acc(t, c), acc(t, c))?;
                    }
                }
            }
            for (row, tw, wdisp, c) in self.row_taps(seg, w_off, chains) {
                let wdisp = imm32(wdisp, "weight")?;
                // Per vector and 8-column load: its first input
                // column and the lanes whose column lies inside the
                // row and whose output pixel exists (a contiguous
                // range; the odd columns of a stride-2 pair are loaded
                // only to be dropped).
                let loads: Vec<Vec<(i64, usize, usize)>> = (0..n)
                    .map(|t| {
                        let ow0 = (v0 + t) * LANES;
                        let start = (ow0 * sw + tw * dil_w) as i64 - pl as i64;
                        (0..sw)
                            .map(|half| {
                                let col0 = start + (half * LANES) as i64;
                                let inside = |q: usize| {
                                    let col = col0 + q as i64;
                                    ow0 + (half * LANES + q) / sw < self.ow
                                        && col >= 0
                                        && col < self.w as i64
                                };
                                let lo = (0..LANES).find(|&q| inside(q)).unwrap_or(LANES);
                                let hi = (lo..LANES).find(|&q| !inside(q)).unwrap_or(LANES);
                                (col0, lo, hi)
                            })
                            .collect()
                    })
                    .collect();
                let empty = |l: &[(i64, usize, usize)]| l.iter().all(|&(_, lo, _)| lo == LANES);
                if loads.iter().all(|l| empty(l)) {
                    continue;
                }
                a.vbroadcastss(WEIGHT, dword_ptr(W_G + wdisp))?;
                for (t, halves) in loads.iter().enumerate() {
                    if empty(halves) {
                        continue;
                    }
                    for (half, &(col0, lo, hi)) in halves.iter().enumerate() {
                        let x = [xr(t), odd_half(t)][half];
                        if lo == LANES {
                            a.vxorps(x, x, x)?;
                            continue;
                        }
                        let at = SRC + imm32(row + col0 * 4, "input pixel")?;
                        let masked = (lo, hi) != (0, LANES);
                        if masked {
                            masks.load(a, (lo, hi))?;
                        }
                        ymm::load(a, x, at, masked)?;
                    }
                    if sw == 2 {
                        // Columns 0, 2, 4, 6 of each half, in order:
                        // the even lanes of each 128-bit lane pair,
                        // then the quadwords put back in order.
                        a.vshufps(xr(t), xr(t), odd_half(t), 0b10_00_10_00)?;
                        a.vpermpd(xr(t), xr(t), 0b11_01_10_00)?;
                    }
                    a.vfmadd231ps(acc(t, c), xr(t), WEIGHT)?;
                }
            }
            for t in 0..n {
                for c in 1..chains {
                    a.vaddps(acc(t, 0), acc(t, 0), acc(t, c))?;
                }
            }
            for t in 0..n {
                let ow0 = (v0 + t) * LANES;
                let lanes = (self.ow - ow0).min(LANES);
                let x = if self.epilogue.is_empty() {
                    acc(t, 0)
                } else {
                    let regs: Vec<AsmRegisterYmm> = std::iter::once(acc(t, 0))
                        .chain(free.iter().copied())
                        .collect();
                    ymm::run_epilogue(a, &self.epilogue, (&home, &regs), (CHANNEL, j), None, TEMPS)?
                };
                if lanes < LANES {
                    masks.load(a, (0, lanes))?;
                }
                let at = DST + imm32((ow0 * 4) as i64, "output pixel")?;
                ymm::store(a, at, x, lanes < LANES)?;
            }
            v0 += n;
        }
        Ok(())
    }
}
