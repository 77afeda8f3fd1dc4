//! AVX-512 depthwise convolution of narrow maps, 16 channels a vector.
//!
//! The row kernel of `depthwise.rs` puts output pixels along W in the
//! lanes, so a map narrower than 16 leaves lanes empty: a 7×7 map fills 7
//! of 16, and a 7×7 window on it runs 49 FMAs a row at less than half
//! width. Here the lanes are 16 channels (onnxruntime's NCHWc blocking,
//! done inside the kernel): per block of 16 channels the input planes are
//! copied into a scratch plane `[rows][cols][16]` with zero borders (the
//! padding), 16 pixels of 16 channels at a time through a 16×16 transpose
//! in registers, every output pixel of a row is an accumulator, each tap
//! loads its 16 weights once and adds them times the shifted scratch
//! pixel into every accumulator of the row, and the row is transposed
//! back and stored to the 16 output planes. No tap needs a mask, any
//! stride or dilation is an address, and every lane is used but the last
//! block's past the channel count (masked).
//!
//! The copies in and out cost about two FMAs a pixel, so the kernel pays
//! where the window is large enough against the map ([`worth_blocking`]).

use iced_x86::code_asm::*;

use super::super::epilogue::{allocate_slots, run_epilogue, FullAccess, Operand};
use super::super::{imm32, load_address, MicrokernelError};
use super::{DepthwiseSpec, B_G, CHANNEL, DST, GROUPS, OUT_G, ROWS, SAVED, SRC, W_G, X_G, ZMM};
use crate::plan::Loc;

/// Lanes: channels per block.
const LANES: usize = 16;

/// Most output pixels a row keeps in accumulators (zmm0..).
pub(crate) const MAX_ROW: usize = 14;

/// Largest scratch plane: one block of the map stays in L2.
const MAX_PLANE_BYTES: u64 = 256 << 10;

/// Registers: the row kernel's (`CHANNEL` the block's channel offset in
/// bytes of a per-channel operand, `GROUPS` the block count), and the
/// scratch plane in r15 (the row kernel's `TMP`).
const S_B: AsmRegister64 = r15;
const WEIGHT: AsmRegisterZmm = zmm15;
const PIXEL: AsmRegisterZmm = zmm16;
/// Registers the epilogue may use beside the accumulator.
const FREE: std::ops::Range<usize> = 17..30;

/// Whether the blocked kernel is expected to beat the row kernel, in the
/// row kernel's FMAs (one vector with its input load and a broadcast
/// weight) per 16 channels: the row kernel runs `taps` a row vector per
/// channel, filling `ow` of 16 lanes (at W stride 2 each also loads twice
/// and permutes); the blocked one `taps` per output pixel at half that
/// cost (one load, the weight in a register, independent accumulators),
/// and the copy of each input and output pixel through the 16×16
/// transposes at 2. Where the row kernel computes blocks of rows
/// (`DepthwiseSpec::row_block`: a window more than one row tall, rows of
/// at most [`super::BLOCK_MAX_TILES`] vectors) its input loads, and at W
/// stride 2 their permutes, are shared by several rows: a row FMA then
/// counts 0.8, and the stride's extra half. Fitted on the sweep's 15
/// depthwise shapes of at most 14 output columns, both kernels forced
/// (`kiln bench --random --runs 100 --threads 1`, ms blocked / row): the
/// row kernel wins only 3×3/2 from 28×28 of few channels (ShuffleNetV2's
/// 116: 0.027 / 0.023; MobileNetV3's 240: 0.052 / 0.049); 3×3 on 14×14 of
/// 384 ties (0.035 / 0.036); 5×5 on 14×14 of 672 0.105 / 0.133, 7×7 on
/// 14×14 of 384 0.095 / 0.126, 5×5 on 7×7 of 960 0.039 / 0.088, 3×3 on
/// 7×7 of 960 0.024 / 0.040. (With a gather and a scatter per pixel, at
/// 12, 8.6 ns each, the blocked kernel took 0.080 ms for that 5×5 on 7×7.)
pub(crate) fn worth_blocking(spec: &DepthwiseSpec) -> bool {
    let taps = spec.kh * spec.kw;
    let row_vectors = spec.oh * spec.ow.div_ceil(16) * 16 * taps;
    let row_blocks = spec.kh > 1 && spec.ow.div_ceil(16) <= super::BLOCK_MAX_TILES;
    let row_kernel = match row_blocks {
        true => row_vectors * (1 + spec.stride_w) * 2 / 5,
        false => row_vectors * spec.stride_w,
    };
    let blocked = spec.oh * spec.ow * taps / 2 + 2 * (spec.h * spec.w + spec.oh * spec.ow);
    spec.ow <= MAX_ROW && 10 * blocked < 9 * row_kernel
}

