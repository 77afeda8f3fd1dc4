//! The AVX2 + FMA (`x86_64-v3`) tile of [`GemmSpec`]: the zmm kernel's
//! loops (column tiles, row tiles, K chunks, the unrolled k loop) with a
//! tile of ymm registers in VEX encoding.
//!
//! - **Registers.** 16 ymm: `mr * nv` accumulators and `nv` B vectors in
//!   ymm0–13, the A broadcast in [`ABC`], the edge mask in [`MASK`].
//! - **Edges.** AVX2 has no mask registers: the last vector of the last
//!   column tile is loaded and stored with `vmaskmovps` under [`MASK`]
//!   (lanes off are neither read nor written, so nothing outside a tensor
//!   is touched).
//! - **Store loop.** `* alpha`, `+ beta * C` and Relu or Clip; a fused
//!   program's rest runs after the kernel (`epilogue_fits` is false for
//!   ymm), and only f32 is stored. [`GemmSpec::ymm_declines`] names what
//!   else the tile does not read (16-bit and int8 operands).

use iced_x86::code_asm::*;

use crate::microkernel::ymm::{load, splat, store, BYTES, MASK, YMM};

use super::{
    imm32, Activation, Elem, GemmSpec, Geometry, MicrokernelError, Pass, Store, Vector, A_K, B_K,
    B_TILE, CONST, C_TILE, K_COUNT, OUT_TILE, PANEL,
};

/// The A broadcast (and a constant in the store loop).
const ABC: usize = 14;

/// Copies `rows` k rows of the column tile at B_TILE (`nv` vectors, the
/// last under [`MASK`] when `partial`; `row` bytes apart) into the panel
/// (`panel_row` bytes apart).
pub(super) fn pack_panel(
    a: &mut CodeAssembler,
    (row, panel_row): (i64, i64),
    nv: usize,
    partial: bool,
    rows: usize,
) -> Result<(), MicrokernelError> {
    let mut top = a.create_label();
    a.mov(A_K, B_TILE)?;
    a.mov(B_K, PANEL)?;
    a.mov(K_COUNT, rows as u64)?;
    a.set_label(&mut top)?;
    for v in 0..nv {
        let disp = imm32(BYTES * v as i64, "panel")?;
        if partial && v == nv - 1 {
            a.vmaskmovps(ymm0, MASK, ymmword_ptr(A_K + disp))?;
        } else {
            a.vmovups(ymm0, ymmword_ptr(A_K + disp))?;
        }
        a.vmovups(ymmword_ptr(B_K + disp), ymm0)?;
    }
    a.add(A_K, imm32(row, "B row stride")?)?;
    a.add(B_K, imm32(panel_row, "panel row")?)?;
    a.dec(K_COUNT)?;
    a.jnz(top)?;
    Ok(())
}

impl GemmSpec {
    /// Why the ymm tile cannot run this spec, `None` when it can (see the
    /// module doc); always `None` for zmm.
    pub(crate) fn ymm_declines(&self) -> Option<String> {
        if self.blocking.vector != Vector::Ymm {
            return None;
        }
        let why = if self.elem != Elem::F32 {
            format!(
                "the operands are {:?}; the AVX2 kernel reads f32",
                self.elem
            )
        } else if !self.epilogue.is_empty() {
            "the AVX2 store loop runs no epilogue program".into()
        } else if self.store != Store::F32 {
            "the AVX2 store loop writes f32 only".into()
        } else {
            return None;
        };
        Some(why)
    }

    /// One `rows × nv` ymm tile at A_TILE / B_TILE / OUT_TILE / C_TILE,
    /// its last vector under [`MASK`] when `partial`.
    pub(super) fn ymm_tile(
        &self,
        a: &mut CodeAssembler,
        g: &Geometry,
        (rows, nv): (usize, usize),
        partial: bool,
        pass: Pass,
    ) -> Result<(), MicrokernelError> {
        let acc = |r: usize, v: usize| YMM[r * nv + v];
        let edge = |v: usize| partial && v == nv - 1;
        let out_at = |r: usize, v: usize| -> Result<AsmMemoryOperand, MicrokernelError> {
            let disp = imm32(
                self.out_row * r as i64 + BYTES * v as i64,
                "output displacement",
            )?;
            Ok(OUT_TILE + disp)
        };
        for r in 0..rows {
            for v in 0..nv {
                let x = acc(r, v);
                if pass.resume {
                    load(a, x, out_at(r, v)?, edge(v))?;
                } else {
                    a.vxorps(x, x, x)?;
                }
            }
        }
        self.prefetch_next_output(a, rows, nv)?;
        let a_row = g.a_row;
        let step = |a: &mut CodeAssembler, ak: i64, bk: i64, _odd: bool| {
            for v in 0..nv {
                let disp = imm32(bk + BYTES * v as i64, "B displacement")?;
                load(a, YMM[rows * nv + v], B_K + disp, edge(v))?;
            }
            for r in 0..rows {
                let disp = imm32(ak + a_row * r as i64, "A displacement")?;
                a.vbroadcastss(YMM[ABC], dword_ptr(A_K + disp))?;
                for v in 0..nv {
                    a.vfmadd231ps(acc(r, v), YMM[ABC], YMM[rows * nv + v])?;
                }
            }
            Ok(())
        };
        self.k_loop(a, g, pass, &step)?;
        if !pass.finish {
            for r in 0..rows {
                for v in 0..nv {
                    store(a, out_at(r, v)?, acc(r, v), edge(v))?;
                }
            }
            return Ok(());
        }
        // Free in the store loop: the B registers and the broadcast.
        let (cval, konst) = (YMM[rows * nv], ABC);
        for r in 0..rows {
            for v in 0..nv {
                let x = acc(r, v);
                if self.alpha != 1.0 {
                    splat(a, konst, self.alpha, CONST)?;
                    a.vmulps(x, x, YMM[konst])?;
                }
                if let Some(c) = self.c {
                    let column = if c.per_column { BYTES * v as i64 } else { 0 };
                    let at = C_TILE + imm32(c.row * r as i64 + column, "C displacement")?;
                    if c.per_column {
                        load(a, cval, at, edge(v))?;
                    } else {
                        a.vbroadcastss(cval, dword_ptr(at))?;
                    }
                    if c.beta == 1.0 {
                        a.vaddps(x, x, cval)?;
                    } else {
                        splat(a, konst, c.beta, CONST)?;
                        a.vfmadd231ps(x, cval, YMM[konst])?;
                    }
                }
                match self.act {
                    Activation::None => {}
                    Activation::Relu => {
                        a.vxorps(YMM[konst], YMM[konst], YMM[konst])?;
                        a.vmaxps(x, x, YMM[konst])?;
                    }
                    Activation::Clip { lo, hi } => {
                        splat(a, konst, lo, CONST)?;
                        a.vmaxps(x, x, YMM[konst])?;
                        splat(a, konst, hi, CONST)?;
                        a.vminps(x, x, YMM[konst])?;
                    }
                }
                store(a, out_at(r, v)?, x, edge(v))?;
            }
        }
        Ok(())
    }
}
