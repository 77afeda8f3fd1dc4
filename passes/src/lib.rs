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

mod assign_precision;
mod bias_correction;
mod dce;
mod flush_subnormals;
mod fold_batchnorm;
mod fold_constants;
mod fuse;
mod layout;
mod manager;
mod precision_plan;
mod precision_report;
mod quantize;
mod recognize;
mod simplify;
mod smooth;

pub use assign_precision::{
    is_embedding_lookup, is_precision_layer, AssignPrecision, Decision, Mode, Pattern, Policy,
    PolicyError, Precision, Reason,
};
pub use bias_correction::{measure_bias_corrections, BiasCorrections};
pub use dce::DeadCodeElimination;
pub use flush_subnormals::FlushSubnormals;
pub use fold_batchnorm::FoldBatchNorm;
pub use fold_constants::FoldConstants;
pub use fuse::Fuse;
pub use layout::Layout;
pub use manager::{
    Pass, PassError, PassManager, PassRecord, PassStats, PipelineOptions, PipelineReport,
};
pub use precision_plan::{structural_key, PlanEntry, PlanError, PrecisionPlan};
pub use precision_report::{compare as compare_precision, AccuracyReport, LayerError};
pub use quantize::{
    observe, quantize_weights, u8_params, ActivationRange, ActivationType, Observer,
};
pub use recognize::Recognize;
pub use simplify::Simplify;
pub use smooth::{channel_axis, smoothing_factors, Smoothing};
