//! The `kiln` command: argument parsing, subcommands, and rendering results
//! and errors. In the library so that the Python binding (`python/`) runs
//! the very same option checks and reports as the command line
//! ([`compile_report`]).

use crate::compare::compare;
use crate::driver::{self, CompileOptions, DriverError, DumpIr};
use crate::npy::{self, NpyError};
use crate::signing;
use crate::target::Target;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use kiln_format::{self as format, Artifact, ArtifactView};
use kiln_onnx::OnnxError;
use kiln_runtime::{DType, Model, PublicKey, Session, Tensor, TensorSpec};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

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
    /// `run --check` found outputs outside tolerance.
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
}

#[derive(Args)]
struct KeygenArgs {
    /// Where to write the secret key (PKCS#8 PEM, mode 0600); the public key
    /// goes to the same path with `.pub` appended.
    output: PathBuf,
    /// Overwrite existing key files.
    #[arg(long)]
    force: bool,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Bind a whole input shape: NAME=1x3x224x224 (repeatable).
    #[arg(long = "input-shape", value_name = "NAME=DIMS")]
    input_shapes: Vec<String>,
    /// Bind a symbolic dim by name: NAME=VALUE (repeatable).
    #[arg(long = "dim", value_name = "NAME=VALUE")]
    dims: Vec<String>,
    /// Fix a graph input's value at compile time: NAME=FILE.npy
    /// (repeatable). The input folds into what reads it (a Reshape target,
    /// Pad amounts, TopK's k) and is no longer an input of the artifact.
    #[arg(long = "bind-input", value_name = "NAME=FILE.npy")]
    bind_inputs: Vec<String>,
    /// Optimization level: 0 imports as is, 1 folds constants and removes dead code,
    /// 2 also simplifies, recognizes decomposed LayerNorm, GELU, softmax and
    /// attention, folds BatchNormalization into Conv/Gemm/MatMul and fuses
    /// kernels; 3 is the level-2 pipeline (docs/passes.md says why)
    #[arg(short = 'O', default_value_t = 2, value_name = "LEVEL")]
    opt_level: u8,
    /// Run exactly these passes, comma-separated (overrides -O).
    #[arg(long, value_delimiter = ',')]
    passes: Option<Vec<String>>,
    /// Verify the graph after every pass.
    #[arg(long)]
    verify_each: bool,
    /// Print the time, node count and changes of every pass (and of import
    /// and code generation) to stderr.
    #[arg(long)]
    time_passes: bool,
    /// Precision of the dense ops (MatMul, Gemm, Conv): fp32, bf16, fp16
    /// (f16 weights, f32 math), int8 (as --quantize dynamic) or mixed (bf16
    /// except the first and last dense layer). Everything else stays fp32
    /// (docs/precision.md).
    #[arg(long, default_value = "fp32", value_name = "PRECISION", value_parser = listed::<kiln_passes::Mode>(["fp32", "bf16", "fp16", "int8", "mixed"].map(PossibleValue::new)))]
    precision: kiln_passes::Mode,
    /// int8 MatMul/Gemm/ungrouped Conv (i8 weights per output column or
    /// channel, u8 or int8 activations per tensor (--activation-type),
    /// VNNI kernels that rescale in their store loop): `dynamic` computes
    /// activation ranges at run time; `static` observes them (min/max) on the calibration samples
    /// (--calibrate DIR; --calibrate-random only for tests).
    #[arg(long, value_enum)]
    quantize: Option<Quantize>,
    /// --quantize static: how the observed activation values become a
    /// range: minmax, percentile[=P] (default P 99.99) or entropy
    /// (TensorRT-style KL-divergence threshold).
    #[arg(long, default_value = "minmax", value_name = "OBSERVER")]
    observer: String,
    /// int8 layers' activations: uint8 (asymmetric per tensor, zero point
    /// from the range) or int8 (symmetric per tensor, −127..127 around 0).
    #[arg(long = "activation-type", value_parser = listed::<kiln_passes::ActivationType>([
        PossibleValue::new("uint8").alias("u8").help("asymmetric per tensor, zero point from the range"),
        PossibleValue::new("int8").aliases(["s8", "i8"]).help("symmetric per tensor around 0"),
    ]))]
    activation_type: Option<kiln_passes::ActivationType>,
    /// Keep these nodes in fp32: op types or node-name globs,
    /// comma-separated (`Conv,/encoder/layer.0/*`).
    #[arg(long = "keep-fp32", value_name = "PATTERNS")]
    keep_fp32: Option<String>,
    /// Force nodes to a precision: PRECISION=PATTERNS (repeatable; a later
    /// one wins; --keep-fp32 wins over all).
    #[arg(long, value_name = "PRECISION=PATTERNS")]
    force: Vec<String>,
}

#[derive(Args)]
struct CompileArgs {
    /// The ONNX model.
    model: PathBuf,
    /// Where to write the artifact.
    #[arg(short, long, required_unless_present = "check")]
    output: Option<PathBuf>,
    /// Preflight only: list every unsupported op and every unbound input
    /// dim at once, without compiling (exit 0 when nothing blocks, 4 when
    /// something does).
    #[arg(long)]
    check: bool,
    /// CPU targets: split each large dense kernel into up to N tasks that
    /// a multi-threaded session (`kiln run/bench --threads`) runs at once;
    /// 1 compiles for one thread. Default: the cores of this machine (at
    /// most 8) for `native`, 4 for a named target.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Target: native, x86_64-v3, x86_64-avx512, aarch64, or a CUDA GPU:
    /// cuda-sm70, cuda-sm75, cuda-sm80, cuda-sm86, cuda-sm89, cuda-sm90.
    #[arg(long, default_value = "native", value_parser = clap::value_parser!(Target))]
    target: Target,
    #[command(flatten)]
    model_args: ModelArgs,
    /// CUDA targets: write each kernel's PTX (a standalone module) to
    /// DIR/<kernel>.ptx.
    #[arg(long, value_name = "DIR")]
    dump_ptx: Option<PathBuf>,
    /// Write IR dumps: `all`, `import`, or `after=PASS`.
    #[arg(long, value_name = "WHICH")]
    dump_ir: Option<String>,
    /// Directory for IR dumps (default: next to the output).
    #[arg(long)]
    dump_dir: Option<PathBuf>,
    /// Compile a second time in a separate process (another working
    /// directory, another thread-count environment) and fail unless both
    /// artifacts are byte-identical.
    #[arg(long)]
    verify_reproducible: bool,
    /// Sign the artifact with this Ed25519 secret key (PKCS#8 PEM, from
    /// `kiln keygen` or `openssl genpkey -algorithm ed25519`); writes the
    /// signature to OUTPUT.sig for `Model::load_verified`.
    #[arg(long, value_name = "KEYFILE")]
    sign: Option<PathBuf>,
    /// Reduced-precision builds: compare every dense layer with the fp32
    /// graph on N deterministic random inputs (flagged as random in the
    /// report; 0 skips the report).
    #[arg(long, default_value_t = 1, value_name = "N")]
    calibrate_random: usize,
    /// Reduced-precision builds: real calibration samples instead of random
    /// ones, one .npz per sample with an array per model input (its name,
    /// dtype and shape), checked before any work.
    #[arg(long, value_name = "DIR")]
    calibrate: Option<PathBuf>,
    /// Error-driven fallback: while a graph output's relative L2 error on
    /// the calibration samples exceeds E, raise the reduced-precision layer
    /// with the largest error to fp32 (listed in the report).
    #[arg(long, value_name = "E")]
    max_rel_error: Option<f64>,
    /// int8 builds with --calibrate DIR correct each int8 layer's bias by
    /// its mean output error per channel on the calibration samples
    /// (measured layer by layer); this turns that off.
    #[arg(long)]
    no_bias_correction: bool,
    /// int8 builds: divide each activation channel by
    /// max|x|^ALPHA / max|W|^(1-ALPHA), measured on the calibration
    /// samples, and multiply it into the weights (SmoothQuant), so one
    /// activation scale fits channels of different ranges; ALPHA in [0, 1].
    /// Default: 0.5 for --quantize static with --calibrate DIR, off
    /// otherwise; `off` turns it off.
    #[arg(long, value_name = "ALPHA|off")]
    smooth: Option<String>,
    /// Write the final per-node precision plan (JSON: precision, reason and
    /// measured error per dense node, keyed by name and structure).
    #[arg(long, value_name = "FILE")]
    emit_plan: Option<PathBuf>,
    /// Apply a precision plan (from --emit-plan, possibly edited): every
    /// dense node's precision; a plan for another model or a stale entry
    /// is an error naming the node.
    #[arg(long, value_name = "FILE")]
    plan: Option<PathBuf>,
    /// Write the per-layer precision report here: JSON, or a self-contained
    /// HTML page with an error plot when FILE ends in .html.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Print a machine-readable summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct InputArgs {
    /// An input: NAME=file.npy (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// An .npz file whose array names are input names.
    #[arg(long)]
    inputs_npz: Option<PathBuf>,
    /// Fill every input not given with deterministic random values.
    #[arg(long)]
    random: bool,
    /// Seed for --random.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(Args)]
struct RunArgs {
    /// The artifact.
    artifact: PathBuf,
    #[command(flatten)]
    inputs: InputArgs,
    /// Write each output to DIR/<output name>.npy.
    #[arg(long)]
    output_dir: Option<PathBuf>,
    /// Compare outputs with DIR/<output name>.npy references.
    #[arg(long, value_name = "DIR")]
    check: Option<PathBuf>,
    /// Tolerance of --check: max abs error relative to the output's scale.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f64,
    /// Threads of the run (default: every core, up to the most tasks the
    /// artifact's steps have).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Refuse the artifact unless ARTIFACT.sig is a valid signature by this
    /// Ed25519 public key (PEM, from `kiln keygen` or `openssl pkey -pubout`).
    #[arg(long, value_name = "PEM")]
    public_key: Option<PathBuf>,
    /// Print a machine-readable summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// An ONNX model or a .kiln artifact.
    path: PathBuf,
    #[command(flatten)]
    model_args: ModelArgs,
    /// Print a machine-readable description (same as --format json).
    #[arg(long)]
    json: bool,
    /// Output format: text, json, or (ONNX models) dot: the optimized
    /// graph for Graphviz, nodes filled by precision.
    #[arg(long, value_enum, default_value_t = InspectFormat::Text)]
    format: InspectFormat,
}

/// `--quantize`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Quantize {
    /// Activation ranges observed on calibration samples at compile time.
    Static,
    /// Activation ranges computed at run time.
    Dynamic,
}

