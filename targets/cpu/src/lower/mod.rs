//! Lowering: one Cranelift function per kernel.
//!
//! [`Kb`] (kernel builder) wraps a `FunctionBuilder` with the two kernel
//! arguments (arena and weights pointers) and small helpers for addresses,
//! constants, loads/stores and host calls. The op families live in
//! submodules; loop construction is in [`loops`].

mod attention;
mod conv;
pub(crate) mod dense;
mod elementwise;
mod fused;
mod layout;
mod linalg;
mod logic;
pub(crate) mod loops;
pub(crate) mod math;
mod narrow;
mod norm;
mod partition;
mod pool;
mod reduce;
mod resize;
pub(crate) mod select;
mod softmax;

use cranelift_codegen::ir::types::{F32, F32X4, F64, F64X2, I16, I32, I64, I8};
use cranelift_codegen::ir::{
    AbiParam, Block, ExtFuncData, ExternalName, FuncRef, Function, InstBuilder, MemFlagsData,
    Signature, Type, UserExternalName, UserFuncName, Value,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use kiln_format::HostFn;
use kiln_ir::{
    DType, ElementwiseProgram, FusedKernel, Graph, Instr, Node, NodeId, Op, Reg, ValueType,
};

use crate::emit::HOST_NAMESPACE;
use crate::isa::Target;
use crate::microkernel::Vector;
use crate::plan::{Base, Job, Loc, Plan, Scratch, Weights};
use crate::CpuError;

/// Memory flags of every tensor access: cannot trap (the plan keeps every
/// access in bounds), but no alignment promise.
pub(crate) fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// The kernel builder.
pub(crate) struct Kb<'a> {
    /// The underlying function builder.
    pub b: FunctionBuilder<'a>,
    arena: Value,
    weights: Value,
    /// Whether `fma` is a native instruction.
    pub fma: bool,
    host: Vec<(HostFn, FuncRef)>,
    fail: Option<Block>,
    call_conv: CallConv,
}

impl Kb<'_> {
    /// The address of `loc`.
    pub(crate) fn ptr(&mut self, loc: Loc) -> Value {
        crate::plan::note_address(loc);
        let base = match loc.base {
            Base::Arena => self.arena,
            Base::Weights => self.weights,
        };
        self.add_off(base, loc.offset as i64)
    }

    /// An `i64` constant.
    pub(crate) fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(I64, v)
    }

    /// `p + off`.
    pub(crate) fn add_off(&mut self, p: Value, off: i64) -> Value {
        if off == 0 {
            p
        } else {
            self.b.ins().iadd_imm_s(p, off)
        }
    }

    /// `p + idx * scale` (`idx` an `i64`).
    pub(crate) fn add_scaled(&mut self, p: Value, idx: Value, scale: i64) -> Value {
        match scale {
            0 => p,
            1 => self.b.ins().iadd(p, idx),
            s if s > 0 && (s as u64).is_power_of_two() => {
                let t = self.b.ins().ishl_imm_u(idx, s.trailing_zeros() as i64);
                self.b.ins().iadd(p, t)
            }
            s => {
                let t = self.b.ins().imul_imm_s(idx, s);
                self.b.ins().iadd(p, t)
            }
        }
    }

    /// Loads a `ty` at `p + off`.
    pub(crate) fn load(&mut self, ty: Type, p: Value, off: i64) -> Value {
        match i32::try_from(off) {
            Ok(o) => self.b.ins().load(ty, mem(), p, o),
            Err(_) => {
                let q = self.add_off(p, off);
                self.b.ins().load(ty, mem(), q, 0)
            }
        }
    }

    /// Stores `v` at `p + off`.
    pub(crate) fn store(&mut self, v: Value, p: Value, off: i64) {
        match i32::try_from(off) {
            Ok(o) => {
                self.b.ins().store(mem(), v, p, o);
            }
            Err(_) => {
                let q = self.add_off(p, off);
                self.b.ins().store(mem(), v, q, 0);
            }
        }
    }

    /// A float constant of type `ty` (scalar or vector: splatted).
    pub(crate) fn fconst(&mut self, ty: Type, v: f64) -> Value {
        let lane = ty.lane_type();
        let s = if lane == F64 {
            self.b.ins().f64const(v)
        } else {
            self.b.ins().f32const(v as f32)
        };
        self.splat_to(ty, s)
    }

    /// The `shuffle` mask (of two 4-lane vectors of 4-byte elements seen
    /// as `i8x16`) that picks lanes `order` (0–3 from the first vector,
    /// 4–7 from the second).
    pub(crate) fn f32_lanes(&mut self, order: [u8; 4]) -> cranelift_codegen::ir::Immediate {
        let bytes: Vec<u8> = (order.iter())
            .flat_map(|&l| (0..4).map(move |b| 4 * l + b))
            .collect();
        self.b.func.dfg.immediates.push(bytes.into())
    }

    /// Splats a scalar to `ty` when `ty` is a vector.
    pub(crate) fn splat_to(&mut self, ty: Type, s: Value) -> Value {
        if ty.is_vector() {
            self.b.ins().splat(ty, s)
        } else {
            s
        }
    }

    /// `a * b + c`, fused when the target has FMA.
    pub(crate) fn fmadd(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let t = self.b.ins().fmul(a, b);
            self.b.ins().fadd(t, c)
        }
    }

    /// Calls host function `f` on scalars, returning a scalar of the
    /// arguments' type (the libm functions).
    pub(crate) fn call_host(&mut self, f: HostFn, args: &[Value]) -> Value {
        let ty = self.b.func.dfg.value_type(args[0]);
        self.call_host_returning(f, args, Some(ty))[0]
    }

    /// Calls host function `f` with `args` (its parameters have their
    /// types) and returns its result of type `returns`, if any.
    pub(crate) fn call_host_returning(
        &mut self,
        f: HostFn,
        args: &[Value],
        returns: Option<Type>,
    ) -> Vec<Value> {
        let fref = match self.host.iter().find(|(h, _)| *h == f) {
            Some((_, r)) => *r,
            None => {
                let mut sig = Signature::new(self.call_conv);
                for &a in args {
                    sig.params
                        .push(AbiParam::new(self.b.func.dfg.value_type(a)));
                }
                sig.returns.extend(returns.map(AbiParam::new));
                let signature = self.b.import_signature(sig);
                let name = self
                    .b
                    .func
                    .declare_imported_user_function(UserExternalName::new(
                        HOST_NAMESPACE,
                        f as u32,
                    ));
                let r = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature,
                    colocated: false,
                    patchable: false,
                });
                self.host.push((f, r));
                r
            }
        };
        let call = self.b.ins().call(fref, args);
        self.b.inst_results(call).to_vec()
    }

    /// Applies a scalar host function lane by lane (or once, for scalars).
    pub(crate) fn call_host_lanes(&mut self, f: HostFn, args: &[Value]) -> Value {
        let ty = self.b.func.dfg.value_type(args[0]);
        if !ty.is_vector() {
            return self.call_host(f, args);
        }
        let mut out = args[0];
        for lane in 0..ty.lane_count() as u8 {
            let lanes: Vec<Value> = args
                .iter()
                .map(|&a| self.b.ins().extractlane(a, lane))
                .collect();
            let r = self.call_host(f, &lanes);
            out = self.b.ins().insertlane(out, r, lane);
        }
        out
    }

    /// The block that returns 1 (index out of range).
    pub(crate) fn fail_block(&mut self) -> Block {
        *self.fail.get_or_insert_with(|| self.b.create_block())
    }
}

