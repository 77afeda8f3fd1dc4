#!/usr/bin/env bash
# The Python package (python/): installs it into target/fixtures-venv (made
# by scripts/real-models.sh, with numpy, onnx, onnxruntime and ml_dtypes)
# from the dev-profile build that `cargo build --workspace` already made,
# then runs its pytest suite, which compares with onnxruntime on the
# fixtures and the real models and serves a model on a local Ray instance
# (python/tests/test_serve.py, about a minute). A user's install is just `pip install
# ./python` (a release build; README "Python").
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/fixtures-venv
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$VENV/bin/python" -c "import maturin, pytest, ray.serve" >/dev/null 2>&1; then
    echo "python: installing maturin, pytest and Ray Serve into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet -r python/requirements-test.txt \
        -r python/requirements-serve.txt
fi
# The dev profile shares the workspace build's compiled crates: only the
# extension itself is linked again.
PATH="$PWD/$VENV/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
    "$VENV/bin/python" -m pip install --quiet --no-build-isolation --no-deps --force-reinstall ./python
# The Ray Serve test is required here, not skipped when Ray is missing.
KILN_REQUIRE_SERVE=1 KILN_BIN="$PWD/target/debug/kiln" "$VENV/bin/python" -m pytest -q -p no:cacheprovider python/tests
