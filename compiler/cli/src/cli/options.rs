//! The flags that say how a model is imported and optimized, shared by
//! `kiln compile` and `kiln inspect`, and their translation into the
//! driver's [`CompileOptions`].

use super::{exit, listed, Failure};
use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};
use kiln_driver::{npy, CompileOptions, Target};
use kiln_passes::{ActivationType, Mode, Observer, Pattern, Policy, Precision};
use std::path::PathBuf;

#[derive(Args, Clone)]
pub(super) struct ModelArgs {
    /// Bind a whole input shape: NAME=1x3x224x224 (repeatable; NAME= for a
    /// scalar). Several shapes, NAME=1x3x224x224|4x3x224x224, make one
    /// profile each.
    #[arg(long = "input-shape", value_name = "NAME=DIMS[|DIMS...]", value_parser = input_shapes)]
    input_shapes: Vec<(String, Vec<Vec<usize>>)>,
    /// Bind a symbolic dim by name: NAME=VALUE (repeatable). Several values
    /// (a list 1,8,32 and/or ranges LO..HI:STEP, HI included when on the
    /// step) make one profile each; the artifact holds every combination.
    #[arg(long = "dim", value_name = "NAME=VALUES", value_parser = dim_values)]
    dims: Vec<(String, Vec<usize>)>,
    /// Let runs pad dim NAME (a --dim) up to the smallest profile that
    /// fits: inputs smaller along it run padded with zeros, outputs come
    /// back cut to size (repeatable). Refused, naming the node, when an op
    /// combines rows along the dim (a reduction, attention or reshape
    /// across the batch).
    #[arg(long = "pad-dim", value_name = "NAME")]
    pad_dims: Vec<String>,
    /// Fix a graph input's value at compile time: NAME=FILE.npy
    /// (repeatable). The input folds into what reads it (a Reshape target,
    /// Pad amounts, TopK's k) and is no longer an input of the artifact.
    #[arg(long = "bind-input", value_name = "NAME=FILE.npy", value_parser = name_and_path)]
    bind_inputs: Vec<(String, PathBuf)>,
    /// Most iterations a Loop whose trip count or condition is computed
    /// from inputs may run: the artifact holds one variant per trip count
    /// up to N, and a run that needs more is refused, naming the loop.
    #[arg(long, value_name = "N", default_value_t = kiln_driver::DEFAULT_MAX_TRIP_COUNT)]
    max_trip_count: usize,
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
    pub(super) time_passes: bool,
    /// Precision of the dense ops (MatMul, Gemm, Conv): fp32, bf16, fp16
    /// (f16 weights, f32 math), int8 (as --quantize dynamic) or mixed (bf16
    /// except the first and last dense layer). Everything else stays fp32
    /// (docs/precision.md).
    #[arg(long, default_value = "fp32", value_name = "PRECISION", value_parser = listed::<Mode>(["fp32", "bf16", "fp16", "int8", "mixed"].map(PossibleValue::new)))]
    precision: Mode,
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
    #[arg(long, default_value = "minmax", value_name = "OBSERVER", value_parser = clap::value_parser!(Observer))]
    observer: Observer,
    /// int8 layers' activations: uint8 (asymmetric per tensor, zero point
    /// from the range) or int8 (symmetric per tensor, −127..127 around 0).
    #[arg(long = "activation-type", value_parser = listed::<ActivationType>([
        PossibleValue::new("uint8").alias("u8").help("asymmetric per tensor, zero point from the range"),
        PossibleValue::new("int8").aliases(["s8", "i8"]).help("symmetric per tensor around 0"),
    ]))]
    activation_type: Option<ActivationType>,
    /// Keep these nodes in fp32: op types or node-name globs,
    /// comma-separated (`Conv,/encoder/layer.0/*`).
    #[arg(long = "keep-fp32", value_name = "PATTERNS", value_delimiter = ',', value_parser = clap::value_parser!(Pattern))]
    keep_fp32: Vec<Pattern>,
    /// Force nodes to a precision: PRECISION=PATTERNS (repeatable; a later
    /// one wins; --keep-fp32 wins over all).
    #[arg(long, value_name = "PRECISION=PATTERNS", value_parser = force)]
    force: Vec<(Precision, Vec<Pattern>)>,
}

/// `--quantize`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Quantize {
    /// Activation ranges observed on calibration samples at compile time.
    Static,
    /// Activation ranges computed at run time.
    Dynamic,
}