/// A parser for a flag whose values are `values` (listed by `--help`, and
/// by the error for any other value) and parse into `T` with its `FromStr`,
/// the one definition of their meaning.
fn listed<T>(values: impl IntoIterator<Item = PossibleValue>) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::fmt::Debug,
{
    PossibleValuesParser::new(values).map(|s| s.parse::<T>().expect("every listed value parses"))
}

/// `kiln inspect --format`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum InspectFormat {
    Text,
    Json,
    Dot,
}

#[derive(Args)]
struct BenchArgs {
    /// The artifact.
    artifact: PathBuf,
    #[command(flatten)]
    inputs: InputArgs,
    /// Timed runs.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Untimed warm-up runs.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Threads of each run (default: every core, up to the most tasks the
    /// artifact's steps have).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Print a machine-readable summary.
    #[arg(long)]
    json: bool,
    /// After the timed runs, time every schedule step over as many runs
    /// and list the N slowest steps (with --json: every step).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "20")]
    profile: Option<usize>,
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
    fn new(code: i32, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<DriverError> for Failure {
    fn from(e: DriverError) -> Failure {
        let code = match &e {
            DriverError::Onnx(o) => match o {
                OnnxError::Io { .. } => exit::IO,
                OnnxError::Unsupported(_)
                | OnnxError::UnboundDim { .. }
                | OnnxError::UnsupportedDType { .. }
                | OnnxError::UnsupportedOpset { .. } => exit::UNSUPPORTED,
                OnnxError::InputValue { .. } => exit::USAGE,
                _ => exit::BAD_MODEL,
            },
            DriverError::Pass(kiln_passes::PassError::UnknownPass { .. })
            | DriverError::Pass(kiln_passes::PassError::UnknownLevel(_)) => exit::USAGE,
            DriverError::Pass(kiln_passes::PassError::Plan(_)) => exit::USAGE,
            DriverError::Pass(_) => exit::INTERNAL,
            DriverError::Cpu(_) | DriverError::ArenaTooLarge { .. } => exit::UNSUPPORTED,
            DriverError::Cuda(kiln_target_cuda::CudaError::UnsupportedSm(_)) => exit::USAGE,
            DriverError::Cuda(kiln_target_cuda::CudaError::Ptxas(_)) => exit::IO,
            DriverError::Cuda(kiln_target_cuda::CudaError::PtxasRejected { .. }) => exit::INTERNAL,
            DriverError::Cuda(_) => exit::UNSUPPORTED,
            DriverError::Io { .. } => exit::IO,
            DriverError::Calibration { .. } => exit::BAD_INPUT,
            DriverError::Usage(_) => exit::USAGE,
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
            | E::BadSignature => exit::BAD_ARTIFACT,
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
            | E::InputDataLength { .. }
            | E::OutputCount { .. }
            | E::OutputBufferSize { .. }
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
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
        Command::Compile(a) => cmd_compile(*a),
        Command::Run(a) => cmd_run(a),
        Command::Inspect(a) => cmd_inspect(a),
        Command::Bench(a) => cmd_bench(a),
        Command::Keygen(a) => cmd_keygen(a),
    };
    match result {
        Ok(()) => exit::OK,
        Err(f) => {
            eprintln!("error: {}", f.message);
            f.code
        }
    }
}

fn parse_pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str), Failure> {
    s.rsplit_once('=')
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| Failure::new(exit::USAGE, format!("{flag} expects NAME=VALUE, got '{s}'")))
}

fn compile_options(args: &ModelArgs, target: Target) -> Result<CompileOptions, Failure> {
    let mut opts = CompileOptions {
        target,
        opt_level: args.opt_level,
        passes: args.passes.clone(),
        verify_each: args.verify_each,
        ..CompileOptions::default()
    };
    let usage =
        |flag: &str, e: kiln_passes::PolicyError| Failure::new(exit::USAGE, format!("{flag}: {e}"));
    opts.precision.mode = args.precision;
    if let Some(q) = args.quantize {
        if args.precision != kiln_passes::Mode::Fp32 {
            return Err(Failure::new(
                exit::USAGE,
                "--quantize sets the precision to int8; use --force PRECISION=PATTERN for other layers",
            ));
        }
        opts.static_activations = q == Quantize::Static;
        opts.precision.mode = kiln_passes::Mode::Int8;
    }
    opts.observer = args
        .observer
        .parse()
        .map_err(|e: String| Failure::new(exit::USAGE, format!("--observer: {e}")))?;
    if args.observer != "minmax" && !opts.static_activations {
        return Err(Failure::new(
            exit::USAGE,
            "--observer applies to --quantize static only",
        ));
    }
    if let Some(t) = args.activation_type {
        opts.precision.activation_type = t;
    }
    if let Some(k) = &args.keep_fp32 {
        opts.precision.keep_fp32 =
            kiln_passes::Pattern::list(k).map_err(|e| usage("--keep-fp32", e))?;
    }
    for f in &args.force {
        opts.precision
            .force
            .push(kiln_passes::Policy::parse_force(f).map_err(|e| usage("--force", e))?);
    }
    for s in &args.input_shapes {
        let (name, dims) = parse_pair("--input-shape", s)?;
        let dims = dims
            .split('x')
            .map(|d| d.parse::<usize>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| {
                Failure::new(
                    exit::USAGE,
                    format!("--input-shape: '{dims}' is not like 1x3x224x224"),
                )
            })?;
        opts.import.input_shapes.insert(name.to_string(), dims);
    }
    for s in &args.bind_inputs {
        let (name, path) = parse_pair("--bind-input", s)?;
        let value = npy::read_ir_tensor(Path::new(path))?;
        opts.import.input_values.insert(name.to_string(), value);
    }
    for s in &args.dims {
        let (name, v) = parse_pair("--dim", s)?;
        let v = v
            .parse()
            .map_err(|_| Failure::new(exit::USAGE, format!("--dim: '{v}' is not a number")))?;
        opts.import.dims.insert(name.to_string(), v);
    }
    Ok(opts)
}

/// Kernels of an artifact: CPU functions, or the kernels of a CUDA
/// artifact's PTX module.
fn kernel_count(a: &Artifact) -> usize {
    if a.arch == kiln_format::Arch::Nvptx64 {
        kiln_format::CudaCode::parse(&a.text).map_or(0, |c| c.kernels.len())
    } else {
        a.kernels.len()
    }
}

/// Writes `bytes` to `path`, all or nothing.
fn write_file(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let io = |e: std::io::Error| Failure::new(exit::IO, format!("{}: {e}", path.display()));
    crate::output::write_atomically(path, io, |f| {
        std::io::Write::write_all(f, bytes).map_err(io)
    })
}

/// `kiln compile --check`: everything that blocks a compile, at once.
fn cmd_preflight(a: &CompileArgs, opts: &driver::CompileOptions) -> Result<(), Failure> {
    let at_model = |e: kiln_onnx::OnnxError| {
        let f = Failure::from(DriverError::from(e));
        Failure::new(f.code, format!("{}: {}", a.model.display(), f.message))
    };
    let model = kiln_onnx::load_model(&a.model).map_err(at_model)?;
    let report = kiln_onnx::preflight(&model, kiln_onnx::model_dir(&a.model), &opts.import)
        .map_err(at_model)?;
    let dims: Vec<Value> = report
        .unbound_dims
        .iter()
        .map(|(input, i, name)| json!({"input": input, "dim": i, "name": name}))
        .collect();
    if a.json {
        let ops: Vec<Value> = report
            .unsupported
            .iter()
            .map(|u| json!({"op": u.op_type, "node": u.node_name, "domain": u.domain, "opset": u.opset, "hint": u.hint}))
            .collect();
        println!(
            "{}",
            json!({"model": a.model.display().to_string(), "ok": report.is_clear(), "unsupported": ops, "unbound_dims": dims})
        );
    } else if report.is_clear() {
        println!(
            "{}: every op is supported and every input dim is bound",
            a.model.display()
        );
    } else {
        for u in &report.unsupported {
            println!("{u}");
        }
        for (input, i, name) in &report.unbound_dims {
            let name = name
                .as_ref()
                .map(|n| format!(" ('{n}'; bind with --dim {n}=V)"))
                .unwrap_or_default();
            println!("input '{input}' dim {i} is unbound{name}; or bind the whole shape with --input-shape {input}=...");
        }
    }
    if report.is_clear() {
        Ok(())
    } else {
        Err(Failure::new(
            exit::UNSUPPORTED,
            format!(
                "{}: {} unsupported op(s) and {} unbound input dim(s)",
                a.model.display(),
                report.unsupported.len(),
                report.unbound_dims.len()
            ),
        ))
    }
}

/// `--time-passes`: one line per phase and pass, to stderr.
fn print_pass_times(
    report: &kiln_passes::PipelineReport,
    import: std::time::Duration,
    codegen: Option<std::time::Duration>,
) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    eprintln!(
        "{:>10}  {:>7}  {:>8} {:>8} {:>10}  phase",
        "time (ms)", "nodes", "removed", "added", "rewritten"
    );
    let phase = |time: std::time::Duration, name: &str| {
        eprintln!("{:>10.2}  {:>37}  {name}", ms(time), "");
    };
    phase(import, "import");
    let mut total = import;
    for p in &report.passes {
        total += p.time;
        eprintln!(
            "{:>10.2}  {:>7}  {:>8} {:>8} {:>10}  {}",
            ms(p.time),
            p.nodes_after,
            p.stats.removed,
            p.stats.added,
            p.stats.rewritten,
            p.name
        );
    }
    if let Some(c) = codegen {
        total += c;
        phase(c, "codegen");
    }
    phase(total, "total");
}

