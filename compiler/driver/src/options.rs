//! What decides what a compilation produces ([`CompileOptions`]), checked
//! once ([`CompileOptions::validate`]) and recorded in the artifact
//! ([`CompileOptions::canonical`]).

use crate::error::DriverError;
use crate::target::Target;
use kiln_ir::{DType, Graph, Op};
use kiln_onnx::ImportOptions;
use kiln_passes::{ActivationType, Mode, Observer, Policy, Precision};
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

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

impl FromStr for DumpIr {
    type Err = String;
    /// `all`, `import` or `after=PASS` (`--dump-ir`).
    fn from_str(s: &str) -> Result<DumpIr, String> {
        match s {
            "all" => Ok(DumpIr::All),
            "import" => Ok(DumpIr::After("import".into())),
            _ => match s.strip_prefix("after=") {
                Some(pass) if !pass.is_empty() => Ok(DumpIr::After(pass.to_string())),
                _ => Err(format!("expected all, import or after=PASS, got '{s}'")),
            },
        }
    }
}

/// `1x3x224x224`.
fn shape_text(dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(usize::to_string).collect();
    dims.join("x")
}

/// The most profiles one artifact may hold: each is a full compilation.
pub const MAX_PROFILES: usize = 256;

/// Dims and whole input shapes given several values at compile time
/// (`--dim batch=1,8,32`, `--dim seq=16..512:16`, `--input-shape
/// x=1x3|4x3`): the artifact holds one profile per combination, in the
/// order of [`ShapeProfiles::imports`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShapeProfiles {
    /// Symbolic dims by name, each with its values in the order given.
    pub dims: std::collections::BTreeMap<String, Vec<usize>>,
    /// Graph inputs by name, each with its whole shapes in the order given.
    pub input_shapes: std::collections::BTreeMap<String, Vec<Vec<usize>>>,
    /// Dims a run may pad to a larger profile (`--pad-dim batch`), in the
    /// order given; each must be a `--dim`, and the compiler must prove no
    /// op combines its rows.
    pub paddable: Vec<String>,
}

impl ShapeProfiles {
    /// How many profiles the combinations make (saturating).
    pub fn count(&self) -> usize {
        (self.dims.values().map(Vec::len))
            .chain(self.input_shapes.values().map(Vec::len))
            .fold(1usize, |n, k| n.saturating_mul(k))
    }

    /// The import options of every profile: `base` with one value of each
    /// dim and input shape bound, the last-named varying fastest (input
    /// shapes, then dims, each in name order). Errors past
    /// [`MAX_PROFILES`].
    pub fn imports(
        &self,
        base: &ImportOptions,
    ) -> Result<Vec<(String, ImportOptions)>, DriverError> {
        let count = self.count();
        if count > MAX_PROFILES {
            return Err(DriverError::Usage(format!(
                "{count} profiles (the product of the values given to --dim and --input-shape); an artifact holds at most {MAX_PROFILES}"
            )));
        }
        let mut out = vec![(String::new(), base.clone())];
        for (name, shapes) in &self.input_shapes {
            out = (out.into_iter())
                .flat_map(|(label, o)| {
                    shapes.iter().map(move |shape| {
                        let mut o = o.clone();
                        o.input_shapes.insert(name.clone(), shape.clone());
                        (
                            join_label(&label, &format!("{name}={}", shape_text(shape))),
                            o,
                        )
                    })
                })
                .collect();
        }
        for (name, values) in &self.dims {
            out = (out.into_iter())
                .flat_map(|(label, o)| {
                    values.iter().map(move |&v| {
                        let mut o = o.clone();
                        o.dims.insert(name.clone(), v);
                        (join_label(&label, &format!("{name}={v}")), o)
                    })
                })
                .collect();
        }
        Ok(out)
    }
}

fn join_label(label: &str, part: &str) -> String {
    match label.is_empty() {
        true => part.to_string(),
        false => format!("{label} {part}"),
    }
}

