//! The runtime under load: each compiled fixture model is loaded once and
//! run from several threads at once, every thread alternating between its
//! own `Session` (allocation-free `run_into`) and the shared `Model::run`
//! (which lends the model's cached arena or allocates a temporary one);
//! every output is compared with the first run (bitwise) and with the
//! onnxruntime reference (tolerance); the resident set size must not grow
//! once warmed up.
//!
//! `KILN_LOAD_RUNS=<n>` sets the total number of runs (default 10,000); see
//! `docs/robustness.md`.

use kiln_driver::compare::compare;
use kiln_runtime::{Model, Session, Tensor};
use kiln_tests::Fixture;
use std::sync::{Arc, Barrier};
use std::time::Instant;

const THREADS: usize = 4;
const TOLERANCE: f64 = 1e-4;
/// RSS growth allowed between the end of the warm-up and the end of the
/// runs.
const RSS_SLACK_BYTES: u64 = 4 << 20;

/// A compiled model with its batch-1 input and reference outputs.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    inputs: Vec<Tensor>,
    references: Vec<Tensor>,
    /// Share of the total runs.
    weight: usize,
}

/// The first `rows` rows of a tensor (batch slicing of references).
fn first_rows(t: &Tensor, rows: u64) -> Tensor {
    let per_row = t.data.len() as u64 / t.shape[0];
    let mut shape = t.shape.clone();
    shape[0] = rows;
    Tensor {
        name: t.name.clone(),
        dtype: t.dtype,
        shape,
        data: t.data[..(per_row * rows) as usize].to_vec(),
    }
}

fn case(name: &'static str, weight: usize) -> Case {
    let fixture = Fixture::load(name);
    let mut opts = fixture.compile_options();
    for dims in opts.import.input_shapes.values_mut() {
        dims[0] = 1;
    }
    let bytes = fixture.compile_with(&opts).unwrap();
    Case {
        name,
        bytes,
        inputs: fixture.inputs().iter().map(|t| first_rows(t, 1)).collect(),
        references: fixture
            .reference_outputs()
            .iter()
            .map(|t| first_rows(t, 1))
            .collect(),
        weight,
    }
}

/// Resident set size of this process, from `/proc/self/statm`.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("statm resident field");
    // 4 KiB pages (x86-64 Linux; on 64 KiB-page kernels this under-reports,
    // which only makes the growth check stricter in relative terms).
    pages * 4096
}

/// Compares one run's outputs with the first run (bitwise) and with the
/// onnxruntime reference (within `TOLERANCE`).
fn check_outputs(outputs: &[Tensor], case: &Case, first: &[Tensor]) -> Result<(), String> {
    if outputs != first {
        return Err("outputs differ bitwise from the first run".into());
    }
    for (o, r) in outputs.iter().zip(&case.references) {
        let c = compare(o, r);
        if !c.passes(TOLERANCE) {
            return Err(format!("output '{}' vs onnxruntime: {c:?}", o.name));
        }
    }
    Ok(())
}

/// One run through the shared `Model::run`.
fn run_shared(model: &Model, case: &Case, first: &[Tensor]) -> Result<(), String> {
    let views: Vec<_> = case.inputs.iter().map(Tensor::view).collect();
    let outputs = model.run(&views).map_err(|e| format!("Model::run: {e}"))?;
    check_outputs(&outputs, case, first)
}

/// One allocation-free run in `session`, into `buffers` (one per output).
fn run_session(
    session: &mut Session,
    buffers: &mut [Vec<u8>],
    case: &Case,
    first: &[Tensor],
) -> Result<(), String> {
    let views: Vec<_> = case.inputs.iter().map(Tensor::view).collect();
    let mut outs: Vec<&mut [u8]> = buffers.iter_mut().map(Vec::as_mut_slice).collect();
    session
        .run_into(&views, &mut outs)
        .map_err(|e| format!("Session::run_into: {e}"))?;
    let outputs: Vec<Tensor> = (session.outputs().iter().zip(buffers.iter()))
        .map(|(spec, data)| Tensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            shape: spec.shape.clone(),
            data: data.clone(),
        })
        .collect();
    check_outputs(&outputs, case, first)
}

