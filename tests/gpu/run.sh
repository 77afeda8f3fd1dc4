#!/usr/bin/env bash
# Execution check of the CUDA target on a machine with an NVIDIA GPU: builds
# `gpu_check` (kiln-tests with the runtime's `cuda` feature), compiles every
# fixture model for GPU 0's SM (the newest Kiln supports that the GPU can
# run), runs it and compares each output with the committed onnxruntime
# reference (fixtures/models/*/outputs; plus the real models under
# target/real-models or KILN_REAL_MODELS when fetched), printing the max error per output,
# the p50 latency per model, and a summary. Exit status 1 on any failure.
#
#   tests/gpu/run.sh                 every fixture in fp32, bf16, fp16, int8,
#                                    the ONNX conformance cases the CPU passes
#                                    (when generated), then onnxruntime's p50
#                                    on the same models
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

# The GPU machine's own ptxas (a CUDA toolkit) first: scripts/ptxas.sh needs
# PyPI, which a GPU server may not reach.
if [ -z "${KILN_PTXAS:-}" ]; then
    if PTXAS=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null); then
        export KILN_PTXAS="$PTXAS"
    elif PTXAS=$(bash scripts/ptxas.sh 2>/dev/null); then
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
# Everything in fp32 first, alone, so that its p50s are the timings; then
# bf16, fp16 (tensor-core GEMMs from sm_80) and int8 builds and the ONNX
# conformance cases (in shards) at the same time, since only their answers
# count; then onnxruntime on the real models and the larger fixtures for
# comparison (tests/gpu/ort_p50.py; its CUDA provider when installed).
status=0
"$BIN" || status=1
LOGS=$(mktemp -d)
pids=()
for precision in bf16 fp16 int8; do
    "$BIN" --precision $precision >"$LOGS/$precision.log" 2>&1 &
    pids+=($!)
done
NODE_DIR=${KILN_ONNX_TESTS_DIR:-target/onnx-node-tests}/node
SHARDS=${KILN_GPU_SHARDS:-6}
if [ -d "$NODE_DIR" ]; then
    for ((i = 0; i < SHARDS; i++)); do
        "$BIN" --conformance "$NODE_DIR" --shard $i/$SHARDS --results "$LOGS/cases-$i.txt" \
            >"$LOGS/conformance-$i.log" 2>&1 &
        pids+=($!)
    done
else
    echo "tests/gpu/run.sh: no conformance cases under $NODE_DIR (scripts/conformance-data.sh); skipping them" >&2
fi
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
cat "$LOGS"/bf16.log "$LOGS"/fp16.log "$LOGS"/int8.log
if [ -d "$NODE_DIR" ]; then
    cat "$LOGS"/conformance-*.log
    # Each case's outcome on this GPU, for the record.
    RESULTS=${KILN_GPU_RESULTS:-target/gpu-conformance.txt}
    cat "$LOGS"/cases-*.txt 2>/dev/null | sort >"$RESULTS" || true
    echo "conformance on the GPU: $(wc -l <"$RESULTS") cases; $(cut -d' ' -f2 "$RESULTS" | sort | uniq -c | tr '\n' ' '); outcomes in $RESULTS"
fi
rm -rf "$LOGS"
PYTHON=${PYTHON:-python3}
if "$PYTHON" -c "import onnxruntime, numpy" 2>/dev/null; then
    models=(fixtures/models/ppocr_cls fixtures/models/digits_cnn fixtures/models/digits_mlp)
    for m in "${KILN_REAL_MODELS:-target/real-models}"/*/; do
        [ -f "$m/meta.json" ] && models+=("$m")
    done
    "$PYTHON" tests/gpu/ort_p50.py "${models[@]}" || status=1
else
    echo "tests/gpu/run.sh: no onnxruntime in $PYTHON; skipping its comparison" >&2
fi
exit $status
