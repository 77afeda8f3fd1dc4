//! The IR text format: one node a line, stable and diffable.
//!
//! ```text
//! graph(%0: f32[1,64] "input", %1: i64[3] "ids") {
//!   %2: f32[64,10] = const dense<[...]>  # onnx: fc.weight
//!   %3: f32[1,10] = gemm(%0, %2) {alpha=1.0, beta=1.0, trans_a=false, trans_b=false}  # onnx: /fc/Gemm
//!   %4: f32[1,10] = relu(%3)  # onnx: /relu
//!   return %4 "probs"
//! }
//! ```
//!
//! [`print`](fn@print) numbers values in [`Graph::topo_order`] order (graph inputs
//! first, in input order), so the dump of a graph does not depend on the
//! petgraph indices it happens to use, and prints every attribute of every
//! op. Constants with more than 16 elements are printed as an
//! `elided<N x dtype, fnv1a=0x...>` summary unless
//! [`PrintOptions::full_constants`] is set; such a dump cannot be parsed
//! back. [`parse`] reads the format (hand-written IR too: value names may be
//! any `%identifier`, and most attributes have ONNX defaults) and rebuilds
//! the graph through [`Graph::add_node`], checking that every declared type
//! is the inferred one. `docs/ir.md` holds the full grammar.
//!
//! ```
//! use kiln_ir::{text, Graph, Op, UnaryOp, ValueType, DType};
//! let mut g = Graph::new();
//! let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
//! let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "relu").unwrap();
//! g.add_output("y", y);
//! let dump = text::print(&g);
//! assert_eq!(
//!     dump,
//!     "graph(%0: f32[2,3] \"x\") {\n  %1: f32[2,3] = relu(%0)  # onnx: relu\n  return %1 \"y\"\n}\n"
//! );
//! assert_eq!(text::print(&text::parse(&dump).unwrap()), dump);
//! ```

use crate::{Graph, IrError};

mod dot;
mod lex;
mod parse;
mod print;
#[cfg(test)]
mod tests;

/// Constants with at most this many elements are always printed in full.
const DENSE_LIMIT: usize = 16;

/// Options of [`print_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrintOptions {
    /// Print every element of every constant (`dense<[...]>`), so that the
    /// dump parses back. When false (the default), constants with more than
    /// 16 elements are printed as `elided<N x dtype, fnv1a=...>`.
    pub full_constants: bool,
}

/// The attributes of `op` as the text format writes them (`name=value`).
pub(crate) fn op_attributes(op: &crate::Op) -> Vec<String> {
    print::attributes(op)
}

/// Prints `graph` in the text format with default options (large constants
/// elided).
pub fn print(graph: &Graph) -> String {
    print_with(graph, &PrintOptions::default())
}

/// Prints `graph` in the text format.
pub fn print_with(graph: &Graph, opts: &PrintOptions) -> String {
    print::print_graph(graph, opts)
}

/// Renders `graph` for Graphviz (`dot -Tsvg`): one box per computing node
/// filled by element type (precision), constants listed in their
/// consumers' labels.
pub fn dot(graph: &Graph) -> String {
    dot::render(graph)
}

/// Parses the text format into a graph. Errors are [`IrError::Parse`] with
/// the 1-based line of the offending token.
pub fn parse(text: &str) -> Result<Graph, IrError> {
    parse::parse_graph(text)
}