/// Everything that decides what `kiln compile` produces. Built once from
/// the command line; recorded in the artifact (minus output locations).
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Code generation target (`--target`).
    pub target: Target,
    /// Shape bindings for the frontend (dims and input shapes with one
    /// value; those with several are in `profiles`).
    pub import: ImportOptions,
    /// Dims and input shapes with several values: the artifact holds one
    /// profile per combination (`--dim batch=1,8,32`).
    pub profiles: ShapeProfiles,
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
    pub observer: Observer,
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
    /// The golden self-test's input sets (`--golden FILE.npz|DIR`, or
    /// `--golden-from-calibration N`; see [`crate::golden`]); `None`: the
    /// artifact has none.
    pub golden: Option<GoldenInputs>,
    /// Held-out samples (`--validate DIR`, read like `--calibrate`'s): a
    /// static int8 build reports how well its calibrated activation
    /// ranges cover them ([`kiln_passes::coverage`]).
    pub validate: Option<PathBuf>,
    /// The clipped share above which a layer's coverage gets a warning
    /// (`--coverage-warn`, a fraction; default [`DEFAULT_COVERAGE_WARN`]).
    pub coverage_warn: f64,
    /// Most iterations a `Loop` whose trip count or condition is known
    /// only at run time may run (`--max-trip-count`): the artifact holds
    /// one variant per trip count up to it, and a run past it is refused.
    pub max_trip_count: usize,
    /// The self-test's tolerance for every output (`--golden-tolerance`);
    /// `None`: by the build's precision ([`CompileOptions::golden_tolerance`]).
    pub golden_tolerance: Option<f64>,
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

impl FromStr for Smooth {
    type Err = String;
    /// `off` or α in [0, 1] (`--smooth`).
    fn from_str(s: &str) -> Result<Smooth, String> {
        match (s, s.parse::<f32>()) {
            ("off", _) => Ok(Smooth::Off),
            (_, Ok(alpha)) if (0.0..=1.0).contains(&alpha) => Ok(Smooth::Alpha(alpha)),
            _ => Err(format!("'{s}' is neither off nor a number in [0, 1]")),
        }
    }
}

/// The smoothing strength of calibrated static builds (SmoothQuant's
/// default; measured in `docs/precision.md`).
pub const DEFAULT_SMOOTH_ALPHA: f32 = 0.5;

impl CompileOptions {
    /// The import options of a compile: the model's run-time control
    /// flow followed one path at a time (`crate::variants`).
    pub fn import_on_paths(&self) -> ImportOptions {
        ImportOptions {
            branches: Some(kiln_onnx::Branches {
                max_trip_count: self.max_trip_count,
                ..Default::default()
            }),
            ..self.import.clone()
        }
    }
}

/// Default of [`CompileOptions::max_arena_bytes`]: 16 GiB.
pub const DEFAULT_MAX_ARENA_BYTES: u64 = 16 << 30;

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            target: Target::default(),
            import: ImportOptions::default(),
            profiles: ShapeProfiles::default(),
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
            observer: Observer::MinMax,
            bias_correction: true,
            smooth: Smooth::Auto,
            golden: None,
            golden_tolerance: None,
            validate: None,
            coverage_warn: DEFAULT_COVERAGE_WARN,
            max_trip_count: DEFAULT_MAX_TRIP_COUNT,
        }
    }
}

/// Default of [`CompileOptions::max_trip_count`].
pub const DEFAULT_MAX_TRIP_COUNT: usize = 16;

/// Default of [`CompileOptions::coverage_warn`]: 0.1% of a layer's
/// activation values outside its calibrated range.
pub const DEFAULT_COVERAGE_WARN: f64 = 1e-3;

/// The golden self-test's default tolerance per precision: the largest
/// error of an output relative to its scale, against the source model
/// evaluated in f32. A build takes the entry of its least precise layer
/// (the `--precision` mode and every `--force`); order: most precise first.
/// fp32 is `kiln run --check`'s default; the others leave room for what
/// the precision costs on real models (docs/precision.md: bf16 and int8
/// outputs of the real models stay within 2e-2 and 1e-1).
pub const GOLDEN_TOLERANCES: [(Precision, f64); 4] = [
    (Precision::Fp32, 1e-4),
    (Precision::Fp16, 1e-2),
    (Precision::Bf16, 5e-2),
    (Precision::Int8, 0.15),
];

