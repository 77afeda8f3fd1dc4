#!/usr/bin/env bash
# The precision table (bench/precision.py): every model in fp32, bf16,
# fp16, mixed and int8 (dynamic, static unsmoothed, static) with artifact
# size, quality against fp32 on held-out inputs, the report's worst layers
# and p50 against the fp32 artifact in the same run. Builds the release
# `kiln` and fetches the real models. Arguments go to the script: --runs N,
# --rounds R, --models a,b, --out DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(bash bench/venv.sh)
bash scripts/real-models.sh >&2
cargo build --release --locked -p kiln --bin kiln >&2
exec "$PY" bench/precision.py "$@"
