//! AVX-512 max or min of a whole f32 tensor to one value (the range
//! observers of dynamic int8 quantization reduce every activation this
//! way): four accumulators of 16 lanes, a tail loaded over the identity
//! value, then the lanes reduced. A NaN anywhere makes the result NaN,
//! as in the reference evaluator: `vmaxps` alone would drop it, so
//! unordered lanes are collected in `k3` on the way.

use iced_x86::code_asm::*;

use super::softmax::horizontal;
use super::{imm32, load_address, MicrokernelError};
use crate::plan::Loc;

/// Which extreme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Extreme {
    Max,
    Min,
}

/// One whole-tensor max or min.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ExtremeSpec {
    pub extreme: Extreme,
    /// Elements (at least one).
    pub len: usize,
    /// The contiguous f32 input.
    pub x: Loc,
    /// The one f32 output.
    pub y: Loc,
}

const X: AsmRegister64 = r8;
const COUNT: AsmRegister64 = rcx;
const ACC: [AsmRegisterZmm; 4] = [zmm0, zmm1, zmm5, zmm6];
const IDENTITY: AsmRegisterZmm = zmm7;
const LOADED: [AsmRegisterZmm; 4] = [zmm8, zmm9, zmm10, zmm11];

/// Emits a loop of `count` iterations (at least one; COUNT counts them):
/// `body`, then `ptr` advanced by `stride` bytes.
fn counted_loop(
    a: &mut CodeAssembler,
    count: usize,
    ptr: AsmRegister64,
    stride: i32,
    body: impl FnOnce(&mut CodeAssembler) -> Result<(), MicrokernelError>,
) -> Result<(), MicrokernelError> {
    let mut top = a.create_label();
    a.mov(COUNT, count as u64)?;
    a.set_label(&mut top)?;
    body(a)?;
    a.add(ptr, stride)?;
    a.dec(COUNT)?;
    a.jnz(top)?;
    Ok(())
}

impl ExtremeSpec {
    fn combine(
        &self,
        a: &mut CodeAssembler,
        acc: AsmRegisterZmm,
        x: AsmRegisterZmm,
    ) -> Result<(), MicrokernelError> {
        // Unordered lanes (NaN) of x join k3.
        a.vcmpps(k2, x, x, 3)?;
        a.korw(k3, k3, k2)?;
        match self.extreme {
            Extreme::Max => a.vmaxps(acc, acc, x)?,
            Extreme::Min => a.vminps(acc, acc, x)?,
        }
        Ok(())
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        assert!(self.len > 0, "an empty reduction has no extreme");
        let mut a = CodeAssembler::new(64)?;
        let identity = match self.extreme {
            Extreme::Max => f32::NEG_INFINITY,
            Extreme::Min => f32::INFINITY,
        };
        a.mov(eax, identity.to_bits())?;
        a.vpbroadcastd(IDENTITY, eax)?;
        for acc in ACC {
            a.vmovaps(acc, IDENTITY)?;
        }
        a.kxorw(k3, k3, k3)?;
        load_address(&mut a, X, self.x)?;
        let (blocks, vectors, tail) = (self.len / 64, (self.len % 64) / 16, self.len % 16);
        if blocks > 0 {
            counted_loop(&mut a, blocks, X, 256, |a| {
                for (v, (&acc, &x)) in ACC.iter().zip(&LOADED).enumerate() {
                    a.vmovups(x, zmmword_ptr(X + 64 * v as i32))?;
                    self.combine(a, acc, x)?;
                }
                Ok(())
            })?;
        }
        for v in 0..vectors {
            a.vmovups(LOADED[v], zmmword_ptr(X + 64 * v as i32))?;
            self.combine(&mut a, ACC[v], LOADED[v])?;
        }
        if tail > 0 {
            a.mov(eax, (1u32 << tail) - 1)?;
            a.kmovw(k1, eax)?;
            let x = LOADED[0];
            a.vmovaps(x, IDENTITY)?;
            a.vmovups(x.k1(), zmmword_ptr(X + 64 * vectors as i32))?;
            self.combine(&mut a, ACC[0], x)?;
        }
        let op = |a: &mut CodeAssembler, x: AsmRegisterZmm, y: AsmRegisterZmm| match self.extreme {
            Extreme::Max => a.vmaxps(x, x, y),
            Extreme::Min => a.vminps(x, x, y),
        };
        op(&mut a, ACC[0], ACC[1])?;
        op(&mut a, ACC[2], ACC[3])?;
        op(&mut a, ACC[0], ACC[2])?;
        horizontal(&mut a, |a, x, y| match self.extreme {
            Extreme::Max => a.vmaxps(x, x, y),
            Extreme::Min => a.vminps(x, x, y),
        })?;
        let mut store = a.create_label();
        a.kortestw(k3, k3)?;
        a.jz(store)?;
        a.mov(eax, f32::NAN.to_bits())?;
        a.vmovd(xmm0, eax)?;
        a.set_label(&mut store)?;
        load_address(&mut a, X, self.y)?;
        a.vmovss(dword_ptr(X), xmm0)?;
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}

/// What a [`RowFoldSpec`] accumulates per element and how it finishes a
/// row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowFold {
    /// `Σ x`.
    Sum,
    /// `Σ x / len`.
    Mean,
    /// `Σ x²`.
    SumSquare,
    /// `Σ |x|`.
    L1,
    /// `√(Σ x²)`.
    L2,
}