fn cmd_compile(a: CompileArgs) -> Result<(), Failure> {
    if let Some(report) = compile_and_report(&a)? {
        println!("{report}");
    }
    Ok(())
}

/// `kiln compile ARGS --json` in process: parses `args` (the words after
/// `kiln compile`) as the command line does, compiles, writes the artifact
/// and what the flags ask for, and returns the report that `--json` prints.
/// Fails as the command would, with its exit code and message. Refuses
/// `--check` and `--verify-reproducible`, which need the `kiln` executable.
pub fn compile_report<I, S>(args: I) -> Result<Value, Failure>
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let words = ["kiln", "compile"].map(std::ffi::OsString::from);
    let cli = Cli::try_parse_from(words.into_iter().chain(args.into_iter().map(Into::into)))
        .map_err(|e| {
            let text = e.render().to_string();
            // The message without clap's own `error: ` (the caller adds it).
            let text = text.strip_prefix("error: ").unwrap_or(&text);
            Failure::new(exit::USAGE, text.trim_end())
        })?;
    let Command::Compile(mut a) = cli.command else {
        unreachable!("the words start with `compile`");
    };
    if a.check || a.verify_reproducible {
        return Err(Failure::new(
            exit::USAGE,
            "--check and --verify-reproducible run only from the kiln command",
        ));
    }
    a.json = true;
    Ok(compile_and_report(&a)?.expect("--json makes a report"))
}

