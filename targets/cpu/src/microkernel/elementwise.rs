//! AVX-512 and AVX2 elementwise kernels: a fused node without a dense head
//! (a chain of `+ − × ÷`, max/min and the activations made of them, as
//! [`EpilogueStep`]s) over `rows × cols` contiguous f32 elements, 16 (zmm)
//! or 8 (ymm) lanes at a time with a masked tail per row.
//!
//! The program is the same one GEMM store loops run ([`run_epilogue`]):
//! slot 0 is the first input's vector, other inputs are full-size tensors
//! ([`Operand::Full`]), one value per column ([`Operand::PerColumn`], a
//! bias along the last axis), one value per row (a per-channel operand,
//! the rows being channels) or one value. Replaces the Cranelift `f32x4` loop for
//! these chains (a quarter of the lanes).

use iced_x86::code_asm::*;

use super::epilogue::{allocate_slots, run_epilogue, EpilogueStep, FullAccess, Operand};
use super::Vector;
use super::{base_register, imm32, ymm, MicrokernelError, Store};
use crate::plan::Loc;

/// One elementwise kernel.
#[derive(Clone, Debug)]
pub(crate) struct ElementwiseSpec {
    /// Rows (per-row operands advance one value per row).
    pub rows: usize,
    /// Per-row operands hold this many values and wrap around after the
    /// last (a per-channel operand of a batch: rows are batch × channel).
    pub row_period: usize,
    /// The index into the per-row operands of the first row (a part of a
    /// split kernel starts inside a period).
    pub first_row: usize,
    /// Contiguous elements per row.
    pub cols: usize,
    /// The first input (slot 0 of the program), `rows × cols` f32.
    pub input: Loc,
    /// The program; its result is stored.
    pub steps: Vec<EpilogueStep>,
    /// The output, `rows × cols` elements stored as `store` says.
    pub out: Loc,
    /// How the result is stored (u8: see [`ElementwiseSpec::narrowed`];
    /// zmm only).
    pub store: Store,
    /// The registers.
    pub vector: Vector,
}

/// The element byte offset, the per-row byte offset, the byte offset
/// within the row and the counters.
const ELEM: AsmRegister64 = rax;
const ROW: AsmRegister64 = rdx;
const COL: AsmRegister64 = r9;
const ROWS: AsmRegister64 = rcx;
const VECS: AsmRegister64 = r8;
/// The byte offset of the element in a u8 output.
const OUT_BYTE: AsmRegister64 = r10;

/// The ymm registers the program's slots live in: ymm13 and ymm14 are
/// the temporaries of [`ymm::run_epilogue`], ymm15 its mask.
const YMM_SLOTS: usize = 13;

/// Registers the program's slots live in.
const REGS: [AsmRegisterZmm; 30] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14,
    zmm15, zmm16, zmm17, zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27,
    zmm28, zmm29,
];

impl ElementwiseSpec {
    /// The kernel storing u8 ([`Store::U8`], `zero` an f32 0 in the
    /// weights) into the output that starts at `out` (this part's output
    /// offset, computed for f32 elements, scaled to bytes).
    pub(crate) fn narrowed(mut self, out: Loc, zero: Loc) -> ElementwiseSpec {
        self.store = Store::U8 { zero };
        self.out = self.store.narrow(out, self.out);
        self
    }

    /// Whether the program's live values fit `vector`'s registers.
    pub(crate) fn fits(steps: &[EpilogueStep], vector: Vector) -> bool {
        allocate_slots(steps, slots(vector)).is_some()
    }

    /// The kernel as up to `tasks` kernels over consecutive rows, or over
    /// consecutive 16-element-aligned ranges of a single row.
    pub(crate) fn split(&self, tasks: usize) -> Vec<ElementwiseSpec> {
        let tasks = tasks.max(1);
        if self.rows >= tasks {
            return (0..tasks)
                .map(|t| {
                    let (first, end) = (self.rows * t / tasks, self.rows * (t + 1) / tasks);
                    let elems = first * self.cols * 4;
                    self.part(end - first, self.cols, elems, first)
                })
                .collect();
        }
        if self.rows != 1 {
            return vec![self.clone()];
        }
        let lanes = self.vector.lanes();
        let vectors = self.cols.div_ceil(lanes);
        let tasks = tasks.min(vectors);
        (0..tasks)
            .map(|t| {
                let first = (vectors * t / tasks) * lanes;
                let end = ((vectors * (t + 1) / tasks) * lanes).min(self.cols);
                self.part(1, end - first, first * 4, 0)
            })
            .collect()
    }

