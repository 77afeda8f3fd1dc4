//! AVX-512 cast of f32 to u8, as the reference evaluator defines it
//! (truncation toward zero, saturating, NaN to 0: [`super::store_u8`]).
//! A fused kernel ending an int8 activation quantization stores its bytes
//! itself; this kernel casts what no producer could take (a graph's u8
//! Cast).

use iced_x86::code_asm::*;

use super::{load_address, store_u8, MicrokernelError};
use crate::plan::Loc;

/// One contiguous f32 → u8 cast.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NarrowSpec {
    /// Elements.
    pub len: usize,
    /// The f32 input.
    pub x: Loc,
    /// The u8 output.
    pub y: Loc,
}

/// Elements per unrolled loop iteration.
const BLOCK: usize = 64;

const X: AsmRegister64 = r8;
const Y: AsmRegister64 = r9;
const COUNT: AsmRegister64 = rcx;
const ZERO: AsmRegisterZmm = zmm30;

impl NarrowSpec {
    /// The cast split into at most `tasks` ranges of whole blocks.
    pub(crate) fn split(self, tasks: usize) -> Vec<NarrowSpec> {
        let blocks = self.len.div_ceil(BLOCK);
        let tasks = tasks.clamp(1, blocks.max(1));
        (0..tasks)
            .map(|t| {
                let start = (blocks * t / tasks * BLOCK).min(self.len);
                let end = (blocks * (t + 1) / tasks * BLOCK).min(self.len);
                NarrowSpec {
                    len: end - start,
                    x: self.x.moved((4 * start) as i64),
                    y: self.y.moved(start as i64),
                }
            })
            .filter(|s| s.len > 0)
            .collect()
    }

    /// 16 elements at `X + 4 * at` to `Y + at` (the first `lanes` only,
    /// under k1, when fewer than 16).
    fn vector(&self, a: &mut CodeAssembler, at: i32, lanes: usize) -> Result<(), MicrokernelError> {
        let v = zmm0;
        if lanes < 16 {
            a.vmovups(v.k1().z(), zmmword_ptr(X + 4 * at))?;
        } else {
            a.vmovups(v, zmmword_ptr(X + 4 * at))?;
        }
        store_u8(a, Y + at, v, ZERO, lanes < 16)
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let mut a = CodeAssembler::new(64)?;
        a.vpxord(ZERO, ZERO, ZERO)?;
        load_address(&mut a, X, self.x)?;
        load_address(&mut a, Y, self.y)?;
        let (blocks, rest) = (self.len / BLOCK, self.len % BLOCK);
        if blocks > 0 {
            let mut top = a.create_label();
            a.mov(COUNT, blocks as u64)?;
            a.set_label(&mut top)?;
            for v in 0..BLOCK / 16 {
                self.vector(&mut a, 16 * v as i32, 16)?;
            }
            a.add(X, (4 * BLOCK) as i32)?;
            a.add(Y, BLOCK as i32)?;
            a.dec(COUNT)?;
            a.jnz(top)?;
        }
        for v in 0..rest.div_ceil(16) {
            let lanes = (rest - 16 * v).min(16);
            if lanes < 16 {
                a.mov(eax, (1u32 << lanes) - 1)?;
                a.kmovw(k1, eax)?;
            }
            self.vector(&mut a, 16 * v as i32, lanes)?;
        }
        a.vzeroupper()?;
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }
}
