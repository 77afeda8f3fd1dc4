//! Winograd F(4×4, 3×3): the two transforms around the GEMMs of a 3×3
//! stride-1 convolution (Lavin & Gray, "Fast Algorithms for Convolutional
//! Neural Networks", 2016).
//!
//! The output is cut into tiles of 4×4 pixels; tile `(ty, tx)` reads the
//! 6×6 input patch from row `4·ty − pad_top`, column `4·tx − pad_left`.
//! For one channel, `V = Bᵀ d B` of the patch `d`, and the product with
//! the transformed weights `U = G g Gᵀ` (compile time, [`transform_weights`])
//! becomes, per position `ξ` of the 6×6, a GEMM over channels:
//! `M[ξ][oc][t] = Σ_c U[ξ][oc][c] · V[ξ][c][t]`; then `Y = Aᵀ M A` per tile.
//! 36 multiplies per channel pair give 16 outputs where the direct form
//! takes 144: the GEMM does 4× less work, the transforms are linear passes.
//!
//! Both transforms vectorize over 16 tiles of a tile row. The input side
//! first combines the 6 input rows along H (vectors along W, loads masked
//! to the image, so padding is read as zeros), keeps the 6 results of 80
//! columns in a stack buffer, then splits each row's 64 columns into the
//! four phases `x mod 4` (two levels of `vpermi2ps`), which are the
//! patch columns 0–3 of 16 consecutive tiles; columns 4 and 5 are phases 0
//! and 1 one tile on. The output side runs the mirror image: `Aᵀ` along H
//! into a stack buffer, `Aᵀ` along W, bias and activation, and an
//! interleave of the four phases back into 64 output columns.
//!
//! `V` and `M` are `[36][channels][row]`, the GEMMs' B and output: `row`
//! tiles, a tile row after the other, of every image side by side or of
//! one band of tile rows (see [`WinogradTask`]).

use std::ops::Range;

use iced_x86::code_asm::*;

use super::gemm::Activation;
use super::{imm32, load_address, MicrokernelError, SAVED};
use crate::plan::Loc;

// The interpolation points are 0, 1, −1, 2, −1/2 and ∞, not Lavin's
// 0, ±1, ±2, ∞: simulated in f32 over 256 channels
// (`scripts/winograd_points.py`), the output's error was 1.7× smaller on
// average and 3.4× at worst (2.5e-6 and 5.8e-6 of its scale, the direct
// sum's 1.0e-6 and 2.3e-6), for 6 more vector ops per 6-point transform.

/// `Bᵀ`: the input transform.
const BT: [[f64; 6]; 6] = [
    [1.0, 1.5, -2.0, -1.5, 1.0, 0.0],
    [0.0, -1.0, -2.5, -0.5, 1.0, 0.0],
    [0.0, 1.0, 0.5, -2.5, 1.0, 0.0],
    [0.0, -0.5, -1.0, 0.5, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 1.0, 1.5, -2.0, -1.5, 1.0],
];

/// `G`: the weight transform.
const G: [[f64; 3]; 6] = [
    [1.0, 0.0, 0.0],
    [-1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0],
    [1.0 / 3.0, -1.0 / 3.0, 1.0 / 3.0],
    [1.0 / 15.0, 2.0 / 15.0, 4.0 / 15.0],
    [-16.0 / 15.0, 8.0 / 15.0, -4.0 / 15.0],
    [0.0, 0.0, 1.0],
];

/// `Aᵀ`: the output transform.
const AT: [[f64; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -0.5, 0.0],
    [0.0, 1.0, 1.0, 4.0, 0.25, 0.0],
    [0.0, 1.0, -1.0, 8.0, -0.125, 1.0],
];

/// The magnitudes other than 0 and 1 in `Bᵀ` and `Aᵀ`, which the kernels
/// read by broadcast from their table.
const SCALES: [f64; 8] = [1.5, 2.0, 2.5, 0.5, 4.0, 0.25, 8.0, 0.125];

/// Positions of the 6×6 transformed tile: the GEMMs per image.
pub(crate) const POSITIONS: usize = 36;

