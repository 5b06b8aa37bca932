#!/usr/bin/env bash
# ferry's whole test suite: formatting, lints, unit, property and end-to-end tests
# (the end-to-end tests need root: they create network namespaces and TAP devices),
# then a short run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages cc:build-essential ip:iproute2 tshark:tshark

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
cargo test --locked --workspace
if [ -x scripts/fuzz-smoke.sh ]; then
  echo "== fuzz smoke"
  scripts/fuzz-smoke.sh
fi
