//! Lowering: one PTX kernel per schedule job.
//!
//! [`Cx`] is what a lowering sees (node, operand places and types, output
//! place); the helpers here cover what every family needs: element types
//! to register and memory types, tensor base pointers, the global thread
//! index of a 1-D launch, coordinates of a linear index and strided offsets
//! with the shapes as immediates. Element indices are `u32`: every tensor
//! the CUDA target touches has fewer than 2^31 elements (checked here).

mod conv;
pub(crate) mod elementwise;
mod layout;
mod linalg;
mod math;
mod narrow;
mod reduce;
mod resize;

use std::cell::RefCell;

use kiln_ir::{DType, Graph, Node, Op, UnaryOp, ValueType};

use crate::plan::{Base, Job, Loc, Plan};
use crate::ptx::{Bin, Cmp, KernelBuilder, MemTy, Opnd, Reg, Space, Special, Ty};
use crate::{CudaError, Launch};

/// Threads per block of 1-D elementwise launches.
pub(crate) const BLOCK: u32 = 256;

/// A finished kernel.
pub(crate) struct Kernel {
    pub name: String,
    pub node: String,
    pub op: &'static str,
    pub launch: Launch,
    pub text: String,
    pub uses_smem: bool,
}

/// What a lowering sees.
pub(crate) struct Cx<'g> {
    /// Kernel (`.entry`) name.
    pub kernel: String,
    /// Source node name.
    pub name: String,
    /// Source op name.
    pub op: &'static str,
    /// Operand places and types, by slot.
    pub inputs: Vec<(Loc, &'g ValueType)>,
    /// Output place.
    pub out: Loc,
    /// Output type.
    pub out_ty: &'g ValueType,
    /// Unary ops fused into this kernel: applied, in order, to every value
    /// before it is stored (f32 outputs only; see `plan.rs`).
    pub epilogue: Vec<UnaryOp>,
    /// The weights blob, to which lowerings append compile-time tables.
    pub tables: &'g RefCell<Vec<u8>>,
    /// The SM compiled for (compute capability times ten).
    pub sm: u32,
}

impl Cx<'_> {
    pub(crate) fn dtype_err(&self, dtype: DType) -> CudaError {
        CudaError::UnsupportedDType {
            node: self.name.clone(),
            op: self.op,
            dtype,
        }
    }

    pub(crate) fn unsupported(&self, detail: impl Into<String>) -> CudaError {
        CudaError::UnsupportedOp {
            node: self.name.clone(),
            op: self.op,
            detail: detail.into(),
        }
    }

    /// Appends a compile-time table (e.g. Resize taps) to the weights blob
    /// and returns its place.
    pub(crate) fn table(&self, bytes: &[u8]) -> Loc {
        let mut w = self.tables.borrow_mut();
        let offset = kiln_ir::arena::align(w.len() as u64);
        w.resize(offset as usize, 0);
        w.extend_from_slice(bytes);
        Loc {
            base: Base::Weights,
            offset,
        }
    }

    /// `v` after the fused unary ops.
    pub(crate) fn epilogue(&self, kb: &mut KernelBuilder, v: Reg) -> Reg {
        self.epilogue
            .iter()
            .fold(v, |v, &op| elementwise::unary_float(kb, op, v))
    }

    /// A builder for this node's kernel, with both base pointers loaded.
    pub(crate) fn builder(&self, max_threads: [u32; 3]) -> KernelBuilder {
        let mut kb = KernelBuilder::new(&self.kernel, max_threads);
        kb.load_params();
        kb
    }

    /// Wraps a finished builder.
    pub(crate) fn finish(&self, kb: KernelBuilder, launch: Launch) -> Kernel {
        let uses_smem = kb.uses_smem();
        Kernel {
            name: self.kernel.clone(),
            node: self.name.clone(),
            op: self.op,
            launch,
            text: kb.finish(),
            uses_smem,
        }
    }

    /// The element type of input `i`, checked to be one `cty` accepts
    /// (f32/f64, or any integer/bool with `ints`).
    pub(crate) fn input_cty(&self, i: usize, ints: bool) -> Result<Ty, CudaError> {
        let d = self.inputs[i].1.dtype;
        match cty(d) {
            Some(t) if t.is_float() || ints => Ok(t),
            _ => Err(self.dtype_err(d)),
        }
    }
}

