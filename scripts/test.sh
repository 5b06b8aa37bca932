#!/usr/bin/env bash
# ferry's whole test suite: formatting, lints, unit, property and end-to-end tests
# (the end-to-end tests need root: they create network namespaces and TAP devices),
# then a short run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages cc:build-essential protoc:protobuf-compiler ip:iproute2 tshark:tshark ping:iputils-ping nc:netcat-openbsd iperf3:iperf3 ethtool:ethtool python3:python3 curl:curl nft:nftables sysctl:procps iptables-legacy:iptables podman:podman runc:runc mmdebstrap:mmdebstrap containerd:containerd /usr/lib/cni/loopback:containernetworking-plugins busybox:busybox-static

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --locked --workspace 2>&1 | tee "$log"
passed=$(grep -oE '[0-9]+ passed' "$log" | awk '{s += $1} END {print s + 0}')
failed=$(grep -oE '[0-9]+ failed' "$log" | awk '{s += $1} END {print s + 0}')
echo "== fuzz smoke"
scripts/fuzz-smoke.sh
# One closing line for the whole suite (cargo prints one per test binary).
echo "$passed passed, $failed failed"
