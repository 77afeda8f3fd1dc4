//! Model metadata: provenance, and per profile the inputs, outputs,
//! arena size and schedule.

use std::fmt;

use super::DType;

/// A model input or output: name, element type, static shape, and where the
/// tensor lives in the arena (dense, row-major, little-endian).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name of the ONNX graph input or output.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions (empty for a scalar).
    pub shape: Vec<u64>,
    /// Byte offset of the tensor in the arena.
    pub arena_offset: u64,
}

impl TensorSpec {
    /// Number of elements, or `None` on overflow.
    pub fn num_elements(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Size of the tensor in bytes, or `None` on overflow.
    pub fn checked_byte_len(&self) -> Option<u64> {
        self.num_elements()?
            .checked_mul(self.dtype.size_bytes() as u64)
    }

    /// Size of the tensor in bytes (saturating at `u64::MAX`; specs of a
    /// parsed artifact never overflow).
    pub fn byte_len(&self) -> u64 {
        self.checked_byte_len().unwrap_or(u64::MAX)
    }

    /// The type as written in messages: `f32[1,3,224,224]`.
    pub fn type_string(&self) -> String {
        type_string(self.dtype, &self.shape)
    }
}

/// Formats a dtype and shape as `f32[1,3,224,224]` (`f32[]` for a scalar).
pub fn type_string(dtype: DType, shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("{dtype}[{}]", dims.join(","))
}

impl fmt::Display for TensorSpec {
    /// `name: f32[1,3] @ arena+64`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} @ arena+{}",
            self.name,
            self.type_string(),
            self.arena_offset
        )
    }
}

/// Provenance a compiler target records in the artifact's [`Metadata`]:
/// the same for every target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArtifactInfo {
    /// Version of the compiler writing the artifact.
    pub compiler_version: String,
    /// Compile options, as text (shown by `kiln inspect`).
    pub options: String,
    /// SHA-256 of the source model.
    pub source_sha256: [u8; 32],
}

/// Where the artifact came from: compiler, target and options, source
/// model. The same for every profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Version of the compiler that wrote the artifact.
    pub compiler_version: String,
    /// Target name as given to the compiler (`x86_64-v3`, `native`, ...).
    pub target: String,
    /// Compile options, as text (for `kiln inspect`).
    pub options: String,
    /// SHA-256 of the source model file.
    pub source_sha256: [u8; 32],
}

/// One specialization of the model to one combination of input shapes
/// (`kiln compile --dim batch=1,8`): its inputs and outputs with their
/// shapes and arena offsets, its arena size, how its dense nodes were
/// lowered, its schedule and its [`Role`]. Every profile of an artifact
/// has the same input names, dtypes and ranks, in the same order, and
/// every model profile the same output names, dtypes and ranks (the
/// decoder checks it); no two selectable profiles have the same input
/// shapes and guards. All share the artifact's weights and kernels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// Model inputs, in declared order.
    pub inputs: Vec<TensorSpec>,
    /// Model outputs, in declared order.
    pub outputs: Vec<TensorSpec>,
    /// Size of the arena (activations, inputs, outputs, scratch) in bytes.
    pub arena_size: u64,
    /// How each dense node was lowered (empty for targets that do not
    /// choose between kernels).
    pub dense_kernels: Vec<DenseKernel>,
    /// Kernel calls of one inference, in order (empty for CUDA, whose
    /// code carries its own schedule).
    pub schedule: Vec<crate::Step>,
    /// What a run does with this profile: run the model, refuse, or
    /// compute a run-time condition that selects between variants.
    pub role: Role,
    /// The outputs whose size along one axis depends on data (NonZero,
    /// TopK of a run-time k): planned at their bound, cut by a run to the
    /// length it computed. At most one per output, in output order.
    pub bounded: Vec<BoundedOutput>,
}

/// An output computed at its bound along `axis`, whose run's length the
/// kernels write to the arena as an `i64` at `length_offset`: a run
/// returns the first `length` positions along the axis, and a length
/// outside `0..=bound` is an error of the run, never a read past the
/// buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundedOutput {
    /// The output's index among the profile's outputs.
    pub output: u32,
    /// The axis of data-dependent length.
    pub axis: u32,
    /// Byte offset of the run's length (`i64`) in the arena.
    pub length_offset: u64,
}

