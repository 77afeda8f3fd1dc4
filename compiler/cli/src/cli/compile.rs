//! `kiln compile`: flags into [`driver::CompileOptions`], the driver's compile,
//! then the outputs the flags ask for (artifact, signature, IR and PTX
//! dumps, precision report and plan) and the summary for people or the
//! `--json` report; `--check` (preflight) and `--verify-reproducible`.

use super::options::{compile_options, ModelArgs};
use super::{exit, write_file, Failure};
use clap::{Args, CommandFactory};
use kiln_driver::report::{
    dense_kernels_json, generic_dense_warnings, hex, kernel_count, largest_abs, memory_json,
    min_max, precision_json, specs_json,
};
use kiln_driver::{self as driver, signing, DriverError, DumpIr, GoldenInputs, Smooth, Target};
use kiln_format as format;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub(super) struct CompileArgs {
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
    #[arg(long, value_name = "N", value_parser = at_least_one)]
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
    #[arg(long, value_name = "WHICH", value_parser = clap::value_parser!(DumpIr))]
    dump_ir: Option<DumpIr>,
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
    /// Static int8 builds: held-out samples (like --calibrate's) on which
    /// to report how well the calibrated activation ranges cover them: per
    /// int8 layer the share of values clipped and the largest overshoot,
    /// per output the int8 build against fp32 (rel. L2, cosine, argmax
    /// agreement).
    #[arg(long, value_name = "DIR")]
    validate: Option<PathBuf>,
    /// With --validate: warn about a layer whose clipped share is over this
    /// many percent of its activation values.
    #[arg(long, value_name = "PERCENT", default_value_t = 0.1, value_parser = non_negative, requires = "validate")]
    coverage_warn: f64,
    /// Error-driven fallback: while a graph output's relative L2 error on
    /// the calibration samples exceeds E, raise the reduced-precision layer
    /// with the largest error to fp32 (listed in the report).
    #[arg(long, value_name = "E", value_parser = non_negative)]
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
    #[arg(long, value_name = "ALPHA|off", value_parser = clap::value_parser!(Smooth))]
    smooth: Option<Smooth>,
    /// Store a golden self-test in the artifact: the input sets of FILE.npz
    /// (one set) or DIR (one .npz per set; an array per model input, its
    /// name, dtype and shape), with the outputs the source model gives for
    /// them. `kiln verify ARTIFACT` checks them on the machine at hand.
    #[arg(long, value_name = "FILE.npz|DIR", group = "golden_sets")]
    golden: Option<PathBuf>,
    /// Store a golden self-test whose input sets are the first N
    /// calibration samples (--calibrate DIR, in name order), instead of
    /// --golden's.
    #[arg(long, value_name = "N", value_parser = at_least_one, group = "golden_sets")]
    golden_from_calibration: Option<usize>,
    /// The self-test's tolerance for every output: the largest error
    /// relative to the output's scale. Default by the build's precision:
    /// fp32 1e-4, fp16 1e-2, bf16 5e-2, int8 0.15.
    #[arg(long, value_name = "T", value_parser = non_negative, requires = "golden_sets")]
    golden_tolerance: Option<f64>,
    /// Keep these values as extra outputs after the model's own: `all`, or
    /// comma-separated ONNX tensor-name globs (`/encoder/layer.0/*`). No
    /// pass fuses a kept value away or lets another value reuse its
    /// memory; the options recorded in the artifact say which were kept.
    #[arg(long, value_name = "all|GLOB", value_parser = clap::value_parser!(kiln_onnx::KeepValues))]
    keep_values: Option<kiln_onnx::KeepValues>,
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
    /// The flags as given (`kiln` only, not the Python binding): what
    /// `--verify-reproducible` repeats.
    #[arg(skip)]
    pub(super) given: Option<clap::ArgMatches>,
}

/// `--threads N`: at least 1.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a number")),
    }
}

/// `--max-rel-error E`: a finite E ≥ 0.
fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(e) if e.is_finite() && e >= 0.0 => Ok(e),
        _ => Err(format!("'{s}' is not a non-negative number")),
    }
}

