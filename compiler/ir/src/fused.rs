//! Fused kernels: an optional dense head (MatMul, Gemm or Conv) followed by
//! an elementwise program, computed as one kernel with no intermediate
//! tensor written (the `fuse` pass builds them).
//!
//! An integer head (`matmul_integer`, `conv_integer`) hands the program
//! its exact i32 result converted to f32 (the `cast` to f32 that follows
//! every int8 product is part of the head), so an int8 layer's rescale,
//! bias and activation run in the product's store loop.
//!
//! An [`ElementwiseProgram`] is a short SSA list of float instructions over
//! registers. Register `i < inputs` is program input `i`; register
//! `inputs + j` is the result of instruction `j`; the last instruction is
//! the result. Program inputs broadcast numpy-style to the output shape.
//!
//! The kernel's inputs are the head's inputs (when there is a head) followed
//! by the program's extra operands: with a head, program input 0 is the
//! head's result and program input `i ≥ 1` is kernel input
//! `head.inputs + i - 1`; without a head, program input `i` is kernel input
//! `i`.

use crate::infer::broadcast_shapes;
use crate::op::Conv2d;
use crate::{BinaryOp, DType, IrError, Op, Shape, UnaryOp, ValueType};

/// A register of an [`ElementwiseProgram`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reg(pub u32);

impl Reg {
    /// The register's index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One instruction of an [`ElementwiseProgram`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Instr {
    /// A unary float op.
    Unary(UnaryOp, Reg),
    /// A binary float op, operands broadcast.
    Binary(BinaryOp, Reg, Reg),
}

impl Instr {
    /// The registers the instruction reads.
    pub fn operands(&self) -> impl Iterator<Item = Reg> {
        let (a, b) = match *self {
            Instr::Unary(_, a) => (a, None),
            Instr::Binary(_, a, b) => (a, Some(b)),
        };
        std::iter::once(a).chain(b)
    }

    /// The op the instruction applies, as a standalone IR op.
    pub fn op(&self) -> Op {
        match *self {
            Instr::Unary(u, _) => Op::Unary(u),
            Instr::Binary(b, _, _) => Op::Binary(b),
        }
    }

    /// Text-format name of the instruction's op.
    pub fn name(&self) -> &'static str {
        match self {
            Instr::Unary(u, _) => u.name(),
            Instr::Binary(b, _, _) => b.name(),
        }
    }
}

/// A straight-line elementwise program (see the module docs).
///
/// **Invariant:** at least one instruction, and every operand names a
/// program input or an earlier instruction ([`ElementwiseProgram::new`]
/// checks it; the fields are private).
#[derive(Clone, Debug, PartialEq)]
pub struct ElementwiseProgram {
    inputs: usize,
    instrs: Vec<Instr>,
}

impl ElementwiseProgram {
    /// A program over `inputs` inputs; fails when `instrs` is empty or an
    /// operand refers to a register not yet defined.
    pub fn new(inputs: usize, instrs: Vec<Instr>) -> Result<ElementwiseProgram, IrError> {
        if instrs.is_empty() {
            return Err(IrError::ty(
                "fused",
                "an elementwise program needs an instruction",
            ));
        }
        for (j, instr) in instrs.iter().enumerate() {
            for r in instr.operands() {
                if r.index() >= inputs + j {
                    return Err(IrError::ty(
                        "fused",
                        format!(
                            "instruction {j} reads register {} but only {} are defined",
                            r.index(),
                            inputs + j
                        ),
                    ));
                }
            }
        }
        Ok(ElementwiseProgram { inputs, instrs })
    }

    /// Number of program inputs.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// The instructions, in order.
    pub fn instrs(&self) -> &[Instr] {
        &self.instrs
    }

    /// The register holding the result (the last instruction's).
    pub fn result(&self) -> Reg {
        Reg((self.inputs + self.instrs.len() - 1) as u32)
    }

