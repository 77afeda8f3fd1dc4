//! `kiln-target-cpu`: Kiln's CPU code generator.
//!
//! [`compile`] turns a (shape-static) [`kiln_ir::Graph`] into a
//! [`kiln_format::Artifact`]:
//!
//! 1. **ISA** ([`CpuTarget`]): a fixed Cranelift ISA (x86-64 or AArch64) with
//!    explicit feature flags; the same features are recorded in the artifact
//!    so the runtime refuses CPUs that lack them.
//! 2. **Memory plan**: constants go to the weights blob (64-byte aligned,
//!    deduplicated); every other value gets a 64-byte aligned region of one
//!    arena, assigned by liveness over the schedule with greedy best-fit
//!    packing and in-place reuse for elementwise kernels (Reshape aliases its
//!    input when that is safe). [`memory_plan`] and [`plan_stats`] show the
//!    plan without compiling.
//! 3. **Lowering**: one kernel per IR node (plus copy kernels for outputs
//!    that are graph inputs or constants): on AVX-512 targets MatMul, Gemm
//!    and ungrouped Conv become shape-specialized machine-code microkernels
//!    ([`microkernel`]) reading weights packed at compile time (k×k convs
//!    through an im2col matrix in kernel scratch, an arena region live
//!    during the kernel's step only);
//!    everything else is a Cranelift function. Every kernel has the ABI
//!    `extern "C" fn(arena: *mut u8, weights: *const u8) -> i32` and returns
//!    0, or 1 when a Gather index is out of range. Operand addresses are
//!    compile-time offsets from those two pointers; loops have compile-time
//!    trip counts; f32 work uses `f32x4` vectors with scalar tails.
//! 4. **Emission**: each function is compiled with `Context::compile` alone;
//!    the code (with its constant pool) is placed in one TEXT blob and its
//!    relocations are translated to the artifact's own kinds (host `libm`
//!    calls become absolute 64-bit addresses the loader patches).
//!
//! The same graph and options always give byte-identical artifacts.
//!
//! # Example
//! ```
//! use kiln_ir::{Graph, Op, UnaryOp, ValueType, DType};
//! use kiln_target_cpu::{compile, ArtifactInfo, CpuOptions, CpuTarget};
//! let mut g = Graph::new();
//! let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
//! let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "relu").unwrap();
//! g.add_output("y", y);
//! let opts = CpuOptions { target: CpuTarget::Aarch64, opt_level: 2, threads: 1 };
//! let artifact = compile(&g, &opts, ArtifactInfo::default()).unwrap();
//! assert_eq!(artifact.kernels.len(), 1);
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md); the one
// exception is the unit tests' kernel runner (`microkernel::exec`).
#![deny(unsafe_code)]

use std::collections::HashSet;

mod emit;
mod isa;
mod legalize;
mod lower;
pub mod microkernel;
mod plan;

pub use isa::CpuTarget;
pub use plan::{memory_plan, plan_stats, MemoryPlan, PlanStats, PlannedValue, Step, ValueKind};

use kiln_format::{Artifact, Metadata, Profile};

/// The default of [`CpuOptions::threads`]: dense kernels are split for up
/// to four threads, which a session with fewer runs in turn.
pub const DEFAULT_THREADS: usize = 4;

/// Options of the CPU target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// The ISA level to generate code for.
    pub target: CpuTarget,
    /// Cranelift optimization: 0 = `none`, anything else = `speed`.
    pub opt_level: u8,
    /// The most tasks a dense kernel is split into, for sessions with that
    /// many threads (1: no split). See `lower/partition.rs`.
    pub threads: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            target: CpuTarget::Native,
            opt_level: 2,
            threads: DEFAULT_THREADS,
        }
    }
}

pub use kiln_format::ArtifactInfo;

