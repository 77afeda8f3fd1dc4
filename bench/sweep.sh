#!/usr/bin/env bash
# One command for the shape sweep: Kiln beside onnxruntime on >= 150
# single-op models whose shapes come from the layers of common
# architectures, at 1 and 2 threads (bench/sweep.py has the details).
# Builds the release `kiln` and the `roofline` example, installs
# bench/requirements.txt into target/bench-venv, generates the models into
# target/sweep/models with bench/sweep_models.py when the manifest is
# missing or older than the generator, then runs the sweep. Arguments go to
# bench/sweep.py: --filter REGEX, --limit N, --threads 1,2, --runs N, ...
# Writes target/sweep/results.json and results.md.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(bash bench/venv.sh)
cargo build --release --locked -p kiln --bin kiln --example roofline >&2
MANIFEST=target/sweep/models/manifest.json
if [ ! -f "$MANIFEST" ] || [ bench/sweep_models.py -nt "$MANIFEST" ]; then
    "$PY" bench/sweep_models.py --check --out target/sweep/models >&2
fi
exec "$PY" bench/sweep.py "$@"