/// A depthwise convolution with its weights blocked by 16 channels.
#[derive(Clone, Debug)]
pub(crate) struct BlockedDepthwise {
    /// The convolution (one output channel per group, f32 store).
    pub spec: DepthwiseSpec,
    /// Weights `[blocks][kh·kw][16]`, the last block padded with zeros.
    pub weights: Loc,
    /// This kernel's scratch plane, [`BlockedDepthwise::scratch_bytes`].
    pub scratch: Loc,
}

impl BlockedDepthwise {
    /// Scratch rows and columns: every input pixel at (pad + y, pad + x),
    /// and every tap of every output pixel inside.
    fn plane(spec: &DepthwiseSpec) -> (usize, usize) {
        let reach = |out: usize, stride: usize, k: usize, step: usize| {
            (out - 1) * stride + (k - 1) * step + 1
        };
        let rows =
            reach(spec.oh, spec.stride_h, spec.kh, spec.dilations[0]).max(spec.pad_tl[0] + spec.h);
        let cols =
            reach(spec.ow, spec.stride_w, spec.kw, spec.dilations[1]).max(spec.pad_tl[1] + spec.w);
        (rows, cols)
    }

    /// The scratch one kernel of `spec` needs.
    pub(crate) fn scratch_bytes(spec: &DepthwiseSpec) -> u64 {
        let (rows, cols) = Self::plane(spec);
        (rows * cols * LANES * 4) as u64
    }