/// Sums (or sums of squares, of magnitudes) of `rows` contiguous runs of
/// `len` f32, one f32 result per run: a global average pool, a ReduceMean
/// or ReduceSum over trailing axes (a squeeze-excite block's spatial
/// mean). Each run is widened to f64 as it is loaded (`vcvtps2pd`) and
/// summed in four accumulators of 8 lanes, then the lanes; the result is
/// rounded to f32 once, as the reference evaluator's f64 fold rounds it
/// (the sum's order differs: 32 partial sums, not one running sum). A
/// widening load issues as fast as a plain one, so f64 costs nothing over
/// f32 accumulation here, where the loads bound the loop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowFoldSpec {
    pub fold: RowFold,
    /// Runs (at least one).
    pub rows: usize,
    /// Elements per run (at least one).
    pub len: usize,
    /// The first run; the others follow it.
    pub x: Loc,
    /// `rows` consecutive f32 results.
    pub y: Loc,
}

const Y: AsmRegister64 = r9;
const ROWS: AsmRegister64 = rdx;
const WIDE: [AsmRegisterZmm; 4] = [zmm0, zmm1, zmm2, zmm3];
const WIDENED: [AsmRegisterZmm; 4] = [zmm4, zmm5, zmm6, zmm7];
const ABS_MASK: AsmRegisterZmm = zmm8;
const DIVISOR: AsmRegisterZmm = zmm9;
const DIVISOR_LOW: AsmRegisterXmm = xmm9;

/// Sets `mask` to the low `tail` lanes (nothing when `tail` is 0).
fn set_tail_mask(
    a: &mut CodeAssembler,
    mask: AsmRegisterK,
    tail: usize,
) -> Result<(), MicrokernelError> {
    if tail > 0 {
        a.mov(eax, (1u32 << tail) - 1)?;
        a.kmovw(mask, eax)?;
    }
    Ok(())
}

/// The f64 sum of `f(x)` over the `len` f32 at X into xmm0, X left past
/// them: blocks of 32 elements (8 per accumulator of [`WIDE`]), whole
/// vectors of 8, then a tail masked by k1 ([`set_tail_mask`] of `len %
/// 8`) that reads nothing past the run. `add(a, acc, x, masked)` adds
/// `f(x)` of the widened `x` to `acc`; `masked` marks the tail, whose
/// lanes past the run hold 0. Clobbers zmm0–zmm7.
fn widened_sum(
    a: &mut CodeAssembler,
    len: usize,
    add: impl Fn(
        &mut CodeAssembler,
        AsmRegisterZmm,
        AsmRegisterZmm,
        bool,
    ) -> Result<(), MicrokernelError>,
) -> Result<(), MicrokernelError> {
    let (blocks, vectors, tail) = (len / 32, (len % 32) / 8, len % 8);
    for acc in WIDE {
        a.vxorpd(acc, acc, acc)?;
    }
    if blocks > 0 {
        counted_loop(a, blocks, X, 128, |a| {
            for (v, (&acc, &x)) in WIDE.iter().zip(&WIDENED).enumerate() {
                a.vcvtps2pd(x, ymmword_ptr(X + 32 * v as i32))?;
                add(a, acc, x, false)?;
            }
            Ok(())
        })?;
    }
    for v in 0..vectors {
        a.vcvtps2pd(WIDENED[v], ymmword_ptr(X + 32 * v as i32))?;
        add(a, WIDE[v], WIDENED[v], false)?;
    }
    if tail > 0 {
        let x = WIDENED[vectors % 4];
        a.vcvtps2pd(x.k1().z(), ymmword_ptr(X + 32 * vectors as i32))?;
        add(a, WIDE[vectors % 4], x, true)?;
    }
    let rest = 32 * vectors + 4 * tail;
    if rest > 0 {
        a.add(X, rest as i32)?;
    }
    a.vaddpd(zmm0, zmm0, zmm1)?;
    a.vaddpd(zmm2, zmm2, zmm3)?;
    a.vaddpd(zmm0, zmm0, zmm2)?;
    a.vextractf64x4(ymm1, zmm0, 1)?;
    a.vaddpd(ymm0, ymm0, ymm1)?;
    a.vextractf128(xmm1, ymm0, 1)?;
    a.vaddpd(xmm0, xmm0, xmm1)?;
    a.vunpckhpd(xmm1, xmm0, xmm0)?;
    a.vaddsd(xmm0, xmm0, xmm1)?;
    Ok(())
}