/// The compile options the flags ask for (checked as a whole by the
/// driver's [`CompileOptions::validate`]).
pub(super) fn compile_options(args: &ModelArgs, target: Target) -> Result<CompileOptions, Failure> {
    let mut opts = CompileOptions {
        target,
        opt_level: args.opt_level,
        passes: args.passes.clone(),
        verify_each: args.verify_each,
        observer: args.observer,
        ..CompileOptions::default()
    };
    opts.precision.mode = args.precision;
    if let Some(q) = args.quantize {
        if args.precision != Mode::Fp32 {
            return Err(Failure::new(
                exit::USAGE,
                "--quantize sets the precision to int8; use --force PRECISION=PATTERN for other layers",
            ));
        }
        opts.static_activations = q == Quantize::Static;
        opts.precision.mode = Mode::Int8;
    }
    if let Some(t) = args.activation_type {
        opts.precision.activation_type = t;
    }
    opts.precision.keep_fp32 = args.keep_fp32.clone();
    opts.precision.force = args.force.clone();
    // One value binds as before; several make profiles.
    for (name, shapes) in &args.input_shapes {
        if let [one] = shapes.as_slice() {
            opts.import.input_shapes.insert(name.clone(), one.clone());
        } else {
            opts.profiles
                .input_shapes
                .insert(name.clone(), shapes.clone());
        }
    }
    for (name, values) in &args.dims {
        if let [one] = values.as_slice() {
            opts.import.dims.insert(name.clone(), *one);
        } else {
            opts.profiles.dims.insert(name.clone(), values.clone());
        }
    }
    for name in &args.pad_dims {
        if !opts.profiles.paddable.contains(name) {
            opts.profiles.paddable.push(name.clone());
        }
    }
    for (name, path) in &args.bind_inputs {
        let value = npy::read_ir_tensor(path)?;
        opts.import.input_values.insert(name.clone(), value);
    }
    opts.max_trip_count = args.max_trip_count;
    Ok(opts)
}

/// `NAME=VALUE`, split at the last `=`, neither side empty.
pub(super) fn name_value(s: &str) -> Result<(&str, &str), String> {
    s.rsplit_once('=')
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| format!("expected NAME=VALUE, got '{s}'"))
}

/// `NAME=DIMS`, split at the last `=`; NAME not empty, DIMS empty for a
/// scalar's shape (`--input-shape sr=`).
fn name_dims(s: &str) -> Result<(&str, &str), String> {
    (s.rsplit_once('='))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected NAME=DIMS, got '{s}'"))
}

/// `--input-shape NAME=1x3x224x224`.
fn input_shape(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, dims) = name_dims(s)?;
    if dims.is_empty() {
        return Ok((name.to_string(), Vec::new()));
    }
    let dims = (dims.split('x').map(str::parse))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| format!("'{dims}' is not like 1x3x224x224"))?;
    Ok((name.to_string(), dims))
}

/// `--shape NAME=2x16` of `kiln run`/`bench`.
pub(super) fn input_shape_u64(s: &str) -> Result<(String, Vec<u64>), String> {
    let (name, dims) = input_shape(s)?;
    Ok((name, dims.into_iter().map(|d| d as u64).collect()))
}

/// `--input-shape NAME=1x3x224x224|4x3x224x224`: distinct shapes.
fn input_shapes(s: &str) -> Result<(String, Vec<Vec<usize>>), String> {
    let (name, shapes) = name_dims(s)?;
    let mut out: Vec<Vec<usize>> = Vec::new();
    for shape in shapes.split('|') {
        let (_, dims) = input_shape(&format!("{name}={shape}"))?;
        if out.contains(&dims) {
            return Err(format!("shape '{shape}' is given twice"));
        }
        out.push(dims);
    }
    Ok((name.to_string(), out))
}

/// `--dim NAME=VALUES`: comma-separated numbers and ranges `LO..HI:STEP`
/// (`:STEP` defaults to 1; HI is included when a step lands on it), each
/// value at least 1 and given once.
fn dim_values(s: &str) -> Result<(String, Vec<usize>), String> {
    let (name, values) = name_value(s)?;
    let number = |v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("'{v}' is not a positive number (in --dim {s})"))
    };
    let mut out: Vec<usize> = Vec::new();
    for part in values.split(',') {
        let expanded: Vec<usize> = match part.split_once("..") {
            None => vec![number(part)?],
            Some((lo, rest)) => {
                let (hi, step) = rest.split_once(':').unwrap_or((rest, "1"));
                let (lo, hi, step) = (number(lo)?, number(hi)?, number(step)?);
                if lo > hi {
                    return Err(format!("range '{part}' is empty (in --dim {s})"));
                }
                if (hi - lo) / step >= kiln_driver::MAX_PROFILES {
                    return Err(format!(
                        "range '{part}' has more than {} values (in --dim {s})",
                        kiln_driver::MAX_PROFILES
                    ));
                }
                (lo..=hi).step_by(step).collect()
            }
        };
        for v in expanded {
            if out.contains(&v) {
                return Err(format!("value {v} is given twice (in --dim {s})"));
            }
            out.push(v);
        }
    }
    Ok((name.to_string(), out))
}

/// `--bind-input NAME=FILE.npy`.
pub(super) fn name_and_path(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = name_value(s)?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// `--force PRECISION=PATTERNS`.
fn force(s: &str) -> Result<(Precision, Vec<Pattern>), String> {
    Policy::parse_force(s).map_err(|e| e.to_string())
}