/// `U[ξ][oc][c]` (row-major, `ξ` outermost) of OIHW 3×3 weights `w`
/// (`oc × cin × 9`), computed in f64.
pub(crate) fn transform_weights(w: &[f32], oc: usize, cin: usize) -> Vec<f32> {
    let mut u = vec![0f32; POSITIONS * oc * cin];
    for o in 0..oc {
        for c in 0..cin {
            let g = &w[(o * cin + c) * 9..][..9];
            // G g, then (G g) Gᵀ.
            let mut gg = [[0f64; 3]; 6];
            for (i, row) in gg.iter_mut().enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = (0..3).map(|k| G[i][k] * g[k * 3 + j] as f64).sum();
                }
            }
            for i in 0..6 {
                for j in 0..6 {
                    let v: f64 = (0..3).map(|k| gg[i][k] * G[j][k]).sum();
                    u[((i * 6 + j) * oc + o) * cin + c] = v as f32;
                }
            }
        }
    }
    u
}

/// The tiling of one 3×3 stride-1 convolution's image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tiling {
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Output height and width.
    pub oh: usize,
    /// Output width.
    pub ow: usize,
    /// Padding at the top and the left.
    pub pad_tl: [usize; 2],
}

impl Tiling {
    /// Tile rows and tiles per row.
    pub(crate) fn tiles(&self) -> (usize, usize) {
        (self.oh.div_ceil(4), self.ow.div_ceil(4))
    }

    /// Tiles per image (the GEMMs' columns).
    pub(crate) fn count(&self) -> usize {
        let (th, tw) = self.tiles();
        th * tw
    }

    /// Chunks of 16 tiles per tile row.
    fn chunks(&self) -> usize {
        self.tiles().1.div_ceil(16)
    }

    /// Tile rows as runs `(first, count, mask)` of consecutive rows alike:
    /// `mask` bit `r` says whether row `r` of `rows` (6 patch rows on the
    /// input side, 4 tile rows on the output side) falls in `0..limit`.
    fn runs(
        &self,
        rows: usize,
        origin: impl Fn(usize) -> i64,
        limit: usize,
    ) -> Vec<(usize, usize, u32)> {
        let mut runs: Vec<(usize, usize, u32)> = Vec::new();
        for ty in 0..self.tiles().0 {
            let mask = (0..rows)
                .filter(|&r| (0..limit as i64).contains(&(origin(ty) + r as i64)))
                .fold(0u32, |m, r| m | 1 << r);
            match runs.last_mut() {
                Some(run) if run.2 == mask => run.1 += 1,
                _ => runs.push((ty, 1, mask)),
            }
        }
        runs
    }
}

/// Lanes `l` of a 16-lane vector whose column `x0 + l` lies in `0..w`, as
/// a mask (at most `lanes` lanes).
fn column_mask(x0: i64, w: usize, lanes: usize) -> u32 {
    (0..lanes)
        .filter(|&l| (0..w as i64).contains(&(x0 + l as i64)))
        .fold(0, |m, l| m | 1 << l)
}

/// Source, destination, channel counter, tile-row pointers, row counter.
const SRC: AsmRegister64 = r8;
const DST: AsmRegister64 = r9;
const CH: AsmRegister64 = rcx;
const ROW: AsmRegister64 = r10;
const OUT: AsmRegister64 = r11;
const CNT: AsmRegister64 = r12;
/// The stack buffer between the two passes.
const BUF: AsmRegister64 = rbx;
/// The bias pointer of the output transform.
const BIAS: AsmRegister64 = r13;
const TMP: AsmRegister32 = eax;

use super::ZMM as Z;
/// The kernel's table (index vectors, then [`SCALES`]).
const TABLE: AsmRegister64 = r14;
/// The permute index vectors: even and odd lanes on the input side (the
/// first two, both levels), the two of each level's interleaves on the
/// output side; and the shifts by one tile for patch columns 4 and 5.
const IDX: [AsmRegisterZmm; 4] = [zmm24, zmm25, zmm26, zmm27];
const SHIFT: [AsmRegisterZmm; 2] = [zmm22, zmm23];

/// `out[i] = Σ_j coef[i][j] · x[j]` along one axis, 16 lanes at once:
/// from the row's first +1 term, then an add, a subtract or an FMA with
/// a broadcast of the magnitude per other nonzero term.
fn combine(
    a: &mut CodeAssembler,
    coef: &[[f64; 6]],
    x: [AsmRegisterZmm; 6],
    out: &[AsmRegisterZmm],
) -> Result<(), MicrokernelError> {
    for (row, &o) in coef.iter().zip(out) {
        let first = (row.iter().position(|&c| c == 1.0))
            .ok_or_else(|| MicrokernelError::Layout("a transform row without a +1".into()))?;
        a.vmovaps(o, x[first])?;
        for (j, &c) in row.iter().enumerate() {
            if j == first || c == 0.0 {
                continue;
            }
            let scale = || -> Result<AsmMemoryOperand, MicrokernelError> {
                let i = (SCALES.iter().position(|&s| s == c.abs()))
                    .ok_or_else(|| MicrokernelError::Layout(format!("no scale {c}")))?;
                Ok(dword_bcst(TABLE + (INDEX_BYTES + 4 * i) as i32))
            };
            match c {
                1.0 => a.vaddps(o, o, x[j])?,
                -1.0 => a.vsubps(o, o, x[j])?,
                c if c > 0.0 => a.vfmadd231ps(o, x[j], scale()?)?,
                _ => a.vfnmadd231ps(o, x[j], scale()?)?,
            }
        }
    }
    Ok(())
}

