//! Errors of the ONNX frontend.

use std::fmt;
use std::path::PathBuf;
use thiserror::Error;

/// One op the frontend cannot import, with where it is and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The ONNX op type (`LSTM`).
    pub op_type: String,
    /// The node name (or `<op_type>_<index>` when the model leaves it empty).
    pub node_name: String,
    /// The op's domain; the default domain is spelled `ai.onnx`.
    pub domain: String,
    /// The opset version the model imports for that domain.
    pub opset: i64,
    /// Why, and what to do about it.
    pub hint: String,
    /// Graph inputs whose values, fixed at compile time
    /// ([`crate::ImportOptions::input_values`], `--bind-input`), would let
    /// the op import: set when the op needs a compile-time constant that
    /// depends only on these inputs. Empty otherwise.
    pub bindable_inputs: Vec<String>,
}

impl fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unsupported op '{}' (domain '{}', opset {}) at node '{}': {}",
            self.op_type, self.domain, self.opset, self.node_name, self.hint
        )?;
        if !self.bindable_inputs.is_empty() {
            let flags: Vec<String> = self
                .bindable_inputs
                .iter()
                .map(|i| format!("--bind-input {i}=FILE.npy"))
                .collect();
            write!(
                f,
                "; it depends on graph input{} {}: fix {} at compile time with {}",
                if self.bindable_inputs.len() == 1 {
                    ""
                } else {
                    "s"
                },
                self.bindable_inputs
                    .iter()
                    .map(|i| format!("'{i}'"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if self.bindable_inputs.len() == 1 {
                    "its value"
                } else {
                    "their values"
                },
                flags.join(" ")
            )?;
        }
        Ok(())
    }
}

/// Formats a list of unsupported ops: one inline, several one a line.
fn list_unsupported(ops: &[UnsupportedOp]) -> String {
    match ops {
        [one] => one.to_string(),
        _ => {
            let mut s = format!("{} unsupported ops:", ops.len());
            for op in ops {
                s.push_str("\n  ");
                s.push_str(&op.to_string());
            }
            s
        }
    }
}