/// Compiles as `a` asks. With `--json`, returns the report without
/// printing it; otherwise prints the summary for people and returns `None`.
fn compile_and_report(a: &CompileArgs) -> Result<Option<Value>, Failure> {
    let mut opts = compile_options(&a.model_args, a.target)?;
    opts.threads = match a.threads {
        Some(0) => return Err(Failure::new(exit::USAGE, "--threads must be at least 1")),
        Some(n) => n,
        None => opts.target.default_threads(),
    };
    if a.check {
        return cmd_preflight(a, &opts).map(|()| None);
    }
    let output = a
        .output
        .clone()
        .expect("clap requires --output without --check");
    opts.dump_ir = match a.dump_ir.as_deref() {
        None => DumpIr::None,
        Some("all") => DumpIr::All,
        Some("import") => DumpIr::After("import".into()),
        Some(s) => match s.strip_prefix("after=") {
            Some(pass) => DumpIr::After(pass.to_string()),
            None => {
                return Err(Failure::new(
                    exit::USAGE,
                    format!("--dump-ir: expected all, import or after=PASS, got '{s}'"),
                ))
            }
        },
    };
    if a.dump_ptx.is_some() && opts.target.cuda().is_none() {
        return Err(Failure::new(
            exit::USAGE,
            "--dump-ptx needs a CUDA target (--target cuda-sm80, ...)",
        ));
    }
    opts.calibrate_random = a.calibrate_random;
    opts.calibrate = a.calibrate.clone();
    if let Some(path) = &a.plan {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", path.display())))?;
        let plan = kiln_passes::PrecisionPlan::parse(&text)
            .map_err(|e| Failure::new(exit::USAGE, format!("--plan {}: {e}", path.display())))?;
        opts.precision.plan = Some(plan);
    }
    if a.emit_plan.is_some() && opts.precision.is_identity() {
        return Err(Failure::new(
            exit::USAGE,
            "--emit-plan needs a reduced --precision (or --force / --plan)",
        ));
    }
    if let Some(e) = a.max_rel_error {
        if !(e.is_finite() && e >= 0.0) {
            return Err(Failure::new(
                exit::USAGE,
                format!("--max-rel-error: {e} is not a non-negative number"),
            ));
        }
        opts.max_rel_error = Some(e);
    }
    opts.bias_correction = !a.no_bias_correction;
    if let Some(smooth) = &a.smooth {
        opts.smooth = match smooth.as_str() {
            "off" => driver::Smooth::Off,
            alpha => match alpha.parse::<f32>() {
                Ok(alpha) if (0.0..=1.0).contains(&alpha) => driver::Smooth::Alpha(alpha),
                _ => {
                    return Err(Failure::new(
                        exit::USAGE,
                        format!("--smooth: '{smooth}' is neither off nor a number in [0, 1]"),
                    ))
                }
            },
        };
    }
    let start = Instant::now();
    let bars = Bars::new(!a.json);
    let out = driver::compile_with_progress(&a.model, &opts, &bars).map_err(|e| {
        let f = Failure::from(e);
        Failure::new(f.code, format!("{}: {}", a.model.display(), f.message))
    })?;
    let elapsed = start.elapsed();
    // From the header just written: hashing the sections again costs a
    // pass over every weight.
    let content_hash = format::read_header(&out.bytes)
        .map_err(|e| Failure::new(exit::INTERNAL, format!("the artifact just written: {e}")))?
        .content_hash;
    if a.model_args.time_passes {
        print_pass_times(&out.report, out.import_time, Some(out.codegen_time));
    }
    let reproducible = if a.verify_reproducible {
        Some(verify_reproducible(a, &out.bytes)?)
    } else {
        None
    };
    let signature = match &a.sign {
        Some(key_path) => {
            let pem = std::fs::read_to_string(key_path)
                .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", key_path.display())))?;
            let sig = signing::sign_artifact(&out.bytes, &pem).map_err(|e| {
                Failure::new(exit::USAGE, format!("--sign {}: {e}", key_path.display()))
            })?;
            Some(sig)
        }
        None => None,
    };
    write_file(&output, &out.bytes)?;
    let signature_path = signature.map(|sig| {
        let path = format::signature_path(&output);
        write_file(&path, &sig.to_bytes()).map(|()| path)
    });
    let signature_path = signature_path.transpose()?;
    if let Some(dir) = &a.dump_ptx {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", dir.display())))?;
        for (name, text) in &out.ptx_kernels {
            write_file(&dir.join(format!("{name}.ptx")), text.as_bytes())?;
        }
        if !a.json {
            eprintln!(
                "wrote {} PTX kernel(s) to {}",
                out.ptx_kernels.len(),
                dir.display()
            );
        }
    }
    if opts.target.cuda().is_some() && !a.json {
        match &out.ptxas {
            Some(p) => eprintln!("cubin assembled with {}", p.display()),
            None => eprintln!(
                "no ptxas found (KILN_PTXAS or PATH): the artifact holds PTX only, which the driver compiles at load time"
            ),
        }
    }
    if !out.dumps.is_empty() {
        let dir = a.dump_dir.clone().unwrap_or_else(|| {
            let mut d = output.clone().into_os_string();
            d.push(".ir");
            PathBuf::from(d)
        });
        std::fs::create_dir_all(&dir)
            .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", dir.display())))?;
        for (name, text) in &out.dumps {
            write_file(&dir.join(name), text.as_bytes())?;
        }
        if !a.json {
            eprintln!("wrote {} IR dump(s) to {}", out.dumps.len(), dir.display());
        }
    }
    let precision_json = out.precision.as_ref().map(precision_json);
    if let (Some(path), Some(p), Some(outcome)) = (&a.report, &precision_json, &out.precision) {
        let text = if path.extension().is_some_and(|e| e == "html" || e == "htm") {
            crate::report_html::precision_html(&a.model.display().to_string(), outcome)
        } else {
            serde_json::to_string_pretty(p).expect("JSON values serialize")
        };
        write_file(path, text.as_bytes())?;
    }
    if let (Some(path), Some(p)) = (&a.emit_plan, &out.precision) {
        write_file(path, p.plan.to_json().as_bytes())?;
    }
    let meta = &out.artifact.metadata;
    for line in generic_dense_warnings(&out.artifact) {
        eprintln!("{line}");
    }
    if a.json {
        // CPU targets: the arena plan of the values (`plan-memory`'s view:
        // planned bytes against their sum; the artifact's arena also holds
        // the kernels' scratch), planned again only for this report.
        let memory = match opts.target {
            Target::Cpu(_) => {
                Some(kiln_target_cpu::plan_stats(&out.graph).map_err(DriverError::from)?)
            }
            Target::Cuda(_) => None,
        };
        let passes: Vec<Value> = out
            .report
            .passes
            .iter()
            .map(|p| json!({"name": p.name, "removed": p.stats.removed, "added": p.stats.added, "rewritten": p.stats.rewritten, "fused_nodes": p.stats.fused_nodes, "fused_kernels": p.stats.fused_kernels, "summary": p.stats.summary(), "nodes_after": p.nodes_after, "time_ms": p.time.as_secs_f64() * 1e3}))
            .collect();
        return Ok(Some(json!({
                "output": output.display().to_string(),
                "bytes": out.bytes.len(),
                "target": meta.target,
                "kernels": kernel_count(&out.artifact),
                "code_bytes": out.artifact.text.len(),
                "weights_bytes": out.artifact.weights.len(),
                "arena_bytes": meta.arena_size,
                "memory": memory.map(|m| json!({
                    "planned_bytes": m.arena_bytes,
                    "peak_live_bytes": m.peak_live_bytes,
                    "sum_of_values_bytes": m.total_bytes,
                    "values": m.values,
                    "buffers": m.buffers,
                    "in_place": m.in_place,
                    "aliases": m.aliases,
                })),
                "inputs": specs_json(&meta.inputs),
                "outputs": specs_json(&meta.outputs),
                "passes": passes,
                "import_ms": out.import_time.as_secs_f64() * 1e3,
                "codegen_ms": out.codegen_time.as_secs_f64() * 1e3,
                "compile_ms": elapsed.as_secs_f64() * 1e3,
                "content_sha256": hex(&content_hash),
                "reproducible": reproducible.is_some().then_some(true),
                "signature": signature_path.as_ref().map(|p| p.display().to_string()),
                "precision": precision_json,
                "dense_kernels": dense_kernels_json(&meta.dense_kernels),
        })));
    }
    println!(
        "compiled {} -> {} ({} bytes: {} kernels, {} B code, {} B weights, {} B arena) in {:.1} ms",
        a.model.display(),
        output.display(),
        out.bytes.len(),
        kernel_count(&out.artifact),
        out.artifact.text.len(),
        out.artifact.weights.len(),
        meta.arena_size,
        elapsed.as_secs_f64() * 1e3
    );
    if let Some(p) = &out.precision {
        print_precision(p);
    }
    if let Some(path) = &signature_path {
        println!("signed: {}", path.display());
    }
    if let Some(how) = &reproducible {
        println!(
            "reproducible: {how} gave identical bytes (content sha256 {})",
            hex(&content_hash)
        );
    }
    Ok(None)
}

/// Progress bars on stderr for long compile stages (`indicatif`), drawn
/// only when stderr is a terminal and the output is for people: never with
/// `--json`, never into a pipe or a file.
struct Bars {
    enabled: bool,
    bar: std::cell::RefCell<Option<indicatif::ProgressBar>>,
}

impl Bars {
    fn new(for_people: bool) -> Bars {
        use std::io::IsTerminal;
        Bars {
            enabled: for_people && std::io::stderr().is_terminal(),
            bar: std::cell::RefCell::new(None),
        }
    }
}

impl Drop for Bars {
    /// A compile that fails mid-stage leaves no stale bar above its error.
    fn drop(&mut self) {
        driver::Progress::end(self);
    }
}