/// The Cranelift scalar type holding one element of `d`, if any.
pub(crate) fn scalar_type(d: DType) -> Option<Type> {
    Some(match d {
        DType::F32 => F32,
        DType::F64 => F64,
        DType::I8 | DType::U8 | DType::Bool => I8,
        // A narrow type's code (`narrow.rs` converts it).
        d if d.is_narrow() => I8,
        DType::I16 | DType::U16 => I16,
        DType::I32 | DType::U32 => I32,
        DType::I64 | DType::U64 => I64,
        DType::F16 | DType::BF16 => return None,
        _ => return None,
    })
}

/// The 128-bit vector type for float `d`, if there is one.
pub(crate) fn vector_type(d: DType) -> Option<Type> {
    match d {
        DType::F32 => Some(F32X4),
        DType::F64 => Some(F64X2),
        _ => None,
    }
}

/// Row-major strides of `shape`, in elements.
pub(crate) fn strides(shape: &[usize]) -> Vec<i64> {
    kiln_ir::infer::strides_of(shape)
        .into_iter()
        .map(|s| s as i64)
        .collect()
}

/// What a node's lowering sees: the node, its operands and its output.
pub(crate) struct NodeCx<'g> {
    pub graph: &'g Graph,
    pub node: &'g Node,
    pub input_ids: Vec<NodeId>,
    pub inputs: Vec<(Loc, &'g ValueType)>,
    pub out: Loc,
}

impl NodeCx<'_> {
    pub(crate) fn dtype_err(&self, d: DType) -> CpuError {
        CpuError::UnsupportedDType {
            node: self.node.name.clone(),
            op: self.node.op.name(),
            dtype: d,
        }
    }

    pub(crate) fn unsupported(&self, detail: impl Into<String>) -> CpuError {
        CpuError::UnsupportedOp {
            node: self.node.name.clone(),
            op: self.node.op.name(),
            detail: detail.into(),
        }
    }

    /// The input's element type, checked to be f32 (or f64 when `f64_ok`).
    pub(crate) fn float_input(&self, i: usize, f64_ok: bool) -> Result<DType, CpuError> {
        let d = self.inputs[i].1.dtype;
        match d {
            DType::F32 => Ok(d),
            DType::F64 if f64_ok => Ok(d),
            _ => Err(self.dtype_err(d)),
        }
    }
}