/// Errors from loading or importing an ONNX model. The messages name the
/// node, op, value or file concerned; the frontend never panics on bad input.
#[derive(Debug, Error)]
pub enum OnnxError {
    /// The bytes are not a (complete) ONNX ModelProto.
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// Reading a file failed.
    #[error("cannot read '{path}': {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The model is structurally broken in a way no other variant covers
    /// (no graph, a value produced twice, a graph input without a type...).
    #[error("invalid ONNX model: {0}")]
    InvalidModel(String),
    /// Ops Kiln cannot import; every one in the graph is listed.
    #[error("{}", list_unsupported(.0))]
    Unsupported(Vec<UnsupportedOp>),
    /// Graph inputs with symbolic or unknown dims that no option binds:
    /// every one of every input, with a ready `--dim` line.
    #[error("{}", describe_unbound(.0))]
    UnboundDim(Vec<UnboundDim>),
    /// A value bound to a graph input at compile time contradicts the
    /// model's declared type or names no input.
    #[error("bound value for input '{input}': {message}")]
    InputValue {
        /// The input named in the options.
        input: String,
        /// What is wrong.
        message: String,
    },
    /// `--keep-values` patterns that name no computed value of the model.
    #[error("--keep-values {patterns} names no computed value of the model; values are ONNX tensor names such as {examples} (inputs, initializers and values that fold at import are not kept)")]
    KeepValues {
        /// The patterns as given.
        patterns: String,
        /// Some value names of the model, for the hint.
        examples: String,
    },
    /// A bound input shape contradicts the model or names no input.
    #[error("input shape for '{input}': {message}")]
    InputShape {
        /// The input named in the options.
        input: String,
        /// What is wrong.
        message: String,
    },
    /// The import met a run-time decision its [`Branches`](crate::Branches)
    /// give no value for (the caller enumerates the paths).
    #[error("{what}, on a value known only at run time: this import follows one path of the model's run-time control flow and has no value for it (decision '{key}')")]
    Undecided {
        /// The decision's key, for [`Branches::taken`](crate::Branches::taken).
        key: String,
        /// The decision in words: `If 'If_0' takes its then branch`.
        what: String,
    },
    /// The node graph has a cycle.
    #[error("the graph has a cycle through node '{0}'")]
    Cycle(String),
    /// A node reads a value that no node, initializer or graph input produces.
    #[error("node '{node}' reads '{input}', which no node, initializer or graph input produces")]
    MissingInput {
        /// The reading node (or `graph output`).
        node: String,
        /// The value name.
        input: String,
    },
    /// An attribute has the wrong protobuf type.
    #[error("node '{node}': attribute '{attribute}' should be {expected}, found {found}")]
    AttributeType {
        /// The node.
        node: String,
        /// The attribute name.
        attribute: String,
        /// The type the op needs (`INT`, `FLOATS`...).
        expected: String,
        /// The type in the model.
        found: String,
    },
    /// An attribute (or an attribute-like constant input) has a value the op
    /// does not allow.
    #[error("node '{node}': invalid attribute '{attribute}': {message}")]
    InvalidAttribute {
        /// The node.
        node: String,
        /// The attribute (or input) name.
        attribute: String,
        /// What is wrong.
        message: String,
    },
    /// A node is malformed in a way not tied to one attribute (a required
    /// input is missing, a used output cannot be produced...).
    #[error("node '{node}' ({op_type}): {message}")]
    InvalidNode {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// What is wrong.
        message: String,
    },
    /// Building the IR for a node failed (shape or type mismatch).
    #[error("node '{node}' ({op_type}): {source}")]
    Node {
        /// The node.
        node: String,
        /// Its op type.
        op_type: String,
        /// The IR's complaint.
        source: kiln_ir::IrError,
    },
    /// External tensor data is missing, out of range, or outside the model
    /// directory.
    #[error("external data of tensor '{tensor}': {reason}")]
    ExternalData {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        reason: ExternalDataError,
    },
    /// A tensor declares more bytes than the limit or than the data present.
    #[error("tensor '{tensor}' declares {declared_bytes} bytes: {reason}")]
    TooLarge {
        /// The tensor.
        tensor: String,
        /// The byte size its dims and type declare (saturating).
        declared_bytes: u64,
        /// Why that is refused.
        reason: String,
    },
    /// A tensor's stored data does not match its declared type and dims.
    #[error("tensor '{tensor}': {message}")]
    InvalidTensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// The model imports a default-domain opset newer than Kiln knows.
    #[error(
        "the model uses opset {version} of the default domain; Kiln knows opsets 1 to {newest}"
    )]
    UnsupportedOpset {
        /// The declared version.
        version: i64,
        /// The newest version Kiln implements.
        newest: i64,
    },
    /// A value has an element type Kiln does not support.
    #[error("'{value}' has element type {dtype}, which Kiln does not support")]
    UnsupportedDType {
        /// The value, tensor or attribute concerned.
        value: String,
        /// The ONNX type name.
        dtype: String,
    },
}

/// Why external data was refused.
#[derive(Debug, thiserror::Error)]
pub enum ExternalDataError {
    /// The tensor has no `location` entry.
    #[error("no 'location' entry")]
    NoLocation,
    /// `offset` or `length` is not a number.
    #[error("'{key}' is not a byte count: '{value}'")]
    BadNumber {
        /// `offset` or `length`.
        key: String,
        /// The value given.
        value: String,
    },
    /// The location is absolute, empty or climbs out with `..`.
    #[error("location '{0}' must be a relative path inside the model directory (absolute paths and '..' are refused)")]
    Escapes(String),
    /// A component of the location is hidden (starts with a dot).
    #[error("location '{location}' has the hidden component '{component}': hidden files and directories are never read")]
    Hidden {
        /// The location.
        location: String,
        /// The hidden component.
        component: String,
    },
    /// A component of the location is a symbolic link.
    #[error("'{}' is a symbolic link: external data is read without following links (copy the file into the model directory)", .0.display())]
    Symlink(PathBuf),
    /// The location is not a regular file.
    #[error("'{}' is {kind}, not a regular file", path.display())]
    NotRegularFile {
        /// The path.
        path: PathBuf,
        /// What it is (`a named pipe (FIFO)`, `a directory`...).
        kind: &'static str,
    },
    /// The model was not loaded from a file.
    #[error(
        "location '{0}' is relative to the model file, but the model was not loaded from a file"
    )]
    NoModelDirectory(String),
    /// Opening or reading failed.
    #[error("cannot {action} '{}': {source}", path.display())]
    Io {
        /// `open`, `read`...
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// The `length` entry does not match the tensor.
    #[error("'length' is {length} bytes but the tensor needs {needed}")]
    Length {
        /// The `length` entry.
        length: u64,
        /// The tensor's byte size.
        needed: u64,
    },
    /// `offset` + the tensor's size is past the end of the file.
    #[error("offset {offset} + {bytes} bytes is past the end of '{}' ({file_len} bytes)", path.display())]
    PastEnd {
        /// The `offset` entry.
        offset: u64,
        /// The tensor's byte size.
        bytes: u64,
        /// The file.
        path: PathBuf,
        /// Its size.
        file_len: u64,
    },
}

