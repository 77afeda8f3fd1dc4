//! Comparing outputs with reference tensors (`kiln run --check`, tests):
//! the runtime's comparison, the one the artifact's self-test uses too.

pub use kiln_runtime::compare::{compare, Comparison};
