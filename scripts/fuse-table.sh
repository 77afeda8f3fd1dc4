#!/usr/bin/env bash
# The `fuse` table of docs/passes.md: for each model, nodes after import,
# nodes after -O2, what `fuse` merged, kernels at -O0 and -O2, and `kiln
# bench` p50 (native target, compiled for and run on one thread, random
# inputs) at -O0, at -O2 without `fuse` and at -O2; and the -O2 arena: the
# sum of all values (one region each), the planned arena of the values
# (liveness and in-place reuse) and the artifact's arena (with the
# kernels' scratch packed in).
#
#   RUNS=50 ROUNDS=3 scripts/fuse-table.sh KILN MODEL_DIR...
#
# Each MODEL_DIR holds model.onnx and meta.json (input_shapes, dims), like
# fixtures/models/* and the real models of scripts/real-models.sh. The
# three builds are benchmarked in turn, ROUNDS times, and each p50 is the
# smallest of its rounds, so that load from other processes on a shared
# machine hits all three alike and shows up as little as it can.
set -euo pipefail
kiln=$1
shift
runs=${RUNS:-50}
rounds=${ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py() { python3 -c "$1"; }
echo "| model | nodes (import) | nodes (-O2) | fused | kernels -O0 | kernels -O2 | p50 -O0 | p50 -O2 w/o fuse | p50 -O2 | values: sum → planned | arena |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for dir in "$@"; do
  name=$(basename "$dir")
  args=()
  while read -r a; do args+=("$a"); done < <(py "
import json
m = json.load(open('$dir/meta.json'))
for k, v in (m.get('input_shapes') or {}).items(): print('--input-shape'); print(k + '=' + 'x'.join(map(str, v)))
for k, v in (m.get('dims') or {}).items(): print('--dim'); print(f'{k}={v}')
")
  "$kiln" compile "$dir/model.onnx" "${args[@]}" --threads 1 -O0 -o "$tmp/o0.kiln" --json \
    --dump-ir after=import --dump-dir "$tmp/ir" > "$tmp/o0.json"
  "$kiln" compile "$dir/model.onnx" "${args[@]}" --threads 1 -O2 -o "$tmp/o2.kiln" --json > "$tmp/o2.json"
  "$kiln" compile "$dir/model.onnx" "${args[@]}" --threads 1 -o "$tmp/nf.kiln" \
    --passes fold-constants,simplify,recognize,layout,fold-batchnorm,flush-subnormals,dce > /dev/null
  for r in $(seq "$rounds"); do
    for v in o0 nf o2; do
      "$kiln" bench "$tmp/$v.kiln" --threads 1 --random --runs "$runs" --warmup 3 --json > "$tmp/b-$v-$r.json"
    done
  done
  # Graph::node_count: every `%n:` definition, graph inputs included.
  import=$(grep -o '%[0-9]*:' "$tmp/ir/00-import.kir" | wc -l)
  py "
import json, glob
c0 = json.load(open('$tmp/o0.json')); c2 = json.load(open('$tmp/o2.json'))
fuse = [p for p in c2['passes'] if p['name'] == 'fuse'][0]
def p50(v):
    return '%.3f ms' % min(json.load(open(f))['p50_ms'] for f in glob.glob(f'$tmp/b-{v}-*.json'))
mem = c2['memory']
print(f\"| $name | $import | {c2['passes'][-1]['nodes_after']} | {fuse['fused_nodes']} → {fuse['fused_kernels']} | {c0['kernels']} | {c2['kernels']} | {p50('o0')} | {p50('nf')} | {p50('o2')} | {mem['sum_of_values_bytes']:,} → {mem['planned_bytes']:,} | {c2['arena_bytes']:,} |\")
"
done
