#!/usr/bin/env bash
# Proof that a refactor preserves behaviour: builds `kiln` (release) at BASE_REV
# and from the working tree, compiles every fixture and real model in every
# configuration of scripts/byte_identity.py with both, and compares the
# artifacts byte for byte. Exit 0 only when all are identical.
#
#   bash scripts/byte-identity.sh BASE_REV [--only SUBSTR]
#
# The base is built once per revision (kept as target/byte-identity/kiln-REV)
# in a git worktree that shares this checkout's target directory, so only
# Kiln's own crates rebuild. Real
# models come from scripts/real-models.sh (run it first to include them).
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev=${1:?usage: scripts/byte-identity.sh BASE_REV [--only SUBSTR]}
shift
root=$PWD
work=target/byte-identity
mkdir -p "$work"

base_kiln="$work/kiln-$(git rev-parse "$base_rev")"
if [ ! -x "$base_kiln" ]; then
    base_src="$work/base-src"
    git worktree remove --force "$base_src" 2>/dev/null || rm -rf "$base_src"
    git worktree prune
    git worktree add --detach --quiet "$base_src" "$base_rev"
    (cd "$base_src" && CARGO_TARGET_DIR="$root/target" cargo build --release --locked -p kiln --bin kiln)
    cp target/release/kiln "$base_kiln"
    git worktree remove --force "$base_src"
fi

cargo build --release --locked -p kiln --bin kiln
cp target/release/kiln "$work/kiln-head"

rm -rf "$work/out"
python3 scripts/byte_identity.py "$base_kiln" "$work/kiln-head" "$work/out" "$@"
