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

use std::time::Instant;

use kiln::compare::compare;
use kiln_runtime::cuda::CudaModel;
use kiln_runtime::{Tensor, TensorRef};
use kiln_target_cuda::{SmArch, SUPPORTED_SMS};
use kiln_tests::Fixture;

struct Args {
    sm: Option<u32>,
    runs: usize,
    precision: kiln_passes::Mode,
    tolerance: f64,
    names: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        sm: None,
        runs: 20,
        precision: kiln_passes::Mode::Fp32,
        tolerance: f64::NAN,
        names: Vec::new(),
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

/// Outcome of one model: per-output (name, max abs error, rel error,
/// passed), the p50 latency with one launch per kernel and the p50 when
/// replaying a captured CUDA graph.
type Checked = (Vec<(String, f64, f64, bool)>, f64, f64);

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
    opts.cuda = Some(sm);
    opts.precision = kiln_passes::Policy {
        mode: args.precision,
        ..kiln_passes::Policy::default()
    };
    opts.calibrate_random = 0;
    let bytes = fixture.compile_with(&opts)?;
    let mut model = CudaModel::from_bytes(&bytes).map_err(|e| format!("load: {e}"))?;
    let inputs = fixture.inputs();
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
        .map(|(o, r)| {
            let c = compare(o, r);
            let passed = c.passes(args.tolerance);
            let name = match &c.mismatch {
                Some(m) => format!("{} ({m})", c.name),
                None => c.name.clone(),
            };
            (name, c.max_abs_error, c.rel_error, passed)
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
    // The real models too, when fetched (fixtures/make_real.py).
    if args.names.is_empty() {
        if let Some(root) = kiln_tests::real_models_root() {
            for name in kiln_tests::REAL_MODELS {
                fixtures.push((name.to_string(), Fixture::load_dir(&root.join(name))));
            }
        }
    }
    println!(
        "{:<44} {:>12} {:>12} {:>10} {:>10}  verdict",
        "model:output", "max abs err", "rel err", "p50 ms", "graph p50"
    );
    let mut failures = Vec::new();
    let mut outputs = 0;
    let start = Instant::now();
    for (name, fixture) in &fixtures {
        match check(fixture, sm, &args) {
            Ok((results, p50, graph_p50)) => {
                for (out, abs, rel, passed) in results {
                    outputs += 1;
                    let verdict = if passed { "ok" } else { "FAILED" };
                    println!(
                        "{:<44} {abs:>12.3e} {rel:>12.3e} {p50:>10.3} {graph_p50:>10.3}  {verdict}",
                        format!("{name}:{out}")
                    );
                    if !passed {
                        failures.push(format!("{name}:{out}: rel error {rel:.3e}"));
                    }
                }
            }
            Err(e) => {
                println!(
                    "{name:<44} {:>12} {:>12} {:>10} {:>10}  ERROR {e}",
                    "-", "-", "-", "-"
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
