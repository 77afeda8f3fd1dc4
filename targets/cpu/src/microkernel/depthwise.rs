//! AVX-512 depthwise convolution (one input channel per group, W stride 1
//! or 2): output pixels along W in zmm vectors, each tap an FMA with the
//! tap's weight broadcast from memory. With W stride 2 a vector's input is
//! two loads of 16 columns, the even columns picked by `vpermt2ps`.
//!
//! Output rows are split at compile time into segments with a fixed set of
//! valid vertical taps (`lower::pool::window_segments`); a segment is a
//! run-time loop over its rows. Along W, up to [`MAX_TILES`] vectors of 16
//! pixels are accumulated at once (independent FMA chains); a vector whose
//! input window crosses the left or right border, or the last partial
//! vector, loads with a zero-masking `k1` mask computed at compile time, so
//! padding reads nothing. Groups are a run-time loop; output channels of a
//! group (the depth multiplier) are unrolled. The AVX2 form of a row is in
//! `depthwise/ymm.rs`.

pub(crate) mod blocked;
mod ymm;

use iced_x86::code_asm::*;

use super::epilogue::{allocate_slots, run_epilogue, EpilogueStep, Operand};
use super::{imm32, load_address, MicrokernelError, Store, Vector};
use crate::plan::Loc;

/// Most 16-pixel vectors accumulated together.
const MAX_TILES: usize = 8;

/// Independent accumulators a row's FMAs need: each FMA also loads an
/// input vector and a weight, so two loads per cycle allow one FMA per
/// cycle, which four chains of latency 4 sustain.
const CHAINS: usize = 4;

/// Registers: image/output bases, group pointers, counters, row cursors.
const X_G: AsmRegister64 = r10;
const OUT_G: AsmRegister64 = r11;
const W_G: AsmRegister64 = rax;
const B_G: AsmRegister64 = rbx;
const GROUPS: AsmRegister64 = rcx;
const ROWS: AsmRegister64 = r12;
const SRC: AsmRegister64 = r13;
const DST: AsmRegister64 = r14;
const TMP: AsmRegister32 = r15d;
const SAVED: [AsmRegister64; 5] = [rbx, r12, r13, r14, r15];
/// The first output channel of the group, in bytes of a per-channel
/// operand (for the epilogue).
const CHANNEL: AsmRegister64 = rdx;
/// The lane indices 0, 2, .., 30 (W stride 2). Tiles use zmm0–zmm23.
const EVEN: AsmRegisterZmm = zmm24;

/// The zmm registers by number.
use super::ZMM;

/// A row segment: output rows `start..start + len` read the vertical taps
/// `taps`.
#[derive(Clone, Debug)]
pub(crate) struct RowSegment {
    /// First output row.
    pub start: usize,
    /// Number of rows.
    pub len: usize,
    /// Vertical taps inside the input.
    pub taps: Vec<usize>,
}

/// One depthwise convolution kernel.
#[derive(Clone, Debug)]
pub(crate) struct DepthwiseSpec {
    /// Groups (= input channels).
    pub groups: usize,
    /// Output channels per group.
    pub per_group: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel height and width.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Output height and width.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// H stride.
    pub stride_h: usize,
    /// W stride: 1, or 2 (each 16-pixel vector loads 32 input columns and
    /// keeps the even ones with `vpermt2ps`).
    pub stride_w: usize,
    /// Padding at the top and the left.
    pub pad_tl: [usize; 2],
    /// Dilations (H, W).
    pub dilations: [usize; 2],
    /// Row segments.
    pub rows: Vec<RowSegment>,
    /// Weights `[groups * per_group, 1, kh, kw]`.
    pub weights: Loc,
    /// Bias `[groups * per_group]`, if any.
    pub bias: Option<Loc>,
    /// Per image: (input, output).
    pub images: Vec<(Loc, Loc)>,
    /// A fused program applied to every output vector before it is stored
    /// (per-row operands are per output channel); empty for none.
    pub epilogue: Vec<EpilogueStep>,
    /// How outputs are stored (u8: see [`DepthwiseSpec::narrowed`]).
    pub store: Store,
    /// The registers: zmm (16 pixels a vector), or ymm (8; f32 stores
    /// only, see [`DepthwiseSpec::ymm_declines`]).
    pub vector: Vector,
}

/// The registers free when a tile of accumulators is stored: the input
/// registers, the stride-2 halves and what is left past the permutation
/// index.
const STORE_FREE: std::ops::Range<usize> = MAX_TILES..32;