    /// `w` (`[channels, 1, kh, kw]`) blocked as `[blocks][kh·kw][16]`.
    pub(crate) fn block_weights(w: &[f32], channels: usize, taps: usize) -> Vec<u8> {
        let blocks = channels.div_ceil(LANES);
        let mut out = vec![0f32; blocks * taps * LANES];
        for c in 0..channels {
            for t in 0..taps {
                out[((c / LANES) * taps + t) * LANES + c % LANES] = w[c * taps + t];
            }
        }
        out.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Why this kernel cannot run `spec`, if it cannot.
    pub(crate) fn declines(spec: &DepthwiseSpec) -> Option<String> {
        if spec.per_group != 1 {
            return Some(format!("{} output channels per group", spec.per_group));
        }
        if spec.ow > MAX_ROW {
            return Some(format!("{} output columns > {MAX_ROW}", spec.ow));
        }
        let plane = Self::scratch_bytes(spec);
        if plane > MAX_PLANE_BYTES {
            return Some(format!(
                "its scratch plane would be {plane} bytes (> {MAX_PLANE_BYTES}: a tall map)"
            ));
        }
        if spec.store.bytes() != 4 {
            return Some("a u8 store".into());
        }
        if (spec.epilogue.iter()).any(|s| {
            [s.a, s.b]
                .iter()
                .any(|o| matches!(o, Operand::Full(_) | Operand::PerColumn(_)))
        }) {
            return Some("an epilogue operand per element".into());
        }
        if allocate_slots(&spec.epilogue, 1 + FREE.len()).is_none() {
            return Some("the epilogue does not fit".into());
        }
        None
    }

    /// The kernel as up to `tasks` kernels over contiguous ranges of whole
    /// blocks, each with its own scratch (`scratch[t]`).
    pub(crate) fn split(&self, scratch: &[Loc]) -> Vec<BlockedDepthwise> {
        let blocks = self.spec.groups.div_ceil(LANES);
        let tasks = scratch.len().clamp(1, blocks.max(1));
        let taps = self.spec.kh * self.spec.kw;
        (0..tasks)
            .map(|t| {
                let (first, end) = (blocks * t / tasks, blocks * (t + 1) / tasks);
                let channels = (end * LANES).min(self.spec.groups) - first * LANES;
                BlockedDepthwise {
                    spec: self.spec.groups_from(first * LANES, channels),
                    weights: self.weights.moved((first * taps * LANES * 4) as i64),
                    scratch: scratch[t],
                }
            })
            .collect()
    }

    /// Assembles the kernel.
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let spec = &self.spec;
        if let Some(why) = Self::declines(spec) {
            return Err(MicrokernelError::Layout(why));
        }
        let mut a = CodeAssembler::new(64)?;
        for r in SAVED {
            a.push(r)?;
        }
        // The scratch plane's borders are the padding: zero it once.
        load_address(&mut a, SRC, self.scratch)?;
        a.vpxord(PIXEL, PIXEL, PIXEL)?;
        let mut zero = a.create_label();
        a.mov(ROWS, Self::scratch_bytes(spec) / 64)?;
        a.set_label(&mut zero)?;
        a.vmovaps(zmmword_ptr(SRC), PIXEL)?;
        a.add(SRC, 64)?;
        a.dec(ROWS)?;
        a.jnz(zero)?;
        load_address(&mut a, S_B, self.scratch)?;
        let full = spec.groups / LANES;
        let tail = spec.groups % LANES;
        for &(x, out) in &spec.images {
            load_address(&mut a, X_G, x)?;
            load_address(&mut a, OUT_G, out)?;
            load_address(&mut a, W_G, self.weights)?;
            if let Some(b) = spec.bias {
                load_address(&mut a, B_G, b)?;
            }
            a.xor(CHANNEL, CHANNEL)?;
            if full > 0 {
                let mut top = a.create_label();
                a.mov(GROUPS, full as u64)?;
                a.set_label(&mut top)?;
                self.block(&mut a, LANES)?;
                a.dec(GROUPS)?;
                a.jnz(top)?;
            }
            if tail > 0 {
                self.block(&mut a, tail)?;
            }
        }
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }

    /// One block of `lanes` channels at X_G/OUT_G/W_G/B_G/CHANNEL, which
    /// it advances to the next block.
    fn block(&self, a: &mut CodeAssembler, lanes: usize) -> Result<(), MicrokernelError> {
        let spec = &self.spec;
        let (_, cols) = Self::plane(spec);
        let pixel = (LANES * 4) as i64;
        let masked = lanes < LANES;
        // k1: the block's lanes, the epilogue's mask; k2 the pixels of a
        // partial load or store.
        a.mov(r9d, ((1u32 << lanes) - 1) as i32)?;
        a.kmovw(k1, r9d)?;
        // The input planes into the scratch plane, 16 pixels at a time:
        // a vector of 16 pixels per channel, transposed to a vector of 16
        // channels per pixel, stored at the pixel's place. Maps at least
        // 16 wide go row by row (a loop), narrower ones as one run of
        // pixels across rows (unrolled).
        let plane = (spec.h * spec.w) as i64;
        let (run, rows) = match spec.w >= LANES {
            true => (spec.w, spec.h),
            false => (spec.h * spec.w, 1),
        };
        a.mov(SRC, X_G)?;
        let first = (spec.pad_tl[0] * cols + spec.pad_tl[1]) as i64 * pixel;
        a.lea(DST, qword_ptr(S_B + imm32(first, "scratch pixel")?))?;
        let mut top = a.create_label();
        if rows > 1 {
            a.mov(ROWS, rows as u64)?;
            a.set_label(&mut top)?;
        }
        for p0 in (0..run).step_by(LANES) {
            let n = (run - p0).min(LANES);
            for (c, &reg) in ZMM[..LANES].iter().enumerate() {
                if c >= lanes {
                    a.vpxord(reg, reg, reg)?;
                    continue;
                }
                let at = imm32((c as i64 * plane + p0 as i64) * 4, "input pixel")?;
                match n {
                    LANES => a.vmovups(reg, zmmword_ptr(SRC + at))?,
                    _ => {
                        a.mov(r9d, ((1u32 << n) - 1) as i32)?;
                        a.kmovw(k2, r9d)?;
                        a.vmovups(reg.k2().z(), zmmword_ptr(SRC + at))?;
                    }
                }
            }
            let pixels = transpose16(
                a,
                std::array::from_fn(|i| ZMM[i]),
                std::array::from_fn(|i| ZMM[16 + i]),
            )?;
            for (p, &reg) in pixels[..n].iter().enumerate() {
                let (y, x) = ((p0 + p) / spec.w, (p0 + p) % spec.w);
                let at = (y * cols + x) as i64 * pixel;
                a.vmovaps(zmmword_ptr(DST + imm32(at, "scratch pixel")?), reg)?;
            }
        }
        if rows > 1 {
            a.add(SRC, imm32((spec.w * 4) as i64, "input row")?)?;
            a.add(DST, imm32(cols as i64 * pixel, "scratch row")?)?;
            a.dec(ROWS)?;
            a.jnz(top)?;
        }
        // Output rows: SRC the scratch row of tap row 0, DST the output row.
        a.mov(SRC, S_B)?;
        a.mov(DST, OUT_G)?;
        let free: Vec<AsmRegisterZmm> = FREE.map(|i| ZMM[i]).collect();
        let home = allocate_slots(&spec.epilogue, 1 + free.len())
            .ok_or_else(|| MicrokernelError::Layout("the epilogue does not fit".into()))?;
        // Per-channel operands are a vector of the block's channels.
        let epilogue: Vec<_> = (spec.epilogue.iter())
            .map(|st| {
                let per_lane = |o: Operand| match o {
                    Operand::PerRow(loc) => Operand::PerColumn(loc),
                    o => o,
                };
                super::super::epilogue::EpilogueStep {
                    a: per_lane(st.a),
                    b: per_lane(st.b),
                    ..*st
                }
            })
            .collect();
        let access = FullAccess {
            offset: CHANNEL,
            column: CHANNEL,
            masked,
        };
        let mut out_rows = a.create_label();
        a.mov(ROWS, spec.oh as u64)?;
        a.set_label(&mut out_rows)?;
        let acc = |ox: usize| ZMM[ox];
        for ox in 0..spec.ow {
            match spec.bias {
                Some(_) if masked => a.vmovups(acc(ox).k1().z(), zmmword_ptr(B_G + CHANNEL))?,
                Some(_) => a.vmovups(acc(ox), zmmword_ptr(B_G + CHANNEL))?,
                None => a.vpxord(acc(ox), acc(ox), acc(ox))?,
            }
        }
        for th in 0..spec.kh {
            for tw in 0..spec.kw {
                let tap = th * spec.kw + tw;
                a.vmovups(
                    WEIGHT,
                    zmmword_ptr(W_G + imm32(tap as i64 * pixel, "weight")?),
                )?;
                for ox in 0..spec.ow {
                    let at = (th * spec.dilations[0] * cols
                        + ox * spec.stride_w
                        + tw * spec.dilations[1]) as i64
                        * pixel;
                    a.vfmadd231ps(acc(ox), WEIGHT, zmmword_ptr(SRC + imm32(at, "tap")?))?;
                }
            }
        }
        for ox in 0..spec.ow {
            if !spec.epilogue.is_empty() {
                let regs: Vec<AsmRegisterZmm> = std::iter::once(acc(ox))
                    .chain(free.iter().copied())
                    .collect();
                let x = run_epilogue(a, &epilogue, &home, &regs, (CHANNEL, 0), Some(access))?;
                if x != acc(ox) {
                    a.vmovaps(acc(ox), x)?;
                }
            }
        }
        // The row's pixels (vectors of 16 channels; past `ow` whatever the
        // registers hold) transposed to a vector of pixels per channel,
        // stored to its plane's row.
        let channels = transpose16(
            a,
            std::array::from_fn(|i| ZMM[i]),
            std::array::from_fn(|i| ZMM[16 + i]),
        )?;
        a.mov(r9d, ((1u32 << spec.ow) - 1) as i32)?;
        a.kmovw(k2, r9d)?;
        let out_plane = (spec.oh * spec.ow * 4) as i64;
        for (c, &reg) in channels[..lanes].iter().enumerate() {
            let at = imm32(c as i64 * out_plane, "output plane")?;
            a.vmovups(zmmword_ptr(DST + at).k2(), reg)?;
        }
        a.add(
            SRC,
            imm32((spec.stride_h * cols) as i64 * pixel, "scratch row")?,
        )?;
        a.add(DST, imm32((spec.ow * 4) as i64, "output row")?)?;
        a.dec(ROWS)?;
        a.jnz(out_rows)?;
        // The next block.
        let block = LANES as i64;
        a.add(
            X_G,
            imm32(block * (spec.h * spec.w * 4) as i64, "input planes")?,
        )?;
        a.add(
            OUT_G,
            imm32(block * (spec.oh * spec.ow * 4) as i64, "output planes")?,
        )?;
        a.add(W_G, imm32((spec.kh * spec.kw) as i64 * pixel, "weights")?)?;
        a.add(CHANNEL, imm32(block * 4, "channel")?)?;
        Ok(())
    }
}

