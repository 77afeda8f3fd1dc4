#!/usr/bin/env bash
# Execution check of the CUDA target on a machine with an NVIDIA GPU: builds
# `gpu_check` (kiln-tests with the runtime's `cuda` feature), compiles every
# fixture model for GPU 0's SM (the newest Kiln supports that the GPU can
# run), runs it and compares each output with the committed onnxruntime
# reference (fixtures/models/*/outputs; plus the real models under
# target/real-models or KILN_REAL_MODELS when fetched), printing the max error per output,
# the p50 latency per model, and a summary. Exit status 1 on any failure.
#
#   tests/gpu/run.sh                 every fixture, in fp32 then in bf16
#   tests/gpu/run.sh digits_cnn ...  only these fixtures (fp32)
#
# Options go to gpu_check: --sm 80 (force a target), --runs N (default 20),
# --precision bf16|fp16|mixed, --tolerance T (default 1e-4 relative to the
# output's scale in fp32, 5e-2 in bf16).
#
# ptxas is optional: with KILN_PTXAS set, or scripts/ptxas.sh able to
# install it (needs PyPI), artifacts carry a cubin; otherwise the driver
# compiles the PTX at load time. Without a working cargo (e.g. an offline
# machine without the crates), set KILN_GPU_CHECK to a prebuilt binary
# (`cargo build -p kiln-tests --features cuda --bin gpu_check` elsewhere).
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: nvidia-smi not found; this needs a machine with an NVIDIA GPU and driver" >&2
fi
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || true

if [ -z "${KILN_PTXAS:-}" ]; then
    if PTXAS=$(bash scripts/ptxas.sh 2>/dev/null); then
        export KILN_PTXAS="$PTXAS"
    fi
fi

# Fixtures are read from this checkout, wherever the binary was built.
export KILN_REPO_ROOT="$PWD"
BIN=${KILN_GPU_CHECK:-}
if [ -z "$BIN" ]; then
    BIN=target/debug/gpu_check
    if ! cargo build --locked -p kiln-tests --features cuda --bin gpu_check >&2; then
        if [ -x "$BIN" ]; then
            echo "tests/gpu/run.sh: cargo build failed; using the existing $BIN" >&2
        else
            echo "tests/gpu/run.sh: cannot build gpu_check; set KILN_GPU_CHECK to a prebuilt binary" >&2
            exit 1
        fi
    fi
fi
if [ $# -gt 0 ]; then
    exec "$BIN" "$@"
fi
# Everything in fp32, then in bf16 (tensor-core GEMMs from sm_80).
status=0
"$BIN" || status=1
"$BIN" --precision bf16 || status=1
exit $status