impl driver::Progress for Bars {
    fn begin(&self, stage: &str, total: Option<u64>) {
        if !self.enabled {
            return;
        }
        use indicatif::{ProgressBar, ProgressStyle};
        let (bar, template) = match total {
            Some(n) => (
                ProgressBar::new(n),
                "{prefix:>22} [{bar:30}] {pos}/{len} {wide_msg} {elapsed}",
            ),
            None => (
                ProgressBar::new_spinner(),
                "{prefix:>22} {spinner} {wide_msg} {elapsed}",
            ),
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(stage.to_string());
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        if let Some(old) = self.bar.replace(Some(bar)) {
            old.finish_and_clear();
        }
    }

    fn step(&self, note: &str) {
        if let Some(bar) = &*self.bar.borrow() {
            bar.set_message(note.to_string());
            bar.inc(1);
        }
    }

    fn end(&self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// `--verify-reproducible`: compiles the model again in a child process of
/// this executable, with another working directory and another thread
/// count in the environment (`RAYON_NUM_THREADS`, `KILN_NUM_THREADS`; the
/// compiler is single-threaded today, so these guard future parallelism),
/// and compares its artifact with `bytes`. Returns how the second build was
/// made; fails with the first differing offset and its section otherwise.
fn verify_reproducible(a: &CompileArgs, bytes: &[u8]) -> Result<String, Failure> {
    let internal = |m: String| Failure::new(exit::INTERNAL, format!("--verify-reproducible: {m}"));
    let exe = std::env::current_exe().map_err(|e| internal(format!("current executable: {e}")))?;
    let model = std::path::absolute(&a.model)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", a.model.display())))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("kiln-repro-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", dir.display())))?;
    let second = dir.join("second.kiln");
    // Every option that decides the artifact (see `compile_options`).
    let m = &a.model_args;
    let mut args: Vec<std::ffi::OsString> = vec![
        "compile".into(),
        model.into(),
        "-o".into(),
        second.clone().into(),
        "--target".into(),
        a.target.to_string().into(),
        format!("-O{}", m.opt_level).into(),
    ];
    for s in &m.input_shapes {
        args.extend(["--input-shape".into(), s.into()]);
    }
    for s in &m.dims {
        args.extend(["--dim".into(), s.into()]);
    }
    for s in &m.bind_inputs {
        args.extend(["--bind-input".into(), s.into()]);
    }
    if let Some(p) = &m.passes {
        args.extend(["--passes".into(), p.join(",").into()]);
    }
    if m.verify_each {
        args.push("--verify-each".into());
    }
    if let Some(n) = a.threads {
        args.extend(["--threads".into(), n.to_string().into()]);
    }
    let threads = match std::env::var("RAYON_NUM_THREADS").as_deref() {
        Ok("1") => "3",
        _ => "1",
    };
    let result = std::process::Command::new(&exe)
        .args(&args)
        .current_dir(&dir)
        .env("RAYON_NUM_THREADS", threads)
        .env("KILN_NUM_THREADS", threads)
        .output();
    let second_bytes = std::fs::read(&second);
    let _ = std::fs::remove_dir_all(&dir);
    let output = result.map_err(|e| internal(format!("cannot run {}: {e}", exe.display())))?;
    if !output.status.success() {
        return Err(internal(format!(
            "the second compilation failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let second_bytes = second_bytes.map_err(|e| internal(format!("{}: {e}", second.display())))?;
    if let Some((offset, region)) = driver::first_difference(bytes, &second_bytes) {
        let hash = |b: &[u8]| {
            kiln_format::read_header(b)
                .map(|h| hex(&h.content_hash))
                .unwrap_or_else(|_| "unreadable".into())
        };
        return Err(internal(format!(
            "not reproducible: a second compilation in a separate process gave different bytes; \
             first difference at offset {offset} in {region} \
             ({} vs {} bytes, content sha256 {} vs {})",
            bytes.len(),
            second_bytes.len(),
            hash(bytes),
            hash(&second_bytes)
        )));
    }
    Ok(format!(
        "a second compilation in a separate process (working directory {}, RAYON_NUM_THREADS={threads})",
        dir.display()
    ))
}

fn specs_json(specs: &[TensorSpec]) -> Value {
    Value::Array(
        specs
            .iter()
            .map(|s| json!({"name": s.name, "dtype": s.dtype.to_string(), "shape": s.shape}))
            .collect(),
    )
}

fn layer_json(l: &kiln_passes::LayerError) -> Value {
    json!({"node": l.node, "op": l.op, "precision": l.precision.name(), "rel_l2": l.rel_l2, "cosine": l.cosine, "max_abs": l.max_abs})
}

/// The precision decisions and accuracy report as JSON (`--json`,
/// `--report`).
fn precision_json(p: &driver::PrecisionOutcome) -> Value {
    let decisions: Vec<Value> = p
        .decisions
        .iter()
        .map(|d| {
            let mut v = json!({"node": d.node, "op": d.op, "precision": d.precision.name(), "reason": d.reason.to_string()});
            if let Some(m) = p.smoothing.get(&d.node) {
                let (lo, hi) = min_max(m);
                v["smoothing_divisors"] = json!({"channels": m.len(), "min": lo, "max": hi});
            }
            if let Some(c) = p.bias_corrections.get(&d.node) {
                v["bias_correction_max_abs"] = json!(largest_abs(c));
            }
            v
        })
        .collect();
    let report = p.report.as_ref().map(|r| {
        json!({
            "samples": r.samples,
            "random_inputs": r.random,
            "outputs": r.outputs.iter().map(layer_json).collect::<Vec<_>>(),
            "layers_worst_first": r.layers.iter().map(layer_json).collect::<Vec<_>>(),
        })
    });
    json!({"decisions": decisions, "report": report})
}

fn min_max(v: &[f32]) -> (f32, f32) {
    (v.iter()).fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| {
        (lo.min(x), hi.max(x))
    })
}

fn largest_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// The human summary of a reduced-precision build.
fn print_precision(p: &driver::PrecisionOutcome) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &p.decisions {
        *counts.entry(d.precision.name()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    println!("precision: layers {}", counts.join(", "));
    if !p.smoothing.is_empty() {
        let (lo, hi) = p
            .smoothing
            .values()
            .map(|m| min_max(m))
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), (lo, hi)| {
                (a.min(lo), b.max(hi))
            });
        println!(
            "  smoothing: {} int8 layers' activations divided per channel by {lo:.3e} to {hi:.3e}",
            p.smoothing.len()
        );
    }
    if let Some((node, c)) = (p.bias_corrections.iter())
        .map(|(n, c)| (n, largest_abs(c)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        println!(
            "  bias correction: {} int8 layers, largest shift {c:.3e} ({node})",
            p.bias_corrections.len()
        );
    }
    let Some(r) = &p.report else { return };
    let kind = if r.random { "random" } else { "calibration" };
    for o in &r.outputs {
        println!(
            "  {} vs fp32 on {} {kind} sample(s): rel L2 {:.3e}, cosine {:.6}, max abs {:.3e}",
            o.node, r.samples, o.rel_l2, o.cosine, o.max_abs
        );
    }
    for l in r.layers.iter().take(3) {
        println!(
            "  worst: {} ({} {}): rel L2 {:.3e}, cosine {:.6}, max abs {:.3e}",
            l.node, l.op, l.precision, l.rel_l2, l.cosine, l.max_abs
        );
    }
}

/// Deterministic pseudo-random tensor for a spec (SplitMix64).
fn random_tensor(spec: &TensorSpec, seed: u64) -> Tensor {
    let n: u64 = spec.shape.iter().product();
    let mut state = seed ^ 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    match spec.dtype {
        DType::F32 => {
            let v: Vec<f32> = (0..n).map(|_| unit(next()) as f32).collect();
            Tensor::from_f32(&spec.name, &spec.shape, &v)
        }
        DType::F64 => {
            let v: Vec<f64> = (0..n).map(|_| unit(next())).collect();
            Tensor::from_slice(&spec.name, &spec.shape, &v)
        }
        dtype => Tensor {
            name: spec.name.clone(),
            dtype,
            shape: spec.shape.clone(),
            data: vec![0; (n as usize) * dtype.size_bytes()],
        },
    }
}

fn gather_inputs(specs: &[TensorSpec], args: &InputArgs) -> Result<Vec<Tensor>, Failure> {
    let mut given: BTreeMap<String, Tensor> = BTreeMap::new();
    if let Some(npz) = &args.inputs_npz {
        let want = |name: &str| specs.iter().find(|s| s.name == name).map(|s| s.dtype);
        for t in npy::read_npz(npz, want)? {
            given.insert(t.name.clone(), t);
        }
    }
    for s in &args.inputs {
        let (name, path) = parse_pair("--input", s)?;
        let path = Path::new(path);
        let tensor = match specs.iter().find(|s| s.name == name) {
            Some(spec) => npy::read_tensor_as(name, path, spec.dtype)?,
            None => npy::read_tensor(name, path)?,
        };
        given.insert(name.to_string(), tensor);
    }
    if let Some(name) = given.keys().find(|n| !specs.iter().any(|s| &s.name == *n)) {
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        return Err(Failure::new(
            exit::BAD_INPUT,
            format!(
                "unknown input '{name}'; the model's inputs are: {}",
                names.join(", ")
            ),
        ));
    }
    let mut inputs = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        match given.remove(&spec.name) {
            Some(t) => inputs.push(t),
            None if args.random => {
                inputs.push(random_tensor(spec, args.seed.wrapping_add(i as u64)))
            }
            None => {
                return Err(Failure::new(
                    exit::BAD_INPUT,
                    format!(
                        "missing input '{}' ({}); give it with --input {}=FILE.npy or use --random",
                        spec.name,
                        spec.type_string(),
                        spec.name
                    ),
                ))
            }
        }
    }
    Ok(inputs)
}

/// Whether the file at `path` is a Kiln artifact for architecture nvptx64
/// (the header's arch field, bytes 12..16); the loader validates the rest.
#[cfg(feature = "cuda")]
fn is_cuda_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; kiln_format::PEEK_LEN];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|_| {
            kiln_format::peek(&head).is_some_and(|p| p.arch == Some(kiln_format::Arch::Nvptx64))
        })
}

/// Loads `path` and runs it once: on the GPU for a CUDA artifact (with the
/// `cuda` feature), else with the CPU runtime (which refuses CUDA artifacts
/// with a clear error).
/// Threads for a session of `model`: `requested`, or every core, and never
/// more than the most tasks of any of its steps.
fn session_threads(model: &Model, requested: Option<usize>) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    requested.unwrap_or(cores).clamp(1, model.max_tasks())
}

fn load_and_run(
    path: &Path,
    args: &InputArgs,
    public_key: Option<&Path>,
    threads: Option<usize>,
) -> Result<(Vec<Tensor>, std::time::Duration), Failure> {
    #[cfg(feature = "cuda")]
    if is_cuda_artifact(path) {
        if public_key.is_some() {
            return Err(Failure::new(
                exit::USAGE,
                "--public-key is not supported for CUDA artifacts yet",
            ));
        }
        let mut model = kiln_runtime::cuda::CudaModel::load(path)?;
        let inputs = gather_inputs(model.inputs(), args)?;
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let start = Instant::now();
        let outputs = model.run(&views)?;
        return Ok((outputs, start.elapsed()));
    }
    let model = match public_key {
        Some(key) => Model::load_verified(path, &PublicKey::from_pem_file(key)?)?,
        None => Model::load(path)?,
    };
    let inputs = gather_inputs(model.inputs(), args)?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut session = model.session_with_threads(session_threads(&model, threads))?;
    let start = Instant::now();
    let outputs = session.run(&views)?;
    Ok((outputs, start.elapsed()))
}

fn cmd_run(a: RunArgs) -> Result<(), Failure> {
    let (outputs, latency) =
        load_and_run(&a.artifact, &a.inputs, a.public_key.as_deref(), a.threads)?;
    if let Some(dir) = &a.output_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", dir.display())))?;
        for t in &outputs {
            npy::write_tensor(&dir.join(format!("{}.npy", npy::sanitize_name(&t.name))), t)?;
        }
    }
    let mut checks = Vec::new();
    if let Some(dir) = &a.check {
        for t in &outputs {
            let path = dir.join(format!("{}.npy", npy::sanitize_name(&t.name)));
            let reference = npy::read_tensor_as(&t.name, &path, t.dtype)?;
            checks.push(compare(t, &reference));
        }
    }
    let failed = checks.iter().filter(|c| !c.passes(a.tolerance)).count();
    if a.json {
        let outs: Vec<Value> = outputs
            .iter()
            .map(|t| json!({"name": t.name, "dtype": t.dtype.to_string(), "shape": t.shape}))
            .collect();
        let checks: Vec<Value> = checks
            .iter()
            .map(|c| json!({"name": c.name, "max_abs_error": c.max_abs_error, "rel_error": c.rel_error, "passed": c.passes(a.tolerance), "mismatch": c.mismatch}))
            .collect();
        println!(
            "{}",
            json!({"outputs": outs, "latency_ms": latency.as_secs_f64() * 1e3, "checks": checks})
        );
    } else {
        for t in &outputs {
            println!("{}: {}{}", t.name, t.type_string(), preview(t));
        }
        for c in &checks {
            let verdict = if c.passes(a.tolerance) {
                "ok"
            } else {
                "FAILED"
            };
            match &c.mismatch {
                Some(m) => println!("check {}: FAILED ({m})", c.name),
                None => println!(
                    "check {}: {verdict} (max abs error {:.3e}, {:.3e} of output scale {:.3e}; tolerance {:.1e})",
                    c.name, c.max_abs_error, c.rel_error, c.scale, a.tolerance
                ),
            }
        }
        println!("latency: {:.3} ms (first run)", latency.as_secs_f64() * 1e3);
    }
    if failed > 0 {
        return Err(Failure::new(
            exit::CHECK_FAILED,
            format!(
                "{failed} output(s) differ from the reference beyond tolerance {:e}",
                a.tolerance
            ),
        ));
    }
    Ok(())
}