/// What a profile is for. A model whose control flow branches on values
/// known only at run time (an `If` on an input, a `Loop` whose trip count
/// is an input) is compiled once per path, a **variant**: each variant is
/// a profile whose [`Guard`]s name the condition programs that must give
/// the values its path assumed. Variants of one input shape share the
/// shapes; their guards tell them apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Runs the model when its input shapes match and every guard holds
    /// (no guards: the input shapes alone select it).
    Model {
        /// The conditions this variant's path assumed, in the order the
        /// model meets them.
        guards: Vec<Guard>,
    },
    /// A path the compiler could not build (a branch that does not import
    /// at these shapes, a loop past `--max-trip-count`): a run that takes
    /// it is refused with `reason`. It has no outputs and no schedule.
    Refused {
        /// The conditions of the path, as for [`Role::Model`].
        guards: Vec<Guard>,
        /// Why the path has no code.
        reason: String,
    },
    /// Computes one run-time condition from the inputs: its one output is
    /// a one-element bool.
    Condition {
        /// The condition in words (`If 'If_0' takes its then branch`).
        what: String,
    },
}

impl Role {
    /// A profile selected by its input shapes alone.
    pub const SHAPES: Role = Role::Model { guards: Vec::new() };

    /// The guards of a model or refused variant (none for a condition).
    pub fn guards(&self) -> &[Guard] {
        match self {
            Role::Model { guards } | Role::Refused { guards, .. } => guards,
            Role::Condition { .. } => &[],
        }
    }

    /// Whether a run's input shapes may select this profile (a model or a
    /// refused variant; a condition program only serves them).
    pub fn is_selectable(&self) -> bool {
        !matches!(self, Role::Condition { .. })
    }
}

/// Conditions and their values in words, as messages and listings show
/// them: `If 'If_0' takes its then branch: false, ...`. Each value names
/// a condition program by its index in `profiles`.
pub fn describe_conditions(
    profiles: &[Profile],
    values: impl IntoIterator<Item = (u32, bool)>,
) -> String {
    let words: Vec<String> = (values.into_iter())
        .map(|(c, v)| match profiles.get(c as usize).map(|p| &p.role) {
            Some(Role::Condition { what }) => format!("{what}: {v}"),
            _ => format!("condition {c}: {v}"),
        })
        .collect();
    words.join(", ")
}

/// One condition a variant assumed: the condition program (an index into
/// the profiles, of [`Role::Condition`]) gives `holds` on this run's
/// inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Guard {
    /// The condition program's profile index.
    pub condition: u32,
    /// The value the variant's path assumed.
    pub holds: bool,
}

impl Profile {
    /// The input shapes, as in messages: `x: f32[1,3,224,224], mask: i64[1,16]`.
    pub fn describe_inputs(&self) -> String {
        let specs: Vec<String> = (self.inputs.iter())
            .map(|s| format!("{}: {}", s.name, s.type_string()))
            .collect();
        specs.join(", ")
    }
}

/// A dim the runtime may pad (`kiln compile --pad-dim batch`): inputs
/// smaller along it than every profile run the smallest profile at least
/// as large, padded with zeros along the dim, and the outputs are cut back
/// to the real size. The compiler proved that no op combines the rows of
/// this axis, so the real rows come out as an exact profile computes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PaddableDim {
    /// The dim's name in the model (`batch`).
    pub name: String,
    /// Per input, in declared order: the axis that is this dim, if any.
    pub inputs: Vec<Option<u32>>,
    /// Per output, in declared order: the axis its rows are on, if any
    /// (an output without one is returned whole).
    pub outputs: Vec<Option<u32>>,
}

/// The largest arena any of `profiles` needs: what one session allocates
/// to run them all.
pub fn largest_arena(profiles: &[Profile]) -> u64 {
    profiles.iter().map(|p| p.arena_size).max().unwrap_or(0)
}

/// How the compiler lowered one dense node (MatMul, Gemm, Conv, their
/// integer forms, and fused kernels with such a head): the kernel chosen
/// and why each faster candidate declined. `kiln inspect` lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseKernel {
    /// Name of the node.
    pub node: String,
    /// The dense op (`conv`, `matmul`, ...), the head's for a fused node.
    pub op: String,
    /// The kernel chosen (`avx512/implicit-gemm`, `generic/cranelift`, ...).
    pub kernel: String,
    /// Floating-point operations of one run (a multiply-add counts 2).
    pub flops: u64,
    /// The candidates tried before the chosen one, each with the reason it
    /// declined, in the order they were tried.
    pub declined: Vec<Declined>,
}

/// A candidate lowering that did not serve a node, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declined {
    /// The candidate's name.
    pub kernel: String,
    /// Why it does not apply.
    pub reason: String,
}

impl DenseKernel {
    /// Whether the chosen kernel is the generic (Cranelift) one rather than
    /// a microkernel.
    pub fn is_generic(&self) -> bool {
        self.kernel.starts_with("generic/")
    }
}
