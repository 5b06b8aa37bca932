#!/usr/bin/env bash
# ferry's demo on its embedded default: builds ferry and runs the built-in replay demo
# (fragments reassembled, forwarded and refragmented; GRO super-packets segmented;
# path MTU discovery; refused attacks). Extra arguments go to `ferry demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages cc:build-essential
cargo build --release --locked -q -p ferry
exec target/release/ferry demo "$@"