/// The code of one kernel.
pub(crate) enum Lowered {
    /// A Cranelift function, compiled by [`crate::emit::Text::add`].
    Clif(Box<Function>),
    /// Finished position-independent machine code without relocations
    /// (a [`crate::microkernel`] kernel), as one or more independent tasks
    /// of one schedule step.
    Machine(Vec<Vec<u8>>),
    /// A microkernel, then the rest of the program, run as one kernel (a
    /// fused node whose head is a microkernel and whose program continues
    /// over the head's result): see [`crate::emit::Text::add_chain`].
    Chain(Vec<u8>, crate::emit::TailCode),
    /// A fused node whose head is split into tasks: the tasks as one
    /// schedule step, then the rest of the program as the next, itself
    /// split when large (the threads matter more than one kernel per
    /// node).
    SplitChain(Vec<Vec<u8>>, SplitTail),
    /// Cranelift functions, each over one part of an elementwise node's
    /// output (see [`split_elementwise`]), as the tasks of one step.
    ClifTasks(Vec<Function>),
    /// A step of microkernel tasks that prepare what a dense head's tasks
    /// read (im2col matrices, a Winograd input transform), then the head's
    /// kernels.
    Before(dense::Step, Box<Lowered>),
    /// A dense head whose tasks write scratch, then a step that makes the
    /// output of it, then the rest of a fused program, if any.
    Then(Vec<Vec<u8>>, Then, Option<SplitTail>),
}

/// The step of a [`Lowered::Then`] that writes the output.
pub(crate) enum Then {
    /// The transpose of pixels as rows (`dense::After::Transpose`).
    Transpose(Vec<Function>),
    /// Microkernel tasks (`dense::After::Step`).
    Machine(dense::Step),
}

/// The tasks of the second step of a [`Lowered::SplitChain`].
pub(crate) enum SplitTail {
    /// AVX-512 elementwise kernels.
    Machine(Vec<Vec<u8>>),
    /// Cranelift functions.
    Clif(Vec<Function>),
}

/// Builds the kernel of one job: an AVX-512 microkernel for the ops one
/// covers when the target has AVX-512, otherwise a Cranelift function. A
/// dense node's kernel is chosen from its candidates ([`select`]) and
/// recorded in `plan.dense_kernels`.
pub(crate) fn lower_job(
    graph: &Graph,
    plan: &mut Plan,
    job: &Job,
    target: &Target,
) -> Result<Lowered, CpuError> {
    let Job::Node(id) = job else {
        return lower_clif(graph, plan, job, target).map(|f| Lowered::Clif(Box::new(f)));
    };
    let node = graph.node(*id);
    let Some(op) = dense_op(&node.op) else {
        return lower_other(graph, plan, *id, target);
    };
    let mut trail = select::Trail::default();
    let (lowered, kernel) = match lower_dense(graph, plan, *id, target, &mut trail)? {
        Some(served) => served,
        None => (lower_other(graph, plan, *id, target)?, select::GENERIC),
    };
    let flops = kiln_ir::cost::node_dense_flops(graph, *id);
    (plan.dense_kernels).push(trail.chose(&node.name, op, kernel, flops));
    Ok(lowered)
}

/// The dense op of `op` (the head's for a fused kernel), which kernel
/// selection records; `None` for other ops.
fn dense_op(op: &Op) -> Option<&'static str> {
    match op {
        Op::Fused(k) => k.head().map(|h| h.op.op().name()),
        Op::MatMul | Op::Gemm { .. } | Op::Conv(_) | Op::MatMulInteger | Op::ConvInteger(_) => {
            Some(op.name())
        }
        _ => None,
    }
}