/// The least precise computation a model asks for itself: int8 when it
/// quantizes values (a QuantizeLinear, a dynamic quantization: a cast of a
/// float to i8/u8) or multiplies integers, else fp16/bf16 when it has
/// values of that type, else fp32.
pub fn source_precision(graph: &Graph) -> Precision {
    let mut least = Precision::Fp32;
    for id in graph.node_ids() {
        let node = graph.node(id);
        let quantizes = match &node.op {
            Op::Cast {
                to: DType::I8 | DType::U8,
            } => (graph.inputs_of(id).first()).is_some_and(|&x| graph.node(x).ty.dtype.is_float()),
            op => op.is_integer_product(),
        };
        if quantizes {
            return Precision::Int8;
        }
        least = match node.ty.dtype {
            DType::BF16 => Precision::Bf16,
            DType::F16 if least == Precision::Fp32 => Precision::Fp16,
            _ => least,
        };
    }
    least
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

/// Where the golden self-test's input sets come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoldenInputs {
    /// `--golden FILE.npz|DIR`: one set, or one per `.npz` file.
    Path(PathBuf),
    /// `--golden-from-calibration N`: the first `sets` calibration samples
    /// (`--calibrate DIR`, in name order).
    Calibration {
        /// How many samples, at most.
        sets: usize,
    },
}

impl CompileOptions {
    /// Refuses options that cannot work together, before any work: the one
    /// place these checks live (the command line, the Python binding and
    /// library users all reach it through [`crate::compile`]). Each rule
    /// names the flag it is about.
    pub fn validate(&self) -> Result<(), DriverError> {
        let p = &self.precision;
        let has_samples =
            !p.is_identity() && (self.calibrate.is_some() || self.calibrate_random > 0);
        let rules: [(bool, &str); 7] = [
            (self.threads == 0, "--threads must be at least 1"),
            (
                self.observer != Observer::MinMax && !self.static_activations,
                "--observer applies to --quantize static only",
            ),
            (
                p.activation_type != ActivationType::default() && !p.may_quantize(),
                "--activation-type applies to int8 layers (--quantize, --precision int8, --force int8=..., --plan with int8 entries)",
            ),
            (
                matches!(self.smooth, Smooth::Alpha(_)) && !(has_samples && p.may_quantize()),
                "--smooth needs int8 layers (--quantize, --force int8=...) and calibration samples (--calibrate DIR)",
            ),
            (
                self.validate.is_some()
                    && !(self.static_activations && self.calibrate.is_some() && p.may_quantize()),
                "--validate needs a static int8 build calibrated on real samples (--quantize static --calibrate DIR)",
            ),
            (
                matches!(self.golden, Some(GoldenInputs::Calibration { .. }))
                    && (self.calibrate.is_none() || p.is_identity()),
                "--golden-from-calibration needs calibration samples (--calibrate DIR) of a reduced-precision build (--quantize, --precision)",
            ),
            (
                self.max_rel_error.is_some() && !has_samples,
                "--max-rel-error needs calibration samples (--calibrate DIR or --calibrate-random N with N > 0) and a reduced --precision",
            ),
        ];
        if let Some((_, why)) = rules.iter().find(|(broken, _)| *broken) {
            return Err(DriverError::Usage((*why).into()));
        }
        let bound =
            |n: &String| self.import.dims.contains_key(n) || self.profiles.dims.contains_key(n);
        match self.profiles.paddable.iter().find(|n| !bound(n)) {
            Some(n) => Err(DriverError::Usage(format!(
                "--pad-dim {n} needs --dim {n}=VALUES (the sizes to pad up to)"
            ))),
            None => Ok(()),
        }
    }

