//! The compile pipeline: import → passes → codegen → artifact bytes.

use crate::error::DriverError;
use crate::options::{CompileOptions, DumpIr};
use crate::samples::{npz_files, read_sample};
use crate::target::Generated;
use crate::variants::Expansion;
use kiln_format::{Artifact, ArtifactInfo, Role};
use kiln_ir::Graph;
use kiln_passes::{
    Activations, AssignPrecision, BiasCorrection, PassManager, PipelineOptions, PipelineReport,
    Samples,
};
use kiln_passes::{PrecisionOutcome, Progress, Silent};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// The final IR (of the first profile, when there are several).
    pub graph: Graph,
    /// The bindings of each profile (`batch=8 seq=128`), in the artifact's
    /// order; empty for an artifact of one profile.
    pub profiles: Vec<String>,
    /// What each pass did (to the first profile's graph).
    pub report: PipelineReport,
    /// IR dumps requested by [`CompileOptions::dump_ir`]: file name and text.
    pub dumps: Vec<(String, String)>,
    /// The precision decisions and accuracy report of a reduced-precision
    /// build.
    pub precision: Option<PrecisionOutcome>,
    /// Calibration coverage on the `--validate` samples.
    pub coverage: Option<Validated>,
    /// The golden outputs whose tolerance the build's own departure from
    /// the source changed or exceeds ([`crate::golden::fit_tolerances`]).
    pub golden_fits: Vec<crate::golden::ToleranceFit>,
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
    /// The golden self-test, computed on the source graph before any pass
    /// (empty without `--golden`).
    pub golden: kiln_format::Golden<'static>,
    /// The golden outputs whose tolerance the build's own departure from
    /// the source changed or exceeds ([`crate::golden::fit_tolerances`]).
    pub golden_fits: Vec<crate::golden::ToleranceFit>,
    /// Calibration coverage on the `--validate` samples.
    pub coverage: Option<Validated>,
    /// The outputs of data-dependent length, whose lengths are the graph's
    /// last outputs (`crate::bounded`).
    bounded: Vec<crate::bounded::Bounded>,
}

