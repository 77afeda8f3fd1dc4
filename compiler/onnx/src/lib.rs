//! `kiln-onnx`: the ONNX frontend of Kiln.
//!
//! It decodes an ONNX `ModelProto` (with tract-onnx's protobuf types) and
//! builds a [`kiln_ir::Graph`] with concrete shapes:
//!
//! 1. structural checks: every value read is produced (initializer, graph
//!    input or node output) and the nodes form a DAG;
//! 2. one scan over the whole graph that reports **every** unsupported op
//!    at once ([`OnnxError::Unsupported`]);
//! 3. graph inputs get concrete shapes: symbolic or unknown dims are bound
//!    from [`ImportOptions::input_shapes`] or [`ImportOptions::dims`], and an
//!    unbound one is an [`OnnxError::UnboundDim`] naming every input and dim;
//! 4. initializers are decoded (inline or external data, size-checked
//!    before any allocation, never read from outside the model directory);
//! 5. nodes are built in topological order by per-family builders in
//!    [`ops`]; whenever all inputs of an op are constants (and always for
//!    `Shape`) it is evaluated with [`kiln_ir::eval::eval`] and becomes a
//!    constant, so shape subgraphs (Shape → Gather → Concat → Reshape)
//!    vanish at import.
//!
//! Control flow is imported inline ([`ops::control`]), since the IR has no
//! subgraphs: an `If` whose condition folds to a constant imports only the
//! branch taken; one whose condition is known only at run time imports both
//! branches and selects each output with a `Where` on the condition (exact,
//! as ONNX branches have no side effects; both branches must give the same
//! static shapes and types). `Scan` and `Loop` are unrolled, one copy of the
//! body per iteration, scan outputs stacked with a `Concat`: a `Loop` needs
//! its trip count and its condition (initial and per iteration) known at
//! import. At most [`ops::control::MAX_ITERATIONS`] iterations per node and
//! [`ops::control::MAX_UNROLLED_NODES`] body nodes per model are unrolled,
//! checked before a body is imported. Subgraphs read outer values by name;
//! the names a subgraph defines are scoped to it, and the unsupported-op
//! scan of step 2 looks into subgraphs too.
//!
//! Opsets 1 to 23 and later of the default domain are accepted; opset
//! differences live inside each builder.
//!
//! ```no_run
//! use kiln_onnx::{import, ImportOptions};
//! let mut opts = ImportOptions::default();
//! opts.dims.insert("batch".into(), 1);
//! let graph = import(std::path::Path::new("model.onnx"), &opts)?;
//! # Ok::<(), kiln_onnx::OnnxError>(())
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

mod ctx;
mod error;
mod external;
mod import;
pub mod ops;
mod summary;
mod tensor;

pub use ctx::{ImportCtx, Val, FOLD_LIMIT_BYTES};
pub use error::{suggested_dim, ExternalDataError, OnnxError, UnboundDim, UnsupportedOp};
pub use external::ExternalData;
pub use import::Preflight;
pub use summary::{summarize, DimSummary, IoSummary, ModelSummary};
pub use tensor::{dtype_from_onnx, onnx_dtype_name, tensor_from_proto};
pub use tract_onnx::pb;
pub use tract_onnx::pb::ModelProto;

use std::collections::BTreeMap;
use std::path::Path;

