#!/usr/bin/env bash
# The whole test suite: build everything, run every test with nextest, then
# compile and run the C ABI example with gcc against the runtime library.
# Needs only cargo (+ cargo-nextest if present) and gcc; fixtures are committed.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --workspace --all-targets --locked
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
else
    cargo test --workspace --locked --no-fail-fast
fi
cargo test --doc --workspace --locked
bash scripts/c_example.sh
