//! Dense kernels as AVX-512 microkernels ([`crate::microkernel::gemm`]):
//! MatMul, Gemm, ungrouped convolution (pointwise directly on NCHW, others
//! through im2col into arena scratch) with the constant operand packed into
//! the weights blob at compile time, and depthwise convolution.
//!
//! [`lower`] returns `None` when a node is not a shape the microkernel
//! covers (non-f32, a dynamic transposed B, grouped convolutions other than
//! depthwise with W stride 1, non-constant weights of ungrouped convs, an empty dimension, offsets beyond 32-bit
//! displacements); the node then keeps its Cranelift kernel.

use std::borrow::Cow;

use kiln_ir::{
    BinaryOp, Conv2d, DType, Data, DenseOp, ElementwiseProgram, FusedKernel, FusedStore, Graph,
    Instr, NodeId, Op, Reg, UnaryOp,
};

use super::elementwise::broadcast_strides;
use super::NodeCx;
use crate::microkernel::depthwise::{depthwise_epilogue_fits, DepthwiseSpec, RowSegment};
use crate::microkernel::elementwise::ElementwiseSpec;
use crate::microkernel::gemm::{
    epilogue_fits, pack_a, pack_a_half, pack_a_quads, pack_b, pack_b_half, pack_b_pairs,
    pack_b_quads, packed_a_rows, ALayout, Activation, BLayout, Blocking, CLayout, Call, Elem,
    EpilogueOp, EpilogueStep, GemmSpec, Half, Operand, MAX_MR,
};
use crate::microkernel::im2col::Im2col;
use crate::plan::{Base, Loc, Scratch, Weights};

/// Most arena scratch (bytes) one kernel uses: half for an im2col matrix,
/// half for a B panel.
const MAX_SCRATCH: u64 = 64 << 20;

/// Fewest full row tiles for which a strided B is packed into a scratch
/// panel per column tile (the copy costs one read of the panel).
const PANEL_MIN_ROW_TILES: usize = 4;

/// Most GEMM calls (batch entries) one kernel unrolls.
const MAX_CALLS: usize = 4096;

/// The microkernel of node `cx` as one or more independent tasks (see
/// [`partition`](super::partition); at most `tasks`), or `None` when the
/// Cranelift kernel should be used.
pub(crate) fn lower(
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
    tasks: usize,
) -> Option<Vec<Vec<u8>>> {
    lower_with(cx, weights, scratch, None, tasks).map(|(codes, _)| codes)
}

/// The part of a fused kernel's program that its head's store loop could
/// not take: the caller runs it over the head's f32 result at `src` and
/// writes the fused node's output. `src` is the output itself (the program
/// runs in place) unless the kernel stores u8 (then the head wrote f32
/// scratch).
pub(crate) struct Tail {
    pub program: ElementwiseProgram,
    pub src: Loc,
}

/// The microkernel of the head of fused node `cx` with as much of the
/// program as its store loop takes, and the rest of the program, or
/// `None` when the head has no microkernel.
pub(crate) fn lower_fused(
    cx: &NodeCx,
    k: &FusedKernel,
    weights: &mut Weights,
    scratch: &mut Scratch,
    tasks: usize,
) -> Option<(Vec<Vec<u8>>, Option<Tail>)> {
    let h = k.head()?;
    let node = super::fused::head_node(cx, &h.op);
    let hcx = super::fused::head_cx(cx, &node, h.inputs);
    lower_with(&hcx, weights, scratch, Some((cx, k)), tasks)
}

/// Where the tasks of a head write, once its store loop has taken what it
/// can of the fused program (`tail`: the rest): u8 into the output when
/// the kernel stores u8 and nothing is left, f32 scratch when something is
/// left of a u8 kernel's program, else f32 into the output.
fn head_output(
    fused: Option<(&NodeCx, &FusedKernel)>,
    tail: Option<ElementwiseProgram>,
    weights: &mut Weights,
) -> (HeadOutput, Option<ElementwiseProgram>) {
    let narrow = fused.is_some_and(|(_, k)| k.store() != FusedStore::F32);
    let output = match (narrow, &tail) {
        (false, _) => HeadOutput::InPlace,
        (true, None) => HeadOutput::Narrow {
            zero: f32_zero(weights),
        },
        (true, Some(_)) => HeadOutput::Scratch,
    };
    (output, tail)
}

/// An f32 zero in the weights: the clamp of a u8 store reads it by
/// broadcast (`microkernel::Store::U8`).
fn f32_zero(weights: &mut Weights) -> Loc {
    weights_loc(weights, &0f32.to_le_bytes())
}

/// Where a dense microkernel writes its f32 results (see [`head_output`]).
#[derive(Clone, Copy)]
enum HeadOutput {
    /// Into the node's output; a tail runs there in place.
    InPlace,
    /// Into the node's output, cast to u8 in the store loop (`zero`: an f32
    /// 0 in the weights).
    Narrow { zero: Loc },
    /// Into scratch of the output's size in f32, which the tail reads.
    Scratch,
}

/// The tasks' code and the tail, its source located.
fn finish(
    (codes, src): (Vec<Vec<u8>>, Loc),
    tail: Option<ElementwiseProgram>,
) -> (Vec<Vec<u8>>, Option<Tail>) {
    (codes, tail.map(|program| Tail { program, src }))
}

/// [`lower`], and for the head of a fused node (`fused`: the fused node's
/// context and kernel) the program left after the store-loop epilogue,
/// which the caller runs over the whole output after the tasks.
fn lower_with(
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    tasks: usize,
) -> Option<(Vec<Vec<u8>>, Option<Tail>)> {
    let whole = |fused: Option<(&NodeCx, &FusedKernel)>| fused.map(|(_, k)| k.body().clone());
    let integer = match &cx.node.op {
        Op::MatMulInteger => Some(integer_matmul(cx, weights)?),
        Op::ConvInteger(c) => Some(integer_conv(cx, weights, c)?),
        _ => None,
    };
    if let Some(mut spec) = integer {
        // A fused integer head converts to f32 in its store loop and takes
        // what it can of the program there.
        let tail = match fused {
            Some((fcx, k)) => {
                spec.to_f32 = true;
                absorb(fcx, k, &mut spec, weights)
            }
            None => None,
        };
        let (output, tail) = head_output(fused, tail, weights);
        return assemble_parts(cx, spec, scratch, tasks, output).map(|r| finish(r, tail));
    }
    let float = |d: DType| matches!(d, DType::F32 | DType::BF16 | DType::F16);
    if cx.inputs.iter().any(|(_, t)| !float(t.dtype)) || cx.node.ty.dtype != DType::F32 {
        return None;
    }
    // Bias / C are read as f32 by the epilogue.
    if cx.inputs.get(2).is_some_and(|(_, t)| t.dtype != DType::F32) {
        return None;
    }
    // The depthwise kernel reads f32 only.
    if matches!(&cx.node.op, Op::Conv(c) if c.group > 1)
        && cx.inputs.iter().any(|(_, t)| t.dtype != DType::F32)
    {
        return None;
    }
    if cx.node.ty.num_elements() == 0 {
        return None;
    }
    if let Op::Conv(c) = &cx.node.op {
        // Out-of-limit windows get the Cranelift path's error.
        super::conv::check_conv_window(cx, c).ok()?;
    }
    let spec = match &cx.node.op {
        Op::MatMul => matmul(cx, weights)?,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => gemm(cx, weights, *alpha, *beta, *trans_a, *trans_b)?,
        Op::Conv(c) if c.group > 1 => {
            let mut spec = depthwise_conv(cx, c)?;
            let mut tail = whole(fused);
            if let (Some((fcx, k)), Some(program)) = (fused, &tail) {
                if let Some(steps) = epilogue_steps(fcx, k, program, weights) {
                    if depthwise_epilogue_fits(&steps) {
                        spec.epilogue = steps;
                        tail = None;
                    }
                }
            }
            let flops = 2 * cx.node.ty.num_elements() * spec.kh * spec.kw;
            let tasks = tasks.min(flops / super::partition::MIN_TASK_FLOPS).max(1);
            let (output, tail) = head_output(fused, tail, weights);
            let src = match output {
                HeadOutput::Scratch => scratch.reserve(&[f32_bytes(cx)])[0],
                _ => cx.out,
            };
            let codes = spec
                .split(tasks)
                .into_iter()
                .map(|mut part| {
                    match output {
                        HeadOutput::InPlace => {}
                        HeadOutput::Narrow { zero } => part = part.narrowed(cx.out, zero),
                        HeadOutput::Scratch => {
                            for image in &mut part.images {
                                image.1 = relocated(cx.out, image.1, src);
                            }
                        }
                    }
                    part.assemble().ok()
                })
                .collect::<Option<Vec<_>>>()?;
            return Some(finish((codes, src), tail));
        }
        Op::Conv(c) => match pointwise_conv(cx, weights, c) {
            Some(spec) => spec,
            None => match implicit_conv(cx, weights, c, tasks) {
                Some(spec) => spec,
                None => im2col_conv(cx, weights, c)?,
            },
        },
        _ => return None,
    };
    let mut spec = spec;
    let tail = match fused {
        Some((fcx, k)) => absorb(fcx, k, &mut spec, weights),
        None => None,
    };
    let (output, tail) = head_output(fused, tail, weights);
    assemble_parts(cx, spec, scratch, tasks, output).map(|r| finish(r, tail))
}

