#!/usr/bin/env bash
# Builds tests/c/example.c against the runtime's static library and the
# kiln.h header, compiles a fixture with the CLI, and runs the C program on it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Same command as scripts/test.sh, so nothing is rebuilt with other features.
cargo build --workspace --all-targets --locked
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gcc -std=c11 -Wall -Wextra -Werror -O2 -I runtime/include tests/c/example.c \
    target/debug/libkiln_runtime.a -lm -lpthread -ldl -o "$out/example"
./target/debug/kiln compile fixtures/models/digits_mlp/model.onnx --input-shape input=1x64 -o "$out/mlp.kiln" >/dev/null
"$out/example" "$out/mlp.kiln"