/// Most taps whose weights stay in registers (a 5×5 window).
const MAX_HELD_TAPS: usize = 25;

/// Most 16-pixel vectors of a row that a block of rows accumulates
/// (a map at most 128 wide; see [`DepthwiseSpec::row_block`]).
const BLOCK_MAX_TILES: usize = 8;

/// Most output rows of a block.
const MAX_BLOCK_ROWS: usize = 8;

/// Registers a block's accumulators and inputs may take when the weights
/// are not held: those below the permutation index.
const BLOCK_REGISTERS: usize = 24;

/// The registers accumulator and input tiles take: `n` tiles, each with
/// `chains` accumulators, and an input register each.
fn tile_registers(n: usize) -> usize {
    n * (CHAINS / n).max(1) + n
}

/// Whether `steps` fits the store of a depthwise kernel on `vector`'s
/// registers.
pub(crate) fn depthwise_epilogue_fits(steps: &[EpilogueStep], vector: Vector) -> bool {
    let free = match vector {
        Vector::Zmm => STORE_FREE.len() - 1,
        Vector::Ymm => ymm::STORE_FREE.len(),
    };
    allocate_slots(steps, 1 + free).is_some()
}

impl DepthwiseSpec {
    /// The kernel storing u8 ([`Store::U8`], `zero` an f32 0 in the
    /// weights) into the output that starts at `out`: the image offsets,
    /// computed for f32 elements, scaled to bytes.
    pub(crate) fn narrowed(mut self, out: Loc, zero: Loc) -> DepthwiseSpec {
        self.store = Store::U8 { zero };
        for image in &mut self.images {
            image.1 = self.store.narrow(out, image.1);
        }
        self
    }

    /// The kernel as up to `tasks` independent kernels over contiguous
    /// ranges of groups (each group reads its own input channel and writes
    /// its own output channels).
    pub(crate) fn split(&self, tasks: usize) -> Vec<DepthwiseSpec> {
        let tasks = tasks.clamp(1, self.groups.max(1));
        (0..tasks)
            .map(|t| {
                let first = self.groups * t / tasks;
                let end = self.groups * (t + 1) / tasks;
                self.groups_from(first, end - first)
            })
            .collect()
    }

    /// Groups `first..first + count` as a kernel of their own.
    pub(crate) fn groups_from(&self, first: usize, count: usize) -> DepthwiseSpec {
        let moved = |loc: Loc, bytes: usize| Loc {
            offset: loc.offset + bytes as u64,
            ..loc
        };
        let channels = first * self.per_group;
        DepthwiseSpec {
            groups: count,
            rows: self.rows.clone(),
            weights: moved(self.weights, channels * self.kh * self.kw * 4),
            bias: self.bias.map(|b| moved(b, channels * 4)),
            epilogue: self
                .epilogue
                .iter()
                .map(|st| {
                    let shift = |o: Operand| match o {
                        Operand::PerRow(loc) => Operand::PerRow(moved(loc, channels * 4)),
                        o => o,
                    };
                    EpilogueStep {
                        a: shift(st.a),
                        b: shift(st.b),
                        ..*st
                    }
                })
                .collect(),
            images: self
                .images
                .iter()
                .map(|&(x, out)| {
                    (
                        moved(x, first * self.h * self.w * 4),
                        moved(out, channels * self.oh * self.ow * 4),
                    )
                })
                .collect(),
            ..*self
        }
    }

    /// Why the kernel has no form on `self.vector`'s registers, if it has
    /// none: the ymm form stores f32.
    pub(crate) fn ymm_declines(&self) -> Option<String> {
        if self.vector != Vector::Ymm {
            return None;
        }
        match self.store {
            Store::F32 => None,
            Store::U8 { .. } => Some("a u8 store: the AVX2 depthwise kernel stores f32".into()),
        }
    }

    /// The first of the registers that hold the window's weights over a
    /// segment (one each, the last registers), when they fit: W stride 1
    /// on zmm (stride 2 needs its upper registers), at most
    /// [`MAX_HELD_TAPS`] taps, and an epilogue that fits what is left.
    /// Then each FMA loads only its input, not also a broadcast weight.
    /// With it, the most 16-pixel tiles a row accumulates at once (those
    /// whose registers fit below the weights).
    fn held_weights(&self) -> Option<(usize, usize)> {
        let taps = self.kh * self.kw;
        if self.vector != Vector::Zmm || self.stride_w != 1 || taps > MAX_HELD_TAPS {
            return None;
        }
        let first = 32 - taps;
        let tiles = (1..=MAX_TILES)
            .take_while(|&n| tile_registers(n) <= first)
            .last()?;
        allocate_slots(&self.epilogue, 1 + first - tiles)?;
        Some((first, tiles))
    }

