//! The driver's error type, below the driver and the target backends that
//! both return it.

use std::path::PathBuf;

use kiln_onnx::OnnxError;
use kiln_passes::PassError;
use kiln_target_cpu::CpuError;
use kiln_target_cuda::CudaError;
use thiserror::Error;

/// Errors of the driver; each wraps the failing stage's error.
#[derive(Debug, Error)]
pub enum DriverError {
    /// Reading or importing the ONNX model failed.
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    /// The pass pipeline failed.
    #[error(transparent)]
    Pass(#[from] PassError),
    /// Code generation failed.
    #[error(transparent)]
    Cpu(#[from] CpuError),
    /// CUDA code generation (or ptxas) failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The compiled model needs a larger arena than
    /// [`crate::CompileOptions::max_arena_bytes`] allows.
    #[error("the model needs a {arena_bytes}-byte arena, more than the limit of {limit} bytes (its shapes are too large)")]
    ArenaTooLarge {
        /// Arena bytes the artifact would need.
        arena_bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Calibration data (`--calibrate DIR`) that does not fit the model,
    /// found before any compile work is done.
    #[error("calibration data {}: {message}", path.display())]
    Calibration {
        /// The directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Golden input sets (`--golden`) that do not fit the model, or that
    /// the reference evaluator cannot run.
    #[error("golden inputs {}: {message}", path.display())]
    Golden {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Reference values (`kiln debug --reference DIR`) that do not fit the
    /// model, or inputs the reference evaluator cannot run.
    #[error("reference values {}: {message}", path.display())]
    Reference {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The compiled model failed to load or run (`kiln debug`).
    #[error("running the compiled model: {0}")]
    Run(#[from] kiln_runtime::Error),
    /// An option combination that cannot work (`--max-rel-error` without
    /// calibration samples).
    #[error("{0}")]
    Usage(String),
    /// A dim `--pad-dim` names cannot be padded: an op combines its rows
    /// (the message names the node and op), or it is on no input.
    #[error("--pad-dim {dim}: {message}")]
    Padding {
        /// The dim.
        dim: String,
        /// Why.
        message: String,
    },
    /// A value of data-dependent size (NonZero, Compress, NMS, TopK of a
    /// run-time k) meets an op that reads past its run's length.
    #[error("'{value}' has a size that depends on the data, computed at its bound, and {reason}: only ops that keep the positions along that axis apart may follow it (docs/bounded.md)")]
    Bounded {
        /// The data-dependent value.
        value: String,
        /// The op that reads across its axis, and why.
        reason: String,
    },
    /// An error compiling one profile of several (`--dim batch=1,8`).
    #[error("profile {profile}: {source}")]
    InProfile {
        /// The profile's bindings (`batch=8 seq=128`).
        profile: String,
        /// The error.
        source: Box<DriverError>,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What kind of failure a [`DriverError`] is, for a front end to report
/// (the `kiln` command's exit codes): the one classification of every
/// stage's errors, so no front end matches on the stages' own types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The model is unreadable or malformed.
    BadModel,
    /// The model needs something Kiln does not support (an op, a dtype, an
    /// opset, an unbound dim, a shape past a limit).
    Unsupported,
    /// The options or their values cannot work.
    Usage,
    /// Calibration data does not fit the model.
    BadInput,
    /// A file could not be read or written (or a tool, ptxas, run).
    Io,
    /// A Kiln bug: a pass or an assembler failed on valid input.
    Internal,
}

impl DriverError {
    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DriverError::Onnx(o) => match o {
                OnnxError::Io { .. } => ErrorKind::Io,
                OnnxError::Unsupported(_)
                | OnnxError::UnboundDim { .. }
                | OnnxError::UnsupportedDType { .. }
                | OnnxError::UnsupportedOpset { .. } => ErrorKind::Unsupported,
                OnnxError::InputValue { .. } | OnnxError::KeepValues { .. } => ErrorKind::Usage,
                _ => ErrorKind::BadModel,
            },
            DriverError::Pass(
                PassError::UnknownPass { .. } | PassError::UnknownLevel(_) | PassError::Plan(_),
            ) => ErrorKind::Usage,
            DriverError::Pass(_) => ErrorKind::Internal,
            DriverError::Cpu(_) | DriverError::ArenaTooLarge { .. } => ErrorKind::Unsupported,
            DriverError::Cuda(CudaError::UnsupportedSm(_)) => ErrorKind::Usage,
            DriverError::Cuda(CudaError::Ptxas(_)) => ErrorKind::Io,
            DriverError::Cuda(CudaError::PtxasRejected { .. }) => ErrorKind::Internal,
            DriverError::Cuda(_) => ErrorKind::Unsupported,
            DriverError::Io { .. } => ErrorKind::Io,
            DriverError::Calibration { .. }
            | DriverError::Golden { .. }
            | DriverError::Reference { .. } => ErrorKind::BadInput,
            DriverError::Run(e) => match e {
                // The target's code cannot run on this machine.
                kiln_runtime::Error::UnsupportedArch { .. }
                | kiln_runtime::Error::CudaArtifact { .. }
                | kiln_runtime::Error::MissingCpuFeatures(_) => ErrorKind::Usage,
                kiln_runtime::Error::UnknownInput { .. }
                | kiln_runtime::Error::MissingInput { .. }
                | kiln_runtime::Error::InputTypeMismatch { .. }
                | kiln_runtime::Error::InputDataLength { .. }
                | kiln_runtime::Error::NoProfile { .. }
                | kiln_runtime::Error::VariantRefused { .. }
                | kiln_runtime::Error::NoVariant { .. } => ErrorKind::BadInput,
                _ => ErrorKind::Internal,
            },
            DriverError::Usage(_) => ErrorKind::Usage,
            DriverError::InProfile { source, .. } => source.kind(),
            DriverError::Padding { .. } | DriverError::Bounded { .. } => ErrorKind::Unsupported,
        }
    }
}