    /// The golden self-test's tolerance (and `kiln debug`'s): the
    /// `--golden-tolerance`, or the [`GOLDEN_TOLERANCES`] entry of the
    /// least precise computation of the build: the policy's (its
    /// `--precision` mode and every `--force`; a `--plan`'s entries are
    /// not read: give `--golden-tolerance` with one) or the `source`
    /// model's own ([`source_precision`]: a model quantized elsewhere
    /// rounds its int8 values one step apart from the reference evaluator
    /// at ties, a model in f16 its f16 values one ulp apart).
    pub fn golden_tolerance(&self, source: &Graph) -> f64 {
        if let Some(t) = self.golden_tolerance {
            return t;
        }
        let mode = match self.precision.mode {
            Mode::Fp32 => Precision::Fp32,
            Mode::Fp16 => Precision::Fp16,
            Mode::Bf16 | Mode::Mixed => Precision::Bf16,
            Mode::Int8 => Precision::Int8,
        };
        let rank = |p: Precision| GOLDEN_TOLERANCES.iter().position(|(q, _)| *q == p);
        let loosest = (self.precision.force.iter())
            .map(|(p, _)| rank(*p))
            .chain([rank(source_precision(source))])
            .fold(rank(mode), |a, b| a.max(b));
        loosest.map_or(GOLDEN_TOLERANCES[0].1, |i| GOLDEN_TOLERANCES[i].1)
    }

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
            let _ = write!(s, " input_shape={name}={}", shape_text(dims));
        }
        for (name, v) in &self.import.dims {
            let _ = write!(s, " dim={name}={v}");
        }
        for (name, shapes) in &self.profiles.input_shapes {
            let shapes: Vec<String> = shapes.iter().map(|d| shape_text(d)).collect();
            let _ = write!(s, " input_shape={name}={}", shapes.join("|"));
        }
        for (name, values) in &self.profiles.dims {
            let values: Vec<String> = values.iter().map(usize::to_string).collect();
            let _ = write!(s, " dim={name}={}", values.join(","));
        }
        for name in &self.profiles.paddable {
            let _ = write!(s, " pad_dim={name}");
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
        if self.import.keep_values != kiln_onnx::KeepValues::None {
            let _ = write!(s, " keep_values={}", self.import.keep_values);
        }
        if self.max_trip_count != DEFAULT_MAX_TRIP_COUNT {
            let _ = write!(s, " max_trip_count={}", self.max_trip_count);
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
            if p.activation_type != ActivationType::Uint8 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule refuses what it names, and a build that needs none of
    /// them passes.
    #[test]
    fn validate_refuses_each_combination_that_cannot_work() {
        let usage = |o: &CompileOptions| match o.validate() {
            Err(DriverError::Usage(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        };
        let base = CompileOptions::default();
        assert!(base.validate().is_ok());
        let mut o = base.clone();
        o.threads = 0;
        assert!(usage(&o).contains("--threads"));
        let mut o = base.clone();
        o.observer = Observer::Entropy;
        assert!(usage(&o).contains("--observer"));
        let mut o = base.clone();
        o.precision.activation_type = ActivationType::Int8;
        assert!(usage(&o).contains("--activation-type"));
        let mut o = base.clone();
        o.precision.mode = Mode::Bf16;
        o.smooth = Smooth::Alpha(0.5);
        assert!(usage(&o).contains("--smooth"));
        let mut o = base.clone();
        o.max_rel_error = Some(0.1);
        assert!(usage(&o).contains("--max-rel-error"));
        // The same options where they apply.
        let mut o = base;
        o.precision.mode = Mode::Int8;
        o.static_activations = true;
        o.observer = Observer::Entropy;
        o.precision.activation_type = ActivationType::Int8;
        o.smooth = Smooth::Alpha(0.5);
        o.max_rel_error = Some(0.1);
        assert!(o.validate().is_ok());
    }

    #[test]
    fn smooth_and_dump_ir_parse_their_flag_values() {
        assert_eq!("off".parse::<Smooth>(), Ok(Smooth::Off));
        assert_eq!("0.25".parse::<Smooth>(), Ok(Smooth::Alpha(0.25)));
        assert!("1.5".parse::<Smooth>().is_err());
        assert_eq!("all".parse::<DumpIr>(), Ok(DumpIr::All));
        assert_eq!(
            "after=fuse".parse::<DumpIr>(),
            Ok(DumpIr::After("fuse".into()))
        );
        assert!("after=".parse::<DumpIr>().is_err());
    }
}