/// `kiln compile --check`: everything that blocks a compile, at once.
pub(super) fn cmd_preflight(a: &CompileArgs, opts: &driver::CompileOptions) -> Result<(), Failure> {
    let at_model = |e: kiln_onnx::OnnxError| {
        let f = Failure::from(DriverError::from(e));
        Failure::new(f.code, format!("{}: {}", a.model.display(), f.message))
    };
    let model = kiln_onnx::load_model(&a.model).map_err(at_model)?;
    // Profiles bind their dims one combination at a time: the first stands
    // for all (the dims are the same, only their values differ).
    let imports = opts.profiles.imports(&opts.import_on_paths())?;
    let report = kiln_onnx::preflight(&model, kiln_onnx::model_dir(&a.model), &imports[0].1)
        .map_err(at_model)?;
    let weights = kiln_onnx::summarize(&model).initializer_bytes;
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
            json!({"model": a.model.display().to_string(), "ok": report.is_clear(), "unsupported": ops, "unbound_dims": dims, "profiles": imports.len(), "weights_bytes_estimate": weights})
        );
    } else if report.is_clear() {
        println!(
            "{}: every op is supported and every input dim is bound",
            a.model.display()
        );
        println!(
            "  {} profile(s); weights about {weights} B, stored once for all of them, plus code and schedule per profile",
            imports.len()
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
        let mut names: Vec<&str> = Vec::new();
        for n in report
            .unbound_dims
            .iter()
            .filter_map(|(_, _, n)| n.as_deref())
        {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        if !names.is_empty() {
            let line: Vec<String> = (names.iter())
                .map(|n| format!("--dim {n}={}", kiln_onnx::suggested_dim(n)))
                .collect();
            println!("e.g.: {}", line.join(" "));
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
pub(super) fn print_pass_times(
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

pub(super) fn cmd_compile(a: CompileArgs) -> Result<(), Failure> {
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
    let super::Command::Compile(mut a) = super::parse_subcommand("compile", args)? else {
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
pub(super) fn compile_and_report(a: &CompileArgs) -> Result<Option<Value>, Failure> {
    let mut opts = compile_options(&a.model_args, a.target)?;
    opts.threads = a.threads.unwrap_or(opts.target.default_threads());
    opts.dump_ir = a.dump_ir.clone().unwrap_or_default();
    opts.calibrate_random = a.calibrate_random;
    opts.calibrate = a.calibrate.clone();
    opts.max_rel_error = a.max_rel_error;
    opts.bias_correction = !a.no_bias_correction;
    opts.smooth = a.smooth.unwrap_or_default();
    opts.golden = match (&a.golden, a.golden_from_calibration) {
        (Some(path), _) => Some(GoldenInputs::Path(path.clone())),
        (None, Some(sets)) => Some(GoldenInputs::Calibration { sets }),
        (None, None) => None,
    };
    if let Some(keep) = &a.keep_values {
        opts.import.keep_values = keep.clone();
    }
    opts.validate = a.validate.clone();
    opts.coverage_warn = a.coverage_warn / 100.0;
    opts.golden_tolerance = a.golden_tolerance;
    if let Some(path) = &a.plan {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", path.display())))?;
        let plan = kiln_passes::PrecisionPlan::parse(&text)
            .map_err(|e| Failure::new(exit::USAGE, format!("--plan {}: {e}", path.display())))?;
        opts.precision.plan = Some(plan);
    }
    opts.validate()?;
    if a.check {
        return cmd_preflight(a, &opts).map(|()| None);
    }
    // What only this command's outputs need.
    if a.dump_ptx.is_some() && opts.target.cuda().is_none() {
        return Err(Failure::new(
            exit::USAGE,
            "--dump-ptx needs a CUDA target (--target cuda-sm80, ...)",
        ));
    }
    if a.emit_plan.is_some() && opts.precision.is_identity() {
        return Err(Failure::new(
            exit::USAGE,
            "--emit-plan needs a reduced --precision (or --force / --plan)",
        ));
    }
    let output = a
        .output
        .clone()
        .expect("clap requires --output without --check");
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
            let coverage = out.coverage.as_ref().map(|v| (v, opts.coverage_warn));
            driver::report_html::precision_html(&a.model.display().to_string(), outcome, coverage)
        } else {
            serde_json::to_string_pretty(p).expect("JSON values serialize")
        };
        write_file(path, text.as_bytes())?;
    }
    if let (Some(path), Some(p)) = (&a.emit_plan, &out.precision) {
        write_file(path, p.plan.to_json().as_bytes())?;
    }
    let meta = &out.artifact.metadata;
    let first = &out.artifact.profiles[0];
    for line in generic_dense_warnings(&out.artifact) {
        eprintln!("{line}");
    }
    if let Some(v) = &out.coverage {
        for line in driver::report::coverage_warnings(v, opts.coverage_warn) {
            eprintln!("{line}");
        }
    }
    if a.json {
        let memory = memory_json(opts.target, &out.graph)?;
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
                "arena_bytes": out.artifact.arena_size(),
                "memory": memory,
                "inputs": specs_json(&first.inputs),
                "outputs": specs_json(&first.outputs),
                "profiles": profiles_json(&out),
                "padding": driver::report::padding_json(&out.artifact.padding),
                "bounded": driver::report::bounded_json(first),
                "passes": passes,
                "import_ms": out.import_time.as_secs_f64() * 1e3,
                "codegen_ms": out.codegen_time.as_secs_f64() * 1e3,
                "compile_ms": elapsed.as_secs_f64() * 1e3,
                "content_sha256": hex(&content_hash),
                "reproducible": reproducible.is_some().then_some(true),
                "signature": signature_path.as_ref().map(|p| p.display().to_string()),
                "precision": precision_json,
                "dense_kernels": dense_kernels_json(&first.dense_kernels),
                "golden": driver::report::golden_json(&out.artifact.golden),
                "golden_inputs": driver::golden::describe(&opts),
                "golden_fits": driver::report::golden_fits_json(&out.golden_fits),
                "coverage": out.coverage.as_ref().map(|v| driver::report::coverage_json(v, opts.coverage_warn)),
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
        out.artifact.arena_size(),
        elapsed.as_secs_f64() * 1e3
    );
    let profiles = &out.artifact.profiles;
    if profiles.iter().any(|p| p.role != format::Role::SHAPES) {
        // Run-time control flow: a line per path.
        let count = |f: fn(&format::Role) -> bool| profiles.iter().filter(|p| f(&p.role)).count();
        println!(
            "  {} profiles for the model's run-time control flow ({} variants, {} condition programs, {} refused paths), one weights section:",
            profiles.len(),
            count(|r| matches!(r, format::Role::Model { .. })),
            count(|r| matches!(r, format::Role::Condition { .. })),
            count(|r| matches!(r, format::Role::Refused { .. })),
        );
        for (i, (label, p)) in out.profiles.iter().zip(profiles).enumerate() {
            match &p.role {
                format::Role::Model { .. } => println!("    #{i:<3} {label}"),
                format::Role::Refused { reason, .. } => {
                    println!("    #{i:<3} {label}: refused");
                    eprintln!("warning: runs that take this path are refused ({label}): {reason}");
                }
                format::Role::Condition { .. } => {}
            }
        }
    } else if !out.profiles.is_empty() {
        println!(
            "  {} profiles ({}), one weights section",
            out.profiles.len(),
            out.profiles.join("; ")
        );
    }
    for d in &out.artifact.padding {
        println!(
            "  runs may pad {} up to the next profile: its padded positions never reach the real ones",
            d.name
        );
    }
    let int8 = (out.precision.iter().flat_map(|p| &p.decisions))
        .any(|d| d.precision == kiln_passes::Precision::Int8);
    if int8 && !out.artifact.padding.is_empty() {
        println!(
            "  note: int8 layers measure their activation range per run over the whole tensor, padded positions included: a padded run's outputs are as close to the fp32 model as an exact int8 run's, not equal to them"
        );
    }
    if let Some(p) = &out.precision {
        print_precision(p);
    }
    if let Some(v) = &out.coverage {
        for line in driver::report::coverage_summary(v) {
            println!("{line}");
        }
    }
    if let Some(line) = driver::report::golden_summary(&out.artifact.golden) {
        let from = driver::golden::describe(&opts).unwrap_or_default();
        println!("{line}; its inputs: {from}");
    }
    for line in driver::report::golden_fit_lines(&out.golden_fits) {
        println!("{line}");
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
pub(super) struct Bars {
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
pub(super) fn verify_reproducible(a: &CompileArgs, bytes: &[u8]) -> Result<String, Failure> {
    let internal = |m: String| Failure::new(exit::INTERNAL, format!("--verify-reproducible: {m}"));
    let exe = std::env::current_exe().map_err(|e| internal(format!("current executable: {e}")))?;
    let model = std::path::absolute(&a.model)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", a.model.display())))?;
    let flags = given_flags(a)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("kiln-repro-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(exit::IO, format!("{}: {e}", dir.display())))?;
    let second = dir.join("second.kiln");
    let mut args: Vec<std::ffi::OsString> = vec!["compile".into(), model.into()];
    args.extend(flags);
    args.extend(["-o".into(), second.clone().into()]);
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

/// Flags of `kiln compile` that say only where results go or what is
/// printed: the second build of `--verify-reproducible` leaves them out.
/// Every other flag the user gave is repeated, so a new flag that decides
/// the artifact takes part without a change here.
const OUTPUT_ONLY: [&str; 12] = [
    "model",
    "output",
    "check",
    "verify_reproducible",
    "sign",
    "dump_ptx",
    "dump_ir",
    "dump_dir",
    "emit_plan",
    "report",
    "json",
    "time_passes",
];

/// Flags whose values are paths (`--bind-input`'s after `NAME=`): made
/// absolute, as the second build runs in another working directory.
const PATH_VALUED: [&str; 5] = ["calibrate", "plan", "bind_inputs", "golden", "validate"];

/// The flags given on the command line (not defaults) that decide the
/// artifact, as `--long=VALUE` words (`-OVALUE` for a flag with no long
/// name), paths made absolute.
fn given_flags(a: &CompileArgs) -> Result<Vec<std::ffi::OsString>, Failure> {
    let Some(given) = &a.given else {
        return Err(Failure::new(
            exit::USAGE,
            "--verify-reproducible runs only from the kiln command",
        ));
    };
    let command = super::Cli::command();
    let compile = command
        .find_subcommand("compile")
        .expect("kiln has a compile subcommand");
    let mut words = Vec::new();
    for arg in compile.get_arguments() {
        let id = arg.get_id().as_str();
        if OUTPUT_ONLY.contains(&id)
            || given.value_source(id) != Some(clap::parser::ValueSource::CommandLine)
        {
            continue;
        }
        let flag = match (arg.get_long(), arg.get_short()) {
            (Some(long), _) => format!("--{long}"),
            (None, Some(short)) => format!("-{short}"),
            (None, None) => continue,
        };
        let separator = if arg.get_long().is_some() { "=" } else { "" };
        if !arg.get_action().takes_values() {
            words.push(flag.into());
            continue;
        }
        for value in given.get_raw(id).into_iter().flatten() {
            let value = if PATH_VALUED.contains(&id) {
                absolute_path_value(value, id == "bind_inputs")?
            } else {
                value.to_os_string()
            };
            let mut word = std::ffi::OsString::from(format!("{flag}{separator}"));
            word.push(value);
            words.push(word);
        }
    }
    Ok(words)
}

/// A path value made absolute (after its `NAME=` when `named`).
fn absolute_path_value(
    value: &std::ffi::OsStr,
    named: bool,
) -> Result<std::ffi::OsString, Failure> {
    let text = value.to_string_lossy();
    let (prefix, path) = match named {
        true => {
            let (name, path) =
                super::options::name_value(&text).map_err(|e| Failure::new(exit::USAGE, e))?;
            (format!("{name}="), path)
        }
        false => (String::new(), &*text),
    };
    let absolute =
        std::path::absolute(path).map_err(|e| Failure::new(exit::IO, format!("{path}: {e}")))?;
    let mut word = std::ffi::OsString::from(prefix);
    word.push(absolute);
    Ok(word)
}

/// The human summary of a reduced-precision build.
pub(super) fn print_precision(p: &driver::PrecisionOutcome) {
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

/// Each profile's bindings, input shapes and arena (empty for one).
fn profiles_json(out: &driver::Compiled) -> Value {
    let list: Vec<Value> = (out.profiles.iter().zip(&out.artifact.profiles))
        .map(|(label, p)| {
            json!({"bindings": label, "inputs": specs_json(&p.inputs), "outputs": specs_json(&p.outputs), "arena_bytes": p.arena_size, "role": driver::report::role_json(&p.role)})
        })
        .collect();
    json!(list)
}
