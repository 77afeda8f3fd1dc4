//! `kiln-runtime`: loads and runs Kiln artifacts (`.kiln` files), and
//! defines the artifact format that the compiler writes.
//!
//! The runtime depends on nothing of the compiler. Loading an artifact maps
//! the file, verifies the header, every section's SHA-256, all bounds and
//! the CPU features the code needs, copies the machine code into anonymous
//! pages, applies relocations (host `libm` functions come from a fixed
//! allow-list), and only then makes the code executable (W^X). The arena is
//! allocated once; an inference does not allocate (see [`Model::run_into`]).
//!
//! - [`format`](mod@format): the artifact format (writer and reader).
//! - [`Model`]: load and run.
//! - [`capi`]: the C ABI declared in `include/kiln.h`.
//!
//! # Threads
//!
//! [`Model`] is `Send + Sync`. [`Model::run`] takes `&mut self` (one arena
//! per model), so concurrent runs are allowed on different `Model`
//! instances, e.g. one per thread loaded from the same bytes, and one
//! instance is shared between threads behind a `Mutex`. The load test in
//! `tests/tests/robustness_load.rs` runs both from four threads.
//!
//! # Example
//! ```no_run
//! use kiln_runtime::{Model, Tensor};
//!
//! let mut model = Model::load("model.kiln")?;
//! let x = Tensor::from_f32("x", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
//! let outputs = model.run(&[x.view()])?;
//! println!("{:?}", outputs[0].to_f32_vec());
//! # Ok::<(), kiln_runtime::Error>(())
//! ```
#![deny(missing_docs)]

pub mod capi;
mod code;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod format;
mod host;
mod memory;
mod model;
mod reloc;
mod tensor;

pub use error::{Error, KERNEL_INDEX_OUT_OF_RANGE};
pub use format::{DType, TensorSpec};
pub use model::Model;
pub use tensor::{Element, Tensor, TensorRef};
