//! The precision subsystem: which dense layers run in bf16, f16 or int8,
//! and how (`docs/precision.md`).
//!
//! - [`types`]: the vocabulary (`Precision`, `Decision`, `Reason`, which ops
//!   are decided); depends on nothing here.
//! - [`report`]: per-layer error of a reduced-precision graph against the
//!   f32 one; [`plan`]: the per-node plan file (`--emit-plan`, `--plan`).
//! - [`policy`]: what was asked for; [`measured`]: what was measured for
//!   it on calibration samples; [`quantize`], [`smooth`],
//!   [`bias_correction`]: the int8 rewrites and the measurements they use.
//! - [`assign`]: the `assign-precision` pass, which applies a policy.
//! - [`calibrate`]: the measurements on sample inputs and the fallback
//!   loop around the pass: the driver's one entry point,
//!   [`calibrate::assign`].
//! - [`coverage`]: how well a static build's calibrated ranges cover a
//!   held-out set (`--validate`).

pub mod assign;
pub mod bias_correction;
pub mod calibrate;
pub mod coverage;
pub mod measured;
pub mod plan;
pub mod policy;
pub mod quantize;
pub mod report;
pub mod smooth;
pub mod types;

pub use assign::AssignPrecision;
pub use bias_correction::{measure_bias_corrections, BiasCorrections};
pub use calibrate::{
    activation_ranges, random_samples, Activations, BiasCorrection, PrecisionOutcome, Progress,
    Request, Samples, Silent,
};
pub use coverage::{coverage, Coverage, LayerCoverage, OutputAgreement};
pub use measured::Measured;
pub use plan::{structural_key, PlanEntry, PlanError, PrecisionPlan};
pub use policy::{Mode, Pattern, Policy};
pub use quantize::{
    observe, quantize_weights, u8_params, ActivationRange, ActivationType, Observer,
};
pub use report::{compare as compare_precision, AccuracyReport, LayerError};
pub use smooth::{channel_axis, smoothing_factors, Smoothing};
pub use types::{
    is_embedding_lookup, is_precision_layer, Decision, PolicyError, Precision, Reason,
};
