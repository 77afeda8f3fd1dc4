//! The inputs of `kiln run` and `kiln bench`: `.npy`/`.npz` files or
//! seeded random values, checked against the artifact's input specs; and
//! the threads of their session.

use super::options::name_and_path;
use super::{exit, Failure};
use clap::Args;
use kiln_driver::npy;
use kiln_runtime::{DType, Model, Tensor, TensorSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Clone)]
pub(super) struct InputArgs {
    /// An input: NAME=file.npy (repeatable).
    #[arg(long = "input", value_name = "NAME=FILE", value_parser = name_and_path)]
    inputs: Vec<(String, PathBuf)>,
    /// An .npz file whose array names are input names.
    #[arg(long)]
    inputs_npz: Option<PathBuf>,
    /// Fill every input not given with deterministic random values.
    #[arg(long)]
    random: bool,
    /// Seed for --random.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The shape of a random input (NAME=2x16, repeatable), which picks
    /// the artifact's profile of that shape; by default random inputs take
    /// the first profile's shapes (or those that fit the inputs given).
    #[arg(long = "shape", value_name = "NAME=DIMS", value_parser = super::options::input_shape_u64)]
    shapes: Vec<(String, Vec<u64>)>,
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

/// The inputs `args` give (files, or random values) for a model whose
/// inputs have the shapes of one of `candidates` (an artifact's profiles;
/// all have the same names and dtypes). Random inputs take the shapes of
/// the first candidate that fits the files given and the `--shape`s; with
/// several candidates and none that fits, the error lists them.
pub(super) fn gather_inputs(
    candidates: &[&[TensorSpec]],
    args: &InputArgs,
) -> Result<Vec<Tensor>, Failure> {
    gather_inputs_padded(candidates, false, args)
}

/// [`gather_inputs`] for a model that may pad (`paddable`): shapes that no
/// candidate has exactly are left for the run to fit, random inputs taking
/// their `--shape` or the first candidate's.
pub(super) fn gather_inputs_padded(
    candidates: &[&[TensorSpec]],
    paddable: bool,
    args: &InputArgs,
) -> Result<Vec<Tensor>, Failure> {
    let specs = candidates[0];
    let mut given: BTreeMap<String, Tensor> = BTreeMap::new();
    if let Some(npz) = &args.inputs_npz {
        let want = |name: &str| specs.iter().find(|s| s.name == name).map(|s| s.dtype);
        for t in npy::read_npz(npz, want)? {
            given.insert(t.name.clone(), t);
        }
    }
    for (name, path) in &args.inputs {
        let tensor = match specs.iter().find(|s| &s.name == name) {
            Some(spec) => npy::read_tensor_as(name, path, spec.dtype)?,
            None => npy::read_tensor(name, path)?,
        };
        given.insert(name.clone(), tensor);
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
    if let Some((name, _)) = args
        .shapes
        .iter()
        .find(|(n, _)| !specs.iter().any(|s| &s.name == n))
    {
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--shape names '{name}', which is not an input; the model's inputs are: {}",
                names.join(", ")
            ),
        ));
    }
    let shape_of = |name: &str| {
        (given.get(name).map(|t| t.shape.as_slice())).or_else(|| {
            args.shapes
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| d.as_slice())
        })
    };
    let fits = |c: &[TensorSpec]| {
        c.iter()
            .all(|s| shape_of(&s.name).is_none_or(|d| d == s.shape.as_slice()))
    };
    let specs = match candidates.iter().find(|c| fits(c)) {
        Some(c) => *c,
        // One profile: a run reports the input that does not fit.
        None if candidates.len() == 1 || paddable => specs,
        None => {
            let list: Vec<String> = (candidates.iter().enumerate())
                .map(|(i, c)| {
                    let c: Vec<String> = c
                        .iter()
                        .map(|s| format!("{}: {}", s.name, s.type_string()))
                        .collect();
                    format!("  profile {i}: {}", c.join(", "))
                })
                .collect();
            return Err(Failure::new(
                exit::BAD_INPUT,
                format!(
                    "no profile of the artifact has the input shapes given; its profiles:\n{}",
                    list.join("\n")
                ),
            ));
        }
    };
    let mut inputs = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        match given.remove(&spec.name) {
            Some(t) => inputs.push(t),
            None if args.random => {
                let shaped;
                let spec = match args.shapes.iter().find(|(n, _)| *n == spec.name) {
                    Some((_, shape)) => {
                        shaped = TensorSpec {
                            shape: shape.clone(),
                            ..spec.clone()
                        };
                        &shaped
                    }
                    None => spec,
                };
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

/// Threads for a session of `model`: `requested`, or every core, and never
/// more than the most tasks of any of its steps.
pub(super) fn session_threads(model: &Model, requested: Option<usize>) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    requested.unwrap_or(cores).clamp(1, model.max_tasks())
}

/// The inputs of a run of `model` from `args` (see [`gather_inputs`]).
pub(super) fn model_inputs(model: &Model, args: &InputArgs) -> Result<Vec<Tensor>, Failure> {
    let paddable = !model.paddable_dims().is_empty();
    gather_inputs_padded(&profile_inputs(model), paddable, args)
}

/// The input specs of every profile of `model`, for [`gather_inputs`].
pub(super) fn profile_inputs(model: &Model) -> Vec<&[TensorSpec]> {
    model
        .profiles()
        .iter()
        .map(|p| p.inputs.as_slice())
        .collect()
}
