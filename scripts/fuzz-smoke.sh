#!/usr/bin/env bash
# A short run of every fuzz target (default 10 s each; FUZZ_SECONDS to change).
# Stable Rust: the targets are built without a sanitizer (-s none); libFuzzer's
# coverage guidance still works and any panic fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages cc:build-essential c++:g++
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "ferry: installing cargo-fuzz" >&2
  cargo install --locked -q cargo-fuzz
fi
seconds=${FUZZ_SECONDS:-10}
cd fuzz
for target in $(cargo fuzz list); do
  echo "-- fuzz $target for ${seconds}s"
  log=$(mktemp)
  if ! cargo fuzz run -s none "$target" -- -max_total_time="$seconds" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    rm -f "$log"
    if compgen -G "artifacts/$target/*" >/dev/null; then
      echo "fuzz target $target failed: the crashing input is under fuzz/artifacts/$target/" >&2
    else
      echo "fuzz target $target did not build or run (see above)" >&2
    fi
    exit 1
  fi
  grep -E '^Done' "$log" || true
  rm -f "$log"
done
