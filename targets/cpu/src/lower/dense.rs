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
    Instr, Node, NodeId, Op, Reg, UnaryOp, ValueType,
};

use super::elementwise::broadcast_strides;
use super::select::{decline, require, Attempt, Miss, OrDecline, Trail};
use super::NodeCx;
use crate::microkernel::depthwise::blocked::{worth_blocking, BlockedDepthwise};
use crate::microkernel::depthwise::{depthwise_epilogue_fits, DepthwiseSpec, RowSegment};
use crate::microkernel::elementwise::ElementwiseSpec;
use crate::microkernel::epilogue::{EpilogueOp, EpilogueStep, Operand};
use crate::microkernel::gemm::{
    epilogue_fits, packed_a_rows, ALayout, Activation, BLayout, Blocking, CLayout, Call, Elem,
    GemmSpec, PackedSide, MAX_MR,
};
use crate::microkernel::im2col::Im2col;
use crate::microkernel::pack::{
    pack_a, pack_a_half, pack_a_quads, pack_b, pack_b_half, pack_b_pairs, pack_b_quads, Half,
};
use crate::microkernel::{MicrokernelError, Vector};
use crate::plan::{Base, Loc, Scratch, Weights};

mod pixel_rows;
mod winograd;

/// Most arena scratch (bytes) one kernel uses: half for an im2col matrix,
/// half for a B panel.
const MAX_SCRATCH: u64 = 64 << 20;

/// The decline of a kernel whose im2col matrix or band copy would take
/// `bytes` of scratch.
fn too_much_scratch(bytes: u64) -> String {
    format!(
        "its scratch would be {bytes} bytes (limit {})",
        MAX_SCRATCH / 2
    )
}

/// The decline of a kernel of `calls` GEMM calls.
fn too_many_calls(calls: usize) -> String {
    format!("{calls} GEMM calls; one kernel unrolls at most {MAX_CALLS}")
}

/// Fewest full row tiles for which a strided B is packed into a scratch
/// panel per column tile (the copy costs one read of the panel).
const PANEL_MIN_ROW_TILES: usize = 4;

/// Most GEMM calls (batch entries) one kernel unrolls.
const MAX_CALLS: usize = 4096;

/// The microkernel of node `cx` as one or more independent tasks (see
/// [`partition`](super::partition); at most `tasks`; no tail) and the
/// name of the candidate that made it, or `None` when every candidate declined
/// (recorded in `trail`) and the Cranelift kernel should be used.
pub(crate) fn lower(
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
    machine: Machine,
    trail: &mut Trail,
) -> Result<Option<Served>, MicrokernelError> {
    lower_with(cx, weights, scratch, None, machine, trail)
}

/// What the dense candidates build for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Machine {
    /// The vector registers of the GEMM kernels (only zmm serves the
    /// depthwise, implicit-GEMM, im2col and int8 kernels).
    pub vector: Vector,
    /// The most tasks a kernel is split into.
    pub tasks: usize,
}

/// The code a dense candidate gave.
pub(crate) struct Served {
    /// A step before the head's (usually none): the im2col matrices its
    /// tasks share, or a Winograd input transform.
    pub before: Option<Step>,
    /// The tasks of the head's step.
    pub codes: Vec<Vec<u8>>,
    /// What is left of a fused program (see [`lower_fused`]).
    pub tail: Option<Tail>,
    /// A step between the head's and the tail: `None` when the head wrote
    /// the output.
    pub after: Option<After>,
    /// The candidate's name.
    pub kernel: &'static str,
}

/// Microkernel tasks run as a schedule step of their own, named after
/// the node with `suffix` (`conv_3/im2col`).
pub(crate) struct Step {
    pub suffix: &'static str,
    pub tasks: Vec<Vec<u8>>,
}