fn preview(t: &Tensor) -> String {
    let values: Option<Vec<String>> = match t.dtype {
        DType::F32 => t
            .to_vec::<f32>()
            .map(|v| v.iter().take(8).map(|x| format!("{x:.6}")).collect()),
        DType::I64 => t
            .to_vec::<i64>()
            .map(|v| v.iter().take(8).map(|x| x.to_string()).collect()),
        DType::I32 => t
            .to_vec::<i32>()
            .map(|v| v.iter().take(8).map(|x| x.to_string()).collect()),
        _ => None,
    };
    match values {
        Some(v) => {
            let n: u64 = t.shape.iter().product();
            format!(" [{}{}]", v.join(", "), if n > 8 { ", ..." } else { "" })
        }
        None => String::new(),
    }
}

fn is_artifact(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; kiln_format::PEEK_LEN];
    // Not a plain open: a FIFO would block it.
    kiln_runtime::open_regular(path)
        .and_then(|(mut f, _)| f.read_exact(&mut head))
        .is_ok_and(|_| kiln_format::peek(&head).is_some())
}

fn cmd_inspect(mut a: InspectArgs) -> Result<(), Failure> {
    a.json |= a.format == InspectFormat::Json;
    if is_artifact(&a.path) {
        if a.format == InspectFormat::Dot {
            return Err(Failure::new(
                exit::USAGE,
                "--format dot renders an ONNX model's optimized graph, not an artifact",
            ));
        }
        inspect_artifact(&a)
    } else {
        inspect_model(&a)
    }
}

/// The `kiln inspect --json` fields every artifact has, CPU or CUDA.
fn artifact_json(artifact: &Artifact, version: u32) -> Value {
    let m = &artifact.metadata;
    json!({
        "kind": "artifact",
        "format_version": version,
        "content_sha256": hex(&artifact.content_hash()),
        "compiler": m.compiler_version,
        "target": m.target,
        "options": m.options,
        "source_sha256": hex(&m.source_sha256),
        "inputs": specs_json(&m.inputs),
        "outputs": specs_json(&m.outputs),
        "arena_bytes": m.arena_size,
        "weights_bytes": artifact.weights.len(),
        "dense_kernels": dense_kernels_json(&m.dense_kernels),
    })
}

/// The kernel chosen for each dense node, with the candidates that
/// declined before it and why.
fn dense_kernels_json(kernels: &[format::DenseKernel]) -> Value {
    let rows: Vec<Value> = kernels
        .iter()
        .map(|k| {
            let declined: Vec<Value> = (k.declined.iter())
                .map(|d| json!({"kernel": d.kernel, "reason": d.reason}))
                .collect();
            json!({
                "node": k.node,
                "op": k.op,
                "kernel": k.kernel,
                "flops": k.flops,
                "generic": k.is_generic(),
                "declined": declined,
            })
        })
        .collect();
    json!(rows)
}

