//! AVX-512 fp32 GEMM: `out[i, j] = act(alpha * sum_k A[i, k] * B[k, j] + beta * C[i, j])`.
//!
//! **Tile.** The register tile is `mr` rows × `nv` zmm vectors (`16 * nv`
//! columns): `mr * nv` accumulators, `nv` registers for the B row and one
//! for the broadcast A element, so `mr * nv + nv + 1 <= 32`. Per k step the
//! kernel loads the `nv` B vectors, then for each row broadcasts A[i, k] and
//! issues `nv` FMAs. [`Blocking::choose`] picks `(mr, nv)` per shape with a
//! small cost model (FMA issue, loads, FMA latency, wasted edge lanes).
//!
//! **Operands.** A is read with broadcasts, so any strides work
//! ([`ALayout::Strided`]), or from panels packed at compile time
//! ([`ALayout::Packed`], [`pack_a`](super::pack::pack_a)). B is read as vectors along j, so it is
//! either row-contiguous ([`BLayout::Strided`]) or packed into panels
//! ([`BLayout::Packed`], [`pack_b`](super::pack::pack_b)).
//!
//! **Loops.** j tiles outside, i tiles inside (a B panel is reused by every
//! row tile), K innermost and unrolled by [`K_UNROLL`] with displacements as
//! immediates. The last j tile masks its last vector with `k1` (loads
//! zero-masked, stores merge-masked), so no element outside the tensor is
//! read or written; a partial last row tile is generated separately.
//!
//! **Epilogue** (in the store loop): `* alpha`, `+ beta * C` (C broadcast
//! per row, per column, scalar or full), then Relu or Clip, then an
//! epilogue program ([`super::epilogue`]). Operands are packed by
//! [`super::pack`].
//!
//! **Calls.** One kernel can run several GEMMs of the same shape (batched
//! MatMul, the images of a batch): the entry code loads each call's operand
//! addresses into r8–r11 and calls the shared body.

use iced_x86::code_asm::*;

use super::epilogue::{allocate_slots, run_epilogue, EpilogueStep, FullAccess, Operand};
use super::im2col::Im2col;
use super::pack::Half;
use super::SAVED;
use super::{base_register, imm32, load_address, MicrokernelError, Store, Vector};
use crate::plan::Loc;

mod ymm;

/// K steps per unrolled loop iteration.
pub(crate) const K_UNROLL: usize = 4;

/// Bytes per f32.
const F: i64 = 4;

/// Most rows of a tile (the A broadcasts per k step).
pub(crate) const MAX_MR: usize = 14;

/// Bytes of a packed A panel (`mr × K` floats) that should stay in L1: the
/// panel is re-read by every column tile, and the 48 KB L1 also holds the
/// B lines in flight.
const L1_PANEL_BYTES: usize = 32 << 10;

/// The most rows of a tile whose packed A panel over `k` stays in L1.
/// When that is fewer than [`MIN_PANEL_ROWS`] (K above about 1,400), a
/// tile of so few rows issues too few FMAs per load: the registers bound
/// the rows instead and the kernel walks K in chunks
/// (`GemmSpec::k_chunks`; a 256×196×2304 constant-A GEMM, a 3×3 conv of
/// 256 channels on 14×14, went from 51.6% to 69.8% of peak with chunks
/// whose panels fit L1).
pub(crate) fn packed_a_rows(k: usize) -> usize {
    match (L1_PANEL_BYTES / (k.max(1) * 4)).clamp(1, MAX_MR) {
        rows if rows < MIN_PANEL_ROWS => MAX_MR,
        rows => rows,
    }
}

/// Fewest rows of an L1-resident A panel worth keeping whole (see
/// [`packed_a_rows`]).
const MIN_PANEL_ROWS: usize = 6;

/// Most zmm vectors per tile row.
const MAX_NV: usize = 8;

/// Registers a tile's accumulators and B vectors may take: all but the A
/// broadcast register (and for ymm the edge mask, which AVX2 keeps in a
/// vector register).
fn tile_registers(vector: Vector) -> usize {
    match vector {
        Vector::Zmm => 31,
        Vector::Ymm => 14,
    }
}

/// The register tile of one GEMM shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Rows of a full tile.
    pub mr: usize,
    /// Vectors (of [`Vector::lanes`] columns each) of a full tile.
    pub nv: usize,
    /// The registers.
    pub vector: Vector,
}

impl Blocking {
    /// Columns of a full tile.
    pub(crate) fn nr(self) -> usize {
        self.nv * self.vector.lanes()
    }

    /// [`Blocking::choose_for`] with zmm registers.
    pub(crate) fn choose(m: usize, n: usize, max_rows: usize) -> Blocking {
        Blocking::choose_for(Vector::Zmm, m, n, max_rows)
    }

    /// The cheapest tile for an `m × n` output by the cost model: the sum
    /// over tiles of `max(FMAs / 2, loads / 2, 4)` cycles per k step (two
    /// FMA and two load pipes, four cycles of FMA latency per accumulator
    /// chain). Rows are balanced over the row tiles; tiles have at most
    /// `max_rows` rows.
    pub(crate) fn choose_for(vector: Vector, m: usize, n: usize, max_rows: usize) -> Blocking {
        Blocking::choose_within(vector, m, n, max_rows, None)
    }

    /// [`Blocking::choose_for`] with one side of the tile fixed (the rows
    /// `mr` of a packed A, or the vectors `nv` of a packed B, as an earlier
    /// profile packed the same constant): the cheapest tile with that side,
    /// or the free choice when no tile has it.
    pub(crate) fn choose_within(
        vector: Vector,
        m: usize,
        n: usize,
        max_rows: usize,
        fixed: Option<(PackedSide, usize)>,
    ) -> Blocking {
        match Blocking::scored(vector, m, n, max_rows, fixed) {
            (cost, tile) if cost.is_finite() => tile,
            _ => Blocking::choose_for(vector, m, n, max_rows),
        }
    }

    /// The modeled cycles per k step of [`Blocking::choose_for`]'s tile
    /// for an `m × n` output: what comparing two ways of laying out one
    /// product (channels or pixels along the vectors) weighs.
    pub(crate) fn modeled_cycles(vector: Vector, m: usize, n: usize, max_rows: usize) -> f64 {
        Blocking::scored(vector, m, n, max_rows, None).0
    }

    /// The cheapest tile within the constraints and its modeled cycles
    /// per k step (infinite when `fixed` allows no tile).
    fn scored(
        vector: Vector,
        m: usize,
        n: usize,
        max_rows: usize,
        fixed: Option<(PackedSide, usize)>,
    ) -> (f64, Blocking) {
        let cycles = |mr: usize, nv: usize| -> f64 {
            let fma = (mr * nv) as f64 / 2.0;
            let loads = (mr + nv) as f64 / 2.0;
            fma.max(loads).max(4.0)
        };
        let lanes = vector.lanes();
        let registers = tile_registers(vector);
        let nv_cap = n.div_ceil(lanes).clamp(1, MAX_NV.min(registers / 2));
        let tile = |mr, nv| Blocking { mr, nv, vector };
        let mut best = (f64::INFINITY, tile(1, 1));
        for nv in 1..=nv_cap {
            // `max_rows` keeps a packed A panel in L1 while the column
            // tiles re-read it; one column tile reads it once, so its
            // rows are bounded by the registers alone (a narrow output
            // of many channels, the last stages of a CNN, would otherwise
            // run one row per tile: one FMA per k step).
            let rows_cap = if n <= nv * lanes { MAX_MR } else { max_rows };
            let mr_cap = ((registers - nv) / nv)
                .min(rows_cap.clamp(1, MAX_MR))
                .min(m.max(1));
            for mr_max in 1..=mr_cap {
                let tiles_i = m.max(1).div_ceil(mr_max);
                let mr = m.max(1).div_ceil(tiles_i);
                let nr = nv * lanes;
                let (full_i, rem_i) = (m / mr, m % mr);
                let (full_j, rem_j) = (n / nr, n % nr);
                let nv_edge = rem_j.div_ceil(lanes);
                let mut cost = 0.0;
                for (rows, count_i) in [(mr, full_i), (rem_i, usize::from(rem_i > 0))] {
                    for (vecs, count_j) in [(nv, full_j), (nv_edge, usize::from(rem_j > 0))] {
                        if rows > 0 && vecs > 0 {
                            cost += (count_i * count_j) as f64 * cycles(rows, vecs);
                        }
                    }
                }
                let allowed = match fixed {
                    None => true,
                    Some((PackedSide::Rows, f)) => mr == f,
                    Some((PackedSide::Columns, f)) => nv == f,
                };
                if !allowed {
                    continue;
                }
                // On ties prefer the larger tile (fewer loop overheads).
                let tie = (cost - best.0).abs() < 1e-9 && mr * nv > best.1.mr * best.1.nv;
                if cost < best.0 - 1e-9 || tie {
                    best = (cost, tile(mr, nv));
                }
            }
        }
        best
    }

    /// The side `side` of this tile.
    pub(crate) fn side(self, side: PackedSide) -> usize {
        match side {
            PackedSide::Rows => self.mr,
            PackedSide::Columns => self.nv,
        }
    }
}

/// The side of a tile that packing a constant operand at compile time
/// fixes: the rows of a packed A panel, or the vectors of a packed B panel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PackedSide {
    /// `mr`: A is packed in panels of `mr` rows.
    Rows,
    /// `nv`: B is packed in panels of `nv` vectors of columns.
    Columns,
}

/// How the kernel reads A.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ALayout {
    /// `A[i, k]` at `base + i * row + k * col` (bytes).
    Strided {
        /// Bytes between rows.
        row: i64,
        /// Bytes between k steps.
        col: i64,
    },
    /// Panels of `mr` rows written by [`pack_a`](super::pack::pack_a).
    Packed,
}

