//! The compile pipeline: import → passes → codegen → artifact bytes.

use kiln_format::{Artifact, ArtifactInfo};
use kiln_ir::Graph;
use kiln_onnx::ImportOptions;
use kiln_passes::{
    Activations, AssignPrecision, BiasCorrection, PassManager, PipelineOptions, PipelineReport,
    Policy, Samples,
};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::error::DriverError;
use crate::target::{Generated, Target};
pub use kiln_passes::{PrecisionOutcome, Progress, Silent};

/// Which IR dumps to write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DumpIr {
    /// No dumps.
    #[default]
    None,
    /// The imported graph and the graph after every pass.
    All,
    /// The graph after one named pass (`import` for the imported graph).
    After(String),
}

/// Everything that decides what `kiln compile` produces. Built once from
/// the command line; recorded in the artifact (minus output locations).
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Code generation target (`--target`).
    pub target: Target,
    /// Shape bindings for the frontend.
    pub import: ImportOptions,
    /// Optimization level (`-O`).
    pub opt_level: u8,
    /// Explicit pass list (`--passes`), overriding the level's pipeline.
    pub passes: Option<Vec<String>>,
    /// Verify the graph after every pass.
    pub verify_each: bool,
    /// IR dumps to produce.
    pub dump_ir: DumpIr,
    /// The largest arena (inputs, outputs, activations) an artifact may
    /// need; a larger one is [`DriverError::ArenaTooLarge`]. It bounds what a
    /// small model claiming huge shapes makes the runtime allocate.
    /// Default [`DEFAULT_MAX_ARENA_BYTES`].
    pub max_arena_bytes: u64,
    /// CPU targets: the most tasks a dense kernel is split into for
    /// multi-threaded sessions (`--threads`; 1: no split).
    pub threads: usize,
    /// Precision policy (`--precision`, `--keep-fp32`, `--force`); the
    /// default (fp32) leaves the graph untouched.
    pub precision: Policy,
    /// Random input samples on which a reduced-precision build is compared
    /// with the f32 graph for the accuracy report (`--calibrate-random`;
    /// 0: no report).
    pub calibrate_random: usize,
    /// Real calibration samples (`--calibrate DIR`, see
    /// [`read_calibration`]); they replace the random ones.
    pub calibrate: Option<PathBuf>,
    /// Error-driven fallback (`--max-rel-error E`): while a graph output's
    /// relative L2 error on the calibration samples exceeds `E`, the
    /// reduced-precision layer with the largest error is raised to fp32.
    pub max_rel_error: Option<f64>,
    /// int8 layers quantize their activations with ranges observed on the
    /// calibration samples (`--quantize static`, min/max observer);
    /// otherwise per run (`--quantize dynamic`).
    pub static_activations: bool,
    /// How `--quantize static` makes a range of the observed values
    /// (`--observer`).
    pub observer: kiln_passes::Observer,
    /// Static int8 layers' biases are corrected by their mean output error
    /// on the calibration samples (`--calibrate DIR` only: random samples
    /// would teach the wrong shift; dynamic builds keep an artifact that
    /// does not depend on the samples; `--no-bias-correction` turns it
    /// off).
    pub bias_correction: bool,
    /// Per-channel smoothing of int8 layers' activations (`--smooth`, see
    /// [`kiln_passes::smoothing_factors`]), measured on the calibration
    /// samples.
    pub smooth: Smooth,
}

/// Whether int8 activations are smoothed, and how strongly (`--smooth`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Smooth {
    /// α = [`DEFAULT_SMOOTH_ALPHA`] for static builds calibrated on real
    /// samples (`--quantize static --calibrate DIR`); none otherwise.
    #[default]
    Auto,
    /// Not smoothed (`--smooth off`).
    Off,
    /// Migration strength α in [0, 1] (`--smooth α`).
    Alpha(f32),
}

/// The smoothing strength of calibrated static builds (SmoothQuant's
/// default; measured in `docs/precision.md`).
pub const DEFAULT_SMOOTH_ALPHA: f32 = 0.5;