/// The register type an element of `d` is computed in: f32 and f64 as
/// themselves, f16 and bf16 as f32 (widened exactly on load, rounded to
/// nearest even on store, like the reference evaluator's per-op rounding),
/// every integer type and bool widened to s64 (wrapping
/// arithmetic then matches the reference evaluator's i64 semantics, and
/// stores truncate back; u8, u16 and u32 load zero-extended, so signed
/// s64 comparisons and divisions are exact for them). u64 is computed as
/// u64, so comparisons, divisions, remainders, min/max, right shifts and
/// conversions are the unsigned instructions. The narrow storage types
/// have none (they move as bytes and convert in Cast).
pub(crate) fn cty(d: DType) -> Option<Ty> {
    Some(match d {
        DType::F32 | DType::F16 | DType::BF16 => Ty::F32,
        DType::F64 => Ty::F64,
        DType::I8
        | DType::U8
        | DType::I16
        | DType::U16
        | DType::I32
        | DType::U32
        | DType::I64
        | DType::Bool => Ty::S64,
        DType::U64 => Ty::U64,
        _ => return None,
    })
}

/// The memory access type of one element of `d`.
pub(crate) fn mem(d: DType) -> MemTy {
    MemTy(match d {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::I8 => "s8",
        DType::U8 | DType::Bool => "u8",
        DType::I16 => "s16",
        DType::U16 => "u16",
        DType::I32 => "s32",
        DType::U32 => "u32",
        DType::I64 => "s64",
        DType::U64 => "u64",
        DType::F16 | DType::BF16 => "b16",
        // A narrow type's code (no kernel computes on one: `cty` refuses).
        _ => "u8",
    })
}

/// The global address of `loc`.
pub(crate) fn ptr(kb: &mut KernelBuilder, loc: Loc) -> Reg {
    let base = match loc.base {
        Base::Arena => kb.arena(),
        Base::Weights => kb.weights(),
    };
    kb.bin(Bin::Add, base, Opnd::I(loc.offset as i64))
}

/// Loads element `idx` of the `d`-typed tensor at `base`, in its compute
/// type.
pub(crate) fn load(kb: &mut KernelBuilder, base: Reg, idx: Reg, d: DType) -> Reg {
    let a = kb.addr(base, idx, d.size_bytes() as u32);
    match d {
        DType::F16 => {
            let h = kb.ld(Space::Global, MemTy("b16"), Ty::B16, a, 0);
            kb.f16_to_f32(h)
        }
        DType::BF16 => {
            let raw = kb.ld(Space::Global, MemTy("u16"), Ty::U32, a, 0);
            bf16_bits_to_f32(kb, raw)
        }
        // A narrow type's code, moved or cast as a byte (`narrow.rs`).
        d if d.is_narrow() => kb.ld(Space::Global, MemTy("u8"), Ty::U32, a, 0),
        _ => kb.ld(Space::Global, mem(d), cty(d).expect("checked dtype"), a, 0),
    }
}

/// Stores `v` (in `d`'s compute type) as element `idx` of the tensor at
/// `base`.
pub(crate) fn store(kb: &mut KernelBuilder, base: Reg, idx: Reg, d: DType, v: Reg) {
    let a = kb.addr(base, idx, d.size_bytes() as u32);
    match d {
        DType::F16 => {
            let h = kb.f32_to_f16(v);
            kb.st(Space::Global, MemTy("b16"), a, 0, h);
        }
        DType::BF16 => {
            let bits = f32_to_bf16_bits(kb, v);
            kb.st(Space::Global, MemTy("u16"), a, 0, bits);
        }
        _ => kb.st(Space::Global, mem(d), a, 0, v),
    }
}

/// A bf16's bits (the low 16 bits of `raw`, a `u32`) as the f32 they
/// denote exactly: the high half of an f32's bits. Integer operations, so
/// every SM has them (`cvt.f32.bf16` needs sm_90).
pub(crate) fn bf16_bits_to_f32(kb: &mut KernelBuilder, raw: Reg) -> Reg {
    let hi = kb.bin(Bin::Shl, raw, 16u32);
    kb.bitcast(Ty::F32, hi)
}

/// The bf16 nearest `v` (ties to even; overflow gives infinity) as the low
/// 16 bits of a `u32`; a NaN keeps its sign and high payload and is made
/// quiet, as `half::bf16::from_f32` (the reference) does. Integer
/// operations, so sm_70/75 (no `cvt.rn.bf16.f32`) get the same bits.
pub(crate) fn f32_to_bf16_bits(kb: &mut KernelBuilder, v: Reg) -> Reg {
    let bits = kb.bitcast(Ty::U32, v);
    let high = kb.bin(Bin::Shr, bits, 16u32);
    let lsb = kb.bin(Bin::And, high, 1u32);
    let bias = kb.bin(Bin::Add, lsb, 0x7fffu32);
    let rounded = kb.bin(Bin::Add, bits, bias);
    let rounded = kb.bin(Bin::Shr, rounded, 16u32);
    let quiet = kb.bin(Bin::Or, high, 0x40u32);
    let nan = kb.is_nan(v, v);
    kb.selp(Ty::U32, nan, quiet, rounded)
}