/// A masked (zeroing) load of `mask`'s lanes, a full load, or zeros.
fn load_masked(
    a: &mut CodeAssembler,
    reg: AsmRegisterZmm,
    at: AsmMemoryOperand,
    mask: u32,
) -> Result<(), MicrokernelError> {
    match mask {
        0 => a.vpxord(reg, reg, reg)?,
        0xffff => a.vmovups(reg, at)?,
        _ => {
            a.mov(TMP, mask)?;
            a.kmovw(k1, TMP)?;
            a.vmovups(reg.k1().z(), at)?;
        }
    }
    Ok(())
}

/// A store of `mask`'s lanes (none: nothing).
fn store_masked(
    a: &mut CodeAssembler,
    at: AsmMemoryOperand,
    reg: AsmRegisterZmm,
    mask: u32,
) -> Result<(), MicrokernelError> {
    match mask {
        0 => {}
        0xffff => a.vmovups(at, reg)?,
        _ => {
            a.mov(TMP, mask)?;
            a.kmovw(k1, TMP)?;
            a.vmovups(at.k1(), reg)?;
        }
    }
    Ok(())
}

/// What a task does, in order.
#[derive(Clone, Debug)]
pub(crate) enum Stage {
    /// The input transform of `channels` channels from the image at `x`
    /// into `V` at `v` (both at the first of them), tile rows `rows`.
    Input {
        x: Loc,
        v: Loc,
        channels: usize,
        rows: Range<usize>,
    },
    /// Runs GEMM kernel `i` of [`WinogradTask::gemms`] (`M` from `V`).
    Gemm(usize),
    /// The output transform of `channels` channels of `M` at `m` into the
    /// image at `y` (both at the first of them; the bias at `bias`), tile
    /// rows `rows`.
    Output {
        m: Loc,
        y: Loc,
        bias: Option<Loc>,
        channels: usize,
        rows: Range<usize>,
    },
}

/// A Winograd convolution's kernel: stages of input transforms, GEMMs
/// (kernels assembled by the caller, embedded and called) and output
/// transforms (bias, activation). `V` and `M` are `[36][C][row]` (`C`:
/// all of `channels`; `row` tiles: a band's, or every image's).
#[derive(Clone, Debug)]
pub(crate) struct WinogradTask {
    pub tiling: Tiling,
    /// Input and output channels.
    pub channels: [usize; 2],
    /// Tiles per row of `V` and `M`.
    pub row: usize,
    pub act: Activation,
    /// Position-independent GEMM kernels (kernel ABI), called by
    /// [`Stage::Gemm`].
    pub gemms: Vec<Vec<u8>>,
    pub stages: Vec<Stage>,
}

/// Bytes of the stack buffer between the passes of a transform: 6 rows of
/// 5 vectors (input), 4 rows of 6 (output).
const BUFFER: usize = 6 * 5 * 64;

/// The band offset register of a transform routine: bytes from the image
/// (or `M`) pointer to the band's first row.
const BAND: AsmRegister64 = rdx;

/// A routine's rows: runs of `(tile rows, row mask)` (see [`Tiling::runs`]).
type Runs = Vec<(usize, u32)>;

impl WinogradTask {
    /// `V`'s (and `M`'s) bytes per channel.
    pub(crate) fn channel_bytes(&self) -> i64 {
        (self.row * 4) as i64
    }

    /// Bytes between the ξ planes of `V` and of `M`.
    pub(crate) fn xi_strides(&self) -> [i64; 2] {
        self.channels.map(|c| c as i64 * self.channel_bytes())
    }

