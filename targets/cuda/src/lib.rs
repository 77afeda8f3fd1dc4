//! `kiln-target-cuda`: the CUDA target of Kiln.
//!
//! [`compile`] turns a shape-static [`kiln_ir::Graph`] into a
//! [`CudaProgram`]: one PTX module holding one `.entry` kernel per IR node
//! (plus copy kernels for graph outputs that need one), the launch plan of
//! every kernel (grid, block and dynamic shared memory, all computed at
//! compile time from the shapes), the weights blob and the device arena
//! plan. PTX is text written through a small typed builder ([`ptx`]): no
//! GPU and no CUDA toolkit are needed to compile; `ptxas` validates the
//! text offline (see `docs/targets-cuda.md`).
//!
//! Every kernel has the parameters `(u64 arena, u64 weights)`: operand
//! addresses are compile-time offsets from those two device pointers, index
//! arithmetic uses the shapes as immediates.
//!
//! # Example
//! ```
//! use kiln_ir::{Graph, Op, UnaryOp, ValueType, DType};
//! let mut g = Graph::new();
//! let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
//! let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "relu").unwrap();
//! g.add_output("y", y);
//! let sm = kiln_target_cuda::SmArch::parse("sm80").unwrap();
//! let program = kiln_target_cuda::compile(&g, sm).unwrap();
//! assert_eq!(program.kernels.len(), 1);
//! assert!(program.ptx.contains(".target sm_80"));
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

pub mod artifact;
mod lower;
mod plan;
pub mod ptx;
pub mod ptxas;
mod split;

use kiln_ir::{DType, Graph};

pub use plan::STATUS_BYTES;

/// A CUDA streaming-multiprocessor architecture Kiln targets, with the PTX
/// ISA version the module declares for it (the oldest that supports it, so
/// that the oldest drivers able to run that GPU can load the module).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmArch {
    /// Compute capability times ten (80 for sm_80).
    pub sm: u32,
    /// PTX ISA version (major, minor).
    pub ptx_isa: (u32, u32),
}

/// The supported architectures: Volta through Hopper.
pub const SUPPORTED_SMS: [SmArch; 6] = [
    SmArch {
        sm: 70,
        ptx_isa: (6, 0),
    },
    SmArch {
        sm: 75,
        ptx_isa: (6, 3),
    },
    SmArch {
        sm: 80,
        ptx_isa: (7, 0),
    },
    SmArch {
        sm: 86,
        ptx_isa: (7, 1),
    },
    SmArch {
        sm: 89,
        ptx_isa: (7, 8),
    },
    SmArch {
        sm: 90,
        ptx_isa: (7, 8),
    },
];

impl SmArch {
    /// Parses `sm80`, `sm_80` or `80`.
    pub fn parse(name: &str) -> Result<SmArch, CudaError> {
        let digits = name
            .strip_prefix("sm_")
            .or_else(|| name.strip_prefix("sm"))
            .unwrap_or(name);
        digits
            .parse::<u32>()
            .ok()
            .and_then(|sm| SUPPORTED_SMS.iter().copied().find(|a| a.sm == sm))
            .ok_or_else(|| CudaError::UnsupportedSm(name.to_owned()))
    }

    /// The `ptxas -arch` name (`sm_80`).
    pub fn arch_name(&self) -> String {
        format!("sm_{}", self.sm)
    }
}

/// The supported SM names, for error messages (`sm70, sm75, ...`).
pub fn supported_sm_names() -> String {
    SUPPORTED_SMS
        .iter()
        .map(|a| format!("sm{}", a.sm))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a graph could not be compiled for CUDA.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// The SM is not one the emitter supports.
    #[error("unsupported CUDA architecture '{0}' (supported: {list})", list = supported_sm_names())]
    UnsupportedSm(String),
    /// The op (or this use of it) has no CUDA lowering.
    #[error("node '{node}': {op} has no CUDA lowering: {detail}")]
    UnsupportedOp {
        /// Node name.
        node: String,
        /// Op name.
        op: &'static str,
        /// What exactly is unsupported.
        detail: String,
    },
    /// The op has no CUDA lowering for this element type.
    #[error("node '{node}': {op} on {dtype} has no CUDA lowering")]
    UnsupportedDType {
        /// Node name.
        node: String,
        /// Op name.
        op: &'static str,
        /// The element type.
        dtype: DType,
    },
    /// A size does not fit the CUDA target's limits (32-bit element
    /// indices, grid dimensions).
    #[error("node '{node}': {message}")]
    TooLarge {
        /// Node name.
        node: String,
        /// What overflowed.
        message: String,
    },
    /// ptxas could not be run or its output not read.
    #[error("ptxas: {0}")]
    Ptxas(String),
    /// ptxas rejected the module.
    #[error("ptxas rejected kernel {kernel} (node '{node}'):\n{log}")]
    PtxasRejected {
        /// The first kernel an error line points into.
        kernel: String,
        /// That kernel's source node.
        node: String,
        /// ptxas's log, error lines annotated with kernel and node.
        log: String,
    },
    /// The graph is malformed (e.g. a cycle).
    #[error(transparent)]
    Graph(#[from] kiln_ir::IrError),
}

/// How a kernel is launched: computed at compile time from the shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Grid dimensions in blocks.
    pub grid: [u32; 3],
    /// Block dimensions in threads.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
}

