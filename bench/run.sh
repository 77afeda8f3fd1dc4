#!/usr/bin/env bash
# One command for the CPU benchmark: Kiln, onnxruntime and tract on the
# same models and inputs, at 1 and 2 threads, in one run (bench/harness.py
# has the details). Builds the release `kiln` and the `roofline` example,
# installs bench/requirements.txt into target/bench-venv, fetches the real
# models (scripts/real-models.sh), then runs the harness. Arguments go to
# the harness: --runs N, --threads 1,2, --int8, model directories.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(bash bench/venv.sh)
bash scripts/real-models.sh >&2
cargo build --release --locked -p kiln --bin kiln --example roofline >&2
exec "$PY" bench/harness.py "$@"
