#!/usr/bin/env bash
# The README's test command: everything CI checks, runnable on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/fetch-models.sh
# The runtime crate has no import cycle and weights/ imports nothing of backend/gpu/.
python3 ci/import-graph.py
export LODE_MODELS_DIR="${LODE_MODELS_DIR:-$HOME/.cache/lode/models}"
cargo build --release --locked
cargo test --release --locked --workspace --no-fail-fast -- --test-threads=2