/// The f32 bytes of node `cx`'s output.
fn f32_bytes(cx: &NodeCx) -> u64 {
    4 * cx.node.ty.num_elements() as u64
}

/// Output location `loc` (inside the output that starts at `out`) moved to
/// the same offset from `to`.
fn relocated(out: Loc, loc: Loc, to: Loc) -> Loc {
    to.moved(loc.offset as i64 - out.offset as i64)
}

/// `spec` (the kernel of node `cx`) split into at most `tasks` kernels,
/// each with scratch of its own for its im2col matrix and B panel,
/// writing where `output` says, assembled; and where the f32 results are
/// (the output, or the scratch that [`HeadOutput::Scratch`] reserves).
fn assemble_parts(
    cx: &NodeCx,
    spec: GemmSpec,
    scratch: &mut Scratch,
    tasks: usize,
    output: HeadOutput,
) -> Option<(Vec<Vec<u8>>, Loc)> {
    let parts = super::partition::split(spec, tasks);
    // Every task gets scratch of its own, since tasks run concurrently; the
    // f32 results of a u8 kernel with a tail come first.
    let staged = matches!(output, HeadOutput::Scratch);
    let mut sizes: Vec<u64> = staged.then(|| f32_bytes(cx)).into_iter().collect();
    sizes.extend(parts.iter().flat_map(|p| {
        let (col, panel) = scratch_bytes(p);
        [col, panel]
    }));
    let mut locs = if sizes.iter().any(|&b| b > 0) {
        scratch.reserve(&sizes)
    } else {
        Vec::new()
    };
    let src = if staged { locs.remove(0) } else { cx.out };
    let sizes = &sizes[usize::from(staged)..];
    let mut codes = Vec::with_capacity(parts.len());
    for (t, mut part) in parts.into_iter().enumerate() {
        match output {
            HeadOutput::InPlace => {}
            HeadOutput::Narrow { zero } => part = part.narrowed(cx.out, zero),
            HeadOutput::Scratch => {
                for call in &mut part.calls {
                    call.out = relocated(cx.out, call.out, src);
                }
            }
        }
        if sizes[2 * t] > 0 {
            // B was addressed relative to the start of the scratch.
            for call in &mut part.calls {
                call.b = locs[2 * t].moved(call.b.offset as i64);
            }
        }
        if sizes[2 * t + 1] > 0 {
            part.b_panel = Some(locs[2 * t + 1]);
        }
        codes.push(part.assemble().ok()?);
    }
    Some((codes, src))
}

/// Scratch bytes a GEMM kernel needs: its im2col matrix, and the panel into
/// which a strided B re-read by at least [`PANEL_MIN_ROW_TILES`] row tiles
/// is copied one column tile at a time (0 when none).
fn scratch_bytes(spec: &GemmSpec) -> (u64, u64) {
    let panel = match spec.b {
        // Quad rows are written to scratch as the kernel reads them.
        BLayout::Strided { .. } if spec.elem == Elem::I8U8Dot => 0,
        BLayout::Strided { .. } if spec.m / spec.blocking.mr >= PANEL_MIN_ROW_TILES => {
            (spec.k * spec.blocking.nr() * 4) as u64
        }
        _ => 0,
    };
    let panel = if panel > MAX_SCRATCH / 2 { 0 } else { panel };
    let col = spec.im2col.iter().map(Im2col::col_bytes).max().unwrap_or(0);
    (col, panel)
}

/// Moves the start of `k`'s program into `spec`'s store loop: a first
/// `add` of the head's result and an extra operand that the GEMM's `C`
/// can address (a bias or a residual; only when `C` is free), then a
/// `relu` or `clip` of that value, then whatever is left as an epilogue
/// program when [`epilogue_steps`] can express it and it fits the tile's
/// free registers. Returns the program left to run over the output,
/// `None` when nothing is left.
fn absorb(
    cx: &NodeCx,
    k: &FusedKernel,
    spec: &mut GemmSpec,
    weights: &mut Weights,
) -> Option<ElementwiseProgram> {
    let rest = absorb_prefix(cx, k, spec)?;
    match epilogue_steps(cx, k, &rest, weights) {
        Some(steps) if epilogue_fits(&steps, spec.blocking) => {
            spec.epilogue = steps;
            None
        }
        _ => Some(rest),
    }
}

/// How many trailing output dims the GEMM columns of dense head `op` span
/// (a convolution's output pixels, a product's last dim).
fn column_dims(op: &DenseOp) -> usize {
    match op {
        DenseOp::Conv(_) | DenseOp::ConvInteger(_) => 2,
        DenseOp::MatMul | DenseOp::MatMulInteger | DenseOp::Gemm { .. } => 1,
    }
}

/// The C and activation part of [`absorb`]: returns the program left.
fn absorb_prefix(cx: &NodeCx, k: &FusedKernel, spec: &mut GemmSpec) -> Option<ElementwiseProgram> {
    let p = k.body();
    let h = k.head().expect("a fused head");
    let instrs = p.instrs();
    let saved = spec.clone();
    let mut used = 0;
    let mut cur = Reg(0);
    if let (None, Instr::Binary(BinaryOp::Add, a, b)) = (spec.c, instrs[0]) {
        let extra = match (a, b) {
            (Reg(0), e) | (e, Reg(0)) if e != Reg(0) && e.index() < p.inputs() => Some(e),
            _ => None,
        };
        let low = column_dims(&h.op);
        let matmul_1d = matches!(h.op, DenseOp::MatMul)
            && cx.inputs[..2].iter().any(|(_, t)| t.shape.len() < 2);
        if let (Some(e), false) = (extra, matmul_1d) {
            let (loc, ety) = cx.inputs[h.inputs + e.index() - 1];
            let shape = &cx.node.ty.shape;
            let es = broadcast_strides(&ety.shape, shape);
            if let Some((row, per_column, bases)) = c_operand(&es, shape, low, spec.calls.len()) {
                spec.c = Some(CLayout {
                    row: row * 4,
                    per_column,
                    beta: 1.0,
                });
                for (call, base) in spec.calls.iter_mut().zip(bases) {
                    call.c = Some(loc.moved(base * 4));
                }
                used = 1;
                cur = Reg(p.inputs() as u32);
            }
        }
    }
    if let Some(&Instr::Unary(u, r)) = instrs.get(used) {
        let act = match u {
            UnaryOp::Relu => Some(Activation::Relu),
            UnaryOp::Clip { min, max } => Some(Activation::Clip { lo: min, hi: max }),
            _ => None,
        };
        if let (Some(act), true) = (act, r == cur) {
            spec.act = act;
            used += 1;
        }
    }
    if used == instrs.len() {
        return None;
    }
    if used == 0 {
        return Some(p.clone());
    }
    match p.rest_after(used) {
        Some(rest) => Some(rest),
        None => {
            *spec = saved;
            Some(p.clone())
        }
    }
}