/// Why a graph could not be compiled for the CPU.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// The target name is not one of `native`, `x86_64-v3`, `x86_64-avx512`,
    /// `aarch64`.
    #[error("unknown CPU target '{0}' (expected native, x86_64-v3, x86_64-avx512 or aarch64)")]
    UnknownTarget(String),
    /// The target cannot be built here (e.g. `native` on an unsupported host).
    #[error("CPU target {target}: {message}")]
    Isa {
        /// The target.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// The op (or this use of it) has no CPU lowering.
    #[error("node '{node}': {op} is not supported by the CPU target: {detail}")]
    UnsupportedOp {
        /// Node name.
        node: String,
        /// Op name.
        op: &'static str,
        /// What exactly is unsupported.
        detail: String,
    },
    /// The op has no CPU lowering for this element type.
    #[error("node '{node}': {op} on {dtype} is not supported by the CPU target")]
    UnsupportedDType {
        /// Node name.
        node: String,
        /// Op name.
        op: &'static str,
        /// The element type.
        dtype: kiln_ir::DType,
    },
    /// Cranelift rejected the generated function.
    #[error("node '{node}': code generation failed: {message}")]
    Codegen {
        /// Node name.
        node: String,
        /// Cranelift's message.
        message: String,
    },
    /// The generated code needs a relocation the artifact format cannot
    /// express.
    #[error("node '{node}': unsupported relocation {kind} to {target}")]
    UnsupportedReloc {
        /// Node name.
        node: String,
        /// Cranelift's relocation kind.
        kind: String,
        /// The relocation target.
        target: String,
    },
    /// The graph is malformed (e.g. a cycle).
    #[error(transparent)]
    Graph(#[from] kiln_ir::IrError),
    /// A size or offset does not fit the target's limits.
    #[error("node '{node}': {message}")]
    TooLarge {
        /// Node name.
        node: String,
        /// What overflowed.
        message: String,
    },
}

/// The scratch bytes each job of `graph` in `order` needs: what lowering
/// every job once reserves (scratch sizes follow from the shapes, not from
/// where values are), so that [`plan::plan`] can pack each job's scratch
/// with the values live at its step instead of stacking one region for
/// all of them on top of the arena.
///
/// Also returns the constants some kernel addresses: the others (weights
/// that kernels read only in their packed form) are left out of the
/// artifact.
fn scratch_sizes(
    graph: &kiln_ir::Graph,
    order: &[kiln_ir::NodeId],
    target: &isa::Target,
    weights: &plan::Weights,
) -> Result<(Vec<u64>, HashSet<kiln_ir::NodeId>), CpuError> {
    let mut dry = plan::plan(
        graph,
        order,
        &[],
        weights.measuring_twin(),
        plan::Constants::All,
    )?;
    let mut sizes = Vec::with_capacity(dry.jobs.len());
    let mut reads = Vec::new();
    for (k, job) in dry.jobs.clone().into_iter().enumerate() {
        dry.scratch_for(k);
        let (lowered, job_reads) =
            plan::weight_reads(|| lower::lower_job(graph, &mut dry, &job, target));
        lowered?;
        reads.extend(job_reads);
        sizes.push(dry.scratch.bytes);
    }
    let read = dry.constants_at(graph, &reads);
    Ok((sizes, read))
}

/// Appends the kernels of job `name` to `text` as its schedule steps.
fn add_lowered(
    text: &mut emit::Text,
    name: &str,
    lowered: lower::Lowered,
    target: &isa::Target,
) -> Result<(), CpuError> {
    match lowered {
        lower::Lowered::Clif(func) => text.add(name, *func, target)?,
        lower::Lowered::Machine(tasks) => text.add_machine(name, &tasks),
        lower::Lowered::Chain(code, tail) => text.add_chain(name, &code, tail, target)?,
        lower::Lowered::ClifTasks(funcs) => text.add_tasks(name, funcs, target)?,
        lower::Lowered::SplitChain(tasks, tail) => {
            text.add_machine(name, &tasks);
            add_tail(text, name, tail, target)?;
        }
        lower::Lowered::Then(tasks, then, tail) => {
            text.add_machine(name, &tasks);
            match then {
                lower::Then::Transpose(transpose) => {
                    text.add_tasks(&format!("{name}/transpose"), transpose, target)?
                }
                lower::Then::Machine(step) => {
                    text.add_machine(&format!("{name}/{}", step.suffix), &step.tasks)
                }
            }
            if let Some(tail) = tail {
                add_tail(text, name, tail, target)?;
            }
        }
        lower::Lowered::Before(step, rest) => {
            text.add_machine(&format!("{name}/{}", step.suffix), &step.tasks);
            add_lowered(text, name, *rest, target)?;
        }
    }
    Ok(())
}

/// Appends the step of job `name`'s fused program after its head.
fn add_tail(
    text: &mut emit::Text,
    name: &str,
    tail: lower::SplitTail,
    target: &isa::Target,
) -> Result<(), CpuError> {
    let name = format!("{name}/tail");
    match tail {
        lower::SplitTail::Machine(codes) => text.add_machine(&name, &codes),
        lower::SplitTail::Clif(funcs) => text.add_tasks(&name, funcs, target)?,
    }
    Ok(())
}

/// Compiles `graph` for the CPU target `opts.target`: an artifact of one
/// profile (see [`compile_profiles`]).
pub fn compile(
    graph: &kiln_ir::Graph,
    opts: &CpuOptions,
    meta: ArtifactInfo,
) -> Result<Artifact, CpuError> {
    compile_profiles(&[graph], opts, meta)
}

/// Compiles one profile per graph (the same model specialized to different
/// input shapes, in the order given) into one artifact: each profile's
/// kernels, schedule and arena plan, and one weights section in which a
/// constant (or packed constant) that several profiles use is stored once.
///
/// Shapes must be static (they are, in the IR). The result is deterministic:
/// the same graphs, options and `meta` give the same artifact.
pub fn compile_profiles(
    graphs: &[&kiln_ir::Graph],
    opts: &CpuOptions,
    meta: ArtifactInfo,
) -> Result<Artifact, CpuError> {
    let target = isa::build(opts)?;
    let mut features = target.features;
    let mut weights = plan::Weights::default();
    let mut text = emit::Text::new(target.arch);
    // The largest profile is compiled first: a constant packed by several
    // profiles is packed with the tile the first one chooses, and the
    // largest is where the tile matters most. The profiles keep the order
    // given.
    let size = |g: &kiln_ir::Graph| -> u64 {
        (g.inputs().iter())
            .map(|&id| g.node(id).ty.shape.iter().product::<usize>() as u64)
            .sum()
    };
    let mut order: Vec<usize> = (0..graphs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(size(graphs[i])));
    let mut profiles: Vec<Option<Profile>> = vec![None; graphs.len()];
    for i in order {
        let graph = &*legalize::legalize(graphs[i], &target)?;
        features |= required_features(graph, &target);
        let (profile, rest) = compile_profile(graph, &target, weights, &mut text)?;
        weights = rest;
        profiles[i] = Some(profile);
    }
    let profiles = profiles.into_iter().flatten().collect();
    let (text, kernels, relocs) = text.finish();
    Ok(Artifact {
        arch: target.arch,
        features,
        metadata: Metadata {
            compiler_version: meta.compiler_version,
            target: opts.target.to_string(),
            options: meta.options,
            source_sha256: meta.source_sha256,
        },
        weights: weights.into_bytes(),
        text,
        kernels,
        relocs,
        profiles,
        padding: Vec::new(),
        golden: Default::default(),
    })
}

/// The CPU features beyond the target's that `graph`'s kernels use.
fn required_features(graph: &kiln_ir::Graph, target: &isa::Target) -> kiln_format::CpuFeatures {
    let mut features = kiln_format::CpuFeatures::default();
    if graph.node_ids().any(|id| legalize::is_bf16_dot(graph, id)) {
        features |= kiln_format::CpuFeatures::AVX512BF16;
    }
    if target.vnni
        && graph
            .node_ids()
            .any(|id| graph.node(id).op.is_integer_product())
    {
        features |= kiln_format::CpuFeatures::AVX512VNNI | kiln_format::CpuFeatures::AVX512BW;
    }
    features
}

/// Plans and lowers one legalized graph: its kernels go to `text`, its
/// constants to `weights` (returned with them added).
fn compile_profile(
    graph: &kiln_ir::Graph,
    target: &isa::Target,
    weights: plan::Weights,
    text: &mut emit::Text,
) -> Result<(Profile, plan::Weights), CpuError> {
    let order = kiln_ir::schedule(graph)?;
    let (scratch, read) = scratch_sizes(graph, &order, target, &weights)?;
    let mut plan = plan::plan(
        graph,
        &order,
        &scratch,
        weights,
        plan::Constants::Read(&read),
    )?;
    for (k, job) in plan.jobs.clone().into_iter().enumerate() {
        let name = job.name(graph);
        plan.scratch_for(k);
        let (lowered, reads) =
            plan::weight_reads(|| lower::lower_job(graph, &mut plan, &job, target));
        // Lowering is deterministic: a constant left out because the
        // measuring lowering never addressed it is never addressed now.
        if reads.iter().any(|&r| r >= plan::UNPLACED / 2) {
            return Err(CpuError::Codegen {
                node: name,
                message: "the kernel addresses a constant that was left out of the weights (a Kiln bug: please report it)".into(),
            });
        }
        let lowered = lowered?;
        if !plan.scratch_fits(k) {
            return Err(CpuError::Codegen {
                node: name,
                message: "the kernel asked for more scratch than when its size was measured".into(),
            });
        }
        add_lowered(text, &name, lowered, target)?;
    }
    plan.weights.end_profile();
    let profile = Profile {
        inputs: plan.inputs,
        outputs: plan.outputs,
        arena_size: plan.arena_size,
        dense_kernels: plan.dense_kernels,
        schedule: text.take_schedule(),
        role: kiln_format::Role::SHAPES,
        bounded: Vec::new(),
    };
    Ok((profile, plan.weights))
}