/// Whether `y < h` and `x < w`, unsigned: a coordinate that wrapped below
/// 0 (a padded tap) is outside too.
pub(crate) fn inside(kb: &mut KernelBuilder, (y, h): (Reg, usize), (x, w): (Reg, usize)) -> Reg {
    let y_ok = kb.setp(Cmp::Lt, y, h as u32);
    let x_ok = kb.setp(Cmp::Lt, x, w as u32);
    kb.pred_op("and", y_ok, x_ok)
}

/// A 1-D launch of `n` threads in blocks of [`BLOCK`].
pub(crate) fn linear_launch(n: usize) -> Launch {
    Launch {
        grid: [(n as u64).div_ceil(BLOCK as u64) as u32, 1, 1],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
    }
}

/// The global thread index of a 1-D launch; threads at or past `n` return.
pub(crate) fn global_index(kb: &mut KernelBuilder, n: usize) -> Reg {
    let b = kb.special(Special::CtaidX);
    let t = kb.special(Special::TidX);
    let i = kb.mad(b, BLOCK, t);
    exit_if_ge(kb, i, n as u32);
    i
}

/// Returns from the kernel when `i >= n`.
pub(crate) fn exit_if_ge(kb: &mut KernelBuilder, i: Reg, n: u32) {
    let p = kb.setp(Cmp::Ge, i, n);
    kb.ret_if(p);
}

/// The coordinates of linear index `i` in `shape` (row-major); `None` for
/// axes of size 1 (coordinate 0).
pub(crate) fn coords(kb: &mut KernelBuilder, i: Reg, shape: &[usize]) -> Vec<Option<Reg>> {
    let mut out = vec![None; shape.len()];
    let mut rem = i;
    // The outermost axis with size > 1 needs no modulo.
    let first = shape.iter().position(|&d| d > 1);
    for d in (0..shape.len()).rev() {
        if shape[d] == 1 {
            continue;
        }
        if Some(d) == first {
            out[d] = Some(rem);
            break;
        }
        out[d] = Some(kb.bin(Bin::Rem, rem, shape[d] as u32));
        rem = kb.bin(Bin::Div, rem, shape[d] as u32);
    }
    out
}

/// `base + sum(coord[d] * strides[d])` in wrapping `u32` arithmetic (so
/// negative strides work as long as the result is in range).
pub(crate) fn offset(
    kb: &mut KernelBuilder,
    coords: &[Option<Reg>],
    strides: &[i64],
    base: i64,
) -> Reg {
    let mut acc = kb.mov(Ty::U32, Opnd::I(base as u32 as i64));
    for (c, &s) in coords.iter().zip(strides) {
        if let (Some(c), true) = (c, s != 0) {
            acc = kb.mad(*c, Opnd::I(s as u32 as i64), acc);
        }
    }
    acc
}

/// Row-major strides of `shape`, in elements.
pub(crate) fn strides(shape: &[usize]) -> Vec<i64> {
    kiln_ir::infer::strides_of(shape)
        .into_iter()
        .map(|s| s as i64)
        .collect()
}

/// The strides (in elements) at which an operand of shape `input` is read
/// for each axis of the broadcast `out` shape: 0 on broadcast axes.
pub(crate) fn broadcast_strides(input: &[usize], out: &[usize]) -> Vec<i64> {
    let own = strides(input);
    let lead = out.len() - input.len();
    (0..out.len())
        .map(|d| {
            if d < lead || input[d - lead] == 1 {
                0
            } else {
                own[d - lead]
            }
        })
        .collect()
}

/// A PTX identifier for kernel `k` of node `name`.
fn kernel_name(k: usize, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(48)
        .collect();
    format!("kiln_{k}_{clean}")
}

/// The largest element count the 32-bit index arithmetic handles.
const MAX_ELEMENTS: usize = i32::MAX as usize;

