//! `kiln`: the compiler driver behind the `kiln` command.
//!
//! [`driver::compile`] runs the whole pipeline: ONNX import
//! (`kiln-onnx`), the pass pipeline (`kiln-passes`), code generation for the
//! chosen target (`kiln-target-cpu`) and artifact serialization
//! (`kiln-runtime`'s format). [`npy`] reads and writes `.npy`/`.npz`
//! tensors for `kiln run`; [`signing`] makes keys and signs artifacts.
//! [`cli`] is the command line (argument parsing, subcommands, rendering
//! for people or, with `--json`, machines); the binary in `main.rs` only
//! calls it, and the Python binding (`python/`) compiles through
//! [`cli::compile_report`].
//!
//! # Example
//! ```no_run
//! use kiln::driver::{compile, CompileOptions};
//! let out = compile(std::path::Path::new("model.onnx"), &CompileOptions::default())?;
//! std::fs::write("model.kiln", &out.bytes)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

pub mod cli;
pub mod compare;
pub mod driver;
mod error;
pub mod npy;
pub mod output;
pub mod report_html;
pub mod signing;
pub mod target;