/// Transposes the 16×16 f32 matrix in `r` (row i in `r[i]`) with the
/// temporaries `t`: returns the registers holding its columns, in order
/// (unpacks of singles, then of pairs, within 128-bit lanes; then two
/// rounds of 128-bit lane shuffles). 64 shuffles for 256 elements, where a
/// gather or scatter of 16 took about 8.6 ns on this machine.
fn transpose16(
    a: &mut CodeAssembler,
    r: [AsmRegisterZmm; 16],
    t: [AsmRegisterZmm; 16],
) -> Result<[AsmRegisterZmm; 16], MicrokernelError> {
    for i in 0..8 {
        a.vunpcklps(t[2 * i], r[2 * i], r[2 * i + 1])?;
        a.vunpckhps(t[2 * i + 1], r[2 * i], r[2 * i + 1])?;
    }
    // r[4g + j], 128-bit lane L: rows 4g..4g+4 of column 4L + j.
    for g in 0..4 {
        let q = 4 * g;
        a.vunpcklpd(r[q], t[q], t[q + 2])?;
        a.vunpckhpd(r[q + 1], t[q], t[q + 2])?;
        a.vunpcklpd(r[q + 2], t[q + 1], t[q + 3])?;
        a.vunpckhpd(r[q + 3], t[q + 1], t[q + 3])?;
    }
    // Column 4L + j gathers lane L of r[j], r[4 + j], r[8 + j], r[12 + j],
    // and ends in r[4L + j].
    for j in 0..4 {
        let u = [t[4 * j], t[4 * j + 1], t[4 * j + 2], t[4 * j + 3]];
        a.vshuff32x4(u[0], r[j], r[4 + j], 0x44)?;
        a.vshuff32x4(u[1], r[j], r[4 + j], 0xee)?;
        a.vshuff32x4(u[2], r[8 + j], r[12 + j], 0x44)?;
        a.vshuff32x4(u[3], r[8 + j], r[12 + j], 0xee)?;
        a.vshuff32x4(r[j], u[0], u[2], 0x88)?;
        a.vshuff32x4(r[4 + j], u[0], u[2], 0xdd)?;
        a.vshuff32x4(r[8 + j], u[1], u[3], 0x88)?;
        a.vshuff32x4(r[12 + j], u[1], u[3], 0xdd)?;
    }
    Ok(r)
}
