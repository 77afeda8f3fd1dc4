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
    /// An option combination that cannot work (`--max-rel-error` without
    /// calibration samples).
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