/// Default of [`CompileOptions::max_arena_bytes`]: 16 GiB.
pub const DEFAULT_MAX_ARENA_BYTES: u64 = 16 << 30;

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            target: Target::default(),
            import: ImportOptions::default(),
            opt_level: 2,
            passes: None,
            verify_each: false,
            dump_ir: DumpIr::None,
            max_arena_bytes: DEFAULT_MAX_ARENA_BYTES,
            threads: kiln_target_cpu::DEFAULT_THREADS,
            precision: Policy::default(),
            calibrate_random: 1,
            calibrate: None,
            max_rel_error: None,
            static_activations: false,
            observer: kiln_passes::Observer::MinMax,
            bias_correction: true,
            smooth: Smooth::Auto,
        }
    }
}

/// The first 8 bytes of the SHA-256 of `data`, in hex: names data that
/// decides the artifact (bound input values, a plan file) in the options
/// text.
fn digest_prefix(data: &[u8]) -> String {
    Sha256::digest(data)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl CompileOptions {
    /// The smoothing strength this build uses, if any.
    pub fn smooth_alpha(&self) -> Option<f32> {
        match self.smooth {
            Smooth::Auto => (self.static_activations
                && self.calibrate.is_some()
                && self.precision.may_quantize())
            .then_some(DEFAULT_SMOOTH_ALPHA),
            Smooth::Off => None,
            Smooth::Alpha(alpha) => Some(alpha),
        }
    }

    /// A canonical, deterministic rendering of the options, stored in the
    /// artifact so `kiln inspect` can show how it was built.
    pub fn canonical(&self) -> String {
        let mut s = format!("target={} opt_level={}", self.target, self.opt_level);
        if self.target.backend().splits_kernels() {
            let _ = write!(s, " threads={}", self.threads);
        }
        if let Some(p) = &self.passes {
            let _ = write!(s, " passes={}", p.join(","));
        }
        for (name, dims) in &self.import.input_shapes {
            let dims: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
            let _ = write!(s, " input_shape={name}={}", dims.join("x"));
        }
        for (name, v) in &self.import.dims {
            let _ = write!(s, " dim={name}={v}");
        }
        for (name, t) in &self.import.input_values {
            let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
            let _ = write!(
                s,
                " bind_input={name}={}[{}]sha256:{}",
                t.dtype(),
                dims.join("x"),
                digest_prefix(&t.data().to_le_bytes())
            );
        }
        // fp32 builds keep the options text (and so the artifact bytes)
        // they had before precision assignment existed.
        let p = &self.precision;
        if !p.is_identity() {
            let _ = write!(s, " precision={}", p.mode.name());
            if self.static_activations {
                let _ = write!(s, " quantize=static observer={}", self.observer);
            }
            // The default keeps the options text of builds made before
            // the choice existed.
            if p.activation_type != kiln_passes::ActivationType::Uint8 {
                let _ = write!(s, " activation_type={}", p.activation_type);
            }
            let list = |v: &[kiln_passes::Pattern]| {
                v.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            if !p.keep_fp32.is_empty() {
                let _ = write!(s, " keep_fp32={}", list(&p.keep_fp32));
            }
            for (prec, pats) in &p.force {
                let _ = write!(s, " force={prec}={}", list(pats));
            }
            if let Some(plan) = &p.plan {
                let _ = write!(
                    s,
                    " plan={}nodes:sha256:{}",
                    plan.entries.len(),
                    digest_prefix(plan.to_json().as_bytes())
                );
            }
            if let Some(e) = self.max_rel_error {
                let _ = write!(s, " max_rel_error={e}");
            }
            if !self.bias_correction && p.may_quantize() {
                s.push_str(" bias_correction=off");
            }
            match self.smooth_alpha() {
                Some(alpha) => {
                    let _ = write!(s, " smooth={alpha}");
                }
                None if self.smooth == Smooth::Off && p.may_quantize() => {
                    s.push_str(" smooth=off");
                }
                None => {}
            }
        }
        s
    }
}

/// Runs `work` as one stage of unknown length.
fn stage<T>(progress: &dyn Progress, name: &str, work: impl FnOnce() -> T) -> T {
    progress.begin(name, None);
    let result = work();
    progress.end();
    result
}

/// The result of a compilation.
pub struct Compiled {
    /// The artifact.
    pub artifact: Artifact,
    /// Its serialized bytes (what `-o` writes).
    pub bytes: Vec<u8>,
    /// The final IR.
    pub graph: Graph,
    /// What each pass did.
    pub report: PipelineReport,
    /// IR dumps requested by [`CompileOptions::dump_ir`]: file name and text.
    pub dumps: Vec<(String, String)>,
    /// The precision decisions and accuracy report of a reduced-precision
    /// build.
    pub precision: Option<PrecisionOutcome>,
    /// CUDA compilations: every kernel as a standalone PTX module (kernel
    /// name, text), for `--dump-ptx`. Empty for CPU targets.
    pub ptx_kernels: Vec<(String, String)>,
    /// CUDA compilations: the ptxas that assembled the cubin stored in the
    /// artifact (`None`: no ptxas found, the artifact holds PTX only).
    pub ptxas: Option<PathBuf>,
    /// Wall time of reading and importing the ONNX model.
    pub import_time: Duration,
    /// Wall time of code generation (and ptxas) and serialization.
    pub codegen_time: Duration,
}

/// An imported and optimized graph, before code generation.
pub struct Optimized {
    /// The final IR.
    pub graph: Graph,
    /// What each pass did.
    pub report: PipelineReport,
    /// IR dumps requested by [`CompileOptions::dump_ir`]: file name and text.
    pub dumps: Vec<(String, String)>,
    /// Wall time of reading and importing the ONNX model.
    pub import_time: Duration,
    /// The precision outcome of a reduced-precision build.
    pub precision: Option<PrecisionOutcome>,
}

/// Reads the calibration samples in `dir` for `graph`'s inputs: every
/// `.npz` file (in name order) is one sample with one array per graph
/// input, named as the input, of its exact dtype and shape, all values
/// finite. Anything else is a [`DriverError::Calibration`] naming the file
/// and array: an empty directory, a missing or extra array, a wrong dtype
/// or shape, NaN or infinity.
pub fn read_calibration(
    dir: &Path,
    graph: &Graph,
) -> Result<Vec<Vec<kiln_ir::Tensor>>, DriverError> {
    let bad = |path: &Path, message: String| DriverError::Calibration {
        path: path.to_path_buf(),
        message,
    };
    let entries = std::fs::read_dir(dir).map_err(|source| DriverError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npz"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(
            dir,
            "no .npz files (one per sample, one array per model input)".into(),
        ));
    }
    let inputs: Vec<&kiln_ir::Node> = graph.inputs().iter().map(|&i| graph.node(i)).collect();
    let names: Vec<&str> = inputs.iter().map(|n| n.name.as_str()).collect();
    let mut samples = Vec::with_capacity(files.len());
    for file in &files {
        // Raw (ml_dtypes) arrays read as the input they feed.
        let want = |name: &str| {
            let input = inputs.iter().find(|n| n.name == name)?;
            Some(input.ty.dtype)
        };
        let arrays = crate::npy::read_npz(file, want).map_err(|e| bad(file, e.to_string()))?;
        if let Some(extra) = arrays.iter().find(|a| !names.contains(&a.name.as_str())) {
            return Err(bad(
                file,
                format!(
                    "array '{}' is not a model input (inputs: {})",
                    extra.name,
                    names.join(", ")
                ),
            ));
        }
        let mut sample = Vec::with_capacity(inputs.len());
        for input in &inputs {
            let array = arrays
                .iter()
                .find(|a| a.name == input.name)
                .ok_or_else(|| bad(file, format!("no array for input '{}'", input.name)))?;
            let t = crate::npy::to_ir_tensor(array.clone(), file)
                .map_err(|e| bad(file, e.to_string()))?;
            if t.dtype() != input.ty.dtype || t.shape() != &input.ty.shape {
                return Err(bad(
                    file,
                    format!(
                        "array '{}' is {}{:?}, the model input is {}",
                        input.name,
                        t.dtype(),
                        t.shape().as_slice(),
                        input.ty
                    ),
                ));
            }
            if t.dtype().is_float() {
                if let Some(i) = t.to_f64_vec().iter().position(|v| !v.is_finite()) {
                    return Err(bad(
                        file,
                        format!(
                            "array '{}' has a non-finite value at flat index {i}",
                            input.name
                        ),
                    ));
                }
            }
            sample.push(t);
        }
        samples.push(sample);
    }
    Ok(samples)
}

