//! `kiln bench`: latency percentiles of an artifact over many runs and,
//! with `--profile`, the time of every schedule step.

use super::inputs::{model_inputs, session_threads, InputArgs};
use super::{exit, Failure};
use clap::Args;
use kiln_runtime::{Model, Session, Tensor};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub(super) struct BenchArgs {
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

pub(super) fn cmd_bench(a: BenchArgs) -> Result<(), Failure> {
    if a.runs == 0 {
        return Err(Failure::new(exit::USAGE, "--runs must be at least 1"));
    }
    let loading = Instant::now();
    let model = Model::load(&a.artifact)?;
    let load_ms = loading.elapsed().as_secs_f64() * 1e3;
    let inputs = model_inputs(&model, &a.inputs)?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let profile = &model.profiles()[model.profile_for(&views)?];
    // Output buffers of the run's shapes (cut back when the run pads).
    let mut outputs: Vec<Vec<u8>> = model.run(&views)?.into_iter().map(|t| t.data).collect();
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
    let step_times = match a.profile {
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
    let profile: Option<Vec<(&str, usize, f64)>> = step_times.map(|steps| {
        let mut rows: Vec<_> = (profile.schedule.iter())
            .zip(&steps)
            .map(|(step, t)| {
                let ms = t.as_secs_f64() * 1e3 / a.runs as f64;
                (step.node.as_str(), step.tasks as usize, ms)
            })
            .collect();
        rows.sort_by(|x, y| y.2.total_cmp(&x.2));
        rows
    });
    if a.json {
        let mut v = json!({"artifact": a.artifact.display().to_string(), "runs": a.runs, "warmup": a.warmup, "threads": threads,
               "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "mean_ms": mean, "min_ms": times[0], "runs_per_s": throughput,
               "load_ms": load_ms, "profiles": model.profiles().len()});
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
