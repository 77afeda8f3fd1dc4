#!/usr/bin/env bash
# The main job on a bundled model: build Kiln, compile the real PP-OCR
# text-direction classifier, run it on the reference input, compare with
# onnxruntime's output, and print the latency.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p kiln --locked
K=target/release/kiln
M=fixtures/models/ppocr_cls
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== compile"
$K compile $M/model.onnx --input-shape x=1x3x48x192 -o "$out/cls.kiln"
echo "== inspect (first lines)"
$K inspect "$out/cls.kiln" | sed -n 1,12p
echo "== run and compare with onnxruntime"
$K run "$out/cls.kiln" --input x=$M/inputs/x.npy --output-dir "$out/outputs" --check $M/outputs
echo "== bench (1 thread)"
$K bench "$out/cls.kiln" --input x=$M/inputs/x.npy --runs 300 --threads 1