/// How the kernel reads B.
#[derive(Clone, Copy, Debug)]
pub(crate) enum BLayout {
    /// `B[k, j]` at `base + k * row + j * 4` (bytes).
    Strided {
        /// Bytes between k steps.
        row: i64,
    },
    /// Panels of `16 * nv` columns written by [`pack_b`](super::pack::pack_b).
    Packed,
    /// Read in place from an image (an implicit-GEMM convolution): k is
    /// `(channel, th, tw)` with the taps of a `kh × kw` window in row-major
    /// order. The image's columns are split into `phases` planes (the W
    /// stride; 1: the image as it is), plane `p` holding the columns `p,
    /// p + phases, ...`, so that the output columns of one tap are
    /// consecutive in one plane: with `t = tw * dilation`, `B[k, j]` is at
    /// byte `base + c * channel + th * row + (t % phases) * phase + 4 *
    /// (t / phases + j)`. The k loop runs over channels with the taps
    /// unrolled, so no im2col matrix is built.
    Taps {
        /// Bytes between channels.
        channel: i64,
        /// Kernel rows and columns.
        kh: usize,
        /// Kernel columns.
        kw: usize,
        /// Bytes between kernel rows (dilation included).
        row: i64,
        /// The W dilation.
        dilation: usize,
        /// Column planes (the W stride).
        phases: usize,
        /// Bytes between column planes.
        phase: i64,
    },
}