    /// Assembles the kernel.
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        if !(1..=2).contains(&self.stride_w) {
            return Err(MicrokernelError::Layout(format!(
                "depthwise W stride {} (1 or 2)",
                self.stride_w
            )));
        }
        if let Some(why) = self.ymm_declines() {
            return Err(MicrokernelError::Layout(why));
        }
        let mut masks = ymm::Masks::default();
        let mut a = CodeAssembler::new(64)?;
        let mut even_lanes = a.create_label();
        for r in SAVED {
            a.push(r)?;
        }
        // The zmm permutation's index (the ymm row shuffles in registers).
        let permutes = self.stride_w == 2 && self.vector == Vector::Zmm;
        if permutes {
            a.vpmovzxbd(EVEN, xmmword_ptr(even_lanes))?;
        }
        for &(x, out) in &self.images {
            load_address(&mut a, X_G, x)?;
            load_address(&mut a, OUT_G, out)?;
            load_address(&mut a, W_G, self.weights)?;
            if let Some(b) = self.bias {
                load_address(&mut a, B_G, b)?;
            }
            a.xor(CHANNEL, CHANNEL)?;
            self.groups_loop(&mut a, &mut masks)?;
        }
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        if permutes {
            // The permutation picking lanes 0, 2, .., 30 of two vectors.
            a.set_label(&mut even_lanes)?;
            let idx: Vec<u8> = (0..16).map(|i| 2 * i).collect();
            a.db(&idx)?;
        }
        masks.emit(&mut a)?;
        Ok(a.assemble(0)?)
    }

    fn groups_loop(
        &self,
        a: &mut CodeAssembler,
        masks: &mut ymm::Masks,
    ) -> Result<(), MicrokernelError> {
        let taps = (self.kh * self.kw) as i64;
        let plane_out = (self.oh * self.ow * self.store.bytes()) as i64;
        let mut top = a.create_label();
        a.mov(GROUPS, self.groups as u64)?;
        a.set_label(&mut top)?;
        for j in 0..self.per_group {
            for seg in &self.rows {
                let offsets = (j as i64 * taps * 4, j as i64 * plane_out);
                self.segment(a, seg, j, offsets, masks)?;
            }
        }
        a.add(X_G, imm32((self.h * self.w * 4) as i64, "input plane")?)?;
        a.add(
            OUT_G,
            imm32(self.per_group as i64 * plane_out, "output planes")?,
        )?;
        a.add(W_G, imm32(self.per_group as i64 * taps * 4, "weights")?)?;
        if self.bias.is_some() {
            a.add(B_G, imm32(self.per_group as i64 * 4, "bias")?)?;
        }
        a.add(CHANNEL, imm32(self.per_group as i64 * 4, "channel")?)?;
        a.dec(GROUPS)?;
        a.jnz(top)?;
        Ok(())
    }

    /// The rows of one segment of output channel `j` of the group
    /// (weights at W_G + `w_off`, bias at B_G + 4j, output plane at OUT_G +
    /// `out_off`).
    fn segment(
        &self,
        a: &mut CodeAssembler,
        seg: &RowSegment,
        j: usize,
        (w_off, out_off): (i64, i64),
        masks: &mut ymm::Masks,
    ) -> Result<(), MicrokernelError> {
        if seg.len == 0 {
            return Ok(());
        }
        let w4 = (self.w * 4) as i64;
        let out_row = self.ow * self.store.bytes();
        let pt = self.pad_tl[0];
        // SRC: input row of output row `start` with tap 0 (may point above
        // the image; every tap added to it is inside).
        let first = (seg.start * self.stride_h) as i64 - pt as i64;
        a.lea(SRC, qword_ptr(X_G + imm32(first * w4, "input row")?))?;
        a.lea(
            DST,
            qword_ptr(OUT_G + imm32(out_off + (seg.start * out_row) as i64, "output row")?),
        )?;
        // The weights stay in registers over the segment's rows.
        if let Some((first, _)) = self.held_weights() {
            for tap in 0..self.kh * self.kw {
                let at = imm32(w_off + (tap * 4) as i64, "weight")?;
                a.vbroadcastss(ZMM[first + tap], dword_ptr(W_G + at))?;
            }
        }
        // Blocks of output rows that share their input loads, then the
        // rows left one at a time.
        let block = self.row_block(seg);
        let (blocks, single) = (seg.len / block, seg.len % block);
        for (count, rows) in [(blocks, block), (single, 1)] {
            if count == 0 {
                continue;
            }
            let mut top = a.create_label();
            a.mov(ROWS, count as u64)?;
            a.set_label(&mut top)?;
            match (self.vector, rows) {
                (Vector::Zmm, 1) => self.row(a, seg, j, w_off)?,
                (Vector::Zmm, _) => self.rows(a, seg, j, w_off, rows)?,
                (Vector::Ymm, _) => self.ymm_row(a, seg, j, w_off, masks)?,
            }
            let stride = (rows * self.stride_h) as i64 * w4;
            a.add(SRC, imm32(stride, "input row stride")?)?;
            a.add(DST, imm32((rows * out_row) as i64, "output row stride")?)?;
            a.dec(ROWS)?;
            a.jnz(top)?;
        }
        Ok(())
    }

    /// Output rows a [`DepthwiseSpec::rows`] block of `seg` computes at
    /// once (1: row by row). Each input vector a row loads is an
    /// unaligned 64-byte load, two cache lines, for one FMA; a block of
    /// rows adds it into every row whose window holds it, up to `kh`
    /// (ConvNeXt's 7×7 on 56×56 ran at 29% of peak row by row). Only on
    /// zmm, for rows of at most [`BLOCK_MAX_TILES`] vectors, with as many
    /// rows as the accumulators, inputs and held weights leave registers
    /// for, when the window is more than one row tall.
    fn row_block(&self, seg: &RowSegment) -> usize {
        let n = self.ow.div_ceil(16);
        if self.vector != Vector::Zmm || n > BLOCK_MAX_TILES || seg.taps.len() < 2 {
            return 1;
        }
        let limit = self
            .held_weights()
            .map_or(BLOCK_REGISTERS, |(first, _)| first);
        let inputs = n * self.stride_w;
        let fits = |r: usize| {
            r * n + inputs <= limit
                && allocate_slots(&self.epilogue, 1 + self.block_free(r, n).len()).is_some()
        };
        let most = (2..=MAX_BLOCK_ROWS.min(seg.len))
            .take_while(|&r| fits(r))
            .last();
        most.unwrap_or(1)
    }

    /// The registers free for the epilogue of a block of `r` rows of `n`
    /// vectors (everything past the accumulators, below held weights,
    /// except the permutation index).
    fn block_free(&self, r: usize, n: usize) -> Vec<AsmRegisterZmm> {
        let limit = self.held_weights().map_or(32, |(first, _)| first);
        (r * n..limit)
            .filter(|&i| ZMM[i] != EVEN)
            .map(|i| ZMM[i])
            .collect()
    }

    /// Loads the input vector of output pixels `16·v..16·v + 16` for the
    /// tap in column `tw` of the input row `row` bytes from SRC into
    /// `regs[0]` (at W stride 2 the even columns of `regs[0..2]`), zero
    /// where the window lies outside the row; `false` when every column is
    /// outside (nothing loaded).
    fn load_tap(
        &self,
        a: &mut CodeAssembler,
        v: usize,
        (row, tw): (i64, usize),
        regs: [AsmRegisterZmm; 2],
    ) -> Result<bool, MicrokernelError> {
        let ow0 = v * 16;
        let sw = self.stride_w;
        // Input columns `col0 + q` for q in 0..16·sw; a column is loaded
        // when it lies inside the row and its output pixel exists (the odd
        // ones of a stride-2 pair are loaded only to be dropped).
        let col0 = (ow0 * sw + tw * self.dilations[1]) as i64 - self.pad_tl[1] as i64;
        let mut masks = [0u32; 2];
        for q in 0..16 * sw {
            let col = col0 + q as i64;
            if ow0 + q / sw < self.ow && col >= 0 && col < self.w as i64 {
                masks[q / 16] |= 1 << (q % 16);
            }
        }
        if masks == [0, 0] {
            return Ok(false);
        }
        for (half, &mask) in masks[..sw].iter().enumerate() {
            let disp = imm32(row + (col0 + 16 * half as i64) * 4, "input pixel")?;
            if mask == 0xffff {
                a.vmovups(regs[half], zmmword_ptr(SRC + disp))?;
            } else if mask == 0 {
                a.vpxord(regs[half], regs[half], regs[half])?;
            } else {
                a.mov(TMP, mask)?;
                a.kmovw(k1, TMP)?;
                a.vmovups(regs[half].k1().z(), zmmword_ptr(SRC + disp))?;
            }
        }
        if sw == 2 {
            a.vpermt2ps(regs[0], EVEN, regs[1])?;
        }
        Ok(true)
    }

    /// `r` output rows of output channel `j` at SRC/DST (see
    /// [`DepthwiseSpec::row_block`]): each input vector is loaded once and
    /// added into every row of the block whose window holds it.
    fn rows(
        &self,
        a: &mut CodeAssembler,
        seg: &RowSegment,
        j: usize,
        w_off: i64,
        r: usize,
    ) -> Result<(), MicrokernelError> {
        let n = self.ow.div_ceil(16);
        let held = self.held_weights();
        let free = self.block_free(r, n);
        let home = allocate_slots(&self.epilogue, 1 + free.len()).ok_or_else(|| {
            MicrokernelError::Layout("the depthwise epilogue does not fit".into())
        })?;
        let acc = |row: usize, t: usize| ZMM[row * n + t];
        let input = |t: usize| [ZMM[r * n + t], ZMM[r * n + n + t]];
        let b_off = 4 * j as i64;
        for row in 0..r {
            for t in 0..n {
                match self.bias {
                    Some(_) => {
                        a.vbroadcastss(acc(row, t), dword_ptr(B_G + imm32(b_off, "bias")?))?
                    }
                    None => a.vpxord(acc(row, t), acc(row, t), acc(row, t))?,
                }
            }
        }
        // Input row `u` (in steps of an input row from SRC) feeds block
        // row `row` through vertical tap `th` when u = row·stride + th·dil.
        let (stride, dilation) = (self.stride_h, self.dilations[0]);
        let w4 = (self.w * 4) as i64;
        let last = (r - 1) * stride + seg.taps.iter().max().map_or(0, |&th| th * dilation);
        for u in 0..=last {
            let uses: Vec<(usize, usize)> = (0..r)
                .filter_map(|row| {
                    let d = u.checked_sub(row * stride)?;
                    let th = d.is_multiple_of(dilation).then_some(d / dilation)?;
                    seg.taps.contains(&th).then_some((row, th))
                })
                .collect();
            if uses.is_empty() {
                continue;
            }
            for tw in 0..self.kw {
                for t in 0..n {
                    if !self.load_tap(a, t, (u as i64 * w4, tw), input(t))? {
                        continue;
                    }
                    for &(row, th) in &uses {
                        let tap = th * self.kw + tw;
                        match held {
                            Some((first, _)) => {
                                a.vfmadd231ps(acc(row, t), input(t)[0], ZMM[first + tap])?
                            }
                            None => {
                                let w = imm32(w_off + (tap * 4) as i64, "weight")?;
                                a.vfmadd231ps(acc(row, t), input(t)[0], dword_bcst(W_G + w))?
                            }
                        }
                    }
                }
            }
        }
        let out_row = (self.ow * self.store.bytes()) as i64;
        for row in 0..r {
            for t in 0..n {
                let ow0 = t * 16;
                let lanes = (self.ow - ow0).min(16);
                let disp = row as i64 * out_row + (ow0 * self.store.bytes()) as i64;
                self.store_vector(a, (acc(row, t), &free, &home), j, disp, lanes)?;
            }
        }
        Ok(())
    }

    /// Runs the epilogue on accumulator `acc` (with the `free` registers,
    /// slots `home`) and stores its first `lanes` lanes at DST + `disp`.
    fn store_vector(
        &self,
        a: &mut CodeAssembler,
        (acc, free, home): (AsmRegisterZmm, &[AsmRegisterZmm], &[usize]),
        j: usize,
        disp: i64,
        lanes: usize,
    ) -> Result<(), MicrokernelError> {
        let disp = imm32(disp, "output pixel")?;
        let x = if self.epilogue.is_empty() {
            acc
        } else {
            let regs: Vec<AsmRegisterZmm> =
                std::iter::once(acc).chain(free.iter().copied()).collect();
            run_epilogue(a, &self.epilogue, home, &regs, (CHANNEL, j), None)?
        };
        if lanes < 16 {
            a.mov(TMP, (1u32 << lanes) - 1)?;
            a.kmovw(k1, TMP)?;
        }
        self.store.vector(a, DST + disp, x, lanes < 16)
    }

    /// The taps of an output row of `seg` in the order the row reads them:
    /// the tap's input row (bytes from SRC), its column, its weight
    /// (bytes from W_G, the channel's weights at `w_off`) and the
    /// accumulator chain it adds to (of `chains`, in rotation).
    fn row_taps(
        &self,
        seg: &RowSegment,
        w_off: i64,
        chains: usize,
    ) -> impl Iterator<Item = (i64, usize, i64, usize)> + '_ {
        let w4 = (self.w * 4) as i64;
        let dil_h = self.dilations[0];
        let taps: Vec<usize> = seg.taps.clone();
        (taps.into_iter())
            .flat_map(move |th| (0..self.kw).map(move |tw| (th, tw)))
            .enumerate()
            .map(move |(i, (th, tw))| {
                let row = (th * dil_h) as i64 * w4;
                let weight = w_off + ((th * self.kw + tw) * 4) as i64;
                (row, tw, weight, i % chains)
            })
    }

    /// One output row of output channel `j` of the group at SRC/DST
    /// (weights at W_G + `w_off`, bias at B_G + 4j), in zmm vectors.
    fn row(
        &self,
        a: &mut CodeAssembler,
        seg: &RowSegment,
        j: usize,
        w_off: i64,
    ) -> Result<(), MicrokernelError> {
        let b_off = 4 * j as i64;
        // The epilogue's registers: the accumulator, then the free ones
        // (the permutation index excluded).
        let held = self.held_weights();
        let (free, max_tiles): (Vec<AsmRegisterZmm>, usize) = match held {
            // Past the accumulators the sums leave, below the weights.
            Some((first, tiles)) => ((tiles..first).map(|i| ZMM[i]).collect(), tiles),
            None => {
                let free = STORE_FREE.map(|i| ZMM[i]).filter(|&r| r != EVEN);
                (free.collect(), MAX_TILES)
            }
        };
        let home = allocate_slots(&self.epilogue, 1 + free.len()).ok_or_else(|| {
            MicrokernelError::Layout("the depthwise epilogue does not fit".into())
        })?;
        let vectors = self.ow.div_ceil(16);
        let mut v0 = 0;
        while v0 < vectors {
            let n = (vectors - v0).min(max_tiles);
            // Fewer tiles than independent FMA chains wanted (one or two:
            // a map at most 32 wide): each tile's taps rotate over `chains`
            // accumulators, summed before the store, so a row is not one
            // dependent chain of kh·kw FMAs (a 7×7 map's 7×7 window: 49
            // FMAs at 4 cycles each).
            let chains = (CHAINS / n).max(1);
            let acc = |t: usize, c: usize| ZMM[t + n * c];
            let xr = |t: usize| match held {
                Some(_) => ZMM[tile_registers(n) - n + t],
                None => ZMM[MAX_TILES + t],
            };
            for t in 0..n {
                for c in 0..chains {
                    if c == 0 && self.bias.is_some() {
                        a.vbroadcastss(acc(t, c), dword_ptr(B_G + imm32(b_off, "bias")?))?;
                    } else {
                        a.vpxord(acc(t, c), acc(t, c), acc(t, c))?;
                    }
                }
            }
            for (row, tw, wdisp, c) in self.row_taps(seg, w_off, chains) {
                let wdisp = imm32(wdisp, "weight")?;
                for t in 0..n {
                    if !self.load_tap(a, v0 + t, (row, tw), [xr(t), ZMM[2 * MAX_TILES + t]])? {
                        continue;
                    }
                    match held {
                        Some((first, _)) => {
                            let tap = (wdisp as i64 - w_off) as usize / 4;
                            a.vfmadd231ps(acc(t, c), xr(t), ZMM[first + tap])?
                        }
                        None => a.vfmadd231ps(acc(t, c), xr(t), dword_bcst(W_G + wdisp))?,
                    }
                }
            }
            for t in 0..n {
                for c in 1..chains {
                    a.vaddps(acc(t, 0), acc(t, 0), acc(t, c))?;
                }
            }
            for t in 0..n {
                let ow0 = (v0 + t) * 16;
                let lanes = (self.ow - ow0).min(16);
                let disp = (ow0 * self.store.bytes()) as i64;
                self.store_vector(a, (acc(t, 0), &free, &home), j, disp, lanes)?;
            }
            v0 += n;
        }
        Ok(())
    }
}
