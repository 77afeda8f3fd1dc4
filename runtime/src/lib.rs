//! `kiln-runtime`: loads and runs Kiln artifacts (`.kiln` files).
//!
//! The runtime depends on the artifact schema (`kiln-format`, re-exported
//! as [`format`](mod@format)) and on nothing of the compiler. Loading an artifact reads
//! the file once into private memory, verifies the header, every section's SHA-256, all bounds and
//! the CPU features the code needs, copies the machine code into anonymous
//! pages, applies relocations (host `libm` functions come from a fixed
//! allow-list), and only then makes the code executable (W^X). The arena is
//! allocated once per session; an inference in a session does not allocate
//! (see [`Session::run_into`]).
//!
//! - [`format`](mod@format): the artifact format (`kiln-format`: writer and
//!   reader).
//! - [`Model`]: load (shared, immutable) and run; [`Session`]: one arena,
//!   for allocation-free runs on one thread.
//! - [`capi`]: the C ABI declared in `include/kiln.h`.
//! - [`Model::verify`]: the artifact's golden self-test on this machine;
//!   [`compare`]: the output metric it and `kiln run --check` use.
//! - `PublicKey` and `Model::load_verified` (feature `signing`, default):
//!   refuse artifacts not signed by your pipeline (`docs/security.md`).
//!
//! # Threads
//!
//! [`Model`] is `Send + Sync` and immutable once loaded: share one model
//! between threads (`Arc<Model>`). The arena an inference works in belongs
//! to a [`Session`] (`model.session()`), one per thread; sessions of one
//! model run concurrently and never allocate in [`Session::run_into`].
//! [`Model::run`] is the simple entry point: it uses the model's cached
//! arena, or a temporary one when another thread holds it. The load test in
//! `tests/tests/robustness_load.rs` runs one model from four threads both
//! ways.
//!
//! # Example
//! ```no_run
//! use kiln_runtime::{Model, Tensor};
//!
//! let model = std::sync::Arc::new(Model::load("model.kiln")?);
//! let x = Tensor::from_f32("x", &[1, 4], &[1.0, 2.0, 3.0, 4.0]);
//! let outputs = model.run(&[x.view()])?;
//! println!("{:?}", outputs[0].to_f32_vec());
//!
//! // One session per thread: runs in parallel, no allocation per run.
//! let worker = {
//!     let model = model.clone();
//!     std::thread::spawn(move || -> Result<Vec<u8>, kiln_runtime::Error> {
//!         let mut session = model.session()?;
//!         let x = Tensor::from_f32("x", &[1, 4], &[5.0, 6.0, 7.0, 8.0]);
//!         let mut y = vec![0u8; model.outputs()[0].byte_len() as usize];
//!         session.run_into(&[x.view()], &mut [&mut y])?;
//!         Ok(y)
//!     })
//! };
//! let y = worker.join().unwrap()?;
//! # Ok::<(), kiln_runtime::Error>(())
//! ```
#![deny(missing_docs)]
// Every `unsafe` block says why it is sound (docs/architecture.md).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod capi;
mod code;
pub mod compare;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
mod file;
mod golden;
mod host;
mod memory;
mod model;
mod pool;
mod reloc;
#[cfg(feature = "signing")]
mod signing;
mod tensor;

/// The artifact schema, `kiln-format`.
pub use kiln_format as format;

pub use error::{Error, KERNEL_INDEX_OUT_OF_RANGE};
pub use file::{open_regular, read_regular};
pub use format::{DType, TensorSpec};
pub use golden::{GoldenCheck, VerifyReport};
pub use model::{Model, Session, MAX_SESSION_THREADS};
#[cfg(feature = "signing")]
pub use signing::PublicKey;
pub use tensor::{Element, Tensor, TensorRef};
