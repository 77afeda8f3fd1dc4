//! `kiln`: the command line of the Kiln compiler.
//!
//! [`cli`] parses the command line (clap), runs each subcommand through
//! `kiln-driver` (the compiler as a library) or `kiln-runtime`, and renders
//! results and errors for people or, with `--json`, machines; the binary
//! in `main.rs` only calls [`cli::main`]. The Python binding (`python/`)
//! compiles through [`cli::compile_report`], so it runs the very same
//! option checks and reports.
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

pub mod cli;
