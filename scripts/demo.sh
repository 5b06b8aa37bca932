#!/usr/bin/env bash
# ferry's demo: builds ferry and its CNI plugin, then runs `ferry lab demo` as root: a
# three-node cluster in two zones in network namespaces (agents, pods made through the
# CNI plugin, an external client and load balancer), every connectivity check, then
# everything removed (docs/lab.md). Extra arguments go to `ferry lab demo`. The offline
# replay demo is `ferry demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
if [ "$(id -u)" -ne 0 ]; then
  echo "ferry: the lab demo makes network namespaces: run it as root" >&2
  exit 1
fi
ensure_packages cc:build-essential ip:iproute2 nft:nftables curl:curl ping:iputils-ping tshark:tshark sysctl:procps
cargo build --release --locked -q -p ferry -p ferry-cni
exec target/release/ferry lab demo "$@"