    /// Assembles the kernel (kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let t = self.tiling;
        let mut a = CodeAssembler::new(64)?;
        let pt = t.pad_tl[0] as i64;
        // The distinct row runs of the bands, per side.
        let runs = |rows: &Range<usize>, patch: usize, origin: i64, limit: usize| -> Runs {
            (t.runs(patch, |ty| 4 * ty as i64 - origin, limit)
                .into_iter())
            .filter_map(|(ty0, n, mask)| {
                let lo = ty0.max(rows.start);
                let hi = (ty0 + n).min(rows.end);
                (lo < hi).then(|| (hi - lo, mask))
            })
            .collect()
        };
        let (mut inputs, mut outputs): (Vec<Runs>, Vec<Runs>) = (Vec::new(), Vec::new());
        let mut calls = Vec::new();
        for stage in &self.stages {
            calls.push(match stage {
                Stage::Input { rows, .. } => {
                    let r = runs(rows, 6, pt, t.h);
                    crate::lower::intern(&mut inputs, r.clone(), |x| *x == r)
                }
                Stage::Output { rows, .. } => {
                    let r = runs(rows, 4, 0, t.oh);
                    crate::lower::intern(&mut outputs, r.clone(), |x| *x == r)
                }
                Stage::Gemm(i) => *i,
            });
        }
        let input_labels: Vec<CodeLabel> = inputs.iter().map(|_| a.create_label()).collect();
        let output_labels: Vec<CodeLabel> = outputs.iter().map(|_| a.create_label()).collect();
        let mut gemm_labels: Vec<CodeLabel> = self.gemms.iter().map(|_| a.create_label()).collect();
        let mut data = a.create_label();
        for r in SAVED {
            a.push(r)?;
        }
        a.mov(rbp, rsp)?;
        a.sub(rsp, imm32(BUFFER as i64 + 64, "stack buffer")?)?;
        a.and(rsp, -64)?;
        a.mov(BUF, rsp)?;
        a.lea(TABLE, qword_ptr(data))?;
        let [v_xi, m_xi] = self.xi_strides();
        let (w4, ow4) = ((t.w * 4) as i64, (t.ow * 4) as i64);
        for (stage, &routine) in self.stages.iter().zip(&calls) {
            match stage {
                &Stage::Input {
                    x,
                    v,
                    channels,
                    ref rows,
                } => {
                    // The index tables are reloaded: a GEMM clobbers them.
                    for (i, &reg) in IDX[..2].iter().chain(&SHIFT).enumerate() {
                        a.vmovdqu32(reg, zmmword_ptr(TABLE + (64 * i) as i32))?;
                    }
                    a.mov(BAND, (4 * rows.start as i64 - pt) * w4)?;
                    load_address(&mut a, SRC, x)?;
                    load_address(&mut a, DST, v)?;
                    a.mov(CH, channels as u64)?;
                    a.call(input_labels[routine])?;
                }
                Stage::Gemm(_) => {
                    a.push(rdi)?;
                    a.push(rsi)?;
                    a.call(gemm_labels[routine])?;
                    a.pop(rsi)?;
                    a.pop(rdi)?;
                }
                &Stage::Output {
                    m,
                    y,
                    bias,
                    channels,
                    ref rows,
                } => {
                    for (i, &reg) in IDX.iter().enumerate() {
                        a.vmovdqu32(reg, zmmword_ptr(TABLE + (64 * (4 + i)) as i32))?;
                    }
                    a.mov(BAND, 4 * rows.start as i64 * ow4)?;
                    load_address(&mut a, SRC, m)?;
                    load_address(&mut a, DST, y)?;
                    if let Some(bias) = bias {
                        load_address(&mut a, BIAS, bias)?;
                    }
                    a.mov(CH, channels as u64)?;
                    a.call(output_labels[routine])?;
                }
            }
        }
        a.mov(rsp, rbp)?;
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        for (runs, label) in inputs.iter().zip(input_labels) {
            self.input_routine(&mut a, label, runs, v_xi)?;
        }
        let bias = (self.stages.iter()).any(|s| matches!(s, Stage::Output { bias: Some(_), .. }));
        for (runs, label) in outputs.iter().zip(output_labels) {
            self.output_routine(&mut a, label, runs, m_xi, bias)?;
        }
        for (code, label) in self.gemms.iter().zip(&mut gemm_labels) {
            a.set_label(label)?;
            a.db(code)?;
        }
        a.set_label(&mut data)?;
        a.db(&table_bytes())?;
        Ok(a.assemble(0)?)
    }

    /// The input transform of `CH` channels from SRC (+ BAND: the band's
    /// first patch row) into `V` at DST, tile rows as `runs`.
    fn input_routine(
        &self,
        a: &mut CodeAssembler,
        mut top: CodeLabel,
        runs: &Runs,
        xi_stride: i64,
    ) -> Result<(), MicrokernelError> {
        let t = self.tiling;
        let (_, tw) = t.tiles();
        let w4 = (t.w * 4) as i64;
        a.set_label(&mut top)?;
        a.lea(ROW, qword_ptr(SRC + BAND))?;
        a.mov(OUT, DST)?;
        self.rows_loop(a, runs, |a, mask| {
            for chunk in 0..t.chunks() {
                input_chunk(a, t, chunk, mask, xi_stride)?;
            }
            a.add(ROW, imm32(4 * w4, "tile row stride")?)?;
            a.add(OUT, imm32((tw * 4) as i64, "tile row")?)?;
            Ok(())
        })?;
        a.add(SRC, imm32((t.h * t.w * 4) as i64, "channel stride")?)?;
        a.add(DST, imm32(self.channel_bytes(), "V channel stride")?)?;
        a.dec(CH)?;
        a.jnz(top)?;
        a.ret()?;
        Ok(())
    }

    /// The output transform of `CH` channels of `M` at SRC into the image
    /// at DST (+ BAND: the band's first output row), tile rows as `runs`.
    fn output_routine(
        &self,
        a: &mut CodeAssembler,
        mut top: CodeLabel,
        runs: &Runs,
        xi_stride: i64,
        bias: bool,
    ) -> Result<(), MicrokernelError> {
        let t = self.tiling;
        let (_, tw) = t.tiles();
        let ow4 = (t.ow * 4) as i64;
        a.set_label(&mut top)?;
        // The bias of this channel in every lane (zmm21), zero without.
        match bias {
            true => a.vbroadcastss(Z[21], dword_ptr(BIAS))?,
            false => a.vpxord(Z[21], Z[21], Z[21])?,
        }
        a.mov(ROW, SRC)?;
        a.lea(OUT, qword_ptr(DST + BAND))?;
        self.rows_loop(a, runs, |a, mask| {
            for chunk in 0..t.chunks() {
                output_chunk(a, t, chunk, mask, xi_stride, self.act)?;
            }
            a.add(ROW, imm32((tw * 4) as i64, "tile row")?)?;
            a.add(OUT, imm32(4 * ow4, "tile row stride")?)?;
            Ok(())
        })?;
        a.add(SRC, imm32(self.channel_bytes(), "M channel stride")?)?;
        a.add(DST, imm32((t.oh * t.ow * 4) as i64, "channel stride")?)?;
        if bias {
            a.add(BIAS, 4)?;
        }
        a.dec(CH)?;
        a.jnz(top)?;
        a.ret()?;
        Ok(())
    }

    /// `row` (a tile row, ending with the pointers' advance) for each
    /// tile row of `runs`, a loop for a run of several.
    fn rows_loop(
        &self,
        a: &mut CodeAssembler,
        runs: &Runs,
        mut row: impl FnMut(&mut CodeAssembler, u32) -> Result<(), MicrokernelError>,
    ) -> Result<(), MicrokernelError> {
        for &(count, mask) in runs {
            let mut again = a.create_label();
            if count > 1 {
                a.mov(CNT, count as u64)?;
                a.set_label(&mut again)?;
            }
            row(a, mask)?;
            if count > 1 {
                a.dec(CNT)?;
                a.jnz(again)?;
            }
        }
        Ok(())
    }
}