    /// The kernel over `rows × cols` starting `elem_bytes` into the
    /// full-size operands and `first_row` rows on.
    fn part(
        &self,
        rows: usize,
        cols: usize,
        elem_bytes: usize,
        first_row: usize,
    ) -> ElementwiseSpec {
        // Column ranges (one row) move per-column operands too.
        let col_bytes = if rows == 1 && self.rows == 1 {
            elem_bytes
        } else {
            0
        };
        let shift = |o: Operand| match o {
            Operand::Full(loc) => Operand::Full(loc.moved(elem_bytes as i64)),
            Operand::PerColumn(loc) => Operand::PerColumn(loc.moved(col_bytes as i64)),
            o => o,
        };
        ElementwiseSpec {
            rows,
            row_period: self.row_period,
            first_row: (self.first_row + first_row) % self.row_period,
            cols,
            input: self.input.moved(elem_bytes as i64),
            steps: (self.steps.iter())
                .map(|st| EpilogueStep {
                    op: st.op,
                    a: shift(st.a),
                    b: shift(st.b),
                })
                .collect(),
            out: self.out.moved(elem_bytes as i64),
            store: self.store,
            vector: self.vector,
        }
    }

    /// Assembles the kernel (the kernel ABI: arena in rdi, weights in rsi).
    pub(crate) fn assemble(&self) -> Result<Vec<u8>, MicrokernelError> {
        let home = allocate_slots(&self.steps, slots(self.vector))
            .ok_or_else(|| MicrokernelError::Layout("too many live values".into()))?;
        if self.vector == Vector::Ymm && self.store != Store::F32 {
            return Err(MicrokernelError::Layout(
                "the AVX2 elementwise kernel stores f32 only".into(),
            ));
        }
        let lanes = self.vector.lanes();
        let mut a = CodeAssembler::new(64)?;
        if self.rows > 0 && self.cols > 0 {
            let (vectors, tail) = (self.cols / lanes, self.cols % lanes);
            if tail > 0 {
                match self.vector {
                    Vector::Zmm => {
                        a.mov(eax, (1u32 << tail) - 1)?;
                        a.kmovw(k1, eax)?;
                    }
                    Vector::Ymm => ymm::edge_mask(&mut a, tail)?,
                }
            }
            a.xor(ELEM, ELEM)?;
            a.mov(ROW, 4 * self.first_row as u64)?;
            let narrow = self.store != Store::F32;
            if narrow {
                a.xor(OUT_BYTE, OUT_BYTE)?;
            }
            a.mov(ROWS, self.rows as u64)?;
            let mut row = a.create_label();
            a.set_label(&mut row)?;
            a.xor(COL, COL)?;
            if vectors > 0 {
                let mut top = a.create_label();
                a.mov(VECS, vectors as u64)?;
                a.set_label(&mut top)?;
                self.vector(&mut a, &home, false)?;
                a.add(ELEM, 4 * lanes as i32)?;
                if narrow {
                    a.add(OUT_BYTE, 16)?;
                }
                a.add(COL, 4 * lanes as i32)?;
                a.dec(VECS)?;
                a.jnz(top)?;
            }
            if tail > 0 {
                self.vector(&mut a, &home, true)?;
                a.add(ELEM, imm32(4 * tail as i64, "tail")?)?;
                if narrow {
                    a.add(OUT_BYTE, tail as i32)?;
                }
            }
            a.add(ROW, 4)?;
            if self.row_period < self.first_row + self.rows {
                let mut same_period = a.create_label();
                a.cmp(ROW, imm32(4 * self.row_period as i64, "row period")?)?;
                a.jne(same_period)?;
                a.xor(ROW, ROW)?;
                a.set_label(&mut same_period)?;
            }
            a.dec(ROWS)?;
            a.jnz(row)?;
            a.vzeroupper()?;
        }
        a.xor(eax, eax)?;
        a.ret()?;
        Ok(a.assemble(0)?)
    }

    /// One vector: the input loaded into slot 0, the program, the store.
    fn vector(
        &self,
        a: &mut CodeAssembler,
        home: &[usize],
        masked: bool,
    ) -> Result<(), MicrokernelError> {
        let full = FullAccess {
            offset: ELEM,
            column: COL,
            masked,
        };
        let at = base_register(self.input) + ELEM + imm32(self.input.offset as i64, "input")?;
        if self.vector == Vector::Ymm {
            let regs = &ymm::YMM[..YMM_SLOTS];
            ymm::load(a, regs[home[0]], at, masked)?;
            let temps = [ymm::YMM[YMM_SLOTS], ymm::YMM[YMM_SLOTS + 1]];
            let program = (home, regs);
            let result = ymm::run_epilogue(a, &self.steps, program, (ROW, 0), Some(full), temps)?;
            let out = base_register(self.out) + ELEM + imm32(self.out.offset as i64, "output")?;
            return ymm::store(a, out, result, masked);
        }
        let input = zmmword_ptr(at);
        let slot0 = REGS[home[0]];
        if masked {
            a.vmovups(slot0.k1().z(), input)?;
        } else {
            a.vmovups(slot0, input)?;
        }
        let result = run_epilogue(a, &self.steps, home, &REGS, (ROW, 0), Some(full))?;
        let index = match self.store {
            Store::F32 => ELEM,
            Store::U8 { .. } => OUT_BYTE,
        };
        let disp = imm32(self.out.offset as i64, "output")?;
        self.store
            .vector(a, base_register(self.out) + index + disp, result, masked)
    }
}

/// Registers the program's slots may take on `vector`.
fn slots(vector: Vector) -> usize {
    match vector {
        Vector::Zmm => REGS.len(),
        Vector::Ymm => YMM_SLOTS,
    }
}
