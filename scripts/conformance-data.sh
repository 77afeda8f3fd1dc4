#!/usr/bin/env bash
# Generates the ONNX backend node-test cases the conformance runner reads
# (tests/tests/conformance.rs), if they are missing.
#
# The onnx wheel ships only the generators of these cases; this script
# installs the pinned onnx into its own venv and points its test-data writer
# at the node cases (about 1,884 cases, 56 MB, a few seconds). Idempotent and
# quiet: it does nothing when the data for this onnx version exists.
#
#   KILN_ONNX_TESTS_DIR   where the cases go (default target/onnx-node-tests)
set -euo pipefail
cd "$(dirname "$0")/.."

ONNX_VERSION=1.23.2
VENV=target/conformance-venv
OUT=${KILN_ONNX_TESTS_DIR:-target/onnx-node-tests}
STAMP="$OUT/.generated-by-onnx-$ONNX_VERSION"

if [ -f "$STAMP" ]; then
    exit 0
fi

PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore
# The interpreter with the pinned onnx: a venv, or (where python3 has no
# venv/ensurepip module) the system python with a `pip --target` directory.
have_onnx() {
    "$@" -c "import onnx, sys; sys.exit(onnx.__version__ != '$ONNX_VERSION')" >/dev/null 2>&1
}
if have_onnx "$VENV/bin/python"; then
    RUN=("$VENV/bin/python")
elif PYTHONPATH="$VENV/site" have_onnx "$PYTHON"; then
    RUN=(env "PYTHONPATH=$VENV/site" "$PYTHON")
else
    echo "conformance: installing onnx==$ONNX_VERSION into $VENV" >&2
    rm -rf "$VENV"
    if "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 && [ -x "$VENV/bin/pip" ]; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "onnx==$ONNX_VERSION"
        RUN=("$VENV/bin/python")
    else
        rm -rf "$VENV"
        "$PYTHON" -m pip install --quiet --disable-pip-version-check --target "$VENV/site" "onnx==$ONNX_VERSION"
        RUN=(env "PYTHONPATH=$VENV/site" "$PYTHON")
    fi
fi

echo "conformance: generating the ONNX node test cases into $OUT" >&2
rm -rf "$OUT/node"
mkdir -p "$OUT"
"${RUN[@]}" - "$OUT" <<'PY'
import argparse, sys, warnings
warnings.simplefilter("ignore")
import onnx.backend.test.cmd_tools as ct
import onnx.backend.test.case.node as node
ct.model_test.collect_testcases = node.collect_testcases
ct.generate_data(argparse.Namespace(output=sys.argv[1]))
PY
n=$(find "$OUT/node" -mindepth 1 -maxdepth 1 -type d | wc -l)
if [ "$n" -lt 1000 ]; then
    echo "conformance: expected the node cases in $OUT/node, found $n" >&2
    exit 1
fi
touch "$STAMP"
echo "conformance: $n cases" >&2
