#!/usr/bin/env bash
# Makes NVIDIA's PTX assembler available for the offline PTX validation
# (tests/tests/cuda_ptxas.rs) and prints its path on stdout.
#
# ptxas ships in the PyPI wheel nvidia-cuda-nvcc-cu12 (40 MB, no GPU or
# driver needed); this script installs the pinned version into its own
# venv (or a `pip --target` directory where python3 has no venv module).
# Idempotent: once installed it only prints the path.
#
#   KILN_PTXAS   use this ptxas instead (printed as is)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -n "${KILN_PTXAS:-}" ]; then
    echo "$KILN_PTXAS"
    exit 0
fi

NVCC_VERSION=12.9.86
VENV=target/ptxas-venv
STAMP="$VENV/.nvcc-$NVCC_VERSION"
find_ptxas() {
    find "$VENV" -path '*nvidia/cuda_nvcc/bin/ptxas' -type f 2>/dev/null | head -n 1
}

if [ ! -f "$STAMP" ] || [ -z "$(find_ptxas)" ]; then
    PYTHON=${PYTHON:-python3}
    export PIP_ROOT_USER_ACTION=ignore
    echo "ptxas: installing nvidia-cuda-nvcc-cu12==$NVCC_VERSION into $VENV" >&2
    rm -rf "$VENV"
    if "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 && [ -x "$VENV/bin/pip" ]; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "nvidia-cuda-nvcc-cu12==$NVCC_VERSION" >&2
    else
        rm -rf "$VENV"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps \
            --target "$VENV/site" "nvidia-cuda-nvcc-cu12==$NVCC_VERSION" >&2
    fi
    touch "$STAMP"
fi

PTXAS=$(find_ptxas)
if [ -z "$PTXAS" ] || ! "$PTXAS" --version >/dev/null 2>&1; then
    echo "ptxas: no working ptxas under $VENV" >&2
    exit 1
fi
realpath "$PTXAS"
