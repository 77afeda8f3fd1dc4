//! `kiln-ir`: the typed graph IR at the centre of Kiln.
//!
//! A [`Graph`] holds single-output [`Node`]s in a petgraph `StableDiGraph`;
//! each node carries an [`Op`] with typed attributes and the inferred
//! [`ValueType`] (element type and concrete shape) of its value. Shapes are
//! static: the frontend binds symbolic dims before building the graph.
//!
//! Every op has type inference ([`infer`]), a verifier rule ([`verify`]), a
//! naive reference implementation ([`eval`]) and a line in the text format
//! ([`text`]).
//!
//! # Example
//! ```
//! use kiln_ir::{Graph, Op, UnaryOp, ValueType, DType};
//! let mut g = Graph::new();
//! let x = g.add_input("x", ValueType::new(DType::F32, [2, 3]));
//! let y = g.add_node(Op::Unary(UnaryOp::Relu), &[x], "relu").unwrap();
//! g.add_output("y", y);
//! kiln_ir::verify::verify(&g).unwrap();
//! ```
#![deny(missing_docs)]
// `unsafe` lives in the runtime only (docs/architecture.md).
#![forbid(unsafe_code)]

pub mod arena;
pub mod cost;
mod dtype;
mod error;
pub mod eval;
pub mod fused;
mod graph;
pub mod infer;
mod name_pattern;
pub mod narrow;
mod op;
mod schedule;
mod tensor;
pub mod text;
mod value_type;
pub mod verify;
mod vocab;

pub use dtype::DType;
pub use error::IrError;
pub use fused::{DenseHead, DenseOp, ElementwiseProgram, FusedKernel, FusedStore, Instr, Reg};
pub use graph::{Graph, Node, NodeId};
pub use name_pattern::NamePattern;
pub use op::{
    BinaryOp, BitwiseOp, Col2Im, CompareOp, Conv2d, CoordinateTransform, Ints, LogicalOp,
    NearestRounding, Nms, Op, Pool2d, ReduceOp, Resize, ResizeMode, ResizeTaps, SliceAxis, UnaryOp,
};
pub use schedule::{peak_live_bytes, schedule};
pub use tensor::{Data, Tensor};
pub use value_type::ValueType;
pub use vocab::{Attribute, AttributeReader, AttributeType};

/// A concrete tensor shape.
pub type Shape = smallvec::SmallVec<[usize; 6]>;
