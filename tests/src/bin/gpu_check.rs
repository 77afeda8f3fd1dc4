//! Runs every fixture model (or the ones named) on GPU 0 through the CUDA
//! target and the runtime's `cuda` feature, and compares the outputs with
//! the committed onnxruntime references. Driven by `tests/gpu/run.sh`.
//!
//! ```text
//! gpu_check [--sm 90] [--runs 20] [--precision bf16] [--tolerance 1e-4] [FIXTURE...]
//! ```
//!
//! `--precision bf16|fp16|mixed|int8` builds every model in that
//! precision (`docs/precision.md`; bf16 MatMul/Gemm and int8 MatMul with
//! constant weights run on `mma.sync` from sm_80) and compares with the
//! same fp32 references at a looser default tolerance: 5e-2 for bf16 and
//! mixed, 1e-2 for fp16, 1.5e-1 for int8 (1e-4 for fp32).
//!
//! The target SM defaults to the newest one Kiln supports that GPU 0 can
//! run. Prints one line per model output (max abs error, error relative to
//! the output's scale, p50 latency of `runs` inferences after 3 warm-ups,
//! then the p50 again replaying a captured CUDA graph, whose outputs must
//! equal the launched kernels' bit for bit) and a summary; exits 1 when an output misses the tolerance or a model
//! fails to compile, load or run.
//!
//! A build in another precision also runs on the CPU target from the same
//! options: an output passes when it is within the tolerance of the fp32
//! reference or no more than 1.25 times as far from it as the CPU build's
//! (the precision's loss belongs to the build, which `tests/precision.rs`
//! measures on real data; what this checks is that the GPU adds none).
//!
//! ```text
//! gpu_check --conformance NODE_DIR [--shard I/N] [--results FILE] [--skip FILE]
//! ```
//!
//! runs the ONNX node conformance cases the CPU target passes
//! (`tests/conformance/passing.txt`, from the generated `NODE_DIR`) on the
//! GPU with their reference data, as `tests/conformance.rs` does on the CPU
//! (`kiln_tests::conformance`), printing each case that does not pass and
//! writing `case outcome` lines to FILE; exits 1 on a wrong answer or crash
//! (a case refused with a typed "no CUDA lowering" error is `unsupported`).
//! `--skip` takes an earlier run's results file and runs only the cases it
//! lacks.

use std::path::PathBuf;
use std::time::Instant;

use kiln_driver::compare::compare;
use kiln_driver::CompileOptions;
use kiln_runtime::cuda::CudaModel;
use kiln_runtime::{Tensor, TensorRef};
use kiln_target_cuda::{SmArch, SUPPORTED_SMS};
use kiln_tests::conformance::{run_case, Backend};
use kiln_tests::Fixture;

struct Args {
    sm: Option<u32>,
    runs: usize,
    precision: kiln_passes::Mode,
    tolerance: f64,
    names: Vec<String>,
    /// The generated `node/` directory of the conformance cases.
    conformance: Option<PathBuf>,
    /// This process's share of the cases: `(index, count)`.
    shard: (usize, usize),
    results: Option<PathBuf>,
    /// A results file of an earlier run: its cases are not run again.
    skip: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        sm: None,
        runs: 20,
        precision: kiln_passes::Mode::Fp32,
        tolerance: f64::NAN,
        names: Vec::new(),
        conformance: None,
        shard: (0, 1),
        results: None,
        skip: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| it.next().ok_or(format!("{flag} needs a value"));
        match a.as_str() {
            "--sm" => {
                let v = value("--sm")?;
                args.sm = Some(SmArch::parse(&v).map_err(|e| e.to_string())?.sm);
            }
            "--runs" => {
                args.runs = value("--runs")?
                    .parse()
                    .map_err(|_| "--runs expects a number")?
            }
            "--precision" => {
                args.precision = value("--precision")?
                    .parse()
                    .map_err(|e: kiln_passes::PolicyError| e.to_string())?
            }
            "--tolerance" => {
                args.tolerance = value("--tolerance")?
                    .parse()
                    .map_err(|_| "--tolerance expects a number")?
            }
            "--conformance" => args.conformance = Some(value("--conformance")?.into()),
            "--results" => args.results = Some(value("--results")?.into()),
            "--skip" => args.skip = Some(value("--skip")?.into()),
            "--shard" => {
                let v = value("--shard")?;
                args.shard = v
                    .split_once('/')
                    .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)))
                    .filter(|&(i, n)| i < n)
                    .ok_or(format!("--shard expects I/N with I < N, got {v}"))?;
            }
            s if s.starts_with("--") => return Err(format!("unknown flag {s}")),
            name => args.names.push(name.to_string()),
        }
    }
    args.runs = args.runs.max(1);
    if args.tolerance.is_nan() {
        args.tolerance = match args.precision {
            kiln_passes::Mode::Fp32 => 1e-4,
            kiln_passes::Mode::Fp16 => 1e-2,
            kiln_passes::Mode::Int8 => 1.5e-1,
            _ => 5e-2,
        };
    }
    Ok(args)
}

