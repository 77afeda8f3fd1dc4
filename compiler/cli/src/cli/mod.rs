//! The `kiln` command: argument parsing (clap), one module per
//! subcommand, and rendering results and errors for people or, with
//! `--json`, machines. What a command does lives in `kiln-driver`; this
//! module only turns flags into its options and its results into text. In
//! the library so that the Python binding (`python/`) runs the very same
//! option checks and reports as the command line ([`compile_report`]).

mod bench;
mod compile;
mod debug;
mod inputs;
mod inspect;
mod keygen;
mod options;
mod run;
mod verify;

pub use compile::compile_report;
pub use debug::debug_report;

use bench::BenchArgs;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use compile::CompileArgs;
use debug::DebugArgs;
use inspect::InspectArgs;
use keygen::KeygenArgs;
use kiln_driver::npy::NpyError;
use kiln_driver::{DriverError, ErrorKind};
use run::RunArgs;
use std::path::Path;
use verify::VerifyArgs;

/// Exit codes, documented in the README.
pub mod exit {
    /// Success.
    pub const OK: i32 = 0;
    /// Internal error (a Kiln bug).
    pub const INTERNAL: i32 = 1;
    /// Bad command line (clap's own code).
    pub const USAGE: i32 = 2;
    /// The model file is unreadable or malformed.
    pub const BAD_MODEL: i32 = 3;
    /// The model uses something Kiln does not support, or a dim is unbound.
    pub const UNSUPPORTED: i32 = 4;
    /// The artifact is invalid or cannot run on this machine.
    pub const BAD_ARTIFACT: i32 = 5;
    /// Inputs given to `run`/`bench` are wrong.
    pub const BAD_INPUT: i32 = 6;
    /// `run --check`, `verify` or `debug` found values outside tolerance.
    pub const CHECK_FAILED: i32 = 7;
    /// A file could not be read or written.
    pub const IO: i32 = 8;
}

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Kiln: an ahead-of-time compiler for ONNX models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile an ONNX model into a .kiln artifact.
    Compile(Box<CompileArgs>),
    /// Run an artifact on .npy/.npz inputs (or random inputs).
    Run(RunArgs),
    /// Describe an ONNX model or a .kiln artifact.
    Inspect(InspectArgs),
    /// Measure an artifact's latency.
    Bench(BenchArgs),
    /// Make an Ed25519 key pair for signing artifacts (`compile --sign`).
    Keygen(KeygenArgs),
    /// Run the artifact's golden self-test (`compile --golden`) on this
    /// machine: exit 0, or 7 when an output is beyond its tolerance.
    Verify(VerifyArgs),
    /// Find where a compiled model departs from its source model: the first
    /// value beyond tolerance (every value kept and compared), or with
    /// --bisect-passes the pass that makes the outputs depart. Exit 0, or
    /// 7 when something departs.
    Debug(Box<DebugArgs>),
}

/// A failure rendered for people, with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code ([`exit`]).
    pub code: i32,
    /// What went wrong, for people (printed after `error: `).
    pub message: String,
}

