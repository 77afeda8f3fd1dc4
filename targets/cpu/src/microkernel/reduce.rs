//! AVX-512 max or min of a whole f32 tensor to one value (the range
//! observers of dynamic int8 quantization reduce every activation this
//! way): four accumulators of 16 lanes, a tail loaded over the identity
//! value, then the lanes reduced. A NaN anywhere makes the result NaN,
//! as in the reference evaluator: `vmaxps` alone would drop it, so
//! unordered lanes are collected in `k3` on the way.

use iced_x86::code_asm::*;

use super::softmax::horizontal;
use super::{load_address, MicrokernelError};
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
            let mut top = a.create_label();
            a.mov(COUNT, blocks as u64)?;
            a.set_label(&mut top)?;
            for (v, (&acc, &x)) in ACC.iter().zip(&LOADED).enumerate() {
                a.vmovups(x, zmmword_ptr(X + 64 * v as i32))?;
                self.combine(&mut a, acc, x)?;
            }
            a.add(X, 256)?;
            a.dec(COUNT)?;
            a.jnz(top)?;
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
const DIVISOR: AsmRegisterXmm = xmm9;

impl RowFoldSpec {
    /// `acc += f(x)` for the fold's per-element `f`.
    fn accumulate(
        &self,
        a: &mut CodeAssembler,
        acc: AsmRegisterZmm,
        x: AsmRegisterZmm,
    ) -> Result<(), MicrokernelError> {
        match self.fold {
            RowFold::Sum | RowFold::Mean => a.vaddpd(acc, acc, x)?,
            RowFold::SumSquare | RowFold::L2 => a.vfmadd231pd(acc, x, x)?,
            RowFold::L1 => {
                a.vpandq(x, x, ABS_MASK)?;
                a.vaddpd(acc, acc, x)?;
            }
        }
        Ok(())
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        assert!(self.rows > 0 && self.len > 0, "a row fold needs elements");
        let mut a = CodeAssembler::new(64)?;
        if self.fold == RowFold::L1 {
            a.mov(rax, 0x7fff_ffff_ffff_ffff_u64)?;
            a.vpbroadcastq(ABS_MASK, rax)?;
        }
        if self.fold == RowFold::Mean {
            a.mov(rax, (self.len as f64).to_bits())?;
            a.vmovq(DIVISOR, rax)?;
        }
        load_address(&mut a, X, self.x)?;
        load_address(&mut a, Y, self.y)?;
        a.mov(ROWS, self.rows as u64)?;
        // Per run: blocks of 32 elements (8 per accumulator), then whole
        // vectors of 8, then a masked tail that reads nothing past the run.
        let (blocks, vectors, tail) = (self.len / 32, (self.len % 32) / 8, self.len % 8);
        if tail > 0 {
            a.mov(eax, (1u32 << tail) - 1)?;
            a.kmovw(k1, eax)?;
        }
        let mut row = a.create_label();
        a.set_label(&mut row)?;
        for acc in WIDE {
            a.vxorpd(acc, acc, acc)?;
        }
        if blocks > 0 {
            let mut top = a.create_label();
            a.mov(COUNT, blocks as u64)?;
            a.set_label(&mut top)?;
            for (v, (&acc, &x)) in WIDE.iter().zip(&WIDENED).enumerate() {
                a.vcvtps2pd(x, ymmword_ptr(X + 32 * v as i32))?;
                self.accumulate(&mut a, acc, x)?;
            }
            a.add(X, 128)?;
            a.dec(COUNT)?;
            a.jnz(top)?;
        }
        for v in 0..vectors {
            a.vcvtps2pd(WIDENED[v], ymmword_ptr(X + 32 * v as i32))?;
            self.accumulate(&mut a, WIDE[v], WIDENED[v])?;
        }
        if tail > 0 {
            let x = WIDENED[vectors % 4];
            a.vcvtps2pd(x.k1().z(), ymmword_ptr(X + 32 * vectors as i32))?;
            self.accumulate(&mut a, WIDE[vectors % 4], x)?;
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
        match self.fold {
            RowFold::Mean => a.vdivsd(xmm0, xmm0, DIVISOR)?,
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