impl RowFold {
    /// `acc += f(x)` for the fold's per-element `f`.
    fn accumulate(
        self,
        a: &mut CodeAssembler,
        acc: AsmRegisterZmm,
        x: AsmRegisterZmm,
    ) -> Result<(), MicrokernelError> {
        match self {
            RowFold::Sum | RowFold::Mean => a.vaddpd(acc, acc, x)?,
            RowFold::SumSquare | RowFold::L2 => a.vfmadd231pd(acc, x, x)?,
            RowFold::L1 => {
                a.vpandq(x, x, ABS_MASK)?;
                a.vaddpd(acc, acc, x)?;
            }
        }
        Ok(())
    }

    /// The constants the fold reads, for runs of `len`: the magnitude mask
    /// of L1 in [`ABS_MASK`], the divisor of Mean in every lane of
    /// [`DIVISOR`].
    fn load_constants(self, a: &mut CodeAssembler, len: usize) -> Result<(), MicrokernelError> {
        match self {
            RowFold::L1 => {
                a.mov(rax, 0x7fff_ffff_ffff_ffff_u64)?;
                a.vpbroadcastq(ABS_MASK, rax)?;
            }
            RowFold::Mean => {
                a.mov(rax, (len as f64).to_bits())?;
                a.vpbroadcastq(DIVISOR, rax)?;
            }
            RowFold::Sum | RowFold::SumSquare | RowFold::L2 => {}
        }
        Ok(())
    }
}

impl RowFoldSpec {
    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        assert!(self.rows > 0 && self.len > 0, "a row fold needs elements");
        let mut a = CodeAssembler::new(64)?;
        self.fold.load_constants(&mut a, self.len)?;
        load_address(&mut a, X, self.x)?;
        load_address(&mut a, Y, self.y)?;
        a.mov(ROWS, self.rows as u64)?;
        set_tail_mask(&mut a, k1, self.len % 8)?;
        let mut row = a.create_label();
        a.set_label(&mut row)?;
        widened_sum(&mut a, self.len, |a, acc, x, _| {
            self.fold.accumulate(a, acc, x)
        })?;
        match self.fold {
            RowFold::Mean => a.vdivsd(xmm0, xmm0, DIVISOR_LOW)?,
            RowFold::L2 => a.vsqrtsd(xmm0, xmm0, xmm0)?,
            RowFold::Sum | RowFold::SumSquare | RowFold::L1 => {}
        }
        a.vcvtsd2ss(xmm0, xmm0, xmm0)?;
        a.vmovss(dword_ptr(Y), xmm0)?;
        a.add(Y, 4)?;
        a.dec(ROWS)?;
        a.jnz(row)?;
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}

/// A [`RowFold`] over the middle axis of `[outer, len, inner]` f32: one
/// result per `(outer, inner)` pair, `[outer, inner]` (a sequence's mean
/// over its tokens, `[batch, tokens, hidden]` → `[batch, hidden]`). The
/// inner elements lie along the vectors: per chunk of 32 of them, four
/// 8-lane f64 accumulators (widened as loaded, as [`RowFoldSpec`] does)
/// walk the `len` rows, then finish lane by lane and store 32 f32; the
/// last chunk is masked, so nothing outside the tensor is read or written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ColumnFoldSpec {
    pub fold: RowFold,
    /// Outer blocks (at least one).
    pub outer: usize,
    /// Rows folded per result (at least one).
    pub len: usize,
    /// Results per outer block (at least one).
    pub inner: usize,
    pub x: Loc,
    pub y: Loc,
}

