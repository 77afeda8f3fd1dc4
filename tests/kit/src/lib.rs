//! `kiln-test-kit`: helpers the test suites of several crates share, as a
//! crate instead of `#[path]` includes, so each is compiled once and has
//! one definition. Dev-only: no shipped crate depends on it.
//!
//! - [`ptx_interp`]: the PTX interpreter that runs the CUDA target's
//!   kernels on a machine without a GPU and checks them against the IR's
//!   reference evaluator.
//! - [`rng::Rng`]: the seeded generator (SplitMix64) every suite draws its
//!   random graphs, tensors and mutations from.
#![forbid(unsafe_code)]

pub mod ptx_interp;
pub mod rng;

pub use rng::Rng;

/// Whether this host runs `x86_64-v3` code (AVX2 and FMA): the suites
/// that run that target's artifacts here skip it otherwise.
pub fn host_runs_x86_64_v3() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