/// `program` (register 0: the GEMM's output element after C and the
/// activation; registers `1..`: the fused kernel's extra inputs) as
/// epilogue steps, when every extra input is one f32, one per output
/// row (per channel of a convolution) or one per output column of a
/// product (a bias or an int8 rescale along the last axis), and every instruction is `+ - × ÷`
/// or a unary op made of them with constants: Relu, Clip, Neg,
/// LeakyRelu (0 ≤ α ≤ 1), HardSigmoid, HardSwish, Erf (the rational
/// approximation of `math::erf`) and erf-form Gelu, Exp and Sigmoid (the
/// polynomial of `math::exp`, `2^n` by `vscalefps`), and Round (ties to
/// even, one instruction). Constants go to the weights section. `None`
/// otherwise.
fn epilogue_steps(
    cx: &NodeCx,
    k: &FusedKernel,
    program: &ElementwiseProgram,
    weights: &mut Weights,
) -> Option<Vec<EpilogueStep>> {
    let h = k.head()?;
    let shape = &cx.node.ty.shape;
    let low = column_dims(&h.op);
    let matmul_1d =
        matches!(h.op, DenseOp::MatMul) && cx.inputs[..2].iter().any(|(_, t)| t.shape.len() < 2);
    if shape.len() < low + 1 || matmul_1d {
        return None;
    }
    let row_dim = shape.len() - low - 1;
    // Per register, its operand; `None` for an input the store loop cannot
    // read (fatal only if the program reads it: after `absorb_prefix` the
    // input C took is still listed).
    let mut value = vec![Some(Operand::Slot(0))];
    for i in 1..program.inputs() {
        let (loc, ety) = cx.inputs[h.inputs + i - 1];
        let es = broadcast_strides(&ety.shape, shape);
        value.push(if ety.dtype != DType::F32 {
            None
        } else if es.iter().all(|&e| e == 0) {
            Some(Operand::Scalar(loc))
        } else if es
            .iter()
            .enumerate()
            .all(|(d, &e)| e == 0 || (d == row_dim && e == 1))
        {
            Some(Operand::PerRow(loc))
        } else if low == 1
            && es
                .iter()
                .enumerate()
                .all(|(d, &e)| e == 0 || (d == shape.len() - 1 && e == 1))
        {
            Some(Operand::PerColumn(loc))
        } else {
            None
        });
    }
    program_steps(program, value, weights)
}

/// `program` as epilogue steps, `value[i]` being where register `i` (a
/// program input) is read from (`None`: nowhere the kernel can address;
/// fatal only if the program reads it). `None` when an instruction has no
/// step form (see [`epilogue_steps`]).
pub(crate) fn program_steps(
    program: &ElementwiseProgram,
    mut value: Vec<Option<Operand>>,
    weights: &mut Weights,
) -> Option<Vec<EpilogueStep>> {
    let mut b = Steps {
        steps: Vec::new(),
        weights,
    };
    use EpilogueOp::{Add, Div, Max, Min, Mul, Sub};
    for instr in program.instrs() {
        let v = match *instr {
            Instr::Binary(op, x, y) => {
                let op = match op {
                    BinaryOp::Add => Add,
                    BinaryOp::Sub => Sub,
                    BinaryOp::Mul => Mul,
                    BinaryOp::Div => Div,
                    _ => return None,
                };
                b.emit(op, value[x.index()]?, value[y.index()]?)
            }
            Instr::Unary(u, x) => {
                let x = value[x.index()]?;
                match u {
                    UnaryOp::Relu => b.emit_const(Max, x, 0.0),
                    UnaryOp::Clip { min, max } => {
                        let t = b.emit_const(Max, x, min);
                        b.emit_const(Min, t, max)
                    }
                    UnaryOp::Neg => b.emit_const(Mul, x, -1.0),
                    UnaryOp::Round => b.emit(EpilogueOp::RoundEven, x, x),
                    UnaryOp::LeakyRelu { alpha } if (0.0..=1.0).contains(&alpha) => {
                        let t = b.emit_const(Mul, x, alpha);
                        b.emit(Max, x, t)
                    }
                    UnaryOp::HardSigmoid { alpha, beta } => {
                        let t = b.emit_const(Mul, x, alpha);
                        let t = b.emit_const(Add, t, beta);
                        let t = b.emit_const(Max, t, 0.0);
                        b.emit_const(Min, t, 1.0)
                    }
                    UnaryOp::HardSwish => {
                        // x · clamp(x + 3, 0, 6) · (1/6), as
                        // `lower::elementwise` computes it: no `vdivps`.
                        let t = b.emit_const(Add, x, 3.0);
                        let t = b.emit_const(Max, t, 0.0);
                        let t = b.emit_const(Min, t, 6.0);
                        let t = b.emit(Mul, x, t);
                        b.emit_const(Mul, t, 1.0 / 6.0)
                    }
                    UnaryOp::Erf => b.erf(x),
                    // Below e^-87 the Exp kernels' value would be
                    // subnormal; the steps give e^-87 ≈ 1.6e-38 there
                    // (within 2e-38 of the reference) and never produce
                    // a subnormal (`docs/targets-cpu.md`).
                    UnaryOp::Exp => b.exp(x),
                    UnaryOp::Sigmoid => {
                        // 1 / (1 + e^-x): 1 + e^-x is 1 wherever e^-x is
                        // below e^-87, so the floor changes no result.
                        let t = b.emit_const(Mul, x, -1.0);
                        let e = b.exp(t);
                        let d = b.emit_const(Add, e, 1.0);
                        let one = b.konst(1.0);
                        b.emit(Div, one, d)
                    }
                    UnaryOp::Gelu { tanh: false } => {
                        // x · (1 + erf(x / √2)) / 2
                        let t = b.emit_const(Mul, x, std::f32::consts::FRAC_1_SQRT_2);
                        let t = b.erf(t);
                        let t = b.emit_const(Add, t, 1.0);
                        let t = b.emit(Mul, x, t);
                        b.emit_const(Mul, t, 0.5)
                    }
                    _ => return None,
                }
            }
        };
        value.push(Some(v));
    }
    Some(b.steps)
}