/// Columns per chunk: four vectors of eight f64 lanes.
const CHUNK: usize = 32;

const ROW: AsmRegister64 = r10;
const CHUNKS: AsmRegister64 = r11;

impl ColumnFoldSpec {
    /// One chunk of `vectors` vectors at X (the last masked by k1 when
    /// `masked`), results to Y.
    fn chunk(
        &self,
        a: &mut CodeAssembler,
        vectors: usize,
        masked: bool,
    ) -> Result<(), MicrokernelError> {
        let fold = self.fold;
        let last = |v: usize| masked && v + 1 == vectors;
        for acc in &WIDE[..vectors] {
            a.vxorpd(*acc, *acc, *acc)?;
        }
        a.mov(ROW, X)?;
        let stride = imm32((self.inner * 4) as i64, "row stride")?;
        counted_loop(a, self.len, ROW, stride, |a| {
            for v in 0..vectors {
                let at = ymmword_ptr(ROW + 32 * v as i32);
                match last(v) {
                    true => a.vcvtps2pd(WIDENED[v].k1().z(), at)?,
                    false => a.vcvtps2pd(WIDENED[v], at)?,
                }
                fold.accumulate(a, WIDE[v], WIDENED[v])?;
            }
            Ok(())
        })?;
        for v in 0..vectors {
            let acc = WIDE[v];
            match self.fold {
                RowFold::Mean => a.vdivpd(acc, acc, DIVISOR)?,
                RowFold::L2 => a.vsqrtpd(acc, acc)?,
                RowFold::Sum | RowFold::SumSquare | RowFold::L1 => {}
            }
            let narrow = [ymm0, ymm1, ymm2, ymm3][v];
            a.vcvtpd2ps(narrow, acc)?;
            let at = ymmword_ptr(Y + 32 * v as i32);
            match last(v) {
                true => a.vmovups(at.k1(), narrow)?,
                false => a.vmovups(at, narrow)?,
            }
        }
        Ok(())
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        assert!(
            self.outer > 0 && self.len > 0 && self.inner > 0,
            "a column fold needs elements"
        );
        let mut a = CodeAssembler::new(64)?;
        self.fold.load_constants(&mut a, self.len)?;
        let (chunks, rest) = (self.inner / CHUNK, self.inner % CHUNK);
        set_tail_mask(&mut a, k1, rest % 8)?;
        load_address(&mut a, X, self.x)?;
        load_address(&mut a, Y, self.y)?;
        a.mov(ROWS, self.outer as u64)?;
        let block = (self.len * self.inner * 4) as i64;
        let mut outer = a.create_label();
        a.set_label(&mut outer)?;
        if chunks > 0 {
            let mut next = a.create_label();
            a.mov(CHUNKS, chunks as u64)?;
            a.set_label(&mut next)?;
            self.chunk(&mut a, 4, false)?;
            a.add(X, (CHUNK * 4) as i32)?;
            a.add(Y, (CHUNK * 4) as i32)?;
            a.dec(CHUNKS)?;
            a.jnz(next)?;
        }
        if rest > 0 {
            self.chunk(&mut a, rest.div_ceil(8), rest % 8 > 0)?;
        }
        // X and Y moved by the whole chunks: on to the next outer block.
        let done = (chunks * CHUNK * 4) as i64;
        a.add(X, imm32(block - done, "outer stride")?)?;
        a.add(Y, imm32((self.inner * 4) as i64 - done, "output stride")?)?;
        a.dec(ROWS)?;
        a.jnz(outer)?;
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}

/// Layer normalization of `rows` contiguous rows of `size` f32:
/// `(x − mean) · (var + ε)^-½ · scale + bias`, `scale` and `bias` of
/// `size` elements each. Per row three passes: the sum and the sum of
/// squared deviations in f64 ([`widened_sum`], as [`RowFoldSpec`]), then
/// the normalization in f32 vectors of 16, the last masked.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LayerNormSpec {
    /// Rows (at least one).
    pub rows: usize,
    /// Elements per row (at least one).
    pub size: usize,
    pub epsilon: f32,
    pub x: Loc,
    pub y: Loc,
    pub scale: Loc,
    pub bias: Option<Loc>,
}