/// The microkernel of dense node `id` and the candidate that made it, or
/// `None` when every candidate declined (each recorded in `trail`).
fn lower_dense(
    graph: &Graph,
    plan: &mut Plan,
    id: NodeId,
    target: &Target,
    trail: &mut select::Trail,
) -> Result<Option<(Lowered, &'static str)>, CpuError> {
    let Some(vector) = target.vector() else {
        let why = "the target has neither AVX-512 nor AVX2 (NEON targets run dense ops as \
                   Cranelift loops)";
        trail.declined("avx2", why);
        return Ok(None);
    };
    let machine = dense::Machine {
        vector,
        tasks: target.tasks,
    };
    let cx = node_cx(graph, plan, id);
    let codegen = |e| microkernel_error(cx.node, e);
    if cx.node.op.is_integer_product() && !target.vnni {
        trail.declined("avx512-vnni", "the target has no AVX512-VNNI");
        return Ok(None);
    }
    let fused = match &cx.node.op {
        Op::Fused(k) => Some(k.as_ref()),
        _ => None,
    };
    let (weights, scratch) = (&mut plan.weights, &mut plan.scratch);
    let served = match fused {
        Some(k) => dense::lower_fused(&cx, k, weights, scratch, machine, trail),
        None => dense::lower(&cx, weights, scratch, machine, trail),
    }
    .map_err(codegen)?;
    let Some(dense::Served {
        before,
        codes: tasks,
        tail,
        after,
        kernel,
    }) = served
    else {
        return Ok(None);
    };
    let lowered = match after {
        Some(after) => {
            let then = match after {
                dense::After::Transpose(rows) => {
                    Then::Transpose(pixel_rows_transpose(&cx, id, rows, target)?)
                }
                dense::After::Step(step) => Then::Machine(step),
            };
            let tail = match (fused, tail) {
                (Some(k), Some(tail)) => Some(tail_kernels(plan, id, target, &cx, k, tail, true)?),
                _ => None,
            };
            let tail = tail.map(|t| match t {
                TailKernels::Split(t) => t,
                TailKernels::Chained(_) => unreachable!("a split tail is asked for"),
            });
            Lowered::Then(tasks, then, tail)
        }
        None => with_tail(plan, id, target, &cx, fused, tasks, tail)?,
    };
    Ok(Some(match before {
        None => (lowered, kernel),
        Some(step) => (Lowered::Before(step, Box::new(lowered)), kernel),
    }))
}

/// The kernels of dense node `id` whose head's tasks are `tasks`: those
/// alone, or with the rest of a fused program that the head's store loop
/// did not take (`tail`).
fn with_tail(
    plan: &mut Plan,
    id: NodeId,
    target: &Target,
    cx: &NodeCx,
    fused: Option<&FusedKernel>,
    mut tasks: Vec<Vec<u8>>,
    tail: Option<dense::Tail>,
) -> Result<Lowered, CpuError> {
    let (Some(k), Some(tail)) = (fused, tail) else {
        return Ok(Lowered::Machine(tasks));
    };
    let split = tasks.len() > 1;
    Ok(match tail_kernels(plan, id, target, cx, k, tail, split)? {
        TailKernels::Split(tail) => Lowered::SplitChain(tasks, tail),
        TailKernels::Chained(tail) => Lowered::Chain(tasks.swap_remove(0), tail),
    })
}

/// The kernels of the rest of a fused program ([`dense::Tail`]).
enum TailKernels {
    /// A step of its own, split when large.
    Split(SplitTail),
    /// Code to run in the head's kernel, after it.
    Chained(crate::emit::TailCode),
}

/// The kernels of `tail`, the rest of fused kernel `k`'s program over its
/// head's result: a step of its own when `split` (the head is split into
/// tasks, or another step comes between), else code chained to the head.
fn tail_kernels(
    plan: &mut Plan,
    id: NodeId,
    target: &Target,
    cx: &NodeCx,
    k: &FusedKernel,
    dense::Tail { program, src }: dense::Tail,
    split: bool,
) -> Result<TailKernels, CpuError> {
    let codegen = |e| microkernel_error(cx.node, e);
    let first_extra = k.head().map_or(0, |h| h.inputs);
    // The tail as a headless kernel over the head's result: an AVX-512 or
    // AVX2 elementwise kernel when its program has the step form, else
    // Cranelift.
    let tail_kernel = FusedKernel::new(None, program.clone())?.with_store(k.store());
    let tail = Node {
        op: Op::Fused(Box::new(tail_kernel.clone())),
        name: cx.node.name.clone(),
        ty: cx.node.ty.clone(),
    };
    let src_ty = ValueType::new(DType::F32, cx.node.ty.shape.clone());
    let mut tail_cx = NodeCx {
        graph: cx.graph,
        node: &tail,
        input_ids: vec![id],
        inputs: vec![(src, &src_ty)],
        out: cx.out,
    };
    tail_cx.input_ids.extend(&cx.input_ids[first_extra..]);
    tail_cx.inputs.extend(&cx.inputs[first_extra..]);
    let tail_tasks = if split { target.tasks } else { 1 };
    let headless = target.vector().and_then(|vector| {
        let machine = dense::Machine {
            vector,
            tasks: tail_tasks,
        };
        dense::lower_headless(&tail_cx, &tail_kernel, &mut plan.weights, machine)
    });
    let machine = match headless {
        Some(parts) => select::assembled_tasks(parts).map_err(codegen)?,
        None => None,
    };
    let over = |kb: &mut Kb| {
        fused::program_over(kb, cx, &program, first_extra, (src, DType::F32));
        Ok(())
    };
    if split {
        let tail = match machine {
            Some(codes) => SplitTail::Machine(codes),
            None => SplitTail::Clif(match split_elementwise(&tail_cx, plan, target)? {
                Some(funcs) => funcs,
                None => vec![build_function(target, over)?],
            }),
        };
        return Ok(TailKernels::Split(tail));
    }
    Ok(TailKernels::Chained(match machine {
        Some(mut codes) => crate::emit::TailCode::Machine(codes.swap_remove(0)),
        None => crate::emit::TailCode::Clif(Box::new(build_function(target, over)?)),
    }))
}