/// What turns the head's result into the output.
pub(crate) enum After {
    /// The head wrote `[N, P, C]` into this scratch (pixels as rows, see
    /// [`pixel_rows`]): the caller transposes it into the output.
    Transpose(Loc),
    /// These tasks write the output (a Winograd output transform).
    Step(Step),
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
/// `None` when the head has no microkernel (every candidate declined, see
/// `trail`).
pub(crate) fn lower_fused(
    cx: &NodeCx,
    k: &FusedKernel,
    weights: &mut Weights,
    scratch: &mut Scratch,
    machine: Machine,
    trail: &mut Trail,
) -> Result<Option<Served>, MicrokernelError> {
    let Some(h) = k.head() else {
        return Ok(None);
    };
    let node = super::fused::head_node(cx, &h.op);
    let hcx = super::fused::head_cx(cx, &node, h.inputs);
    lower_with(&hcx, weights, scratch, Some((cx, k)), machine, trail)
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

/// The tasks' code of candidate `kernel` and the tail, its source located.
fn finish(kernel: &'static str, parts: Parts, tail: Option<ElementwiseProgram>) -> Served {
    let Parts { im2col, gemm, src } = parts;
    Served {
        before: (!im2col.is_empty()).then_some(Step {
            suffix: "im2col",
            tasks: im2col,
        }),
        codes: gemm,
        tail: tail.map(|program| Tail { program, src }),
        after: None,
        kernel,
    }
}

/// [`lower`], and for the head of a fused node (`fused`: the fused node's
/// context and kernel) the program left after the store-loop epilogue,
/// which the caller runs over the whole output after the tasks. Every
/// candidate that declines is recorded in `trail`.
fn lower_with(
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    machine: Machine,
    trail: &mut Trail,
) -> Result<Option<Served>, MicrokernelError> {
    // Conditions every candidate of the op shares decline as its family.
    let family = match &cx.node.op {
        Op::MatMulInteger => INT8_GEMM,
        Op::ConvInteger(_) => INT8_IM2COL,
        Op::Conv(_) => on(machine.vector, CONV),
        _ => on(machine.vector, GEMM),
    };
    // A 1-D convolution along H is run along W (same bytes).
    let transposed = along_w(cx);
    let transposed_cx;
    let cx = match &transposed {
        Some((node, x, w)) => {
            let mut inputs = cx.inputs.clone();
            inputs[0].1 = x;
            inputs[1].1 = w;
            transposed_cx = NodeCx {
                graph: cx.graph,
                node,
                input_ids: cx.input_ids.clone(),
                inputs,
                out: cx.out,
            };
            &transposed_cx
        }
        None => cx,
    };
    match candidates(cx, weights, scratch, fused, machine, trail) {
        Ok(served) => Ok(served),
        Err(Miss::Declined(why)) => {
            trail.declined(family, why);
            Ok(None)
        }
        Err(Miss::Failed(e)) => Err(e),
    }
}

/// Convolution `cx` seen along W when it runs along H alone: an input,
/// window and output one column wide, unpadded along W (the `[N, C, L, 1]`
/// form of a 1-D convolution). `[N, C, L, 1]` and `[N, C, 1, L]` hold the
/// same bytes, and every kernel here vectorizes along W, so the node, its
/// input and its weights are returned with H and W (and their strides,
/// pads and dilations) swapped; `None` for any other node.
fn along_w(cx: &NodeCx) -> Option<(Node, ValueType, ValueType)> {
    let swap = |c: &Conv2d| Conv2d {
        strides: [c.strides[1], c.strides[0]],
        pads: [c.pads[1], c.pads[0], c.pads[3], c.pads[2]],
        dilations: [c.dilations[1], c.dilations[0]],
        group: c.group,
    };
    let op = match &cx.node.op {
        Op::Conv(c) => Op::Conv(swap(c)),
        Op::ConvInteger(c) => Op::ConvInteger(swap(c)),
        _ => return None,
    };
    let (x, w, y) = (cx.inputs[0].1, cx.inputs[1].1, &cx.node.ty);
    let c = match &cx.node.op {
        Op::Conv(c) | Op::ConvInteger(c) => c,
        _ => return None,
    };
    let column = x.shape[3] == 1 && w.shape[3] == 1 && y.shape[3] == 1;
    if !column || x.shape[2] == 1 || c.pads[1] != 0 || c.pads[3] != 0 {
        return None;
    }
    let swapped = |t: &ValueType| {
        let s = &t.shape;
        ValueType::new(t.dtype, vec![s[0], s[1], s[3], s[2]])
    };
    let node = Node {
        op,
        name: cx.node.name.clone(),
        ty: swapped(y),
    };
    Some((node, swapped(x), swapped(w)))
}

/// Candidate names: `isa/kernel`, named for zmm (see [`on`]).
const GEMM: &str = "avx512/gemm";
const CONV: &str = "avx512/conv";
const INT8_GEMM: &str = "avx512-vnni/gemm";
const INT8_IM2COL: &str = "avx512-vnni/im2col-gemm";
const DEPTHWISE: &str = "avx512/depthwise";
const DEPTHWISE_BLOCKED: &str = "avx512/depthwise-c16";
const FULLY_CONNECTED: &str = "avx512/fully-connected-gemm";
const POINTWISE: &str = "avx512/pointwise-gemm";
const IMPLICIT: &str = "avx512/implicit-gemm";
const IM2COL: &str = "avx512/im2col-gemm";
const TRANSPOSED: &str = "avx512/transposed-gemm";
const WINOGRAD: &str = "avx512/winograd";

/// The name of the float candidates on ymm registers.
const YMM_NAMES: [(&str, &str); 8] = [
    (GEMM, "avx2/gemm"),
    (CONV, "avx2/conv"),
    (DEPTHWISE, "avx2/depthwise"),
    (FULLY_CONNECTED, "avx2/fully-connected-gemm"),
    (POINTWISE, "avx2/pointwise-gemm"),
    (IMPLICIT, "avx2/implicit-gemm"),
    (IM2COL, "avx2/im2col-gemm"),
    (TRANSPOSED, "avx2/transposed-gemm"),
];

/// Candidate `name` (a zmm name) built from `vector`'s registers.
fn on(vector: Vector, name: &'static str) -> &'static str {
    match vector {
        Vector::Zmm => name,
        Vector::Ymm => YMM_NAMES
            .iter()
            .find(|(zmm, _)| *zmm == name)
            .map_or(name, |(_, ymm)| ymm),
    }
}

/// Declines a candidate that has no ymm form on a ymm machine (the int8
/// products: their kernels are AVX512-VNNI dot products).
fn zmm_only(vector: Vector) -> Attempt<()> {
    require(vector == Vector::Zmm, || {
        "built for AVX-512 only (the int8 kernels use AVX512-VNNI; AVX2 has no such dot product)"
            .into()
    })
}

/// Declines operands other than f32 on a ymm machine (the AVX2 GEMM reads
/// f32 only).
fn f32_on(vector: Vector, elem: Elem) -> Attempt<()> {
    require(vector == Vector::Zmm || elem == Elem::F32, || {
        format!("the operands are {elem:?}; the AVX2 kernel reads f32")
    })
}

/// A GEMM-based convolution candidate.
type ConvGemm = fn(&NodeCx, &mut Weights, &Conv2d, Machine) -> Attempt<GemmSpec>;

/// The GEMM convolutions in the order they are tried: a window that
/// covers the whole input (one output pixel: a squeeze-excite 1×1 on a
/// pooled map, a classifier written as a convolution) is a fully connected
/// layer, images as rows and channels as columns; a 1×1 convolution
/// reads its input as B in place; an implicit GEMM copies the input once
/// and reads the taps from the copy; im2col writes every tap, which costs
/// the most but serves any window and stride.
const CONV_GEMMS: [(&str, ConvGemm); 4] = [
    (FULLY_CONNECTED, fully_connected_conv),
    (POINTWISE, pointwise_conv),
    (IMPLICIT, implicit_conv),
    (IM2COL, im2col_conv),
];

/// [`CONV_GEMMS`] in the order that suits convolution `cx`: an implicit
/// GEMM re-reads all the weights for every output row (its GEMMs are one
/// row wide), im2col once per band of rows, so past
/// [`IMPLICIT_MAX_CHANNELS`] output channels per group, where the weights
/// outweigh the im2col copies, im2col goes first. A single output row
/// (a 1-D convolution) has no rows to share the weights across: there the
/// implicit GEMM reads them once too and stays first (4 convs of 384
/// channels, k7, over 250 steps: 15.6 ms implicit, 18.6 ms im2col).
fn conv_gemms(cx: &NodeCx, c: &Conv2d, vector: Vector) -> [(&'static str, ConvGemm); 4] {
    let [fully_connected, pointwise, implicit, im2col] = CONV_GEMMS;
    let (channels, rows) = (cx.node.ty.shape[1] / c.group.max(1), cx.node.ty.shape[2]);
    // A row-merged implicit GEMM reads the weights once per band, as
    // im2col does, from a copy a third of im2col's (for 3 columns of
    // taps): it goes first.
    if channels > IMPLICIT_MAX_CHANNELS && rows > 1 && !merges_rows(cx, c, vector) {
        [fully_connected, pointwise, im2col, implicit]
    } else {
        CONV_GEMMS
    }
}

/// Most output channels per group for which an implicit GEMM goes before
/// im2col (measured on the sweep's convolutions at one thread: on 3×3
/// windows of 32 and 64 channels the implicit GEMM was 6–60% faster, from
/// 96 channels im2col was as fast or up to 28% faster; a 5×5 of 64
/// channels on 35×35 was the exception, 6% slower than im2col).
const IMPLICIT_MAX_CHANNELS: usize = 64;

/// Longest K (input channels per group times taps) of a
/// [`row_merged_conv`] (a longer one keeps one GEMM per row, and past
/// [`IMPLICIT_MAX_CHANNELS`] output channels im2col first). Measured at
/// one thread (`kiln bench --profile` on the zoo's ResNet-18 and
/// VGG-16): 3×3 of 128 channels on 28×28 (K 1,152)
/// 2.43 → 2.15 ms with the merged GEMM first; 256 channels on 14×14 (K
/// 2,304) 2.30 → 2.40 ms; 512 channels on 7×7 (K 4,608) 2.9 → 6.5 ms and
/// on VGG's 28×28 3% slower: past a K of about 1,000 the taps' scattered
/// B loses to im2col's packed panels.
const IMPLICIT_MERGED_MAX_K: usize = 1152;

/// The candidates of [`lower_with`] in order; `Ok(None)` when each
/// declined (recorded in `trail`), a decline when a condition all of them
/// share fails.
fn candidates(
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    machine: Machine,
    trail: &mut Trail,
) -> Attempt<Option<Served>> {
    let Machine { vector, tasks } = machine;
    if cx.node.op.is_integer_product() {
        zmm_only(vector)?;
    }
    if vector == Vector::Ymm && fused.is_some_and(|(_, k)| k.store() != FusedStore::F32) {
        return decline("the kernel stores u8; the AVX2 store loop writes f32 only");
    }
    let integer = match &cx.node.op {
        Op::MatMulInteger => Some((INT8_GEMM, integer_matmul(cx, weights)?)),
        Op::ConvInteger(c) => Some((INT8_IM2COL, integer_conv(cx, weights, c)?)),
        _ => None,
    };
    if let Some((kernel, mut spec)) = integer {
        // A fused integer head converts to f32 in its store loop and takes
        // what it can of the program there.
        let tail = match fused {
            Some((fcx, k)) => {
                spec.to_f32 = true;
                let low = column_dims(&k.head().expect("a fused head").op);
                absorb(fcx, k, &mut spec, weights, low)
            }
            None => None,
        };
        let (output, tail) = head_output(fused, tail, weights);
        let parts = assemble_parts(cx, spec, scratch, tasks, output)?;
        return Ok(Some(finish(kernel, parts, tail)));
    }
    let float = |d: DType| matches!(d, DType::F32 | DType::BF16 | DType::F16);
    if let Some((_, t)) = cx.inputs.iter().find(|(_, t)| !float(t.dtype)) {
        return decline(format!(
            "an operand is {}; the kernels read f32, bf16 and f16",
            t.dtype
        ));
    }
    require(cx.node.ty.dtype == DType::F32, || {
        format!("the result is {}; the kernels write f32", cx.node.ty.dtype)
    })?;
    // Bias / C are read as f32 by the epilogue.
    require(
        cx.inputs.get(2).is_none_or(|(_, t)| t.dtype == DType::F32),
        || "the bias is not f32".into(),
    )?;
    require(cx.node.ty.num_elements() > 0, || {
        "the output is empty".into()
    })?;
    if let Op::Conv(c) = &cx.node.op {
        // Out-of-limit windows get the Cranelift path's error.
        if let Err(e) = super::conv::check_conv_window(cx, c) {
            return decline(e.to_string());
        }
    }
    let (kernel, spec) = match &cx.node.op {
        Op::MatMul => (GEMM, matmul(cx, weights, vector)?),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => (
            GEMM,
            gemm(cx, weights, vector, *alpha, *beta, (*trans_a, *trans_b))?,
        ),
        Op::Conv(c) => {
            if c.group > 1 {
                let served = depthwise_blocked(cx, c, weights, scratch, fused, machine);
                if let Some(served) = trail.attempt(DEPTHWISE_BLOCKED, served)? {
                    return Ok(Some(served));
                }
                let served = depthwise(cx, c, weights, scratch, fused, machine);
                if let Some(served) = trail.attempt(on(vector, DEPTHWISE), served)? {
                    return Ok(Some(served));
                }
            }
            let served = winograd::winograd_conv(cx, c, weights, scratch, fused, machine);
            if let Some(served) = trail.attempt(WINOGRAD, served)? {
                return Ok(Some(served));
            }
            let served = pixel_rows::transposed_conv(cx, c, weights, scratch, fused, machine);
            if let Some(served) = trail.attempt(on(vector, TRANSPOSED), served)? {
                return Ok(Some(served));
            }
            let mut chosen = None;
            for (name, candidate) in conv_gemms(cx, c, vector) {
                let spec = candidate(cx, weights, c, machine);
                if let Some(spec) = trail.attempt(on(vector, name), spec)? {
                    chosen = Some((name, spec));
                    break;
                }
            }
            match chosen {
                Some(chosen) => chosen,
                None => return Ok(None),
            }
        }
        op => return decline(format!("{} has no microkernel", op.name())),
    };
    let mut spec = spec;
    // The output dims the GEMM's columns span: a fully connected
    // convolution's columns are its channels (and the 1×1 pixel).
    let low = match (kernel, &cx.node.op) {
        (FULLY_CONNECTED, _) => cx.node.ty.shape.len() - 1,
        (_, Op::Conv(_)) => 2,
        _ => 1,
    };
    let tail = match fused {
        Some((fcx, k)) => absorb(fcx, k, &mut spec, weights, low),
        None => None,
    };
    if let Some(why) = spec.ymm_declines() {
        return decline(why);
    }
    let (output, tail) = head_output(fused, tail, weights);
    let spec = super::partition::in_row_bands(super::partition::batch_rows_folded(spec));
    let parts = assemble_parts(cx, spec, scratch, tasks, output)?;
    Ok(Some(finish(on(vector, kernel), parts, tail)))
}

/// How many GEMM FLOPs one depthwise FLOP costs, for counting tasks: the
/// depthwise kernel runs at 12–26 GFLOP/s on one core where the GEMMs
/// that [`super::partition::MIN_TASK_FLOPS`] was measured on run at
/// 100–150 (EfficientNet-B0's 5×5 depthwise convs on 14×14 with a SiLU:
/// 6.6 MFLOP, 0.25 ms, one task; `kiln bench --profile`).
const DEPTHWISE_FLOP_COST: usize = 4;

/// A depthwise convolution as [`DepthwiseSpec`] tasks, taking what it can
/// of a fused program in its store loop.
fn depthwise(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    Machine { vector, tasks }: Machine,
) -> Attempt<Served> {
    let (spec, tail) = depthwise_spec(cx, c, weights, fused, vector)?;
    let tasks = depthwise_tasks(cx, &spec, tasks);
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
            part.assemble()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let parts = Parts {
        im2col: Vec::new(),
        gemm: codes,
        src,
    };
    Ok(finish(on(vector, DEPTHWISE), parts, tail))
}

/// The depthwise kernel of `cx` with as much of `fused`'s program in its
/// store as fits (the rest returned, to run as a tail).
fn depthwise_spec(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    fused: Option<(&NodeCx, &FusedKernel)>,
    vector: Vector,
) -> Attempt<(DepthwiseSpec, Option<ElementwiseProgram>)> {
    // The depthwise kernel reads f32 only.
    if let Some((_, t)) = cx.inputs.iter().find(|(_, t)| t.dtype != DType::F32) {
        return decline(format!("an operand is {}; the kernel reads f32", t.dtype));
    }
    let mut spec = depthwise_conv(cx, c, vector)?;
    if let Some(why) = spec.ymm_declines() {
        return decline(why);
    }
    let mut tail = fused.map(|(_, k)| k.body().clone());
    if let (Some((fcx, k)), Some(program)) = (fused, &tail) {
        if let Some(steps) = epilogue_steps(fcx, k, program, weights, 2) {
            if depthwise_epilogue_fits(&steps, vector) {
                spec.epilogue = steps;
                tail = None;
            }
        }
    }
    Ok((spec, tail))
}

/// The tasks a depthwise kernel of `spec` is worth splitting into.
fn depthwise_tasks(cx: &NodeCx, spec: &DepthwiseSpec, tasks: usize) -> usize {
    let flops = 2 * cx.node.ty.num_elements() * spec.kh * spec.kw;
    let bytes = 4 * (cx.inputs[0].1.num_elements() + cx.node.ty.num_elements());
    super::partition::tasks_worth(tasks, DEPTHWISE_FLOP_COST * flops, bytes)
}

/// A depthwise convolution of a narrow map on 16-channel blocks
/// ([`BlockedDepthwise`]): tried before the row kernel, where the map
/// leaves most of its lanes empty and the window is large enough to pay
/// for the gathers.
fn depthwise_blocked(
    cx: &NodeCx,
    c: &Conv2d,
    weights: &mut Weights,
    scratch: &mut Scratch,
    fused: Option<(&NodeCx, &FusedKernel)>,
    Machine { vector, tasks }: Machine,
) -> Attempt<Served> {
    require(vector == Vector::Zmm, || {
        "AVX-512 only (a block is 16 channels of a zmm register)".into()
    })?;
    let (mut spec, tail) = depthwise_spec(cx, c, weights, fused, vector)?;
    if let Some(why) = BlockedDepthwise::declines(&spec) {
        return decline(why);
    }
    require(worth_blocking(&spec), || {
        format!(
            "a {}x{} window on a map {} wide: the row kernel fills enough lanes",
            spec.kh, spec.kw, spec.ow
        )
    })?;
    let Some(w) = f32_constant(cx.graph, cx.input_ids[1]) else {
        return decline("the weights are not an f32 constant");
    };
    let (output, tail) = head_output(fused, tail, weights);
    if matches!(output, HeadOutput::Narrow { .. }) {
        return decline("a u8 store (the row kernel narrows in its store loop)");
    }
    let taps = spec.kh * spec.kw;
    let blocked = weights_loc(
        weights,
        &BlockedDepthwise::block_weights(w, spec.groups, taps),
    );
    let tasks = depthwise_tasks(cx, &spec, tasks).min(spec.groups.div_ceil(16));
    let plane = BlockedDepthwise::scratch_bytes(&spec);
    let mut sizes = vec![plane; tasks];
    if matches!(output, HeadOutput::Scratch) {
        sizes.push(f32_bytes(cx));
    }
    let reserved = scratch.reserve(&sizes);
    let src = match output {
        HeadOutput::Scratch => reserved[tasks],
        _ => cx.out,
    };
    for image in &mut spec.images {
        image.1 = relocated(cx.out, image.1, src);
    }
    let kernel = BlockedDepthwise {
        spec,
        weights: blocked,
        scratch: reserved[0],
    };
    let codes = (kernel.split(&reserved[..tasks]).iter())
        .map(BlockedDepthwise::assemble)
        .collect::<Result<Vec<_>, _>>()?;
    let parts = Parts {
        im2col: Vec::new(),
        gemm: codes,
        src,
    };
    Ok(finish(DEPTHWISE_BLOCKED, parts, tail))
}

/// The conditions of a head `cx` whose fused program runs after a step
/// that follows the head's (`after`: what that step does): f32 stored,
/// and the program's output the head's shape.
fn program_after_head(
    cx: &NodeCx,
    fused: Option<(&NodeCx, &FusedKernel)>,
    after: &str,
) -> Attempt<()> {
    if let Some((fcx, k)) = fused {
        require(k.store() == FusedStore::F32, || {
            format!("the fused result is stored as u8; {after} f32")
        })?;
        require(fcx.node.ty.shape == cx.node.ty.shape, || {
            "the fused program broadcasts the convolution's result".into()
        })?;
    }
    Ok(())
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

/// The assembled tasks of a GEMM kernel.
pub(crate) struct Parts {
    /// A first step's tasks, which build the im2col matrices the GEMM
    /// tasks share (see [`super::partition::stage_im2col`]); empty when
    /// the GEMM tasks build their own.
    pub im2col: Vec<Vec<u8>>,
    /// The GEMM's tasks.
    pub gemm: Vec<Vec<u8>>,
    /// Where the f32 results are: the output, or the scratch that
    /// [`HeadOutput::Scratch`] reserves.
    pub src: Loc,
}

/// `spec` (the kernel of node `cx`) split into at most `tasks` kernels,
/// each with scratch of its own for its im2col matrix and B panel (or,
/// staged, after im2col tasks that fill one shared matrix), writing where
/// `output` says, assembled.
fn assemble_parts(
    cx: &NodeCx,
    spec: GemmSpec,
    scratch: &mut Scratch,
    tasks: usize,
    output: HeadOutput,
) -> Attempt<Parts> {
    let staged = super::partition::stage_im2col(&spec, tasks);
    let (spec, shared_col) = match &staged {
        Some(s) => (s.gemm.clone(), s.col_bytes),
        None => (spec, 0),
    };
    let parts = super::partition::split(spec, tasks);
    // Every task gets scratch of its own, since tasks run concurrently; the
    // f32 results of a u8 kernel with a tail come first, then the im2col
    // matrices that staged tasks share.
    let f32_scratch = matches!(output, HeadOutput::Scratch);
    let mut sizes: Vec<u64> = f32_scratch.then(|| f32_bytes(cx)).into_iter().collect();
    sizes.extend(staged.is_some().then_some(shared_col));
    sizes.extend(parts.iter().flat_map(|p| {
        let (col, panel) = scratch_bytes(p);
        [col, panel]
    }));
    let mut locs = if sizes.iter().any(|&b| b > 0) {
        scratch.reserve(&sizes)
    } else {
        Vec::new()
    };
    let src = if f32_scratch { locs.remove(0) } else { cx.out };
    // Staged: the shared matrices, and the im2col tasks that fill them.
    let mut im2col = Vec::new();
    let shared = match staged {
        Some(staged) => {
            let col = locs.remove(0);
            for mut kernel in staged.im2col {
                for job in &mut kernel.jobs {
                    job.1 = col.moved(job.1.offset as i64);
                }
                im2col.push(kernel.assemble()?);
            }
            Some(col)
        }
        None => None,
    };
    let sizes = &sizes[sizes.len() - 2 * parts.len()..];
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
        // The im2col operand was addressed relative to the start of its
        // scratch.
        let col = shared.or((sizes[2 * t] > 0).then(|| locs[2 * t]));
        if let Some(col) = col {
            for call in &mut part.calls {
                match part.im2col_into_a {
                    true => call.a = col.moved(call.a.offset as i64),
                    false => call.b = col.moved(call.b.offset as i64),
                }
            }
        }
        if sizes[2 * t + 1] > 0 {
            part.b_panel = Some(locs[2 * t + 1]);
        }
        codes.push(part.assemble()?);
    }
    Ok(Parts {
        im2col,
        gemm: codes,
        src,
    })
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
    low: usize,
) -> Option<ElementwiseProgram> {
    let rest = absorb_prefix(cx, k, spec, low)?;
    match epilogue_steps(cx, k, &rest, weights, low) {
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
fn absorb_prefix(
    cx: &NodeCx,
    k: &FusedKernel,
    spec: &mut GemmSpec,
    low: usize,
) -> Option<ElementwiseProgram> {
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
        if let (Some(act), true) = (activation(u), r == cur) {
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

/// The store-loop activation that unary op `u` is, if any.
fn activation(u: UnaryOp) -> Option<Activation> {
    match u {
        UnaryOp::Relu => Some(Activation::Relu),
        UnaryOp::Clip { min, max } => Some(Activation::Clip { lo: min, hi: max }),
        _ => None,
    }
}

/// `program` (register 0: the GEMM's output element after C and the
/// activation; registers `1..`: the fused kernel's extra inputs) as
/// epilogue steps, when every extra input is one f32, one per output
/// row (per channel of a convolution) or one per output column of a
/// product (a bias or an int8 rescale along the last axis), and every instruction is `+ - × ÷`
/// or a unary op made of them with constants: Relu, Clip, Neg,
/// LeakyRelu (0 ≤ α ≤ 1), HardSigmoid, HardSwish, Erf (the rational
/// approximation of `math::erf`) and erf-form Gelu, Tanh and tanh-form
/// Gelu (the rational function of `math::tanh`), Exp and Sigmoid (the
/// polynomial of `math::exp`, `2^n` by `vscalefps`), and Round (ties to
/// even, one instruction). Constants go to the weights section. `None`
/// otherwise.
fn epilogue_steps(
    cx: &NodeCx,
    k: &FusedKernel,
    program: &ElementwiseProgram,
    weights: &mut Weights,
    low: usize,
) -> Option<Vec<EpilogueStep>> {
    let h = k.head()?;
    let shape = &cx.node.ty.shape;
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
        } else if !matches!(h.op, DenseOp::Conv(_) | DenseOp::ConvInteger(_)) || low > 2 {
            // One value per GEMM column: contiguous along the column dims
            // (size-1 dims aside), constant along the others. A
            // convolution's columns are its pixels (`low` 2: the GEMM and
            // depthwise store loops read no per-pixel operand), except a
            // fully connected one's, which are its channels (`low` 3).
            let per_column = (0..shape.len()).all(|d| match d > row_dim {
                true => shape[d] == 1 || es[d] == shape[d + 1..].iter().product::<usize>() as i64,
                false => es[d] == 0,
            });
            per_column.then_some(Operand::PerColumn(loc))
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
                    UnaryOp::Erf => b.odd_rational(x, &super::math::ERF),
                    UnaryOp::Tanh => b.odd_rational(x, &super::math::TANH),
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
                        let t = b.odd_rational(t, &super::math::ERF);
                        let t = b.emit_const(Add, t, 1.0);
                        let t = b.emit(Mul, x, t);
                        b.emit_const(Mul, t, 0.5)
                    }
                    UnaryOp::Gelu { tanh: true } => {
                        // x · sigmoid(2u) = x / (1 + e^(-2u)), u = √(2/π) ·
                        // (x + 0.044715·x³), as `lower::elementwise`
                        // computes x/2 · (1 + tanh u) without its
                        // cancellation where tanh u is near -1.
                        let x2 = b.emit(Mul, x, x);
                        let x3 = b.emit(Mul, x2, x);
                        let t = b.emit_const(Mul, x3, 0.044_715);
                        let t = b.emit(Add, t, x);
                        let k = -2.0 * (2.0 / std::f64::consts::PI).sqrt();
                        let t = b.emit_const(Mul, t, k as f32);
                        let e = b.exp(t);
                        let d = b.emit_const(Add, e, 1.0);
                        b.emit(Div, x, d)
                    }
                    _ => return None,
                }
            }
        };
        value.push(Some(v));
    }
    Some(b.steps)
}

/// A fused node without a head (`cx`, kernel `k`) as elementwise kernels
/// on `machine`'s registers (up to its tasks; ymm: f32 stores only), when
/// its program has a step form and every
/// input is f32 of the output's shape (slot 0: the first input), one value,
/// one value per index of the last axis (a bias), or one value per index of
/// one axis with only unit axes before it (a per-channel operand of a
/// single image: one value per row). `None` otherwise (the Cranelift kernel
/// runs it).
pub(crate) fn lower_headless<'a>(
    cx: &'a NodeCx,
    k: &FusedKernel,
    weights: &mut Weights,
    Machine { vector, tasks }: Machine,
) -> Option<impl Iterator<Item = Result<Vec<u8>, MicrokernelError>> + 'a> {
    let shape = &cx.node.ty.shape;
    let n = cx.node.ty.num_elements();
    if k.head().is_some() || cx.node.ty.dtype != k.store().dtype() || n == 0 {
        return None;
    }
    if vector == Vector::Ymm && k.store() != FusedStore::F32 {
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
    if !ElementwiseSpec::fits(&steps, vector) {
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
        vector,
    };
    let zero = (k.store() != FusedStore::F32).then(|| f32_zero(weights));
    // Large enough that a task is worth its wake-up (as split_elementwise).
    let tasks = tasks.min(n / (1 << 14)).max(1);
    Some(spec.split(tasks).into_iter().map(move |p| match zero {
        Some(zero) => p.narrowed(cx.out, zero).assemble(),
        None => p.assemble(),
    }))
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

    /// `r` at `x` as `math::odd_rational` computes it (`math::erf`,
    /// `math::tanh`); the clamps take x second, so a NaN stays NaN.
    fn odd_rational(&mut self, x: Operand, r: &super::math::OddRational) -> Operand {
        use EpilogueOp::{Add, Div, Max, Min, Mul};
        let hi = self.konst(r.clamp);
        let x = self.emit(Min, hi, x);
        let lo = self.konst(-r.clamp);
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
        let n = horner(r.numerator);
        let d = horner(r.denominator);
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

/// The GEMM tile `(vector, m, n, max_rows)` ([`Blocking::choose_within`])
/// for a node whose input `packed.0`, a constant, is packed at compile time
/// along side `packed.1` (`packed.2` says how: shapes and element types).
/// A constant an earlier profile packed keeps its tile side
/// ([`Weights::shared_side`]); with no constant packed, the free choice.
fn packed_blocking(
    cx: &NodeCx,
    weights: &mut Weights,
    packed: Option<(usize, PackedSide, String)>,
    (vector, m, n, max_rows): (Vector, usize, usize, usize),
) -> Blocking {
    let Some((input, side, how)) = packed else {
        return Blocking::choose_for(vector, m, n, max_rows);
    };
    let name = &cx.graph.node(cx.input_ids[input]).name;
    weights.shared_side(format!("{side:?} {name} {how}"), |fixed| {
        let tile = Blocking::choose_within(vector, m, n, max_rows, fixed.map(|v| (side, v)));
        (tile, tile.side(side))
    })
}

/// [`packed_blocking`] for a convolution whose weights are the packed A.
fn conv_weights_blocking(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    elem: Elem,
    tile: (Vector, usize, usize, usize),
) -> Blocking {
    let w = &cx.inputs[1].1.shape;
    let how = format!("{w:?} g{} {elem:?}", c.group);
    packed_blocking(cx, weights, Some((1, PackedSide::Rows, how)), tile)
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

/// The bytes [`pack_b_for`] makes of a `k × n` B in panels of `nr`.
fn packed_b_len(elem: Elem, k: usize, n: usize, nr: usize) -> usize {
    let columns = n.div_ceil(nr) * nr;
    match elem {
        Elem::Bf16Dot => columns * k.div_ceil(2) * 2 * 2,
        Elem::WidenB(_) => columns * k * 2,
        _ => columns * k * 4,
    }
}

/// The bytes [`pack_w_for`] makes of `oc × k` weights in panels of `mr`.
fn packed_w_len(elem: Elem, oc: usize, k: usize, mr: usize) -> usize {
    let rows = oc.div_ceil(mr) * mr;
    match elem {
        Elem::WidenA(_) => rows * k * 2,
        _ => rows * k * 4,
    }
}

/// The weights location of `len` packed bytes that `pack` makes: packed
/// only when the blob stores them (the plan that measures scratch needs
/// the length alone; packing a large model's weights twice cost seconds).
fn packed_loc(weights: &mut Weights, len: usize, pack: impl FnOnce() -> Vec<u8>) -> Loc {
    let offset = weights.add_with(len as u64, || {
        let bytes = pack();
        assert_eq!(
            bytes.len(),
            len,
            "a packing's length was mispredicted (a Kiln bug)"
        );
        bytes
    });
    Loc {
        base: Base::Weights,
        offset,
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
fn matmul(cx: &NodeCx, weights: &mut Weights, vector: Vector) -> Attempt<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (bloc, bty) = cx.inputs[1];
    let shape = super::linalg::MatMulShape::of(&aty.shape, &bty.shape)
        .or_decline(|| "the operand shapes do not broadcast".into())?;
    let (m, k, n) = (shape.m, shape.k, shape.n);
    let (a_batch, b_batch, batch) = (shape.a_batch(), shape.b_batch(), &shape.batch);
    let count: usize = batch.iter().product();
    require(count <= MAX_CALLS, || {
        format!("{count} products in the batch; one kernel unrolls at most {MAX_CALLS}")
    })?;
    require(k > 0, || "the reduction is empty".into())?;
    let elem = product_elem(aty.dtype, bty.dtype)
        .or_decline(|| format!("no kernel multiplies {} by {}", aty.dtype, bty.dtype))?;
    f32_on(vector, elem)?;
    let b_const = float_constant(cx.graph, cx.input_ids[1]);
    require(elem == Elem::F32 || b_const.is_some(), || {
        "a 16-bit B must be a constant packed at compile time".into()
    })?;
    let b_const = b_const.as_deref();
    let a_const = f32_constant(cx.graph, cx.input_ids[0]).filter(|_| elem == Elem::F32);
    // Bytes of one stored A element.
    let ea = aty.dtype.size_bytes();
    let a_packed = a_const.is_some() && b_const.is_none();
    // Products of a shared B over a batch of A matrices become one GEMM
    // over all their rows when the fused program allows
    // (`partition::batch_rows_folded`): the tile is chosen for those rows.
    let foldable = !a_packed && a_batch == batch.as_slice() && b_batch.iter().all(|&d| d == 1);
    let rows = if foldable { count * m } else { m };
    let max_rows = if a_packed { packed_a_rows(k) } else { MAX_MR };
    let mats = |sh: &[usize]| sh.iter().product::<usize>();
    let packed = match (b_const.is_some(), a_packed) {
        (true, _) => Some((
            1,
            PackedSide::Columns,
            format!("{k}x{n}x{} {elem:?}", mats(b_batch)),
        )),
        (false, true) => Some((0, PackedSide::Rows, format!("{m}x{k}x{}", mats(a_batch)))),
        _ => None,
    };
    let blocking = packed_blocking(cx, weights, packed, (vector, rows, n, max_rows));
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
            let per = packed_b_len(elem, k, n, blocking.nr());
            let base = packed_loc(weights, per * mats(b_batch), || {
                let pack = |q| pack_b_for(elem, &v[q * k * n..], k, n, n, 1, blocking.nr());
                (0..mats(b_batch)).flat_map(pack).collect()
            });
            (BLayout::Packed, base, per as i64)
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
    Ok(GemmSpec {
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
        im2col_into_a: false,
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
fn integer_matmul(cx: &NodeCx, weights: &mut Weights) -> Attempt<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (_, bty) = cx.inputs[1];
    require(aty.dtype == DType::U8, || {
        format!("A is {}; the kernel reads u8", aty.dtype)
    })?;
    require(aty.shape.len() >= 2 && bty.shape.len() == 2, || {
        "B must be one matrix and A at least one".into()
    })?;
    let (k, n) = (bty.shape[0], bty.shape[1]);
    let m = aty.num_elements() / k.max(1);
    require(k > 0 && m > 0 && n > 0, || "a dimension is empty".into())?;
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
    Ok(GemmSpec {
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
        im2col_into_a: false,
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
    vector: Vector,
    alpha: f32,
    beta: f32,
    (trans_a, trans_b): (bool, bool),
) -> Attempt<GemmSpec> {
    let (aloc, aty) = cx.inputs[0];
    let (bloc, _) = cx.inputs[1];
    let (m, k) = if trans_a {
        (aty.shape[1], aty.shape[0])
    } else {
        (aty.shape[0], aty.shape[1])
    };
    let n = cx.node.ty.shape[1];
    require(k > 0, || "the reduction is empty".into())?;
    // Element strides of op(A)[i, k] and op(B)[k, j] in the stored tensors.
    let (a_row, a_col) = if trans_a { (1, m) } else { (k, 1) };
    let (b_row, b_col) = if trans_b { (1, k) } else { (n, 1) };
    let bdt = cx.inputs[1].1.dtype;
    let elem = product_elem(aty.dtype, bdt)
        .or_decline(|| format!("no kernel multiplies {} by {bdt}", aty.dtype))?;
    f32_on(vector, elem)?;
    let b_const = float_constant(cx.graph, cx.input_ids[1]);
    require(elem == Elem::F32 || b_const.is_some(), || {
        "a 16-bit B must be a constant packed at compile time".into()
    })?;
    // A bf16 dot reads A pairs along k, which a transposed A does not have.
    require(!(elem == Elem::Bf16Dot && trans_a), || {
        "a bf16 dot product reads A along k, which trans_a is not".into()
    })?;
    let b_const = b_const.as_deref();
    let a_const = f32_constant(cx.graph, cx.input_ids[0]).filter(|_| elem == Elem::F32);
    let ea = aty.dtype.size_bytes();
    let a_packed = a_const.is_some() && b_const.is_none();
    let max_rows = if a_packed { packed_a_rows(k) } else { MAX_MR };
    let packed = match (b_const.is_some(), a_packed) {
        (true, _) => Some((
            1,
            PackedSide::Columns,
            format!("{k}x{n}{trans_b:?} {elem:?}"),
        )),
        (false, true) => Some((0, PackedSide::Rows, format!("{m}x{k}{trans_a:?}"))),
        _ => None,
    };
    let blocking = packed_blocking(cx, weights, packed, (vector, m, n, max_rows));
    let (b, b_base) = match b_const {
        Some(v) => {
            let len = packed_b_len(elem, k, n, blocking.nr());
            let base = packed_loc(weights, len, || {
                pack_b_for(elem, v, k, n, b_row, b_col, blocking.nr())
            });
            (BLayout::Packed, base)
        }
        None if !trans_b => (
            BLayout::Strided {
                row: (n * 4) as i64,
            },
            bloc,
        ),
        // Columns of a dynamic transposed B are not contiguous.
        None => {
            return decline("B is a run-time value with trans_b: its columns are not contiguous")
        }
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
    Ok(GemmSpec {
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
        im2col_into_a: false,
        u8_zero: None,
        row_sums: None,
        to_f32: false,
        store: crate::microkernel::Store::F32,
        epilogue: Vec::new(),
    })
}

/// The channel groups of a convolution as the GEMM kernels run them: one
/// GEMM call per image and group, each group's packed weights after the
/// previous group's (`a_stride` bytes apart).
#[derive(Clone, Copy, Debug)]
struct Groups {
    /// Number of groups.
    count: usize,
    /// Input channels per group.
    cin: usize,
    /// Output channels per group (the GEMM's rows).
    oc: usize,
    /// Bytes between two groups' packed weights.
    a_stride: i64,
}

impl Groups {
    /// The offsets (bytes) of group `g` in the input image, the output
    /// image, the packed weights and the bias, for an input of `in_plane`
    /// and an output of `out_plane` bytes per channel.
    fn offsets(&self, g: usize, in_plane: usize, out_plane: usize) -> (i64, i64, i64, i64) {
        (
            (g * self.cin * in_plane) as i64,
            (g * self.oc * out_plane) as i64,
            g as i64 * self.a_stride,
            (g * self.oc * 4) as i64,
        )
    }
}

/// The weights of a (grouped) convolution with `k` values per output
/// channel, packed per group into panels of `mr` rows, in the weights
/// section; where they start and the groups' geometry.
fn pack_conv_weights(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    elem: Elem,
    mr: usize,
) -> Attempt<(Loc, Groups)> {
    let wv = float_constant(cx.graph, cx.input_ids[1])
        .or_decline(|| "the weights are not a constant".into())?;
    let wty = cx.inputs[1].1;
    let (oc, cin_g) = (wty.shape[0], wty.shape[1]);
    let k = cin_g * wty.shape[2] * wty.shape[3];
    let oc_g = oc / c.group;
    let part = packed_w_len(elem, oc_g, k, mr);
    let base = packed_loc(weights, part * c.group, || {
        let pack = |g| pack_w_for(elem, &wv[g * oc_g * k..(g + 1) * oc_g * k], oc_g, k, mr);
        (0..c.group).flat_map(pack).collect()
    });
    let groups = Groups {
        count: c.group,
        cin: cin_g,
        oc: oc_g,
        a_stride: part as i64,
    };
    Ok((base, groups))
}

/// The shared conditions of the float GEMM convolutions: their element
/// types, and at most [`MAX_CALLS`] images × groups.
fn conv_gemm_elem(cx: &NodeCx, c: &Conv2d) -> Attempt<Elem> {
    let (xty, wty) = (cx.inputs[0].1, cx.inputs[1].1);
    let calls = xty.shape[0] * c.group;
    require(calls <= MAX_CALLS, || too_many_calls(calls))?;
    require(wty.shape[1] * wty.shape[2] * wty.shape[3] > 0, || {
        "the window is empty".into()
    })?;
    conv_elem(xty.dtype, wty.dtype)
        .or_decline(|| format!("no kernel convolves {} by {}", xty.dtype, wty.dtype))
}

/// A convolution whose window covers its whole (unpadded) input, so each
/// image has one output pixel: a fully connected layer, `Y[img, oc] =
/// bias[oc] + X[img, :] @ W[oc, :]ᵀ` with the images as GEMM rows and the
/// channels as columns (NCHW X is `[N, C·kh·kw]` in the weights' row
/// order; W is packed transposed at compile time). The other GEMMs would
/// make the channels the rows and the one pixel the columns: one lane of
/// each 16 used (MobileNetV3's squeeze-excite 960 → 240 on a pooled map:
/// 0.080 ms, onnxruntime 0.023).
fn fully_connected_conv(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    machine: Machine,
) -> Attempt<GemmSpec> {
    let (xloc, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, h, w) = (xty.shape[0], xty.shape[2], xty.shape[3]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    require((kh, kw) == (h, w), || {
        format!("the {kh}x{kw} window does not cover the {h}x{w} input")
    })?;
    require(c.pads == [0, 0, 0, 0] && c.group == 1, || {
        "the convolution is padded or grouped".into()
    })?;
    require(c.dilations == [1, 1], || {
        "the convolution is dilated".into()
    })?;
    let elem = conv_elem(xty.dtype, wty.dtype)
        .and(product_elem(xty.dtype, wty.dtype))
        .or_decline(|| format!("no kernel convolves {} by {}", xty.dtype, wty.dtype))?;
    f32_on(machine.vector, elem)?;
    let wv = float_constant(cx.graph, cx.input_ids[1])
        .or_decline(|| "the weights are not a constant".into())?;
    let k = wty.shape[1] * kh * kw;
    require(k > 0, || "the window is empty".into())?;
    let packed = Some((1, PackedSide::Columns, format!("{k}x{oc}T {elem:?}")));
    let blocking = packed_blocking(cx, weights, packed, (machine.vector, batch, oc, MAX_MR));
    let packed_len = packed_b_len(elem, k, oc, blocking.nr());
    let packed = packed_loc(weights, packed_len, || {
        pack_b_for(elem, &wv, k, oc, 1, k, blocking.nr())
    });
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let ea = xty.dtype.size_bytes() as i64;
    Ok(GemmSpec {
        a: ALayout::Strided {
            row: k as i64 * ea,
            col: ea,
        },
        out_row: (oc * 4) as i64,
        c: bias.map(|_| CLayout {
            row: 0,
            per_column: true,
            beta: 1.0,
        }),
        calls: vec![Call {
            a: xloc,
            b: packed,
            out: cx.out,
            c: bias,
            src: None,
        }],
        ..conv_gemm(batch, oc, k, elem, blocking, false)
    })
}

/// The dims of a 2-D convolution node (NCHW): the input `[batch, cin, h,
/// w]`, the weights `[oc, cin_g, kh, kw]` and the output's `[oh, ow]`.
#[derive(Clone, Copy)]
struct ConvDims {
    x: [usize; 4],
    w: [usize; 4],
    y: [usize; 2],
}

impl ConvDims {
    fn of(cx: &NodeCx) -> ConvDims {
        let dims = |s: &[usize]| [s[0], s[1], s[2], s[3]];
        let y = &cx.node.ty.shape;
        ConvDims {
            x: dims(&cx.inputs[0].1.shape),
            w: dims(&cx.inputs[1].1.shape),
            y: [y[2], y[3]],
        }
    }
}

/// A 1×1, stride-1, unpadded convolution with constant weights: per image
/// and group, `Y[oc, p] = bias[oc] + W[oc, :] @ X[:, p]` over the `H*W`
/// positions `p` (NCHW needs no transposition).
fn pointwise_conv(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    machine: Machine,
) -> Attempt<GemmSpec> {
    let xloc = cx.inputs[0].0;
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, _, kh, kw],
        ..
    } = ConvDims::of(cx);
    require((kh, kw) == (1, 1), || {
        format!("the window is {kh}x{kw}, not 1x1")
    })?;
    require(c.strides == [1, 1] && c.pads == [0, 0, 0, 0], || {
        "the convolution is strided or padded".into()
    })?;
    let elem = conv_gemm_elem(cx, c)?;
    f32_on(machine.vector, elem)?;
    let p = h * w;
    let cin_g = cin / c.group;
    let blocking = conv_weights_blocking(
        cx,
        weights,
        c,
        elem,
        (machine.vector, oc / c.group, p, packed_a_rows(cin_g)),
    );
    let (a_base, groups) = pack_conv_weights(cx, weights, c, elem, blocking.mr)?;
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let mut calls = Vec::with_capacity(batch * groups.count);
    for img in 0..batch {
        for g in 0..groups.count {
            let (x_off, y_off, a_off, c_off) = groups.offsets(g, p * 4, p * 4);
            calls.push(Call {
                a: a_base.moved(a_off),
                b: xloc.moved((img * cin * p * 4) as i64 + x_off),
                out: cx.out.moved((img * oc * p * 4) as i64 + y_off),
                c: bias.map(|b| b.moved(c_off)),
                src: None,
            });
        }
    }
    Ok(GemmSpec {
        b: BLayout::Strided {
            row: (p * 4) as i64,
        },
        out_row: (p * 4) as i64,
        calls,
        ..conv_gemm(groups.oc, p, cin_g, elem, blocking, bias.is_some())
    })
}

/// A convolution with constant weights as im2col + GEMM: per image and
/// group, `col[Cin*kh*kw, OH*OW]` is built in arena scratch (in bands of
/// output rows when large), then `Y[oc, p] = bias[oc] + W[oc, :] @ col[:,
/// p]` (OIHW weights are already `[OC, Cin*kh*kw]` in the row order of
/// `col`).
fn im2col_conv(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    machine: Machine,
) -> Attempt<GemmSpec> {
    let ConvDims {
        w: [oc, cin_g, kh, kw],
        y: [oh, ow],
        ..
    } = ConvDims::of(cx);
    let elem = conv_gemm_elem(cx, c)?;
    f32_on(machine.vector, elem)?;
    let full = Im2col {
        cin: cin_g,
        ..whole_image_im2col(cx, c, None, machine.vector)
    };
    let band = im2col_band(&full);
    let first = Im2col { rows: band, ..full };
    require(first.col_bytes() <= MAX_SCRATCH / 2, || {
        too_much_scratch(first.col_bytes())
    })?;
    let (k, p) = (cin_g * kh * kw, band * ow);
    let blocking = conv_weights_blocking(
        cx,
        weights,
        c,
        elem,
        (machine.vector, oc / c.group, p, packed_a_rows(k)),
    );
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let (a_base, groups) = pack_conv_weights(cx, weights, c, elem, blocking.mr)?;
    // `lower` points B at the im2col matrix once scratch is reserved.
    let (routines, calls) = banded_calls(cx, first, a_base, bias, groups);
    require(calls.len() <= MAX_CALLS, || too_many_calls(calls.len()))?;
    Ok(GemmSpec {
        b: BLayout::Strided {
            row: (p * 4) as i64,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        ..conv_gemm(groups.oc, p, k, elem, blocking, bias.is_some())
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
fn integer_conv(cx: &NodeCx, weights: &mut Weights, c: &Conv2d) -> Attempt<GemmSpec> {
    let (_, xty) = cx.inputs[0];
    let (_, wty) = cx.inputs[1];
    let (batch, cin) = (xty.shape[0], xty.shape[1]);
    let (oc, kh, kw) = (wty.shape[0], wty.shape[2], wty.shape[3]);
    let (oh, ow) = (cx.node.ty.shape[2], cx.node.ty.shape[3]);
    require(xty.dtype == DType::U8, || {
        format!("X is {}; the kernel reads u8", xty.dtype)
    })?;
    require(c.group == 1, || {
        format!("{} groups; the kernel is ungrouped", c.group)
    })?;
    require(batch <= MAX_CALLS, || {
        format!("batch {batch} > {MAX_CALLS}")
    })?;
    require(cin * kh * kw > 0 && cx.node.ty.num_elements() > 0, || {
        "a dimension is empty".into()
    })?;
    if let Err(e) = super::conv::check_conv_window(cx, c) {
        return decline(e.to_string());
    }
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
    let full = whole_image_im2col(cx, c, Some(zero), Vector::Zmm);
    let band = im2col_band(&full);
    let first = Im2col { rows: band, ..full };
    require(first.col_bytes() <= MAX_SCRATCH / 2, || {
        too_much_scratch(first.col_bytes())
    })?;
    let p = band * ow;
    let blocking = Blocking::choose(oc, p, packed_a_rows(k));
    let a_base = weights_loc(weights, &pack_a_quads(&wq, oc, k, blocking.mr));
    let (row_sums, u8_zero) = if zero_point_is_0(cx, 2) {
        (None, None)
    } else {
        let bytes: Vec<u8> = sums.iter().flat_map(|v| v.to_le_bytes()).collect();
        (Some(weights_loc(weights, &bytes)), Some(zero))
    };
    let ungrouped = Groups {
        count: 1,
        cin,
        oc,
        a_stride: 0,
    };
    let (routines, calls) = banded_calls(cx, first, a_base, None, ungrouped);
    require(calls.len() <= MAX_CALLS, || too_many_calls(calls.len()))?;
    Ok(GemmSpec {
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
fn signed_constant(cx: &NodeCx, slot: usize, zero_slot: usize) -> Attempt<Vec<i8>> {
    let shift = match cx.inputs[slot].1.dtype {
        DType::I8 => 0,
        DType::U8 => 128,
        d => return decline(format!("the weights are {d}; the kernel reads i8 or u8")),
    };
    let zero = cx
        .graph
        .constant(cx.input_ids[zero_slot])
        .or_decline(|| "the weights' zero point is not a constant".into())?
        .to_i64_vec();
    require(zero.iter().all(|&z| z == shift), || {
        format!("the weights' zero point is not {shift} (the kernel needs signed weights)")
    })?;
    let v = cx
        .graph
        .constant(cx.input_ids[slot])
        .or_decline(|| "the weights are not a constant".into())?
        .to_i64_vec();
    Ok(v.iter().map(|&x| (x - shift) as i8).collect())
}

/// Whether the zero point at kernel input `slot` is the constant 0 (its
/// correction can be left out).
fn zero_point_is_0(cx: &NodeCx, slot: usize) -> bool {
    cx.graph
        .constant(cx.input_ids[slot])
        .is_some_and(|t| t.to_i64_vec() == [0])
}

/// The GEMM calls of an im2col convolution `cx` converted in bands of
/// `first.rows` output rows: per image, group and band, B built by the
/// band's routine into scratch (offset 0 here; `lower` places it), A at
/// `a` (moved per group), C at `c`. One routine per distinct band
/// geometry; a band reuses one with the image moved down by the rows
/// between them.
fn banded_calls(
    cx: &NodeCx,
    first: Im2col,
    a: Loc,
    c: Option<Loc>,
    groups: Groups,
) -> (Vec<Im2col>, Vec<Call>) {
    let (xloc, xty) = cx.inputs[0];
    let (oc, oh, ow) = (
        cx.node.ty.shape[1],
        cx.node.ty.shape[2],
        cx.node.ty.shape[3],
    );
    let plane = xty.shape[2] * xty.shape[3] * first.elem_bytes();
    let image = (xty.shape[1] * plane) as i64;
    let col = Loc {
        base: Base::Arena,
        offset: 0,
    };
    let mut routines: Vec<Im2col> = Vec::new();
    let mut calls = Vec::new();
    for img in 0..xty.shape[0] as i64 {
        for g in 0..groups.count {
            let (x_off, y_off, a_off, c_off) = groups.offsets(g, plane, oh * ow * 4);
            for row0 in (0..oh).step_by(first.rows) {
                let (routine, shift) = band_routine(&mut routines, Im2col { row0, ..first });
                calls.push(Call {
                    a: a.moved(a_off),
                    b: col,
                    out: cx
                        .out
                        .moved(img * (oc * oh * ow * 4) as i64 + y_off + (row0 * ow * 4) as i64),
                    c: c.map(|c| c.moved(c_off)),
                    src: Some((xloc.moved(img * image + x_off + shift), routine)),
                });
            }
        }
    }
    (routines, calls)
}

/// The im2col of one whole image of convolution `cx` (f32, or quads
/// padded with the zero point at `quads`).
fn whole_image_im2col(cx: &NodeCx, c: &Conv2d, quads: Option<Loc>, vector: Vector) -> Im2col {
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
        vector,
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
        im2col_into_a: false,
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
    let i = super::intern(routines, geo, |r| r.band_key() == key);
    let shift = (geo.row0 - routines[i].row0) * geo.strides[0] * geo.w * geo.elem_bytes();
    (i, shift as i64)
}

/// A convolution with W stride 1 and constant weights as an implicit
/// GEMM: per band of output rows, the input rows the band reads are copied
/// once into arena scratch with their padding made explicit (`[Cin, rows,
/// pl + W + pr]`), and every output row is one GEMM per group `Y[oc, ow] =
/// bias[oc] + W[oc, :] @ B` whose B the kernel reads in place from that
/// copy ([`BLayout::Taps`]: per channel, the `kh × kw` taps at fixed
/// offsets). Against [`im2col_conv`] this writes the input once instead of
/// `kh * kw` times, but each GEMM is one output row wide: at H stride 1,
/// rows that do not fill whole vectors merge into one GEMM per band
/// ([`row_merged_conv`]); otherwise it declines rows too narrow to fill
/// the vectors, which im2col packs together. Bands are cut small enough
/// for L2 and numerous enough for `tasks`.
fn implicit_conv(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    Machine { tasks, vector }: Machine,
) -> Attempt<GemmSpec> {
    let xloc = cx.inputs[0].0;
    let dims = ConvDims::of(cx);
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, cin_g, kh, kw],
        y: [oh, ow],
    } = dims;
    let [sh, sw] = c.strides;
    require(sw <= MAX_IMPLICIT_W_STRIDE, || {
        format!("W stride {sw} > {MAX_IMPLICIT_W_STRIDE}")
    })?;
    require(kw > 1 || sw == 1, || {
        format!("a window one column wide at W stride {sw}: im2col's copy is the same subsampling, and its GEMM spans the image")
    })?;
    // Measured on the sweep's strided 1-D convs (`bench/sweep.py`, one
    // thread): Whisper's 512-channel k3/2 over 3000 frames took 17.1 ms
    // through im2col and 19.3 ms through column planes, CANINE's k4/4
    // 16.5 and 19.3 ms; 2-D stems and strided 3×3 convs gained 5–25%.
    require(sw == 1 || oh > 1, || {
        format!("one output row at W stride {sw}: im2col's rows read faster than the taps' column planes")
    })?;
    require(kh * kw <= MAX_TAPS, || {
        format!("{kh}x{kw} taps; the kernel unrolls at most {MAX_TAPS}")
    })?;
    if merges_rows(cx, c, vector) {
        return row_merged_conv(cx, weights, c, Machine { tasks, vector }, dims);
    }
    let fill = lane_fill(ow);
    require(fill >= MIN_ROW_FILL || oh == 1, || {
        format!(
            "output rows of {ow} columns fill {:.0}% of the 16-lane vectors (< {:.0}%); im2col packs rows together",
            fill * 100.0,
            MIN_ROW_FILL * 100.0
        )
    })?;
    let elem = conv_gemm_elem(cx, c)?;
    f32_on(vector, elem)?;
    let [dh, dw] = c.dilations;
    // The padded columns a row reads, split into planes of `wp` columns
    // each (plane p: padded columns p, p + sw, ...): a tap's output
    // columns are then consecutive in one plane. A W stride of 1 is one
    // plane, the padded row itself; only planes some tap reads are made.
    let wp = ow + ((kw - 1) * dw) / sw;
    let planes = sw.min((kw - 1) * dw + 1);
    // Padded input rows a band of `rows` output rows reads.
    let padded_rows = |rows: usize| (rows - 1) * sh + (kh - 1) * dh + 1;
    let band_bytes = |rows: usize| (cin * padded_rows(rows) * planes * wp * 4) as u64;
    // Threads split the kernel by bands, so an image's rows are cut into
    // a multiple of its share of the tasks, into bands as even as the
    // height allows, each copy small enough for L2.
    let band = even_band(oh, bands_per_image(cx, tasks), |b| {
        band_bytes(b) <= IM2COL_BAND_BYTES
    });
    require(band_bytes(band) <= MAX_SCRATCH / 2, || {
        too_much_scratch(band_bytes(band))
    })?;
    let calls_wanted = batch * oh * c.group;
    require(calls_wanted <= MAX_CALLS, || too_many_calls(calls_wanted))?;
    let k = cin_g * kh * kw;
    let blocking = conv_weights_blocking(
        cx,
        weights,
        c,
        elem,
        (vector, oc / c.group, ow, packed_a_rows(k)),
    );
    let (a_base, groups) = pack_conv_weights(cx, weights, c, elem, blocking.mr)?;
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let rows_p = padded_rows(band);
    let plane = (rows_p * wp * 4) as i64;
    let channel = planes as i64 * plane;
    // The band copy is a 1×planes "convolution" at W stride sw onto the
    // padded grid: its tap p is plane p, whose output row `r`, column `q`
    // is input row `r - pt`, column `q * sw + p - pl`, zero outside the
    // image. It copies every channel; each group's GEMMs read theirs.
    let copy = |row0: usize| Im2col {
        cin,
        h,
        w,
        kh: 1,
        kw: planes,
        row0: row0 * sh,
        rows: rows_p,
        ow: wp,
        strides: [1, sw],
        pad_tl: [c.pads[0], c.pads[1]],
        dilations: [1, 1],
        quads: None,
        vector,
    };
    let mut routines: Vec<Im2col> = Vec::new();
    let mut calls = Vec::new();
    for img in 0..batch as i64 {
        let image = xloc.moved(img * (cin * h * w * 4) as i64);
        for row0 in (0..oh).step_by(band) {
            // The last band may be shorter: its copy's rows past the
            // image are padding, and no GEMM reads them.
            let (routine, shift) = band_routine(&mut routines, copy(row0));
            for r in 0..band.min(oh - row0) {
                for g in 0..groups.count {
                    let (b_off, y_off, a_off, c_off) =
                        groups.offsets(g, planes * rows_p * wp * 4, oh * ow * 4);
                    let first = r == 0 && g == 0;
                    calls.push(Call {
                        a: a_base.moved(a_off),
                        // Relative to the scratch, which `lower` reserves.
                        b: Loc {
                            base: Base::Arena,
                            offset: (r * sh * wp * 4) as u64 + b_off as u64,
                        },
                        out: cx.out.moved(
                            img * (oc * oh * ow * 4) as i64 + y_off + ((row0 + r) * ow * 4) as i64,
                        ),
                        c: bias.map(|b| b.moved(c_off)),
                        src: first.then_some((image.moved(shift), routine)),
                    });
                }
            }
        }
    }
    Ok(GemmSpec {
        b: BLayout::Taps {
            channel,
            kh,
            kw,
            row: (dh * wp * 4) as i64,
            dilation: dw,
            phases: sw,
            phase: plane,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        ..conv_gemm(groups.oc, ow, k, elem, blocking, bias.is_some())
    })
}

/// How many bands of output rows each image of an implicit-GEMM
/// convolution is worth (threads split it by bands): the image's share of
/// the tasks its work is worth ([`super::partition::tasks_worth`]), at
/// most one per row.
fn bands_per_image(cx: &NodeCx, tasks: usize) -> usize {
    let (x, w, y) = (cx.inputs[0].1, cx.inputs[1].1, &cx.node.ty);
    let (batch, oh) = (y.shape[0], y.shape[2]);
    let flops = 2 * y.num_elements() * w.shape[1..].iter().product::<usize>();
    let bytes = 4 * (x.num_elements() + y.num_elements() + w.num_elements());
    let tasks = super::partition::tasks_worth(tasks, flops, bytes);
    tasks.min(oh * batch).div_ceil(batch)
}

/// Rows per band when `rows` output rows are cut into a multiple of
/// `per_task` bands (the tasks of one image) for threads to share: the
/// fewest such bands whose size `fits`, cut as evenly as the height allows
/// (the last may be shorter), so no task gets a band more than another;
/// one row per band when none fits. A band count that only divides the
/// height (3 bands of 49 rows of a 147-row map on two threads) left one
/// thread twice the other's rows.
fn even_band(rows: usize, per_task: usize, fits: impl Fn(usize) -> bool) -> usize {
    let per_task = per_task.clamp(1, rows.max(1));
    (1..=rows.div_ceil(per_task))
        .map(|times| rows.div_ceil(per_task * times))
        .find(|&band| fits(band))
        .unwrap_or(1)
}

/// Whether [`implicit_conv`] runs as [`row_merged_conv`]: H stride 1,
/// more than one output row, rows that do not fill whole vectors, and a K
/// of at most [`IMPLICIT_MERGED_MAX_K`].
fn merges_rows(cx: &NodeCx, c: &Conv2d, vector: Vector) -> bool {
    let (out, w) = (&cx.node.ty.shape, &cx.inputs[1].1.shape);
    c.strides[0] == 1
        && out[2] > 1
        && !out[3].is_multiple_of(vector.lanes())
        && w[1] * w[2] * w[3] <= IMPLICIT_MERGED_MAX_K
}

/// [`implicit_conv`] at H stride 1 with output rows that do not fill
/// whole vectors (56, 28 or 14 columns fill 87.5% of them, 17 fill 53%):
/// one GEMM per band of rows instead of one per row. The band copy holds
/// `kw` planes per channel, plane `tw` the input columns tap `tw` reads
/// for each output column (`q * sw + tw * dw - pl`, zero outside the
/// image), rows of exactly `ow` columns. Tap `(th, tw)` of output row `r`,
/// column `q` is then plane `tw`, row `r + th * dh`, column `q`: the
/// band's output pixels are one run of `rows * ow` consecutive columns for
/// every tap, so the GEMM's vectors span rows and only the band's last is
/// partial; the weights are read once per band, not once per row. The
/// copy is `kw` times the input rows' (im2col's is `kh * kw` times).
fn row_merged_conv(
    cx: &NodeCx,
    weights: &mut Weights,
    c: &Conv2d,
    Machine { tasks, vector }: Machine,
    dims: ConvDims,
) -> Attempt<GemmSpec> {
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, cin_g, kh, kw],
        y: [oh, ow],
    } = dims;
    let xloc = cx.inputs[0].0;
    let [_, sw] = c.strides;
    let [dh, dw] = c.dilations;
    let elem = conv_gemm_elem(cx, c)?;
    f32_on(vector, elem)?;
    let padded_rows = |rows: usize| rows + (kh - 1) * dh;
    let plane_bytes = |rows: usize| (padded_rows(rows) * ow * 4) as u64;
    let band_bytes = |rows: usize| (cin * kw) as u64 * plane_bytes(rows);
    // Every band is one GEMM of `band * ow` columns.
    let band = dividing_band(oh, ow, bands_per_image(cx, tasks), band_bytes);
    require(band_bytes(band) <= MAX_SCRATCH / 2, || {
        too_much_scratch(band_bytes(band))
    })?;
    let calls_wanted = batch * (oh / band) * c.group;
    require(calls_wanted <= MAX_CALLS, || too_many_calls(calls_wanted))?;
    let (k, n) = (cin_g * kh * kw, band * ow);
    let blocking = conv_weights_blocking(
        cx,
        weights,
        c,
        elem,
        (vector, oc / c.group, n, packed_a_rows(k)),
    );
    let (a_base, groups) = pack_conv_weights(cx, weights, c, elem, blocking.mr)?;
    let bias = cx.inputs.get(2).map(|&(loc, _)| loc);
    let plane = plane_bytes(band) as i64;
    // A 1×kw "convolution" at W stride sw and dilation dw: tap `tw` is
    // plane `tw`; output row `r` is input row `row0 + r - pt`.
    let copy = |row0: usize| Im2col {
        cin,
        h,
        w,
        kh: 1,
        kw,
        row0,
        rows: padded_rows(band),
        ow,
        strides: [1, sw],
        pad_tl: [c.pads[0], c.pads[1]],
        dilations: [1, dw],
        quads: None,
        vector,
    };
    let mut routines: Vec<Im2col> = Vec::new();
    let mut calls = Vec::new();
    for img in 0..batch as i64 {
        let image = xloc.moved(img * (cin * h * w * 4) as i64);
        for row0 in (0..oh).step_by(band) {
            let (routine, shift) = band_routine(&mut routines, copy(row0));
            for g in 0..groups.count {
                let (b_off, y_off, a_off, c_off) =
                    groups.offsets(g, kw * plane as usize, oh * ow * 4);
                calls.push(Call {
                    a: a_base.moved(a_off),
                    // Relative to the scratch, which `lower` reserves.
                    b: Loc {
                        base: Base::Arena,
                        offset: b_off as u64,
                    },
                    out: cx
                        .out
                        .moved(img * (oc * oh * ow * 4) as i64 + y_off + (row0 * ow * 4) as i64),
                    c: bias.map(|b| b.moved(c_off)),
                    src: (g == 0).then_some((image.moved(shift), routine)),
                });
            }
        }
    }
    Ok(GemmSpec {
        b: BLayout::Taps {
            channel: kw as i64 * plane,
            kh,
            kw,
            row: (dh * ow * 4) as i64,
            dilation: 1,
            phases: kw,
            phase: plane,
        },
        out_row: (oh * ow * 4) as i64,
        calls,
        im2col: routines,
        ..conv_gemm(groups.oc, n, k, elem, blocking, bias.is_some())
    })
}

/// The share of the lanes of 16-wide vectors that `n` columns fill.
fn lane_fill(n: usize) -> f64 {
    n as f64 / (n.div_ceil(16).max(1) * 16) as f64
}

/// Least [`lane_fill`] of an implicit GEMM's output rows: below it, the
/// wasted lanes cost more than im2col's copies of the input (an output
/// row of 7 or 14 columns, the last stages of a ResNet, fills 44% or 88%
/// of one vector; 23 columns fill 72% of two).
const MIN_ROW_FILL: f64 = 0.7;

/// Largest W stride of an implicit-GEMM convolution: its band copy
/// splits each row into this many column planes.
const MAX_IMPLICIT_W_STRIDE: usize = 8;

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
/// GEMM of the same width) whose matrix fits [`IM2COL_BAND_BYTES`]. When
/// that band is too narrow a GEMM ([`wide_band`]: a height with no
/// divisor between 1 and itself leaves bands of one row), the fewest rows
/// dividing the height that make one, within [`MAX_SCRATCH`]: leaving L2
/// costs less than empty lanes (Inception v3's 3x3/2 conv of 288 → 384
/// channels to 17x17, one thread: 17 bands of one row 10.1 ms, the whole
/// 3 MB matrix 5.8 ms).
fn im2col_band(full: &Im2col) -> usize {
    if full.col_bytes() <= IM2COL_WHOLE_BYTES {
        return full.rows;
    }
    let row_bytes = full.col_bytes() / full.rows as u64;
    dividing_band(full.rows, full.ow, 1, |b| b as u64 * row_bytes)
}

/// Rows per band of a convolution whose bands are GEMMs of one width (so
/// they divide the `rows` output rows of `ow` columns), a band of `b`
/// rows taking `bytes(b)` of scratch: the most rows whose scratch fits
/// [`IM2COL_BAND_BYTES`] in at least `min_bands` bands; when that band is
/// not [`wide_band`], the fewest rows that make one within half of
/// [`MAX_SCRATCH`].
fn dividing_band(rows: usize, ow: usize, min_bands: usize, bytes: impl Fn(usize) -> u64) -> usize {
    let divisors = || (1..=rows).filter(move |&b| rows.is_multiple_of(b));
    let fitting = divisors()
        .rev()
        .find(|&b| bytes(b) <= IM2COL_BAND_BYTES && rows / b >= min_bands)
        .unwrap_or(1);
    if wide_band(fitting * ow) {
        return fitting;
    }
    divisors()
        .find(|&b| b > fitting && wide_band(b * ow) && bytes(b) <= MAX_SCRATCH / 2)
        .unwrap_or(fitting)
}

/// Whether a band of `columns` output pixels (an im2col band, a
/// row-merged implicit GEMM's band) makes a GEMM wide enough: four vectors
/// or more, filled to [`MIN_BAND_FILL`].
fn wide_band(columns: usize) -> bool {
    columns >= 64 && lane_fill(columns) >= MIN_BAND_FILL
}

/// Least [`lane_fill`] of a band's columns: a band of one 17-pixel row
/// fills 53% of its vectors.
const MIN_BAND_FILL: f64 = 0.85;

/// A depthwise convolution (one input channel per group, any depth
/// multiplier) with W stride 1, weights read as they are.
fn depthwise_conv(cx: &NodeCx, c: &Conv2d, vector: Vector) -> Attempt<DepthwiseSpec> {
    let (xloc, wloc) = (cx.inputs[0].0, cx.inputs[1].0);
    let ConvDims {
        x: [batch, cin, h, w],
        w: [oc, cg, kh, kw],
        y: [oh, ow],
    } = ConvDims::of(cx);
    require(c.group == cin && cg == 1 && oc % c.group == 0, || {
        format!("{} input channels per group, not 1", cin / c.group)
    })?;
    require(c.strides[1] <= 2, || {
        format!("W stride {} > 2", c.strides[1])
    })?;
    require(batch <= MAX_CALLS, || {
        format!("batch {batch} > {MAX_CALLS}")
    })?;
    require(ow <= 4096, || format!("{ow} output columns > 4096"))?;
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
    Ok(DepthwiseSpec {
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
        vector,
    })
}