/// One output of one model.
struct OutputCheck {
    name: String,
    max_abs_error: f64,
    rel_error: f64,
    /// The CPU build's error relative to the output's scale (builds in
    /// another precision than fp32).
    cpu_rel_error: Option<f64>,
    passed: bool,
}

/// Outcome of one model: its outputs, the p50 latency with one launch per
/// kernel and the p50 when replaying a captured CUDA graph.
type Checked = (Vec<OutputCheck>, f64, f64);

/// How far a GPU output may be from the reference, relative to the CPU
/// build of the same precision (accumulation order and rounding-level
/// flips differ between the targets).
const CPU_ERROR_SLACK: f64 = 1.25;

/// The GPU and the conformance cases.
struct Cuda {
    sm: SmArch,
}

impl Backend for Cuda {
    type Loaded = CudaModel;
    fn options(&self) -> CompileOptions {
        CompileOptions {
            target: kiln_driver::target::Target::Cuda(self.sm),
            ..CompileOptions::default()
        }
    }
    fn load(&self, artifact: &[u8]) -> Result<CudaModel, String> {
        CudaModel::from_bytes(artifact).map_err(|e| e.to_string())
    }
    fn run(&self, model: &mut CudaModel, inputs: &[TensorRef<'_>]) -> Result<Vec<Tensor>, String> {
        model.run(inputs).map_err(|e| e.to_string())
    }
}

/// The p50 of `runs` timed runs after 3 untimed ones.
fn p50(model: &mut CudaModel, views: &[TensorRef<'_>], runs: usize) -> Result<f64, String> {
    for _ in 0..3 {
        model.run(views).map_err(|e| format!("run: {e}"))?;
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        model.run(views).map_err(|e| format!("run: {e}"))?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn check(fixture: &Fixture, sm: SmArch, args: &Args) -> Result<Checked, String> {
    let mut opts = fixture.compile_options();
    opts.target = kiln_driver::target::Target::Cuda(sm);
    opts.precision = kiln_passes::Policy {
        mode: args.precision,
        ..kiln_passes::Policy::default()
    };
    opts.calibrate_random = 0;
    let bytes = fixture.compile_with(&opts)?;
    let mut model = CudaModel::from_bytes(&bytes).map_err(|e| format!("load: {e}"))?;
    let inputs = fixture.inputs();
    let cpu_outputs = if args.precision == kiln_passes::Mode::Fp32 {
        None
    } else {
        let cpu = fixture.compile_with(&CompileOptions { cuda: None, ..opts })?;
        Some(kiln_tests::run_artifact(&cpu, &inputs).map_err(|e| format!("CPU build: {e}"))?)
    };
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let outputs = model.run(&views).map_err(|e| format!("run: {e}"))?;
    let references = fixture.reference_outputs();
    if outputs.len() != references.len() {
        return Err(format!(
            "{} outputs, the reference has {}",
            outputs.len(),
            references.len()
        ));
    }
    let results = outputs
        .iter()
        .zip(&references)
        .enumerate()
        .map(|(i, (o, r))| {
            let c = compare(o, r);
            let cpu_rel_error = cpu_outputs
                .as_ref()
                .map(|cpu| compare(&cpu[i], r).rel_error);
            let passed = c.passes(args.tolerance)
                || (c.mismatch.is_none()
                    && cpu_rel_error.is_some_and(|cpu| c.rel_error <= CPU_ERROR_SLACK * cpu));
            OutputCheck {
                name: match &c.mismatch {
                    Some(m) => format!("{} ({m})", c.name),
                    None => c.name.clone(),
                },
                max_abs_error: c.max_abs_error,
                rel_error: c.rel_error,
                cpu_rel_error,
                passed,
            }
        })
        .collect();
    let plain = p50(&mut model, &views, args.runs)?;
    // The captured graph must replay exactly what the launches computed.
    model.capture_graph().map_err(|e| format!("capture: {e}"))?;
    let replayed = model.run(&views).map_err(|e| format!("graph run: {e}"))?;
    if replayed.iter().zip(&outputs).any(|(a, b)| a.data != b.data) {
        return Err("the CUDA graph replay differs from the kernel launches".into());
    }
    let graph = p50(&mut model, &views, args.runs)?;
    Ok((results, plain, graph))
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            std::process::exit(2);
        }
    };
    let (device_sm, device_name) = match kiln_runtime::cuda::gpu() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            std::process::exit(1);
        }
    };
    let target = args.sm.unwrap_or_else(|| {
        SUPPORTED_SMS
            .iter()
            .filter(|a| a.sm <= device_sm)
            .map(|a| a.sm)
            .max()
            .unwrap_or(SUPPORTED_SMS[0].sm)
    });
    let sm = SmArch::parse(&target.to_string()).expect("a supported SM");
    if let Some(dir) = &args.conformance {
        std::process::exit(conformance(dir, sm, &args));
    }
    println!(
        "GPU 0: {device_name} (sm_{device_sm}); compiling for sm_{} in {}; ptxas: {}",
        sm.sm,
        args.precision.name(),
        kiln_target_cuda::ptxas::find_ptxas()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none (the driver JIT-compiles the PTX)".into())
    );
    let mut fixtures: Vec<(String, Fixture)> = if args.names.is_empty() {
        Fixture::all_names()
            .into_iter()
            .map(|n| {
                let f = Fixture::load(&n);
                (n, f)
            })
            .collect()
    } else {
        args.names
            .iter()
            .map(|n| (n.clone(), Fixture::load(n)))
            .collect()
    };
    // The real models too, those fetched (fixtures/make_real.py) or copied
    // to the GPU machine (`KILN_REAL_MODELS`): a machine without a registry
    // may hold only some of them.
    if args.names.is_empty() {
        let root = std::env::var_os("KILN_REAL_MODELS")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| kiln_tests::repo_root().join("target/real-models"));
        for name in kiln_tests::REAL_MODELS {
            if root.join(name).join("meta.json").exists() {
                fixtures.push((name.to_string(), Fixture::load_dir(&root.join(name))));
            }
        }
    }
    println!(
        "{:<44} {:>12} {:>12} {:>12} {:>10} {:>10}  verdict",
        "model:output", "max abs err", "rel err", "CPU rel err", "p50 ms", "graph p50"
    );
    let mut failures = Vec::new();
    let mut outputs = 0;
    let start = Instant::now();
    for (name, fixture) in &fixtures {
        match check(fixture, sm, &args) {
            Ok((results, p50, graph_p50)) => {
                for out in results {
                    outputs += 1;
                    let verdict = if out.passed { "ok" } else { "FAILED" };
                    let cpu = out
                        .cpu_rel_error
                        .map_or("-".to_string(), |e| format!("{e:.3e}"));
                    println!(
                        "{:<44} {:>12.3e} {:>12.3e} {cpu:>12} {p50:>10.3} {graph_p50:>10.3}  {verdict}",
                        format!("{name}:{}", out.name),
                        out.max_abs_error,
                        out.rel_error,
                    );
                    if !out.passed {
                        failures.push(format!(
                            "{name}:{}: rel error {:.3e} (CPU build {cpu})",
                            out.name, out.rel_error
                        ));
                    }
                }
            }
            Err(e) => {
                println!(
                    "{name:<44} {:>12} {:>12} {:>12} {:>10} {:>10}  ERROR {e}",
                    "-", "-", "-", "-", "-"
                );
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    println!(
        "{} models, {outputs} outputs checked in {:.1} s; {} failure(s) (tolerance {:.1e} of the output scale)",
        fixtures.len(),
        start.elapsed().as_secs_f64(),
        failures.len(),
        args.tolerance
    );
    for f in &failures {
        println!("FAILED {f}");
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}

/// Runs this shard of the conformance cases the CPU target passes; the
/// exit status.
fn conformance(node_dir: &std::path::Path, sm: SmArch, args: &Args) -> i32 {
    let list = kiln_tests::repo_root().join("tests/conformance/passing.txt");
    let Ok(list) = std::fs::read_to_string(&list) else {
        eprintln!("gpu_check: cannot read {}", list.display());
        return 2;
    };
    let done = match &args.skip {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(String::from))
                .collect(),
            Err(e) => {
                eprintln!("gpu_check: --skip {}: {e}", path.display());
                return 2;
            }
        },
        None => std::collections::BTreeSet::new(),
    };
    let (shard, shards) = args.shard;
    let cases: Vec<&str> = list
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !done.contains(*l))
        .enumerate()
        .filter(|(i, _)| i % shards == shard)
        .map(|(_, c)| c)
        .collect();
    let backend = Cuda { sm };
    let start = Instant::now();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    // Written as the cases run, so a shard that dies or is stopped leaves
    // the outcomes it reached (the next case of the list is the one that
    // took it down).
    let mut results = match args.results.as_ref().map(std::fs::File::create).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("gpu_check: --results: {e}");
            return 2;
        }
    };
    for case in &cases {
        let dir = node_dir.join(case);
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&dir, &backend)));
        let (outcome, detail) = match result {
            Ok(v) => (
                v["outcome"].as_str().unwrap_or("crash").to_string(),
                v["detail"].as_str().unwrap_or("").to_string(),
            ),
            Err(e) => (
                "crash".to_string(),
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
            ),
        };
        if outcome != "pass" {
            let detail: String = detail.chars().take(400).collect();
            println!("{case}: {outcome}: {detail}");
        }
        if let Some(f) = results.as_mut() {
            use std::io::Write;
            if let Err(e) = writeln!(f, "{case} {outcome}") {
                eprintln!("gpu_check: --results: {e}");
                return 2;
            }
        }
        *counts.entry(outcome).or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(o, n)| format!("{n} {o}")).collect();
    println!(
        "conformance on sm_{} (shard {shard}/{shards}): {} cases in {:.1} s: {}",
        sm.sm,
        cases.len(),
        start.elapsed().as_secs_f64(),
        summary.join(", ")
    );
    i32::from(counts.contains_key("fail") || counts.contains_key("crash"))
}