/// One kernel of the schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The `.entry` name in the module.
    pub name: String,
    /// The source node's name (or `output:<name>` for an output copy).
    pub node: String,
    /// The source op's name (`copy` for an output copy).
    pub op: &'static str,
    /// The launch plan.
    pub launch: Launch,
    /// First and last line (1-based, inclusive) of the kernel in
    /// [`CudaProgram::ptx`], to map assembler diagnostics to kernels.
    pub lines: (usize, usize),
}

/// A graph input or output: name, type and place in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoSpec {
    /// Name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte offset in the arena.
    pub arena_offset: u64,
}

/// The result of compiling a graph for CUDA.
#[derive(Clone, Debug)]
pub struct CudaProgram {
    /// The target architecture.
    pub sm: SmArch,
    /// The PTX module.
    pub ptx: String,
    /// Kernels in launch order.
    pub kernels: Vec<KernelInfo>,
    /// Constants, 64-byte aligned, little-endian.
    pub weights: Vec<u8>,
    /// Device arena size in bytes (status block included).
    pub arena_size: u64,
    /// Graph inputs, in order.
    pub inputs: Vec<IoSpec>,
    /// Graph outputs, in order.
    pub outputs: Vec<IoSpec>,
}

impl CudaProgram {
    /// Every kernel as a standalone module (header, shared-memory
    /// declaration and the one kernel): what `--dump-ptx` writes, one file
    /// per kernel, each assemblable alone.
    pub fn kernel_modules(&self) -> Vec<(String, String)> {
        let lines: Vec<&str> = self.ptx.lines().collect();
        let header_end = self.kernels.first().map_or(lines.len(), |k| k.lines.0 - 1);
        let header = lines[..header_end].join("\n");
        self.kernels
            .iter()
            .map(|k| {
                let body = lines[k.lines.0 - 1..k.lines.1].join("\n");
                (k.name.clone(), format!("{header}\n{body}\n"))
            })
            .collect()
    }

    /// The kernel whose text holds line `line` (1-based) of the module.
    pub fn kernel_at_line(&self, line: usize) -> Option<&KernelInfo> {
        self.kernels
            .iter()
            .find(|k| k.lines.0 <= line && line <= k.lines.1)
    }
}

/// Compiles `graph` for the architecture `sm`.
///
/// Deterministic: the same graph and architecture give the same program.
pub fn compile(graph: &Graph, sm: SmArch) -> Result<CudaProgram, CudaError> {
    let split = split::split_long_reductions(graph)?;
    let graph = split.as_ref().unwrap_or(graph);
    let order = kiln_ir::schedule(graph)?;
    let mut plan = plan::plan(graph, &order)?;
    let tables = std::cell::RefCell::new(std::mem::take(&mut plan.weights));
    let mut kernels = Vec::new();
    let mut texts = Vec::new();
    let mut uses_smem = false;
    for (k, job) in plan.jobs.iter().enumerate() {
        let Some(kernel) = lower::lower_job(graph, &plan, &tables, job, k, sm.sm)? else {
            continue;
        };
        uses_smem |= kernel.uses_smem;
        texts.push(kernel.text);
        kernels.push(KernelInfo {
            name: kernel.name,
            node: kernel.node,
            op: kernel.op,
            launch: kernel.launch,
            lines: (0, 0),
        });
    }
    let ptx = ptx::module(sm.ptx_isa, sm.sm, &texts, uses_smem);
    // Line ranges: each kernel's text starts with its `.visible .entry`.
    let mut line_starts = ptx
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with(".visible .entry"))
        .map(|(i, _)| i + 1)
        .collect::<Vec<_>>();
    line_starts.push(ptx.lines().count() + 1);
    for (k, info) in kernels.iter_mut().enumerate() {
        info.lines = (line_starts[k], line_starts[k + 1] - 1);
    }
    let io = |name: &str, id: kiln_ir::NodeId, offset: u64| {
        let ty = &graph.node(id).ty;
        IoSpec {
            name: name.to_owned(),
            dtype: ty.dtype,
            shape: ty.shape.to_vec(),
            arena_offset: offset,
        }
    };
    let inputs = graph
        .inputs()
        .iter()
        .map(|&id| io(&graph.node(id).name, id, plan.locs[&id].offset))
        .collect();
    let outputs = graph
        .outputs()
        .iter()
        .zip(&plan.output_offsets)
        .map(|((name, id), &off)| io(name, *id, off))
        .collect();
    Ok(CudaProgram {
        sm,
        ptx,
        kernels,
        weights: tables.into_inner(),
        arena_size: plan.arena_size,
        inputs,
        outputs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm_table_is_sorted_and_isa_monotonic() {
        let t = SUPPORTED_SMS;
        assert!(t
            .windows(2)
            .all(|w| w[0].sm < w[1].sm && w[0].ptx_isa <= w[1].ptx_isa));
    }

    #[test]
    fn sm_names_parse_and_unknown_ones_list_the_supported() {
        assert_eq!(SmArch::parse("sm_86").unwrap().sm, 86);
        assert_eq!(SmArch::parse("sm90").unwrap().ptx_isa, (7, 8));
        let e = SmArch::parse("sm61").unwrap_err().to_string();
        assert!(
            e.contains("sm61") && e.contains("sm70, sm75, sm80, sm86, sm89, sm90"),
            "{e}"
        );
    }
}
