//! `kiln-driver`: the Kiln compiler as a library.
//!
//! [`compile`] runs the whole pipeline: ONNX import (`kiln-onnx`), the pass
//! pipeline (`kiln-passes`), code generation for the chosen [`Target`]
//! (`kiln-target-cpu`, `kiln-target-cuda`, behind [`target::Backend`]) and
//! artifact serialization (`kiln-format`). [`CompileOptions`] is everything
//! that decides the artifact, checked once by [`CompileOptions::validate`].
//! Around it: [`npy`] reads and writes `.npy`/`.npz` tensors (calibration
//! samples, bound inputs, `kiln run`), [`compare`] checks outputs against
//! references, [`report`] and [`report_html`] render a compilation for
//! machines, [`signing`] makes keys and signs artifacts. The `kiln` command
//! (`compiler/cli`) and the Python binding are front ends of this crate.
//!
//! # Example
//! ```no_run
//! use kiln_driver::{compile, CompileOptions};
//! let out = compile(std::path::Path::new("model.onnx"), &CompileOptions::default())?;
//! std::fs::write("model.kiln", &out.bytes)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

mod bounded;
pub mod compare;
pub mod debug;
mod error;
pub mod golden;
pub mod npy;
mod options;
pub mod output;
mod padding;
mod pipeline;
pub mod report;
pub mod report_html;
mod samples;
pub mod signing;
pub mod target;
mod variants;

pub use error::{DriverError, ErrorKind};
pub use kiln_passes::{PrecisionOutcome, Progress, Silent};
pub use options::source_precision;
pub use options::ShapeProfiles;
pub use options::{
    CompileOptions, DumpIr, GoldenInputs, Smooth, DEFAULT_COVERAGE_WARN, DEFAULT_MAX_ARENA_BYTES,
    DEFAULT_MAX_TRIP_COUNT, DEFAULT_SMOOTH_ALPHA, GOLDEN_TOLERANCES, MAX_PROFILES,
};
pub use pipeline::{
    compile, compile_bytes, compile_with_progress, first_difference, optimize, read_calibration,
    Compiled, Optimized, Validated,
};
pub use target::Target;