/// A fused node without a head (`cx`, kernel `k`) as AVX-512 elementwise
/// kernels (up to `tasks`), when its program has a step form and every
/// input is f32 of the output's shape (slot 0: the first input), one value,
/// one value per index of the last axis (a bias), or one value per index of
/// one axis with only unit axes before it (a per-channel operand of a
/// single image: one value per row). `None` otherwise (the Cranelift kernel
/// runs it).
pub(crate) fn lower_headless(
    cx: &NodeCx,
    k: &FusedKernel,
    weights: &mut Weights,
    tasks: usize,
) -> Option<Vec<Vec<u8>>> {
    let shape = &cx.node.ty.shape;
    let n = cx.node.ty.num_elements();
    if k.head().is_some() || cx.node.ty.dtype != k.store().dtype() || n == 0 {
        return None;
    }
    // The axis whose index is the row, for per-row operands; whether an
    // operand varies along the last axis only (then rows are that axis).
    let rank = shape.len();
    let mut row_axis: Option<usize> = None;
    let mut per_column = false;
    let mut value = Vec::with_capacity(cx.inputs.len());
    for (i, (loc, ty)) in cx.inputs.iter().enumerate() {
        if ty.dtype != DType::F32 {
            return None;
        }
        let es = broadcast_strides(&ty.shape, shape);
        let v = if ty.shape == *shape {
            Operand::Full(*loc)
        } else if es.iter().all(|&e| e == 0) {
            Operand::Scalar(*loc)
        } else {
            let axis = es.iter().position(|&e| e != 0)?;
            let single = (es.iter().enumerate()).all(|(d, &e)| d == axis || e == 0);
            if !single || es[axis] != 1 {
                return None;
            }
            if axis + 1 == rank {
                per_column = true;
                Operand::PerColumn(*loc)
            } else {
                // Leading axes (a batch) repeat the operand: its rows wrap.
                if *row_axis.get_or_insert(axis) != axis {
                    return None;
                }
                Operand::PerRow(*loc)
            }
        };
        if i == 0 && !matches!(v, Operand::Full(_)) {
            return None;
        }
        value.push(Some(v));
    }
    // Per-column operands need rows of the last axis, per-row ones rows of
    // their axis: both only when those are the same rows.
    if per_column && row_axis.is_some_and(|a| a + 2 != rank) {
        return None;
    }
    let mut steps = program_steps(k.body(), value, weights)?;
    // Slot 0 is the first input, loaded by the kernel.
    for st in &mut steps {
        for o in [&mut st.a, &mut st.b] {
            if *o == Operand::Full(cx.inputs[0].0) {
                *o = Operand::Slot(0);
            }
        }
    }
    if !ElementwiseSpec::fits(&steps) {
        return None;
    }
    let (rows, row_period, cols) = match (row_axis, per_column) {
        (Some(axis), _) => (
            shape[..=axis].iter().product(),
            shape[axis],
            shape[axis + 1..].iter().product(),
        ),
        (None, true) => (n / shape[rank - 1], n / shape[rank - 1], shape[rank - 1]),
        (None, false) => (1, 1, n),
    };
    let spec = ElementwiseSpec {
        rows,
        row_period,
        first_row: 0,
        cols,
        input: cx.inputs[0].0,
        steps,
        out: cx.out,
        store: crate::microkernel::Store::F32,
    };
    let zero = (k.store() != FusedStore::F32).then(|| f32_zero(weights));
    // Large enough that a task is worth its wake-up (as split_elementwise).
    let tasks = tasks.min(n / (1 << 14)).max(1);
    spec.split(tasks)
        .into_iter()
        .map(|p| match zero {
            Some(zero) => p.narrowed(cx.out, zero).assemble().ok(),
            None => p.assemble().ok(),
        })
        .collect()
}

/// Epilogue steps being written, with the weights section for their
/// constants.
struct Steps<'w> {
    steps: Vec<EpilogueStep>,
    weights: &'w mut Weights,
}

impl Steps<'_> {
    /// Appends `op(a, b)`; its result.
    fn emit(&mut self, op: EpilogueOp, a: Operand, b: Operand) -> Operand {
        self.steps.push(EpilogueStep { op, a, b });
        Operand::Slot(self.steps.len())
    }

    /// A constant, stored in the weights section.
    fn konst(&mut self, v: f32) -> Operand {
        Operand::Scalar(weights_loc(self.weights, &v.to_le_bytes()))
    }

    /// Appends `op(a, v)` for a constant `v`.
    fn emit_const(&mut self, op: EpilogueOp, a: Operand, v: f32) -> Operand {
        let k = self.konst(v);
        self.emit(op, a, k)
    }

    /// `erf(x)` as the rational function of `math::erf`; the clamp takes x
    /// second, so a NaN stays NaN.
    fn erf(&mut self, x: Operand) -> Operand {
        use super::math::{ERF_CLAMP, ERF_DENOMINATOR, ERF_NUMERATOR};
        use EpilogueOp::{Add, Div, Max, Min, Mul};
        let hi = self.konst(ERF_CLAMP);
        let x = self.emit(Min, hi, x);
        let lo = self.konst(-ERF_CLAMP);
        let x = self.emit(Max, lo, x);
        let x2 = self.emit(Mul, x, x);
        let mut horner = |coeffs: &[f64]| {
            let mut p = self.konst(coeffs[0] as f32);
            for &c in &coeffs[1..] {
                let t = self.emit(Mul, p, x2);
                p = self.emit_const(Add, t, c as f32);
            }
            p
        };
        let n = horner(&ERF_NUMERATOR);
        let d = horner(&ERF_DENOMINATOR);
        let n = self.emit(Mul, x, n);
        self.emit(Div, n, d)
    }

    /// `e^x` as the Cranelift `math::exp` computes it: `n = round(t·log₂e)`,
    /// `r = t − n·ln 2` in two parts, `1 + r + r²·P(r)`, times `2^n`
    /// (`vscalefps`), with `t = clamp(x, −87, 88.8)`: no step produces a
    /// subnormal, and above 88.8 the result is +inf as it should be; the
    /// clamps take x second, so a NaN stays NaN.
    fn exp(&mut self, x: Operand) -> Operand {
        use super::math::{EXP_HIGHEST, EXP_NORMAL_LOWEST, EXP_POLY, LN2_HI, LN2_LO};
        use EpilogueOp::{Add, Max, Min, Mul, RoundEven, Scale, Sub};
        let highest = self.konst(EXP_HIGHEST);
        let t = self.emit(Min, highest, x);
        let lowest = self.konst(EXP_NORMAL_LOWEST);
        let t = self.emit(Max, lowest, t);
        let n = self.emit_const(Mul, t, std::f32::consts::LOG2_E);
        let n = self.emit(RoundEven, n, n);
        let hi = self.emit_const(Mul, n, LN2_HI as f32);
        let r = self.emit(Sub, t, hi);
        let lo = self.emit_const(Mul, n, LN2_LO as f32);
        let r = self.emit(Sub, r, lo);
        let mut p = self.konst(EXP_POLY[0] as f32);
        for &c in &EXP_POLY[1..] {
            let t = self.emit(Mul, p, r);
            p = self.emit_const(Add, t, c as f32);
        }
        let r2 = self.emit(Mul, r, r);
        let p = self.emit(Mul, p, r2);
        let r1 = self.emit_const(Add, r, 1.0);
        let e = self.emit(Add, p, r1);
        self.emit(Scale, e, n)
    }
}

/// How an operand with element strides `es` over the output `shape` reads
/// as a GEMM `C`: the output's last `low` dims are the GEMM columns, the dim
/// above them the rows, the dims above that one GEMM call each (in
/// row-major order). Returns the row stride, whether C is contiguous along
/// the columns (else broadcast), and each call's base offset (elements).
fn c_operand(
    es: &[i64],
    shape: &[usize],
    low: usize,
    calls: usize,
) -> Option<(i64, bool, Vec<i64>)> {
    let rank = shape.len();
    if rank < low + 1 {
        return None;
    }
    // Along the columns the operand must be contiguous or constant.
    let mut col = None;
    let mut inner = 1i64;
    for d in (rank - low..rank).rev() {
        if shape[d] == 1 {
            continue;
        }
        let c = *col.get_or_insert(es[d]);
        if es[d] != c * inner {
            return None;
        }
        inner *= shape[d] as i64;
    }
    let col = col.unwrap_or(0);
    if col != 0 && col != 1 {
        return None;
    }
    let row = if shape[rank - low - 1] == 1 {
        0
    } else {
        es[rank - low - 1]
    };
    let batch = &shape[..rank - low - 1];
    let bases: Vec<i64> = indices(batch)
        .iter()
        .map(|idx| dot(idx, &es[..rank - low - 1]))
        .collect();
    (bases.len() == calls).then_some((row, col == 1, bases))
}

fn f32_constant(graph: &Graph, id: NodeId) -> Option<&[f32]> {
    match graph.constant(id)?.data() {
        Data::F32(v) => Some(v),
        _ => None,
    }
}

/// The values of a float constant (f32, or 16-bit widened exactly, so that
/// packing them back into 16 bits reproduces the stored bits).
fn float_constant(graph: &Graph, id: NodeId) -> Option<Cow<'_, [f32]>> {
    let t = graph.constant(id)?;
    match t.data() {
        Data::F32(v) => Some(Cow::Borrowed(v)),
        Data::BF16(_) | Data::F16(_) => Some(Cow::Owned(t.to_f32_vec())),
        _ => None,
    }
}

