//! Element types of IR values: the artifact schema's [`DType`], so the
//! compiler and the runtime share one vocabulary and the targets write an
//! IR value's type into an artifact without converting it.

pub use kiln_format::DType;
