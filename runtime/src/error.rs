//! Errors of loading and running a model.

use std::path::PathBuf;

use crate::format::{Arch, FormatError};

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not a valid artifact.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The artifact file could not be read.
    #[error("cannot read '{}': {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The code is for another architecture.
    #[error("the artifact is compiled for {artifact}, but this machine is {host}")]
    UnsupportedArch {
        /// Architecture of the artifact.
        artifact: Arch,
        /// Architecture of this machine.
        host: &'static str,
    },
    /// A CUDA artifact given to the CPU loader.
    #[error(
        "this is a CUDA artifact (sm_{sm}); the CPU runtime cannot run it: load it with a runtime built with the `cuda` feature (kiln_runtime::cuda::CudaModel, or `kiln run` built with --features cuda) on a machine with an NVIDIA GPU"
    )]
    CudaArtifact {
        /// The SM the artifact was compiled for.
        sm: u64,
    },
    /// No CUDA driver (`libcuda`) on this machine.
    #[cfg(feature = "cuda")]
    #[error("no CUDA driver found (libcuda.so could not be loaded): this machine cannot run CUDA artifacts; compile for the CPU instead (--target native)")]
    NoCudaDriver,
    /// A CPU artifact given to the CUDA loader.
    #[cfg(feature = "cuda")]
    #[error("this is a CPU artifact ({arch}), not a CUDA one: load it with kiln_runtime::Model")]
    NotCudaArtifact {
        /// The artifact's architecture.
        arch: Arch,
    },
    /// The GPU is older than the SM the artifact was compiled for.
    #[cfg(feature = "cuda")]
    #[error("the GPU ({device_name}, sm_{device}) is older than the artifact's sm_{artifact}; recompile with --target cuda-sm{device}")]
    CudaSmTooOld {
        /// The GPU's SM.
        device: u32,
        /// The GPU's name.
        device_name: String,
        /// The artifact's SM.
        artifact: u32,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA: cannot {what}: {message}")]
    CudaDriver {
        /// What was being done.
        what: &'static str,
        /// The driver's message.
        message: String,
    },
    /// The CPU lacks features the code needs.
    #[error(
        "this CPU lacks features the artifact needs: {}; recompile for this machine (e.g. --target native)",
        .0.join(", ")
    )]
    MissingCpuFeatures(Vec<String>),
    /// The loaded weights could not be made read-only.
    #[error("cannot make the loaded weights read-only: {0}")]
    SealWeights(#[source] std::io::Error),
    /// Executable memory could not be set up.
    #[error("cannot map the artifact's code: {0}")]
    CodeMemory(#[source] std::io::Error),
    /// A PC-relative relocation cannot reach its target from where the code
    /// was mapped.
    #[error(
        "relocation {index} at TEXT offset {offset} cannot reach its target: distance {distance} does not fit in 32 bits"
    )]
    RelocationOutOfRange {
        /// Index in the relocation table.
        index: usize,
        /// Patch site in TEXT.
        offset: u64,
        /// The distance that did not fit.
        distance: i128,
    },
    /// The worker threads of a session could not be created.
    #[error("cannot create the session's worker threads: {0}")]
    SpawnThreads(std::io::Error),
    /// A buffer could not be allocated.
    #[error("cannot allocate {bytes} bytes for the {what}")]
    OutOfMemory {
        /// Which buffer (`arena`, `weights`).
        what: &'static str,
        /// Requested size.
        bytes: u64,
    },
    /// An input name the model does not have.
    #[error("unknown input '{name}'; the model's inputs are: {expected}")]
    UnknownInput {
        /// The name given.
        name: String,
        /// The model's input names, comma-separated.
        expected: String,
    },
    /// The same input name given twice.
    #[error("input '{0}' is given more than once")]
    DuplicateInput(String),
    /// A declared input not given.
    #[error("missing input '{name}' ({expected})")]
    MissingInput {
        /// The input's name.
        name: String,
        /// Its type, e.g. `f32[1,3,224,224]`.
        expected: String,
    },
    /// An input with the wrong dtype or shape.
    #[error("input '{name}': expected {expected}, given {given}")]
    InputTypeMismatch {
        /// The input's name.
        name: String,
        /// Declared type, e.g. `f32[1,3,48,192]`.
        expected: String,
        /// Given type.
        given: String,
    },
    /// Inputs whose shapes match none of the artifact's profiles.
    #[error("no profile of the model takes inputs of these shapes ({given}); the artifact has {} profile(s): {}; compile with `--dim` or `--input-shape` values that include these shapes", available.len(), list_profiles(available))]
    NoProfile {
        /// The inputs given, `name: f32[2,16]`, in declared order.
        given: String,
        /// Each profile's inputs, as [`Profile::describe_inputs`](crate::format::Profile::describe_inputs) writes them.
        available: Vec<String>,
    },
    /// A run whose run-time conditions (an `If` on an input, a `Loop`'s
    /// trip count) take a path the compiler could not build at these
    /// shapes.
    #[error("this run takes a path of the model's run-time control flow that the artifact has no code for ({path}): {reason}")]
    VariantRefused {
        /// The conditions of the path and their values, in words.
        path: String,
        /// Why the compiler built no code for it.
        reason: String,
    },
    /// A run whose run-time conditions match no variant of the artifact.
    #[error(
        "no variant of the model takes this run's path of its run-time control flow ({conditions})"
    )]
    NoVariant {
        /// The conditions computed for this run and their values.
        conditions: String,
    },
    /// Input data whose length does not match its type.
    #[error("input '{name}': {ty} needs {expected} bytes of data, given {given}")]
    InputDataLength {
        /// The input's name.
        name: String,
        /// Its type.
        ty: String,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        given: usize,
    },
    /// `run_into` got the wrong number of output buffers.
    #[error("the model has {expected} outputs, but {given} output buffers were given")]
    OutputCount {
        /// Number of outputs.
        expected: usize,
        /// Number of buffers.
        given: usize,
    },
    /// A run whose data-dependent output length (NonZero, TopK of a
    /// run-time k) is outside the bound the artifact was planned for.
    #[error("output '{output}': this run's data-dependent length along axis {axis} is {length}, outside its compiled bound of 0..={bound} (a TopK's k larger than its axis, or a damaged artifact)")]
    LengthOutOfBound {
        /// The output's name.
        output: String,
        /// The axis of data-dependent length.
        axis: u32,
        /// The length the run computed.
        length: i64,
        /// The largest length the output holds.
        bound: u64,
    },
    /// An output buffer of the wrong size.
    #[error("output '{name}': {ty} needs a buffer of {expected} bytes, given {given}")]
    OutputBufferSize {
        /// The output's name.
        name: String,
        /// Its type.
        ty: String,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        given: usize,
    },
    /// `load_verified`: the artifact has no signature file.
    #[error("'{}' is not signed: there is no signature file '{}'", artifact.display(), signature.display())]
    Unsigned {
        /// The artifact.
        artifact: PathBuf,
        /// Where its signature was looked for.
        signature: PathBuf,
    },
    /// `load_verified`: the signature file cannot be read or decoded.
    #[error("signature file '{}': {reason}", path.display())]
    SignatureFile {
        /// The signature file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `load_verified`: the artifact is not the one that was signed.
    #[error("the artifact was modified after signing: its content hash is {found}, the signature is for {signed}")]
    ModifiedAfterSigning {
        /// Content hash (hex) recorded in the signature file.
        signed: String,
        /// Content hash (hex) of the artifact.
        found: String,
    },
    /// `load_verified`: the signature does not verify with the public key.
    #[error("the artifact's signature does not verify with the given public key (it was signed with another key, or the signature is forged)")]
    BadSignature,
    /// [`Model::verify`](crate::Model::verify) on an artifact without a
    /// self-test.
    #[error("the artifact has no golden self-test (compile it with `kiln compile --golden FILE.npz|DIR`)")]
    NoGolden,
    /// A golden set lacks an expected value or a tolerance for an output
    /// the model produces (an artifact whose GOLDEN section does not match
    /// its outputs).
    #[error("golden set {set} has no expected value or tolerance for output '{output}'")]
    GoldenOutput {
        /// The set's index.
        set: usize,
        /// The output.
        output: String,
    },
    /// A public key that is not a valid Ed25519 key (or not PEM).
    #[error("invalid public key: {0}")]
    InvalidPublicKey(String),
    /// A kernel returned a non-zero code.
    #[error("{}", kernel_message(node, *code))]
    Kernel {
        /// Source node of the failing kernel call.
        node: String,
        /// The kernel's return code.
        code: i32,
    },
}

impl Error {
    /// Whether a signed-artifact check refused the artifact (unsigned,
    /// modified after signing, signed with another key, unreadable
    /// signature or key).
    pub fn is_signature_error(&self) -> bool {
        matches!(
            self,
            Error::Unsigned { .. }
                | Error::SignatureFile { .. }
                | Error::ModifiedAfterSigning { .. }
                | Error::BadSignature
                | Error::InvalidPublicKey(_)
        )
    }
}

/// Kernel return code: an index (e.g. of Gather) was out of range.
pub const KERNEL_INDEX_OUT_OF_RANGE: i32 = 1;

fn kernel_message(node: &str, code: i32) -> String {
    match code {
        KERNEL_INDEX_OUT_OF_RANGE => format!("node '{node}': index out of range"),
        _ => format!("node '{node}': kernel failed with code {code}"),
    }
}

/// At most eight profiles, each in brackets, and how many more.
fn list_profiles(available: &[String]) -> String {
    const SHOWN: usize = 8;
    let mut list: Vec<String> = (available.iter().take(SHOWN))
        .map(|p| format!("[{p}]"))
        .collect();
    if available.len() > SHOWN {
        list.push(format!("and {} more", available.len() - SHOWN));
    }
    list.join(", ")
}