/// Imports the model at `path` and runs the pass pipeline on it.
pub fn optimize(path: &Path, opts: &CompileOptions) -> Result<Optimized, DriverError> {
    let start = Instant::now();
    let graph = kiln_onnx::import(path, &opts.import)?;
    optimize_graph(graph, start.elapsed(), opts, &Silent)
}

/// Runs the pass pipeline on an imported graph.
fn optimize_graph(
    mut graph: Graph,
    import_time: Duration,
    opts: &CompileOptions,
    progress: &dyn Progress,
) -> Result<Optimized, DriverError> {
    let pm = match &opts.passes {
        Some(names) => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            PassManager::from_names(&names)?
        }
        None => PassManager::for_level(opts.opt_level)?,
    };
    let pm = opts.target.backend().pipeline(pm);
    // Options that cannot work are refused before the calibration data is
    // read (an empty calibration directory is an error of its own).
    if opts.precision.activation_type != kiln_passes::ActivationType::default()
        && !opts.precision.may_quantize()
    {
        return Err(DriverError::Usage(
            "--activation-type applies to int8 layers (--quantize, --precision int8, --force int8=..., --plan with int8 entries)".into(),
        ));
    }
    let has_samples =
        !opts.precision.is_identity() && (opts.calibrate.is_some() || opts.calibrate_random > 0);
    if matches!(opts.smooth, Smooth::Alpha(_)) && !(has_samples && opts.precision.may_quantize()) {
        return Err(DriverError::Usage(
            "--smooth needs int8 layers (--quantize, --force int8=...) and calibration samples (--calibrate DIR)".into(),
        ));
    }
    if opts.max_rel_error.is_some() && !has_samples {
        return Err(DriverError::Usage(
            "--max-rel-error needs calibration samples (--calibrate DIR or --calibrate-random N with N > 0) and a reduced --precision".into(),
        ));
    }
    // Calibration data is checked against the model before any work.
    let samples = if opts.precision.is_identity() {
        Vec::new()
    } else {
        match &opts.calibrate {
            Some(dir) => read_calibration(dir, &graph)?,
            None => kiln_passes::random_samples(&graph, opts.calibrate_random),
        }
    };
    let mut dumps = Vec::new();
    let wants = |pass: &str| match &opts.dump_ir {
        DumpIr::None => false,
        DumpIr::All => true,
        DumpIr::After(p) => p == pass,
    };
    if wants("import") {
        dumps.push(("00-import.kir".to_string(), kiln_ir::text::print(&graph)));
    }
    let pipeline = PipelineOptions {
        verify_each: opts.verify_each,
    };
    // Precision is assigned before `fuse` (dense ops, not fused heads);
    // the rest of the pipeline then fuses what stays f32.
    let (before, after) = if opts.precision.is_identity() {
        (pm, PassManager::from_names(&[])?)
    } else {
        pm.split_before("fuse")
    };
    let mut index = 0;
    let mut record = |pass: &str, g: &Graph| {
        index += 1;
        if wants(pass) {
            dumps.push((format!("{index:02}-{pass}.kir"), kiln_ir::text::print(g)));
        }
    };
    let optimizing = |pm: &PassManager| progress.begin("optimizing", Some(pm.names().len() as u64));
    let mut after_pass = |pass: &str, g: &Graph| {
        record(pass, g);
        progress.step(pass);
    };
    optimizing(&before);
    let mut report = before.run_with(&mut graph, &pipeline, &mut after_pass)?;
    progress.end();
    let mut precision = None;
    if !opts.precision.is_identity() {
        let request = kiln_passes::Request {
            policy: &opts.precision,
            samples: match opts.calibrate {
                Some(_) => Samples::Calibration(&samples),
                None => Samples::Random(&samples),
            },
            activations: match opts.static_activations {
                true => Activations::Static(opts.observer),
                false => Activations::Dynamic,
            },
            smooth_alpha: opts.smooth_alpha(),
            // Dynamic builds depend on their calibration samples only
            // through the report (and `--smooth`, asked for explicitly).
            bias_correction: match opts.bias_correction && opts.static_activations {
                true => BiasCorrection::Measure,
                false => BiasCorrection::Off,
            },
            max_rel_error: opts.max_rel_error,
        };
        let (pass, outcome) =
            kiln_passes::precision::calibrate::assign(&mut graph, &request, progress)?;
        report.passes.push(pass);
        after_pass(AssignPrecision::NAME, &graph);
        precision = Some(outcome);
    }
    optimizing(&after);
    let rest = after.run_with(&mut graph, &pipeline, &mut after_pass)?;
    progress.end();
    report.passes.extend(rest.passes);
    Ok(Optimized {
        graph,
        report,
        dumps,
        import_time,
        precision,
    })
}

