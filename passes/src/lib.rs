//! `kiln-passes`: the pass manager and the graph-to-graph passes.
//!
//! A pass is a [`Pass`]: a name and `run(&mut Graph) -> Result<PassStats>`.
//! The [`PassManager`] runs a pipeline chosen by optimization level or by an
//! explicit list of names, optionally verifies the graph after each pass and
//! records per-pass statistics and timings.
//!
//! # Example
//! ```
//! use kiln_passes::{PassManager, PipelineOptions};
//! let mut g = kiln_ir::Graph::new();
//! let pm = PassManager::for_level(1).unwrap();
//! let report = pm.run(&mut g, &PipelineOptions::default()).unwrap();
//! assert_eq!(report.passes.len(), 2);
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

mod dce;
#[cfg(debug_assertions)]
pub mod fault;
mod flush_subnormals;
mod fold_batchnorm;
mod fold_constants;
mod fuse;
mod layout;
mod manager;
mod pass;
pub mod precision;
mod recognize;
pub mod rows;
mod simplify;

pub use dce::DeadCodeElimination;
pub use flush_subnormals::FlushSubnormals;
pub use fold_batchnorm::FoldBatchNorm;
pub use fold_constants::FoldConstants;
pub use fuse::Fuse;
pub use layout::Layout;
pub use manager::{PassManager, PassRecord, PipelineOptions, PipelineReport};
pub use pass::{Pass, PassError, PassStats};
pub use precision::{
    activation_ranges, channel_axis, compare_precision, coverage, is_embedding_lookup,
    is_precision_layer, measure_bias_corrections, observe, quantize_weights, random_samples,
    smoothing_factors, structural_key, u8_params, AccuracyReport, ActivationRange, ActivationType,
    Activations, AssignPrecision, BiasCorrection, BiasCorrections, Coverage, Decision,
    LayerCoverage, LayerError, Measured, Mode, Observer, OutputAgreement, Pattern, PlanEntry,
    PlanError, Policy, PolicyError, Precision, PrecisionOutcome, PrecisionPlan, Progress, Reason,
    Request, Samples, Silent, Smoothing,
};
pub use recognize::Recognize;
pub use simplify::Simplify;