/// Lowers one job; `None` when it needs no kernel (inputs, constants,
/// empty outputs).
pub(crate) fn lower_job<'g>(
    graph: &'g Graph,
    plan: &Plan,
    tables: &'g RefCell<Vec<u8>>,
    job: &Job,
    k: usize,
    sm: u32,
) -> Result<Option<Kernel>, CudaError> {
    let (cx, node): (Cx, Option<&Node>) = match job {
        Job::Node(id) => {
            let node = graph.node(*id);
            let fused = plan.fused_names(graph, *id);
            let inputs = graph
                .inputs_of(*id)
                .iter()
                .map(|i| (plan.locs[i], &graph.node(*i).ty))
                .collect();
            (
                Cx {
                    kernel: kernel_name(k, &fused),
                    name: fused,
                    op: node.op.name(),
                    inputs,
                    out: plan.locs[id],
                    out_ty: &node.ty,
                    epilogue: plan.epilogue_ops(graph, *id),
                    tables,
                    sm,
                },
                Some(node),
            )
        }
        Job::Copy { name, src, dst } => {
            let ty = &graph.node(*src).ty;
            let name = format!("output:{name}");
            (
                Cx {
                    kernel: kernel_name(k, &name),
                    name,
                    op: "copy",
                    inputs: vec![(plan.locs[src], ty)],
                    out: *dst,
                    out_ty: ty,
                    epilogue: Vec::new(),
                    tables,
                    sm,
                },
                None,
            )
        }
    };
    for ty in cx.inputs.iter().map(|(_, t)| *t).chain([cx.out_ty]) {
        if ty.num_elements() > MAX_ELEMENTS {
            return Err(CudaError::TooLarge {
                node: cx.name.clone(),
                message: format!("{ty} has more than 2^31 - 1 elements"),
            });
        }
        // Narrow codes only move (as bytes), are selected or convert
        // (Cast).
        let moves_or_casts = matches!(
            node.map(|n| &n.op),
            None | Some(
                Op::Cast { .. }
                    | Op::Where
                    | Op::Reshape { .. }
                    | Op::Transpose { .. }
                    | Op::Concat { .. }
                    | Op::Gather { .. }
                    | Op::Slice { .. }
            )
        );
        if cty(ty.dtype).is_none() && !(ty.dtype.is_narrow() && moves_or_casts) {
            return Err(cx.dtype_err(ty.dtype));
        }
    }
    if cx.out_ty.num_elements() == 0 {
        return Ok(None);
    }
    let Some(node) = node else {
        return layout::copy(&cx).map(Some);
    };
    let kernel = match &node.op {
        Op::Input { .. } | Op::Constant(_) => return Ok(None),
        Op::Unary(u) => elementwise::unary(&cx, *u)?,
        Op::Binary(b) => elementwise::binary(&cx, *b)?,
        Op::Cast { to } => elementwise::cast(&cx, *to)?,
        Op::Compare(c) => elementwise::compare(&cx, *c)?,
        Op::Logical(l) => elementwise::logical(&cx, *l)?,
        Op::Not => elementwise::not(&cx)?,
        Op::Bitwise(op) => elementwise::bitwise(&cx, *op)?,
        Op::BitwiseNot => elementwise::bitwise_not(&cx)?,
        Op::Where => elementwise::where_(&cx)?,
        Op::MatMul => linalg::matmul(&cx)?,
        Op::MatMulInteger => linalg::matmul_integer(&cx)?,
        Op::ConvInteger(c) => conv::conv_integer(&cx, c)?,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => linalg::gemm(&cx, *alpha, *beta, *trans_a, *trans_b)?,
        Op::Conv(c) => conv::conv(&cx, c)?,
        Op::MaxPool(p) => conv::pool(&cx, p, None)?,
        Op::AveragePool {
            pool,
            count_include_pad,
        } => conv::pool(&cx, pool, Some(*count_include_pad))?,
        Op::GlobalAveragePool => reduce::global_pool(&cx, false)?,
        Op::GlobalMaxPool => reduce::global_pool(&cx, true)?,
        Op::Softmax { axis } => reduce::softmax(&cx, *axis)?,
        Op::Reduce { op, axes, .. } => reduce::reduce(&cx, *op, axes)?,
        Op::Reshape { .. } => layout::copy(&cx)?,
        Op::Bitcast { .. } => layout::copy_bits(&cx)?,
        Op::Transpose { perm } => layout::transpose(&cx, perm)?,
        Op::Concat { axis } => layout::concat(&cx, *axis)?,
        Op::Gather { axis } => layout::gather(&cx, *axis)?,
        Op::Slice { axes } => layout::slice(&cx, axes)?,
        Op::Expand { .. } => elementwise::expand(&cx)?,
        Op::LayerNorm { axis, epsilon } => reduce::layer_norm(&cx, *axis, *epsilon)?,
        Op::Resize(r) => resize::resize(&cx, r)?,
        Op::Col2Im(c) => resize::col2im(&cx, c)?,
        Op::Fused(k) if k.head().is_none() => elementwise::fused(&cx, k)?,
        Op::Attention { .. } => {
            return Err(cx.unsupported(
                "attention has no CUDA lowering (the driver runs recognize without attention for CUDA, which keeps the matmul/softmax/matmul chain)",
            ))
        }
        Op::Fused(_) => {
            return Err(cx.unsupported(
                "fused kernels with a dense head have no CUDA lowering (the driver runs fuse without dense heads for CUDA)",
            ))
        }
        Op::NonZero | Op::WithLength { .. } | Op::NonMaxSuppression(_) | Op::Unique { .. } => {
            return Err(cx.unsupported(
                "outputs whose size depends on data have no CUDA lowering; compile for a CPU target",
            ))
        }
    };
    Ok(Some(kernel))
}
