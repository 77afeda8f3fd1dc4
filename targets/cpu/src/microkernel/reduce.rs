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