/// One dim of a graph input that no option binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnboundDim {
    /// The graph input.
    pub input: String,
    /// Position of the dim.
    pub dim_index: usize,
    /// The `dim_param` name, if the model gives one.
    pub dim_name: Option<String>,
    /// An example shape for the message: the declared dims with every
    /// unbound one at its suggested value.
    pub suggested_shape: Vec<usize>,
}

/// Values suggested for symbolic dims by (lower-case) name: the first
/// entry whose word the name contains wins; anything else gets 1.
const SUGGESTED_DIMS: [(&str, usize); 8] = [
    ("batch", 1),
    ("seq", 128),
    ("len", 128),
    ("token", 128),
    ("time", 128),
    ("frame", 128),
    ("height", 224),
    ("width", 224),
];

/// The value `kiln compile` suggests for the symbolic dim `name`.
pub fn suggested_dim(name: &str) -> usize {
    let name = name.to_ascii_lowercase();
    (SUGGESTED_DIMS.iter())
        .find(|(word, _)| name.contains(word))
        .map_or(1, |&(_, v)| v)
}

fn describe_unbound(dims: &[UnboundDim]) -> String {
    let mut inputs: Vec<(&str, Vec<String>)> = Vec::new();
    for d in dims {
        let what = match &d.dim_name {
            Some(n) => format!("dim {} ('{n}')", d.dim_index),
            None => format!("dim {} (unnamed)", d.dim_index),
        };
        match inputs.iter_mut().find(|(i, _)| *i == d.input) {
            Some((_, list)) => list.push(what),
            None => inputs.push((&d.input, vec![what])),
        }
    }
    let listed: Vec<String> = (inputs.iter())
        .map(|(input, list)| format!("'{input}' {}", list.join(", ")))
        .collect();
    let mut names: Vec<&str> = Vec::new();
    for n in dims.iter().filter_map(|d| d.dim_name.as_deref()) {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let dim_line: Vec<String> = (names.iter())
        .map(|n| format!("--dim {n}={}", suggested_dim(n)))
        .collect();
    let mut hint = Vec::new();
    if !dim_line.is_empty() {
        hint.push(format!(
            "bind them, e.g. {} (several values make one profile each: --dim NAME=1,8,32 or NAME=16..512:16)",
            dim_line.join(" ")
        ));
    }
    let mut shapes: Vec<&UnboundDim> = dims.iter().collect();
    shapes.dedup_by(|a, b| a.input == b.input);
    let shapes: Vec<String> = (shapes.iter())
        .map(|d| {
            let shape: Vec<String> = d.suggested_shape.iter().map(usize::to_string).collect();
            format!("--input-shape {}={}", d.input, shape.join("x"))
        })
        .collect();
    match dim_line.is_empty() {
        true => hint.push(format!("give the whole shapes, e.g. {}", shapes.join(" "))),
        false => hint.push(format!("or the whole shapes: {}", shapes.join(" "))),
    }
    format!(
        "graph inputs have dims no option binds: {}; {}",
        listed.join("; "),
        hint.join("; ")
    )
}