/// A static int8 build's calibration coverage on held-out samples.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The report.
    pub coverage: kiln_passes::Coverage,
    /// The held-out sample files, by sample index.
    pub files: Vec<PathBuf>,
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
    let files = npz_files(dir)?;
    if files.is_empty() {
        return Err(bad(
            dir,
            "no .npz files (one per sample, one array per model input)".into(),
        ));
    }
    files
        .iter()
        .map(|file| read_sample(file, graph).map_err(|m| bad(file, m)))
        .collect()
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
    opts.validate()?;
    let bounded = crate::bounded::resolve(&mut graph)?;
    if !bounded.is_empty() {
        let names: Vec<&str> = (bounded.iter())
            .map(|b| graph.outputs()[b.output].0.as_str())
            .collect();
        let names = names.join("', '");
        if opts.golden.is_some() {
            return Err(DriverError::Usage(format!(
                "--golden with outputs whose size depends on the data ('{names}'): the self-test compares whole outputs; compile without --golden"
            )));
        }
        if matches!(opts.target, crate::target::Target::Cuda(_)) {
            return Err(DriverError::Usage(format!(
                "outputs whose size depends on the data ('{names}') have no CUDA lowering; compile for a CPU target"
            )));
        }
    }
    // The golden outputs are the source model's, before any pass; golden
    // and calibration data are checked against the model before any work.
    let golden = match opts.golden {
        Some(_) => stage(progress, "computing golden outputs", || {
            crate::golden::build(&graph, opts)
        })?,
        None => kiln_format::Golden::default(),
    };
    let samples = if opts.precision.is_identity() {
        Vec::new()
    } else {
        match &opts.calibrate {
            Some(dir) => read_calibration(dir, &graph)?,
            None => kiln_passes::random_samples(&graph, opts.calibrate_random),
        }
    };
    let held_out = match &opts.validate {
        Some(dir) => Some((read_calibration(dir, &graph)?, npz_files(dir)?)),
        None => None,
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
    let mut validated = None;
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
        // The f32 graph the ranges were calibrated on, for the coverage.
        let reference = held_out.as_ref().map(|_| graph.clone());
        let (pass, outcome) =
            kiln_passes::precision::calibrate::assign(&mut graph, &request, progress)?;
        if let (Some(reference), Some((validation, files))) = (reference, held_out) {
            let measured = stage(progress, "measuring calibration coverage", || {
                kiln_passes::coverage(&reference, &graph, &outcome, &validation)
            });
            let coverage = measured.map_err(|source| {
                DriverError::Pass(kiln_passes::PassError::Failed {
                    pass: AssignPrecision::NAME,
                    source,
                })
            })?;
            validated = Some(Validated { coverage, files });
        }
        report.passes.push(pass);
        after_pass(AssignPrecision::NAME, &graph);
        precision = Some(outcome);
    }
    optimizing(&after);
    let rest = after.run_with(&mut graph, &pipeline, &mut after_pass)?;
    progress.end();
    report.passes.extend(rest.passes);
    let mut golden = golden;
    let golden_fits = match golden.sets.is_empty() {
        true => Vec::new(),
        false => stage(progress, "fitting golden tolerances to the build", || {
            crate::golden::fit_tolerances(&mut golden, &graph, opts.golden_tolerance.is_some())
        })?,
    };
    Ok(Optimized {
        graph,
        report,
        dumps,
        import_time,
        precision,
        golden,
        golden_fits,
        coverage: validated,
        bounded,
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
    std::thread::scope(|scope| {
        // Hashing a large model's bytes takes a core for a while (0.4 s for
        // VGG's 553 MB): it runs beside the import and the passes.
        let hashing = scope.spawn(|| -> [u8; 32] { Sha256::digest(source).into() });
        let source_sha256 = move || hashing.join().expect("hashing does not panic");
        let start = Instant::now();
        if opts.profiles.count() > 1 || !opts.profiles.paddable.is_empty() {
            return compile_profiles(source, source_sha256, model_dir, opts, progress);
        }
        let graph = stage(progress, "importing", || {
            let model = kiln_onnx::decode_model(source)?;
            kiln_onnx::import_model(&model, model_dir, &opts.import_on_paths())
        });
        let graph = match graph {
            // Control flow decided at run time: one variant per path.
            Err(kiln_onnx::OnnxError::Undecided { .. }) => {
                return compile_profiles(source, source_sha256, model_dir, opts, progress);
            }
            graph => graph?,
        };
        compile_optimized(graph, start.elapsed(), opts, progress, source_sha256)
    })
}

/// An artifact of several profiles ([`CompileOptions::profiles`]): each
/// combination imported, optimized and lowered on its own, all sharing one
/// weights section. An error names the profile it arose in. Also the
/// path of `--pad-dim` (with one profile or more): the padding table is
/// proved on the imported graphs; and of run-time control flow, each
/// combination expanded into its variants and condition programs
/// (`crate::variants`).
fn compile_profiles(
    source: &[u8],
    source_sha256: impl FnOnce() -> [u8; 32],
    model_dir: Option<&Path>,
    opts: &CompileOptions,
    progress: &dyn Progress,
) -> Result<Compiled, DriverError> {
    if opts.static_activations {
        let why = match opts.profiles.count() {
            1 => "the model's run-time control flow (an If or Loop whose condition is computed from inputs) makes one profile per path, and calibration measures one graph; bind the inputs the conditions read (--bind-input) to compile one path, or use dynamic int8 (--quantize dynamic)",
            _ => "calibration samples have one shape each, and every profile must share the activation ranges; give one value per --dim (or use dynamic int8, --quantize dynamic)",
        };
        return Err(DriverError::Usage(format!(
            "--quantize static builds one profile: {why}"
        )));
    }
    let imports = opts.profiles.imports(&opts.import_on_paths())?;
    let start = Instant::now();
    let model = stage(progress, "importing", || kiln_onnx::decode_model(source))?;
    let in_profile = |label: &str| {
        let label = label.to_string();
        move |e: DriverError| DriverError::InProfile {
            profile: label,
            source: Box::new(e),
        }
    };
    let mut graphs = Vec::with_capacity(imports.len());
    let mut variants = Variants::default();
    for (label, import) in &imports {
        let mut import_path = |branches: &kiln_onnx::Branches| -> Result<Graph, DriverError> {
            let import = kiln_onnx::ImportOptions {
                branches: Some(branches.clone()),
                ..import.clone()
            };
            Ok(kiln_onnx::import_model(&model, model_dir, &import)?)
        };
        let base = import.branches.clone().unwrap_or_default();
        let expansion = stage(progress, "importing", || {
            crate::variants::expand(&mut import_path, &base)
        });
        match expansion.map_err(in_profile(label))? {
            Expansion::Single(graph) => variants.add_shape(label, graph, &mut graphs),
            Expansion::Variants(units) => variants.add(label, units, &mut graphs),
            Expansion::TooMany(why) => {
                // Too many paths to compile each: both branches of every
                // run-time If, selected with Where, where the shapes agree.
                let legacy = kiln_onnx::ImportOptions {
                    branches: None,
                    ..import.clone()
                };
                let graph = kiln_onnx::import_model(&model, model_dir, &legacy)
                    .map_err(|e| {
                        DriverError::Usage(format!(
                            "{why} (importing both branches of each If instead: {e})"
                        ))
                    })
                    .map_err(in_profile(label))?;
                variants.add_shape(label, graph, &mut graphs);
            }
        }
    }
    let import_time = start.elapsed();
    let branching = variants.roles.iter().any(|r| *r != Role::SHAPES);
    if branching && !opts.profiles.paddable.is_empty() {
        return Err(DriverError::Usage(
            "--pad-dim with run-time control flow (an If or Loop whose condition is computed from inputs): padding is proved on one graph per shape, and this model has one per path; compile without --pad-dim".into(),
        ));
    }
    let padding = match opts.profiles.paddable.is_empty() {
        true => Vec::new(),
        false => {
            opts.validate()?;
            let summary = kiln_onnx::summarize(&model);
            let traced: Vec<(String, &Graph, &BTreeMap<String, usize>)> =
                (imports.iter().zip(&graphs))
                    .map(|((label, import), g)| (label.clone(), g, &import.dims))
                    .collect();
            let mut probe = |p: usize, dim: &str, value: usize| {
                let mut import = imports[p].1.clone();
                import.dims.insert(dim.to_string(), value);
                Ok(kiln_onnx::import_model(&model, model_dir, &import)?)
            };
            crate::padding::paddable_dims(&summary, &opts.profiles.paddable, &traced, &mut probe)?
        }
    };
    // The golden sets have one shape: they go with the first profile they
    // fit, and with run-time control flow, whose path they take.
    let golden_profile = match opts.golden {
        None => None,
        Some(_) => {
            let mut first = None;
            for (i, g) in graphs.iter().enumerate() {
                let Role::Model { guards } = &variants.roles[i] else {
                    continue;
                };
                if crate::golden::fits(g, opts) && crate::golden::takes_path(guards, &graphs, opts)?
                {
                    first = Some(i);
                    break;
                }
            }
            Some(first.ok_or_else(|| {
                let e = crate::golden::fits_error(&graphs[0], opts);
                DriverError::Usage(format!(
                    "the golden input sets fit no profile ({}; profile {} says: {e})",
                    opts.profiles.count(),
                    imports[0].0
                ))
            })?)
        }
    };
    let mut optimized = Vec::with_capacity(graphs.len());
    for (i, graph) in graphs.into_iter().enumerate() {
        let mut profile_opts = opts.clone();
        if golden_profile != Some(i) {
            profile_opts.golden = None;
        }
        let o = optimize_graph(graph, import_time, &profile_opts, progress);
        optimized.push(o.map_err(in_profile(&variants.labels[i]))?);
    }
    if variants.labels.len() == 1 {
        variants.labels.clear();
    }
    stage(progress, "generating code", || {
        generate_all(source_sha256(), optimized, variants, padding, opts)
    })
}

/// The profiles of an artifact beyond their graphs: each one's label
/// and role (one per graph, in order), and the refused paths of run-time
/// control flow, which have no graph and follow them.
#[derive(Default)]
struct Variants {
    /// Per graph: the bindings and path (`seq=16, If 'If_0' takes its
    /// then branch: true`); empty for an artifact of one profile.
    labels: Vec<String>,
    /// Per graph: its role.
    roles: Vec<Role>,
    /// The refused paths: label, the index of a graph of the same input
    /// shapes, and the role.
    refused: Vec<(String, usize, Role)>,
}

impl Variants {
    /// Adds the one graph of a shape without run-time decisions.
    fn add_shape(&mut self, label: &str, graph: Graph, graphs: &mut Vec<Graph>) {
        graphs.push(graph);
        self.roles.push(Role::SHAPES);
        self.labels.push(label.to_string());
    }

    /// Adds the units of one shape's expansion (graphs to `graphs`),
    /// their guards re-indexed from the expansion's to the artifact's.
    fn add(&mut self, shape: &str, units: Vec<crate::variants::Unit>, graphs: &mut Vec<Graph>) {
        let offset = graphs.len();
        let global = |role: Role| match role {
            Role::Model { guards } => Role::Model {
                guards: shifted(guards, offset),
            },
            Role::Refused { guards, reason } => Role::Refused {
                guards: shifted(guards, offset),
                reason,
            },
            condition => condition,
        };
        let join = |label: &str| match shape.is_empty() {
            true => label.to_string(),
            false => format!("{shape}, {label}"),
        };
        for unit in units {
            match unit {
                crate::variants::Unit::Compiled { label, graph, role } => {
                    graphs.push(graph);
                    self.roles.push(global(role));
                    self.labels.push(join(&label));
                }
                crate::variants::Unit::Refused { label, role } => {
                    self.refused.push((join(&label), offset, global(role)));
                }
            }
        }
    }
}

fn shifted(guards: Vec<kiln_format::Guard>, offset: usize) -> Vec<kiln_format::Guard> {
    (guards.into_iter())
        .map(|g| kiln_format::Guard {
            condition: g.condition + offset as u32,
            ..g
        })
        .collect()
}

/// The passes and code generation of `graph`, imported from the ONNX bytes
/// `source` (whose hash the artifact records).
pub(crate) fn compile_imported(
    source: &[u8],
    graph: Graph,
    import_time: Duration,
    opts: &CompileOptions,
    progress: &dyn Progress,
) -> Result<Compiled, DriverError> {
    compile_optimized(graph, import_time, opts, progress, || {
        Sha256::digest(source).into()
    })
}

/// The passes and code generation of an imported `graph` whose source's
/// SHA-256 `source_sha256` gives (when the code is generated).
fn compile_optimized(
    graph: Graph,
    import_time: Duration,
    opts: &CompileOptions,
    progress: &dyn Progress,
    source_sha256: impl FnOnce() -> [u8; 32],
) -> Result<Compiled, DriverError> {
    let optimized = optimize_graph(graph, import_time, opts, progress)?;
    stage(progress, "generating code", || {
        generate_all(
            source_sha256(),
            vec![optimized],
            Variants {
                roles: vec![Role::SHAPES],
                ..Variants::default()
            },
            Vec::new(),
            opts,
        )
    })
}

/// Code generation and serialization of optimized graphs, one per profile
/// (`variants` names them (no names for one) and gives their roles and
/// the refused paths after them), compiled from ONNX bytes whose
/// SHA-256 is `source_sha256`. The first profile's report, dumps and precision outcome are
/// the compilation's; the golden self-test is the one profile's that has
/// it.
fn generate_all(
    source_sha256: [u8; 32],
    optimized: Vec<Optimized>,
    variants: Variants,
    padding: Vec<kiln_format::PaddableDim>,
    opts: &CompileOptions,
) -> Result<Compiled, DriverError> {
    let start = Instant::now();
    let graphs: Vec<Graph> = optimized.iter().map(|o| o.graph.clone()).collect();
    let bounded: Vec<Vec<crate::bounded::Bounded>> =
        optimized.iter().map(|o| o.bounded.clone()).collect();
    let mut golden = kiln_format::Golden::default();
    let mut golden_fits = Vec::new();
    let mut first = None;
    for o in optimized {
        if !o.golden.sets.is_empty() {
            golden = o.golden.clone();
            golden_fits = o.golden_fits.clone();
        }
        first.get_or_insert(o);
    }
    let Optimized {
        graph,
        report,
        dumps,
        import_time,
        precision,
        coverage,
        ..
    } = first.expect("at least one profile");
    let info = ArtifactInfo {
        compiler_version: format!("kiln {}", env!("CARGO_PKG_VERSION")),
        options: opts.canonical(),
        source_sha256,
    };
    // Every computed value lives in the arena, so one larger than the arena
    // limit fails it anyway: refuse it before code generation, whose time
    // grows with the shapes it specializes on.
    for g in &graphs {
        for id in g.node_ids() {
            let node = g.node(id);
            let bytes = node.ty.checked_size_bytes().map_or(u64::MAX, |b| b as u64);
            if !matches!(node.op, kiln_ir::Op::Constant(_)) && bytes > opts.max_arena_bytes {
                return Err(DriverError::ArenaTooLarge {
                    arena_bytes: bytes,
                    limit: opts.max_arena_bytes,
                });
            }
        }
    }
    let graph_refs: Vec<&Graph> = graphs.iter().collect();
    let (mut artifact, Generated { ptx_kernels, ptxas }) =
        opts.target
            .backend()
            .generate(&graph_refs, opts.threads, info)?;
    artifact.golden = golden;
    artifact.padding = padding;
    for (profile, role) in artifact.profiles.iter_mut().zip(variants.roles) {
        profile.role = role;
    }
    for (profile, bounded) in artifact.profiles.iter_mut().zip(&bounded) {
        crate::bounded::attach(profile, bounded);
    }
    let mut labels = variants.labels;
    for (label, sibling, role) in variants.refused {
        let profile = kiln_format::Profile {
            outputs: Vec::new(),
            dense_kernels: Vec::new(),
            schedule: Vec::new(),
            role,
            bounded: Vec::new(),
            ..artifact.profiles[sibling].clone()
        };
        artifact.profiles.push(profile);
        labels.push(label);
    }
    if artifact.arena_size() > opts.max_arena_bytes {
        return Err(DriverError::ArenaTooLarge {
            arena_bytes: artifact.arena_size(),
            limit: opts.max_arena_bytes,
        });
    }
    let bytes = artifact.to_bytes();
    Ok(Compiled {
        artifact,
        bytes,
        graph,
        profiles: labels,
        report,
        dumps,
        precision,
        coverage,
        golden_fits,
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
