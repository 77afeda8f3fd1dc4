//! The pass manager: pipelines, verification between passes, statistics.

use crate::pass::{Pass, PassError, PassStats};
use crate::{
    DeadCodeElimination, FlushSubnormals, FoldBatchNorm, FoldConstants, Fuse, Layout, Recognize,
    Simplify,
};
use kiln_ir::Graph;
use std::time::{Duration, Instant};

/// How to run a pipeline.
#[derive(Clone, Default)]
pub struct PipelineOptions {
    /// Run the verifier after every pass (always on in debug builds).
    pub verify_each: bool,
}

/// One pass's entry in a [`PipelineReport`].
#[derive(Clone, Debug)]
pub struct PassRecord {
    /// Pass name.
    pub name: &'static str,
    /// What it did.
    pub stats: PassStats,
    /// Wall time.
    pub time: Duration,
    /// Live nodes after the pass.
    pub nodes_after: usize,
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    /// One record per pass, in order.
    pub passes: Vec<PassRecord>,
}

/// An ordered list of passes.
pub struct PassManager {
    passes: Vec<Box<dyn Pass>>,
}

/// Every pass by name, in a canonical order.
fn registry() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(FoldConstants::default()),
        Box::new(Simplify::default()),
        Box::new(Recognize::default()),
        Box::new(Layout),
        Box::new(FoldBatchNorm),
        Box::new(FlushSubnormals),
        Box::new(Fuse::default()),
        Box::new(DeadCodeElimination),
    ]
}

impl PassManager {
    /// The pipeline of an optimization level: `0` imports as is, `1` folds
    /// constants and removes dead code, `2` also simplifies, recognizes
    /// decomposed LayerNorm, GELU, softmax and attention, moves Transposes
    /// out of elementwise chains (`layout`), folds per-channel
    /// scale/shift (BatchNormalization) into Conv/Gemm/MatMul, flushes
    /// subnormal weights to zero and fuses producer–consumer chains into
    /// single kernels. `3` is the `2`
    /// pipeline: every rewrite Kiln has is exact (or reassociates f32 sums
    /// like any kernel) and paid off when measured, so it is in `2`; what
    /// was tried for `3` and measured no faster is in `docs/passes.md`.
    pub fn for_level(level: u8) -> Result<PassManager, PassError> {
        match level {
            0 => Ok(PassManager { passes: vec![] }),
            1 => PassManager::from_names(&["fold-constants", "dce"]),
            2 | 3 => PassManager::from_names(&[
                "fold-constants",
                "simplify",
                "recognize",
                "layout",
                "fold-batchnorm",
                "flush-subnormals",
                "fuse",
                "dce",
            ]),
            other => Err(PassError::UnknownLevel(other)),
        }
    }

    /// A pipeline from explicit pass names (`--passes a,b,c`).
    pub fn from_names(names: &[&str]) -> Result<PassManager, PassError> {
        let mut passes = Vec::new();
        for name in names {
            let pass = registry()
                .into_iter()
                .find(|p| p.name() == *name)
                .ok_or_else(|| PassError::UnknownPass {
                    name: name.to_string(),
                    known: PassManager::known_names().join(", "),
                })?;
            passes.push(pass);
        }
        Ok(PassManager { passes })
    }

    /// Names of every pass.
    pub fn known_names() -> Vec<&'static str> {
        registry().iter().map(|p| p.name()).collect()
    }

    /// Replaces every pass named like `pass` by `pass` (the driver runs
    /// `fuse` without dense heads for CUDA targets).
    pub fn with_replaced(mut self, pass: impl Pass + Clone + 'static) -> PassManager {
        for p in &mut self.passes {
            if p.name() == pass.name() {
                *p = Box::new(pass.clone());
            }
        }
        self
    }

    /// The passes before the first one named `name`, and the rest (empty
    /// when there is none): the driver runs `assign-precision` between
    /// them, before `fuse`, so that dense ops are assigned a precision
    /// before they become fused heads.
    pub fn split_before(mut self, name: &str) -> (PassManager, PassManager) {
        let at = (self.passes.iter())
            .position(|p| p.name() == name)
            .unwrap_or(self.passes.len());
        let rest = self.passes.split_off(at);
        (self, PassManager { passes: rest })
    }

    /// Names of the passes in this pipeline.
    pub fn names(&self) -> Vec<&'static str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// Runs the pipeline. `after_each` is called with every pass's name and
    /// the graph it produced (for `--dump-ir`).
    pub fn run_with(
        &self,
        graph: &mut Graph,
        opts: &PipelineOptions,
        mut after_each: impl FnMut(&str, &Graph),
    ) -> Result<PipelineReport, PassError> {
        let mut report = PipelineReport::default();
        for pass in &self.passes {
            let start = Instant::now();
            let stats = pass.run(graph)?;
            #[cfg(debug_assertions)]
            crate::fault::after(pass.name(), graph);
            let time = start.elapsed();
            if opts.verify_each || cfg!(debug_assertions) {
                kiln_ir::verify::verify(graph).map_err(|source| PassError::Verify {
                    pass: pass.name(),
                    source,
                })?;
            }
            report.passes.push(PassRecord {
                name: pass.name(),
                stats,
                time,
                nodes_after: graph.node_count(),
            });
            after_each(pass.name(), graph);
        }
        Ok(report)
    }

    /// Runs the pipeline without a per-pass hook.
    pub fn run(
        &self,
        graph: &mut Graph,
        opts: &PipelineOptions,
    ) -> Result<PipelineReport, PassError> {
        self.run_with(graph, opts, |_, _| {})
    }
}