/// The transpose of a head's result written as `[N, P, C]` (pixels as
/// rows) at `rows` into the output of dense node `cx` (`[N, C, H, W]`, P
/// = H·W), as the tasks of one step.
fn pixel_rows_transpose(
    cx: &NodeCx,
    id: NodeId,
    rows: Loc,
    target: &Target,
) -> Result<Vec<Function>, CpuError> {
    let s = &cx.node.ty.shape;
    let (batch, channels, pixels) = (s[0], s[1], s[2..].iter().product::<usize>());
    let rows_ty = ValueType::new(DType::F32, vec![batch, pixels, channels]);
    let perm: kiln_ir::Ints = [0, 2, 1].into_iter().collect();
    let node = Node {
        op: Op::Transpose { perm: perm.clone() },
        name: cx.node.name.clone(),
        ty: ValueType::new(DType::F32, vec![batch, channels, pixels]),
    };
    let tcx = NodeCx {
        graph: cx.graph,
        node: &node,
        input_ids: vec![id],
        inputs: vec![(rows, &rows_ty)],
        out: cx.out,
    };
    if let Some(parts) = split_transpose(&tcx, target)? {
        return Ok(parts);
    }
    let whole = build_function(target, |kb| layout::transpose(kb, &tcx, &perm))?;
    Ok(vec![whole])
}

/// A microkernel that applies but could not be assembled: a compiler bug,
/// reported as an error rather than run as a slower kernel.
fn microkernel_error(node: &Node, e: crate::microkernel::MicrokernelError) -> CpuError {
    CpuError::Codegen {
        node: node.name.clone(),
        message: format!("microkernel: {e}"),
    }
}

/// The kernel of a node that is not dense, or of a dense node no
/// microkernel took: an AVX-512 microkernel where one applies, else
/// Cranelift functions.
fn lower_other(
    graph: &Graph,
    plan: &mut Plan,
    id: NodeId,
    target: &Target,
) -> Result<Lowered, CpuError> {
    let job = Job::Node(id);
    if let Some(vector) = target.vector() {
        let cx = node_cx(graph, plan, id);
        let codegen = |e| microkernel_error(cx.node, e);
        // A lone unary or binary op runs as a one-instruction program on
        // the elementwise microkernel (its inline exp, tanh, erf), not as a
        // Cranelift loop with a libm call per element (a sigmoid over a
        // YOLO head's 1.6 M elements: 3.8 ms).
        let lone = match cx.node.op {
            Op::Unary(u) => Some(Instr::Unary(u, Reg(0))),
            Op::Binary(b) => Some(Instr::Binary(b, Reg(0), Reg(1))),
            _ => None,
        }
        .and_then(|instr| ElementwiseProgram::new(cx.inputs.len(), vec![instr]).ok())
        .and_then(|program| FusedKernel::new(None, program).ok());
        let headless = match &cx.node.op {
            Op::Fused(k) => Some(&**k),
            _ => lone.as_ref(),
        };
        let machine = dense::Machine {
            vector,
            tasks: target.tasks,
        };
        let zmm = vector == Vector::Zmm;
        let machine = match (&cx.node.op, headless) {
            (_, Some(k)) => dense::lower_headless(&cx, k, &mut plan.weights, machine)
                .map(select::assembled_tasks),
            (Op::Softmax { .. }, _) => {
                softmax::lower_microkernel(&cx, machine).map(select::assembled_tasks)
            }
            (Op::Attention { scale }, _) => {
                attention::lower_microkernel(&cx, *scale, &mut plan.scratch, machine)
                    .map(select::assembled_tasks)
            }
            // The kernels below have no ymm form.
            _ if !zmm => None,
            (Op::Reduce { .. }, _) => {
                reduce::lower_avx512(&cx, target.tasks).map(select::assembled_tasks)
            }
            (Op::LayerNorm { axis, epsilon }, _) => {
                norm::layer_norm_avx512(&cx, *axis, *epsilon, target.tasks)
                    .map(select::assembled_tasks)
            }
            (Op::GlobalAveragePool, _) => {
                reduce::global_average_avx512(&cx, target.tasks).map(select::assembled_tasks)
            }
            (Op::Cast { .. }, _) => {
                elementwise::narrow_avx512(&cx, target.tasks).map(select::assembled_tasks)
            }
            _ => None,
        };
        if let Some(code) = machine.transpose().map_err(codegen)?.flatten() {
            return Ok(Lowered::Machine(code));
        }
    }
    if target.tasks > 1 {
        let cx = node_cx(graph, plan, id);
        if let Some(funcs) = split_elementwise(&cx, plan, target)? {
            return Ok(Lowered::ClifTasks(funcs));
        }
        if let Some(funcs) = split_concat(&cx, target)? {
            return Ok(Lowered::ClifTasks(funcs));
        }
        if let Some(funcs) = split_transpose(&cx, target)? {
            return Ok(Lowered::ClifTasks(funcs));
        }
    }
    lower_clif(graph, plan, &job, target).map(|f| Lowered::Clif(Box::new(f)))
}

