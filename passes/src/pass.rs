//! What a pass is: the [`Pass`] trait, what a run changed ([`PassStats`])
//! and how it fails ([`PassError`]). Every pass depends on this module; the
//! pass manager ([`crate::manager`]) on the passes.

use kiln_ir::{Graph, IrError};
use thiserror::Error;

/// What a pass did, for `--time-passes` and JSON reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassStats {
    /// Nodes removed from the graph.
    pub removed: usize,
    /// Nodes added to the graph.
    pub added: usize,
    /// Nodes rewritten in place or replaced.
    pub rewritten: usize,
    /// Nodes merged into fused kernels (`fuse`).
    pub fused_nodes: usize,
    /// Fused kernels those nodes became (`fuse`).
    pub fused_kernels: usize,
}

impl std::ops::AddAssign for PassStats {
    /// Adds what another run (or part of one) did.
    fn add_assign(&mut self, other: PassStats) {
        self.removed += other.removed;
        self.added += other.added;
        self.rewritten += other.rewritten;
        self.fused_nodes += other.fused_nodes;
        self.fused_kernels += other.fused_kernels;
    }
}

impl PassStats {
    /// Whether the pass changed the graph.
    pub fn changed(&self) -> bool {
        self.removed + self.added + self.rewritten > 0
    }

    /// One line for people: `removed 3, added 1` or `fused 23 nodes into 9
    /// kernels`.
    pub fn summary(&self) -> String {
        if self.fused_kernels > 0 {
            return format!(
                "fused {} nodes into {} kernels",
                self.fused_nodes, self.fused_kernels
            );
        }
        format!(
            "removed {}, added {}, rewritten {}",
            self.removed, self.added, self.rewritten
        )
    }
}

/// A graph-to-graph transformation.
pub trait Pass {
    /// The pass's command-line name (`fold-constants`).
    fn name(&self) -> &'static str;
    /// Runs the pass once over the graph.
    fn run(&self, graph: &mut Graph) -> Result<PassStats, PassError>;
}

/// Errors from running a pipeline.
#[derive(Debug, Error)]
pub enum PassError {
    /// `--passes` or `-O` named something that does not exist.
    #[error("unknown pass '{name}'; known passes: {known}")]
    UnknownPass {
        /// The unknown name.
        name: String,
        /// Comma-separated list of known names.
        known: String,
    },
    /// Unsupported optimization level.
    #[error("unknown optimization level {0}; use 0, 1, 2 or 3")]
    UnknownLevel(u8),
    /// A pass failed.
    #[error("pass '{pass}' failed: {source}")]
    Failed {
        /// The pass.
        pass: &'static str,
        /// The IR error.
        source: IrError,
    },
    /// A precision plan (`--plan`) that does not fit the graph.
    #[error("precision plan: {0}")]
    Plan(#[from] crate::precision::PlanError),
    /// The verifier rejected the graph a pass produced (a compiler bug).
    #[error("the graph is invalid after pass '{pass}' (a Kiln bug; please report it): {source}")]
    Verify {
        /// The pass that produced the invalid graph.
        pass: &'static str,
        /// What the verifier found.
        source: IrError,
    },
}