/// Dense ops of at least this many FLOPs on the generic kernel get a
/// warning from `kiln compile`.
const GENERIC_WARN_FLOPS: u64 = 1_000_000;

/// One line per dense node of at least [`GENERIC_WARN_FLOPS`] that an
/// x86-64 build runs on the generic kernel: the node, its cost and why
/// each microkernel declined.
fn generic_dense_warnings(artifact: &Artifact) -> Vec<String> {
    if artifact.arch != format::Arch::X86_64 {
        return Vec::new();
    }
    (artifact.metadata.dense_kernels.iter())
        .filter(|k| k.is_generic() && k.flops >= GENERIC_WARN_FLOPS)
        .map(|k| {
            let why: Vec<String> = (k.declined.iter())
                .map(|d| format!("{}: {}", d.kernel, d.reason))
                .collect();
            format!(
                "warning: node '{}' ({}, {:.1} MFLOP) runs on the generic kernel, not a microkernel: {}",
                k.node,
                k.op,
                k.flops as f64 / 1e6,
                why.join("; ")
            )
        })
        .collect()
}

/// `kiln inspect`'s listing of the dense kernels chosen.
fn print_dense_kernels(kernels: &[format::DenseKernel]) {
    if kernels.is_empty() {
        return;
    }
    println!("  dense kernels (node, op, MFLOP, kernel; candidates that declined):");
    for k in kernels {
        println!(
            "    {:<32} {:<8} {:>10.2}  {}",
            k.node,
            k.op,
            k.flops as f64 / 1e6,
            k.kernel
        );
        for d in &k.declined {
            println!("      {} declined: {}", d.kernel, d.reason);
        }
    }
}

/// The first lines of `kiln inspect` on an artifact of format `version`.
fn print_artifact_header(path: &Path, bytes: usize, version: u32, hash: &str) {
    println!("artifact {} ({bytes} bytes)", path.display());
    println!("  format version {version}, content sha256 {hash}");
}

fn inspect_artifact(a: &InspectArgs) -> Result<(), Failure> {
    let bytes = kiln_runtime::read_regular(&a.path, u64::MAX)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", a.path.display())))?;
    let view =
        ArtifactView::parse(&bytes).map_err(|e| Failure::new(exit::BAD_ARTIFACT, e.to_string()))?;
    let version = view.header.version;
    let cuda = view
        .cuda_code()
        .transpose()
        .map_err(|e| Failure::new(exit::BAD_ARTIFACT, e.to_string()))?;
    let artifact: Artifact = view.into_artifact();
    if let Some(code) = cuda {
        return inspect_cuda_artifact(a, &bytes, version, &artifact, &code);
    }
    let hash = hex(&artifact.content_hash());
    let m = &artifact.metadata;
    let features = artifact.features.names();
    if a.json {
        let kernels: Vec<Value> = artifact
            .kernels
            .iter()
            .map(|k| json!({"name": k.name, "text_offset": k.text_offset, "text_len": k.text_len}))
            .collect();
        let mut v = artifact_json(&artifact, version);
        v["arch"] = json!(format!("{:?}", artifact.arch));
        v["features"] = json!(features);
        v["code_bytes"] = json!(artifact.text.len());
        v["relocations"] = json!(artifact.relocs.len());
        v["kernels"] = json!(kernels);
        v["schedule_steps"] = json!(artifact.schedule.len());
        println!("{v}");
        return Ok(());
    }
    print_artifact_header(&a.path, bytes.len(), version, &hash);
    println!(
        "  arch {:?}, requires CPU features: {}",
        artifact.arch,
        features.join(" ")
    );
    println!("  built by {} with: {}", m.compiler_version, m.options);
    println!("  source model sha256 {}", hex(&m.source_sha256));
    print_io(m);
    println!(
        "  sections: weights {} B, code {} B ({} kernels, {} relocations), schedule {} steps, arena {} B",
        artifact.weights.len(),
        artifact.text.len(),
        artifact.kernels.len(),
        artifact.relocs.len(),
        artifact.schedule.len(),
        m.arena_size
    );
    println!("  kernels:");
    for (i, k) in artifact.kernels.iter().enumerate() {
        println!("    #{i:<4} {:>7} B  {}", k.text_len, k.name);
    }
    print_dense_kernels(&m.dense_kernels);
    Ok(())
}

