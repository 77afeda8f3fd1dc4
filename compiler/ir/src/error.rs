//! Errors of the IR crate.

use thiserror::Error;

/// Errors from building, checking, evaluating or parsing IR.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// Type or shape inference rejected an op's inputs or attributes.
    #[error("{op}: {message}")]
    Type {
        /// Op name.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The graph is not a DAG.
    #[error("the graph has a cycle through node '{0}'")]
    Cycle(String),
    /// The verifier found a broken invariant.
    #[error("IR verifier: node '{node}': {message}")]
    Verify {
        /// Node name.
        node: String,
        /// Broken invariant.
        message: String,
    },
    /// The reference evaluator cannot run an op.
    #[error("cannot evaluate {op}: {message}")]
    Eval {
        /// Op name.
        op: &'static str,
        /// Why.
        message: String,
    },
    /// The text parser rejected its input.
    #[error("IR text line {line}: {message}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

impl IrError {
    pub(crate) fn ty(op: &'static str, message: impl Into<String>) -> IrError {
        IrError::Type {
            op,
            message: message.into(),
        }
    }
}