/// Compiles the ONNX model at `path` into an artifact.
///
/// The file is read once: the source hash recorded in the artifact is of
/// the very bytes compiled.
pub fn compile(path: &Path, opts: &CompileOptions) -> Result<Compiled, DriverError> {
    compile_with_progress(path, opts, &Silent)
}

/// [`compile`], reporting each long stage to `progress`.
pub fn compile_with_progress(
    path: &Path,
    opts: &CompileOptions,
    progress: &dyn Progress,
) -> Result<Compiled, DriverError> {
    let source = kiln_onnx::read_model_file(path)?;
    compile_source(&source, kiln_onnx::model_dir(path), opts, progress)
}

/// Compiles ONNX model bytes held in memory; external data is read from
/// `model_dir` (`None`: external data is an error). The fuzz targets
/// (`fuzz/`, `kiln_tests::fuzz`) enter the compiler here.
pub fn compile_bytes(
    source: &[u8],
    model_dir: Option<&Path>,
    opts: &CompileOptions,
) -> Result<Compiled, DriverError> {
    compile_source(source, model_dir, opts, &Silent)
}

fn compile_source(
    source: &[u8],
    model_dir: Option<&Path>,
    opts: &CompileOptions,
    progress: &dyn Progress,
) -> Result<Compiled, DriverError> {
    let start = Instant::now();
    let graph = stage(progress, "importing", || {
        let model = kiln_onnx::decode_model(source)?;
        kiln_onnx::import_model(&model, model_dir, &opts.import)
    })?;
    let optimized = optimize_graph(graph, start.elapsed(), opts, progress)?;
    stage(progress, "generating code", || {
        generate(source, optimized, opts)
    })
}