/// Options of an import.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportOptions {
    /// Whole shapes for graph inputs by name (`--input-shape x=1x3x224x224`).
    /// The rank must match the model and known dims must agree.
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// Values for named symbolic dims (`--dim batch=1`).
    pub dims: BTreeMap<String, usize>,
    /// The largest byte size one initializer (or constant tensor) may declare.
    /// Default 4 GiB. Data read from the model must also be present: a
    /// tensor never claims more bytes than its file (or external file) holds.
    pub max_initializer_bytes: u64,
    /// The most bytes of constant data the import may create that the model
    /// does not hold, summed over the model: folded results, `ConstantOfShape`
    /// and `Expand` outputs, folded BatchNorm parameters. Default
    /// [`DEFAULT_MAX_GENERATED_BYTES`]. A small model cannot make the import
    /// allocate more than this (plus its own size); a node that would cross
    /// the limit is an [`OnnxError::TooLarge`] naming it, except plain folds,
    /// which are then left in the graph to run in the arena.
    pub max_generated_bytes: u64,
    /// Values fixed at compile time for graph inputs by name
    /// (`--bind-input NAME=FILE.npy`). The input becomes a constant that
    /// folds into whatever reads it (a `Reshape` target, `Pad` amounts,
    /// `TopK`'s k) and is no longer an input of the compiled model. The
    /// value's type must match the model's declaration (symbolic dims take
    /// the value's size).
    pub input_values: BTreeMap<String, kiln_ir::Tensor>,
    /// Computed values to keep as extra graph outputs (`--keep-values`),
    /// after the model's own outputs, in the model's node order.
    pub keep_values: KeepValues,
    /// How control flow whose condition is known only at run time is
    /// imported: `None` imports both branches of such an `If` and selects
    /// with `Where` (and refuses such a `Loop`); `Some` follows one path,
    /// the compiler's variants (see [`Branches`]).
    pub branches: Option<Branches>,
}

/// One path through a model's run-time control flow. Every place where
/// the model decides at run time (an `If` whose condition is computed
/// from inputs, each iteration of a `Loop` whose trip count or condition
/// is) is a **decision**, named by a key; an import follows `taken` and
/// stops at the first decision it has no value for with
/// [`OnnxError::Undecided`], so a caller enumerates the paths one
/// decision at a time. Each path imports to a graph of static shapes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Branches {
    /// The value of each decision met so far, by key.
    pub taken: BTreeMap<String, bool>,
    /// Import this decision's condition (on the path `taken`) as the
    /// graph's one output, a one-element bool named [`CONDITION_OUTPUT`],
    /// instead of the model's outputs: the program that tells, at run
    /// time, which way the decision goes.
    pub condition_of: Option<String>,
    /// Most iterations a `Loop` with a run-time trip count or condition
    /// runs (`--max-trip-count`): a path past it is an error.
    pub max_trip_count: usize,
}

/// The output of a condition program ([`Branches::condition_of`]).
pub const CONDITION_OUTPUT: &str = "condition";

/// Which computed values an import keeps as extra graph outputs, named by
/// their ONNX tensor names (`kiln compile --keep-values`, `kiln debug`). A
/// kept value is a graph output, so no pass fuses it away or lets another
/// value reuse its memory: the compiled model computes and returns it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KeepValues {
    /// Only the model's outputs.
    #[default]
    None,
    /// Every value a node computes.
    All,
    /// The values whose names match one of these patterns.
    Matching(Vec<kiln_ir::NamePattern>),
}

impl KeepValues {
    /// Whether the value `name` is kept.
    pub fn keeps(&self, name: &str) -> bool {
        match self {
            KeepValues::None => false,
            KeepValues::All => true,
            KeepValues::Matching(patterns) => patterns.iter().any(|p| p.matches(name)),
        }
    }
}