/// Fewest output elements for which an elementwise node is split over
/// threads (below, handing half to a worker costs more than it saves).
/// Was 32768 while a hand-over cost 1.1 µs rather than 0.2 µs: see
/// `partition::MIN_TASK_BYTES` for what lowering both gained.
pub(crate) const SPLIT_MIN_ELEMENTS: usize = 1 << 13;

/// An elementwise node (unary, binary, cast, a headless fused program,
/// a layer norm over later axes, a Col2Im by channels, a Resize along an
/// axis it keeps, a pool by batch or channel) as up to
/// `target.tasks` functions,
/// each over a contiguous range of its output's first non-unit axis:
/// every part is the same kernel on a smaller shape, its operands moved
/// to the part's rows (operands broadcast along that axis stay whole;
/// constants are read through their location like any operand). `None`
/// when the node is not of that kind or too small.
fn split_elementwise(
    cx: &NodeCx,
    plan: &mut Plan,
    target: &Target,
) -> Result<Option<Vec<Function>>, CpuError> {
    let graph = cx.graph;
    let shape = &cx.node.ty.shape;
    let Some(axis) = shape.iter().position(|&d| d > 1) else {
        return Ok(None);
    };
    let pool = matches!(
        cx.node.op,
        Op::GlobalAveragePool | Op::GlobalMaxPool | Op::MaxPool(_) | Op::AveragePool { .. }
    );
    let splittable = match &cx.node.op {
        Op::Unary(_) | Op::Binary(_) | Op::Cast { .. } => true,
        Op::Fused(k) => k.head().is_none(),
        Op::LayerNorm { axis: a, .. } => axis < *a,
        // Split by channels: channel c reads input rows c·kh·kw.. .
        Op::Col2Im(_) => axis == 1,
        // Along an axis it does not resample.
        Op::Resize(r) => {
            cx.inputs.len() == 1 && r.resampled_taps(axis, cx.inputs[0].1.shape[axis]).is_none()
        }
        // By batch or channel: each output plane pools its own input
        // plane (a max pool of Inception v3's 147x147 stem: 0.68 ms on
        // one thread, which the second thread waited for).
        _ if pool => axis < 2,
        _ => false,
    };
    // A pool's work is its input, not its output (one value per plane for
    // a global pool).
    let elements = match pool {
        true => cx.inputs[0].1.num_elements(),
        false => cx.node.ty.num_elements(),
    };
    if !splittable || elements < SPLIT_MIN_ELEMENTS {
        return Ok(None);
    }
    let rank = shape.len();
    // Per input: the input's own axis aligned with `axis` when it varies
    // along it (numpy broadcasting aligns trailing axes), and its length
    // per output index.
    let along: Vec<Option<(usize, usize)>> = match &cx.node.op {
        Op::Col2Im(c) => vec![Some((1, c.block[0] * c.block[1]))],
        _ => cx
            .inputs
            .iter()
            .map(|(_, ty)| {
                let offset = rank - ty.shape.len();
                axis.checked_sub(offset)
                    .filter(|&a| ty.shape[a] == shape[axis])
                    .map(|a| (a, 1))
            })
            .collect(),
    };
    let parts = target.tasks.min(shape[axis]);
    let row_bytes = |ty: &ValueType, a: usize| {
        (ty.shape[a + 1..].iter().product::<usize>() * ty.dtype.size_bytes()) as u64
    };
    let mut funcs = Vec::with_capacity(parts);
    for p in 0..parts {
        let (start, end) = (shape[axis] * p / parts, shape[axis] * (p + 1) / parts);
        let sub = |ty: &ValueType, (a, per): (usize, usize)| {
            let mut s = ty.shape.clone();
            s[a] = (end - start) * per;
            ValueType::new(ty.dtype, s)
        };
        let moved = |loc: Loc, bytes: u64| Loc {
            base: loc.base,
            offset: loc.offset + bytes,
        };
        let op = match &cx.node.op {
            Op::Resize(r) => {
                let mut r = r.clone();
                r.shape[axis] = end - start;
                if r.resampled_taps(axis, end - start).is_some() {
                    return Ok(None);
                }
                Op::Resize(r)
            }
            op => op.clone(),
        };
        let node = Node {
            op,
            name: cx.node.name.clone(),
            ty: sub(&cx.node.ty, (axis, 1)),
        };
        let in_tys: Vec<ValueType> = (cx.inputs.iter().zip(&along))
            .map(|((_, ty), own)| own.map_or_else(|| (*ty).clone(), |a| sub(ty, a)))
            .collect();
        let inputs = (cx.inputs.iter().zip(&along).zip(&in_tys))
            .map(|(((loc, ty), own), sub_ty)| match own {
                Some((a, per)) => (
                    moved(*loc, (start * per) as u64 * row_bytes(ty, *a)),
                    sub_ty,
                ),
                None => (*loc, sub_ty),
            })
            .collect();
        let part = NodeCx {
            graph,
            node: &node,
            input_ids: cx.input_ids.clone(),
            inputs,
            out: moved(cx.out, start as u64 * row_bytes(&cx.node.ty, axis)),
        };
        funcs.push(build_function(target, |kb| {
            lower_cx(kb, &part, &mut plan.weights, &mut plan.scratch)
        })?);
    }
    Ok(Some(funcs))
}