/// The kernel's table: the input side's index vectors (even and odd
/// lanes, for both levels, then the shifts by one tile: lanes 1–15 of the
/// first source, lane 0 or 1 of the second), the output side's
/// (interleaves of lanes, then of lane pairs), then [`SCALES`].
fn table_bytes() -> Vec<u8> {
    let even: [u32; 16] = std::array::from_fn(|l| 2 * l as u32);
    let odd: [u32; 16] = std::array::from_fn(|l| 2 * l as u32 + 1);
    let shift = |s: u32| -> [u32; 16] {
        std::array::from_fn(|l| if l < 15 { l as u32 + 1 } else { 16 + s })
    };
    let lo: [u32; 16] = std::array::from_fn(|l| (l / 2 + 16 * (l % 2)) as u32);
    let hi: [u32; 16] = std::array::from_fn(|l| (8 + l / 2 + 16 * (l % 2)) as u32);
    let pair = |base: usize| -> [u32; 16] {
        std::array::from_fn(|l| (base + 2 * (l / 4) + l % 2 + 16 * (l / 2 % 2)) as u32)
    };
    let vectors = [even, odd, shift(0), shift(1), lo, hi, pair(0), pair(8)];
    let scales = SCALES.iter().map(|&s| (s as f32).to_bits());
    (vectors.iter().flatten().copied().chain(scales))
        .flat_map(u32::to_le_bytes)
        .collect()
}

