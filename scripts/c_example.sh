#!/usr/bin/env bash
# Builds tests/c/example.c against the runtime's static library and the
# kiln.h header, compiles a fixture with the CLI (with a golden self-test),
# and runs the C program on it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Same command as scripts/test.sh, so nothing is rebuilt with other features.
cargo build --workspace --all-targets --locked
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -std=c11 -Wall -Wextra -Werror -O2 -I runtime/include tests/c/example.c \
    target/debug/libkiln_runtime.a -lm -lpthread -ldl -o "$out/example"
# With a golden self-test (one input set, from the fixtures' venv made by
# scripts/real-models.sh), which the example runs through kiln_model_verify.
target/fixtures-venv/bin/python -c "import numpy as np, sys; np.savez(sys.argv[1], input=np.linspace(0, 16, 64, dtype=np.float32).reshape(1, 64))" "$out/golden.npz"
./target/debug/kiln compile fixtures/models/digits_mlp/model.onnx --input-shape input=1x64 \
    --golden "$out/golden.npz" -o "$out/mlp.kiln" >/dev/null
"$out/example" "$out/mlp.kiln" | tee "$out/example.txt"
grep -q "golden self-test: every output within tolerance" "$out/example.txt"
# An artifact of two profiles (batch 1 and 3): profile 1 runs through the
# shaped entry point and reports the outputs' actual dims.
./target/debug/kiln compile fixtures/models/digits_mlp/model.onnx --dim batch=1,3 \
    -o "$out/mlp2.kiln" >/dev/null
"$out/example" "$out/mlp2.kiln" -p 1 | tee "$out/example2.txt"
grep -q "profile 1 of 2" "$out/example2.txt"
grep -q "output logits: f32\[3,10\]" "$out/example2.txt"