/// A large concatenation as up to `target.tasks` functions, each copying
/// a contiguous group of its inputs (groups balanced by bytes). `None`
/// when the node is not a concatenation, too small, or of one input.
fn split_concat(cx: &NodeCx, target: &Target) -> Result<Option<Vec<Function>>, CpuError> {
    let Op::Concat { axis } = cx.node.op else {
        return Ok(None);
    };
    let n = cx.inputs.len();
    if n < 2 || cx.node.ty.num_elements() < SPLIT_MIN_ELEMENTS {
        return Ok(None);
    }
    let parts = target.tasks.min(n);
    let total = cx.node.ty.num_elements();
    // Input i goes to the part its first element's share of the output
    // falls in.
    let mut bounds = vec![0; parts + 1];
    let mut before = 0;
    for (i, (_, ty)) in cx.inputs.iter().enumerate() {
        let part = (before * parts / total).min(parts - 1);
        for b in &mut bounds[part + 1..] {
            *b = i + 1;
        }
        before += ty.num_elements();
    }
    let groups: Vec<_> = bounds
        .windows(2)
        .map(|w| w[0]..w[1])
        .filter(|r| !r.is_empty())
        .collect();
    if groups.len() < 2 {
        return Ok(None);
    }
    groups
        .into_iter()
        .map(|range| build_function(target, |kb| layout::concat_inputs(kb, cx, axis, range)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A large transpose that moves the innermost axis as up to
/// `target.tasks` functions, each over a range of the source-contiguous
/// dim (`layout::transpose_parts`). `None` otherwise.
fn split_transpose(cx: &NodeCx, target: &Target) -> Result<Option<Vec<Function>>, CpuError> {
    let Op::Transpose { perm } = &cx.node.op else {
        return Ok(None);
    };
    if cx.node.ty.num_elements() < SPLIT_MIN_ELEMENTS {
        return Ok(None);
    }
    let Some(parts) = layout::transpose_parts(cx, perm, target.tasks) else {
        return Ok(None);
    };
    parts
        .into_iter()
        .map(|along| {
            build_function(target, |kb| {
                layout::transpose_part(kb, cx, perm, along);
                Ok(())
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Builds the Cranelift function of one job.
fn lower_clif(
    graph: &Graph,
    plan: &mut Plan,
    job: &Job,
    target: &Target,
) -> Result<Function, CpuError> {
    build_function(target, |kb| match job {
        Job::Node(id) => lower_node(kb, graph, plan, *id),
        Job::Copy {
            src, dst, bytes, ..
        } => {
            let s = kb.ptr(*src);
            let d = kb.ptr(*dst);
            layout::copy_bytes(kb, d, s, *bytes);
            Ok(())
        }
    })
}

/// A kernel function (`fn(arena, weights) -> i32`) whose body `body` emits.
fn build_function(
    target: &Target,
    body: impl FnOnce(&mut Kb) -> Result<(), CpuError>,
) -> Result<Function, CpuError> {
    let call_conv = target.isa.default_call_conv();
    let mut sig = Signature::new(call_conv);
    sig.params.push(AbiParam::new(I64));
    sig.params.push(AbiParam::new(I64));
    sig.returns.push(AbiParam::new(I32));
    let mut func = Function::with_name_signature(UserFuncName::user(0, 0), sig);
    let mut fctx = FunctionBuilderContext::new();
    let mut b = FunctionBuilder::new(&mut func, &mut fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let arena = b.block_params(entry)[0];
    let weights = b.block_params(entry)[1];
    let mut kb = Kb {
        b,
        arena,
        weights,
        fma: target.fma,
        host: Vec::new(),
        fail: None,
        call_conv,
    };
    body(&mut kb)?;
    let zero = kb.b.ins().iconst(I32, 0);
    kb.b.ins().return_(&[zero]);
    if let Some(fail) = kb.fail {
        kb.b.switch_to_block(fail);
        let one = kb.b.ins().iconst(I32, 1);
        kb.b.ins().return_(&[one]);
    }
    kb.b.seal_all_blocks();
    kb.b.finalize(target.isa.frontend_config());
    Ok(func)
}

/// The index in `items` of the first item that is `same` as `item`,
/// which is appended when there is none (kernels share one routine per
/// distinct geometry).
pub(crate) fn intern<T>(items: &mut Vec<T>, item: T, same: impl Fn(&T) -> bool) -> usize {
    match items.iter().position(same) {
        Some(i) => i,
        None => {
            items.push(item);
            items.len() - 1
        }
    }
}

fn node_cx<'g>(graph: &'g Graph, plan: &Plan, id: NodeId) -> NodeCx<'g> {
    let input_ids = graph.inputs_of(id);
    let inputs = input_ids
        .iter()
        .map(|i| (plan.locs[i], &graph.node(*i).ty))
        .collect();
    NodeCx {
        graph,
        node: graph.node(id),
        input_ids,
        inputs,
        out: plan.locs[&id],
    }
}

fn lower_node(kb: &mut Kb, graph: &Graph, plan: &mut Plan, id: NodeId) -> Result<(), CpuError> {
    let cx = node_cx(graph, plan, id);
    lower_cx(kb, &cx, &mut plan.weights, &mut plan.scratch)
}

/// The Cranelift kernel of node context `cx`.
fn lower_cx(
    kb: &mut Kb,
    cx: &NodeCx,
    weights: &mut Weights,
    scratch: &mut Scratch,
) -> Result<(), CpuError> {
    let node = cx.node;
    match &node.op {
        Op::Input { .. } | Op::Constant(_) => Ok(()),
        Op::Unary(u) => elementwise::unary(kb, cx, u),
        Op::Binary(op) => elementwise::binary(kb, cx, *op),
        Op::Cast { to } => elementwise::cast(kb, cx, *to),
        Op::MatMul => linalg::matmul(kb, cx),
        Op::MatMulInteger => linalg::matmul_integer(kb, cx),
        Op::ConvInteger(c) => conv::conv_integer(kb, cx, c),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => linalg::gemm(kb, cx, weights, *alpha, *beta, *trans_a, *trans_b),
        Op::Conv(c) => conv::conv(kb, cx, c),
        Op::MaxPool(p) => pool::pool(kb, cx, p, pool::Kind::Max),
        Op::AveragePool {
            pool: p,
            count_include_pad,
        } => pool::pool(kb, cx, p, pool::Kind::Avg(*count_include_pad)),
        Op::GlobalAveragePool => pool::global(kb, cx, false),
        Op::GlobalMaxPool => pool::global(kb, cx, true),
        Op::Softmax { axis } => softmax::softmax(kb, cx, *axis),
        Op::Attention { scale } => attention::attention(kb, cx, *scale, scratch),
        // Both copy the bytes as they are.
        Op::Reshape { .. } | Op::Bitcast { .. } => layout::reshape(kb, cx),
        Op::Transpose { perm } => layout::transpose(kb, cx, perm),
        Op::Concat { axis } => layout::concat(kb, cx, *axis),
        Op::Gather { axis } => layout::gather(kb, cx, *axis),
        Op::Slice { axes } => layout::slice(kb, cx, axes),
        Op::Compare(op) => logic::compare(kb, cx, *op),
        Op::Logical(op) => logic::logical(kb, cx, *op),
        Op::Not => logic::not(kb, cx),
        Op::Bitwise(op) => logic::bitwise(kb, cx, *op),
        Op::BitwiseNot => logic::bitwise_not(kb, cx),
        Op::Where => logic::where_(kb, cx),
        Op::Reduce { op, axes, .. } => reduce::reduce(kb, cx, *op, axes),
        Op::Expand { .. } => elementwise::expand(kb, cx),
        Op::LayerNorm { axis, epsilon } => norm::layer_norm(kb, cx, *axis, *epsilon),
        Op::Resize(r) => resize::resize(kb, cx, weights, r),
        Op::Col2Im(c) => resize::col2im(kb, cx, c),
        Op::Fused(k) => fused::fused(kb, cx, (weights, scratch), k),
        Op::NonZero => layout::non_zero(kb, cx),
        Op::NonMaxSuppression(n) => layout::non_max_suppression(kb, cx, scratch, n),
        Op::Unique { sorted } => layout::unique(kb, cx, scratch, *sorted),
        Op::WithLength { .. } => Err(cx.unsupported(
            "a data-dependent length marker reached code generation; the driver resolves it before the passes",
        )),
    }
}