/// Bytes of the index vectors at the start of the kernel's table.
const INDEX_BYTES: usize = 8 * 64;

/// Tiles `16 · chunk ..` of the tile row at ROW (input) / OUT (V); `rows`:
/// which of the 6 patch rows lie in the image.
fn input_chunk(
    a: &mut CodeAssembler,
    t: Tiling,
    chunk: usize,
    rows: u32,
    xi_stride: i64,
) -> Result<(), MicrokernelError> {
    let (_, tw) = t.tiles();
    let w4 = (t.w * 4) as i64;
    let x0 = 64 * chunk as i64 - t.pad_tl[1] as i64;
    let d: [AsmRegisterZmm; 6] = std::array::from_fn(|i| Z[i]);
    let o: [AsmRegisterZmm; 6] = std::array::from_fn(|i| Z[6 + i]);
    // Along H: 5 vectors of columns (the last one's two lanes are patch
    // columns 4 and 5 of the chunk's last tile).
    for v in 0..5 {
        let x = x0 + 16 * v as i64;
        let cols = column_mask(x, t.w, if v < 4 { 16 } else { 2 });
        for (r, &reg) in d.iter().enumerate() {
            let mask = if rows >> r & 1 == 1 { cols } else { 0 };
            let disp = imm32(r as i64 * w4 + 4 * x, "input pixel")?;
            load_masked(a, reg, zmmword_ptr(ROW + disp), mask)?;
        }
        combine(a, &BT, d, &o)?;
        for (i, &reg) in o.iter().enumerate() {
            a.vmovaps(zmmword_ptr(BUF + (64 * (5 * i + v)) as i32), reg)?;
        }
    }
    // Along W, per patch row: the phases, then Bᵀ.
    let tiles = (tw - 16 * chunk).min(16);
    let store = (1u32 << tiles) - 1;
    for i in 0..6 {
        for (v, &reg) in Z[..5].iter().enumerate() {
            a.vmovaps(reg, zmmword_ptr(BUF + (64 * (5 * i + v)) as i32))?;
        }
        // Level 1: even and odd columns of vectors 0–1 and 2–3.
        let l1 = [Z[5], Z[6], Z[7], Z[8]];
        for (j, &reg) in l1.iter().enumerate() {
            let (src, idx) = ([Z[0], Z[2]][j / 2], IDX[j % 2]);
            a.vmovaps(reg, idx)?;
            a.vpermi2ps(reg, src, if j / 2 == 0 { Z[1] } else { Z[3] })?;
        }
        // Level 2: phase 0 and 2 from the evens, 1 and 3 from the odds.
        let p = [Z[9], Z[10], Z[11], Z[12], Z[13], Z[14]];
        for (phase, &reg) in p[..4].iter().enumerate() {
            let (lo, hi) = if phase % 2 == 0 {
                (l1[0], l1[2])
            } else {
                (l1[1], l1[3])
            };
            a.vmovaps(reg, IDX[phase / 2])?;
            a.vpermi2ps(reg, lo, hi)?;
        }
        for s in 0..2 {
            a.vmovaps(p[4 + s], SHIFT[s])?;
            a.vpermi2ps(p[4 + s], p[s], Z[4])?;
        }
        let out = [Z[15], Z[16], Z[17], Z[18], Z[19], Z[20]];
        combine(a, &BT, p, &out)?;
        for (k, &reg) in out.iter().enumerate() {
            let xi = (6 * i + k) as i64;
            let disp = imm32(xi * xi_stride + (64 * chunk) as i64, "V position")?;
            store_masked(a, zmmword_ptr(OUT + disp), reg, store)?;
        }
    }
    Ok(())
}