    /// The program of instructions `split..`, when none of them reads a
    /// register defined before instruction `split - 1` other than program
    /// inputs `1..` (so the value of instruction `split - 1`, stored over
    /// program input 0, is all that the rest needs). Its input 0 is that
    /// value; its other inputs are this program's inputs `1..`.
    pub fn rest_after(&self, split: usize) -> Option<ElementwiseProgram> {
        if split == 0 || split >= self.instrs.len() {
            return None;
        }
        let carried = self.inputs + split - 1;
        let map = |r: Reg| -> Option<Reg> {
            let i = r.index();
            if i == carried {
                Some(Reg(0))
            } else if (1..self.inputs).contains(&i) {
                Some(r)
            } else if i > carried {
                Some(Reg((i - carried + self.inputs - 1) as u32))
            } else {
                None
            }
        };
        let instrs = self.instrs[split..]
            .iter()
            .map(|ins| {
                Some(match *ins {
                    Instr::Unary(u, a) => Instr::Unary(u, map(a)?),
                    Instr::Binary(b, x, y) => Instr::Binary(b, map(x)?, map(y)?),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        ElementwiseProgram::new(self.inputs, instrs).ok()
    }

    /// Evaluates the program on one element (scalar inputs), rounding every
    /// instruction's result to f32 as the unfused ops would.
    pub fn apply_f32(&self, inputs: &[f32]) -> f32 {
        let mut regs: Vec<f32> = inputs[..self.inputs].to_vec();
        for instr in &self.instrs {
            let v = match *instr {
                Instr::Unary(u, a) => u.apply(regs[a.index()] as f64),
                Instr::Binary(b, x, y) => {
                    b.apply_f64(regs[x.index()] as f64, regs[y.index()] as f64)
                }
            };
            regs.push(v as f32);
        }
        regs[self.result().index()]
    }

    /// The text form of the body: `add(x0, x1), relu(t0)` where `xi` is
    /// program input `i` and `tj` the result of instruction `j`.
    pub fn to_text(&self) -> String {
        let reg = |r: Reg| {
            if r.index() < self.inputs {
                format!("x{}", r.index())
            } else {
                format!("t{}", r.index() - self.inputs)
            }
        };
        let parts: Vec<String> = self
            .instrs
            .iter()
            .map(|ins| {
                let args: Vec<String> = ins.operands().map(reg).collect();
                let attrs = crate::text::op_attributes(&ins.op());
                let mut s = format!("{}({})", ins.name(), args.join(", "));
                if !attrs.is_empty() {
                    s.push_str(&format!(" {{{}}}", attrs.join(", ")));
                }
                s
            })
            .collect();
        parts.join(", ")
    }
}

/// The dense op heading a fused kernel.
#[derive(Clone, Debug, PartialEq)]
pub enum DenseOp {
    /// numpy MatMul.
    MatMul,
    /// ONNX Gemm.
    Gemm {
        /// Scale of the product.
        alpha: f32,
        /// Scale of C.
        beta: f32,
        /// Transpose A.
        trans_a: bool,
        /// Transpose B.
        trans_b: bool,
    },
    /// 2-D convolution.
    Conv(Conv2d),
    /// `matmul_integer`, its i32 result converted to f32.
    MatMulInteger,
    /// `conv_integer`, its i32 result converted to f32.
    ConvInteger(Conv2d),
}

impl DenseOp {
    /// Whether the head is an integer product (its inputs are 8-bit, its
    /// result converted from i32).
    pub fn is_integer(&self) -> bool {
        matches!(self, DenseOp::MatMulInteger | DenseOp::ConvInteger(_))
    }

    /// The op as a standalone IR op.
    pub fn op(&self) -> Op {
        match self {
            DenseOp::MatMul => Op::MatMul,
            DenseOp::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => Op::Gemm {
                alpha: *alpha,
                beta: *beta,
                trans_a: *trans_a,
                trans_b: *trans_b,
            },
            DenseOp::Conv(c) => Op::Conv(c.clone()),
            DenseOp::MatMulInteger => Op::MatMulInteger,
            DenseOp::ConvInteger(c) => Op::ConvInteger(c.clone()),
        }
    }

    /// The dense op of `op`, if it is one.
    pub fn from_op(op: &Op) -> Option<DenseOp> {
        Some(match op {
            Op::MatMul => DenseOp::MatMul,
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => DenseOp::Gemm {
                alpha: *alpha,
                beta: *beta,
                trans_a: *trans_a,
                trans_b: *trans_b,
            },
            Op::Conv(c) => DenseOp::Conv(c.clone()),
            Op::MatMulInteger => DenseOp::MatMulInteger,
            Op::ConvInteger(c) => DenseOp::ConvInteger(c.clone()),
            _ => return None,
        })
    }
}

/// The head of a fused kernel: a dense op reading the first `inputs`
/// kernel inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseHead {
    /// The op.
    pub op: DenseOp,
    /// How many kernel inputs it reads (2, or 3 with a bias / C; 4 for an
    /// integer product: the operands and their zero points).
    pub inputs: usize,
}

/// What a fused kernel stores per output element.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FusedStore {
    /// The program's f32 result.
    #[default]
    F32,
    /// The result cast to u8 as [`Op::Cast`] casts it (truncated toward
    /// zero, saturated to `[0, 255]`, NaN to 0): the narrowing that ends an
    /// int8 activation quantization, so the producer writes one byte per
    /// element instead of four that a separate cast re-reads.
    U8,
}

impl FusedStore {
    /// The element type stored.
    pub fn dtype(self) -> DType {
        match self {
            FusedStore::F32 => DType::F32,
            FusedStore::U8 => DType::U8,
        }
    }

    /// The store of element type `d`, when a fused kernel can store it.
    pub fn from_dtype(d: DType) -> Option<FusedStore> {
        match d {
            DType::F32 => Some(FusedStore::F32),
            DType::U8 => Some(FusedStore::U8),
            _ => None,
        }
    }
}

/// A fused kernel: optional dense head, then an elementwise program, its
/// result stored as [`FusedStore`] says.
///
/// **Invariant:** with a head, the program has at least one input (the
/// head's result) ([`FusedKernel::new`] checks it).
#[derive(Clone, Debug, PartialEq)]
pub struct FusedKernel {
    head: Option<DenseHead>,
    body: ElementwiseProgram,
    store: FusedStore,
}

impl FusedKernel {
    /// A fused kernel; fails when a head has no program input to land in.
    pub fn new(head: Option<DenseHead>, body: ElementwiseProgram) -> Result<FusedKernel, IrError> {
        if head.is_some() && body.inputs() == 0 {
            return Err(IrError::ty(
                "fused",
                "a program after a dense head takes the head's result as input 0",
            ));
        }
        Ok(FusedKernel {
            head,
            body,
            store: FusedStore::F32,
        })
    }

    /// The kernel storing its result as `store`.
    pub fn with_store(self, store: FusedStore) -> FusedKernel {
        FusedKernel { store, ..self }
    }

    /// What the kernel stores.
    pub fn store(&self) -> FusedStore {
        self.store
    }

    /// The dense head, if any.
    pub fn head(&self) -> Option<&DenseHead> {
        self.head.as_ref()
    }

    /// The elementwise program.
    pub fn body(&self) -> &ElementwiseProgram {
        &self.body
    }

    /// Number of kernel inputs.
    pub fn num_inputs(&self) -> usize {
        match &self.head {
            Some(h) => h.inputs + self.body.inputs() - 1,
            None => self.body.inputs(),
        }
    }

    /// The kernel input that program input `i` reads, or `None` for the
    /// head's result.
    pub fn kernel_input(&self, i: usize) -> Option<usize> {
        match &self.head {
            Some(_) if i == 0 => None,
            Some(h) => Some(h.inputs + i - 1),
            None => Some(i),
        }
    }

    /// A readable name: `fused[conv+add+relu]` (`+cast` when it stores u8).
    pub fn label(&self) -> String {
        let mut parts: Vec<&str> = Vec::new();
        if let Some(h) = &self.head {
            parts.push(h.op.op().name());
        }
        parts.extend(self.body.instrs().iter().map(Instr::name));
        if self.store != FusedStore::F32 {
            parts.push("cast");
        }
        format!("fused[{}]", parts.join("+"))
    }

    /// Type inference: every input f32 (but an integer head's); the
    /// head's inputs as the head op requires; every program input
    /// broadcasts to the result without enlarging it, and with a head the
    /// result has the head's shape.
    pub(crate) fn infer(&self, inputs: &[&ValueType]) -> Result<ValueType, IrError> {
        let name = "fused";
        // The head's operands are typed by the head op (integer products;
        // dense ops on bf16/f16 operands, which return f32).
        let head_inputs = self.head.as_ref().map_or(0, |h| h.inputs.min(inputs.len()));
        if let Some(t) = inputs[head_inputs..].iter().find(|t| t.dtype != DType::F32) {
            return Err(IrError::ty(
                name,
                format!("fused kernels are f32, got an input {t}"),
            ));
        }
        let mut regs: Vec<Shape> = Vec::new();
        let head_ty = match &self.head {
            Some(h) => {
                let t = crate::infer::infer(&h.op.op(), &inputs[..h.inputs])?;
                let want = if h.op.is_integer() {
                    DType::I32
                } else {
                    DType::F32
                };
                if t.dtype != want {
                    return Err(IrError::ty(
                        name,
                        format!("a fused head must give {want}, got {t}"),
                    ));
                }
                regs.push(t.shape.clone());
                Some(t)
            }
            None => None,
        };
        let extra = self.head.as_ref().map_or(0, |h| h.inputs);
        regs.extend(inputs[extra..].iter().map(|t| t.shape.clone()));
        for instr in self.body.instrs() {
            let shape = match *instr {
                Instr::Unary(_, a) => regs[a.index()].clone(),
                Instr::Binary(_, x, y) => {
                    let (a, b) = (&regs[x.index()], &regs[y.index()]);
                    broadcast_shapes(a, b).ok_or_else(|| {
                        IrError::ty(name, format!("shapes {a:?} and {b:?} do not broadcast"))
                    })?
                }
            };
            regs.push(shape);
        }
        let out = regs[self.body.result().index()].clone();
        for (i, s) in regs[..self.body.inputs()].iter().enumerate() {
            if broadcast_shapes(s, &out).as_deref() != Some(out.as_slice()) {
                return Err(IrError::ty(
                    name,
                    format!(
                        "program input {i} of shape {s:?} does not broadcast to the result {out:?}"
                    ),
                ));
            }
        }
        if let Some(t) = &head_ty {
            if t.shape != out {
                return Err(IrError::ty(
                    name,
                    format!(
                        "the program result {out:?} must have the head's shape {:?}",
                        t.shape.as_slice()
                    ),
                ));
            }
        }
        Ok(ValueType::new(self.store.dtype(), out))
    }
}
