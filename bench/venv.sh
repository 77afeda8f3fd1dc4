#!/usr/bin/env bash
# Prints the Python of the benchmark venv (target/bench-venv), creating it
# from bench/requirements.txt when it lacks a package the benchmarks import.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/bench-venv
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore
if ! "$VENV/bin/python" -c "import numpy, onnxruntime, tract, matplotlib, onnx" >/dev/null 2>&1; then
    echo "bench: installing bench/requirements.txt into $VENV" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r bench/requirements.txt >&2
fi
echo "$PWD/$VENV/bin/python"