impl BLayout {
    /// Byte offsets of the taps of one channel, for [`BLayout::Taps`].
    fn taps(self) -> Vec<i64> {
        match self {
            BLayout::Taps {
                kh,
                kw,
                row,
                dilation,
                phases,
                phase,
                ..
            } => (0..kh)
                .flat_map(|th| {
                    (0..kw).map(move |tw| {
                        let t = tw * dilation;
                        let (p, q) = ((t % phases) as i64, (t / phases) as i64);
                        th as i64 * row + p * phase + F * q
                    })
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// The element types the kernel reads. Accumulation is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Elem {
    /// f32 operands, `vfmadd231ps`.
    F32,
    /// A bf16 and contiguous along k ([`ALayout::Strided`] with `col` 2),
    /// B bf16 pairs along k ([`pack_b_pairs`](super::pack::pack_b_pairs)): each `vdpbf16ps` takes a
    /// broadcast (A[i,k], A[i,k+1]) dword and 16 columns of (B[k,j],
    /// B[k+1,j]) pairs, two multiply-adds per lane into f32 accumulators.
    Bf16Dot,
    /// A f32; B packed 16-bit ([`pack_b_half`](super::pack::pack_b_half)), widened to f32 as it is
    /// loaded; f32 FMAs.
    WidenB(Half),
    /// A packed 16-bit ([`pack_a_half`](super::pack::pack_a_half)), each element broadcast and
    /// widened; B f32; f32 FMAs.
    WidenA(Half),
    /// int8 dot products (AVX512-VNNI): A u8 and contiguous along k
    /// ([`ALayout::Strided`] with `col` 1), B i8 quads along k
    /// ([`pack_b_quads`](super::pack::pack_b_quads)); each `vpdpbusd` takes a broadcast dword of four
    /// A bytes and 16 columns of four B bytes, four multiply-adds per lane
    /// into i32 accumulators. The output is i32; the epilogue subtracts
    /// `u8_zero * column_sum(B)` (see [`GemmSpec::u8_zero`]).
    U8I8Dot,
    /// int8 dot products with the signed operand on the left: A i8 packed
    /// in panels of quads along k ([`pack_a_quads`](super::pack::pack_a_quads)), each dword broadcast
    /// from memory; B u8 quads along k, 16 columns per vector, strided (an
    /// int8 convolution's quad im2col, rows padded to whole vectors). The
    /// output is i32; the epilogue subtracts `u8_zero * C[i]`, C being A's
    /// row sums (see [`GemmSpec::u8_zero`]).
    I8U8Dot,
}

impl Elem {
    /// Bytes of one stored A element.
    pub(crate) fn a_size(self) -> i64 {
        match self {
            Elem::F32 | Elem::WidenB(_) => F,
            Elem::Bf16Dot | Elem::WidenA(_) => 2,
            Elem::U8I8Dot | Elem::I8U8Dot => 1,
        }
    }

    /// Bytes of one stored B element.
    pub(crate) fn b_size(self) -> i64 {
        match self {
            Elem::F32 | Elem::WidenA(_) => F,
            Elem::Bf16Dot | Elem::WidenB(_) => 2,
            Elem::U8I8Dot | Elem::I8U8Dot => 1,
        }
    }

    /// Whether the kernel accumulates in i32 (int8 dot products).
    pub(crate) fn integer(self) -> bool {
        matches!(self, Elem::U8I8Dot | Elem::I8U8Dot)
    }

    /// k elements one dot-product instruction reduces per lane.
    fn group(self) -> usize {
        match self {
            Elem::Bf16Dot => 2,
            Elem::U8I8Dot | Elem::I8U8Dot => 4,
            _ => 1,
        }
    }

    /// Reduction steps of the kernel loop for `k` (pairs for bf16 dot,
    /// quads for int8 dot).
    fn steps(self, k: usize) -> usize {
        k.div_ceil(self.group())
    }
}

/// The elementwise activation applied in the store loop (a fused kernel's
/// Relu or Clip, see `lower::dense::absorb`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Activation {
    /// Identity.
    None,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, lo), hi)`.
    Clip {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
}

impl Activation {
    /// Applies the activation to `x` in place, with `konst` for its
    /// bounds (set through `gpr`).
    pub(crate) fn emit_zmm(
        self,
        a: &mut CodeAssembler,
        x: AsmRegisterZmm,
        (konst, gpr): (AsmRegisterZmm, AsmRegister32),
    ) -> Result<(), MicrokernelError> {
        let splat = |a: &mut CodeAssembler, v: f32| -> Result<(), MicrokernelError> {
            a.mov(gpr, v.to_bits())?;
            a.vpbroadcastd(konst, gpr)?;
            Ok(())
        };
        match self {
            Activation::None => {}
            Activation::Relu => {
                a.vpxord(konst, konst, konst)?;
                a.vmaxps(x, x, konst)?;
            }
            Activation::Clip { lo, hi } => {
                splat(a, lo)?;
                a.vmaxps(x, x, konst)?;
                splat(a, hi)?;
                a.vminps(x, x, konst)?;
            }
        }
        Ok(())
    }
}

/// The `C` (bias) operand: `C[i, j]` at `base + i * row + j * col`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CLayout {
    /// Bytes between rows (0: broadcast over rows).
    pub row: i64,
    /// Whether C varies along j (contiguous); otherwise broadcast over j.
    pub per_column: bool,
    /// Scale of C.
    pub beta: f32,
}

/// Whether `steps` fits the store loop of tiles of `blocking`.
/// The ymm store loop runs no program (see [`ymm`]).
pub(crate) fn epilogue_fits(steps: &[EpilogueStep], blocking: Blocking) -> bool {
    blocking.vector == Vector::Zmm
        && allocate_slots(steps, 1 + 32 - blocking.mr * blocking.nv).is_some()
}

/// Operand addresses of one GEMM of a kernel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// A (or its packed panels).
    pub a: Loc,
    /// B (or its packed panels).
    pub b: Loc,
    /// The output, row-major with `out_row` bytes between rows.
    pub out: Loc,
    /// C, when the spec has one.
    pub c: Option<Loc>,
    /// When B is built by im2col: the image (moved as the routine needs)
    /// and which of the spec's [`GemmSpec::im2col`] routines reads it.
    pub src: Option<(Loc, usize)>,
}

/// A whole GEMM kernel.
#[derive(Clone, Debug)]
pub(crate) struct GemmSpec {
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// Operand element types.
    pub elem: Elem,
    /// Register tile.
    pub blocking: Blocking,
    /// A's layout.
    pub a: ALayout,
    /// B's layout.
    pub b: BLayout,
    /// Bytes between output rows.
    pub out_row: i64,
    /// Scale of the product.
    pub alpha: f32,
    /// The added operand, if any.
    pub c: Option<CLayout>,
    /// Activation.
    pub act: Activation,
    /// The GEMMs to run, in order.
    pub calls: Vec<Call>,
    /// The im2col routines that build B from a call's `src` before its
    /// GEMM (one per distinct band geometry; empty when B is an operand).
    pub im2col: Vec<Im2col>,
    /// With a strided B: scratch (`K × 16·nv` floats) into which each
    /// column tile of B is copied before the row tiles read it, so they
    /// stream one contiguous panel instead of K rows a page apart.
    pub b_panel: Option<Loc>,
    /// The im2col routines build A, not B (a strided A whose rows are
    /// output pixels: `lower::dense::pixel_rows`), at each call's `a`.
    pub im2col_into_a: bool,
    /// The int8 kernels: the byte holding the u8 operand's zero point `z`.
    /// [`Elem::U8I8Dot`]: the epilogue subtracts `z * C[j]`, C being B's
    /// column sums (i32, one per column, padded to whole tiles), so the
    /// output is `(A - z) @ B`; [`Elem::I8U8Dot`]: `z * C[i]`, C being A's
    /// row sums (one per row), so the output is `A @ (B - z)`. `None`: a
    /// zero point of 0 (and no C).
    pub u8_zero: Option<Loc>,
    /// [`Elem::I8U8Dot`] with a `u8_zero`: A's row sums (i32, one per
    /// row), for the correction `u8_zero * row_sums[i]`.
    pub row_sums: Option<Loc>,
    /// The int8 kernels: convert the corrected i32 result to f32 and run
    /// the float store loop (C, activation, epilogue program) instead of
    /// storing i32 (a fused integer head: the rescale, bias and activation
    /// of an int8 layer).
    pub to_f32: bool,
    /// An elementwise program applied to every output element after the
    /// activation (a fused kernel's tail: hard-swish, a per-channel
    /// affine); empty for none. See [`epilogue_fits`].
    pub epilogue: Vec<EpilogueStep>,
    /// How the float store loop stores (u8: see [`GemmSpec::narrowed`]);
    /// the i32 store of an unfused integer product ignores it.
    pub store: Store,
}

use super::ZMM;

/// Register roles in the body.
const A_BASE: AsmRegister64 = r8;
const B_TILE: AsmRegister64 = r9;
const OUT_COL: AsmRegister64 = r10;
const C_COL: AsmRegister64 = r11;
const A_TILE: AsmRegister64 = rax;
const OUT_TILE: AsmRegister64 = rdx;
const C_TILE: AsmRegister64 = rbx;
const I_COUNT: AsmRegister64 = rcx;
const J_COUNT: AsmRegister64 = r12;
const A_K: AsmRegister64 = r13;
const B_K: AsmRegister64 = r14;
const K_COUNT: AsmRegister64 = r15;
/// The packed B panel in scratch, when the spec has one.
const PANEL: AsmRegister64 = rbp;
/// Scratch for constants in the epilogue (the k counter is free there).
const CONST: AsmRegister32 = r15d;
/// The low half of the broadcast register (zmm31), for `vcvtph2ps`.
const ABC_Y: AsmRegisterYmm = ymm31;
/// The low quarter of the broadcast register, for the masked int8 tail.
const ABC_X: AsmRegisterXmm = xmm31;

/// Bytes of one column tile of B over a K chunk (its "sliver") that
/// should stay in L1 while every row tile of the chunk re-reads it (the
/// 48 KB L1 also holds the A rows and output lines in flight).
const L1_SLIVER_BYTES: usize = 24 << 10;

/// Bytes of A over a K chunk that should stay in L2 while every column
/// tile of the chunk re-reads it.
const L2_BLOCK_BYTES: usize = 1 << 20;

/// Bytes of output whose partial sums stay in L2 between K chunks.
const L2_OUTPUT_BYTES: usize = 512 << 10;

/// Bytes of one column tile of B over a K chunk that should stay in L2
/// while every row tile reads it, for outputs too large for short chunks.
const L2_PANEL_BYTES: usize = 384 << 10;

/// Bytes of output a kernel writes, over all its calls, above which each
/// tile prefetches the next row tile's output lines for writing: an
/// output that large comes from memory, and the tile walk (a column
/// strip down the rows, each row a page or more from the last) defeats
/// the hardware prefetchers, so every first store to a line waited for
/// it. Whisper's 8-head 1500×64×1500 attention scores (72 MB) took 35.6
/// ms in the kernel against 2.0 ms for one head's 9 MB.
const PREFETCH_OUTPUT_BYTES: usize = 2 << 20;

/// Fewest k steps of a chunk: each chunk reloads and stores the output
/// tiles' partial sums, which shorter chunks would not amortize.
const MIN_CHUNK_STEPS: usize = 96;

/// How the kernel walks K: whole, or in chunks (GotoBLAS's `kc`), each
/// sweeping every column tile (see [`GemmSpec::k_chunks`] for their
/// length). A chunk stores its partial sums into the output and the next
/// one loads them back; only the last runs the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KChunks {
    /// k steps of every chunk but the last.
    len: usize,
    /// Number of chunks, at least 2.
    count: usize,
    /// k steps of the last chunk (1..=len).
    last: usize,
}

/// One k step of a tile: `step(a, ak, bk, odd)` (see [`GemmSpec::k_loop`]).
type KStep<'a> = dyn Fn(&mut CodeAssembler, i64, i64, bool) -> Result<(), MicrokernelError> + 'a;

/// One pass of the row tiles over a K range: where its accumulators
/// start and where they go.
#[derive(Clone, Copy, Debug)]
struct Pass {
    /// k steps of the pass.
    steps: usize,
    /// Start from the partial sums in the output (else from zero).
    resume: bool,
    /// Run the epilogue and store (else store the partial sums raw).
    finish: bool,
}

/// Addressing of one GEMM, in bytes, derived from a spec.
struct Geometry {
    /// A: between row tiles, between rows, between k steps.
    a_tile: i64,
    a_row: i64,
    a_k: i64,
    /// B: between column tiles, between k steps as the tiles read it.
    b_tile: i64,
    b_k: i64,
    /// Between k steps of B in memory, when tiles read a packed panel.
    b_pack_row: Option<i64>,
}

impl GemmSpec {
    /// The kernel storing u8 ([`Store::U8`], `zero` an f32 0 in the
    /// weights) into the output that starts at `out`: the offsets and row
    /// stride, computed for f32 elements, scaled to bytes. Only for the
    /// float store loop (a float product, or an integer one with
    /// `to_f32`).
    pub(crate) fn narrowed(mut self, out: Loc, zero: Loc) -> GemmSpec {
        self.store = Store::U8 { zero };
        self.out_row /= 4;
        for call in &mut self.calls {
            call.out = self.store.narrow(out, call.out);
        }
        self
    }

    fn geometry(&self) -> Geometry {
        let Blocking { mr, .. } = self.blocking;
        let (ea, eb) = (self.elem.a_size(), self.elem.b_size());
        // Dot products step over k groups: a dword of A, a dword per B
        // column.
        let pair = self.elem.group() as i64;
        let steps = self.elem.steps(self.k) as i64;
        let (a_row, a_k, a_tile) = match self.a {
            ALayout::Strided { row, col } => (row, col * pair, row * mr as i64),
            ALayout::Packed => (
                ea * pair,
                ea * pair * mr as i64,
                ea * pair * mr as i64 * steps,
            ),
        };
        let nr = self.blocking.nr() as i64;
        let (b_k, b_tile, b_pack_row) = match (self.b, self.b_panel) {
            (BLayout::Strided { row }, None) => (row, F * nr, None),
            (BLayout::Strided { row }, Some(_)) => (F * nr, F * nr, Some(row)),
            (BLayout::Packed, _) => (eb * pair * nr, eb * pair * nr * steps, None),
            (BLayout::Taps { channel, .. }, _) => (channel, F * nr, None),
        };
        Geometry {
            a_tile,
            a_row,
            a_k,
            b_tile,
            b_k,
            b_pack_row,
        }
    }

    /// The K chunks of the kernel, `None` when it walks K whole: only the
    /// f32-accumulating kernels that store f32 (partial sums live in the
    /// output). When the output stays in L2 between chunks, chunks are
    /// short enough that B's sliver stays in L1 while several row tiles
    /// re-read it and A's rows in L2 while several column tiles do
    /// (GotoBLAS's blocking; the 3×3 convolutions of 512 channels on 7×7
    /// in a ResNet-18 went from 3.4 to 2.3 ms each). A larger output would
    /// travel to L3 and back once per chunk, so its chunks only keep a row
    /// tile's A in L1 and a column tile's B in L2, and only when K is long.
    fn k_chunks(&self) -> Option<KChunks> {
        let Blocking { mr, .. } = self.blocking;
        let float = matches!(self.elem, Elem::F32 | Elem::WidenA(_) | Elem::WidenB(_));
        if !float || !matches!(self.store, Store::F32) {
            return None;
        }
        let (ea, eb) = (self.elem.a_size() as usize, self.elem.b_size() as usize);
        let nr = self.blocking.nr();
        let out_fits = self.m * self.n * self.store.bytes() <= L2_OUTPUT_BYTES;
        let most = if out_fits {
            let b_limit = (self.m > mr).then(|| L1_SLIVER_BYTES / (nr * eb));
            let a_limit = (self.n > nr).then(|| L2_BLOCK_BYTES / (self.m * ea));
            match (b_limit, a_limit) {
                (None, None) => return None,
                (b, a) => b.unwrap_or(usize::MAX).min(a.unwrap_or(usize::MAX)),
            }
        } else {
            let a_fits = mr * self.k * ea <= L1_PANEL_BYTES;
            let b_fits = nr * self.k * eb <= L2_PANEL_BYTES;
            if a_fits && b_fits {
                return None;
            }
            (L1_PANEL_BYTES / (mr * ea)).min(L2_PANEL_BYTES / (nr * eb))
        };
        if self.k <= most {
            return None;
        }
        // Chunks are whole unrolled blocks of the k loop: K_UNROLL steps,
        // or one channel's taps.
        let unit = match self.b.taps().len() {
            0 => K_UNROLL,
            taps => taps,
        };
        let len = (most.max(MIN_CHUNK_STEPS) / unit).max(1) * unit;
        if len >= self.k {
            return None;
        }
        let count = self.k.div_ceil(len);
        Some(KChunks {
            len,
            count,
            last: self.k - (count - 1) * len,
        })
    }

    /// Bytes B's cursor moves for `steps` k steps (a multiple of the taps
    /// for [`BLayout::Taps`]), in memory: for a B packed into a panel by
    /// column tile, in B itself.
    fn b_k_bytes(&self, g: &Geometry, steps: usize) -> i64 {
        let taps = self.b.taps().len();
        match g.b_pack_row {
            _ if taps > 0 => (steps / taps) as i64 * g.b_k,
            Some(row) => steps as i64 * row,
            None => steps as i64 * g.b_k,
        }
    }

    /// Bytes between B's column tiles as the kernel steps over them.
    pub(crate) fn b_tile_bytes(&self) -> i64 {
        self.geometry().b_tile
    }

    /// Assembles the kernel.
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        self.check_operands()?;
        let mut a = CodeAssembler::new(64)?;
        let mut body = a.create_label();
        let mut im2col: Vec<CodeLabel> = self.im2col.iter().map(|_| a.create_label()).collect();
        for r in SAVED {
            a.push(r)?;
        }
        if let (Some(panel), Some(_)) = (self.b_panel, self.geometry().b_pack_row) {
            load_address(&mut a, PANEL, panel)?;
        }
        for call in &self.calls {
            self.emit_call(&mut a, call, body, &im2col)?;
        }
        for r in SAVED.iter().rev() {
            a.pop(*r)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        self.emit_body(&mut a, &mut body)?;
        for (routine, label) in self.im2col.iter().zip(&mut im2col) {
            a.set_label(label)?;
            routine.emit(&mut a)?;
        }
        Ok(a.assemble(0)?)
    }

    /// Whether the element types can read the operand layouts.
    pub(crate) fn check_operands(&self) -> Result<(), MicrokernelError> {
        let Blocking { mr, nv, vector } = self.blocking;
        assert!(
            mr >= 1 && nv >= 1 && mr * nv + nv <= tile_registers(vector),
            "tile too large"
        );
        if let Some(why) = self.ymm_declines() {
            return Err(MicrokernelError::Layout(why));
        }
        let taps = self.b.taps();
        let operands_fit = match self.elem {
            _ if !taps.is_empty() => {
                matches!(self.elem, Elem::F32 | Elem::WidenA(_))
                    && self.k.is_multiple_of(taps.len())
                    && self.b_panel.is_none()
            }
            Elem::F32 => true,
            Elem::Bf16Dot => {
                matches!(self.a, ALayout::Strided { col: 2, .. })
                    && matches!(self.b, BLayout::Packed)
            }
            Elem::WidenB(_) => matches!(self.b, BLayout::Packed),
            Elem::WidenA(_) => matches!(self.a, ALayout::Packed),
            Elem::U8I8Dot => {
                matches!(self.a, ALayout::Strided { col: 1, .. })
                    && matches!(self.b, BLayout::Packed)
                    && self.alpha == 1.0
                    && (self.u8_zero.is_none() || self.c.is_some_and(|c| c.per_column))
                    && (self.u8_zero.is_some() || self.c.is_none() || self.to_f32)
                    && self.row_sums.is_none()
                    && (self.to_f32 || (self.act == Activation::None && self.epilogue.is_empty()))
            }
            Elem::I8U8Dot => {
                matches!(self.a, ALayout::Packed)
                    && matches!(self.b, BLayout::Strided { .. })
                    && self.b_panel.is_none()
                    && self.k.is_multiple_of(4)
                    && self.alpha == 1.0
                    && self.row_sums.is_some() == self.u8_zero.is_some()
                    && (self.to_f32
                        || (self.act == Activation::None
                            && self.c.is_none()
                            && self.epilogue.is_empty()))
            }
        };
        if operands_fit {
            Ok(())
        } else {
            Err(MicrokernelError::Layout(format!(
                "{:?} cannot read A {:?} and B {:?}",
                self.elem, self.a, self.b
            )))
        }
    }

    /// One GEMM of the kernel: builds B with the call's im2col routine when
    /// it has one, loads the operand addresses and calls `body` (the
    /// callee-saved [`SAVED`] registers must be saved around all calls).
    pub(crate) fn emit_call(
        &self,
        a: &mut CodeAssembler,
        call: &Call,
        body: CodeLabel,
        im2col: &[CodeLabel],
    ) -> Result<(), MicrokernelError> {
        if let Some((src, routine)) = call.src {
            load_address(a, r8, src)?;
            load_address(a, r9, if self.im2col_into_a { call.a } else { call.b })?;
            a.call(im2col[routine])?;
        }
        load_address(a, A_BASE, call.a)?;
        load_address(a, B_TILE, call.b)?;
        load_address(a, OUT_COL, call.out)?;
        if let Some(c) = call.c {
            load_address(a, C_COL, c)?;
        }
        a.call(body)?;
        Ok(())
    }

    /// The body every call runs, at `label`, ending in `ret`.
    pub(crate) fn emit_body(
        &self,
        a: &mut CodeAssembler,
        label: &mut CodeLabel,
    ) -> Result<(), MicrokernelError> {
        a.set_label(label)?;
        self.body(a, &self.geometry())?;
        a.ret()?;
        Ok(())
    }

    /// Every j tile of one GEMM (operand addresses in r8–r11): one pass
    /// over all of K, or one per K chunk, each sweeping every column tile,
    /// with A_BASE and B_TILE moved along K between them (and moved back
    /// after).
    fn body(&self, a: &mut CodeAssembler, g: &Geometry) -> Result<(), MicrokernelError> {
        if self.m == 0 || self.n == 0 {
            return Ok(());
        }
        let pass = |steps, resume, finish| Pass {
            steps,
            resume,
            finish,
        };
        let Some(chunks) = self.k_chunks() else {
            let whole = pass(self.elem.steps(self.k), false, true);
            return self.columns(a, g, whole, self.k);
        };
        let (a_step, b_step) = (g.a_k * chunks.len as i64, self.b_k_bytes(g, chunks.len));
        let advance = |a: &mut CodeAssembler| -> Result<(), MicrokernelError> {
            a.add(A_BASE, imm32(a_step, "A chunk stride")?)?;
            a.add(B_TILE, imm32(b_step, "B chunk stride")?)?;
            Ok(())
        };
        self.columns(a, g, pass(chunks.len, false, false), chunks.len)?;
        advance(a)?;
        if chunks.count > 2 {
            // The middle chunks in a loop, its counter on the stack (every
            // register is taken; the body calls nothing).
            let mut top = a.create_label();
            a.push((chunks.count - 2) as i32)?;
            a.set_label(&mut top)?;
            self.columns(a, g, pass(chunks.len, true, false), chunks.len)?;
            advance(a)?;
            a.dec(qword_ptr(rsp))?;
            a.jnz(top)?;
            a.add(rsp, 8)?;
        }
        self.columns(a, g, pass(chunks.last, true, true), chunks.last)?;
        let back = (chunks.count - 1) as i64;
        a.sub(A_BASE, imm32(a_step * back, "A chunk stride")?)?;
        a.sub(B_TILE, imm32(b_step * back, "B chunk stride")?)?;
        Ok(())
    }

    /// One `pass` of every column tile (B packed `pack_rows` k rows at a
    /// time when the spec packs), leaving B_TILE, OUT_COL and C_COL at the
    /// first column tile.
    fn columns(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        pass: Pass,
        pack_rows: usize,
    ) -> Result<(), MicrokernelError> {
        let nr = self.blocking.nr();
        let (full_j, rem_j) = (self.n / nr, self.n % nr);
        let c_col_step = match self.c {
            Some(c) if c.per_column => F * nr as i64,
            _ => 0,
        };
        let out_tile = (self.store.bytes() * nr) as i64;
        let tile_strides = [
            (B_TILE, g.b_tile, "B tile stride"),
            (OUT_COL, out_tile, "output tile stride"),
            (C_COL, c_col_step, "C tile stride"),
        ];
        if full_j > 0 {
            let mut top = a.create_label();
            a.mov(J_COUNT, full_j as u64)?;
            a.set_label(&mut top)?;
            let nv = self.blocking.nv;
            self.pack_panel(a, g, nv, false, pack_rows)?;
            let first_col = TileStart::Counted { full: full_j };
            self.row_sweep(a, g, nv, None, first_col, pass)?;
            for (reg, step, what) in tile_strides {
                if step != 0 {
                    a.add(reg, imm32(step, what)?)?;
                }
            }
            a.dec(J_COUNT)?;
            a.jnz(top)?;
        }
        if rem_j > 0 {
            let width = self.blocking.vector.lanes();
            let lanes = rem_j % width;
            self.edge_mask(a, lanes)?;
            let (nv, partial) = (rem_j.div_ceil(width), lanes != 0);
            self.pack_panel(a, g, nv, partial, pack_rows)?;
            let first_col = TileStart::Fixed(full_j * nr);
            self.row_sweep(a, g, nv, Some(partial), first_col, pass)?;
        }
        if full_j > 0 {
            for (reg, step, what) in tile_strides {
                if step != 0 {
                    a.sub(reg, imm32(step * full_j as i64, what)?)?;
                }
            }
        }
        Ok(())
    }

    /// Sets the mask of the last column tile's last vector: its first
    /// `lanes` lanes (all when 0).
    fn edge_mask(&self, a: &mut CodeAssembler, lanes: usize) -> Result<(), MicrokernelError> {
        if self.blocking.vector == Vector::Ymm {
            return super::ymm::edge_mask(a, lanes);
        }
        let mask = if lanes == 0 {
            0xffff
        } else {
            (1u32 << lanes) - 1
        };
        a.mov(CONST, mask)?;
        a.kmovw(k1, CONST)?;
        Ok(())
    }

    /// Copies `rows` k rows of the column tile of B at B_TILE (`nv`
    /// vectors, the last one masked by `k1` when `partial`) into the
    /// panel, when the spec packs.
    fn pack_panel(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        nv: usize,
        partial: bool,
        rows: usize,
    ) -> Result<(), MicrokernelError> {
        let Some(row) = g.b_pack_row else {
            return Ok(());
        };
        if rows == 0 {
            return Ok(());
        }
        if self.blocking.vector == Vector::Ymm {
            return ymm::pack_panel(a, (row, g.b_k), nv, partial, rows);
        }
        let mut top = a.create_label();
        a.mov(A_K, B_TILE)?;
        a.mov(B_K, PANEL)?;
        a.mov(K_COUNT, rows as u64)?;
        a.set_label(&mut top)?;
        for v in 0..nv {
            let disp = imm32(64 * v as i64, "panel")?;
            if partial && v == nv - 1 {
                a.vmovups(zmm0.k1().z(), zmmword_ptr(A_K + disp))?;
            } else {
                a.vmovups(zmm0, zmmword_ptr(A_K + disp))?;
            }
            a.vmovups(zmmword_ptr(B_K + disp), zmm0)?;
        }
        a.add(A_K, imm32(row, "B row stride")?)?;
        a.add(B_K, imm32(g.b_k, "panel row")?)?;
        a.dec(K_COUNT)?;
        a.jnz(top)?;
        Ok(())
    }

    /// Every row tile of one column tile of `nv` vectors; `masked` says
    /// whether this is the last column tile and whether its last vector is
    /// partial (`Some(true)`).
    fn row_sweep(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        nv: usize,
        masked: Option<bool>,
        first_col: TileStart,
        pass: Pass,
    ) -> Result<(), MicrokernelError> {
        let mr = self.blocking.mr;
        let (full_i, rem_i) = (self.m / mr, self.m % mr);
        let partial = masked == Some(true);
        a.mov(A_TILE, A_BASE)?;
        a.mov(OUT_TILE, OUT_COL)?;
        if self.c.is_some() {
            a.mov(C_TILE, C_COL)?;
        }
        if full_i > 0 {
            let mut top = a.create_label();
            a.mov(I_COUNT, full_i as u64)?;
            a.set_label(&mut top)?;
            let first_row = TileStart::Counted { full: full_i };
            self.tile(a, g, (mr, nv), partial, (first_row, first_col), pass)?;
            a.add(A_TILE, imm32(g.a_tile, "A tile stride")?)?;
            a.add(
                OUT_TILE,
                imm32(self.out_row * mr as i64, "output row tile stride")?,
            )?;
            if let Some(c) = self.c {
                if c.row != 0 {
                    a.add(C_TILE, imm32(c.row * mr as i64, "C row tile stride")?)?;
                }
            }
            a.dec(I_COUNT)?;
            a.jnz(top)?;
        }
        if rem_i > 0 {
            let first_row = TileStart::Fixed(full_i * mr);
            self.tile(a, g, (rem_i, nv), partial, (first_row, first_col), pass)?;
        }
        Ok(())
    }

    /// One `rows × nv` register tile at A_TILE / B_TILE / OUT_TILE / C_TILE.
    fn tile(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        (rows, nv): (usize, usize),
        partial: bool,
        (first_row, first_col): (TileStart, TileStart),
        pass: Pass,
    ) -> Result<(), MicrokernelError> {
        if self.blocking.vector == Vector::Ymm {
            return self.ymm_tile(a, g, (rows, nv), partial, pass);
        }
        let acc = |r: usize, v: usize| ZMM[r * nv + v];
        let breg = |v: usize| ZMM[rows * nv + v];
        let abc = ZMM[31];
        // The partial sums of an earlier K chunk, as its raw store left
        // them (f32, masked like the store).
        let sums_at = |r: usize, v: usize| -> Result<AsmMemoryOperand, MicrokernelError> {
            let disp = imm32(
                self.out_row * r as i64 + 64 * v as i64,
                "output displacement",
            )?;
            Ok(OUT_TILE + disp)
        };
        for r in 0..rows {
            for v in 0..nv {
                if !pass.resume {
                    a.vpxord(acc(r, v), acc(r, v), acc(r, v))?;
                } else if partial && v == nv - 1 {
                    a.vmovups(acc(r, v).k1().z(), zmmword_ptr(sums_at(r, v)?))?;
                } else {
                    a.vmovups(acc(r, v), zmmword_ptr(sums_at(r, v)?))?;
                }
            }
        }
        self.prefetch_next_output(a, rows, nv)?;
        let elem = self.elem;
        // `odd`: the last k step of a dot over a K that is not a multiple
        // of the group, whose A dword would read past the row: only the
        // elements inside are loaded, the rest zero (B is zero there too).
        let tail_len = self.k % elem.group();
        // One k step: B at B_K + `bk`, A at A_K + `ak`.
        let step =
            |a: &mut CodeAssembler, ak: i64, bk: i64, odd: bool| -> Result<(), MicrokernelError> {
                // Bytes of one 16-column B vector as stored (pairs are dwords).
                let b_vec = match elem {
                    Elem::WidenB(_) => 32,
                    _ => 64,
                };
                for v in 0..nv {
                    let disp = imm32(bk + b_vec * v as i64, "B displacement")?;
                    let mem = B_K + disp;
                    match elem {
                        Elem::F32 | Elem::WidenA(_) => {
                            if partial && v == nv - 1 {
                                a.vmovups(breg(v).k1().z(), zmmword_ptr(mem))?;
                            } else {
                                a.vmovups(breg(v), zmmword_ptr(mem))?;
                            }
                        }
                        // Packed panels are zero-padded to whole tiles, so
                        // the 16-bit and 8-bit loads need no mask.
                        // So are the quad rows of an int8 convolution.
                        Elem::Bf16Dot | Elem::U8I8Dot | Elem::I8U8Dot => {
                            a.vmovups(breg(v), zmmword_ptr(mem))?
                        }
                        Elem::WidenB(Half::F16) => a.vcvtph2ps(breg(v), ymmword_ptr(mem))?,
                        Elem::WidenB(Half::Bf16) => {
                            a.vpmovzxwd(breg(v), ymmword_ptr(mem))?;
                            a.vpslld(breg(v), breg(v), 16)?;
                        }
                    }
                }
                for r in 0..rows {
                    let disp = imm32(ak + g.a_row * r as i64, "A displacement")?;
                    let mem = A_K + disp;
                    match elem {
                        Elem::Bf16Dot if odd => {
                            a.movzx(CONST, word_ptr(mem))?;
                            a.vpbroadcastd(abc, CONST)?;
                            for v in 0..nv {
                                a.vdpbf16ps(acc(r, v), abc, breg(v))?;
                            }
                            continue;
                        }
                        Elem::Bf16Dot => {
                            for v in 0..nv {
                                a.vdpbf16ps(acc(r, v), breg(v), dword_bcst(mem))?;
                            }
                            continue;
                        }
                        // vpdpbusd takes the unsigned bytes from its first
                        // source, a register, so A is broadcast into one.
                        Elem::U8I8Dot => {
                            if odd {
                                a.mov(CONST, (1u32 << tail_len) - 1)?;
                                a.kmovw(k2, CONST)?;
                                a.vmovdqu8(ABC_X.k2().z(), xmmword_ptr(mem))?;
                                a.vpbroadcastd(abc, ABC_X)?;
                            } else {
                                a.vpbroadcastd(abc, dword_ptr(mem))?;
                            }
                            for v in 0..nv {
                                a.vpdpbusd(acc(r, v), abc, breg(v))?;
                            }
                            continue;
                        }
                        Elem::I8U8Dot => {
                            for v in 0..nv {
                                a.vpdpbusd(acc(r, v), breg(v), dword_bcst(mem))?;
                            }
                            continue;
                        }
                        Elem::F32 | Elem::WidenB(_) => a.vbroadcastss(abc, dword_ptr(mem))?,
                        Elem::WidenA(Half::F16) => {
                            a.vpbroadcastw(abc, word_ptr(mem))?;
                            a.vcvtph2ps(abc, ABC_Y)?;
                        }
                        Elem::WidenA(Half::Bf16) => {
                            a.vpbroadcastw(abc, word_ptr(mem))?;
                            a.vpslld(abc, abc, 16)?;
                        }
                    }
                    for v in 0..nv {
                        a.vfmadd231ps(acc(r, v), abc, breg(v))?;
                    }
                }
                Ok(())
            };
        self.k_loop(a, g, pass, &step)?;
        if !pass.finish {
            for r in 0..rows {
                for v in 0..nv {
                    Store::F32.vector(a, sums_at(r, v)?, acc(r, v), partial && v == nv - 1)?;
                }
            }
            return Ok(());
        }
        if elem.integer() {
            self.epilogue_int(a, rows, nv, partial, first_row, &acc)?;
            if !self.to_f32 {
                return Ok(());
            }
        }
        self.epilogue(a, (rows, nv), partial, (first_row, first_col), &acc)
    }

    /// Prefetches for writing the output lines of the row tile after the
    /// one at OUT_TILE (`rows × nv` vectors), when the kernel's output is
    /// over [`PREFETCH_OUTPUT_BYTES`]: they arrive while this tile's k loop
    /// runs. Past the last row tile the addresses may lie outside the
    /// output, which a prefetch ignores (it never faults).
    pub(super) fn prefetch_next_output(
        &self,
        a: &mut CodeAssembler,
        rows: usize,
        nv: usize,
    ) -> Result<(), MicrokernelError> {
        let bytes = self.store.bytes();
        if self.calls.len() * self.m * self.n * bytes <= PREFETCH_OUTPUT_BYTES {
            return Ok(());
        }
        // A row of the tile, and one line more where it straddles lines.
        let lines = (nv * self.blocking.vector.lanes() * bytes).div_ceil(64) + 1;
        let next = self.out_row * self.blocking.mr as i64;
        for r in 0..rows {
            for line in 0..lines {
                let disp = next + self.out_row * r as i64 + 64 * line as i64;
                a.prefetchw(byte_ptr(OUT_TILE + imm32(disp, "output prefetch")?))?;
            }
        }
        Ok(())
    }

    /// The k loop of one tile at A_TILE / B_TILE (or the panel): `step(a,
    /// ak, bk, odd)` issues one k step with A at A_K + `ak` and B at B_K +
    /// `bk`, `odd` for the last step of a dot product over a K that is not
    /// a multiple of its group. The loop is unrolled by [`K_UNROLL`] (or
    /// by the taps of one channel).
    fn k_loop(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        pass: Pass,
        step: &KStep<'_>,
    ) -> Result<(), MicrokernelError> {
        a.mov(A_K, A_TILE)?;
        a.mov(
            B_K,
            if g.b_pack_row.is_some() {
                PANEL
            } else {
                B_TILE
            },
        )?;
        let taps = self.b.taps();
        let odd_tail = !self.k.is_multiple_of(self.elem.group());
        let steps = pass.steps - usize::from(odd_tail);
        // Taps: one loop iteration per channel, its taps unrolled.
        let (unroll, b_unroll) = if taps.is_empty() {
            (K_UNROLL, g.b_k * K_UNROLL as i64)
        } else {
            (taps.len(), g.b_k)
        };
        let b_disp = |u: usize| taps.get(u).copied().unwrap_or(g.b_k * u as i64);
        let (blocks, rest) = (steps / unroll, steps % unroll);
        if blocks > 0 {
            let mut top = a.create_label();
            a.mov(K_COUNT, blocks as u64)?;
            a.set_label(&mut top)?;
            for u in 0..unroll {
                step(a, g.a_k * u as i64, b_disp(u), false)?;
            }
            if matches!(self.a, ALayout::Packed) {
                // Packed A streams from memory once per column tile (the
                // weights of a model are rarely in cache): fetch what the
                // next row tile reads at this k, a whole tile ahead.
                for off in (0..g.a_k * unroll as i64).step_by(64) {
                    let ahead = imm32(g.a_tile + off, "A prefetch")?;
                    a.prefetcht0(byte_ptr(A_K + ahead))?;
                }
            }
            if matches!(self.b, BLayout::Packed) && self.m > self.blocking.mr {
                // Packed B (the weights, when the pixels are the rows)
                // streams from memory once: bring what the next column
                // tile reads at this k into L2 while this one's row tiles
                // run (into L1 it would evict the sliver they share).
                // With one row tile B is a single forward stream, which
                // the hardware prefetchers follow into L1; fetching the
                // next panel as well doubled the memory instructions and
                // cost a matrix-vector product a fifth of its speed (see
                // docs/performance.md, "Matrix-vector products stream B").
                for off in (0..b_unroll).step_by(64) {
                    if let Ok(ahead) = i32::try_from(g.b_tile + off) {
                        a.prefetcht1(byte_ptr(B_K + ahead))?;
                    }
                }
            }
            a.add(A_K, imm32(g.a_k * unroll as i64, "A k stride")?)?;
            a.add(B_K, imm32(b_unroll, "B k stride")?)?;
            a.dec(K_COUNT)?;
            a.jnz(top)?;
        }
        for u in 0..rest {
            step(a, g.a_k * u as i64, b_disp(u), false)?;
        }
        if odd_tail {
            step(a, g.a_k * rest as i64, b_disp(rest), true)?;
        }
        Ok(())
    }

    /// The zero-point correction of the int8 kernels, in i32: `acc -
    /// u8_zero * C[j]` ([`Elem::U8I8Dot`], B's column sums in C) or `acc -
    /// u8_zero * row_sums[i]` ([`Elem::I8U8Dot`]); then, unless the kernel
    /// converts to f32 ([`GemmSpec::to_f32`]), the i32 store.
    fn epilogue_int(
        &self,
        a: &mut CodeAssembler,
        rows: usize,
        nv: usize,
        partial: bool,
        first_row: TileStart,
        acc: &dyn Fn(usize, usize) -> AsmRegisterZmm,
    ) -> Result<(), MicrokernelError> {
        // The B registers are free here: one correction vector per column
        // vector (per tile) or per row.
        let corr = |v: usize| ZMM[rows * nv + v];
        if let Some(zero) = self.u8_zero {
            let disp = imm32(zero.offset as i64, "zero point offset")?;
            a.movzx(CONST, byte_ptr(base_register(zero) + disp))?;
            a.vpbroadcastd(ZMM[31], CONST)?;
            if self.elem == Elem::U8I8Dot {
                for v in 0..nv {
                    let disp = imm32(64 * v as i64, "C displacement")?;
                    a.vpmulld(corr(v), ZMM[31], zmmword_ptr(C_TILE + disp))?;
                }
            }
        }
        if let Some(sums) = self.row_sums {
            row_offset(a, first_row, self.blocking.mr)?;
            a.add(ROW_BYTES, base_register(sums))?;
            for r in 0..rows {
                let disp = imm32(sums.offset as i64 + 4 * r as i64, "row sum offset")?;
                a.vpmulld(corr(0), ZMM[31], dword_bcst(ROW_BYTES + disp))?;
                for v in 0..nv {
                    a.vpsubd(acc(r, v), acc(r, v), corr(0))?;
                }
            }
        } else if self.u8_zero.is_some() {
            for r in 0..rows {
                for v in 0..nv {
                    a.vpsubd(acc(r, v), acc(r, v), corr(v))?;
                }
            }
        }
        if self.to_f32 {
            for r in 0..rows {
                for v in 0..nv {
                    a.vcvtdq2ps(acc(r, v), acc(r, v))?;
                }
            }
            return Ok(());
        }
        for r in 0..rows {
            for v in 0..nv {
                let disp = imm32(
                    self.out_row * r as i64 + 64 * v as i64,
                    "output displacement",
                )?;
                if partial && v == nv - 1 {
                    a.vmovdqu32(zmmword_ptr(OUT_TILE + disp).k1(), acc(r, v))?;
                } else {
                    a.vmovdqu32(zmmword_ptr(OUT_TILE + disp), acc(r, v))?;
                }
            }
        }
        Ok(())
    }

    fn epilogue(
        &self,
        a: &mut CodeAssembler,
        (rows, nv): (usize, usize),
        partial: bool,
        (first_row, first_col): (TileStart, TileStart),
        acc: &dyn Fn(usize, usize) -> AsmRegisterZmm,
    ) -> Result<(), MicrokernelError> {
        // Free in the epilogue: the B registers and the broadcast register.
        let cval = ZMM[rows * nv];
        let konst = ZMM[31];
        let program = &self.epilogue;
        let free = 32 - rows * nv;
        let home = allocate_slots(program, 1 + free).ok_or_else(|| {
            MicrokernelError::Layout(format!(
                "an epilogue of {} steps does not fit {free} free registers",
                program.len()
            ))
        })?;
        let per_row = |o: Operand| matches!(o, Operand::PerRow(_));
        if program.iter().any(|st| per_row(st.a) || per_row(st.b)) {
            row_offset(a, first_row, self.blocking.mr)?;
        }
        let per_column = |o: Operand| matches!(o, Operand::PerColumn(_));
        let columns = program
            .iter()
            .any(|st| per_column(st.a) || per_column(st.b));
        if columns {
            let nr = self.blocking.nr();
            tile_offset(a, (COL_BYTES, J_COUNT), first_col, nr)?;
        }
        // Per output vector `v`: the program with its per-column operands
        // moved to the vector's columns.
        let programs: Vec<Vec<EpilogueStep>> = (0..nv)
            .map(|v| {
                let at = |o: Operand| match o {
                    Operand::PerColumn(loc) => Operand::PerColumn(loc.moved(64 * v as i64)),
                    o => o,
                };
                (program.iter())
                    .map(|st| EpilogueStep {
                        op: st.op,
                        a: at(st.a),
                        b: at(st.b),
                    })
                    .collect()
            })
            .collect();
        let splat = |a: &mut CodeAssembler, reg: AsmRegisterZmm, v: f32| {
            a.mov(CONST, v.to_bits())?;
            a.vpbroadcastd(reg, CONST)
        };
        for r in 0..rows {
            for (v, steps) in programs.iter().enumerate() {
                let x = acc(r, v);
                let last = partial && v == nv - 1;
                if self.alpha != 1.0 {
                    splat(a, konst, self.alpha)?;
                    a.vmulps(x, x, konst)?;
                }
                // With a zero point, U8I8Dot's C holds B's column sums (see
                // `epilogue_int`).
                let sums = self.elem == Elem::U8I8Dot && self.u8_zero.is_some();
                if let Some(c) = self.c.filter(|_| !sums) {
                    let disp = imm32(
                        c.row * r as i64 + if c.per_column { 64 * v as i64 } else { 0 },
                        "C displacement",
                    )?;
                    if !c.per_column {
                        a.vbroadcastss(cval, dword_ptr(C_TILE + disp))?;
                    } else if last {
                        a.vmovups(cval.k1().z(), zmmword_ptr(C_TILE + disp))?;
                    } else {
                        a.vmovups(cval, zmmword_ptr(C_TILE + disp))?;
                    }
                    if c.beta == 1.0 {
                        a.vaddps(x, x, cval)?;
                    } else {
                        splat(a, konst, c.beta)?;
                        a.vfmadd231ps(x, cval, konst)?;
                    }
                }
                self.act.emit_zmm(a, x, (konst, CONST))?;
                let x = if program.is_empty() {
                    x
                } else {
                    let regs: Vec<AsmRegisterZmm> = std::iter::once(x)
                        .chain(ZMM[rows * nv..].iter().copied())
                        .collect();
                    let full = columns.then_some(FullAccess {
                        offset: COL_BYTES,
                        column: COL_BYTES,
                        masked: last,
                    });
                    run_epilogue(a, steps, &home, &regs, (ROW_BYTES, r), full)?
                };
                let disp = imm32(
                    self.out_row * r as i64 + (16 * self.store.bytes() * v) as i64,
                    "output displacement",
                )?;
                self.store.vector(a, OUT_TILE + disp, x, last)?;
            }
        }
        Ok(())
    }
}

/// The first row (column) of a register tile, for per-row (per-column)
/// epilogue operands.
#[derive(Clone, Copy)]
enum TileStart {
    /// A full tile of the row (column) loop: `(full - I_COUNT) * mr`
    /// (`(full - J_COUNT) * nr`).
    Counted { full: usize },
    /// The partial last tile.
    Fixed(usize),
}

/// The byte offset of the tile's first row into per-row operands (the A
/// cursor, free in the store loop).
const ROW_BYTES: AsmRegister64 = A_K;

/// The byte offset of the tile's first column into per-column operands
/// (the B cursor, free in the store loop).
const COL_BYTES: AsmRegister64 = B_K;

/// ROW_BYTES = the tile's first row times 4 (tiles of `mr` rows).
fn row_offset(
    a: &mut CodeAssembler,
    first_row: TileStart,
    mr: usize,
) -> Result<(), MicrokernelError> {
    tile_offset(a, (ROW_BYTES, I_COUNT), first_row, mr)
}

/// `reg` = the tile's first row or column (`counter` counting the tiles of
/// `size` down) times 4.
fn tile_offset(
    a: &mut CodeAssembler,
    (reg, counter): (AsmRegister64, AsmRegister64),
    start: TileStart,
    size: usize,
) -> Result<(), MicrokernelError> {
    match start {
        TileStart::Counted { full } => {
            a.mov(reg, full as u64)?;
            a.sub(reg, counter)?;
            a.imul_3(reg, reg, (size * 4) as i32)?;
        }
        TileStart::Fixed(first) => a.mov(reg, (first * 4) as u64)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microkernel::pack::*;
    use crate::plan::Base;

    #[test]
    fn blocking_fits_the_register_file() {
        for m in [1, 2, 5, 14, 15, 16, 28, 100, 1024] {
            for n in [1, 15, 16, 17, 64, 100, 1024] {
                let b = Blocking::choose(m, n, MAX_MR);
                assert!(b.mr * b.nv + b.nv < 32, "{m}x{n}: {b:?}");
                assert!(b.mr <= m.max(1), "{m}x{n}: {b:?}");
            }
        }
    }

    #[test]
    fn packed_a_panels_fit_l1() {
        assert_eq!(packed_a_rows(16), MAX_MR);
        assert_eq!(packed_a_rows(1024), 8);
        let b = Blocking::choose(1024, 1024, packed_a_rows(1024));
        assert!(b.mr <= 8 && b.mr * 1024 * 4 <= L1_PANEL_BYTES, "{b:?}");
        // Past K ≈ 1,400 a whole panel would leave under 6 rows: the tile
        // takes all the rows the registers allow and K runs in chunks.
        assert_eq!(packed_a_rows(4608), MAX_MR);
    }

    #[test]
    fn one_row_uses_wide_tiles_for_latency() {
        // A single row needs several vectors in flight to hide FMA latency.
        let b = Blocking::choose(1, 1024, MAX_MR);
        assert_eq!(b.mr, 1);
        assert!(b.nv >= 8, "{b:?}");
    }

    #[test]
    fn packing_pads_with_zeros() {
        // A 3x2 matrix in panels of 2 rows: rows (0,1) then (2,pad).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let p = pack_a(&a, 3, 2, 2, 1, 2);
        let vals: Vec<f32> = p
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [1.0, 3.0, 2.0, 4.0, 5.0, 0.0, 6.0, 0.0]);
        let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 2x3
        let p = pack_b(&b, 2, 3, 3, 1, 2);
        let vals: Vec<f32> = p
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [1.0, 2.0, 4.0, 5.0, 3.0, 0.0, 6.0, 0.0]);
    }

    /// Whether `code` holds a `prefetchw` (0F 0D /1) addressed from the
    /// output tile's register (rdx), as [`GemmSpec::prefetch_next_output`]
    /// emits it.
    fn prefetches_output(code: &[u8]) -> bool {
        code.windows(3)
            .any(|w| w[0] == 0x0F && w[1] == 0x0D && w[2] & 0b0011_1111 == 0b0000_1010)
    }

    /// A one-call f32 GEMM of `m × n` over K = 64 with a strided A, B
    /// laid out as `b`, operands in the arena.
    fn arena_spec(m: usize, n: usize, vector: Vector, b: BLayout) -> GemmSpec {
        let k = 64;
        GemmSpec {
            m,
            n,
            k,
            elem: Elem::F32,
            blocking: Blocking::choose_for(vector, m, n, MAX_MR),
            a: ALayout::Strided {
                row: (k * 4) as i64,
                col: 4,
            },
            b,
            out_row: (n * 4) as i64,
            alpha: 1.0,
            c: None,
            act: Activation::None,
            calls: vec![Call {
                a: Loc {
                    base: Base::Arena,
                    offset: 0,
                },
                b: Loc {
                    base: Base::Arena,
                    offset: (m * k * 4) as u64,
                },
                out: Loc {
                    base: Base::Arena,
                    offset: ((m + n) * k * 4) as u64,
                },
                c: None,
                src: None,
            }],
            im2col: Vec::new(),
            b_panel: None,
            im2col_into_a: false,
            u8_zero: None,
            row_sums: None,
            to_f32: false,
            store: crate::microkernel::Store::F32,
            epilogue: Vec::new(),
        }
    }

    #[test]
    fn large_outputs_prefetch_the_next_row_tile_and_small_ones_do_not() {
        let spec = |m: usize, n: usize, vector: Vector| {
            arena_spec(
                m,
                n,
                vector,
                BLayout::Strided {
                    row: (n * 4) as i64,
                },
            )
        };
        for vector in [Vector::Zmm, Vector::Ymm] {
            // Attention scores of one head: a 9 MB output.
            let large = spec(1500, 1500, vector).assemble().unwrap();
            assert!(prefetches_output(&large), "{vector:?}");
            let small = spec(64, 64, vector).assemble().unwrap();
            assert!(!prefetches_output(&small), "{vector:?}");
        }
    }

    /// Whether `code` holds a `prefetcht1` (0F 18 /2) addressed from B's
    /// k pointer (r14), as the k loop fetches the next packed B panel.
    fn prefetches_next_b_panel(code: &[u8]) -> bool {
        code.windows(4)
            .any(|w| w[..3] == [0x41, 0x0F, 0x18] && w[3] & 0b0011_1111 == 0b0001_0110)
    }

    #[test]
    fn packed_b_fetches_the_next_panel_only_for_several_row_tiles() {
        for vector in [Vector::Zmm, Vector::Ymm] {
            // A recurrent layer's step (one row): B is one forward stream.
            let gemv = arena_spec(1, 2048, vector, BLayout::Packed);
            assert!(!prefetches_next_b_panel(&gemv.assemble().unwrap()));
            // Pixels as rows: the row tiles share each B panel.
            let rows = arena_spec(196, 256, vector, BLayout::Packed);
            assert!(rows.m > rows.blocking.mr);
            assert!(prefetches_next_b_panel(&rows.assemble().unwrap()));
        }
    }

    /// Runs a Gemm with every epilogue feature on the host and compares with
    /// a scalar reference (f64 accumulation).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn epilogue_alpha_bias_and_activations() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512F on this host: the generated code cannot run here");
            return;
        }
        let (m, k, n) = (19, 7, 37);
        let val = |i: usize, salt: usize| (((i * 7919 + salt * 104_729) % 23) as f32 - 11.0) / 4.0;
        let av: Vec<f32> = (0..m * k).map(|i| val(i, 1)).collect();
        let bv: Vec<f32> = (0..k * n).map(|i| val(i, 2)).collect();
        let cv: Vec<f32> = (0..m).map(|i| val(i, 3)).collect();
        for act in [
            Activation::None,
            Activation::Relu,
            Activation::Clip { lo: -1.5, hi: 2.0 },
        ] {
            let blocking = Blocking::choose(m, n, MAX_MR);
            let mut weights = pack_b(&bv, k, n, n, 1, blocking.nr());
            let c_at = weights.len().div_ceil(64) * 64;
            weights.resize(c_at, 0);
            weights.extend(cv.iter().flat_map(|v| v.to_le_bytes()));
            let mut arena = vec![0u8; (m * k + m * n) * 4];
            for (i, v) in av.iter().enumerate() {
                arena[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            let out_at = (m * k * 4) as u64;
            let spec = GemmSpec {
                m,
                n,
                k,
                elem: Elem::F32,
                blocking,
                a: ALayout::Strided {
                    row: (k * 4) as i64,
                    col: 4,
                },
                b: BLayout::Packed,
                out_row: (n * 4) as i64,
                alpha: 0.5,
                c: Some(CLayout {
                    row: 4,
                    per_column: false,
                    beta: -2.0,
                }),
                act,
                calls: vec![Call {
                    a: Loc {
                        base: Base::Arena,
                        offset: 0,
                    },
                    b: Loc {
                        base: Base::Weights,
                        offset: 0,
                    },
                    out: Loc {
                        base: Base::Arena,
                        offset: out_at,
                    },
                    c: Some(Loc {
                        base: Base::Weights,
                        offset: c_at as u64,
                    }),
                    src: None,
                }],
                im2col: Vec::new(),
                b_panel: None,
                im2col_into_a: false,
                u8_zero: None,
                row_sums: None,
                to_f32: false,
                store: crate::microkernel::Store::F32,
                epilogue: Vec::new(),
            };
            let code = spec.assemble().unwrap();
            assert_eq!(
                super::super::exec::call_kernel(&code, &mut arena, &weights),
                0
            );
            for i in 0..m {
                for j in 0..n {
                    let dot: f64 = (0..k)
                        .map(|kk| av[i * k + kk] as f64 * bv[kk * n + j] as f64)
                        .sum();
                    let mut want = 0.5 * dot - 2.0 * cv[i] as f64;
                    want = match act {
                        Activation::None => want,
                        Activation::Relu => want.max(0.0),
                        Activation::Clip { lo, hi } => want.max(lo as f64).min(hi as f64),
                    };
                    let at = out_at as usize + (i * n + j) * 4;
                    let got = f32::from_le_bytes(arena[at..at + 4].try_into().unwrap()) as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{act:?} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// Reduced-precision kernels against an f64 reference computed from the
    /// same 16-bit-rounded operands: what is left is f32 accumulation error.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn reduced_precision_kernels_match_rounded_operands() {
        let have = |f: &str| match f {
            "avx512_bf16" => std::arch::is_x86_feature_detected!("avx512bf16"),
            _ => std::arch::is_x86_feature_detected!("avx512f"),
        };
        if !have("avx512f") {
            eprintln!("no AVX-512F on this host: the generated code cannot run here");
            return;
        }
        let val = |i: usize, salt: usize| {
            (((i * 7919 + salt * 104_729) % 97) as f32 - 48.0) / 13.7 + 0.001 * salt as f32
        };
        let round = |x: f32, h: Option<Half>| match h {
            Some(Half::Bf16) => half::bf16::from_f32(x).to_f32(),
            Some(Half::F16) => half::f16::from_f32(x).to_f32(),
            None => x,
        };
        let cases = [
            (Elem::Bf16Dot, Some(Half::Bf16), Some(Half::Bf16)),
            (Elem::WidenB(Half::F16), None, Some(Half::F16)),
            (Elem::WidenB(Half::Bf16), None, Some(Half::Bf16)),
            (Elem::WidenA(Half::F16), Some(Half::F16), None),
            (Elem::WidenA(Half::Bf16), Some(Half::Bf16), None),
        ];
        for (elem, ha, hb) in cases {
            if elem == Elem::Bf16Dot && !have("avx512_bf16") {
                eprintln!("no AVX512-BF16 on this host: skipping {elem:?}");
                continue;
            }
            for (m, k, n) in [(19, 7, 37), (5, 64, 16), (14, 33, 100), (1, 1, 3)] {
                let av: Vec<f32> = (0..m * k).map(|i| round(val(i, 1), ha)).collect();
                let bv: Vec<f32> = (0..k * n).map(|i| round(val(i, 2), hb)).collect();
                let blocking = Blocking::choose(m, n, MAX_MR);
                let ea = ha.map_or(4, |_| 2);
                let a_packed = matches!(elem, Elem::WidenA(_));
                // Arena: A (unless packed), B (when strided), then the output;
                // poison after A so an over-read of the odd-K pair would show.
                let mut arena = Vec::new();
                let mut weights = Vec::new();
                let (a_layout, a_loc) = if a_packed {
                    weights = pack_a_half(&av, m, k, k, 1, blocking.mr, ha.unwrap());
                    (
                        ALayout::Packed,
                        Loc {
                            base: Base::Weights,
                            offset: 0,
                        },
                    )
                } else {
                    for &x in &av {
                        match ha {
                            Some(h) => arena.extend(half_bits(x, h).to_le_bytes()),
                            None => arena.extend(x.to_le_bytes()),
                        }
                    }
                    arena.extend([0xff; 64]);
                    let lay = ALayout::Strided {
                        row: (k * ea) as i64,
                        col: ea as i64,
                    };
                    (
                        lay,
                        Loc {
                            base: Base::Arena,
                            offset: 0,
                        },
                    )
                };
                let (b_layout, b_loc) = if a_packed {
                    let at = arena.len() as u64;
                    arena.extend(bv.iter().flat_map(|x| x.to_le_bytes()));
                    (
                        BLayout::Strided {
                            row: (n * 4) as i64,
                        },
                        Loc {
                            base: Base::Arena,
                            offset: at,
                        },
                    )
                } else {
                    weights = match elem {
                        Elem::Bf16Dot => pack_b_pairs(&bv, k, n, n, 1, blocking.nr()),
                        _ => pack_b_half(&bv, k, n, n, 1, blocking.nr(), hb.unwrap()),
                    };
                    (
                        BLayout::Packed,
                        Loc {
                            base: Base::Weights,
                            offset: 0,
                        },
                    )
                };
                let out_at = arena.len().div_ceil(64) * 64;
                arena.resize(out_at + m * n * 4, 0);
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    elem,
                    blocking,
                    a: a_layout,
                    b: b_layout,
                    out_row: (n * 4) as i64,
                    alpha: 1.0,
                    c: None,
                    act: Activation::None,
                    calls: vec![Call {
                        a: a_loc,
                        b: b_loc,
                        out: Loc {
                            base: Base::Arena,
                            offset: out_at as u64,
                        },
                        c: None,
                        src: None,
                    }],
                    im2col: Vec::new(),
                    b_panel: None,
                    im2col_into_a: false,
                    u8_zero: None,
                    row_sums: None,
                    to_f32: false,
                    store: crate::microkernel::Store::F32,
                    epilogue: Vec::new(),
                };
                let code = spec.assemble().unwrap();
                assert_eq!(
                    super::super::exec::call_kernel(&code, &mut arena, &weights),
                    0
                );
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|kk| av[i * k + kk] as f64 * bv[kk * n + j] as f64);
                        let abs: f64 = terms.clone().map(f64::abs).sum();
                        let want: f64 = terms.sum();
                        let at = out_at + (i * n + j) * 4;
                        let got = f32::from_le_bytes(arena[at..at + 4].try_into().unwrap()) as f64;
                        // f32 accumulation: a few ulps of the sum of |terms|.
                        assert!(
                            (got - want).abs() <= 1e-6 * k as f64 * abs.max(1e-30) + 1e-30,
                            "{elem:?} {m}x{k}x{n} [{i},{j}]: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The int8 VNNI kernel against exact integer arithmetic, over shapes
    /// with K tails (not a multiple of 4), partial column vectors and row
    /// tails, with and without A's zero point.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn int8_dot_kernel_is_exact() {
        if !(std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512bw"))
        {
            eprintln!("no AVX512-VNNI/BW on this host: the generated code cannot run here");
            return;
        }
        let byte = |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 251) as u8;
        for (m, k, n) in [
            (19, 7, 37),
            (5, 64, 16),
            (14, 33, 100),
            (1, 1, 3),
            (128, 384, 96),
        ] {
            for zero in [None, Some(131u8)] {
                let av: Vec<u8> = (0..m * k).map(|i| byte(i, 1)).collect();
                let bv: Vec<i8> = (0..k * n).map(|i| byte(i, 2) as i8).collect();
                let blocking = Blocking::choose(m, n, MAX_MR);
                let mut weights = pack_b_quads(&bv, k, n, n, 1, blocking.nr());
                let c_at = weights.len() as u64;
                let mut sums = vec![0i32; n.div_ceil(blocking.nr()) * blocking.nr()];
                for kk in 0..k {
                    for j in 0..n {
                        sums[j] += i32::from(bv[kk * n + j]);
                    }
                }
                weights.extend(sums.iter().flat_map(|v| v.to_le_bytes()));
                // Arena: A, then the zero point, then the output.
                let mut arena = av.clone();
                let zero_at = arena.len() as u64;
                arena.push(zero.unwrap_or(0));
                let out_at = arena.len().div_ceil(64) * 64;
                arena.resize(out_at + m * n * 4, 0);
                let arena_loc = |offset: u64| Loc {
                    base: Base::Arena,
                    offset,
                };
                let spec = GemmSpec {
                    m,
                    n,
                    k,
                    elem: Elem::U8I8Dot,
                    blocking,
                    a: ALayout::Strided {
                        row: k as i64,
                        col: 1,
                    },
                    b: BLayout::Packed,
                    out_row: (n * 4) as i64,
                    alpha: 1.0,
                    c: zero.map(|_| CLayout {
                        row: 0,
                        per_column: true,
                        beta: 1.0,
                    }),
                    act: Activation::None,
                    calls: vec![Call {
                        a: arena_loc(0),
                        b: Loc {
                            base: Base::Weights,
                            offset: 0,
                        },
                        out: arena_loc(out_at as u64),
                        c: zero.map(|_| Loc {
                            base: Base::Weights,
                            offset: c_at,
                        }),
                        src: None,
                    }],
                    im2col: Vec::new(),
                    b_panel: None,
                    im2col_into_a: false,
                    u8_zero: zero.map(|_| arena_loc(zero_at)),
                    row_sums: None,
                    to_f32: false,
                    store: crate::microkernel::Store::F32,
                    epilogue: Vec::new(),
                };
                let code = spec.assemble().unwrap();
                assert_eq!(
                    super::super::exec::call_kernel(&code, &mut arena, &weights),
                    0
                );
                let z = i32::from(zero.unwrap_or(0));
                for i in 0..m {
                    for j in 0..n {
                        let want: i32 = (0..k)
                            .map(|kk| (i32::from(av[i * k + kk]) - z) * i32::from(bv[kk * n + j]))
                            .sum();
                        let at = out_at + (i * n + j) * 4;
                        let got = i32::from_le_bytes(arena[at..at + 4].try_into().unwrap());
                        assert_eq!(got, want, "{m}x{k}x{n} zero {zero:?} [{i},{j}]");
                    }
                }
            }
        }
    }
}