/// The kernel element types of a MatMul/Gemm with operand types `a`, `b`
/// (B must then be a constant packed at compile time, except for f32).
fn product_elem(a: DType, b: DType) -> Option<Elem> {
    match (a, b) {
        (DType::F32, DType::F32) => Some(Elem::F32),
        (DType::BF16, DType::BF16) => Some(Elem::Bf16Dot),
        (DType::F32, DType::BF16) => Some(Elem::WidenB(Half::Bf16)),
        (DType::F32, DType::F16) => Some(Elem::WidenB(Half::F16)),
        _ => None,
    }
}

/// Whether the microkernels can take dense node `id` with its 16-bit
/// float operands as they are (on an AVX-512 target; `bf16_dot`: the
/// target has AVX512-BF16): the element pairs [`product_elem`] and
/// [`conv_elem`] accept, with the 16-bit operand a constant the kernel
/// packs at compile time. `legalize` widens the operands of every other
/// dense op with a 16-bit operand to f32.
pub(crate) fn takes_half_operands(graph: &Graph, id: NodeId, bf16_dot: bool) -> bool {
    let node = graph.node(id);
    let mut ins = graph.inputs_of(id);
    // A fused kernel's head: its operands, its (f32) result.
    let (op, result) = match &node.op {
        Op::Fused(k) => match k.head() {
            Some(h) if !h.op.is_integer() => {
                ins.truncate(h.inputs);
                (h.op.op(), DType::F32)
            }
            _ => return false,
        },
        op => (op.clone(), node.ty.dtype),
    };
    if result != DType::F32
        || ins.len() < 2
        || ins[2..]
            .iter()
            .any(|&i| graph.node(i).ty.dtype != DType::F32)
        || float_constant(graph, ins[1]).is_none()
    {
        return false;
    }
    let (a, b) = (graph.node(ins[0]).ty.dtype, graph.node(ins[1]).ty.dtype);
    match &op {
        Op::MatMul => matches!(product_elem(a, b), Some(e) if e != Elem::Bf16Dot || bf16_dot),
        Op::Gemm { trans_a, .. } => match product_elem(a, b) {
            Some(Elem::Bf16Dot) => bf16_dot && !trans_a,
            e => e.is_some(),
        },
        Op::Conv(c) => c.group == 1 && conv_elem(a, b).is_some(),
        _ => false,
    }
}

/// B packed for the kernel's element types.
fn pack_b_for(
    elem: Elem,
    b: &[f32],
    k: usize,
    n: usize,
    row: usize,
    col: usize,
    nr: usize,
) -> Vec<u8> {
    match elem {
        Elem::Bf16Dot => pack_b_pairs(b, k, n, row, col, nr),
        Elem::WidenB(h) => pack_b_half(b, k, n, row, col, nr, h),
        Elem::F32 | Elem::WidenA(_) => pack_b(b, k, n, row, col, nr),
        Elem::U8I8Dot | Elem::I8U8Dot => unreachable!("int8 operands are packed as quads"),
    }
}

/// The kernel element types of a Conv with input `x` and weights `w`.
fn conv_elem(x: DType, w: DType) -> Option<Elem> {
    match (x, w) {
        (DType::F32, DType::F32) => Some(Elem::F32),
        (DType::F32, DType::BF16) => Some(Elem::WidenA(Half::Bf16)),
        (DType::F32, DType::F16) => Some(Elem::WidenA(Half::F16)),
        _ => None,
    }
}

/// Conv weights packed for the kernel's element types.
fn pack_w_for(elem: Elem, w: &[f32], oc: usize, k: usize, mr: usize) -> Vec<u8> {
    match elem {
        Elem::WidenA(h) => pack_a_half(w, oc, k, k, 1, mr, h),
        _ => pack_a(w, oc, k, k, 1, mr),
    }
}

fn weights_loc(weights: &mut Weights, bytes: &[u8]) -> Loc {
    Loc {
        base: Base::Weights,
        offset: weights.add(bytes),
    }
}

/// Row-major multi-indices of `shape`, in order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let total: usize = shape.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0; shape.len()];
    for _ in 0..total {
        out.push(idx.clone());
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn dot(idx: &[usize], strides: &[i64]) -> i64 {
    idx.iter().zip(strides).map(|(&i, &s)| i as i64 * s).sum()
}

/// numpy MatMul, batch dims broadcast; a constant operand is packed.
fn matmul(cx: &NodeCx, weights: &mut Weights) -> Option<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (bloc, bty) = cx.inputs[1];
    let shape = super::linalg::MatMulShape::of(&aty.shape, &bty.shape)?;
    let (m, k, n) = (shape.m, shape.k, shape.n);
    let (a_batch, b_batch, batch) = (shape.a_batch(), shape.b_batch(), &shape.batch);
    let count: usize = batch.iter().product();
    if count > MAX_CALLS || k == 0 {
        return None;
    }
    let elem = product_elem(aty.dtype, bty.dtype)?;
    let b_const = float_constant(cx.graph, cx.input_ids[1]);
    if elem != Elem::F32 && b_const.is_none() {
        return None;
    }
    let b_const = b_const.as_deref();
    let a_const = f32_constant(cx.graph, cx.input_ids[0]).filter(|_| elem == Elem::F32);
    // Bytes of one stored A element.
    let ea = aty.dtype.size_bytes();
    let a_packed = a_const.is_some() && b_const.is_none();
    let blocking = Blocking::choose(m, n, if a_packed { packed_a_rows(k) } else { MAX_MR });
    let mats = |sh: &[usize]| sh.iter().product::<usize>();
    // Per-matrix byte sizes of each operand as the kernel reads it.
    let (a_layout, a_base, a_mat) = match (a_const, b_const) {
        (Some(v), None) => {
            let mut bytes = Vec::new();
            for q in 0..mats(a_batch) {
                bytes.extend(pack_a(&v[q * m * k..], m, k, k, 1, blocking.mr));
            }
            let per = (bytes.len() / mats(a_batch).max(1)) as i64;
            (ALayout::Packed, weights_loc(weights, &bytes), per)
        }
        _ => (
            ALayout::Strided {
                row: (k * ea) as i64,
                col: ea as i64,
            },
            aloc,
            (m * k * ea) as i64,
        ),
    };
    let (b_layout, b_base, b_mat) = match b_const {
        Some(v) => {
            let mut bytes = Vec::new();
            for q in 0..mats(b_batch) {
                bytes.extend(pack_b_for(elem, &v[q * k * n..], k, n, n, 1, blocking.nr()));
            }
            let per = (bytes.len() / mats(b_batch).max(1)) as i64;
            (BLayout::Packed, weights_loc(weights, &bytes), per)
        }
        None => (
            BLayout::Strided {
                row: (n * 4) as i64,
            },
            bloc,
            (k * n * 4) as i64,
        ),
    };
    let a_st: Vec<i64> = broadcast_strides(a_batch, batch)
        .iter()
        .map(|s| s * a_mat)
        .collect();
    let b_st: Vec<i64> = broadcast_strides(b_batch, batch)
        .iter()
        .map(|s| s * b_mat)
        .collect();
    let out_st: Vec<i64> = super::strides(batch)
        .iter()
        .map(|s| s * (m * n * 4) as i64)
        .collect();
    let calls = indices(batch)
        .iter()
        .map(|idx| Call {
            a: a_base.moved(dot(idx, &a_st)),
            b: b_base.moved(dot(idx, &b_st)),
            out: cx.out.moved(dot(idx, &out_st)),
            c: None,
            src: None,
        })
        .collect();
    Some(GemmSpec {
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
        calls,
        im2col: Vec::new(),
        b_panel: None,
        u8_zero: None,
        row_sums: None,
        to_f32: false,
        store: crate::microkernel::Store::F32,
        epilogue: Vec::new(),
    })
}