/// Code generation and serialization of an optimized graph compiled from
/// the ONNX bytes `source`.
fn generate(
    source: &[u8],
    optimized: Optimized,
    opts: &CompileOptions,
) -> Result<Compiled, DriverError> {
    let start = Instant::now();
    let Optimized {
        graph,
        report,
        dumps,
        import_time,
        precision,
    } = optimized;
    let info = ArtifactInfo {
        compiler_version: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        options: opts.canonical(),
        source_sha256: Sha256::digest(source).into(),
    };
    // Every computed value lives in the arena, so one larger than the arena
    // limit fails it anyway: refuse it before code generation, whose time
    // grows with the shapes it specializes on.
    for id in graph.node_ids() {
        let node = graph.node(id);
        let bytes = node.ty.checked_size_bytes().map_or(u64::MAX, |b| b as u64);
        if !matches!(node.op, kiln_ir::Op::Constant(_)) && bytes > opts.max_arena_bytes {
            return Err(DriverError::ArenaTooLarge {
                arena_bytes: bytes,
                limit: opts.max_arena_bytes,
            });
        }
    }
    let (artifact, Generated { ptx_kernels, ptxas }) =
        opts.target.backend().generate(&graph, opts.threads, info)?;
    if artifact.metadata.arena_size > opts.max_arena_bytes {
        return Err(DriverError::ArenaTooLarge {
            arena_bytes: artifact.metadata.arena_size,
            limit: opts.max_arena_bytes,
        });
    }
    let bytes = artifact.to_bytes();
    Ok(Compiled {
        artifact,
        bytes,
        graph,
        report,
        dumps,
        precision,
        ptx_kernels,
        ptxas,
        import_time,
        codegen_time: start.elapsed(),
    })
}

/// Where two artifacts' bytes first differ: the offset and the region of
/// the file holding it (a header field, a section-table entry, a section or
/// the padding between sections), as named by the first artifact's layout.
/// `None` when the bytes are identical.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<(u64, String)> {
    let offset = match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => i,
        None if a.len() == b.len() => return None,
        None => a.len().min(b.len()),
    };
    let region = if offset >= a.len() {
        format!("end of file (lengths {} and {})", a.len(), b.len())
    } else {
        kiln_format::region_at(a, offset as u64)
    };
    Some((offset as u64, region))
}