impl std::fmt::Display for KeepValues {
    /// As `--keep-values` takes it: `all` or comma-separated patterns.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepValues::None => Ok(()),
            KeepValues::All => f.write_str("all"),
            KeepValues::Matching(patterns) => {
                let list: Vec<&str> = patterns.iter().map(|p| p.as_str()).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

impl std::str::FromStr for KeepValues {
    type Err = String;
    /// `all`, or comma-separated name patterns (none empty).
    fn from_str(s: &str) -> Result<KeepValues, String> {
        if s == "all" {
            return Ok(KeepValues::All);
        }
        let patterns = (s.split(','))
            .map(|p| match p.trim() {
                "" => Err(format!("empty pattern in '{s}'")),
                p => Ok(p.parse().unwrap_or_else(|e| match e {})),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeepValues::Matching(patterns))
    }
}

/// Default of [`ImportOptions::max_generated_bytes`]: 1 GiB, enough for the
/// ONNX "light" models whose weights are `ConstantOfShape` nodes (VGG-19,
/// the largest, needs 548 MiB).
pub const DEFAULT_MAX_GENERATED_BYTES: u64 = 1 << 30;

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            input_shapes: BTreeMap::new(),
            dims: BTreeMap::new(),
            max_initializer_bytes: 4 << 30,
            max_generated_bytes: DEFAULT_MAX_GENERATED_BYTES,
            input_values: BTreeMap::new(),
            keep_values: KeepValues::None,
            branches: None,
        }
    }
}

/// Reads and decodes an ONNX model file (external data is not read here).
pub fn load_model(path: &Path) -> Result<ModelProto, OnnxError> {
    decode_model(&read_model_file(path)?)
}

/// The bytes of the ONNX model file at `path`, a regular file (a FIFO or
/// device is refused before anything is read).
pub fn read_model_file(path: &Path) -> Result<Vec<u8>, OnnxError> {
    let io_err = |source| OnnxError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut bytes = Vec::new();
    let mut file = external::open_model_file(path).map_err(io_err)?;
    std::io::Read::read_to_end(&mut file, &mut bytes).map_err(io_err)?;
    Ok(bytes)
}

/// Decodes ONNX protobuf bytes.
pub fn decode_model(bytes: &[u8]) -> Result<ModelProto, OnnxError> {
    let model = <ModelProto as prost::Message>::decode(bytes)
        .map_err(|e| OnnxError::Decode(e.to_string()))?;
    // Protobuf accepts many byte strings as an empty message; an ONNX model
    // has at least a graph or an opset.
    if model.graph.is_none() && model.opset_import.is_empty() && model.ir_version == 0 {
        return Err(OnnxError::Decode("the data holds no ONNX graph".into()));
    }
    Ok(model)
}

/// Loads the model at `path` and imports it; external data is read from the
/// file's directory.
pub fn import(path: &Path, opts: &ImportOptions) -> Result<kiln_ir::Graph, OnnxError> {
    let model = load_model(path)?;
    import_model(&model, model_dir(path), opts)
}

/// Where the external data of the model file at `path` lives: its
/// directory.
pub fn model_dir(path: &Path) -> Option<&Path> {
    path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    })
}

/// Lists every unsupported op and every unbound graph-input dim of a
/// decoded model (`kiln compile --check`), so a user sees everything that
/// blocks a compile at once. The ops and dims come from a scan of the
/// model; when the scan finds nothing, the model is imported (no passes,
/// no code) to find the uses of supported ops that cannot compile: an op
/// whose output shape depends on run-time data and has no bounded form
/// (`Unique`, `NonMaxSuppression`; `docs/bounded.md`), which names the
/// graph input to bind. External
/// data is read from `model_dir`.
pub fn preflight(
    model: &ModelProto,
    model_dir: Option<&Path>,
    opts: &ImportOptions,
) -> Result<Preflight, OnnxError> {
    let mut report = import::preflight(model, opts)?;
    if report.is_clear() {
        match import_model(model, model_dir, opts) {
            // A decision of run-time control flow: compiling enumerates
            // the paths.
            Ok(_) | Err(OnnxError::Undecided { .. }) => {}
            Err(OnnxError::Unsupported(list)) => report.unsupported = list,
            Err(e) => return Err(e),
        }
    }
    Ok(report)
}

/// Imports a decoded model into IR. `model_dir` is where external tensor
/// data lives (`None`: external data is an error).
pub fn import_model(
    model: &ModelProto,
    model_dir: Option<&Path>,
    opts: &ImportOptions,
) -> Result<kiln_ir::Graph, OnnxError> {
    import::import_model(model, model_dir, opts)
}