/// Tiles `16 · chunk ..` of the tile row at ROW (M) / OUT (image); `rows`:
/// which of the tile's 4 output rows lie in the image.
fn output_chunk(
    a: &mut CodeAssembler,
    t: Tiling,
    chunk: usize,
    rows: u32,
    xi_stride: i64,
    act: Activation,
) -> Result<(), MicrokernelError> {
    let (_, tw) = t.tiles();
    let ow4 = (t.ow * 4) as i64;
    let tiles = (tw - 16 * chunk).min(16);
    let load = (1u32 << tiles) - 1;
    let m: [AsmRegisterZmm; 6] = std::array::from_fn(|i| Z[i]);
    let y: [AsmRegisterZmm; 4] = std::array::from_fn(|i| Z[6 + i]);
    // Along H, per patch column k: Aᵀ of the 6 patch rows.
    for k in 0..6 {
        for (i, &reg) in m.iter().enumerate() {
            let xi = (6 * i + k) as i64;
            let disp = imm32(xi * xi_stride + (64 * chunk) as i64, "M position")?;
            load_masked(a, reg, zmmword_ptr(ROW + disp), load)?;
        }
        combine(a, &AT, m, &y)?;
        for (r, &reg) in y.iter().enumerate() {
            a.vmovaps(zmmword_ptr(BUF + (64 * (6 * r + k)) as i32), reg)?;
        }
    }
    // Along W, per output row: Aᵀ, bias, activation, interleave, store.
    for r in (0..4).filter(|r| rows >> r & 1 == 1) {
        for (k, &reg) in m.iter().enumerate() {
            a.vmovaps(reg, zmmword_ptr(BUF + (64 * (6 * r + k)) as i32))?;
        }
        combine(a, &AT, m, &y)?;
        for &reg in &y {
            a.vaddps(reg, reg, Z[21])?;
            act.emit_zmm(a, reg, (Z[12], TMP))?;
        }
        // Level 1: lanes of phases 0/1 and 2/3 interleaved (low and high
        // halves); level 2: their pairs.
        let l1 = [Z[13], Z[14], Z[15], Z[16]];
        for (j, &reg) in l1.iter().enumerate() {
            let (p, q) = if j / 2 == 0 {
                (y[0], y[1])
            } else {
                (y[2], y[3])
            };
            a.vmovaps(reg, IDX[j % 2])?;
            a.vpermi2ps(reg, p, q)?;
        }
        let x0 = 64 * chunk as i64;
        for v in 0..4 {
            let reg = Z[17 + v];
            // Vector v holds tiles 4v..4v+4: the low or high half's first
            // or second pair run.
            let (half, run) = (v / 2, v % 2);
            a.vmovaps(reg, IDX[2 + run])?;
            a.vpermi2ps(reg, l1[half], l1[2 + half])?;
            let x = x0 + 16 * v as i64;
            let mask = column_mask(x, t.ow, 16);
            let disp = imm32(r as i64 * ow4 + 4 * x, "output pixel")?;
            store_masked(a, zmmword_ptr(OUT + disp), reg, mask)?;
        }
    }
    Ok(())
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;
    use crate::microkernel::exec::call_kernel;
    use crate::plan::Base;

    fn arena(offset: usize) -> Loc {
        Loc {
            base: Base::Arena,
            offset: offset as u64,
        }
    }

    fn bias_loc(offset: usize) -> Loc {
        Loc {
            base: Base::Weights,
            offset: offset as u64,
        }
    }

    /// A 3×3 stride-1 conv through both transforms and a scalar GEMM, in
    /// bands of `band` tile rows, against the direct sum.
    fn check(
        cin: usize,
        oc: usize,
        (h, w): (usize, usize),
        pads: [usize; 4],
        act: Activation,
        band: usize,
    ) {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let oh = h + pads[0] + pads[2] - 2;
        let ow = w + pads[1] + pads[3] - 2;
        let tiling = Tiling {
            h,
            w,
            oh,
            ow,
            pad_tl: [pads[0], pads[1]],
        };
        let (th, tw) = tiling.tiles();
        let tb = band * tw;
        let x: Vec<f32> = (0..cin * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let wt: Vec<f32> = (0..oc * cin * 9)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 60.0)
            .collect();
        let bias: Vec<f32> = (0..oc).map(|o| o as f32 * 0.25 - 1.0).collect();
        // Arena: x, V, M, y.
        let (xv, vv, mv) = (0, cin * h * w * 4, (cin * h * w + 36 * cin * tb) * 4);
        let yv = mv + 36 * oc * tb * 4;
        let mut mem = vec![0u8; yv + oc * oh * ow * 4 + 64];
        for (i, v) in x.iter().enumerate() {
            mem[xv + 4 * i..][..4].copy_from_slice(&v.to_le_bytes());
        }
        let weights: Vec<u8> = bias.iter().flat_map(|v| v.to_le_bytes()).collect();
        let task = |stages: Vec<Stage>| WinogradTask {
            tiling,
            channels: [cin, oc],
            row: tb,
            act,
            gemms: Vec::new(),
            stages,
        };
        let f = |m: &[u8], at: usize| f32::from_le_bytes(m[at..at + 4].try_into().unwrap());
        let u = transform_weights(&wt, oc, cin);
        for ty0 in (0..th).step_by(band) {
            let rows = ty0..(ty0 + band).min(th);
            let tiles = rows.len() * tw;
            // Poison V and M: every lane read must have been written.
            mem[vv..yv].fill(0xff);
            let input = task(vec![Stage::Input {
                x: arena(xv),
                v: arena(vv),
                channels: cin,
                rows: rows.clone(),
            }]);
            assert_eq!(call_kernel(&input.assemble().unwrap(), &mut mem, &[]), 0);
            for xi in 0..36 {
                for o in 0..oc {
                    for t in 0..tiles {
                        let s: f32 = (0..cin)
                            .map(|c| {
                                u[(xi * oc + o) * cin + c]
                                    * f(&mem, vv + ((xi * cin + c) * tb + t) * 4)
                            })
                            .sum();
                        mem[mv + ((xi * oc + o) * tb + t) * 4..][..4]
                            .copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
            let output = task(vec![Stage::Output {
                m: arena(mv),
                y: arena(yv),
                bias: Some(bias_loc(0)),
                channels: oc,
                rows,
            }]);
            assert_eq!(
                call_kernel(&output.assemble().unwrap(), &mut mem, &weights),
                0
            );
        }
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut s = bias[o] as f64;
                    for c in 0..cin {
                        for ky in 0..3 {
                            for kx in 0..3 {
                                let (iy, ix) = (
                                    (oy + ky) as i64 - pads[0] as i64,
                                    (ox + kx) as i64 - pads[1] as i64,
                                );
                                if (0..h as i64).contains(&iy) && (0..w as i64).contains(&ix) {
                                    s += x[(c * h + iy as usize) * w + ix as usize] as f64
                                        * wt[((o * cin + c) * 3 + ky) * 3 + kx] as f64;
                                }
                            }
                        }
                    }
                    let want = match act {
                        Activation::None => s,
                        Activation::Relu => s.max(0.0),
                        Activation::Clip { lo, hi } => s.max(lo as f64).min(hi as f64),
                    };
                    let got = f(&mem, yv + ((o * oh + oy) * ow + ox) * 4) as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "oc {o} ({oy}, {ox}): {got} vs {want}"
                    );
                }
            }
        }
        // Nothing past the output was written.
        assert!(mem[yv + oc * oh * ow * 4..].iter().all(|&b| b == 0));
    }

    #[test]
    fn transforms_match_the_direct_sum() {
        let clip = Activation::Clip { lo: -1.0, hi: 3.0 };
        // Whole tiles, "same" padding.
        check(3, 5, (8, 8), [1, 1, 1, 1], Activation::None, 2);
        // Ragged tiles, several chunks per tile row, rows not whole; in
        // one band, and in bands of 2 tile rows (the last one short).
        check(2, 3, (13, 70), [1, 1, 1, 1], Activation::Relu, 4);
        check(2, 3, (21, 70), [1, 1, 1, 1], Activation::Relu, 2);
        // Unpadded and asymmetric padding, bands of one tile row.
        check(4, 2, (9, 11), [0, 0, 0, 0], Activation::None, 1);
        check(1, 2, (6, 5), [2, 0, 1, 2], clip, 1);
        // A single tile smaller than 4×4.
        check(2, 2, (3, 3), [1, 1, 1, 1], Activation::None, 1);
    }

    #[test]
    fn the_transform_matrices_invert() {
        // Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A is the 4×4 correlation of d with g,
        // checked in f64 for one patch.
        let d: Vec<f64> = (0..36).map(|i| (i * 7 % 11) as f64 - 5.0).collect();
        let g: Vec<f32> = (0..9).map(|i| (i * 5 % 7) as f32 - 3.0).collect();
        let u = transform_weights(&g, 1, 1);
        let mut v = [[0f64; 6]; 6];
        for i in 0..6 {
            for j in 0..6 {
                v[i][j] = (0..6)
                    .flat_map(|p| (0..6).map(move |q| (p, q)))
                    .map(|(p, q)| BT[i][p] * d[p * 6 + q] * BT[j][q])
                    .sum();
            }
        }
        for y in 0..4 {
            for x in 0..4 {
                let got: f64 = (0..36)
                    .map(|xi| AT[y][xi / 6] * u[xi] as f64 * v[xi / 6][xi % 6] * AT[x][xi % 6])
                    .sum();
                let want: f64 = (0..9)
                    .map(|t| d[(y + t / 3) * 6 + x + t % 3] * g[t] as f64)
                    .sum();
                assert!((got - want).abs() < 1e-4, "({y}, {x}): {got} vs {want}");
            }
        }
    }
}
