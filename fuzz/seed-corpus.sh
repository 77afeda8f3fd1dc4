#!/usr/bin/env bash
# Fills fuzz/corpus/<target>/ with seeds: the fixture models, fixtures/bad/
# and the ONNX conformance models for onnx_compile; compiled fixtures
# (prefixed with the mode byte 0) for artifact_load; the IR snapshots and
# printed fixture graphs for ir_text. Needs a debug build of `kiln`.
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=target/debug/kiln
out=fuzz/corpus
mkdir -p "$out"/{onnx_compile,artifact_load,ir_text}
for m in fixtures/models/*/model.onnx; do
    cp "$m" "$out/onnx_compile/fixture-$(basename "$(dirname "$m")").onnx"
done
cp fixtures/bad/*.onnx "$out/onnx_compile/"
node_dir=${KILN_ONNX_TESTS_DIR:-target/onnx-node-tests}/node
if [ -d "$node_dir" ]; then
    for c in "$node_dir"/*/; do
        cp "$c/model.onnx" "$out/onnx_compile/node-$(basename "$c").onnx"
    done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for name in digits_mlp digits_cnn op_add_bcast op_gather_indices_input op_conv_basic op_slice_basic ppocr_cls control_if_runtime_then bounded_nms_some bounded_unique_rows; do
    shapes=$(python3 -c "
import json,sys
m=json.load(open('fixtures/models/$name/meta.json'))
print(' '.join('--input-shape %s=%s' % (k, 'x'.join(map(str, v))) for k, v in m.get('input_shapes', {}).items()))")
    # shellcheck disable=SC2086
    "$kiln" compile "fixtures/models/$name/model.onnx" $shapes -o "$tmp/$name.kiln" >/dev/null
    { printf '\0'; cat "$tmp/$name.kiln"; } > "$out/artifact_load/$name"
    "$kiln" compile "fixtures/models/$name/model.onnx" $shapes -o "$tmp/x.kiln" \
        --dump-ir import --dump-dir "$tmp/ir-$name" >/dev/null
    cp "$tmp/ir-$name"/*.kir "$out/ir_text/$name.kir"
done
for s in compiler/ir/src/text/snapshots/*.snap; do
    # insta front matter ends at the second '---' line.
    awk 'n>=2{print} /^---$/{n++}' "$s" > "$out/ir_text/$(basename "$s" .snap).kir"
done
for t in onnx_compile artifact_load ir_text; do
    echo "$t: $(ls "$out/$t" | wc -l) seeds"
done