/// `MatMulInteger` with a u8 A and a constant B that is signed once its
/// zero point is taken out (i8 with zero point 0, or u8 with zero point
/// 128, stored as `b - 128`): B is packed as i8 quads with its column sums
/// after the panels, and A's zero point (any u8, constant or computed) is
/// applied in the epilogue. Batch dims of A fold into its rows (B is one
/// matrix). Other operand types and zero points keep the Cranelift kernel.
fn integer_matmul(cx: &NodeCx, weights: &mut Weights) -> Option<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (_, bty) = cx.inputs[1];
    if aty.dtype != DType::U8 || aty.shape.len() < 2 || bty.shape.len() != 2 {
        return None;
    }
    let (k, n) = (bty.shape[0], bty.shape[1]);
    let m = aty.num_elements() / k.max(1);
    if k == 0 || m == 0 || n == 0 {
        return None;
    }
    let b = signed_constant(cx, 1, 3)?;
    let blocking = Blocking::choose(m, n, MAX_MR);
    let nr = blocking.nr();
    let packed = pack_b_quads(&b, k, n, n, 1, nr);
    let b_loc = weights_loc(weights, &packed);
    // A's zero point: skipped when it is the constant 0.
    let (c, c_loc, u8_zero) = if zero_point_is_0(cx, 2) {
        (None, None, None)
    } else {
        let mut sums = vec![0i32; n.div_ceil(nr) * nr];
        for row in b.chunks(n) {
            for (j, &v) in row.iter().enumerate() {
                sums[j] += i32::from(v);
            }
        }
        let bytes: Vec<u8> = sums.iter().flat_map(|v| v.to_le_bytes()).collect();
        let layout = CLayout {
            row: 0,
            per_column: true,
            beta: 1.0,
        };
        (
            Some(layout),
            Some(weights_loc(weights, &bytes)),
            Some(cx.inputs[2].0),
        )
    };
    Some(GemmSpec {
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
        c,
        act: Activation::None,
        calls: vec![Call {
            a: aloc,
            b: b_loc,
            out: cx.out,
            c: c_loc,
            src: None,
        }],
        im2col: Vec::new(),
        b_panel: None,
        u8_zero,
        row_sums: None,
        to_f32: false,
        store: crate::microkernel::Store::F32,
        epilogue: Vec::new(),
    })
}

/// ONNX Gemm: `alpha * op(A) @ op(B) + beta * C`.
fn gemm(
    cx: &NodeCx,
    weights: &mut Weights,
    alpha: f32,
    beta: f32,
    trans_a: bool,
    trans_b: bool,
) -> Option<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (bloc, _) = cx.inputs[1];
    let (m, k) = if trans_a {
        (aty.shape[1], aty.shape[0])
    } else {
        (aty.shape[0], aty.shape[1])
    };
    let n = cx.node.ty.shape[1];
    if k == 0 {
        return None;
    }
    // Element strides of op(A)[i, k] and op(B)[k, j] in the stored tensors.
    let (a_row, a_col) = if trans_a { (1, m) } else { (k, 1) };
    let (b_row, b_col) = if trans_b { (1, k) } else { (n, 1) };
    let elem = product_elem(aty.dtype, cx.inputs[1].1.dtype)?;
    let b_const = float_constant(cx.graph, cx.input_ids[1]);
    // A bf16 dot reads A pairs along k, which a transposed A does not have.
    if elem != Elem::F32 && (b_const.is_none() || (elem == Elem::Bf16Dot && trans_a)) {
        return None;
    }
    let b_const = b_const.as_deref();
    let a_const = f32_constant(cx.graph, cx.input_ids[0]).filter(|_| elem == Elem::F32);
    let ea = aty.dtype.size_bytes();
    let a_packed = a_const.is_some() && b_const.is_none();
    let blocking = Blocking::choose(m, n, if a_packed { packed_a_rows(k) } else { MAX_MR });
    let (b, b_base) = match b_const {
        Some(v) => {
            let bytes = pack_b_for(elem, v, k, n, b_row, b_col, blocking.nr());
            (BLayout::Packed, weights_loc(weights, &bytes))
        }
        None if !trans_b => (
            BLayout::Strided {
                row: (n * 4) as i64,
            },
            bloc,
        ),
        // Columns of a dynamic transposed B are not contiguous.
        None => return None,
    };
    let (a, a_base) = match (a_const, b_const) {
        (Some(v), None) => {
            let bytes = pack_a(v, m, k, a_row, a_col, blocking.mr);
            (ALayout::Packed, weights_loc(weights, &bytes))
        }
        _ => (
            ALayout::Strided {
                row: (a_row * ea) as i64,
                col: (a_col * ea) as i64,
            },
            aloc,
        ),
    };
    let c = match cx.inputs.get(2) {
        Some(&(cloc, cty)) if beta != 0.0 => {
            let st = broadcast_strides(&cty.shape, &[m, n]);
            Some((
                CLayout {
                    row: st[0] * 4,
                    per_column: st[1] != 0,
                    beta,
                },
                cloc,
            ))
        }
        _ => None,
    };
    Some(GemmSpec {
        m,
        n,
        k,
        elem,
        blocking,
        a,
        b,
        out_row: (n * 4) as i64,
        alpha,
        c: c.map(|(l, _)| l),
        act: Activation::None,
        calls: vec![Call {
            a: a_base,
            b: b_base,
            out: cx.out,
            c: c.map(|(_, loc)| loc),
            src: None,
        }],
        im2col: Vec::new(),
        b_panel: None,
        u8_zero: None,
        row_sums: None,
        to_f32: false,
        store: crate::microkernel::Store::F32,
        epilogue: Vec::new(),
    })
}

