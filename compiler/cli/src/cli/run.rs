//! `kiln run`: one run of an artifact on given or random inputs, its
//! outputs written as `.npy` and checked against references.

use super::inputs::{model_inputs, session_threads, InputArgs};
use super::{exit, Failure};
use clap::Args;
use kiln_driver::compare::{compare, Comparison};
use kiln_driver::npy;
use kiln_runtime::{DType, Model, PublicKey, Tensor, TensorRef};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args)]
pub(super) struct RunArgs {
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

/// One run: its outputs, its time, and the profile it ran where the
/// artifact had several or may pad.
struct Ran {
    outputs: Vec<Tensor>,
    latency: std::time::Duration,
    profile: Option<Picked>,
}

/// The profile a run picked: its index, the count, its input shapes, and
/// whether the inputs were padded to them.
struct Picked {
    index: usize,
    count: usize,
    shapes: String,
    padded: bool,
    /// The variant's path of run-time control flow, in words (empty when
    /// the shapes alone pick the profile).
    path: String,
}

impl Picked {
    fn of(model: &Model, inputs: &[TensorRef<'_>]) -> Result<Option<Picked>, Failure> {
        let count = model.profiles().len();
        if count == 1 && model.paddable_dims().is_empty() {
            return Ok(None);
        }
        let index = model.profile_for(inputs)?;
        let specs = &model.profiles()[index].inputs;
        let padded = (specs.iter().zip(inputs)).any(|(s, t)| s.shape != t.shape);
        let shapes = (specs.iter())
            .map(|s| format!("{}={}", s.name, s.type_string()))
            .collect::<Vec<_>>()
            .join(" ");
        let path =
            kiln_driver::report::describe_role(&model.profiles()[index].role, model.profiles());
        Ok(Some(Picked {
            index,
            count,
            shapes,
            padded,
            path,
        }))
    }
}

/// Loads `path` and runs it once: on the GPU for a CUDA artifact (with the
/// `cuda` feature), else with the CPU runtime (which refuses CUDA artifacts
/// with a clear error).
fn load_and_run(
    path: &Path,
    args: &InputArgs,
    public_key: Option<&Path>,
    threads: Option<usize>,
) -> Result<Ran, Failure> {
    #[cfg(feature = "cuda")]
    if is_cuda_artifact(path) {
        if public_key.is_some() {
            return Err(Failure::new(
                exit::USAGE,
                "--public-key is not supported for CUDA artifacts yet",
            ));
        }
        let mut model = kiln_runtime::cuda::CudaModel::load(path)?;
        let inputs = super::inputs::gather_inputs(&[model.inputs()], args)?;
        let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
        let start = Instant::now();
        let outputs = model.run(&views)?;
        return Ok(Ran {
            outputs,
            latency: start.elapsed(),
            profile: None,
        });
    }
    let model = match public_key {
        Some(key) => Model::load_verified(path, &PublicKey::from_pem_file(key)?)?,
        None => Model::load(path)?,
    };
    let inputs = model_inputs(&model, args)?;
    let views: Vec<_> = inputs.iter().map(Tensor::view).collect();
    let mut session = model.session_with_threads(session_threads(&model, threads))?;
    let start = Instant::now();
    let outputs = session.run(&views)?;
    let latency = start.elapsed();
    Ok(Ran {
        outputs,
        latency,
        profile: Picked::of(&model, &views)?,
    })
}

pub(super) fn cmd_run(a: RunArgs) -> Result<(), Failure> {
    let Ran {
        outputs,
        latency,
        profile,
    } = load_and_run(&a.artifact, &a.inputs, a.public_key.as_deref(), a.threads)?;
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
        let mut summary =
            json!({"outputs": outs, "latency_ms": latency.as_secs_f64() * 1e3, "checks": checks});
        if let Some(p) = &profile {
            summary["profile"] = json!(p.index);
            summary["padded"] = json!(p.padded);
            if !p.path.is_empty() {
                summary["path"] = json!(p.path);
            }
        }
        println!("{summary}");
    } else {
        for t in &outputs {
            println!("{}: {}{}", t.name, t.type_string(), preview(t));
        }
        for c in &checks {
            println!("check {}", check_line(c, a.tolerance));
        }
        if let Some(p) = &profile {
            let padded = match p.padded {
                true => ", the inputs padded with zeros and the outputs cut back",
                false => "",
            };
            let path = match p.path.is_empty() {
                true => String::new(),
                false => format!(", {}", p.path),
            };
            println!(
                "profile {} of {} ({}){padded}{path}",
                p.index, p.count, p.shapes
            );
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

/// `NAME: ok (max abs error ..., ... of output scale ...; tolerance ...)`,
/// or `NAME: FAILED (...)`: one compared output, for people.
pub(super) fn check_line(c: &Comparison, tolerance: f64) -> String {
    let verdict = if c.passes(tolerance) { "ok" } else { "FAILED" };
    match &c.mismatch {
        Some(m) => format!("{}: FAILED ({m})", c.name),
        None => format!(
            "{}: {verdict} (max abs error {:.3e}, {:.3e} of output scale {:.3e}; tolerance {:.1e})",
            c.name, c.max_abs_error, c.rel_error, c.scale, tolerance
        ),
    }
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