impl Failure {
    pub(crate) fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<DriverError> for Failure {
    fn from(e: DriverError) -> Failure {
        let code = match e.kind() {
            ErrorKind::BadModel => exit::BAD_MODEL,
            ErrorKind::Unsupported => exit::UNSUPPORTED,
            ErrorKind::Usage => exit::USAGE,
            ErrorKind::BadInput => exit::BAD_INPUT,
            ErrorKind::Io => exit::IO,
            ErrorKind::Internal => exit::INTERNAL,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<kiln_runtime::Error> for Failure {
    fn from(e: kiln_runtime::Error) -> Failure {
        use kiln_runtime::Error as E;
        // Every variant named, no wildcard: a new runtime error must be
        // classified here, not fall into "bad input" by default.
        let code = match &e {
            E::Io { .. } => exit::IO,
            E::InvalidPublicKey(_) => exit::USAGE,
            // The artifact is invalid, or cannot be loaded or run here.
            E::Format(_)
            | E::UnsupportedArch { .. }
            | E::CudaArtifact { .. }
            | E::MissingCpuFeatures(_)
            | E::SealWeights(_)
            | E::CodeMemory(_)
            | E::RelocationOutOfRange { .. }
            | E::SpawnThreads(_)
            | E::OutOfMemory { .. }
            | E::Unsigned { .. }
            | E::SignatureFile { .. }
            | E::ModifiedAfterSigning { .. }
            | E::BadSignature
            | E::GoldenOutput { .. } => exit::BAD_ARTIFACT,
            // `kiln verify` of an artifact compiled without `--golden`.
            E::NoGolden => exit::USAGE,
            #[cfg(feature = "cuda")]
            E::NoCudaDriver
            | E::NotCudaArtifact { .. }
            | E::CudaSmTooOld { .. }
            | E::CudaDriver { .. } => exit::BAD_ARTIFACT,
            // What the caller gave a run, or what a kernel found in it.
            E::UnknownInput { .. }
            | E::DuplicateInput(_)
            | E::MissingInput { .. }
            | E::InputTypeMismatch { .. }
            | E::NoProfile { .. }
            | E::VariantRefused { .. }
            | E::NoVariant { .. }
            | E::InputDataLength { .. }
            | E::OutputCount { .. }
            | E::OutputBufferSize { .. }
            | E::LengthOutOfBound { .. }
            | E::Kernel { .. } => exit::BAD_INPUT,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<NpyError> for Failure {
    fn from(e: NpyError) -> Failure {
        let code = match e {
            NpyError::Io { .. } => exit::IO,
            _ => exit::BAD_INPUT,
        };
        Failure::new(code, e.to_string())
    }
}

/// Runs the command line of this process; returns the exit code.
pub fn main() -> i32 {
    // The matches as well as the parsed arguments: `compile
    // --verify-reproducible` repeats the flags the user gave.
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
        }
    };
    let result = match cli.command {
        Command::Compile(mut a) => {
            a.given = matches.subcommand_matches("compile").cloned();
            compile::cmd_compile(*a)
        }
        Command::Run(a) => run::cmd_run(a),
        Command::Inspect(a) => inspect::cmd_inspect(a),
        Command::Bench(a) => bench::cmd_bench(a),
        Command::Keygen(a) => keygen::cmd_keygen(a),
        Command::Verify(a) => verify::cmd_verify(a),
        Command::Debug(a) => debug::cmd_debug(*a),
    };
    match result {
        Ok(()) => exit::OK,
        Err(f) => {
            eprintln!("error: {}", f.message);
            f.code
        }
    }
}

/// Parses `kiln SUBCOMMAND ARGS` for a library call (the Python binding):
/// a usage error is a [`Failure`] with clap's message.
fn parse_subcommand<I, S>(subcommand: &str, args: I) -> Result<Command, Failure>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let words = ["kiln", subcommand].map(std::ffi::OsString::from);
    let cli = Cli::try_parse_from(words.into_iter().chain(args.into_iter().map(Into::into)))
        .map_err(|e| {
            let text = e.render().to_string();
            // The message without clap's own `error: ` (the caller adds it).
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            Failure::new(exit::USAGE, text.trim_end())
        })?;
    Ok(cli.command)
}

/// Writes `bytes` to `path`, all or nothing.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::new(exit::IO, format!("{}: {e}", path.display()));
    kiln_driver::output::write_atomically(path, io, |f| {
        std::io::Write::write_all(f, bytes).map_err(io)
    })
}

/// A parser for a flag whose values are `values` (listed by `--help`, and
/// by the error for any other value) and parse into `T` with its `FromStr`,
/// the one definition of their meaning.
pub(crate) fn listed<T>(
    values: impl IntoIterator<Item = PossibleValue>,
) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    PossibleValuesParser::new(values).map(|s| s.parse::<T>().expect("every listed value parses"))
}