const SCALE: AsmRegister64 = r11;
const BIAS: AsmRegister64 = rsi;
const OFFSET: AsmRegister64 = rax;
const MEAN64: AsmRegisterZmm = zmm11;
const MEAN: AsmRegisterZmm = zmm12;
const INV_STD: AsmRegisterZmm = zmm13;
const LANES: AsmRegisterZmm = zmm14;

impl LayerNormSpec {
    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        assert!(
            self.rows > 0 && self.size > 0,
            "a layer norm needs elements"
        );
        let mut a = CodeAssembler::new(64)?;
        let n = self.size as f64;
        a.mov(rax, n.to_bits())?;
        a.vmovq(DIVISOR_LOW, rax)?;
        set_tail_mask(&mut a, k1, self.size % 8)?;
        set_tail_mask(&mut a, k2, self.size % 16)?;
        load_address(&mut a, ROW, self.x)?;
        load_address(&mut a, Y, self.y)?;
        load_address(&mut a, SCALE, self.scale)?;
        // Last: BIAS is rsi, the weights' base.
        if let Some(bias) = self.bias {
            load_address(&mut a, BIAS, bias)?;
        }
        a.mov(ROWS, self.rows as u64)?;
        let mut row = a.create_label();
        a.set_label(&mut row)?;
        // The mean, in f64 and as f32 lanes.
        a.mov(X, ROW)?;
        widened_sum(&mut a, self.size, |a, acc, x, _| Ok(a.vaddpd(acc, acc, x)?))?;
        a.vdivsd(xmm0, xmm0, DIVISOR_LOW)?;
        a.vbroadcastsd(MEAN64, xmm0)?;
        a.vcvtsd2ss(xmm0, xmm0, xmm0)?;
        a.vbroadcastss(MEAN, xmm0)?;
        // The variance: Σ (x − mean)², the tail's lanes past the row kept 0.
        a.mov(X, ROW)?;
        widened_sum(&mut a, self.size, |a, acc, x, masked| {
            match masked {
                true => a.vsubpd(x.k1().z(), x, MEAN64)?,
                false => a.vsubpd(x, x, MEAN64)?,
            }
            Ok(a.vfmadd231pd(acc, x, x)?)
        })?;
        a.vdivsd(xmm0, xmm0, DIVISOR_LOW)?;
        a.mov(rax, f64::from(self.epsilon).to_bits())?;
        a.vmovq(xmm1, rax)?;
        a.vaddsd(xmm0, xmm0, xmm1)?;
        a.vsqrtsd(xmm0, xmm0, xmm0)?;
        a.mov(rax, 1.0f64.to_bits())?;
        a.vmovq(xmm1, rax)?;
        a.vdivsd(xmm0, xmm1, xmm0)?;
        a.vcvtsd2ss(xmm0, xmm0, xmm0)?;
        a.vbroadcastss(INV_STD, xmm0)?;
        // The normalized row.
        let (vectors, tail) = (self.size / 16, self.size % 16);
        let normalize = |a: &mut CodeAssembler, masked: bool| -> Result<(), MicrokernelError> {
            let at = |base: AsmRegister64| zmmword_ptr(base + OFFSET);
            match masked {
                true => a.vmovups(LANES.k2().z(), at(ROW))?,
                false => a.vmovups(LANES, at(ROW))?,
            }
            a.vsubps(LANES, LANES, MEAN)?;
            a.vmulps(LANES, LANES, INV_STD)?;
            match masked {
                true => a.vmulps(LANES.k2().z(), LANES, at(SCALE))?,
                false => a.vmulps(LANES, LANES, at(SCALE))?,
            }
            if self.bias.is_some() {
                match masked {
                    true => a.vaddps(LANES.k2().z(), LANES, at(BIAS))?,
                    false => a.vaddps(LANES, LANES, at(BIAS))?,
                }
            }
            match masked {
                true => a.vmovups(at(Y).k2(), LANES)?,
                false => a.vmovups(at(Y), LANES)?,
            }
            Ok(())
        };
        a.xor(OFFSET, OFFSET)?;
        if vectors > 0 {
            counted_loop(&mut a, vectors, OFFSET, 64, |a| normalize(a, false))?;
        }
        if tail > 0 {
            normalize(&mut a, true)?;
        }
        let row_bytes = imm32((self.size * 4) as i64, "row stride")?;
        a.add(ROW, row_bytes)?;
        a.add(Y, row_bytes)?;
        a.dec(ROWS)?;
        a.jnz(row)?;
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}