#[test]
fn models_run_from_many_threads_with_stable_outputs_and_memory() {
    let total_runs: usize = std::env::var("KILN_LOAD_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    // The CNN classifier costs ~100x the MLP per run; weights give each
    // its share of the runs.
    let cases = [case("digits_mlp", 24), case("ppocr_cls", 1)];
    let weight_sum: usize = cases.iter().map(|c| c.weight).sum();

    // The first run of each model, on its own instance: the bitwise
    // reference for every later run.
    let firsts: Vec<Vec<Tensor>> = cases
        .iter()
        .map(|c| {
            let m = Model::from_bytes(&c.bytes).unwrap();
            let views: Vec<_> = c.inputs.iter().map(Tensor::view).collect();
            let out = m.run(&views).unwrap();
            for (o, r) in out.iter().zip(&c.references) {
                let cmp = compare(o, r);
                assert!(cmp.passes(TOLERANCE), "{}: {cmp:?}", c.name);
            }
            out
        })
        .collect();
    // Each model is loaded once; every thread runs the same instance.
    let models: Vec<Arc<Model>> = cases
        .iter()
        .map(|c| Arc::new(Model::from_bytes(&c.bytes).unwrap()))
        .collect();

    let barrier = Barrier::new(THREADS + 1);
    let mut rss = (0, 0);
    let mut elapsed = 0.0;
    let runs_per_case: Vec<usize> = cases
        .iter()
        .map(|c| total_runs * c.weight / weight_sum)
        .collect();
    let done_runs: usize = runs_per_case.iter().sum::<usize>() / THREADS * THREADS;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let (cases, firsts, barrier, runs_per_case) =
                (&cases, &firsts, &barrier, &runs_per_case);
            let models: Vec<Arc<Model>> = models.iter().map(Arc::clone).collect();
            handles.push(s.spawn(move || -> Result<(), String> {
                let mut sessions: Vec<Session> =
                    models.iter().map(|m| m.session().unwrap()).collect();
                let mut buffers: Vec<Vec<Vec<u8>>> = (models.iter())
                    .map(|m| {
                        (m.outputs().iter())
                            .map(|o| vec![0; o.byte_len() as usize])
                            .collect()
                    })
                    .collect();
                // Warm-up: every path once, so allocator arenas and output
                // buffers exist before the baseline.
                let mut step = |i: usize, k: usize| -> Result<(), String> {
                    let result = if i.is_multiple_of(2) {
                        run_session(&mut sessions[k], &mut buffers[k], &cases[k], &firsts[k])
                    } else {
                        run_shared(&models[k], &cases[k], &firsts[k])
                    };
                    result.map_err(|e| format!("thread {t}, {} run {i}: {e}", cases[k].name))
                };
                let mut warm = Ok(());
                for k in 0..cases.len() {
                    for i in 0..4 {
                        warm = warm.and(step(i, k));
                    }
                }
                barrier.wait(); // warm-up done
                barrier.wait(); // baseline measured
                let mut result = warm;
                // Interleave the models so both run concurrently.
                let per_thread: Vec<usize> = runs_per_case.iter().map(|n| n / THREADS).collect();
                let longest = per_thread.iter().copied().max().unwrap_or(0);
                for i in 0..longest {
                    for (k, &n) in per_thread.iter().enumerate() {
                        // Spread model k's n runs over the `longest` steps.
                        if i * n / longest != (i + 1) * n / longest && result.is_ok() {
                            result = step(i + t, k);
                        }
                    }
                }
                barrier.wait(); // runs done
                barrier.wait(); // final RSS measured
                result
            }));
        }
        barrier.wait();
        rss.0 = rss_bytes();
        let start = Instant::now();
        barrier.wait();
        barrier.wait();
        elapsed = start.elapsed().as_secs_f64();
        rss.1 = rss_bytes();
        barrier.wait();
        let errors: Vec<String> = handles
            .into_iter()
            .filter_map(|h| h.join().expect("worker does not panic").err())
            .collect();
        assert!(errors.is_empty(), "{}", errors.join("\n"));
    });
    let growth = rss.1 as i64 - rss.0 as i64;
    println!(
        "{done_runs} runs ({}) on {THREADS} threads in {elapsed:.2} s ({:.0} runs/s); \
         RSS {:.1} MiB after warm-up, {:.1} MiB after the runs ({:+.2} MiB)",
        cases
            .iter()
            .zip(&runs_per_case)
            .map(|(c, n)| format!("{} {}", c.name, n / THREADS * THREADS))
            .collect::<Vec<_>>()
            .join(", "),
        done_runs as f64 / elapsed,
        rss.0 as f64 / (1 << 20) as f64,
        rss.1 as f64 / (1 << 20) as f64,
        growth as f64 / (1 << 20) as f64,
    );
    assert!(
        done_runs >= total_runs * 99 / 100,
        "only {done_runs} of {total_runs} runs were scheduled"
    );
    assert!(
        growth <= RSS_SLACK_BYTES as i64,
        "RSS grew by {growth} bytes over the runs (allowed {RSS_SLACK_BYTES})"
    );
}

/// `Model` is `Send + Sync` (shared by `Arc`, all methods take `&self`);
/// a `Session` is `Send`, so each thread can own one (checked by the
/// compiler).
#[test]
fn model_is_send_and_sync_and_sessions_are_send() {
    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<Model>();
    assert_send_sync::<Arc<Model>>();
    assert_send::<Session>();
}