/// A 1×1, stride-1, unpadded, ungrouped convolution with constant weights:
/// per image, `Y[oc, p] = bias[oc] + W[oc, :] @ X[:, p]` over the `H*W`
/// positions `p` (NCHW needs no transposition).
fn pointwise_conv(cx: &NodeCx, weights: &mut Weights, c: &Conv2d) -> Option<GemmSpec> {
    let (xloc, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, cin, h, w) = (xty.shape[0], xty.shape[1], xty.shape[2], xty.shape[3]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    let pointwise =
        c.group == 1 && (kh, kw) == (1, 1) && c.strides == [1, 1] && c.pads == [0, 0, 0, 0];
    if !pointwise || batch > MAX_CALLS || cin == 0 {
        return None;
    }
    let elem = conv_elem(xty.dtype, wty.dtype)?;
    let wv = float_constant(cx.graph, cx.input_ids[1])?;
    let p = h * w;
    let blocking = Blocking::choose(oc, p, packed_a_rows(cin));
    let packed = pack_w_for(elem, &wv, oc, cin, blocking.mr);
    let a_base = weights_loc(weights, &packed);
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let calls = (0..batch as i64)
        .map(|img| Call {
            a: a_base,
            b: xloc.moved(img * (cin * p * 4) as i64),
            out: cx.out.moved(img * (oc * p * 4) as i64),
            c: bias,
            src: None,
        })
        .collect();
    Some(GemmSpec {
        b: BLayout::Strided {
            row: (p * 4) as i64,
        },
        out_row: (p * 4) as i64,
        calls,
        ..conv_gemm(oc, p, cin, elem, blocking, bias.is_some())
    })
}

/// An ungrouped convolution with constant weights as im2col + GEMM: per
/// image, `col[Cin*kh*kw, OH*OW]` is built in arena scratch, then
/// `Y[oc, p] = bias[oc] + W[oc, :] @ col[:, p]` (OIHW weights are already
/// `[OC, Cin*kh*kw]` in the row order of `col`).
fn im2col_conv(cx: &NodeCx, weights: &mut Weights, c: &Conv2d) -> Option<GemmSpec> {
    let (_, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, cin) = (xty.shape[0], xty.shape[1]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    if c.group != 1 || batch > MAX_CALLS || cin * kh * kw == 0 {
        return None;
    }
    let elem = conv_elem(xty.dtype, wty.dtype)?;
    let wv = float_constant(cx.graph, cx.input_ids[1])?;
    let full = whole_image_im2col(cx, c, None);
    let band = im2col_band(&full);
    let first = Im2col { rows: band, ..full };
    if first.col_bytes() > MAX_SCRATCH / 2 {
        return None;
    }
    let (k, p) = (cin * kh * kw, band * ow);
    let blocking = Blocking::choose(oc, p, packed_a_rows(k));
    let packed = pack_w_for(elem, &wv, oc, k, blocking.mr);
    let a_base = weights_loc(weights, &packed);
    // `lower` points B at the im2col matrix once scratch is reserved.
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let (routines, calls) = banded_calls(cx, first, a_base, bias);
    if calls.len() > MAX_CALLS {
        return None;
    }
    Some(GemmSpec {
        b: BLayout::Strided {
            row: (p * 4) as i64,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        ..conv_gemm(oc, p, k, elem, blocking, bias.is_some())
    })
}

/// `ConvInteger` (ungrouped) with a u8 X and constant weights that are
/// signed once their zero point is taken out (i8 with zero point 0, or u8
/// with zero point 128), on [`Elem::I8U8Dot`]: per band of output rows a
/// quad im2col of X (k over `(th, tw, channel)`, channels padded to a
/// multiple of 4, the padding filled with X's zero point `z`) in scratch,
/// then the GEMM of the packed i8 weights by it, minus `z` times each
/// output channel's weight sum. Other operand types keep the Cranelift
/// kernel.
fn integer_conv(cx: &NodeCx, weights: &mut Weights, c: &Conv2d) -> Option<GemmSpec> {
    let (_, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, cin) = (xty.shape[0], xty.shape[1]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    if xty.dtype != DType::U8 || c.group != 1 || batch > MAX_CALLS {
        return None;
    }
    if cin * kh * kw == 0 || cx.node.ty.num_elements() == 0 {
        return None;
    }
    super::conv::check_conv_window(cx, c).ok()?;
    let wv = signed_constant(cx, 1, 3)?;
    // Weights as `[oc, (th, tw, channel)]` with the channels padded to
    // quads, and each output channel's sum for the zero-point correction.
    let cin4 = cin.div_ceil(4) * 4;
    let k = kh * kw * cin4;
    let mut wq = vec![0i8; oc * k];
    let mut sums = vec![0i32; oc];
    for o in 0..oc {
        for ic in 0..cin {
            for t in 0..kh * kw {
                let v = wv[(o * cin + ic) * kh * kw + t];
                wq[o * k + t * cin4 + ic] = v;
                sums[o] += i32::from(v);
            }
        }
    }
    let zero = cx.inputs[2].0;
    let full = whole_image_im2col(cx, c, Some(zero));
    let band = im2col_band(&full);
    let first = Im2col { rows: band, ..full };
    if first.col_bytes() > MAX_SCRATCH / 2 {
        return None;
    }
    let p = band * ow;
    let blocking = Blocking::choose(oc, p, packed_a_rows(k));
    let a_base = weights_loc(weights, &pack_a_quads(&wq, oc, k, blocking.mr));
    let (row_sums, u8_zero) = if zero_point_is_0(cx, 2) {
        (None, None)
    } else {
        let bytes: Vec<u8> = sums.iter().flat_map(|v| v.to_le_bytes()).collect();
        (Some(weights_loc(weights, &bytes)), Some(zero))
    };
    let (routines, calls) = banded_calls(cx, first, a_base, None);
    if calls.len() > MAX_CALLS {
        return None;
    }
    Some(GemmSpec {
        b: BLayout::Strided {
            row: first.row_bytes() as i64,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        u8_zero,
        row_sums,
        ..conv_gemm(oc, p, k, Elem::I8U8Dot, blocking, false)
    })
}

/// The constant 8-bit operand at kernel input `slot` as i8 values, when
/// it is signed once its zero point (kernel input `zero_slot`, constant)
/// is taken out: i8 with zero point 0, or u8 with zero point 128 (stored
/// as `v - 128`). `None` for other types and zero points.
fn signed_constant(cx: &NodeCx, slot: usize, zero_slot: usize) -> Option<Vec<i8>> {
    let shift = match cx.inputs[slot].1.dtype {
        DType::I8 => 0,
        DType::U8 => 128,
        _ => return None,
    };
    let zero = cx.graph.constant(cx.input_ids[zero_slot])?.to_i64_vec();
    if zero.iter().any(|&z| z != shift) {
        return None;
    }
    let v = cx.graph.constant(cx.input_ids[slot])?.to_i64_vec();
    Some(v.iter().map(|&x| (x - shift) as i8).collect())
}

/// Whether the zero point at kernel input `slot` is the constant 0 (its
/// correction can be left out).
fn zero_point_is_0(cx: &NodeCx, slot: usize) -> bool {
    cx.graph
        .constant(cx.input_ids[slot])
        .is_some_and(|t| t.to_i64_vec() == [0])
}

/// The GEMM calls of an im2col convolution `cx` converted in bands of
/// `first.rows` output rows: per image and band, B built by the band's
/// routine into scratch (offset 0 here; `lower` places it), A at `a`, C
/// at `c`. One routine per distinct band geometry; a band reuses one with
/// the image moved down by the rows between them.
fn banded_calls(cx: &NodeCx, first: Im2col, a: Loc, c: Option<Loc>) -> (Vec<Im2col>, Vec<Call>) {
    let (xloc, xty) = cx.inputs[0];
    let (oc, oh, ow) = (
        cx.node.ty.shape[1],
        cx.node.ty.shape[2],
        cx.node.ty.shape[3],
    );
    let image = (xty.shape[1] * xty.shape[2] * xty.shape[3] * first.elem_bytes()) as i64;
    let col = Loc {
        base: Base::Arena,
        offset: 0,
    };
    let mut routines: Vec<Im2col> = Vec::new();
    let mut calls = Vec::new();
    for img in 0..xty.shape[0] as i64 {
        for row0 in (0..oh).step_by(first.rows) {
            let (routine, shift) = band_routine(&mut routines, Im2col { row0, ..first });
            calls.push(Call {
                a,
                b: col,
                out: cx
                    .out
                    .moved(img * (oc * oh * ow * 4) as i64 + (row0 * ow * 4) as i64),
                c,
                src: Some((xloc.moved(img * image + shift), routine)),
            });
        }
    }
    (routines, calls)
}

/// The im2col of one whole image of convolution `cx` (f32, or quads
/// padded with the zero point at `quads`).
fn whole_image_im2col(cx: &NodeCx, c: &Conv2d, quads: Option<Loc>) -> Im2col {
    let (x, w, y) = (
        &cx.inputs[0].1.shape,
        &cx.inputs[1].1.shape,
        &cx.node.ty.shape,
    );
    Im2col {
        cin: x[1],
        h: x[2],
        w: x[3],
        kh: w[2],
        kw: w[3],
        row0: 0,
        rows: y[2],
        ow: y[3],
        strides: c.strides,
        pad_tl: [c.pads[0], c.pads[1]],
        dilations: c.dilations,
        quads,
    }
}

/// The GEMM of a convolution with packed weights as A (`m` output
/// channels), a per-channel bias as C when `bias`; B, the output layout
/// and the calls are the caller's.
fn conv_gemm(m: usize, n: usize, k: usize, elem: Elem, blocking: Blocking, bias: bool) -> GemmSpec {
    GemmSpec {
        m,
        n,
        k,
        elem,
        blocking,
        a: ALayout::Packed,
        b: BLayout::Packed,
        out_row: 0,
        alpha: 1.0,
        c: bias.then_some(CLayout {
            row: 4,
            per_column: false,
            beta: 1.0,
        }),
        act: Activation::None,
        calls: Vec::new(),
        im2col: Vec::new(),
        b_panel: None,
        u8_zero: None,
        row_sums: None,
        to_f32: false,
        store: crate::microkernel::Store::F32,
        epilogue: Vec::new(),
    }
}

/// The index of the routine in `routines` that converts band `geo` (added
/// when no band so far has its geometry), and how far (bytes) the image
/// pointer moves for it: bands whose taps fall alike share one routine.
fn band_routine(routines: &mut Vec<Im2col>, geo: Im2col) -> (usize, i64) {
    let key = geo.band_key();
    let i = match routines.iter().position(|r| r.band_key() == key) {
        Some(i) => i,
        None => {
            routines.push(geo);
            routines.len() - 1
        }
    };
    let shift = (geo.row0 - routines[i].row0) * geo.strides[0] * geo.w * geo.elem_bytes();
    (i, shift as i64)
}

/// An ungrouped convolution with W stride 1 and constant weights as an
/// implicit GEMM: per band of output rows, the input rows the band reads
/// are copied once into arena scratch with their padding made explicit
/// (`[Cin, rows, pl + W + pr]`), and every output row is one GEMM
/// `Y[oc, ow] = bias[oc] + W[oc, :] @ B` whose B the kernel reads in
/// place from that copy ([`BLayout::Taps`]: per channel, the `kh × kw`
/// taps at fixed offsets). Against [`im2col_conv`] this writes the input
/// once instead of `kh * kw` times. Bands are cut small enough for L2 and
/// numerous enough for `tasks`.
fn implicit_conv(cx: &NodeCx, weights: &mut Weights, c: &Conv2d, tasks: usize) -> Option<GemmSpec> {
    let (xloc, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, cin, h, w) = (xty.shape[0], xty.shape[1], xty.shape[2], xty.shape[3]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    if c.group != 1 || c.strides[1] != 1 || cin * kh * kw == 0 || kh * kw > MAX_TAPS {
        return None;
    }
    let elem = conv_elem(xty.dtype, wty.dtype)?;
    if !matches!(elem, Elem::F32 | Elem::WidenA(_)) {
        return None;
    }
    let wv = float_constant(cx.graph, cx.input_ids[1])?;
    let [sh, _] = c.strides;
    let [dh, dw] = c.dilations;
    let wp = c.pads[1] + w + c.pads[3];
    // Padded input rows a band of `rows` output rows reads.
    let padded_rows = |rows: usize| (rows - 1) * sh + (kh - 1) * dh + 1;
    let band_bytes = |rows: usize| (cin * padded_rows(rows) * wp * 4) as u64;
    // The most rows dividing the height whose copy stays in L2, in at
    // least as many bands as tasks (threads split the kernel by bands).
    let flops = 2 * batch * oc * oh * ow * cin * kh * kw;
    let tasks = tasks.min(flops / super::partition::MIN_TASK_FLOPS).max(1);
    let bands_wanted = tasks.min(oh * batch).div_ceil(batch);
    let band = (1..=oh)
        .rev()
        .find(|&b| {
            oh.is_multiple_of(b) && band_bytes(b) <= IM2COL_BAND_BYTES && oh / b >= bands_wanted
        })
        .unwrap_or(1);
    if band_bytes(band) > MAX_SCRATCH / 2 {
        return None;
    }
    let k = cin * kh * kw;
    let blocking = Blocking::choose(oc, ow, packed_a_rows(k));
    let packed = pack_w_for(elem, &wv, oc, k, blocking.mr);
    let a_base = weights_loc(weights, &packed);
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let rows_p = padded_rows(band);
    let channel = (rows_p * wp * 4) as i64;
    // The band copy is a 1×1 "convolution" onto the padded grid: output
    // row `r` of the copy is input row `r - pt`, zero outside the image.
    let copy = |row0: usize| Im2col {
        cin,
        h,
        w,
        kh: 1,
        kw: 1,
        row0: row0 * sh,
        rows: rows_p,
        ow: wp,
        strides: [1, 1],
        pad_tl: [c.pads[0], c.pads[1]],
        dilations: [1, 1],
        quads: None,
    };
    let mut routines: Vec<Im2col> = Vec::new();
    let mut calls = Vec::new();
    for img in 0..batch as i64 {
        let image = xloc.moved(img * (cin * h * w * 4) as i64);
        for row0 in (0..oh).step_by(band) {
            let (routine, shift) = band_routine(&mut routines, copy(row0));
            for r in 0..band {
                calls.push(Call {
                    a: a_base,
                    // Relative to the scratch, which `lower` reserves.
                    b: Loc {
                        base: Base::Arena,
                        offset: (r * sh * wp * 4) as u64,
                    },
                    out: cx
                        .out
                        .moved(img * (oc * oh * ow * 4) as i64 + ((row0 + r) * ow * 4) as i64),
                    c: bias,
                    src: (r == 0).then_some((image.moved(shift), routine)),
                });
            }
        }
    }
    if calls.len() > MAX_CALLS {
        return None;
    }
    Some(GemmSpec {
        b: BLayout::Taps {
            channel,
            kh,
            kw,
            row: (dh * wp * 4) as i64,
            col: (dw * 4) as i64,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        ..conv_gemm(oc, ow, k, elem, blocking, bias.is_some())
    })
}

/// Most taps of an implicit-GEMM convolution window (its k loop unrolls
/// them).
const MAX_TAPS: usize = 49;

/// An im2col matrix up to this size is built for the whole image at once.
const IM2COL_WHOLE_BYTES: u64 = 2 << 20;
/// A band's im2col matrix is kept under this size (when one output row
/// allows), so the GEMM reads it from L2 right after it is written.
const IM2COL_BAND_BYTES: u64 = 1 << 20;

/// Output rows per im2col band: the whole image when its matrix is small,
/// else the most rows dividing the output height (so every band is one
/// GEMM of the same width) whose matrix fits [`IM2COL_BAND_BYTES`], at
/// least one.
fn im2col_band(full: &Im2col) -> usize {
    if full.col_bytes() <= IM2COL_WHOLE_BYTES {
        return full.rows;
    }
    let row_bytes = full.col_bytes() / full.rows as u64;
    (1..=full.rows)
        .rev()
        .find(|&b| full.rows.is_multiple_of(b) && b as u64 * row_bytes <= IM2COL_BAND_BYTES)
        .unwrap_or(1)
}

/// A depthwise convolution (one input channel per group, any depth
/// multiplier) with W stride 1, weights read as they are.
fn depthwise_conv(cx: &NodeCx, c: &Conv2d) -> Option<DepthwiseSpec> {
    let (xloc, xty) = cx.inputs[0];
    let (wloc, wty) = cx.inputs[1];
    let (batch, cin, h, w) = (xty.shape[0], xty.shape[1], xty.shape[2], xty.shape[3]);
    let (oc, cg, kh, kw) = (wty.shape[0], wty.shape[1], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    let depthwise = c.group == cin && cg == 1 && oc % c.group == 0;
    if !depthwise || c.strides[1] > 2 || batch > MAX_CALLS || ow > 4096 {
        return None;
    }
    let rows = super::pool::window_segments(
        oh,
        h,
        kh,
        c.strides[0],
        c.pads[0],
        c.pads[2],
        c.dilations[0],
    )
    .into_iter()
    .map(|s| RowSegment {
        start: s.start,
        len: s.len,
        taps: s.taps,
    })
    .collect();
    let images = (0..batch as i64)
        .map(|img| {
            (
                xloc.moved(img * (cin * h * w * 4) as i64),
                cx.out.moved(img * (oc * oh * ow * 4) as i64),
            )
        })
        .collect();
    Some(DepthwiseSpec {
        groups: c.group,
        per_group: oc / c.group,
        h,
        w,
        kh,
        kw,
        oh,
        ow,
        stride_h: c.strides[0],
        stride_w: c.strides[1],
        pad_tl: [c.pads[0], c.pads[1]],
        dilations: c.dilations,
        rows,
        weights: wloc,
        bias: cx.inputs.get(2).map(|&(loc, _)| loc),
        images,
        epilogue: Vec::new(),
        store: crate::microkernel::Store::F32,
    })
}