/// `kiln inspect` of a CUDA artifact: the SM, I/O, and every kernel with
/// its launch plan and the registers / spills / static shared memory ptxas
/// reported (when the compiler found ptxas).
fn inspect_cuda_artifact(
    a: &InspectArgs,
    bytes: &[u8],
    version: u32,
    artifact: &Artifact,
    code: &kiln_format::CudaCode,
) -> Result<(), Failure> {
    let hash = hex(&artifact.content_hash());
    let m = &artifact.metadata;
    let assembled = !code.cubin.is_empty();
    if a.json {
        let kernels: Vec<Value> = code
            .kernels
            .iter()
            .map(|k| {
                json!({
                    "name": k.name, "node": k.node, "grid": k.grid, "block": k.block,
                    "dynamic_shared_bytes": k.shared_bytes,
                    "registers": assembled.then_some(k.registers),
                    "spill_bytes": assembled.then_some(k.spill_bytes),
                    "static_shared_bytes": assembled.then_some(k.static_shared_bytes),
                })
            })
            .collect();
        let mut v = artifact_json(artifact, version);
        v["arch"] = json!("nvptx64");
        v["sm"] = json!(code.sm);
        v["ptx_bytes"] = json!(code.ptx.len());
        v["cubin_bytes"] = json!(code.cubin.len());
        v["kernels"] = json!(kernels);
        v["schedule_steps"] = json!(code.schedule.len());
        println!("{v}");
        return Ok(());
    }
    print_artifact_header(&a.path, bytes.len(), version, &hash);
    println!("  CUDA sm_{} (target {})", code.sm, m.target);
    println!("  built by {} with: {}", m.compiler_version, m.options);
    print_io(m);
    println!(
        "  sections: weights {} B, PTX {} B, cubin {} B, {} kernels, schedule {} steps, device arena {} B",
        artifact.weights.len(),
        code.ptx.len(),
        code.cubin.len(),
        code.kernels.len(),
        code.schedule.len(),
        m.arena_size
    );
    if !assembled {
        println!("  (no cubin: ptxas was not found at compile time, registers unknown)");
    }
    println!(
        "  {:<5} {:<32} {:>16} {:>12} {:>6} {:>5} {:>6}  node",
        "#", "kernel", "grid", "block", "smem", "regs", "spill"
    );
    for (i, k) in code.kernels.iter().enumerate() {
        let dims = |d: [u32; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
        let regs = if assembled {
            k.registers.to_string()
        } else {
            "?".into()
        };
        let spill = if assembled {
            k.spill_bytes.to_string()
        } else {
            "?".into()
        };
        println!(
            "  {i:<5} {:<32} {:>16} {:>12} {:>6} {:>5} {:>6}  {}",
            k.name,
            dims(k.grid),
            dims(k.block),
            u64::from(k.shared_bytes) + u64::from(k.static_shared_bytes),
            regs,
            spill,
            k.node
        );
    }
    Ok(())
}

fn inspect_model(a: &InspectArgs) -> Result<(), Failure> {
    let proto = kiln_onnx::load_model(&a.path).map_err(|e| Failure::from(DriverError::from(e)))?;
    let summary = kiln_onnx::summarize(&proto);
    let opts = compile_options(&a.model_args, Target::default())?;
    let optimized = driver::optimize(&a.path, &opts);
    if let (Ok(o), true) = (&optimized, a.model_args.time_passes) {
        print_pass_times(&o.report, o.import_time, None);
    }
    if a.format == InspectFormat::Dot {
        let o = optimized.map_err(|e| {
            let f = Failure::from(e);
            Failure::new(f.code, format!("{}: {}", a.path.display(), f.message))
        })?;
        print!("{}", kiln_ir::text::dot(&o.graph));
        return Ok(());
    }
    let ir = optimized.map(|o| {
        (
            kiln_ir::text::print(&o.graph),
            kiln_ir::cost::dense_flops(&o.graph),
        )
    });
    let dims = |dims: &[kiln_onnx::DimSummary]| -> String {
        dims.iter()
            .map(|d| match d {
                kiln_onnx::DimSummary::Known(n) => n.to_string(),
                kiln_onnx::DimSummary::Symbolic(s) => s.clone(),
                kiln_onnx::DimSummary::Unknown => "?".to_string(),
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    if a.json {
        let io = |list: &[kiln_onnx::IoSummary]| -> Value {
            Value::Array(
                list.iter()
                    .map(|i| json!({"name": i.name, "dtype": i.dtype, "dims": dims(&i.dims)}))
                    .collect(),
            )
        };
        let (ir_text, dense_flops, ir_error) = match &ir {
            Ok((t, flops)) => (Some(t.clone()), Some(*flops), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        println!(
            "{}",
            json!({
                "kind": "onnx",
                "ir_version": summary.ir_version,
                "opsets": summary.opsets.iter().map(|(d, v)| json!({"domain": d, "version": v})).collect::<Vec<_>>(),
                "producer": summary.producer,
                "inputs": io(&summary.inputs),
                "outputs": io(&summary.outputs),
                "op_histogram": summary.op_histogram,
                "initializers": summary.initializer_count,
                "initializer_bytes": summary.initializer_bytes,
                "ir": ir_text,
                "dense_flops": dense_flops,
                "ir_error": ir_error,
            })
        );
        return Ok(());
    }
    println!(
        "model {} (ir_version {}, producer '{}')",
        a.path.display(),
        summary.ir_version,
        summary.producer
    );
    let opsets: Vec<String> = summary
        .opsets
        .iter()
        .map(|(d, v)| format!("{}:{v}", if d.is_empty() { "ai.onnx" } else { d }))
        .collect();
    println!("  opsets: {}", opsets.join(" "));
    for i in &summary.inputs {
        println!("  input  {}: {}[{}]", i.name, i.dtype, dims(&i.dims));
    }
    for o in &summary.outputs {
        println!("  output {}: {}[{}]", o.name, o.dtype, dims(&o.dims));
    }
    println!(
        "  initializers: {} ({} bytes)",
        summary.initializer_count, summary.initializer_bytes
    );
    println!("  ops:");
    for (op, n) in &summary.op_histogram {
        println!("    {n:>5}  {op}");
    }
    match ir {
        Ok((text, flops)) => {
            println!(
                "  dense FLOPs (MatMul, Gemm, Conv; a multiply-add is 2): {flops} ({:.3} GFLOP)",
                flops as f64 / 1e9
            );
            println!("IR after -O{}:", opts.opt_level);
            print!("{text}");
        }
        Err(e) => println!("IR not shown: {e}"),
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cmd_keygen(a: KeygenArgs) -> Result<(), Failure> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let public_path = {
        let mut p = a.output.clone().into_os_string();
        p.push(".pub");
        PathBuf::from(p)
    };
    let (secret, public) =
        signing::generate_key_pair().map_err(|e| Failure::new(exit::INTERNAL, e.to_string()))?;
    let io =
        |path: &Path, e: std::io::Error| Failure::new(exit::IO, format!("{}: {e}", path.display()));
    for path in [&a.output, &public_path] {
        if path.exists() && !a.force {
            return Err(Failure::new(
                exit::IO,
                format!("{} exists; pass --force to overwrite it", path.display()),
            ));
        }
    }
    // The secret key is readable by its owner only, from its first byte.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&a.output)
        .map_err(|e| io(&a.output, e))?;
    file.write_all(secret.as_bytes())
        .map_err(|e| io(&a.output, e))?;
    write_file(&public_path, public.as_bytes())?;
    println!(
        "wrote secret key {} and public key {}",
        a.output.display(),
        public_path.display()
    );
    Ok(())
}

/// The `input`/`output` lines of an artifact description.
fn print_io(m: &kiln_format::Metadata) {
    for (what, specs) in [("input ", &m.inputs), ("output", &m.outputs)] {
        for s in specs {
            println!(
                "  {what} {}: {} @ arena+{}",
                s.name,
                s.type_string(),
                s.arena_offset
            );
        }
    }
}

fn cmd_bench(a: BenchArgs) -> Result<(), Failure> {
    if a.runs == 0 {
        return Err(Failure::new(exit::USAGE, "--runs must be at least 1"));
    }
    let model = Model::load(&a.artifact)?;
    let inputs = gather_inputs(model.inputs(), &a.inputs)?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut outputs: Vec<Vec<u8>> = model
        .outputs()
        .iter()
        .map(|s| vec![0u8; s.byte_len() as usize])
        .collect();
    // A session's runs never allocate, so the timings hold no allocator.
    let mut session = model.session_with_threads(session_threads(&model, a.threads))?;
    let threads = session.threads();
    let mut run = |session: &mut Session| -> Result<(), Failure> {
        let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(|v| v.as_mut_slice()).collect();
        session.run_into(&views, &mut outs)?;
        Ok(())
    };
    for _ in 0..a.warmup {
        run(&mut session)?;
    }
    let mut times = Vec::with_capacity(a.runs);
    let total = Instant::now();
    for _ in 0..a.runs {
        let t = Instant::now();
        run(&mut session)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let wall = total.elapsed().as_secs_f64();
    let profile = match a.profile {
        Some(_) => {
            let mut steps = Vec::new();
            let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(|v| v.as_mut_slice()).collect();
            for _ in 0..a.runs {
                session.run_profiled(&views, &mut outs, &mut steps)?;
            }
            Some(steps)
        }
        None => None,
    };
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let (p50, p95, p99) = (pct(0.5), pct(0.95), pct(0.99));
    let mean = times.iter().sum::<f64>() / times.len() as f64;
    let throughput = a.runs as f64 / wall;
    // Per step: (node, tasks, mean ms per run), slowest first.
    let profile: Option<Vec<(&str, usize, f64)>> = profile.map(|steps| {
        let mut rows: Vec<_> = model
            .step_nodes()
            .iter()
            .zip(model.step_tasks())
            .zip(&steps)
            .map(|((node, tasks), t)| (node.as_str(), tasks, t.as_secs_f64() * 1e3 / a.runs as f64))
            .collect();
        rows.sort_by(|x, y| y.2.total_cmp(&x.2));
        rows
    });
    if a.json {
        let mut v = json!({"artifact": a.artifact.display().to_string(), "runs": a.runs, "warmup": a.warmup, "threads": threads,
               "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "mean_ms": mean, "min_ms": times[0], "runs_per_s": throughput});
        if let Some(rows) = &profile {
            v["profile"] = rows
                .iter()
                .map(|(node, tasks, ms)| json!({"node": node, "tasks": tasks, "mean_ms": ms}))
                .collect();
        }
        println!("{v}");
    } else {
        println!(
            "{}: {} runs ({threads} thread(s)): p50 {p50:.3} ms, p95 {p95:.3} ms, p99 {p99:.3} ms, mean {mean:.3} ms, {throughput:.1} runs/s",
            a.artifact.display(),
            a.runs
        );
        if let (Some(rows), Some(n)) = (&profile, a.profile) {
            let total: f64 = rows.iter().map(|r| r.2).sum();
            println!(
                "steps: {} kernels, {total:.3} ms per run in kernels; the {} slowest:",
                rows.len(),
                n.min(rows.len())
            );
            println!(
                "{:>9} {:>6} {:>6} {:>5}  node",
                "ms/run", "%", "cum%", "tasks"
            );
            let mut cum = 0.0;
            for (node, tasks, ms) in rows.iter().take(n) {
                cum += ms;
                println!(
                    "{ms:>9.3} {:>6.1} {:>6.1} {tasks:>5}  {node}",
                    100.0 * ms / total,
                    100.0 * cum / total
                );
            }
        }
    }
    Ok(())
}
